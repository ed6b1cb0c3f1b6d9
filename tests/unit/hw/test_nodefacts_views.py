"""What each caller of the node-fact cache gets: pinned before the two caches became one.

Two callers read the GPUs' facts from one node-model read:

* the SPANK step (``--gpu-numa-bind``) binds a task to its GPUs' local CPUs:
  the PUs of the GPU's local cores, else (a GPU whose locality has no core
  the model knows) the PUs of its NUMA nodes; and to their NUMA nodes' memory;
* the prolog pins the job's MPS daemon (``taskset``) to the GPUs' local
  cores' PUs only: a GPU without local cores pins nothing.

Both are keyed by Slurm's GPU index (gres.conf order).  These tests hold on
the code before and after the merge; only the two ``*_view`` helpers say how
each caller is reached.
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from slurm_gpu.hw import HwlocXml, Snapshot, load_node
from slurm_gpu.hw.model import Node
from paths import ROOT

MACHINES = ROOT / "tests" / "data" / "machines"


@pytest.fixture()
def env(tmp_path, monkeypatch):
    """An empty config, gres.conf beside $SLURM_CONF, caches under tmp_path."""
    from slurm_gpu import config
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text("")
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    config.clear_cache()
    yield tmp_path
    config.clear_cache()


def spank_view(tmp: Path, model: Node, monkeypatch) -> list[dict]:
    """The GPU locality a bound SPANK step gets (its cache's slow path)."""
    from slurm_gpu import nodefacts
    from slurm_gpu.spank import nodecache
    monkeypatch.setattr("slurm_gpu.hw.load_node", lambda *a: model)
    monkeypatch.setattr(nodefacts, "CACHE_DIR", str(tmp / "spank-cache"))
    return list(nodecache.get(str(tmp / "slurm-gpu.toml"), "n1", with_gpus=True)["gpus"])


def prolog_view(tmp: Path, model: Node, indices: list[int]) -> list[dict]:
    """The facts of the job's GPUs (Slurm indices) the prolog gets."""
    from slurm_gpu.jobs import lifecycle
    from slurm_gpu.jobs.context import job_gpu_facts
    from slurm_gpu.jobs.settings import JobsSettings, MigSettings, MpsSettings
    ctx = lifecycle.Context({}, JobsSettings(), MpsSettings(), MigSettings(), str(tmp / "state"),
                            lambda: None, lambda: model, gres_conf=str(tmp / "gres.conf"),
                            node_name="n1")
    return job_gpu_facts(ctx, indices)


def _gres_in_minor_order(tmp: Path, minors: list[int]) -> None:
    (tmp / "gres.conf").write_text("AutoDetect=off\n" + "".join(
        f"NodeName=n1 Name=gpu File=/dev/nvidia{m}\n" for m in minors))


def _numa_pus(model: Node, gpu) -> tuple[int, ...]:
    return tuple(sorted(p for n in model.numa_nodes if n.index in gpu.numa_nodes for p in n.pus))


def _mems(model: Node, gpu) -> tuple[int, ...]:
    return tuple(sorted(n.os_index for n in model.numa_nodes if n.index in gpu.numa_nodes))


def test_recorded_machine_both_callers_get_the_gpus_cores(env, monkeypatch) -> None:
    """dgx-a100-permuted: minors are not NVML indices; gres.conf lists them in minor order."""
    model = load_node(Snapshot(str(MACHINES / "dgx-a100-permuted" / "snapshot.json")))
    by_minor = {g.minor: g for g in model.gpus}
    minors = sorted(by_minor)
    assert minors != [g.minor for g in sorted(model.gpus, key=lambda g: g.index)]
    _gres_in_minor_order(env, minors)
    spank = spank_view(env, model, monkeypatch)
    prolog = prolog_view(env, model, list(range(len(minors))))
    assert len(spank) == len(prolog) == len(minors) == 8
    for k, minor in enumerate(minors):
        g = by_minor[minor]
        cores = tuple(model.pus_of_cores(g.cores))
        assert cores, g
        assert (spank[k]["index"], spank[k]["minor"], spank[k]["uuid"]) == (g.index, minor, g.uuid)
        assert tuple(spank[k]["cpus"]) == cores
        assert tuple(spank[k]["mems"]) == _mems(model, g) != ()
        assert prolog[k] == {"index": k, "minor": minor, "uuid": g.uuid, "name": g.name,
                             "cpus": list(cores)}


def test_gpu_whose_locality_has_no_core(env, monkeypatch) -> None:
    """The two callers differ here, on purpose: SPANK falls back to the NUMA node's CPUs,
    the MPS daemon is pinned to no CPU (taskset is skipped)."""
    model = load_node(Snapshot(str(MACHINES / "mini-2numa" / "snapshot.json")))
    g0, g1 = sorted(model.gpus, key=lambda g: g.index)
    assert g0.cores and g0.numa_nodes
    model = replace(model, gpus=(replace(g0, cores=()), g1))
    _gres_in_minor_order(env, [g0.minor, g1.minor])
    spank = spank_view(env, model, monkeypatch)
    assert tuple(spank[0]["cpus"]) == _numa_pus(model, g0) != ()
    assert tuple(spank[0]["mems"]) == _mems(model, g0)
    assert tuple(spank[1]["cpus"]) == tuple(model.pus_of_cores(g1.cores))
    prolog = prolog_view(env, model, [0, 1])
    assert prolog[0]["cpus"] == [] and prolog[0]["uuid"] == g0.uuid
    assert prolog[1]["cpus"] == list(model.pus_of_cores(g1.cores))


def test_recorded_gpus_without_any_locality(env, monkeypatch) -> None:
    """irregular-groups (hwloc's own test topology): both GPUs sit outside the allowed
    cpuset, so neither has a core nor a NUMA node: nothing to bind or pin to."""
    model = load_node(HwlocXml(str(MACHINES / "irregular-groups" / "hwloc.xml")))
    # hwloc alone knows no UUID, which the prolog insists on (NVML gives it on a real node)
    model = replace(model, gpus=tuple(replace(g, uuid=f"GPU-irregular-{g.minor}") for g in model.gpus))
    assert len(model.gpus) == 2 and not any(g.cores or g.numa_nodes for g in model.gpus)
    _gres_in_minor_order(env, [g.minor for g in model.gpus])
    spank = spank_view(env, model, monkeypatch)
    assert [(tuple(s["cpus"]), tuple(s["mems"])) for s in spank] == [((), ())] * 2
    assert [p["cpus"] for p in prolog_view(env, model, [0, 1])] == [[], []]


def test_views_hold_without_gres_conf(env, monkeypatch) -> None:
    """No gres.conf: Slurm's order is NVML's (AutoDetect)."""
    model = load_node(Snapshot(str(MACHINES / "dgx-a100-permuted" / "snapshot.json")))
    assert not os.path.exists(env / "gres.conf")
    nvml_order = sorted(model.gpus, key=lambda g: g.index)
    assert [s["uuid"] for s in spank_view(env, model, monkeypatch)] == [g.uuid for g in nvml_order]
    assert [p["uuid"] for p in prolog_view(env, model, list(range(8)))] == [g.uuid for g in nvml_order]


def test_prolog_follows_an_edited_snapshot_and_config(env, monkeypatch) -> None:
    """The node this config names changed (a new snapshot recorded in place, then a config
    edit): the next prolog must see the new GPUs, not the ones cached before."""
    from slurm_gpu import config
    snap = env / "node.json"
    snap.write_bytes((MACHINES / "mini-2numa" / "snapshot.json").read_bytes())
    (env / "slurm-gpu.toml").write_text(f'[node]\nsnapshot = "{snap}"\n')
    config.clear_cache()
    model = load_node(Snapshot(str(snap)))
    _gres_in_minor_order(env, [g.minor for g in model.gpus])
    assert [p["uuid"] for p in prolog_view(env, model, [0, 1])] == [g.uuid for g in model.gpus]
    renamed = replace(model, gpus=tuple(replace(g, uuid=g.uuid + "-new") for g in model.gpus))
    snap.write_text(snap.read_text() + " ")                # recorded again, same path
    os.utime(snap, ns=(1, 1))
    assert [p["uuid"] for p in prolog_view(env, renamed, [0, 1])] == [g.uuid for g in renamed.gpus]
    (env / "slurm-gpu.toml").write_text(f'[node]\nsnapshot = "{snap}"\n# edited\n')
    config.clear_cache()
    assert [p["uuid"] for p in prolog_view(env, model, [0, 1])] == [g.uuid for g in model.gpus]
