#!/usr/bin/env bash
# Real-GPU validation of fgpu. See tests/gpu/README.md.
#
#   bash tests/gpu/run.sh [--dry-run | --self-test] [--only NAME[,NAME...]]
#
# --dry-run: no GPU needed; checks prerequisites, compiles the Python, prints the plan.
# --self-test: no GPU needed; runs the whole harness against the fakes in
#   tests/gpu/selftest/ (a good fake must pass everything, a do-nothing shim must fail).
#
# Runs every check with its own time limit, prints PASS/FAIL/SKIP per check and a
# final line "N passed, M failed[, K skipped]"; exits non-zero if any check failed.
# Writes the report to docs/gpu-validation.md and, when $OUT is set, $OUT/gpu-report.md.
#
# Environment: FGPU_LIB (target/release/libfgpu.so), FGPU_BIN (target/release/fgpu),
# FGPU_GPU_CAP (8G), FGPU_GPU_BUDGET_S (540: whole run), PYTHON (python3), and the
# FGPU_GPU_* tunables described in tests/gpu/check.py.
set -u -o pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
HERE=tests/gpu
SELF="$(pwd)/$HERE/run.sh"

DRY=0
SELFTEST=0
ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --self-test) SELFTEST=1 ;;
    --only) ONLY="${2:-}"; shift ;;
    --only=*) ONLY="${1#--only=}" ;;
    -h|--help) sed -n '2,17p' "$SELF"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done

# The harness itself must not be hooked; only the workloads it starts are.
unset LD_PRELOAD
export PYTHONDONTWRITEBYTECODE=1

PY="${PYTHON:-python3}"
LIB="${FGPU_LIB:-target/release/libfgpu.so}"
BIN="${FGPU_BIN:-target/release/fgpu}"
CAP="${FGPU_GPU_CAP:-8G}"
BUDGET="${FGPU_GPU_BUDGET_S:-540}"
REPORT="${FGPU_GPU_REPORT:-docs/gpu-validation.md}"

# name:seconds, in the order they run. The seconds are each check's own limit; the
# whole run is further held to $BUDGET (a check gets at most what is left).
CHECKS=(
  nvidia-smi:60
  cuda-bindings:40
  torch-default:60
  torch-expandable:60
  torch-async:60
  cupy:50
  jax:90
  two-process:60
  overhead-nvidia-smi:60
  overhead-torch:150
  compute-torch:45
  compute-graphs:45
)

describe() {
  case "$1" in
    nvidia-smi) echo "nvidia-smi under the shim shows the cap and only the ledger's processes; CSV agrees with CUDA and the monitor" ;;
    cuda-bindings) echo "cuda-bindings: cuDeviceTotalMem and cuMemGetInfo show the cap; cuMemAlloc stops at it" ;;
    torch-default) echo "PyTorch caching allocator: mem_get_info total is the cap; OutOfMemoryError at the cap; real usage <= cap" ;;
    torch-expandable) echo "the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (VMM)" ;;
    torch-async) echo "the same with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (pools)" ;;
    cupy) echo "CuPy: memGetInfo shows the cap; OutOfMemoryError at the cap" ;;
    jax) echo "JAX default preallocation takes ~0.75 of the cap, not of the card" ;;
    two-process) echo "two processes share one ledger; after kill -9 of A, B takes its share" ;;
    overhead-nvidia-smi) echo "nvidia-smi start-up time with and without the shim (medians, ratio)" ;;
    overhead-torch) echo "fixed PyTorch workload (matmuls + allocation loop) with and without the shim (medians, ratio)" ;;
    compute-torch) echo "two PyTorch matmul loops in two jobs capped at FGPU_COMPUTE=30% and 70%: NVML's per-process samples say 30 and 70 (+-5)" ;;
    compute-graphs) echo "a PyTorch job replaying CUDA graphs at FGPU_COMPUTE=30% beside an unhooked matmul loop: 30 (+-5) and at least 60" ;;
  esac
}

