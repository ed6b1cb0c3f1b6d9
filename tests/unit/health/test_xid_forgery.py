"""Issue 10, point 1: a job user cannot forge a GPU fault, and no log text reaches a drain reason.

Every route a job user has into the kernel log is tried here: records that
userspace wrote to /dev/kmsg (facility 1), ``logger`` lines in a syslog file,
journal entries that only claim to be the kernel, the NVIDIA driver's
version-mismatch message (which echoes a version string the client chose, with
newlines in it), and kernel messages that start with a task name.  None may
produce a finding, while the real logs (tests/data/xid/) keep their verdicts.
"""
from __future__ import annotations

import json
import os
import re
import time

import pytest

from slurm_gpu.health import engine, xid
from slurm_gpu.health.findings import DRAIN, drain_reason
from slurm_gpu.health.nodestate import parse_show_node
from slurm_gpu.health.settings import HealthSettings
from slurm_gpu.hw import kmsg
from kmsgfake import serving
from paths import ROOT

DATA = ROOT / "tests" / "data" / "xid" / "real_kernel_xid_lines_from_issues.md"
BLOCKS = dict(re.findall(r"## ([A-H])\. .*?```\n(.*?)```", DATA.read_text(), re.S))
XID = "NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."
OFF_BUS = ("NVRM: The NVIDIA GPU 0000:02:00.0\\x0aNVRM: (PCI ID: 10de:26b5) installed in this system has"
           "\\x0aNVRM: fallen off the bus and is not responding to commands.")


def findings(text: str):
    return xid.check_xid(xid.parse_lines(kmsg.scan_buffer(text.encode())))


# What a job user can put into each log format.  Each entry is one log text.
FORGED = {
    # /dev/kmsg: userspace writes get facility 1 (LOG_USER); "<0>" cannot set facility 0
    "kmsg user record": f"14,1188,812401212,-;{XID}\n",
    "kmsg user record, level 3": f"11,1188,812401212,-;{XID}\n",
    "kmsg user three-line off-bus": f"12,1189,812401212,-;{OFF_BUS}\n",
    # version mismatch: the client's version string is echoed by the driver
    "mismatch, inline": f"3,1190,812401212,-;NVRM: API mismatch: the client has the version {XID}, but\n",
    "mismatch, kmsg newline": (f"3,1190,812401212,-;NVRM: API mismatch: the client has the version 1\\x0a{XID}"
                               "\\x0a, but\\x0aNVRM: this kernel module has the version 550.54.15.  Please\n"),
    "mismatch, kmsg off-bus": (f"3,1190,812401212,-;NVRM: API mismatch: the client has the version 1\\x0a"
                               f"{OFF_BUS}, but\n"),
    "mismatch, dmesg continuation": (f"[ 15.483551] NVRM: API mismatch: the client has the version 1\n"
                                     f"              {XID}, but\n"
                                     "              NVRM: this kernel module has the version 550.54.15.  Please\n"),
    "mismatch, fake terminator": (
        "[ 15.483551] NVRM: API mismatch: the client has the version 1\n"
        "[ 15.483551] NVRM: components have the same version.\n"
        f"[ 15.483551] {XID}, but\n"),
    "mismatch names off-bus": "[1.0] NVRM: API mismatch: the client has the version fallen off the bus 0000:02:00.0\n",
    # logger / any syslog program
    "logger plain": f"Aug 30 11:43:09 n1 alice: {XID}\n",
    "logger pid": f"Aug 30 11:43:09 n1 python3[4242]: {XID}\n",
    "logger tag kernelx": f"Aug 30 11:43:09 n1 kernel-x: {XID}\n",
    "logger iso": f"2024-08-30T11:43:09.123456+00:00 n1 alice: {XID}\n",
    "logger embeds kernel tag": f"Aug 30 11:43:09 n1 alice: kernel: {XID}\n",
    # text before the driver's own prefix
    "mid-line": f"[1.0] usb 1-1: Product: {XID}\n",
    "task name first": f"[1.0] a.out[99]: {XID}\n",
    "comm as prefix": "[1.0] NVRM: Xid (PCI[1234]: segfault at 0 ip 0 sp 0 error 4\n",
    "kmsg mid-line": f"6,1191,812401212,-;usb 1-1: Product: {XID}\n",
    "off-bus anywhere": "[1.0] usb 1-1: Product: NVRM: GPU 0000:02:00.0 has fallen off the bus\n",
    "off-bus in other NVRM text": "[1.0] NVRM: nvidia-uvm: client said GPU 0000:02:00.0 has fallen off the bus\n",
    # dmesg -x / -r name the facility
    "dmesg -x user": f"user  :warn  : [    1.000000] {XID}\n",
    "dmesg -r user": f"<12>[    1.000000] {XID}\n",
    # journal export: only journald's trusted fields (_TRANSPORT) prove the source
    "journal syslog as kernel": json.dumps({"_TRANSPORT": "syslog", "SYSLOG_IDENTIFIER": "kernel",
                                            "SYSLOG_FACILITY": "0", "MESSAGE": XID}) + "\n",
    "journal stdout": json.dumps({"_TRANSPORT": "stdout", "MESSAGE": XID}) + "\n",
    "journal kernel facility user": json.dumps({"_TRANSPORT": "kernel", "SYSLOG_FACILITY": "1",
                                                "MESSAGE": XID}) + "\n",
    "journal kernel, mismatch newline": json.dumps({
        "_TRANSPORT": "kernel", "SYSLOG_FACILITY": "0",
        "MESSAGE": f"NVRM: API mismatch: the client has the version 1\n{XID}, but"}) + "\n",
}


