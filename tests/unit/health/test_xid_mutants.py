"""Issue 24 §8: what the XID classifier decides, and its exact words, pinned.

Mutation testing (mutmut, docs/development.md) found that most of
``health/xid.py`` could change without any test failing: actions, the
order of severities, the NVLink5 decode, the NVML records and every word of
the drain reason.  A drain reason is text that admins read and tools parse,
so the findings here are compared whole (severity, GPU, XID and message).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from slurm_gpu.health import xid
from slurm_gpu.health.findings import DRAIN, INFO, WARN, Finding
from slurm_gpu.health.xid import Verdict, XidEvent
from slurm_gpu.hw import kmsg
from slurm_gpu.hw.kmsg_scan import KernelLine
from paths import ROOT

DATA = ROOT / "tests" / "data" / "xid" / "real_kernel_xid_lines_from_issues.md"
BLOCKS = dict(re.findall(r"## ([A-H])\. .*?```\n(.*?)```", DATA.read_text(), re.S))
BUS = "0000:02:00.0"
XID79 = "NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."
AER = "0000:00:02.0: AER: Uncorrected (Fatal) error received: 0000:00:02.0"
OFF1 = "NVRM: The NVIDIA GPU 0000:02:00.0"
OFF2 = "NVRM: (PCI ID: 10de:26b5) installed in this system has"
OFF3 = "NVRM: fallen off the bus and is not responding to commands."
OFF_TEXT = "GPU has fallen off the bus (no Xid line)"


def rows(findings: list[Finding]) -> list[tuple[str, str | None, int | None, str]]:
    return [(f.severity, f.gpu, f.xid, f.message) for f in findings]


def scan(text: str) -> list[tuple[str, str | None, int | None, str]]:
    return rows(xid.check_xid(xid.parse_lines(kmsg.scan_buffer(text.encode()))))


def line(when: str | None, text: str, cont: bool = False) -> KernelLine:
    return KernelLine(when, text, cont)


def nvl(code: int, unit: str, sev: str, link: str, *words: int, bus: str = "0000:02:00") -> str:
    """An NVLink5 Xid line in the driver's form (unit, severity, link, six words)."""
    return (f"NVRM: Xid (PCI:{bus}): {code}, {unit} {sev} XC0 i0 Link {link} ("
            + " ".join(f"0x{w:08x}" for w in words) + ")")


# ------------------------------------------------------------ the real logs

REAL = {
    "A": [(DRAIN, BUS, 79, "Xid 79 on 0000:02:00.0: GPU has fallen off the bus, after a PCIe AER uncorrected "
                          "error at 0000:00:02.0")],
    "B": [(DRAIN, "0000:b3:00.0", 79, "Xid 79 on 0000:b3:00.0: GPU has fallen off the bus [driver printed no "
                                      "Xid line]")],
    "C": [(INFO, "0000:cb:00.0", 13, "Xid 13 on 0000:cb:00.0: Graphics Engine Exception [application error: "
                                     "node stays up] (3 reports)"),
          (INFO, "0000:cb:00.0", 109, "Xid 109 on 0000:cb:00.0: Context Switch Timeout Error [application "
                                      "error: node stays up]")],
    "D": [(DRAIN, f"0000:{b}:00.0", 45, f"Xid 45 on 0000:{b}:00.0: Preemptive cleanup, due to previous errors, "
                                        f"caused by previous Xid {c} (NVLINK: {n} Error) (2 reports)")
          for b, c, n in (("dc", 149, "NETIR"), ("ed", 145, "RLW"), ("ba", 145, "RLW"), ("97", 145, "RLW"))],
    "E": [(DRAIN, "0019:01:00.0", 149, "Xid 149 on 0019:01:00.0: NETIR/NETIR_INT Link Fatal, status 0x0: "
                                       "RESET_GPU (SYMPATHETIC_REPORT_SOLO)"),
          (DRAIN, "0000:00:00.0", 149, "Xid 149 on 0000:00:00.0: NETIR_LINK_EVT/NETIR_LINK_DOWN Link Fatal link 0, "
                                       "status 0x0: RESET_GPU (INVESTIGATE_PEER_DEVICE) (2 reports)"),
          (INFO, "0018:01:00.0", 145, "Xid 145 on 0018:01:00.0: RLW_RXPIPE Non-fatal link 13, status 0x8: IGNORE"),
          (INFO, "0000:01:00.0", 144, "Xid 144 on 0000:01:00.0: SAW_MVB Non-fatal link 0, status 0x8: IGNORE")],
    "F": [(WARN, None, 145, "Xid 145 on unknown GPU: RLW_RXPIPE Nonfatal link 11 (no decode-table row)"),
          (INFO, None, 137, "Xid 137 on unknown GPU: NVLink Privilege Error")],
    "G": [(INFO, "0000:01:00.0", 32, "Xid 32 on 0000:01:00.0: Invalid or corrupted push buffer stream "
                                     "[application error: node stays up] (2 reports)"),
          (INFO, "0000:01:00.0", 31, "Xid 31 on 0000:01:00.0: GPU memory page fault [application error: node "
                                     "stays up]")],
}


