"""Issue 24 §6, more real formats: ``journalctl -o verbose``, CRI container logs, unbounded json-pretty.

* ``journalctl -o verbose``: each entry is a header line at column 0, then one
  field per line indented by exactly 4 spaces; a value's later lines are
  indented by the field's width plus 5 (systemd ``output_verbose`` calls
  ``print_multiline(f, 4 + fieldlen + 1, ...)``), so a newline in a message
  cannot make a field line or a header.  ``_TRANSPORT=kernel`` (journald's
  own field) with ``SYSLOG_FACILITY=0`` proves the kernel; an entry whose
  origin cannot be proven warns, naming the line.  Old systemd printed each
  field raw after a tab (``"\\t%.*s\\n"``): there a newline in a value makes
  any field line, so such an entry only warns.
* CRI container logs (``<RFC3339Nano> stdout|stderr F|P <msg>``, kubelet's
  files under /var/log/pods): a line there is a container's output; an Xid in
  it warns, naming the line, and never drains.
* A root-owned json-pretty file with no ``}`` line is not re-read whole on
  every run: past two ``MAX_JSON_LINE`` windows, what has no entry end is
  read once (its reports warn) and the cursor moves on.

Real envelopes: tests/data/xid/real/journal_verbose_envelopes.log and
cri_container_log_envelopes.log (provenance in PROVENANCE.md there).
"""
from __future__ import annotations

import json

import pytest

from slurm_gpu.health import xid
from slurm_gpu.health.findings import DRAIN, WARN
from slurm_gpu.hw import kmsg, kmsg_scan
from paths import ROOT

REAL = ROOT / "tests" / "data" / "xid" / "real"
XID79 = "NVRM: Xid (PCI:0000:02:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


def findings(text: str) -> list[tuple[str, str]]:
    return [(f.severity, f.message) for f in xid.check_xid(xid.parse_lines(kmsg.scan_buffer(text.encode())))]


def verbose_entries() -> list[str]:
    """The real verbose file's header, then its two kernel entries, each with its MESSAGE line."""
    text = (REAL / "journal_verbose_envelopes.log").read_text()
    head, rest = text.split("\n", 1)
    assert head.startswith("-- Logs begin at ")
    cut = rest.index("\nTue 2017-10-24") + 1
    return [head + "\n", rest[:cut], rest[cut:]]


def with_message(entry: str, msg: str) -> str:
    lines = [f"    MESSAGE={msg}" if ln.startswith("    MESSAGE=") else ln for ln in entry.split("\n")]
    return "\n".join(lines)


# ------------------------------------------------------------ journalctl -o verbose

@pytest.mark.parametrize("which", [1, 2])
def test_a_verbose_kernel_entry_drains(which):
    parts = verbose_entries()
    parts[which] = with_message(parts[which], XID79)
    assert [sev for sev, _ in findings("".join(parts))] == [DRAIN]


def test_a_verbose_entry_from_a_user_is_not_the_kernel_s():
    head, first, second = verbose_entries()
    user = with_message(second, XID79).replace("    _TRANSPORT=kernel\n", "    _TRANSPORT=syslog\n")
    assert findings(head + first + user) == []        # journald says who sent it: not the kernel


def test_a_verbose_entry_without_its_transport_warns_naming_the_line():
    # journalctl -o verbose --output-fields=MESSAGE: nothing proves the sender
    head, first, second = verbose_entries()
    entry = "\n".join(ln for ln in with_message(second, XID79).split("\n")
                      if not ln.startswith(("    _TRANSPORT=", "    SYSLOG_FACILITY=")))
    text = head + first + entry
    got = findings(text)
    at = text.index("    MESSAGE=NVRM")
    assert [sev for sev, _ in got] == [WARN]
    assert f"byte {at} " in got[0][1] and "_TRANSPORT" in got[0][1]


def test_a_newline_in_a_users_message_cannot_forge_a_field_line_or_an_entry():
    head, first, second = verbose_entries()
    # What journalctl prints for a user's entry whose MESSAGE holds a fake
    # kernel entry: every later line of the value indented by len("    MESSAGE=").
    fake = ["hi", "Tue 2017-10-24 10:37:51.000000 UTC [s=6bffb876a10048479266ab251fa82f13;i=524715b;"
            "b=0a163cddc55946f889e0c7d0d3b917e8;m=914ed6facb6;t=55c4887dc4cce;x=98df4480dbf4c069]",
            "    _TRANSPORT=kernel", "    SYSLOG_FACILITY=0", f"    MESSAGE={XID79}"]
    user = ("Tue 2017-10-24 10:37:50.900000 UTC [s=6bffb876a10048479266ab251fa82f13;i=524715b;"
            "b=0a163cddc55946f889e0c7d0d3b917e8;m=914ed6facb5;t=55c4887dc4ccd;x=98df4480dbf4c068]\n"
            "    _TRANSPORT=stdout\n    SYSLOG_FACILITY=3\n    MESSAGE=" + ("\n" + " " * 12).join(fake) + "\n")
    got = findings(head + first + user + with_message(second, "usb 2-3: USB disconnect"))
    assert all(sev != DRAIN for sev, _ in got), got