if [ -n "$ONLY" ]; then
  for want in ${ONLY//,/ }; do
    known=0
    for entry in "${CHECKS[@]}"; do [ "${entry%%:*}" = "$want" ] && known=1; done
    if [ "$known" = 0 ]; then
      echo "unknown check '$want'; known: $(printf '%s ' "${CHECKS[@]%%:*}")" >&2
      exit 2
    fi
  done
fi

selected() {
  [ -z "$ONLY" ] && return 0
  case ",$ONLY," in *",$1,"*) return 0 ;; esac
  return 1
}

abspath() {
  case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s/%s\n' "$(pwd)" "$1" ;; esac
}

have_module() {
  "$PY" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('$1') else 1)" 2>/dev/null
}

WORK="$(mktemp -d "${TMPDIR:-/tmp}/fgpu-gpu.XXXXXX")" || { echo "cannot create a temporary directory" >&2; exit 2; }
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
  if [ "${FGPU_GPU_KEEP:-0}" = 1 ]; then
    echo "kept work directory: $WORK" >&2
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT

# ---------------------------------------------------------------------------------
if [ "$DRY" = 1 ]; then
  echo "fgpu real-GPU validation: dry run (nothing touches a GPU)"
  echo
  echo "prerequisites:"
  bad=0
  for tool in "$PY" timeout; do
    if command -v "$tool" >/dev/null 2>&1; then
      echo "  ok       $tool"
    else
      echo "  MISSING  $tool (required)"; bad=1
    fi
  done
  if [ -f "$LIB" ]; then
    echo "  ok       $LIB"
  else
    echo "  absent   $LIB (build it with 'cargo build --release' before a real run)"
  fi
  if [ -x "$BIN" ]; then echo "  ok       $BIN (optional, only its version is recorded)"
  else echo "  absent   $BIN (optional, only its version is recorded)"; fi
  if command -v nvidia-smi >/dev/null 2>&1; then echo "  ok       nvidia-smi"
  else echo "  absent   nvidia-smi (needed on the GPU machine)"; fi
  if [ "$bad" = 0 ]; then
    for mod in torch jax cupy cuda.bindings pynvml; do
      if have_module "$mod"; then echo "  ok       python: $mod"
      else echo "  absent   python: $mod (checks that need it are skipped)"; fi
    done
  fi
  echo
  echo "compiling the Python check scripts:"
  if [ "$bad" = 0 ] && PYTHONPYCACHEPREFIX="$WORK/pycache" "$PY" -m py_compile "$HERE"/*.py; then
    for f in "$HERE"/*.py; do echo "  ok       $f"; done
  else
    echo "  FAILED"; bad=1
  fi
  if ! bash -n "$SELF"; then echo "  FAILED   bash -n $HERE/run.sh"; bad=1; fi
  echo
  echo "plan (cap $CAP, whole run held to ${BUDGET}s, a fresh FGPU_LEDGER per check under a temporary directory):"
  for entry in "${CHECKS[@]}"; do
    name="${entry%%:*}"; secs="${entry##*:}"
    selected "$name" || continue
    echo "  $name ($secs s): $(describe "$name")"
    echo "      timeout -k 5 $((secs + 10)) $PY $HERE/check.py $name --lib $LIB --workdir <tmp> --time-limit $secs --cap $CAP --idle-used <MiB>"
  done
  echo
  echo "report: $REPORT${OUT:+ and \$OUT/gpu-report.md}"
  if [ "$bad" = 0 ]; then echo "dry run ok"; exit 0; fi
  echo "dry run found problems"; exit 1
fi

# ---------------------------------------------------------------------------------
if [ "$SELFTEST" = 1 ]; then
  echo "fgpu real-GPU validation: self-test of the harness against tests/gpu/selftest (no GPU)"
  # Any library that preloads harmlessly stands in for libfgpu.so; the fakes decide
  # what "under the shim" means from LD_PRELOAD and FGPU_LIMIT.
  stand_in="$("$PY" -c 'import ctypes, re
ctypes.CDLL("libm.so.6")
print(next(l.split()[-1] for l in open("/proc/self/maps") if re.search(r"/libm[.-][^/]*$", l.strip())))' 2>/dev/null)"
  if [ -z "$stand_in" ]; then echo "self-test FAILED: no libm to preload"; exit 1; fi
  n=0
  for entry in "${CHECKS[@]}"; do selected "${entry%%:*}" && n=$((n + 1)); done
  st_ok=1
  for mode in good no-cap; do
    want="$((n + 1)) passed, 0 failed"
    [ "$mode" = no-cap ] && want="1 passed, $n failed"
    echo
    echo "== fake GPU, $mode shim (expect: $want)"
    vars=(PATH="$(pwd)/$HERE/selftest/bin:$PATH" PYTHONPATH="$(pwd)/$HERE/selftest/py"
      FAKEGPU_STATE="$WORK/fakegpu-$mode.json" FGPU_LIB="$stand_in" FGPU_BIN=/nonexistent
      FGPU_GPU_REPORT="$WORK/report-$mode.md" FGPU_GPU_RUNS=3 FGPU_GPU_SMI_RUNS=3 FGPU_GPU_ALLOCS=100
      FGPU_GPU_WORK_TOL=1 FGPU_GPU_WALL_TOL=1 FGPU_GPU_SMI_TOL=1 FGPU_GPU_COMPUTE_WINDOW_S=3)
    [ "$mode" = no-cap ] && vars+=(FAKEGPU_NO_CAP=1)
    args=()
    [ -n "$ONLY" ] && args=(--only "$ONLY")
    env -u OUT "${vars[@]}" bash "$SELF" ${args[@]+"${args[@]}"} >"$WORK/selftest-$mode.log" 2>&1
    got="$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$WORK/selftest-$mode.log" | tail -n 1)"
    # In the no-cap mode the checks are meant to fail: their FAIL lines are labelled so.
    label=""
    [ "$mode" = no-cap ] && label="(expected) "
    grep -E '^(PASS|FAIL|SKIP) ' "$WORK/selftest-$mode.log" | sed "s/^FAIL /${label}FAIL /" | cut -c1-160
    if [ "$got" = "$want" ]; then
      echo "ok: $got"
    else
      echo "UNEXPECTED: $got"; st_ok=0
    fi
  done
  echo
  if [ "$st_ok" = 1 ]; then echo "self-test ok"; exit 0; fi
  echo "self-test FAILED"; exit 1
fi

START=$SECONDS
RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
PASSED=0
FAILED=0
SKIPPED=0

count() {
  echo "$1"
  case "$1" in
    PASS*) PASSED=$((PASSED + 1)) ;;
    FAIL*) FAILED=$((FAILED + 1)) ;;
    SKIP*) SKIPPED=$((SKIPPED + 1)) ;;
  esac
}

summary() {
  local s="$PASSED passed, $FAILED failed"
  [ "$SKIPPED" -gt 0 ] && s="$s, $SKIPPED skipped"
  printf '%s\n' "$s"
}

finish() {
  local s
  s="$(summary)"
  local outs=(--out "$REPORT")
  [ -n "${OUT:-}" ] && outs+=(--out "$OUT/gpu-report.md")
  timeout 30 "$PY" "$HERE/report.py" write --env "$WORK/env.json" --results "$RESULTS" \
    --summary "$s" "${outs[@]}" || echo "warning: could not write the report" >&2
  if [ -n "${OUT:-}" ] && mkdir -p "$OUT/gpu-logs" 2>/dev/null; then
    (cd "$WORK" && find . -type f \( -name '*.out' -o -name '*.err' -o -name '*.stderr' -o -name '*.json' -o -name '*.jsonl' \) \
      -size -2M -exec cp --parents {} "$OUT/gpu-logs/" \; ) 2>/dev/null
  fi
  echo "report: $REPORT${OUT:+ and \$OUT/gpu-report.md} ($((SECONDS - START)) s)" >&2
  printf '%s\n' "$s"
  [ "$FAILED" -eq 0 ]
  exit $?
}

# Prerequisites: without these no check means anything.
LIB_ABS="$(abspath "$LIB")"
BIN_ABS="$(abspath "$BIN")"
prereq=""
command -v "$PY" >/dev/null 2>&1 || prereq="$PY not found"
command -v timeout >/dev/null 2>&1 || prereq="${prereq:+$prereq; }timeout not found"
[ -f "$LIB_ABS" ] || prereq="${prereq:+$prereq; }$LIB not found (set FGPU_LIB)"
if ! command -v nvidia-smi >/dev/null 2>&1; then
  prereq="${prereq:+$prereq; }nvidia-smi not found"
elif ! timeout 60 nvidia-smi -L >"$WORK/smi-L.out" 2>&1; then
  prereq="${prereq:+$prereq; }nvidia-smi -L failed: $(tail -c 300 "$WORK/smi-L.out" | tr '\n' ' ')"
fi
if [ -z "$prereq" ]; then
  # The shim must load: a preload that fails is only a warning from ld.so, and every
  # check would then silently run unhooked.
  load_out="$(LD_PRELOAD="$LIB_ABS" FGPU_LIMIT="$CAP" FGPU_LEDGER="$WORK/ledger-load" FGPU_LOG=warn \
    timeout 60 "$PY" -c 'print("loaded")' 2>"$WORK/load.err")"
  if [ "$load_out" != loaded ] || grep -qiE 'cannot be preloaded|ld\.so|wrong ELF|version .GLIBC' "$WORK/load.err"; then
    prereq="$LIB does not load: $(grep -v '^[[:space:]]*$' "$WORK/load.err" | head -n 1 | cut -c1-300 | tr '\n' ' ')"
  fi
fi

timeout 60 "$PY" "$HERE/report.py" env --lib "$LIB_ABS" --bin "$BIN_ABS" --cap "$CAP" \
  --out "$WORK/env.json" --print-idle >"$WORK/idle.out" 2>"$WORK/env.err" || true
IDLE="$(head -n1 "$WORK/idle.out" 2>/dev/null || true)"

if [ -n "$prereq" ]; then
  count "$(timeout 30 "$PY" "$HERE/report.py" record prerequisites fail "$prereq" --results "$RESULTS" ||
    echo "FAIL prerequisites: $prereq")"
  finish
fi
count "$(timeout 30 "$PY" "$HERE/report.py" record prerequisites pass "" --results "$RESULTS")"

for entry in "${CHECKS[@]}"; do
  name="${entry%%:*}"; secs="${entry##*:}"
  selected "$name" || continue
  left=$((BUDGET - (SECONDS - START) - 20))
  if [ "$left" -lt 20 ]; then
    count "$(timeout 30 "$PY" "$HERE/report.py" record "$name" skip \
      "time budget of ${BUDGET}s exhausted" --results "$RESULTS")"
    continue
  fi
  [ "$secs" -gt "$left" ] && secs=$left
  echo "-- $name (limit ${secs}s): $(describe "$name")" >&2
  idle_args=()
  [ -n "$IDLE" ] && idle_args=(--idle-used "$IDLE")
  timeout -k 5 $((secs + 10)) "$PY" "$HERE/check.py" "$name" --lib "$LIB_ABS" --workdir "$WORK" \
    --time-limit "$secs" --cap "$CAP" ${idle_args[@]+"${idle_args[@]}"} >"$WORK/$name.out" 2>"$WORK/$name.err"
  rc=$?
  line="$(timeout 30 "$PY" "$HERE/report.py" verdict "$name" --stdout "$WORK/$name.out" \
    --stderr "$WORK/$name.err" --rc "$rc" --limit "$secs" --results "$RESULTS")" ||
    line="FAIL $name: could not read its result (rc $rc)"
  count "$line"
done

finish
