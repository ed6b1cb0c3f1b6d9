"""Review of the ``journalctl -o verbose`` reader (kmsg_scan, kmsg.read_file).

* A user's multi-line MESSAGE of many "NVRM: " lines costs linear work: the
  entry holding each hit is found from the column-0 line starts, collected
  once, not by walking back line by line from every hit (which took 93 s for
  a 128 KiB file and tripped the run's watchdog on every run).
"""
from __future__ import annotations

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
