"""``slurm-gpu doctor``: one node's Slurm setup against what slurm-gpu needs.

Each check returns :class:`Finding` objects (pure functions over what
:func:`gather` read once: slurm.conf, plugstack, the plugin file, the
running slurmd's version, processes).  Statuses follow Nagios: OK,
WARNING, CRITICAL, UNKNOWN; the worst one is the exit status.
"""
from __future__ import annotations

import os
import re
import socket
import stat
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import slurmversion
from .slurminstall import MARKER, plugin_built_for  # noqa: F401 - doctor's names for them

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .doctor_cgroup import CgroupFacts

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
NAMES = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}
PLUGIN_FILE = "slurm_gpu_spank.so"


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
    # so path -> (the interpreter its inner half starts, the slurm-gpu that built it)
    plugin_runs: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    setup_failed: str | None = None         # the package's last venv setup that did not go live
    venv_writable: str | None = None        # first path of the venv someone but root can change
    gres_skipped: bool = False              # --no-gres: no finding at all
    configs: list[ConfigFile] | None = None  # None: not gathered (no finding)
    slurm_from: str = "slurmd"              # whose version slurmd_version is ("srun" on a login node)

    # [mps]: enabled, the control binary's path and (uid, mode) when it
    # exists (None: missing); mps_error: the config could not be read
    mps_enabled: bool = True
    mps_control: str = ""
    mps_control_stat: tuple[int, int] | None = None
    mps_error: str | None = None
    cgroup: "CgroupFacts | None" = None     # None: not gathered (login role, tests): no finding
    rebuild: str = "slurm-gpu spank build"  # the command that rebuilds the plugin here (:func:`rebuild_command`)
    imex: Any = None                        # slurm_gpu.imex.doctor.ImexFacts (None: not gathered)
    # [health] kernel_log: (path, "proven" | "unproven" | "empty" | "unknown", why): hw.kmsg.sender_proof
    kernel_log: tuple[str, str, str] | None = None
    # The package's systemd units: name -> `systemctl show` properties (None: not gathered)
    units: dict[str, dict[str, str]] | None = None
    # /etc/fuse.conf: (its path, whether it sets user_allow_other); None: no such file
    fuse_allow_other: tuple[str, bool] | None = None


@dataclass(frozen=True)
class ConfigFile:
    """One slurm-gpu config file a Slurm-run part of slurm-gpu reads (see :func:`gather_configs`)."""

    path: str
    named_by: str                  # "plugstack config=", "$SLURM_GPU_CONFIG", "the default lookup"
    exists: bool
    error: str | None = None       # why it does not load (None: it loads)
    unknown_sections: tuple[str, ...] = ()


# -- reading ------------------------------------------------------------------
def parse_slurm_conf(text: str, base: Path) -> dict[str, str]:
    from .slurmclient import parse_conf
    return parse_conf(text, str(base))


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


INNER_MARKER = b"slurm-gpu-spank-py python="
# an inner half built before it carried INNER_MARKER: its interpreter path, as compiled in
_OLD_PYTHON = re.compile(rb"(/[\x21-\x7e]+/bin/python[0-9.]*)\x00")


def plugin_runs(so: str) -> tuple[str | None, str | None]:
    """The interpreter the inner half beside *so* starts, and the slurm-gpu that built it."""
    try:
        data = (Path(so).parent / "slurm_gpu_spank_py.so").read_bytes()
    except OSError:
        return None, None
    i = data.find(INNER_MARKER)
    if i < 0:
        m = _OLD_PYTHON.search(data)
        return (m.group(1).decode(), None) if m else (None, None)
    rec = data[i + len(INNER_MARKER):data.find(b"\0", i)].decode(errors="replace")
    python, _, version = rec.rpartition(" version=")
    return python or None, version or None


