#!/bin/sh
# ClearML agents on a machine with several GPUs, without Docker: each agent, and every
# task it runs, is capped at SIZE (default 8G) and put on the GPU with the most room left
# when it starts (fgpu run --gpus auto: the GPU's memory less the caps of the jobs already
# there and what others use on it; the lower index on a tie). With --wait an agent that
# finds no room waits for one instead of failing.
#
#   sh images/examples/clearml-agent-gpus-auto.sh 10 8G     # ten 8 GiB agents, spread by room
#
# fgpu status shows what each GPU has committed; fgpu status --all (as root) every job.
set -eu

agents=${1:-1}
size=${2:-8G}

i=1
while [ "$i" -le "$agents" ]; do
    CLEARML_WORKER_ID="$(hostname):fgpu$i" \
        fgpu run --limit "$size" --gpus auto --wait -- \
        clearml-agent daemon --queue default --foreground &
    i=$((i + 1))
done
wait
