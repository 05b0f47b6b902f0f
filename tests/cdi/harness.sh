# Shared by the podman scripts (tests/cdi/test.sh, tests/cdi/dra.sh, images/test.sh): PASS/FAIL lines, a
# summary, running a command so that a failure shows it with its exit status and output,
# and the host side both need (the test client, nvidia-smi, pynvml, the plain image).
# Source it after setting WORK (the scratch directory) and T0 (the start time).

npass=0
nfail=0
failed=()
log() { printf '[%3ds] %s\n' "$(($(date +%s) - T0))" "$*" >&2; }
pass() { echo "PASS $1"; npass=$((npass + 1)); }
fail() {
    echo "FAIL $1${2:+: $2}"
    nfail=$((nfail + 1))
    failed+=("$1")
}
summary() {
    log "done in $(($(date +%s) - T0)) s"
    [ "${#failed[@]}" -gt 0 ] && echo "failed: ${failed[*]}"
    echo "$npass passed, $nfail failed"
}
die() {
    fail setup "$*"
    summary
    exit 1
}

# run CMD...: runs it, keeping what a failure report shows.
CMD= RC= OUT= ERR=
run() {
    CMD=$(printf '%q ' "$@")
    "$@" >"$WORK/out" 2>"$WORK/err"
    RC=$?
    OUT=$(cat "$WORK/out")
    ERR=$(cat "$WORK/err")
}
# check NAME WHY CONDITION...: PASS if CONDITION succeeds; else FAIL with WHY and the
# last command run (its exit status, stdout and stderr).
check() {
    local name=$1 why=$2
    shift 2
    if "$@"; then
        pass "$name"
    else
        fail "$name" "$why"
        printf '    command: %s\n    exit status: %s\n' "$CMD" "$RC"
        printf '%s\n' "$OUT" | sed 's/^/    stdout: /' | head -n 30
        printf '%s\n' "$ERR" | sed 's/^/    stderr: /' | head -n 30
    fi
}
field() { printf '%s\n' "$OUT" | sed -n "s/^$1=//p" | head -n 1; }

# stage_host_tools: builds the test client (images/test/fgpu-client.c) and copies
# nvidia-smi and pynvml into $HOSTDIR/bin, readable by every user; sets CLIENT, NVSMI and
# PYNVML. Needs root (the checkout), HOSTDIR, WORK and PY.
stage_host_tools() {
    CLIENT=$HOSTDIR/bin/fgpu-client
    cc -O2 -Wall -o "$CLIENT" "$root/images/test/fgpu-client.c" -ldl >"$WORK/client.log" 2>&1 \
        || die "building images/test/fgpu-client.c failed (see $WORK/client.log)"
    NVSMI=${FGPU_TEST_NVIDIA_SMI:-}
    if [ ! -x "$NVSMI" ]; then
        NVSMI=$(bash "$root/scripts/get-nvidia-smi.sh" "$root/target/nvidia-smi" 2>"$WORK/nvidia-smi.log" | tail -n 1)
    fi
    [ -x "$NVSMI" ] || die "no nvidia-smi (see $WORK/nvidia-smi.log)"
    cp "$NVSMI" "$HOSTDIR/bin/nvidia-smi" && NVSMI=$HOSTDIR/bin/nvidia-smi
    PYNVML=$("$PY" -c 'import pynvml; print(pynvml.__file__)') && cp "$PYNVML" "$HOSTDIR/bin/pynvml.py" \
        && PYNVML=$HOSTDIR/bin/pynvml.py || die "no pynvml in $PY"
    chmod -R a+rX "$HOSTDIR"
}

# ensure_image: the plain image $IMAGE (Debian bookworm, minbase, with python3), imported
# into podman from a debootstrap made once and cached in $CACHE.
ensure_image() {
    podman image exists "$IMAGE" && return 0
    local tar=$CACHE/bookworm-minbase-python3.tar
    if [ ! -s "$tar" ]; then
        log "debootstrap --variant=minbase --include=python3 bookworm (once; cached in $CACHE)"
        local tmp=$CACHE/rootfs-python3.$$.tmp
        rm -rf "$tmp"
        debootstrap --variant=minbase --include=python3 bookworm "$tmp" >"$WORK/debootstrap.log" 2>&1 \
            || die "debootstrap failed (see $WORK/debootstrap.log)"
        rm -rf "$tmp/var/cache/apt/archives/"*.deb "$tmp/var/lib/apt/lists/"*
        tar -C "$tmp" -cf "$tar.$$.part" . && mv "$tar.$$.part" "$tar"
        rm -rf "$tmp"
    fi
    log "podman import $IMAGE"
    podman import --change 'CMD ["bash"]' "$tar" "$IMAGE" >"$WORK/import.log" 2>&1 || die "podman import failed (see $WORK/import.log)"
}
