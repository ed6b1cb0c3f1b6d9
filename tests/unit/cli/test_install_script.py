"""scripts/install.sh holds services down only around its own apt-get.

The script runs for real, with fake ``apt-get``, ``dpkg-query``, ``id``,
``update-rc.d`` and ``systemctl`` first on PATH and the policy-rc.d
and lock paths pointed into a temp directory (``SLURM_GPU_POLICY_RC``,
``SLURM_GPU_APT_LOCK``), so nothing on this machine is touched.  The fake
apt-get records what invoke-rc.d would have been told while it ran (at the
start of each call, and at the end of a slow install).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from paths import ROOT

REPO = ROOT
SCRIPT = REPO / "scripts" / "install.sh"

FAKE_APT = """#!/bin/sh
# Record, per call, whether the policy exists and what it answers for a start.
if [ -x "$FAKE_POLICY" ]; then "$FAKE_POLICY" slurmd start; echo "$1 policy=$?" >>"$FAKE_LOG"
else echo "$1 policy=none" >>"$FAKE_LOG"; fi
if [ "$1" = install ] && [ -n "$FAKE_APT_SLEEP" ]; then
  echo started >"$FAKE_LOG.started"; sleep "$FAKE_APT_SLEEP"
  if [ -x "$FAKE_POLICY" ]; then "$FAKE_POLICY" slurmd start; echo "install-end policy=$?" >>"$FAKE_LOG"
  else echo "install-end policy=none" >>"$FAKE_LOG"; fi
fi
if [ "$1" = install ]; then exit "${FAKE_APT_RC:-0}"; fi
exit 0
"""


@pytest.fixture
def fake(tmp_path: Path) -> dict[str, object]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    services = tmp_path / "services.log"
    record = f'#!/bin/sh\necho "$(basename "$0") $*" >>{services}\n'
    for name, text in {"apt-get": FAKE_APT,
                       "dpkg-query": "#!/bin/sh\nexit 1\n",      # nothing installed
                       "id": "#!/bin/sh\necho 0\n",              # "root"
                       "update-rc.d": record, "systemctl": record}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    sbin = tmp_path / "sbin"
    sbin.mkdir()
    policy = sbin / "policy-rc.d"
    log = tmp_path / "apt.log"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_GPU_POLICY_RC": str(policy),
           "SLURM_GPU_APT_LOCK": str(tmp_path / "lock" / "install.lock"),
           "SLURM_GPU_SKIP_VENV": "1", "FAKE_POLICY": str(policy), "FAKE_LOG": str(log),
           "HOME": str(tmp_path), "SLURM_GPU_VENV": str(tmp_path / "venv")}
    return {"env": env, "policy": policy, "log": log, "sbin": sbin, "services": services}


def _run(fake: dict[str, object], **extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(fake["env"], **extra)  # type: ignore[arg-type]
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=60)


def test_policy_only_during_apt_get_then_removed(fake) -> None:
    res = _run(fake)
    assert res.returncode == 0, res.stderr
    # During both apt-get calls a start was refused (101: "action forbidden by policy").
    assert fake["log"].read_text().split("\n")[:2] == ["update policy=101", "install policy=101"]
    assert not fake["policy"].exists()
    assert sorted(p.name for p in fake["sbin"].iterdir()) == []


def test_failed_apt_get_removes_the_policy_too(fake) -> None:
    res = _run(fake, FAKE_APT_RC="100")
    assert res.returncode == 100
    assert "install policy=101" in fake["log"].read_text()
    assert sorted(p.name for p in fake["sbin"].iterdir()) == []


def test_an_existing_policy_is_used_and_kept(fake) -> None:
    mine = "#!/bin/sh\n# the admin's own\nexit 104\n"
    fake["policy"].write_text(mine)
    fake["policy"].chmod(0o755)
    res = _run(fake)
    assert res.returncode == 0, res.stderr
    assert "install policy=104" in fake["log"].read_text()
    assert fake["policy"].read_text() == mine


def test_a_dangling_policy_link_is_not_replaced(fake) -> None:
    fake["policy"].symlink_to(fake["sbin"] / "elsewhere")
    res = _run(fake)
    assert res.returncode == 0, res.stderr
    assert fake["policy"].is_symlink()


@pytest.mark.parametrize("sig, rc", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_interrupted_install_removes_the_policy(fake, sig: signal.Signals, rc: int) -> None:
    env = dict(fake["env"], FAKE_APT_SLEEP="30")
    # A signal ignored when bash starts cannot be trapped (nor does it reach
    # apt-get): a suite started in the background (`cmd &`) inherits SIGINT
    # ignored, so give the script the disposition a terminal's shell gives it.
    proc = subprocess.Popen(["bash", str(SCRIPT)], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    started = Path(str(fake["log"]) + ".started")
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), "fake apt-get install never ran"
    assert fake["policy"].exists()
    os.killpg(proc.pid, sig)            # as a terminal's ^C reaches the whole group
    assert proc.wait(timeout=30) == rc
    assert sorted(p.name for p in fake["sbin"].iterdir()) == []


def test_skip_apt_never_writes_a_policy(fake, tmp_path: Path) -> None:
    res = _run(fake, SLURM_GPU_SKIP_APT="1")
    assert res.returncode == 0, res.stderr
    assert not fake["log"].exists()
    assert sorted(p.name for p in fake["sbin"].iterdir()) == []


def test_services_of_installed_packages_are_disabled_at_boot(fake) -> None:
    """postinst enables mariadb, munge, slurm*: they would start at the next boot."""
    res = _run(fake)
    assert res.returncode == 0, res.stderr
    calls = fake["services"].read_text().splitlines()
    for svc in ("mariadb", "munge", "slurmctld", "slurmd", "slurmdbd"):
        # Debian 12 ships an init script for each (update-rc.d also drops the unit's
        # wants link); systemctl where there is none.
        want = (f"update-rc.d {svc} disable" if Path(f"/etc/init.d/{svc}").exists()
                else f"systemctl --quiet disable {svc}.service")
        assert want in calls, calls
    assert len(calls) == 5 and not [c for c in calls if " enable" in c or " stop" in c], calls


def test_services_of_packages_already_there_are_left_alone(fake) -> None:
    """An admin's own mariadb/munge/slurmd stay as they were (only what we installed is undone)."""
    installed = "#!/bin/sh\necho 'install ok installed'\n"
    (Path(fake["env"]["PATH"].split(":")[0]) / "dpkg-query").write_text(installed)
    res = _run(fake)
    assert res.returncode == 0, res.stderr
    assert not fake["services"].exists()
    assert not fake["log"].exists()                  # nothing missing: no apt-get at all


