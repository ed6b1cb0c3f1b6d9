#!/bin/bash
# `make deb`: build dist/slurm-gpu_<version>-1_all.deb with dpkg-deb.
#
# The package holds wheels (slurm-gpu and nvidia-ml-py, both pure Python),
# not a venv: postinst makes /opt/slurm-gpu/venv from the node's own
# /usr/bin/python3 (Debian 12: 3.11, Debian 13: 3.13) with the distribution's
# click/jinja2/cffi/PyYAML/ClusterShell, so one .deb fits both releases and
# installs with no network.  It also holds the prolog/epilog scripts, the
# HealthCheckProgram wrapper and a systemd unit for xid-watch.  The SPANK
# plugin is compiled by postinst for the installed Slurm.
#   scripts/build-deb.sh            -> prints the .deb's path
# Needs python3 with its venv module, dpkg-deb, and the package index for
# pip (nvidia-ml-py at packaging/wheels.txt's version, setuptools for the
# wheel build): a throw-away build venv (scripts/build-env.sh), not the
# development install of `make install`.
set -euo pipefail
umask 022
HERE=$(cd "$(dirname "$0")/.." && pwd)
OUT=${SLURM_GPU_DIST:-$HERE/dist}
command -v dpkg-deb >/dev/null || { echo "slurm-gpu: dpkg-deb not found (apt-get install dpkg)" >&2; exit 1; }
# shellcheck source=build-env.sh
. "$HERE/scripts/build-env.sh"

version=$(sg_version "$HERE")
nvml=$(sed -n 's/^nvidia-ml-py==//p' "$HERE/packaging/wheels.txt")
[ -n "$version" ] && [ -n "$nvml" ] || { echo "slurm-gpu: no version in slurm_gpu/__init__.py or packaging/wheels.txt" >&2; exit 1; }
deb_version="$version-1"
stage=$(mktemp -d /tmp/slurm-gpu-deb.XXXXXX)
trap 'rm -rf "$stage"' EXIT
build_env "$stage/venv"
export BPY
PY=$BPY
root=$stage/root
mkdir -p "$root/DEBIAN" "$root/usr/share/slurm-gpu/wheels" "$root/usr/lib/slurm-gpu" \
         "$root/usr/lib/systemd/system" "$root/usr/share/doc/slurm-gpu" "$root/usr/bin"

# Wheels: ours (scripts/build-wheel.sh) and nvidia-ml-py (not in Debian).
bash "$HERE/scripts/build-wheel.sh" "$stage/wheels" >/dev/null
"$PY" -m pip download -q --no-deps --only-binary=:all: --disable-pip-version-check \
    -d "$stage/wheels" "nvidia-ml-py==$nvml" >"$stage/pip.log" 2>&1 ||
    { echo "slurm-gpu: cannot fetch nvidia-ml-py==$nvml from the package index (or PIP_FIND_LINKS=DIR holding it): $(grep -E 'ERROR' "$stage/pip.log" | head -1)" >&2; exit 1; }
cp "$stage"/wheels/slurm_gpu-"$version"-py3-none-any.whl "$stage"/wheels/nvidia_ml_py-*.whl \
   "$root/usr/share/slurm-gpu/wheels/"

# What slurmd runs, at fixed paths (no PATH, no venv knowledge in slurm.conf).
cp -r "$HERE/prolog.d" "$HERE/epilog.d" "$root/usr/lib/slurm-gpu/"
install -m 755 "$HERE/packaging/common/healthcheck" "$root/usr/lib/slurm-gpu/healthcheck"
install -m 755 "$HERE/packaging/common/venv-setup.sh" "$root/usr/lib/slurm-gpu/venv-setup.sh"
# On PATH for admins; the venv link, so it follows every upgrade.
ln -s /opt/slurm-gpu/venv/bin/slurm-gpu "$root/usr/bin/slurm-gpu"
install -m 644 "$HERE/packaging/common/slurm-gpu-xid-watch.service" "$root/usr/lib/systemd/system/"
install -m 644 "$HERE/packaging/common/slurm-gpu-monitor.service" "$root/usr/lib/systemd/system/"
# The site config, every key commented out at its default: a conffile, so an
# upgrade keeps the admin's edits (dpkg-deb adds nothing to conffiles itself).
install -D -m 644 "$HERE/packaging/common/slurm-gpu.toml" "$root/etc/slurm-gpu/slurm-gpu.toml"
echo /etc/slurm-gpu/slurm-gpu.toml >"$root/DEBIAN/conffiles"
# The glob is the checkout's, not the current directory's (`sandbox up --vm` builds from anywhere).
for f in "$HERE/README.md" "$HERE/CHANGELOG.md" "$HERE"/docs/*.md; do install -m 644 "$f" "$root/usr/share/doc/slurm-gpu/"; done
cat >"$root/usr/share/doc/slurm-gpu/copyright" <<COPYRIGHT
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: slurm-gpu

Files: *
License: Apache-2.0
 On Debian systems the full text of the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.

Files: usr/share/slurm-gpu/wheels/nvidia_ml_py-*.whl
Copyright: NVIDIA Corporation
License: BSD-3-Clause
 nvidia-ml-py $nvml from PyPI; its license text is inside the wheel.
COPYRIGHT

for s in postinst prerm postrm; do install -m 755 "$HERE/packaging/debian/$s" "$root/DEBIAN/$s"; done
install -m 644 "$HERE/packaging/debian/triggers" "$root/DEBIAN/triggers"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$deb_version/" -e "s/@SIZE@/$size/" \
    -e "s/@MAINTAINER@/${DEBFULLNAME:-slurm-gpu maintainers} <${DEBEMAIL:-slurm-gpu@localhost}>/" \
    "$HERE/packaging/debian/control.in" >"$root/DEBIAN/control"
chmod -R u=rwX,go=rX "$root"
chmod 755 "$root"/usr/lib/slurm-gpu/{healthcheck,venv-setup.sh} "$root"/usr/lib/slurm-gpu/*.d/* "$root"/DEBIAN/{postinst,prerm,postrm}

mkdir -p "$OUT"
deb="$OUT/slurm-gpu_${deb_version}_all.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
