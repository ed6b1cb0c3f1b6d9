"""``slurm-gpu doctor``: one node's Slurm setup against what slurm-gpu needs.

Each check returns :class:`Finding` objects (pure functions over what
:func:`gather` read once: slurm.conf, plugstack, the plugin file, the
running slurmd's version, processes).  Statuses follow Nagios: OK,
WARNING, CRITICAL, UNKNOWN; the worst one is the exit status.
"""
from __future__ import annotations

import os
import socket
import stat
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import slurmversion

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
NAMES = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}
PLUGIN_FILE = "slurm_gpu_spank.so"
MARKER = b"slurm-gpu-spank built-for-slurm="


@dataclass(frozen=True)
class Finding:
    status: int
    check: str       # dotted name, e.g. "spank.plugin"
    message: str

    def line(self) -> str:
        return f"{NAMES[self.status]} {self.check}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = NAMES[self.status]
        return d


@dataclass
class Facts:
    """What the checks look at, read once by :func:`gather` (tests build it by hand)."""

    slurm_conf_path: str
    conf: dict[str, str]                    # lower-case key -> value (last wins)
    conf_readable: bool
    slurmd_version: str | None              # "24.11.5"
    plugstack_lines: list[tuple[str, str]]  # (file, line) of every plugstack line
    plugin_built_for: dict[str, str | None] = field(default_factory=dict)  # so path -> version
    venv: str = sys.prefix
    venv_unreadable: str | None = None      # first path a job user cannot read
    gpus_present: bool = False
    persistenced: bool = False
    gres_drift: list[str] | None = None     # None: not checked
    gres_error: str | None = None
    # [mps]: enabled, the control binary's path and (uid, mode) when it
    # exists (None: missing); mps_error: the config could not be read
    mps_enabled: bool = True
    mps_control: str = ""
    mps_control_stat: tuple[int, int] | None = None
    mps_error: str | None = None


# -- reading ------------------------------------------------------------------
def parse_slurm_conf(text: str, base: Path) -> dict[str, str]:
    from .slurmconfig import parse
    return parse(text, base)


def plugstack_lines(path: Path, depth: int = 0) -> list[tuple[str, str]]:
    """Every plugin line of plugstack.conf, following ``include`` globs."""
    out: list[tuple[str, str]] = []
    try:
        text = path.read_text()
    except OSError:
        return out
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("include") and depth < 5:
            pattern = line.split(None, 1)[1].strip() if len(line.split(None, 1)) > 1 else ""
            base = Path("/") if pattern.startswith("/") else path.parent
            for p in sorted(base.glob(pattern.lstrip("/"))):
                out += plugstack_lines(p, depth + 1)
            continue
        out.append((str(path), line))
    return out


def plugin_built_for(so: str) -> str | None:
    """The Slurm version recorded in a built plugin (None: not ours, or too old to say)."""
    try:
        data = Path(so).read_bytes()
    except OSError:
        return None
    i = data.find(MARKER)
    if i < 0:
        return None
    end = data.find(b"\0", i)
    return data[i + len(MARKER):end].decode(errors="replace")


def first_unreadable(root: Path, limit: int = 200000) -> str | None:
    """The first file (or directory) under *root* a user who is not its owner cannot read."""
    n = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [dirpath, *(os.path.join(dirpath, f) for f in filenames)]:
            try:
                st = os.lstat(name)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                continue
            need = 0o005 if stat.S_ISDIR(st.st_mode) else 0o004
            if st.st_mode & need != need:
                return name
            n += 1
            if n > limit:
                return None
    return None


def _slurmd_version() -> str | None:
    from .runner import run
    from .errors import SlurmGpuError
    for exe in ("/usr/sbin/slurmd", "/usr/local/sbin/slurmd"):
        if os.access(exe, os.X_OK):
            try:
                return slurmversion.parse(run([exe, "-V"], timeout=10, check=False).stdout)
            except SlurmGpuError:
                return None
    return None


def _process_running(name: str) -> bool:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                    return True
            except OSError:
                continue
    return False


def gather(slurm_conf: str | None = None, node: str | None = None,
           gres_drift: Callable[[str, str], list[str]] | None = None) -> Facts:
    """Read everything the checks need, once."""
    path = slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    try:
        conf, readable = parse_slurm_conf(Path(path).read_text(), Path(path).parent), True
    except OSError:
        conf, readable = {}, False
    plugstack = Path(conf.get("plugstackconfig") or str(Path(path).parent / "plugstack.conf"))
    lines = plugstack_lines(plugstack)
    built = {}
    for _, line in lines:
        words = line.split()
        if len(words) >= 2 and words[1].endswith(PLUGIN_FILE):
            built[words[1]] = plugin_built_for(words[1])
    facts = Facts(path, conf, readable, _slurmd_version(), lines, built,
                  gpus_present=os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia"),
                  persistenced=_process_running("nvidia-persistenced"))
    facts.venv_unreadable = first_unreadable(Path(sys.prefix))
    _gather_mps(facts)
    gres = Path(path).parent / "gres.conf"
    if gres_drift is not None and gres.exists():
        name = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        try:
            facts.gres_drift = gres_drift(str(gres), name)
        except Exception as e:  # noqa: BLE001 - reported as a finding, not a crash
            facts.gres_error = getattr(e, "what", None) or f"{type(e).__name__}: {e}"
    return facts


