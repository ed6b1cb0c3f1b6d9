"""Finding the kernel's own GPU-driver lines in a buffer of kernel-log text.

The scan half of :mod:`slurm_gpu.hw.kmsg` (which re-exports
:class:`KernelLine` and :func:`scan_buffer`; its docstring says which lines
count as the kernel's): pure functions over bytes, no I/O.
"""
from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass, replace

TYPE_CHECKING = False   # not typing's: the health check imports this module
if TYPE_CHECKING:
    from typing import Any

KERN = 0                     # syslog facility of the kernel's own records
MAX_JSON_LINE = 64 << 10     # a journal export line longer than this is not ours to parse

# Each pattern starts with its literal: the scan finds the literal with
# ``bytes.find`` (see _find) and lets the pattern search on from there.
_PATTERNS = ((b"NVRM: ", re.compile(rb"NVRM: [^\n]*")),
             (b"AER: Uncorrected", re.compile(rb"AER: Uncorrected[^\n]*")),
             (b"nvidia-nvswitch", re.compile(rb"nvidia-nvswitch\d{1,3}: SXid [^\n]*")))
# CPython's ``bytes.find`` picks its algorithm by size: for a haystack under
# 30,000 bytes (and a needle under 100) a skip search that jumps about a
# needle's length past bytes the needle lacks; above that, two-way.  Over a
# kernel log the skip search is 1.5-4x faster than two-way and than ``re``'s
# scan for a literal prefix (one byte at a time), so the scan searches in
# windows below that size (docs/development.md, issue 15).
_WINDOW = 29_000
# The drivers' own prefixes: what a kept message (or its continuation) starts with.
_DRIVER = re.compile(r"NVRM: |nvidia-nvswitch\d{1,3}: SXid ")
_KTS = r"\[\s*(?P<kts>\d{1,10}\.\d{1,9})\]\s"          # the kernel's own "[  123.456789] "
# A month or weekday as a locale writes it (journalctl and dmesg use strftime's
# %b/%a): "Aug", "Okt", "oct.", "окт", "10月".
_WORD = r"[^\s\[\]:]{1,12}"
_HOST = r"[^\s:\[\]]{1,255}"
# dmesg's (util-linux) ways of printing a record's time, each of which it may
# print alone or several at once (--time-format given twice, -d with -T):
# "[  12.345678]", with -d "[  12.345678 <    0.000123>]" or "[<    0.000123>]",
# --ctime "[Fri Aug 30 11:43:09 2024]" (any locale), -e/reltime "[Aug30 11:43]"
# and "[  +0.000123]", iso "2024-08-30T11:43:09,123456+00:00".
_NUM = r"\d{1,10}\.\d{1,9}"
_DELTA = r"(?:\s<\s*" + _NUM + r">)?"
_CTIME = _WORD + " " + _WORD + r" [ \d]\d [\d:]{8} \d{4}"
_REL = r"<\s*" + _NUM + r">|\s*\+" + _NUM + "|" + _WORD + r" ?\d{1,2} \d\d:\d\d"
_ISO = r"\d{4}-\d\d-\d\dT[\d:]{8}[,.\d]{0,10}(?:[+-]\d\d:?\d\d|Z)?"
_MORE = (r"(?:\s(?:\[(?:\s*" + _NUM + _DELTA + "|" + _CTIME + _DELTA + "|" + _REL + r")\]|" + _ISO + "))*")
# A kernel built with CONFIG_PRINTK_CALLER gives every record the id of the
# task or CPU that logged it; dmesg prints it after the time ("[   T334]"),
# the kernel's own syslog(2) text (dmesg -S, /proc/kmsg) right after it
# ("[  1.087841][  T334]").  The kernel sets it, for userspace's writes too.
# Alone (dmesg --notime) it proves nothing: dmesg then leaves a record's later
# lines unindented, so a user's newline in a kernel message could start one.
_CALLER = r"(?:\s?\[\s{0,10}[TC]\d{1,10}\])?"
_DSTAMP = _MORE + _CALLER + r"\s"                 # what may follow dmesg's first time field
# Everything a trusted line may carry before the driver's text.  One
# alternative per log format; the named groups say who wrote the line.
_ENVELOPE = re.compile(
    r"(?:"
    r"(?P<cont>[ \t]+)"                                                   # continuation (dmesg, journal)
    r"|(?P<kpri>\d{1,4}),(?P<seq>\d{1,20}),(?P<usec>\d{1,20}),[^;]{0,200};"  # raw kmsg record
    r"|<(?P<rpri>\d{1,4})>\[\s*(?P<rmono>" + _NUM + r")\]" + _CALLER + r"\s"  # dmesg -r
    # dmesg -x, with any time format
    r"|(?P<xfac>[a-z]{2,8})\s*:(?P<xlvl>[a-z]{2,8})\s*:\s(?:\[(?:\s*(?P<xmono>" + _NUM + r")" + _DELTA
    + "|(?P<xctime>" + _CTIME + ")" + _DELTA + "|" + _REL + r")\]|(?P<xiso>" + _ISO + "))" + _DSTAMP
    # dmesg; with "<host> kernel: " after it, journalctl -o short-monotonic (--no-hostname: "kernel: ")
    + r"|\[\s*(?P<mono>" + _NUM + r")" + _DELTA + r"\]" + _DSTAMP
    + r"(?:(?:(?P<mhost>" + _HOST + r")\s)?(?P<mkern>kernel):\s)?"
    + r"|\[(?P<ctime>" + _CTIME + r")" + _DELTA + r"\]" + _DSTAMP     # dmesg --ctime, any locale
    + r"|\[(?P<rel>" + _REL + r")\]" + _DSTAMP                     # dmesg -d alone, -e / reltime
    + r"|(?P<iso>" + _ISO + r")(?:\s(?P<ihost>[^\s:\[\]]+)\s(?P<itag>[^\s:]+):\s(?:"
    + _KTS.replace("kts", "ikts") + r")?|" + _DSTAMP + ")"
    # talosctl dmesg: "<node>: <facility>: <level>: [<time>]: "; Talos reads
    # /dev/kmsg, so the facility is the record's own (userspace writes: "user").
    r"|(?P<tnode>[^\s\[\]]{1,64}?):\s(?P<tfac>[a-z]{2,8}):\s{1,8}(?P<tlvl>[a-z]{2,8}):\s"
    r"\[(?P<tts>[\dT:.,+Z-]{10,40})\]:\s"
    # syslog / journalctl short, any locale, with or without the host name; a
    # tag may hold spaces ("x kernel" is a tag, not the kernel)
    r"|(?P<sys>" + _WORD + r" [ \d]\d [\d:]{8}(?:[.,]\d{1,9})?)\s(?:(?P<host>[^\s:\[\]]+)\s)?"
    r"(?P<tag>[^:\n]{1,64}?):\s(?:" + _KTS.replace("kts", "skts") + r")?"
    r"|(?P<bare>kernel):\s(?:" + _KTS.replace("kts", "bkts") + r")?"        # "kernel: NVRM: ..." excerpts
    # journalctl -o short-unix / short-full ("Fri 2024-08-30 11:43:09 UTC", weekday in any locale)
    r"|(?:(?P<unix>\d{9,11}\.\d{6})|(?P<full>" + _WORD + r" \d{4}-\d\d-\d\d [\d:]{8} [^\s\[\]:]{1,12}))"
    r"\s" + _HOST + r"\s(?P<jtag>[^:\n]{1,64}?):\s"
    r")?")
