#!/bin/bash
# `make rpm`: build dist/slurm-gpu-<version>-1.x86_64.rpm for EL8/EL9 with
# rpmbuild from packaging/rpm/slurm-gpu.spec.
#
# Source0 holds every wheel the venv needs for CPython 3.11 on x86_64
# (manylinux, glibc >= 2.17: EL8 has 2.28): slurm-gpu built from this tree,
# and its dependencies in the versions the project's venv runs.  EL has no
# python3-click etc. for 3.11, so nothing comes from the system but python3.11.
# Exit 77 (one `slurm-gpu:` line) when rpmbuild is missing or the package
# index cannot be reached.
set -euo pipefail
umask 022
HERE=$(cd "$(dirname "$0")/.." && pwd)
VENV=${SLURM_GPU_VENV:-/opt/slurm-gpu/venv}
OUT=${SLURM_GPU_DIST:-$HERE/dist}
PY="$VENV/bin/python"
[ -x "$PY" ] || { echo "slurm-gpu: no venv at $VENV (run: make install)" >&2; exit 1; }
command -v rpmbuild >/dev/null || { echo "slurm-gpu: rpmbuild not found (apt-get install rpm)" >&2; exit 77; }

version=$("$PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); import slurm_gpu; print(slurm_gpu.__version__)' "$HERE")
stage=$(mktemp -d /tmp/slurm-gpu-rpm.XXXXXX)
trap 'rm -rf "$stage"' EXIT
src=$stage/slurm-gpu-$version
mkdir -p "$src/wheels" "$src/packaging" "$src/docs"

bash "$HERE/scripts/build-wheel.sh" "$src/wheels" >/dev/null

# Its dependencies, pinned to what the project's venv runs, for EL's python3.11.
pins=$("$PY" - <<'PIN'
import importlib.metadata as m
req = ["click", "jinja2", "markupsafe", "cffi", "pycparser", "nvidia-ml-py", "clustershell", "pyyaml"]
print(" ".join(f"{n}=={m.version(n)}" for n in req))
PIN
)
# shellcheck disable=SC2086
if ! "$PY" -m pip download -q --no-deps --only-binary=:all: --disable-pip-version-check \
        --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        --platform any -d "$src/wheels" $pins >"$stage/pip.log" 2>&1; then
    echo "slurm-gpu: cannot fetch the EL wheels ($(grep -E 'ERROR' "$stage/pip.log" | head -1))" >&2
    exit 77
fi
{
    echo "slurm-gpu $version: Apache-2.0."
    echo "Bundled wheels (installed into /opt/slurm-gpu/venv in %post); each wheel holds its license text:"
    for w in "$src"/wheels/*.whl; do
        "$PY" - "$w" <<'LIC'
import sys, zipfile, email.parser
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
msg = email.parser.Parser().parsestr(z.read(meta).decode())
lic = msg.get("License-Expression") or msg.get("License") or ", ".join(
    c.split("::")[-1].strip() for c in msg.get_all("Classifier") or [] if c.startswith("License ::")) or "see wheel"
print(f"  {msg['Name']} {msg['Version']}: {lic.splitlines()[0]}")
LIC
    done
} >"$src/LICENSE-NOTES"

cp -r "$HERE/prolog.d" "$HERE/epilog.d" "$src/"
cp -r "$HERE/packaging/common" "$src/packaging/"
cp "$HERE/README.md" "$HERE/CHANGELOG.md" "$src/"
cp "$HERE"/docs/*.md "$src/docs/"
mkdir -p "$stage"/rpmbuild/{SOURCES,SPECS,BUILD,RPMS,SRPMS,BUILDROOT}
tar -C "$stage" -czf "$stage/rpmbuild/SOURCES/slurm-gpu-$version.tar.gz" "slurm-gpu-$version"
if ! rpmbuild -bb --quiet --define "_topdir $stage/rpmbuild" --define "sg_version $version" \
        --define "_build_id_links none" --nodeps \
        "$HERE/packaging/rpm/slurm-gpu.spec" >"$stage/rpmbuild.log" 2>&1; then
    echo "slurm-gpu: rpmbuild failed: $(grep -iE 'error' "$stage/rpmbuild.log" | head -1) " >&2
    cat "$stage/rpmbuild.log" >&2
    exit 1
fi
mkdir -p "$OUT"
rpm=$(find "$stage/rpmbuild/RPMS" -name "slurm-gpu-$version-1*.rpm" | head -1)
cp "$rpm" "$OUT/"
echo "$OUT/$(basename "$rpm")"
