#!/bin/bash
# `make rpm`: build dist/slurm-gpu-<version>-1.<arch>.rpm for EL8/EL9 with
# rpmbuild from packaging/rpm/slurm-gpu.spec, for x86_64 and aarch64 (GH200,
# GB200 nodes): SLURM_GPU_RPM_ARCHES (default "x86_64 aarch64").  Prints one
# path a line.
#
# Source0 holds every wheel the venv needs for CPython 3.11 on the arch
# (manylinux, glibc >= 2.17: EL8 has 2.28): slurm-gpu built from this tree,
# and its dependencies at packaging/wheels.txt's versions.  Nothing is
# compiled here, so one host builds both arches (rpmbuild --target).  An
# arch whose wheels PyPI lacks is skipped with one line naming them; x86_64's
# missing is exit 77.  EL has no
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
mkdir -p "$stage/own"
bash "$HERE/scripts/build-wheel.sh" "$stage/own" >/dev/null
pins=$(grep -E '^[A-Za-z0-9_.-]+==' "$HERE/packaging/wheels.txt" | tr '\n' ' ')
mkdir -p "$OUT"
built=0

for arch in ${SLURM_GPU_RPM_ARCHES:-x86_64 aarch64}; do
case $arch in x86_64|aarch64) ;; *) echo "slurm-gpu: no RPM for arch '$arch' (x86_64, aarch64)" >&2; exit 2 ;; esac
src=$stage/$arch/slurm-gpu-$version
rm -rf "$stage/$arch"
mkdir -p "$src/wheels" "$src/packaging" "$src/docs"
cp "$stage"/own/*.whl "$src/wheels/"

# Its dependencies, pinned in packaging/wheels.txt, for EL's python3.11 on $arch.
# shellcheck disable=SC2086
if ! "$PY" -m pip download -q --no-deps --only-binary=:all: --disable-pip-version-check \
        --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none \
        --platform manylinux2014_$arch --platform manylinux_2_17_$arch --platform manylinux_2_28_$arch \
        --platform any -d "$src/wheels" $pins >"$stage/pip.log" 2>&1; then
    why=$(grep -E 'ERROR' "$stage/pip.log" | head -1)
    if [ "$arch" = x86_64 ]; then
        echo "slurm-gpu: cannot fetch the EL wheels ($why)" >&2
        exit 77
    fi
    echo "slurm-gpu: no $arch RPM: cannot fetch its wheels ($why)" >&2
    continue
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
top=$stage/$arch/rpmbuild
mkdir -p "$top"/{SOURCES,SPECS,BUILD,RPMS,SRPMS,BUILDROOT}
tar -C "$stage/$arch" -czf "$top/SOURCES/slurm-gpu-$version.tar.gz" "slurm-gpu-$version"
if ! rpmbuild -bb --quiet --target "$arch" --define "_topdir $top" --define "sg_version $version" \
        --define "_build_id_links none" --nodeps \
        "$HERE/packaging/rpm/slurm-gpu.spec" >"$stage/rpmbuild.log" 2>&1; then
    echo "slurm-gpu: rpmbuild failed: $(grep -iE 'error' "$stage/rpmbuild.log" | head -1) " >&2
    cat "$stage/rpmbuild.log" >&2
    exit 1
fi
rpm=$(find "$top/RPMS" -name "slurm-gpu-$version-1*.$arch.rpm" | head -1)
[ -n "$rpm" ] || { echo "slurm-gpu: rpmbuild made no $arch package" >&2; exit 1; }
cp "$rpm" "$OUT/"
echo "$OUT/$(basename "$rpm")"
built=$((built + 1))
done
[ $built -gt 0 ] || exit 77
