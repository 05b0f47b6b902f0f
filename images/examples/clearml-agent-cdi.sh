#!/bin/sh
# ClearML agents that give every task of a queue an 8 GiB fraction of one GPU, in
# whatever image the task names: the cap comes from fgpu's CDI device (docs/cdi.md),
# added to each task's container through the agent's extra container arguments, not from
# the image.
#
#   sh images/examples/clearml-agent-cdi.sh [SHARES] [SIZE] [GPU] [QUEUE]
#   sh images/examples/clearml-agent-cdi.sh 10 8g 0 gpu0-8g   # ten 8 GiB tasks on GPU 0
#
# Needs, on the agent's machine: `sudo fgpu cdi generate` (a device fgpu.io/gpu=GPU-SIZE
# must exist), and a container engine that reads CDI: Docker 25+ with "cdi" enabled in
# daemon.json (on by default from 28.2), or podman (with podman-docker providing the
# `docker` command the agent calls). The agent's --gpus gives the task its GPU as usual;
# where NVIDIA's devices come from CDI instead (nvidia-ctk cdi generate), set
# NVIDIA_CDI=1 to add --device nvidia.com/gpu=GPU as well.
#
# SHARES agents share the GPU, one task each at a time, each task within its own cap: keep
# SHARES x SIZE within the GPU's memory (80 GiB / 8 GiB = 10), as nothing else does
# (docs/cdi.md, Over-subscription). The same arguments can go in clearml.conf as
# agent.extra_docker_arguments.
set -eu

shares=${1:-1}
size=${2:-8g}
gpu=${3:-0}
queue=${4:-default}
# The image for tasks that name none; any glibc-based image is capped the same way.
default_image=${CLEARML_DEFAULT_IMAGE:-nvidia/cuda:12.3.2-runtime-ubuntu22.04}

args="--device fgpu.io/gpu=$gpu-$size"
if [ "${NVIDIA_CDI:-0}" = 1 ]; then
    args="--device nvidia.com/gpu=$gpu $args"
fi
export CLEARML_AGENT_EXTRA_DOCKER_ARGS="$args"

i=1
while [ "$i" -le "$shares" ]; do
    CLEARML_WORKER_ID="$(hostname):gpu$gpu-$size-$i" \
        clearml-agent daemon --queue "$queue" --docker "$default_image" --gpus "$gpu" --detached
    i=$((i + 1))
done
