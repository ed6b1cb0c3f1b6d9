#!/bin/bash
# `make gpu-check-bundle`: one self-contained directory (at most 60 MiB) to
# carry to a GPU machine that may reach no package registry, and run there
# with one command (docs/development.md):
#   OUTDIR/gpu-check.sh        the check (packaging/gpu-check/)
#   OUTDIR/gpu_check.py        its Python half
#   OUTDIR/wheels/             slurm-gpu's wheel, pip, pytest and every
#                              dependency for CPython 3.10-3.13 on x86_64
#                              and aarch64 (manylinux 2.17+)
#   OUTDIR/tests/gpu/          the project's tests/gpu, and a pytest.ini
#   OUTDIR/MANIFEST            what is in it, from which commit
#   scripts/gpu-check-bundle.sh [OUTDIR]         (default: dist/gpu-check)
# GPU_CHECK_PYTHONS ("3.10 3.11 3.12 3.13") and GPU_CHECK_ARCHES
# ("x86_64 aarch64") narrow it (the tests build one for this host only).
# Needs the package index for pip (or PIP_FIND_LINKS=DIR holding the wheels).
set -euo pipefail
umask 022
HERE=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$HERE/dist/gpu-check}
PYTHONS=${GPU_CHECK_PYTHONS:-3.10 3.11 3.12 3.13}
ARCHES=${GPU_CHECK_ARCHES:-x86_64 aarch64}
MAX_MIB=60
say() { echo "slurm-gpu: gpu-check-bundle: $*" >&2; }
# shellcheck source=build-env.sh
. "$HERE/scripts/build-env.sh"
stage=$(mktemp -d /tmp/slurm-gpu-gpucheck.XXXXXX)
trap 'rm -rf "$stage"' EXIT
build_env "$stage/venv"
export BPY
mkdir -p "$stage/b/wheels" "$stage/b/tests/gpu"
bash "$HERE/scripts/build-wheel.sh" "$stage/b/wheels" >/dev/null
# The packages' pins (the versions the test suite runs), pytest for tests/gpu,
# pip to install them into a venv made without ensurepip, tomli and
# exceptiongroup for pytest on 3.10.
pins=$(grep '==' "$HERE/packaging/wheels.txt")
extra="pytest pip tomli exceptiongroup"
for py in $PYTHONS; do
    for arch in $ARCHES; do
        abi=cp${py/./}
        fetch() {
            # shellcheck disable=SC2086
            "$BPY" -m pip download -q --no-deps --only-binary=:all: --disable-pip-version-check \
                --python-version "$py" --implementation cp --abi "$abi" --abi abi3 --abi none \
                --platform "manylinux2014_$arch" --platform "manylinux_2_17_$arch" \
                --platform "manylinux_2_28_$arch" --platform any -d "$stage/b/wheels" "$@" >"$stage/pip.log" 2>&1
        }
        # A pin whose release needs a newer Python (3.10) gets the newest release that fits.
        for pin in $pins; do
            if ! fetch "$pin" && ! fetch "${pin%%==*}"; then
                say "cannot fetch $pin for CPython $py on $arch: $(grep -E 'ERROR' "$stage/pip.log" | head -1)"
                exit 1
            fi
        done
    done
    # pytest and its dependencies are pure Python; their set depends on the version only
    # shellcheck disable=SC2086
    "$BPY" -m pip download -q --only-binary=:all: --disable-pip-version-check --python-version "$py" \
        --implementation cp --platform any -d "$stage/b/wheels" $extra >"$stage/pip.log" 2>&1 ||
        { say "cannot fetch pytest for CPython $py: $(grep -E 'ERROR' "$stage/pip.log" | head -1)"; exit 1; }
done
install -m 755 "$HERE/packaging/gpu-check/gpu-check.sh" "$stage/b/gpu-check.sh"
install -m 644 "$HERE/packaging/gpu-check/gpu_check.py" "$stage/b/gpu_check.py"
install -m 644 "$HERE"/tests/gpu/*.py "$stage/b/tests/gpu/"
printf '[pytest]\nmarkers =\n    gpu: needs a real NVIDIA GPU and driver\n' >"$stage/b/tests/pytest.ini"
{
    echo "slurm-gpu GPU check bundle: $(sg_version "$HERE"), $(git -C "$HERE" describe --always --dirty 2>/dev/null || echo 'no git')"
    echo "CPython: $PYTHONS; machines: $ARCHES"
    (cd "$stage/b" && find . -type f ! -name MANIFEST -printf '%s %p\n' | sort -k2)
} >"$stage/b/MANIFEST"
mib=$(( ($(du -sb "$stage/b" | cut -f1) + 1048575) / 1048576 ))
[ "$mib" -le $MAX_MIB ] || { say "the bundle is $mib MiB, over $MAX_MIB MiB"; exit 1; }
rm -rf "$OUT.new"
mkdir -p "$(dirname "$OUT")"
cp -a "$stage/b" "$OUT.new"
rm -rf "$OUT"
mv "$OUT.new" "$OUT"
echo "$OUT ($mib MiB, $(ls "$OUT/wheels" | wc -l) wheels)"
