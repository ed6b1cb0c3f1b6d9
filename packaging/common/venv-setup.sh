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
# SLURM_GPU_SLURM_INCLUDE: the directory holding slurm/spank.h when Slurm is
# not under /usr (a prefix install: /opt/slurm/include).
#
# A plugin build that fails while the live tree has a plugin keeps the live
# tree (exit 1, the reason in $BASE/setup-failed for `slurm-gpu doctor`):
# swapping in a tree without one failed every srun/sbatch on the node.
set -e
umask 022
WHEELS=${1:?usage: venv-setup.sh WHEEL_DIR}
# The package's own defaults, in setup-defaults beside this script (the .rpm
# ships SLURM_GPU_PYTHON=/usr/bin/python3.11 and SLURM_GPU_SYSTEM_SITE=0:
# EL's python3 is 3.9, and its pip refuses slurm-gpu), so the one documented
# command reruns the setup as the package ran it.  The environment wins.
# Read, not sourced: only these two keys, one KEY=VALUE a line.
DEFAULTS=$(dirname "$0")/setup-defaults
if [ -r "$DEFAULTS" ]; then
    while IFS='=' read -r key value; do
        case $key in
            SLURM_GPU_PYTHON) SLURM_GPU_PYTHON=${SLURM_GPU_PYTHON:-$value} ;;
            SLURM_GPU_SYSTEM_SITE) SLURM_GPU_SYSTEM_SITE=${SLURM_GPU_SYSTEM_SITE:-$value} ;;
        esac
    done <"$DEFAULTS"
fi
PYTHON=${SLURM_GPU_PYTHON:-/usr/bin/python3}
BASE=${SLURM_GPU_BASE:-/opt/slurm-gpu}   # tests only: another directory than the packages'
VENV=$BASE/venv
SETUP=$0
# Built beside the live one and swapped in with one rename: slurmd runs our
# prolog, epilog and health check at any moment, and a hook that found no
# venv (the old rm -rf, then rebuild) exited 127 and drained the node.
# $VENV is a symlink to venv-STAMP; scripts' shebangs and the plugin name
# their own versioned directory, so a hook already running finishes on the
# tree it started from.  That previous tree is kept (one upgrade back);
# older ones are removed.  From scratch each time: no stale file survives.
NAME=venv-$(date -u +%Y%m%dT%H%M%S.%N)-$$
NEW=$BASE/$NAME
mkdir -p "$BASE"
trap 'rm -rf "$NEW" "$BASE/.venv.link.$$" "$BASE/.setup-failed.$$"' EXIT
if [ "${SLURM_GPU_SYSTEM_SITE:-1}" = 1 ]; then
    "$PYTHON" -m venv --system-site-packages "$NEW"
else
    "$PYTHON" -m venv "$NEW"
fi
# Only the shipped wheels: no pip config or PIP_* variable of the admin's
# (or of the package manager's environment) takes part.
env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/nonexistent PIP_CONFIG_FILE=/dev/null \
    "$NEW/bin/python" -m pip install -q --no-index --no-cache-dir --disable-pip-version-check \
    --find-links "$WHEELS" slurm-gpu
# The runner's pre-exec helper (MPS daemons join the job's cgroups through
# it): built here like the plugin; best effort, its absence is one clear
# line when a --gpu-mps job needs it.
"$NEW/bin/python" -I -m slurm_gpu.exechelper >/dev/null ||
    echo "slurm-gpu: warning: slurm-gpu-exec not built (needs gcc and libc6-dev/glibc-devel); --gpu-mps jobs fail until: $VENV/bin/python -m slurm_gpu.exechelper" >&2
# The SPANK plugin must match the installed Slurm's major version: built here,
# never shipped, into the new tree before it goes live.  Best effort: a node
# without a compiler still gets the rest.
spank_ok=1
out=$("$NEW/bin/slurm-gpu" spank build ${SLURM_GPU_SLURM_INCLUDE:+--include-dir "$SLURM_GPU_SLURM_INCLUDE"} 2>&1) ||
    spank_ok=0
