"""The kernel's lines in a journal export file (``journalctl -o export``).

The export format (systemd's JOURNAL_EXPORT_FORMATS) is a series of entries
separated by an empty line.  A field is ``KEY=value`` on one line when the
value is printable text, else ``KEY``, a newline, a 64-bit little-endian
length, the raw value and a newline.  journald sets ``_TRANSPORT`` itself;
only an entry with ``_TRANSPORT=kernel`` (and ``SYSLOG_FACILITY`` 0, when
present) is the kernel's.

What a program logs can hold anything, an export entry's text included:
journald exports a value with a newline in it in the binary form, and its
bytes are never read as fields.  So the file is walked from an entry
boundary, and the binary values are stepped over by their length.  Only the
binary fields cost a Python step each (the text between them is searched by
one regex), and the driver prefixes are found as in a text log
(``kmsg_scan.find_hits``): only the entries with a hit are parsed.
"""
from __future__ import annotations

import re
from bisect import bisect_right

from .kmsg_scan import KernelLine, _message_lines, find_hits

TYPE_CHECKING = False   # not typing's: the health check imports this module (~2 ms)
if TYPE_CHECKING:
    from typing import Any

MAGIC = b"__CURSOR="
# A line that is a field's name alone: in a walk that starts at a field,
# the name of a binary field (journald's field names are A-Z, 0-9 and "_").
# The search starts at the newline before the line: a pattern that starts
# with a literal, with no group, is searched for at C speed (about 4 ms per
# MB of export; "^" with re.M, or a group, is 4x slower).
_BINARY_NAME = re.compile(rb"\n[A-Z0-9_]{1,64}\n")
_FIRST_NAME = re.compile(rb"[A-Z0-9_]{1,64}\n")
_FIELD = re.compile(rb"([A-Za-z0-9_]{1,64})=([^\n]*)\n")
MAX_FIELD = 768 << 20        # journald's DATA_SIZE_MAX: a longer value is no journal's (the file broke)
# A value longer than this is stepped over by its length, never read (the
# kernel's records are under 1 KiB: its entry is never one with such a value).
STEP_OVER = 1 << 20
# An entry boundary to resync at after bytes that are not the export format:
# an empty line, then a field's name.
_RESYNC = re.compile(rb"\n\n(?=[A-Za-z0-9_]{1,64}[=\n])")


Binary = tuple[bytes, int, int, int]   # name, where its line starts, where its length starts, its value's end


class Oversized(ValueError):
    """The entry at the start holds a value longer than ``STEP_OVER``; it ends (its newline) at ``value_end``."""

    def __init__(self, value_end: int) -> None:
        super().__init__(value_end)
        self.value_end = value_end


class Broken(ValueError):
    """The bytes at ``offset`` are not the export format (a binary value without its length or end)."""

    def __init__(self, offset: int) -> None:
        super().__init__(offset)
        self.offset = offset


def _walk(buf: bytes | bytearray, start: int, end: int) -> tuple[list[Binary], int, bool, int]:
    """The binary fields in ``buf[start:end]``, where the walk stopped, whether it stopped
    at bytes that are not the export format (else at a value *end* cuts off: read on next time),
    and where a value longer than ``STEP_OVER`` that *end* cuts off ends (else -1).
    """
    out: list[Binary] = []
    i = start
    while True:
        first = _FIRST_NAME.match(buf, i, end) if i == start else None
        if first is not None:
            ns, ls = first.start(), first.end()  # the name's line, where the length starts
        else:
            # from the newline that ends the field before (the previous value's)
            m = _BINARY_NAME.search(buf, i - 1 if i > start else i, end)
            if m is None:
                return out, end, False, -1
            ns, ls = m.start() + 1, m.end()
        ds = ls + 8
        if ds > end:
            return out, ns, False, -1
        size = int.from_bytes(buf[ls:ds], "little")
        de = ds + size
        if size > MAX_FIELD or (de < end and buf[de:de + 1] != b"\n"):
            return out, ns, True, -1
        if de + 1 > end:
            return out, ns, False, de if size > STEP_OVER else -1
        out.append((bytes(buf[ns:ls - 1]), ns, ls, de))
        i = de + 1


def _in_value(bins: list[Binary], starts: list[int], pos: int) -> int:
    """Index of the binary field whose length, value or closing newline holds *pos*, else -1."""
    k = bisect_right(starts, pos) - 1
    return k if k >= 0 and pos <= bins[k][3] else -1


