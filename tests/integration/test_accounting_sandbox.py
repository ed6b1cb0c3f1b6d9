"""`sandbox up --accounting`: a real slurmdbd over a private MariaDB, so sacct works."""
from __future__ import annotations

import os
import time

import pytest

from slurm_gpu_devkit.sandbox.accounting import BINARIES

pytestmark = pytest.mark.skipif(
    any(not os.access(b, os.X_OK) for b in BINARIES) and os.environ.get("SLURM_GPU_REQUIRE_INTEGRATION") != "1",
    reason="slurmdbd or mariadb-server not installed")


def sacct(c, jobid: int, fields: str) -> str:
    return c.run(["sacct", "-n", "-P", "-X", "-j", str(jobid), "-o", fields]).stdout.strip()


def wait_sacct(c, jobid: int, fields: str, pred, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        out = sacct(c, jobid, fields)
        if pred(out) or time.monotonic() > deadline:
            return out
        time.sleep(0.2)


@pytest.fixture(scope="module")
def acct_cluster(make_sandbox, job_users):
    return make_sandbox(1, accounting=True)


def test_sacct_records_a_finished_job_of_a_job_user(acct_cluster):
    c = acct_cluster
    jid = c.sbatch("--gres=gpu:1", "--wrap", "true", user="sgtest1")
    c.wait_job(jid)
    out = wait_sacct(c, jid, "User,State,AllocTRES", lambda o: "COMPLETED" in o)
    user, state, tres = out.split("|")
    assert (user, state) == ("sgtest1", "COMPLETED")
    assert "gres/gpu=1" in tres


def test_cluster_and_daemons_are_the_sandboxs_own(acct_cluster):
    c = acct_cluster
    out = c.run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"]).stdout.split()
    assert out == [c.sb.layout.cluster_name]
    names = [d["name"] for d in c.sb.status()["daemons"] if d["alive"]]
    assert "mariadbd" in names and "slurmdbd" in names
    assert (c.dir / "mysql" / "mysqld.sock").is_socket()
    assert oct((c.dir / "etc" / "slurmdbd.conf").stat().st_mode & 0o777) == "0o600"


def test_admin_comment_set_after_the_end_survives_through_sacctmgr(acct_cluster):
    """The path the epilog uses: scontrol refuses a finished job; sacctmgr does not."""
    c = acct_cluster
    jid = c.sbatch("--wrap", "true")
    c.wait_job(jid)
    wait_sacct(c, jid, "State", lambda o: o == "COMPLETED")
    res = c.run(["scontrol", "update", f"jobid={jid}", "AdminComment=late"])
    assert res.returncode != 0 and "already finished" in (res.stderr + res.stdout)
    res = c.run(["sacctmgr", "-i", "modify", "job", "where", f"jobid={jid}", "set",
                 "AdminComment=x:{`a`:1}"])
    assert res.returncode == 0, res.stderr
    assert sacct(c, jid, "AdminComment") == "x:{`a`:1}"


def test_down_stops_mariadb_and_slurmdbd(make_sandbox, job_users):
    c = make_sandbox(1, accounting=True)
    pids = {d["name"]: d["pid"] for d in c.sb.status()["daemons"]}
    c.sb.down()
    for name in ("mariadbd", "slurmdbd"):
        try:
            with open(f"/proc/{pids[name]}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        assert state in ("Z", "X"), f"{name} still running"


def test_database_initialises_where_no_host_name_resolves(tmp_path) -> None:
    """A fresh CI root (debootstrap) has no /etc/hosts: mariadb-install-db
    refused to run there ("Neither host ... nor 'localhost' could be looked
    up"), so every accounting test failed in CI.  Only local sockets are used,
    so name resolution must not matter."""
    import subprocess
    import sys

    from sandboxlib import REPO
    empty = tmp_path / "hosts"
    empty.write_text("")
    nss = tmp_path / "nsswitch.conf"
    nss.write_text("hosts: files\n")
    code = ("import sys; from pathlib import Path; from slurm_gpu_devkit.sandbox import accounting as a;"
            f"a.init_db(a.Paths(Path({str(tmp_path / 'db')!r})))")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        # Where there is no /etc/hosts (CI's root) nothing to hide.
                        '{ [ ! -e /etc/hosts ] || mount --bind "$1" /etc/hosts; } && '
                        '{ [ ! -e /etc/nsswitch.conf ] || mount --bind "$2" /etc/nsswitch.conf; } && '
                        'exec "$3" -c "$4"',
                        "_", str(empty), str(nss), sys.executable, code],
                       capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert r.returncode == 0, r.stderr[-1500:]
    assert (tmp_path / "db" / "data" / "mysql").is_dir()
