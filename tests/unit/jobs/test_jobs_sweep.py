"""Nothing left behind decides later jobs: a failed epilog's state is swept once its job is gone.

Slurm's answer comes from a stand-in ``squeue`` (a script beside the
configured ``scancel``) that prints what the test says slurmctld knows.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_gpu.jobs import lifecycle, sweep
from slurm_gpu.jobs import state as js
from slurm_gpu.mig import instances

from test_jobs_lifecycle import Env  # noqa: E402 - the same simulated node


@pytest.fixture()
def node():
    n = Env()
    yield n
    n.close()


def _squeue(node: Env, stdout: str = "", stderr: str = "", rc: int = 0) -> Path:
    """Make ``squeue`` answer like slurmctld; returns the file it logs its argv to."""
    d = node.base / "bin"
    d.mkdir(exist_ok=True)
    log = d / "argv"
    (d / "squeue").write_text("#!/bin/sh\n"
                              f"echo \"$@\" >> {log}\n"
                              f"printf '%s' '{stdout}'\n"
                              f"printf '%s' '{stderr}' >&2\n"
                              f"exit {rc}\n")
    (d / "squeue").chmod(0o755)
    node.jobs.scancel = str(d / "scancel")
    return log


def _ctx(node: Env, jobid: str, **env: str) -> lifecycle.Context:
    c = node.ctx(SLURM_JOB_ID=jobid, **env)
    c.node_name = "n1"
    return c


def _fail_epilog(node: Env, jobid: str, monkeypatch) -> None:
    """Job *jobid*'s epilog cannot destroy its MIG instances: its state stays."""
    def stuck(api, dev, gid, where):
        raise instances.MigError("cannot destroy GPU instance: In use by another client", where, 19)
    with monkeypatch.context() as m:
        m.setattr(instances, "destroy_gi", stuck)
        node.mig.check_blockers = False
        assert lifecycle.epilog(_ctx(node, jobid, SLURM_JOB_GPUS="2")) == 1
    assert js.load(node.state_dir, jobid) is not None


def test_failed_epilog_never_makes_a_later_job_a_user_error(node: Env, monkeypatch) -> None:
    before = node.layout(2)
    assert lifecycle.prolog(_ctx(node, "100", SLURM_JOB_GPUS="2",
                                 SPANK_SLURM_GPU_MIG="3g.40gb")) == 0, node.logs
    _fail_epilog(node, "100", monkeypatch)
    # Job 100 is over (purged from slurmctld); job 101 gets the same GPU.
    argv = _squeue(node, stderr="slurm_load_jobs error: Invalid job id specified", rc=1)
    assert lifecycle.prolog(_ctx(node, "101", SLURM_JOB_GPUS="2",
                                 SPANK_SLURM_GPU_MIG="3g.40gb")) == 0, node.logs
    st = js.load(node.state_dir, "101")
    assert st.error is None, st.error           # not "also used by job 100"
    assert js.load(node.state_dir, "100") is None
    assert "-j 100" in argv.read_text()
    assert any("stale job 100: cleaned up" in line for line in node.logs)
    assert lifecycle.epilog(_ctx(node, "101", SLURM_JOB_GPUS="2")) == 0
    assert node.layout(2) == before                   # job 100's baseline came back, not its layout
    assert node.leftovers("100") == [] and node.leftovers("101") == []


def test_a_job_slurm_still_runs_here_is_never_swept(node: Env) -> None:
    assert lifecycle.prolog(_ctx(node, "100", SLURM_JOB_GPUS="1",
                                 SPANK_SLURM_GPU_MPS="default")) == 0, node.logs
    for answer in ("100|RUNNING|n1\n", "100|COMPLETING|n[1-2]\n", "100|SUSPENDED|n1\n"):
        _squeue(node, stdout=answer)
        assert sweep.sweep(_ctx(node, "101"), lifecycle.teardown, exclude="101") == []
        assert js.load(node.state_dir, "100") is not None
    # slurmctld unreachable: unsure, so nothing is touched
    _squeue(node, stderr="slurm_load_jobs error: Unable to contact slurm controller", rc=1)
    assert sweep.sweep(_ctx(node, "101"), lifecycle.teardown, exclude="101") == []
    assert node.leftovers("100") != []
    # finished, or requeued onto other nodes: swept
    _squeue(node, stdout="100|PENDING|n7\n")
    assert sweep.gone(["100"], "n1", node.jobs.scancel.replace("scancel", "squeue")) == {"100"}
    _squeue(node, stdout="100|COMPLETED|n1\n")
    lines = sweep.sweep(_ctx(node, "101"), lifecycle.teardown, exclude="101")
    assert lines and lines[-1].endswith("cleaned up") and node.leftovers("100") == []


