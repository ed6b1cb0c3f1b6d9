"""The shipped XID catalog: complete, regenerable, and every class maps to its action."""
from __future__ import annotations

import importlib.util

import pytest

from slurm_gpu.health import xid
from slurm_gpu.health.findings import DRAIN, INFO, WARN
from paths import ROOT

GEN = ROOT / "tests" / "data" / "xid" / "build_xid_catalog.py"
SHIPPED = ROOT / "slurm_gpu" / "data" / "xid_catalog.json"


def _gen():
    spec = importlib.util.spec_from_file_location("build_xid_catalog", GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_shipped_catalog_is_the_generator_output():
    assert SHIPPED.read_text() == _gen().render()


def test_all_172_codes_with_buckets_and_provenance():
    cat = xid.catalog()
    assert sorted(int(c) for c in cat["codes"]) == list(range(1, 173))
    assert "docs.nvidia.com" in cat["provenance"]["source"]
    for e in cat["codes"].values():
        assert e["action"] in (DRAIN, WARN, INFO)
        assert "immediate" in e and "investigatory" in e


BUCKETS = _gen().BUCKET_ACTION
OVERRIDES = _gen().OVERRIDES


@pytest.mark.parametrize("code", range(1, 173))
def test_every_code_follows_its_bucket_or_a_documented_override(code):
    e = xid.entry(code)
    if code in OVERRIDES:
        assert (e["action"], e["kind"]) == OVERRIDES[code][:2]
        assert e["override"]
    else:
        assert (e["action"], e["kind"]) == BUCKETS[e["immediate"]]


@pytest.mark.parametrize("bucket,action", [
    ("RESET_GPU", DRAIN), ("RESTART_BM", DRAIN), ("CONTACT_SUPPORT", DRAIN), ("CHECK_MECHANICALS", DRAIN),
    ("WORKFLOW_NVLINK_ERR", DRAIN), ("WORKFLOW_XID_48", DRAIN), ("RESTART_APP", INFO), ("IGNORE", INFO),
    ("UPDATE_SWFW", WARN), ("RESTART_VM", WARN), ("CHECK_UVM", WARN)])
def test_each_resolution_class_maps_to_its_action(bucket, action):
    codes = [int(c) for c, e in xid.catalog()["codes"].items() if e["immediate"] == bucket and int(c) not in OVERRIDES]
    assert codes, bucket
    for c in codes:
        ev = xid.XidEvent(code=c, gpu="0000:07:00.0", text="")
        assert xid.classify(ev).action == action, c


@pytest.mark.parametrize("code", [13, 31, 43, 45, 68, 109])
def test_application_xids_never_drain(code):
    ev = xid.XidEvent(code=code, gpu="0000:07:00.0")
    v = xid.classify(ev)
    assert v.action == INFO and v.kind == "application"


@pytest.mark.parametrize("code", [79, 119, 48, 64, 74, 95, 46, 62, 140, 167, 171])
def test_hardware_xids_drain(code):
    assert xid.classify(xid.XidEvent(code=code, gpu="0000:07:00.0")).action == DRAIN


def test_every_restart_app_code_is_application_kind():
    for c, e in xid.catalog()["codes"].items():
        if e["immediate"] == "RESTART_APP":
            assert e["action"] == INFO and e["kind"] == "application", c


def test_nvlink5_table_covers_144_to_150():
    rules = xid.catalog()["nvlink5_rules"]
    assert {r["xid"] for r in rules} == set(range(144, 151))
    assert all(len(r["intrinfo_v1"]) == 32 and len(r["intrinfo_v2"]) == 32 for r in rules)


def test_unknown_code_warns_not_drains():
    assert xid.classify(xid.XidEvent(code=999, gpu=None)).action == WARN


def test_recovery_154_to_none_is_info_else_drain():
    none = xid.XidEvent(154, "0000:07:00.0", text="GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)")
    reset = xid.XidEvent(154, "0000:07:00.0", text="GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)")
    assert xid.classify(none).action == INFO
    assert xid.classify(reset).action == DRAIN


def test_recovery_154_from_nvml_alone_does_not_drain_a_recovered_gpu():
    # After a reset the driver reports 154 "... to 0x0 (None)"; xid-watch sees the
    # same 154 as a bare NVML event.  It must not turn the recovery into a drain.
    kernel = xid.XidEvent(154, "0000:07:00.0", text="GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)")
    events, _ = xid.events_from_nvml([{"event": "xid", "xid": 154, "gpu": "0000:07:00.0"}])
    fs = xid.check_xid([kernel, *events])
    assert [(f.xid, f.severity) for f in fs] == [(154, WARN)]
    assert xid.check_xid(events)[0].severity == WARN


# ------------------------------------------------ what a fault does to the job

@pytest.mark.parametrize("code,job", [(79, "fatal"), (95, "fatal"), (48, "fatal"), (119, "fatal"),
                                      (94, "process"), (13, "process"), (43, "process"), (109, "process"),
                                      (64, "none"), (156, "none"), (63, "none"), (92, "none")])
def test_the_catalog_says_what_a_fault_does_to_the_job_on_the_gpu(code, job):
    assert xid.entry(code)["job"] == job


def test_job_impact_follows_nvidia_columns_not_a_list():
    gen = _gen()
    for c, e in xid.catalog()["codes"].items():
        if int(c) in gen.JOB_OVERRIDES:
            assert e["job"] == gen.JOB_OVERRIDES[int(c)][0]
        elif e["kind"] == "application":
            assert e["job"] == "process", c
        elif e["immediate"] in gen.JOB_FATAL_BUCKETS:
            assert e["job"] == ("none" if "RETIREMENT" in e["mnemonic"] else "fatal"), c
        else:
            assert e["job"] == "none", c


def test_a_fatal_finding_is_marked_and_a_contained_one_is_not():
    fs = xid.check_xid([xid.XidEvent(79, "0000:18:00.0"), xid.XidEvent(94, "0000:19:00.0"),
                        xid.XidEvent(64, "0000:1a:00.0"),
                        xid.XidEvent(45, "0000:1b:00.0", cause=95)])
    by = {f.xid: f for f in fs}
    assert by[79].fatal and by[45].fatal
    assert not by[94].fatal and not by[64].fatal
    assert by[64].severity == DRAIN       # drains the node, kills nothing
    assert "fatal" not in by[79].to_json()


def test_nvml_events_mark_lost_gpus_dbe_and_reset_recovery_fatal():
    _, direct = xid.events_from_nvml([
        {"event": "dbe", "gpu": "0000:18:00.0"}, {"event": "gpu_unavailable", "gpu": "0000:19:00.0"},
        {"event": "recovery_action", "gpu": "0000:1a:00.0", "data": 1},
        {"event": "recovery_action", "gpu": "0000:1b:00.0", "data": 4}])
    assert [f.fatal for f in direct] == [True, True, True, False]
    v = xid.classify(xid.XidEvent(154, "0000:18:00.0",
                                  text="GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"))
    assert v.job == "fatal"


def test_every_text_the_catalog_gives_a_finding_is_one_line():
    # NVIDIA's spreadsheet has line breaks inside cells (Xid 13's mnemonic,
    # 45's resolution, 62's description): a finding is one line of `health`
    # output and of --json's "message", whatever code it names.
    cat = xid.catalog()
    texts = [v for e in cat["codes"].values() for v in e.values() if isinstance(v, str)]
    texts += [v for r in cat["nvlink5_rules"] for v in r.values() if isinstance(v, str)]
    assert [t for t in texts if t != " ".join(t.split())] == []
    # a real Xid 62 (Kubuntu 15.04 forum post quoting dmesg; code index id 56800496124)
    real = ("[  121.331400] NVRM: GPU at PCI:0000:01:00: GPU-b47b78f9-b9d9-272f-5f10-043e977b5633\n"
            "[  121.331414] NVRM: Xid (PCI:0000:01:00): 62, 12b2(1fa0) 00000000 00000000\n")
    from slurm_gpu.hw import kmsg
    fs = xid.check_xid(xid.parse_lines(kmsg.scan_buffer(real.encode())))
    assert [(f.xid, f.severity, f.message) for f in fs] == [
        (62, DRAIN, "Xid 62 on 0000:01:00.0: Internal micro-controller halt (newer drivers)")]
