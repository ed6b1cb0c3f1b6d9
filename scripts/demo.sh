#!/bin/bash
# `make demo`: a real Slurm (Debian's slurmctld/slurmd/munge) modelled on a
# recorded 8-GPU server runs a job with --gres=gpu:2 that prints what it got,
# shows the gres.conf generated from the machine model, and tears down, also
# when something fails.  Needs root; leaves nothing running.
#   MACHINE=<name|path> NODES=<n> scripts/demo.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
VENV=${SLURM_GPU_VENV:-/opt/slurm-gpu/venv}
SG="$VENV/bin/slurm-gpu"
MACHINE=${MACHINE:-h100-sxm-8x}
NODES=${NODES:-2}
[ -d "$HERE/tests/data/machines/$MACHINE" ] && MACHINE="$HERE/tests/data/machines/$MACHINE"

if [ "$(id -u)" != 0 ]; then
  echo "slurm-gpu: the demo needs root (it runs Slurm's daemons; try: sudo make demo)" >&2
  exit 1
fi
[ -x "$SG" ] || { echo "slurm-gpu: not installed in $VENV (run: make install)" >&2; exit 1; }

# Job users must reach slurm.conf and the munge socket: not under a 0700 directory.
DIR=$(mktemp -d /tmp/slurm-gpu-demo.XXXXXX)
chmod 755 "$DIR"
teardown() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -f "$DIR/run/sandbox.json" ]; then "$SG" sandbox down --dir "$DIR" || rc=1; fi
  rm -rf "$DIR"
  exit $rc
}
trap teardown EXIT INT TERM

section() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

section "sandbox up: $NODES nodes modelled on $(basename "$MACHINE")"
# An assignment, not eval "$(...)": set -e must see up's failure.
env_line=$("$SG" sandbox up --dir "$DIR" --nodes "$NODES" --machine "$MACHINE")
eval "$env_line"
cd "$DIR"
sinfo -N -o '%N %T %c %m %G'

section "gres.conf generated from the machine model ($DIR/etc/gres.conf)"
cat "$DIR/etc/gres.conf"

section "slurm.conf node lines"
grep '^NodeName=' "$SLURM_CONF"

section "srun -N1 --gres=gpu:2: the job prints what it got"
# Slurm's CPU ids are the modelled machine's abstract cores; Cpus_allowed is
# what this (smaller) host could actually give the task.
srun -N1 --gres=gpu:2 --gres-flags=enforce-binding bash -c '
  echo "node                 $SLURMD_NODENAME"
  echo "CUDA_VISIBLE_DEVICES $CUDA_VISIBLE_DEVICES"
  echo "SLURM_STEP_GPUS      $SLURM_STEP_GPUS"
  scontrol show job -d "$SLURM_JOB_ID" | grep -o "CPU_IDs=[^ ]* Mem=[^ ]* GRES=[^ ]*" | sed "s/^/allocation           /"
  echo "Cpus_allowed_list    $(grep Cpus_allowed_list /proc/self/status | cut -f2) (on this host)"'

section "sandbox down"
