"""The sandbox's config files, as text (pure: data in, text out).

slurm.conf node lines and gres.conf come from :mod:`slurm_gpu.confgen`, the
same generator admins use, pointed at the sandbox's fake device directory;
this module adds only what a throw-away cluster on one host needs: private
paths and ports, ``config_overrides`` (a node may claim more CPUs than this
host has) and a ``DefMemPerCPU`` so that jobs do not each take the whole
node's memory and run one at a time.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from slurm_gpu import __version__
from slurm_gpu.config import ENV_VAR
from slurm_gpu.hw.model import Node
from .layout import Layout

GENERATOR = "slurm-gpu sandbox up"
SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class NodeSpec:
    """Where one sandbox node's slurmd listens."""

    name: str
    hostname: str
    addr: str
    port: int


@dataclass(frozen=True)
class ClusterSpec:
    """Everything that decides the sandbox's config files."""

    layout: Layout
    machine: str                       # label for headers (name or path)
    model: Node
    ctld_host: str
    ctld_addr: str
    ctld_port: int
    nodes: tuple[NodeSpec, ...]
    gres_options: Mapping[str, Any] = field(default_factory=dict)
    prolog: bool = False
    epilog: bool = False
    health_interval: int | None = None  # None: no HealthCheckProgram
    cgroup: bool = False
    extra: Mapping[str, str] = field(default_factory=dict)  # slurm.conf Key=Value overrides


def gres_opts(spec: ClusterSpec) -> Any:
    from slurm_gpu.confgen import GresOptions
    return GresOptions(dev_dir=str(spec.layout.dev), **dict(spec.gres_options))


def node_lines(spec: ClusterSpec) -> list[str]:
    """One ``NodeName=`` line per node: the model's line plus address and port."""
    from slurm_gpu.confgen import node_line
    opts = gres_opts(spec)
    return [node_line(n.name, spec.model, options=opts,
                      extra={"NodeHostname": n.hostname, "NodeAddr": n.addr,
                             "Port": str(n.port), "State": "UNKNOWN"})
            for n in spec.nodes]


def gres_conf(spec: ClusterSpec) -> str:
    """gres.conf for every node, ``File=`` under the sandbox's dev directory."""
    from slurm_gpu.confgen import gresconf
    return gresconf.render({n.name: spec.model for n in spec.nodes}, gres_opts(spec), inputs=[spec.machine])


