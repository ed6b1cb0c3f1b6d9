#!/bin/bash
# Build, once per set of inputs, the disk image of a systemd + cgroup v2
# Debian node for `slurm-gpu sandbox up --vm` (docs/sandbox.md, "The VM"):
#   bookworm: Slurm 22.05;  trixie: Slurm 24.11;  sid: Slurm 26.05.
# Everything comes from Debian packages: a debootstrap root (a copy of an
# existing cached root of the same suite when there is one: the bare
# bookworm-pkgroot of scripts/test-deb.sh, the trixie/sid roots of
# scripts/debian-root.sh), Debian's kernel and initramfs, systemd as PID 1,
# munge/slurmctld/slurmd as Debian's units, and slurm-gpu from the project's
# own .deb installed with docs/install.md's own install line.  The image is
# written with `mke2fs -d` (no loop mount).
# Cached as $CACHE/vm-SUITE/{root.img,vmlinuz,initrd.img,inputs}; rebuilt only
# when an input changes (this script, the guest files, the .deb, the MPS
# binary).  Prints the cache directory on stdout; one `slurm-gpu:` line on
# stderr and exit 1 on failure (2: bad usage).
#   scripts/vm-image.sh SUITE DEB [MPS_CONTROL|""] [DEVKIT_WHEEL]
set -euo pipefail
umask 022
HERE=$(cd "$(dirname "$0")/.." && pwd)
SUITE=${1:-}; DEB=${2:-}; MPS=${3:-}; DEVKIT=${4:-}
case "$SUITE" in
    bookworm|trixie|sid) ;;
    *) echo "slurm-gpu: usage: vm-image.sh bookworm|trixie|sid DEB [MPS_CONTROL]" >&2; exit 2 ;;
