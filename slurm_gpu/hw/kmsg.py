"""Kernel log source for the health check: the GPU driver's lines, each once.

Two sources, one result (a list of :class:`KernelLine`):

* ``/dev/kmsg``: the kernel's record interface.  Every record carries a
  sequence number; the cursor remembers the last one seen (and the boot it
  belongs to), so an event is counted by exactly one health-check run.
* a file (``--kernel-log FILE`` or ``[health] kernel_log``): ``dmesg`` output
  with monotonic ``[  12.345]``, ``--ctime`` ``[Fri Aug 30 11:43:09 2024]`` or
  ISO timestamps, syslog/journal lines (``... kernel: NVRM: ...``) or raw
  kmsg records (``6,1234,5678,-;NVRM: ...``).  The cursor is the byte offset
  plus the file's inode, so rotation or truncation restarts at the top.

Only lines the checks can use are kept (``NVRM:`` driver messages and PCIe
AER reports); the search is a literal-prefix regex over 8 MB chunks, so a 100 MB
log is scanned in well under a second.
"""
from __future__ import annotations

import errno
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

DEV_KMSG = "/dev/kmsg"
CHUNK = 8 << 20
BOOT_ID = "/proc/sys/kernel/random/boot_id"

# Each pattern starts with a literal, which lets ``re`` skip through the
# buffer with a fast substring search instead of trying every position.
_PATTERNS = (re.compile(rb"NVRM: [^\n]*"), re.compile(rb"AER: Uncorrected[^\n]*"))
# Leading timestamp forms: [  123.456789] | [Fri Aug 30 11:43:09 2024] | ISO | syslog month
_TS = re.compile(
    r"^\s*(?:\[\s*(?P<mono>\d+\.\d+)\]|\[(?P<ctime>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d [\d:]{8} \d{4})\]"
    r"|(?P<iso>\d{4}-\d\d-\d\dT[\d:]{8}[,.\d]*(?:[+-]\d\d:?\d\d|Z)?)"
    r"|(?P<sys>[A-Z][a-z]{2} [ \d]\d [\d:]{8})"
    r"|(?P<raw>\d+,(?P<seq>\d+),(?P<usec>\d+),[^;]*;))")


@dataclass(frozen=True)
class KernelLine:
    """One kernel message of interest: its timestamp as logged, and its text."""

    when: str | None
    text: str          # from the subsystem tag on: "NVRM: Xid (PCI:...): 79, ..." or "pcieport ...: AER: ..."


def _line_bounds(buf: bytes, start: int, end: int) -> tuple[int, int]:
    ls = buf.rfind(b"\n", 0, start) + 1
    return ls, end


def _timestamp(prefix: str) -> str | None:
    m = _TS.match(prefix)
    if not m:
        return None
    if m.group("mono"):
        return m.group("mono")
    if m.group("raw"):
        return f"{int(m.group('usec')) / 1e6:.6f}"
    return m.group("ctime") or m.group("iso") or m.group("sys")


def scan_buffer(buf: bytes, start: int = 0, end: int | None = None) -> list[KernelLine]:
    """Kernel lines of interest in ``buf[start:end]``, in log order."""
    if end is None:
        end = len(buf)
    hits: list[tuple[int, int, int]] = []
    for pat in _PATTERNS:
        for m in pat.finditer(buf, start, end):
            hits.append((m.start(), m.end(), _line_bounds(buf, m.start(), m.end())[0]))
    hits.sort()
    out: list[KernelLine] = []
    for s, e, ls in hits:
        prefix = bytes(buf[max(ls, s - 200):s]).decode("utf-8", "replace")
        text = bytes(buf[s:e]).decode("utf-8", "replace").rstrip("\r")
        if text.startswith("AER:"):
            # keep the reporting device: "pcieport 0000:00:02.0: AER: ..."
            dev = prefix.rstrip().rstrip(":").split(" ")[-1] if prefix.strip() else ""
            text = f"{dev}: {text}" if dev else text
        out.append(KernelLine(_timestamp(prefix), text.replace("\\x0a", " ")))
    return out


# --------------------------------------------------------------------- files

@dataclass
class FileCursor:
    path: str
    inode: int = 0
    offset: int = 0
    mark: str = ""     # hex of the last bytes before offset: proves the file was not truncated and refilled


MARK_BYTES = 32


def _mark(fd: int, offset: int) -> str:
    n = min(MARK_BYTES, offset)
    return os.pread(fd, n, offset - n).hex() if n else ""


def _same_file(fd: int, cursor: FileCursor) -> bool:
    """The bytes before the cursor are still the ones we read (copytruncate keeps the inode)."""
    if not cursor.mark:
        return True          # a cursor from before marks existed
    try:
        want = bytes.fromhex(cursor.mark)
    except ValueError:
        return False
    return os.pread(fd, len(want), cursor.offset - len(want)) == want if len(want) <= cursor.offset else False