# With 1-second stamps a line of the echoed record and a record of its own
# logged in the same second look alike (issue 24 §5): never a drain, never
# silently "ok" either, but a warning that says why.
AMBIGUOUS = {
    "mismatch, dmesg --ctime": (
        "[Tue Dec 22 11:26:00 2026] NVRM: API mismatch: the client has the version 1\n"
        f"[Tue Dec 22 11:26:00 2026] {XID}, but\n"),
    # in a syslog file every line is a tag-only claim anyway (TAG_ONLY below)
    "mismatch, syslog split, no kernel time": (
        "Dec 22 11:26:00 n1 kernel: NVRM: API mismatch: the client has the version 1\n"
        f"Dec 22 11:26:00 n1 kernel: {XID}, but\n"),
}


@pytest.mark.parametrize("name", sorted(AMBIGUOUS))
def test_forged_fault_in_the_same_second_only_warns(tmp_path, name):
    fs = findings(AMBIGUOUS[name])
    assert [(f.xid, f.severity) for f in fs] == [(79, "warn")]
    why = "same second" if "ctime" in name else "logger -t kernel"
    assert why in fs[0].message and "not drained" in fs[0].message
    log = tmp_path / "kern.log"
    log.write_text(AMBIGUOUS[name])
    rep = engine.run(engine.Options(node="n1", settings=HealthSettings(kernel_log=str(log)), state_dir="",
                                    only=["gpu.xid"], no_drain=True))
    assert rep.status == "warn" and drain_reason(rep.findings) is None


MISMATCH_1S = ("[Tue Dec 22 11:26:00 2026] NVRM: API mismatch: the client has the version 550.1, but\n"
               "[Tue Dec 22 11:26:00 2026] NVRM: this kernel module has the version 550.54.15.  Please\n")