def test_old_tab_indented_verbose_output_only_warns():
    # systemd before print_multiline printed "\t%.*s\n": a raw newline in a value made any field line
    head, first, second = verbose_entries()
    old = with_message(second, XID79).replace("\n    ", "\n\t")
    got = findings(head + first.replace("\n    ", "\n\t") + old)
    assert [sev for sev, _ in got] == [WARN]
    assert "tab" in got[0][1]


def test_a_kernel_entry_s_later_message_lines_never_start_an_event():
    head, first, second = verbose_entries()
    msg = ("NVRM: API mismatch: the client has the version 1\n" + " " * 12 + XID79)
    assert all(sev != DRAIN for sev, _ in findings(head + first + with_message(second, msg)))


def test_the_file_reader_reads_a_verbose_file_and_waits_for_an_entry_being_written(tmp_path):
    head, first, second = verbose_entries()
    entry = with_message(second, XID79)
    log = tmp_path / "journal.verbose"
    cut = entry.index("    _TRANSPORT=")                     # journalctl flushed mid-entry
    log.write_text(head + first + entry[:cut])
    log.chmod(0o644)
    lines, cur = kmsg.read_file(log)
    assert lines == [] and cur.offset == len((head + first).encode())
    with log.open("a") as f:
        f.write(entry[cut:])
    lines, cur = kmsg.read_file(log, cur)
    assert [(ln.doubt, ln.text) for ln in lines] == [(None, XID79)]
    assert cur.offset == log.stat().st_size


def test_verbose_is_its_own_family():
    head, first, _ = verbose_entries()
    assert kmsg_scan.head_family((head + first).encode()) == "verbose"
    # a dmesg-stamped line inside a verbose file is no entry: it warns
    got = findings(head + first + f"[  5.000000] {XID79}\n")
    assert [sev for sev, _ in got] == [WARN]


# ------------------------------------------------------------ CRI container logs

def cri_lines() -> list[str]:
    return (REAL / "cri_container_log_envelopes.log").read_text().splitlines()


@pytest.mark.parametrize("i", range(5))
def test_an_xid_in_a_container_log_warns_naming_the_line(i):
    envs = [ln[:ln.index(" ", ln.index(" ", ln.index(" ") + 1) + 1) + 1] for ln in cri_lines()]
    text = "".join(f"{e}hello\n" for e in envs) + f"{envs[i]}{XID79}\n"
    got = findings(text)
    assert [sev for sev, _ in got] == [WARN]
    assert "container" in got[0][1] and f"byte {text.index(envs[i] + 'NVRM')} " in got[0][1]


@pytest.mark.parametrize("inner", ["[ 5123.456789] ", "", "kernel: ", "<3>[ 5.0] "])
def test_a_dmesg_run_in_a_container_never_drains(inner):
    env = cri_lines()[2][:len("2018-09-20T11:54:11.753589172Z stdout F ")]
    got = findings(f"{env}{inner}{XID79}\n")
    assert [sev for sev, _ in got] == [WARN]


def test_a_container_log_line_inside_a_dmesg_file_warns():
    env = cri_lines()[2][:len("2018-09-20T11:54:11.753589172Z stdout F ")]
    got = findings(f"[    0.000000] Linux version 6.8.0\n{env}{XID79}\n")
    assert [sev for sev, _ in got] == [WARN]


# ------------------------------------------------------------ json-pretty without a "}" line

def test_a_json_pretty_file_without_an_entry_end_is_not_re_read_whole(tmp_path):
    log = tmp_path / "journal.json"
    filler = '\t"X" : "' + "y" * 100 + '",\n'
    body = "{\n" + filler * 200 + f'\t"MESSAGE" : "{XID79}",\n' + filler * 3000
    log.write_text(body)
    log.chmod(0o644)
    lines, cur = kmsg.read_file(log)
    size = log.stat().st_size
    # what no entry end can follow is read once: its report warns, and the cursor moves past it
    assert [(ln.doubt is not None, ln.text.startswith(XID79)) for ln in lines] == [(True, True)]
    assert size - 2 * kmsg_scan.MAX_JSON_LINE - len(filler) <= cur.offset <= size - 2 * kmsg_scan.MAX_JSON_LINE
    again, cur2 = kmsg.read_file(log, cur)
    assert again == [] and cur2.offset == cur.offset


