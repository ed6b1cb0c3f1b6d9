"""Kernel log source for the health check: the GPU driver's lines, each once.

Two sources, one result (a list of :class:`KernelLine`):

* ``/dev/kmsg``: the kernel's record interface.  Every record carries a
  sequence number; the cursor remembers the last one seen (and the boot it
  belongs to), so an event is counted by exactly one health-check run.
* a file (``--kernel-log FILE`` or ``[health] kernel_log``): ``dmesg`` output
  with monotonic ``[  12.345]``, ``--ctime`` ``[Fri Aug 30 11:43:09 2024]``,
  ISO, delta or relative timestamps (and a ``CONFIG_PRINTK_CALLER`` caller
  id after them), syslog/journal lines (``... kernel: NVRM: ...``) or raw
  kmsg records (``6,1234,5678,-;NVRM: ...``), journal JSON (``journalctl
  -o json`` lines, ``-o json-pretty`` entries), or a journal export
  (``journalctl -o export``, read entry by entry: ``kmsg_export``).  The
  cursor is the byte offset plus the file's inode, so rotation or truncation
  restarts at the top.

Only lines the checks can use are kept (``NVRM:`` driver messages, the
NVSwitch driver's ``nvidia-nvswitchN: SXid`` reports and PCIe AER reports),
and only when the kernel wrote them (issue 10): a job user
must not be able to drain a node by logging text that looks like a fault.

* A kmsg record counts only with facility 0 (``kern``).  The kernel stamps
  every record written to ``/dev/kmsg`` from userspace with facility 1
  (``user``) unless the writer names another non-zero one; facility 0 cannot
  be claimed (``devkmsg_write``; Documentation/ABI/testing/dev-kmsg).
* A syslog or journal line counts only with the ``kernel`` tag (with or
  without a host name, month names in any locale); a journal JSON line
  (``journalctl -o json``), json-pretty entry or export entry (``-o export``) only with
  ``_TRANSPORT=kernel`` (a field journald sets itself) and facility 0; a
  ``talosctl dmesg`` line only with the facility ``kern`` (Talos reads it
  from ``/dev/kmsg``).  ``dmesg -x`` / ``dmesg -r``
  output counts only with facility ``kern``.  Plain ``dmesg`` output names no
  facility: only root can write ``/dev/kmsg``.
* The driver's prefix must start the message: text before it (a task name,
  a USB product string, another program's message) disqualifies the line.
* A driver line after text no log format we know explains is not proven
  either way: it never starts an event, and ``gpu.xid`` warns about it,
  naming its byte offset (``KernelLine.doubt``).
* The lines after the first one of a multi-line record (``\\x0a`` in kmsg,
  indented in dmesg and journal output, a newline in journal JSON) are
  *continuations*: they never start an event (see ``health/xid.py``).
* Read from ``/proc/kmsg`` (imklog, klogd, ``dmesg -S``), every line of a
  multi-line record carries the record's kernel time: a driver line with the
  exact kernel time of the foreign kernel line before it may be a user's
  newline in that record, and is a doubt (``kmsg_scan.SAME_RECORD``).

The search finds each driver prefix with ``bytes.find`` over 8 MB chunks
(``kmsg_scan._find``), so a 100 MB log is scanned in about 30 ms; the trust
checks run on the few hits only.
"""
from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass

from .. import procfs
from ..errors import InputError
# The scan over the text (re-exported: kmsg.KernelLine and kmsg.scan_buffer are the public names).
from .kmsg_scan import (KERN, MAX_JSON_LINE, KernelLine, head_family, line_before,  # noqa: F401
                        resume_after_long_line, scan_buffer, text_log_head, verbose_cut)
from .kmsg_export import MAGIC, Broken, Oversized, resync, scan_export

TYPE_CHECKING = False   # not typing's: the health check imports this module (~2 ms)
if TYPE_CHECKING:
    from typing import Any

DEV_KMSG = "/dev/kmsg"
# The kernel's syslog(2) buffer: a read takes the messages it returns from
# every other reader (rsyslog's imklog, klogd), so it is never read here.
PROC_KMSG = "/proc/kmsg"
PROC_KMSG_WHY = ("/proc/kmsg, whose every read takes its messages from the syslog daemon: "
                 "name /dev/kmsg (the default) or the file the syslog daemon writes")
CHUNK = 8 << 20


def _is_proc_kmsg(path: str) -> bool:
    try:
        return os.path.realpath(path) == PROC_KMSG
    except (OSError, ValueError):
        return False


