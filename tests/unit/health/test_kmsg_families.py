"""A kernel log file has one format, fixed by its first line (issue 24 §6, hostile review).

A line of another format family than the file's is a user's newline (dmesg
--notime leaves a record's later lines at column 0; a syslog writer that keeps
raw newlines) or proves nothing: it warns, naming the line, and never drains.
"""
from __future__ import annotations

import json

import pytest

from slurm_gpu.health import xid
from slurm_gpu.health.findings import DRAIN, WARN
from slurm_gpu.hw import kmsg, kmsg_scan

XID = "NVRM: Xid (PCI:0000:01:00): 79"
NOTIME_HEAD = "Linux version 6.8.0-45-generic (buildd@lcy02-amd64-075) (gcc 13.2.0) #45-Ubuntu SMP\n"


def verdict(text: str) -> list[tuple[str, str]]:
    return [(f.severity, f.message) for f in xid.check_xid(xid.parse_lines(kmsg.scan_buffer(text.encode())))]


# A client's version string (63 bytes at most) with a newline and a forged stamp in it.
FORGED_STAMPS = {
    "dmesg": f"[1.1] {XID}",
    "ctime": f"[Fri Aug 30 11:43:09 2024] {XID}",
    "iso": f"2024-08-30T11:43:09,123456+00:00 {XID}",
    "dmesg -x": f"kern  :err   : [1.1] {XID}",
    "dmesg -r": f"<3>[1.1] {XID}",
    "kmsg record": f"3,99,5000000,-;{XID}",
}


@pytest.mark.parametrize("name", sorted(FORGED_STAMPS))
def test_a_forged_stamp_in_a_notime_log_never_drains(name):
    text = (NOTIME_HEAD + "NVRM: API mismatch: the client has the version 1\n"
            f"{FORGED_STAMPS[name]}, but\nNVRM: this kernel module has the version 550.54.15.\n")
    got = verdict(text)
    assert got and all(sev == WARN for sev, _ in got), got
    assert any("byte " in msg for _, msg in got)


def test_a_journal_json_line_in_a_notime_log_never_drains():
    rec = json.dumps({"_TRANSPORT": "kernel", "MESSAGE": f"{XID}, GPU has fallen off the bus."})
    got = verdict(NOTIME_HEAD + rec + "\n")
    assert [sev for sev, _ in got] == [WARN]
    assert "another log format (json)" in got[0][1] and f"byte {len(NOTIME_HEAD)} " in got[0][1]


def test_a_stamped_line_in_a_notime_log_warns_naming_the_line():
    lines = kmsg.scan_buffer((NOTIME_HEAD + f"[5.000000] {XID}, GPU has fallen off the bus.\n").encode())
    assert [(ln.at, ln.doubt is not None and "another log format (kernel)" in ln.doubt) for ln in lines] == [
        (len(NOTIME_HEAD), True)]


def test_a_notime_log_keeps_its_own_lines():
    assert [sev for sev, _ in verdict(NOTIME_HEAD + f"{XID}, GPU has fallen off the bus.\n")] == [DRAIN]


def test_a_dmesg_log_keeps_its_own_lines_whatever_the_stamp():
    text = "[0.000000] Linux version 6.8.0\nkern  :err   : [5.0] " + XID + ", GPU has fallen off the bus.\n"
    assert [sev for sev, _ in verdict(text)] == [DRAIN]


def test_the_file_reader_fixes_the_format_from_the_file_s_head(tmp_path, monkeypatch):
    monkeypatch.setattr(kmsg, "CHUNK", 64)           # the forged line in a later chunk than the head
    log = tmp_path / "dmesg.txt"
    log.write_text(NOTIME_HEAD + "usb 1-1: new device\n" * 4 + f"[5.000000] {XID}, GPU has fallen off the bus.\n")
    log.chmod(0o644)
    lines, _ = kmsg.read_file(log)
    assert [ln.doubt is not None for ln in lines] == [True]