# Blocks D and F are excerpts whose lines start "kernel: ": a tag anyone can
# write (logger -t kernel), so as they stand they only warn (below); the
# verdicts here are those of the driver's words, as the kernel would log them.
EXCERPTS = ("D", "F")


@pytest.mark.parametrize("block", sorted(REAL))
def test_real_logs_give_these_exact_findings(block):
    text = BLOCKS[block]
    if block in EXCERPTS:
        text = re.sub(r"(?m)^kernel: ", "", text)
    assert scan(text) == REAL[block]


@pytest.mark.parametrize("block", EXCERPTS)
def test_an_excerpt_with_only_a_kernel_tag_warns_and_never_drains(block):
    got = scan(BLOCKS[block])
    assert got and all(sev in (WARN, INFO) and "not trusted (a syslog/journal text line" in msg
                       for sev, _, _, msg in got), got


# ------------------------------------------------------------ kernel lines

def test_a_line_object_without_cont_is_not_a_continuation():
    @dataclass
    class Bare:                       # a reader's line that has no .cont at all
        when: str | None
        text: str
    assert xid.parse_lines([Bare("5.0", XID79)]) == [
        XidEvent(code=79, gpu=BUS, text="GPU has fallen off the bus.", when="5.0")]


def test_an_xid_line_without_text_after_the_code():
    assert xid.parse_lines([line("1.0", "NVRM: Xid (PCI:0000:02:00): 79")]) == [
        XidEvent(code=79, gpu=BUS, text="", when="1.0")]


def test_the_echoed_client_record_is_dropped_for_exactly_its_lines():
    """With stamps the version-mismatch record hides its continuations and every
    same-time line after it, however many (a client string may hold any number of
    short "NVRM: " lines: a count of 12 let the 13th drain), and no later line."""
    lines = ([line("1.0", "NVRM: API mismatch: the client has the version 1, but")]
             + [line("1.0", XID79, cont=True)] * 3
             + [line("1.0", XID79)] * (xid.ECHO_MAX_LINES + 40)   # same time: the echoed string's lines
             + [line("2.0", XID79), line("3.0", XID79)])
    assert xid.ECHO_MAX_LINES == 2048 // 7 + 1                      # a record's size, for unstamped logs
    assert [ev.when for ev in xid.parse_lines(lines)] == ["2.0", "3.0"]


def test_three_line_fallen_off_the_bus_in_one_record_and_split_by_syslog():
    want = [XidEvent(code=79, gpu=BUS, text=OFF_TEXT, when="3.0", synthesized=True)]
    # rsyslog: every line carries the record's time, none is marked a continuation
    assert xid.parse_lines([line("3.0", OFF1), line("3.0", OFF2), line("3.0", OFF3)]) == want
    # dmesg/kmsg: the record's later lines are continuations; the event takes the last line's time
    got = xid.parse_lines([line("2.0", AER), line("2.5", OFF1), line("2.5", OFF2, True), line("3.0", OFF3, True)])
    assert got == [XidEvent(code=79, gpu=BUS, text=OFF_TEXT, when="3.0", synthesized=True, after_aer="0000:00:02.0")]


