#!/usr/bin/env bash
# fgpu-kubelet-plugin's claims in real podman containers: the CDI devices that the DRA
# driver gpu.fgpu.io answers NodePrepareResources with cap a plain Debian image, on the
# simulated driver, as tests/cdi/test.sh does for `fgpu cdi generate`'s devices. No
# kubelet and no API server exist here: fgpu-dra-harness (tests/support/dra/) is the API
# server on 127.0.0.1, serving resource.k8s.io/v1 claims with consumedCapacity, and
# tests/python/fake_kubelet.py is kubelet, calling the plugin over its sockets as kubelet's
# grpc-go does (the percent-encoded socket path as :authority).
#
#   bash tests/cdi/dra.sh           (as root; tests/run.sh runs it)
#
# It checks:
#   - kubelet registers the plugin; Prepare of a claim allocated 8Gi and 30 % of GPU 0
#     answers NVIDIA's device under the GPU's UUID (from a stand-in for NVIDIA's spec) and
#     fgpu.io/gpu=claim-<uid>, both defined by specs in /var/run/cdi; the same again on a
#     repeated Prepare;
#   - a container started with those devices sees an 8192 MiB GPU in nvidia-smi, pynvml and
#     cuMemGetInfo, is refused 9000 MiB and granted 7000 MiB, and has the 30 % share in its
#     configuration;
#   - a second container in the first one's IPC namespace (a pod's second container) shares
#     the one 8 GiB cap, and so does a container of the same claim in an IPC namespace of
#     its own (a second pod), after the plugin was killed and restarted in between;
#   - a prioritized-list claim (the scheduler chose subrequest gpu/small, 4Gi) is answered
#     for request `gpu`, and its container sees a 4096 MiB GPU;
#   - a claim allocated a device the node lacks gets an error and no spec;
#   - Unprepare removes the claims' specs; SIGTERM stops the plugin, which removes its
#     registration socket and leaves nothing running;
#   - a MIG partition (a simulated A100 80GB in MIG mode, --mig-gpus all): Prepare of a
#     claim of 4Gi in the 1g.10gb at slice 6 creates that instance; its container gets the
#     instance's two nvidia-caps nodes (stand-ins made with mknod, minors from a mig-minors
#     list laid out as the kernel module's) and sees a 4096 MiB device; Unprepare destroys
#     the instance.
# Host state: the specs go to /var/run/cdi (podman 4.3 reads only it and /etc/cdi) under
# names of this script's own, removed at exit; everything else lives in a temporary
# directory, removed at exit with the processes and mounts it started. The base image is
# tests/cdi/test.sh's (the same cache, the same name).
# Prints PASS/FAIL lines and "N passed, M failed"; exits non-zero if anything failed.
#
# Environment:
#   FGPU_IMAGES_CACHE  cache of the base rootfs (default /var/cache/fgpu-images)
#   FGPU_DRA_WORK      scratch directory (default target/dra-test)
#   FGPU_DRA_KEEP=1    leave the containers, the plugin's files and the specs behind
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1

CACHE=${FGPU_IMAGES_CACHE:-/var/cache/fgpu-images}
WORK=${FGPU_DRA_WORK:-$root/target/dra-test}
PREFIX=fgpu-dra-test
IMAGE=localhost/fgpu-cdi-test/bookworm-python3:latest
CDI_DIR=/var/run/cdi
NVIDIA_SPEC=$CDI_DIR/$PREFIX-nvidia.yaml
NODE=node-a
ARCH=$(uname -m)
LIBDIR=/usr/lib/$ARCH-linux-gnu
CAP_MIB=8192
# The claims: UIDs of this script's own, so that their specs never meet another's.
UID_TRAIN=0d7a2c4e-dra0-4000-8000-000000000001
UID_LOST=0d7a2c4e-dra0-4000-8000-000000000003
UID_SMALL=0d7a2c4e-dra0-4000-8000-000000000004
UID_MIG=0d7a2c4e-dra0-4000-8000-000000000005
MIG_SPEC=$CDI_DIR/$PREFIX-nvidia-mig.yaml
HOSTDIR=
API_PID=
PLUGIN_PID=
T0=$(date +%s)

# shellcheck source=tests/cdi/harness.sh
source "$root/tests/cdi/harness.sh"

mkdir -p "$WORK" "$CACHE" "$CDI_DIR" || die "cannot create $WORK, $CACHE or $CDI_DIR"

