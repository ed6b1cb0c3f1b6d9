"""Every construct the kernel-log reader and the XID parser skip over lets the
read go on: each later Xid in that read is still found (issue 24 §8: a
``continue`` turned into ``break`` after a continuation line or a one-line
"fallen off the bus" survived every test).
"""
from __future__ import annotations

import json

import pytest

from slurm_gpu.health import sxid, xid
from slurm_gpu.hw import kmsg

LATER = ("[900.000000] NVRM: Xid (PCI:0000:e1:00): 48, pid=1, name=a, DBE\n"
         "[901.000000] nvidia-nvswitch2: SXid (PCI:0000:e2:00.0): 20034, Fatal, Link 48 LTSSM Fault Up\n"
         "[902.000000] NVRM: Xid (PCI:0000:e3:00): 79, GPU has fallen off the bus.\n")
LATER_XIDS = [(48, "0000:e1:00.0"), (79, "0000:e3:00.0")]
# Each log starts as dmesg's: a file's first line fixes its format (kmsg_scan.FAMILY),
# and here every construct sits inside a dmesg log.
HEAD = "[0.100000] Linux version 6.8.0\n"

BEFORE = {
    "xid line": "[1.000000] NVRM: Xid (PCI:0000:02:00): 13, pid=1, name=a, Graphics Exception\n",
    "one-line fallen off the bus": "[1.000000] NVRM: GPU 0000:02:00.0: GPU has fallen off the bus.\n",
    "old one-line fallen off the bus": "[1.000000] NVRM: GPU at PCI:0000:02:00: GPU has fallen off the bus.\n",
    "three-line fallen off the bus": ("[1.000000] NVRM: The NVIDIA GPU 0000:02:00.0\n"
                                      "           NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
                                      "           NVRM: fallen off the bus and is not responding to commands.\n"),
    "three-line, cut short": ("[1.000000] NVRM: The NVIDIA GPU 0000:02:00.0\n"
                              "           NVRM: (PCI ID: 10de:26b5) installed in this system has\n"),
    "continuation after an xid": ("[1.000000] NVRM: Xid (PCI:0000:02:00): 120, GSP task exception\n"
                                  "           NVRM:     Reported by libos partition:4#5\n"),
    "continuation of nothing": "           NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.\n",
    "aer report": "[1.000000] pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010\n",
    "api mismatch record": ("[1.000000] NVRM: API mismatch: the client has the version 1\n"
                            "           NVRM: Xid (PCI:0000:02:00): 79, x, but\n"
                            "           NVRM: this kernel module has the version 550.54.15.  Please\n"),
    # (a file whose first line is a syslog text line proves nothing at all: kmsg_scan.TEXT_LOG;
    # here the syslog lines sit in a log that starts as dmesg's)
    "api mismatch, syslog split": ("[0.500000] usb 1-1: new device\n"
                                   "Dec 22 11:26:00 n1 kernel: [ 1.000000] NVRM: API mismatch: the client has the "
                                   "version 1\nDec 22 11:26:00 n1 kernel: [ 1.000000] NVRM: Xid (PCI:0000:02:00): "
                                   "79, x, but\n"),
    "api mismatch, 1-second stamps": ("[0.500000] usb 1-1: new device\n"
                                      "Dec 22 11:26:00 n1 kernel: NVRM: API mismatch: the client has the version 1\n"
                                      "Dec 22 11:26:00 n1 kernel: NVRM: Xid (PCI:0000:02:00): 79, x, but\n"),
    "kmsg record with continuations": ("3,1,1000,-;NVRM: Xid (PCI:0000:02:00): 13, a\\x0aNVRM: more\n"),
    "user record": "14,2,1000,-;NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.\n",
    "two hits on one line": "[1.000000] NVRM: GPU 0000:02:00.0: NVRM: Xid (PCI:0000:02:00): 79, x\n",
    "text before the driver": "[1.000000] usb 1-1: Product: NVRM: Xid (PCI:0000:02:00): 79, x\n",
    "unproven line": "fluentd | NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.\n",
    "journal json": json.dumps({"_TRANSPORT": "kernel", "SYSLOG_FACILITY": "0",
                                "MESSAGE": "NVRM: Xid (PCI:0000:02:00): 13, a\nNVRM: more"}) + "\n",
    "journal json of a user": json.dumps({"_TRANSPORT": "stdout", "MESSAGE": "NVRM: Xid (PCI:0000:02:00): 79, x"})
    + "\n",
    "bare line in a stamped log": "[1.000000] usb 1-1: x\nNVRM: Xid (PCI:0000:02:00): 79, x\n",
}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_every_later_report_is_still_found(name):
    lines = kmsg.scan_buffer((HEAD + BEFORE[name] + LATER).encode())
    events = [(e.code, e.gpu) for e in xid.parse_lines(lines) if e.untrusted is None]
    assert events[-2:] == LATER_XIDS, (name, events)
    assert [(r["code"], r["bus"]) for r in sxid.parse_lines(lines)][-1:] == [(20034, "0000:e2:00.0")]


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_every_later_report_is_still_found_in_a_file(tmp_path, name, monkeypatch):
    # the same through the chunked file reader, with chunks smaller than a line
    monkeypatch.setattr(kmsg, "CHUNK", 16)
    log = tmp_path / "kern.log"
    log.write_text(HEAD + BEFORE[name] + LATER)
    lines, _ = kmsg.read_file(log)
    assert [(e.code, e.gpu) for e in xid.parse_lines(lines) if e.untrusted is None][-2:] == LATER_XIDS