def test_a_real_xid_in_the_same_second_as_a_mismatch_is_not_hidden():
    # Issue 24 §5: a user's "API mismatch" (any client can trigger one) used to
    # swallow every line with the same 1-second stamp, a real Xid 48 included.
    real = "[Tue Dec 22 11:26:00 2026] NVRM: Xid (PCI:0000:03:00): 48, pid=1, DBE\n"
    fs = findings(MISMATCH_1S + real)
    assert [(f.xid, f.gpu, f.severity) for f in fs] == [(48, "0000:03:00.0", "warn")]
    assert f"byte {len(MISMATCH_1S)} of the kernel log" in fs[0].message and "same second" in fs[0].message
    # a second later, or with kernel time in the line, it drains as before
    assert [(f.xid, f.severity) for f in findings(MISMATCH_1S + real.replace(":00 2026", ":01 2026"))] == [(48, DRAIN)]
    precise = (MISMATCH_1S.replace("[Tue Dec 22 11:26:00 2026] NVRM", "[   15.483551] NVRM")
               + real.replace("[Tue Dec 22 11:26:00 2026] NVRM", "[   15.900000] NVRM"))
    assert [(f.xid, f.severity) for f in findings(precise)] == [(48, DRAIN)]


@pytest.mark.parametrize("name", sorted(FORGED))
def test_forged_fault_gives_no_finding(name):
    assert findings(FORGED[name]) == []


@pytest.mark.parametrize("name", sorted(FORGED))
def test_forged_fault_drains_nothing_through_the_health_run(tmp_path, name, monkeypatch):
    log = tmp_path / "kern.log"
    log.write_text(FORGED[name])
    rep = engine.run(engine.Options(node="n1", settings=HealthSettings(kernel_log=str(log)), state_dir="",
                                    only=["gpu.xid"], no_drain=True))
    assert rep.status == "ok" and rep.findings == []


TRUSTED = {
    "kmsg kernel record": f"3,1187,812401212,-;{XID}\n",
    "kmsg with caller": f"3,1187,812401212,-,caller=T1;{XID}\n",
    "dmesg": f"[74889.644138] {XID}\n",
    "dmesg -x kern": f"kern  :err   : [    1.000000] {XID}\n",
    "dmesg -r kern": f"<3>[    1.000000] {XID}\n",
    "journal json": json.dumps({"_TRANSPORT": "kernel", "SYSLOG_FACILITY": "0", "MESSAGE": XID}) + "\n",
    "kmsg three-line off-bus": f"3,1189,812401212,-;{OFF_BUS}\n",
    "new driver off-bus": "[1.0] NVRM: GPU 0000:02:00.0: GPU has fallen off the bus.\n",
    "old driver off-bus": "[1.0] NVRM: GPU at PCI:0000:02:00: GPU has fallen off the bus.\n",
    "after a real mismatch": ("[ 15.483551] NVRM: API mismatch: the client has the version 550.1, but\n"
                              "               NVRM: this kernel module has the version 550.54.15.  Please\n"
                              f"[ 16.000000] {XID}\n"),
}


@pytest.mark.parametrize("name", sorted(TRUSTED))
def test_the_kernel_s_own_report_still_drains(name):
    fs = findings(TRUSTED[name])
    assert [(f.xid, f.gpu, f.severity) for f in fs] == [(79, "0000:02:00.0", DRAIN)], name


# The kernel's own line in a syslog file, byte for byte what `logger -t kernel`
# (any local user) leaves there: the sender is not proven, so it only warns.
TAG_ONLY = {
    "syslog kernel": f"Aug 30 11:43:09 n1 kernel: {XID}\n",
    "syslog kernel with kernel time": f"Aug 30 11:43:09 n1 kernel: [ 1843.308145] {XID}\n",
    "journal short-precise": f"Sep 12 14:25:44.984246 n1 kernel: {XID}\n",
    "rsyslog iso": f"2024-08-30T11:43:09.123456+00:00 n1 kernel: {XID}\n",
    # rsyslog (imklog) writes every line of a multi-line record with the record's prefix
    "mismatch, syslog split": (
        "Dec 22 11:26:00 n1 kernel: [   15.483551] NVRM: API mismatch: the client has the version 1\n"
        f"Dec 22 11:26:00 n1 kernel: [   15.483551] {XID}, but\n"
        "Dec 22 11:26:00 n1 kernel: [   15.483551] NVRM: this kernel module has the version 550.54.15.  Please\n"),
}