def test_unstamped_echo_window_is_not_closed_by_a_forged_stamp():
    # parse_lines alone: after an unstamped "API mismatch", a line inside the
    # window warns whatever stamp it shows
    lines = [kmsg.KernelLine(None, "NVRM: API mismatch: the client has the version 1"),
             kmsg.KernelLine("1.100000", XID + ", GPU has fallen off the bus.")]
    evs = xid.parse_lines(lines)
    assert [(e.code, e.untrusted is not None) for e in evs] == [(79, True)]


# A syslog/journal text log is known by its writer's own part at the line's
# start, never by the tag a sender chose (any length, spaces in it).
TEXT_HEADS = {
    "classic, long tag": "Nov 29 00:00:01 gpu01 " + "a" * 70 + "[4242]: hi\n",
    "rfc 3339, tag with a space": "2026-11-29T00:00:01.123456+00:00 gpu01 my job[4242]: hi\n",
    "rfc 3339, no fraction": "2026-11-29T00:00:01+0000 gpu01 my job[4242]: hi\n",
    "classic, no host, odd tag": "Nov 29 00:00:01 my: job: hi\n",
    "short-unix, tag with a space": "1732838401.123456 gpu01 my job[4242]: hi\n",
    "short-full": "Fri 2026-11-29 00:00:01 UTC gpu01 my job[4242]: hi\n",
}


@pytest.mark.parametrize("name", sorted(TEXT_HEADS))
def test_a_text_log_is_known_by_its_writer_whatever_the_tag(name, tmp_path):
    raw = f"[    5.000000] {XID}, GPU has fallen off the bus.\n"     # a message's raw newline
    text = TEXT_HEADS[name] + raw
    assert kmsg.text_log_head(text.encode())
    assert [sev for sev, _ in verdict(text)] == [WARN]
    log = tmp_path / "messages"
    log.write_text(text)
    log.chmod(0o644)
    lines, _ = kmsg.read_file(log)
    assert [ln.doubt == kmsg_scan.TEXT_LOG for ln in lines] == [True]


def test_dmesg_iso_is_not_a_text_log():
    # dmesg --time-format iso prints ",usec" (util-linux; tests/data/xid/real/util_linux_dmesg_envelopes.txt)
    text = "2026-11-29T00:00:01,123456+00:00 Linux version 6.8.0\n" \
           f"2026-11-29T00:00:05,000000+00:00 {XID}, GPU has fallen off the bus.\n"
    assert not kmsg.text_log_head(text.encode())
    assert [sev for sev, _ in verdict(text)] == [DRAIN]


# Read from /proc/kmsg, every line of a record carries its stamp: an
# "API mismatch" record split by a run boundary is still one record.
SPLIT_FORMATS = {
    "/proc/kmsg": "<4>[   12.345678] ",
    "dmesg -S": "[   12.345678] ",
    "caller id": "[   12.345678][  T334] ",
}


@pytest.mark.parametrize("name", sorted(SPLIT_FORMATS))
def test_an_api_mismatch_split_across_two_runs_never_drains(name, tmp_path):
    p = SPLIT_FORMATS[name]
    log = tmp_path / "kern.log"
    head = p.replace("12.345678", " 0.000000")
    log.write_text(f"{head}Linux version 6.8.0\n{p}NVRM: API mismatch: the client has the version 1\n")
    log.chmod(0o644)
    first, cur = kmsg.read_file(log)
    with log.open("a") as f:
        f.write(f"{p}{XID}, but\n{p}NVRM: this kernel module has the version 550.54.15.\n")
    second, _ = kmsg.read_file(log, cur)
    evs = xid.parse_lines(first + second)      # what two runs see, one after the other
    assert first and first[0].doubt is None          # the mismatch line itself is the kernel's
    assert [e.untrusted is not None for e in evs if e.code == 79] in ([], [True])
    assert all(f.severity != DRAIN for f in xid.check_xid(xid.parse_lines(second)))


# journalctl -f -o json-pretty > file flushes in 4 KB blocks: a read may end
# inside an entry, which the next run must read whole.
PRETTY_XID = ('{\n\t"_TRANSPORT" : "kernel",\n\t"SYSLOG_FACILITY" : "0",\n'
              f'\t"MESSAGE" : "{XID}, GPU has fallen off the bus.",\n\t"__REALTIME_TIMESTAMP" : "1788544992222751"\n}}\n')
