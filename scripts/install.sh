#!/bin/bash
# Install everything slurm-gpu needs on a Debian 12 machine, as root:
# the Debian packages (Slurm 22.05, munge, hwloc, cffi build deps) and the
# project itself (the runtime and its devkit) into a venv made from Debian's /usr/bin/python3 that every
# user can read (Slurm runs our code as root with no PATH, and the SPANK
# plugin runs inside job users' processes).
#   scripts/install.sh            -> packages + venv + project
#   SLURM_GPU_SKIP_APT=1 ...      -> venv + project only
#   SLURM_GPU_SKIP_VENV=1 ...     -> packages only
# Nothing system-wide is left behind but the packages: the policy-rc.d that
# keeps apt from starting the system's slurmctld/slurmd/munge/mariadb/slurmdbd
# exists only while our own apt-get runs (a policy-rc.d left in place would
# block every later service start on the machine), and the services of the
# packages this script installed are disabled again (their postinst enables
# them: mariadb and munge would start at the next boot).  The sandbox runs
# its own daemons; an admin who wants the system's runs `systemctl enable`.
set -euo pipefail
umask 022
HERE=$(cd "$(dirname "$0")/.." && pwd)
VENV=${SLURM_GPU_VENV:-/opt/slurm-gpu/venv}
POLICY_RC=${SLURM_GPU_POLICY_RC:-/usr/sbin/policy-rc.d}   # overridable for the tests only
APT_LOCK=${SLURM_GPU_APT_LOCK:-/run/lock/slurm-gpu-install.lock}   # likewise
PKGS=(slurm-wlm slurmctld slurmd slurm-client munge libslurm-dev slurmdbd mariadb-server mariadb-client
      hwloc libhwloc15 libhwloc-dev pci.ids
      python3 python3-venv python3-dev gcc libc6-dev
      iproute2 procps util-linux passwd make ca-certificates debootstrap strace
      qemu-system-x86 e2fsprogs
      rpm)
# The services those packages enable at boot (package:service): disabled again
# when this script installed the package.
SERVICES=(mariadb-server:mariadb munge:munge slurmctld:slurmctld slurmd:slurmd slurmdbd:slurmdbd)

if [ "$(id -u)" != 0 ]; then
  echo "slurm-gpu: install needs root (scripts/install.sh)" >&2; exit 1
fi
# A venv of another Python is replaced below; anything else at that path (a
# mistyped SLURM_GPU_VENV=/opt) is an admin's, and is never removed.
if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ] && [ -n "$(ls -A "$VENV" 2>/dev/null || echo x)" ]; then
  echo "slurm-gpu: $VENV exists and is not a venv; not replacing it (SLURM_GPU_VENV)" >&2; exit 1
fi
# apt-get, waiting up to 10 min for another apt/dpkg to let go of its locks (a
# fresh VM's apt-daily runs at boot; apt-get update never waits by itself).
apt_wait() {
  local verb=$1 err rc=0 try
  shift
  err=$(mktemp)
  for try in $(seq 60); do
    rc=0
    apt-get "$verb" -o DPkg::Lock::Timeout=600 "$@" 2>"$err" || rc=$?
    if [ $rc = 0 ] || ! grep -q 'Could not get lock' "$err"; then break; fi
    sleep 10
  done
  cat "$err" >&2; rm -f "$err"
  return $rc
}
missing_packages() {
  missing=()
  for p in "${PKGS[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
}
if [ -z "${SLURM_GPU_SKIP_APT:-}" ]; then
  missing_packages
  if [ ${#missing[@]} -gt 0 ]; then
    # Two installs at once (several test runs): one installs, the other waits
    # and then finds nothing missing; neither removes the policy-rc.d while
    # the other's apt-get runs.
    mkdir -p "$(dirname "$APT_LOCK")"
    exec 8>"$APT_LOCK"
    flock 8
    missing_packages
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    # Never let the packages start the system's slurmctld/slurmd/munge (the
    # sandbox runs its own), but only during our apt-get: an admin's own
    # policy-rc.d is used and kept; ours is removed on every way out.
    own_policy= tmp_policy=
    drop_policy() {
      if [ -n "$tmp_policy" ]; then rm -f "$tmp_policy"; fi
      if [ -n "$own_policy" ]; then rm -f "$POLICY_RC"; own_policy=; fi
    }
    trap drop_policy EXIT
    trap 'drop_policy; exit 130' INT
    trap 'drop_policy; exit 143' TERM
    if [ ! -e "$POLICY_RC" ] && [ ! -L "$POLICY_RC" ]; then
      tmp_policy="$POLICY_RC.slurm-gpu.$$"
      printf '#!/bin/sh\n# slurm-gpu install.sh: no service starts during its apt-get (removed after)\nexit 101\n' >"$tmp_policy"
      chmod 755 "$tmp_policy"
      own_policy=1
      mv "$tmp_policy" "$POLICY_RC"
      tmp_policy=
    fi
    apt_wait update -qq
    apt_wait install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    drop_policy
    trap - EXIT INT TERM
    for entry in "${SERVICES[@]}"; do
      pkg=${entry%%:*} svc=${entry#*:}
      case " ${missing[*]} " in *" $pkg "*) ;; *) continue ;; esac
      # update-rc.d turns the SysV links off and (through systemctl --root) the
      # unit's wants link; a later upgrade keeps it so (the postinst only
      # re-enables what was enabled).  systemctl where no init script exists.
      if [ -e "/etc/init.d/$svc" ]; then
        update-rc.d "$svc" disable >/dev/null 2>&1 && continue
      elif command -v systemctl >/dev/null; then
        systemctl --quiet disable "$svc.service" >/dev/null 2>&1 && continue
      else
        continue
      fi
      echo "slurm-gpu: warning: could not disable $svc at boot (systemctl disable $svc)" >&2
    done
  fi
  exec 8>&-
fi
# NVIDIA's MPS control daemon for the tests, benchmarks and sandbox (it runs
# without a GPU): unpacked into /var/cache/slurm-gpu/mps, apt sources untouched.
if ! bash "$HERE/scripts/fetch-mps.sh" >/dev/null; then
  echo "slurm-gpu: warning: no nvidia-cuda-mps-control; the sandbox uses the stand-in" >&2
fi
if [ -n "${SLURM_GPU_SKIP_VENV:-}" ]; then
  echo "slurm-gpu: Debian packages installed (venv skipped)"
  exit 0
fi
# Serialize concurrent installs (several test runs may share one venv).
mkdir -p "$(dirname "$VENV")"
exec 9>"$(dirname "$VENV")/.install.lock"
flock 9
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys; sys.exit(sys.base_prefix != "/usr")'; then
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  /usr/bin/python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
# The runtime and the devkit (simulator, sandbox, recorded machines: devkit/),
# in one resolve so the devkit's "slurm-gpu" requirement is this checkout's.
# pip builds in the tree, and setuptools' build/lib keeps files that the
# checkout no longer has (the simulator before the devkit split would ship
# again): build from a clean build/ every time.
rm -rf "$HERE/build" "$HERE/devkit/build"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "$HERE[test]" "$HERE/devkit"
# The runner's pre-exec helper (cgroups, CPUs, identity), built on the node
# like the SPANK plugin; -I: the installed copy, not a checkout in the cwd.
"$VENV/bin/python" -I -m slurm_gpu.exechelper >/dev/null
# The venv readable by all, and its parent passable: nothing else beside it
# (SLURM_GPU_VENV=/opt/venv must not open all of /opt).
chmod -R a+rX "$VENV"
chmod a+x "$(dirname "$VENV")"
echo "slurm-gpu: installed into $VENV"
