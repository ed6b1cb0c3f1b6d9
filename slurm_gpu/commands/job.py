"""``slurm-gpu job``: what a job has on this node (GPUs, binding, MPS, MIG)."""
from __future__ import annotations

import json

import click


@click.group()
def job() -> None:
    """Per-job GPU state on this node."""


def _jobid_arg(jobid: str) -> str:
    """JOBID as typed: a malformed one is a usage error (exit 2), as in `job report`."""
    from ..errors import InputError, UsageError
    from ..jobs import state as jobstate
    try:
        return jobstate.check_jobid(jobid)
    except InputError:
        raise UsageError(f"bad job id {jobid[:40]!r}", "JOBID") from None


def _state_dir() -> str:
    from ..hw import live
    return live.settings().state_dir


@job.command("show")
@click.argument("jobid")
@click.option("--json", "as_json", is_flag=True, help="Print the state file as JSON.")
def show(jobid: str, as_json: bool) -> None:
    """Show JOBID's GPUs, CPU binding, MPS daemon and MIG instances on this node."""
    import os

    from ..errors import SlurmGpuError
    from ..jobs import state as jobstate
    from ..jobs.mps import daemon_pids

    jobid = _jobid_arg(jobid)
    sd = _state_dir()
    st = jobstate.load(sd, jobid)
    if st is None:
        raise SlurmGpuError(f"job {jobid} has no GPU state on this node", sd)
    if as_json:
        click.echo(json.dumps(st.to_dict(), indent=2, sort_keys=True))
        return
    click.echo(f"job {st.jobid}  user {st.user or st.uid}  phase {st.phase}")
    if st.error:
        click.echo(f"  error: {st.error}")
    for g in st.gpus:
        cpus = ",".join(map(str, g.get("cpus") or [])) or "-"
        click.echo(f"  GPU {g['index']}  {g.get('name') or ''}  {g.get('uuid') or ''}  "
                   f"local CPUs {cpus}")
    m = st.mps
    if m:
        live_pids = daemon_pids(m["pipe_dir"]) if os.path.isdir(m["pipe_dir"]) else []
        click.echo(f"  MPS: {'ready' if m.get('ready') else 'starting'}  pipe {m['pipe_dir']}  "
                   f"log {m['log_dir']}  pids {','.join(map(str, live_pids)) or 'none'}  "
                   f"CPUs {m.get('cpus') or '-'}  active threads "
                   f"{m.get('percentage') or 'default'}")
        if m.get("hold"):
            click.echo(f"  MPS hold until the first step: {','.join(m['hold'] or [])}  GPU limit: "
                       f"{m.get('hold_devices') or 'none recorded'}")
    mig = st.mig
    if mig:
        click.echo(f"  MIG layout {mig['layout']} ({'ready' if mig.get('ready') else 'incomplete'})")
        for g in mig.get("gpus", []):
            for i in g.get("instances", []):
                click.echo(f"    GPU {g['index']}  {i.get('profile', '?'):<12} GI {i.get('gi_id')}  "
                           f"CI {i.get('ci_id')}  at {i.get('start')}:{i.get('size')}  "
                           f"{i.get('uuid') or ''}")


@job.command("list")
def list_cmd() -> None:
    """Job ids with GPU state on this node."""
    from ..jobs import state as jobstate
    for j in jobstate.list_jobs(_state_dir()):
        click.echo(j)


@job.command("cleanup")
@click.argument("jobid", required=False)
@click.option("--stale", is_flag=True,
              help="Clean up every job with state here that Slurm no longer runs here.")
@click.option("--force", is_flag=True,
              help="Clean up JOBID even if Slurm says it still runs here (or cannot say).")
def cleanup(jobid: str | None, stale: bool, force: bool) -> None:
    """Undo what JOBID's epilog should have: MPS daemon, MIG instances, compute mode, state.

    Refused while Slurm still runs JOBID on this node (its epilog owns it),
    unless --force.  Exit status 1 when something could not be removed.
    """
    from ..errors import SlurmGpuError, UsageError
    from ..jobs import lifecycle, sweep
    from ..slurmclient import sibling
    if stale == bool(jobid):
        raise UsageError("give either JOBID or --stale", "slurm-gpu job cleanup")
    if jobid:
        jobid = _jobid_arg(jobid)
    ctx = lifecycle.default_context({"SLURM_JOB_ID": jobid} if jobid else {})
    if stale:
        lines = sweep.sweep(ctx, lifecycle.teardown)
        for line in lines:
            click.echo(line)
        if not lines:
            click.echo("slurm-gpu: no stale job state on this node")
        if any("cleanup incomplete" in line for line in lines):
            raise SlurmGpuError("some stale job state could not be cleaned up", ctx.state_dir)
        return
    jobid = jobid or ""   # not --stale, so given (checked above)
    if not force:
        squeue = sibling(ctx.jobs.scancel, "squeue")
        if jobid not in sweep.gone([jobid], ctx.node_name, squeue):
            raise SlurmGpuError(f"job {jobid} still runs on {ctx.node_name} or Slurm cannot say; "
                                "its epilog cleans up (use --force to clean up now)", "squeue")
    notes = sweep.clean(ctx, jobid, lifecycle.teardown)
    for note in notes or ["nothing of slurm-gpu's left on this node"]:
        click.echo(f"slurm-gpu: job {jobid}: {note}")


@job.command("report")
@click.argument("jobid")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def report_cmd(jobid: str, as_json: bool) -> None:
    """What JOBID did with each GPU: utilisation, memory, energy, idle time, verdicts.

    Reads the summary stored in slurmdbd (works wherever sacct does); on the
    node of a running job, this node's live figures are merged in.
    """
    from .report import job_report
    job_report(jobid, as_json)