# ------------------------------------------------------------------ tools

need=()
command -v podman >/dev/null || need+=(podman)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v runc >/dev/null || need+=(runc)
command -v cc >/dev/null || need+=(gcc libc6-dev)
if [ "${#need[@]}" -gt 0 ]; then
    log "apt-get install ${need[*]}"
    { DEBIAN_FRONTEND=noninteractive apt-get update -qq \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"; } \
        >"$WORK/apt.log" 2>&1 || die "apt-get install ${need[*]} failed (see $WORK/apt.log)"
fi

PY=${FGPU_TEST_PYTHON:-$root/.venv/bin/python}
if ! "$PY" -c 'import pynvml, grpc, grpc_tools, h2' 2>/dev/null; then
    log "pip install -r tests/python/requirements.txt into .venv"
    { [ -x "$PY" ] || python3 -m venv "$root/.venv"; } && PY=$root/.venv/bin/python \
        && "$PY" -m pip install -q --disable-pip-version-check -r tests/python/requirements.txt >"$WORK/pip.log" 2>&1 \
        || die "pip install failed (see $WORK/pip.log)"
fi

# Podman on these machines (docs/cdi.md, Tests): root has no CAP_SYS_RESOURCE, so no
# default ulimits; the hybrid cgroup layout needs cgroupfs and runc. A real host needs
# none of this.
cat >"$WORK/containers.conf" <<'EOF'
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
EOF
export CONTAINERS_CONF=$WORK/containers.conf
RUN_ARGS=(--network=none --ulimit nofile=1024:4096 --ulimit nproc=4096:4096 --label "$PREFIX=1")

cleanup() {
    [ "${FGPU_DRA_KEEP:-0}" = 1 ] && return 0
    local ids
    ids=$(podman ps -aq --filter "label=$PREFIX=1" 2>/dev/null)
    [ -n "$ids" ] && podman rm -f -t 0 $ids >/dev/null 2>&1
    [ -n "$PLUGIN_PID" ] && kill "$PLUGIN_PID" 2>/dev/null && wait "$PLUGIN_PID" 2>/dev/null
    [ -n "$API_PID" ] && kill "$API_PID" 2>/dev/null && wait "$API_PID" 2>/dev/null
    { exec 9>&-; } 2>/dev/null
    rm -f "$NVIDIA_SPEC" "$MIG_SPEC" "$CDI_DIR/fgpu-claim-$UID_MIG.json" "$CDI_DIR/fgpu-claim-$UID_TRAIN.json" "$CDI_DIR/fgpu-claim-$UID_LOST.json" "$CDI_DIR/fgpu-claim-$UID_SMALL.json"
    if [ -n "$HOSTDIR" ]; then
        # The claims' ledger tmpfs, should a failure have left one mounted.
        grep -o " $HOSTDIR/[^ ]*" /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m"; done
        rm -rf "$HOSTDIR"
    fi
    return 0
}
trap cleanup EXIT
# Stopped by a signal: leave through the EXIT trap, which cleans up.
trap 'exit 1' INT TERM
cleanup

# ------------------------------------------------------------------ builds

log "cargo build --release of fgpu, the shim, the simulated driver, fgpu-kubelet-plugin and fgpu-dra-harness (about 2 minutes on 2 cores from a clean tree; output in $WORK/cargo.log)"
cargo build --release -p fgpu-cli -p fgpu-shim -p fgpu-sim-cuda -p fgpu-sim-nvml -p fgpu-kubelet-plugin -p fgpu-tests --bins \
    >"$WORK/cargo.log" 2>&1 || die "cargo build failed (see $WORK/cargo.log)"
REL=$root/target/release
for f in fgpu libfgpu.so libfgpu_shim.so fgpu-kubelet-plugin fgpu-dra-harness libfgpu_sim_cuda.so libfgpu_sim_nvml.so; do
    [ -e "$REL/$f" ] || die "$REL/$f was not built"
done
HOSTDIR=$(mktemp -d /tmp/$PREFIX.XXXXXX) && chmod 755 "$HOSTDIR" || die "mktemp failed"
mkdir -p "$HOSTDIR/simlib" "$HOSTDIR/bin" "$HOSTDIR/sim"
SIM_CUDA=$HOSTDIR/simlib/libcuda.so.1
SIM_NVML=$HOSTDIR/simlib/libnvidia-ml.so.1
cp "$REL/libfgpu_sim_cuda.so" "$SIM_CUDA" && cp "$REL/libfgpu_sim_nvml.so" "$SIM_NVML" || die "cannot copy the simulated driver"
stage_host_tools
ensure_image

# ------------------------------------------------------------------ the node

# One simulated 80 GiB GPU, its state shared with the containers.
SIM_STATE=$HOSTDIR/sim/one
sim() { LD_LIBRARY_PATH=$HOSTDIR/simlib FGPU_SIM_STATE=$SIM_STATE FGPU_SIM_DEVICES=1 FGPU_SIM_MEMORY=80G FGPU_SIM_CONTEXT_OVERHEAD=300M "$@"; }
sim "$CLIENT" nvml >/dev/null 2>&1
chmod 0666 "$SIM_STATE" || die "the simulated driver did not create its state file"
GPU_UUID=$(sim "$PY" -c 'import pynvml as n; n.nvmlInit(); u = n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(0)); print(u.decode() if isinstance(u, bytes) else u)')
[ -n "$GPU_UUID" ] || die "pynvml does not read the simulated GPU's UUID"

# The stand-in for NVIDIA's spec: the GPU under its UUID only (nvidia-ctk's uuid names), so
# that its names meet no other stand-in's.
cat >"$NVIDIA_SPEC" <<EOF
cdiVersion: "0.5.0"
kind: "nvidia.com/gpu"
containerEdits:
  mounts:
    - {hostPath: "$SIM_CUDA", containerPath: "$LIBDIR/libcuda.so.1", options: ["ro", "nosuid", "nodev", "bind"]}
    - {hostPath: "$SIM_NVML", containerPath: "$LIBDIR/libnvidia-ml.so.1", options: ["ro", "nosuid", "nodev", "bind"]}
    - {hostPath: "$NVSMI", containerPath: "/usr/bin/nvidia-smi", options: ["ro", "nosuid", "nodev", "bind"]}
devices:
  - name: "$GPU_UUID"
    containerEdits:
      mounts:
        - {hostPath: "$SIM_STATE", containerPath: "/tmp/fgpu-sim-state", options: ["rw", "nosuid", "nodev", "bind"]}
EOF

# The API server, with the claims as the scheduler allocated them: 8Gi and 30 % of gpu-0,
# and one on a device this node lacks. It serves until its standard input (fd 9) closes.
log "the stub API server and fgpu-kubelet-plugin"
mkfifo "$HOSTDIR/api.in" || die "mkfifo failed"
"$REL/fgpu-dra-harness" api "$HOSTDIR/kubeconfig" "$NODE" 5e0c1a2b-0000-4000-8000-00000000node \
    "default/train/$UID_TRAIN/gpu-0/8Gi/30" "default/lost/$UID_LOST/gpu-5/8Gi/-" "default/small/$UID_SMALL/gpu-0/4Gi/-/gpu/small" \
    "default/mig/$UID_MIG/gpu-0-mig-1g-10gb-6/4Gi/-" \
    <"$HOSTDIR/api.in" >"$HOSTDIR/api.out" 2>"$HOSTDIR/api.err" &
API_PID=$!
exec 9>"$HOSTDIR/api.in"
for _ in $(seq 1 100); do grep -q '^ready ' "$HOSTDIR/api.out" && break; sleep 0.1; done
grep -q '^ready ' "$HOSTDIR/api.out" || die "the stub API server did not start: $(cat "$HOSTDIR/api.err")"

# The plugin itself, not a shell around it: $PLUGIN_PID is the plugin's, so that the
# cleanup stops it.
REG_SOCKET=$HOSTDIR/registry/gpu.fgpu.io-reg.sock
start_plugin() { # start_plugin [SIM-STATE MEMORY [FLAGS...]]
    local state=${1:-$SIM_STATE} memory=${2-80G}
    shift 2 2>/dev/null || shift $#
    rm -f "$REG_SOCKET"
    env LD_LIBRARY_PATH="$HOSTDIR/simlib" FGPU_SIM_STATE="$state" FGPU_SIM_DEVICES=1 FGPU_SIM_MEMORY="$memory" FGPU_SIM_CONTEXT_OVERHEAD=300M \
        FGPU_SHIM="$REL/libfgpu.so" "$REL/fgpu-kubelet-plugin" --node-name "$NODE" --kubeconfig "$HOSTDIR/kubeconfig" \
        --cdi-root "$CDI_DIR" --state-dir "$HOSTDIR/state" --fgpu "$REL/fgpu" "$@" \
        --kubelet-registrar-directory-path "$HOSTDIR/registry" --kubelet-plugins-directory-path "$HOSTDIR/plugins" \
        >>"$HOSTDIR/plugin.log" 2>&1 &
    PLUGIN_PID=$!
    for _ in $(seq 1 300); do [ -S "$REG_SOCKET" ] && break; sleep 0.1; done
    [ -S "$REG_SOCKET" ] || die "the plugin did not start: $(cat "$HOSTDIR/plugin.log")"
}
start_plugin

# kubelet: tests/python/fake_kubelet.py, with the :authority grpc-go sends.
kubelet() { run "$PY" "$root/tests/python/fake_kubelet.py" --authority grpc-go "$@"; }
claims() { # claims NAMESPACE/NAME/UID...: the JSON list kubelet names claims with
    local out="" c ns name uid
    for c in "$@"; do
        IFS=/ read -r ns name uid <<<"$c"
        out+="${out:+,}{\"namespace\": \"$ns\", \"name\": \"$name\", \"uid\": \"$uid\"}"
    done
    printf '[%s]' "$out"
}
# The CDI IDs of a prepare's answer ($OUT), one a line, for claim $1.
ids_of() { printf '%s' "$OUT" | "$PY" -c 'import json, sys; a = json.load(sys.stdin)["claims"][sys.argv[1]]; print("\n".join(i for d in a["devices"] for i in d["cdiDeviceIds"]))' "$1"; }
error_of() { printf '%s' "$OUT" | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["claims"][sys.argv[1]]["error"])' "$1"; }
requests_of() { printf '%s' "$OUT" | "$PY" -c 'import json, sys; print(" ".join(r for d in json.load(sys.stdin)["claims"][sys.argv[1]]["devices"] for r in d["requestNames"]))' "$1"; }

log "kubelet registers the plugin"
kubelet register "$REG_SOCKET"
check kubelet-registers-the-plugin "GetInfo and NotifyRegistrationStatus with grpc-go's :authority failed" \
    eval 'test "$RC" = 0 && printf "%s" "$OUT" | grep -q "\"endpoint\": \"$HOSTDIR/plugins/gpu.fgpu.io/dra.sock\""'
DRA_SOCKET=$HOSTDIR/plugins/gpu.fgpu.io/dra.sock

# ------------------------------------------------------------------ prepare

log "NodePrepareResources"
kubelet prepare "$DRA_SOCKET" "$(claims "default/train/$UID_TRAIN")"
IDS=$(ids_of "$UID_TRAIN")
check prepare-answers-nvidia-and-fgpu-devices "Prepare did not answer NVIDIA's UUID device and fgpu's claim device" \
    test "$RC/$IDS" = "0/$(printf 'nvidia.com/gpu=%s\nfgpu.io/gpu=claim-%s' "$GPU_UUID" "$UID_TRAIN")"
check prepared-spec-in-cdi-dir "no spec defines fgpu.io/gpu=claim-$UID_TRAIN in $CDI_DIR" \
    grep -q "\"name\": \"claim-$UID_TRAIN\"" "$CDI_DIR/fgpu-claim-$UID_TRAIN.json"
FIRST=$OUT
kubelet prepare "$DRA_SOCKET" "$(claims "default/train/$UID_TRAIN")"
check prepare-again-same-ids "a repeated Prepare answered otherwise" test "$RC/$OUT" = "0/$FIRST"
kubelet prepare "$DRA_SOCKET" "$(claims "default/lost/$UID_LOST")"
check prepare-device-the-node-lacks-fails "a claim on gpu-5 must get an error naming it, and no spec" \
    eval 'test "$RC" = 0 && error_of "$UID_LOST" | grep -q "gpu-5 is not on this node" && test ! -e "$CDI_DIR/fgpu-claim-$UID_LOST.json"'
kubelet prepare "$DRA_SOCKET" "$(claims "default/small/$UID_SMALL")"
SMALL_IDS=$(ids_of "$UID_SMALL")
check prioritized-list-claim-answers-its-request "the claim allocated for subrequest gpu/small must be answered for request gpu" \
    test "$RC/$(requests_of "$UID_SMALL")/$(printf '%s' "$SMALL_IDS" | wc -l)" = "0/gpu/1"
DEVICES=()
for id in $IDS; do DEVICES+=(--device "$id"); done

# ------------------------------------------------------------------ containers

start() { # start NAME PODMAN-RUN-ARGS...: a long-running container of the plain image
    local name=$1
    shift
    run podman run -d --name "$PREFIX-$name" "${RUN_ARGS[@]}" \
        -v "$CLIENT:/usr/local/bin/fgpu-client:ro" \
        -v "$PYNVML:/usr/lib/python3/dist-packages/pynvml.py:ro" \
        "$@" "$IMAGE" sleep infinity
    test "$RC" = 0
}
px() { # px NAME [podman exec args] -- CMD...: podman exec with a timeout, through run
    local name=$1
    shift
    local args=()
    while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do args+=("$1"); shift; done
    shift
    run timeout 60 podman exec "${args[@]}" "$PREFIX-$name" "$@"
}
refused() { local name=$1 mib=$2; shift 2; px "$name" "$@" -- fgpu-client alloc "$mib"; test "$RC" = 2; }
granted() { local name=$1 mib=$2; shift 2; px "$name" "$@" -- fgpu-client alloc "$mib"; test "$RC" = 0; }
total_is() { px "$1" -- fgpu-client info; test "$RC" = 0 && test "$(field total_mib)" = "$2"; }
hold() { # hold NAME OUTFILE MIB: a background allocation held until killed
    local name=$1 out=$2 mib=$3
    podman exec -d "$PREFIX-$name" sh -c "exec fgpu-client alloc $mib --hold >$out 2>&1" >/dev/null
    for _ in $(seq 1 100); do
        px "$name" -- cat "$out"
        printf '%s\n' "$OUT" | grep -q '^holding=1' && return 0
        printf '%s\n' "$OUT" | grep -q '^alloc_result=' && return 1
        sleep 0.1
    done
    return 1
}

log "a pod's container with the claim's devices"
start a "${DEVICES[@]}" || die "podman run with ${IDS//$'\n'/ } failed: $ERR"
px a -- nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits
check nvidia-smi-total-8192 "nvidia-smi does not show the claim's 8192 MiB" test "$(printf '%s' "$OUT" | tr -d ' ')" = "$CAP_MIB"
px a -- python3 -c 'import pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0); print(n.nvmlDeviceGetMemoryInfo(h).total >> 20)'
check pynvml-total-8192 "pynvml's total is not the claim's 8192 MiB" test "$OUT" = "$CAP_MIB"
check cuMemGetInfo-total-8192 "cuMemGetInfo's total is not the claim's 8192 MiB" total_is a "$CAP_MIB"
check over-claim-refused "9000 MiB must be refused under the claim's 8 GiB" refused a 9000
check under-claim-granted "7000 MiB must be granted under the claim's 8 GiB" granted a 7000
check raise-FGPU_LIMIT-refused "FGPU_LIMIT=64G raised the claim's cap" refused a 9000 -e FGPU_LIMIT=64G
px a -- sh -c 'grep -E "^(limit|compute|ledger) " /etc/fgpu/fgpu.conf; stat -c "%U:%G %a" /etc/fgpu/fgpu.conf; grep -c " /run/fgpu " /proc/mounts'
check claim-config-in-container "the container's configuration is not the claim's (8G and 30 % of $GPU_UUID, root-owned, the ledger mounted)" \
    test "$OUT" = "$(printf 'limit = %s=8G,*=1\ncompute = %s=30%%\nledger = /run/fgpu/ledger\nroot:root 644\n1' "$GPU_UUID" "$GPU_UUID")"

log "the pod's second container (the first one's IPC namespace) and a second pod"
if hold a /tmp/holder.out 5000; then
    pass pod-first-container-holds-5000
    start a2 --ipc "container:$PREFIX-a" "${DEVICES[@]}" || die "podman run --ipc container:... failed: $ERR"
    check pod-second-container-shares-cap "a second container of the pod got 3000 MiB beside 5000 held under 8 GiB" refused a2 3000
    check pod-second-container-gets-the-rest "a second container of the pod was refused what is left of the claim" granted a2 2000
    # The plugin killed (as its container is) and started again between the two pods'
    # allocations: it takes the claim's ledger over from the first pod's processes.
    kill -KILL "$PLUGIN_PID"; wait "$PLUGIN_PID" 2>/dev/null
    start_plugin
    check plugin-restart-takes-the-ledger-over "the restarted plugin did not take the claim's ledger over from the first pod" \
        grep -q "the ledger its processes use is kept on, taken over from PID" "$HOSTDIR/plugin.log"
    start b "${DEVICES[@]}" || die "podman run failed: $ERR"
    px b -- readlink /proc/self/ns/ipc
    B_IPC=$OUT
    px a -- readlink /proc/self/ns/ipc
    check second-pod-own-ipc-namespace "the second pod's container must have an IPC namespace of its own" test -n "$B_IPC" -a "$B_IPC" != "$OUT"
    check second-pod-shares-cap "a second pod of the claim got 3000 MiB beside 5000 held under 8 GiB" refused b 3000
    check second-pod-gets-the-rest "a second pod of the claim was refused what is left of the claim" granted b 2000
else
    fail pod-first-container-holds-5000 "$OUT $ERR"
fi
podman rm -f -t 0 "$PREFIX-a" "$PREFIX-a2" "$PREFIX-b" >/dev/null 2>&1

log "the prioritized-list claim's container"
SMALL=()
for id in $SMALL_IDS; do SMALL+=(--device "$id"); done
if start s "${SMALL[@]}"; then
    check prioritized-list-claim-total-4096 "the container of the claim allocated 4Gi for gpu/small does not see a 4096 MiB GPU" total_is s 4096
else
    fail prioritized-list-claim-total-4096 "podman run with $SMALL_IDS failed: $ERR"
fi
podman rm -f -t 0 "$PREFIX-s" >/dev/null 2>&1

# ------------------------------------------------------------------ unprepare

log "NodeUnprepareResources"
kubelet unprepare "$DRA_SOCKET" "$(claims "default/train/$UID_TRAIN" "default/small/$UID_SMALL")"
check unprepare-removes-specs "Unprepare failed or left the claims' specs or files" \
    eval 'test "$RC" = 0 && test ! -e "$CDI_DIR/fgpu-claim-$UID_TRAIN.json" && test ! -e "$CDI_DIR/fgpu-claim-$UID_SMALL.json" && test ! -e "$HOSTDIR/state/claims/$UID_TRAIN"'

log "SIGTERM"
kill -TERM "$PLUGIN_PID"
for _ in $(seq 1 100); do kill -0 "$PLUGIN_PID" 2>/dev/null || break; sleep 0.1; done
wait "$PLUGIN_PID"
RC=$?
check plugin-stops-on-sigterm "the plugin did not stop cleanly on SIGTERM (status $RC): $(tail -n 5 "$HOSTDIR/plugin.log" 2>/dev/null)" \
    eval 'test "$RC" = 0 && test ! -e "$REG_SOCKET"'
PLUGIN_PID=

# ------------------------------------------------------------------ a MIG partition

log "a MIG partition: an A100 80GB in MIG mode"
# The simulated GPUs have the same UUID: the first GPU's stand-in goes, so that CDI finds
# one definition of the name.
rm -f "$NVIDIA_SPEC"
MIG_STATE=$HOSTDIR/sim/mig
msim() { LD_LIBRARY_PATH=$HOSTDIR/simlib FGPU_SIM_STATE=$MIG_STATE FGPU_SIM_DEVICES=1 FGPU_SIM_MEMORY= FGPU_SIM_PRODUCT=a100-80gb FGPU_SIM_MIG=all FGPU_SIM_CONTEXT_OVERHEAD=300M "$@"; }
msim "$CLIENT" nvml >/dev/null 2>&1
chmod 0666 "$MIG_STATE" || die "the simulated driver did not create the MIG state file"
MIG_GPU=$(msim "$REL/fgpu" mig list --json | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["gpus"][0]["uuid"])')
# /proc/driver/nvidia-caps/mig-minors as nv-caps.c lays it out: config 1, monitor 2, then per
# GPU minor and GPU instance 0-14, its access and its compute instances' 0-7.
awk 'BEGIN { print "config 1"; print "monitor 2"; m = 3; for (g = 0; g < 32; g++) for (i = 0; i < 15; i++) {
    printf "gpu%d/gi%d/access %d\n", g, i, m++; for (c = 0; c < 8; c++) printf "gpu%d/gi%d/ci%d/access %d\n", g, i, c, m++ } }' >"$HOSTDIR/mig-minors"
