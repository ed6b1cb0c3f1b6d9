"""gpu.imex: IMEX readiness where slurm.conf sets SwitchType=switch/nvidia_imex."""
from __future__ import annotations


import os

import pytest

from slurm_gpu import runner
from slurm_gpu.health import engine, imex
from slurm_gpu.health.findings import INFO, WARN
from slurm_gpu.health.settings import HealthSettings
from paths import ROOT

DATA = ROOT / "tests" / "data" / "imex"


def test_parse_nvidia_sources_samples():
    up = imex.parse_status((DATA / "imex-ctl-N-j-up.json").read_text())
    assert (up.domain, up.nodes, up.error) == ("UP", {"0": "READY"}, None)
    deg = imex.parse_status((DATA / "imex-ctl-N-j-degraded.json").read_text())
    assert deg.domain == "DEGRADED" and deg.nodes == {"3": "READY", "1": "READY"}
    assert imex.parse_status("IMEX command service not enabled").error


def test_not_ready_is_info_without_jobs_warn_with_one():
    deg = imex.parse_status((DATA / "imex-ctl-N-j-degraded.json").read_text())
    (f,) = imex.check(511, deg, busy=False)
    assert f.severity == INFO and "IMEX domain is DEGRADED" in f.message and "no job here" in f.message
    (f,) = imex.check(511, deg, busy=True)
    assert f.severity == WARN
    (f,) = imex.check(None, imex.parse_status((DATA / "imex-ctl-N-j-up.json").read_text()), busy=True)
    assert f.severity == WARN and "nvidia-caps-imex-channels" in f.message
    (f,) = imex.check(511, imex.parse_status((DATA / "imex-ctl-N-j-up.json").read_text()), busy=True)
    assert f.severity == INFO and f.message.startswith("IMEX ready")


def test_only_with_the_imex_switch_plugin(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=c\n#SwitchType=switch/nvidia_imex\n")
    assert not imex.imex_configured(str(conf))
    assert imex.run_check(1.0, str(conf), str(tmp_path)) == []
    conf.write_text("ClusterName=c\nSwitchType=switch/nvidia_imex\nSwitchParameters=imex_channel_count=2048\n")
    assert imex.imex_configured(str(conf))
    assert not imex.imex_configured(str(tmp_path / "missing.conf"))


def test_engine_runs_it_from_the_node_root(tmp_path, monkeypatch):
    conf = tmp_path / "slurm.conf"
    conf.write_text("SwitchType=switch/nvidia_imex\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    (tmp_path / "proc" / "77").mkdir(parents=True)
    (tmp_path / "proc" / "devices").write_text("Character devices:\n511 nvidia-caps-imex-channels\n")
    (tmp_path / "proc" / "77" / "cmdline").write_bytes(b"slurmstepd: [1234.0]\x00")
    (tmp_path / "proc" / "77" / "status").write_text("Name:\tslurmstepd\nUid:\t0\t0\t0\t0\n")
    monkeypatch.setattr(imex.os, "access", lambda p, m: p.endswith("/usr/bin/nvidia-imex-ctl"))
    monkeypatch.setattr(runner, "run", lambda argv, timeout, **kw: runner.Completed(
        tuple(argv), 0, (DATA / "imex-ctl-N-j-degraded.json").read_text(), ""))
    r = engine.run(engine.Options(node="n1", settings=HealthSettings(), state_dir=str(tmp_path / "st"),
                                  only=["gpu.imex"], no_drain=True, os_root=str(tmp_path)))
    assert [(f.check, f.severity) for f in r.findings] == [("gpu.imex", WARN)] and r.status == "warn"


def test_per_job_imex_makes_the_node_wide_check_not_applicable(tmp_path, monkeypatch):
    conf = tmp_path / "slurm.conf"
    conf.write_text("SwitchType=switch/nvidia_imex\n")
    toml = tmp_path / "sg.toml"
    toml.write_text('[imex]\nmode = "per-job"\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(toml))
    from slurm_gpu import config
    config.clear_cache()
    monkeypatch.setattr(runner, "run", lambda *a, **kw: pytest.fail("no node-wide query under per-job IMEX"))
    (f,) = imex.run_check(1.0, str(conf), root=str(tmp_path))
    assert f.severity == INFO and f.message.startswith("not applicable: per-job IMEX")
    toml.write_text('[imex]\nmode = "off"\n')
    config.clear_cache()
    monkeypatch.setattr(runner, "run", lambda argv, timeout, **kw: runner.Completed(
        tuple(argv), 0, (DATA / "imex-ctl-N-j-up.json").read_text(), ""))
    monkeypatch.setattr(imex.os, "access", lambda p, m: p.endswith("/usr/bin/nvidia-imex-ctl"))
    (f,) = imex.run_check(1.0, str(conf), root=str(tmp_path))
    assert f.message.startswith("IMEX ready") or f.message.startswith("IMEX not ready")


def _proc(root, pid, uids, cmdline):
    d = root / str(pid)
    d.mkdir(parents=True)
    u = "\t".join(str(x) for x in uids)
    (d / "status").write_text(f"Name:\tx\nState:\tS (sleeping)\nPid:\t{pid}\nPPid:\t1\n"
                              f"Uid:\t{u}\nGid:\t{u}\n")
    if cmdline is None:
        os.mkfifo(d / "cmdline")        # a read that never answers (a FUSE-backed page)
    else:
        (d / "cmdline").write_bytes(cmdline)


def test_a_job_runs_only_where_roots_slurmstepd_runs_a_step(tmp_path):
    """slurmstepd runs as root; a job user can name a process of theirs "slurmstepd:
    [5.0]" (prctl, argv[0]) or back its argv pages with a FUSE file of theirs, so
    that reading its cmdline never answers.  Neither counts, nor holds the check."""
    import threading
    root = tmp_path / "proc"
    _proc(root, 7, (1001,) * 4, b"slurmstepd: [5.0]\0")
    _proc(root, 8, (1001,) * 4, None)
    _proc(root, 9, (0,) * 4, b"/usr/sbin/slurmd\0-D\0")
    box = []
    t = threading.Thread(target=lambda: box.append(imex.jobs_running(str(root))), daemon=True)
    t.start()
    t.join(30)
    try:
        assert box == [False]
        _proc(root, 10, (0,) * 4, b"slurmstepd: [5.0]\0")
        assert imex.jobs_running(str(root)) is True
    finally:
        try:
            os.close(os.open(root / "8" / "cmdline", os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
