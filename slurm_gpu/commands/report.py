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
        from ..nodefacts import slurm_conf_path
        base = os.path.dirname(slurm_conf_path(os.environ))
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


# ------------------------------------------------------------- fault history

def _history_source(from_dir: str | None) -> tuple[str | None, str]:
    """(directory of ``<node>.jsonl`` files or None for this node's own log, how it was chosen)."""
    import os

    from .. import config
    if from_dir:
        sub = os.path.join(from_dir, "health-events")
        return (sub if os.path.isdir(sub) else from_dir), "--from"
    pub = (config.load_raw().get("cluster") or {}).get("publish_dir")
    if isinstance(pub, str) and pub and "%n" not in pub:
        return os.path.join(pub, "health-events"), "[cluster] publish_dir"
    return None, "this node's [health] event_log"


def _local_log(node: str) -> str | None:
    """This node's own event log, as the health check writes it (engine.event_log_path)."""
    from .. import config
    from ..health.engine import Options
    from ..health.events import log_path as event_log_path
    from ..health.settings import HealthSettings, RepairSettings
    from ..hw import live
    h = config.section(HealthSettings, "health")
    r = config.section(RepairSettings, "repair")
    return event_log_path(Options(node=node, settings=h, state_dir=h.state_dir or live.settings().state_dir,
                                  repair=r))


def _node_events(node: str, from_dir: str | None) -> tuple[list[dict[str, Any]], str]:
    import os

    from ..health import events, history
    directory, how = _history_source(from_dir)
    path = history.node_file(directory, node) if directory else _local_log(node)
    if not path or not any(os.path.exists(p) for p in [path, f"{path}.1"]):
        return [], path or how
    return events.read(path), path


def _known_to_slurm(node: str) -> bool | None:
    from ..health.jobctl import slurm_bin
    from ..runner import run
    try:
        res = run([slurm_bin("scontrol"), "show", "node", "-o", node], 15, check=False)
    except Exception:  # noqa: BLE001 - no Slurm here: cannot tell
        return None
    if res.returncode == 0:
        return True
    return False if "not found" in (res.stdout + res.stderr) else None


def _stamp(t: float | None) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S") if t else "-"


def _jobs_between(node: str, t0: float, t1: float) -> tuple[list[dict[str, str]], str | None]:
    """Jobs that ran on *node* between *t0* and *t1*, from slurmdbd (sacct): (jobs, error)."""
    from ..runner import run
    s = _settings()
    fields = ["JobID", "User", "Account", "Start", "End", "State", "AllocTRES"]
    try:
        res = run([s.sacct, "-n", "-P", "-X", "-a", "-N", node, "-S", _stamp(t0 - 1), "-E", _stamp(t1 + 1),
                   "-o", ",".join(fields)], s.dbd_timeout * 3, check=False)
    except Exception as e:  # noqa: BLE001 - accounting is optional here
        return [], f"sacct did not run ({e})"
    if res.returncode != 0:
        return [], f"sacct failed: {(res.stderr or res.stdout).strip()[:160]}"
    jobs = []
    for line in res.stdout.splitlines():
        parts = line.split("|")
        if len(parts) == len(fields) and parts[0]:
            jobs.append(dict(zip((f.lower() for f in fields), parts)))
    return jobs, None


@report.command("node")
@click.argument("node")
@click.option("--since", default=None, metavar="DATE", help="Only faults since [default: all the history kept].")
@click.option("--from", "from_dir", default=None, metavar="DIR",
              help="Read <DIR>/health-events/<node>.jsonl [default: [cluster] publish_dir, else this node's log].")