def first_writable(root: str) -> str | None:
    """The first path of the venv *root* (its tree, and every directory above it)
    that someone but root can change: the prolog, the health check and the
    plugin in every job run that code, as root."""
    def bad(path: str, st: os.stat_result) -> str | None:
        if st.st_uid != 0:
            return f"{path} (owner uid {st.st_uid})"
        if stat.S_ISLNK(st.st_mode):
            return None
        sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if st.st_mode & 0o022 and not sticky_dir:
            return f"{path} (mode {stat.S_IMODE(st.st_mode):04o})"
        return None
    real = os.path.realpath(root)
    up = os.path.dirname(real)
    chain = [root] if os.path.islink(root) else []
    while True:
        chain.append(up)
        if up == "/":
            break
        up = os.path.dirname(up)
    for path in chain:
        try:
            why = bad(path, os.lstat(path))
        except OSError:
            continue
        if why:
            return why
    for dirpath, _, filenames in os.walk(real):
        for name in [dirpath, *(os.path.join(dirpath, f) for f in filenames)]:
            try:
                why = bad(name, os.lstat(name))
            except OSError:
                continue
            if why:
                return why
    return None


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
           gres_drift: Callable[[str, str], list[str]] | None = None, role: str = "gpu") -> Facts:
    """Read everything the checks need, once (*role*: see :data:`ROLES`)."""
    from .slurmclient import conf_path, read_conf
    path = conf_path(slurm_conf)
    read = read_conf(path)
    conf, readable = read or {}, read is not None
    plugstack = Path(conf.get("plugstackconfig") or str(Path(path).parent / "plugstack.conf"))
    lines = plugstack_lines(plugstack)
    built = {}
    runs = {}
    for _, line in lines:
        words = line.split()
        if len(words) >= 2 and words[1].endswith(PLUGIN_FILE):
            built[words[1]] = plugin_built_for(words[1])
            runs[words[1]] = plugin_runs(words[1])
    login = role == "login"
    facts = Facts(path, conf, readable, _client_version() if login else _slurmd_version(), lines, built,
                  gpus_present=os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia"),
                  persistenced=_process_running("nvidia-persistenced"), plugin_runs=runs,
                  gres_skipped=gres_drift is None, slurm_from="srun" if login else "slurmd")
    so = next(iter(built), None)
    facts.rebuild = rebuild_command(so)
    facts.venv_unreadable = first_unreadable(Path(sys.prefix))
    facts.venv_writable = first_writable(sys.prefix)
    facts.setup_failed = setup_failed()
    facts.configs = gather_configs(lines)
    _gather_mps(facts)
    if login:
        return facts
    from . import doctor_cgroup
    facts.cgroup = doctor_cgroup.gather(str(Path(path).parent))
    from .imex.doctor import gather as gather_imex
    facts.imex = gather_imex(conf, path)
    facts.kernel_log = _gather_kernel_log(node)
    facts.fuse_allow_other = read_fuse_allow_other()
    if doctor_cgroup.systemd_running("/"):
        facts.units = gather_units(doctor_cgroup._default_runner)
    gres = Path(path).parent / "gres.conf"
    if gres_drift is not None and gres.exists():
        name = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        try:
            facts.gres_drift = gres_drift(str(gres), name)
        except Exception as e:  # noqa: BLE001 - reported as a finding, not a crash
            facts.gres_error = getattr(e, "what", None) or f"{type(e).__name__}: {e}"
    return facts


FUSE_CONF = "/etc/fuse.conf"


def read_fuse_allow_other(path: str = FUSE_CONF) -> tuple[str, bool] | None:
    """(*path*, whether it sets ``user_allow_other``: fuse(8), a line of that word alone);
    None when there is no such file to read."""
    try:
        with open(path, "rb") as f:
            text = f.read(1 << 16).decode(errors="replace")
    except OSError:
        return None
    return path, any(line.split("#", 1)[0].strip() == "user_allow_other" for line in text.splitlines())


XID_WATCH = "slurm-gpu-xid-watch.service"
UNITS = (XID_WATCH, "slurm-gpu-monitor.service")
UNIT_PROPS = ("LoadState", "UnitFileState", "ActiveState", "NeedDaemonReload")


