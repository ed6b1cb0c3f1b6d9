"""The body of ``slurm-gpu health``, free of click.

:mod:`slurm_gpu.commands.health` is its click front end; :mod:`slurm_gpu.fastcli`
runs it without click for the plain argvs Slurm's HealthCheckProgram uses.
"""
from __future__ import annotations

import os
from typing import Any

from ..echo import echo


def _settings() -> Any:
    from .. import config
    from ..health.settings import HealthSettings
    return config.section(HealthSettings, "health")


def _repair_settings() -> Any:
    from .. import config
    from ..errors import InputError
    from ..health.settings import RepairSettings
    try:
        return config.section(RepairSettings, "repair")
    except ValueError as e:
        raise InputError(f"bad [repair] setting: {e}", str(config.config_path() or "config")) from None


def _job_gpus(state_dir: str) -> Any:
    """Which job holds which GPU, read only when the repair ladder asks."""
    def read() -> dict[str, str]:
        from ..jobs.state import gpus_held
        return gpus_held(state_dir)
    return read


def _untrusted_dir(path: str) -> str | None:
    """The job state's trust rule (jobs/trust.py), for the check's state_dir."""
    from ..jobs.trust import untrusted_ancestor
    return untrusted_ancestor(path)


def _state_dir(s: Any) -> str:
    from ..hw import live
    if s.state_dir:
        return s.state_dir.replace("%n", live.node_name())
    return live.settings().state_dir


def _slurmd_run_lock(state_dir: str, node: str) -> int | None:
    """Take this node's slurmd-run lock: its fd (-1 when there is no lock to
    take), or None when another slurmd-started run holds it.

    slurmd starts HealthCheckProgram every HealthCheckInterval, each in its
    own RPC thread, whether or not its last run finished: on a node where a
    run outlasts the interval (a slow NVML, a loaded or emulated CPU) the
    runs pile up, each paying for its start and its Slurm queries, and the
    node gets slower still.  The acting part has its own lock (engine); this
    one lets the late run leave before it costs anything.

    A lock file a user planted (a link, not root's, writable by others) is
    InputError (:func:`slurm_gpu.health.statefiles.open_lock`)."""
    import fcntl

    from ..health.statefiles import open_lock, slurmd_run_lock_file
    try:
        os.makedirs(state_dir, mode=0o755, exist_ok=True)
        fd = open_lock(slurmd_run_lock_file(state_dir, node))
    except OSError:
        return -1           # no lock to take: run (the engine's lock still guards the state)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


_SNAPSHOTS: dict[str, Any] = {}


def _read_snapshot(path: str) -> Any:
    """Parse a snapshot once per run (the model and the replay both need it)."""
    if path not in _SNAPSHOTS:
        from ..hw import snapshot as snap
        _SNAPSHOTS[path] = snap.read_snapshot(path)
    return _SNAPSHOTS[path]


def model_links(snapshot: str | None) -> dict[str, int] | None:
    """bus id -> NVLink count in the snapshot's derived (healthy) model, for gpu.nvlink."""
    from ..hw import live
    if snapshot is None:
        ns = live.settings()
        if ns.nvml_plugin or not ns.snapshot:
            return None
        snapshot = ns.snapshot
    node = _read_snapshot(snapshot).get("node") or {}
    return {g["pci_bus_id"]: sum(l["links"] for l in g.get("nvlinks", ())) for g in node.get("gpus", ())} or None


def _opener(snapshot: str | None, overlay: str | None, s: Any) -> Any:
    """Opens the GPUs this node uses (replay, simulator or the driver) when called."""
    from ..hw import backend, live
    ov_path = overlay or (s.nvml_overlay.replace("%n", live.node_name()) if s.nvml_overlay else None)
    source = backend.source_for(live.settings() if snapshot is None else None, snapshot=snapshot,
                                overlay_path=ov_path)

    def open_gpus() -> Any:
        if source.scheme == "snapshot":   # parsed once per run: the model and the replay both need it
            return backend.open_gpus(source.replace(data=_read_snapshot(source.path)))
        return backend.open_gpus(source)
    return open_gpus


