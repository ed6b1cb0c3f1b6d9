"""The job options slurm-gpu adds (`--gpu-*`) and the plugstack arguments: declared once, parsed here (pure).

Everything a user or an admin types is checked here, in srun/sbatch/salloc
(local and allocator context) before a job is submitted, and by
``slurm-gpu spank install`` before a plugstack line is written.  A bad value
raises :class:`~slurm_gpu.errors.UsageError` whose one line names the option.
"""
from __future__ import annotations

from .errors import SlurmGpuError, UsageError

# Imported by srun/sbatch and slurmstepd on every use of the plugin: keep the
# import graph to builtins (no dataclasses, typing or re at import time).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

class Declared:
    """One SPANK option, declared once.

    spank/build_plugin.py generates the C shim's option table and ``SG_OPT_*``
    ids from :data:`OPTIONS`; local.py hands the given ones to the prolog
    (``SPANK_<env>``) and raises the prolog gate for those with ``prolog``.
    """

    __slots__ = ("id", "name", "arginfo", "help", "has_arg", "env", "prolog")

    def __init__(self, id: int, name: str, arginfo: str, help: str, has_arg: int, env: str,
                 prolog: bool) -> None:
        self.id = id              # SG_OPT_<NAME> in C, the index of the option's value
        self.name = name          # --<name>
        self.arginfo = arginfo
        self.help = help
        self.has_arg = has_arg    # spank_option.has_arg: 1 required, 2 optional
        self.env = env            # tasks see <env>, prolog/epilog SPANK_<env>
        self.prolog = prolog      # the prolog has work for a job that gives it

    @property
    def c_name(self) -> str:
        """``SG_OPT_NUMA_BIND`` for ``gpu-numa-bind``."""
        return "SG_OPT_" + self.name.removeprefix("gpu-").replace("-", "_").upper()


NUMA_BIND, PROFILE, MPS, MIG = 0, 1, 2, 3
OPTIONS = (
    Declared(NUMA_BIND, "gpu-numa-bind", "strict|prefer|off[,verbose]",
             "[slurm-gpu] Bind each task's CPUs and memory to its GPU's NUMA node(s): "
             "strict (MPOL_BIND, fail if impossible), prefer (MPOL_PREFERRED, warn if "
             "impossible) or off; add ',verbose' to print the binding of each task.",
             1, "SLURM_GPU_NUMA_BIND", False),
    Declared(PROFILE, "gpu-profile", "training|inference|none",
             "[slurm-gpu] Per-task OS tuning for GPU work: inference turns transparent "
             "huge pages off, training keeps them; both raise the locked-memory limit "
             "for pinned host memory.",
             1, "SLURM_GPU_PROFILE", False),
    Declared(MPS, "gpu-mps", "PERCENT",
             "[slurm-gpu] Start a private CUDA MPS daemon for this job on each node, "
             "optionally with a default active-thread percentage (1-100).",
             2, "SLURM_GPU_MPS", True),
    Declared(MIG, "gpu-mig", "LAYOUT",
             "[slurm-gpu] Partition each of the job's whole GPUs into MIG instances, "
             "e.g. 3g.40gb,2g.20gb,2g.20gb; each task gets its own instance(s).",
             1, "SLURM_GPU_MIG", True),
)
OPTION_NAMES = {o.id: o.name for o in OPTIONS}
# spank_job_control_setenv names: prolog/epilog see SPANK_<name>; tasks see <name>.
ENV_NAMES = {o.id: o.env for o in OPTIONS}
# Set (to 1) for the prolog/epilog when the job gave an option with `prolog`:
# prolog.d's shell gate tests this one variable and starts Python only then.
PROLOG_GATE = "SLURM_GPU_PROLOG"

NUMA_MODES = ("strict", "prefer", "off")
PROFILES = ("training", "inference", "none")
MPS_DEFAULT = "default"
PLUGSTACK_KEYS = ("config", "numa_bind")


def prolog_env(name: str) -> str:
    """What the prolog/epilog calls job-control variable *name*."""
    return "SPANK_" + name


# One MIG device profile as nvidia-smi names it: [<c>c.]<g>g.<mem>gb[+me|+gfx|...]
_MIG_PROFILE = r"^(?:[1-7]c\.)?[1-7]g\.\d+gb(?:\+[a-z]+)*$"


class NumaBind:
    """A ``--gpu-numa-bind`` value: mode strict|prefer|off, and verbose."""

    __slots__ = ("mode", "verbose")

    def __init__(self, mode: str, verbose: bool = False) -> None:
        self.mode = mode
        self.verbose = verbose

    def value(self) -> str:
        return self.mode + (",verbose" if self.verbose else "")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NumaBind) and (self.mode, self.verbose) == (other.mode,
                                                                              other.verbose)

    def __repr__(self) -> str:
        return f"NumaBind({self.mode!r}, {self.verbose!r})"


def parse_numa_bind(value: str, default: NumaBind | None = None,
                    where: str = "--gpu-numa-bind") -> NumaBind:
    """``strict|prefer|off[,verbose]``; ``verbose`` alone keeps *default*'s mode."""
    tokens = [t.strip() for t in value.split(",")]
    modes = [t for t in tokens if t in NUMA_MODES]
    bad = [t for t in tokens if t not in NUMA_MODES and t != "verbose"]
    if bad or len(modes) > 1 or not tokens or (not modes and "verbose" not in tokens):
        raise UsageError(f"bad value {value!r} for {where}: expected strict, prefer or off, "
                         "optionally with ',verbose'")
    mode = modes[0] if modes else (default.mode if default else "off")
    return NumaBind(mode, "verbose" in tokens)


