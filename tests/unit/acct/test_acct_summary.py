"""The summary's format in AdminComment, report figures and device/cgroup attribution."""
from __future__ import annotations


import pytest

from slurm_gpu.acct import aggregate, dbd, report
from slurm_gpu.acct.attribution import attribute, job_of_pid
from slurm_gpu.acct.devices import job_device_keys, slurm_device_keys
from slurm_gpu.hw import Snapshot, load_node
from slurm_gpu.hw.gpustats import DeviceStats, ProcUse
from paths import ROOT

MACHINES = ROOT / "tests" / "data" / "machines"


def part(sm: float = 50.0) -> dict:
    d = aggregate.new_device(True)
    for t in range(4):
        aggregate.add_sample(d, float(t), sm=sm, mem=2 << 30, energy_mj=1000 * t, idle_threshold=1.0)
    return aggregate.summary("n1", {"0": d}, 10.0, 3000)


def test_summary_survives_what_sacctmgr_stores():
    value = dbd.merged("", "N1", part())
    assert value == dbd.sacctmgr_form(value)          # lower case, no quotes: stored as written
    got = dbd.parse(value)["n1"]["dev"]["0"]
    assert (got["sm"], got["smx"], got["mem"], got["idle"], got["j"], got["n"]) == (50.0, 50.0, 2048, 0.0, 3, 4)


def test_other_tools_text_is_kept_and_other_nodes_merged():
    first = dbd.merged("nhc: ok", "n1", part(10))
    both = dbd.merged(first, "n2", part(90))
    other, ours = dbd.split(both)
    assert other == "nhc: ok" and set(ours) == {"n1", "n2"}
    again = dbd.merged(both, "n1", part(20))          # a retry replaces only its own node's part
    assert dbd.parse(again)["n1"]["dev"]["0"]["sm"] == 20 and dbd.parse(again)["n2"]["dev"]["0"]["sm"] == 90
    assert dbd.split(again)[0] == "nhc: ok"


def test_text_sacctmgr_would_alter_is_not_rewritten():
    assert dbd.merged('{"owner":"X"}', "n1", part()) is None
    assert dbd.merged("NHC: Disk", "n1", part()) is None


def test_summary_is_size_bounded():
    devs = {}
    for g in range(8):
        for gi in range(7):
            d = aggregate.new_device(gi % 2 == 0)
            aggregate.add_sample(d, 0.0, sm=5.0, mem=1 << 30, energy_mj=None, idle_threshold=1.0)
            for x in range(8):
                aggregate.add_xid(d, 40 + x)
            devs[f"{g}/gi{gi}"] = d
    p = aggregate.summary("node001", devs, 10.0, 600)
    assert len(aggregate.encode_part("node001", p)) <= 600
    assert p["dev"] and all("leak" not in v and "xid" not in v for v in p["dev"].values())


def test_energy_counter_restart_keeps_what_was_counted():
    d = aggregate.new_device(True)
    for e in (1000_000, 3000_000, 500_000, 1500_000):      # driver reloaded after the 2nd sample
        aggregate.add_sample(d, 0.0, sm=1.0, mem=0, energy_mj=e, idle_threshold=1.0)
    assert aggregate.device_summary(d)["j"] == 3000


def test_slurm_gres_indices_map_to_mig_instances():
    node = load_node(Snapshot(str(MACHINES / "h100-mig" / "snapshot.json")))
    order = slurm_device_keys(node)
    # As Slurm 22.05 numbered them in the sandbox: whole GPUs, then 4g, then 1g instances.
    assert order[:4] == ["0", "1", "2/gi2", "3/gi1"] and order[4:7] == ["2/gi7", "2/gi8", "2/gi9"]
    assert job_device_keys([4, 5], order, None) == ["2/gi7", "2/gi8"]
    assert job_device_keys([0], order, {"gpus": [{"index": 0, "instances": [{"gi_id": 3}]}]}) == ["0/gi3"]
    assert job_device_keys([99], order, None) == []


def test_instances_a_job_made_do_not_move_slurms_indices():
    """Slurm numbers the gres.conf it was started with.  A ``--gpu-mig`` job's
    instances on GPU 0 are in the live model, not in gres.conf: the next job,
    given Slurm's index 1 (GPU 1 whole), was registered on "0/gi8" and its use
    of GPU 1 counted as a leak (bench/bench_oversub.py, h100-mig sandbox)."""
    import dataclasses

    from slurm_gpu.confgen import render_gres_conf
    from slurm_gpu.confgen.gres import mig_cap_minors
    from slurm_gpu.confgen.grescheck import effective, parse_gres_conf
    deployed = load_node(Snapshot(str(MACHINES / "h100-mig" / "snapshot.json")))
    conf = effective(parse_gres_conf(render_gres_conf({"n1": deployed}).splitlines(), "gres.conf"), "n1")
    template = deployed.gpus[2].mig_instances[1]                   # a 1g.10gb
    made = [dataclasses.replace(template, gi_id=gi, placement_start=i, uuid=f"MIG-job-{gi}",
                                gi_cap_minor=mig_cap_minors(deployed.gpus[0].minor, gi, 0)[0],
                                ci_cap_minor=mig_cap_minors(deployed.gpus[0].minor, gi, 0)[1])
            for i, gi in enumerate((7, 8))]
    gpus = list(deployed.gpus)
    gpus[0] = dataclasses.replace(gpus[0], mig_enabled=True, mig_instances=tuple(made))
    live = dataclasses.replace(deployed, gpus=tuple(gpus))
    order = slurm_device_keys(live, conf)
    assert order == slurm_device_keys(deployed) and order[:4] == ["0", "1", "2/gi2", "3/gi1"]
    assert job_device_keys([1], order, None) == ["1"]


