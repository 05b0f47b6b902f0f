#!/usr/bin/env bash
# Fails when a source file (.rs, .c, .h) has more lines than its place allows, tests included.
#
#   scripts/check-file-lengths.sh              every place of the table below
#   scripts/check-file-lengths.sh DIR [MAX]    one directory (MAX defaults to 500)
#
# Lists every file over its limit, longest first, and how many lines each has. A file
# longer than its limit is split by content (docs/architecture.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The places and their limits: every crate's sources, 500 lines; the integration tests,
# 800 (one test file per subject, split by content past that).
TABLE="
abi 500
front 500
core 500
shim 500
cli 500
cdi 500
kubelet-plugin 500
sim 500
bench 500
tests/support 500
tests/integration 800
"

# Files over their limit that wait for a split by content (the
# DRA driver's and the test support's, in the hands of the work on them when this check
# grew to every crate): listed on every run, never a failure. Remove a line once its file
# is split; add none.
PENDING="
"

# check DIR MAX: prints the files over MAX; returns 1 if there are any not PENDING.
check() {
    local dir=$1 max=$2 over files pending
    [ -d "$dir" ] || { echo "check-file-lengths: no directory $dir" >&2; return 2; }
    files=$(find "$dir" -type f \( -name '*.rs' -o -name '*.c' -o -name '*.h' \) -not -path '*/target/*' | wc -l)
    over=$(find "$dir" -type f \( -name '*.rs' -o -name '*.c' -o -name '*.h' \) -not -path '*/target/*' -print0 \
        | xargs -0 -r wc -l | awk -v max="$max" '$2 != "total" && $1 > max' | sort -rn)
    pending=$(printf '%s\n' "$over" | awk -v list="$PENDING" 'BEGIN { n = split(list, p, "\n"); for (i = 1; i <= n; i++) if (p[i] != "") want[p[i]] = 1 } NF && ($2 in want)')
    over=$(printf '%s\n' "$over" | awk -v list="$PENDING" 'BEGIN { n = split(list, p, "\n"); for (i = 1; i <= n; i++) if (p[i] != "") want[p[i]] = 1 } NF && !($2 in want)')
    if [ -n "$pending" ]; then
        printf '%s\n' "$pending" | awk -v max="$max" '{ printf "check-file-lengths: pending split: %s: %d lines (limit %d)\n", $2, $1, max }'
    fi
    if [ -n "$over" ]; then
        echo "check-file-lengths: $(printf '%s\n' "$over" | wc -l) of $files source files under $dir/ have more than $max lines:"
        printf '%s\n' "$over" | awk '{ printf "  %s: %d lines\n", $2, $1 }'
        return 1
    fi
    if [ -n "$pending" ]; then
        echo "check-file-lengths: the other source files under $dir/ (of $files) have at most $max lines"
    else
        echo "check-file-lengths: all $files source files under $dir/ have at most $max lines"
    fi
}

if [ $# -gt 0 ]; then
    check "$1" "${2:-500}"
    exit
fi
status=0
while read -r dir max; do
    [ -n "$dir" ] || continue
    check "$dir" "$max" || status=1
done <<<"$TABLE"
exit "$status"
