#!/usr/bin/env bash
# Every test of fgpu, on a fresh machine with no GPU: installs what the tests need (Debian
# packages, a Python venv with the real NVML/CUDA clients, NVIDIA's cuda.h and nvml.h, the
# real nvidia-smi, Docker for the image tests), builds the workspace, and runs
#   1. cargo test: unit tests of every crate and the integration tests against the
#      simulated driver (tests/integration), including the Python wheel that
#      scripts/build-wheel.sh builds first (installed into a fresh venv, caps a job),
#   2. the container tests of the images (images/test.sh),
#   3. the CDI tests: `fgpu cdi generate` and podman capping a plain image at run time
#      (tests/cdi/test.sh), and the DRA driver's claims in podman (tests/cdi/dra.sh),
#   4. the real-GPU script's dry run and self-test (tests/gpu/run.sh),
#   5. the benchmark in quick mode: a target missed beyond its margin fails (a row read past
#      it is measured again with the full plan first; docs/benchmarks.md, "Verdicts"),
#   6. the house rules: no import cycle through more than one file of a crate, the layers
#      and crate arrows of scripts/layers.toml kept (scripts/check-imports.py, with its own
#      unit tests), no source file of any crate over 500 lines and no integration test
#      file over 800 (scripts/check-file-lengths.sh), and `cargo fmt --all --check` (rustfmt.toml).
# Ends with one line over the suites: "suites: N passed, M failed, K skipped; tests
# skipped: S". A skipped test is one whose prerequisite was missing (tests/support:
# prerequisite writes each to $FGPU_TEST_SKIP_LOG, which this script sets); a skipped suite
# is one left out with FGPU_SKIP_*. Under CI (CI set to anything but empty, 0, false or no:
# the rule of tests/support's under_ci) nothing may be skipped: any skip fails the run.
#
#   bash tests/run.sh              everything (as root, as CI runs it)
#   FGPU_SKIP_IMAGES=1 bash tests/run.sh   without the Docker image tests
#   FGPU_SKIP_CDI=1 bash tests/run.sh      without the podman CDI tests
#   bash tests/run.sh --is-ci      exits 0 if this run would count as CI, 1 if not
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 1

# Whether this is CI: the rule of tests/support's under_ci(), which its unit test holds
# this function to (through --is-ci): CI set to anything but empty, 0, false or no, case
# and surrounding blanks aside.
under_ci() {
    local value=${CI:-}
    value=${value#"${value%%[![:space:]]*}"}
    value=${value%"${value##*[![:space:]]}"}
    case ${value,,} in
        "" | 0 | false | no) return 1 ;;
        *) return 0 ;;
    esac
}
if [ "${1:-}" = --is-ci ]; then
    under_ci
    exit
fi
[ "$#" -eq 0 ] || { echo "usage: bash tests/run.sh [--is-ci]"; exit 2; }

start=$(date +%s)
step() { printf '\n== [%ds] %s\n' "$(($(date +%s) - start))" "$*"; }
passed=0
failed=0
failed_names=()
skipped_suites=()
# Every skipped test, one line each ("SKIPPED: <test>: <why>"), counted in the summary.
mkdir -p "$root/target"
export FGPU_TEST_SKIP_LOG=$root/target/test-skips.log
: >"$FGPU_TEST_SKIP_LOG"
skip_suite() { # name, why
    step "$1"
    echo "SKIPPED SUITE: $1 ($2)"
    skipped_suites+=("$1 ($2)")
}
suite() { # name, command...
    local name=$1
    shift
    step "$name"
    if "$@"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        failed_names+=("$name")
        echo "FAILED SUITE: $name"
    fi
}

