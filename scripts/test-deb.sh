#!/bin/bash
# An admin's lifecycle of the .deb in fresh Debian roots, with the lines of
# docs/install.md itself (its `<!-- lifecycle: NAME -->` code blocks: the
# guide cannot drift from what is tested), and `slurm-gpu doctor`'s verdict
# checked against the truth after each step.  For each SUITE (default:
# bookworm trixie):
#   1. a bare debootstrap minbase root, built once and cached as
#      $CACHE/SUITE-pkgroot (never changed afterwards: every run works on a
#      throw-away overlay over it);
#   2. the package's dependencies are installed first (apt-get; trixie: also
#      the guide's build tools and the Recommends slurmd and slurm-client, so
#      that the guide's own install line then adds only the package), then a
#      list of every file (type, mode, owner, size, path) is taken;
#   3. install: trixie with the guide's `apt-get install ./dist/...deb ...`
#      line, so postinst must build the SPANK plugin; bookworm with dpkg -i
#      and no build tools, so postinst must say so in one line and succeed;
#   4. slurm-gpu --version (as root and as nobody; /usr/bin/slurm-gpu too),
#      inventory over a shipped machine's hwloc XML, gres render;
#   5. configure: the guide's slurm.conf and plugstack.conf blocks; doctor
#      must say OK for the plugin (trixie), or CRITICAL for the missing one
#      (bookworm), and OK for the hooks; `spank install` must write the
#      guide's plugstack line; the guide's Prolog=/Epilog= scripts exit 0
#      for a job without our options;
#   6. two upgrades while a loop runs the venv's slurm-gpu (no call may
#      fail), then doctor again: the plugin the guide's line names still
#      starts a Python that exists;
#   7. trixie: a failed plugin build (spank.h moved away) on a third
#      upgrade: dpkg must fail, the live tree and its plugin stay, doctor
#      must report package.setup; with spank.h back, `dpkg --configure -a`
#      goes live and doctor is clean again; then the dpkg trigger on Slurm's
#      headers: a no-op over a plugin that fits, a rebuild (and doctor
#      clean) over one whose record names another Slurm major;
#   8. the guide's `apt-get remove`: every script the guide's Prolog=,
#      Epilog= and HealthCheckProgram= lines name must still exist and exit 0
#      (for a job that asked for our prolog too); then the guide's
#      `apt-get purge`, and the file list again: it must equal step 2's.
# Not done here: jobs.  The roots run no slurmctld/slurmd (the sandbox
# tests do, from the checkout's venv), so no job runs with the options.
# Needs root, debootstrap, overlayfs and a Debian mirror (DEBIAN_MIRROR).
# With --rpm FILE the EL package goes through install, run, upgrades and
# erase in a Debian 12 root instead (rpm --root: its %post makes the venv
# from python3.11, which Debian 12 also has, with every shipped wheel and
# nothing from the system; %postun removes it): the closest this project
# gets to EL, see docs/install.md.
# Exit 0: all passed; 1: a check failed; 77: cannot run here (no mirror,
# no debootstrap, no rpm), with one `slurm-gpu:` line saying why.
#   scripts/test-deb.sh [--deb FILE] [SUITE...]
#   scripts/test-deb.sh --rpm FILE [bookworm]
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${SLURM_GPU_CACHE:-/var/cache/slurm-gpu}
DOC=$HERE/docs/install.md
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEB= RPM=
if [ "${1:-}" = --deb ]; then DEB=$2; shift 2; fi
if [ "${1:-}" = --rpm ]; then RPM=$2; shift 2; fi
SUITES=("$@")
[ ${#SUITES[@]} -gt 0 ] || SUITES=(bookworm trixie)

say() { echo "slurm-gpu: test-deb: $*" >&2; }
# The code block after `<!-- lifecycle: NAME -->` in docs/install.md.
doc_block() {
    awk -v m="<!-- lifecycle: $1 -->" '$0 == m { f = 1; next } f && /^```/ { if (b) exit; b = 1; next } f && b { print }' "$DOC"
}
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
    if [ -z "$DEB" ]; then
        # As the guide says (its build-deb block), into a directory of our own.
        dist=$(mktemp -d /tmp/slurm-gpu-dist.XXXXXX)
        build=$(doc_block build-deb | sed 's/#.*//' | grep .) || { say "no build-deb block in $DOC"; exit 1; }
        (cd "$HERE" && SLURM_GPU_DIST=$dist bash -ec "$build" >/dev/null) || { say "the guide's build ($build) failed"; exit 1; }
        DEB=$(ls "$dist"/slurm-gpu_*_all.deb)
    fi
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

# doctor's findings in the root, one per line (its exit status is not the
# point: a test root is no complete node).  A traceback or a broken check
# (exit 3 with no finding) fails.
doctor() {
    local rc=0
    in_root /usr/bin/slurm-gpu doctor --no-gres >"$WORK/doctor.log" 2>&1 || rc=$?
    if [ "$rc" -gt 3 ] || grep -q Traceback "$WORK/doctor.log"; then fail "doctor broke (exit $rc): $(cat "$WORK/doctor.log")"; fi
    sed "s/^/    doctor ($1): /" "$WORK/doctor.log" >&2
}
# doctor must have said each line that starts with one of these.
doctor_says() {
    local step=$1 want; shift
    for want in "$@"; do
        grep -qF -- "$want" "$WORK/doctor.log" || fail "$step: doctor did not say '$want' (it said: $(cat "$WORK/doctor.log"))"
    done
}
doctor_not() {
    local step=$1 bad; shift
    for bad in "$@"; do
        ! grep -F -- "$bad" "$WORK/doctor.log" || fail "$step: doctor said '$bad', which is not true here"
    done
}
# The scripts a slurm.conf key of the guide names (Prolog=/Epilog= take a glob).
guide_key() { doc_block slurm.conf | sed -n "s/^$1=\([^ ]*\).*/\1/p"; }
# Run every script the guide's slurm.conf names, as slurmd does (no PATH),
# for a job that asked for our prolog work; each must exist and exit 0.
hooks_exit_0() {
    local key n=0 f rc
    for key in Prolog Epilog HealthCheckProgram; do
        local pat; pat=$(guide_key "$key")
        [ -n "$pat" ] || fail "the guide's slurm.conf has no $key= line"
        for f in $R$pat; do
            [ -x "$f" ] || fail "$1: $key=$pat: ${f#"$R"} is missing or not executable (slurmd would fail the job and drain the node)"
            rc=0
            chroot "$R" /usr/bin/env -i SLURM_JOB_ID=7 SLURM_JOB_UID=0 SPANK_SLURM_GPU_PROLOG=1 SPANK_SLURM_GPU_EPILOG=1 \
                "${f#"$R"}" >"$WORK/hook.log" 2>&1 || rc=$?
            [ $rc = 0 ] || fail "$1: ${f#"$R"} exited $rc: $(head -3 "$WORK/hook.log")"
            [ -z "${2:-}" ] || grep -qF "$2" "$WORK/hook.log" || fail "$1: ${f#"$R"} did not say '$2': $(cat "$WORK/hook.log")"
            n=$((n + 1))
        done
    done
    echo $n
}

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
    guide_install=
    recommends=--no-install-recommends
    if [ -n "$RPM" ]; then
        # What the spec Requires, by its Debian names (python3.11's ensurepip for the venv).
        deps="python3.11 python3.11-venv libhwloc15"
    else
        deps=$(dpkg-deb -f "$DEB" Depends | sed -e 's/([^)]*)//g' -e 's/,/ /g')
        if [ "$SUITE" != bookworm ]; then
            # The guide's GPU-node line: its packages (and, as apt does by
            # default, Recommends) first, so that the line itself then adds
            # only slurm-gpu and the purge can be compared with this state.
            guide_install=$(doc_block install-deb | sed 's/#.*//' | grep '^apt-get install ') ||
                fail "no apt-get install line in the guide's install-deb block"
            read -r -a extra <<<"$(echo "$guide_install" | sed 's#^apt-get install \./dist/slurm-gpu_[^ ]*\.deb##')"
            extra+=(slurmd slurm-client)
            recommends=
            spank_expect=built
        fi
    fi
    in_root apt-get update -qq >/dev/null || fail "apt-get update failed"
    # The archive cache is bind-mounted into every run's root and apt-get locks it
    # (archives/lock, no waiting): concurrent runs take turns for the install.
    # shellcheck disable=SC2086
    (flock 7 && in_root apt-get install -y -qq $recommends $deps "${extra[@]}") \
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
        if [ -n "$guide_install" ]; then
            # shellcheck disable=SC2001
            cmd=$(echo "$guide_install" | sed 's#^apt-get install \./dist/slurm-gpu_[^ ]*\.deb#apt-get install -y -q /tmp/slurm-gpu.deb#')
            # shellcheck disable=SC2086
            (flock 7 && in_root $cmd) 7>"$CACHE/$SUITE-pkgroot-apt.lock" >"$WORK/install.log" 2>&1 ||
                fail "the guide's install ($guide_install) failed: $(tail -5 "$WORK/install.log")"
        else
            in_root dpkg -i /tmp/slurm-gpu.deb >"$WORK/install.log" 2>&1 || fail "dpkg -i failed: $(cat "$WORK/install.log")"
        fi
        python=/usr/bin/python3
    fi
    grep '^slurm-gpu:' "$WORK/install.log" | sed 's/^/    /' >&2 || true
    py=$(in_root "$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    vpy=$(in_root /opt/slurm-gpu/venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [ "$py" = "$vpy" ] || fail "venv runs Python $vpy, the root has $py"
    ver=$(in_root /opt/slurm-gpu/venv/bin/slurm-gpu --version) || fail "slurm-gpu --version failed"
    [ "$(in_root slurm-gpu --version)" = "$ver" ] || fail "/usr/bin/slurm-gpu is not the venv's slurm-gpu"
    chroot --userspec=nobody:nogroup "$R" /opt/slurm-gpu/venv/bin/slurm-gpu --version >/dev/null ||
        fail "slurm-gpu --version fails for an ordinary user (venv not readable by all)"
    # A recorded machine from the checkout's devkit (the package ships none),
    # removed again before the purge's comparison.
    in_root /opt/slurm-gpu/venv/bin/python -c 'import slurm_gpu_devkit' 2>/dev/null &&
        fail "the package's venv has the devkit (slurm_gpu_devkit)"
    mkdir -p "$R/tmp/sg-machine"
    cp "$HERE/devkit/slurm_gpu_devkit/machines/h100-mig/hwloc.xml" "$HERE/devkit/slurm_gpu_devkit/machines/h100-mig/snapshot.json" "$R/tmp/sg-machine/"
    in_root /opt/slurm-gpu/venv/bin/slurm-gpu inventory --hwloc-xml /tmp/sg-machine/hwloc.xml >/dev/null ||
        fail "inventory over a recorded machine failed (libhwloc through cffi)"
    in_root /opt/slurm-gpu/venv/bin/slurm-gpu gres render --snapshot "n1=/tmp/sg-machine/snapshot.json" |
        grep -q '^NodeName=n1 Name=gpu' || fail "gres render over a recorded machine printed no gpu line"
    rm -rf "$R/tmp/sg-machine"
    plugin=/opt/slurm-gpu/venv/lib/slurm-gpu/slurm_gpu_spank.so
    case $spank_expect in
        built) [ -f "$R$plugin" ] || fail "postinst built no SPANK plugin"
               grep -q '^slurm-gpu: SPANK plugin built' "$WORK/install.log" || fail "postinst did not report the plugin" ;;
        missing) [ "$(grep -c '^slurm-gpu: SPANK plugin not built' "$WORK/install.log")" = 1 ] ||
               fail "postinst did not say in one line that the SPANK plugin was not built" ;;
    esac

    # Configure as the guide says: its slurm.conf lines (the node line, which
    # `gres render --node-lines` makes per node, left out) and its plugstack
    # line.  Kept aside to be undone before the purge's comparison: they are
    # the admin's files, not the package's.
    mkdir -p "$R/etc/slurm"
    for f in slurm.conf plugstack.conf cgroup.conf; do
        if [ -e "$R/etc/slurm/$f" ]; then cp -p "$R/etc/slurm/$f" "$WORK/orig.$f"; fi
    done
    { echo "ClusterName=lifecycle"; doc_block slurm.conf | grep -v '^NodeName=.*\.\.\.'; } >"$R/etc/slurm/slurm.conf"
    doc_block cgroup.conf | sed 's/ *#.*//' >"$R/etc/slurm/cgroup.conf"
    psline=$(doc_block plugstack.conf | grep .)
    [ "$(echo "$psline" | wc -l)" = 1 ] || fail "the guide's plugstack block is not one line: $psline"
    echo "$psline" >>"$R/etc/slurm/plugstack.conf"
    doctor configured
    doctor_says configured "OK slurm.prolog: Prolog=$(guide_key Prolog)" "OK slurm.epilog: Epilog=$(guide_key Epilog)" \
        "OK slurm.prologflags:" "OK slurm.healthcheck: HealthCheckProgram=$(guide_key HealthCheckProgram)" \
        "OK spank.plugstack: $psline" "OK venv.owner:" \
        "OK cgroup.conf: ConstrainDevices, ConstrainCores and ConstrainRAMSpace are yes (/etc/slurm/cgroup.conf)"
    doctor_not configured "package.setup"
    if [ $spank_expect = built ]; then
        slurm=$(in_root /usr/sbin/slurmd -V | awk '{print $2}')
        doctor_says configured "OK spank.plugin: built for Slurm $slurm, slurmd is $slurm ($plugin)" "OK spank.tree: $plugin starts"
        # `spank install` writes the guide's line (config= is its argument, like numa_bind=)
        args=$(echo "$psline" | cut -d' ' -f3-)
        # shellcheck disable=SC2086
        in_root slurm-gpu spank install --plugstack /tmp/spank-install.conf $args >/dev/null ||
            fail "slurm-gpu spank install $args failed"
        [ "$(cat "$R/tmp/spank-install.conf")" = "$psline" ] ||
            fail "spank install wrote '$(cat "$R/tmp/spank-install.conf")', the guide says '$psline'"
        rm -f "$R/tmp/spank-install.conf"
    else
        doctor_says configured "CRITICAL spank.plugin: $plugin does not exist"
    fi
    # A job without our options: the hooks' sh fast path (no Python).
    for key in Prolog Epilog; do
        for f in $R$(guide_key $key); do
            chroot "$R" /usr/bin/env -i SLURM_JOB_ID=7 "${f#"$R"}" >/dev/null 2>&1 || fail "${f#"$R"} failed for a job without options"
        done
    done

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
    if [ -z "$RPM" ]; then
        doctor "two upgrades"
        doctor_not "two upgrades" "package.setup" "CRITICAL spank.tree"
        if [ $spank_expect = built ]; then
            doctor_says "two upgrades" "OK spank.plugin: built for Slurm $slurm" "OK spank.tree: $plugin starts /opt/slurm-gpu/$(echo "$trees" | tail -1)/bin/python"
        fi
    fi

    # A failed plugin build (Slurm's header gone) must keep the live tree and
    # its plugin, fail the package's configuration, and show in doctor.
    if [ -z "$RPM" ] && [ $spank_expect = built ]; then
        live=$(readlink "$R/opt/slurm-gpu/venv")
        mv "$R/usr/include/slurm/spank.h" "$R/usr/include/slurm/spank.h.away"
        cp "$DEB" "$R/tmp/slurm-gpu.deb"
        rc=0; in_root dpkg -i /tmp/slurm-gpu.deb >"$WORK/failed.log" 2>&1 || rc=$?
        grep '^slurm-gpu:' "$WORK/failed.log" | sed 's/^/    failed build: /' >&2 || true
        [ $rc != 0 ] || fail "dpkg -i succeeded although the plugin could not be built"
        grep -q '^slurm-gpu: SPANK plugin not built (slurm/spank.h not found.*the new venv was NOT put live.*then run: dpkg --configure -a$' "$WORK/failed.log" ||
            fail "the failed build did not say so in its line: $(cat "$WORK/failed.log")"
        [ "$(readlink "$R/opt/slurm-gpu/venv")" = "$live" ] || fail "a tree without a plugin went live"
        [ -f "$R$plugin" ] && [ -f "$R/opt/slurm-gpu/venv/lib/slurm-gpu/slurm_gpu_spank_py.so" ] || fail "the live plugin is gone"
        [ "$(cd "$R/opt/slurm-gpu" && ls -d venv-* | wc -l)" = 2 ] || fail "the failed build left a tree behind"
        in_root dpkg-query -W -f='${Status}' slurm-gpu | grep -q half-configured || fail "dpkg does not call slurm-gpu half-configured"
        doctor "failed build"
        doctor_says "failed build" "CRITICAL package.setup: the last upgrade did not go live: slurm-gpu: SPANK plugin not built" \
            "OK spank.plugin: built for Slurm $slurm" "OK spank.tree: $plugin starts /opt/slurm-gpu/$live/bin/python"
        for f in $R$(guide_key Prolog); do
            chroot "$R" /usr/bin/env -i SLURM_JOB_ID=7 "${f#"$R"}" >/dev/null 2>&1 || fail "${f#"$R"} failed after the failed build"
        done
        mv "$R/usr/include/slurm/spank.h.away" "$R/usr/include/slurm/spank.h"
        in_root dpkg --configure -a >"$WORK/fixed.log" 2>&1 || fail "dpkg --configure -a failed after the fix: $(tail -3 "$WORK/fixed.log")"
        rm -f "$R/tmp/slurm-gpu.deb"
        [ "$(readlink "$R/opt/slurm-gpu/venv")" != "$live" ] || fail "dpkg --configure -a did not put a new tree live"
        doctor "fixed"
        doctor_not "fixed" "package.setup" "CRITICAL spank"
        doctor_says "fixed" "OK spank.plugin: built for Slurm $slurm"
        upgrades="$upgrades; a failed plugin build kept the live plugin and doctor said so"

        # A Slurm of another major under the plugin: the root has one Slurm, so
        # the plugin's record is made another major's (same length), then the
        # package's dpkg trigger on Slurm's headers fires as a Slurm upgrade
        # would fire it. A trigger over a plugin that fits changes nothing.
        live=$(readlink "$R/opt/slurm-gpu/venv")
        in_root dpkg-trigger --no-await /usr/include/slurm/spank.h && in_root dpkg --triggers-only -a >"$WORK/trigger.log" 2>&1 ||
            fail "dpkg --triggers-only failed: $(tail -3 "$WORK/trigger.log")"
        [ "$(readlink "$R/opt/slurm-gpu/venv")" = "$live" ] || fail "a trigger over a plugin that fits rebuilt it"
        other=22.05.8; [ "${slurm%%.*}" != 22 ] || other=24.11.5
        python3 -c 'import sys; p, a, b = sys.argv[1:]; d = open(p, "rb").read(); a, b = (b"built-for-slurm=" + x.encode() for x in (a, b)); assert a in d and len(a) == len(b); open(p, "wb").write(d.replace(a, b))' \
            "$R/opt/slurm-gpu/$live/lib/slurm-gpu/slurm_gpu_spank.so" "$slurm" "$other" || fail "cannot age the plugin's record"
        doctor "stale plugin"
        doctor_says "stale plugin" "CRITICAL spank.plugin: built for Slurm $other but slurmd is $slurm: Slurm will refuse it; rebuild it (/usr/lib/slurm-gpu/venv-setup.sh /usr/share/slurm-gpu/wheels)"
        in_root dpkg-trigger --no-await /usr/include/slurm/spank.h && in_root dpkg --triggers-only -a >"$WORK/trigger.log" 2>&1 ||
            fail "dpkg --triggers-only failed: $(tail -3 "$WORK/trigger.log")"
        grep '^slurm-gpu:' "$WORK/trigger.log" | sed 's/^/    trigger: /' >&2 || true
        [ "$(readlink "$R/opt/slurm-gpu/venv")" != "$live" ] || fail "the trigger did not rebuild a plugin built for Slurm $other"
        doctor "triggered"
        doctor_not "triggered" "package.setup" "CRITICAL spank"
        doctor_says "triggered" "OK spank.plugin: built for Slurm $slurm"
        upgrades="$upgrades; a plugin of another Slurm major was rebuilt by the dpkg trigger"
    fi

    # State a node's runs keep where the product puts it by default: the repair
    # ladder's counts, which must survive reboots ([repair] state_dir, not /run).
    # Removing the package for good must take it too.
    sdir=$(in_root /opt/slurm-gpu/venv/bin/python -I -c \
        'from slurm_gpu.health.settings import RepairSettings; print(RepairSettings().state_dir)') ||
        fail "cannot read [repair] state_dir's default"
    mkdir -p "$R$sdir" && echo '{}' >"$R$sdir/repair-state.n1.json"

    if [ -n "$RPM" ]; then
        erase() {
            env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
                rpm --root "$R" -e slurm-gpu >"$WORK/purge.log" 2>&1 || fail "rpm -e failed: $(cat "$WORK/purge.log")"
        }
        # The erase (dnf remove) with slurm.conf still naming the hooks: they must stay harmless.
        erase
        [ ! -e "$R/opt/slurm-gpu" ] || fail "rpm -e left /opt/slurm-gpu: $(ls -a "$R/opt/slurm-gpu")"
        hooks=$(hooks_exit_0 erased "slurm-gpu: package removed") || exit 1
        # A reinstall takes the harmless hooks away again (they would run beside the real ones).
        env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
            rpm --root "$R" --nodeps -i "$RPM" >"$WORK/reinstall.log" 2>&1 || fail "reinstall failed: $(tail -3 "$WORK/reinstall.log")"
        ! ls "$R"/usr/lib/slurm-gpu/*.d/00-slurm-gpu-removed 2>/dev/null || fail "the reinstall kept the erase's hooks"
        erase
        # The guide's last step on EL: the hooks, by hand.
        rmhooks=$(doc_block remove-rpm | sed 's/#.*//' | grep '^rm ') || fail "no rm line in the guide's remove-rpm block"
        # shellcheck disable=SC2086
        in_root $rmhooks || fail "$rmhooks failed"
        removed="erased ($hooks hooks the guide names exit 0), reinstalled, erased, hooks removed as the guide says"
    else
        # The guide's removal, with slurm.conf still naming the hooks (the
        # step it asks for first, forgotten): they must stay harmless.
        remove=$(doc_block remove-deb | sed 's/#.*//' | grep '^apt-get remove ') || fail "no apt-get remove line in the guide"
        purge=$(doc_block remove-deb | sed 's/#.*//' | grep '^apt-get purge ') || fail "no apt-get purge line in the guide"
        # shellcheck disable=SC2086
        in_root ${remove/apt-get remove/apt-get remove -y -q} >"$WORK/remove.log" 2>&1 || fail "$remove failed: $(tail -3 "$WORK/remove.log")"
        [ ! -e "$R/opt/slurm-gpu" ] || fail "$remove left /opt/slurm-gpu: $(ls -a "$R/opt/slurm-gpu")"
        [ ! -e "$R/usr/bin/slurm-gpu" ] && [ ! -L "$R/usr/bin/slurm-gpu" ] || fail "$remove left /usr/bin/slurm-gpu"
        hooks=$(hooks_exit_0 removed "slurm-gpu: package removed") || exit 1
        # A reinstall takes the harmless hooks away again (they would run beside the real ones).
        cp "$DEB" "$R/tmp/slurm-gpu.deb"
        in_root dpkg -i /tmp/slurm-gpu.deb >"$WORK/reinstall.log" 2>&1 || fail "reinstall failed: $(tail -3 "$WORK/reinstall.log")"
        rm -f "$R/tmp/slurm-gpu.deb"
        ! ls "$R"/usr/lib/slurm-gpu/*.d/00-slurm-gpu-removed 2>/dev/null || fail "the reinstall kept the removal's hooks"
        in_root ${remove/apt-get remove/apt-get remove -y -q} >>"$WORK/remove.log" 2>&1 || fail "$remove (again) failed"
        # shellcheck disable=SC2086
        in_root ${purge/apt-get purge/apt-get purge -y -q} >"$WORK/purge.log" 2>&1 || fail "$purge failed: $(tail -3 "$WORK/purge.log")"
        removed="removed ($hooks hooks the guide names exit 0), reinstalled, removed, purged"
    fi
    # The admin's own files as they were before configuring.
    rm -f "$R/etc/slurm/slurm.conf" "$R/etc/slurm/plugstack.conf" "$R/etc/slurm/cgroup.conf"
    for f in slurm.conf plugstack.conf cgroup.conf; do
        if [ -e "$WORK/orig.$f" ]; then cp -p "$WORK/orig.$f" "$R/etc/slurm/$f"; fi
    done
    if [ -z "$(ls -A "$R/etc/slurm")" ] && ! grep -q ' ./etc/slurm$' "$WORK/before"; then rmdir "$R/etc/slurm"; fi
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
    say "$SUITE${RPM:+ (rpm)}: ok in $(( $(date +%s) - t0 )) s: $ver on Python $py, SPANK plugin $spank_expect; $upgrades; $removed; purge left $(wc -l <"$WORK/before") files as they were"
    cleanup
done
if [ -n "${dist:-}" ]; then rm -rf "$dist"; fi
