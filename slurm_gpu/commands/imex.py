"""``slurm-gpu imex status``: the job's IMEX domain, its nodes and each node's state."""
from __future__ import annotations

import json
import os
from typing import Any

import click


@click.group()
def imex() -> None:
    """Per-job IMEX domains (docs/imex.md)."""


def status_of(base_dir: str, ctl: str, jobid: str) -> dict[str, Any]:
    """The job's domain as this node's daemon sees it: plain data for text and --json."""
    from ..errors import SlurmGpuError
    from ..imex import daemon, domain, job
    st = job.load(base_dir, jobid)
    if st is None:
        raise SlurmGpuError(f"job {jobid} has no IMEX domain on this node", base_dir)
    out: dict[str, Any] = {"job": jobid, "node": st.get("node"), "phase": st.get("phase"),
                           "domain": st.get("domain"), "port": st.get("port"),
                           "error": st.get("error"), "status": None, "nodes": [], "ready": False}
    names: list[str] = st.get("nodes") or []
    addrs: list[str] = st.get("addresses") or []
    if st.get("config") and st.get("phase") == "ready":
        status, nodes = daemon.domain_status(ctl, st["config"])
        out["status"] = status
        by_index = {n["index"]: n["status"] for n in nodes}
        out["nodes"] = [{"name": n, "address": addrs[i] if i < len(addrs) else "",
                         "state": by_index.get(str(i), "UNAVAILABLE")} for i, n in enumerate(names)]
        out["ready"] = domain.domain_up(status, nodes, len(names))
    return out


@imex.command("status")
@click.option("--job", "jobid", default=None, metavar="JOBID",
              help="The job (default: $SLURM_JOB_ID, as inside a job).")
@click.option("--json", "as_json", is_flag=True, help="Print the domain as JSON.")
def status(jobid: str | None, as_json: bool) -> None:
    """Show the job's IMEX domain on this node: its nodes and each one's state.

    Exit status 0 when the domain is UP and every node READY, 1 otherwise."""
    from ..errors import InputError, UsageError
    from ..imex.settings import load
    from ..jobs.state import check_jobid
    raw = jobid or os.environ.get("SLURM_JOB_ID") or ""
    if not raw:
        raise UsageError("no job: run it inside a job, or give --job JOBID", "imex status")
    try:
        jobid = check_jobid(raw)
    except InputError:
        raise UsageError(f"bad job id {raw[:40]!r}", "--job") from None
    s = load()
    out = status_of(s.base_dir, s.ctl, jobid)
    if as_json:
        click.echo(json.dumps(out, indent=2, sort_keys=True))
    else:
        click.echo(f"job {jobid}  node {out['node']}  IMEX domain {out['domain'] or '-'}  "
                   f"port {out['port'] or '-'}  status {out['status'] or out['phase']}")
        if out["error"]:
            click.echo(f"  {out['error']}")
        for n in out["nodes"]:
            click.echo(f"  {n['name']:<16} {n['address']:<16} {n['state']}")
    if not out["ready"]:
        click.get_current_context().exit(1)