def test_concurrent_installs_never_run_apt_without_the_policy(fake, tmp_path: Path) -> None:
    """Two installs at once: the second waits for the first, so the first's
    cleanup never removes the policy-rc.d under the second's apt-get."""
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = []
    for log in logs:
        env = dict(fake["env"], FAKE_APT_SLEEP="2", FAKE_LOG=str(log))
        procs.append(subprocess.Popen(["bash", str(SCRIPT)], env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 30
        while log is logs[0] and not Path(f"{log}.started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    for log in logs:
        lines = log.read_text().splitlines()
        assert lines[:3] == ["update policy=101", "install policy=101", "install-end policy=101"], (log, lines)
    assert sorted(p.name for p in fake["sbin"].iterdir()) == []


def test_venv_install_opens_only_the_venv_to_all(fake, tmp_path: Path) -> None:
    """SLURM_GPU_VENV=/opt/venv must not make everything else under /opt readable by all."""
    parent = tmp_path / "opt"
    venv = parent / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text("#!/bin/sh\nexit 0\n")          # a venv of /usr's python; pip succeeds
    py.chmod(0o700)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    secret = parent / "secret"
    secret.write_text("x")
    secret.chmod(0o600)
    private = parent / "private"
    private.mkdir(mode=0o700)
    env = {k: v for k, v in fake["env"].items() if k != "SLURM_GPU_SKIP_VENV"}  # type: ignore[union-attr]
    res = subprocess.run(["bash", str(SCRIPT)], env={**env, "SLURM_GPU_SKIP_APT": "1",
                                                     "SLURM_GPU_VENV": str(venv)},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert py.stat().st_mode & 0o777 == 0o755            # the venv: readable by every user
    assert secret.stat().st_mode & 0o777 == 0o600        # its neighbours: as they were
    assert private.stat().st_mode & 0o777 == 0o700


def test_a_directory_that_is_not_a_venv_is_never_removed(fake, tmp_path: Path) -> None:
    """SLURM_GPU_VENV=/opt by mistake: the script ran `rm -rf "$VENV"` on it."""
    admins = tmp_path / "opt"
    (admins / "theirs").mkdir(parents=True)
    (admins / "theirs" / "data").write_text("keep")
    res = _run(fake, SLURM_GPU_VENV=str(admins), SLURM_GPU_SKIP_VENV="")
    assert res.returncode == 1
    assert res.stderr.strip() == (f"slurm-gpu: {admins} exists and is not a venv; "
                                  "not replacing it (SLURM_GPU_VENV)")
    assert (admins / "theirs" / "data").read_text() == "keep"
    assert not fake["log"].exists()      # refused before apt-get ran
