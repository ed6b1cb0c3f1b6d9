#!/bin/bash
# Build slurm-gpu's wheel into OUTDIR from a clean copy of this tree (tracked
# and new files, never ignored ones: setuptools' build/ directory keeps files
# deleted from the tree and would ship them).  Used by build-deb.sh and
# build-rpm.sh; prints the wheel's path.
#   scripts/build-wheel.sh OUTDIR      (SLURM_GPU_VENV: the venv whose pip builds it)
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:?usage: build-wheel.sh OUTDIR}
PY="${SLURM_GPU_VENV:-/opt/slurm-gpu/venv}/bin/python"
[ -x "$PY" ] || { echo "slurm-gpu: no venv at ${SLURM_GPU_VENV:-/opt/slurm-gpu/venv} (run: make install)" >&2; exit 1; }
tree=$(mktemp -d /tmp/slurm-gpu-tree.XXXXXX)
trap 'rm -rf "$tree"' EXIT
if git -C "$HERE" rev-parse --git-dir >/dev/null 2>&1; then
    (cd "$HERE" && git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi; done |
        tar --null -T - -cf -) | tar -xf - -C "$tree"
else
    tar -C "$HERE" --exclude=./build --exclude=./dist --exclude='*.egg-info' -cf - . | tar -xf - -C "$tree"
fi
version=$("$PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); import slurm_gpu; print(slurm_gpu.__version__)' "$tree")
mkdir -p "$OUT"
"$PY" -m pip wheel -q --no-deps --disable-pip-version-check -w "$OUT" "$tree" >/dev/null
echo "$OUT/slurm_gpu-$version-py3-none-any.whl"
