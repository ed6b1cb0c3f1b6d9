#!/bin/bash
# Install the .deb in fresh Debian roots, run it, purge it, and prove that the
# purge leaves no file behind.  For each SUITE (default: bookworm trixie):
#   1. a bare debootstrap minbase root, built once and cached as
#      $CACHE/SUITE-pkgroot (never changed afterwards: every run works on a
#      throw-away overlay over it);
#   2. the package's dependencies are installed first (apt-get), then a list
#      of every file (type, mode, owner, size, path) is taken;
#   3. dpkg -i: postinst makes /opt/slurm-gpu/venv from the root's python3
#      and builds the SPANK plugin (trixie: with gcc, python3-dev, setuptools and
#      libslurm-dev installed, so it must build; bookworm: without, so
#      postinst must say so in one line and still succeed);
#   4. slurm-gpu --version (as root and as nobody), inventory over a shipped
#      machine's hwloc XML (loads the root's libhwloc through cffi), gres
#      render, and `slurm-gpu doctor` where this version has it;
#   5. dpkg --purge, then the file list again: it must equal step 2's.
# Needs root, debootstrap, overlayfs and a Debian mirror (DEBIAN_MIRROR).
# With --rpm FILE the EL package goes through the same steps in a Debian 12
# root instead (rpm --root: its %post makes the venv from python3.11, which
# Debian 12 also has, with every shipped wheel and nothing from the system;
# %postun removes it): the closest this project gets to EL, see docs/install.md.
# Exit 0: all passed; 1: a check failed; 77: cannot run here (no mirror,
# no debootstrap, no rpm), with one `slurm-gpu:` line saying why.
#   scripts/test-deb.sh [--deb FILE] [SUITE...]
#   scripts/test-deb.sh --rpm FILE [bookworm]
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${SLURM_GPU_CACHE:-/var/cache/slurm-gpu}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEB= RPM=
if [ "${1:-}" = --deb ]; then DEB=$2; shift 2; fi
if [ "${1:-}" = --rpm ]; then RPM=$2; shift 2; fi
SUITES=("$@")
[ ${#SUITES[@]} -gt 0 ] || SUITES=(bookworm trixie)

say() { echo "slurm-gpu: test-deb: $*" >&2; }
[ "$(id -u)" = 0 ] || { say "needs root (debootstrap, chroot, mount)"; exit 77; }
command -v debootstrap >/dev/null || { say "debootstrap is not installed (apt-get install debootstrap)"; exit 77; }
for s in "${SUITES[@]}"; do
    case "$s" in *[!a-z0-9-]*|"") say "bad suite name '$s'"; exit 2 ;; esac
done
if [ -n "$RPM" ]; then
    command -v rpm >/dev/null || { say "rpm is not installed (apt-get install rpm)"; exit 77; }
    [ -f "$RPM" ] || { say "no package at $RPM"; exit 1; }
    [ ${#SUITES[@]} = 1 ] && [ "${SUITES[0]}" = bookworm ] || SUITES=(bookworm)
else
    if [ -z "$DEB" ]; then DEB=$(bash "$HERE/scripts/build-deb.sh"); fi
    [ -f "$DEB" ] || { say "no package at $DEB"; exit 1; }
fi

# The bare root of SUITE, built once (flock: concurrent runs wait for one build).
bare_root() {
    local suite=$1 root=$CACHE/$1-pkgroot
    mkdir -p "$CACHE"
    (
        flock 9
        if [ -f "$root/.slurm-gpu-complete" ]; then exit 0; fi
        local probe=(wget -q -O /dev/null --timeout=10 --tries=1)
        if command -v curl >/dev/null; then probe=(curl -fsS -o /dev/null --connect-timeout 10 --max-time 20); fi
        local release="$MIRROR/dists/$suite/InRelease"
        # wget cannot read a local (file://) mirror.
        if [[ $release == file://* ]]; then probe=(test -r); release=${release#file://}; fi
        if ! "${probe[@]}" "$release" 2>/dev/null; then
            say "Debian mirror unreachable ($MIRROR/dists/$suite/InRelease)"; exit 77
        fi
        local log=$CACHE/$suite-pkgroot.log try
        for try in 1 2; do   # a second try: a mirror sync or a flaky download fails the first
            rm -rf --one-file-system "$root.partial"
            if debootstrap --variant=minbase "$suite" "$root.partial" "$MIRROR" >"$log" 2>&1; then break; fi
            cp "$root.partial/debootstrap/debootstrap.log" "$log.inner" 2>/dev/null || true
            rm -rf --one-file-system "$root.partial"
            if [ $try = 2 ]; then
                say "debootstrap $suite failed: $(grep -E '^[EW]: ' "$log" | tail -1) (see $log, $log.inner)"
                exit 1
            fi
        done
        touch "$root.partial/.slurm-gpu-complete"
        mv "$root.partial" "$root"
    ) 9>"$CACHE/$suite-pkgroot.lock"
}

# Every file of the root but the ones apt/dpkg bookkeeping and the kernel own.
# A directory's size is left out: the root is an overlay, and a directory
# copied up into a tmpfs upper layer (/tmp is one in CI) changes size alone.
file_list() {
    (cd "$1" && find . -xdev \( -path ./proc -o -path ./sys -o -path ./dev -o -path ./run \
        -o -path ./tmp -o -path ./var/cache/apt -o -path ./var/lib/apt -o -path ./var/log \
        -o -path ./var/lib/dpkg -o -path ./var/cache/debconf -o -path ./var/cache/ldconfig \
        -o -path ./var/lib/rpm -o -path ./root/.rpmdb -o -path ./usr/lib/sysimage/rpm \
        -o -path ./etc/ld.so.cache \) -prune -o \
        \( -type d -printf '%y %m %u:%g - %p\n' -o -printf '%y %m %u:%g %s %p\n' \) | LC_ALL=C sort)
}

MNT=()
WORK=
cleanup() {
    local i
    for ((i=${#MNT[@]}-1; i>=0; i--)); do umount -l "${MNT[$i]}" 2>/dev/null || true; done
    MNT=()
    if [ -n "$WORK" ]; then rm -rf --one-file-system "$WORK"; WORK=; fi
}
trap cleanup EXIT INT TERM

in_root() { chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive "$@"; }
fail() { say "$SUITE: $*"; exit 1; }

for SUITE in "${SUITES[@]}"; do
    t0=$(date +%s)
    bare_root "$SUITE"
    WORK=$(mktemp -d /tmp/slurm-gpu-pkgtest.XXXXXX)
    mkdir "$WORK"/{upper,work,root}
    R=$WORK/root
    mount -t overlay overlay -o "lowerdir=$CACHE/$SUITE-pkgroot,upperdir=$WORK/upper,workdir=$WORK/work" "$R"
    MNT+=("$R")
    mount -t proc proc "$R/proc"; MNT+=("$R/proc")
    mkdir -p "$CACHE/$SUITE-pkgroot-apt/partial"
    mount --bind "$CACHE/$SUITE-pkgroot-apt" "$R/var/cache/apt/archives"; MNT+=("$R/var/cache/apt/archives")
    cp /etc/resolv.conf "$R/etc/resolv.conf"
    # Never start a service inside the test root (no init there anyway).
    printf '#!/bin/sh\nexit 101\n' >"$R/usr/sbin/policy-rc.d"; chmod 755 "$R/usr/sbin/policy-rc.d"

    extra=()
    spank_expect=missing
    if [ -n "$RPM" ]; then
        # What the spec Requires, by its Debian names (python3.11's ensurepip for the venv).
        deps="python3.11 python3.11-venv libhwloc15"
    else
        deps=$(dpkg-deb -f "$DEB" Depends | sed -e 's/([^)]*)//g' -e 's/,/ /g')
        if [ "$SUITE" != bookworm ]; then extra=(gcc python3-dev python3-setuptools libslurm-dev); spank_expect=built; fi
    fi
    in_root apt-get update -qq >/dev/null || fail "apt-get update failed"
    # The archive cache is bind-mounted into every run's root and apt-get locks it
    # (archives/lock, no waiting): concurrent runs take turns for the install.
    # shellcheck disable=SC2086
    (flock 7 && in_root apt-get install -y -qq --no-install-recommends $deps "${extra[@]}") \
        7>"$CACHE/$SUITE-pkgroot-apt.lock" >"$WORK/apt.log" 2>&1 ||
        fail "installing the dependencies failed: $(tail -3 "$WORK/apt.log")"
    # EL's filesystem package owns /usr/share/licenses; a Debian root lacks it.
    if [ -n "$RPM" ]; then mkdir -p "$R/usr/share/licenses"; fi
    file_list "$R" >"$WORK/before"

    if [ -n "$RPM" ]; then
        # --nodeps: the root has the Requires under Debian's names, not EL's.
        env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root rpm --root "$R" --initdb
        env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
            rpm --root "$R" --nodeps -i "$RPM" >"$WORK/install.log" 2>&1 || fail "rpm -i failed: $(cat "$WORK/install.log")"
        python=/usr/bin/python3.11
    else
        cp "$DEB" "$R/tmp/slurm-gpu.deb"
        in_root dpkg -i /tmp/slurm-gpu.deb >"$WORK/install.log" 2>&1 || fail "dpkg -i failed: $(cat "$WORK/install.log")"
        rm -f "$R/tmp/slurm-gpu.deb"
        python=/usr/bin/python3
    fi
    sed 's/^/    /' "$WORK/install.log" >&2
    py=$(in_root "$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    vpy=$(in_root /opt/slurm-gpu/venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [ "$py" = "$vpy" ] || fail "venv runs Python $vpy, the root has $py"
    ver=$(in_root /opt/slurm-gpu/venv/bin/slurm-gpu --version) || fail "slurm-gpu --version failed"
    chroot --userspec=nobody:nogroup "$R" /opt/slurm-gpu/venv/bin/slurm-gpu --version >/dev/null ||
        fail "slurm-gpu --version fails for an ordinary user (venv not readable by all)"
    site=$(in_root /opt/slurm-gpu/venv/bin/python -c 'import slurm_gpu, os; print(os.path.dirname(slurm_gpu.__file__))')
    in_root /opt/slurm-gpu/venv/bin/slurm-gpu inventory --hwloc-xml "$site/data/machines/h100-mig/hwloc.xml" >/dev/null ||
        fail "inventory over a shipped machine failed (libhwloc through cffi)"
    in_root /opt/slurm-gpu/venv/bin/slurm-gpu gres render --snapshot "n1=$site/data/machines/h100-mig/snapshot.json" |
        grep -q '^NodeName=n1 Name=gpu' || fail "gres render over a shipped machine printed no gpu line"
    case $spank_expect in
        built) [ -f "$R/opt/slurm-gpu/venv/lib/slurm-gpu/slurm_gpu_spank.so" ] || fail "postinst built no SPANK plugin"
               grep -q '^slurm-gpu: SPANK plugin built' "$WORK/install.log" || fail "postinst did not report the plugin" ;;
        missing) [ "$(grep -c '^slurm-gpu: SPANK plugin not built' "$WORK/install.log")" = 1 ] ||
               fail "postinst did not say in one line that the SPANK plugin was not built" ;;
    esac
    doctor="not in this version"
    if in_root /opt/slurm-gpu/venv/bin/slurm-gpu doctor --help >/dev/null 2>&1; then
        rc=0; in_root /opt/slurm-gpu/venv/bin/slurm-gpu doctor >"$WORK/doctor.log" 2>&1 || rc=$?
        # A bare root is no configured node: findings are expected (Nagios 0-2), a broken check (3) or a traceback is not.
        if [ "$rc" -gt 2 ] || grep -q Traceback "$WORK/doctor.log"; then fail "doctor broke (exit $rc): $(cat "$WORK/doctor.log")"; fi
        doctor="exit $rc, $(grep -c . "$WORK/doctor.log") finding line(s)"
        sed 's/^/    doctor: /' "$WORK/doctor.log" >&2
    fi

    # An upgrade rebuilds the venv while slurmd may run a hook at any moment:
    # a loop calling the venv's slurm-gpu (as a prolog would) must never fail
    # through the reinstall (the package again: its upgrade scripts) and one
    # more venv-setup; afterwards the venv is a link to the newest tree, with
    # exactly one tree kept before it.
    [ -L "$R/opt/slurm-gpu/venv" ] || fail "/opt/slurm-gpu/venv is not a link to a versioned tree"
    stop=$WORK/stop-loop
    ( n=0 f=0
      while [ ! -e "$stop" ]; do
          if chroot "$R" /opt/slurm-gpu/venv/bin/slurm-gpu --version >/dev/null 2>&1; then n=$((n+1)); else f=$((f+1)); fi
      done
      echo "$n $f" >"$WORK/loop" ) &
    loop=$!
    if [ -n "$RPM" ]; then
        in_root env SLURM_GPU_PYTHON=/usr/bin/python3.11 SLURM_GPU_SYSTEM_SITE=0 \
            /usr/lib/slurm-gpu/venv-setup.sh /usr/share/slurm-gpu/wheels >"$WORK/upgrade.log" 2>&1 ||
            { touch "$stop"; wait $loop; fail "venv-setup (upgrade) failed: $(tail -3 "$WORK/upgrade.log")"; }
    else
        cp "$DEB" "$R/tmp/slurm-gpu.deb"
        in_root dpkg -i /tmp/slurm-gpu.deb >"$WORK/upgrade.log" 2>&1 ||
            { touch "$stop"; wait $loop; fail "dpkg -i (upgrade) failed: $(tail -3 "$WORK/upgrade.log")"; }
        rm -f "$R/tmp/slurm-gpu.deb"
    fi
    in_root env ${RPM:+SLURM_GPU_PYTHON=/usr/bin/python3.11 SLURM_GPU_SYSTEM_SITE=0} \
        /usr/lib/slurm-gpu/venv-setup.sh /usr/share/slurm-gpu/wheels >>"$WORK/upgrade.log" 2>&1 ||
        { touch "$stop"; wait $loop; fail "venv-setup (second upgrade) failed: $(tail -3 "$WORK/upgrade.log")"; }
    touch "$stop"; wait $loop
    read -r calls failed <"$WORK/loop"
    [ "$failed" = 0 ] || fail "$failed of $((calls + failed)) calls of the venv's slurm-gpu failed while it was rebuilt"
    [ "$calls" -ge 10 ] || fail "only $calls calls ran while the venv was rebuilt: the check proves nothing"
    trees=$(cd "$R/opt/slurm-gpu" && ls -d venv-*)
    [ "$(echo "$trees" | wc -l)" = 2 ] || fail "after two upgrades the venv trees are: $(echo $trees)"
    [ "$(readlink "$R/opt/slurm-gpu/venv")" = "$(echo "$trees" | tail -1)" ] ||
        fail "the venv link names $(readlink "$R/opt/slurm-gpu/venv"), not the newest tree"
    upgrades="upgraded twice with $calls calls and none failed"

    # State a node's runs keep where the product puts it by default: the repair
    # ladder's counts, which must survive reboots ([repair] state_dir, not /run).
    # Removing the package for good must take it too.
    sdir=$(in_root /opt/slurm-gpu/venv/bin/python -I -c \
        'from slurm_gpu.health.settings import RepairSettings; print(RepairSettings().state_dir)') ||
        fail "cannot read [repair] state_dir's default"
    mkdir -p "$R$sdir" && echo '{}' >"$R$sdir/repair-state.n1.json"

    if [ -n "$RPM" ]; then
        env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
            rpm --root "$R" -e slurm-gpu >"$WORK/purge.log" 2>&1 || fail "rpm -e failed: $(cat "$WORK/purge.log")"
    else
        in_root dpkg --purge slurm-gpu >"$WORK/purge.log" 2>&1 || fail "dpkg --purge failed: $(cat "$WORK/purge.log")"
    fi
    file_list "$R" >"$WORK/after"
    if ! diff -u "$WORK/before" "$WORK/after" >"$WORK/diff"; then
        fail "purge left the root changed:
$(grep '^[-+][^-+]' "$WORK/diff" | head -20)"
    fi
    if [ -n "$RPM" ]; then
        rpm --root "$R" -q slurm-gpu >/dev/null 2>&1 && fail "rpm still knows slurm-gpu after erase"
    else
        in_root dpkg-query -W slurm-gpu >/dev/null 2>&1 && fail "dpkg still knows slurm-gpu after purge"
    fi
    say "$SUITE${RPM:+ (rpm)}: ok in $(( $(date +%s) - t0 )) s: $ver on Python $py, SPANK plugin $spank_expect, doctor $doctor; $upgrades; purge left $(wc -l <"$WORK/before") files as they were"
    cleanup
done
