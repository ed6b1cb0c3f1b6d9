#!/bin/bash
# `make demo`: a tour of slurm-gpu on a real Slurm sandbox (Debian's slurmctld,
# slurmd and munge; 2 nodes modelled on a recorded 2-GPU, 2-NUMA H100 NVL
# server, each with the NVML simulator and NVIDIA's MPS control daemon):
#   1. gres.conf rendered from the node's hardware;
#   2. a --gpu-numa-bind job that prints its CPUs and memory policy;
#   3. a --gpu-mps job that talks to its own MPS control daemon;
#   4. a --gpu-mig job that gets its own MIG instances;
#   5. a named fault drill (Xid 48: the kernel line and NVML's ECC count) that
#      drains a node through the health check, then the repair and the resume.
# It tears down, also when something fails, and leaves nothing running.
# Needs root; the jobs run as DEMO_USER (default nobody).  Prints the tour's
# time at the end.
#   MACHINE=<name|path> DEMO_SLURM=22.05|24.11|26.05 scripts/demo.sh
set -euo pipefail
VENV=${SLURM_GPU_VENV:-/opt/slurm-gpu/venv}
SG="$VENV/bin/slurm-gpu"
MACHINE=${MACHINE:-mini-2numa}
DEMO_SLURM=${DEMO_SLURM:-}

if [ "$(id -u)" != 0 ]; then
  echo "slurm-gpu: the demo needs root (it runs Slurm's daemons; try: sudo make demo)" >&2
  exit 1
fi
[ -x "$SG" ] || { echo "slurm-gpu: not installed in $VENV (run: make install)" >&2; exit 1; }
export SLURM_GPU_VENV=$VENV
start=$(date +%s%N)

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

# Jobs run as an ordinary user (MPS daemons never run as root): `nobody`,
# which every system (and every Debian root) has, so the demo creates no user.
# `sandbox run` runs the client inside the Debian root on --slurm 24.11/26.05.
as_user() { "$SG" sandbox run --dir "$DIR" --user "${DEMO_USER:-nobody}" --timeout 60 -- "$@"; }
section() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
wait_state() {   # NODE REGEX SECONDS: poll sinfo until the node's state matches
  local deadline=$(( $(date +%s) + $3 )) state=
  while [ "$(date +%s)" -le $deadline ]; do
    state=$(sinfo -h -n "$1" -o '%T')
    if [[ $state =~ ^($2)$ ]]; then echo "$1: $state"; return 0; fi
    sleep 0.2
  done
  echo "slurm-gpu: demo: $1 is '$state', not $2, after $3 s" >&2
  return 1
}

section "sandbox up: 2 nodes modelled on $MACHINE${DEMO_SLURM:+, Slurm $DEMO_SLURM}"
# The model's NUMA node 1 is this host's node 0, so binding is real on a 1-NUMA host.
# HealthCheckInterval=2, not 1: on Slurm 22.05 a node resumed while health-check
# RPCs go out every second stays NOT_RESPONDING (idle*) for tens of seconds.
# An assignment, not eval "$(...)": set -e must see up's failure.
env_lines=$("$SG" sandbox up --dir "$DIR" --nodes 2 --machine "$MACHINE" ${DEMO_SLURM:+--slurm "$DEMO_SLURM"} \
            --health-interval 2 --set health.clean_runs_to_resume=1 --set 'spank.numa_node_map={"1" = 0}')
eval "$env_lines"
cd "$DIR"
sinfo -N -o '%N %T %c %m %G'

section "1. gres.conf rendered from n1's hardware (NVML + hwloc, here the simulator)"
SLURM_GPU_CONFIG=$DIR/etc/slurm-gpu.toml SLURMD_NODENAME=n1 "$SG" gres render --node n1 --dev-dir "$DIR/dev" | grep -v '^#\|^$'

section "2. srun -n2 --gres=gpu:2 --gpu-numa-bind=prefer: each task is bound to its GPU's NUMA node"
as_user srun -N1 -w n1 -n2 --gres=gpu:2 --gpu-numa-bind=prefer bash -c '
  policy=$(head -1 /proc/self/numa_maps | cut -d" " -f2)
  echo "task $SLURM_PROCID  GPU ${CUDA_VISIBLE_DEVICES}  CPUs $(grep Cpus_allowed_list /proc/self/status | cut -f2)  memory policy $policy  (${SLURM_GPU_BINDING:-})"' | sort

section "3. srun --gpu-mps=50: the job's own MPS control daemon"
as_user srun -N1 -w n1 --gres=gpu:1 --gpu-mps=50 bash -c '
  echo "CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_PIPE_DIRECTORY"
  echo "active thread percentage $(echo get_default_active_thread_percentage | '"$DIR"'/lib/nvidia-cuda-mps-control)"'

section "4. srun --gpu-mig=3g.47gb,2x1g.12gb: MIG instances made for the job, removed after it"
as_user srun -N1 -w n1 --gres=gpu:1 --gpu-mig=3g.47gb,2x1g.12gb bash -c '
  echo "CUDA_VISIBLE_DEVICES $CUDA_VISIBLE_DEVICES"'

section "5. a fault drill: Xid 48 (double-bit ECC) on n2's GPU 0, then the repair"
"$SG" sandbox fault --list
"$SG" sandbox fault --dir "$DIR" n2 xid-48
wait_state n2 'drained|draining' 20
sinfo -h -n n2 -o 'reason: %E'
"$SG" sandbox fault --dir "$DIR" n2 --clear
wait_state n2 idle 20

section "sandbox down"
"$SG" sandbox down --dir "$DIR"
rm -rf "$DIR"
echo "slurm-gpu: demo: tour took $(( ($(date +%s%N) - start) / 1000000 )) ms"