@dataclass
class FileCursor:
    """Where the last read of a kernel log file stopped (and proof it is the same file)."""

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
    if _is_proc_kmsg(p):
        raise InputError(f"kernel log is {PROC_KMSG_WHY}", p)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError("kernel log not found", p) from None
    except OSError as e:
        raise InputError(f"cannot read kernel log: {e.strerror}", p) from None
    try:
        st = os.fstat(fd)
        start = 0
        if (cursor is not None and cursor.inode == st.st_ino and 0 <= cursor.offset <= st.st_size
                and _same_file(fd, cursor)):
            start = cursor.offset
        if st.st_size == 0 or start >= st.st_size:
            return [], FileCursor(p, st.st_ino, start if st.st_size else 0, _mark(fd, start if st.st_size else 0))
        # Chunks keep memory flat however big the log is (a whole-file mmap
        # would show the file's size in RSS, and dies of SIGBUS when
        # copytruncate shortens the file under it); only whole lines are
        # scanned, so a line being written now is read next time.
        # Each read starts where the last whole line ended, so no partial line
        # is ever copied onto the next chunk (that copy was a third of the
        # scan of a 100 MB log); a chunk without a newline is read again twice
        # as long, as the old carry grew.  Every chunk is read into the same
        # buffer: a fresh 8 MB bytes object per read costs page faults (100
        # MB: 14-24 ms of reads, 8 ms into one buffer).  Past ``n`` the
        # buffer holds the previous chunk's bytes: nothing reads beyond ``cut``.
        out: list[KernelLine] = []
        pos, want = start, CHUNK
        buf = bytearray(min(want, st.st_size - start))
        # A journal export file (journalctl -o export) is read entry by entry
        # (kmsg_export): its first bytes are journalctl's, never a program's.
        head = os.pread(fd, 4096, 0)
        export = head.startswith(MAGIC)
        family = None if export else head_family(head)
        lost = -1                          # where in ``out`` the export format broke (what follows is unproven)
        while pos < st.st_size:
            size = min(want, st.st_size - pos)
            if len(buf) < size:
                buf = bytearray(size)
            n = os.preadv(fd, [memoryview(buf)[:size]], pos)
            if not n:
                break
            got: list[KernelLine] = []
            if export:
                try:
                    got, cut = scan_export(buf, 0, n, pos)
                except Oversized as e:
                    # A value too long to read (a program's, up to journald's
                    # 768 MiB): stepped over by its length, never read.  From
                    # its closing newline on, the rest of that entry reads as
                    # no entry (not the kernel's, which has no such value).
                    end_at = pos + e.value_end
                    if end_at >= st.st_size:
                        break              # still being written: read next time
                    if os.pread(fd, 1, end_at) == b"\n":
                        pos, want = end_at, CHUNK
                        continue
                    frm = pos
                except Broken as e:
                    frm = pos + e.offset
                else:
                    frm = -1
                if frm >= 0:
                    # Not the export format from ``frm`` on: stopping there would
                    # blind every later run.  Resync at the next entry boundary,
                    # say what was skipped (a warning), and trust nothing read
                    # after it in this run: the boundary may be a program's text.
                    to = _resync_at(fd, frm, st.st_size)
                    if lost < 0:
                        lost = len(out)
                    out.append(KernelLine(None, "", doubt=f"journal export: bytes {frm} to {to} of the kernel log are "
                                          "not the export format (a value without its length or end): skipped, "
                                          "and no report after them is trusted", at=frm))
                    pos, want = to, CHUNK
                    continue
            elif family == "pretty":
                # A json-pretty entry is read whole or not at all (a follower
                # flushes in blocks; a chunk ends anywhere): up to the last
                # "}" line, as the export reader stops at an entry's end.
                last = buf.rfind(b"\n}\n", 0, n)
                cut = last + 3 if last >= 0 else 0
                if not cut and n > 2 * MAX_JSON_LINE:
                    # No entry ends here: only the last two MAX_JSON_LINE
                    # windows can still be part of one being written (a longer
                    # one is never parsed).  What is before them is read now
                    # (a MESSAGE line in it warns), so no run re-reads the
                    # whole file, however big it grows without a "}" line.
                    cut = buf.rfind(b"\n", 0, n - 2 * MAX_JSON_LINE) + 1
            elif family in ("verbose", "verbose-tab", "verbose-cut"):
                # journalctl -o verbose: an entry is read whole (kmsg_scan.verbose_cut).
                cut = buf.rfind(b"\n", 0, n) + 1
                if cut:
                    cut = verbose_cut(buf, cut, pos + n >= st.st_size)
            else:
                cut = buf.rfind(b"\n", 0, n) + 1
            if not cut:
                if pos + n >= st.st_size:
                    break                  # the last line (entry), still being written
                tail = buf.rfind(b"\n", 0, n) + 1
                if family in ("verbose", "verbose-tab", "verbose-cut", "pretty") and n - tail > 2 * MAX_JSON_LINE:
                    # A line longer than any of the kernel's entries (a
                    # program's value, up to journald's 768 MiB): stepped
                    # over in blocks, never read whole into memory.
                    to = _resume_at(fd, pos + n, st.st_size, "pretty" if family == "pretty" else "verbose")
                    if to < 0:
                        break              # its end is not written yet: read next time
                    if family == "pretty" and tail:
                        out += scan_buffer(buf, 0, tail, pos, _line_before(fd, pos), family=family)
                    pos, want = to, CHUNK
                    continue
                want *= 2
                continue
            out += got if export else scan_buffer(buf, 0, cut, pos, _line_before(fd, pos), family=family)
            pos += cut
            want = CHUNK
        if lost >= 0:
            out[lost:] = [ln if ln.doubt else KernelLine(ln.when, ln.text, ln.cont, AFTER_RESYNC, ln.at)
                          for ln in out[lost:]]
        if not trusted_stat(st):
            # Whoever may write the file writes any format: nothing in it is proven.
            out = [ln if ln.doubt else KernelLine(ln.when, ln.text, ln.cont, OPEN_FILE, ln.at) for ln in out]
        return out, FileCursor(p, st.st_ino, pos, _mark(fd, pos))
    finally:
        os.close(fd)