tools="needs gcc, Python headers, setuptools and Slurm's spank.h (Debian: gcc python3-dev python3-setuptools libslurm-dev; EL: gcc python3.11-devel slurm-devel; Slurm under a prefix: SLURM_GPU_SLURM_INCLUDE=<prefix>/include)"
reason=$(echo "$out" | tail -1 | sed 's/^slurm-gpu: //')
# The live tree's plugin works when both halves are there and its Python
# starts: never trade that for a tree without a plugin.
if [ $spank_ok = 0 ] && [ -f "$VENV/lib/slurm-gpu/slurm_gpu_spank.so" ] &&
   [ -f "$VENV/lib/slurm-gpu/slurm_gpu_spank_py.so" ] && "$VENV/bin/python" -I -c '' 2>/dev/null; then
    msg="slurm-gpu: SPANK plugin not built ($reason): the new venv was NOT put live, $VENV ($(readlink "$VENV" 2>/dev/null || echo a directory)) and its plugin stay; $tools, then run: ${SLURM_GPU_RETRY:-$SETUP $WHEELS}"
    echo "$msg" >"$BASE/.setup-failed.$$" && mv -f "$BASE/.setup-failed.$$" "$BASE/setup-failed"
    echo "$msg" >&2
    exit 1
fi
# Slurm runs our code as root and inside every job user's processes: the
# whole tree, plugin included, readable by all before it goes live.
chmod a+rx "$BASE"
chmod -R a+rX "$NEW"
# The swap: rename(2) of a new symlink over the old one is atomic.  A venv
# made by an older package is a real directory, which rename cannot replace:
# it is moved aside first (the one moment without $VENV, two renames apart).
OLD=
if [ -L "$VENV" ]; then
    OLD=$(basename "$(readlink "$VENV")")
elif [ -d "$VENV" ]; then
    OLD=venv-0-previous-$$   # sorts before every stamped tree
    mv -T "$VENV" "$BASE/$OLD"
fi
ln -s "$NAME" "$BASE/.venv.link.$$"
mv -T "$BASE/.venv.link.$$" "$VENV"
trap - EXIT
rm -f "$BASE/setup-failed"
# How to run this setup again, as the package ran it: what `slurm-gpu
# doctor` names to rebuild a plugin built for another Slurm, and what the
# packages' triggers run when Slurm's major changes under the plugin.
rerun="${SLURM_GPU_PYTHON:+SLURM_GPU_PYTHON=$SLURM_GPU_PYTHON }${SLURM_GPU_SYSTEM_SITE:+SLURM_GPU_SYSTEM_SITE=$SLURM_GPU_SYSTEM_SITE }${SLURM_GPU_SLURM_INCLUDE:+SLURM_GPU_SLURM_INCLUDE=$SLURM_GPU_SLURM_INCLUDE }$SETUP $WHEELS"
echo "$rerun" >"$BASE/.setup-command.$$" && mv -f "$BASE/.setup-command.$$" "$BASE/setup-command"
for d in "$BASE"/venv-*; do
    [ -d "$d" ] && [ ! -L "$d" ] || continue
    case ${d##*/} in "$NAME"|"${OLD:-$NAME}") ;; *) rm -rf "$d" ;; esac
done
echo "slurm-gpu: installed $("$VENV/bin/slurm-gpu" --version 2>&1 | tail -1) into $VENV ($NEW)"
if [ $spank_ok = 1 ]; then
    echo "slurm-gpu: SPANK plugin built: $(echo "$out" | tail -1)"
    # The Slurm major it was built for (the .so records it; libslurm's soname says which is installed).
    "$VENV/bin/python" -I -m slurm_gpu.slurminstall check "$VENV/lib/slurm-gpu/slurm_gpu_spank.so" 2>&1 || true
else
    echo "slurm-gpu: SPANK plugin not built ($reason); $tools, then run: $VENV/bin/slurm-gpu spank build${SLURM_GPU_SLURM_INCLUDE:+ --include-dir $SLURM_GPU_SLURM_INCLUDE}"
fi
