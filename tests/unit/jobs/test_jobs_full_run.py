"""A job user who fills the filesystem of the job records fails jobs, never drains the node.

By default ``[node] state_dir`` (/run/slurm-gpu) and ``[mps] base_dir`` share
``/run``, a small tmpfs, and a ``--gpu-mps`` job's user owns
``<base>/<job>/pipe``: they can fill it.  Saving a job's record there then
fails that job (its record removed, so its steps fail in the SPANK plugin),
the prolog and the epilog exit 0, and nothing the prolog made is left.  A full
state filesystem that holds no MPS directories stays a node fault.

Real full filesystems (a tmpfs with 64 inodes, as root, detached whatever
happens) for the prolog and the epilog; the policy's corner cases through
the state file's one write call (``atomic_write``) failing with ENOSPC.
"""
from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
from test_jobs_lifecycle import Env

from slurm_gpu.errors import HardwareError
from slurm_gpu.fsutil import WriteError
from slurm_gpu.jobs import lifecycle, steps
from slurm_gpu.jobs import state as js
from slurm_gpu.jobs.settings import JobsSettings, MigSettings, MpsSettings
from slurm_gpu.jobs.state import JobFailed

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")


def _umount_below(d: Path) -> None:
    prefix = os.path.realpath(d).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as f:
        mounts = [ln.split()[4] for ln in f if ln.split()[4].startswith(prefix)]
    for m in reversed(mounts):
        subprocess.run(["umount", "-l", m], capture_output=True)


@pytest.fixture()
def node() -> Iterator[Env]:
    n = Env()
    try:
        yield n
    finally:
        _umount_below(n.base)
        n.close()


def _small_run(node: Env, mps_on_it: bool = True) -> Path:
    """/run as a tmpfs of 64 inodes holding the state dir (and the MPS base_dir)."""
    run = node.base / "run"
    run.mkdir(mode=0o755)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "nr_inodes=64,mode=0755", "sg-run", str(run)],
                   check=True)
    node.state_dir = str(run / "slurm-gpu")
    base = run / "mps" if mps_on_it else node.base / "mps"
    node.mps = MpsSettings(control=node.mps.control, base_dir=str(base),
                           start_timeout=5, quit_timeout=1)
    return run


def _fill(d: Path) -> None:
    """What the job user does through their pipe directory: every inode taken."""
    i = 0
    try:
        while True:
            (d / f"f{i}").write_text("")
            i += 1
    except OSError as e:
        assert e.errno == errno.ENOSPC


def _full_line(run: Path) -> str:
    return (f"slurm-gpu: the filesystem {run} of the job state and the MPS directories is full "
            "(No space left on device): the job's record cannot be written (job 100)")


