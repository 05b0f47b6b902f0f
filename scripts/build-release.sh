#!/usr/bin/env bash
# Release build of libfgpu.so (the preloaded front), libfgpu_shim.so (the shim it loads on
# a process's first CUDA or NVML call) and the fgpu command, linked against an old glibc so
# that the same files load on every distribution from glibc 2.17 on (CentOS 7, Ubuntu
# 18.04 through 24.04). Uses cargo-zigbuild with zig from PyPI (`ziglang`), both installed
# into a virtual environment on first use.
#
#   scripts/build-release.sh            # host architecture, glibc 2.17
#   FGPU_ARCH=aarch64 scripts/build-release.sh
#
# Output: target/dist/libfgpu.so, target/dist/libfgpu_shim.so and target/dist/fgpu (plus
# SHA256SUMS). Fails, listing the offending symbols, when any of them needs a GLIBC symbol
# version newer than the baseline, and when the front needs any library but libc.so.6:
# it is loaded into every process, and each further library (libdl.so.2, libpthread.so.0
# on glibc 2.17's terms) costs every process about 7 % of a /bin/true start-up
# (docs/benchmarks.md). `scripts/build-release.sh --check FILE...` runs only the glibc
# check.
#
# aarch64 needs the Rust standard library for aarch64-unknown-linux-gnu (`rustup target
# add`, done here when rustup is present) and a linker for it, which zig is: nothing else.
# The front (front/src/entries.c) has aarch64 entry points; objdump for the check comes from
# binutils-multiarch or aarch64-linux-gnu-objdump (OBJDUMP).
#
# Environment:
#   FGPU_ARCH       target architecture (default: uname -m): x86_64, aarch64
#   FGPU_GLIBC      glibc baseline (default 2.17)
#   FGPU_DIST       output directory (default target/dist)
#   FGPU_BUILD_VENV virtual environment for ziglang + cargo-zigbuild (default .venv-images)
#   OBJDUMP         objdump to use for the check (default objdump; binutils-multiarch
#                   or <arch>-linux-gnu-objdump for a foreign architecture)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

arch=${FGPU_ARCH:-$(uname -m)}
case "$arch" in
    amd64) arch=x86_64 ;;
    arm64) arch=aarch64 ;;
esac
glibc=${FGPU_GLIBC:-2.17}
triple="$arch-unknown-linux-gnu"
dist=${FGPU_DIST:-$root/target/dist}
venv=${FGPU_BUILD_VENV:-$root/.venv-images}
objdump=${OBJDUMP:-objdump}

say() { printf 'build-release: %s\n' "$*" >&2; }

# check_glibc FILE...: fails, listing them, when a dynamic symbol of FILE needs a GLIBC
# version newer than the baseline.
check_glibc() {
    local f syms newer max bad=0
    for f in "$@"; do
        syms=$("$objdump" -T "$f") || { say "$objdump -T $f failed"; return 1; }
        newer=$(printf '%s\n' "$syms" | awk -v base="$glibc" '
            function newer(v, b,   i, n, m, x, y) {
                n = split(v, x, "."); m = split(b, y, ".")
                for (i = 1; i <= (n > m ? n : m); i++) {
                    if ((x[i] + 0) > (y[i] + 0)) return 1
                    if ((x[i] + 0) < (y[i] + 0)) return 0
                }
                return 0
            }
            {
                for (i = 1; i <= NF; i++) {
                    if (match($i, /^\(?GLIBC_[0-9][0-9.]*\)?$/)) {
                        v = $i; gsub(/[()]/, "", v); sub(/^GLIBC_/, "", v)
                        if (newer(v, base)) { print "  " $NF " needs GLIBC_" v; break }
                    }
                }
            }')
        if [ -n "$newer" ]; then
            say "$(basename "$f") needs symbols newer than GLIBC_$glibc:"
            printf '%s\n' "$newer" >&2
            bad=1
        else
            max=$(printf '%s\n' "$syms" | grep -o 'GLIBC_[0-9][0-9.]*' | sort -uV | tail -n 1 || true)
            say "$(basename "$f"): newest glibc symbol version ${max:-none} (baseline GLIBC_$glibc)"
        fi
    done
    return "$bad"
}

if [ "${1:-}" = "--check" ]; then
    shift
    [ "$#" -gt 0 ] || { say "usage: $0 --check FILE..."; exit 2; }
    check_glibc "$@"
    exit
fi

# Tools: zig and cargo-zigbuild from PyPI, in a venv (pip refuses system-wide installs
# on recent distributions).
if [ ! -x "$venv/bin/cargo-zigbuild" ] || ! "$venv/bin/python" -c 'import ziglang' 2>/dev/null; then
    say "installing ziglang and cargo-zigbuild into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check ziglang cargo-zigbuild
fi
export PATH="$venv/bin:$PATH"

if ! command -v "$objdump" >/dev/null; then
    say "installing binutils for $objdump"
    if command -v apt-get >/dev/null; then
        apt-get install -y -qq binutils >/dev/null
    fi
fi

# The Rust standard library for the target.
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx "$triple"; then
    say "adding Rust target $triple"
    rustup target add "$triple"
fi

say "cargo zigbuild --release --target $triple.$glibc"
# zig links its own unwinder; GCC's static one (shim/build.rs) is for native builds only.
# Building fgpu-shim builds fgpu-front, whose build script links libfgpu.so with zig cc.
FGPU_SHARED_UNWINDER=1 cargo zigbuild --release --target "$triple.$glibc" -p fgpu-shim -p fgpu-cli

out="$root/target/$triple/release"
mkdir -p "$dist"
files=(libfgpu.so libfgpu_shim.so fgpu)
for f in "${files[@]}"; do
    install -m 0755 "$out/$f" "$dist/$f"
done

check_glibc "${files[@]/#/$dist/}" || exit 1

# The front is loaded into every process: it must need libc.so.6 and nothing else.
needed=$(LC_ALL=C "$objdump" -p "$dist/libfgpu.so" | awk '$1 == "NEEDED" {print $2}' | sort | tr '\n' ' ')
if [ "$needed" != "libc.so.6 " ]; then
    say "libfgpu.so (the front) needs ${needed:-nothing}; it may need libc.so.6 only"
    exit 1
fi
say "libfgpu.so needs libc.so.6 only"

(cd "$dist" && sha256sum "${files[@]}" > SHA256SUMS)
say "wrote ${files[*]/#/$dist/}"
