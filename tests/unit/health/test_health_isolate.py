"""--isolate-bad-gpu: one bad GPU leaves gres.conf (through confgen) instead of draining the node."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurm_gpu.hw.gpus_nvml import NvmlGpus
from slurm_gpu import config, runner
from slurm_gpu.health import engine
from slurm_gpu.health.findings import DRAIN, Finding
from slurm_gpu.health.isolate import bad_gpus
from slurm_gpu.health.settings import HealthSettings
from slurm_gpu.hw import snapshot as snap
from paths import ROOT

H100 = str(ROOT / "tests" / "data" / "machines" / "h100-sxm-8x" / "snapshot.json")
SC = ROOT / "tests" / "data" / "xid" / "scontrol"


@pytest.fixture
def node_env(tmp_path, monkeypatch):
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text(f'[node]\nsnapshot = "{H100}"\nstate_dir = "{tmp_path}/state"\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    config.clear_cache()
    calls: list[list[str]] = []
    text = re.sub(r"^NodeName=\S+", "NodeName=n1", (SC / "idle.txt").read_text())

    def fake_run(argv, timeout, **kw):
        calls.append(list(argv))
        if list(argv)[1:3] == ["show", "node"]:
            return runner.Completed(tuple(argv), 0, text, "")
        return runner.Completed(tuple(argv), 0, "", "")
    monkeypatch.setattr(runner, "run", fake_run)
    yield calls
    config.clear_cache()


def gres_for(tmp_path, names) -> Path:
    from slurm_gpu.confgen.gres import render_gres_conf
    node = snap.node_from_file(H100)
    p = tmp_path / "gres.conf"
    p.write_text(render_gres_conf({n: node for n in names}, dev_dir=str(tmp_path / "dev")))
    return p


def opts(tmp_path, gres, overlay):
    data = snap.read_snapshot(H100)
    s = HealthSettings(isolate_bad_gpu=True, kernel_log=str(tmp_path / "k.log"))
    (tmp_path / "k.log").write_text("")
    return engine.Options(node="n1", settings=s, state_dir=str(tmp_path / "state"), gres_conf=str(gres),
                          only=["gpu.count", "gpu.remap", "gpu.xid"],
                          nvml_opener=lambda: NvmlGpus(snap.replay_api(data, H100, overlay)))


PENDING = {"calls": [{"fn": "nvmlDeviceGetRemappedRows", "gpu": 2, "result": [0, 1, 1, 0]}]}


def test_one_bad_gpu_leaves_gres_conf_and_the_node_stays_up(tmp_path, node_env):
    gres = gres_for(tmp_path, ["n1"])
    before = gres.read_text()
    r = engine.run(opts(tmp_path, gres, PENDING))
    bad = snap.node_from_file(H100).gpus[2]
    assert r.status == "warn" and r.action == "none", r
    after = gres.read_text()
    assert f"{tmp_path}/dev/nvidia2" in before and f"{tmp_path}/dev/nvidia2" not in after
    assert before.count("Name=gpu") == 8 and after.count("Name=gpu") == 7
    assert (tmp_path / "gres.conf.slurm-gpu.orig").read_text() == before
    updates = [c for c in node_env if c[1] in ("update", "reconfigure")]
    assert updates[0][2] == "nodename=n1" and updates[0][3].startswith("gres=gpu:") and updates[0][3].endswith(":7")
    assert updates[1][1] == "reconfigure" and len(updates) == 2
    assert any(bad.pci_bus_id in f.gpu for f in r.findings if f.gpu)
    # the fault persists on the isolated GPU: a warning, no second rewrite, no drain
    node_env.clear()
    r = engine.run(opts(tmp_path, gres, PENDING))
    assert r.status == "warn" and [c for c in node_env if c[1] != "show"] == []


def test_shared_gres_conf_is_never_rewritten_node_drains(tmp_path, node_env):
    gres = gres_for(tmp_path, ["n1", "n2"])
    before = gres.read_text()
    r = engine.run(opts(tmp_path, gres, PENDING))
    assert r.status == "drain" and r.action == "drain" and gres.read_text() == before
    assert any("other nodes" in n for n in r.notes)


def test_which_faults_may_be_isolated():
    gpus = ["0000:18:00.0", "0000:2a:00.0"]
    def f(check, gpu, xid=None):
        return Finding(check, DRAIN, "x", gpu, xid)
    assert bad_gpus([f("gpu.remap", gpus[0])], gpus) == {gpus[0]}
    assert bad_gpus([f("gpu.remap", gpus[0]), f("gpu.ecc", gpus[1])], gpus) is None      # all of them
    assert bad_gpus([f("gpu.xid", gpus[0], 79)], gpus) is None                           # off the bus
    assert bad_gpus([f("gpu.nvlink", gpus[0])], gpus) is None                            # fabric-wide
    assert bad_gpus([f("gpu.count", None)], gpus) is None                                # node-level


def test_slurm_refusing_the_new_count_changes_nothing_and_drains(tmp_path, node_env, monkeypatch):
    # Real slurmctld 22.05 answer, seen on the sandbox: File= GRES counts cannot be changed by scontrol.
    gres = gres_for(tmp_path, ["n1"])
    before = gres.read_text()
    text = re.sub(r"^NodeName=\S+", "NodeName=n1", (SC / "idle.txt").read_text())
    calls = []

    def refusing(argv, timeout, **kw):
        calls.append(list(argv))
        if list(argv)[1:3] == ["show", "node"]:
            return runner.Completed(tuple(argv), 0, text, "")
        if any(a.startswith("gres=") for a in argv):
            from slurm_gpu.errors import CommandError
            raise CommandError("scontrol failed: slurm_update error: Invalid generic resource (gres) specification")
        return runner.Completed(tuple(argv), 0, "", "")
    monkeypatch.setattr(runner, "run", refusing)
    r = engine.run(opts(tmp_path, gres, PENDING))
    assert r.status == "drain" and r.action == "drain"
    assert gres.read_text() == before and not (tmp_path / "gres.conf.slurm-gpu.orig").exists()
    assert not any(c[1] == "reconfigure" for c in calls)
    assert any("refused" in n for n in r.notes)
