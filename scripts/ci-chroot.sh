#!/bin/bash
# Rehearse CI: run .ci/run on a fresh clone of HEAD inside a fresh Debian 12
# root (debootstrap minbase, nothing preinstalled), in a private mount
# namespace, so the host's packages, venv and /tmp cannot help.  Needs root,
# debootstrap and a Debian mirror + PyPI.  The root is thrown away afterwards
# unless KEEP=1.
#   scripts/ci-chroot.sh                 # -> rc of `make test` in the fresh root
#   KEEP=1 WORK=/var/tmp/ci scripts/ci-chroot.sh
# A host whose HTTPS goes through an intercepting proxy passes its CA bundle
# on: PIP_CERT (or SSL_CERT_FILE) is copied into the root and used by pip, and
# /usr/local/share/ca-certificates/*.crt into the root's own trust store.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/var/tmp/slurm-gpu-ci}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ "$(id -u)" != 0 ]; then echo "slurm-gpu: ci-chroot.sh needs root" >&2; exit 1; fi
command -v debootstrap >/dev/null || { echo "slurm-gpu: apt-get install debootstrap" >&2; exit 1; }

R="$WORK/root"
mkdir -p "$WORK"
rm -rf --one-file-system "$R"
echo "slurm-gpu: debootstrap bookworm into $R (log $WORK/debootstrap.log)" >&2
debootstrap --variant=minbase bookworm "$R" "$MIRROR" >"$WORK/debootstrap.log" 2>&1
git clone -q "$HERE" "$R/src"
cp /etc/resolv.conf "$R/etc/resolv.conf"
extra=()
ca=${PIP_CERT:-${SSL_CERT_FILE:-}}
if [ -n "$ca" ] && [ -f "$ca" ]; then cp "$ca" "$R/ci-ca.crt"; extra+=(PIP_CERT=/ci-ca.crt); fi
# The host's own extra CAs go where a real machine keeps them, so the root's
# trust store holds them once install.sh installs ca-certificates: the pip
# runs inside the Debian roots (Slurm 24.11/26.05) trust that store, not PIP_CERT.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "$R/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$R/usr/local/share/ca-certificates/"
fi

set +e
# / must be a mount point inside (as on a real machine): bind the root onto itself.
unshare -m --propagation private bash -c '
  R=$1; shift
  mount --bind "$R" "$R" && mount -t proc proc "$R/proc" && mount --rbind /sys "$R/sys" &&
  mount --rbind /dev "$R/dev" && mount -t tmpfs tmpfs "$R/run" && mount -t tmpfs tmpfs "$R/tmp" &&
  chmod 1777 "$R/tmp" &&
  exec chroot "$R" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 "$@" bash -c "cd /src && .ci/run"' _ "$R" "${extra[@]}" 2>&1 | tee "$WORK/ci.log"
rc=${PIPESTATUS[0]}
set -e
[ "${KEEP:-}" = 1 ] || rm -rf --one-file-system "$R"
echo "slurm-gpu: .ci/run in a fresh Debian 12 root: rc $rc (log $WORK/ci.log)" >&2
exit "$rc"
