#!/usr/bin/env bash
# Builds fgpu and shows it capping a job. On a machine with an NVIDIA GPU it uses the real
# driver; on a machine without one it says so and uses fgpu's simulated driver (an 80 GiB
# simulated GPU, built from sim/ in this workspace).
#
#   bash scripts/demo.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
say() { printf '\n\033[1m%s\033[0m\n' "$*"; }

say "Building fgpu (cargo build --release)"
cargo build --release --workspace
fgpu=$root/target/release/fgpu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    say "NVIDIA GPU found: using the real driver"
    nvidia-smi -L
else
    say "No NVIDIA GPU on this machine: using fgpu's simulated driver (one 80 GiB GPU)"
    echo "\$ eval \"\$(fgpu sim-env $work/sim --memory 80G --context-overhead 300M)\""
    eval "$("$fgpu" sim-env "$work/sim" --memory 80G --context-overhead 300M)"
fi
client=$work/cuclient
cc -O1 -o "$client" tests/clients/cuclient.c -ldl -lpthread

say "A job capped at 8 GiB: it sees an 8 GiB GPU, takes 6 GiB, and is refused 4 GiB more"
echo "\$ fgpu run --limit 8G -- cuclient init primary info alloc 6G alloc 4G info"
"$fgpu" run --limit 8G -- "$client" init primary info alloc 6G alloc 4G info

say "Two processes sharing one 8 GiB cap: one holds 6 GiB, fgpu status shows it, the other is refused"
ledger=$work/team.ledger
mkfifo "$work/hold"
"$fgpu" run --limit 8G --ledger "$ledger" -- "$client" init primary alloc 6G hold <"$work/hold" >"$work/holder.log" 2>&1 &
holder=$!
exec 3>"$work/hold" # the holder holds until this is closed
for _ in $(seq 50); do grep -q holding "$work/holder.log" 2>/dev/null && break; sleep 0.1; done
echo "\$ fgpu status --ledger team.ledger"
"$fgpu" status --ledger "$ledger"
echo "\$ fgpu run --limit 8G --ledger team.ledger -- cuclient init primary alloc 2G"
"$fgpu" run --limit 8G --ledger "$ledger" -- "$client" init primary alloc 2G || true
exec 3>&-
kill "$holder" 2>/dev/null || true
wait "$holder" 2>/dev/null || true

say "Checking this installation (fgpu doctor)"
"$fgpu" run --limit 8G -- "$fgpu" doctor || true
say "Done. To try fgpu status and fgpu top yourself on the simulated driver (docs/simulator.md):"
echo "  export PATH=\"$root/target/release:\$PATH\""
echo "  eval \"\$(fgpu sim-env /tmp/fgpu-sim)\"            # one simulated 80 GiB GPU"
echo "  cc -O1 -o /tmp/cuclient $root/tests/clients/cuclient.c -ldl -lpthread"
echo "  sleep 600 | fgpu run --limit 8G -- /tmp/cuclient init primary alloc 6G hold &   # holds 6 GiB"
echo "  fgpu status; fgpu top                            # q leaves top"
echo "More: docs/cli.md (the fgpu command), docs/images.md (the fractional-gpu images)."
