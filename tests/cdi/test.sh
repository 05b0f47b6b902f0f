#!/usr/bin/env bash
# CDI tests: `fgpu cdi generate` and Debian's podman (4.3, which reads CDI specs), with
# the simulated driver and no GPU. The containers run a plain Debian base image with no
# fgpu inside; the cap comes from `--device fgpu.io/gpu=...` beside a stand-in for NVIDIA's
# own CDI spec (`nvidia.com/gpu=0`), which this script writes: it mounts the simulated
# libcuda.so.1 and libnvidia-ml.so.1 where NVIDIA's spec mounts the real ones, the real
# nvidia-smi (Debian's 535 package), and the simulated GPU's state file.
#
#   bash tests/cdi/test.sh          (as root; tests/run.sh runs it)
#
# It installs what it needs (podman, debootstrap, uidmap; ziglang and cargo-zigbuild into
# .venv-images for the glibc-2.17 release build; jsonschema and PyYAML into .venv),
# builds the shipped files (scripts/build-release.sh), a base image with python3
# (debootstrap --variant=minbase --include=python3 bookworm, podman import; cached), and
# checks:
#   - the spec: CDI 0.5.0, valid against the CDI JSON schema of the CDI release Debian
#     ships (0.5.2), YAML and JSON alike; the files it mounts root-owned 0644/0755;
#   - in a container: nvidia-smi, pynvml and cuMemGetInfo show the cap; over the cap is
#     refused; `podman exec` shares the container's cap; FGPU_LIMIT=64G, LD_PRELOAD=,
#     env -i, FGPU_LEDGER do not raise it; neither root nor a non-root user can change
#     the preload or the configuration (write, remove, rename, unmount, remount);
#   - a second container with another fraction of the same GPU is independent;
#   - combinations: nvidia.com/gpu=all with 0-8g (nothing on the other GPU), 0-8g_1-4g,
#     all-8g, two fgpu devices (the last one applies);
#   - images/examples/clearml-agent-cdi.sh, with a stand-in clearml-agent;
#   - user namespaces: podman's default seccomp profile lets a process mount over the
#     preload in one (docs/security.md), images/examples/seccomp-no-userns.py stops it;
#   - regenerating while a container runs keeps its cap;
#   - rootless podman (as a test user this script creates, with uidmap): root's files are
#     distrusted (GPU memory refused), `--owner`'s are trusted and cap the container.
# The mounted files live in a temporary directory under /tmp every user can search.
# Prints PASS/FAIL lines (a failure shows the command, its exit status, stdout and
# stderr) and "N passed, M failed"; exits non-zero if anything failed.
#
# Environment:
#   FGPU_IMAGES_CACHE  cache of the base rootfs and nvidia-smi (default /var/cache/fgpu-images)
#   FGPU_CDI_WORK      scratch directory (default target/cdi-test)
#   FGPU_CDI_KEEP=1    leave the containers and the specs in /var/run/cdi behind
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1

CACHE=${FGPU_IMAGES_CACHE:-/var/cache/fgpu-images}
WORK=${FGPU_CDI_WORK:-$root/target/cdi-test}
PREFIX=fgpu-cdi-test
IMAGE=localhost/$PREFIX/bookworm-python3:latest
# Specs go to /var/run/cdi, the directory CDI reads after /etc/cdi (it wins a conflict
# with a spec of the same kind there); both files are removed at exit.
SPEC=/var/run/cdi/$PREFIX-fgpu.yaml
SPEC_JSON=$WORK/fgpu.json
NVIDIA_SPEC=/var/run/cdi/$PREFIX-nvidia.yaml
# What the specs mount lives in a directory every user can search (rootless podman mounts
# it as the test user): copies of the simulated driver, nvidia-smi, the test client,
# pynvml, the simulated GPUs' state, and fgpu's --config-dir.
HOSTDIR=
CONFIG_DIR=
ROOTLESS=() # podman as the rootless test user, set up at the end
ARCH=$(uname -m)
LIBDIR=/usr/lib/$ARCH-linux-gnu
CAP_MIB=8192
T0=$(date +%s)

# shellcheck source=tests/cdi/harness.sh
source "$root/tests/cdi/harness.sh"

mkdir -p "$WORK" "$CACHE" /var/run/cdi || die "cannot create $WORK, $CACHE or /var/run/cdi"

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

