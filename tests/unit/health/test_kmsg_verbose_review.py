"""Review of the ``journalctl -o verbose`` reader (kmsg_scan, kmsg.read_file).

* A user's multi-line MESSAGE of many "NVRM: " lines costs linear work: the
  entry holding each hit is found from the column-0 line starts, collected
  once, not by walking back line by line from every hit (which took 93 s for
  a 128 KiB file and tripped the run's watchdog on every run).
* A verbose file whose first line is no entry header (copytruncate, or
  ``journalctl -f -o verbose > f`` cut mid-entry) is still a verbose file: its
  family comes from its first column-0 line when that is an entry header, and
  a ``    MESSAGE=`` hit in a file of no proven family warns, naming the line.
"""
from __future__ import annotations

import json

import pytest

from slurm_gpu.health.findings import DRAIN, WARN
from slurm_gpu.hw import kmsg, kmsg_scan

from test_kmsg_more_formats import XID79, findings, verbose_entries, with_message

HEADER = ("Tue 2017-10-24 10:37:50.900000 UTC [s=6bffb876a10048479266ab251fa82f13;i=524715b;"
          "b=0a163cddc55946f889e0c7d0d3b917e8;m=914ed6facb5;t=55c4887dc4ccd;x=98df4480dbf4c068]\n")


def user_entry(lines: int) -> str:
    """A user's journal entry whose MESSAGE is "hi" and then *lines* lines "NVRM: " (as journalctl prints it)."""
    return (HEADER + "    _TRANSPORT=journal\n    SYSLOG_FACILITY=3\n    MESSAGE=hi\n"
            + (" " * 12 + "NVRM: \n") * lines)


class CountingBuf(bytearray):
    """A buffer that counts the searches and slices made on it (a structural bound on the scan's work)."""

    calls = 0

    def find(self, *a):  # type: ignore[override]
        CountingBuf.calls += 1
        return super().find(*a)

    def rfind(self, *a):  # type: ignore[override]
        CountingBuf.calls += 1
        return super().rfind(*a)

    def __getitem__(self, i):  # type: ignore[override]
        CountingBuf.calls += 1
        return super().__getitem__(i)


def test_a_users_many_line_message_costs_linear_work():
    head = verbose_entries()[0]
    text = (head + user_entry(1500)).encode()
    CountingBuf.calls = 0
    got = kmsg.scan_buffer(CountingBuf(text))
    assert got == []                                     # journald says a user sent it: silent
    # a few searches per hit; walking back from every hit is ~hits² / 2 (over a million here)
    assert CountingBuf.calls <= 10 * 1500 + 100, CountingBuf.calls


def test_the_file_reader_reads_a_users_huge_message_once_and_moves_on(tmp_path):
    head, first, second = verbose_entries()
    log = tmp_path / "journal.verbose"
    log.write_text(head + user_entry(7000) + with_message(second, XID79) + first)
    log.chmod(0o644)
    lines, cur = kmsg.read_file(log)
    assert [(ln.doubt, ln.text) for ln in lines] == [(None, XID79)]
    assert cur.offset == log.stat().st_size


def test_a_hit_deep_in_a_long_kernel_free_entry_is_still_that_entry_s():
    # beyond the old 64 KiB walk-back reach: still the user's entry, so silent
    head = verbose_entries()[0]
    assert findings(head + user_entry(4000)) == []
    assert kmsg_scan.MAX_JSON_LINE < len(user_entry(4000)) < 2 * kmsg_scan.MAX_JSON_LINE


# ------------------------------------------------------------ a verbose file cut mid-entry

def kernel_xid_entry() -> str:
    return with_message(verbose_entries()[2], XID79)