_AER_DEV = re.compile(r"[a-z][\w-]{0,31} (?P<dev>[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]): ")


@dataclass(frozen=True)
class KernelLine:
    """One kernel message line of interest: its timestamp as logged, and its text.

    ``cont``: the line continues a multi-line record (never the start of an event).
    ``doubt``: why the line is not proven the kernel's (no log format we know
    comes before the driver's text); such a line never starts an event, and
    ``gpu.xid`` warns about it.  ``at``: the line's byte offset in what was read.
    ``indents``: the line is dmesg's with a time field but no kernel time
    (``-e``, deltas, ``-x``): reading ``/dev/kmsg``, dmesg indents a record's
    later lines (``dmesg -S`` prefixes them instead, and then none is indented).
    """

    when: str | None
    text: str          # from the subsystem tag on: "NVRM: Xid (PCI:...): 79, ..." or "0000:00:02.0: AER: ..."
    cont: bool = False
    doubt: str | None = None
    at: int = -1
    indents: bool = False


UNKNOWN_FORMAT = "no log format slurm-gpu knows comes before the driver's text"
# A syslog or journal *text* line names its sender only by the tag the sender
# chose: `logger -t kernel` (any local user) writes the kernel's own bytes into
# /var/log/messages, journalctl's short formats and RFC 3339 files alike.
TAG_ONLY = ("a syslog/journal text line whose only sign of the kernel is the \"kernel:\" tag, which any "
            "local user can write (logger -t kernel)")
SAME_RECORD = ("the line before it, another message, has the same kernel time: "
               "a newline in that message may have made this line")
# The envelope groups that hold the kernel's own monotonic time ("[ 5123.456789]").
_KSTAMPS = ("mono", "rmono", "xmono", "skts", "ikts", "bkts")


def _trusted(m: re.Match[str]) -> tuple[bool, str | None, bool]:
    """(written by the kernel, its timestamp, is a continuation) for an envelope match."""
    g = m.groupdict()
    if g["cont"] is not None:
        return True, None, True
    if g["kpri"] is not None:
        return int(g["kpri"]) >> 3 == KERN, f"{int(g['usec']) / 1e6:.6f}", False
    if g["rpri"] is not None:
        return int(g["rpri"]) >> 3 == KERN, g["rmono"], False
    if g["xfac"] is not None:
        return g["xfac"] == "kern", g["xmono"] or g["xctime"] or g["xiso"], False
    if g["unix"] is not None or g["full"] is not None:
        return g["jtag"] == "kernel", g["unix"] or g["full"], False
    if g["mono"] is not None or g["ctime"] is not None:
        return True, g["mono"] or g["ctime"], False
    if g["rel"] is not None:
        # dmesg's: a relative time (or a delta) dates nothing, so it is no stamp
        # (after an "API mismatch" the lines that follow only warn: health/xid.py)
        return True, None, False
    if g["iso"] is not None:
        if g["ihost"] is None:
            return True, g["iso"], False                   # dmesg --time-format iso
        return g["itag"] == "kernel", g["ikts"] or g["iso"], False
    if g["tfac"] is not None:
        return g["tfac"] == "kern", g["tts"], False
    if g["sys"] is not None:
        return g["tag"] == "kernel", g["skts"] or g["sys"], False
    if g["bare"] is not None:
        return True, g["bkts"], False
    return True, None, False                               # the message alone, at the start of the line


def _tag_only(m: re.Match[str]) -> bool:
    """Whether a trusted envelope says "kernel" only as a syslog/journal tag (``TAG_ONLY``).

    The formats whose sender is proven are the record formats: a ``/dev/kmsg``
    record's facility (``kpri``, ``dmesg -r``/``-x``, Talos), dmesg's own
    stamps (it reads ``/dev/kmsg``, which only root writes) and journald's
    fields (``_journal_lines``, ``kmsg_export``).
    """
    g = m.groupdict()
    return (g["sys"] is not None or g["bare"] is not None or g["unix"] is not None or g["full"] is not None
            or g["mkern"] is not None or (g["iso"] is not None and g["ihost"] is not None))


