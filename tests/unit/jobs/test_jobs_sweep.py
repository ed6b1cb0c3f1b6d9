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


def test_candidates_are_state_files_and_mps_dirs_but_the_callers_job(tmp_path: Path) -> None:
    from types import SimpleNamespace
    ctx = SimpleNamespace(state_dir=str(tmp_path / "state"),
                          mps=SimpleNamespace(base_dir=str(tmp_path / "mps")))
    for jobid in ("5", "7"):
        js.save(ctx.state_dir, js.new(jobid, uid=1000, gid=1000, user="u"))
    assert sweep.candidates(ctx) == ["5", "7"]                  # no MPS base directory yet
    for name in ("7", "10", "x"):
        (tmp_path / "mps" / name).mkdir(parents=True)
    assert sweep.candidates(ctx) == ["5", "7", "10"]
    assert sweep.candidates(ctx, exclude="7") == ["5", "10"]
    assert sweep.candidates(ctx, exclude="10") == ["5", "7"]


def test_gone_asks_squeue_once_and_is_unsure_on_any_other_failure() -> None:
    from slurm_gpu.errors import CommandError
    from slurm_gpu.runner import Completed
    calls: list[tuple] = []

    def answer(rc: int, out: str, err: str = ""):
        def run(argv, timeout, check=True):
            calls.append((tuple(argv), timeout, check))
            return Completed(tuple(argv), rc, out, err)
        return run
    run = answer(0, "9|RUNNING|n1\n10|COMPLETED|n1\n")
    assert sweep.gone(["10", "9", "100", "9"], "n1", "/sq", run) == {"10", "100"}
    assert calls == [(("/sq", "-h", "-t", "all", "-j", "9,10,100", "-o", "%A|%T|%N"), 10, False)]
    calls.clear()
    assert sweep.gone([], "n1", "/sq", run) == set() and calls == []
    invalid = "slurm_load_jobs error: Invalid job id specified"
    assert sweep.gone(["9", "10"], "n1", "/sq", answer(1, "", invalid)) == {"9", "10"}
    assert sweep.gone(["9"], "n1", "/sq", answer(1, "9|RUNNING|n1\n", invalid)) == set()
    assert sweep.gone(["9"], "n1", "/sq", answer(1, "", "Unable to contact slurm controller")) == set()

    def unreachable(argv, timeout, check=True):
        raise CommandError("squeue timed out", "/sq")
    assert sweep.gone(["9"], "n1", "/sq", unreachable) == set()