@pytest.mark.parametrize("name", sorted(TAG_ONLY))
def test_a_kernel_tag_in_a_text_log_only_warns(name):
    fs = findings(TAG_ONLY[name])
    assert [(f.xid, f.gpu, f.severity) for f in fs] == [(79, "0000:02:00.0", "warn")], name
    assert "logger -t kernel" in fs[0].message and "not drained" in fs[0].message and not fs[0].fatal


def test_kmsg_device_drops_records_userspace_wrote():
    recs = [f"14,10,100,-;{XID}\n".encode(), b"3,11,200,-;NVRM: Xid (PCI:0000:03:00): 48, pid=1, DBE\n"]
    with serving(recs):
        lines, cur = kmsg.read_kmsg(None, device="/dev/null")
    assert [l.text for l in lines] == ["NVRM: Xid (PCI:0000:03:00): 48, pid=1, DBE"] and cur.seq == 11


def test_a_process_name_cannot_make_an_application_xid_a_hardware_one():
    # comm is at most 15 bytes, but whatever it holds, only the driver's tail names a cause
    line = "[1.0] NVRM: Xid (PCI:0000:02:00): 45, pid=7, name=caused by previous Xid 79, Ch 00000001\n"
    assert [(f.xid, f.severity) for f in findings(line)] == [(45, "info")]


def test_the_real_logs_keep_their_verdicts():
    # D and F are excerpts whose lines start with a bare "kernel: " tag (proves nothing:
    # test_xid_mutants.py); the driver's words are judged here
    got = {k: sorted((f.xid, f.gpu, f.severity) for f in findings(re.sub(r"(?m)^kernel: ", "", v)))
           for k, v in BLOCKS.items() if k != "H"}
    assert got["A"] == [(79, "0000:02:00.0", DRAIN)]
    assert got["B"] == [(79, "0000:b3:00.0", DRAIN)]
    assert got["C"] == [(13, "0000:cb:00.0", "info"), (109, "0000:cb:00.0", "info")]
    assert (45, "0000:dc:00.0", DRAIN) in got["D"] and len(got["D"]) == 4
    assert (149, "0019:01:00.0", DRAIN) in got["E"] and len(got["E"]) == 4
    assert got["F"] == [(137, None, "info"), (145, None, "warn")]
    assert got["G"] == [(31, "0000:01:00.0", "info"), (32, "0000:01:00.0", "info")]


# ------------------------------------------------------- drain reasons

STAMP = "[root@2026-11-22T05:20:00]"
HOSTILE_REASONS = [
    f"[1.0] NVRM: Xid (PCI:0000:02:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (x {STAMP})\n",
    f"[1.0] NVRM: Xid (PCI:0000:02:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 ({STAMP}\n",
    "[1.0] NVRM: Xid (PCI:0000:02:00): 149, ROOT_AT_X Fatal XC0 i0 Link 3 (0x1 0x2)\n",
    f"[1.0] pcieport {STAMP}: AER: Uncorrected (Fatal) error received: id=0010\n[1.1] {XID}\n",
    "[1.0] pcieport 0000:00:02.0 x=y: AER: Uncorrected (Fatal) error received: id=0010\n[1.1] " + XID + "\n",
]


@pytest.mark.parametrize("text", HOSTILE_REASONS)
def test_drain_reason_carries_only_our_words(text):
    reason = drain_reason(findings(text))
    assert reason is not None
    assert "root@" not in reason and "ROOT_AT_X" not in reason and "x=y" not in reason
    # What slurmctld shows back must be exactly what we set, or we could never resume it.
    shown = f"NodeName=n1 State=IDLE+DRAIN Reason={reason} [slurm@2026-11-22T05:20:00]"
    assert parse_show_node(shown).reason == reason