def test_a_cut_three_line_record_is_no_event_and_the_next_line_still_counts():
    # two lines of the three, then an Xid line at the same time: only that Xid
    assert xid.parse_lines([line("3.0", OFF1), line("3.0", OFF2), line("3.0", XID79)]) == [
        XidEvent(code=79, gpu=BUS, text="GPU has fallen off the bus.", when="3.0")]
    # the first line, then an unrelated same-time line, then an Xid line
    assert xid.parse_lines([line("3.0", OFF1), line("3.0", XID79)]) == [
        XidEvent(code=79, gpu=BUS, text="GPU has fallen off the bus.", when="3.0")]
    # the second and third lines from another record (other time, not continuations) finish nothing
    assert xid.parse_lines([line("3.0", OFF1), line("4.0", OFF2), line("4.0", OFF3)]) == []


def test_lines_after_a_continuation_or_a_one_line_off_bus_are_read():
    one = "NVRM: GPU at PCI:0000:03:00: GPU has fallen off the bus."
    got = xid.parse_lines([line("1.0", AER), line("1.0", "SUBSYSTEM=pci", True), line("2.0", one),
                           line("3.0", XID79)])
    assert got == [XidEvent(code=79, gpu="0000:03:00.0", text=OFF_TEXT, when="2.0", synthesized=True,
                            after_aer="0000:00:02.0"),
                   XidEvent(code=79, gpu=BUS, text="GPU has fallen off the bus.", when="3.0",
                            after_aer="0000:00:02.0")]


def test_an_aer_report_is_named_only_by_a_79():
    got = xid.parse_lines([line("1.0", AER), line("2.0", "NVRM: Xid (PCI:0000:02:00): 48, pid=1, DBE")])
    assert got == [XidEvent(code=48, gpu=BUS, text="pid=1, DBE", when="2.0")]


def test_nvlink5_fields_are_read_from_the_driver_words():
    def ev(text: str) -> XidEvent:
        [e] = xid.parse_lines([line("1.0", text)])
        return e
    e = ev("NVRM: Xid (PCI:0000:02:00): 150, mse_x Non-fatal XC0 i0 Link 1234 (0x1 0x2 0x3 0x4 0x5 0x6 0x7)")
    assert (e.unit, e.log_severity, e.link, e.words) == ("MSE_X", "nonfatal", 1234, (1, 2, 3, 4, 5, 6))
    e = ev("NVRM: Xid (PCI:0000:02:00): 144, SAW_MVB Fatal XC0 i0 Link 12345 (0x12345678 0x123456789 0x2)")
    assert (e.unit, e.log_severity, e.link, e.words) == ("SAW_MVB", "fatal", None, (0x12345678, 2))
    e = ev("NVRM: Xid (PCI:0000:02:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link -1 (0x1)")
    assert (e.unit, e.log_severity, e.link, e.words) == ("RLW_RXPIPE", "nonfatal", -1, (1,))
    e = ev("NVRM: Xid (PCI:0000:02:00): 145, RLW_RXPIPE Fatal no link here")
    assert (e.unit, e.log_severity, e.link, e.words) == ("RLW_RXPIPE", "fatal", None, ())
    e = ev("NVRM: Xid (PCI:0000:02:00): 151, KEY_X Fatal XC0 i0 Link 3 (0x1 0x2)")  # not NVLink5
    assert (e.unit, e.log_severity, e.link, e.words) == (None, None, None, ())
    e = ev("NVRM: Xid (PCI:0000:02:00): 143, KEY_X Fatal XC0 i0 Link 3 (0x1 0x2)")
    assert (e.unit, e.log_severity, e.link, e.words) == (None, None, None, ())


# ------------------------------------------------------------ NVML records

