"""``slurm-gpu report usage`` and ``slurm-gpu job report``: GPU use from slurmdbd's summaries."""
from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

import click


def _settings() -> Any:
    from ..acct import settings
    return settings.load()


def _when(text: str | None, default: float, opt: str) -> tuple[float, str]:
    from ..errors import UsageError
    if not text:
        return default, datetime.fromtimestamp(default).strftime("%Y-%m-%dT%H:%M:%S")
    for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d"):
        try:
            t = datetime.strptime(text, fmt).timestamp()
            return t, datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S")
        except ValueError:
            continue
    raise UsageError(f"bad date {text!r}: expected YYYY-MM-DD[THH:MM[:SS]]", opt)


@click.group()
def report() -> None:
    """Cluster GPU usage from the per-job summaries in slurmdbd."""


@report.command("usage")
@click.option("--since", default=None, metavar="DATE", help="Start of the period [default: 7 days ago].")
@click.option("--until", default=None, metavar="DATE", help="End of the period [default: now].")
@click.option("--by", "by", type=click.Choice(["user", "account", "partition", "node"]), default="user",
              show_default=True, help="Group the figures by.")
@click.option("--gpus", "gpus", type=click.FloatRange(0), default=None,
              help="GPUs the cluster offers [default: from sinfo; MIG slices by their fraction].")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def usage_cmd(since: str | None, until: str | None, by: str, gpus: float | None, as_json: bool) -> None:
    """Job efficiency and cluster utilisation over a period, GPU-hours held idle."""
    from ..acct import report as rep
    from ..errors import UsageError
    from ..runner import run
    s = _settings()
    now = time.time()
    t1, until_s = _when(until, now, "--until")
    t0, since_s = _when(since, t1 - 7 * 86400, "--since")
    if t0 >= t1:
        raise UsageError("--since must be before --until", "--since")
    rows = rep.fetch_period(s.sacct, since_s, until_s)
    if gpus is None:
        res = run(["sinfo", "-h", "-N", "-o", "%N %G"], 15, check=False)
        gpus = rep.capacity_gpus(res.stdout) if res.returncode == 0 else 0.0
    view = rep.usage_view(rep.usage(rows, t0, t1, by), t0, t1, gpus, by)
    click.echo(json.dumps(view, indent=2) if as_json else rep.format_usage(view))


def local_parts(jobid: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """This node's live aggregates and unstored summary of *jobid* (None when there are none or
    accounting is not set up here)."""
    from ..acct import aggregate, settings
    from ..acct.store import Store
    from ..errors import SlurmGpuError
    from ..hw import live
    try:
        s = settings.load()
        if not s.enabled:
            return None, None
        store = Store(settings.acct_dir(s, live.settings().state_dir))
        node = live.node_name()
        agg = store.read("agg", jobid)
        reg = store.read("jobs", jobid)
        pend = store.read("pending", jobid)
    except (SlurmGpuError, OSError):
        return None, None
    live_part = None
    if agg and agg.get("devices"):
        part = aggregate.summary(node, agg["devices"], s.interval, 1 << 20)
        part["held"] = (reg or {}).get("devices", [])
        live_part = {node: part}
    return live_part, ({pend["node"]: pend["part"]} if pend else None)


def job_report(jobid: str, as_json: bool) -> None:
    from ..acct import report as rep
    from ..errors import SlurmGpuError, UsageError
    if not (jobid.isdigit() and len(jobid) <= 12):
        raise UsageError(f"bad job id {jobid!r}", "JOBID")
    s = _settings()
    live_part, pend = local_parts(jobid)
    try:
        row = rep.fetch_job(s.sacct, jobid)
    except SlurmGpuError:
        if not (live_part or pend):
            raise
        row = None
    if row is None and not (live_part or pend):
        raise SlurmGpuError(f"job {jobid} is unknown to slurmdbd", "sacct")
    view = rep.job_view(row, jobid, live_part, pend)
    click.echo(json.dumps(view, indent=2) if as_json else rep.format_job(view))