def _line_before(fd: int, pos: int) -> bytes:
    """The line that ends at *pos*, when a read from *pos* must compare with it (``kmsg_scan.line_before``)."""
    if pos <= 0:
        return b""
    return line_before(os.pread(fd, min(pos, 64 << 10), max(0, pos - (64 << 10))), pos <= 64 << 10)


def _resume_at(fd: int, frm: int, size: int, family: str) -> int:
    """Where reading resumes after a line too long for the kernel's that goes on at *frm* (-1: none yet)."""
    at = frm
    while at < size:
        block = os.pread(fd, 64 << 10, at)
        k = resume_after_long_line(block, family)
        if k >= 0:
            return at + k
        if len(block) <= 1:
            break
        at += len(block) - (family != "pretty")      # a verbose block's last newline is looked at again
    return -1


OPEN_FILE = "the kernel log file is not root's, or someone else may write it"
AFTER_RESYNC = "read after bytes that are not the journal export format (see the warning about them)"


def _resync_at(fd: int, frm: int, size: int) -> int:
    """The next entry boundary of an export file at or after *frm* (*size* when none)."""
    at = frm
    while at < size:
        block = os.pread(fd, CHUNK, at)
        k = resync(block, 0, len(block))
        if k >= 0:
            return at + k
        if at + len(block) >= size or len(block) <= 128:
            break
        at += len(block) - 128           # a boundary across two blocks is found in the next
    return size


# ----------------------------------------------------------------- /dev/kmsg

@dataclass
class KmsgCursor:
    """The last ``/dev/kmsg`` record read, and the boot it belongs to."""

    boot_id: str = ""
    seq: int = -1


def boot_id() -> str:
    """This boot's id (kmsg sequence numbers restart at every boot)."""
    return procfs.boot_id()