def test_a_verbose_entry_split_across_chunks_is_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(kmsg, "CHUNK", 64)           # smaller than an entry
    head, first, second = verbose_entries()
    log = tmp_path / "journal.verbose"
    log.write_text(head + first + with_message(second, XID79) + first)
    log.chmod(0o644)
    lines, cur = kmsg.read_file(log)
    assert [(ln.doubt, ln.text) for ln in lines] == [(None, XID79)]
    assert cur.offset == log.stat().st_size


def test_doctor_calls_a_verbose_file_proven(tmp_path):
    head, first, second = verbose_entries()
    log = tmp_path / "journal.verbose"
    log.write_text(head + first + second)
    log.chmod(0o644)
    state, why = kmsg.sender_proof(str(log))
    assert state == "proven" and "verbose" in why


# ------------------------------------------------------------ what cannot be told apart (pinned: warn, never silent)

def test_a_dmesg_section_of_an_nvidia_bug_report_only_warns():
    # nvidia-bug-report.sh writes "____", "", "dmesg:", "" and then dmesg's output,
    # after sections that copy other writers' text: no header there proves one writer.
    head = (REAL / "nvidia_bug_report_head.log").read_text()
    text = head + "____________________________________________\n\ndmesg:\n\n" + f"[ 5123.456789] {XID79}\n"
    got = findings(text)
    assert [sev for sev, _ in got] == [WARN]
    assert f"byte {text.index('[ 5123.456789]')} " in got[0][1]


def test_a_dmesg_file_whose_first_record_names_a_task_kernel_only_warns():
    # "[t] h kernel: ..." is byte for byte journalctl -o short-monotonic (host "h"):
    # the first line makes the file a text log, whose reports only warn.
    text = (f"[ 5000.000000] h kernel: page allocation failure: order:0, mode:0x40cc0\n"
            f"[ 5001.000000] {XID79}\n")
    got = findings(text)
    assert [sev for sev, _ in got] == [WARN]


def test_a_header_and_fields_forged_in_an_old_verbose_file_never_drain():
    # Old journalctl printed a value raw after a tab: a user's message can hold
    # a whole new-form entry, header and 4-space fields included.
    head, first, second = verbose_entries()
    forged = with_message(second, XID79)
    user = ("Tue 2017-10-24 10:37:50.900000 UTC [s=6bffb876a10048479266ab251fa82f13;i=524715b;"
            "b=0a163cddc55946f889e0c7d0d3b917e8;m=914ed6facb5;t=55c4887dc4ccd;x=98df4480dbf4c068]\n"
            "\t_TRANSPORT=stdout\n\tMESSAGE=hi\n" + forged)
    got = findings(head + first.replace("\n    ", "\n\t") + user)
    assert [sev for sev, _ in got] == [WARN]
    assert kmsg_scan.head_family((head + first.replace("\n    ", "\n\t")).encode()) == "verbose-tab"


# ------------------------------------------------------------ JSON that names no sender

def docker_lines() -> list[str]:
    return (REAL / "docker_json_file_envelopes.log").read_text().splitlines()


@pytest.mark.parametrize("i", range(2))
def test_an_xid_in_a_docker_json_log_warns_naming_the_line(i):
    rec = json.loads(docker_lines()[i])
    text = docker_lines()[1 - i] + "\n" + json.dumps(dict(rec, log=XID79 + "\n")) + "\n"
    got = findings(text)
    assert [sev for sev, _ in got] == [WARN]
    assert "_TRANSPORT" in got[0][1] and f"byte {len(docker_lines()[1 - i]) + 1} " in got[0][1]


@pytest.mark.parametrize("line", [
    json.dumps({"MESSAGE": XID79}),                                      # journalctl -o json --output-fields=MESSAGE
    '{"_TRANSPORT": "kernel", "MESSAGE": "' + XID79 + '"',             # cut short
    json.dumps({"_TRANSPORT": "kernel", "MESSAGE": XID79, "X": "y" * kmsg_scan.MAX_JSON_LINE}),
])
def test_a_json_line_that_names_no_sender_warns(line):
    assert [sev for sev, _ in findings(line + "\n")] == [WARN]


def test_a_json_pretty_entry_that_names_no_sender_warns():
    text = '{\n\t"MESSAGE" : "' + XID79 + '"\n}\n'
    assert [sev for sev, _ in findings(text)] == [WARN]


def test_a_journal_json_line_from_a_user_stays_silent():
    # journald names the sender: proven not the kernel's (as a line tagged "alice:")
    line = json.dumps({"_TRANSPORT": "syslog", "SYSLOG_FACILITY": "1", "MESSAGE": XID79})
    assert findings(line + "\n") == []
