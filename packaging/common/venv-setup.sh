#!/bin/sh
# Make the slurm-gpu venv from this system's own /usr/bin/python3, from the
# wheels the package ships (no network), then try to build the SPANK plugin
# for the installed Slurm.  Run by the deb's postinst and the rpm's %post;
# also by hand after a Python upgrade.  Prints one line per outcome.
#   venv-setup.sh WHEEL_DIR
# SLURM_GPU_PYTHON: the interpreter (default /usr/bin/python3; EL: python3.11).
# SLURM_GPU_SYSTEM_SITE=1 (default): click, jinja2, cffi, PyYAML and
# ClusterShell come from the distribution's packages (the .deb's
# dependencies) and only nvidia-ml-py and slurm-gpu from WHEEL_DIR; 0: every
# dependency comes from WHEEL_DIR (the .rpm ships them all).
set -e
umask 022
WHEELS=${1:?usage: venv-setup.sh WHEEL_DIR}
PYTHON=${SLURM_GPU_PYTHON:-/usr/bin/python3}
BASE=/opt/slurm-gpu
VENV=$BASE/venv
# Always from scratch: an upgrade of Python or of slurm-gpu leaves no stale file.
rm -rf "$VENV"
mkdir -p "$BASE"
if [ "${SLURM_GPU_SYSTEM_SITE:-1}" = 1 ]; then
    "$PYTHON" -m venv --system-site-packages "$VENV"
else
    "$PYTHON" -m venv "$VENV"
fi
# Only the shipped wheels: no pip config or PIP_* variable of the admin's
# (or of the package manager's environment) takes part.
env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/nonexistent PIP_CONFIG_FILE=/dev/null \
    "$VENV/bin/python" -m pip install -q --no-index --no-cache-dir --disable-pip-version-check \
    --find-links "$WHEELS" slurm-gpu
# Slurm runs our code as root and inside every job user's processes.
chmod -R a+rX "$BASE"
echo "slurm-gpu: installed $("$VENV/bin/slurm-gpu" --version 2>&1 | tail -1) into $VENV"
# The SPANK plugin must match the installed Slurm's major version: built here,
# never shipped.  Best effort: a node without a compiler still gets the rest.
if out=$("$VENV/bin/slurm-gpu" spank build 2>&1); then
    echo "slurm-gpu: SPANK plugin built: $(echo "$out" | tail -1)"
else
    echo "slurm-gpu: SPANK plugin not built ($(echo "$out" | tail -1 | sed 's/^slurm-gpu: //')); needs gcc, Python headers, setuptools and Slurm's spank.h (Debian: gcc python3-dev python3-setuptools libslurm-dev; EL: gcc python3.11-devel slurm-devel), then run: $VENV/bin/slurm-gpu spank build"
fi
