"""Real kernel lines (tests/data/xid/real_kernel_xid_lines_from_issues.md) classify correctly."""
from __future__ import annotations

import os
import re

import pytest

from slurm_gpu.health import xid
from slurm_gpu.health.findings import DRAIN, INFO, WARN, worst
from slurm_gpu.hw import kmsg
from kmsgfake import serving
from paths import ROOT

DATA = ROOT / "tests" / "data" / "xid" / "real_kernel_xid_lines_from_issues.md"
BLOCKS = dict(re.findall(r"## ([A-H])\. .*?```\n(.*?)```", DATA.read_text(), re.S))


def findings_of(text: str):
    return xid.check_xid(xid.parse_lines(kmsg.scan_buffer(text.encode())))


def by_code(fs):
    return {(f.xid, f.gpu): f for f in fs}


def test_79_after_pcie_aer_drains_and_names_the_aer_port():
    fs = findings_of(BLOCKS["A"])
    f = by_code(fs)[(79, "0000:02:00.0")]
    assert f.severity == DRAIN and f.check == "gpu.xid"
    assert "0000:00:02.0" in f.message and "AER" in f.message


def test_fallen_off_bus_without_xid_line_counts_as_79():
    fs = findings_of(BLOCKS["B"])
    assert [(f.xid, f.gpu, f.severity) for f in fs] == [(79, "0000:b3:00.0", DRAIN)]
    assert "no Xid line" in fs[0].message


def test_13_then_109_is_an_application_error():
    fs = findings_of(BLOCKS["C"])
    assert {(f.xid, f.severity) for f in fs} == {(13, INFO), (109, INFO)}
    assert worst(fs) == "ok"
    assert "3 reports" in by_code(fs)[(13, "0000:cb:00.0")].message


def test_45_caused_by_previous_nvlink5_xid_follows_the_cause():
    # the excerpt's "kernel: " tag proves nothing (test_xid_mutants.py): the driver's words are judged here
    fs = findings_of(re.sub(r"(?m)^kernel: ", "", BLOCKS["D"]))
    f = by_code(fs)[(45, "0000:dc:00.0")]
    assert f.severity == DRAIN and "caused by previous Xid 149" in f.message


def test_45_following_a_decoded_nonfatal_cause_stays_quiet():
    lines = ("NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 "
             "0x00000001 0x00000000 0x00100000 0x00000004)\n"
             "NVRM: Xid (PCI:0018:01:00): 45, pid=1, name=python3, Ch 00000001 caused by previous Xid 145\n")
    fs = by_code(findings_of(lines))
    assert fs[(145, "0018:01:00.0")].severity == INFO
    assert fs[(45, "0018:01:00.0")].severity == INFO


def test_45_alone_is_an_application_error():
    fs = findings_of("NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001\n")
    assert fs[0].severity == INFO


def test_nvlink5_144_145_149_decode():
    fs = by_code(findings_of(BLOCKS["E"]))
    assert fs[(144, "0000:01:00.0")].severity == INFO          # SAW_MVB status 0x8: IGNORE
    assert "SAW_MVB" in fs[(144, "0000:01:00.0")].message
    assert fs[(145, "0018:01:00.0")].severity == INFO          # RLW_RXPIPE status 0x8: IGNORE
    assert fs[(149, "0019:01:00.0")].severity == DRAIN         # NETIR, Link Fatal: RESET_GPU
    assert "RESET_GPU" in fs[(149, "0019:01:00.0")].message


def test_nvlink5_netir_link_event_subcodes():
    peer = "NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)\n"
    sw = "NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)\n"
    assert findings_of(peer)[0].severity == DRAIN
    assert "INVESTIGATE_PEER_DEVICE" in findings_of(peer)[0].message
    # sub-code 0x26: resolution IGNORE, cause SW/user, but "Link Fatal": a warning, not a drain
    assert findings_of(sw)[0].severity == WARN


def test_nvlink5_without_decodable_words_uses_the_logged_severity():
    fs = by_code(findings_of(BLOCKS["F"]))
    assert fs[(145, None)].severity == WARN
    assert fs[(137, None)].severity == INFO


def test_old_driver_format():
    fs = by_code(findings_of(BLOCKS["G"]))
    assert fs[(32, "0000:01:00.0")].severity == INFO and fs[(31, "0000:01:00.0")].severity == INFO


def test_app_only_logs_report_no_drain():
    text = BLOCKS["C"] + BLOCKS["G"] + "NVRM: Xid (PCI:0000:3b:00): 68, pid=5, name=ffmpeg, NVDEC0 Exception\n"
    assert worst(findings_of(text)) == "ok"


@pytest.mark.parametrize("line", [
    "[  812.401212] NVRM: Xid (PCI:0000:c1:00): 119, pid=2170, name=python, Timeout after 6s of waiting for RPC response from GPU0 GSP!",
    "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:c1:00): 119, pid=2170, name=python, Timeout waiting for RPC from GSP!",
    "2024-08-30T11:43:09,123456+00:00 NVRM: Xid (PCI:0000:c1:00): 119, pid=2170, name=python, Timeout waiting for RPC from GSP!",
    "3,1187,812401212,-;NVRM: Xid (PCI:0000:c1:00): 119, pid=2170, name=python, Timeout waiting for RPC from GSP!",
])
def test_gsp_timeout_drains_in_every_log_format(line):
    lines = kmsg.scan_buffer((line + "\n").encode())
    assert len(lines) == 1 and lines[0].when is not None
    fs = xid.check_xid(xid.parse_lines(lines))
    assert [(f.xid, f.gpu, f.severity) for f in fs] == [(119, "0000:c1:00.0", DRAIN)]


