"""scripts/debian-root.sh builds a root aside and retries a failed debootstrap once.

The script runs for real with fake ``debootstrap``, ``chroot`` and ``id`` first
on PATH, the mirror a local directory (``file://``) and
the cache a temp directory (``SLURM_GPU_CACHE``): nothing is fetched and no
root is built on this machine.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from paths import ROOT

REPO = ROOT
SCRIPT = REPO / "scripts" / "debian-root.sh"

# Fails the first FAIL_TIMES calls (with a half-made root and debootstrap's E: line),
# then makes a root with what the script checks: slurmctld and both topology plugins.
FAKE_DEBOOTSTRAP = """#!/bin/sh
n=$(cat "$FAKE_DIR/calls" 2>/dev/null || echo 0); n=$((n + 1)); echo $n >"$FAKE_DIR/calls"
target=$4   # --variant --include SUITE TARGET MIRROR
mkdir -p "$target/usr/sbin" "$target/usr/lib/x86_64-linux-gnu/slurm-wlm"
if [ "$n" -le "${FAIL_TIMES:-0}" ]; then
  echo "E: Couldn't download packages: slurmctld" ; exit 1
fi
touch "$target/usr/sbin/slurmctld" && chmod 755 "$target/usr/sbin/slurmctld"
touch "$target/usr/lib/x86_64-linux-gnu/slurm-wlm/topology_tree.so" \\
      "$target/usr/lib/x86_64-linux-gnu/slurm-wlm/topology_block.so"
"""


@pytest.fixture
def fake(tmp_path: Path) -> dict[str, object]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"debootstrap": FAKE_DEBOOTSTRAP,
                       "chroot": "#!/bin/sh\necho 'slurm-wlm 24.11.5'\n",
                       "sleep": "#!/bin/sh\n",
                       "id": "#!/bin/sh\necho 0\n"}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    mirror = tmp_path / "mirror"
    (mirror / "dists" / "trixie").mkdir(parents=True)
    (mirror / "dists" / "trixie" / "InRelease").write_text("Suite: trixie\n")
    cache = tmp_path / "cache"
    env = {"PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_GPU_CACHE": str(cache),
           "DEBIAN_MIRROR": f"file://{mirror}", "FAKE_DIR": str(tmp_path), "HOME": str(tmp_path)}
    return {"env": env, "cache": cache, "calls": tmp_path / "calls"}


def _run(fake: dict[str, object], **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), "trixie"], env=dict(fake["env"], **extra),  # type: ignore[arg-type]
                          capture_output=True, text=True, timeout=60)


def test_one_failed_debootstrap_is_retried(fake) -> None:
    res = _run(fake, FAIL_TIMES="1")
    root = fake["cache"] / "trixie-root"
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(root)
    assert fake["calls"].read_text().strip() == "2"
    assert (root / ".slurm-gpu-complete").exists() and (root / ".slurm-version").read_text().split()[-1] == "24.11.5"
    assert not (fake["cache"] / "trixie-root.partial").exists()


def test_two_failures_say_why_in_one_line_and_leave_no_root(fake) -> None:
    res = _run(fake, FAIL_TIMES="2")
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slurm-gpu: debootstrap trixie failed"), lines
    assert "Couldn't download packages" in lines[0]
    assert not (fake["cache"] / "trixie-root").exists()
    assert not (fake["cache"] / "trixie-root.partial").exists()


def test_a_built_root_is_reused(fake) -> None:
    assert _run(fake).returncode == 0
    res = _run(fake, FAIL_TIMES="99")            # a second debootstrap would fail: none runs
    assert res.returncode == 0, res.stderr
    assert fake["calls"].read_text().strip() == "1"


def test_a_local_mirror_is_read_without_curl_or_wget(fake) -> None:
    """A fresh minimal Debian has wget but no curl, and wget cannot read
    file:// URLs: the probe said "mirror unreachable" for a local mirror."""
    bin_dir = Path(str(fake["env"]["PATH"]).split(":")[0])  # type: ignore[index]
    for name in ("curl", "wget"):
        (bin_dir / name).write_text("#!/bin/sh\necho 'unsupported protocol' >&2; exit 1\n")
        (bin_dir / name).chmod(0o755)
    res = _run(fake)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(Path(str(fake["cache"])) / "trixie-root")


# chroot ROOT CMD...: dpkg-query answers from $FAKE_DIR/installed (one package a
# line); apt-get records its arguments in $FAKE_DIR/apt (exit $APT_RC); anything
# else is `slurmctld -V`.
FAKE_CHROOT = """#!/bin/sh
shift
[ "$1" = /usr/bin/env ] && { shift; while [ "${1#*=}" != "$1" ]; do shift; done; }
case "$1" in
  dpkg-query) for p; do :; done
              grep -qx "$p" "$FAKE_DIR/installed" 2>/dev/null && printf 'install ok installed'; exit 0 ;;
  apt-get) echo "$*" >>"$FAKE_DIR/apt"
           [ "${APT_RC:-0}" = 0 ] || echo "E: Unable to locate package slurmdbd"; exit "${APT_RC:-0}" ;;
  *) echo 'slurm-wlm 24.11.5' ;;
esac
"""


def _stale_root(fake: dict[str, object]) -> Path:
    """A root completed by an older script: no package record, no slurmdbd."""
    bin_dir = Path(str(fake["env"]["PATH"]).split(":")[0])  # type: ignore[index]
    (bin_dir / "chroot").write_text(FAKE_CHROOT)
    assert _run(fake).returncode == 0
    root = Path(str(fake["cache"])) / "trixie-root"
    (root / ".slurm-gpu-packages").unlink()
    wanted = next(l for l in SCRIPT.read_text().splitlines() if l.startswith("PACKAGES="))
    fake_dir = Path(str(fake["calls"])).parent
    (fake_dir / "installed").write_text("\n".join(p for p in wanted[9:].split(",") if p != "slurmdbd") + "\n")
    return root


def test_a_stale_root_gets_the_packages_added_since(fake) -> None:
    """Caches built before slurmdbd joined PACKAGES were taken as complete, so
    `sandbox up --accounting --slurm 24.11` found no slurmdbd in them."""
    root = _stale_root(fake)
    fake_dir = Path(str(fake["calls"])).parent
    res = _run(fake, FAIL_TIMES="99")              # never rebuilt: completed in place
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(root)
    apt = (fake_dir / "apt").read_text().splitlines()
    assert apt == ["apt-get -o Acquire::Check-Valid-Until=false update", "apt-get install -y --no-install-recommends slurmdbd"]
    assert "slurmdbd" in (root / ".slurm-gpu-packages").read_text().split(",")
    assert not (root / "usr" / "sbin" / "policy-rc.d").exists()
    assert _run(fake, FAIL_TIMES="99").returncode == 0
    assert len((fake_dir / "apt").read_text().splitlines()) == 2     # recorded: not asked again


def test_a_stale_root_that_cannot_be_completed_says_why(fake) -> None:
    root = _stale_root(fake)
    res = _run(fake, FAIL_TIMES="99", APT_RC="100")
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slurm-gpu: cannot add slurmdbd to the trixie root"), lines
    assert "Unable to locate package" in lines[0]
    assert not (root / ".slurm-gpu-packages").exists()
    assert not (root / "usr" / "sbin" / "policy-rc.d").exists()
