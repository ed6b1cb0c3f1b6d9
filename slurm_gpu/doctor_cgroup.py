"""``doctor``'s cgroup checks: what breaks GPU jobs on a systemd + cgroup v2 node.

Gathered once by :func:`gather` from a root path (tests point it at a
fixture tree) and one injected command runner (``systemctl show``,
``bpftool``); the checks are pure functions of :class:`CgroupFacts`.
What each check rests on, in Slurm's sources (SchedMD/slurm, slurm-26-05-3-1):

* slurmd's unit carries ``Delegate=yes`` (etc/slurmd.service.in): slurmd asks
  systemd (dbus) for a ``[<node>_]slurmstepd.scope`` and makes the job
  cgroups below it (src/plugins/cgroup/v2/cgroup_v2.c); without delegation
  systemd owns that subtree and may move or re-limit what Slurm made.
* ``IgnoreSystemd=yes`` (cgroup.conf(5): "for development and testing")
  makes the scope with mkdir, unknown to systemd; where no systemd runs,
  without it (or ``IgnoreSystemdOnFailure``) slurmd is fatal ("systemd scope
  for slurmstepd could not be set").
* ``ConstrainDevices``: on v2, a ``BPF_CGROUP_DEVICE`` program attached to the
  job's cgroup and each step's ``user`` cgroup (cgroup_p_constrain_apply;
  src/plugins/cgroup/v2/ebpf.c); on v1, the job's ``devices.list``.
* ``CgroupJobIdPaths`` (26.05.2+, src/interfaces/cgroup.c): job directories
  named ``job_<id>`` instead of the SLUID; an older slurmd refuses a
  cgroup.conf with a key it does not know (src/common/parse_config.c).

The device program is checked read-only with ``bpftool -j cgroup show DIR``
on the job directories that exist now (no kernel interface lists a cgroup's
BPF programs in cgroupfs): with no job running, or no bpftool, it says so.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
_TRUE = {"yes", "true", "1", "on", "y"}
_FALSE = {"no", "false", "0", "off", "n", ""}
SLUID = re.compile(r"s[0-9A-HJKMNP-TV-Z]{13}")
JOB_DIR = re.compile(r"job_[1-9][0-9]{0,11}")
BPFTOOL = ("/usr/sbin/bpftool", "/usr/bin/bpftool", "/sbin/bpftool")
UNIT_DIRS = ("etc/systemd/system", "run/systemd/system", "usr/local/lib/systemd/system",
             "usr/lib/systemd/system", "lib/systemd/system")
MAX_JOBS = 3            # job directories looked at (one bpftool each)

Runner = Callable[[Sequence[str], float], "tuple[int, str]"]


@dataclass
class CgroupFacts:
    """What the cgroup checks look at (tests build it, or :func:`gather` reads a fixture tree)."""

    version: int | None                     # 2: unified; 1: v1 controllers (legacy or hybrid); None: none
    hybrid: bool = False                    # v1 controllers beside a cgroup2 mount
    cgroup_conf: dict[str, str] | None = None   # lower-case keys; None: no cgroup.conf
    cgroup_conf_path: str = ""
    systemd: bool = False                   # systemd is PID 1 (/run/systemd/system)
    delegate: str | None = None             # slurmd.service's Delegate= (None: no unit found)
    delegate_from: str = ""                 # "systemctl show" or the unit file(s) read
    jobs: list[str] = field(default_factory=list)   # job cgroup directories now
    # job dir -> True (a device program / devices.list limits it), False (none), None (cannot tell)
    devices: dict[str, bool | None] = field(default_factory=dict)
    device_tool: str | None = None          # the bpftool used (v2); None: not installed


def parse_cgroup_conf(text: str) -> dict[str, str]:
    """cgroup.conf's ``Key=Value`` lines, keys lower-cased, the last one winning."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        key, eq, value = line.partition("=")
        if eq and key.strip() and " " not in key.strip():
            out[key.strip().lower()] = value.strip()
    return out


def _bool(conf: dict[str, str], key: str) -> bool:
    return conf.get(key.lower(), "no").strip().lower() in _TRUE


def _mode(root: str) -> tuple[int | None, bool, list[tuple[str, int, tuple[str, ...]]]]:
    from .jobs.jobcgroup import mounts
    ms = mounts(os.path.join(root, "proc/self/mountinfo"))
    v2 = [m for m in ms if m[1] == 2]
    v1 = [m for m in ms if m[1] == 1]
    if v1:
        return 1, bool(v2), ms
    return (2 if v2 else None), False, ms


