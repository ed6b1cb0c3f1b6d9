"""The node's accounting records, under ``[acct] dir`` (root's alone: 0700, files 0600).

* ``jobs/<id>.json``: the prolog's registration (user, devices held, start);
  the epilog removes it.  dcgm-exporter's mapping files are derived from
  these and nothing else (:mod:`.metrics`), so a registration gone means
  its mapping gone.
* ``agg/<id>.json``: the job's rolling aggregates, rewritten by the sampler.
* ``pending/<id>.json``: a summary slurmdbd has not confirmed yet (retried
  by the next epilog and by the sampler), or one it confirmed, kept for a
  second check a minute later.
* ``ended/<id>``: the epilog ran; the sampler must not start the job's
  aggregates again from a process that lingers.  Expires after a day.

Every file is written atomically; every reader refuses a file that is not
root's or is writable by others (a user must not plant a registration that
points us at another job's GPU), and ignores what it cannot parse.  No one
else reads them either: they name each job's user, account and GPUs, which
Slurm's ``PrivateData`` may hide from other users; directories an older
version left 0755 (files 0644) are tightened on first use.
"""
from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any, Iterable

from ..fsutil import atomic_write, read_trusted
from ..jobs.state import check_jobid

KINDS = ("jobs", "agg", "pending", "ended")
ENDED_TTL_S = 86400.0


class Store:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.root = Path(directory)
        self._ready: set[str] = set()

    def path(self, kind: str, jobid: str) -> Path:
        suffix = "" if kind == "ended" else ".json"
        return self.root / kind / f"{check_jobid(jobid)}{suffix}"

    def ensure(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        # An older version made this one with the umask's mode (0775 under umask 002):
        # what is in it is checked one by one (below, and by every read), so tighten it.
        self._private(self.root, files=False, loose_ok=True)
        for kind in KINDS:
            d = self.root / kind
            d.mkdir(exist_ok=True, mode=0o700)
            self._private(d, files=True)

    @staticmethod
    def _private(d: Path, files: bool, loose_ok: bool = False) -> None:
        """Check *d* is root's and not writable by others; make it (and its files) private."""
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, os.geteuid()) or \
                (st.st_mode & 0o022 and not loose_ok):
            from ..errors import InputError
            raise InputError("accounting directory must be root's and not writable by others", str(d))
        if not st.st_mode & 0o077:
            return
        os.chmod(d, 0o700)
        if not files:
            return
        # Only root writes in here (checked above): no one can swap an entry for a link meanwhile.
        for name in os.listdir(d):
            p = d / name
            try:
                fst = os.lstat(p)
                if stat.S_ISREG(fst.st_mode) and fst.st_mode & 0o077:
                    os.chmod(p, 0o600)
            except OSError:
                pass

    def write(self, kind: str, jobid: str, data: dict[str, Any]) -> None:
        # Aggregates are rewritten every tick: no fsync (a crash loses one tick at most).
        if kind not in self._ready:
            self.ensure()
            self._ready.add(kind)
        atomic_write(self.path(kind, jobid), json.dumps(data, separators=(",", ":"), sort_keys=True),
                     mode=0o600, durable=kind != "agg")

    def read(self, kind: str, jobid: str) -> dict[str, Any] | None:
        raw = read_trusted(self.path(kind, jobid), 1 << 20)
        if raw is None:
            return None
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def remove(self, kind: str, jobid: str) -> None:
        try:
            os.unlink(self.path(kind, jobid))
        except FileNotFoundError:
            pass

    def ids(self, kind: str) -> list[str]:
        try:
            names = os.listdir(self.root / kind)
        except FileNotFoundError:
            return []
        out = []
        for n in names:
            base = n[:-5] if n.endswith(".json") else n
            if base.isdigit() and len(base) <= 12 and (kind == "ended") == (not n.endswith(".json")):
                out.append(base)
        return sorted(out, key=int)

    def mark_ended(self, jobid: str, sluids: Iterable[str] = ()) -> None:
        """The tombstone; *sluids* (26.05: the job's SLUIDs so far) on its second
        line, for the prolog of a requeued run (:meth:`ended_sluids`)."""
        # A tombstone needs no fsync: after a crash the sweep finds the job gone anyway.
        self.ensure()
        atomic_write(self.path("ended", jobid), f"{time.time():.0f}\n{' '.join(sluids)}\n", mode=0o600,
                     durable=False)

    def ended_sluids(self, jobid: str) -> list[str]:
        """The SLUIDs the tombstone of *jobid* kept (checked as every read is)."""
        from .attribution import SLUID
        raw = read_trusted(self.path("ended", jobid), 4096)
        if raw is None:
            return []
        lines = raw.decode(errors="replace").splitlines()
        return [x for x in (lines[1].split() if len(lines) > 1 else []) if SLUID.fullmatch(x)]

    def ended(self, jobid: str) -> bool:
        return self.path("ended", jobid).exists()

    def expire_ended(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        for j in self.ids("ended"):
            try:
                if now - os.stat(self.path("ended", j)).st_mtime > ENDED_TTL_S:
                    self.remove("ended", j)
            except OSError:
                pass

    def registrations(self) -> dict[str, dict[str, Any]]:
        out = {}
        for j in self.ids("jobs"):
            r = self.read("jobs", j)
            if r is not None and r.get("jobid") == j:
                out[j] = r
        return out
