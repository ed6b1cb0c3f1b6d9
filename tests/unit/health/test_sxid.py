"""gpu.sxid: NVSwitch SXid lines (real, tests/data/xid/sxid_lines.txt) through the trusted kernel-log reader."""
from __future__ import annotations


import pytest

from slurm_gpu.health import engine, sxid
from slurm_gpu.health.findings import DRAIN, INFO, WARN
from slurm_gpu.health.settings import HealthSettings
from slurm_gpu.hw import kmsg
from paths import ROOT

LINES = ROOT / "tests" / "data" / "xid" / "sxid_lines.txt"


def read(text: str):
    return kmsg.scan_buffer(text.encode())


def test_real_lines_are_parsed_and_classified():
    evs = sxid.parse_lines(read(LINES.read_text()))
    assert [(e["code"], e["bus"], e["link"], e["fatal"]) for e in evs] == [
        (20034, "0000:06:00.0", 48, True), (20034, "0000:05:00.0", 63, True),
        (22013, "0000:08:00.0", 60, False), (12028, "0000:05:00.0", 32, False),
        (20009, "0000:c3:00.0", 28, False)]          # the "Severity 0 Engine ..." detail line is no report
    by = {(f.message.split()[1], f.message.split()[4].rstrip(":")): f for f in sxid.check_sxid(evs)}
    assert by[("20034", "0000:06:00.0")].severity == DRAIN
    assert by[("12028", "0000:05:00.0")].severity == WARN      # non-fatal report, NVIDIA pairs it with a reboot
    assert by[("22013", "0000:08:00.0")].severity == INFO
    assert by[("20009", "0000:c3:00.0")].severity == INFO
    f = by[("20034", "0000:06:00.0")]
    assert f.check == "gpu.sxid" and f.gpu is None
    assert f.message.startswith("SXid 20034 on NVSwitch 0000:06:00.0 link 48: LTSSM Fault Up (fatal")


def test_unknown_code_fatal_drains_nonfatal_warns():
    assert sxid.classify({"code": 99999, "fatal": True, "link": 1})[0] == DRAIN
    assert sxid.classify({"code": 99999, "fatal": False, "link": 1})[0] == WARN


@pytest.mark.parametrize("line", [
    # logger / a job writing to syslog: the tag is not "kernel"
    "Nov 24 14:00:00 n1 sgtest1: nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 1 LTSSM Fault Up",
    # a userspace record in /dev/kmsg: facility 1 (user), priority 11
    "11,55,1000,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 1 LTSSM Fault Up",
    # text before the driver's prefix
    "[  1.000000] myprog: nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 1 LTSSM Fault Up",
    # a continuation of someone else's record
    "[  1.000000] usb 1-1: Product: x\n  nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 1 x",
])
def test_forged_sxid_lines_never_count(line):
    assert sxid.parse_lines(read(line + "\n")) == []


def test_kernel_written_kmsg_record_counts():
    rec = "3,55,1000,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 1 LTSSM Fault Up\n"
    assert [e["code"] for e in sxid.parse_lines(read(rec))] == [20034]


def test_engine_drains_on_a_fatal_sxid(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(LINES.read_text())
    s = HealthSettings(kernel_log=str(log))
    r = engine.run(engine.Options(node="n1", settings=s, state_dir=str(tmp_path / "st"),
                                  only=["gpu.sxid"], no_drain=True))
    assert r.status == "drain" and all(f.check == "gpu.sxid" for f in r.findings)
    assert "gpu.sxid" in engine.select_checks(None, s)