cat >"$MIG_SPEC" <<EOF
cdiVersion: "0.5.0"
kind: "nvidia.com/gpu"
devices:
  - name: "$MIG_GPU"
    containerEdits:
      mounts:
        - {hostPath: "$SIM_CUDA", containerPath: "$LIBDIR/libcuda.so.1", options: ["ro", "nosuid", "nodev", "bind"]}
        - {hostPath: "$SIM_NVML", containerPath: "$LIBDIR/libnvidia-ml.so.1", options: ["ro", "nosuid", "nodev", "bind"]}
        - {hostPath: "$MIG_STATE", containerPath: "/tmp/fgpu-sim-state", options: ["rw", "nosuid", "nodev", "bind"]}
EOF
start_plugin "$MIG_STATE" "" --mig-gpus all --mig-minors "$HOSTDIR/mig-minors" --device-root "$HOSTDIR/devroot"
kubelet register "$REG_SOCKET"
kubelet prepare "$DRA_SOCKET" "$(claims "default/mig/$UID_MIG")"
MIG_IDS=$(ids_of "$UID_MIG")
GI=$(msim "$REL/fgpu" mig list --json | "$PY" -c 'import json, sys; print(" ".join(str(i["gpu_instance"]) for i in json.load(sys.stdin)["gpus"][0]["instances"] if i["placement"] == [6, 1]))')
check mig-prepare-creates-the-instance "Prepare did not create the 1g.10gb at slice 6 (instances there: '$GI'): $(error_of "$UID_MIG")" \
    eval 'test "$RC" = 0 && test -n "$GI" && test "$GI" = "${GI%% *}"'
