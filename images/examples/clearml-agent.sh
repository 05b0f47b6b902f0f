#!/bin/sh
# ClearML agents that run every task of the queue in an 8 GiB fractional-gpu container.
# The single-agent command line is:
#
#   clearml-agent daemon --queue default --docker fractional-gpu:u22-cu12.3-8gb
#
# This script starts SHARES such agents on GPU 0 (default 1; 10 fills an 80 GB GPU with
# 8 GiB shares), each with its own worker id. Each task container gets its own 8 GiB cap.
# A task may name its own image built FROM a fractional-gpu image
# (images/examples/Dockerfile); the cap comes with it.
#
# --pid=host and --ipc=host are how ClearML runs its fractional GPU images; fgpu needs
# neither: the cap and NVML's process lists are the container's own with or without them,
# and the caps of different containers stay independent with --ipc=host (docs/images.md).
# The same arguments can go in clearml.conf as agent.extra_docker_arguments.
#
#   sh images/examples/clearml-agent.sh 10
set -eu

shares=${1:-1}
export CLEARML_AGENT_EXTRA_DOCKER_ARGS="--pid=host --ipc=host"

i=1
while [ "$i" -le "$shares" ]; do
    CLEARML_WORKER_ID="$(hostname):gpu0-share$i" \
        clearml-agent daemon --queue default --docker fractional-gpu:u22-cu12.3-8gb \
        --gpus 0 --detached
    i=$((i + 1))
done