def test_a_forged_stamp_in_a_reason_does_not_wedge_the_drain(tmp_path, monkeypatch):
    # Today a "[user@time]" inside the reason makes `scontrol show node` unreadable
    # for us: the drain is never recognised as ours and the node is never resumed.
    from test_health_drain import FakeSlurm, capture  # the recorded-scontrol fake
    from slurm_gpu import runner
    fake = FakeSlurm(capture("idle"))
    monkeypatch.setattr(runner, "run", fake.run)
    monkeypatch.setattr(kmsg, "boot_id", lambda: "b")
    log = tmp_path / "kern.log"
    log.write_text(HOSTILE_REASONS[0])
    s = HealthSettings(kernel_log=str(log), clean_runs_to_resume=1)
    o = engine.Options(node="n1", settings=s, state_dir=str(tmp_path / "st"), only=["gpu.xid"])
    assert engine.run(o).action == "drain"
    assert engine.run(o).action == "resume"


@pytest.mark.skipif(os.geteuid() != 0 or not os.access("/dev/kmsg", os.W_OK), reason="needs root to write /dev/kmsg")
def test_the_real_kernel_marks_what_userspace_writes_to_dev_kmsg(monkeypatch):
    # The kernel's own word for the facility rule: a record written to
    # /dev/kmsg, even one that asks for "<0>" (kern), comes back with facility
    # 1 (user), so the reader never takes it for the driver's.  The forged
    # line is an application Xid (13, info): even a reader from before this
    # fix would not drain anyone's node with it.
    marker = f"sg-forge-{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setattr(kmsg, "boot_id", lambda: "this-boot")
    _, cursor = kmsg.read_kmsg(None)
    fd = os.open("/dev/kmsg", os.O_WRONLY)
    try:
        for prefix in ("", "<0>", "<3>"):
            os.write(fd, f"{prefix}NVRM: Xid (PCI:0000:cb:00): 13, pid={marker}, name=a, Graphics Exception\n".encode())
    finally:
        os.close(fd)
    raw = [r for r in kmsg.raw_records() if marker.encode() in r]
    assert len(raw) == 3 and all(int(r.split(b",", 1)[0]) >> 3 == 1 for r in raw), raw
    lines, after = kmsg.read_kmsg(cursor)
    assert after.seq > cursor.seq and not any(marker in ln.text for ln in lines)


@pytest.mark.parametrize("stamp", ["Dec 22 11:26:00 n1 kernel: [   15.483551] ", "Dec 22 11:26:00 n1 kernel: ",
                                   "2024-08-30T11:43:09.123456+00:00 n1 kernel: ", "[   15.483551] ",
                                   "[Tue Dec 22 11:26:00 2026] "])
def test_a_long_echoed_string_cannot_outlast_the_mismatch_window(stamp):
    # The client string can hold many short "NVRM: " lines (a record holds up to
    # 1 KB): a syslog daemon splits them with the record's stamp.  No count of
    # lines ends the echo, only another stamp does; a 1-second stamp only warns.
    text = (stamp + "NVRM: API mismatch: the client has the version 1\n"
            + "".join(f"{stamp}NVRM: {i}\n" for i in range(40)) + f"{stamp}{XID}, but\n")
    assert drain_reason(findings(text)) is None
    # (in a syslog file every line is also a tag-only claim: that is the warning's reason there)
    assert all(f.severity == "warn" and ("same second" in f.message or "logger -t kernel" in f.message)
               for f in findings(text))


def test_a_mismatch_in_a_log_without_stamps_never_hides_a_report_silently():
    text = ("kernel: NVRM: API mismatch: the client has the version 1\n"
            + "".join(f"kernel: NVRM: {i}\n" for i in range(40)) + f"kernel: {XID}\n")
    fs = findings(text)
    assert [(f.xid, f.severity) for f in fs] == [(79, "warn")]