esac
[ -f "$DEB" ] || { echo "slurm-gpu: vm-image.sh: no package at '$DEB'" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "slurm-gpu: vm-image.sh needs root (debootstrap, chroot)" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "slurm-gpu: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
command -v mke2fs >/dev/null || { echo "slurm-gpu: mke2fs is not installed (apt-get install e2fsprogs)" >&2; exit 1; }
CACHE=${SLURM_GPU_CACHE:-/var/cache/slurm-gpu}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
OUT=$CACHE/vm-$SUITE
GUEST=$HERE/scripts/vm
LOG=$CACHE/vm-$SUITE.log
SIZE=${SLURM_GPU_VM_IMAGE_SIZE:-2560M}
# The node: systemd as PID 1 and Debian's kernel; Slurm's daemons and clients;
# what slurm-gpu's .deb depends on, and the plugin build tools the guide's
# install line names (installed first without recommends, so that line only
# adds the package); what the hooks and tests run; bpftool, so doctor reads a
# job cgroup's BPF device program (docs/slurm-versions.md, cgroup.devices).
PACKAGES="systemd-sysv udev dbus kmod linux-image-amd64 initramfs-tools zstd
 munge slurmd slurmctld slurm-client
 python3 python3-venv python3-click python3-jinja2 python3-cffi python3-yaml python3-clustershell libhwloc15 pci.ids
 gcc python3-dev python3-setuptools libslurm-dev
 procps iproute2 util-linux e2fsprogs bpftool"

mkdir -p "$CACHE"
exec 9>"$CACHE/vm-$SUITE.lock"
flock 9

# Two layers, each rebuilt only when its inputs change:
#   $CACHE/vm-SUITE-base/: the Debian root with every package but ours, the
#     kernel and initramfs (keyed by the suite and the package list: minutes,
#     once);
#   $CACHE/vm-SUITE/: that root plus slurm-gpu's .deb and the guest's files,
#     written as the image (keyed by everything: seconds, at each change).
BASE=$CACHE/vm-$SUITE-base
BASE_VERSION=1      # bump when the base's recipe below changes
base_key=$(echo "$BASE_VERSION $SUITE $PACKAGES" | sha256sum | cut -d' ' -f1)
key=$( {
    echo "$base_key $SIZE"
    sha256sum "$0" "$DEB" | cut -d' ' -f1
    (cd "$GUEST" && find . -type f | sort | xargs sha256sum)
    [ -z "$MPS" ] || sha256sum "$MPS" | cut -d' ' -f1
    [ -z "$DEVKIT" ] || sha256sum "$DEVKIT" | cut -d' ' -f1
} | sha256sum | cut -d' ' -f1)
if [ -f "$OUT/inputs" ] && [ "$(cat "$OUT/inputs")" = "$key" ] && [ -f "$OUT/root.img" ]; then
    echo "$OUT"; exit 0
fi
fail() { echo "slurm-gpu: building the $SUITE VM image: $1 (see $LOG)" >&2; exit 1; }
t0=$(date +%s)
: >"$LOG"
in_root() { chroot "$root" /usr/bin/env DEBIAN_FRONTEND=noninteractive PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
# No service may start while packages install; /proc for the maintainer scripts.
enter_build() {
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"; chmod 755 "$root/usr/sbin/policy-rc.d"
    mount -t proc proc "$root/proc"
    trap 'umount "$root/proc" 2>/dev/null || true' EXIT
}
leave_build() {
    rm -f "$root/usr/sbin/policy-rc.d"
    umount "$root/proc"; trap - EXIT
}

if ! { [ -f "$BASE/inputs" ] && [ "$(cat "$BASE/inputs")" = "$base_key" ]; }; then
    case "$SUITE" in
        bookworm) from=$CACHE/bookworm-pkgroot ;;
        *) from=$CACHE/$SUITE-root ;;
    esac
    rm -rf --one-file-system "$BASE.partial"
    mkdir -p "$BASE.partial"
    root=$BASE.partial/root
    if [ -f "$from/.slurm-gpu-complete" ]; then
        cp -a "$from" "$root"
        rm -f "$root/.slurm-gpu-complete" "$root/.slurm-gpu-packages" "$root/.slurm-version"
    elif ! debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" >>"$LOG" 2>&1; then
        fail "debootstrap $SUITE: $(grep -E '^[EW]: ' "$LOG" | tail -1 || true)"
    fi
    echo "base root $(( $(date +%s) - t0 ))s" >>"$LOG"
    enter_build
    # The initramfs needs only the virtio disk: build it small and fast.
    mkdir -p "$root/etc/initramfs-tools/conf.d"
    printf 'MODULES=list\nCOMPRESS=zstd\n' >"$root/etc/initramfs-tools/conf.d/slurm-gpu-vm"
    printf 'virtio_pci\nvirtio_blk\next4\n' >"$root/etc/initramfs-tools/modules"
    in_root apt-get -o Acquire::Check-Valid-Until=false update >>"$LOG" 2>&1 || fail "apt-get update: $(grep -E '^E: ' "$LOG" | tail -1)"
    # shellcheck disable=SC2086
    in_root apt-get install -y --no-install-recommends $PACKAGES >>"$LOG" 2>&1 || fail "apt-get install: $(grep -E '^E: ' "$LOG" | tail -1)"
    in_root apt-get clean
    leave_build
    cp "$root"/boot/vmlinuz-* "$BASE.partial/vmlinuz" || fail "no kernel in the root (linux-image-amd64)"
    cp "$root"/boot/initrd.img-* "$BASE.partial/initrd.img" || fail "no initramfs in the root"
    rm -rf "$root/boot"/*
    echo "$base_key" >"$BASE.partial/inputs"
    rm -rf --one-file-system "$BASE"
    mv "$BASE.partial" "$BASE"
    echo "base packages $(( $(date +%s) - t0 ))s" >>"$LOG"
fi

work=$CACHE/vm-$SUITE.partial
rm -rf --one-file-system "$work"
mkdir -p "$work"
root=$work/root
cp -a "$BASE/root" "$root"
cp "$BASE/vmlinuz" "$BASE/initrd.img" "$work/"
echo "copy $(( $(date +%s) - t0 ))s" >>"$LOG"
enter_build

# slurm-gpu as the guide installs it (docs/install.md, its install-deb block).
cp "$DEB" "$root/tmp/"
debname=$(basename "$DEB")
guide=$(awk -v m="<!-- lifecycle: install-deb -->" '$0 == m { f = 1; next } f && /^```/ { if (b) exit; b = 1; next } f && b { print }' "$HERE/docs/install.md" |
        sed 's/#.*//' | grep '^apt-get install')
