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


def _period(since: str | None, until: str | None) -> tuple[float, float, str, str]:
    """``--since``/``--until`` (default: the last 7 days) as times and as sacct's text."""
    from ..errors import UsageError
    t1, until_s = _when(until, time.time(), "--until")
    t0, since_s = _when(since, t1 - 7 * 86400, "--since")
    if t0 >= t1:
        raise UsageError("--since must be before --until", "--since")
    return t0, t1, since_s, until_s


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
    from ..runner import run
    from ..slurmclient import command
    s = _settings()
    t0, t1, since_s, until_s = _period(since, until)
    rows = rep.fetch_period(s.sacct, since_s, until_s)
    if gpus is None:
        res = run([command("sinfo"), "-h", "-N", "-o", "%N %G"], 15, check=False)
        gpus = rep.capacity_gpus(res.stdout) if res.returncode == 0 else 0.0
    view = rep.usage_view(rep.usage(rows, t0, t1, by), t0, t1, gpus, by)
    click.echo(json.dumps(view, indent=2) if as_json else rep.format_usage(view))


@report.command("placement")
@click.option("--since", default=None, metavar="DATE", help="Jobs that ended since [default: 7 days ago].")
@click.option("--until", default=None, metavar="DATE", help="... and before [default: now].")
@click.option("--topology", "topo_path", default=None, metavar="FILE",
              help="The deployed topology.conf or topology.yaml [default: beside slurm.conf].")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def placement_cmd(since: str | None, until: str | None, topo_path: str | None, as_json: bool) -> None:
    """Did topology help?  Finished multi-node jobs: the leaf switches or blocks
    each spanned against the fewest possible; free nodes per domain now."""
    import os

    from ..cluster import placement
    from ..confgen import hostlist, topocheck
    from ..errors import InputError, SlurmGpuError
    from ..runner import run
    from ..slurmclient import command
    s = _settings()
    _, _, since_s, until_s = _period(since, until)
    if topo_path is None:
        base = os.path.dirname(os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
        yml = os.path.join(base, "topology.yaml")
        topo_path = yml if os.path.exists(yml) else os.path.join(base, "topology.conf")
    try:
        with open(topo_path, encoding="utf-8", errors="replace") as f:
            text = f.read(16 << 20)
    except OSError as e:
        raise InputError(f"cannot read the topology file: {e.strerror}", topo_path) from None
    yaml_file = topo_path.endswith((".yaml", ".yml"))
    meaning = topocheck.parse_yaml(text, topo_path) if yaml_file else topocheck.parse_conf(
        text.splitlines(True), topo_path)
    kind, doms = placement.domains(meaning)
    if not doms:
        raise InputError("no leaf switch and no block with nodes", topo_path)
    # sacct's -P lines: JobID|NNodes|NodeList (no field can hold a '|').
    res = run([s.sacct, "-n", "-P", "-X", "-a", "-S", since_s, "-E", until_s,
               "-s", "CD,F,TO,CA,NF,OOM,PR", "-o", "JobID,NNodes,NodeList"], s.dbd_timeout * 3, check=False)
    if res.returncode != 0:
        raise SlurmGpuError(f"sacct failed: {(res.stderr or res.stdout).strip()[:200]}", "sacct")
    jobs = []
    for line in res.stdout.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[1].isdigit() or int(parts[1]) < 2 or not parts[2] or "None" in parts[2]:
            continue
        try:
            jobs.append((parts[0], hostlist.expand(parts[2], "sacct NodeList")))
        except InputError:
            continue
    summary = placement.summarize(kind, doms, jobs)
    states: dict[str, str] = {}
    sres = run([command("sinfo"), "-h", "-N", "-o", "%N %t"], 15, check=False)
    if sres.returncode == 0:
        for line in sres.stdout.splitlines():
            w = line.split()
            if len(w) == 2:
                states.setdefault(w[0], w[1])
    v = placement.view(summary, placement.free_now(doms, states, kind))
    click.echo(json.dumps(v, indent=2) if as_json else placement.format_view(v), nl=as_json)


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