def gather_units(run: Callable[[list[str], float], tuple[int, str]]) -> dict[str, dict[str, str]]:
    """``systemctl show`` of the package's units (those systemd knows)."""
    out: dict[str, dict[str, str]] = {}
    for unit in UNITS:
        rc, text = run(["systemctl", "show", unit, *(f"--property={p}" for p in UNIT_PROPS)], 10)
        props = dict(line.partition("=")[::2] for line in text.splitlines() if "=" in line)
        if rc == 0 and props.get("LoadState") == "loaded":
            out[unit] = props
    return out


SETUP_FAILED = "setup-failed"   # packaging/common/venv-setup.sh writes it beside the venv link
SETUP_COMMAND = "setup-command"  # ... and the command that runs it again, as the package ran it


def rebuild_command(so: str | None, prefix: str | None = None, root: str = "/") -> str:
    """The command that rebuilds the plugin *so* for the installed Slurm.

    A package's venv: the package's own setup (``SETUP_COMMAND`` beside the
    venv link: a new tree with a new plugin, swapped in whole).  Else
    ``slurm-gpu spank build``, with ``-o`` when *so* is not this venv's
    plugin and ``--include-dir`` when the installed Slurm's ``spank.h`` is
    not under /usr/include (:func:`slurm_gpu.slurminstall.include_dir`).
    """
    from .paths import venv_link
    from .slurminstall import include_dir
    prefix = prefix or sys.prefix
    link = venv_link(prefix)
    if link != prefix and so is not None and \
            os.path.realpath(os.path.dirname(so)) == os.path.realpath(os.path.join(prefix, "lib", "slurm-gpu")):
        try:
            text = Path(os.path.dirname(link), SETUP_COMMAND).read_text(errors="replace")
            if text.strip() and "\n" not in text.strip():
                return text.strip()
        except OSError:
            pass
    argv = ["slurm-gpu", "spank", "build"]
    if so is not None and os.path.realpath(so) != os.path.realpath(os.path.join(prefix, "lib", "slurm-gpu",
                                                                                 PLUGIN_FILE)):
        argv += ["-o", so]
    inc = include_dir(root)
    if inc and inc != "/usr/include":
        argv += ["--include-dir", inc]
    return " ".join(argv)


def setup_failed(prefix: str | None = None) -> str | None:
    """What the package's last venv setup said when it kept the old tree (None: it did not)."""
    from .paths import venv_link
    link = venv_link(prefix)
    if link == (prefix or sys.prefix):
        return None                   # not the packages' layout
    try:
        text = Path(os.path.dirname(link), SETUP_FAILED).read_text(errors="replace")
    except OSError:
        return None
    return " ".join(text.split()) or "(no reason recorded)"


def _client_version() -> str | None:
    """The Slurm a login node's srun/sbatch load the plugin into: ``srun -V``,
    else libslurm's soname (srun -V needs a readable slurm.conf)."""
    from .runner import run
    from .errors import SlurmGpuError
    for exe in ("/usr/bin/srun", "/usr/local/bin/srun"):
        if os.access(exe, os.X_OK):
            try:
                res = run([exe, "-V"], timeout=10, check=False)
                if res.returncode == 0 and slurmversion.parse(res.stdout):
                    return slurmversion.parse(res.stdout)
            except SlurmGpuError:
                pass
    from .slurminstall import find
    inst = find()        # Debian's, SchedMD's slurm-smd, EL's or a prefix's libslurm.so.NN
    return inst.release if inst is not None else None


def gather_configs(lines: list[tuple[str, str]]) -> list[ConfigFile]:
    """The config file the plugstack line names, and the one the prolog, epilog
    and health check find (``$SLURM_GPU_CONFIG``, else the default lookup), each
    loaded through every section's own reader."""
    from . import config
    from .config_sections import validate
    from .errors import SlurmGpuError
    named: dict[str, str] = {}
    for _, line in lines:
        words = line.split()
        if len(words) >= 2 and words[1].endswith(PLUGIN_FILE):
            for w in words[2:]:
                if w.startswith("config=/"):
                    named.setdefault(w[len("config="):], "plugstack config=")
            break
    config.use_config(None)
    hooks = config.config_file()
    named.setdefault(hooks or config.DEFAULT_PATH,
                     "$SLURM_GPU_CONFIG" if os.environ.get(config.ENV_VAR) else "the default lookup")
    out = []
    for path, by in named.items():
        if not os.path.exists(path) and path != config.DEFAULT_PATH:
            out.append(ConfigFile(path, by, False))
            continue
        if os.path.exists(path) and not os.path.isfile(path):
            # a FIFO would block the read (and a directory cannot be one)
            out.append(ConfigFile(path, by, True, error="not a regular file"))
            continue
        try:
            out.append(ConfigFile(path, by, os.path.exists(path), unknown_sections=tuple(validate(path))))
        except SlurmGpuError as e:
            out.append(ConfigFile(path, by, True, error=e.what))
        except (ValueError, TypeError) as e:    # a settings class's own check (RepairSettings)
            out.append(ConfigFile(path, by, True, error=str(e)))
    return out


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