# A user's newline inside a kernel record (tmpfs echoes a mount option it does not
# know): read from /proc/kmsg (rsyslog imklog, busybox klogd, ``dmesg -S``) the
# kernel puts its prefix and the record's own stamp on every line of the record.
SPLIT = {
    "imklog kern.log": ("Nov 28 15:10:23 gpu01 kernel: [ 5123.456789] tmpfs: Unknown parameter 'a\n"
                        "Nov 28 15:10:23 gpu01 kernel: [ 5123.456789] NVRM: Xid (PCI:0000:07:00): 79\n"
                        "Nov 28 15:10:23 gpu01 kernel: [ 5123.456789] b'\n"),
    "dmesg -S": ("[ 5123.456789] tmpfs: Unknown parameter 'a\n"
                 "[ 5123.456789] NVRM: Xid (PCI:0000:07:00): 79\n"
                 "[ 5123.456789] b'\n"),
    "rsyslog iso with kernel time": ("2026-11-28T15:10:23.1+00:00 gpu01 kernel: [ 5123.456789] "
                                     "tmpfs: Unknown parameter 'a\n"
                                     "2026-11-28T15:10:23.1+00:00 gpu01 kernel: [ 5123.456789] "
                                     "NVRM: Xid (PCI:0000:07:00): 79\n"),
    # a kernel with CONFIG_PRINTK_CALLER: the record's caller id after its stamp (util-linux
    # tests/expected/dmesg/*-syslog-printk-caller; the kernel's info_print_prefix)
    "dmesg -S, caller ids": ("[ 5123.456789][ T4242] tmpfs: Unknown parameter 'a\n"
                             "[ 5123.456789][ T4242] NVRM: Xid (PCI:0000:07:00): 79\n"
                             "[ 5123.456789][ T4242] b'\n"),
    "two forged lines": ("[ 5123.456789] tmpfs: Unknown parameter 'a\n"
                         "[ 5123.456789] NVRM: GPU 0000:07:00.0: GPU has fallen off the bus.\n"
                         "[ 5123.456789] NVRM: Xid (PCI:0000:07:00): 79\n"),
}


@pytest.mark.parametrize("name", sorted(SPLIT))
def test_a_newline_in_a_foreign_record_only_warns(tmp_path, name):
    fs = findings(SPLIT[name])
    assert fs and {f.severity for f in fs} == {"warn"} and all("not drained" in f.message for f in fs), fs
    _names_its_line_and_only_warns(tmp_path / "kern.log", SPLIT[name], fs)


def _names_its_line_and_only_warns(log, text, fs):
    """The first warning names the first driver line by its offset, and a health run reading *text* only warns."""
    assert f"byte {text.rindex(chr(10), 0, text.index('NVRM')) + 1} of the kernel log" in fs[0].message
    log.write_text(text)
    rep = engine.run(engine.Options(node="n1", settings=HealthSettings(kernel_log=str(log)), state_dir="",
                                    only=["gpu.xid"], no_drain=True))
    assert rep.status == "warn" and drain_reason(rep.findings) is None


def test_a_real_multi_line_record_read_through_proc_kmsg_still_drains():
    stamp = "[ 5123.456789] "
    off_bus = "".join(stamp + part + "\n" for part in OFF_BUS.replace("02:00.0", "b3:00.0").split("\\x0a"))
    assert [(f.xid, f.gpu, f.severity) for f in findings(off_bus)] == [(79, "0000:b3:00.0", DRAIN)]
    # a real Xid a microsecond after another record's line, or after a kept line of its own stamp
    assert [(f.xid, f.severity) for f in findings(SPLIT["dmesg -S"].replace("5123.456789] NVRM", "5123.456790] NVRM"))
            ] == [(79, DRAIN)]