def run_health(as_json: bool = False, slurm_mode: bool = False, no_drain: bool = False,
               only: str | None = None, kernel_log: str | None = None, prom_file: str | None = None,
               node: str | None = None, snapshot: str | None = None, overlay: str | None = None,
               gres_conf: str | None = None, isolate_bad_gpu: bool | None = None,
               debug: bool = False) -> int:
    """Check this GPU node; drain it on a hardware fault, resume it when clean.

    Exit codes follow Nagios: 0 ok, 1 warn, 2 drain, 3 unknown (with --slurm:
    0 unless the check itself broke; 75 for a run not started by slurmd that
    found slurmd's run holding the node).
    """
    from ..errors import SlurmGpuError
    from ..health.findings import EXIT_SKIPPED, EXIT_UNKNOWN
    from ..hw import live
    s = _settings()
    name = node or live.node_name()
    try:
        lock = _slurmd_run_lock(_state_dir(s), name) if slurm_mode and not no_drain else -1
    except SlurmGpuError as e:
        echo(f"slurm-gpu: health check incomplete: {e}", err=True)
        return EXIT_UNKNOWN
    if lock is None:
        echo(f"slurm-gpu: health {name}: skipped: this node's previous run, started by slurmd, "
             "is still running")
        from ..procfs import parent_slurmd
        # slurmd's own run: 0, as Slurm's contract asks.  Anyone else
        # (xid-watch's run) is told apart, to try again shortly.
        return 0 if parent_slurmd() else EXIT_SKIPPED
    try:
        rc, verdict = _run_health(s, name, as_json, slurm_mode, no_drain, only, kernel_log, prom_file,
                                  snapshot, overlay, gres_conf, isolate_bad_gpu, debug)
    finally:
        if lock >= 0:
            os.close(lock)
    if slurm_mode and verdict:
        # After the lock is released: a slow teardown of a stale job must not
        # hold off the run xid-watch starts for a fault.
        _sweep_stale_jobs()
    return rc


def _run_health(s: Any, name: str, as_json: bool, slurm_mode: bool, no_drain: bool, only: str | None,
                kernel_log: str | None, prom_file: str | None, snapshot: str | None,
                overlay: str | None, gres_conf: str | None, isolate_bad_gpu: bool | None,
                debug: bool) -> tuple[int, bool]:
    """The exit code, and whether the run came to a verdict (the stale-job sweep follows it)."""
    import json as _json
    from ..health import engine
    from ..health.findings import EXIT_UNKNOWN, exit_code
    from ..hw import live
    if isolate_bad_gpu is not None:
        s.isolate_bad_gpu = isolate_bad_gpu
    healthy = None
    if slurm_mode:
        from ..slurmclient import health_check_timeout, read_conf
        # Slurm >= 26.05 kills us after HealthCheckTimeout (60 s before, and by
        # default): the watchdog must fire first, with time to spare.
        limit = health_check_timeout(read_conf())
        if limit is not None and s.watchdog_seconds > 0:
            s.watchdog_seconds = min(s.watchdog_seconds, max(1.0, limit * 0.75))
        healthy = os.environ.get("SLURM_NODE_IS_HEALTHY")
        healthy = healthy if healthy in ("yes", "no") else None
    only_list = [c.strip() for c in only.split(",") if c.strip()] if only else None
    checks = engine.select_checks(only_list, s)
    opener = None
    from ..health.registry import NVML, needs
    if needs(checks, NVML):
        opener = _opener(snapshot, overlay, s)
    opts = engine.Options(
        node=name, settings=s, state_dir=_state_dir(s), only=only_list, kernel_log=kernel_log,
        no_drain=no_drain, slurm_mode=slurm_mode, nvml_opener=opener,
        gres_conf=gres_conf, parent_slurmd=engine.parent_slurmd() if slurm_mode else None,
        expected_links=model_links(snapshot) if "gpu.nvlink" in checks else None,
        repair=_repair_settings(), job_gpus=_job_gpus(live.settings().state_dir),
        slurm_healthy=healthy, untrusted_dir=_untrusted_dir)
    from ..errors import SlurmGpuError
    try:
        rep = engine.run(opts)
        if prom_file:
            from ..health.prom import write_prom
            write_prom(prom_file, rep)
    except SlurmGpuError as e:
        if not slurm_mode:
            raise           # bad input on the command line: the house line and exit 1
        # HealthCheckProgram: the check itself broke (a configured source is
        # unreadable): Nagios unknown, and nothing was drained or resumed.
        echo(f"slurm-gpu: health check incomplete: {e}", err=True)
        return EXIT_UNKNOWN, False
    except Exception as e:  # noqa: BLE001 - a bug in a check is "unknown", never a drain
        if debug:
            raise           # --debug: cli.py prints the traceback
        echo(f"slurm-gpu: health check broke: {type(e).__name__}: {e} "
             "(run with --debug for a traceback)", err=True)
        return EXIT_UNKNOWN, False
    _publish(name, snapshot)
    if as_json:
        echo(_json.dumps(rep.to_json(), indent=1))
    else:
        echo(f"slurm-gpu: health {rep.node}: {rep.status}"
             + (f" (action: {rep.action})" if rep.action != "none" else ""))
        for f in rep.findings:
            echo(f"  {f.severity:5} {f.check}" + (f" [{f.gpu}]" if f.gpu else "") + f": {f.message}")
        for n in rep.notes:
            echo(f"  note: {n}", err=True)
    if rep.broken:
        echo(f"slurm-gpu: health check incomplete: {rep.broken}", err=True)
        return EXIT_UNKNOWN, True
    if slurm_mode:
        return 0, True
    return exit_code(rep.status), True


