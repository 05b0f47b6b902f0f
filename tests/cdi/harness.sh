# Shared by the podman scripts of this directory (test.sh, dra.sh): PASS/FAIL lines, a
# summary, and running a command so that a failure shows it with its exit status and
# output. Source it after setting WORK (the scratch directory) and T0 (the start time).

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
