"""Issue 24 §6: kernel logs in the formats sites really keep (tests/data/xid/real/).

Each real log whose format proves the sender (Talos's facility word, from
``/dev/kmsg``) keeps the verdict its driver lines have in plain ``dmesg``
form.  A syslog or journal text line proves nothing but a tag, which
``logger -t kernel`` writes too: the same reports, each a warning.  A line
whose kernel origin cannot be proven is never silently "ok": it is a warning
that names the line (its byte offset in the log) and says why it was not
trusted, and it never drains.  Every forged route stays
refused (test_xid_forgery.py runs them all; the new envelopes are tried here).
"""
from __future__ import annotations

import json

import pytest

from slurm_gpu.health import engine, sxid, xid
from slurm_gpu.health.findings import DRAIN, INFO, WARN, worst
from slurm_gpu.health.settings import HealthSettings
from slurm_gpu.hw import kmsg, kmsg_scan
from paths import ROOT

REAL = ROOT / "tests" / "data" / "xid" / "real"
XID79 = "NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."


def verdicts(text: str) -> list[tuple]:
    fs = xid.check_xid(xid.parse_lines(kmsg.scan_buffer(text.encode())))
    return sorted((f.xid, f.gpu, f.severity) for f in fs)


def as_dmesg(text: str) -> str:
    """The driver lines of a real log, each in plain dmesg form (the reference verdict)."""
    out = []
    for i, ln in enumerate(text.splitlines()):
        at = ln.find("NVRM: ")
        if at < 0:
            at = ln.find("nvidia-nvswitch")
        if at >= 0:
            out.append(f"[{100 + i}.000000] {ln[at:]}\n")
    return "".join(out)


def health(tmp_path, text: str):
    log = tmp_path / "kern.log"
    log.write_text(text)
    return engine.run(engine.Options(node="n1", settings=HealthSettings(kernel_log=str(log)), state_dir="",
                                     only=["gpu.xid", "gpu.sxid"], no_drain=True))


# ------------------------------------------------------------ real logs

REAL_VERDICTS = {
    # talosctl dmesg: the facility word comes from /dev/kmsg (user writes say "user")
    "talos_dmesg_gsp_reset.log": [(154, "0000:0b:00.0", DRAIN)],
    # journal lines without a host name
    "journal_no_hostname_off_bus.log": [(79, "0000:41:00.0", DRAIN), (154, "0000:01:00.0", DRAIN),
                                        (154, "0000:41:00.0", DRAIN), (154, "0000:61:00.0", DRAIN)],
    # journalctl in a German locale ("Okt")
    "journal_de_locale_off_bus.log": [(79, "0000:01:00.0", DRAIN)],
    "rsyslog_iso_off_bus.log": [(79, "0000:01:00.0", DRAIN), (154, "0000:01:00.0", DRAIN)],
    "journal_gsp_task_exception.log": [(120, "0000:02:00.0", DRAIN)],
}


# The logs whose lines name the kernel only by their "kernel:" tag.
TAG_ONLY = {"journal_no_hostname_off_bus.log", "journal_de_locale_off_bus.log", "rsyslog_iso_off_bus.log",
            "journal_gsp_task_exception.log"}


def warned(want: list[tuple]) -> list[tuple]:
    return [(code, gpu, WARN) for code, gpu, _ in want]


@pytest.mark.parametrize("name", sorted(REAL_VERDICTS))
def test_real_log_keeps_its_dmesg_verdict_or_warns_when_only_its_tag_says_kernel(name):
    text = (REAL / name).read_text()
    assert verdicts(as_dmesg(text)) == REAL_VERDICTS[name]
    assert verdicts(text) == (warned(REAL_VERDICTS[name]) if name in TAG_ONLY else REAL_VERDICTS[name])


@pytest.mark.parametrize("name", sorted(REAL_VERDICTS))
def test_real_log_through_the_health_run(tmp_path, name):
    rep = health(tmp_path, (REAL / name).read_text())
    assert rep.status == (WARN if name in TAG_ONLY else DRAIN)
    if name in TAG_ONLY:
        assert all("logger -t kernel" in f.message for f in rep.findings if f.severity == WARN)


def test_talos_sxid_line_is_the_kernel_s():
    text = (REAL / "talos_dmesg_sxid.log").read_text()
    got = kmsg.scan_buffer(text.encode())
    ref = kmsg.scan_buffer(as_dmesg(text).encode())
    assert [ln.text for ln in got] == [ln.text for ln in ref] and len(got) == 3
    assert any(ln.text.startswith("nvidia-nvswitch1: SXid (PCI:0000:aa:00.0): 24007") for ln in got)
    assert all(ln.doubt is None for ln in got)


