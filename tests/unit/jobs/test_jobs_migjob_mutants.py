"""jobs/migjob.py: the job's MIG record, its error lines and what the epilog
destroys, each asserted whole: the mutants mutmut made of these survived the
prolog/epilog tests (docs/development.md, mutation testing).  Runs as root
against the simulated node of test_jobs_lifecycle.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from test_jobs_lifecycle import Env, _uid

from slurm_gpu.jobs import lifecycle, migjob
from slurm_gpu.jobs import state as js
from slurm_gpu.mig import instances
from slurm_gpu_devkit.sim.mig import clear_holder, set_holder

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="prolog/epilog run as root")

BLOCKER = "DCGM host engine (nv-hostengine) (pid 4242): stop it (systemctl stop nvidia-dcgm)"
USER = "[job 100: user error, job fails, node stays up]"


@pytest.fixture()
def node():
    n = Env()
    yield n
    n.close()


def _dicts(node: Env, gpu: int) -> list[dict]:
    return [e.to_dict() for e in instances.list_instances(node.api(), gpu)]


def _made(node: Env, gpu: int, wanted: list[tuple[str, int, int, int]]) -> list[dict]:
    """The record of the instances now on *gpu*: (profile, profile id, start, size) each."""
    api = node.api()
    now = {(e.profile_id, e.start): e.gi_id for e in instances.list_instances(api, gpu)}
    uuids = {(g, c): u for g, c, u in instances.mig_devices(api, gpu)}
    out = []
    for name, pid, start, size in wanted:
        gid = now[(pid, start)]
        out.append({"profile": name, "gi_profile_id": pid, "start": start, "size": size,
                    "gi_id": gid, "ci_id": 0, "uuid": uuids[(gid, 0)]})
    return out


def _gpu(node: Env, i: int) -> dict:
    g = node.node().gpus[i]
    return {"index": i, "uuid": g.uuid, "minor": i, "model": "h100-80gb"}


def test_the_record_names_each_gpus_baseline_and_instances_whole(node: Env) -> None:
    # one layout per GPU (";"): GPU 1 has no baseline, GPU 3 has one
    base3, layout3 = _dicts(node, 3), node.layout(3)
    ctx = node.ctx(SLURM_JOB_GPUS="1,3", SPANK_SLURM_GPU_MIG="3g.40gb;1g.10gb,1g.10gb")
    assert lifecycle.prolog(ctx) == 0, node.logs
    assert node.logs == []
    st = js.load(node.state_dir, "100")
    assert st.mig == {"layout": "3g.40gb;1g.10gb,1g.10gb", "ready": True, "gpus": [
        {**_gpu(node, 1), "baseline": [], "baseline_removed": False,
         "instances": _made(node, 1, [("3g.40gb", 9, 0, 4)])},
        {**_gpu(node, 3), "baseline": base3, "baseline_removed": True,
         "instances": _made(node, 3, [("1g.10gb", 19, 0, 1), ("1g.10gb", 19, 1, 1)])}]}
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert _dicts(node, 1) == [] and node.layout(3) == layout3 and node.leftovers() == []


def test_an_unpublished_profile_id_is_recorded_as_the_driver_tells_it(node: Env, monkeypatch) -> None:
    real = migjob.plan_gpu
    monkeypatch.setattr(migjob, "plan_gpu", lambda reqs, model: [
        dataclasses.replace(p, gi_profile_id=None) for p in real(reqs, model)])
    ctx = node.ctx(SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MIG="2g.20gb,1g.10gb")
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    assert st.mig["gpus"][0]["instances"] == _made(node, 1, [("2g.20gb", 14, 0, 2),
                                                             ("1g.10gb", 19, 2, 1)])
    assert lifecycle.epilog(ctx) == 0 and _dicts(node, 1) == []


class Killed(BaseException):
    """What SIGKILL looks like to the code: nothing after it runs."""


def test_killed_before_the_ids_the_record_holds_the_pending_placement(node: Env, monkeypatch) -> None:
    real = instances.create_placement
    calls = {"n": 0}

    def dying(api, dev, p, where):
        calls["n"] += 1
        ids = real(api, dev, p, where)
        if calls["n"] == 2:
            raise Killed()
        return ids

    monkeypatch.setattr(migjob.instances, "create_placement", dying)
    with pytest.raises(Killed):
        lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MIG="3g.40gb,2g.20gb"))
    st = js.load(node.state_dir, "100")
    assert st.mig["ready"] is False
    assert st.mig["gpus"][0]["instances"] == _made(node, 1, [("3g.40gb", 9, 0, 4)]) + [
        {"profile": "2g.20gb", "gi_profile_id": 14, "start": 4, "size": 2,
         "gi_id": None, "ci_id": None, "uuid": None}]
    monkeypatch.undo()
    assert lifecycle.epilog(node.ctx()) == 0 and _dicts(node, 1) == []


def test_a_mig_device_without_uuid_is_a_node_fault_undone(node: Env, monkeypatch) -> None:
    before = node.layout(3)
    monkeypatch.setattr(migjob.instances, "mig_devices", lambda api, dev: [])
    assert lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="3", SPANK_SLURM_GPU_MIG="7g.80gb")) == 1
    assert node.logs[0].startswith("slurm-gpu: new MIG device has no UUID (GPU 3) [job 100: ")
    assert node.layout(3) == before


def _edit_sim(node: Env, gpu: int, **facts) -> None:
    sim = json.loads(Path(node.sim).read_text())
    g = sim["facts"]["gpus"][gpu]
    for k, v in facts.items():
        if v is None:
            g.pop(k)
        else:
            g[k] = v
    Path(node.sim).write_text(json.dumps(sim))


@pytest.mark.parametrize("env,sim,line", [
    ({"SLURM_JOB_GPUS": "1"}, "disabled", "--gpu-mig is disabled on this cluster ([mig] enabled)"),
    ({"CUDA_VISIBLE_DEVICES": "1"}, None,
     "--gpu-mig needs whole GPUs held by the job (--gpus/--gres=gpu), not shards or gres/mps (job 100)"),
    ({"SLURM_JOB_GPUS": "1,3", "SPANK_SLURM_GPU_MIG": "1g.10gb;1g.10gb;1g.10gb"}, None,
     "MIG layout names 3 GPU layouts but the job has 2 GPU(s) on this node (--gpu-mig)"),
    ({"SLURM_JOB_GPUS": "0"}, "no mig", "GPU 0 (NVIDIA H100 80GB HBM3) does not support MIG (job 100)"),
    ({"SLURM_JOB_GPUS": "2"}, "unknown model",
     "GPU 2 (NVIDIA Foo) is a GPU model slurm-gpu has no MIG table for; tell the admin (job 100)"),
    ({"SLURM_JOB_GPUS": "0"}, None, "GPU 0 (NVIDIA H100 80GB HBM3) does not have MIG mode enabled; "
     "the admin enables it with slurm-gpu mig apply (job 100)"),
])
def test_each_refusal_is_one_whole_line(node: Env, env: dict, sim: str | None, line: str) -> None:
    if sim == "disabled":
        node.mig.enabled = False
    elif sim == "no mig":
        _edit_sim(node, 0, mig=None)
    elif sim == "unknown model":
        _edit_sim(node, 2, name="NVIDIA Foo", pci_device_id="0x12345678")
    before = {g: _dicts(node, g) for g in (1, 2, 3)}
    assert lifecycle.prolog(node.ctx(**{"SPANK_SLURM_GPU_MIG": "1g.10gb", **env})) == 0
    assert node.logs == [f"slurm-gpu: {line} {USER}"]
    st = js.load(node.state_dir, "100")
    assert (st.phase, st.error, st.mig) == ("failed", line, None)
    assert {g: _dicts(node, g) for g in (1, 2, 3)} == before


def test_a_gpu_another_job_recorded_is_refused_past_broken_records(node: Env) -> None:
    # this job's own record (an earlier run) comes first, a corrupt one next
    own = js.new("100", uid=_uid("sgtest1"), gid=0, user="sgtest1")
    own.gpus = [{"index": 1, "uuid": node.node().gpus[1].uuid, "minor": 1}]
    js.save(node.state_dir, own)
    Path(js.jobs_dir(node.state_dir), "120.json").write_text("{")
    theirs = js.new("150", uid=_uid("sgtest1"), gid=0, user="sgtest1")
    js.save(node.state_dir, theirs)
    os.chown(js.path(node.state_dir, "150"), _uid("sgtest1"), 0)     # load() refuses it
    other = js.new("200", uid=_uid("sgtest1"), gid=0, user="sgtest1")
    other.gpus = [{"index": 3, "uuid": node.node().gpus[3].uuid, "minor": 3}]
    js.save(node.state_dir, other)
    before = _dicts(node, 3)
    assert lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="1,3", SPANK_SLURM_GPU_MIG="1g.10gb")) == 0
    line = "GPU 3 is also used by job 200; --gpu-mig needs GPUs the job holds exclusively (job 100)"
    assert node.logs[-1] == f"slurm-gpu: {line} {USER}"
    assert js.load(node.state_dir, "100").error == line
    assert _dicts(node, 1) == [] and _dicts(node, 3) == before


@pytest.mark.parametrize("check", [True, False])
def test_blockers_named_only_when_the_admin_asks(node: Env, check: bool, monkeypatch) -> None:
    from slurm_gpu.mig import blockers
    node.mig.check_blockers = check
    monkeypatch.setattr(blockers, "find", lambda *a, **k: [blockers.Blocker(
        "DCGM host engine (nv-hostengine)", "pid 4242", "stop it (systemctl stop nvidia-dcgm)")])
    before = node.layout(3)
    ctx = node.ctx(SLURM_JOB_GPUS="1,3", SPANK_SLURM_GPU_MIG="1g.10gb")
    set_holder(node.sim, "dcgm", gpus=[3], blocks=("create",))
    assert lifecycle.prolog(ctx) == 1
    why = "In use by another client" + (f"; blockers: {BLOCKER}" if check else "") + " (GPU 3)"
    # the creation refused, then the undo's recreation of GPU 3's baseline (the teardown)
    assert node.logs == [
        f"slurm-gpu: cannot create GPU instance (profile 19 at 0:1): {why} "
        "[job 100: node fault, on_internal_error=drain]",
        f"slurm-gpu: prolog cleanup incomplete, the epilog retries: "
        f"cannot create GPU instance (profile 9 at 0:4): {why}"]
    clear_holder(node.sim, "dcgm")
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert _dicts(node, 1) == [] and node.layout(3) == before


def test_an_epilog_refused_half_way_leaves_a_true_record(node: Env, monkeypatch) -> None:
    from slurm_gpu.mig import blockers
    monkeypatch.setattr(blockers, "find", lambda *a, **k: [blockers.Blocker(
        "DCGM host engine (nv-hostengine)", "pid 4242", "stop it (systemctl stop nvidia-dcgm)")])
    base2, layout2, layout3 = _dicts(node, 2), node.layout(2), node.layout(3)
    ctx = node.ctx(SLURM_JOB_GPUS="2,3", SPANK_SLURM_GPU_MIG="1g.10gb")
    assert lifecycle.prolog(ctx) == 0, node.logs
    made3 = js.load(node.state_dir, "100").mig["gpus"][1]
    set_holder(node.sim, "dcgm", gpus=[3], blocks=("destroy",))
    for check in (False, True):
        node.mig.check_blockers = check
        node.logs.clear()
        lifecycle.epilog(ctx)
        gid = made3["instances"][0]["gi_id"]
        assert node.logs == [f"slurm-gpu: cannot destroy GPU instance {gid}: In use by another client"
                             + (f"; blockers: {BLOCKER}" if check else "")
                             + " (GPU 3) [epilog job 100: cleanup incomplete, on_internal_error=drain]"]
        # GPU 2 is done (its baseline back, and said so), GPU 3 is as the prolog left it
        assert node.layout(2) == layout2
        st = js.load(node.state_dir, "100")
        assert st.mig["gpus"] == [{**_gpu(node, 2), "baseline": base2, "baseline_removed": False,
                                   "instances": []}, made3]
    clear_holder(node.sim, "dcgm")
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert node.layout(2) == layout2 and node.layout(3) == layout3 and node.leftovers() == []


def _hand_record(node: Env, insts: list[dict], gpu: dict | None = None) -> None:
    st = js.new("100", uid=_uid("sgtest1"), gid=0, user="sgtest1")
    st.mig = {"layout": "x", "ready": True, "gpus": [
        gpu or {"index": 1, "uuid": node.node().gpus[1].uuid, "minor": 1, "model": "h100-80gb",
                "baseline": [], "baseline_removed": False, "instances": insts}]}
    js.save(node.state_dir, st)


@pytest.mark.parametrize("pid", [19, None])
def test_the_epilog_destroys_by_placement_never_an_instance_it_did_not_make(node: Env, pid) -> None:
    api = node.api()
    from slurm_gpu.mig.planner import plan
    from slurm_gpu.mig.profiles import find_model
    for p in plan("1g.10gb,1g.10gb,1g.10gb", find_model("h100-80gb"))[0]:
        instances.create_placement(api, 1, p, "setup")
    ids = {e.start: e.gi_id for e in instances.list_instances(api, 1)}
    assert sorted(ids) == [0, 1, 2]
    # the record: the instance at 0 under the foreign one's id (a recycled id),
    # the one at 1 under an id no instance has; the one at 2 is not the job's
    _hand_record(node, [
        {"profile": "1g.10gb", "gi_profile_id": pid, "start": 0, "size": 1, "gi_id": ids[2]},
        {"profile": "1g.10gb", "gi_profile_id": pid, "start": 1, "size": 1, "gi_id": 99}])
    assert lifecycle.epilog(node.ctx()) == 0, node.logs
    assert [(e.start, e.gi_id) for e in instances.list_instances(api, 1)] == [(2, ids[2])]


def test_a_record_without_lists_touches_nothing(node: Env) -> None:
    before = _dicts(node, 3)
    _hand_record(node, [], {"index": 3, "uuid": node.node().gpus[3].uuid, "minor": 3,
                            "baseline_removed": True})
    assert lifecycle.epilog(node.ctx()) == 0, node.logs
    assert _dicts(node, 3) == before and node.leftovers() == []


def test_a_gpu_whose_uuid_and_minor_disagree_is_named_by_its_index(node: Env) -> None:
    g3 = node.node().gpus[3].uuid
    _hand_record(node, [], {"index": 3, "uuid": g3, "minor": 2, "instances": [], "baseline": [],
                            "baseline_removed": False})
    lifecycle.epilog(node.ctx())
    assert len(node.logs) == 1 and node.logs[0].startswith(
        f"slurm-gpu: GPU {g3} is /dev/nvidia3, not /dev/nvidia2 as recorded (GPU 3) ["), node.logs


def test_an_instance_of_another_profile_at_the_recorded_start_is_not_the_jobs(node: Env) -> None:
    """1g.10gb+me (profile 20) has 1g.10gb's size: the profile id tells them apart."""
    api = node.api()
    from slurm_gpu.mig.planner import plan
    from slurm_gpu.mig.profiles import find_model
    (p,) = plan("1g.10gb+me", find_model("h100-80gb"))[0]
    instances.create_placement(api, 1, p, "setup")
    theirs = _dicts(node, 1)
    assert [(e["profile_id"], e["start"], e["size"]) for e in theirs] == [(20, 0, 1)]
    _hand_record(node, [{"profile": "1g.10gb", "gi_profile_id": 19, "start": 0, "size": 1, "gi_id": 99}])
    assert lifecycle.epilog(node.ctx()) == 0, node.logs
    assert _dicts(node, 1) == theirs



def test_a_prolog_failing_after_the_layout_keeps_a_readable_record(node: Env) -> None:
    """Undone in the prolog, the layout leaves the failed record saying "no MIG" (None)."""
    layout3 = node.layout(3)
    node.jobs.on_internal_error = "pass"        # the record stays, for the tasks to fail
    node.mps.control = "/bin/false"             # the MPS step, after the MIG one, fails
    assert lifecycle.prolog(node.ctx(SLURM_JOB_GPUS="3", SPANK_SLURM_GPU_MIG="7g.80gb",
                                     SPANK_SLURM_GPU_MPS="default")) == 0
    assert node.layout(3) == layout3
    st = js.load(node.state_dir, "100", warn=node.logs.append)
    assert node.logs == ["slurm-gpu: MPS control daemon could not start: false -d failed: exit status 1 "
                         "(its directories and daemon are the job's user's) (job 100) "
                         "[job 100: user error, job fails, node stays up]"]
    assert (st.phase, st.mig) == ("failed", None)
    assert lifecycle.epilog(node.ctx()) == 0 and node.leftovers() == []
