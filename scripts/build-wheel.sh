#!/bin/bash
# Build slurm-gpu's wheel into OUTDIR from a clean copy of this tree (tracked
# and new files, never ignored ones: setuptools' build/ directory keeps files
# deleted from the tree and would ship them), with a throw-away build venv
# (scripts/build-env.sh).  Used by build-deb.sh and build-rpm.sh; prints the
# wheel's path.
#   scripts/build-wheel.sh OUTDIR      (SLURM_GPU_BUILD_PYTHON: the python3 to use)
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:?usage: build-wheel.sh OUTDIR}
# shellcheck source=build-env.sh
. "$HERE/scripts/build-env.sh"
work=$(mktemp -d /tmp/slurm-gpu-wheel.XXXXXX)
trap 'rm -rf "$work"' EXIT
tree=$work/tree
mkdir "$tree"
if git -C "$HERE" rev-parse --git-dir >/dev/null 2>&1; then
    (cd "$HERE" && git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi; done |
        tar --null -T - -cf -) | tar -xf - -C "$tree"
else
    tar -C "$HERE" --exclude=./build --exclude=./dist --exclude='*.egg-info' -cf - . | tar -xf - -C "$tree"
fi
version=$(sg_version "$tree")
[ -n "$version" ] || { echo "slurm-gpu: no __version__ in slurm_gpu/__init__.py" >&2; exit 1; }
if [ -z "${BPY:-}" ]; then build_env "$work/venv"; fi
mkdir -p "$OUT"
if ! "$BPY" -m pip wheel -q --no-deps --disable-pip-version-check -w "$OUT" "$tree" >"$work/pip.log" 2>&1; then
    echo "slurm-gpu: building the wheel failed (pip fetches setuptools and wheel for it): $(grep -E 'ERROR|rror:' "$work/pip.log" | head -1)" >&2
    exit 1
fi
echo "$OUT/slurm_gpu-$version-py3-none-any.whl"
