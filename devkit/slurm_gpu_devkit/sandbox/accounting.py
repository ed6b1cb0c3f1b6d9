"""Accounting for a sandbox: a private MariaDB and a real slurmdbd.

``sandbox up --accounting`` gives the sandbox Slurm's own job database, so
``sacct`` and ``sacctmgr`` work as on a real cluster.  Everything lives under
the sandbox directory and nothing of the host's is touched:

* MariaDB (Debian's ``mariadb-server``): a fresh data directory
  ``DIR/mysql/data`` made by ``mariadb-install-db`` at each ``up``, one
  ``mariadbd`` running as root (``--user=root``) with its own socket, pid
  file and log under ``DIR/mysql/``, listening on ``127.0.0.1`` at a reserved
  port.  ``--no-defaults`` keeps the host's ``/etc/mysql`` out of it, so the
  system's MariaDB service (which the package installs but policy-rc.d keeps
  stopped) is never used.  slurmdbd connects over TCP because its MySQL
  plugin passes no socket path (it would reach the system's default socket).
* slurmdbd (Debian's ``slurmdbd``): ``DIR/etc/slurmdbd.conf`` (0600, as
  slurmdbd demands), found through ``SLURM_CONF``'s directory, using the
  sandbox's munge socket and a database user made for it with a random
  password.
* The cluster is registered with ``sacctmgr -i add cluster`` before
  slurmctld starts (slurmctld then registers its address at once).

The database is fresh at every ``up``, like slurmctld's state: job ids start
at 1 again, and ``sacct -j 1`` must not find an earlier run's job 1.
"""
from __future__ import annotations

import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.runner import run
from .layout import Layout

# MariaDB is always the host's: slurmdbd only speaks SQL to it over TCP on
# 127.0.0.1, which a chrooted slurmdbd reaches unchanged (the root shares the
# host's network; only its mount namespace is private), and the MySQL
# protocol does not depend on Slurm's release.
DB_BINARIES = ("/usr/bin/mariadb-install-db", "/usr/sbin/mariadbd", "/usr/bin/mariadb")
# slurmdbd and its clients must be the sandbox's Slurm's: slurmdbd must be at
# least slurmctld's release, and serves daemons and clients only a few
# releases back (SchedMD's RELEASE_NOTES: the 25.05 one, 23.11 and later),
# never 22.05 for 24.11 or 26.05.  From the Debian root for those.
SLURM_BINARIES = ("/usr/sbin/slurmdbd", "/usr/bin/sacctmgr", "/usr/bin/sacct")
BINARIES = DB_BINARIES + SLURM_BINARIES
DB_NAME = "slurm_acct_db"
DB_USER = "slurm"
ACCOUNT = "sandbox"
# A throw-away database: small InnoDB files (the defaults make 100+ MB) and
# no fsync per commit, so the whole instance starts in about a second.
MARIADB_OPTS = ("--innodb-log-file-size=4M", "--innodb-buffer-pool-size=16M",
                "--innodb-data-file-path=ibdata1:4M:autoextend", "--skip-name-resolve")
MARIADB_RUN_OPTS = ("--innodb-flush-log-at-trx-commit=0", "--skip-log-bin",
                    "--max-connections=50")


@dataclass(frozen=True)
class Paths:
    """Where one sandbox's database lives."""

    root: Path

    @classmethod
    def of(cls, layout: Layout) -> "Paths":
        return cls(layout.root / "mysql")

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def socket(self) -> Path:
        return self.root / "mysqld.sock"

    @property
    def pid_file(self) -> Path:
        return self.root / "mysqld.pid"

    @property
    def log(self) -> Path:
        return self.root / "mysqld.err"


def require(root: Path | None = None, suite: str | None = None) -> None:
    """Refuse with the install line when MariaDB or slurmdbd is missing.

    *root*: the Debian root whose Slurm the sandbox runs (None: the host's).
    """
    missing = [b for b in DB_BINARIES if not os.access(b, os.X_OK)]
    if missing:
        raise SlurmGpuError("accounting needs MariaDB (apt-get install mariadb-server)", missing[0])
    if root is None:
        missing = [b for b in SLURM_BINARIES if not os.access(b, os.X_OK)]
        if missing:
            raise SlurmGpuError("accounting needs slurmdbd (apt-get install slurmdbd)", missing[0])
        return
    from .chroot import in_root
    missing = [b for b in SLURM_BINARIES if not os.access(in_root(root, b), os.X_OK)]
    if missing:
        raise SlurmGpuError(f"the {suite or root.name} root has no {os.path.basename(missing[0])}: "
                            f"complete it with scripts/debian-root.sh {suite or 'SUITE'}",
                            str(in_root(root, missing[0])))


def slurm_settings(layout: Layout, dbd_port: int) -> list[tuple[str, str]]:
    """slurm.conf lines that send jobs to the sandbox's slurmdbd.

    Connections to slurmdbd do not use ``AuthInfo``: with munge,
    ``AccountingStoragePass`` names the munge socket they use (Slurm's
    "alternate munge daemon" for accounting), here the sandbox's own.

    AdminComment needs no AccountingStoreFlags: slurmctld sends it with
    every job record (``job_comment`` is for the user's ``Comment``).
    ``JobAcctGatherType`` stays ``none``: the project's own sampler
    (``slurm-gpu monitor``) measures the GPUs.
    """
    return [("AccountingStorageType", "accounting_storage/slurmdbd"),
            ("AccountingStorageHost", "127.0.0.1"),
            ("AccountingStoragePort", str(dbd_port)),
            ("AccountingStoragePass", str(layout.munge_socket)),
            ("AccountingStoreFlags", "job_comment"),
            # GPUs in AllocTRES, which `report usage` counts as allocated GPU-hours.
            ("AccountingStorageTRES", "gres/gpu"),
            ("JobCompType", "jobcomp/none")]


