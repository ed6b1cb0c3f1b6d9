"""The health check uses what newer Slurm gives it, and keeps the 22.05 logic without it.

* SLURM_NODE_IS_HEALTHY (26.05.2, SlurmctldParameters=health_check_report):
  a clean run on a node in service calls no scontrol; its presence means
  slurmd has registered, so a new slurmd's run is not a start-up run.
* HealthCheckTimeout (26.05): the watchdog fires before slurmd's kill.
"""
from __future__ import annotations

from test_health_drain import R, XID13, XID79, capture, opts  # noqa: F401  (slurm fixture below)
from test_health_drain import slurm  # noqa: F401

from slurm_gpu.health import actions, engine
from slurm_gpu.health.nodestate import parse_show_node


def test_healthy_verdict_spares_scontrol_on_a_clean_run(tmp_path, slurm):  # noqa: F811
    log = tmp_path / "kern.log"
    log.write_text(XID13)
    for _ in range(3):
        r = engine.run(opts(tmp_path, log, slurm_mode=True, parent_slurmd="1:1", slurm_healthy="yes"))
        assert r.status == "ok" and r.action == "none"
    assert slurm.calls == []
    # without the verdict (Slurm < 26.05.2, or health_check_report off): as before
    engine.run(opts(tmp_path, log, slurm_mode=True, parent_slurmd="1:1"))
    assert [c[1:3] for c in slurm.calls] == [["show", "node"]]


def test_a_fault_still_drains_and_our_drain_still_resumes(tmp_path, slurm):  # noqa: F811
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    r = engine.run(opts(tmp_path, log, slurm_mode=True, parent_slurmd="1:1", slurm_healthy="yes",
                        resume=1))
    # the verdict proves slurmd registered: no deferral, even on its first run
    assert r.action == "drain" and slurm.updates[-1][4] == f"reason={R}"
    r = engine.run(opts(tmp_path, log, slurm_mode=True, parent_slurmd="1:1", slurm_healthy="no",
                        resume=1))
    assert r.action == "resume" and not parse_show_node(slurm.text).drained


def test_first_run_logic_kept_without_the_verdict(tmp_path, slurm):  # noqa: F811
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    r = engine.run(opts(tmp_path, log, slurm_mode=True, parent_slurmd="7:7"))
    assert slurm.calls == [] and r.action == "deferred"


def test_admin_drain_is_looked_at_when_the_verdict_is_no(tmp_path, slurm):  # noqa: F811
    slurm.text = capture("admin_drained")
    out = actions.act("n1", None, engine_memory(), clean_runs_to_resume=1, timeout=5,
                      slurm_healthy="no")
    assert out.plan.action == "none" and slurm.calls and slurm.updates == []


def engine_memory():
    from slurm_gpu.health.nodestate import Memory
    return Memory()


def test_health_check_timeout_bounds_the_watchdog(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from slurm_gpu.commands import health as cmd
    from slurm_gpu.slurmclient import health_check_timeout, parse_conf
    assert health_check_timeout(parse_conf("HealthCheckTimeout=10\n", str(tmp_path))) == 10
    assert health_check_timeout(parse_conf("HealthCheckInterval=10\n", str(tmp_path))) is None
    conf = tmp_path / "slurm.conf"
    conf.write_text("HealthCheckTimeout=8\n")
    seen = {}

    def fake_run(o):
        seen["watchdog"] = o.settings.watchdog_seconds
        seen["healthy"] = o.slurm_healthy
        return engine.Report(o.node, [], "ok")
    monkeypatch.setattr(engine, "run", fake_run)
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setenv("SLURM_NODE_IS_HEALTHY", "yes")
    toml = tmp_path / "c.toml"
    toml.write_text(f'[node]\nstate_dir = "{tmp_path}"\n[health]\nkernel_log = "{tmp_path}/k"\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(toml))
    res = CliRunner().invoke(cmd.health, ["--slurm", "--node", "n1", "--only", "gpu.xid"])
    assert res.exit_code == 0, res.output
    assert seen == {"watchdog": 6.0, "healthy": "yes"}