def read_file(path: str | os.PathLike[str], cursor: FileCursor | None = None) -> tuple[list[KernelLine], FileCursor]:
    """Scan a kernel log file from *cursor* (or the top) to its last full line.

    Returns the lines and the new cursor.  A changed inode, a file shorter
    than the cursor, or one whose bytes before the cursor changed (rotated,
    or truncated by ``copytruncate`` and written past the old offset again)
    is read from the top.
    """
    p = str(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError("kernel log not found", p) from None
    except OSError as e:
        raise InputError(f"cannot read kernel log: {e.strerror}", p) from None
    try:
        st = os.fstat(fd)
        start = 0
        if (cursor is not None and cursor.inode == st.st_ino and cursor.offset <= st.st_size
                and _same_file(fd, cursor)):
            start = cursor.offset
        if st.st_size == 0 or start >= st.st_size:
            return [], FileCursor(p, st.st_ino, start if st.st_size else 0, _mark(fd, start if st.st_size else 0))
        # Chunks keep memory flat however big the log is (a whole-file mmap
        # would show the file's size in RSS); only whole lines are scanned,
        # so a line being written now is read next time.
        out: list[KernelLine] = []
        pos, carry = start, b""
        while pos < st.st_size:
            chunk = os.pread(fd, min(CHUNK, st.st_size - pos), pos)
            if not chunk:
                break
            pos += len(chunk)
            buf = carry + chunk
            cut = buf.rfind(b"\n") + 1
            if cut:
                out += scan_buffer(buf, 0, cut)
            carry = buf[cut:]
        end = pos - len(carry)
        return out, FileCursor(p, st.st_ino, end, _mark(fd, end))
    finally:
        os.close(fd)


# ----------------------------------------------------------------- /dev/kmsg

@dataclass
class KmsgCursor:
    boot_id: str = ""
    seq: int = -1


def boot_id() -> str:
    """This boot's id (kmsg sequence numbers restart at every boot)."""
    try:
        return Path(BOOT_ID).read_text().strip()
    except OSError:
        return ""


def read_kmsg(cursor: KmsgCursor | None = None, device: str = DEV_KMSG) -> tuple[list[KernelLine], KmsgCursor]:
    """Read every record /dev/kmsg still holds after *cursor*, without blocking."""
    bid = boot_id()
    last = cursor.seq if cursor is not None and cursor.boot_id == bid else -1
    try:
        fd = os.open(device, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputError(f"cannot read kernel log: {e.strerror}", device) from None
    chunks: list[bytes] = []
    seq = last
    try:
        while True:
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # records overwritten while reading: go on
                    continue
                if e.errno == errno.EINVAL:
                    continue
                raise
            if not rec:
                break
            head, _, _ = rec.partition(b";")
            try:
                rseq = int(head.split(b",")[1])
            except (IndexError, ValueError):
                continue
            if rseq <= last:
                continue
            seq = max(seq, rseq)
            # Continuation lines (" KEY=value") carry device properties: drop them.
            chunks.append(rec.split(b"\n", 1)[0] + b"\n")
    finally:
        os.close(fd)
    buf = b"".join(chunks)
    return scan_buffer(buf), KmsgCursor(bid, seq)


# ------------------------------------------------------------------ cursors

def read_source(source: str, doc: dict) -> tuple[list[KernelLine], dict]:
    """Read *source* (``/dev/kmsg`` or a file) after the cursor in *doc*.

    Returns the lines and the advanced cursor document; the caller saves it
    (in the health state file) only once it has acted on the lines, so a run
    that dies half-way reads the same events again instead of losing them.
    An empty *doc* reads everything the source holds.
    """
    doc = json.loads(json.dumps(doc))  # never mutate the caller's copy
    if source == DEV_KMSG:
        c = doc.get("kmsg") or {}
        lines, cur = read_kmsg(KmsgCursor(c.get("boot_id", ""), int(c.get("seq", -1))))
        doc["kmsg"] = {"boot_id": cur.boot_id, "seq": cur.seq}
    else:
        files = doc.setdefault("files", {})
        c = files.get(source) or {}
        lines, fcur = read_file(source, FileCursor(source, int(c.get("inode", 0)), int(c.get("offset", 0)),
                                                   str(c.get("mark") or "")) if c else None)
        files[source] = {"inode": fcur.inode, "offset": fcur.offset, "mark": fcur.mark}
    return lines, doc


def read_events(path: str, doc: dict) -> tuple[list[dict], dict]:
    """New records of the ``xid-watch`` event file (JSON lines) after the cursor in *doc*."""
    doc = json.loads(json.dumps(doc))
    ev = doc.get("events") or {}
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return [], doc
    except OSError as e:
        raise InputError(f"cannot read event file: {e.strerror}", path) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        cur = FileCursor(path, int(ev.get("inode", 0)), int(ev.get("offset", 0)), str(ev.get("mark") or ""))
        same = cur.inode == st.st_ino and cur.offset <= st.st_size and _same_file(f.fileno(), cur)
        start = cur.offset if same else 0
        f.seek(start)
        data = f.read()
        end = data.rfind(b"\n") + 1
        mark = _mark(f.fileno(), start + end)
    out = []
    for raw in data[:end].splitlines():
        try:
            rec = json.loads(raw)
        except ValueError:
            continue  # a torn or foreign line must not stop the check
        if isinstance(rec, dict):
            out.append(rec)
    doc["events"] = {"inode": st.st_ino, "offset": start + end, "mark": mark}
    return out, doc
