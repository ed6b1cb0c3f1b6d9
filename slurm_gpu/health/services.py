"""The daemons the NVLink fabric depends on, checked only where they apply.

* ``svc.fabricmanager``: ``nv-fabricmanager`` where NVSwitches are local
  (HGX/DGX boards: NVIDIA PCI bridges of class 0x0680 under
  ``/sys/bus/pci/devices``).  A GB200 compute tray has no local NVSwitch:
  its switches are managed from the switch trays, so the check does not
  apply there.  Without it no new NVLink job starts, while per-GPU checks
  stay green (the field's 20-day outage);
* ``svc.imex``: ``nvidia-imex`` where a node-wide IMEX domain is expected:
  ``/etc/nvidia-imex/nodes_config.cfg`` lists peers and ``[imex] mode`` is
  not "per-job" (a per-job daemon is the prolog's, and idle between jobs);
* ``svc.hostengine``: ``nv-hostengine`` where DCGM checks are on
  (``[health] dcgm_level`` or ``[repair] dcgm_gate``): a warning, as
  ``gpu.dcgm`` itself then says what it could not run.

A daemon is "running" when a process of that name is (``/proc/*/comm``, as
``os.persistenced`` looks), under ``[health] fabric_root``, and both its
``/proc`` entry's owner and its *real* uid are root's: any user can name a
process ``nv-fabricmanager``, and a set-user-ID program run through a link of
that name (``ln -s /usr/bin/su nv-fabricmanager``) is a root-owned process
whose real uid is still the user's.
"""
from __future__ import annotations

import os
from typing import Any

from .fabric_state import fabric_root
from .findings import DRAIN, WARN, Finding, not_applicable

NVIDIA = "0x10de"
BRIDGE_OTHER = "0x0680"          # PCI class 06 (bridge), subclass 80 (other): how NVSwitches enumerate
IMEX_NODES = "etc/nvidia-imex/nodes_config.cfg"
_SCANS: dict[tuple[str, float], frozenset[str]] = {}


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _real_uid(status: str) -> int | None:
    """The real uid from ``/proc/PID/status`` (``Uid:`` real, effective, saved, fs)."""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            f = line.split()
            return int(f[1]) if len(f) > 1 and f[1].isdigit() else None
    return None


def processes(root: str, run_key: float) -> frozenset[str]:
    """The comm names of the processes under *root* that the owner of its
    ``proc`` (root on a real node) runs, by ``/proc`` entry and by real uid,
    one scan per run: a user's process named ``nv-fabricmanager`` must not
    hide a dead service."""
    key = (root, run_key)
    got = _SCANS.get(key)
    if got is None:
        names = set()
        proc = os.path.join(root, "proc")
        try:
            owner = os.stat(proc).st_uid
            pids = [p for p in os.listdir(proc) if p.isdigit()]
        except OSError:
            owner, pids = 0, []
        for p in pids:
            try:
                if os.stat(os.path.join(proc, p)).st_uid != owner:
                    continue
            except OSError:
                continue
            if _real_uid(_read(os.path.join(proc, p, "status"))) != owner:
                continue            # a set-user-ID program a user started, or gone
            c = _read(os.path.join(proc, p, "comm"))
            if c:
                names.add(c)
        _SCANS.clear()
        got = _SCANS[key] = frozenset(names)
    return got


def local_nvswitches(root: str) -> int:
    base = os.path.join(root, "sys/bus/pci/devices")
    try:
        devs = os.listdir(base)
    except OSError:
        return 0
    return sum(1 for d in devs if _read(os.path.join(base, d, "vendor")) == NVIDIA
               and _read(os.path.join(base, d, "class")).startswith(BRIDGE_OTHER))


def imex_expected(root: str) -> bool:
    peers = [ln for ln in _read(os.path.join(root, IMEX_NODES)).splitlines() if ln.strip()
             and not ln.lstrip().startswith("#")]
    if not peers:
        return False
    from ..config import load_raw
    mode = (load_raw().get("imex") or {}).get("mode", "off")
    return mode != "per-job"


def _running(names: frozenset[str], comm: str) -> bool:
    return any(n.startswith(comm[:15]) for n in names)    # comm is cut at 15 characters


def check_fabricmanager(g: Any) -> list[Finding]:
    root = fabric_root(g.opts)
    n = local_nvswitches(root)
    if not n:
        return [not_applicable("svc.fabricmanager", "no NVSwitch on this node")]
    if _running(processes(root, g.deadline), "nv-fabricmanager"):
        return []
    # The count of switches stays out of the text: a drain reason is one stable line.
    return [Finding("svc.fabricmanager", DRAIN, "nvidia-fabricmanager is not running on a node with NVSwitches")]


def check_imex(g: Any) -> list[Finding]:
    root = fabric_root(g.opts)
    if not imex_expected(root):
        return [not_applicable("svc.imex", "no node-wide IMEX domain here")]
    if _running(processes(root, g.deadline), "nvidia-imex"):
        return []
    return [Finding("svc.imex", DRAIN, f"nvidia-imex is not running (node-wide IMEX domain in /{IMEX_NODES})")]


def check_hostengine(g: Any) -> list[Finding]:
    s = g.opts.settings
    gate = getattr(g.opts.repair, "dcgm_gate", 0) if g.opts.repair is not None else 0
    if not (s.dcgm_level or gate):
        return [not_applicable("svc.hostengine", "DCGM checks are off")]
    if _running(processes(fabric_root(g.opts), g.deadline), "nv-hostengine"):
        return []
    return [Finding("svc.hostengine", WARN, "nv-hostengine is not running (DCGM checks are on)")]