def slurmdbd_conf(layout: Layout, dbd_port: int, db_port: int, password: str) -> str:
    """slurmdbd.conf for the sandbox (holds the database password: written 0600)."""
    host = os.uname().nodename.split(".")[0]
    lines = [
        "# generated by slurm-gpu sandbox up --accounting",
        "AuthType=auth/munge",
        f"AuthInfo=socket={layout.munge_socket}",
        f"DbdHost={host}",
        "DbdAddr=127.0.0.1",
        f"DbdPort={dbd_port}",
        "SlurmUser=root",
        "DebugLevel=info",
        f"LogFile={layout.log}/slurmdbd.log",
        f"PidFile={layout.run}/slurmdbd.pid",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        f"StoragePort={db_port}",
        f"StorageUser={DB_USER}",
        f"StoragePass={password}",
        f"StorageLoc={DB_NAME}",
    ]
    return "\n".join(lines) + "\n"


def init_db(paths: Paths, timeout: float = 60.0) -> None:
    """A fresh MariaDB data directory (an earlier run's is removed first)."""
    shutil.rmtree(paths.data, ignore_errors=True)
    paths.root.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.root, 0o700)
    paths.data.mkdir()
    res = run(["/usr/bin/mariadb-install-db", "--no-defaults", f"--datadir={paths.data}",
               "--user=root", "--auth-root-authentication-method=socket", "--skip-test-db",
               # --force: go on where neither the host name nor 'localhost'
               # resolves (a fresh debootstrap root has no /etc/hosts); the
               # sandbox reaches the server by socket and 127.0.0.1 only.
               "--force", *MARIADB_OPTS], timeout, check=False, cwd=str(paths.root))
    if res.returncode != 0:
        tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
        raise SlurmGpuError(f"sandbox: mariadb-install-db failed: {tail}", str(paths.data))


def mariadbd_argv(paths: Paths, port: int) -> list[str]:
    return ["/usr/sbin/mariadbd", "--no-defaults", f"--datadir={paths.data}", "--user=root",
            f"--socket={paths.socket}", f"--port={port}", "--bind-address=127.0.0.1",
            f"--pid-file={paths.pid_file}", f"--log-error={paths.log}",
            *MARIADB_OPTS, *MARIADB_RUN_OPTS]


def sql(paths: Paths, statement: str, timeout: float = 20.0) -> str:
    """Run *statement* as MariaDB's root over the private socket; its output."""
    res = run(["/usr/bin/mariadb", "--no-defaults", f"--socket={paths.socket}", "-u", "root",
               "-N", "-B", "-e", statement], timeout, check=False)
    if res.returncode != 0:
        raise SlurmGpuError(f"sandbox: MariaDB refused SQL: {res.stderr.strip()}", str(paths.socket))
    return res.stdout


def wait_ready(paths: Paths, timeout: float, dead: Callable[[], str | None]) -> None:
    """Wait until mariadbd answers on its socket."""
    from .waiting import tail
    t0 = time.monotonic()
    while True:
        if paths.socket.exists():
            res = run(["/usr/bin/mariadb", "--no-defaults", f"--socket={paths.socket}", "-u",
                       "root", "-e", "SELECT 1"], 5, check=False)
            if res.returncode == 0:
                return
        if dead() is not None or time.monotonic() - t0 > timeout:
            raise SlurmGpuError(f"sandbox: mariadbd did not start: {tail(paths.log)}",
                                str(paths.log))
        time.sleep(0.05)


def make_db_user(paths: Paths) -> str:
    """The database and slurmdbd's user (random password, TCP from 127.0.0.1 only)."""
    password = secrets.token_hex(16)
    sql(paths, f"CREATE DATABASE IF NOT EXISTS {DB_NAME}; "
               f"CREATE USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{password}'; "
               f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';")
    return password


def register(cluster: str, env: dict[str, str], users: list[str], timeout: float = 30.0) -> None:
    """Add the cluster, an account and *users* to the database (idempotent).

    Jobs are recorded without associations (the sandbox sets no
    AccountingStorageEnforce), but users with an association show their
    account in ``sacct``, as on a real cluster.
    """
    steps = [["sacctmgr", "-i", "add", "cluster", cluster],
             ["sacctmgr", "-i", "add", "account", ACCOUNT, f"cluster={cluster}",
              "description=slurm-gpu sandbox", "organization=slurm-gpu"]]
    if users:
        steps.append(["sacctmgr", "-i", "add", "user", ",".join(users),
                      f"account={ACCOUNT}", f"cluster={cluster}"])
    for argv in steps:
        deadline = time.monotonic() + timeout
        while True:
            res = run(argv, 20, env=env, check=False)
            out = (res.stdout + res.stderr).lower()
            if res.returncode == 0 or "already exists" in out or "nothing new added" in out:
                break
            if time.monotonic() > deadline:
                raise SlurmGpuError(f"sandbox: {' '.join(argv[:4])} failed: "
                                    f"{(res.stderr or res.stdout).strip()}", "slurmdbd")
            time.sleep(0.2)


def existing_users(names: list[str]) -> list[str]:
    """Those of *names* that exist on this host (root always does)."""
    import pwd
    out = []
    for n in names:
        try:
            pwd.getpwnam(n)
            out.append(n)
        except KeyError:
            continue
    return out
