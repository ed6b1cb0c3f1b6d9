#!/bin/bash
# Fetch NVIDIA's real MPS control daemon (Debian non-free, package
# nvidia-cuda-mps) into a cache the tests and benchmarks own, without
# touching the system's apt sources, lists or cache: apt-get runs on a
# private sources list, private lists and a private archive cache, and the
# package is unpacked with dpkg-deb -x (never installed).
#   scripts/fetch-mps.sh          -> prints the path of nvidia-cuda-mps-control
# Environment:
#   SLURM_GPU_MPS_CACHE   where it goes (default /var/cache/slurm-gpu/mps)
#   SLURM_GPU_MPS_MIRROR  Debian mirror (default http://deb.debian.org/debian)
#   SLURM_GPU_MPS_SUITE   suite (default bookworm: 535.x runs on glibc >= 2.17)
# The binary needs only libc; it runs without a GPU (answers, logs) and its
# start_server fails there, which is what the tests rely on.  Exit 1 with
# one line when the mirror cannot be reached.
set -euo pipefail
umask 022
CACHE=${SLURM_GPU_MPS_CACHE:-/var/cache/slurm-gpu/mps}
MIRROR=${SLURM_GPU_MPS_MIRROR:-http://deb.debian.org/debian}
SUITE=${SLURM_GPU_MPS_SUITE:-bookworm}
BIN="$CACHE/root/usr/bin/nvidia-cuda-mps-control"

if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi

work=$(mktemp -d "$CACHE/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/deb"
echo "deb $MIRROR $SUITE non-free" >"$work/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
          -o Debug::NoLocking=1 -o APT::Sandbox::User=root -o Acquire::Retries=2
          -o Acquire::http::Timeout=20)
# apt-get update exits 0 when a fetch fails: its warning says so.
if ! apt-get "${apt_opts[@]}" update -qq >"$work/apt.log" 2>&1 || grep -q '^[WE]: Failed to fetch' "$work/apt.log"; then
  echo "slurm-gpu: cannot fetch nvidia-cuda-mps ($MIRROR $SUITE non-free: $(grep -m1 -o 'Failed to fetch.*' "$work/apt.log" || tail -1 "$work/apt.log"))" >&2
  exit 1
fi
# apt-get download checks the .deb against the signed Release's hashes.
if ! (cd "$work/deb" && apt-get "${apt_opts[@]}" download -qq nvidia-cuda-mps >"$work/apt.log" 2>&1); then
  echo "slurm-gpu: cannot download nvidia-cuda-mps ($MIRROR $SUITE: $(tail -1 "$work/apt.log"))" >&2
  exit 1
fi
dpkg-deb -x "$work"/deb/nvidia-cuda-mps_*.deb "$work/root"
cp "$work"/deb/nvidia-cuda-mps_*.deb "$work/root/"
chmod -R a+rX "$work/root"
rm -rf "$CACHE/root"
mv "$work/root" "$CACHE/root"
chmod a+rX "$CACHE"
echo "$BIN"