# The CDI JSON schema of the CDI release Debian ships (0.5.2, the one podman 4.3 builds
# with): from Debian's Go source package, unpacked, not installed.
SCHEMA_DIR=$WORK/cdi-schema/usr/share/gocode/src/github.com/container-orchestrated-devices/container-device-interface/schema
if [ ! -f "$SCHEMA_DIR/schema.json" ]; then
    log "fetching the CDI schema (golang-github-container-orchestrated-devices-container-device-interface-dev)"
    rm -rf "$WORK/cdi-schema" && mkdir -p "$WORK/cdi-schema/pkg"
    download() {
        (cd "$WORK/cdi-schema/pkg" && apt-get download -qq -o APT::Sandbox::User=root \
            golang-github-container-orchestrated-devices-container-device-interface-dev)
    }
    { download || { apt-get update -qq && download; }; } >"$WORK/schema.log" 2>&1
    deb=$(ls "$WORK"/cdi-schema/pkg/*.deb 2>/dev/null | head -n 1)
    [ -n "$deb" ] && dpkg -x "$deb" "$WORK/cdi-schema"
    [ -f "$SCHEMA_DIR/schema.json" ] || die "no CDI schema (see $WORK/schema.log)"
fi

PY=${FGPU_TEST_PYTHON:-$root/.venv/bin/python}
if ! "$PY" -c 'import jsonschema, yaml, pynvml' 2>/dev/null; then
    log "pip install -r tests/python/requirements.txt into .venv"
    { [ -x "$PY" ] || python3 -m venv "$root/.venv"; } && PY=$root/.venv/bin/python \
        && "$PY" -m pip install -q --disable-pip-version-check -r tests/python/requirements.txt >"$WORK/pip.log" 2>&1 \
        || die "pip install failed (see $WORK/pip.log)"
fi

VENV_IMAGES=$root/.venv-images
if [ ! -x "$VENV_IMAGES/bin/cargo-zigbuild" ] || ! "$VENV_IMAGES/bin/python" -c 'import ziglang' 2>/dev/null; then
    log "pip install ziglang cargo-zigbuild into .venv-images"
    python3 -m venv "$VENV_IMAGES" && "$VENV_IMAGES/bin/pip" install -q --disable-pip-version-check \
        ziglang cargo-zigbuild >"$WORK/pip-images.log" 2>&1 || die "pip install failed (see $WORK/pip-images.log)"
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

# Rootless podman leaves a pause process (catatonit) holding the user's namespaces after
# its last container; stop it when that user has no container left, so the run leaves
# nothing running. Its PID is in the user's runtime directory, which the user can write:
# only a process of that user is signalled.
stop_rootless_pause() {
    local pidfile="/run/user/$ROOTLESS_UID/libpod/tmp/pause.pid" pid
    [ -n "$("${ROOTLESS[@]}" ps -aq 2>/dev/null)" ] && return 0
    pid=$(cat "$pidfile" 2>/dev/null) || return 0
    case $pid in '' | *[!0-9]*) return 0 ;; esac
    # It ignores SIGTERM (and holds nothing worth a clean exit): podman starts a new one.
    [ "$(stat -c %u "/proc/$pid" 2>/dev/null)" = "$ROOTLESS_UID" ] && kill -KILL "$pid" 2>/dev/null
    rm -f "$pidfile"
    return 0
}

cleanup() {
    [ "${FGPU_CDI_KEEP:-0}" = 1 ] && return 0
    local ids
    ids=$(podman ps -aq --filter "label=$PREFIX=1" 2>/dev/null)
    [ -n "$ids" ] && podman rm -f -t 0 $ids >/dev/null 2>&1
    if [ "${#ROOTLESS[@]}" -gt 0 ]; then
        ids=$("${ROOTLESS[@]}" ps -aq --filter "label=$PREFIX=1" 2>/dev/null)
        [ -n "$ids" ] && "${ROOTLESS[@]}" rm -f -t 0 $ids >/dev/null 2>&1
        stop_rootless_pause
    fi
    rm -f "$SPEC" "$NVIDIA_SPEC"
    [ -n "$HOSTDIR" ] && rm -rf "$HOSTDIR"
    return 0
}
trap cleanup EXIT
cleanup

# ------------------------------------------------------------------ builds

log "cargo build --release (fgpu, the shim, the simulated driver)"
cargo build --release -p fgpu-cli -p fgpu-shim -p fgpu-sim-cuda -p fgpu-sim-nvml >"$WORK/cargo.log" 2>&1 \
    || die "cargo build failed (see $WORK/cargo.log)"
log "scripts/build-release.sh (the shipped glibc-2.17 fgpu and libfgpu.so)"
FGPU_BUILD_VENV=$VENV_IMAGES scripts/build-release.sh >"$WORK/build-release.log" 2>&1 \
    || die "scripts/build-release.sh failed (see $WORK/build-release.log)"
FGPU=$root/target/dist/fgpu
HOSTDIR=$(mktemp -d /tmp/$PREFIX.XXXXXX) && chmod 755 "$HOSTDIR" || die "mktemp failed"
CONFIG_DIR=$HOSTDIR/fgpu-cdi
mkdir -p "$HOSTDIR/simlib" "$HOSTDIR/bin" "$HOSTDIR/sim"
SIM_CUDA=$HOSTDIR/simlib/libcuda.so.1
SIM_NVML=$HOSTDIR/simlib/libnvidia-ml.so.1
cp target/release/libfgpu_sim_cuda.so "$SIM_CUDA" && cp target/release/libfgpu_sim_nvml.so "$SIM_NVML" \
    || die "no simulated driver in target/release"
stage_host_tools
ensure_image

# ------------------------------------------------------------------ the simulated GPUs

# Two state files: one GPU (what nvidia.com/gpu=0 gives) and two GPUs (nvidia.com/gpu=all),
# two views of one host: GPU 0 has the same UUID in both, as they share a UUID seed (each
# state file otherwise draws its own). Created by root here, used by every user in containers.
sim() { # sim STATE CMD...: a host command against the simulated driver
    local state=$1
    shift
    LD_LIBRARY_PATH=$HOSTDIR/simlib FGPU_SIM_STATE=$state "$@"
}
gpu0_uuid() { # gpu0_uuid STATE: GPU 0's UUID as NVML names it
    sim "$1" "$PY" -c 'import pynvml as n; n.nvmlInit(); u = n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(0)); print(u.decode() if isinstance(u, bytes) else u)'
}
UUID_SEED=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
FGPU_SIM_UUID_SEED=$UUID_SEED FGPU_SIM_DEVICES=1 FGPU_SIM_MEMORY=80G FGPU_SIM_CONTEXT_OVERHEAD=300M sim "$HOSTDIR/sim/one" "$CLIENT" nvml >/dev/null 2>&1
FGPU_SIM_UUID_SEED=$UUID_SEED FGPU_SIM_DEVICES=2 FGPU_SIM_MEMORY=80G FGPU_SIM_CONTEXT_OVERHEAD=300M sim "$HOSTDIR/sim/two" "$CLIENT" nvml >/dev/null 2>&1
chmod 0666 "$HOSTDIR/sim/one" "$HOSTDIR/sim/two" || die "the simulated driver did not create its state files"
GPU0_UUID=$(gpu0_uuid "$HOSTDIR/sim/one")
case $GPU0_UUID in GPU-????????-????-????-????-????????????) ;; *) die "pynvml does not read the simulated GPU's UUID ($GPU0_UUID)" ;; esac
[ "$(gpu0_uuid "$HOSTDIR/sim/two")" = "$GPU0_UUID" ] || die "GPU 0 has another UUID in the two-GPU state file, despite FGPU_SIM_UUID_SEED=$UUID_SEED"
host_used_mib() { sim "$HOSTDIR/sim/one" "$CLIENT" nvml 2>/dev/null | sed -n 's/^nvml_used_mib=//p'; }

# The stand-in for NVIDIA's spec (nvidia-ctk cdi generate): the driver libraries and
# nvidia-smi for every device, the GPU (here: the simulator's state) per device.
cat >"$NVIDIA_SPEC" <<EOF
cdiVersion: "0.5.0"
kind: "nvidia.com/gpu"
containerEdits:
  mounts:
    - {hostPath: "$SIM_CUDA", containerPath: "$LIBDIR/libcuda.so.1", options: ["ro", "nosuid", "nodev", "bind"]}
    - {hostPath: "$SIM_NVML", containerPath: "$LIBDIR/libnvidia-ml.so.1", options: ["ro", "nosuid", "nodev", "bind"]}
    - {hostPath: "$NVSMI", containerPath: "/usr/bin/nvidia-smi", options: ["ro", "nosuid", "nodev", "bind"]}
devices:
  - name: "0"
    containerEdits:
      mounts:
        - {hostPath: "$HOSTDIR/sim/one", containerPath: "/tmp/fgpu-sim-state", options: ["rw", "nosuid", "nodev", "bind"]}
  - name: "all"
    containerEdits:
      mounts:
        - {hostPath: "$HOSTDIR/sim/two", containerPath: "/tmp/fgpu-sim-state", options: ["rw", "nosuid", "nodev", "bind"]}
EOF

# ------------------------------------------------------------------ fgpu cdi generate

log "fgpu cdi generate"
rm -rf "$CONFIG_DIR"
run sim "$HOSTDIR/sim/two" "$FGPU" cdi generate --output "$SPEC" --config-dir "$CONFIG_DIR" --combine 0-8g,1-4g
check generate-writes-spec "fgpu cdi generate failed" test "$RC" = 0 -a -s "$SPEC"
check generate-names-devices "the summary does not list 0-8g, 1-4g, all-8g, 0-25pct and 0-8g_1-4g" \
    eval 'for d in 0-8g 0-4g 1-4g all-8g 0-25pct 0-8g_1-4g; do printf "%s\n" "$ERR" | grep -qw -- "$d" || exit 1; done'
run sim "$HOSTDIR/sim/two" "$FGPU" cdi generate --output "$SPEC_JSON" --config-dir "$CONFIG_DIR" --combine 0-8g,1-4g
check generate-json "fgpu cdi generate --output x.json failed" test "$RC" = 0 -a -s "$SPEC_JSON"

run "$PY" - "$SCHEMA_DIR" "$SPEC" "$SPEC_JSON" <<'EOF'
import json, sys, yaml, jsonschema, pathlib
schema_dir = pathlib.Path(sys.argv[1])
schema = json.loads((schema_dir / "schema.json").read_text())
defs = json.loads((schema_dir / "defs.json").read_text())
# schema.json refers to defs.json by file name: resolve it as a local document.
store = {"defs.json": defs}
resolver = jsonschema.RefResolver(base_uri="", referrer=schema, store=store)
docs = [yaml.safe_load(open(sys.argv[2])), json.load(open(sys.argv[3]))]
for doc in docs:
    jsonschema.Draft7Validator(schema, resolver=resolver).validate(doc)
    assert doc["cdiVersion"] == "0.5.0" and doc["kind"] == "fgpu.io/gpu", doc.get("cdiVersion")
    # CDI 0.5 reads specs strictly: only the fields its Go types define.
    assert set(doc) <= {"cdiVersion", "kind", "devices", "containerEdits"}, set(doc)
    for dev in doc["devices"]:
        assert set(dev) == {"name", "containerEdits"}, dev
        for m in dev["containerEdits"]["mounts"] + doc["containerEdits"]["mounts"]:
            assert set(m) <= {"hostPath", "containerPath", "options", "type"}, m
assert docs[0] == docs[1], "the YAML and JSON specs differ"
print("valid", len(docs[0]["devices"]), "devices")
EOF
check spec-valid-cdi-0.5-schema "the spec does not validate against Debian's CDI 0.5.2 schema" test "$RC" = 0

run sh -c "stat -c '%U:%G %a %n' '$CONFIG_DIR/ld.so.preload' '$CONFIG_DIR/devices/0-8g/fgpu.conf' '$CONFIG_DIR/lib/libfgpu.so' '$CONFIG_DIR/devices/0-8g' '$CONFIG_DIR/lib'; cmp '$CONFIG_DIR/lib/libfgpu.so' '$root/target/dist/libfgpu.so' && echo same"
check generate-files-root-owned-read-only "the mounted files are not root-owned 0644 (0755), or the library is not the shipped one" \
    test "$OUT" = "$(printf 'root:root 644 %s\nroot:root 644 %s\nroot:root 755 %s\nroot:root 755 %s\nroot:root 755 %s\nsame' \
        "$CONFIG_DIR/ld.so.preload" "$CONFIG_DIR/devices/0-8g/fgpu.conf" "$CONFIG_DIR/lib/libfgpu.so" "$CONFIG_DIR/devices/0-8g" "$CONFIG_DIR/lib")"

run sim "$HOSTDIR/sim/two" "$FGPU" cdi generate --output - --config-dir "$WORK/unused" --sizes 8x
check generate-bad-size-usage-error "a bad --sizes must exit 2 and name the argument" \
    eval 'test "$RC" = 2 && printf "%s" "$ERR" | grep -q -- "--sizes" && printf "%s" "$ERR" | grep -q "8x"'
run env -u LD_LIBRARY_PATH "$FGPU" cdi generate --output - --config-dir "$WORK/unused"
check generate-without-driver-fails "without NVML it must exit 1 with one line saying why" \
    eval 'test "$RC" = 1 && test "$(printf "%s\n" "$ERR" | wc -l)" = 1 && printf "%s" "$ERR" | grep -q "no GPU found through NVML"'

# ------------------------------------------------------------------ container helpers

engine() { # engine NAME: sets ENGINE, the podman command for NAME (rl-*: rootless podman's)
    case $1 in
        rl-*) ENGINE=("${ROOTLESS[@]}") ;;
        *) ENGINE=(podman) ;;
    esac
}
start() { # start NAME PODMAN-RUN-ARGS...: a long-running container of the plain image
    local name=$1
    shift
    engine "$name"
    run "${ENGINE[@]}" run -d --name "$PREFIX-$name" "${RUN_ARGS[@]}" \
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
    engine "$name"
    run timeout 60 "${ENGINE[@]}" exec "${args[@]}" "$PREFIX-$name" "$@"
}
# refused/granted NAME MIB [exec args]: one allocation (fgpu-client exits 2 when refused)
refused() { local name=$1 mib=$2; shift 2; px "$name" "$@" -- fgpu-client alloc "$mib"; test "$RC" = 2; }
granted() { local name=$1 mib=$2; shift 2; px "$name" "$@" -- fgpu-client alloc "$mib"; test "$RC" = 0; }
total_is() { # total_is NAME MIB [exec args]: cuMemGetInfo's total
    local name=$1 mib=$2
    shift 2
    px "$name" "$@" -- fgpu-client info
    test "$RC" = 0 && test "$(field total_mib)" = "$mib"
}
hold() { # hold NAME OUTFILE MIB: a background allocation (podman exec -d) held until killed
    local name=$1 out=$2 mib=$3
    engine "$name"
    "${ENGINE[@]}" exec -d "$PREFIX-$name" sh -c "exec fgpu-client alloc $mib --hold >$out 2>&1" >/dev/null
    for _ in $(seq 1 100); do
        px "$name" -- cat "$out"
        printf '%s\n' "$OUT" | grep -q '^holding=1' && return 0
        printf '%s\n' "$OUT" | grep -q '^alloc_result=' && return 1
        sleep 0.1
    done
    return 1
}
wait_until() { # wait_until SECONDS CMD...
    local end=$((SECONDS + $1))
    shift
    while [ "$SECONDS" -lt "$end" ]; do
        "$@" && return 0
        sleep 0.2
    done
    "$@"
}

BASE_USED=$(host_used_mib)
[ -n "$BASE_USED" ] || die "the simulated driver does not answer on the host"

# ------------------------------------------------------------------ one container, 0-8g

log "a container with nvidia.com/gpu=0 and fgpu.io/gpu=0-8g"
start a --device nvidia.com/gpu=0 --device fgpu.io/gpu=0-8g || die "podman run failed: $ERR"

px a -- sh -c 'cat /etc/ld.so.preload; stat -c "%U:%G %a" /etc/ld.so.preload /etc/fgpu/fgpu.conf /usr/lib/fgpu/libfgpu.so; grep "^limit" /etc/fgpu/fgpu.conf; grep -c " /run/fgpu tmpfs " /proc/mounts'
check container-files-mounted "the container does not see the preload, the config and the tmpfs as generated" \
    test "$OUT" = "$(printf '/usr/lib/fgpu/libfgpu.so\nroot:root 644\nroot:root 644\nroot:root 755\nlimit = %s=8G,*=1\n1' "$GPU0_UUID")"
px a -- sh -c 'ls / >/dev/null; echo done'
check untouched-without-cuda "a process that never touches CUDA must not notice the shim" test "$RC/$OUT/$ERR" = "0/done/"

px a -- nvidia-smi
check nvidia-smi-shows-8192MiB "nvidia-smi does not show an 8192 MiB GPU" eval 'printf "%s" "$OUT" | grep -q "/ *8192MiB"'
px a -- nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits
check nvidia-smi-query-total-8192 "memory.total is not 8192" test "$(printf '%s' "$OUT" | tr -d ' ')" = "$CAP_MIB"
px a -- python3 -c 'import pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0); print(n.nvmlDeviceGetMemoryInfo(h).total >> 20)'
check pynvml-total-8192 "pynvml's nvmlDeviceGetMemoryInfo total is not 8192 MiB" test "$OUT" = "$CAP_MIB"
check cuMemGetInfo-total-8192 "cuMemGetInfo's total is not 8192 MiB" total_is a "$CAP_MIB"
check over-cap-refused "9000 MiB must be refused under an 8 GiB cap" refused a 9000
check under-cap-granted "7000 MiB must be granted under an 8 GiB cap" granted a 7000

# What the workload can do to the files that hold the cap: nothing, as root or not.
# Each attempt prints a word when it succeeds; none may. The last line proves the attempts
# ran to the end inside the container: an exec that failed prints nothing either.
attempts='
    exec 2>/dev/null
    echo "limit = 64G" >>/etc/fgpu/fgpu.conf && echo wrote-config
    echo >/etc/ld.so.preload && echo wrote-preload
    rm -f /etc/fgpu/fgpu.conf && echo removed-config
    rm -f /etc/ld.so.preload && echo removed-preload
    mv /etc/fgpu /etc/fgpu.old && echo renamed-config-dir
    mv /usr/lib/fgpu /usr/lib/fgpu.old && echo renamed-lib-dir
    echo x >/tmp/empty; mv /tmp/empty /etc/ld.so.preload && echo replaced-preload
    touch /etc/fgpu/other && echo created-in-config-dir
    chmod 666 /etc/fgpu/fgpu.conf && echo chmod-config
    chown 65534 /etc/fgpu/fgpu.conf && echo chown-config
    umount /etc/ld.so.preload && echo unmounted-preload
    umount -l /etc/fgpu && echo unmounted-config
    mount -o remount,rw /etc/fgpu && echo remounted-config
    mount --bind /tmp/empty /etc/ld.so.preload && echo overmounted-preload
    echo attempts-made'
# attempts_changed_nothing: the attempts ran (exit 0, their last line) and none printed a word.
attempts_changed_nothing() { test "$RC" = 0 && test "$OUT" = attempts-made; }
if hold a /tmp/holder.out 5000; then
    pass exec-holder-allocates-5000
    HOLDER=$(field pid)
    check exec-shares-cap-3000-refused "a second podman exec process got 3000 MiB beside 5000 held" refused a 3000
    check exec-shares-cap-2000-granted "a second podman exec process was refused what is left" granted a 2000
    px a -- nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits
    used=$(printf '%s' "$OUT" | tr -d ' ')
    # Exactly the container's: 5000 MiB and the holder's 300 MiB context (the whole GPU's
    # figure, or another container's, would differ).
    check nvidia-smi-used-is-the-containers "memory.used=$used with 5000 MiB held (want 5300)" test "$RC/$used" = 0/5300
    px a -- python3 -c 'import pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0); print(n.nvmlDeviceGetMemoryInfo(h).used >> 20)'
    check pynvml-used-is-the-containers "pynvml used=$OUT with 5000 MiB held (want 5300)" test "$RC/$OUT" = 0/5300
    px a -- /usr/lib/fgpu/fgpu status
    check fgpu-status-inside-lists-holder "/usr/lib/fgpu/fgpu status does not list the holder $HOLDER" \
        eval 'test "$RC" = 0 && printf "%s" "$OUT" | grep -qw "$HOLDER" && printf "%s" "$OUT" | grep -q /run/fgpu/ledger'

    # Attempts to raise the cap from inside, each asking for 3000 MiB more.
    check raise-FGPU_LIMIT-64G-refused "FGPU_LIMIT=64G raised the cap" refused a 3000 -e FGPU_LIMIT=64G
    check raise-FGPU_LIMIT-64G-total-8192 "FGPU_LIMIT=64G changed cuMemGetInfo's total" total_is a "$CAP_MIB" -e FGPU_LIMIT=64G
    check raise-empty-LD_PRELOAD-refused "LD_PRELOAD= raised the cap" refused a 3000 -e LD_PRELOAD=
    px a -- env -i /usr/local/bin/fgpu-client alloc 3000
    check raise-env-i-refused "env -i raised the cap" test "$RC" = 2
    px a -- env -i FGPU_LIMIT=64G LD_PRELOAD= /usr/local/bin/fgpu-client info
    check raise-env-i-total-8192 "env -i FGPU_LIMIT=64G changed the total" eval 'test "$RC" = 0 && test "$(field total_mib)" = "$CAP_MIB"'
    check raise-own-FGPU_LEDGER-refused "FGPU_LEDGER=/tmp/own escaped the container's ledger" refused a 3000 -e FGPU_LEDGER=/tmp/own
    check raise-non-root-refused "a non-root user got 3000 MiB beside 5000 held" refused a 3000 -u 65534:65534
    check raise-non-root-FGPU_LIMIT-64G-refused "a non-root user raised the cap with FGPU_LIMIT=64G" \
        refused a 3000 -u 65534:65534 -e FGPU_LIMIT=64G -e LD_PRELOAD=

    for who in root nobody; do
        user=0:0
        [ "$who" = nobody ] && user=65534:65534
        px a -u "$user" -- sh -c "$attempts"
        check "$who-cannot-change-preload-or-config" "$who changed a file that holds the cap, or the attempts did not run: $OUT" \
            attempts_changed_nothing
    done
    # The mounts' parents: overlay refuses to rename a directory of the image's layers.
    px a -- python3 -c '
import errno, os
for d in ("/etc", "/usr/lib", "/usr"):
    try:
        os.rename(d, d + ".old")
        print(d, "renamed")
    except OSError as e:
        print(d, errno.errorcode[e.errno])'
    check overlay-refuses-renaming-etc-and-usr "root renamed /etc, /usr/lib or /usr (docs/security.md says overlay refuses)" \
        test "$OUT" = "$(printf '/etc EXDEV\n/usr/lib EXDEV\n/usr EXDEV')"
    px a -- sh -c 'cat /etc/ld.so.preload; grep "^limit" /etc/fgpu/fgpu.conf'
    check files-unchanged-after-attempts "the preload or the config changed" \
        test "$OUT" = "$(printf '/usr/lib/fgpu/libfgpu.so\nlimit = %s=8G,*=1' "$GPU0_UUID")"
    check cap-holds-after-attempts "3000 MiB more was granted after the attempts" refused a 3000

    # The holder killed inside the container: its share comes back.
    px a -- sh -c "kill -9 $HOLDER"
    check exec-killed-holder-share-returned "7000 MiB is still refused after kill -9 of the holder" wait_until 10 granted a 7000
else
    fail exec-holder-allocates-5000 "$OUT $ERR"
fi

# ------------------------------------------------------------------ two containers

log "two containers on one GPU: fgpu.io/gpu=0-8g and fgpu.io/gpu=0-4g"
start b --device nvidia.com/gpu=0 --device fgpu.io/gpu=0-4g || die "podman run failed: $ERR"
check second-container-total-4096 "the 0-4g container does not see 4096 MiB" total_is b 4096
if hold a /tmp/h2.out 6000 && hold b /tmp/h.out 3000; then
    pass two-containers-hold-6000-and-3000
    used=$(host_used_mib)
    check two-containers-one-gpu "the host sees $used MiB used, not both holdings (9000 MiB and two contexts: $((BASE_USED + 9600)))" \
        test "$used" = $((BASE_USED + 9600))
    check two-containers-a-capped "container a got 3000 MiB more beside its 6000" refused a 3000
    check two-containers-b-capped "container b got 1000 MiB more beside its 3000 under 4 GiB" refused b 1000
    check two-containers-b-independent "container b was refused 400 MiB that fit its own cap" granted b 400
    px b -- nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits
    check two-containers-nvidia-smi-own-view "b's nvidia-smi does not show its own 3300 MiB (3000 and a context) of 4096" \
        eval 'test "$RC/$(printf "%s" "$OUT" | tr -d " ")" = 0/3300,4096'
else
    fail two-containers-hold-6000-and-3000 "$OUT $ERR"
fi
podman rm -f -t 0 "$PREFIX-a" "$PREFIX-b" >/dev/null 2>&1
host_used_le() { # host_used_le MIB: what the host sees used on the simulated GPU
    run sim "$HOSTDIR/sim/one" "$CLIENT" nvml
    local used
    used=$(field nvml_used_mib)
    test -n "$used" && test "$used" -le "$1"
}
check removed-containers-memory-returned "the host still sees more than $BASE_USED MiB used" wait_until 15 host_used_le "$BASE_USED"

# ------------------------------------------------------------------ combinations

log "combinations (two simulated GPUs: nvidia.com/gpu=all)"
gpu_total_is() { # gpu_total_is NAME INDEX MIB: cuMemGetInfo's total on GPU INDEX
    total_is "$1" "$3" -e "CUDA_VISIBLE_DEVICES=$2"
}
gpu_gives_nothing() { # gpu_gives_nothing NAME INDEX: even a context is refused on GPU INDEX
    px "$1" -e "CUDA_VISIBLE_DEVICES=$2" -- fgpu-client info
    test "$RC" = 1 && printf '%s' "$OUT" | grep -q "cuDevicePrimaryCtxRetain result=2"
}
start all-one --device nvidia.com/gpu=all --device fgpu.io/gpu=0-8g || die "podman run failed: $ERR"
check all-gpus-0-8g-gpu0-capped "GPU 0 is not capped at 8192 MiB" gpu_total_is all-one 0 8192
check all-gpus-0-8g-gpu1-nothing "GPU 1, not named by the fgpu device, must give nothing (its context refused)" \
    gpu_gives_nothing all-one 1
px all-one -- nvidia-smi --query-gpu=index,memory.total --format=csv,noheader,nounits
check all-gpus-0-8g-nvidia-smi "nvidia-smi does not show 8192 MiB on GPU 0 and 0 on GPU 1" \
    test "$(printf '%s' "$OUT" | tr -d ' ')" = "$(printf '0,8192\n1,0')"

start combo --device nvidia.com/gpu=all --device fgpu.io/gpu=0-8g_1-4g || die "podman run failed: $ERR"
check combination-gpu0-8192 "0-8g_1-4g: GPU 0 is not 8192 MiB" gpu_total_is combo 0 8192
check combination-gpu1-4096 "0-8g_1-4g: GPU 1 is not 4096 MiB" gpu_total_is combo 1 4096

start all-8g --device nvidia.com/gpu=all --device fgpu.io/gpu=all-8g || die "podman run failed: $ERR"
check all-8g-gpu0-8192 "all-8g: GPU 0 is not 8192 MiB" gpu_total_is all-8g 0 8192
check all-8g-gpu1-8192 "all-8g: GPU 1 is not 8192 MiB" gpu_total_is all-8g 1 8192

start two-devices --device nvidia.com/gpu=all --device fgpu.io/gpu=0-8g --device fgpu.io/gpu=1-4g || die "podman run failed: $ERR"
check two-fgpu-devices-last-applies "with 0-8g then 1-4g, GPU 1 is not 4096 MiB" gpu_total_is two-devices 1 4096
check two-fgpu-devices-first-gpu-nothing "with 0-8g then 1-4g, GPU 0 must give nothing (the last config names only GPU 1)" \
    gpu_gives_nothing two-devices 0

start uncapped --device nvidia.com/gpu=0 || die "podman run failed: $ERR"
check without-fgpu-device-uncapped "without an fgpu device the container must see the whole 80 GiB GPU" total_is uncapped 81920

# ------------------------------------------------------------------ the ClearML example

log "images/examples/clearml-agent-cdi.sh (a stand-in clearml-agent records its calls)"
mkdir -p "$WORK/clearml/bin"
cat >"$WORK/clearml/bin/clearml-agent" <<'EOF'
#!/bin/sh
printf '%s|%s|%s\n' "$CLEARML_WORKER_ID" "$CLEARML_AGENT_EXTRA_DOCKER_ARGS" "$*" >>"$CLEARML_LOG"
EOF
chmod +x "$WORK/clearml/bin/clearml-agent"
rm -f "$WORK/clearml/calls"
run env "PATH=$WORK/clearml/bin:$PATH" "CLEARML_LOG=$WORK/clearml/calls" NVIDIA_CDI=1 \
    sh images/examples/clearml-agent-cdi.sh 3 8g 0 gpu0-8g
calls=$(cat "$WORK/clearml/calls" 2>/dev/null)
check clearml-example-starts-agents "the example did not start 3 agents on queue gpu0-8g with the fgpu device in the extra arguments: $calls" \
    eval 'test "$RC" = 0 && test "$(printf "%s\n" "$calls" | grep -c "|--device nvidia.com/gpu=0 --device fgpu.io/gpu=0-8g|daemon --queue gpu0-8g --docker .* --gpus 0 --detached$")" = 3'
# A task's container as the agent starts it: the extra arguments, the task's own image.
extra=$(printf '%s\n' "$calls" | head -n 1 | cut -d'|' -f2)
# shellcheck disable=SC2086 # the agent splits the arguments on spaces too
start clearml-task $extra || die "podman run with the example's arguments failed: $ERR"
check clearml-example-task-capped "a task started with the example's arguments does not see 8192 MiB" total_is clearml-task "$CAP_MIB"
check clearml-example-task-over-cap-refused "a task started with the example's arguments got 9000 MiB" refused clearml-task 9000

# ------------------------------------------------------------------ user namespaces

log "user namespaces: podman's default seccomp profile, and images/examples/seccomp-no-userns.py"
# As nobody: a new user namespace, an empty file mounted over /etc/ld.so.preload there,
# and an allocation past the cap.
escape='echo >/tmp/empty; unshare -Urm sh -c "mount --bind /tmp/empty /etc/ld.so.preload && exec fgpu-client alloc 9000"'
start userns --device nvidia.com/gpu=0 --device fgpu.io/gpu=0-8g || die "podman run failed: $ERR"
px userns -u 65534:65534 -- sh -c "$escape"
check podman-default-seccomp-allows-userns-escape "docs/security.md says podman's default profile lets a process leave the cap through a user namespace; if podman now refuses it, update the docs" \
    eval 'test "$RC" = 0 && printf "%s" "$OUT" | grep -q "^alloc_result=0"'
run python3 images/examples/seccomp-no-userns.py
printf '%s\n' "$OUT" >"$HOSTDIR/seccomp-no-userns.json"
check seccomp-no-userns-profile-written "images/examples/seccomp-no-userns.py failed" test "$RC" = 0
start userns-blocked --security-opt "seccomp=$HOSTDIR/seccomp-no-userns.json" \
    --device nvidia.com/gpu=0 --device fgpu.io/gpu=0-8g || die "podman run failed: $ERR"
px userns-blocked -u 65534:65534 -- sh -c "$escape"
check seccomp-no-userns-blocks-escape "with the profile, a user namespace still let a process past the cap" \
    eval 'test "$RC" != 0 && ! printf "%s" "$OUT" | grep -q "^alloc_result=0"'
px userns-blocked -u 0:0 -- sh -c "$escape"
check seccomp-no-userns-blocks-escape-as-root "with the profile, root still left the cap through a user namespace" \
    eval 'test "$RC" != 0 && ! printf "%s" "$OUT" | grep -q "^alloc_result=0"'
px userns-blocked -- python3 -c 'import threading, pynvml as n
n.nvmlInit(); out = []
t = threading.Thread(target=lambda: out.append(n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(0)).total >> 20))
t.start(); t.join(); print(out[0])'
check seccomp-no-userns-threads-and-cap "with the profile, a threaded pynvml program does not run or does not see 8192 MiB" test "$OUT" = "$CAP_MIB"
check seccomp-no-userns-refuses-over-cap "with the profile, 9000 MiB was not refused" refused userns-blocked 9000

# ------------------------------------------------------------------ regenerating

log "fgpu cdi generate again, without 0-8g, while a 0-8g container runs"
start keep --device nvidia.com/gpu=0 --device fgpu.io/gpu=0-8g || die "podman run failed: $ERR"
run sim "$HOSTDIR/sim/two" "$FGPU" cdi generate --output "$SPEC" --config-dir "$CONFIG_DIR" --sizes 4g --percents=
check regenerate-keeps-old-device-files "regenerating without 0-8g must keep its files and say so" \
    eval 'test "$RC" = 0 && printf "%s" "$ERR" | grep -q "kept the files of .* no longer generated (.*0-8g"'
check regenerate-running-container-still-capped "a new process in a running 0-8g container is not capped at 8192 MiB after regenerating" \
    total_is keep "$CAP_MIB"
check regenerate-running-container-refuses "a new process in a running 0-8g container got 9000 MiB after regenerating" refused keep 9000
run sim "$HOSTDIR/sim/two" "$FGPU" cdi generate --output "$SPEC" --config-dir "$CONFIG_DIR"
[ "$RC" = 0 ] || die "fgpu cdi generate failed: $ERR"

# ------------------------------------------------------------------ rootless podman

log "rootless podman"
ROOTLESS_USER=$PREFIX-user
if ! command -v newuidmap >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends uidmap >"$WORK/apt-uidmap.log" 2>&1 \
        || die "apt-get install uidmap failed (see $WORK/apt-uidmap.log)"
fi
id -u "$ROOTLESS_USER" >/dev/null 2>&1 || useradd -m -s /bin/sh "$ROOTLESS_USER" || die "useradd $ROOTLESS_USER failed"
grep -q "^$ROOTLESS_USER:" /etc/subuid || usermod --add-subuids 400000-465535 "$ROOTLESS_USER" || die "no subordinate UIDs"
grep -q "^$ROOTLESS_USER:" /etc/subgid || usermod --add-subgids 400000-465535 "$ROOTLESS_USER" || die "no subordinate GIDs"
ROOTLESS_UID=$(id -u "$ROOTLESS_USER")
install -d -m 0700 -o "$ROOTLESS_USER" "/run/user/$ROOTLESS_UID"
install -m 0644 "$WORK/containers.conf" "$HOSTDIR/containers.conf"
# podman as the test user, from a directory it may enter
ROOTLESS=(runuser -u "$ROOTLESS_USER" -- env -C / "HOME=$(getent passwd "$ROOTLESS_USER" | cut -d: -f6)"
    "XDG_RUNTIME_DIR=/run/user/$ROOTLESS_UID" "CONTAINERS_CONF=$HOSTDIR/containers.conf" podman)
rootless() { "${ROOTLESS[@]}" "$@"; }
if ! rootless image exists "$IMAGE"; then
    run rootless import --change 'CMD ["bash"]' "$CACHE/bookworm-minbase-python3.tar" "$IMAGE"
    [ "$RC" = 0 ] || die "rootless podman import failed: $ERR"
fi

# The spec as root wrote it: in the user's namespace the files belong to nobody.
start rl-root --device nvidia.com/gpu=0 --device fgpu.io/gpu=0-8g || die "rootless podman run failed: $ERR"
px rl-root -- fgpu-client info
check rootless-root-owned-config-fails-closed "a rootless container must refuse GPU memory, saying why, when the config is not root's inside" \
    eval 'test "$RC" = 1 && printf "%s" "$ERR" | grep -q "fgpu.conf is not owned by root"'

run sim "$HOSTDIR/sim/two" "$FGPU" cdi generate --output "$SPEC" --config-dir "$HOSTDIR/fgpu-cdi-rootless" --owner "$ROOTLESS_USER"
check generate-owner "fgpu cdi generate --owner failed" test "$RC" = 0
start rl-owner --device nvidia.com/gpu=0 --device fgpu.io/gpu=0-8g || die "rootless podman run failed: $ERR"
px rl-owner -- stat -c '%U:%G %a' /etc/fgpu/fgpu.conf /etc/ld.so.preload
check rootless-owner-files-root-inside "with --owner the files are not root's 0644 inside the user's container" test "$OUT" = "$(printf 'root:root 644\nroot:root 644')"
check rootless-owner-total-8192 "the rootless container does not see 8192 MiB" total_is rl-owner "$CAP_MIB"
check rootless-owner-over-cap-refused "the rootless container got 9000 MiB" refused rl-owner 9000
check rootless-owner-FGPU_LIMIT-64G-refused "FGPU_LIMIT=64G raised the rootless container's cap" refused rl-owner 9000 -e FGPU_LIMIT=64G
check rootless-owner-under-cap-granted "the rootless container was refused 7000 MiB" granted rl-owner 7000
px rl-owner -- sh -c "$attempts"
check rootless-owner-root-cannot-change-files "root of the rootless container changed a file that holds the cap, or the attempts did not run: $OUT" \
    attempts_changed_nothing
start owner-spec-rootful --device nvidia.com/gpu=0 --device fgpu.io/gpu=0-8g || die "podman run failed: $ERR"
px owner-spec-rootful -- fgpu-client info
check owner-spec-distrusted-by-rootful "a rootful container must distrust files owned by the rootless user" \
    eval 'test "$RC" = 1 && printf "%s" "$ERR" | grep -q "fgpu.conf is not owned by root"'

summary
[ "$nfail" = 0 ]
