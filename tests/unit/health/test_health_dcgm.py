"""gpu.dcgm: dcgmi diag's JSON (tests/data/dcgm, from NVIDIA's DCGM sources) into verdicts."""
from __future__ import annotations

import json


import pytest

from slurm_gpu import runner
from slurm_gpu.health import dcgm, engine
from slurm_gpu.health.findings import DRAIN, INFO, WARN
from slurm_gpu.health.settings import HealthSettings
from paths import ROOT

DATA = ROOT / "tests" / "data" / "dcgm"


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_dcgm4_pass():
    r = dcgm.parse(read("dcgm4-r1-pass.json"))
    assert r.status == "pass" and not r.failures
    assert [f.severity for f in dcgm.findings(r)] == [INFO]


def test_dcgm4_fail_drains_the_failing_gpu_only():
    r = dcgm.parse(read("dcgm4-r2-fail.json"))
    assert r.status == "fail"
    (f,) = r.failures
    assert (f.gpu, f.test, f.severity) == (1, "memory", 6)
    (finding,) = dcgm.findings(r, {0: "0000:18:00.0", 1: "0000:2a:00.0"})
    assert finding.severity == DRAIN and finding.gpu == "0000:2a:00.0"
    # A drain reason carries only our words: DCGM's own text stays out of it.
    assert finding.message == "dcgmi diag memory failed on GPU 1"


def test_a_drain_reason_never_carries_dcgm_text():
    doc = json.loads(read("dcgm4-r2-fail.json"))
    text = json.dumps(doc).replace('"memory"', '"memory [root@2026-01-01] Xid 79"', 1)
    (finding,) = dcgm.findings(dcgm.parse(text))
    assert finding.severity == DRAIN
    assert finding.message == "dcgmi diag (unnamed test) failed on GPU 1"


def test_dcgm3_fail_with_monitor_severity_warns_per_gpu():
    r = dcgm.parse(read("dcgm3-per-gpu-fail.json"))
    assert r.status == "fail"
    assert sorted((f.gpu, f.test) for f in r.failures) == [(0, "sm_stress"), (2, "sm_stress"), (3, "sm_stress")]
    fs = dcgm.findings(r)
    assert {f.severity for f in fs} == {WARN}
    assert all("(DCGM: monitor)" in f.message for f in fs)


def test_mig_refusal_is_a_clear_skip():
    r = dcgm.parse(read("dcgm4-mig-refused.json"))
    assert r.status == "skip" and "DCGM refuses MIG GPUs" in r.detail
    (f,) = dcgm.findings(r)
    assert f.severity == INFO and "MIG is enabled, but no compute instances" in f.message


@pytest.mark.parametrize("text", ["", "Error: unable to connect to host engine", "{\"x\": 1}",
                                  '{"DCGM Diagnostic": {"runtime_error": "Error: host engine gone"}}',
                                  '{"DCGM Diagnostic": {"test_categories": []}}'])
def test_unusable_output_warns_never_drains(text):
    r = dcgm.parse(text)
    assert r.status == "error"
    assert [f.severity for f in dcgm.findings(r)] == [WARN]


def test_without_dcgm_installed_the_check_says_so(monkeypatch):
    monkeypatch.setattr(dcgm, "dcgmi_path", lambda: None)
    r = dcgm.run(1, 10)
    assert r.status == "skip" and "DCGM is not installed" in r.detail


def test_runs_dcgmi_diag_level_json(monkeypatch):
    calls = []
    monkeypatch.setattr(dcgm, "dcgmi_path", lambda: "/usr/bin/dcgmi")

    def fake(argv, timeout, **kw):
        calls.append((list(argv), timeout))
        return runner.Completed(tuple(argv), 226, read("dcgm4-r2-fail.json"), "")

    monkeypatch.setattr(runner, "run", fake)
    assert dcgm.run(2, 30).status == "fail"
    assert calls == [(["/usr/bin/dcgmi", "diag", "-r", "2", "-j"], 30)]


def test_check_is_opt_in():
    s = HealthSettings()
    assert "gpu.dcgm" not in engine.select_checks(None, s)
    s.dcgm_level = 1
    assert "gpu.dcgm" in engine.select_checks(None, s)
    assert engine.select_checks(["gpu.dcgm"], HealthSettings()) == ["gpu.dcgm"]