def delegate_from_units(root: str, unit: str = "slurmd.service") -> tuple[str | None, str]:
    """``Delegate=`` of *unit* from its unit file and drop-ins under *root*, as systemd
    merges them (the first unit file on the search path, then every ``*.conf``
    drop-in by name, an /etc one replacing a same-named one below it)."""
    fragment = next((os.path.join(root, d, unit) for d in UNIT_DIRS
                     if os.path.isfile(os.path.join(root, d, unit))), None)
    if fragment is None:
        return None, ""
    dropins: dict[str, str] = {}
    for d in reversed(UNIT_DIRS):
        dd = os.path.join(root, d, unit + ".d")
        try:
            names = os.listdir(dd)
        except OSError:
            continue
        for n in names:
            if n.endswith(".conf"):
                dropins[n] = os.path.join(dd, n)
    value: str | None = "no"                # systemd's default
    read = []
    for path in [fragment, *(dropins[n] for n in sorted(dropins))]:
        try:
            text = open(path, errors="replace").read()
        except OSError:
            continue
        read.append(path[len(root.rstrip("/")):] if root not in ("", "/") else path)
        section = ""
        for raw in text.splitlines():
            line = raw.strip()
            if line.startswith("["):
                section = line
            elif section == "[Service]" and line.startswith("Delegate="):
                value = line[len("Delegate="):].strip() or "no"     # an empty assignment resets
    return value, ", ".join(read)


def delegated(value: str | None) -> bool:
    """``Delegate=yes`` or a list of controllers (delegation on, for those)."""
    if value is None:
        return False
    v = value.strip().lower()
    return v in _TRUE or (v not in _FALSE and bool(v.split()))


def job_dirs_now(root: str, version: int | None, ms: list[tuple[str, int, tuple[str, ...]]],
                 slice_name: str) -> list[str]:
    """The job cgroup directories that exist now (v2: under the stepd scope;
    v1: in the devices hierarchy), at most :data:`MAX_JOBS`."""
    from .acct.attribution import v2_bases
    out: list[str] = []
    for point, v, ctrls in ms:
        base_point = os.path.join(root, point.lstrip("/"))
        if v == 2 and version == 2:
            for base in v2_bases(os.path.join(root, "proc")):
                d = os.path.join(base_point, base.lstrip("/"), slice_name)
                for scope in _list(d):
                    if scope.endswith("slurmstepd.scope"):
                        out += [os.path.join(d, scope, j) for j in _list(os.path.join(d, scope))
                                if JOB_DIR.fullmatch(j) or SLUID.fullmatch(j)]
        elif v == 1 and "devices" in ctrls:
            for top in _list(base_point):
                if top == "slurm" or top.startswith("slurm_"):
                    for u in _list(os.path.join(base_point, top)):
                        if u.startswith("uid_"):
                            out += [os.path.join(base_point, top, u, j)
                                    for j in _list(os.path.join(base_point, top, u)) if JOB_DIR.fullmatch(j)]
    return sorted(set(out))[:MAX_JOBS]


def _list(d: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(d) if os.path.isdir(os.path.join(d, n)))
    except OSError:
        return []


def bpf_device_program(out: str) -> bool | None:
    """Whether ``bpftool -j cgroup show`` output lists a device program (None: unreadable)."""
    try:
        progs = json.loads(out or "[]")
    except ValueError:
        return None
    if not isinstance(progs, list):
        return None
    return any(isinstance(p, dict) and str(p.get("attach_type", "")) in ("device", "cgroup_device")
               for p in progs)


def v1_devices_limited(job: str) -> bool | None:
    """A v1 job's ``devices.list`` is not the unrestricted ``a *:* rwm`` (None: unreadable)."""
    try:
        text = open(os.path.join(job, "devices.list")).read()
    except OSError:
        return None
    return text.split() != ["a", "*:*", "rwm"]


def systemd_running(root: str) -> bool:
    """systemd is PID 1 (sd_booted(3)'s test)."""
    return os.path.isdir(os.path.join(root, "run/systemd/system"))


def _default_runner(argv: Sequence[str], timeout: float) -> tuple[int, str]:
    from .errors import SlurmGpuError
    from .runner import run
    try:
        res = run(list(argv), timeout=timeout, check=False)
    except SlurmGpuError:
        return 127, ""
    return res.returncode, res.stdout


