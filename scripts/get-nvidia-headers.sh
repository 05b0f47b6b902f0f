#!/bin/sh
# Fetch NVIDIA's C headers (cuda.h, nvml.h) pinned in tests/abi/requirements.txt, for the
# layout checks of tests/support/c_layout.rs. Each pinned wheel is downloaded with pip and
# only its include/*.h files are extracted, to DIR/<name>-<version>/include/.
#
#   scripts/get-nvidia-headers.sh DIR [PYTHON]   -> prints DIR
#
# Idempotent: a pin already extracted is not fetched again.
set -eu

dest=${1:?usage: $0 DIR [PYTHON]}
py=${2:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)

grep -v '^[[:space:]]*\(#\|$\)' "$root/tests/abi/requirements.txt" | while read -r pin; do
    name=${pin%%==*}
    version=${pin#*==}
    out="$dest/$name-$version"
    [ -f "$out/.complete" ] && continue
    wheels="$dest/wheels/$name-$version"
    rm -rf "$out" "$wheels"
    mkdir -p "$wheels"
    "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$wheels" "$pin"
    "$py" - "$wheels" "$out" <<'PY'
import pathlib, sys, zipfile
wheels, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
found = 0
for wheel in wheels.glob("*.whl"):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            parts = pathlib.PurePosixPath(name).parts
            if name.endswith(".h") and "include" in parts:
                target = out / "include" / pathlib.PurePosixPath(*parts[parts.index("include") + 1:])
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(z.read(name))
                found += 1
if found == 0:
    sys.exit(f"no headers in {wheels}")
PY
    rm -rf "$wheels"
    touch "$out/.complete"
done
rmdir "$dest/wheels" 2>/dev/null || true
echo "$dest"