def text_log_line(line: str) -> bool:
    """Whether *line* is a syslog or journal *text* line (any tag): its sender is only what it says."""
    if _TEXT_HEAD.match(line):
        return True                    # the writer's own stamp, whatever the tag (text_log_head)
    m = _ENVELOPE.match(line)
    return m is not None and m.end() > 0 and _tag_only(m)


JSON_UNPROVEN = ("a JSON line that is no journal record naming its sender (no _TRANSPORT field: a container "
                 "log's {\"log\": ...}, --output-fields, a line too long or broken)")


def journal_json(line: str) -> dict[str, Any] | None:
    """*line* as a JSON object, or None (too long, not JSON, nested too deep, no object)."""
    if len(line) > MAX_JSON_LINE:
        return None
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return rec if isinstance(rec, dict) else None


def _journal_lines(line: str) -> list[KernelLine] | None:
    """A ``journalctl -o json`` line: only what journald itself saw come from the kernel.

    None when the line is no journal record that names its sender (not JSON,
    too long, no ``_TRANSPORT``): nothing proves who wrote it (``JSON_UNPROVEN``).
    """
    rec = journal_json(line)
    if rec is None or "_TRANSPORT" not in rec:
        return None
    return _journal_record(rec)


# journalctl -o json-pretty: an entry is "{", then one field per line indented
# by a tab (by 8 spaces before systemd 246), then "}".  A value is JSON-escaped
# (a newline in it is "\n"), so a line of an entry is never a program's text.
_PRETTY_MESSAGE = re.compile(rb'[ \t]{1,8}"MESSAGE" : "')


def _pretty_lines(buf: bytes | bytearray, ls: int, s: int, e: int, start: int, end: int,
                  base: int) -> list[KernelLine]:
    """The kernel lines of the json-pretty entry whose MESSAGE line starts at *ls*.

    The entry is the object from the "{" line before it to the "}" line after
    it; a MESSAGE line that is in no such object (a copy cut short, the
    entry split by the read) proves nothing: a warning, never silence.
    """
    lo = max(start, ls - MAX_JSON_LINE)
    at = buf.rfind(b"\n{\n", lo, ls)
    head = at + 1 if at >= 0 else start if buf[start:start + 2] == b"{\n" and start >= lo else -1
    hi = min(end, ls + MAX_JSON_LINE)
    tail = buf.find(b"\n}\n", ls, hi)
    if tail < 0 and hi == end and buf[end - 2:end] == b"\n}":
        tail = end - 2                       # the last line, without its newline
    if head < 0 or tail < 0 or buf.find(b"\n}\n", head, ls) >= 0:
        return _doubt(buf, s, e, ls + base)
    try:
        rec = json.loads(bytes(buf[head:tail + 2]).decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return _doubt(buf, s, e, ls + base)
    if not isinstance(rec, dict) or "_TRANSPORT" not in rec:
        return _doubt(buf, s, e, ls + base, JSON_UNPROVEN)
    return _journal_record(rec)


def _journal_record(rec: object) -> list[KernelLine]:
    """A journal entry's kernel lines, when journald itself saw it come from the kernel."""
    if not isinstance(rec, dict) or rec.get("_TRANSPORT") != "kernel" or rec.get("SYSLOG_FACILITY", "0") != "0":
        return []
    msg = rec.get("MESSAGE")
    if isinstance(msg, list) and msg and all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b < 256
                                             for b in msg):
        # journalctl -o json prints a message that is not printable UTF-8 (a
        # control byte in a process name an Xid names) as its bytes
        msg = bytes(msg).decode("utf-8", "replace")
    if not isinstance(msg, str):
        return []
    when = rec.get("_SOURCE_MONOTONIC_TIMESTAMP") or rec.get("__REALTIME_TIMESTAMP")
    when = str(when) if isinstance(when, (str, int)) and not isinstance(when, bool) else None
    return _message_lines(msg, when)


def _message_lines(msg: str, when: str | None, sep: str = "\n", at: int = -1) -> list[KernelLine]:
    """One record's message, split into its first line and its continuations (*at*: the record's offset)."""
    out: list[KernelLine] = []
    for i, part in enumerate(msg.split(sep)):
        part = part.rstrip("\r")
        if i:
            if _DRIVER.match(part.lstrip()):
                out.append(KernelLine(when, part.strip(), cont=True, at=at))
            continue
        dev = _AER_DEV.match(part)
        if _DRIVER.match(part):
            out.append(KernelLine(when, part, at=at))
        elif dev and part[dev.end():].startswith("AER: Uncorrected"):
            out.append(KernelLine(when, f"{dev.group('dev')}: {part[dev.end():]}", at=at))
    return out


def _find(buf: bytes | bytearray, lit: bytes, pos: int, end: int, window: int) -> int:
    """``buf.find(lit, pos, end)``, searched in windows of *window* bytes that overlap by ``len(lit) - 1``."""
    step = window - len(lit) + 1
    while True:
        stop = min(end, pos + window)
        found = buf.find(lit, pos, stop)
        if found >= 0 or stop >= end:
            return found
        pos += step


def _line_start(buf: bytes | bytearray, start: int) -> int:
    return buf.rfind(b"\n", 0, start) + 1


TEXT_LOG = ("a kernel reader's line inside a syslog/journal text log (the file's first line is one): "
            "a newline in someone's message may have made it")