def test_nvml_records_become_exactly_these_events_and_findings():
    records = [
        {"event": "xid", "xid": 79, "gpu": "0000:07:00.0", "time": 5},
        {"event": "xid", "xid": 0, "gpu": "00000000:07:00.0", "time": 6},      # 16 characters: read
        {"event": "xid", "xid": 9999, "gpu": "0000:07:00.0     ", "time": 7},  # 17: not read
        {"event": "xid", "xid": 10000, "gpu": "0000:07:00.0"},
        {"event": "xid", "xid": -1, "gpu": "0000:07:00.0"},
        {"event": "xid", "xid": True, "gpu": "0000:07:00.0"},
        {"event": "xid", "xid": "79", "gpu": "0000:07:00.0"},
        {"event": "xid", "xid": 48, "gpu": 7},
        {"event": "other", "xid": 79, "gpu": "0000:07:00.0"},
        {"event": "dbe", "gpu": "0000:08:00.0"},
        {"event": "gpu_unavailable", "gpu": "0000:0b:00"},
        {"event": "recovery_action", "gpu": "0000:09:00.0", "data": 1 << 32},
        {"event": "recovery_action", "gpu": "0000:09:00.0", "data": True},
        {"event": "recovery_action", "gpu": "0000:09:00.0", "data": "2"},
        {"event": "recovery_action", "gpu": "0000:09:00.0", "data": -1},
        {"event": "recovery_action", "gpu": "0000:09:00.0"},
        {"event": "recovery_action", "gpu": "0000:09:00.0", "data": None},
        {"event": "recovery_action", "gpu": "0000:09:00.0", "data": 0},
        {"event": "recovery_action", "gpu": "0000:09:00.0", "data": 2},
        {"event": "recovery_action", "gpu": "0000:0a:00.0", "data": (1 << 32) - 1},
    ]
    xids, direct = xid.events_from_nvml(records)
    assert xids == [XidEvent(code=79, gpu="0000:07:00.0", when=5, source="nvml"),
                    XidEvent(code=0, gpu="0000:07:00.0", when=6, source="nvml"),
                    XidEvent(code=9999, gpu=None, when=7, source="nvml"),
                    XidEvent(code=48, gpu=None, source="nvml")]
    assert direct == [
        Finding("gpu.ecc", DRAIN, "NVML double-bit ECC event on 0000:08:00.0", "0000:08:00.0"),
        Finding("gpu.count", DRAIN, "NVML reports GPU 0000:0b:00.0 unavailable", "0000:0b:00.0"),
        Finding("gpu.recovery", DRAIN, "GPU 0000:09:00.0 needs a node reboot", "0000:09:00.0"),
        Finding("gpu.recovery", DRAIN, "GPU 0000:0a:00.0 needs recovery action 4294967295", "0000:0a:00.0"),
    ]


# ------------------------------------------------------------ classification

def test_classify_gives_these_exact_verdicts():
    def v(code: int, **kw) -> Verdict:
        return xid.classify(XidEvent(code=code, gpu=BUS, **kw))
    assert v(9999) == Verdict(WARN, "unknown", "Xid 9999 is not in NVIDIA's catalog", "")
    assert v(48) == Verdict(DRAIN, "hardware", "Double Bit ECC Error", "WORKFLOW_XID_48", job="fatal")
    assert v(45) == Verdict(INFO, "application", "Preemptive cleanup, due to previous errors", "WORKFLOW_XID_45",
                            job="process")
    unused = xid.entry(1)
    assert unused["description"] == "Unused"
    assert v(1) == Verdict(unused["action"], unused["kind"], f"{unused['mnemonic']} (unused code on current drivers)",
                           unused["immediate"])
    assert v(151) == Verdict(WARN, "software", "Key rotation Error", "RESTART_VM")
    # NVLink5 codes without the decode words: the catalog's action from a kernel line,
    # a warning from NVML (the kernel line, read too, decides)
    assert v(145, text="no unit") == Verdict(DRAIN, "nvlink5", "NVLINK: RLW Error", "WORKFLOW_NVLINK5_ERR")
    assert v(150, source="nvml") == Verdict(WARN, "nvlink5", "NVLINK: MSE Error (NVML event; the kernel line "
                                                             "decides)", "WORKFLOW_NVLINK5_ERR")
    assert v(144, source="nvml") == Verdict(WARN, "nvlink5", "NVLINK: SAW Error (NVML event; the kernel line "
                                                             "decides)", "WORKFLOW_NVLINK5_ERR")