def parse_profile(value: str) -> str:
    """``training|inference|none``."""
    if value not in PROFILES:
        raise UsageError(f"bad value {value!r} for --gpu-profile: expected training, "
                         "inference or none")
    return value


def parse_mps(value: str | None) -> str:
    """A percentage 1-100, or ``default`` when the option had no value."""
    if value is None or value.strip().lower() == MPS_DEFAULT:
        return MPS_DEFAULT
    v = value.strip().rstrip("%")
    # isascii: str.isdigit() also takes '²', which int() refuses; and int()
    # refuses 4,300+ digits, so the length is checked first
    if not (v.isascii() and v.isdigit() and len(v) <= 3) or not 1 <= int(v) <= 100:
        raise UsageError(f"bad value {value!r} for --gpu-mps: expected an active-thread "
                         "percentage from 1 to 100, or no value")
    return str(int(v))


def parse_mig(value: str) -> str:
    """A MIG layout such as ``3g.40gb,2g.20gb,2g.20gb``, checked for syntax.

    The MIG planner of the mps/mig area (``slurm_gpu.mig.planner``) does the
    syntax check when installed (it also knows ``2x1g.10gb`` and per-GPU
    ``;`` groups); without it a plain comma list of profile names is
    accepted.  The GPU model is unknown at submit time, so whether the
    layout fits is decided by the prolog on the node.
    """
    parse = _mig_planner_parser()
    if parse is not None:
        try:
            parse(value)
        except SlurmGpuError as e:
            raise UsageError(f"bad value {value!r} for --gpu-mig: {e.what}") from None
        return value.strip()
    items = [p.strip() for p in value.split(",")]
    if not value.strip() or any(not p for p in items):
        raise UsageError(f"bad value {value!r} for --gpu-mig: expected a comma-separated "
                         "list of MIG profiles such as 3g.40gb,2g.20gb")
    import re
    for p in items:
        if not re.match(_MIG_PROFILE, p.lower()):
            raise UsageError(f"bad value {value!r} for --gpu-mig: {p!r} is not a MIG profile "
                             "name (like 1g.10gb, 3g.40gb or 1c.3g.40gb)")
    return ",".join(items)


def _mig_planner_parser() -> Callable[[str], object] | None:
    """The mps/mig area's layout parser, if that area is installed."""
    try:
        from .mig.planner import parse_layout
    except ImportError:
        return None
    return parse_layout


def c_canonical_values(which: int) -> tuple[str, ...]:
    """Values of option *which* the SPANK plugin's C half accepts without Python.

    Exactly the values :func:`validate_option` returns unchanged, and only
    for options the prolog has no work for: for those, srun, sbatch and
    salloc need nothing from Python but the check and the hand-over to the
    prolog (``spank_job_control_setenv`` of the same value), which C does.
    Any other value (to normalise, or refused with Python's one line) still
    goes through Python.  Saves an interpreter start in srun for every
    ``--gpu-numa-bind`` step.
    """
    opt = next(o for o in OPTIONS if o.id == which)
    if opt.prolog:
        return ()
    if which == NUMA_BIND:
        return tuple(m + v for m in NUMA_MODES for v in ("", ",verbose"))
    if which == PROFILE:
        return PROFILES
    return ()


def validate_option(which: int, value: str | None) -> str:
    """Check one option value; return its normalised form."""
    if which == NUMA_BIND:
        return parse_numa_bind(value or "").value()
    if which == PROFILE:
        return parse_profile(value or "")
    if which == MPS:
        return parse_mps(value)
    if which == MIG:
        return parse_mig(value or "")
    raise UsageError(f"unknown option id {which}")


class PluginArgs:
    """The ``key=value`` arguments of the plugstack.conf line."""

    __slots__ = ("config", "numa_bind")

    def __init__(self, config: str | None = None, numa_bind: NumaBind | None = None) -> None:
        self.config = config
        self.numa_bind = numa_bind or NumaBind("off")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PluginArgs) and (self.config, self.numa_bind) == (
            other.config, other.numa_bind)

    def __repr__(self) -> str:
        return f"PluginArgs({self.config!r}, {self.numa_bind!r})"


def parse_plugstack_args(args: list[str]) -> PluginArgs:
    """Parse plugstack arguments; unknown keys and bad values are errors."""
    seen: dict[str, str] = {}
    for a in args:
        key, eq, val = a.partition("=")
        if not eq or key not in PLUGSTACK_KEYS:
            raise UsageError(f"unknown plugstack argument {a!r} (known: config=PATH, "
                             "numa_bind=strict|prefer|off)")
        if key in seen:
            raise UsageError(f"plugstack argument {key} given twice")
        seen[key] = val
    numa = NumaBind("off")
    if "numa_bind" in seen:
        value = seen["numa_bind"]
        if not any(t in NUMA_MODES for t in value.split(",")):
            # the admin's default needs a mode (the C shim checks the same)
            raise UsageError(f"bad value {value!r} for plugstack numa_bind: expected strict, "
                             "prefer or off, optionally with ',verbose'")
        numa = parse_numa_bind(value, where="plugstack numa_bind")
    config = seen.get("config")
    if config is not None and not config.startswith("/"):
        raise UsageError(f"plugstack argument config={config} must be an absolute path")
    return PluginArgs(config=config, numa_bind=numa)


def effective_numa_bind(user_value: str | None, args: PluginArgs) -> NumaBind:
    """The user's --gpu-numa-bind over the admin's default."""
    if user_value is None:
        return args.numa_bind
    return parse_numa_bind(user_value, default=args.numa_bind)
