"""Stopping a sandbox: cancel its jobs, stop its daemons and what they left, release
its reservations, remove the cgroups Slurm made for its nodes (``Sandbox.down``)."""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from slurm_gpu.errors import SlurmGpuError
from . import chroot, netns, procs, registry


def cancel_jobs(daemons: list[procs.Proc], state: dict[str, Any], env: dict[str, str],
                timeout: float = 15.0) -> None:
    """scancel every job and wait (bounded) until none is left running."""
    from slurm_gpu.runner import run
    alive = {p.name for p in daemons if procs.alive(p)}
    if "slurmctld" not in alive or "munged" not in alive:
        return
    # A slurmctld that does not accept connections would make squeue retry for seconds.
    try:
        with socket.create_connection((state.get("ctld_addr", "127.0.0.1"),
                                       int(state.get("ctld_port", 0))), timeout=0.5):
            pass
    except (OSError, ValueError):
        return
    try:
        res = run(["squeue", "-h", "-o", "%A"], timeout=3, env=env, check=False)
        ids = res.stdout.split()
        if not ids:
            return
        run(["scancel", *ids], timeout=5, env=env, check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            res = run(["squeue", "-h", "-o", "%A"], timeout=5, env=env, check=False)
            if res.returncode != 0 or not res.stdout.split():
                return
            time.sleep(0.1)
    except SlurmGpuError:
        return  # slurmctld not answering: the daemons are stopped anyway

def remove_cgroups(node_names: list[str], root: Path = Path("/sys/fs/cgroup")) -> None:
    """Remove the empty cgroup directories proctrack/cgroup made for our nodes:
    v1's ``<controller>/slurm_<node>`` and v2's
    ``[<hierarchy>/]system.slice/<node>_slurmstepd.scope`` (v2 on its own at the
    root, or beside v1 in a hybrid's ``unified``; a leftover of
    ``IgnoreSystemd=yes``, else systemd's, which removes it too)."""
    for name in node_names:
        found = list(root.glob(f"*/slurm_{name}"))
        for base in (root, *root.glob("unified")):
            found += list(base.glob(f"system.slice/{name}_slurmstepd.scope"))
        for d in found:
            for sub in sorted(d.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if sub.is_dir():
                    try:
                        sub.rmdir()
                    except OSError:
                        pass
            try:
                d.rmdir()
            except OSError:
                pass


def down(sb: Any, *, grace: float = 5.0) -> dict[str, Any]:
    """Stop everything *sb* (a :class:`~slurm_gpu_devkit.sandbox.core.Sandbox`) started; see ``Sandbox.down``."""
    state = sb.state or sb._read_state() or {}
    sb.state = state
    daemons = sb._daemons()
    report: dict[str, Any] = {"stopped": [], "killed": [], "swept": []}
    if daemons:
        cancel_jobs(sb._daemons(), sb.state, sb.env)
    nets = [netns.NodeNet.from_dict(d) for d in state.get("netns", [])]
    ns_inodes = {i for i in (netns.inode(n) for n in nets) if i is not None}
    # slurmctld flushes its last job records to slurmdbd, which writes
    # them to MariaDB: stop them in that order, munged last.
    later = ("slurmdbd", "mariadbd", "munged", "chroot")
    slurm = [p for p in daemons if p.name not in later]
    dbd = [p for p in daemons if p.name == "slurmdbd"]
    mariadb = [p for p in daemons if p.name == "mariadbd"]
    munge = [p for p in daemons if p.name == "munged"]
    holder = [p for p in daemons if p.name == "chroot"]
    # Every process of a chrooted sandbox lives in the holder's mount namespace.
    # (Without a live holder, only processes chrooted in our root count: the
    # inode may be another namespace's by now.)
    mntns = state.get("chroot", {}).get("mntns")
    ns_root = None if any(procs.alive(p) for p in holder) else state.get("slurm", {}).get("root")
    # slurmstepd is not slurmd's child (it is reparented to init), and
    # its tasks are its own children: take the whole tree now, before
    # killing a parent loses the links.
    found = procs.touching(sb.layout.root) | procs.in_netns(ns_inodes) | chroot.in_mntns(mntns, ns_root)
    roots = found | {p.pid for p in slurm if procs.alive(p)}
    before = found | procs.descendants(roots)
    before -= {p.pid for p in daemons} | {os.getpid()}
    others = procs.as_procs(before, "leftover")
    report["stopped"] = [p.name for p in daemons if procs.alive(p)]
    report["killed"] += [p.name for p in procs.stop(slurm, grace=grace, reap=sb._reap)]
    # Children that die with their daemon (slurmscriptd) are not leftovers.
    others = [p for p in others if procs.alive(p)]
    report["swept"] += [p.pid for p in others]
    report["killed"] += [f"{p.name}:{p.pid}" for p in procs.stop(others, grace=0.5)]
    report["killed"] += [p.name for p in procs.stop(dbd, grace=grace, reap=sb._reap)]
    report["killed"] += [p.name for p in procs.stop(mariadb, grace=30.0, reap=sb._reap)]
    report["killed"] += [p.name for p in procs.stop(munge, grace=grace, reap=sb._reap)]
    # A second sweep catches what was forked while the daemons shut down.
    late = procs.touching(sb.layout.root) | procs.in_netns(ns_inodes) | chroot.in_mntns(mntns, ns_root)
    late = (late | procs.descendants(late)) - {os.getpid()} - {p.pid for p in holder}
    swept = procs.as_procs(late, "leftover")
    report["swept"] += [p.pid for p in swept]
    report["killed"] += [f"{p.name}:{p.pid}" for p in procs.stop(swept, grace=0.5)]
    # Last: the namespace's holder (its mounts vanish with the last process in it).
    report["killed"] += [p.name for p in procs.stop(holder, grace=grace, reap=sb._reap)]
    (sb.layout.run / "chroot.pid").unlink(missing_ok=True)
    for n in nets:
        netns.destroy(n)
    if state.get("cgroup"):
        remove_cgroups(sb.node_names)
    _forget_node_facts(sb)
    sb._reap()
    res = state.get("reservations", {})
    registry.release("ports", res.get("ports", []), sb.layout.root)
    registry.release("nets", res.get("nets", []), sb.layout.root)
    registry.release("cgroup", res.get("cgroup", []), sb.layout.root)
    if state:
        state["daemons"] = []
        state["netns"] = []
        state["reservations"] = {"ports": [], "nets": [], "cgroup": []}
        state.pop("chroot", None)
        state["down"] = True
        if sb.layout.run.is_dir():
            sb._save()
    return report


def _forget_node_facts(sb: Any) -> None:
    """Remove this sandbox's entries from the host's node-fact cache (/run/slurm-gpu/node-facts):
    its config and gres.conf are gone with it, so the entries could never be valid again."""
    from slurm_gpu import nodefacts
    for name in sb.node_names:
        entry = nodefacts.cache_file(str(sb.layout.config_toml), name, str(sb.layout.gres_conf))
        for path in (entry, entry + ".bind"):     # the entry and its binding table (spank.bindtable)
            try:
                os.unlink(path)
            except OSError:
                pass