def test_caused_by_previous_xid_follows_the_cause():
    def v(cause: int, decoded=None) -> Verdict:
        return xid.classify(XidEvent(code=45, gpu=BUS, cause=cause), decoded)
    head = "Preemptive cleanup, due to previous errors, caused by previous Xid"
    assert v(79) == Verdict(DRAIN, "hardware", f"{head} 79 (GPU has fallen off the bus)", "WORKFLOW_XID_45",
                            job="fatal")
    assert v(13) == Verdict(INFO, "application", f"{head} 13", "WORKFLOW_XID_45")
    assert v(63) == Verdict(INFO, "application", f"{head} 63", "WORKFLOW_XID_45")     # informational
    assert v(9999) == Verdict(INFO, "application", f"{head} 9999", "WORKFLOW_XID_45")  # not in the catalog
    prior = {(145, BUS): Verdict(INFO, "nvlink5", "RLW_RXPIPE Non-fatal, status 0x8: IGNORE")}
    assert v(145, prior) == Verdict(INFO, "nvlink5", f"{head} 145 (RLW_RXPIPE Non-fatal, status 0x8: IGNORE)",
                                    "WORKFLOW_XID_45")
    assert v(145, {(145, "0000:03:00.0"): prior[(145, BUS)]}).action == DRAIN   # another GPU's 145 is not the cause


@pytest.mark.parametrize("text,action,detail,job", [
    ("GPU recovery action changed from 0x0 (None) to 0x1 (Reset)", DRAIN, "a GPU reset", "fatal"),
    ("GPU recovery action changed from 0x1 (Reset) to 0x0 (None)", INFO, "no action", "none"),
    ("GPU recovery action changed from 0x0 to 2", DRAIN, "a node reboot", "fatal"),
    ("GPU recovery action changed from 0x0 to 4", DRAIN, "a drain and reset", "none"),
    ("GPU recovery action changed from 0x0 to 0x9", DRAIN, "action 9", "none"),
])
def test_xid_154_reads_the_new_recovery_action(text, action, detail, job):
    assert xid.classify(XidEvent(code=154, gpu=BUS, text=text)) == Verdict(
        action, "recovery", f"GPU recovery action changed to {detail}", "XID_154", job=job)


def test_xid_154_from_nvml_or_without_the_action_text():
    assert xid.classify(XidEvent(code=154, gpu=BUS, source="nvml")) == Verdict(
        WARN, "recovery", "GPU recovery action changed (NVML event; gpu.recovery reads the action)", "XID_154")
    assert xid.classify(XidEvent(code=154, gpu=BUS, text="something else")) == Verdict(
        DRAIN, "recovery", "GPU Recovery Action Changed", "XID_154")


# The decode table's rows (slurm_gpu/data/xid_catalog.json, nvlink5_rules): RLW_REMAP rows match intrinfo
# 0x82 (v1 pattern) or 0x4 (v2); status 0x8 resolves XID_154_EVAL, 0x40 RESET_GPU.
@pytest.mark.parametrize("text,sev,msg", [
    (nvl(145, "RLW_REMAP", "Nonfatal", "3", 0x4, 0x8), WARN,
     "RLW_REMAP Non-fatal link 3, status 0x8: XID_154_EVAL (CHECK_NVLINK_FAILURE_FLOW)"),
    (nvl(145, "RLW_REMAP", "Nonfatal", "3", 0x82, 0x8), WARN,
     "RLW_REMAP Non-fatal link 3, status 0x8: XID_154_EVAL (CHECK_NVLINK_FAILURE_FLOW)"),
    (nvl(145, "RLW_REMAP", "Fatal", "0", 0x4, 0x40), DRAIN, "RLW_REMAP Fatal link 0, status 0x40: RESET_GPU"),
    (nvl(145, "RLW_REMAP", "Nonfatal", "-1", 0x4, 0x100), INFO, "RLW_REMAP Non-fatal, status 0x100: IGNORE"),
    (nvl(145, "RLW_SRC_TRACK", "Nonfatal", "1", 0x7, 0x4), WARN, "RLW_SRC_TRACK Non-fatal link 1, status 0x4: "
                                                                  "XID_154_EVAL"),
    (nvl(145, "RLW_REMAP", "Nonfatal", "2", 0x4, 0x8, 0, 0, 0, 0), WARN,
     "RLW_REMAP Non-fatal link 2, status 0x8: XID_154_EVAL (CHECK_NVLINK_FAILURE_FLOW)"),
    # intrinfo 0 lacks the rows' required 1 bits: no row, the driver's word decides
    (nvl(145, "RLW_REMAP", "Nonfatal", "3", 0x0, 0x8), WARN, "RLW_REMAP Nonfatal link 3 (no decode-table row)"),
    (nvl(145, "RLW_REMAP", "Fatal", "3", 0x0, 0x8), DRAIN, "RLW_REMAP Fatal link 3 (no decode-table row)"),
    # one word is not enough to decode; the unit is named only when the table knows it
    (nvl(145, "RLW_REMAP", "Nonfatal", "3", 0x4), WARN, "RLW_REMAP Nonfatal link 3 (no decode-table row)"),
    (nvl(145, "EVIL_UNIT", "Fatal", "3", 0x4, 0x8), DRAIN, "NVLink unit Fatal link 3 (no decode-table row)"),
    # a status that only another XID's rows have
    (nvl(144, "RLW_REMAP", "Nonfatal", "3", 0x4, 0x8), WARN, "RLW_REMAP Nonfatal link 3 (no decode-table row)"),
    # the full "A/B" row name as the unit
    (nvl(149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "Fatal", "0", 0x025001c6, 0), DRAIN,
     "NETIR_LINK_EVT/NETIR_LINK_DOWN Link Fatal link 0, status 0x0: RESET_GPU (INVESTIGATE_PEER_DEVICE)"),
])
def test_nvlink5_decode_gives_these_exact_findings(text, sev, msg):
    code = int(text.split("): ", 1)[1].split(",")[0])
    assert scan(text + "\n") == [(sev, BUS, code, f"Xid {code} on {BUS}: {msg}")]


