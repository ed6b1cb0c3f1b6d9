"""``[health]`` settings (``slurm_gpu.config.section(HealthSettings, "health")``).

:class:`slurm_gpu.config.Settings`, not dataclasses: the epilog reads
``[repair]`` and ``[health]`` and imports no dataclasses (~5 ms a job)."""
from __future__ import annotations

from ..config import Settings


class HealthSettings(Settings):
    """``[health]``: what the health check reads, how long it may take and which checks run."""

    # Kernel log: "/dev/kmsg", or a file written by syslog/dmesg ("%n" = Slurm node name).
    kernel_log: str = "/dev/kmsg"
    # Where xid-watch appends NVML events ("" = <state_dir>/xid-events.jsonl).
    events_file: str = ""
    # xid-watch runs the health check at once on a drain-class NVML event or
    # kernel line, instead of leaving it to the next HealthCheckInterval.
    event_drain: bool = True
    # Runtime state (drain bookkeeping, cursors); "" = [node] state_dir.
    state_dir: str = ""
    # Resume a node we drained only after this many clean runs in a row.
    clean_runs_to_resume: int = 3
    # Watchdog for the whole run, and for each NVML call (seconds).
    watchdog_seconds: float = 20.0
    nvml_call_timeout: float = 5.0
    scontrol_timeout: float = 10.0
    # Checks to skip, e.g. ["gpu.pcie", "os.governor"].
    skip: list = None  # type: ignore[assignment]
    # Retired pages (pre-Ampere) that count as "replace the GPU".
    retired_pages_max: int = 60
    # gres.conf to compare against ("" = gres.conf beside $SLURM_CONF, else /etc/slurm/gres.conf).
    gres_conf: str = ""
    # OS audit (warnings only).
    os_thp: bool = True
    os_thp_expected: str = "madvise"        # "always", "madvise" or "never"
    os_swappiness: bool = True
    os_swappiness_max: int = 10
    os_governor: bool = True
    os_governor_expected: str = "performance"
    os_memlock: bool = True
    os_persistenced: bool = True
    # Fault overlay applied when NVML is replayed from [node] snapshot (fire drills, tests).
    nvml_overlay: str = ""
    # Rewrite gres.conf without a bad GPU instead of draining the node (see docs/health.md).
    isolate_bad_gpu: bool = False
    # gpu.dcgm: dcgmi diag -r <level> -j in every run (0: off; only level 1 fits a
    # HealthCheckProgram run; 2 and 3 wait for an idle node) and the most seconds it may take.
    dcgm_level: int = 0
    dcgm_timeout: float = 60.0
    # A fatal fault on a GPU a running job holds (docs/health.md, "Jobs on a dead GPU"):
    # "requeue" those jobs (cancel the ones that cannot be requeued), "cancel" them, or "none".
    on_fatal: str = "requeue"
    # Health events out (docs/health.md, "Health events"): one JSON line per finding, drain,
    # resume, job action and repair step, in a size-rotated file (%n: node name; "" =
    # <[repair] state_dir>/health-events.<node>.jsonl, which outlives reboots; "off": none).
    event_log: str = ""
    event_log_max_bytes: int = 10_000_000
    event_log_keep: int = 3
    # An admin's command (argv, no shell) run with a run's events on stdin, at most
    # event_command_timeout seconds; its failures are counted, never the health check's.
    event_command: list = None  # type: ignore[assignment]
    event_command_timeout: float = 5.0

    def __post_init__(self) -> None:
        if self.skip is None:
            self.skip = []
        if self.event_command is None:
            self.event_command = []
        if not all(isinstance(a, str) for a in self.event_command):
            raise ValueError("event_command must be a list of strings (argv: no shell)")
        if self.on_fatal not in ("requeue", "cancel", "none"):
            raise ValueError('on_fatal must be "requeue", "cancel" or "none"')


class RepairSettings(Settings):
    """``[repair]``: the steps after a drain (docs/health.md, "Repair ladder").

    Every step is off by default: the health check drains, an admin decides.
    Failures are counted either way, so turning RMA on later sees the history.
    """

    # 1. reset an idle GPU (nvidia-smi -r) when its fault's resolution allows it.
    reset: bool = False
    # 2. reboot through Slurm (scontrol reboot ASAP nextstate=RESUME) when a
    #    reset is impossible, off, or did not help.
    reboot: bool = False
    # 3. drain with "slurm-gpu: rma: ..." (never resumed automatically) after
    #    rma_failures failures of the same GPU within rma_window_hours.
    rma: bool = False
    rma_failures: int = 3
    rma_window_hours: float = 168.0
    # Catalog resolution buckets whose faults the ladder repairs (others: drain only).
    buckets: list = None  # type: ignore[assignment]
    # Seconds nvidia-smi -r may take.
    reset_timeout: float = 60.0
    # Persistent across reboots (not /run): failure counts, open repairs, the step log.
    state_dir: str = "/var/lib/slurm-gpu"
    # The epilog drains a node whose job left processes or memory on its GPUs
    # (user-problem) and the health check resumes it once clean.  Off by default:
    # it starts Python in the epilog of every GPU job (bench/bench_prolog.py).
    user_problem: bool = False
    # Before resuming a node drained for a fault, dcgmi diag -r <level> must pass (0: no gate).
    dcgm_gate: int = 0

    def __post_init__(self) -> None:
        if self.buckets is None:
            self.buckets = ["RESET_GPU", "RESTART_BM", "WORKFLOW_XID_48", "XID_154"]
        if self.rma_failures < 1:
            raise ValueError("rma_failures must be at least 1")
        if self.rma_window_hours <= 0:
            raise ValueError("rma_window_hours must be positive")
        if self.dcgm_gate not in (0, 1, 2, 3):
            raise ValueError("dcgm_gate must be 0 (off), 1, 2 or 3")