def test_real_russian_envelope_with_a_driver_line():
    # The envelope of a real ru_RU journal (июл = Jul) around a real driver line.
    envelope = (REAL / "journal_ru_locale_envelope.log").read_text().splitlines()[0].split("list_del")[0]
    assert envelope == "июл 27 14:08:03 laptop kernel: "
    assert verdicts(envelope + XID79 + "\n") == [(79, "0000:02:00.0", WARN)]      # a tag: not proven


@pytest.mark.parametrize("stamp", ["Okt 06 17:59:27", "oct. 06 17:59:27", "10月 06 17:59:27", "окт 06 17:59:27",
                                   "Mär  6 17:59:27", "Okt 06 17:59:27.123456"])
def test_localised_journal_stamps(stamp):
    # read in any locale; the "kernel" tag proves nothing (a warning) ...
    assert verdicts(f"{stamp} n1 kernel: {XID79}\n") == [(79, "0000:02:00.0", WARN)]
    assert verdicts(f"{stamp} kernel: {XID79}\n") == [(79, "0000:02:00.0", WARN)]
    # ...and another program's line in the same locale is still not the kernel's
    assert verdicts(f"{stamp} n1 alice: {XID79}\n") == []
    assert verdicts(f"{stamp} n1 python3[7]: {XID79}\n") == []


def test_localised_dmesg_ctime():
    assert verdicts(f"[Fr Aug 30 11:43:09 2024] {XID79}\n") == [(79, "0000:02:00.0", DRAIN)]
    assert verdicts(f"[пт авг 30 11:43:09 2024] {XID79}\n") == [(79, "0000:02:00.0", DRAIN)]


# ------------------------------------------- what a user can still write

USER_ROUTES = {
    # talosctl dmesg shows a record userspace wrote to /dev/kmsg with facility "user"
    "talos user facility": f"192.168.11.119: user: warning: [2026-04-22T21:30:51.870495804Z]: {XID79}\n",
    "talos daemon facility": f"10.0.0.1: daemon:    err: [2026-04-22T21:30:51Z]: {XID79}\n",
    "talos text before": f"10.0.0.1: kern: warning: [2026-04-22T21:30:51Z]: usb 1-1: Product: {XID79}\n",
    # a syslog line without a host name carries a program's tag like any other
    "no host, user tag": f"Jul 18 21:08:48 alice: {XID79}\n",
    "no host, kernel in text": f"Jul 18 21:08:48 alice: kernel: {XID79}\n",
    "tag with a space": f"Jul 18 21:08:48 n1 x kernel: {XID79}\n",
    "localised, user tag": f"Okt 06 17:59:27 balrog python3[4242]: {XID79}\n",
}


@pytest.mark.parametrize("name", sorted(USER_ROUTES))
def test_user_written_lines_in_the_new_formats_are_refused(tmp_path, name):
    assert verdicts(USER_ROUTES[name]) == []
    rep = health(tmp_path, USER_ROUTES[name])
    assert rep.status == "ok" and rep.findings == []


# --------------------------------------------- unproven lines: a warning

UNKNOWN = {
    "unknown envelope": ("<node-7> 2026/04/22 21:30:50 :: ", f"<node-7> 2026/04/22 21:30:51 :: {XID79}\n"),
    "collector prefix": ("fluentd.kernel | ", f"fluentd.kernel | {XID79}\n"),
}


@pytest.mark.parametrize("name", sorted(UNKNOWN))
def test_a_line_of_unknown_origin_warns_and_names_the_line(tmp_path, name):
    # A whole log in a format slurm-gpu does not know (one line of it names
    # the driver; a line without our envelope inside a stamped log is still a
    # newline in someone's message: test_xid_forgery.py).
    head = UNKNOWN[name][0] + "usb 1-1: new device\n"
    text = head + UNKNOWN[name][1]
    lines = kmsg.scan_buffer(text.encode())
    assert len(lines) == 1 and lines[0].doubt and lines[0].at == len(head)
    fs = xid.check_xid(xid.parse_lines(lines))
    assert [(f.xid, f.gpu, f.severity) for f in fs] == [(79, "0000:02:00.0", WARN)]
    msg = fs[0].message
    assert msg.startswith("Xid 79 on 0000:02:00.0: GPU has fallen off the bus: not trusted (")
    assert f"byte {len(head)} of the kernel log" in msg and "not drained" in msg
    rep = health(tmp_path, text)
    assert rep.status == WARN and [f.severity for f in rep.findings] == [WARN]