def test_nvlink5_verdicts_carry_the_resolution_and_kind():
    decoded = XidEvent(code=145, gpu=BUS, unit="RLW_REMAP", log_severity="fatal", link=0, words=(0x4, 0x40))
    assert xid.classify(decoded) == Verdict(DRAIN, "nvlink5", "RLW_REMAP Fatal link 0, status 0x40: RESET_GPU",
                                            "RESET_GPU", job="fatal")
    no_row = XidEvent(code=145, gpu=BUS, unit="RLW_REMAP", log_severity="fatal", link=0, words=(0x0, 0x40))
    assert xid.classify(no_row) == Verdict(DRAIN, "nvlink5", "RLW_REMAP Fatal link 0 (no decode-table row)",
                                           "WORKFLOW_NVLINK5_ERR")


def test_a_bus_id_without_a_domain_is_domain_0():
    assert [xid.normalize_bus(b) for b in ("02:00", "0001:02:00.1", " 000A0000:02:00 ", "...", "2:00")] == [
        "0000:02:00.0", "0001:02:00.1", "0000:02:00.0", None, None]


def test_a_unit_written_with_hyphens_matches_its_row():
    ev = XidEvent(code=145, gpu=BUS, unit="RLW-REMAP", log_severity="nonfatal", link=3, words=(0x4, 0x8))
    assert xid.decode_nvlink5(ev)["error_status"] == 8
    assert xid.classify(ev).detail == "RLW_REMAP Non-fatal link 3, status 0x8: XID_154_EVAL (CHECK_NVLINK_FAILURE_FLOW)"


# ------------------------------------------------------------ check_xid

def test_nvml_154_then_the_kernels_reset_required_154_drains():
    """Issue 24: warn and drain ranked equal let the first (NVML, warn) report win."""
    nvml = XidEvent(code=154, gpu=BUS, source="nvml")
    kern = XidEvent(code=154, gpu=BUS, text="GPU recovery action changed from 0x0 (None) to 0x1 (Reset)")
    assert rows(xid.check_xid([nvml, kern])) == [
        (DRAIN, BUS, 154, "Xid 154 on 0000:02:00.0: GPU recovery action changed to a GPU reset (2 reports)")]
    assert rows(xid.check_xid([kern, nvml])) == rows(xid.check_xid([nvml, kern]))


