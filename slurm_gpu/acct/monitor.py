"""``slurm-gpu monitor``: the node's sampler.

Every ``[acct] interval`` seconds (default 10) one tick:

1. read every GPU and MIG instance (:class:`~slurm_gpu.hw.gpustats.StatsReader`);
2. give each device's sample to the jobs it belongs to (:mod:`.attribution`);
3. fold it into each job's aggregates, in memory and in ``agg/<id>.json``;
4. add XIDs that xid-watch recorded since the last tick to the jobs holding
   the GPU;
5. write the Prometheus textfile, apply the idle-GPU policy;
6. every few ticks: end jobs that are registered but no longer run on this
   node (their epilog failed or never ran), drop stale aggregates, retry
   summaries slurmdbd has not confirmed.

Memory and disk are bounded: one fixed-size aggregate per (job, device),
at most ``[acct] max_jobs`` jobs.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import aggregate, attribution, hooks, metrics
from .settings import AcctSettings
from .store import Store

SWEEP_EVERY = 6            # ticks between sweeps of finished jobs
STALE_TICKS = 30           # an unregistered job's aggregates unused this long are dropped


@dataclass
class Monitor:
    settings: AcctSettings
    store: Store
    reader: Any                                  # hw.gpustats.StatsReader
    node: str
    running_jobs: Callable[[], set[str] | None]  # job ids running here (None: cannot tell)
    xid_file: str = ""
    bus_index: dict[str, int] = field(default_factory=dict)
    now: Callable[[], float] = time.time
    log: Callable[[str], None] = field(default=lambda m: print(m, file=sys.stderr))
    aggs: dict[str, dict[str, Any]] = field(default_factory=dict)
    ticks: int = 0
    _xid_pos: int = -1
    idle_flags: dict[str, bool] = field(default_factory=dict)
    _idle_acted: set[str] = field(default_factory=set)

    def start(self) -> None:
        """Load aggregates left by an earlier run (restart keeps what was counted)."""
        self.store.ensure()
        for j in self.store.ids("agg"):
            a = self.store.read("agg", j)
            if a is not None and not self.store.ended(j):
                self.aggs[j] = a
        if self.xid_file:
            try:
                self._xid_pos = os.path.getsize(self.xid_file)
            except OSError:
                self._xid_pos = 0

    def tick(self) -> None:
        s = self.settings
        t = self.now()
        regs = self.store.registrations()
        stats = self.reader.read()
        for err in self.reader.errors:
            self.log(f"slurm-gpu: monitor: {err}")
        held = attribution.holders({j: r.get("devices", []) for j, r in regs.items()})
        shared = {k for r in regs.values() if r.get("shared") is True for k in r.get("devices", [])}
        cache: dict[int, str | None] = {}
        sluids = attribution.sluid_map(regs)
        bases = attribution.v2_bases(s.proc_root)

        def pid_job(pid: int) -> str | None:
            if pid not in cache:
                cache[pid] = attribution.job_of_pid(s.proc_root, pid, sluids, bases)
            return cache[pid]

        dirty: set[str] = set()
        for sh in attribution.attribute(stats, held, pid_job, shared):
            if sh.jobid not in regs and self.store.ended(sh.jobid):
                continue
            a = self.aggs.get(sh.jobid)
            if a is None:
                a = self.aggs[sh.jobid] = {"jobid": sh.jobid, "node": self.node, "devices": {}}
            d = a["devices"].get(sh.key)
            if d is None:
                d = a["devices"][sh.key] = aggregate.new_device(sh.held)
                d["mt"], d["fr"] = sh.mem_total, sh.fraction
            aggregate.add_sample(d, t, sm=sh.sm, mem=sh.mem, energy_mj=sh.energy_mj,
                                 idle_threshold=s.idle_threshold, busy=sh.busy and sh.sm is None,
                                 weight=sh.weight, share=sh.share)
            a["updated"] = t
            dirty.add(sh.jobid)
        dirty |= self._xids(held)
        self._bound(regs)
        for j in dirty:
            if j in self.aggs:
                self.store.write("agg", j, self.aggs[j])
                if self.store.ended(j):            # the epilog ran meanwhile
                    self.store.remove("agg", j)
                    self.aggs.pop(j, None)
        self._idle_policy(regs, t)
        if s.metrics_file:
            metrics.write_textfile(s.metrics_file, metrics.textfile(stats, held, self.idle_flags, s.job_labels))
        self.ticks += 1
        if self.ticks % SWEEP_EVERY == 1:
            self.sweep(regs)

    def _xids(self, held: dict[str, list[str]]) -> set[str]:
        if not self.xid_file or self._xid_pos < 0:
            return set()
        try:
            with open(self.xid_file, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                if size < self._xid_pos:
                    self._xid_pos = 0            # rotated
                f.seek(self._xid_pos)
                data = f.read(1 << 20)
        except OSError:
            return set()
        end = data.rfind(b"\n") + 1
        self._xid_pos += end
        touched = set()
        for line in data[:end].splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if not isinstance(ev, dict) or ev.get("event") != "xid":
                continue
            idx = self.bus_index.get(str(ev.get("gpu") or "").lower())
            if idx is None:
                continue
            for key, jobs in held.items():
                if key == str(idx) or key.startswith(f"{idx}/gi"):
                    for job in jobs:            # a shared GPU's XID is every holder's
                        a = self.aggs.get(job)
                        if a is not None and key in a["devices"]:
                            aggregate.add_xid(a["devices"][key], int(ev.get("xid", 0)))
                            touched.add(job)
        return touched

    def _bound(self, regs: dict[str, Any]) -> None:
        """At most max_jobs aggregates: unregistered (leaked-only) jobs go first, oldest first."""
        over = len(self.aggs) - self.settings.max_jobs
        if over <= 0:
            return
        order = sorted(self.aggs, key=lambda j: (j in regs, self.aggs[j].get("updated", 0)))
        for j in order[:over]:
            self.aggs.pop(j, None)
            self.store.remove("agg", j)

    def _idle_policy(self, regs: dict[str, Any], t: float) -> None:
        s = self.settings
        self.idle_flags = {}
        if s.idle_minutes <= 0:
            return
        need = max(int(s.idle_minutes * 60 / s.interval), 1)
        for j, reg in regs.items():
            a = self.aggs.get(j)
            if a is None:
                continue
            for key in reg.get("devices", []):
                d = a["devices"].get(key)
                if d is None:
                    continue
                if d.get("run", 0) >= need:
                    self.idle_flags[key] = True
                    tag = f"{j}:{key}"
                    if tag not in self._idle_acted:
                        self._idle_acted.add(tag)
                        self.log(f"slurm-gpu: monitor: job {j} has held GPU {key} idle for "
                                 f"{s.idle_minutes:g} min")
                        if s.idle_action == "cancel":
                            from ..runner import run as run_cmd
                            run_cmd([s.scancel, j], 10, check=False)

    def sweep(self, regs: dict[str, Any] | None = None) -> None:
        """End jobs that no longer run here; drop stale aggregates; retry pending summaries."""
        regs = self.store.registrations() if regs is None else regs
        running = self.running_jobs()
        t = self.now()
        if running is not None:
            for j, reg in regs.items():
                if j not in running and t - float(reg.get("start", t)) > 2 * self.settings.interval:
                    self.log(f"slurm-gpu: monitor: job {j} ended without our epilog; finishing it")
                    hooks.finish(self.settings, self.store, j, self.node, store_dbd=False, now=t)
                    self.aggs.pop(j, None)
        for j in list(self.aggs):
            a = self.aggs[j]
            stale = t - float(a.get("updated", t)) > STALE_TICKS * self.settings.interval
            if self.store.ended(j) or (j not in regs and stale and (running is None or j not in running)):
                self.aggs.pop(j, None)
                self.store.remove("agg", j)
        for j in self.store.ids("agg"):
            if j not in self.aggs and j not in regs:
                self.store.remove("agg", j)
        if self.settings.dcgm_mapping_dir:
            metrics.sync_mapping(self.settings.dcgm_mapping_dir, self.store.registrations())
        self.store.expire_ended(t)
        hooks.retry_pending(self.settings, self.store, limit=10, now=t)