def gather(slurm_conf_dir: str, root: str = "/", run: Runner | None = None) -> CgroupFacts:
    """Read what the cgroup checks need (*root*: a fixture tree in tests)."""
    run = run or _default_runner
    version, hybrid, ms = _mode(root)
    facts = CgroupFacts(version, hybrid)
    path = os.path.join(slurm_conf_dir, "cgroup.conf")
    facts.cgroup_conf_path = path
    try:
        facts.cgroup_conf = parse_cgroup_conf(open(os.path.join(root, path.lstrip("/")), errors="replace").read())
    except OSError:
        facts.cgroup_conf = None
    facts.systemd = systemd_running(root)
    if facts.systemd and root in ("", "/"):
        rc, out = run(["systemctl", "show", "slurmd.service", "-p", "Delegate", "-p", "LoadState"], 10)
        props = dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)
        if rc == 0 and props.get("LoadState") == "loaded":
            facts.delegate, facts.delegate_from = props.get("Delegate", "no"), "systemctl show slurmd"
    if facts.delegate is None:
        facts.delegate, facts.delegate_from = delegate_from_units(root)
    conf = facts.cgroup_conf or {}
    facts.jobs = job_dirs_now(root, version, ms, conf.get("cgroupslice") or "system.slice")
    if version == 2:
        facts.device_tool = next((t for t in BPFTOOL if os.access(os.path.join(root, t.lstrip("/")), os.X_OK)),
                                 None)
        for j in facts.jobs:
            if facts.device_tool is None:
                facts.devices[j] = None
                continue
            rc, out = run([os.path.join(root, facts.device_tool.lstrip("/")), "-j", "cgroup", "show", j], 10)
            facts.devices[j] = bpf_device_program(out) if rc == 0 else None
    else:
        for j in facts.jobs:
            facts.devices[j] = v1_devices_limited(j)
    return facts


# -- checks (pure) -------------------------------------------------------------
def _at_least(version: str | None, want: tuple[int, ...]) -> bool | None:
    if not version:
        return None
    parts = [int(x) for x in re.findall(r"\d+", version)[:3]]
    return tuple(parts + [0] * (3 - len(parts))) >= want


def finding(status: int, name: str, message: str) -> tuple[int, str, str]:
    return status, name, message