step "system packages"
pkgs=()
command -v cc >/dev/null || pkgs+=(gcc libc6-dev)
# c++: the prototype checks of tests/support/c_layout.rs read the headers through C++.
command -v c++ >/dev/null || pkgs+=(g++)
command -v tmux >/dev/null || pkgs+=(tmux)
command -v promtool >/dev/null || pkgs+=(prometheus)
# unshare and setpriv: the namespace, private /etc and other-user tests (run as root).
command -v unshare >/dev/null || pkgs+=(util-linux)
command -v setpriv >/dev/null || pkgs+=(util-linux)
command -v prlimit >/dev/null || pkgs+=(util-linux)
command -v objdump >/dev/null || pkgs+=(binutils)
command -v python3 >/dev/null || pkgs+=(python3)
if [ ${#pkgs[@]} -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq && apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null \
            || { echo "cannot install ${pkgs[*]}"; exit 1; }
        # promtool comes with Debian's prometheus package, which starts a server we do not want.
        systemctl stop prometheus 2>/dev/null || pkill -x prometheus 2>/dev/null || true
    else
        echo "missing ${pkgs[*]}: install them or run as root"
        exit 1
    fi
fi
# Under CI=true a test whose prerequisite (root, tmux, promtool, unshare, setpriv) is missing
# fails instead of skipping (tests/support: prerequisite); CI runs this as root.
if under_ci && [ "$(id -u)" -ne 0 ]; then
    echo "CI is set but this is not root: the namespace and /etc tests need root"
    exit 1
fi
if under_ci && { [ "${FGPU_SKIP_IMAGES:-0}" = 1 ] || [ "${FGPU_SKIP_CDI:-0}" = 1 ]; }; then
    echo "CI is set but FGPU_SKIP_IMAGES or FGPU_SKIP_CDI asks to leave suites out: under CI nothing is skipped"
    exit 1
fi

# rustfmt for the formatting suite (a rustup toolchain may come without it).
if ! cargo fmt --version >/dev/null 2>&1; then
    rustup component add rustfmt || { echo "cannot install rustfmt (rustup component add rustfmt)"; exit 1; }
fi

step "python clients (.venv: pynvml, gpustat, nvitop, cuda-bindings, jsonschema, PyYAML, kubernetes-validate, grpcio, h2, cel-python)"
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import pynvml, gpustat, nvitop, cuda.bindings, jsonschema, yaml, kubernetes_validate, grpc, grpc_tools, h2, celpy' 2>/dev/null; then
    python3 -m venv .venv && .venv/bin/pip install -q --disable-pip-version-check -r tests/python/requirements.txt \
        || { echo "cannot set up .venv"; exit 1; }
fi
export FGPU_TEST_PYTHON=$root/.venv/bin/python

step "NVIDIA's C headers (cuda.h, nvml.h) for the layout checks (tests/abi/requirements.txt)"
if headers=$(bash scripts/get-nvidia-headers.sh "$root/target/nvidia-headers" "$root/.venv/bin/python" | tail -n 1) && [ -d "$headers" ]; then
    export FGPU_TEST_NVIDIA_HEADERS=$headers
    echo "$headers"
else
    echo "cannot fetch NVIDIA's headers"
    exit 1
fi

step "the real nvidia-smi (Debian non-free, without its NVML)"
if smi=$(bash scripts/get-nvidia-smi.sh "$root/target/nvidia-smi" | tail -n 1) && [ -x "$smi" ]; then
    export FGPU_TEST_NVIDIA_SMI=$smi
    echo "$smi"
else
    echo "cannot fetch nvidia-smi"
    exit 1
fi

step "build"
cargo build --release --workspace --all-targets || exit 1
# The shim with its crash points, for the crash-window tests (never shipped; docs/reliability.md).
cargo build --release -p fgpu-shim --features crash-points --target-dir target/crash || exit 1

step "the Python wheel (scripts/build-wheel.sh: glibc-2.17 release build, maturin; tested by tests/integration/wheel.rs)"
if wheel=$(bash scripts/build-wheel.sh | tail -n 1) && [ -f "$wheel" ]; then
    export FGPU_TEST_WHEEL=$wheel
    echo "$wheel"
else
    failed=$((failed + 1))
    failed_names+=("the Python wheel (scripts/build-wheel.sh)")
    echo "FAILED SUITE: cannot build the wheel"
fi

# The house rules (issue 21): cheap, and independent of the build.
suite "imports: no cycle through more than one file, the layers and crate arrows of scripts/layers.toml kept (scripts/check-imports.py)" python3 scripts/check-imports.py
suite "the import checker's unit tests (scripts/test_check_imports.py)" python3 scripts/test_check_imports.py
suite "no source file of any crate over 500 lines, no integration test file over 800 (scripts/check-file-lengths.sh; pending splits listed)" bash scripts/check-file-lengths.sh
suite "formatting: cargo fmt --all --check (rustfmt.toml)" cargo fmt --all --check
suite "cargo clippy -D warnings (with the unsafe rules of Cargo.toml's [workspace.lints])" cargo clippy --release --workspace --all-targets -- -D warnings
# cargo test, then the integration tests' shared directory of copies every user can run
# (a static of the test binary, never dropped; the next run's sweep would take it): removed
# once its process is gone, so the run leaves nothing in the temporary directory.
cargo_tests() {
    local rc=0 dir pid
    cargo test --release --workspace --no-fail-fast || rc=$?
    for dir in "${TMPDIR:-/tmp}"/fgpu-it-reachable-*; do
        pid=${dir##*/fgpu-it-reachable-}
        pid=${pid%%-*}
        if [ -d "$dir" ] && [ -n "$pid" ] && [ ! -d "/proc/$pid" ]; then
            rm -rf "$dir"
        fi
    done
    return "$rc"
}
suite "cargo test (unit + integration against the simulated driver)" cargo_tests
if [ "${FGPU_SKIP_IMAGES:-0}" != 1 ]; then
    suite "container images (images/test.sh)" bash images/test.sh
else
    skip_suite "container images (images/test.sh)" "FGPU_SKIP_IMAGES=1"
fi
if [ "${FGPU_SKIP_CDI:-0}" != 1 ]; then
    suite "CDI: fgpu cdi generate and podman (tests/cdi/test.sh)" bash tests/cdi/test.sh
    suite "CDI: fgpu-kubelet-plugin's claims in podman (tests/cdi/dra.sh)" bash tests/cdi/dra.sh
else
    skip_suite "CDI: fgpu cdi generate and podman (tests/cdi/test.sh)" "FGPU_SKIP_CDI=1"
    skip_suite "CDI: fgpu-kubelet-plugin's claims in podman (tests/cdi/dra.sh)" "FGPU_SKIP_CDI=1"
fi
suite "real-GPU script: dry run" bash tests/gpu/run.sh --dry-run
suite "real-GPU script: self-test against fake frameworks" bash tests/gpu/run.sh --self-test
# --check: a target missed beyond its margin fails the suite (docs/benchmarks.md, "Verdicts").
suite "benchmark (quick run; a target missed beyond its margin fails: docs/benchmarks.md)" target/release/fgpu-bench --quick --check

step "summary ($(($(date +%s) - start)) s)"
skipped_tests=$(sort -u "$FGPU_TEST_SKIP_LOG" | grep -c '^SKIPPED: ')
sort -u "$FGPU_TEST_SKIP_LOG" | sed -n 's/^SKIPPED: /skipped test: /p'
for name in "${skipped_suites[@]}"; do echo "skipped suite: $name"; done
if under_ci && [ "$((skipped_tests + ${#skipped_suites[@]}))" -gt 0 ]; then
    failed=$((failed + 1))
    failed_names+=("under CI nothing may be skipped: $skipped_tests tests and ${#skipped_suites[@]} suites were")
fi
for name in "${failed_names[@]}"; do echo "failed: $name"; done
echo "suites: $passed passed, $failed failed, ${#skipped_suites[@]} skipped; tests skipped: $skipped_tests"
[ "$failed" -eq 0 ]