def test_an_unproven_application_xid_stays_info():
    fs = xid.check_xid(xid.parse_lines(kmsg.scan_buffer(
        b"fluentd | NVRM: Xid (PCI:0000:cb:00): 13, pid=1, name=a, Graphics Exception\n")))
    assert [(f.xid, f.severity) for f in fs] == [(13, INFO)] and "not trusted" in fs[0].message


def test_an_unproven_line_never_feeds_a_chain_or_a_trusted_finding():
    # An unproven fatal 145 must not make a later "45 caused by previous Xid 145" drain
    # through the NVLink5 memo, and must not raise a trusted report's verdict.
    fake = ("fluentd | NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Fatal XC0 i0 Link 13 (0x0409a0c2 0x00000000 "
            "0x00000001 0x00000000 0x00100000 0x00000004)\n")
    real = ("[2.0] NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 "
            "0x00000001 0x00000000 0x00100000 0x00000004)\n"
            "[3.0] NVRM: Xid (PCI:0018:01:00): 45, pid=1, name=python3, Ch 00000001 caused by previous Xid 145\n")
    memo: dict = {}
    # (lines of two formats, each judged alone: a file's first line would fix its format)
    fs = xid.check_xid(xid.parse_lines(kmsg.scan_buffer((fake + real).encode(), family="any")), memo)
    trusted = sorted((f.xid, f.severity) for f in fs if "not trusted" not in f.message)
    assert trusted == [(45, INFO), (145, INFO)]
    assert memo == {"145|0018:01:00.0": {"action": INFO, "kind": "nvlink5", "detail": memo["145|0018:01:00.0"]["detail"]}}
    assert worst(fs) == WARN


def test_an_unproven_sxid_line_warns_and_never_drains(tmp_path):
    line = "fluentd | nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up\n"
    lines = kmsg.scan_buffer(line.encode())
    assert lines and lines[0].doubt
    fs = sxid.check_sxid(sxid.parse_lines(lines))
    assert [(f.check, f.severity) for f in fs] == [("gpu.sxid", WARN)]
    assert fs[0].message.startswith("SXid 20034 on NVSwitch 0000:06:00.0 link 48: ")
    assert "not trusted (" in fs[0].message and "byte 0 of the kernel log" in fs[0].message
    assert fs[0].message.endswith("not drained")
    # a trusted report of the same code on the same switch keeps its own verdict
    both = sxid.check_sxid(sxid.parse_lines(kmsg.scan_buffer((line + "[2.0] " + line.split("| ")[1]).encode(),
                                                                  family="any")))
    assert sorted(f.severity for f in both) == [DRAIN, WARN]
    rep = health(tmp_path, line)
    assert rep.status == WARN


def test_unproven_line_offset_is_the_file_s_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(kmsg, "CHUNK", 64)
    pad = "[1.000000] usb 1-1: new device\n" * 10
    pad = pad.replace("[1.000000]", "fluentd |")
    log = tmp_path / "kern.log"
    log.write_text(pad + UNKNOWN["collector prefix"][1])
    lines, _ = kmsg.read_file(log)
    assert [ln.at for ln in lines] == [len(pad)] and lines[0].doubt


def test_journal_json_export_still_needs_the_kernel_transport():
    rec = {"_TRANSPORT": "kernel", "SYSLOG_FACILITY": "0", "MESSAGE": XID79, "_HOSTNAME": "n1"}
    assert verdicts(json.dumps(rec) + "\n") == [(79, "0000:02:00.0", DRAIN)]
    rec["_TRANSPORT"] = "syslog"
    assert verdicts(json.dumps(rec) + "\n") == []


# journalctl's other short formats (systemd logs-show.c: short-monotonic
# "[%5llu.%06llu] ", short-unix "%llu.%06llu ", short-full "%a %Y-%m-%d %H:%M:%S %Z ").
JOURNAL_SHORT = {
    "short-monotonic": "[ 1843.308145] n1 kernel: ",
    "short-unix": "1725018189.123456 n1 kernel: ",
    "short-full": "Fri 2024-08-30 11:43:09 UTC n1 kernel: ",
    "short-full, de": "Fr 2024-08-30 11:43:09 CEST n1 kernel: ",
}