[ -n "$guide" ] || fail "no install-deb block in docs/install.md"
guide=$(echo "$guide" | sed "s#\./dist/slurm-gpu_[^ ]*_all\.deb#/tmp/$debname#")
in_root sh -c "$guide -y" >>"$LOG" 2>&1 || fail "the guide's install line ($guide): $(grep -E '^(E: |slurm-gpu:)' "$LOG" | tail -1)"
rm -f "$root/tmp/$debname"
echo "slurm-gpu $(( $(date +%s) - t0 ))s" >>"$LOG"
# The test rig, not the guide: the devkit (the NVML simulator behind the
# guest's fake GPUs, `sandbox fault` in the guest), into the package's venv.
if [ -n "$DEVKIT" ]; then
    cp "$DEVKIT" "$root/tmp/"
    in_root /opt/slurm-gpu/venv/bin/python -m pip install -q --no-index --no-deps --disable-pip-version-check \
        "/tmp/$(basename "$DEVKIT")" >>"$LOG" 2>&1 || fail "installing the devkit wheel in the guest's venv"
    rm -f "$root/tmp/$(basename "$DEVKIT")"
fi

# The guest's own pieces: the command agent, the per-boot setup from the
# sandbox's config disk, and the test users.
install -D -m 755 "$GUEST/sg-vm-agent" "$root/usr/local/sbin/sg-vm-agent"
install -D -m 755 "$GUEST/sg-vm-setup" "$root/usr/local/sbin/sg-vm-setup"
install -m 644 "$GUEST"/sg-vm-*.service "$root/etc/systemd/system/"
for u in sgtest1 sgtest2; do in_root useradd -m -s /bin/sh "$u" 2>/dev/null || true; done
if [ -n "$MPS" ]; then install -D -m 755 "$MPS" "$root/usr/bin/nvidia-cuda-mps-control"; fi
install -D -m 644 "$GUEST/10-sandbox.network" "$root/etc/systemd/network/10-sandbox.network"
install -m 644 "$GUEST/slurmd@.service" "$root/etc/systemd/system/"
in_root systemctl enable sg-vm-setup.service sg-vm-agent.service systemd-networkd.service >>"$LOG" 2>&1
# Nothing here waits for a network that is not there; no getty on the
# console (the agent is the way in); no timers doing work during tests.
in_root systemctl mask systemd-networkd-wait-online.service apt-daily.timer apt-daily-upgrade.timer \
    e2scrub_all.timer fstrim.timer man-db.timer dpkg-db-backup.timer serial-getty@ttyS0.service \
    getty@tty1.service systemd-timesyncd.service >>"$LOG" 2>&1 || true
echo 'LABEL=sgroot / ext4 rw,noatime 0 1' >"$root/etc/fstab"
echo slurm-gpu-vm >"$root/etc/hostname"
rm -f "$root/etc/machine-id"
: >"$root/etc/machine-id"      # systemd makes one at first boot
leave_build
chroot "$root" /usr/sbin/slurmctld -V >"$work/slurm-version"
rm -rf "$root/var/cache/apt/archives"/*.deb "$root/var/lib/apt/lists"/*_*
mke2fs -q -t ext4 -L sgroot -d "$root" "$work/root.img" "$SIZE" >>"$LOG" 2>&1 || fail "mke2fs -d"
rm -rf --one-file-system "$root"
echo "$key" >"$work/inputs"
echo "image $(( $(date +%s) - t0 ))s" >>"$LOG"
rm -rf --one-file-system "$OUT"
mv "$work" "$OUT"
echo "$OUT"