def test_parse_squeue() -> None:
    text = "7|RUNNING|gpu[01-04]\n8|COMPLETED|gpu02\n9|COMPLETING|gpu02\n10_3|RUNNING|gpu09\nbad\n"
    assert sweep.parse_squeue(text, "gpu02") == {"7": True, "8": False, "9": True, "10_3": False}


def test_job_cleanup_cli(node: Env, monkeypatch, capsys) -> None:
    from slurm_gpu.cli import main
    assert lifecycle.prolog(_ctx(node, "100", SLURM_JOB_GPUS="1",
                                 SPANK_SLURM_GPU_MPS="default")) == 0, node.logs
    monkeypatch.setattr(lifecycle, "default_context", lambda env=None: _ctx(node, "100"))
    _squeue(node, stdout="100|RUNNING|n1\n")
    assert main(["job", "cleanup", "100"]) == 1
    assert "still runs on n1" in capsys.readouterr().err
    assert node.leftovers("100") != []
    assert main(["job", "cleanup", "100", "--force"]) == 0
    assert "cleaned up" in capsys.readouterr().out
    assert node.leftovers("100") == []
    assert main(["job", "cleanup"]) == 2
    capsys.readouterr()
    # a malformed JOBID is a usage error, as in `job report` and `job show`
    for argv in (["job", "cleanup", "12abc"], ["job", "cleanup", "../100"], ["job", "show", "12abc"]):
        assert main(argv) == 2, argv
        assert "bad job id" in capsys.readouterr().err
    assert main(["job", "cleanup", "--stale"]) == 0
    assert "no stale job state" in capsys.readouterr().out
    assert os.path.isdir(node.state_dir)


def test_the_health_run_sweeps_too(node: Env, monkeypatch, capsys) -> None:
    """A node no new MPS/MIG job comes to is cleaned by its HealthCheckProgram run."""
    from types import SimpleNamespace

    from slurm_gpu.commands import health
    from slurm_gpu.hw import live
    assert lifecycle.prolog(_ctx(node, "100", SLURM_JOB_GPUS="2",
                                 SPANK_SLURM_GPU_MIG="3g.40gb")) == 0, node.logs
    _fail_epilog(node, "100", monkeypatch)
    _squeue(node, stdout="100|COMPLETED|n1\n")
    monkeypatch.setattr(live, "settings", lambda: SimpleNamespace(state_dir=node.state_dir))
    monkeypatch.setattr(lifecycle, "default_context", lambda env=None: _ctx(node, "1"))
    health._sweep_stale_jobs()
    assert "stale job 100: cleaned up" in capsys.readouterr().err
    assert node.leftovers("100") == []


def _squeue_like_slurm(node: Env, jobs: list[tuple[str, str, str, str]]) -> None:
    """A ``squeue`` that formats like slurmctld's: per job (%A, %i, %T, %N); %i of an
    array element is ``<array job>_<task>``, %A its own job id (squeue(1))."""
    d = node.base / "bin"
    d.mkdir(exist_ok=True)
    lines = "".join(f"{a} {i} {t} {n}\n" for a, i, t, n in jobs)
    (d / "squeue").write_text(
        "#!/bin/sh\n"
        'fmt=""; while [ $# -gt 0 ]; do [ "$1" = -o ] && fmt="$2"; shift; done\n'
        f"printf '%s' '{lines}' | while read -r A i T N; do\n"
        '  out="$fmt"; out=$(printf "%s" "$out" | sed "s/%A/$A/g; s/%i/$i/g; s/%T/$T/g; s/%N/$N/g")\n'
        '  printf "%s\\n" "$out"\n'
        "done\n")
    (d / "squeue").chmod(0o755)
    node.jobs.scancel = str(d / "scancel")


def test_a_running_array_task_is_never_swept(node: Env, monkeypatch, capsys) -> None:
    """Job 12 is task 3 of array 10, running here: its %i is 10_3, never 12."""
    from slurm_gpu.cli import main
    assert lifecycle.prolog(_ctx(node, "12", SLURM_JOB_GPUS="1",
                                 SPANK_SLURM_GPU_MPS="default")) == 0, node.logs
    _squeue_like_slurm(node, [("12", "10_3", "RUNNING", "n1")])
    assert sweep.sweep(_ctx(node, "13"), lifecycle.teardown, exclude="13") == []
    assert js.load(node.state_dir, "12") is not None and node.leftovers("12") != []
    monkeypatch.setattr(lifecycle, "default_context", lambda env=None: _ctx(node, "12"))
    assert main(["job", "cleanup", "12"]) == 1
    assert "still runs on n1" in capsys.readouterr().err
    assert node.leftovers("12") != []
    _squeue_like_slurm(node, [("12", "10_3", "COMPLETED", "n1")])
    lines = sweep.sweep(_ctx(node, "13"), lifecycle.teardown, exclude="13")
    assert lines and lines[-1].endswith("cleaned up") and node.leftovers("12") == []
