#!/usr/bin/env bash
# Builds fgpu's Python wheel: the `fgpu` command and the preloaded libraries, installable
# with `pip install` on any Linux with glibc 2.17 or newer (manylinux2014).
#
#   scripts/build-wheel.sh                  # target/wheels/fgpu-<version>-py3-none-manylinux2014_<arch>...whl
#   FGPU_ARCH=aarch64 scripts/build-wheel.sh
#
# Steps:
#   1. scripts/build-release.sh: libfgpu.so (the front) and libfgpu_shim.so, glibc 2.17,
#      into target/dist/ (checked there: symbol versions, the front's NEEDED entries);
#   2. they are staged as the wheel's data, data/lib/fgpu/: pip installs them into
#      <prefix>/lib/fgpu/, which <prefix>/bin/fgpu finds as ../lib/fgpu (cdi/src/shimpath.rs);
#   3. maturin (packaging/pyproject.toml: metadata, bin bindings) builds `fgpu` with zig for
#      manylinux2014 and writes the wheel, then checks the wheel's contents.
# The last line printed is the wheel's path.
#
# maturin builds in target/wheel-build/ rather than target/: it links through a zig wrapper
# of its own, and sharing a target directory with cargo-zigbuild would rebuild every crate
# each time one of the two ran after the other.
#
# aarch64: the Rust standard library for aarch64-unknown-linux-gnu (rustup target add) and
# zig, which links for it; scripts/build-release.sh and maturin take FGPU_ARCH's target.
#
# Environment: FGPU_ARCH, FGPU_BUILD_VENV (ziglang, cargo-zigbuild and maturin; default
# .venv-images), FGPU_WHEELS (output directory, default target/wheels).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

arch=${FGPU_ARCH:-$(uname -m)}
case "$arch" in
    amd64) arch=x86_64 ;;
    arm64) arch=aarch64 ;;
esac
triple="$arch-unknown-linux-gnu"
venv=${FGPU_BUILD_VENV:-$root/.venv-images}
wheels=${FGPU_WHEELS:-$root/target/wheels}
stage="$root/target/wheel/fgpu.data"

say() { printf 'build-wheel: %s\n' "$*" >&2; }

FGPU_ARCH=$arch FGPU_BUILD_VENV=$venv FGPU_DIST="$root/target/dist" bash scripts/build-release.sh

if [ ! -x "$venv/bin/maturin" ]; then
    say "installing maturin into $venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'maturin>=1.5,<2'
fi
export PATH="$venv/bin:$PATH"

rm -rf "$stage"
mkdir -p "$stage/data/lib/fgpu"
install -m 0755 target/dist/libfgpu.so target/dist/libfgpu_shim.so "$stage/data/lib/fgpu/"

version=$(awk -F'"' '/^\[workspace.package\]/ {s = 1} s && $1 ~ /^version *= */ {print $2; exit}' Cargo.toml)
rm -f "$wheels"/fgpu-"$version"-*.whl
say "maturin build --release --zig --target $triple (manylinux2014)"
(cd packaging && CARGO_TARGET_DIR="$root/target/wheel-build" \
    maturin build --release --zig --target "$triple" --compatibility manylinux2014 --out "$wheels")

wheel=$(ls "$wheels"/fgpu-"$version"-py3-none-manylinux*_"$arch".whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || { say "maturin wrote no wheel for fgpu $version into $wheels"; exit 1; }

# The wheel must hold the command and both libraries, where pip puts them side by side.
"$venv/bin/python" - "$wheel" "$version" <<'EOF'
import sys, zipfile
wheel, version = sys.argv[1], sys.argv[2]
names = set(zipfile.ZipFile(wheel).namelist())
want = {f"fgpu-{version}.data/scripts/fgpu",
        f"fgpu-{version}.data/data/lib/fgpu/libfgpu.so",
        f"fgpu-{version}.data/data/lib/fgpu/libfgpu_shim.so"}
missing = sorted(want - names)
if missing:
    sys.exit(f"build-wheel: {wheel} lacks {', '.join(missing)}")
EOF
say "wrote $wheel"
echo "$wheel"
