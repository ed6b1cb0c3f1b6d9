"""Integration tests run real Slurm daemons started by the project's sandbox.

* Every test in ``tests/integration/`` is marked ``integration``.  Without
  root or without Debian's Slurm/munge the whole directory is skipped with
  the reason; with ``SLURM_GPU_REQUIRE_INTEGRATION=1`` (``scripts/test.sh``
  sets it) a missing prerequisite is an error instead, so CI cannot pass by
  skipping.
* ``make_sandbox(...)`` (module scope) starts a sandbox in a fresh directory
  and always stops it at the end of the module.  It returns a
  :class:`Cluster`: the :class:`~slurm_gpu_devkit.sandbox.Sandbox` plus helpers that
  run Slurm commands (as root or as a job user) and wait for jobs by polling
  ``scontrol`` every 0.1 s (never ``sbatch --wait``, which polls in seconds).
* ``job_users`` (session scope) makes sure ``sgtest1`` and ``sgtest2`` exist.

Sandbox directories live under ``/tmp/slurm-gpu-tests`` (mode 0755), not
pytest's ``tmp_path``: job users must reach slurm.conf and the munge socket,
and pytest's base directory is private to root.  Set
``SLURM_GPU_KEEP_SANDBOX=1`` to keep them for a post-mortem.
"""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

import pytest

from sandboxlib import (CREATED_DIRS, DEFAULT_MACHINE, HERE, JOB_USERS, TEST_SLURM, Cluster, _missing_prerequisite,
                        ensure_user, leftover_processes, mps_mig_node_files, new_sandbox_dir,
                        process_ticks_now, slurm_gpu_cli)


@pytest.hookimpl(tryfirst=True)  # before `-m integration` filters on the marker added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _missing_prerequisite()
    for item in items:
        if HERE not in Path(str(item.fspath)).resolve().parents:
            continue
        item.add_marker(pytest.mark.integration)
        if reason is None:
            continue
        if os.environ.get("SLURM_GPU_REQUIRE_INTEGRATION") == "1":
            item.user_properties.append(("missing", reason))  # fails in setup, below
        else:
            item.add_marker(pytest.mark.skip(reason=reason))

def pytest_runtest_setup(item: pytest.Item) -> None:
    for key, value in item.user_properties:
        if key == "missing":
            pytest.fail(f"SLURM_GPU_REQUIRE_INTEGRATION=1 but {value}", pytrace=False)

@pytest.fixture(scope="session", autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """After the last integration test, no process of ours may be left:
    daemons, slurmstepd, MPS daemons or job tasks of any sandbox or Debian
    root this run started.  Leftovers fail the run and are then killed."""
    since = process_ticks_now()
    yield
    left: list[str] = []
    for _ in range(30):            # a stopping daemon may take a moment to exit
        left = leftover_processes(since, CREATED_DIRS)
        if not left:
            return
        time.sleep(0.2)
    for entry in left:
        try:
            os.kill(int(entry.split()[1]), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    pytest.fail("processes left running after the integration tests:\n  " + "\n  ".join(left))


@pytest.fixture(scope="module")
def node_files(request: pytest.FixtureRequest) -> Iterator[dict[str, Path]]:
    """Simulator state (MIG on, no instances) and NVIDIA's MPS control daemon for
    the test module's ``MACHINE`` (see ``sandboxlib.mps_mig_node_files``)."""
    files = mps_mig_node_files(request.module.__name__.rsplit(".", 1)[-1], request.module.MACHINE)
    yield files
    shutil.rmtree(files["dir"], ignore_errors=True)


@pytest.fixture(scope="session")
def job_users() -> dict[str, pwd.struct_passwd]:
    """``sgtest1`` and ``sgtest2``, created with useradd when missing."""
    return {name: ensure_user(name) for name in JOB_USERS}

@pytest.fixture(scope="module")
def make_sandbox(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Factory: ``make_sandbox(nodes=2, machine=..., spank=..., prolog=..., health=...,
    extra_config={...}, **more SandboxOptions)`` -> :class:`Cluster`.

    Every sandbox made is stopped when the module ends, even when a test or
    the start-up failed.
    """
    from slurm_gpu_devkit.sandbox import Sandbox, SandboxOptions

    made: list[Any] = []
    tag = request.module.__name__.rsplit(".", 1)[-1]

    def make(nodes: int = 1, machine: str | os.PathLike[str] | None = None, *,
             spank: bool = False, prolog: bool = False, health: bool = False,
             extra_config: Mapping[str, Mapping[str, Any]] | None = None, **kw: Any) -> Cluster:
        kw.setdefault("slurm", TEST_SLURM)
        opts = SandboxOptions(nodes=nodes, machine=machine or (None if kw.get("model") else DEFAULT_MACHINE),
                              spank=spank, prolog=prolog, health=health,
                              extra_config=dict(extra_config or {}), **kw)
        sb = Sandbox(new_sandbox_dir(tag), opts)
        made.append(sb)
        sb.up()
        return Cluster(sb)

    yield make
    for sb in made:
        try:
            sb.down()
        finally:
            if os.environ.get("SLURM_GPU_KEEP_SANDBOX") != "1":
                shutil.rmtree(sb.dir, ignore_errors=True)

@pytest.fixture(scope="session")
def sandbox_dir() -> Iterator[Any]:
    """``sandbox_dir(tag)`` -> a fresh directory job users can reach.

    At the end of the session, whatever sandbox is recorded there is stopped
    and the directory removed (kept with ``SLURM_GPU_KEEP_SANDBOX=1``).
    Session scope, so module fixtures can use it too.
    """
    from slurm_gpu_devkit.sandbox import Sandbox

    made: list[Path] = []

    def make(tag: str) -> Path:
        d = new_sandbox_dir(tag)
        made.append(d)
        return d

    yield make
    for d in made:
        try:
            if (d / "run" / "sandbox.json").exists():
                Sandbox.attach(d).down()
        finally:
            if os.environ.get("SLURM_GPU_KEEP_SANDBOX") != "1":
                shutil.rmtree(d, ignore_errors=True)

@pytest.fixture(scope="session")
def default_machine() -> str:
    """The machine integration tests model unless they name one."""
    return DEFAULT_MACHINE

@pytest.fixture(scope="session")
def cli() -> Any:
    """``cli("sandbox", "up", ...)`` runs this checkout's slurm-gpu."""
    return slurm_gpu_cli