# The writer's own part of a syslog/journal text line, at the line's start,
# whatever follows it (a tag may be any length and hold spaces): a classic
# syslog stamp ("Nov 29 00:00:01", any locale), RFC 3339 with a "." fraction
# or none (rsyslog, syslog-ng, journalctl short-iso; dmesg --time-format iso
# prints ",usec": tests/data/xid/real/util_linux_dmesg_envelopes.txt),
# journalctl short-unix and short-full.
_TEXT_HEAD = re.compile(
    _WORD + r" [ \d]\d \d\d:\d\d:\d\d(?:\.\d{1,9})?\s\S"
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:?\d\d)\s\S"
    r"|\d{9,11}\.\d{6}\s\S"
    r"|" + _WORD + r" \d{4}-\d\d-\d\d \d\d:\d\d:\d\d [^\s\[\]:]{1,12}\s\S")


def head_line(head: bytes | bytearray) -> str | None:
    """A log file's first line (*head*: its first bytes), past blanks and journalctl's "-- " headers."""
    for raw in bytes(head[:4096]).split(b"\n")[:16]:
        line = raw.decode("utf-8", "replace").rstrip("\r")
        if not line.strip() or line.startswith("-- "):
            continue                   # blank, or journalctl's "-- Logs begin at ..." header
        return line
    return None


def text_log_head(head: bytes | bytearray) -> bool:
    """Whether a log file whose first bytes are *head* is a syslog or journal *text* log.

    Its writer sets the file's format, and a user cannot write a file's first
    line: every message they send gets the writer's envelope.  In such a file
    no line is the kernel's proof: its kernel lines are tag-only claims
    (``TAG_ONLY``), and a line in a kernel reader's format (a dmesg stamp, a
    facility) can only be a message's raw newline (a writer that keeps them:
    syslog-ng without ``no-multi-line``, a collector's file output).  Decided
    from the writer's own part (``_TEXT_HEAD``), never from the tag a sender
    chose: a tag too long or with a space in it must not make it a kernel log.
    """
    return head_family(head) == "text"


def line_family(line: str) -> str | None:
    """The log format family of *line*: "text" (syslog/journal text), "kernel" (a kernel
    reader's: dmesg stamps, kmsg records, ``-r``, ``-x``, Talos), "json", "pretty"
    (journalctl json-pretty), "verbose" (an entry's header in ``journalctl -o verbose``),
    "none" (no envelope); None for an indented line."""
    if _VERBOSE_HEAD.match(line):
        return "verbose"
    if line.startswith("{"):
        return "pretty" if line.rstrip() == "{" else "json"
    if _TEXT_HEAD.match(line):
        return "text"                  # the writer's own part: whatever tag follows
    m = _ENVELOPE.match(line)
    if m is None or m.end() == 0:
        return "none"
    if m.group("cont") is not None:
        return None
    return "text" if _tag_only(m) else "kernel"


def head_family(head: bytes | bytearray) -> str | None:
    """The family (``line_family``) of a log file whose first bytes are *head*; None when empty.

    A user's message cannot be a file's first line in the writer's format, so
    the first line says what every line of the file is: one of another family
    is a newline in someone's message, or proves nothing (``FAMILY``).
    """
    line = head_line(head)
    fam = None if line is None else line_family(line)
    if line is not None and fam in (None, "none"):
        # A verbose file cut mid-entry (copytruncate, or a follower's block
        # cut mid-line) starts with a field line, a value's later line or the
        # tail of one: its first entry header says what the file is.
        header = _cut_verbose_header(head, line)
        if header is not None:
            # Read as verbose, but nothing in it is proven: a cut dmesg
            # --notime file whose first lines are a client's echoed text
            # (column 0, the user's words) could show a header of theirs.
            return "verbose-cut"
    if fam == "verbose" and line is not None:
        # The first field line says which journalctl wrote the file: an old one
        # (a tab before each field, values printed raw) lets a newline in any
        # value write a header and 4-space field lines, so nothing in such a
        # file is proven, whatever form a later entry seems to have.
        raw = bytes(head[:4096])
        at = raw.find(b"\n", raw.find(line.encode("utf-8", "replace")[:64]))
        if raw[at + 1:at + 2] == b"\t":
            fam = "verbose-tab"
    return fam


def _cut_verbose_header(head: bytes | bytearray, first: str) -> str | None:
    """The first entry header of a verbose file whose first line *first* is no header; else None.

    The lines between are the cut entry's: indented (a field, a value's later
    line), or the first line itself cut mid-line.  Stamped dmesg indents a
    record's later lines too, but its next column-0 line is a dmesg line,
    never a verbose header; a bare first line counts only when an indented
    line follows it.
    """
    lines = bytes(head[:4096]).decode("utf-8", "replace").split("\n")[:-1]    # whole lines only
    seen = False
    for raw in lines:
        text = raw.rstrip("\r")
        if not seen:
            seen = text == first
            indented = first[:1] in (" ", "\t")
            continue
        if not text.strip():
            continue
        if text[:1] in (" ", "\t"):
            indented = True
            continue
        return text if indented and _VERBOSE_HEAD.match(text) else None
    return None


FAMILY = ("a line in another log format ({got}) than the file's (its first line is {want}): "
          "a newline in someone's message may have made it")


