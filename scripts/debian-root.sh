#!/bin/bash
# Build, once, a minimal Debian root of SUITE holding a newer Slurm than the
# host's 22.05 (Debian 12), for the integration tests that need one:
#   trixie (Debian 13): Slurm 24.11, topology/block in topology.conf;
#   sid (unstable):     Slurm 26.05, topology.yaml (Slurm >= 25.05).
# The daemons are run from it chrooted (see tests/integration/debianroot.py).
# Cached under /var/cache/slurm-gpu/SUITE-root; a second run only prints the
# path.  Needs root, debootstrap and a Debian mirror (DEBIAN_MIRROR, default
# deb.debian.org); prints the root's path on stdout on success, and one
# `slurm-gpu: ...` line on stderr otherwise (exit 1; 2 for bad usage).
#
#   scripts/debian-root.sh sid            # build if missing, print the path
#   scripts/debian-root.sh sid --rebuild  # throw the cache away first
set -euo pipefail

SUITE=${1:-}
case "$SUITE" in
    ""|-*) echo "slurm-gpu: usage: debian-root.sh SUITE [--rebuild] (SUITE: trixie, sid, forky, ...)" >&2; exit 2 ;;
esac
case "$SUITE" in
    *[!a-z0-9-]*) echo "slurm-gpu: debian-root.sh: bad suite name '$SUITE'" >&2; exit 2 ;;
esac
REBUILD=${2:-}
if [ -n "$REBUILD" ] && [ "$REBUILD" != --rebuild ]; then
    echo "slurm-gpu: debian-root.sh: unknown option '$REBUILD'" >&2; exit 2
fi

CACHE=${SLURM_GPU_CACHE:-/var/cache/slurm-gpu}
ROOT=$CACHE/$SUITE-root
if [ "$SUITE" = trixie ] && [ -n "${SLURM_GPU_TRIXIE_ROOT:-}" ]; then
    ROOT=$SLURM_GPU_TRIXIE_ROOT   # the older, trixie-only override
fi
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# What the whole product needs inside the root, not only the daemons: the
# venv (python3-venv, ca-certificates for pip), the SPANK plugin build
# (python3-dev, gcc, libc6-dev, libslurm-dev for slurm/spank.h), the hwloc
# bindings (libhwloc15, pci.ids) and what prolog/epilog/health run
# (procps, iproute2, util-linux), and slurmdbd for `sandbox up --accounting`
# (slurmctld only talks to a slurmdbd of its own release or newer).
PACKAGES=slurmd,slurmctld,slurmdbd,slurm-client,munge,libslurm-dev,python3,python3-venv,python3-dev,gcc,libc6-dev,libhwloc15,pci.ids,procps,iproute2,util-linux,ca-certificates
LOG=$CACHE/$SUITE-root.log

if [ "$(id -u)" != 0 ]; then
    echo "slurm-gpu: debian-root.sh needs root (debootstrap, chroot)" >&2
    exit 2
fi
command -v debootstrap >/dev/null || { echo "slurm-gpu: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }

mkdir -p "$CACHE"
exec 9>"$CACHE/$SUITE-root.lock"
flock 9   # several test runs may ask at once; one builds, the others wait

if [ "$REBUILD" = --rebuild ]; then
    rm -rf --one-file-system "$ROOT"
fi
# A complete root built from an older PACKAGES (a cache of CI's or of a
# developer's machine) lacks what was added since: install just those into
# it, as debootstrap would have (no recommends), rather than rebuilding.
# The list it was completed with is recorded in .slurm-gpu-packages.
complete_root() {
    local missing=() p
    for p in ${PACKAGES//,/ }; do
        if ! chroot "$ROOT" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$p")
        fi
    done
    if [ ${#missing[@]} -gt 0 ]; then
        # No service may start inside the root while packages install.  sid's
        # Release file expires within days and a mirror or snapshot may be
        # older than that: debootstrap, which built the root, does not check
        # Valid-Until either.
        printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
        chmod 755 "$ROOT/usr/sbin/policy-rc.d"
        local ok=0
        if chroot "$ROOT" /usr/bin/env DEBIAN_FRONTEND=noninteractive PATH=/usr/sbin:/usr/bin:/sbin:/bin \
                apt-get -o Acquire::Check-Valid-Until=false update >"$LOG" 2>&1 &&
           chroot "$ROOT" /usr/bin/env DEBIAN_FRONTEND=noninteractive PATH=/usr/sbin:/usr/bin:/sbin:/bin \
                apt-get install -y --no-install-recommends "${missing[@]}" >>"$LOG" 2>&1; then
            ok=1
        fi
        rm -f "$ROOT/usr/sbin/policy-rc.d"
        if [ $ok = 0 ]; then
            echo "slurm-gpu: cannot add ${missing[*]} to the $SUITE root: $(grep -E '^E: ' "$LOG" | tail -1 || true) (see $LOG; or debian-root.sh $SUITE --rebuild)" >&2
            exit 1
        fi
    fi
    echo "$PACKAGES" >"$ROOT/.slurm-gpu-packages"
}
if [ -f "$ROOT/.slurm-gpu-complete" ] && [ -x "$ROOT/usr/sbin/slurmctld" ]; then
    if [ "$(cat "$ROOT/.slurm-gpu-packages" 2>/dev/null)" != "$PACKAGES" ]; then
        complete_root
    fi
    echo "$ROOT"
    exit 0
fi

# Ask the mirror first: without network debootstrap would spend minutes in
# retries before failing with a page of log.
release="$MIRROR/dists/$SUITE/InRelease"
if [[ $release == file://* ]]; then
    # A local mirror: wget (all a minimal Debian has when curl is missing)
    # cannot read file:// URLs.
    probe=(test -r "${release#file://}")
elif command -v curl >/dev/null; then
    probe=(curl -fsS -o /dev/null --connect-timeout 10 --max-time 20 "$release")
else
    probe=(wget -q -O /dev/null --timeout=10 --tries=1 "$release")
fi
if ! err=$("${probe[@]}" 2>&1); then
    echo "slurm-gpu: Debian mirror unreachable, cannot build the $SUITE root ($release: ${err:-no answer})" >&2
    exit 1
fi

tmp="$ROOT.partial"
# A half-built root never becomes $ROOT: build aside, mark complete, rename.
# A second try: a mirror caught mid-sync (sid, often) or one flaky download
# fails the first.
for try in 1 2; do
    rm -rf --one-file-system "$tmp"
    if debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$tmp" "$MIRROR" >"$LOG" 2>&1; then
        break
    fi
    if [ "$try" = 2 ]; then
        echo "slurm-gpu: debootstrap $SUITE failed twice: $(grep -E '^E: ' "$LOG" | tail -1 || true) (see $LOG)" >&2
        rm -rf --one-file-system "$tmp"
        exit 1
    fi
    sleep 5
done
chroot "$tmp" /usr/sbin/slurmctld -V >"$tmp/.slurm-version"
for plugin in topology_tree.so topology_block.so; do
    if ! compgen -G "$tmp/usr/lib/*/slurm-wlm/$plugin" >/dev/null; then
        echo "slurm-gpu: the $SUITE root has no $plugin ($(cat "$tmp/.slurm-version"))" >&2
        rm -rf --one-file-system "$tmp"
        exit 1
    fi
done
echo "$PACKAGES" >"$tmp/.slurm-gpu-packages"
touch "$tmp/.slurm-gpu-complete"
rm -rf --one-file-system "$ROOT"
mv "$tmp" "$ROOT"
echo "$ROOT"
