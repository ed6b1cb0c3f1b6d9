"""Journal export files (``journalctl -o export``): the kernel's entries only (issue 24 §6).

The entries are written here as journalctl writes them (systemd's
JOURNAL_EXPORT_FORMATS: ``KEY=value`` for printable text, else ``KEY``, a
newline, the value's length as 64-bit little endian, the value and a
newline; an empty line after each entry).  What a program logs can hold the
text of a whole fake entry; journald exports such a value in the binary
form, and the reader steps over it by its length.
"""
from __future__ import annotations

import struct

import pytest

from slurm_gpu.health import engine, xid
from slurm_gpu.health.findings import DRAIN
from slurm_gpu.health.settings import HealthSettings
from slurm_gpu.hw import kmsg

XID79 = "NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."
OFF_BUS_3 = ("NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\n"
             "NVRM: fallen off the bus and is not responding to commands.")


def field(key: str, value: str | bytes) -> bytes:
    v = value.encode() if isinstance(value, str) else value
    if all(32 <= c < 127 or c >= 128 for c in v) and b"\n" not in v:
        return key.encode() + b"=" + v + b"\n"
    return key.encode() + b"\n" + struct.pack("<Q", len(v)) + v + b"\n"


N = [0]


def entry(transport: str, message: str | bytes, **extra: str | bytes) -> bytes:
    N[0] += 1
    head = [("__CURSOR", f"s=0;i={N[0]:x}"), ("__REALTIME_TIMESTAMP", str(1700000000000000 + N[0])),
            ("__MONOTONIC_TIMESTAMP", str(5000000 + N[0])), ("_BOOT_ID", "0" * 32), ("_TRANSPORT", transport)]
    if transport == "kernel":
        head += [("SYSLOG_FACILITY", "0"), ("SYSLOG_IDENTIFIER", "kernel"),
                 ("_SOURCE_MONOTONIC_TIMESTAMP", str(4000000 + N[0]))]
    head += list(extra.items())
    return b"".join(field(k, v) for k, v in head) + field("MESSAGE", message) + field("_HOSTNAME", "n1") + b"\n"


def verdicts(tmp_path, data: bytes) -> list[tuple]:
    log = tmp_path / "kern.export"
    log.write_bytes(data)
    lines, _ = kmsg.read_file(log)
    return sorted((f.xid, f.gpu, f.severity) for f in xid.check_xid(xid.parse_lines(lines)))


def test_kernel_entries_drain(tmp_path):
    data = (entry("kernel", "usb 1-1: new device") + entry("kernel", XID79)
            + entry("kernel", OFF_BUS_3) + entry("stdout", "hello"))
    assert verdicts(tmp_path, data) == [(79, "0000:02:00.0", DRAIN), (79, "0000:b3:00.0", DRAIN)]


def test_the_health_run_reads_an_export_file(tmp_path):
    log = tmp_path / "kern.export"
    log.write_bytes(entry("kernel", XID79))
    rep = engine.run(engine.Options(node="n1", settings=HealthSettings(kernel_log=str(log)), state_dir="",
                                    only=["gpu.xid"], no_drain=True))
    assert rep.status == DRAIN


FAKE_ENTRY = ("\n\n__CURSOR=s=0;i=ff\n__REALTIME_TIMESTAMP=1\n_TRANSPORT=kernel\nSYSLOG_FACILITY=0\n"
              f"MESSAGE={XID79}\n\n")

FORGED = {
    "syslog claims kernel": lambda: entry("syslog", XID79, SYSLOG_FACILITY="0"),
    "kernel transport, user facility": lambda: entry("kernel", XID79).replace(b"SYSLOG_FACILITY=0", b"SYSLOG_FACILITY=1"),
    "stdout": lambda: entry("stdout", XID79),
    "journal with a fake entry in its message": lambda: entry("journal", "x" + FAKE_ENTRY),
    "fake entry in another field": lambda: entry("journal", "hi", CODE_FUNC="x" + FAKE_ENTRY),
    "fake entry with a newline-rich length": lambda: entry("syslog", ("y" * (0x0a0a - len(FAKE_ENTRY) - 1)) + "x"
                                                           + FAKE_ENTRY),
    "fake entry at the very end of a message": lambda: entry("stdout", FAKE_ENTRY.rstrip("\n")),
    "kernel entry, driver text not first": lambda: entry("kernel", "usb 1-1: Product: " + XID79),
}


@pytest.mark.parametrize("name", sorted(FORGED))
def test_what_a_program_logs_never_drains(tmp_path, name):
    data = entry("kernel", "usb 1-1: new device") + FORGED[name]() + entry("kernel", "usb 1-1: gone")
    assert verdicts(tmp_path, data) == []
    # ...and a real report after it is still read
    assert verdicts(tmp_path, data + entry("kernel", XID79)) == [(79, "0000:02:00.0", DRAIN)]


def test_the_newline_rich_length_is_what_it_claims():
    data = FORGED["fake entry with a newline-rich length"]()
    assert b"MESSAGE\n\n\n" in data