def _gather_kernel_log(node: str | None) -> tuple[str, str, str] | None:
    """``[health] kernel_log`` ("%n": this node) and whether its lines can prove their sender."""
    try:
        from . import config
        from .health.settings import HealthSettings
        src = config.section(HealthSettings, "health").kernel_log
    except Exception:  # noqa: BLE001 - the config check reports an unloadable config
        return None
    name = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    src = src.replace("%n", name)
    from .hw.kmsg import sender_proof
    return (src, *sender_proof(src))


# -- checks (pure) ------------------------------------------------------------
def check_slurm(f: Facts) -> list[Finding]:
    out = []
    if not f.conf_readable:
        out.append(Finding(CRITICAL, "slurm.conf", f"cannot read {f.slurm_conf_path} "
                           "(--slurm-conf or SLURM_CONF)"))
    if f.slurmd_version is None:
        how = "/usr/bin/srun -V" if f.slurm_from == "srun" else "/usr/sbin/slurmd -V"
        out.append(Finding(UNKNOWN, "slurm.version", f"{f.slurm_from} not found ({how})"))
    else:
        out.append(Finding(OK, "slurm.version", f"{f.slurm_from} {f.slurmd_version}"))
    return out


# The first Slurm whose slurmctld keeps a GPU out of gres/gpu while a gres/shard or gres/mps job
# still holds part of it: before it, _job_dealloc() cleared the node's "shared gres in use" bit of
# a GPU when any one sharing job on it ended (SchedMD commit 30eacbe571, bug 19110, 23.11.5).
SHARED_GRES_FIXED = (23, 11, 5)


def _version_tuple(v: str) -> tuple[int, ...] | None:
    parts = v.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