def scan_buffer(buf: bytes | bytearray, start: int = 0, end: int | None = None, base: int = 0,
                before: bytes = b"", text_log: bool | None = None, family: str | None = None) -> list[KernelLine]:
    """Kernel-written lines of interest in ``buf[start:end]``, in log order.

    Also the driver lines whose origin cannot be proven (``doubt`` set);
    ``base`` is the file offset of ``buf[0]`` (their ``at``); *before* is the
    line before ``buf[start]`` (a cursor or a chunk may split a record).
    *family*: the file's format family (``head_family``); None: decided from
    ``buf`` when it starts at the file's start (``base`` 0); "any": none
    fixed (lines of several formats, each judged alone).  *text_log* True is
    family "text" (``text_log_head``).
    """
    if end is None:
        end = len(buf)
    if text_log:
        family = "text"
    if family is None and base == 0 and text_log is None:
        family = head_family(buf[:4096])
    hits = find_hits(buf, start, end)
    if family in _BYTE_MESSAGES:
        hits = sorted(hits + _byte_message_hits(buf, start, end, family))
    out = _decide(buf, start, end, base, hits, [], before, family)
    blobs = [i for i, ln in enumerate(out) if ln.doubt is not None and ln.doubt.startswith(_BLOB_WHY)]
    if len(blobs) > 1:
        # one warning per read, not one per entry
        first = out[blobs[0]]
        more = f" (and {len(blobs) - 1} more such entries)"
        out[blobs[0]] = KernelLine(None, "", doubt=first.doubt + more if first.doubt else more, at=first.at)
        drop = set(blobs[1:])
        out = [ln for i, ln in enumerate(out) if i not in drop]
    if family == "text":
        out = [ln if ln.doubt else KernelLine(ln.when, ln.text, ln.cont, TEXT_LOG, ln.at) for ln in out]
    return out


# journalctl prints a value that is not printable UTF-8 (a control byte in a
# process name an Xid names) as an array of its bytes (-o json) or, without
# --all, as "[142B blob data]" (-o verbose, format_bytes' size): such a
# MESSAGE has no "NVRM: " to find, so the scan looks for the field itself.
_BYTE_MESSAGES = {"json": (b'"MESSAGE":[', b'"MESSAGE" : ['), "verbose": (b"\n    MESSAGE=[",)}
_BLOB = re.compile(rb"MESSAGE=\[[0-9.]{1,12}[BKMGTPE]? blob data\]")
_BLOB_WHY = "a kernel entry's MESSAGE that journalctl -o verbose printed as"


def _byte_message_hits(buf: bytes | bytearray, start: int, end: int, family: str) -> list[tuple[int, int, int]]:
    """``find_hits``' tuples for the MESSAGE fields printed as bytes (``_BYTE_MESSAGES``) in *family*."""
    hits: list[tuple[int, int, int]] = []
    for lit in _BYTE_MESSAGES[family]:
        pos = max(start - 1, 0) if lit.startswith(b"\n") else start
        while (at := _find(buf, lit, pos, end, _WINDOW)) >= 0:
            pos = at + len(lit)
            if lit.startswith(b"\n"):
                m = _BLOB.match(buf, at + 5, end)
                if m is not None:
                    hits.append((at + 1, at + 5, m.end()))
            else:
                hits.append((_line_start(buf, at), at, at + len(lit)))
    return hits


def find_hits(buf: bytes | bytearray, start: int, end: int, window: int = _WINDOW) -> list[tuple[int, int, int]]:
    """(line start, match start, match end) of every driver prefix in ``buf[start:end]``, in order.

    Each prefix is looked for in windows of *window* bytes (the size where
    ``bytes.find`` is fastest); what is found does not depend on it.
    """
    hits: list[tuple[int, int, int]] = []
    for lit, pat in _PATTERNS:
        # What ``pat.finditer(buf, start, end)`` finds: a match can only
        # start at the literal, so the regex searches from there.  Where the
        # literal is not the pattern's start ("nvidia-nvswitchX"), the regex
        # scans on itself: a log full of those costs what a regex pass costs,
        # not a Python step per copy.
        pos = start
        while (at := _find(buf, lit, pos, end, window)) >= 0:
            m = pat.search(buf, at, end)
            if m is None:
                break
            hits.append((_line_start(buf, m.start()), m.start(), m.end()))
            pos = m.end()
    hits.sort()
    return hits


def _decide(buf: bytes | bytearray, start: int, end: int, base: int, hits: list[tuple[int, int, int]],
            out: list[KernelLine], before: bytes = b"", family: str | None = None) -> list[KernelLine]:
    done_line = -1
    kept_end = -1                  # where the last kept line ends: a continuation must start there
    entries: dict[int, _Entry] = {}     # journalctl -o verbose: each entry parsed once
    column0: list[int] | None = None    # its line starts at column 0, collected at the first hit
    for ls, s, e in hits:
        if ls == done_line:
            continue               # one decision per line: a second hit in it is its own text
        done_line = ls
        if _CRI.match(buf, ls):
            # kubelet's container log: whatever follows is a container's output
            # (a dmesg run inside it included), never the kernel's word.
            out += _doubt(buf, s, e, ls + base, CONTAINER)
            continue
        if family in ("verbose", "verbose-cut"):
            if column0 is None:
                column0 = _column0_starts(buf, start, end)
            got = _verbose_lines(buf, ls, s, e, end, base, entries, column0)
            if family == "verbose-cut":
                # The kernel's entries of a file cut mid-entry warn, never drain.
                got = [k if k.doubt else replace(k, when=None, doubt=VERBOSE_CUT) for k in got]
            out += got
            continue
        if family == "verbose-tab":
            out += _doubt(buf, s, e, ls + base, VERBOSE_TAB)
            continue
        le = buf.find(b"\n", e, end)
        le = end if le < 0 else le + 1
        if buf[ls:ls + 1] == b"{":
            jl = _journal_lines(bytes(buf[ls:le]).decode("utf-8", "replace"))
            got = _doubt(buf, s, e, ls + base, JSON_UNPROVEN) if jl is None else jl
            fam: str | None = "json"
        elif family in (None, "none", "any") and (vm := _VERBOSE_MESSAGE.match(buf, ls)) is not None \
                and vm.end() == s:
            # A verbose entry's MESSAGE line in a file whose first line proved
            # no format: perhaps the kernel's, never proven (not silence).
            got, fam = _doubt(buf, s, e, ls + base, VERBOSE_ORPHAN), None
        elif (pm := _PRETTY_MESSAGE.match(buf, ls)) is not None and pm.end() == s:
            got = _pretty_lines(buf, ls, s, e, start, end, base)
            fam = "pretty"
        else:
            got = _scan_line(buf, ls, s, e, start, kept_end, base)
            fam = line_family(bytes(buf[ls:s][:400]).decode("utf-8", "replace"))
        if (got and got[0].doubt is None and family not in (None, "text", "any") and fam is not None
                and fam != family):
            # The file's first line fixed its format: a line of another is a
            # user's newline (dmesg --notime keeps them at column 0) or
            # proves nothing.  Continuations (fam None) follow their record.
            got = _doubt(buf, s, e, ls + base, FAMILY.format(got=fam, want=family))
        if got and got[0].doubt is None and ls != kept_end and _after_same_stamp(buf, ls, s, start, before):
            # Read from /proc/kmsg (imklog, klogd, dmesg -S), every line of a
            # multi-line record carries that record's stamp: a driver line with
            # the stamp of a foreign line just before it may be that record's
            # text (a user's newline).  Not proven either way: a warning.
            got = _doubt(buf, s, e, ls + base, SAME_RECORD)
        if got:
            out += got
            if got[0].doubt is None:
                kept_end = le
    return out