@click.option("--json", "as_json", is_flag=True, help="Print the history as JSON.")
def node_cmd(node: str, since: str | None, from_dir: str | None, as_json: bool) -> None:
    """A node's fault history: findings, drains, resumes, requeues and repairs, and the jobs
    that ran on it between each fault's first signal and its drain (from slurmdbd)."""
    from ..errors import UsageError
    from ..health import history
    t0 = _when(since, 0.0, "--since")[0] if since else None
    recs, where = _node_events(node, from_dir)
    if not recs and _known_to_slurm(node) is not True:
        raise UsageError(f"unknown node {node!r}: no health history and Slurm does not know it", where)
    eps = history.episodes(history.since(recs, t0))
    out = []
    for ep in eps:
        d = ep.to_json()
        if ep.drain is not None:
            d["jobs"], err = _jobs_between(node, ep.first_signal, ep.drain)
            if err:
                d["jobs_error"] = err
        out.append(d)
    view = {"node": node, "source": where, "since": t0, "events": len(history.since(recs, t0)), "episodes": out}
    if as_json:
        click.echo(json.dumps(view, indent=2))
        return
    click.echo(f"{node}: {len(out)} fault(s){' since ' + _stamp(t0) if t0 else ''} ({view['events']} events, "
               f"from {where})")
    for d in out:
        lead = (d["drain"] - d["first_signal"]) if d["drain"] else None
        click.echo(f"  {_stamp(d['drain'] or d['first_signal'])}  "
                   f"{'drained' if d['drain'] else 'not drained'}: {d['reason'] or ', '.join(d['checks'])}")
        click.echo(f"    first signal {_stamp(d['first_signal'])}"
                   + (f" ({lead:.1f} s before the drain)" if lead is not None else "")
                   + f"; {'resumed ' + _stamp(d['resume']) if d['resume'] else 'still drained'}")
        if d["gpus"]:
            xids = f"; Xid {', '.join(map(str, d['xids']))}" if d["xids"] else ""
            click.echo(f"    GPUs: {', '.join(d['gpus'])}{xids}")
        for st in d["steps"]:
            what = f"job {st['job']}" if st.get("job") else (st.get("gpu") or "")
            click.echo(f"    {_stamp(st['time'])}  {st['action']} {what}"
                       + (f": {st['result']}" if st.get("result") else ""))
        if "jobs" in d:
            if d.get("jobs_error"):
                click.echo(f"    jobs between first signal and drain: unknown ({d['jobs_error']})")
            else:
                click.echo(f"    jobs between first signal and drain: {len(d['jobs'])}")
                for j in d["jobs"]:
                    click.echo(f"      {j['jobid']}  {j['user']}  {j['start']} .. {j['end']}  {j['state']}")


@report.command("faults")
@click.option("--since", default=None, metavar="DATE", help="Only faults since [default: all the history kept].")
@click.option("--from", "from_dir", default=None, metavar="DIR",
              help="Read every <DIR>/health-events/<node>.jsonl [default: [cluster] publish_dir].")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def faults_cmd(since: str | None, from_dir: str | None, as_json: bool) -> None:
    """The cluster's faults: repeat offenders (nodes by drains), fault classes by count."""
    import os

    from ..errors import UsageError
    from ..health import events, history
    t0 = _when(since, 0.0, "--since")[0] if since else None
    directory, how = _history_source(from_dir)
    if directory is None or not os.path.isdir(directory):
        raise UsageError("no cluster history: set [cluster] publish_dir on the nodes, or give --from DIR",
                         directory or how)
    nodes, skipped = history.nodes_in(directory)
    if skipped:
        click.echo(f"slurm-gpu: note: skipped {len(skipped)} file(s) not named <node>.jsonl: "
                   f"{', '.join(repr(n) for n in skipped[:5])} ({directory})", err=True)
    by_node = {n: history.since(events.read(history.node_file(directory, n)), t0) for n in nodes}
    v = history.faults_summary(by_node)
    v["since"], v["source"] = t0, directory
    if as_json:
        click.echo(json.dumps(v, indent=2))
        return
    click.echo(f"{v['drains']} drain(s) on {v['nodes_drained']} of {v['nodes_with_history']} node(s) with a history"
               f"{' since ' + _stamp(t0) if t0 else ''}; {v['nodes_causing_half']} node(s) caused over half; "
               f"{v['jobs_requeued_or_cancelled']} job(s) requeued or cancelled")
    click.echo("repeat offenders:")
    for o in v["offenders"][:20]:
        click.echo(f"  {o['node']:<16} {o['drains']:>4}  {o['share'] * 100:5.1f} %  "
                   f"(cumulative {o['cumulative_share'] * 100:5.1f} %)")
    click.echo("fault classes:")
    for c in v["classes"]:
        click.echo(f"  {c['class']:<24} {c['drains']:>4}")
    if v["gpus"]:
        click.echo("GPUs drained more than once:")
        for g in v["gpus"]:
            click.echo(f"  {g['node']} {g['gpu']}  {g['drains']}")
