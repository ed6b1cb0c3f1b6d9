"""Property tests: the kernel-log readers, the XID parser and the health state.

Besides "a result or one line", two properties of issue 10 point 1 hold for
every input: text a job user can log never becomes a finding, and no drain
reason carries log text (it always reads back unchanged from scontrol).
"""
from __future__ import annotations

import json
import re

import pytest
from kmsgfake import serving
from fuzzlib import NASTY, fuzz_settings, json_values, mutated, outcome
from hypothesis import given
from hypothesis import strategies as st

from slurm_gpu.health import actions, xid
from slurm_gpu.health.findings import drain_reason
from slurm_gpu.health.nodestate import parse_show_node
from slurm_gpu.hw import kmsg
from paths import ROOT

DATA = ROOT / "tests" / "data" / "xid" / "real_kernel_xid_lines_from_issues.md"
REAL = [b.strip("\n") + "\n" for b in re.findall(r"```\n(.*?)```", DATA.read_text(), re.S)[:7]]
CORPUS = REAL + [
    "3,1187,812401212,-;NVRM: Xid (PCI:0000:c1:00): 119, pid=2170, name=python, Timeout waiting for RPC\n"
    "3,1188,812401213,-;NVRM: The NVIDIA GPU 0000:02:00.0\\x0aNVRM: (PCI ID: 10de:26b5) installed in this "
    "system has\\x0aNVRM: fallen off the bus and is not responding to commands.\n",
    "Aug 30 11:43:09 n1 kernel: [ 12.5] NVRM: Xid (PCI:0000:02:00): 154, GPU recovery action changed from "
    "0x0 (None) to 0x1 (GPU Reset Required)\nAug 30 11:43:09 n1 kernel: NVRM: API mismatch: the client has "
    "the version 1, but\n",
    json.dumps({"_TRANSPORT": "kernel", "SYSLOG_FACILITY": "0",
                "MESSAGE": "NVRM: Xid (PCI:0000:02:00): 48, pid=1, DBE"}) + "\n",
]
TOKENS = ["NVRM: ", "NVRM: Xid (PCI:0000:02:00): ", "79, ", "fallen off the bus", "AER: Uncorrected",
          " kernel: ", "\\x0a", "               ", "caused by previous Xid 79", "[root@1]", "3,", "14,",
          "NVRM: API mismatch: the client has the version ", "0000:02:00.0", "Link ", "(0x1 0x2)"]
STAMP = re.compile(r"\[[^\]\[\s]*@[^\]\[\s]*\]")


def _check_reason(findings):
    reason = drain_reason(findings)
    if reason is not None:
        assert not STAMP.search(reason), reason
        shown = f"NodeName=n1 State=IDLE+DRAIN Reason={reason} [slurm@2026-11-22T05:20:00]"
        assert parse_show_node(shown).reason == reason


# A real fault logged after whatever the mutated text holds: it must always be
# found (a parser that stops early, or lets earlier text swallow later lines,
# loses it), on a bus no corpus line names.
HEAD = "[    0.000000] Linux version 6.1.0-28-amd64\n"
SENTINEL = "[99999.999999] NVRM: Xid (PCI:0000:fe:00): 79, GPU has fallen off the bus.\n"


@fuzz_settings(2000)
@given(mutated(CORPUS, TOKENS))
def test_scan_parse_and_classify(text):
    # in a kernel reader's output (a file whose first line is a syslog text line proves nothing)
    lines = outcome(kmsg.scan_buffer, (HEAD + text + "\n" + SENTINEL).encode("utf-8", "surrogatepass"))
    events = outcome(xid.parse_lines, lines)
    findings = outcome(xid.check_xid, events, {})
    _check_reason(findings)
    assert ("gpu.xid", 79, "0000:fe:00.0", "drain") in {(f.check, f.xid, f.gpu, f.severity) for f in findings}


@fuzz_settings(1000)
@given(st.binary(max_size=400))
def test_scan_raw_bytes(data):
    _check_reason(xid.check_xid(xid.parse_lines(outcome(kmsg.scan_buffer, data))))


ENVELOPES = ["Aug 30 11:43:09 n1 alice: ", "Aug 30 11:43:09 n1 python3[7]: ", "14,1,1,-;", "11,1,1,-;",
             "[1.0] a.out[1]: ", "[1.0] usb 1-1: Product: ", "user  :err   : [1.0] ", "<12>[1.0] ",
             "2024-08-30T11:43:09+00:00 n1 alice: ", "3,1,1,-;NVRM: API mismatch: the client has the version "]


@fuzz_settings(1000)
@given(st.sampled_from(ENVELOPES),
       st.lists(st.one_of(st.sampled_from(TOKENS), st.text(max_size=8)), max_size=8).map("".join))
def test_text_a_user_can_log_is_never_a_finding(envelope, message):
    text = envelope + message.replace("\n", " ") + "\n"
    assert xid.check_xid(xid.parse_lines(kmsg.scan_buffer(text.encode("utf-8", "surrogatepass")))) == []