# ---------------------------------------------------------- journalctl -o verbose

# systemd's output_verbose (src/shared/logs-show.c): an entry is a header at
# column 0, "<time> [<cursor>]", then one field per line, "    NAME=value";
# a value's later lines are indented by 4 + len(NAME) + 1 (print_multiline),
# so no newline in a value starts a line at column 0 or 4 spaces in, and a
# field name is journald's (a user cannot send one that starts with "_").
# The time is format_timestamp's ("%a %Y-%m-%d %H:%M:%S[.%06u] %Z", weekday in
# any locale) or "(no timestamp)".
_VERBOSE_HEAD = re.compile(r"(?:" + _WORD + r" \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{6})?(?: [^\s\[\]]{1,64})?"
                           r"|\(no timestamp\)) \[s=[0-9a-f]{32};i=[0-9a-f]{1,16};b=[0-9a-f]{32};m=[0-9a-f]{1,16};"
                           r"t=(?P<t>[0-9a-f]{1,16});x=[0-9a-f]{1,16}\]\r?$")
_VERBOSE_FIELD = re.compile(r"(?P<ind>    |\t)(?P<name>[A-Za-z_][A-Za-z0-9_]{0,63})=")
_COLUMN0 = re.compile(rb"\n(?=[^ \t\r\n])")
# CRI container logs (kubelet, /var/log/pods): "<RFC3339Nano> stdout|stderr F|P <msg>".
_CRI = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d) (?:stdout|stderr) [FP] ")

CONTAINER = ("a container's output in a CRI container log (\"<time> stdout|stderr F|P <msg>\", what kubelet "
             "writes under /var/log/pods): a dmesg run in a container, or any program's text")
VERBOSE_UNPROVEN = ("a journalctl -o verbose entry without its _TRANSPORT field, or _TRANSPORT=kernel without "
                    "SYSLOG_FACILITY (--output-fields, or cut short): nothing proves the kernel sent it")
VERBOSE_TAB = ("journalctl -o verbose output in its old form (fields indented by a tab, values printed raw): "
               "a newline in a value may have made any field line")
VERBOSE_NO_ENTRY = "a line that is no field of a journalctl -o verbose entry"
VERBOSE_CUT = ("a journalctl -o verbose entry in a file that starts mid-entry (copytruncate, a follower's cut): "
               "its first line proves no writer, so no entry in it is proven the kernel's")
VERBOSE_ORPHAN = ("a journalctl -o verbose MESSAGE field in a file whose format is not proven (no entry header "
                  "in its first 4 KiB: a copy cut mid-entry); read the journal whole or use -o export")
_VERBOSE_MESSAGE = re.compile(rb"(?:    |\t)MESSAGE=")


@dataclass
class _Entry:
    """One parsed ``journalctl -o verbose`` entry."""

    why: str | None                          # why nothing in it is proven (a doubt), else None
    rec: dict[str, object]
    message: tuple[int, int] = (-1, -1)      # where its MESSAGE field's lines are (buffer offsets)
    emitted: bool = False


def _verbose_lines(buf: bytes | bytearray, ls: int, s: int, e: int, end: int, base: int,
                   entries: dict[int, _Entry], column0: list[int]) -> list[KernelLine]:
    """The kernel lines of the verbose entry that holds the hit at ``buf[s:e]`` (line at *ls*).

    *entries*: the entries parsed so far, by header offset; *column0*: ``_column0_starts``.
    """
    hs = _verbose_entry_start(ls, column0)
    if hs < 0:
        return _doubt(buf, s, e, ls + base, VERBOSE_NO_ENTRY)
    ent = entries.get(hs)
    if ent is None:
        ent = entries[hs] = _parse_verbose(buf, hs, end)
    if ent.why in (VERBOSE_NO_ENTRY, VERBOSE_TAB):
        return _doubt(buf, s, e, ls + base, ent.why)     # its field lines themselves are not proven
    m0, m1 = ent.message
    if not m0 <= ls < m1:
        return []                                # another field's value: no log line
    if buf.startswith(b"MESSAGE=[", s):
        # "[N blob data]": a message journalctl did not print (not printable)
        if ent.rec.get("_TRANSPORT") != "kernel" or ent.rec.get("SYSLOG_FACILITY", "0") != "0":
            return []
        blob = bytes(buf[s + 8:e]).decode("utf-8", "replace")
        return [KernelLine(None, "", doubt=f"{_BLOB_WHY} {blob} (byte {ls + base} of the kernel log): its text "
                           "(an Xid, perhaps) cannot be read; write the file with journalctl -o verbose --all",
                           at=ls + base)]
    if ent.why is not None:
        return _doubt(buf, s, e, ls + base, ent.why)
    if ent.emitted:
        return []                                # the record's lines were given at its first hit
    ent.emitted = True
    got = _journal_record(ent.rec)
    return [KernelLine(ln.when, ln.text, ln.cont, ln.doubt, m0 + base, ln.indents) for ln in got]