def test_the_worst_report_names_the_finding_and_every_report_counts():
    lo = XidEvent(code=13, gpu=BUS)
    hi = XidEvent(code=13, gpu=BUS, cause=79)
    assert rows(xid.check_xid([lo, hi, lo])) == [
        (DRAIN, BUS, 13, "Xid 13 on 0000:02:00.0: Graphics Engine Exception, caused by previous Xid 79 (GPU has "
                         "fallen off the bus) (3 reports)")]
    assert rows(xid.check_xid([lo, lo])) == [
        (INFO, BUS, 13, "Xid 13 on 0000:02:00.0: Graphics Engine Exception [application error: node stays up] "
                        "(2 reports)")]
    # equal rank: the first report names the finding
    a = XidEvent(code=149, gpu=BUS, unit="NETIR_LINK_EVT", log_severity="fatal", link=1, words=(0x025001c6, 0))
    b = XidEvent(code=149, gpu=BUS, unit="NETIR_LINK_EVT", log_severity="fatal", link=2, words=(0x025001c6, 0))
    assert [f.message for f in xid.check_xid([a, b])] == [
        "Xid 149 on 0000:02:00.0: NETIR_LINK_EVT/NETIR_LINK_DOWN Link Fatal link 1, status 0x0: RESET_GPU "
        "(INVESTIGATE_PEER_DEVICE) (2 reports)"]


def test_a_45_follows_the_latest_worst_decoded_cause():
    drain = XidEvent(code=145, gpu=BUS, unit="RLW_REMAP", log_severity="fatal", link=1, words=(0x4, 0x40))
    drain2 = XidEvent(code=145, gpu=BUS, unit="RLW_REMAP", log_severity="fatal", link=2, words=(0x4, 0x40))
    quiet = XidEvent(code=145, gpu=BUS, unit="RLW_REMAP", log_severity="nonfatal", link=3, words=(0x4, 0x100))
    app = XidEvent(code=45, gpu=BUS, cause=145)
    f45 = {f.xid: f for f in xid.check_xid([drain, drain2, quiet, app])}[45]
    assert (f45.severity, f45.message) == (DRAIN, "Xid 45 on 0000:02:00.0: Preemptive cleanup, due to previous "
                                                  "errors, caused by previous Xid 145 (RLW_REMAP Fatal link 2, status "
                                                  "0x40: RESET_GPU)")


def test_the_memo_carries_kernel_nvlink5_verdicts_across_runs():
    memo: dict[str, dict[str, str]] = {}
    evs = [XidEvent(code=c, gpu=BUS, text="t") for c in (143, 144, 150, 151)]
    evs += [XidEvent(code=145, gpu=None, unit="RLW_REMAP", log_severity="fatal", link=0, words=(0x4, 0x40)),
            XidEvent(code=146, gpu=BUS, source="nvml")]
    xid.check_xid(evs, memo)
    assert memo == {
        "144|0000:02:00.0": {"action": DRAIN, "kind": "nvlink5", "detail": "NVLINK: SAW Error"},
        "150|0000:02:00.0": {"action": DRAIN, "kind": "nvlink5", "detail": "NVLINK: MSE Error"},
        "145|": {"action": DRAIN, "kind": "nvlink5", "detail": "RLW_REMAP Fatal link 0, status 0x40: RESET_GPU"},
    }
    # the next run: a 45 whose cause was decoded in the last one
    later = [XidEvent(code=45, gpu=None, cause=145), XidEvent(code=45, gpu=BUS, cause=144)]
    assert rows(xid.check_xid(later, memo)) == [
        (DRAIN, None, 45, "Xid 45 on unknown GPU: Preemptive cleanup, due to previous errors, caused by previous "
                          "Xid 145 (RLW_REMAP Fatal link 0, status 0x40: RESET_GPU)"),
        (DRAIN, BUS, 45, "Xid 45 on 0000:02:00.0: Preemptive cleanup, due to previous errors, caused by previous "
                         "Xid 144 (NVLINK: SAW Error)")]


def test_memo_entries_keep_their_kind_and_default_to_empty_words():
    memo = {"145|0000:02:00.0": {"action": INFO, "kind": "application", "detail": "d"},
            "149|0000:02:00.0": {"action": WARN}}
    later = [XidEvent(code=45, gpu=BUS, cause=145), XidEvent(code=13, gpu=BUS, cause=149)]
    assert rows(xid.check_xid(later, dict(memo))) == [
        (INFO, BUS, 45, "Xid 45 on 0000:02:00.0: Preemptive cleanup, due to previous errors, caused by previous "
                        "Xid 145 (d) [application error: node stays up]"),
        (WARN, BUS, 13, "Xid 13 on 0000:02:00.0: Graphics Engine Exception, caused by previous Xid 149 ()")]