def test_cgroup_names_the_job_and_a_leak_is_attributed(tmp_path):
    for pid, cg in ((10, "12:devices:/slurm_n1/uid_1001/job_77/step_0\n"),
                    (11, "0::/system.slice/slurmstepd.scope/job_78/step_batch/user/task_0\n"),
                    (12, "0::/user.slice/user-1001.slice/session-3.scope\n")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(cg)
    assert job_of_pid(str(tmp_path), 10) == "77" and job_of_pid(str(tmp_path), 11) == "78"
    assert job_of_pid(str(tmp_path), 12) is None and job_of_pid(str(tmp_path), 13) is None
    stats = [DeviceStats(0, None, "GPU-a", 90.0, 5 << 30, 80 << 30, 300_000, 10, (ProcUse(10, 1 << 30),
                                                                             ProcUse(11, 2 << 30))),
             DeviceStats(1, None, "GPU-b", 0.0, 0, 80 << 30, 60_000, 10, ())]
    shares = attribute(stats, {"0": ["77"], "1": ["78"]}, lambda p: job_of_pid(str(tmp_path), p))
    got = {(s.jobid, s.key): s for s in shares}
    assert set(got) == {("77", "0"), ("78", "0"), ("78", "1")}
    assert got[("77", "0")].held and got[("77", "0")].mem == 5 << 30
    leak = got[("78", "0")]
    assert not leak.held and leak.mem == 2 << 30 and leak.energy_mj is None


def test_usage_ratios_by_hand():
    a = report.JobRow("1", user="u1", start=0.0, end=100.0, elapsed=100.0, gpus=2,
                      summary={"n1": {"dev": {"0": {"sm": 90.0, "idle": 0.0}, "1": {"sm": 30.0, "idle": 0.0}},
                                      "held": ["0", "1"]}})
    b = report.JobRow("2", user="u2", start=50.0, end=150.0, elapsed=100.0, gpus=1,
                      summary={"n1": {"dev": {"2/gi7": {"sm": 0.0, "idle": 1.0, "fr": 1 / 7}},
                                      "held": ["2/gi7"]}})
    c = report.JobRow("3", user="u3", start=0.0, end=100.0, elapsed=100.0, gpus=1)   # no summary
    u = report.usage([a, b, c], 0.0, 100.0, "user")
    assert u.used == pytest.approx(100 * 1.2)
    assert u.allocated == pytest.approx(200 + 50 / 7 + 100)      # b: half its time inside the period
    assert u.idle == pytest.approx(50 / 7)
    v = report.usage_view(u, 0.0, 100.0, 4.0, "user")
    assert v["cluster_utilisation"] == pytest.approx(120 / 400, rel=1e-3)
    assert v["top_idle"][0]["user"] == "u2"


def test_capacity_counts_mig_gres_by_slices():
    text = ("n1 gpu:nvidia_h100_80gb_hbm3:2(S:0),gpu:nvidia_h100_80gb_hbm3_1g.10gb:6(S:1),"
            "gpu:nvidia_h100_80gb_hbm3_4g.40gb:2(S:1)\nn1 gpu:nvidia_h100_80gb_hbm3:2(S:0)\nn2 gpu:8\n")
    assert report.capacity_gpus(text) == pytest.approx(2 + 6 / 7 + 8 / 7 + 8)


def test_verdicts_name_idle_low_and_headroom():
    v = report.verdicts([{"node": "n1", "device": "2", "sm": 0.0, "idle": 1.0, "mem": 0, "mt": 80000},
                         {"node": "n1", "device": "0", "sm": 12.0, "idle": 0.1, "mem": 1000, "mt": 80000,
                          "j": 7_200_000}])
    assert "GPU 2 on n1: idle (100% of samples)" in v
    assert "GPU 0 on n1: low utilisation (mean 12%)" in v
    assert any("memory headroom" in x for x in v) and v[-1].startswith("energy: 2.000 kWh")


def test_planted_or_malformed_records_are_ignored(tmp_path):
    from slurm_gpu.acct.store import Store
    store = Store(tmp_path / "acct")
    store.write("jobs", "5", {"jobid": "5", "devices": ["0"]})
    bad = store.path("jobs", "6")
    bad.write_text('{"jobid": "6", "devices": ["1"]}')
    bad.chmod(0o666)                                    # writable by anyone: not ours to trust
    (tmp_path / "acct" / "jobs" / "7.json").write_text("{not json")
    (tmp_path / "acct" / "jobs" / "../x.json").parent.mkdir(exist_ok=True)
    (tmp_path / "acct" / "jobs" / "8.json").symlink_to(store.path("jobs", "5"))
    assert list(store.registrations()) == ["5"]
    with pytest.raises(Exception):
        store.path("jobs", "../../etc/passwd")


def test_comment_with_a_broken_part_of_ours_still_merges():
    broken = "nhc: x slurm-gpu:{`n1`:{"
    value = dbd.merged(broken, "n2", part())
    other, ours = dbd.split(value)
    assert other == broken and set(ours) == {"n2"}


def test_prolog_ignores_malformed_gpu_lists(tmp_path):
    from slurm_gpu.acct import hooks
    from slurm_gpu.acct.settings import AcctSettings
    from slurm_gpu.acct.store import Store
    s = AcctSettings(enabled=True, dir=str(tmp_path / "acct"))
    env = {"SLURM_JOB_ID": "12", "SLURM_JOB_GPUS": "0,x,../1,99999,1"}
    reg = hooks.register(s, Store(s.dir), env, "n1", lambda: ["0", "1", "2"], None)
    assert reg["devices"] == ["0", "1"]
    with pytest.raises(Exception):
        hooks.register(s, Store(s.dir), {"SLURM_JOB_ID": "12/../13"}, "n1", lambda: [], None)
    from slurm_gpu import config
    conf = tmp_path / "c.toml"
    conf.write_text(f'[node]\nstate_dir = "{tmp_path}/var"\n[acct]\nenabled = true\n')
    config.use_config(str(conf))
    try:
        assert hooks.main("prolog", {"SLURM_JOB_ID": "bad"}) == 0        # never fails the job
        assert hooks.main("epilog", {"SLURM_JOB_ID": "12"}) == 0
    finally:
        config.use_config(None)


def test_a_shared_gpu_is_split_by_process(tmp_path):
    jobs = {10: "5", 11: "9", 12: "5"}
    st = DeviceStats(0, None, "GPU-a", 55.0, 9 << 30, 80 << 30, 300_000, 10_000,
                     (ProcUse(10, 1 << 30, sm=30.0), ProcUse(11, 2 << 30, sm=15.0), ProcUse(12, 1 << 30, sm=10.0)))
    got = {s.jobid: s for s in attribute([st], {"0": ["5", "6"]}, jobs.get)}
    assert (got["5"].held, got["5"].sm, got["5"].mem, got["5"].weight, got["5"].share) == (True, 40.0, 2 << 30, 1.0, 0.5)
    assert (got["6"].held, got["6"].sm, got["6"].mem, got["6"].weight, got["6"].busy) == (True, 0.0, 0, 0.0, False)
    assert (got["9"].held, got["9"].sm, got["9"].energy_mj) == (False, 15.0, None)       # a leak: its own SM
    # NVML gives no per-process figure: the job with processes is busy (never idle), not measured.
    blind = DeviceStats(0, None, "GPU-a", 55.0, 9 << 30, 80 << 30, 300_000, 10_000, (ProcUse(10, 1 << 30),))
    got = {s.jobid: s for s in attribute([blind], {"0": ["5", "6"]}, jobs.get)}
    assert (got["5"].sm, got["5"].busy, got["5"].weight) == (None, True, 1.0)
    assert (got["6"].sm, got["6"].weight) == (0.0, 0.0)
    # Held alone, unless its holder registered it as shared (gres/mps): the whole device.
    one = {s.jobid: s for s in attribute([st], {"0": ["5"]}, jobs.get)}
    assert (one["5"].sm, one["5"].share) == (55.0, None)
    one = {s.jobid: s for s in attribute([st], {"0": ["5"]}, jobs.get, {"0"})}
    assert (one["5"].sm, one["5"].share) == (40.0, 1.0)


def test_usage_counts_a_share_by_its_part_of_the_gpu():
    row = report.JobRow("1", user="u1", start=0.0, end=100.0, elapsed=100.0, gpus=0,
                        summary={"n1": {"dev": {"0": {"sm": 40.0, "idle": 0.25, "fr": 0.5, "sh": 1}}, "held": ["0"]}})
    u = report.usage([row], 0.0, 100.0, "user")
    assert (u.used, u.allocated, u.idle) == pytest.approx((40.0, 50.0, 12.5))


def test_metrics_name_every_job_of_a_shared_gpu():
    from slurm_gpu.acct import metrics
    st = DeviceStats(0, None, "GPU-a", 55.0, 9 << 30, 80 << 30, 300_000, 10_000)
    text = metrics.textfile([st], {"0": ["5", "6"]}, {}, True)
    assert 'slurm_gpu_allocated{gpu="0",UUID="GPU-a",jobid="5,6"} 1' in text