def _column0_starts(buf: bytes | bytearray, start: int, end: int) -> list[int]:
    """The start of every line in ``buf[start:end]`` that is at column 0 (a verbose entry's header, or no field).

    Collected once per scan, so finding each hit's entry is a bisection: a
    user's message of thousands of "NVRM: " lines (each a later line of one
    value, indented) costs linear work, not a walk back per hit.
    """
    first = [start] if buf[start:start + 1] not in (b" ", b"\t", b"\r", b"\n", b"") else []
    return first + [m.start() + 1 for m in _COLUMN0.finditer(buf, start, end)]


def _verbose_entry_start(ls: int, column0: list[int]) -> int:
    """Where the verbose entry holding the line at *ls* starts (its header line); -1: none.

    *column0*: ``_column0_starts`` of what is scanned.  The hit's own line at
    column 0 is no field of an entry (-1).
    """
    i = bisect.bisect_right(column0, ls) - 1
    if i < 0 or column0[i] == ls:
        return -1
    return column0[i]


def _parse_verbose(buf: bytes | bytearray, hs: int, end: int) -> _Entry:
    """Parse the verbose entry whose header line starts at *hs* (up to the next column-0 line)."""
    m = _COLUMN0.search(buf, hs, min(end, hs + 2 * MAX_JSON_LINE))
    he = m.start() + 1 if m else end
    if m is None and end > hs + 2 * MAX_JSON_LINE:
        return _Entry(VERBOSE_UNPROVEN, {})      # an entry too long to read: not proven
    lines = bytes(buf[hs:he]).decode("utf-8", "replace").split("\n")
    head = _VERBOSE_HEAD.match(lines[0])
    if head is None:
        return _Entry(VERBOSE_NO_ENTRY, {})
    fields: dict[str, list[str]] = {}
    name, indent, tab = "", 0, False
    msg_at, msg_end = -1, -1
    pos = hs + len(lines[0].encode()) + 1
    for line in lines[1:]:
        size = len(line.encode()) + 1
        f = _VERBOSE_FIELD.match(line)
        if f is not None:
            tab = tab or f.group("ind") == "\t"
            name = f.group("name")
            indent = 4 + len(name) + 1
            fields.setdefault(name, []).append(line[f.end():].rstrip("\r"))
            if name == "MESSAGE":
                msg_at, msg_end = pos, pos + size
        elif name and line.startswith(" " * indent) and line.strip():
            fields[name][-1] += "\n" + line[indent:].rstrip("\r")     # a value's later line
            if name == "MESSAGE":
                msg_end = pos + size
        elif line.strip():
            return _Entry(VERBOSE_NO_ENTRY, {})  # not journalctl's: nothing in the entry is proven
        pos += size
    rec: dict[str, object] = {k: v[0] if len(v) == 1 else v for k, v in fields.items()}
    rec.setdefault("__REALTIME_TIMESTAMP", str(int(head.group("t"), 16)))
    why = None
    if tab:
        why = VERBOSE_TAB
    elif "_TRANSPORT" not in rec or (rec["_TRANSPORT"] == "kernel" and "SYSLOG_FACILITY" not in rec):
        # journald omits SYSLOG_FACILITY for facility 0 from userspace
        # (`logger -p kern.err`): any other _TRANSPORT names a sender that
        # is not the kernel, with or without it (silent, as in JSON).
        why = VERBOSE_UNPROVEN
    return _Entry(why, rec, (msg_at, min(msg_end, he)))


def verbose_cut(buf: bytes | bytearray, cut: int, last: bool) -> int:
    """Where a read of a verbose file should stop in ``buf[:cut]`` (whole lines; 0: read more).

    An entry ends where the next one's header starts, so a chunk stops before
    its last entry's header (read whole by the next chunk).  At the end of the
    file (*last*) the last entry is read once it has its ``_TRANSPORT``,
    ``SYSLOG_FACILITY`` and ``MESSAGE`` lines; before that journalctl is
    still writing it, and the next run reads it whole.
    """
    lo = max(0, cut - 2 * MAX_JSON_LINE)
    p = buf.rfind(b"\n", lo, cut - 1)
    while p >= lo:
        if buf[p + 1:p + 2] not in (b" ", b"\t", b"\r", b"\n"):
            break
        p = buf.rfind(b"\n", lo, p)
    hs = p + 1 if p >= lo else (0 if lo == 0 and buf[:1] not in (b" ", b"\t") else -1)
    if hs < 0 or (hs == 0 and cut >= 2 * MAX_JSON_LINE):
        return cut                                # an entry too long to prove anything: judged as it is
    if not last:
        return hs
    entry = bytes(buf[hs:cut])
    if all(b"\n    " + f + b"=" in entry or b"\n\t" + f + b"=" in entry
           for f in (b"_TRANSPORT", b"SYSLOG_FACILITY", b"MESSAGE")):
        return cut
    return hs


def resume_after_long_line(block: bytes, family: str) -> int:
    """Where a read resumes in *block*, which follows a verbose or json-pretty line too long for the kernel's.

    No kernel entry has a line of ``2 * MAX_JSON_LINE`` bytes: it is a
    program's value.  json-pretty resumes at the next line (a ``MESSAGE``
    line of the cut entry then warns); verbose at the next column-0 line, the
    next entry's header (the long entry is no kernel entry: silent, as
    ``_parse_verbose`` treats one too long to read).  -1: not in *block*
    (the last byte of a verbose block is looked at again in the next).
    """
    if family == "pretty":
        k = block.find(b"\n")
        return k + 1 if k >= 0 else -1
    m = _COLUMN0.search(block)
    return m.start() + 1 if m else -1


