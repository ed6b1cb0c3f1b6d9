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
# Needs the project's venv (SLURM_GPU_VENV, default /opt/slurm-gpu/venv) for
# pip; the nvidia-ml-py wheel is the version that venv runs.
set -euo pipefail
umask 022
HERE=$(cd "$(dirname "$0")/.." && pwd)
VENV=${SLURM_GPU_VENV:-/opt/slurm-gpu/venv}
OUT=${SLURM_GPU_DIST:-$HERE/dist}
PY="$VENV/bin/python"
[ -x "$PY" ] || { echo "slurm-gpu: no venv at $VENV (run: make install)" >&2; exit 1; }
command -v dpkg-deb >/dev/null || { echo "slurm-gpu: dpkg-deb not found (apt-get install dpkg)" >&2; exit 1; }

version=$("$PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); import slurm_gpu; print(slurm_gpu.__version__)' "$HERE")
nvml=$("$PY" -c 'import importlib.metadata as m; print(m.version("nvidia-ml-py"))')
deb_version="$version-1"
stage=$(mktemp -d /tmp/slurm-gpu-deb.XXXXXX)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
mkdir -p "$root/DEBIAN" "$root/usr/share/slurm-gpu/wheels" "$root/usr/lib/slurm-gpu" \
         "$root/usr/lib/systemd/system" "$root/usr/share/doc/slurm-gpu"

# Wheels: ours (scripts/build-wheel.sh) and nvidia-ml-py (not in Debian).
bash "$HERE/scripts/build-wheel.sh" "$stage/wheels" >/dev/null
"$PY" -m pip download -q --no-deps --only-binary=:all: --disable-pip-version-check \
    -d "$stage/wheels" "nvidia-ml-py==$nvml" >/dev/null
cp "$stage"/wheels/slurm_gpu-"$version"-py3-none-any.whl "$stage"/wheels/nvidia_ml_py-*.whl \
   "$root/usr/share/slurm-gpu/wheels/"

# What slurmd runs, at fixed paths (no PATH, no venv knowledge in slurm.conf).
cp -r "$HERE/prolog.d" "$HERE/epilog.d" "$root/usr/lib/slurm-gpu/"
install -m 755 "$HERE/packaging/common/healthcheck" "$root/usr/lib/slurm-gpu/healthcheck"
install -m 755 "$HERE/packaging/common/venv-setup.sh" "$root/usr/lib/slurm-gpu/venv-setup.sh"
install -m 644 "$HERE/packaging/common/slurm-gpu-xid-watch.service" "$root/usr/lib/systemd/system/"
install -m 644 "$HERE/packaging/common/slurm-gpu-monitor.service" "$root/usr/lib/systemd/system/"
# The site config, every key commented out at its default: a conffile, so an
# upgrade keeps the admin's edits (dpkg-deb adds nothing to conffiles itself).
install -D -m 644 "$HERE/packaging/common/slurm-gpu.toml" "$root/etc/slurm-gpu/slurm-gpu.toml"
echo /etc/slurm-gpu/slurm-gpu.toml >"$root/DEBIAN/conffiles"
for f in README.md CHANGELOG.md docs/*.md; do install -m 644 "$HERE/$f" "$root/usr/share/doc/slurm-gpu/"; done
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
