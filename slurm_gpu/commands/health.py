"""``slurm-gpu health`` and ``slurm-gpu xid-watch``: thin click front ends.

The health check's body is :func:`slurm_gpu.commands.health_run.run_health`,
which :mod:`slurm_gpu.fastcli` also runs without click.
"""
from __future__ import annotations

import os

import click

from .health_run import (_job_gpus, _node, _opener, _publish, _read_snapshot,  # noqa: F401 - their old home
                         _repair_settings, _settings, _state_dir, _sweep_stale_jobs, model_links,
                         run_health)


@click.command("health")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON (a stable contract).")
@click.option("--slurm", "slurm_mode", is_flag=True,
              help="HealthCheckProgram mode: act, then exit 0 unless the check itself broke.")
@click.option("--no-drain", is_flag=True, help="Only report: never call scontrol, consume no events.")
@click.option("--only", "only", metavar="CHECK[,CHECK]", help="Run only these checks (e.g. gpu.xid).")
@click.option("--kernel-log", type=click.Path(dir_okay=False), metavar="FILE",
              help="Read XIDs from this kernel log file (whole file, no cursor) instead of [health] kernel_log.")
@click.option("--prom-file", type=click.Path(dir_okay=False), metavar="PATH",
              help="Also write Prometheus textfile metrics here (atomically).")
@click.option("--node", metavar="NAME", help="Slurm node name (default: $SLURMD_NODENAME or the host name).")
@click.option("--snapshot", type=click.Path(dir_okay=False), metavar="FILE",
              help="Read NVML from this snapshot instead of the live GPUs.")
@click.option("--overlay", type=click.Path(dir_okay=False), metavar="FILE",
              help="Fault overlay applied to the snapshot replay.")
@click.option("--gres-conf", type=click.Path(dir_okay=False), metavar="FILE",
              help="gres.conf to compare with (default: beside $SLURM_CONF).")
@click.option("--isolate-bad-gpu", is_flag=True, default=None,
              help="Rewrite gres.conf without a bad GPU and reconfigure, instead of draining (see docs).")
@click.option("--out", type=click.Path(dir_okay=False), metavar="FILE",
              help="With 'baseline record': the baseline file to write (default: [health] baseline).")
@click.argument("action", nargs=-1, metavar="[baseline record]")
def health(as_json: bool, slurm_mode: bool, no_drain: bool, only: str | None, kernel_log: str | None,
           prom_file: str | None, node: str | None, snapshot: str | None, overlay: str | None,
           gres_conf: str | None, isolate_bad_gpu: bool | None, out: str | None, action: tuple[str, ...]) -> int:
    """Check this GPU node; drain it on a hardware fault, resume it when clean.

    Exit codes follow Nagios: 0 ok, 1 warn, 2 drain, 3 unknown (with --slurm:
    0 unless the check itself broke; 75 when skipped outside slurmd).
    """
    if action:
        # `health baseline record`: this known-good node's fabric values
        # become its model's baseline (docs/health.md, "Fabric degradation").
        from ..errors import UsageError
        if action != ("baseline", "record"):
            raise UsageError(f"unknown action {' '.join(action)!r}; known: baseline record", "health")
        from .health_baseline import record
        return record(out, snapshot, overlay)
    if out:
        from ..errors import UsageError
        raise UsageError("--out goes with 'baseline record'", "health")
    ctx = click.get_current_context(silent=True)
    debug = bool(ctx is not None and (ctx.find_root().obj or {}).get("debug"))
    return run_health(as_json, slurm_mode, no_drain, only, kernel_log, prom_file, node, snapshot, overlay,
                      gres_conf, isolate_bad_gpu, debug=debug)


@click.command("xid-watch")
@click.option("--events-file", type=click.Path(dir_okay=False), metavar="PATH",
              help="Append events here (default: <state_dir>/xid-events.jsonl, where health reads them).")
@click.option("--snapshot", type=click.Path(dir_okay=False), metavar="FILE", help="Replay NVML from a snapshot.")
@click.option("--overlay", type=click.Path(dir_okay=False), metavar="FILE",
              help="Fault overlay (events) for the replay.")
@click.option("--max-events", type=int, default=0, help="Stop after this many events (0: run until stopped).")
@click.option("--timeout", "run_for", type=float, default=0.0, help="Stop after this many seconds (0: never).")
@click.option("--node", metavar="NAME", help="Slurm node name (default: $SLURMD_NODENAME or the host name).")
@click.option("--event-drain/--no-event-drain", default=None,
              help="Run the health check at once on a drain-class event or kernel line.  "
                   "[default: [health] event_drain; never with --snapshot or --events-file]")
def xid_watch(events_file: str | None, snapshot: str | None, overlay: str | None, max_events: int,
              run_for: float, node: str | None, event_drain: bool | None) -> int:
    """Listen for NVML events (critical XID, double-bit ECC, GPU unavailable, recovery action).

    Runs until stopped (SIGTERM), appending one JSON line per event where
    `slurm-gpu health` reads them, so events between two health checks are
    not lost.  A drain-class event, or a drain-class line in the node's
    kernel log, runs the health check at once (docs/health.md).
    """
    from .. import hostctx
    from ..health.watch import KernelFollower, health_trigger, watch
    if node:
        hostctx.node_name = node   # %n in the config names this node (several per host in a sandbox)
    s = _settings()
    path = events_file or (s.events_file.replace("%n", _node()) if s.events_file else
                           os.path.join(_state_dir(s), "xid-events.jsonl"))
    # Only when the events go where this node's health check reads them, from
    # this node's own GPUs: a replay or a side file is a drill, not the node.
    if event_drain is None:
        event_drain = bool(s.event_drain) and snapshot is None and events_file is None
    on_drain = kernel = None
    if event_drain:
        on_drain = health_trigger(_node(), timeout=float(s.watchdog_seconds) + 10.0)
        kernel = KernelFollower(s.kernel_log.replace("%n", _node()))
    n = watch(_opener(snapshot, overlay, s), path, max_events=max_events, run_for=run_for,
              on_drain=on_drain, kernel=kernel, skip=tuple(s.skip or ()))
    click.echo(f"slurm-gpu: xid-watch stopped after {n} events ({path})", err=True)
    return 0