CURSOR_KEYS = ["kmsg", "files", "events", "boot_id", "seq", "inode", "offset", "mark", "memory", "cursor",
               "clean_runs", "drained_reason", "pending_reason", "slurmd", "isolated", "xid_memo", "nvlink5"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz-state")
    log, ev = d / "k.log", d / "ev.jsonl"
    log.write_text(REAL[0])
    ev.write_text(json.dumps({"event": "xid", "xid": 79, "gpu": "0000:02:00.0"}) + "\n{bad\n")
    return d / "state.json", log, ev


@fuzz_settings(1000)
@given(doc=json_values(CURSOR_KEYS))
def test_health_state_and_cursors(files, doc):
    state, log, ev = files
    state.write_text(json.dumps(doc, allow_nan=True).replace('"LOG"', json.dumps(str(log))))
    notes: list[str] = []
    loaded = outcome(actions.load_state, state, notes)
    assert isinstance(loaded, dict) and len(notes) <= 1
    cursor = loaded.get("cursor") or {}
    outcome(kmsg.read_source, str(log), cursor)
    recs, _ = outcome(kmsg.read_events, str(ev), cursor)
    _check_reason(xid.events_from_nvml(recs)[1])
    for raw in (doc, {"events": doc}, {"files": {str(log): doc}}, {"kmsg": doc}):
        if isinstance(raw, dict):
            # the cursor a run goes on with when its state file holds this one
            state.write_text(json.dumps({"cursor": raw}, allow_nan=True))
            c = outcome(actions.load_state, state, [])["cursor"]
            outcome(kmsg.read_source, str(log), c)
            outcome(kmsg.read_events, str(ev), c)


@fuzz_settings(1000)
@given(st.lists(st.one_of(st.binary(max_size=60), mutated([r.encode().decode() for r in [
    "3,11,200,-;NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.\n", "6,10,100,-;usb 1-1: x\n"]],
    ["9" * 30, ",", ";", "-1"]).map(lambda s: s.encode("utf-8", "surrogatepass"))), max_size=6),
    st.integers(-(1 << 70), 1 << 70))
def test_kmsg_device_records(recs, seq):
    with serving(recs, boot="b"):
        got = outcome(kmsg.read_kmsg, kmsg.KmsgCursor("b", seq), "/dev/null")
    lines, cur = got
    assert isinstance(cur.seq, int)


@fuzz_settings(1000)
@given(json_values(["event", "xid", "gpu", "data", "time", "dbe", "gpu_unavailable", "recovery_action"]))
def test_xid_watch_records(rec):
    recs = rec if isinstance(rec, list) else [rec]
    tail = [{"event": "xid", "xid": 79, "gpu": "0000:fe:00.0"}, {"event": "dbe", "gpu": "0000:fd:00.0"}]
    xids, direct = outcome(xid.events_from_nvml, [r for r in recs if isinstance(r, dict)] + tail)
    findings = direct + xid.check_xid(xids, {})
    _check_reason(findings)
    # whatever came before, the records after it are read
    got = {(f.check, f.gpu, f.severity) for f in findings}
    assert ("gpu.xid", "0000:fe:00.0", "drain") in got and ("gpu.ecc", "0000:fd:00.0", "drain") in got


@pytest.mark.parametrize("token", NASTY)
def test_nasty_tokens_in_every_field_of_an_xid_line(token):
    """Each token where the parser reads a field (bus, code, the free text, the cause, an NVLink5
    link and word): a result or one line, and never a word of it in a finding."""
    head = "NVRM: Xid (PCI:0000:02:00): "
    for text in (f"{head}79, {token}", f"{head}79, {token} caused by previous Xid 13",
                 f"{head}45, {token} caused by previous Xid {token}", f"NVRM: Xid (PCI:{token}): 79, x",
                 f"{head}{token}, x", f"{head}145, RLW_REMAP Fatal XC0 i0 Link {token} (0x4 0x40)",
                 f"{head}145, RLW_REMAP Fatal XC0 i0 Link 3 (0x4 {token})", f"{head}154, {token}"):
        lines = outcome(kmsg.scan_buffer, (text + "\n").encode("utf-8", "surrogatepass"))
        findings = outcome(xid.check_xid, outcome(xid.parse_lines, lines), {})
        _check_reason(findings)
        for f in findings:
            words = f.message.split(": ", 1)[1]
            assert len(token) < 3 or token.strip() == "" or token not in words, (text, f.message)
    # the free text after the code never changes the verdict
    lines = kmsg.scan_buffer(f"{head}79, {token}\n".encode("utf-8", "surrogatepass"))
    assert [(f.severity, f.gpu, f.xid, f.message) for f in xid.check_xid(xid.parse_lines(lines))] == [
        ("drain", "0000:02:00.0", 79, "Xid 79 on 0000:02:00.0: GPU has fallen off the bus")]