def test_cursor_stops_at_the_last_whole_entry(tmp_path, monkeypatch):
    monkeypatch.setattr(kmsg, "CHUNK", 64)              # entries and binary values cross chunks
    log = tmp_path / "kern.export"
    first = entry("kernel", OFF_BUS_3) + entry("journal", "x" * 300 + FAKE_ENTRY)
    second = entry("kernel", XID79.replace("02:00", "03:00"))
    log.write_bytes(first + second[:-40])               # the last entry is being written
    lines, doc = kmsg.read_source(str(log), {})
    assert [e.code for e in xid.parse_lines(lines)] == [79]
    assert doc["files"][str(log)]["offset"] == len(first)
    log.write_bytes(first + second)
    lines, doc = kmsg.read_source(str(log), doc)
    assert [(e.code, e.gpu) for e in xid.parse_lines(lines)] == [(79, "0000:03:00.0")]
    assert kmsg.read_source(str(log), doc)[0] == []


@pytest.mark.parametrize("bad", [b"MESSAGE\n" + struct.pack("<Q", 1 << 40) + b"x\n\n",     # a length past any value
                                 b"MESSAGE\n" + struct.pack("<Q", 1) + b"xy\n\n"])         # no newline after it
def test_a_broken_export_file_is_read_up_to_the_break_then_resynced_and_said_so(tmp_path, bad):
    first = entry("kernel", XID79)
    log = tmp_path / "kern.export"
    log.write_bytes(first + bad + entry("kernel", XID79.replace("02:00", "03:00")))
    lines, doc = kmsg.read_source(str(log), {})
    fs = xid.check_xid(xid.parse_lines(lines))
    # the whole entries before the break count; what comes after the resync is not proven
    assert [(f.xid, f.gpu, f.severity) for f in fs] == [(79, "0000:02:00.0", DRAIN), (79, "0000:03:00.0", "warn")]
    assert doc["files"][str(log)]["offset"] == log.stat().st_size    # never stuck at the break
    assert kmsg.read_source(str(log), doc)[0] == []
    rep = engine.run(engine.Options(node="n1", settings=HealthSettings(kernel_log=str(log)), state_dir="",
                                    only=["gpu.xid"], no_drain=True))
    assert rep.status == DRAIN
    assert any(f.severity == "warn" and f"bytes {len(first)} to " in f.message and "skipped" in f.message
               for f in rep.findings), rep.findings


def _big_user_entry(f, size: int) -> None:
    """A user's journal entry with a *size*-byte binary MESSAGE, written sparse (never held in memory)."""
    N[0] += 1
    f.write(field("__CURSOR", f"s=0;i={N[0]:x}") + field("_TRANSPORT", "journal")
            + b"MESSAGE\n" + struct.pack("<Q", size))
    f.seek(size, 1)                                      # zeros: the binary form
    f.write(b"\n" + field("_HOSTNAME", "n1") + b"\n")


def test_one_huge_user_entry_does_not_blind_the_reader(tmp_path):
    # journald takes fields up to 768 MiB (DATA_SIZE_MAX); 66 MiB was past the old limit
    log = tmp_path / "kern.export"
    first = entry("kernel", "NVRM: Xid (PCI:0000:07:00): 13, pid=1, Graphics Exception")
    with open(log, "wb") as f:
        f.write(first)
        _big_user_entry(f, 66 << 20)
    lines, doc = kmsg.read_source(str(log), {})
    assert [e.code for e in xid.parse_lines(lines)] == [13]
    assert doc["files"][str(log)]["offset"] == log.stat().st_size
    with open(log, "ab") as f:                           # the next run, from the cursor
        f.write(entry("kernel", "NVRM: Xid (PCI:0000:07:00): 79, pid=1"))
    lines, doc = kmsg.read_source(str(log), doc)
    assert [(f.xid, f.gpu, f.severity) for f in xid.check_xid(xid.parse_lines(lines))] == [
        (79, "0000:07:00.0", DRAIN)]
    rep = engine.run(engine.Options(node="n1", settings=HealthSettings(kernel_log=str(log)), state_dir="",
                                    only=["gpu.xid"], no_drain=True))
    assert rep.status == DRAIN and {f.xid for f in rep.findings} == {13, 79}


def test_a_huge_value_is_stepped_over_by_its_length(tmp_path, monkeypatch):
    monkeypatch.setattr(kmsg, "CHUNK", 4096)            # the value is far larger than a chunk
    log = tmp_path / "kern.export"
    fake = FAKE_ENTRY.encode() * 2000                    # a fake kernel entry all through the value
    with open(log, "wb") as f:
        N[0] += 1
        f.write(field("__CURSOR", "s=0;i=1") + field("_TRANSPORT", "journal") + b"MESSAGE\n"
                + struct.pack("<Q", len(fake) + (4 << 20)) + fake)
        f.seek(4 << 20, 1)
        f.write(b"\n" + field("_HOSTNAME", "n1") + b"\n" + entry("kernel", XID79))
    lines, _ = kmsg.read_source(str(log), {})
    assert [(e.code, e.gpu, e.untrusted) for e in xid.parse_lines(lines)] == [(79, "0000:02:00.0", None)]
