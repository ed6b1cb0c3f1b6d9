"""The usage reader (hw/gpustats.py) over the simulator's scripted load."""
from __future__ import annotations

import json

import pytest

from slurm_gpu.errors import InputError
from slurm_gpu.hw.gpustats import StatsReader
from slurm_gpu_devkit.sim import SimNvml, load_facts
from slurm_gpu_devkit.sim.load import LOAD_SCHEMA, write_load
from paths import ROOT

MACHINES = ROOT / "tests" / "data" / "machines"
T0 = 1_700_000_000.0


def sim_for(machine: str, devices: dict, clock: float, **load) -> SimNvml:
    sim = SimNvml.from_facts(load_facts(str(MACHINES / machine / "facts.json")))
    sim.nvmlInit()
    with sim.edit() as st:
        st["load"] = {"schema": LOAD_SCHEMA, "t0": T0, "devices": devices, **load}
        st["clock"] = clock
    return sim


def tick(sim: SimNvml, clock: float) -> None:
    with sim.edit() as st:
        st["clock"] = clock


def test_whole_gpus_read_the_scripted_timeline():
    sim = sim_for("h100-sxm-8x", {
        "0": [{"t": 0, "sm": 90, "mem_mib": 1000, "power_w": 500, "pids": [{"pid": 11, "mem_mib": 1000}]},
              {"t": 100, "sm": 10, "power_w": 100}]}, T0 + 50, idle_power_w=70)
    r = StatsReader(sim)
    by = {d.key: d for d in r.read()}
    assert len(by) == 8 and not r.errors
    g0, g1 = by["0"], by["1"]
    assert (g0.sm, g0.mem_used, g0.power_mw) == (90.0, 1000 * 2**20, 500_000)
    assert [(p.pid, p.mem_bytes, p.gi) for p in g0.procs] == [(11, 1000 * 2**20, None)]
    assert (g1.sm, g1.mem_used, g1.power_mw, g1.procs) == (0.0, 0, 70_000, ())
    e50 = g0.energy_mj
    tick(sim, T0 + 150)
    g0 = {d.key: d for d in r.read()}["0"]
    # 50 s at 500 W, then 50 s at 100 W: the counter is the exact integral.
    assert g0.energy_mj - e50 == (50 * 500 + 50 * 100) * 1000
    assert (g0.sm, g0.mem_used) == (10.0, 1000 * 2**20)     # memory kept from the earlier entry


def test_mig_instances_get_gpm_utilisation_between_two_samples():
    sim = sim_for("h100-mig", {"2/gi2": [{"t": 0, "sm": 80, "mem_mib": 2000, "pids": [5]}],
                               "2/gi7": [{"t": 0, "sm": 0}, {"t": 10, "sm": 40}]}, T0)
    r = StatsReader(sim)
    first = {d.key: d for d in r.read()}
    assert first["2/gi2"].sm is None                  # GPM needs two samples
    assert first["2"].sm is None and first["2"].gi is None    # no utilisation on a MIG-enabled GPU
    assert [(p.pid, p.gi, p.ci) for p in first["2"].procs] == [(5, 2, 0)]
    assert [p.pid for p in first["2/gi2"].procs] == [5]
    assert first["2/gi2"].mem_total == 40448 * 2**20 and first["2/gi2"].mem_used == 2000 * 2**20
    tick(sim, T0 + 20)
    second = {d.key: d for d in r.read()}
    assert second["2/gi2"].sm == pytest.approx(80.0) and second["2/gi2"].sm_source == "gpm"
    assert second["2/gi7"].sm == pytest.approx(20.0)      # 10 s at 0, 10 s at 40
    assert second["0"].sm == 0.0 and second["0"].sm_source == "util"


def test_without_gpm_accounting_stands_in_and_unknown_stays_unknown():
    facts = load_facts(str(MACHINES / "h100-mig" / "facts.json"))
    for g in facts["gpus"]:
        g["architecture"] = "AMPERE"
    for accounting, want in ((True, 60.0), (False, None)):
        sim = SimNvml.from_facts(facts)
        sim.nvmlInit()
        with sim.edit() as st:
            st["load"] = {"schema": LOAD_SCHEMA, "t0": T0, "accounting": accounting,
                          "devices": {"2/gi2": [{"t": 0, "sm": 60, "pids": [9]}]}}
            st["clock"] = T0 + 30
        r = StatsReader(sim)
        r.read()
        got = {d.key: d for d in r.read()}["2/gi2"]
        assert got.sm == want


def test_load_file_is_checked_and_reread(tmp_path):
    p = tmp_path / "load.json"
    with pytest.raises(InputError):
        write_load(str(p), {"schema": LOAD_SCHEMA, "devices": {"0": [{"t": 0, "gpu": 5}]}})
    write_load(str(p), {"schema": LOAD_SCHEMA, "t0": T0, "devices": {"0": [{"t": 0, "sm": 30}]}})
    sim = SimNvml.from_facts(load_facts(str(MACHINES / "h100-sxm-8x" / "facts.json")))
    sim.nvmlInit()
    with sim.edit() as st:
        st["load_file"] = str(p)
        st["clock"] = T0 + 1
    assert {d.key: d for d in StatsReader(sim).read()}["0"].sm == 30.0
    write_load(str(p), {"schema": LOAD_SCHEMA, "t0": T0, "devices": {"0": [{"t": 0, "sm": 70}]}})
    assert {d.key: d for d in StatsReader(sim).read()}["0"].sm == 70.0
    p.write_text(json.dumps({"schema": "nope"}))
    with pytest.raises(InputError):
        StatsReader(sim).read()


def test_each_process_gets_its_own_sm_share_on_a_shared_gpu():
    """nvmlDeviceGetProcessUtilization: one sample per process with SM activity
    since the last read; one without a sample had none (0), not unknown."""
    sim = sim_for("h100-sxm-8x", {"0": [{"t": 0, "sm": 80, "pids": [{"pid": 5, "sm": 60, "mem_mib": 100},
                                                                     {"pid": 6, "sm": 20}, {"pid": 7}]}]},
                  T0 + 10)
    r = StatsReader(sim)
    g0 = {d.key: d for d in r.read()}["0"]
    assert {p.pid: p.sm for p in g0.procs} == {5: 60.0, 6: 20.0, 7: 0.0}
    g0 = {d.key: d for d in r.read()}["0"]                 # nothing newer: every process idle
    assert {p.pid: p.sm for p in g0.procs} == {5: 0.0, 6: 0.0, 7: 0.0}
    tick(sim, T0 + 20)
    assert {p.pid: p.sm for p in {d.key: d for d in r.read()}["0"].procs} == {5: 60.0, 6: 20.0, 7: 0.0}


def test_per_process_utilisation_is_unknown_in_mig_mode():
    sim = sim_for("h100-mig", {"2/gi2": [{"t": 0, "sm": 80, "pids": [{"pid": 5, "sm": 80}]}]}, T0)
    assert [p.sm for p in {d.key: d for d in StatsReader(sim).read()}["2"].procs] == [None]