def check_shared_gres(f: Facts) -> list[Finding]:
    """A node sharing GPUs (GresTypes shard or mps) on a Slurm that can give a shared GPU whole."""
    version = _version_tuple(f.slurmd_version or "")
    shared = [t for t in ("shard", "mps")
              if t in [x.strip().lower() for x in f.conf.get("grestypes", "").split(",")]]
    if version is None or not shared or version >= SHARED_GRES_FIXED:
        return []
    return [Finding(WARNING, "slurm.shared_gres",
                    f"Slurm {f.slurmd_version} can give a GPU whole (gres/gpu) while a gres/{shared[0]} job "
                    f"still runs on it, once another gres/{shared[0]} job on that GPU ends "
                    "(fixed in 23.11.5: SchedMD bug 19110)")]


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
                           f"older slurm-gpu): rebuild it ({f.rebuild})"))
    elif f.slurmd_version is None:
        out.append(Finding(UNKNOWN, "spank.plugin", f"built for Slurm {built}; {f.slurm_from} not found "
                           f"to compare ({so})"))
    elif slurmversion.major_minor(built) != slurmversion.major_minor(f.slurmd_version):
        out.append(Finding(CRITICAL, "spank.plugin", f"built for Slurm {built} but {f.slurm_from} is "
                           f"{f.slurmd_version}: Slurm will refuse it; rebuild it "
                           f"({f.rebuild}) ({so})"))
    else:
        out.append(Finding(OK, "spank.plugin", f"built for Slurm {built}, {f.slurm_from} is "
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
    if f.gres_skipped and not f.gres_error:
        return []
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


def check_plugin_tree(f: Facts) -> list[Finding]:
    """The interpreter a plugin starts still exists, and it was built by this slurm-gpu."""
    from . import __version__
    out = []
    for so, (python, version) in f.plugin_runs.items():
        if python is None or not os.path.isfile(so):
            continue                  # check_plugin says what is missing
        if not os.path.exists(python):
            out.append(Finding(CRITICAL, "spank.tree", f"{so} starts {python}, which no longer exists "
                               "(an upgrade removed that venv tree): every step with a --gpu-* "
                               "option fails; slurm-gpu spank install"))
        elif os.path.realpath(os.path.dirname(os.path.dirname(python))) != os.path.realpath(f.venv):
            out.append(Finding(WARNING, "spank.tree", f"{so} starts {python}, not this venv's "
                               f"({f.venv}): an upgrade removes a tree it does not run from; "
                               "slurm-gpu spank install"))
        elif version is not None and version != __version__:
            out.append(Finding(CRITICAL, "spank.tree", f"{so} was built by slurm-gpu {version}, the "
                               f"venv runs {__version__}: its options and Python side may not match; "
                               "slurm-gpu spank install"))
        else:
            out.append(Finding(OK, "spank.tree", f"{so} starts {python}"))
    return out


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



def check_setup(f: Facts) -> list[Finding]:
    """The package's last venv setup went live (venv-setup.sh keeps the old tree when not)."""
    if f.setup_failed:
        return [Finding(CRITICAL, "package.setup", f"the last upgrade did not go live: {f.setup_failed}")]
    return []


def check_venv_writable(f: Facts) -> list[Finding]:
    if f.venv_writable:
        return [Finding(CRITICAL, "venv.owner", f"{f.venv_writable} can be changed by someone but "
                        "root: slurmd runs this code as root in every prolog and health check "
                        "(chown -R root:root; chmod -R go-w)")]
    return [Finding(OK, "venv.owner", f"{f.venv} writable by root only")]


def check_config(f: Facts) -> list[Finding]:
    """Each config file a Slurm-run part reads exists (or is the default path) and loads."""
    from .config import DEFAULT_PATH
    out: list[Finding] = []
    for c in f.configs or ():
        if not c.exists and c.path != DEFAULT_PATH:
            out.append(Finding(CRITICAL, "config", f"{c.path} not found (named by {c.named_by}): "
                               "every --gpu-profile, --gpu-mps and --gpu-mig step fails; create it "
                               f"or name {DEFAULT_PATH}"))
        elif c.error:
            out.append(Finding(CRITICAL, "config", f"{c.error} ({c.path}, named by {c.named_by}): the "
                               "jobs that need it fail"))
        elif not c.exists:
            out.append(Finding(OK, "config", f"{c.path} absent: every setting at its default "
                               f"(named by {c.named_by})"))
        else:
            out.append(Finding(OK, "config", f"{c.path} loads (named by {c.named_by})"))
        if c.unknown_sections:
            out.append(Finding(WARNING, "config", f"[{c.unknown_sections[0]}] in {c.path} is read by "
                               "nothing (misspelt?): its settings have no effect"))
    paths = {c.named_by: c.path for c in f.configs or ()}
    if len(paths) > 1:
        plug = paths.pop("plugstack config=")
        other, by = next((p, b) for b, p in paths.items())
        out.append(Finding(WARNING, "config", f"plugstack config= names {plug} but the prolog, epilog "
                           f"and health check read {other} ({by}): they see different settings"))
    return out


def check_kernel_log(f: Facts) -> list[Finding]:
    """``[health] kernel_log``: only a source that proves the kernel wrote a line may drain or requeue."""
    if f.kernel_log is None:
        return []
    path, state, why = f.kernel_log
    if state == "unproven":
        return [Finding(WARNING, "health.kernel_log", f"{path} cannot prove who wrote its lines ({why}): its GPU "
                        "fault lines only warn, and drain or requeue only where NVML proves the GPU dead; name "
                        "/dev/kmsg (the default) or a journalctl -k -o export/json file")]
    # "empty": a trusted file with no line yet (a fresh node's file source)
    return [Finding(OK if state in ("proven", "empty") else UNKNOWN, "health.kernel_log", f"{path}: {why}")]


def check_cgroup(f: Facts) -> list[Finding]:
    """cgroup mode, cgroup.conf's constraints, slurmd's delegation, IgnoreSystemd,
    26.05's job directory names and the job's device limit (:mod:`.doctor_cgroup`)."""
    if f.cgroup is None:
        return []
    from .doctor_cgroup import check
    return [Finding(*x) for x in check(f.cgroup, f.conf, f.slurmd_version)]


def check_imex(f: Facts) -> list[Finding]:
    """Per-job IMEX (docs/imex.md): ``imex.*`` findings, nothing when not gathered."""
    if f.imex is None:
        return []
    from .imex.doctor import check
    return [Finding(status, name, message) for status, name, message in check(f.imex)]


def check_units(f: Facts) -> list[Finding]:
    """The package's systemd units as systemd runs them: xid-watch, once an
    admin enabled it, must be running (an upgrade that stopped it and never
    started it again lost every NVML event until the next health check), and
    no unit file may have changed on disk since systemd loaded it."""
    if f.units is None:
        return []
    out: list[Finding] = []
    for unit, p in sorted(f.units.items()):
        if p.get("NeedDaemonReload") == "yes":
            out.append(Finding(WARNING, "systemd.units", f"{unit} changed on disk since systemd loaded "
                               "it: systemctl daemon-reload"))
        if p.get("ActiveState") == "failed":
            out.append(Finding(WARNING, "systemd.units", f"{unit} failed (journalctl -u {unit}; "
                               f"systemctl restart {unit})"))
    xid = f.units.get(XID_WATCH)
    if xid is None:
        return out
    enabled, active = xid.get("UnitFileState", "?"), xid.get("ActiveState", "?")
    if enabled == "enabled" and active not in ("active", "activating", "reloading", "failed"):
        out.append(Finding(WARNING, "systemd.units", f"{XID_WATCH} is enabled but {active}: NVML events "
                           "between two health checks are lost (systemctl restart slurm-gpu-xid-watch)"))
    elif not out:
        out.append(Finding(OK, "systemd.units", f"{XID_WATCH} {enabled}, {active}"))
    return out


def check_fuse(f: Facts) -> list[Finding]:
    """``user_allow_other`` in /etc/fuse.conf where ``--gpu-mps`` runs: a job user's FUSE
    mount in their MPS directories could then answer root too, and hold root's prolog or
    epilog in a request its server never answers (mounts without it refuse root: EACCES)."""
    if f.fuse_allow_other is None or not f.fuse_allow_other[1] or not f.mps_enabled:
        return []
    return [Finding(WARNING, "fuse.allow_other", f"{f.fuse_allow_other[0]} sets user_allow_other: a job's "
                    "user can mount FUSE in their --gpu-mps directories that root's prolog and epilog "
                    "then wait on (remove it, or set [mps] enabled = false)")]


CHECKS = (check_slurm, check_shared_gres, check_plugin, check_plugin_tree, check_setup, check_prolog, check_health,
          check_gres, check_venv, check_venv_writable, check_persistenced, check_config, check_mps_control,
          check_cgroup, check_imex, check_kernel_log, check_units, check_fuse)
# What each kind of node needs.  A login node runs srun/sbatch/salloc, which
# load the SPANK plugin and read its config to check the options; slurmd,
# the prolog, the health check, gres.conf and the GPUs are a GPU node's.
ROLES = {
    "gpu": CHECKS,
    "login": (check_slurm, check_plugin, check_plugin_tree, check_setup, check_venv, check_venv_writable,
              check_config),
}


def run_checks(f: Facts, role: str = "gpu") -> list[Finding]:
    return [x for c in ROLES[role] for x in c(f)]


def worst(findings: list[Finding]) -> int:
    """Nagios exit status: CRITICAL > WARNING > UNKNOWN > OK."""
    s = {x.status for x in findings}
    for want in (CRITICAL, WARNING, UNKNOWN):
        if want in s:
            return want
    return OK