def test_a_full_run_before_the_prolog_fails_the_job_and_cancels_it(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing can be recorded: exit 0, no record (the SPANK plugin fails every step:
    "no GPU state for job 100"), cancelled under user_error = "cancel"."""
    from slurm_gpu import runner
    calls: list[list[str]] = []
    monkeypatch.setattr(runner, "run", lambda argv, timeout, **kw: calls.append(list(argv)))
    run = _small_run(node)
    _fill(run)
    node.jobs.user_error = "cancel"
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    assert node.logs[0] == _full_line(run) + " [job 100: user error, job fails, node stays up]"
    assert js.load(node.state_dir, "100") is None
    assert calls == [["/usr/bin/scancel", "100"]]
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert node.leftovers() == []


@pytest.mark.parametrize("when,refilled", [("dirs", True), ("started", False), ("started", True)])
def test_filled_while_the_daemon_starts_the_prolog_undoes_it_and_the_job_fails(
        node: Env, monkeypatch: pytest.MonkeyPatch, when: str, refilled: bool) -> None:
    """The record was saved (phase prolog), then /run filled: right after the
    job's MPS directories were made (the daemon's record cannot be saved), or
    once the daemon started (the READY save fails).  What was made is undone.
    The daemon's directories freed inodes: the failure is recorded.  Filled
    again (another process of the user's): the record is removed, since one
    left in phase prolog without its error would let the job's steps run
    without MPS."""
    from slurm_gpu.jobs import mps
    run = _small_run(node)
    apply, undo, make_dirs = steps.MpsDaemon.apply, steps.MpsDaemon.undo, mps.make_dirs

    def then_fill(self: steps.MpsDaemon, job: steps.Job) -> None:
        apply(self, job)
        _fill(run)

    def made_then_fill(*a: Any) -> tuple[str, str]:
        out = make_dirs(*a)
        _fill(run)
        return out

    def undo_then_fill(self: steps.MpsDaemon, job: steps.Job) -> list[str]:
        notes = undo(self, job)
        _fill(run)
        return notes
    if when == "dirs":
        monkeypatch.setattr(mps, "make_dirs", made_then_fill)
    else:
        monkeypatch.setattr(steps.MpsDaemon, "apply", then_fill)
    if refilled:
        monkeypatch.setattr(steps.MpsDaemon, "undo", undo_then_fill)
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    assert node.logs[0] == _full_line(run) + " [job 100: user error, job fails, node stays up]"
    st = js.load(node.state_dir, "100")
    if refilled:
        assert st is None, node.logs
        assert "its failure is not recorded; its record is removed" in node.logs[-1], node.logs
    else:
        assert st is not None and st.phase == "failed" and st.consequence == "user", node.logs
        assert "the job's record cannot be written" in str(st.error)
    assert [x for x in node.leftovers() if x != "state file"] == []   # no daemon, no MPS dir
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert node.leftovers() == []


def test_the_epilog_on_a_full_run_cleans_up_and_stays_up(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """/run full while the epilog stops the daemon (a process of the user's fills
    what the daemon's directories freed): the record is not updated, the undo goes
    on, the record is removed, exit 0."""
    run = _small_run(node)
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    assert js.load(node.state_dir, "100").phase == "ready"
    undo = steps.MpsDaemon.undo

    def undo_then_fill(self: steps.MpsDaemon, job: steps.Job) -> list[str]:
        notes = undo(self, job)
        _fill(run)
        return notes
    monkeypatch.setattr(steps.MpsDaemon, "undo", undo_then_fill)
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert node.leftovers() == []


def test_filled_half_way_through_a_mig_layout_the_baseline_comes_back(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """/run filled once the job's first MIG instance is on record: the next
    instance cannot be recorded before it is made, so it is not made; the
    instance made is destroyed and the GPU's baseline recreated while the
    record cannot follow; the failure cannot be recorded: the record goes."""
    run = _small_run(node)
    node.mig.check_blockers = False
    before = node.layout(3)
    real = js.save

    def save_then_fill(state_dir: str, record: js.JobRecord) -> None:
        real(state_dir, record)
        if record.mig and any(i.get("uuid") for g in record.mig["gpus"] for i in g["instances"]):
            _fill(run)
    monkeypatch.setattr(js, "save", save_then_fill)
    ctx = node.ctx(SLURM_JOB_GPUS="3", SPANK_SLURM_GPU_MIG="4g.40gb,2g.20gb,1g.10gb")
    assert lifecycle.prolog(ctx) == 0, node.logs
    assert node.logs[0] == _full_line(run) + " [job 100: user error, job fails, node stays up]"
    assert js.load(node.state_dir, "100") is None, node.logs
    assert node.layout(3) == before
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert node.layout(3) == before


def test_a_full_state_filesystem_without_mps_dirs_stays_a_node_fault(node: Env) -> None:
    run = _small_run(node, mps_on_it=False)
    _fill(run)
    ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 1, node.logs
    assert "No space left on device" in node.logs[-1] and "node fault" in node.logs[-1]


# -- the policy when the record cannot be written (ENOSPC from its one write call) --

def _job(tmp_path: Path, logs: list[str], on_internal_error: str,
         user_error: str = "fail_tasks") -> tuple[steps.Job, steps.Policy, list[str]]:
    ctx = lifecycle.Context({"SLURM_JOB_ID": "5"}, JobsSettings(on_internal_error=on_internal_error,
                                                                user_error=user_error),
                            MpsSettings(base_dir=str(tmp_path / "mps")), MigSettings(),
                            str(tmp_path / "state"), lambda: None, log=logs.append)
    cancelled: list[str] = []
    job = steps.Job(ctx, js.new("5", uid=1000, gid=1000, user="u"), None, lambda: None)
    job.save()
    return job, steps.Policy(on_internal_error, user_error, cancelled.append), cancelled


class Fills(steps.Step):
    """Applies (its record saved), then the filesystem is full from here on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, undo_error: Exception | None = None) -> None:
        self.monkeypatch, self.undo_error = monkeypatch, undo_error

    def apply(self, job: steps.Job) -> None:
        job.save()

        def full(path: Any, *a: Any, **kw: Any) -> None:
            raise WriteError(f"cannot write {os.path.basename(path)}: No space left on device",
                             path, errno.ENOSPC)
        self.monkeypatch.setattr(js, "atomic_write", full)

    def undo(self, job: steps.Job) -> list[str]:
        if self.undo_error:
            raise self.undo_error
        return []


@pytest.mark.parametrize("user_error", ["fail_tasks", "cancel"])
def test_unrecordable_failure_after_a_saved_record_removes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user_error: str) -> None:
    logs: list[str] = []
    job, pol, cancelled = _job(tmp_path, logs, "drain", user_error)
    assert steps.run([Fills(monkeypatch)], job, pol) == 0
    assert js.load(job.ctx.state_dir, "5") is None     # never a record in phase prolog
    assert cancelled == (["5"] if user_error == "cancel" else [])
    assert "user error, job fails, node stays up" in logs[0]


@pytest.mark.parametrize("policy,rc,cancelled", [("drain", 1, []), ("pass", 0, ["5"])])
def test_unrecordable_failure_with_something_left_keeps_the_record_and_cancels(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str, rc: int,
        cancelled: list[str]) -> None:
    """The undo failed: the record (phase prolog) stays for the epilog, and the job,
    whose record cannot say it failed, is cancelled unless the node drains."""
    logs: list[str] = []
    job, pol, got = _job(tmp_path, logs, policy)
    ss = [Fills(monkeypatch, undo_error=HardwareError("GPU held", "GPU 1"))]
    assert steps.run(ss, job, pol) == rc
    st = js.load(job.ctx.state_dir, "5")
    assert st is not None and st.phase == "prolog"
    assert got == cancelled
    assert any("its failure is not recorded; its record stays for the epilog" in ln
               for ln in logs), logs


def test_a_job_failed_error_is_what_the_full_record_raises(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    job, _pol, _ = _job(tmp_path, [], "drain")
    Fills(monkeypatch).apply(job)
    with pytest.raises(JobFailed) as ei:
        job.save()
    assert ei.value.consequence == "user" and "record cannot be written" in ei.value.line()