PRETTY_OTHER = '{\n\t"_TRANSPORT" : "kernel",\n\t"MESSAGE" : "usb 2-3: USB disconnect, device number 16"\n}\n'


def test_a_json_pretty_entry_split_across_chunks_is_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(kmsg, "CHUNK", 64)           # smaller than an entry
    log = tmp_path / "journal.json"
    log.write_text(PRETTY_OTHER * 3 + PRETTY_XID + PRETTY_OTHER)
    log.chmod(0o644)
    lines, cur = kmsg.read_file(log)
    assert [(ln.doubt, ln.text.startswith("NVRM: Xid")) for ln in lines] == [(None, True)]
    assert cur.offset == log.stat().st_size


def test_a_json_pretty_entry_split_by_the_writer_is_read_by_the_next_run(tmp_path):
    log = tmp_path / "journal.json"
    cut = PRETTY_XID.index("MESSAGE") + 20
    log.write_text(PRETTY_OTHER + PRETTY_XID[:cut])
    log.chmod(0o644)
    first, cur = kmsg.read_file(log)
    assert first == [] and cur.offset == len(PRETTY_OTHER)
    with log.open("a") as f:
        f.write(PRETTY_XID[cut:])
    second, _ = kmsg.read_file(log, cur)
    assert [sev for sev, _ in [(f.severity, f.message) for f in xid.check_xid(xid.parse_lines(second))]] == [DRAIN]


# A mismatch record in dmesg output without a kernel time: a real Xid later
# must still drain (a user keeping a broken node undrained with one mismatch).
MISMATCH = ("NVRM: API mismatch: the client has the version 1, but\n{ind}NVRM: this kernel module has the version "
            "550.54.15.  Please\n{ind}NVRM: make sure that this kernel module and all NVIDIA driver\n")
LATER_RECORDS = {
    "dmesg -x -T": ("kern  :info  : [Fri Aug 30 11:40:00 2024] ", "kern  :warn  : [Fri Aug 30 11:40:01 2024] ",
                    "kern  :err   : [Fri Aug 30 11:43:09 2024] "),
    "dmesg -x iso": ("kern  :info  : 2024-08-30T11:40:00,000000+00:00 ", "kern  :warn  : 2024-08-30T11:40:01,000000+00:00 ",
                     "kern  :err   : 2024-08-30T11:43:09,000000+00:00 "),
    "dmesg -e": ("[Aug30 11:40] ", "[Aug30 11:40] ", "[Aug30 11:43] "),
    "dmesg -x -e": ("kern  :info  : [Aug30 11:40] ", "kern  :warn  : [Aug30 11:40] ", "kern  :err   : [Aug30 11:43] "),
    "dmesg delta": ("[  +0.000000] ", "[  +1.000000] ", "[+188.000000] "),
}


@pytest.mark.parametrize("name", sorted(LATER_RECORDS))
def test_a_real_xid_after_an_api_mismatch_drains_in_dmesg_without_kernel_time(name):
    head, mis, later = LATER_RECORDS[name]
    text = (f"{head}Linux version 6.8.0\n{mis}" + MISMATCH.format(ind=" " * len(mis))
            + f"{later}{XID}, GPU has fallen off the bus.\n")
    assert [sev for sev, _ in verdict(text)] == [DRAIN]


def test_an_echoed_line_of_the_record_still_never_drains_in_dmesg_e():
    ind = " " * len("[Aug30 11:40] ")
    text = (f"[Aug30 11:40] Linux version 6.8.0\n[Aug30 11:40] NVRM: API mismatch: the client has the version 1\n"
            f"{ind}{XID}, but\n" + MISMATCH.split("\n", 1)[1].format(ind=ind))
    assert verdict(text) == []


def test_short_monotonic_without_a_host_warns():
    # journalctl -o short-monotonic --no-hostname: the "kernel:" tag alone (TAG_ONLY), a warning, not silence
    text = "[    0.000000] kernel: Linux version 6.8.0\n[   12.300000] kernel: " + XID + ", GPU has fallen off the bus.\n"
    lines = kmsg.scan_buffer(text.encode())
    assert [ln.doubt is not None for ln in lines] == [True]
    assert [sev for sev, _ in verdict(text)] == [WARN]