def _kernel_stamp(prefix: str) -> str | None:
    """The kernel's own monotonic time in a kernel-written line's envelope, else None."""
    m = _ENVELOPE.match(prefix)
    if m is None or not _trusted(m)[0]:
        return None
    return next((m.group(g) for g in _KSTAMPS if m.group(g) is not None), None)


def _kept_driver_line(line: str) -> bool:
    """Whether *line* is a kernel line whose message is a driver's (or an AER report)."""
    m = _ENVELOPE.match(line)
    if m is None or not _trusted(m)[0]:
        return False
    rest = line[m.end():]
    dev = _AER_DEV.match(rest)
    return bool(_DRIVER.match(rest)) or (dev is not None and rest[dev.end():].startswith("AER: Uncorrected"))


_ECHO = "NVRM: API mismatch:"       # the driver message that echoes a client's string (health/xid.py)


def line_before(tail: bytes, whole: bool) -> bytes:
    """The line before a read's start, for the same-stamp check (``scan_buffer``'s *before*).

    *tail* ends with that line's newline (*whole*: it starts at the top of
    the file).  Empty when that line is a kept driver line: the lines with its
    kernel time back to one with another are all driver lines, as when the
    earlier run kept them, and none of them is the driver's "API mismatch"
    message (whose record may go on after the boundary with the client's text).
    """
    if not tail.endswith(b"\n"):
        return b""
    lines = tail[:-1].split(b"\n")
    prev = lines[-1][:400]
    stamp = _kernel_stamp(prev.decode("utf-8", "replace"))
    if stamp is None:
        return prev
    for raw in reversed(lines if whole else lines[1:]):    # the first may be cut: not a line
        text = raw[:400].decode("utf-8", "replace")
        if _kernel_stamp(text) != stamp:
            return b""
        if not _kept_driver_line(text) or _ECHO in text:
            # An "API mismatch" record echoes a client's text: a line with
            # its stamp after the run boundary may be that text (the earlier
            # run's echo window does not reach this one).
            return prev
    return b"" if whole else prev                      # the group reaches past what was read: not proven


def _after_same_stamp(buf: bytes | bytearray, ls: int, s: int, start: int, before: bytes = b"") -> bool:
    """Whether the line at *ls* (its driver text at *s*) has the kernel time of the kernel line before it
    (*before*: the line before ``buf[start]``)."""
    if ls <= start and not before:
        return False
    stamp = _kernel_stamp(bytes(buf[ls:s][:400]).decode("utf-8", "replace"))
    if stamp is None:
        return False
    if ls <= start:
        prev = before                 # a driver line there was read by an earlier run: not kept in this one
    else:
        ps = max(buf.rfind(b"\n", start, ls - 1) + 1, start)
        prev = bytes(buf[ps:ls - 1])
    return _kernel_stamp(prev[:400].decode("utf-8", "replace")) == stamp


def _scan_line(buf: bytes | bytearray, ls: int, s: int, e: int, start: int, kept_end: int,
               base: int = 0) -> list[KernelLine]:
    """The kernel lines of one text line whose hit is at ``buf[s:e]`` (empty: not the kernel's)."""
    prefix = bytes(buf[ls:s]).decode("utf-8", "replace")
    if len(prefix) > 400:
        return _doubt(buf, s, e, ls + base)
    env = _ENVELOPE.match(prefix)
    if env is None:
        return []
    ok, when, cont = _trusted(env)
    if not ok:
        return []
    if _tag_only(env):
        # The kernel's words, perhaps, but not the kernel's proof: reported, never acted on.
        return _doubt(buf, s, e, ls + base, TAG_ONLY)
    if cont and ls != kept_end:
        return []                  # a continuation of nothing we kept (another program's message)
    if env.end() == 0 and ls > start and _has_envelope(buf, ls, start):
        return []                  # a bare line inside a stamped log: a newline in someone's message
    rest = prefix[env.end():]
    text = bytes(buf[s:e]).decode("utf-8", "replace").rstrip("\r")
    if text.startswith("AER:"):
        # keep the reporting device: "pcieport 0000:00:02.0: AER: ..."
        dev = _AER_DEV.fullmatch(rest)
        return [] if cont or dev is None else [KernelLine(when, f"{dev.group('dev')}: {text}")]
    if rest:
        if env.end() == 0:
            # No envelope we know: neither proven the kernel's nor proven
            # someone else's (a format of its own, a collector's prefix).
            return _doubt(buf, s, e, ls + base)
        return []                  # text before the driver's prefix: not the driver's message
    if env.group("kpri") is not None:
        return _message_lines(text, when, sep="\\x0a", at=ls + base)
    return [KernelLine(when, text, cont, at=ls + base,
                       indents=env.group("rel") is not None or env.group("xfac") is not None)]


def _doubt(buf: bytes | bytearray, s: int, e: int, at: int, why: str = UNKNOWN_FORMAT) -> list[KernelLine]:
    text = bytes(buf[s:e]).decode("utf-8", "replace").rstrip("\r")
    return [] if text.startswith("AER:") else [KernelLine(None, text, doubt=why, at=at)]


def _has_envelope(buf: bytes | bytearray, ls: int, start: int) -> bool:
    """Whether the line before the one at *ls* carries a log envelope (timestamp, host, tag)."""
    ps = buf.rfind(b"\n", start, ls - 1) + 1
    prev = bytes(buf[max(ps, start):ls - 1][:400]).decode("utf-8", "replace")
    m = _ENVELOPE.match(prev)
    return m is not None and m.end() > 0 and m.group("cont") is None and m.group("bare") is None


# --------------------------------------------------------------------- files