def _gather_mps(facts: Facts) -> None:
    """``[mps] enabled`` and ``control`` from the config, and what is at that path."""
    try:
        from .jobs.settings import load
        mps = load()[1]
    except Exception as e:  # noqa: BLE001 - reported as a finding, not a crash
        facts.mps_error = getattr(e, "what", None) or f"{type(e).__name__}: {e}"
        return
    facts.mps_enabled, facts.mps_control = bool(mps.enabled), str(mps.control)
    try:
        st = os.stat(mps.control)       # followed: the prolog execs what a link names
        facts.mps_control_stat = (st.st_uid, st.st_mode)
    except OSError:
        facts.mps_control_stat = None


# -- checks (pure) ------------------------------------------------------------
def check_slurm(f: Facts) -> list[Finding]:
    out = []
    if not f.conf_readable:
        out.append(Finding(CRITICAL, "slurm.conf", f"cannot read {f.slurm_conf_path} "
                           "(--slurm-conf or SLURM_CONF)"))
    if f.slurmd_version is None:
        out.append(Finding(UNKNOWN, "slurm.version", "slurmd not found (/usr/sbin/slurmd -V)"))
    else:
        out.append(Finding(OK, "slurm.version", f"slurmd {f.slurmd_version}"))
    return out


def check_plugin(f: Facts) -> list[Finding]:
    ours = [(src, line) for src, line in f.plugstack_lines
            if len(line.split()) >= 2 and line.split()[1].endswith(PLUGIN_FILE)]
    if not ours:
        return [Finding(WARNING, "spank.plugstack", "no slurm_gpu_spank.so line in the plugstack "
                        "(--gpu-* options unavailable; slurm-gpu spank install)")]
    out: list[Finding] = []
    src, line = ours[0]
    words = line.split()
    if len(ours) > 1:
        out.append(Finding(CRITICAL, "spank.plugstack", f"slurm_gpu_spank.so listed {len(ours)} "
                           f"times ({src})"))
    if words[0] != "required":
        out.append(Finding(WARNING, "spank.plugstack", f"'{words[0]}' plugin: a failure to load it "
                           f"is ignored and the options silently vanish; use required ({src})"))
    from .errors import SlurmGpuError
    from . import joboptions as options
    try:
        options.parse_plugstack_args(words[2:])
        out.append(Finding(OK, "spank.plugstack", f"{' '.join(words)} ({src})"))
    except SlurmGpuError as e:
        out.append(Finding(CRITICAL, "spank.plugstack", f"{e.what} ({src})"))
    so = words[1]
    built = f.plugin_built_for.get(so)
    if not os.path.isfile(so):
        out.append(Finding(CRITICAL, "spank.plugin", f"{so} does not exist (slurm-gpu spank install)"))
    elif not os.path.isfile(os.path.join(os.path.dirname(so), "slurm_gpu_spank_py.so")):
        out.append(Finding(CRITICAL, "spank.plugin", f"slurm_gpu_spank_py.so missing beside {so}"))
    elif built is None:
        out.append(Finding(WARNING, "spank.plugin", f"{so} records no Slurm version (built by an "
                           "older slurm-gpu): rebuild it (slurm-gpu spank build)"))
    elif f.slurmd_version is None:
        out.append(Finding(UNKNOWN, "spank.plugin", f"built for Slurm {built}; slurmd not found "
                           f"to compare ({so})"))
    elif slurmversion.major_minor(built) != slurmversion.major_minor(f.slurmd_version):
        out.append(Finding(CRITICAL, "spank.plugin", f"built for Slurm {built} but slurmd is "
                           f"{f.slurmd_version}: Slurm will refuse it; rebuild it "
                           f"(slurm-gpu spank build) ({so})"))
    else:
        out.append(Finding(OK, "spank.plugin", f"built for Slurm {built}, slurmd is "
                           f"{f.slurmd_version} ({so})"))
    return out


def check_prolog(f: Facts) -> list[Finding]:
    out = []
    for key, name in (("prolog", "Prolog"), ("epilog", "Epilog")):
        v = f.conf.get(key, "")
        if not v:
            out.append(Finding(WARNING, f"slurm.{key}", f"{name} is not set: --gpu-mps and --gpu-mig "
                               f"jobs get no MPS daemon / MIG layout ({f.slurm_conf_path})"))
        else:
            out.append(Finding(OK, f"slurm.{key}", f"{name}={v}"))
    flags = [x.lower() for x in f.conf.get("prologflags", "").split(",") if x]
    if f.conf.get("prolog") and "alloc" not in flags:
        out.append(Finding(WARNING, "slurm.prologflags", "PrologFlags lacks Alloc: the prolog runs "
                           "at the first step, not at allocation, so a batch script starts "
                           "before its MPS daemon / MIG instances"))
    elif f.conf.get("prolog"):
        out.append(Finding(OK, "slurm.prologflags", f"PrologFlags={f.conf.get('prologflags')}"))
    return out