GI_MINOR=$(awk -v k="gpu0/gi$GI/access" '$1 == k { print $2 }' "$HOSTDIR/mig-minors")
CI_MINOR=$(awk -v k="gpu0/gi$GI/ci0/access" '$1 == k { print $2 }' "$HOSTDIR/mig-minors")
# Stand-ins for the nvidia-caps nodes at that instance's minors (the real driver's major is
# dynamic; these only have to exist for the runtime to pass them on).
mkdir -p "$HOSTDIR/devroot/dev/nvidia-caps"
for m in $GI_MINOR $CI_MINOR; do mknod -m 0444 "$HOSTDIR/devroot/dev/nvidia-caps/nvidia-cap$m" c 241 "$m"; done
M=()
for id in $MIG_IDS; do M+=(--device "$id"); done
if start m "${M[@]}"; then
    # The container's own process has the spec's environment (podman exec sets its own).
    px m -- sh -c 'ls /dev/nvidia-caps | sort | tr "\n" " "; tr "\0" "\n" </proc/1/environ | sed -n "s/^CUDA_VISIBLE_DEVICES=//p"'
    check mig-container-has-the-caps-nodes "the container lacks the instance's nvidia-caps nodes (nvidia-cap$GI_MINOR, nvidia-cap$CI_MINOR) or its MIG device: $OUT" \
        eval 'printf "%s" "$OUT" | grep -qx "$(printf "nvidia-cap%s\nnvidia-cap%s\n" "$GI_MINOR" "$CI_MINOR" | sort | tr "\n" " ")MIG-.*"'
    check mig-container-total-4096 "the container of the claim of 4Gi in the 1g.10gb does not see a 4096 MiB device" total_is m 4096
else
    fail mig-container-total-4096 "podman run with $MIG_IDS failed: $ERR"
fi
podman rm -f -t 0 "$PREFIX-m" >/dev/null 2>&1
kubelet unprepare "$DRA_SOCKET" "$(claims "default/mig/$UID_MIG")"
GONE=$(msim "$REL/fgpu" mig list --json | "$PY" -c 'import json, sys; print(len(json.load(sys.stdin)["gpus"][0]["instances"]))')
check mig-unprepare-destroys-the-instance "Unprepare did not destroy the instance ($GONE left) or left its spec" \
    eval 'test "$RC" = 0 && test "$GONE" = 0 && test ! -e "$CDI_DIR/fgpu-claim-$UID_MIG.json"'
kill -TERM "$PLUGIN_PID"; wait "$PLUGIN_PID" 2>/dev/null
PLUGIN_PID=

summary
[ "$nfail" = 0 ]