def test_later_records_from_dev_kmsg_are_found(monkeypatch):
    from kmsgfake import serving
    recs = [b"3,10,100,-;NVRM: The NVIDIA GPU 0000:02:00.0\\x0aNVRM: (PCI ID: 10de:26b5) installed in this system"
            b" has\n", b"12,11,150,-;NVRM: Xid (PCI:0000:02:00): 79, forged\n",
            b"3,12,200,-;NVRM: Xid (PCI:0000:e1:00): 48, pid=1, name=a, DBE\n SUBSYSTEM=pci\n",
            b"3,13,300,-;NVRM: Xid (PCI:0000:e3:00): 79, GPU has fallen off the bus.\n"]
    with serving(recs):
        lines, cur = kmsg.read_kmsg(None, device="/dev/null")
    assert [(e.code, e.gpu) for e in xid.parse_lines(lines)] == LATER_XIDS and cur.seq == 13


def test_two_driver_prefixes_on_one_line_do_not_stop_the_scan():
    line = ("[1.000000] NVRM: GPU 0000:02:00.0: AER: Uncorrected nvidia-nvswitch0: SXid (PCI:0000:02:00.0): "
            "20034, Fatal\n")
    lines = kmsg.scan_buffer((line + LATER).encode())
    assert [(e.code, e.gpu) for e in xid.parse_lines(lines)] == LATER_XIDS


def test_kmsg_three_line_fallen_off_the_bus_then_later_records():
    from kmsgfake import serving
    recs = [b"3,10,100,-;NVRM: The NVIDIA GPU 0000:02:00.0\\x0aNVRM: (PCI ID: 10de:26b5) installed in this system"
            b" has\\x0aNVRM: fallen off the bus and is not responding to commands.\n",
            b"3,12,200,-;NVRM: Xid (PCI:0000:e1:00): 48, pid=1, name=a, DBE\n",
            b"3,13,300,-;NVRM: Xid (PCI:0000:e3:00): 79, GPU has fallen off the bus.\n"]
    with serving(recs):
        lines, _ = kmsg.read_kmsg(None, device="/dev/null")
    assert [(e.code, e.gpu) for e in xid.parse_lines(lines)] == [(79, "0000:02:00.0")] + LATER_XIDS


def test_kmsg_reader_reads_on_past_overwritten_and_malformed_records():
    import errno
    from unittest import mock
    recs = [OSError(errno.EPIPE, "Broken pipe"), b"3,x,100,-;NVRM: Xid (PCI:0000:02:00): 79, malformed\n",
            OSError(errno.EINVAL, "Invalid argument"),
            b"3,12,200,-;NVRM: Xid (PCI:0000:e1:00): 48, pid=1, name=a, DBE\n",
            b"3,13,300,-;NVRM: Xid (PCI:0000:e3:00): 79, GPU has fallen off the bus.\n"]
    it = iter(recs)

    def fake_read(fd: int, n: int) -> bytes:
        r = next(it, None)
        if r is None:
            raise BlockingIOError
        if isinstance(r, OSError):
            raise r
        return r
    with mock.patch.object(kmsg.os, "read", fake_read), mock.patch.object(kmsg, "boot_id", lambda: "b"):
        lines, cur = kmsg.read_kmsg(None, device="/dev/null")
    assert [(e.code, e.gpu) for e in xid.parse_lines(lines)] == LATER_XIDS and cur.seq == 13


def test_event_file_reads_on_past_torn_lines(tmp_path):
    ev = tmp_path / "xid-events.jsonl"
    ev.write_text('{"event": "xid", "xid": 79, "gpu"\n[1, 2]\n{"event": "recovery_action", "gpu": "0000:e0:00.0", '
                  '"data": "x"}\n' + json.dumps({"event": "xid", "xid": 48, "gpu": "0000:e1:00.0"}) + "\n"
                  + json.dumps({"event": "xid", "xid": 79, "gpu": "0000:e3:00.0"}) + "\n")
    recs, _ = kmsg.read_events(str(ev), {})
    xids, direct = xid.events_from_nvml(recs)
    assert [(e.code, e.gpu) for e in xids] == LATER_XIDS and direct == []