def check_health(f: Facts) -> list[Finding]:
    prog = f.conf.get("healthcheckprogram", "")
    if not prog:
        return [Finding(WARNING, "slurm.healthcheck", "HealthCheckProgram is not set: broken GPUs "
                        "are not drained (slurm-gpu health --slurm)")]
    out = [Finding(OK, "slurm.healthcheck", f"HealthCheckProgram={prog}")]
    try:
        interval = int(f.conf.get("healthcheckinterval", "0"))
    except ValueError:
        interval = 0
    if interval <= 0:
        out.append(Finding(WARNING, "slurm.healthcheck", "HealthCheckInterval is 0: the health "
                           "check runs only at slurmd start"))
    else:
        out.append(Finding(OK, "slurm.healthcheck", f"HealthCheckInterval={interval}"))
    states = {s.strip().upper() for s in f.conf.get("healthchecknodestate", "ANY").split(",")}
    if not states & {"ANY", "ALLOC", "MIXED", "CYCLE"} and states <= {"IDLE", "START_ONLY",
                                                                     "REBOOT_ONLY", "NONDRAINED_IDLE"}:
        out.append(Finding(WARNING, "slurm.healthcheck", f"HealthCheckNodeState="
                           f"{','.join(sorted(states))}: busy nodes are never checked, so a GPU "
                           "that fails under a job stays in service"))
    else:
        out.append(Finding(OK, "slurm.healthcheck", f"HealthCheckNodeState={','.join(sorted(states))}"))
    return out


def check_gres(f: Facts) -> list[Finding]:
    if f.gres_error:
        return [Finding(UNKNOWN, "gres.conf", f"cannot compare with the hardware: {f.gres_error}")]
    if f.gres_drift is None:
        return [Finding(UNKNOWN, "gres.conf", "no gres.conf beside slurm.conf to check")]
    if f.gres_drift:
        return [Finding(CRITICAL, "gres.conf", f"differs from the hardware: {f.gres_drift[0]}"
                        + (f" (and {len(f.gres_drift) - 1} more)" if len(f.gres_drift) > 1 else "")
                        + "; see slurm-gpu gres check")]
    return [Finding(OK, "gres.conf", "matches the hardware")]


def check_venv(f: Facts) -> list[Finding]:
    if f.venv_unreadable:
        return [Finding(CRITICAL, "venv", f"{f.venv_unreadable} is not readable by every user: the "
                        "SPANK plugin runs in job users' processes (chmod -R a+rX)")]
    return [Finding(OK, "venv", f"{f.venv} readable by every user")]


def check_persistenced(f: Facts) -> list[Finding]:
    if not f.gpus_present:
        return [Finding(OK, "nvidia.persistenced", "no NVIDIA driver on this node")]
    if not f.persistenced:
        return [Finding(WARNING, "nvidia.persistenced", "nvidia-persistenced is not running: every "
                        "job's first NVML/CUDA call re-initialises the GPUs (seconds), and the "
                        "health check pays it too")]
    return [Finding(OK, "nvidia.persistenced", "running")]


def check_mps_control(f: Facts) -> list[Finding]:
    """``[mps] control``: NVIDIA's ``nvidia-cuda-mps-control``, which every ``--gpu-mps``
    job on this node runs (as the job user); without it those jobs fail (issue 23 #5)."""
    name = "mps.control"
    if f.mps_error:
        return [Finding(UNKNOWN, name, f"[mps] not read: {f.mps_error}")]
    if not f.mps_enabled:
        return [Finding(OK, name, "--gpu-mps is off ([mps] enabled = false): such jobs fail "
                        "with one line")]
    if f.mps_control_stat is None:
        if not f.gpus_present:
            return [Finding(OK, name, f"{f.mps_control} missing; no NVIDIA driver on this node")]
        return [Finding(CRITICAL, name, f"{f.mps_control} does not exist: every --gpu-mps job "
                        "fails on this node (install NVIDIA's nvidia-cuda-mps package, or set "
                        "[mps] enabled = false)")]
    uid, mode = f.mps_control_stat
    if not stat.S_ISREG(mode) or not mode & 0o111:
        return [Finding(CRITICAL, name, f"{f.mps_control} is not an executable file: every "
                        "--gpu-mps job fails on this node")]
    if uid != 0 or mode & 0o022:
        return [Finding(CRITICAL, name, f"{f.mps_control} is not root's, or is writable by group "
                        "or others: whoever can change it runs code in every --gpu-mps job "
                        "(chown root; chmod go-w)")]
    return [Finding(OK, name, f"{f.mps_control} (root's, executable)")]


CHECKS = (check_slurm, check_plugin, check_prolog, check_health, check_gres, check_venv, check_persistenced,
          check_mps_control)


def run_checks(f: Facts) -> list[Finding]:
    return [x for c in CHECKS for x in c(f)]


def worst(findings: list[Finding]) -> int:
    """Nagios exit status: CRITICAL > WARNING > UNKNOWN > OK."""
    s = {x.status for x in findings}
    for want in (CRITICAL, WARNING, UNKNOWN):
        if want in s:
            return want
    return OK
