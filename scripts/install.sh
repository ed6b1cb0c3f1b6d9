#!/bin/bash
# Install everything slurm-gpu needs on a Debian 12 machine, as root:
# the Debian packages (Slurm 22.05, munge, hwloc, cffi build deps) and the
# project itself into a venv made from Debian's /usr/bin/python3 that every
# user can read (Slurm runs our code as root with no PATH, and the SPANK
# plugin runs inside job users' processes).
#   scripts/install.sh            -> packages + venv + project
#   SLURM_GPU_SKIP_APT=1 ...      -> venv + project only
set -euo pipefail
umask 022
HERE=$(cd "$(dirname "$0")/.." && pwd)
VENV=${SLURM_GPU_VENV:-/opt/slurm-gpu/venv}
PKGS=(slurm-wlm slurmctld slurmd slurm-client munge libslurm-dev
      hwloc libhwloc15 libhwloc-dev pci.ids
      python3 python3-venv python3-dev gcc libc6-dev
      iproute2 procps util-linux passwd make ca-certificates debootstrap strace)

if [ "$(id -u)" != 0 ]; then
  echo "slurm-gpu: install needs root (scripts/install.sh)" >&2; exit 1
fi
if [ -z "${SLURM_GPU_SKIP_APT:-}" ]; then
  missing=()
  for p in "${PKGS[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    # policy-rc.d: never let the packages start the system's slurmctld/slurmd/munge
    if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; fi
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
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
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "$HERE[test]"
chmod -R a+rX "$(dirname "$VENV")"
echo "slurm-gpu: installed into $VENV"