# The verdict is given (drain or resume done) before the model is published;
# a publish_dir on a hung NFS server must not hold the report and the next
# interval's run until Slurm kills us.  Publishing takes milliseconds.
PUBLISH_SECONDS = 5.0


def _publish(name: str, snapshot: str | None) -> None:
    """``[cluster] publish_dir``: publish this node's model when it changed (docs/cluster.md).

    A shared directory that cannot be written is a note, never a health
    finding: the node is fine, the collector is not.  One that does not
    answer within PUBLISH_SECONDS is left behind (a daemon thread, ended
    with the process; the half-written file is a dot-file that collectors
    skip) with a note.
    """
    from .. import config
    if not (config.load_raw().get("cluster") or {}).get("publish_dir"):
        return
    import threading
    notes: list[str] = []
    t = threading.Thread(target=lambda: notes.append(_publish_now(name, snapshot) or ""),
                         name="slurm-gpu-publish", daemon=True)
    t.start()
    t.join(PUBLISH_SECONDS)
    note = notes[0] if notes else (f"model not published: [cluster] publish_dir did not answer "
                                   f"in {PUBLISH_SECONDS:g} s (a hung file system?)")
    if note:
        echo(f"slurm-gpu: note: {note}", err=True)


def _publish_now(name: str, snapshot: str | None) -> str | None:
    from ..cluster.modelfile import publish_from_health
    from ..errors import SlurmGpuError
    from ..hw import live
    path = snapshot or (None if live.settings().nvml_plugin else live.settings().snapshot or None)
    try:
        model = None
        if path:  # the replayed snapshot's derived model, already parsed for this run
            model = _read_snapshot(path).get("node")
            if not isinstance(model, dict):
                from ..hw import Snapshot, load_node
                model = load_node(Snapshot(path)).to_dict()
        return publish_from_health(name, model, _state_dir(_settings()))
    except SlurmGpuError as e:
        return f"model not published: {e}"
    except Exception as e:  # noqa: BLE001 - in the thread: never a traceback, never the verdict's business
        return f"model not published: {type(e).__name__}: {e}"


def _node() -> str:
    from ..hw import live
    return live.node_name()


def _sweep_stale_jobs() -> None:
    """Clean up what failed epilogs left for jobs Slurm no longer runs here (docs/mps-mig.md).

    The prolog does the same; this run catches it on a node no new
    ``--gpu-mps``/``--gpu-mig`` job comes to.  A clean node pays one listdir.
    """
    from ..hw import live
    from ..jobs import state as jobstate
    try:
        if not jobstate.list_jobs(live.settings().state_dir):
            return
        from ..jobs import lifecycle, sweep
        for line in sweep.sweep(lifecycle.default_context({}), lifecycle.teardown):
            echo(line, err=True)
    except Exception as e:  # noqa: BLE001 - never the health verdict's business
        echo(f"slurm-gpu: stale job sweep skipped: {type(e).__name__}: {e}", err=True)
