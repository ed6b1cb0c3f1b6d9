"""``xid-watch``: a small persistent GPU event listener.

The driver delivers events (critical XID, double-bit ECC, GPU unavailable, GPU
recovery action) only to a process registered when they happen; a health
check that starts every few minutes would miss them.  This listener
appends one JSON line per event to the file ``slurm-gpu health`` reads
(with its own cursor), so nothing between two checks is lost::

    {"time": 1732250000.1, "event": "xid", "xid": 79, "gpu": "0000:07:00.0", "data": 79}

``event`` is ``xid``, ``dbe``, ``gpu_unavailable``, ``recovery_action`` or ``other``.

**Event-driven drain** (``[health] event_drain``, on by default): when an
event is drain-class by the health check's own rules (the XID catalog,
:func:`drain_finding`), the listener runs the health check at once
(``on_drain``), so a fault drains the node in about a second instead of at
the next ``HealthCheckInterval``.  It is the same check, with the same lock,
debounce, boot grace and "resume only our own drains" rules: there is no
second drain writer.  It also follows the node's kernel log
(:class:`KernelFollower`), so a node whose GPUs give no NVML events still
drains on the driver's own lines.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any, Callable, Sequence

from ..hw.gpus import GpuError, GpuEvent, Gpus

_WAIT_MS = 1000
# With a kernel log to follow, NVML's wait is cut to this so a driver line is
# seen within about half a second.
_FOLLOW_MS = 400


LOST_REPEAT_S = 60.0


def event_record(ev: GpuEvent) -> dict[str, Any]:
    """One GPU event as the JSON record health reads."""
    rec: dict[str, Any] = {"time": round(time.time(), 3), "event": ev.kind, "gpu": ev.gpu, "data": ev.data,
                           "type": ev.type}
    if ev.kind == "xid":
        rec["xid"] = ev.data
    return rec


def append(path: str, rec: dict[str, Any]) -> None:
    """One line per event, O_APPEND: a reader never sees half a line it would keep.

    Never into a file someone else made or may write (``[health] events_file``
    in a shared directory): the health check would refuse its records anyway.
    """
    from ..errors import InputError
    from ..hw.kmsg import trusted_stat
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                     0o600)
    except OSError as e:
        raise InputError(f"cannot write event file: {e.strerror}", path) from None
    try:
        if not trusted_stat(os.fstat(fd)):
            raise InputError("event file is not root's, or someone else may write it", path)
        os.write(fd, (json.dumps(rec, sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def drain_finding(records: Sequence[dict[str, Any]] = (), lines: Sequence[Any] = (),
                  skip: Sequence[str] = ()) -> str | None:
    """``check: message`` of the first drain-class finding these event records
    or kernel lines make, by the health check's own classification (the XID
    catalog, ``health/xid.py``), or None.  Only a trigger: the health run it
    starts reads the same events and lines again and decides."""
    from .findings import DRAIN
    from .xid import check_xid, events_from_nvml, parse_lines
    xids, direct = events_from_nvml(records)
    xids += parse_lines(lines)
    for f in direct + check_xid(xids):
        if f.severity == DRAIN and f.check not in skip:   # a check the site turned off drains nothing
            return f"{f.check}: {f.message}"
    return None


class KernelFollower:
    """The driver lines that reach the node's kernel log after the listener started.

    A file is read through ``hw.kmsg.read_source`` with a cursor of its own,
    kept in memory; ``/dev/kmsg`` through one descriptor kept open and moved
    to the end at start (``SEEK_END``), so each poll reads only the records
    written since, not the whole ring buffer again.  Either way the same
    trust rules as the health check apply (a line a user could have written
    never counts), and the check's own cursor is untouched.
    """

    def __init__(self, source: str) -> None:
        from ..hw.kmsg import DEV_KMSG, read_source
        self.source = source
        self._fd: int | None = None
        self._doc: dict[str, Any] = {}
        try:
            if source == DEV_KMSG:
                self._fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                os.lseek(self._fd, 0, os.SEEK_END)
            else:
                _, self._doc = read_source(source, {})     # start at the end: what was there is the check's
        except Exception as e:  # noqa: BLE001 - a log we cannot read is followed from when it appears
            print(f"slurm-gpu: xid-watch: not following {source} yet ({e})", file=sys.stderr)

    def poll(self) -> list[Any]:
        from ..hw.kmsg import read_source
        if self._fd is not None:
            return self._poll_kmsg(self._fd)
        try:
            lines, self._doc = read_source(self.source, self._doc)
        except Exception:  # noqa: BLE001 - rotated away or not there yet: the health check reports it
            return []
        return lines

    @staticmethod
    def _poll_kmsg(fd: int) -> list[Any]:
        import errno
        from ..hw.kmsg_scan import scan_buffer
        recs: list[bytes] = []
        for _ in range(100_000):          # bounded: a ring buffer holds far fewer
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno in (errno.EPIPE, errno.EINVAL):   # records overwritten meanwhile: go on
                    continue
                break
            if not rec:
                break
            # Continuation lines (" KEY=value") carry device properties: drop them,
            # as the check's own reader does.
            recs.append(rec.split(b"\n", 1)[0] + b"\n")
        return scan_buffer(b"".join(recs)) if recs else []

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _Gap:
    """At most one triggered run per ``MIN_GAP`` seconds: the first at once (a
    fault drains in about a second), later ones within the gap coalesced into
    one run at its end.  A user who can make drain-class-looking lines the
    check then refuses (an echo split across two polls) costs one run per gap,
    not one per line."""

    MIN_GAP = 5.0

    def __init__(self) -> None:
        self.last = -self.MIN_GAP
        self.why: str | None = None

    def now_or_later(self, why: str) -> bool:
        """True when the run may happen now; else it is kept for :meth:`due`."""
        if time.monotonic() - self.last >= self.MIN_GAP:
            self.last, self.why = time.monotonic(), None
            return True
        self.why = self.why or why
        return False

    def due(self) -> str | None:
        if self.why is not None and time.monotonic() - self.last >= self.MIN_GAP:
            why, self.why, self.last = self.why, None, time.monotonic()
            return why
        return None


class _Retry:
    """When a triggered run left the node undrained, run it again a few times.

    The check may rightly take no action now and owe the drain to a later run
    (slurmd not responding, the node booting, its lock held): with a
    ``HealthCheckInterval`` of minutes, "later" must come from here.  Bounded:
    a fault the check decides not to drain is asked about ~60 s, then left.
    """

    DELAYS = (2.0, 4.0, 8.0, 15.0, 30.0)

    def __init__(self) -> None:
        self.why = ""
        self.at: float | None = None
        self.tries = 0

    def after(self, why: str, settled: bool | None) -> None:
        if settled is not False:
            self.at, self.tries = None, 0
            return
        if why != self.why:
            self.tries = 0
        self.why = why
        if self.tries >= len(self.DELAYS):
            self.at, self.tries = None, 0
            print(f"slurm-gpu: xid-watch: {why}: node still not drained; left to the periodic check",
                  file=sys.stderr)
            return
        self.at = time.monotonic() + self.DELAYS[self.tries]
        self.tries += 1

    def due(self) -> bool:
        if self.at is None or time.monotonic() < self.at:
            return False
        self.at = None
        return True


def watch(opener: Callable[[], Gpus], path: str, *, max_events: int = 0, run_for: float = 0.0,
          on_drain: Callable[[str], bool | None] | None = None, kernel: KernelFollower | None = None,
          skip: Sequence[str] = ()) -> int:
    """Listen until SIGTERM/SIGINT (or *max_events* / *run_for*); returns the events written.

    With *on_drain*, a drain-class event (or a drain-class line *kernel*
    follows) calls it with what was seen, after the event is in *path*.  When
    it returns False (the node is not drained after the run) it is called
    again later (:class:`_Retry`).
    """
    from ..errors import HardwareError
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    gpus = opener()
    stop = {"now": False}

    def _stop(signum: int, frame: Any) -> None:
        stop["now"] = True

    old_term = signal.signal(signal.SIGTERM, _stop)
    events = gpus.listen()
    try:
        registered = 0
        for i in range(gpus.count()):
            try:
                events.register(i)
            except GpuError as e:
                # Only a lost GPU is a fault; NOT_SUPPORTED (no XID events on
                # this GPU or platform) and the like are recorded, never drained.
                # (Not written to the event file: a watcher restarted by systemd
                # every few seconds would grow it without end.)
                if e.lost:
                    append(path, {"time": round(time.time(), 3), "event": "gpu_unavailable", "gpu": None,
                                  "data": int(e.code or 0), "index": i})
                else:
                    print(f"slurm-gpu: xid-watch: GPU {i}: event registration refused ({e})", file=sys.stderr)
                continue
            registered += 1
        if registered == 0 and kernel is None:
            raise HardwareError("xid-watch: no GPU accepts NVML event registration")
        if registered == 0:
            print("slurm-gpu: xid-watch: no GPU gives NVML events: following the kernel log only", file=sys.stderr)
        wait_ms = _FOLLOW_MS if kernel is not None else _WAIT_MS
        n = 0
        t0 = time.monotonic()
        last_lost = -LOST_REPEAT_S
        retry, gap = _Retry(), _Gap()

        def trigger(why: str) -> None:
            assert on_drain is not None
            if gap.now_or_later(why):
                retry.after(why, on_drain(why))

        def again(why: str) -> None:
            # A retry is bounded by _Retry itself (5 in a minute): not held to the gap.
            assert on_drain is not None
            gap.last = time.monotonic()
            retry.after(why, on_drain(why))

        while not stop["now"]:
            if run_for and time.monotonic() - t0 >= run_for:
                break
            if on_drain is not None:
                late = gap.due()
                if late is not None:
                    retry.after(late, on_drain(late))
                elif retry.due():
                    again(retry.why)
            if kernel is not None and on_drain is not None:
                why = drain_finding(lines=kernel.poll(), skip=skip)
                if why:
                    trigger(f"kernel log: {why}")
            if registered == 0:
                time.sleep(wait_ms / 1000)
                continue
            try:
                ev = events.wait(wait_ms)
            except GpuError as e:
                if e.lost:
                    # The driver answers this on every wait while the GPU stays lost:
                    # one record a minute is enough to keep the node drained.
                    if time.monotonic() - last_lost >= LOST_REPEAT_S:
                        append(path, {"time": round(time.time(), 3), "event": "gpu_unavailable", "gpu": None,
                                      "data": int(e.code or 0)})
                        n += 1
                        last_lost = time.monotonic()
                        if on_drain is not None:
                            trigger("NVML event: gpu.count: a GPU is lost")
                    time.sleep(1.0)
                    continue
                raise HardwareError(f"xid-watch: {e.call} failed ({e})") from None
            if ev is None:
                continue
            rec = event_record(ev)
            append(path, rec)
            n += 1
            if on_drain is not None:
                why = drain_finding(records=[rec], skip=skip)
                if why:
                    trigger(f"NVML event: {why}")
            if max_events and n >= max_events:
                break
        return n
    finally:
        events.close()
        gpus.close()
        if kernel is not None:
            kernel.close()
        signal.signal(signal.SIGTERM, old_term)


def _drained(node: str | None, timeout: float = 10.0) -> bool:
    from .actions import show_node
    try:
        st = show_node(node or "", timeout) if node else None
    except Exception:  # noqa: BLE001 - cannot tell: ask again later
        return False
    return st is None or st.drained


def health_trigger(node: str | None, timeout: float, retries: int = 3,
                   settled: Callable[[], bool] | None = None) -> Callable[[str], bool]:
    """An ``on_drain`` that runs this node's health check now, as slurmd would.

    ``slurm-gpu health --slurm`` in a process of its own (the check leaves a
    thread in libnvidia-ml on a hung call by design; a listener must not),
    with a minimal environment.  When another run holds the node's lock (the
    health check gives up after 2 s), it tries again: the run holding it may
    have read the events before this one was written.  Returns whether the
    node stands drained afterwards (*settled*, default ``scontrol show node``);
    False at once when the run was skipped because slurmd's run holds the
    node (:data:`~slurm_gpu.health.findings.EXIT_SKIPPED`: it checked
    nothing), so :class:`_Retry` asks again in seconds.
    """
    from .findings import EXIT_SKIPPED
    is_settled = settled or (lambda: _drained(node))
    from .. import runner
    from ..runner import SAFE_PATH
    argv = [sys.executable, "-m", "slurm_gpu", "health", "--slurm"] + (["--node", node] if node else [])
    env = {"PATH": SAFE_PATH}
    for k in ("SLURM_CONF", "SLURM_GPU_CONFIG"):
        if os.environ.get(k):
            env[k] = os.environ[k]
    if node:
        env["SLURMD_NODENAME"] = node

    def run_now(why: str) -> bool:
        print(f"slurm-gpu: xid-watch: {why}: running the health check now", file=sys.stderr)
        for attempt in range(retries):
            try:
                res = runner.run(argv, timeout, env=env, check=False)
            except Exception as e:  # noqa: BLE001 - the periodic check still runs; never stop listening
                print(f"slurm-gpu: xid-watch: health check did not run ({e})", file=sys.stderr)
                return False
            # What the check said (its notes, a failed scontrol) goes to this
            # listener's log: it has no other reader.
            for line in res.stderr.strip().splitlines()[-5:]:
                print(f"slurm-gpu: xid-watch: health check: {line.removeprefix('slurm-gpu: ')}", file=sys.stderr)
            if res.returncode == EXIT_SKIPPED:
                # slurmd's run holds the node for its whole run (seconds, up to
                # the watchdog): 0.5 s retries would only be skipped too.
                print(f"slurm-gpu: xid-watch: {why}: slurmd's run holds the node; trying again shortly",
                      file=sys.stderr)
                return False
            if res.returncode == 0:
                break
            time.sleep(0.5)
        return is_settled()
    return run_now