@pytest.mark.parametrize("env", JOURNAL_SHORT.values(), ids=list(JOURNAL_SHORT))
def test_journalctl_short_formats(tmp_path, env):
    assert verdicts(env + XID79 + "\n") == [(79, "0000:02:00.0", WARN)]      # the tag is the sender's claim
    for user in ("alice", "python3[7]", "x kernel"):
        line = env.replace(" kernel: ", f" {user}: ") + XID79 + "\n"
        assert verdicts(line) == [], line
        assert health(tmp_path, line).status == "ok"


def test_plain_dmesg_lines_keep_their_meaning():
    # "[t] word kernel: " is the journal's; any other text after a dmesg stamp is a kernel message's own
    assert verdicts(f"[1.000000] usb 1-1: Product: {XID79}\n") == []
    assert verdicts(f"[1.000000] a.out[99]: {XID79}\n") == []
    aer = "[1.000000] pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010\n"
    assert [ln.text for ln in kmsg.scan_buffer(aer.encode())] == [
        "0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010"]


# ------------------------------ util-linux dmesg: caller ids, -x, -d, -e

# Where each envelope's own message starts (util_linux_dmesg_envelopes.txt, line by line).
_ENVELOPE_MSG = ("BIOS-e820:", "User program", "snd_hda_intel", "usb 3-3.1", "new", "new", "new", "new", "new", "two",
                 "new", "new", "example[2]", "example[0]", "example[2]", "example[105]", "example[1]",
                 "log_array_reset", "debug-snapshot-log", "ipts mei", "INFO:")


def dmesg_envelopes() -> list[tuple[str, bool]]:
    """(envelope, written by the kernel) of every line of the util-linux capture file."""
    lines = (REAL / "util_linux_dmesg_envelopes.txt").read_text().splitlines()
    assert len(lines) == len(_ENVELOPE_MSG)
    out = []
    for line, msg in zip(lines, _ENVELOPE_MSG):
        env = line[:line.index(msg)]
        out.append((env, not env.startswith("user")))
    return out


@pytest.mark.parametrize("env,kern", dmesg_envelopes())
def test_every_dmesg_envelope_reads_as_plain_dmesg(tmp_path, env, kern):
    # A kernel built with CONFIG_PRINTK_CALLER gives every record a caller id
    # ("[T4]", "[  T334]", "[C1]"), which dmesg prints after the time; dmesg
    # -x, -d, -e and --time-format print the time their way.  The record is
    # the kernel's all the same (only root writes /dev/kmsg); -x's "user"
    # facility is a record userspace wrote, and is refused.
    # A caller id alone (dmesg --notime) is no stamp, and dmesg then leaves a
    # record's later lines unindented: a user's newline in a kernel message
    # could make such a line, so it only warns.
    notime = env.lstrip().startswith("[") and env.strip()[1:].lstrip()[:1] in ("T", "C")
    want = [(79, "0000:02:00.0", WARN if notime else DRAIN)] if kern else []
    assert verdicts(env + XID79 + "\n") == want
    rep = health(tmp_path, env + XID79 + "\n")
    assert rep.status == ((WARN if notime else DRAIN) if kern else "ok")


def test_a_multi_line_record_with_a_caller_id_keeps_its_continuations():
    # util-linux indents a record's later lines under its text (indentation-syslog-printk-caller)
    text = ("[ 1843.308145] [ T1234] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
            "                        NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
            "                        NVRM: fallen off the bus and is not responding to commands.\n")
    assert verdicts(text) == [(79, "0000:b3:00.0", DRAIN)]


def test_a_caller_id_without_a_time_only_warns():
    for env in ("[    T1] ", "[T4552] ", "kern  :err   : [    T1] ", "kern  :err   : "):
        lines = kmsg.scan_buffer(f"{env}{XID79}\n".encode())
        assert len(lines) == 1 and lines[0].doubt == kmsg_scan.UNKNOWN_FORMAT, env


def test_caller_ids_and_dmesg_stamps_do_not_open_a_new_route():
    # text before the driver's prefix is still another message's, whatever the stamp
    for env in ("[    1.000000] [    T1] ", "[Feb13 23:31] ", "[  +1.000000] ", "[<    0.000000>] ",
                "kern  :err   : [Fri Feb 13 23:31:31 2009] "):
        assert verdicts(f"{env}usb 1-1: Product: {XID79}\n") == [], env
        assert verdicts(f"{env}a.out[99]: {XID79}\n") == [], env
    # a relative or delta stamp is no time: after an "API mismatch" the next lines only warn
    mismatch = "NVRM: API mismatch: the client has the version 1, but\nNVRM: this kernel module has the version 2.\n"
    for env in ("[  +0.000004] ", "[<    0.000004>] "):
        assert verdicts(env + mismatch.replace("\n", "\n" + env, 1) + env + XID79 + "\n") == [
            (79, "0000:02:00.0", WARN)], env