def test_gsp_timeout_in_a_syslog_file_only_warns():
    # "kernel:" in a syslog file is the sender's own claim (logger -t kernel writes it too)
    line = ("Aug 30 11:43:09 gpu-node-17 kernel: NVRM: Xid (PCI:0000:c1:00): 119, pid=2170, name=python, "
            "Timeout waiting for RPC from GSP!\n")
    fs = xid.check_xid(xid.parse_lines(kmsg.scan_buffer(line.encode())))
    assert [(f.xid, f.gpu, f.severity) for f in fs] == [(119, "0000:c1:00.0", "warn")]


def test_raw_kmsg_timestamp_is_seconds():
    lines = kmsg.scan_buffer(b"3,1187,812401212,-;NVRM: Xid (PCI:0000:c1:00): 79, GPU has fallen off the bus.\n")
    assert lines[0].when == "812.401212"


def test_file_cursor_counts_each_event_once_and_survives_rotation(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("[1.0] usb 1-1: new device\n[2.0] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.\n")
    lines, doc = kmsg.read_source(str(log), {})
    assert len(lines) == 1
    lines2, doc2 = kmsg.read_source(str(log), doc)
    assert lines2 == []
    with open(log, "a") as f:
        f.write("[3.0] NVRM: Xid (PCI:0000:03:00): 13, pid=1, name=a, Graphics Exception\n[4.0] NVRM: Xid (PCI:0000:04:0")
    lines3, doc3 = kmsg.read_source(str(log), doc2)
    assert [l.text.split(": ")[2][:2] for l in lines3] == ["13"]  # the half-written line waits
    with open(log, "a") as f:
        f.write("0): 79, GPU has fallen off the bus.\n")
    lines4, doc4 = kmsg.read_source(str(log), doc3)
    assert len(lines4) == 1 and "0000:04:00" in lines4[0].text
    os.rename(log, tmp_path / "kern.log.1")            # rotation: new inode, read from the top
    log.write_text("[9.0] NVRM: Xid (PCI:0000:05:00): 48, pid=1, DBE\n")
    lines5, _ = kmsg.read_source(str(log), doc4)
    assert len(lines5) == 1 and "0000:05:00" in lines5[0].text


def test_file_cursor_sees_copytruncate_refilled_past_the_old_offset(tmp_path):
    # logrotate copytruncate keeps the inode; by the next run the new log may
    # already be longer than the old offset.  Its first events must not be skipped.
    log = tmp_path / "kern.log"
    log.write_text("[1.0] NVRM: Xid (PCI:0000:02:00): 13, pid=1, name=a, Graphics Exception\n")
    _, doc = kmsg.read_source(str(log), {})
    with open(log, "r+") as f:
        f.truncate(0)
        f.write("[5.0] NVRM: Xid (PCI:0000:07:00): 79, GPU has fallen off the bus.\n" + "[6.0] usb 1-1: x\n" * 20)
    lines, doc2 = kmsg.read_source(str(log), doc)
    assert [l.text for l in lines] == ["NVRM: Xid (PCI:0000:07:00): 79, GPU has fallen off the bus."]
    assert kmsg.read_source(str(log), doc2)[0] == []          # and then it is counted once


def test_event_file_cursor_sees_copytruncate_refilled_past_the_old_offset(tmp_path):
    import json as _json
    ev = tmp_path / "xid-events.jsonl"
    ev.write_text(_json.dumps({"event": "xid", "xid": 13, "gpu": "0000:07:00.0", "time": 1}) + "\n")
    _, doc = kmsg.read_events(str(ev), {})
    with open(ev, "r+") as f:
        f.truncate(0)
        f.write(_json.dumps({"event": "xid", "xid": 79, "gpu": "0000:07:00.0", "time": 2}) + "\n" +
                _json.dumps({"event": "other", "time": 3, "gpu": None}) + "\n")
    recs, doc2 = kmsg.read_events(str(ev), doc)
    assert [r.get("xid") for r in recs] == [79, None]
    assert kmsg.read_events(str(ev), doc2)[0] == []


def test_missing_kernel_log_is_one_clear_error(tmp_path):
    from slurm_gpu.errors import InputError
    with pytest.raises(InputError) as e:
        kmsg.read_source(str(tmp_path / "nope.log"), {})
    assert "kernel log not found" in e.value.line()


def test_kmsg_device_reader_uses_sequence_cursor(tmp_path):
    recs = [b"6,10,100,-;usb 1-1: new device\n", b"3,11,200,-;NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.\n SUBSYSTEM=pci\n"]
    dev = tmp_path / "kmsg"
    dev.write_bytes(b"")
    with serving(recs):
        lines, cur = kmsg.read_kmsg(None, device=str(dev))
    assert cur.seq == 11 and len(lines) == 1 and lines[0].when == "0.000200"
    with serving(recs):
        lines, cur2 = kmsg.read_kmsg(cur, device=str(dev))
    assert lines == [] and cur2.seq == 11
    with serving(recs, boot="boot-b"):                # a new boot restarts the sequence
        lines, _ = kmsg.read_kmsg(cur, device=str(dev))
    assert len(lines) == 1