# A syslog writer that keeps a message's raw newlines (syslog-ng without
# no-multi-line, a collector's file output) lets a user's message start a line
# in any format; one with the kernel's proof (a dmesg stamp, a facility) is a
# line of a kernel reader's output only where the line before it is one too.
_USER_MSG = "Nov 28 15:10:23 gpu01 alice: hello"
RAW_NEWLINE = {
    "dmesg stamp": f"{_USER_MSG}\n[ 5123.456789] {XID}\n",
    "dmesg stamp after an empty line": f"{_USER_MSG}\n\n[ 5123.456789] {XID}\n",
    "dmesg stamp after a line of no format": f"{_USER_MSG}\nfoo\n[ 5123.456789] {XID}\n",
    "dmesg -r facility kern": f"{_USER_MSG}\n<3>[ 5123.456789] {XID}\n",
    "dmesg -x facility kern": f"{_USER_MSG}\nkern  :err   : [ 5123.456789] {XID}\n",
    "kmsg record": f"{_USER_MSG}\n3,1190,5123456789,-;{XID}\n",
    "dmesg --ctime": f"{_USER_MSG}\n[Sat Nov 28 15:10:23 2026] {XID}\n",
    "dmesg iso": f"{_USER_MSG}\n2026-11-28T15:10:23,123456+00:00 {XID}\n",
    # journalctl -o short-monotonic starts with the kernel's lines of the boot
    "journal short-monotonic": (f"[    0.000000] gpu01 kernel: Linux version 6.1.0\n"
                                f"[ 5120.000001] gpu01 alice[42]: hi\n[ 5123.456789] {XID}\n"),
    "journalctl header, short": (f"-- Journal begins at Sat 2026-11-28 10:00:00 UTC. --\n{_USER_MSG}\n"
                                 f"[ 5123.456789] {XID}\n"),
    "after an rfc3339 line": f"2026-11-28T15:10:23.1+00:00 gpu01 alice: hi\n[ 5123.456789] {XID}\n",
}


@pytest.mark.parametrize("name", sorted(RAW_NEWLINE))
def test_a_kernel_format_line_after_a_text_log_line_only_warns(tmp_path, name):
    fs = findings(RAW_NEWLINE[name])
    assert [(f.xid, f.severity) for f in fs] == [(79, "warn")], fs
    _names_its_line_and_only_warns(tmp_path / "messages", RAW_NEWLINE[name], fs)


def test_a_kernel_reader_s_own_output_still_drains_line_after_line():
    # dmesg's continuation lines, blank lines between records, and a file that starts with the Xid
    for text in (f"[ 5123.000001] nvidia 0000:02:00.0: something\n[ 5123.456789] {XID}\n",
                 f"[ 5123.000001] NVRM: GPU at PCI:0000:02:00: GPU-1\n   more text\n\n[ 5123.456789] {XID}\n",
                 f"[ 5123.456789] {XID}\n",
                 f"<6>[ 5123.000001] usb 1-1: new device\n<3>[ 5123.456789] {XID}\n",
                 f"kern  :info  : [ 5123.000001] usb 1-1: x\nkern  :err   : [ 5123.456789] {XID}\n"):
        assert [(f.xid, f.severity) for f in findings(text)] == [(79, DRAIN)], text


@pytest.mark.parametrize("name,cut", [("imklog kern.log", 1), ("two forged lines", 2)])
def test_the_cursor_between_a_foreign_line_and_the_forged_one_changes_nothing(tmp_path, name, cut):
    # the health run read the log just after the record's first line(s) were written
    log = tmp_path / "kern.log"
    parts = SPLIT[name].split("\n")
    first, rest = "\n".join(parts[:cut]) + "\n", "\n".join(parts[cut:])
    log.write_text(first)
    lines, doc = kmsg.read_source(str(log), {})
    assert all(ln.doubt for ln in lines)
    log.write_text(first + rest)
    lines, doc = kmsg.read_source(str(log), doc)
    fs = xid.check_xid(xid.parse_lines(lines))
    assert [(f.xid, f.severity) for f in fs] == [(79, "warn")]
    assert f"byte {len(first)} of the kernel log" in fs[0].message