def _settings(spec: ClusterSpec) -> list[tuple[str, str]]:
    from slurm_gpu.confgen import socket_layout
    L = spec.layout
    opts = gres_opts(spec)
    lay = socket_layout(spec.model, opts.socket_mode)
    slurmd_params = ["config_overrides"] + ([lay.slurmd_parameters] if lay.slurmd_parameters else [])
    gres_types = ["gpu"] + (["mps"] if opts.mps_count else []) + (["shard"] if opts.shards else [])
    mem_mib = spec.model.memory_bytes // (1024 * 1024)
    def_mem = max(mem_mib // max(lay.cpus, 1), 1)
    s: list[tuple[str, str]] = [
        ("ClusterName", L.cluster_name),
        ("SlurmctldHost", f"{spec.ctld_host}({spec.ctld_addr})"),
        ("SlurmUser", "root"),
        ("SlurmdUser", "root"),
        ("AuthType", "auth/munge"),
        ("CredType", "cred/munge"),
        ("AuthInfo", f"socket={L.munge_socket}"),
        ("SlurmctldPort", str(spec.ctld_port)),
        ("SlurmdPort", str(spec.nodes[0].port)),
        ("StateSaveLocation", str(L.state)),
        ("SlurmdSpoolDir", f"{L.spool}/%n"),
        ("SlurmctldPidFile", f"{L.run}/slurmctld.pid"),
        ("SlurmdPidFile", f"{L.run}/slurmd-%n.pid"),
        ("SlurmctldLogFile", str(L.slurmctld_log)),
        ("SlurmdLogFile", f"{L.log}/slurmd-%n.log"),
        ("SlurmctldDebug", "info"),
        ("SlurmdDebug", "info"),
        ("ProctrackType", "proctrack/cgroup" if spec.cgroup else "proctrack/linuxproc"),
        ("TaskPlugin", "task/cgroup,task/affinity" if spec.cgroup else "task/affinity"),
        ("SelectType", "select/cons_tres"),
        ("SelectTypeParameters", "CR_Core_Memory"),
        ("DefMemPerCPU", str(def_mem)),
        ("GresTypes", ",".join(gres_types)),
        ("SchedulerType", "sched/backfill"),
        ("MpiDefault", "none"),
        ("ReturnToService", "2"),
        ("SlurmdParameters", ",".join(slurmd_params)),
        ("JobAcctGatherType", "jobacct_gather/none"),
        ("AccountingStorageType", "accounting_storage/none"),
        ("JobCompType", "jobcomp/none"),
        ("PlugStackConfig", str(L.plugstack_conf)),
        ("MinJobAge", "300"),
        ("KillWait", "5"),
        ("InactiveLimit", "0"),
        ("SlurmdTimeout", "300"),
        ("MessageTimeout", "10"),
        # Every task on a node finds the node's slurm-gpu config, as every
        # process on a real node finds /etc/slurm-gpu/slurm-gpu.toml.
        ("TaskProlog", str(task_prolog_path(L))),
    ]
    if spec.prolog:
        s += [("Prolog", f"{L.etc}/prolog.d/*"), ("PrologFlags", "Alloc")]
    if spec.epilog:
        s += [("Epilog", f"{L.etc}/epilog.d/*")]
    if spec.health_interval is not None:
        s += [("HealthCheckProgram", f"{L.etc}/healthcheck"),
              ("HealthCheckInterval", str(spec.health_interval)),
              ("HealthCheckNodeState", "ANY")]
    return s


def merge_settings(base: Sequence[tuple[str, str]], extra: Mapping[str, str]) -> list[tuple[str, str]]:
    """*base* with *extra* applied: same key (any case) replaced, new keys appended.

    ``SlurmdParameters`` is merged, not replaced: the sandbox cannot work
    without ``config_overrides``.
    """
    out = list(base)
    index = {k.lower(): i for i, (k, _) in enumerate(out)}
    for k, v in extra.items():
        i = index.get(k.lower())
        if i is None:
            index[k.lower()] = len(out)
            out.append((k, v))
        elif k.lower() == "slurmdparameters":
            have = out[i][1].split(",")
            out[i] = (out[i][0], ",".join(have + [p for p in v.split(",") if p and p not in have]))
        else:
            out[i] = (out[i][0], v)
    return out


def slurm_conf(spec: ClusterSpec) -> str:
    """slurm.conf text for the sandbox."""
    from slurm_gpu.confgen.templating import render
    settings = merge_settings(_settings(spec), spec.extra)
    view = {
        "generator": GENERATOR, "version": __version__, "root": str(spec.layout.root),
        "machine": spec.machine, "settings": settings, "extra_lines": [],
        "node_lines": node_lines(spec),
    }
    return render("sandbox.slurm.conf.j2", {"v": view})


def cgroup_conf() -> str:
    # IgnoreSystemdOnFailure (cgroup/v2 only; 22.05, 24.11 and 26.05 all read it):
    # a machine without a systemd to talk to over dbus (a container, a CI VM
    # without dbus) would otherwise kill slurmd with "systemd scope for
    # slurmstepd could not be set"; slurmd then makes the cgroups itself.
    return ("# generated by slurm-gpu sandbox up\n"
            "CgroupPlugin=autodetect\nCgroupMountpoint=/sys/fs/cgroup\nIgnoreSystemdOnFailure=yes\n"
            "ConstrainCores=yes\nConstrainDevices=yes\nConstrainRAMSpace=yes\n")


def plugstack_conf(lines: Sequence[str]) -> str:
    return "# generated by slurm-gpu sandbox up\n" + "".join(f"{l}\n" for l in lines)


def wrapper_script(layout: Layout, argv: Sequence[str], what: str, python: str | None = None) -> str:
    """A /bin/sh wrapper that gives *argv* the environment slurmd does not.

    slurmd runs prologs, epilogs and the HealthCheckProgram with no PATH and
    no SLURM_CONF, so scontrol would look for DNS SRV records and the
    project's code would read the system config instead of the sandbox's.
    Every value is quoted; nothing user-controlled is written here.
    """
    env = {"SLURM_CONF": str(layout.slurm_conf), "PATH": SAFE_PATH,
           "SLURM_GPU_CONFIG": str(layout.config_toml)}
    if python:  # the project's shell entry points start this interpreter
        env["SLURM_GPU_PYTHON"] = python
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return ("#!/bin/sh\n"
            f"# generated by slurm-gpu sandbox up: {what}\n"
            f"export {exports}\n"
            f"exec {' '.join(shlex.quote(a) for a in argv)} \"$@\"\n")


def task_prolog_path(layout: Layout) -> Path:
    return layout.etc / "task-prolog"


def task_prolog_script(layout: Layout) -> str:
    """The TaskProlog that puts the node's config into every task's environment.

    The sandbox's nodes share the host's /etc, so a user's process on a node
    (``srun slurm-gpu inventory``, ``cluster collect``'s ``snapshot record``)
    would otherwise read the host's config, or none, and see no GPU.  slurmd
    reads ``export NAME=value`` lines of a TaskProlog's stdout into the task's
    environment, over the user's own.
    """
    return ("#!/bin/sh\n"
            "# generated by slurm-gpu sandbox up: the node's config for every task\n"
            f"echo {shlex.quote(f'export {ENV_VAR}=' + str(layout.config_toml))}\n")


def node_config(layout: Layout, snapshot: Path | None,
                extra: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The sections of ``slurm-gpu.toml``: ``[node]`` plus the caller's.

    A caller's ``[node]`` keys are merged into ours (e.g. ``nvml = "sim:..."``);
    other sections are taken as given.
    """
    node: dict[str, Any] = {"state_dir": f"{layout.var}/%n"}
    if snapshot is not None:
        node["snapshot"] = str(snapshot)
    # The repair ladder's persistent state stays inside the sandbox too.
    out: dict[str, dict[str, Any]] = {"node": node, "repair": {"state_dir": f"{layout.var}/%n"}}
    for name, table in extra.items():
        if name == "node":
            node.update(table)
        elif name == "repair":
            out["repair"].update(table)
        else:
            out[name] = dict(table)
    return out