def _boundary_before(buf: bytes | bytearray, bins: list[Any], starts: list[int], pos: int, start: int) -> int:
    """Where the entry holding *pos* starts (after the empty line before it)."""
    while True:
        p = buf.rfind(b"\n\n", start, pos)
        if p < 0:
            return start
        if _in_value(bins, starts, p + 1) < 0:
            return p + 2
        pos = p + 1                       # a newline inside a value: look further back


def _boundary_after(buf: bytes | bytearray, bins: list[Any], starts: list[int], pos: int, end: int) -> int:
    """Where the entry holding *pos* ends (its empty line), or -1 when *end* cuts it."""
    while True:
        p = buf.find(b"\n\n", pos, end)
        if p < 0:
            return -1
        if _in_value(bins, starts, p + 1) < 0:
            return p + 1
        pos = p + 1


def _last_boundary(buf: bytes | bytearray, bins: list[Any], starts: list[int], start: int, stop: int) -> int:
    """The end of the last whole entry before *stop* (*start* when none ends there)."""
    return _boundary_before(buf, bins, starts, stop, start)


def _entry(buf: bytes | bytearray, bins: list[Any], starts: list[int], es: int, ee: int) -> dict[bytes, bytes]:
    """The fields of the entry ``buf[es:ee]`` (the first value of each name)."""
    fields: dict[bytes, bytes] = {}
    k = bisect_right(starts, es)
    i = es
    while i < ee:
        if k < len(bins) and bins[k][1] == i:
            name, _, ls, de = bins[k]
            fields.setdefault(name, bytes(buf[ls + 8:de]))
            i, k = de + 1, k + 1
            continue
        m = _FIELD.match(buf, i, ee)
        if m is None:
            return {}                     # not the export format: not the kernel's
        fields.setdefault(m.group(1), m.group(2))
        i = m.end()
    return fields


def scan_export(buf: bytes | bytearray, start: int, end: int, base: int = 0) -> tuple[list[KernelLine], int]:
    """The kernel's driver lines in the whole entries of ``buf[start:end]``, and where the last one ends.

    *start* must be an entry boundary (the top of the file, or where the
    last read stopped).  Raises :class:`Broken` when the first entry is not
    the export format, :class:`Oversized` when it holds a value too long to
    read (the entries before either are read first).
    """
    bins, stop, broken, big = _walk(buf, start, end)
    starts = [b[2] for b in bins]
    cut = _last_boundary(buf, bins, starts, start, stop)
    if broken and cut == start:
        raise Broken(stop)
    if big >= 0 and cut == start:
        raise Oversized(big)
    out: list[KernelLine] = []
    done: set[int] = set()
    for ls, s, _ in find_hits(buf, start, cut):
        k = _in_value(bins, starts, s)
        if k >= 0:
            if bins[k][0] != b"MESSAGE":
                continue                  # in another field's value (a command line, say)
        elif not buf.startswith(b"MESSAGE=", ls):
            continue
        es = _boundary_before(buf, bins, starts, s, start)
        if es in done:
            continue                      # one decision per entry
        done.add(es)
        ee = _boundary_after(buf, bins, starts, s, cut)
        if ee < 0:
            continue
        f = _entry(buf, bins, starts, es, ee)
        if f.get(b"_TRANSPORT") != b"kernel" or f.get(b"SYSLOG_FACILITY", b"0") != b"0":
            continue                      # journald's own word: not the kernel's
        msg = f.get(b"MESSAGE")
        if msg is None:
            continue
        when = f.get(b"_SOURCE_MONOTONIC_TIMESTAMP") or f.get(b"__MONOTONIC_TIMESTAMP")
        w = when.decode("ascii", "replace") if when and when.isdigit() and len(when) <= 20 else None
        got = _message_lines(msg.decode("utf-8", "replace"), w)
        out += [KernelLine(ln.when, ln.text, ln.cont, at=base + es) for ln in got]
    return out, cut


def resync(buf: bytes | bytearray, start: int, end: int) -> int:
    """Where the first entry after ``buf[start]`` starts (an empty line, then a field's name), else -1."""
    m = _RESYNC.search(buf, start, end)
    return -1 if m is None else m.start() + 2