def check(c: CgroupFacts, slurm_conf: dict[str, str], slurmd: str | None) -> list[tuple[int, str, str]]:
    """Every cgroup finding, as (status, check, message)."""
    out: list[tuple[int, str, str]] = []
    conf = c.cgroup_conf
    # -- mode
    if c.version is None:
        out.append(finding(UNKNOWN, "cgroup.mode", "no cgroup filesystem mounted (/proc/self/mountinfo)"))
    elif c.version == 2:
        out.append(finding(OK, "cgroup.mode", "cgroup v2 (unified)"))
    elif c.hybrid and conf is not None and conf.get("cgroupplugin", "").lower() == "cgroup/v2":
        out.append(finding(CRITICAL, "cgroup.mode", "hybrid cgroups (v1 controllers beside cgroup2) with "
                           "CgroupPlugin=cgroup/v2: slurmd refuses it (\"Hybrid mode is not supported\")"))
    elif _at_least(slurmd, (25, 5)):
        out.append(finding(WARNING, "cgroup.mode", f"cgroup v1{' (hybrid)' if c.hybrid else ''}: Slurm "
                           "deprecated cgroup/v1 in 25.05 (no new features); boot with "
                           "systemd.unified_cgroup_hierarchy=1"))
    else:
        out.append(finding(OK, "cgroup.mode", f"cgroup v1{' (hybrid)' if c.hybrid else ''}"))
    # -- slurm.conf's plugins and cgroup.conf's constraints
    task = slurm_conf.get("taskplugin", "").lower()
    proctrack = slurm_conf.get("proctracktype", "").lower()
    if "task/cgroup" not in task:
        out.append(finding(WARNING, "cgroup.conf", f"TaskPlugin={task or '(unset)'} lacks task/cgroup: no "
                           "job is confined to its GPUs, cores or memory, whatever cgroup.conf says"))
    if proctrack and proctrack != "proctrack/cgroup":
        out.append(finding(WARNING, "cgroup.conf", f"ProctrackType={proctrack}: jobs get no cgroup, so the "
                           "MPS daemon is not held by the job's limits and the epilog finds leftovers "
                           "by process tree only (use proctrack/cgroup)"))
    if conf is None:
        if "task/cgroup" in task:
            out.append(finding(CRITICAL, "cgroup.conf", f"{c.cgroup_conf_path} not found: task/cgroup "
                               "constrains nothing without it"))
    else:
        missing = [k for k in ("ConstrainDevices", "ConstrainCores", "ConstrainRAMSpace") if not _bool(conf, k)]
        if "ConstrainDevices" in missing:
            out.append(finding(WARNING, "cgroup.conf", "ConstrainDevices is not yes: every job can open "
                               f"every GPU of the node (/dev/nvidia*) ({c.cgroup_conf_path})"))
        elif missing:
            out.append(finding(WARNING, "cgroup.conf", f"{', '.join(missing)} not yes: jobs are not held to "
                               f"their cores/memory, so --gpu-numa-bind may pick CPUs the job was not "
                               f"given ({c.cgroup_conf_path})"))
        else:
            out.append(finding(OK, "cgroup.conf", "ConstrainDevices, ConstrainCores and ConstrainRAMSpace "
                               f"are yes ({c.cgroup_conf_path})"))
    if c.version != 2:
        out += _devices(c, conf)
        return out
    # -- systemd: delegation and IgnoreSystemd (v2 only: v1 makes its own hierarchy)
    conf = conf or {}
    ignore = _bool(conf, "IgnoreSystemd")
    on_failure = ignore or _bool(conf, "IgnoreSystemdOnFailure")
    if c.systemd and ignore:
        out.append(finding(WARNING, "cgroup.systemd", "IgnoreSystemd=yes on a node that runs systemd: "
                           "slurmd makes the stepd scope with mkdir, unknown to systemd "
                           "(cgroup.conf(5): for development and testing); remove it"))
    elif not c.systemd and not on_failure:
        out.append(finding(CRITICAL, "cgroup.systemd", "no systemd here and neither IgnoreSystemd nor "
                           "IgnoreSystemdOnFailure is yes: slurmd cannot create the slurmstepd scope "
                           "(fatal at start)"))
    else:
        out.append(finding(OK, "cgroup.systemd", "slurmd's stepd scope is made by systemd" if c.systemd
                           else "no systemd: IgnoreSystemd makes the stepd scope by hand"))
    if c.systemd:
        if c.delegate_from == "":
            out.append(finding(WARNING, "cgroup.delegate", "no slurmd.service unit found: slurmd must run "
                               "with Delegate=yes"))
        elif not delegated(c.delegate):
            out.append(finding(CRITICAL, "cgroup.delegate", f"slurmd.service has Delegate={c.delegate} "
                               f"({c.delegate_from}): systemd owns the job cgroups slurmd makes and may "
                               "move or re-limit them; add Delegate=yes (systemctl edit slurmd), then "
                               "restart slurmd"))
        else:
            out.append(finding(OK, "cgroup.delegate", f"slurmd.service Delegate={c.delegate} "
                               f"({c.delegate_from})"))
    # -- 26.05: SLUID or job id directories
    idpaths = "cgroupjobidpaths" in conf
    if idpaths and _at_least(slurmd, (26, 5, 2)) is False:
        out.append(finding(CRITICAL, "cgroup.jobpaths", f"CgroupJobIdPaths is set but slurmd {slurmd} "
                           "predates it (26.05.2): slurmd refuses cgroup.conf with an unknown key"))
    elif _at_least(slurmd, (26, 5)):
        if _bool(conf, "CgroupJobIdPaths"):
            out.append(finding(OK, "cgroup.jobpaths", "CgroupJobIdPaths=yes: job cgroups are job_<id>"))
        elif not slurm_conf.get("prolog"):
            out.append(finding(WARNING, "cgroup.jobpaths", "job cgroups are named by SLUID (26.05) and no "
                               "Prolog records SLURM_JOB_SLUID: processes cannot be attributed to "
                               "their job by cgroup (set Prolog, or CgroupJobIdPaths=yes)"))
        else:
            out.append(finding(OK, "cgroup.jobpaths", "job cgroups named by SLUID; the prolog records "
                               "each job's SLURM_JOB_SLUID"))
    out += _devices(c, conf)
    return out


def _devices(c: CgroupFacts, conf: dict[str, str] | None) -> list[tuple[int, str, str]]:
    if not conf or not _bool(conf, "ConstrainDevices"):
        return []
    name = "cgroup.devices"
    if not c.jobs:
        return [finding(OK, name, "no job cgroup on the node now: run doctor while a job runs to see "
                        "its device limit")]
    if c.version == 2 and c.device_tool is None:
        return [finding(OK, name, f"{len(c.jobs)} job cgroup(s), device program not checked: bpftool is "
                        "not installed (Debian: bpftool; EL: bpftool)")]
    bad = [j for j in c.jobs if c.devices.get(j) is False]
    unknown = [j for j in c.jobs if c.devices.get(j) is None]
    what = "BPF device program" if c.version == 2 else "devices.list limit"
    if bad:
        return [finding(CRITICAL, name, f"job cgroup {bad[0]} has no {what} although ConstrainDevices=yes: "
                        "its tasks can open every GPU (is task/cgroup in TaskPlugin, and the cgroup "
                        "plugin the one cgroup.conf names?)")]
    if unknown:
        return [finding(UNKNOWN, name, f"cannot read the device limit of {unknown[0]} (bpftool needs root)")]
    return [finding(OK, name, f"{what} on {len(c.jobs)} job cgroup(s)")]
