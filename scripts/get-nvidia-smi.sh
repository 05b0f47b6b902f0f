#!/bin/sh
# Fetch Debian's real `nvidia-smi` binary WITHOUT the real NVML library, so that it
# runs against whatever libnvidia-ml.so.1 is on LD_LIBRARY_PATH (the simulated one).
#
#   scripts/get-nvidia-smi.sh DIR     -> extracts the package under DIR, prints the binary's path
#
# Idempotent: a second run with the same DIR only prints the path.
# Needs root (apt sources, apt-get update) unless the package file is already in DIR.
set -eu

dest=${1:?usage: $0 DIR}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
bin="$dest/root/usr/lib/nvidia/current/nvidia-smi"

if [ -x "$bin" ]; then
    echo "$bin"
    exit 0
fi

# Debian's nvidia-smi lives in the non-free component: enable it if absent.
if ! apt-cache policy nvidia-smi 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
        sed -i 's/^Components: main$/Components: main contrib non-free non-free-firmware/' \
            /etc/apt/sources.list.d/debian.sources
    fi
    if [ -f /etc/apt/sources.list ]; then
        sed -i 's/^\(deb .* main\)$/\1 contrib non-free non-free-firmware/' /etc/apt/sources.list
    fi
    apt-get update -qq >/dev/null
fi

mkdir -p "$dest/pkg"
if ! ls "$dest"/pkg/nvidia-smi_*.deb >/dev/null 2>&1; then
    (cd "$dest/pkg" && apt-get download -qq -o APT::Sandbox::User=root nvidia-smi >/dev/null)
fi
deb=$(ls "$dest"/pkg/nvidia-smi_*.deb | head -n 1)
# Only the nvidia-smi package itself: its dependency on the real libnvidia-ml1 is not
# installed, so the real NVML never shadows the simulated one.
dpkg -x "$deb" "$dest/root"
if [ ! -x "$bin" ]; then
    echo "nvidia-smi binary not found in $deb" >&2
    exit 1
fi
echo "$bin"