def test_parse_squeue_skips_only_what_it_cannot_read() -> None:
    """A line it cannot read is skipped, never the rest; a job with no state or
    no node list yet (pending: ``(null)``) still runs somewhere."""
    text = ("11|RUNNING\n"                 # two fields
            "x1|COMPLETED|gpu02\n"         # not a job id
            "12||gpu02\n"
            "13|PENDING|(null)\n"
            "14|PENDING|\n"
            "15|CANCELLED by 0|gpu02\n"
            "16|RUNNING|gpu[01,03]\n"
            "17|RUNNING|gpu[1-\n")             # a node list it cannot expand: still here
    assert sweep.parse_squeue(text, "gpu02") == {"12": True, "13": True, "14": True, "15": False,
                                                 "16": False, "17": True}


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
    """A node no new MPS/MIG job comes to is cleaned by its HealthCheckProgram run
    (``slurm-gpu health --slurm``: a clean run, here of the kernel log alone)."""
    import re

    from paths import ROOT
    from slurm_gpu import config, hostctx, runner
    from slurm_gpu.cli import main
    assert lifecycle.prolog(_ctx(node, "100", SLURM_JOB_GPUS="2",
                                 SPANK_SLURM_GPU_MIG="3g.40gb")) == 0, node.logs
    _fail_epilog(node, "100", monkeypatch)
    _squeue(node, stdout="100|COMPLETED|n1\n")
    cfg = node.base / "slurm-gpu.toml"
    cfg.write_text(f'[node]\nstate_dir = "{node.state_dir}"\n[health]\nstate_dir = "{node.base}/health"\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(lifecycle, "default_context", lambda env=None: _ctx(node, "1"))
    # slurmctld's answer about this node: an idle one (real 24.11 output); squeue stays the stand-in
    shown = re.sub(r"^NodeName=\S+", f"NodeName={hostctx.node_name}",
                   (ROOT / "tests" / "data" / "slurm" / "show-node-24.11.txt").read_text())
    real_run = runner.run

    def run(argv, timeout, **kw):
        if list(argv)[1:3] == ["show", "node"]:
            return runner.Completed(tuple(argv), 0, shown, "")
        return real_run(argv, timeout, **kw)
    monkeypatch.setattr(runner, "run", run)
    (node.base / "kern.log").write_text("")
    config.clear_cache()
    try:
        assert main(["health", "--slurm", "--only", "gpu.xid", "--kernel-log", str(node.base / "kern.log")]) == 0
    finally:
        config.clear_cache()
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


# -- clean() and sweep() with a stand-in teardown (no GPU, no daemon) ---------

def _bare_ctx(tmp_path: Path, squeue_out: str = "", node_name: str = "n1"):
    """A context with a state directory, an MPS base and a ``squeue`` that prints *squeue_out*."""
    from types import SimpleNamespace
    d = tmp_path / "bin"
    d.mkdir()
    (d / "squeue").write_text(f"#!/bin/sh\necho \"$@\" >> {d}/argv\nprintf '%s' '{squeue_out}'\n")
    (d / "squeue").chmod(0o755)
    return SimpleNamespace(state_dir=str(tmp_path / "state"), node_name=node_name,
                           mps=SimpleNamespace(base_dir=str(tmp_path / "mps")),
                           jobs=SimpleNamespace(scancel=str(d / "scancel")))


def _teardown(seen: list, fail: dict | None = None):
    def teardown(ctx, st):
        seen.append((st.jobid, st.uid))
        if fail and st.jobid in fail:
            raise fail[st.jobid]
        return [f"undone {st.jobid}"]
    return teardown


def test_clean_works_from_the_record_or_a_stand_in_for_an_mps_dir(tmp_path: Path) -> None:
    ctx = _bare_ctx(tmp_path)
    seen: list = []
    assert sweep.clean(ctx, "5", _teardown(seen)) == [] and seen == []   # nothing of job 5 here
    (tmp_path / "mps" / "5").mkdir(parents=True)
    (tmp_path / "mps" / "6").mkdir()
    assert sweep.clean(ctx, "5", _teardown(seen)) == ["undone 5", "cleaned up"]
    assert seen == [("5", None)]                                         # a stand-in: no user known
    js.save(ctx.state_dir, js.new("8", uid=1000, gid=1000, user="u"))
    assert sweep.clean(ctx, "8", _teardown(seen)) == ["undone 8", "cleaned up"]
    assert seen[-1] == ("8", 1000) and js.load(ctx.state_dir, "8") is None


def test_sweep_lines_in_job_order_and_failures_named(tmp_path: Path) -> None:
    from slurm_gpu.errors import HardwareError
    ctx = _bare_ctx(tmp_path)                           # squeue knows none of them: all gone
    for jobid in ("8", "9", "10", "11"):
        js.save(ctx.state_dir, js.new(jobid, uid=1000, gid=1000, user="u"))
    seen: list = []
    fail = {"10": HardwareError("cannot destroy GPU instance", "GPU 2"), "11": KeyError("mig")}
    assert sweep.sweep(ctx, _teardown(seen, fail), exclude="8") == [
        "slurm-gpu: stale job 9: undone 9", "slurm-gpu: stale job 9: cleaned up",
        "slurm-gpu: stale job 10: cleanup incomplete: cannot destroy GPU instance (GPU 2)",
        "slurm-gpu: stale job 11: cleanup incomplete: KeyError: 'mig'"]
    assert js.list_jobs(ctx.state_dir) == ["8", "10", "11"]   # the failed ones wait for the next sweep
    assert (tmp_path / "bin" / "argv").read_text() == "-h -t all -j 9,10,11 -o %A|%T|%N\n"


def test_sweep_without_a_node_name_asks_nobody(tmp_path: Path) -> None:
    ctx = _bare_ctx(tmp_path, node_name="")
    js.save(ctx.state_dir, js.new("9", uid=1000, gid=1000, user="u"))
    seen: list = []
    assert sweep.sweep(ctx, _teardown(seen)) == [] and seen == []
    assert not (tmp_path / "bin" / "argv").exists()