def raw_records(device: str = DEV_KMSG) -> list[bytes]:
    """Every record *device* (``/dev/kmsg``) still holds, as the kernel gives them, without blocking."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputError(f"cannot read kernel log: {e.strerror}", device) from None
    out: list[bytes] = []
    try:
        while True:
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno in (errno.EPIPE, errno.EINVAL):  # records overwritten while reading: go on
                    continue
                raise
            if not rec:
                break
            out.append(rec)
    finally:
        os.close(fd)
    return out


def read_kmsg(cursor: KmsgCursor | None = None, device: str = DEV_KMSG) -> tuple[list[KernelLine], KmsgCursor]:
    """Read every record /dev/kmsg still holds after *cursor*, without blocking."""
    bid = boot_id()
    last = cursor.seq if cursor is not None and cursor.boot_id == bid else -1
    records: list[tuple[int, bytes]] = []
    for rec in raw_records(device):
        head, _, _ = rec.partition(b";")
        try:
            rseq = int(head.split(b",")[1][:20])
        except (IndexError, ValueError):
            continue
        # Continuation lines (" KEY=value") carry device properties: drop them.
        records.append((rseq, rec.split(b"\n", 1)[0] + b"\n"))
    newest = max((r for r, _ in records), default=-1)
    if records and newest < last:
        # A cursor past every record of this boot (a corrupt state file):
        # trusting it would skip every fault until the next reboot.
        last = -1
    buf = b"".join(rec for rseq, rec in records if rseq > last)
    return scan_buffer(buf), KmsgCursor(bid, max(last, newest))


# ------------------------------------------------------- who wrote the lines

def sender_proof(source: str, sample: int = 256 << 10) -> tuple[str, str]:
    """Whether the lines of *source* (``[health] kernel_log``) can prove the kernel wrote them.

    ``("proven" | "unproven" | "empty" | "unknown", why)``: ``/dev/kmsg`` and files of
    its records, dmesg output and journal JSON/export files prove it; a syslog
    or journal text file (judged by its last *sample* bytes) does not, since
    its ``kernel:`` tag is whatever the sender wrote (``kmsg_scan.TAG_ONLY``).
    Opened without blocking (a FIFO there must not hang ``doctor``).
    """
    from .kmsg_scan import text_log_line
    if source == DEV_KMSG:
        return "proven", "the kernel's records, whose facility userspace cannot claim"
    if _is_proc_kmsg(source):
        return "unknown", PROC_KMSG_WHY
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        return "unknown", f"cannot be read ({e.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "unknown", "not a regular file"
        if not trusted_stat(st):
            return "unproven", OPEN_FILE + ": any line in it may be theirs"
        head = os.pread(fd, 4096, 0)
        if head.startswith(MAGIC):
            return "proven", "a journal export file (journald's own _TRANSPORT field)"
        tail = os.pread(fd, sample, max(0, st.st_size - sample))
    except OSError as e:
        return "unknown", f"cannot be read ({e.strerror})"
    finally:
        os.close(fd)
    # What the health check reads as unproven in every line, whatever each looks like.
    why = _unproven_format(head)
    if why:
        return "unproven", why
    lines = tail.split(b"\n")[1 if st.st_size > sample else 0:]
    seen = False
    for raw in lines[-2000:]:
        text = raw[:400].decode("utf-8", "replace")
        if not text.strip():
            continue
        seen = True
        if text_log_line(text):
            return "unproven", ("a syslog/journal text file: a line tagged \"kernel:\" is what its sender wrote, "
                                "and any local user can write one (logger -t kernel)")
    if not seen:
        # Only root may write it (checked above); the health check judges each
        # line by its format as it reads it, so nothing unproven can drain.
        return "empty", "empty so far (root's, writable by no one else): each line is judged by its format"
    return "proven", ("dmesg output, /dev/kmsg records, journal JSON or journalctl -o verbose "
                      "(the kernel's facility or journald's fields)")


def _unproven_format(head: bytes) -> str | None:
    """Why no line of a file whose first bytes are *head* can prove the kernel wrote it
    (as the health check reads them: ``kmsg_scan``), or None."""
    from .kmsg_scan import (CONTAINER, JSON_UNPROVEN, VERBOSE_CUT, VERBOSE_TAB, _CRI, head_family, head_line,
                            journal_json)
    line = head_line(head)
    if line is None:
        return None
    if _CRI.match(line.encode("utf-8", "replace")):
        return CONTAINER
    fam = head_family(head)
    if fam == "verbose-tab":
        return VERBOSE_TAB
    if fam == "verbose-cut":
        return VERBOSE_CUT
    if fam == "json":
        # A first line that does not parse (cut at the 4 KiB head) says nothing.
        rec = journal_json(line)
        if rec is not None and "_TRANSPORT" not in rec:
            return JSON_UNPROVEN
    return None


# ------------------------------------------------------------------ cursors

def read_source(source: str, doc: dict[str, Any]) -> tuple[list[KernelLine], dict[str, Any]]:
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


def trusted_stat(st: os.stat_result) -> bool:
    """A regular file of root (or this process's user) that nobody else may write."""
    return stat.S_ISREG(st.st_mode) and st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022


def read_events(path: str, doc: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """New records of the ``xid-watch`` event file (JSON lines) after the cursor in *doc*.

    Its records count as NVML's own word (they drain, and ``on_fatal``
    requeues on them), so the file must be what ``xid-watch`` (root) wrote: a
    regular file, not a link, root's (or this process's user's), and writable
    by nobody else; anything else is bad input, and its records are not read.
    """
    doc = json.loads(json.dumps(doc))
    ev = doc.get("events") or {}
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return [], doc
    except OSError as e:
        raise InputError(f"cannot read event file: {e.strerror}", path) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not trusted_stat(st):
            raise InputError("event file is not root's, or someone else may write it: its records prove nothing",
                             path)
        cur = FileCursor(path, int(ev.get("inode", 0)), int(ev.get("offset", 0)), str(ev.get("mark") or ""))
        same = cur.inode == st.st_ino and 0 <= cur.offset <= st.st_size and _same_file(f.fileno(), cur)
        start = cur.offset if same else 0
        f.seek(start)
        data = f.read()
        end = data.rfind(b"\n") + 1
        mark = _mark(f.fileno(), start + end)
    out = []
    for raw in data[:end].splitlines():
        try:
            rec = json.loads(raw)
        except (ValueError, RecursionError):
            continue  # a torn or foreign line must not stop the check
        if isinstance(rec, dict):
            out.append(rec)
    doc["events"] = {"inode": st.st_ino, "offset": start + end, "mark": mark}
    return out, doc