# ----------------------------------------- Xids the driver attributes to MIG

def test_akash_dmesg_T_reads_as_its_codes_say():
    text = (REAL / "akash_dmesg_T_43_31_94.log").read_text()
    assert verdicts(text) == [(31, "0000:00:07.0", INFO), (43, "0000:00:05.0", INFO), (94, "0000:00:08.0", INFO)]


@pytest.mark.parametrize("attr", [" GPU-I:05", " GPU-I:01 GPU-CI:02"])
def test_an_xid_attributed_to_a_mig_instance_counts_for_its_gpu(tmp_path, attr):
    # On a GPU in MIG mode the driver names the GPU (and compute) instance
    # inside the parenthesis (kernel_rc.c XID_PRINT_WITH_ATTR; NVIDIA's own
    # example: "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained:
    # CE User Channel (0x9). RST: No, D-RST: No").  It is the same report.
    for code, rest in ((94, "pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No"),
                       (95, "pid=7062, Uncontained: LTC TAG (0x2,0x1). RST: Yes, D-RST: No"),
                       (79, "pid=9, name=a, GPU has fallen off the bus."),
                       (43, "pid=1045242, name=pt_main_thread, Ch 00000008")):
        plain = f"[ 12.345678] NVRM: Xid (PCI:0000:01:00): {code}, {rest}\n"
        mig = plain.replace("(PCI:0000:01:00)", f"(PCI:0000:01:00{attr})")
        assert verdicts(mig) == verdicts(plain) != [], mig
    rep = health(tmp_path, f"[ 1.0] NVRM: Xid (PCI:0000:01:00{attr}): 79, pid=9, name=a, GPU has fallen off the bus.\n")
    assert rep.status == DRAIN
    # a syslog text line stays a warning, MIG or not
    assert verdicts(f"Aug  9 13:32:56 n1 kernel: NVRM: Xid (PCI:0000:01:00{attr}): 79, GPU has fallen off the bus.\n"
                    ) == [(79, "0000:01:00.0", WARN)]


# ----------------------------------------------- journalctl -o json-pretty

def pretty_with(message: str, transport: str = "kernel") -> str:
    """The real json-pretty entries, each carrying *message* (and *transport*)."""
    text = (REAL / "journal_json_pretty_envelopes.log").read_text()
    out = []
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith('"MESSAGE" : '):
            line = line[:line.index('"MESSAGE"')] + '"MESSAGE" : ' + json.dumps(message) + ",\n"
        elif line.lstrip().startswith('"_TRANSPORT" : '):
            line = line[:line.index('"_TRANSPORT"')] + f'"_TRANSPORT" : "{transport}",\n'
        out.append(line)
    return "".join(out)


def test_journal_json_pretty_entries_read_like_json_lines(tmp_path):
    # journalctl -o json-pretty writes each entry as an object, one field per
    # indented line: journald's own _TRANSPORT proves the kernel as in -o json.
    text = pretty_with(XID79)
    assert verdicts(text) == [(79, "0000:02:00.0", DRAIN)]
    assert health(tmp_path, text).status == DRAIN
    # the 3-line "fallen off the bus" record is one MESSAGE with newlines
    off = ("NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\n"
           "NVRM: fallen off the bus and is not responding to commands.")
    assert verdicts(pretty_with(off)) == [(79, "0000:b3:00.0", DRAIN)]


@pytest.mark.parametrize("transport", ["syslog", "stdout", "journal"])
def test_a_json_pretty_entry_a_program_logged_is_refused(tmp_path, transport):
    assert verdicts(pretty_with(XID79, transport)) == []
    assert health(tmp_path, pretty_with(XID79, transport)).status == "ok"


def test_a_json_pretty_field_line_outside_an_object_only_warns():
    # cut from its object (a truncated copy), the line proves nothing: a warning, never silence
    text = "\n".join(ln for ln in pretty_with(XID79).splitlines() if ln not in ("{", "}")) + "\n"
    lines = kmsg.scan_buffer(text.encode())
    assert len(lines) == 2 and all(ln.doubt for ln in lines)
    assert verdicts(text) == [(79, "0000:02:00.0", WARN)]
