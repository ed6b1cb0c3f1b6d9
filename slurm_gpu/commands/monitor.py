"""``slurm-gpu monitor``: the per-job GPU sampler (a node service; docs/accounting.md)."""
from __future__ import annotations

import os
import signal
import time
from typing import Any

import click


def _running_jobs(node: str, timeout: float) -> set[str] | None:
    from ..errors import SlurmGpuError
    from ..runner import run
    from ..slurmclient import command
    try:
        res = run([command("squeue"), "-h", "-w", node, "-o", "%A", "-t", "CF,R,S,CG,ST,SO"], timeout, check=False)
    except SlurmGpuError:
        return None
    if res.returncode != 0:
        return None
    return {j for j in res.stdout.split() if j.isdigit()}


def build(interval: float | None = None) -> Any:
    """The Monitor for this node, from the config."""
    from ..acct import settings
    from ..acct.monitor import Monitor
    from ..acct.store import Store
    from ..health.settings import HealthSettings
    from ..hw import live
    from .. import config
    s = settings.load()
    if interval is not None:
        s.interval = interval
    node_s = live.settings()
    node = live.node_name()
    hs = config.section(HealthSettings, "health")
    xid = hs.events_file.replace("%n", node) if hs.events_file else os.path.join(node_s.state_dir,
                                                                                  "xid-events.jsonl")
    try:
        model = live.this_node(node_s)
        buses = {g.pci_bus_id.lower(): g.index for g in model.gpus if g.pci_bus_id}
    except Exception:  # noqa: BLE001 - XIDs are then not attributed; sampling still works
        buses = {}
    from ..hw import backend
    reader = backend.open_gpus(backend.source_for(node_s)).stats_reader()
    return s, Monitor(s, Store(settings.acct_dir(s, node_s.state_dir)), reader, node,
                      lambda: _running_jobs(node, s.dbd_timeout), xid_file=xid, bus_index=buses)


@click.command("monitor")
@click.option("--interval", type=click.FloatRange(0.1), default=None,
              help="Seconds between samples [default: [acct] interval, 10].")
@click.option("--ticks", type=click.IntRange(0), default=0, help="Stop after this many samples (0: run on).")
@click.option("--once", is_flag=True, help="Take one sample and exit (same as --ticks 1).")
def monitor(interval: float | None, ticks: int, once: bool) -> None:
    """Sample every GPU and MIG instance; keep per-job aggregates (runs as root).

    Does nothing (exit 0) unless [acct] enabled = true.
    """
    from ..acct import settings
    if not settings.load().enabled:
        click.echo("slurm-gpu: monitor: accounting is off ([acct] enabled = false)", err=True)
        return
    s, mon = build(interval)
    mon.start()
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    signal.signal(signal.SIGINT, lambda *a: stop.append(1))
    limit = 1 if once else ticks
    n = 0
    next_at = time.monotonic()
    try:
        while not stop:
            mon.tick()
            n += 1
            if limit and n >= limit:
                break
            next_at += s.interval
            while not stop and time.monotonic() < next_at:
                time.sleep(min(0.5, max(next_at - time.monotonic(), 0)))
            if time.monotonic() - next_at > s.interval:      # fell behind (suspend): do not catch up
                next_at = time.monotonic()
    finally:
        mon.reader.close()
