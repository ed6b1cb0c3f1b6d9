#!/bin/bash
# `make rpm`: build dist/slurm-gpu-<version>-1.x86_64.rpm for EL8/EL9 with
# rpmbuild from packaging/rpm/slurm-gpu.spec.
#
# Source0 holds every wheel the venv needs for CPython 3.11 on x86_64
# (manylinux, glibc >= 2.17: EL8 has 2.28): slurm-gpu built from this tree,
# and its dependencies at packaging/wheels.txt's versions.  EL has no
# python3-click etc. for 3.11, so nothing comes from the system but python3.11.
# Needs bash, python3 with its venv module (a throw-away build venv,
# scripts/build-env.sh: not the development install of `make install`),
# rpmbuild and tar: Debian (apt-get install rpm python3-venv) or EL
# (dnf install rpm-build python3), and the package index for pip.
# Exit 77 (one `slurm-gpu:` line) when rpmbuild is missing or the package
# index cannot be reached.
set -euo pipefail
umask 022
HERE=$(cd "$(dirname "$0")/.." && pwd)
OUT=${SLURM_GPU_DIST:-$HERE/dist}
command -v rpmbuild >/dev/null || { echo "slurm-gpu: rpmbuild not found (Debian: apt-get install rpm; EL: dnf install rpm-build)" >&2; exit 77; }
# shellcheck source=build-env.sh
. "$HERE/scripts/build-env.sh"

version=$(sg_version "$HERE")
stage=$(mktemp -d /tmp/slurm-gpu-rpm.XXXXXX)
trap 'rm -rf "$stage"' EXIT
build_env "$stage/venv"
export BPY
PY=$BPY
src=$stage/slurm-gpu-$version
mkdir -p "$src/wheels" "$src/packaging" "$src/docs"

bash "$HERE/scripts/build-wheel.sh" "$src/wheels" >/dev/null

# Its dependencies, pinned in packaging/wheels.txt, for EL's python3.11.
pins=$(grep -E '^[A-Za-z0-9_.-]+==' "$HERE/packaging/wheels.txt" | tr '\n' ' ')
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
