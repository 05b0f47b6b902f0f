#!/usr/bin/env bash
# Fails when a source file (.rs, .c, .h) under DIR has more than MAX lines, tests included.
#
#   scripts/check-file-lengths.sh [DIR [MAX]]     default: shim 500 (issue 21's bar for the shim)
#
# Lists every file over the limit, longest first, and how many lines each has.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dir=${1:-shim}
max=${2:-500}
[ -d "$dir" ] || { echo "check-file-lengths: no directory $dir" >&2; exit 2; }
over=$(find "$dir" -type f \( -name '*.rs' -o -name '*.c' -o -name '*.h' \) -not -path '*/target/*' -print0 \
    | xargs -0 wc -l | awk -v max="$max" '$2 != "total" && $1 > max' | sort -rn)
files=$(find "$dir" -type f \( -name '*.rs' -o -name '*.c' -o -name '*.h' \) -not -path '*/target/*' | wc -l)
if [ -n "$over" ]; then
    echo "check-file-lengths: $(printf '%s\n' "$over" | wc -l) of $files source files under $dir/ have more than $max lines:"
    printf '%s\n' "$over" | awk '{ printf "  %s: %d lines\n", $2, $1 }'
    exit 1
fi
echo "check-file-lengths: all $files source files under $dir/ have at most $max lines"