@pytest.mark.parametrize("cut", [
    "    _HOSTNAME=n1\n    MESSAGE=hi\n",            # copytruncate: the file starts inside an entry
    "ORT=kernel\n    MESSAGE=hi\n",                 # a follower's block cut mid-line
    "  continued line of a value\n",                 # inside a value's later lines
])
def test_a_verbose_file_cut_mid_entry_still_reads_its_kernel_entries_as_warnings(cut, tmp_path):
    """Never silent, never a drain: its first line proves no writer (a cut dmesg
    --notime file whose first lines are a client's echoed text could show a
    header of the user's), so its kernel entries warn."""
    text = cut + kernel_xid_entry()
    assert kmsg_scan.head_family(text.encode()) == "verbose-cut"
    got = findings(text)
    assert [sev for sev, _ in got] == [WARN] and "starts mid-entry" in got[0][1], got
    log = tmp_path / "journal.verbose"
    log.write_text(text)
    log.chmod(0o644)
    lines, cur = kmsg.read_file(log)
    assert [(ln.doubt, ln.text) for ln in lines] == [(kmsg_scan.VERBOSE_CUT, XID79)]
    assert cur.offset == log.stat().st_size
    # A user's entry in such a file stays silent, as in a whole one.
    user = kernel_xid_entry().replace("_TRANSPORT=kernel", "_TRANSPORT=syslog")
    assert findings(cut + user) == []


def test_the_cut_entry_s_own_message_warns_naming_the_line():
    text = f"    _HOSTNAME=n1\n    MESSAGE={XID79}\n" + kernel_xid_entry()
    got = findings(text)
    assert {sev for sev, _ in got} == {WARN}
    assert any("byte 17 " in msg for sev, msg in got if sev == WARN), got


def test_a_message_field_in_a_file_of_no_proven_family_warns_never_silent():
    # no entry header within the file's head: nothing says which writer it is
    text = "    _HOSTNAME=n1\n" + f"    MESSAGE={XID79}\n" + "    _PID=1\n" * 3
    got = findings(text)
    assert [sev for sev, _ in got] == [WARN]
    assert "byte 17 " in got[0][1]


@pytest.mark.parametrize("first, family, sev", [
    ("    continued text of a record\n", None, DRAIN),   # each line judged alone, as before
    ("ORT=kernel\n", "none", WARN),                     # a bare first line: another family warns, as before
])
def test_a_dmesg_file_starting_with_an_indented_or_bare_line_is_not_made_verbose(first, family, sev):
    # stamped dmesg indents a record's later lines: a cut file may start with one
    text = first + f"[    5.000000] {XID79}\n"
    assert kmsg_scan.head_family(text.encode()) == family
    assert [s for s, _ in findings(text)] == [sev]


def test_a_cut_old_tab_verbose_file_stays_unproven():
    text = "\t_HOSTNAME=n1\n" + kernel_xid_entry().replace("\n    ", "\n\t")
    assert kmsg_scan.head_family(text.encode()) == "verbose-cut"       # cut: nothing in it is proven
    assert [sev for sev, _ in findings(text)] == [WARN]


# ------------------------------------------------------------ facility 0 from userspace

@pytest.mark.parametrize("transport", ["syslog", "stdout", "journal"])
def test_a_users_kern_facility_entry_is_silent(transport):
    # journald omits SYSLOG_FACILITY for facility 0 (`logger -p kern.err 'NVRM: Xid ...'`):
    # its _TRANSPORT still names a sender that is not the kernel
    head, first, second = verbose_entries()
    user = "\n".join(ln for ln in kernel_xid_entry().split("\n") if not ln.startswith("    SYSLOG_FACILITY="))
    user = user.replace("    _TRANSPORT=kernel\n", f"    _TRANSPORT={transport}\n")
    assert findings(head + first + user) == []


def test_a_kernel_entry_without_its_facility_still_warns():
    head, first, _ = verbose_entries()
    entry = "\n".join(ln for ln in kernel_xid_entry().split("\n") if not ln.startswith("    SYSLOG_FACILITY="))
    got = findings(head + first + entry)
    assert [sev for sev, _ in got] == [WARN]
    assert "SYSLOG_FACILITY" in got[0][1]


