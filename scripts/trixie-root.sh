#!/bin/bash
# Build, once, a Debian 13 ("trixie") root holding Slurm 24.11 for the
# topology/block integration tests (Debian 12's Slurm 22.05 has no
# topology/block).  Cached under /var/cache/slurm-gpu; a second run only
# prints the path.  Needs root, debootstrap and a Debian mirror
# (DEBIAN_MIRROR, default deb.debian.org); prints the root's path on success.
#
#   scripts/trixie-root.sh            # build if missing, print the path
#   scripts/trixie-root.sh --rebuild  # throw the cache away first
set -euo pipefail

CACHE=${SLURM_GPU_CACHE:-/var/cache/slurm-gpu}
ROOT=${SLURM_GPU_TRIXIE_ROOT:-$CACHE/trixie-root}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=slurmd,slurmctld,slurm-client,munge,python3

if [ "$(id -u)" != 0 ]; then
    echo "slurm-gpu: trixie-root.sh needs root (debootstrap, chroot)" >&2
    exit 2
fi
command -v debootstrap >/dev/null || { echo "slurm-gpu: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }

mkdir -p "$CACHE"
exec 9>"$CACHE/trixie-root.lock"
flock 9   # several test runs may ask at once; one builds, the others wait

if [ "${1:-}" = "--rebuild" ]; then
    rm -rf --one-file-system "$ROOT"
fi
if [ -f "$ROOT/.slurm-gpu-complete" ] && [ -x "$ROOT/usr/sbin/slurmctld" ]; then
    echo "$ROOT"
    exit 0
fi

tmp="$ROOT.partial"
rm -rf --one-file-system "$tmp"
# A half-built root never becomes $ROOT: build aside, mark complete, rename.
if ! debootstrap --variant=minbase --include="$PACKAGES" trixie "$tmp" "$MIRROR" >"$CACHE/trixie-root.log" 2>&1; then
    echo "slurm-gpu: debootstrap trixie failed (see $CACHE/trixie-root.log)" >&2
    rm -rf --one-file-system "$tmp"
    exit 1
fi
chroot "$tmp" /usr/sbin/slurmctld -V >"$tmp/.slurm-version"
test -e "$tmp/usr/lib/x86_64-linux-gnu/slurm-wlm/topology_block.so" || {
    echo "slurm-gpu: the trixie root has no topology_block.so" >&2; exit 1; }
touch "$tmp/.slurm-gpu-complete"
rm -rf --one-file-system "$ROOT"
mv "$tmp" "$ROOT"
echo "$ROOT"