# ------------------------------------------------------------ a message journalctl prints as bytes

CTRL_XID = XID79.replace("name=python3", "name=py\x01thon3")


def test_a_json_kernel_message_printed_as_bytes_is_read():
    # journalctl -o json prints a message that is not printable as an array of its bytes
    rec = {"_TRANSPORT": "kernel", "SYSLOG_FACILITY": "0", "__REALTIME_TIMESTAMP": "1",
           "MESSAGE": list(CTRL_XID.encode())}
    for line in (json.dumps(rec, separators=(",", ":")), json.dumps(rec, separators=(", ", " : "))):
        assert [sev for sev, _ in findings(line + "\n")] == [DRAIN], line[:80]


def test_a_json_users_message_printed_as_bytes_stays_silent():
    rec = {"_TRANSPORT": "syslog", "SYSLOG_FACILITY": "0", "MESSAGE": list(CTRL_XID.encode())}
    assert findings(json.dumps(rec, separators=(",", ":")) + "\n") == []


def blob_lines(text: str) -> list[kmsg.KernelLine]:
    return [ln for ln in kmsg.scan_buffer(text.encode()) if ln.doubt and not ln.text]


def test_a_verbose_kernel_message_printed_as_a_blob_warns_naming_the_line():
    head, first, second = verbose_entries()
    text = head + first + with_message(second, "[142B blob data]") + with_message(second, "[1.5K blob data]")
    got = blob_lines(text)
    at = text.index("    MESSAGE=[142B")
    assert len(got) == 1, got                                # one warning per read
    assert f"byte {at} " in got[0].doubt and "--all" in got[0].doubt and "1 more" in got[0].doubt


def test_a_users_blob_message_stays_silent():
    head, first, second = verbose_entries()
    user = with_message(second, "[142B blob data]").replace("    _TRANSPORT=kernel\n", "    _TRANSPORT=stdout\n")
    assert kmsg.scan_buffer((head + first + user).encode()) == []


# ------------------------------------------------------------ a line too long for any entry of the kernel's

@pytest.mark.parametrize("family", ["verbose", "pretty"])
def test_a_huge_single_line_value_is_stepped_over_not_read_whole(family, tmp_path, monkeypatch):
    monkeypatch.setattr(kmsg, "CHUNK", 256 << 10)
    reads: list[int] = []
    preadv, pread = kmsg.os.preadv, kmsg.os.pread
    monkeypatch.setattr(kmsg.os, "preadv", lambda fd, bufs, pos: reads.append(sum(len(b) for b in bufs))
                        or preadv(fd, bufs, pos))
    monkeypatch.setattr(kmsg.os, "pread", lambda fd, n, pos: reads.append(n) or pread(fd, n, pos))
    long = "NVRM: " + "y" * (3 << 20)                         # a user's 3 MiB message, one line
    if family == "verbose":
        head, first, second = verbose_entries()
        user = HEADER + "    _TRANSPORT=stdout\n    MESSAGE=" + long + "\n    _PID=1\n"
        text = head + first + user + kernel_xid_entry()
    else:
        def entry(transport: str, msg: str) -> str:
            return f'{{\n\t"_TRANSPORT" : "{transport}",\n\t"SYSLOG_FACILITY" : "0",\n\t"MESSAGE" : "{msg}"\n}}\n'
        text = entry("stdout", "hi") + entry("stdout", long) + entry("kernel", XID79)
    log = tmp_path / "journal.log"
    log.write_text(text)
    log.chmod(0o644)
    lines, cur = kmsg.read_file(log)
    assert max(reads) <= 256 << 10, max(reads)               # memory stays one chunk, however long the line
    assert [(ln.doubt, ln.text) for ln in lines] == [(None, XID79)]
    assert cur.offset == log.stat().st_size
