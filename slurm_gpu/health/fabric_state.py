"""What the fabric checks remember between runs: debounce counts, IB counters and
port history, in one small file per node (``fabric-state.<node>.json``).

Only an acting run (not ``--no-drain``) writes it, so an admin's look at a
node never advances a count.  Debounce and boot grace are applied here, once,
after every check ran (:func:`settle`):

* a drain finding of a check with a debounce count *n* (``[health] debounce``)
  is a warning until the same check has found it for the same GPU or port
  (the same message, numbers aside) in *n* runs in a row; a run without it starts the count again;
* a drain finding of a link-training or fabric-registration check, while the
  node has been up less than ``[health] boot_grace_seconds``, is a warning:
  links train and the fabric registers for minutes after a reboot (the field's
  "NVLink down" alarms after planned reboots).
"""
from __future__ import annotations

import json
import os
import re
from typing import Any

from .findings import DRAIN, WARN, Finding
from .statefiles import _node_tag

# Checks whose first findings after a boot are link training or registration
# still under way.
GRACE_CHECKS = frozenset({"gpu.nvlink", "gpu.nvlink_speed", "gpu.fabric", "gpu.fabric_registration",
                          "ib.port", "ib.errors", "svc.fabricmanager", "svc.imex"})
# Counts that need no configuration: a link that persists downtrained, a port
# whose errors keep rising.  ``[health] debounce`` overrides or adds.
DEFAULT_DEBOUNCE = {"gpu.pcie": 3, "gpu.nvlink_speed": 3, "ib.port": 2}

_DOCS: dict[str, dict[str, Any]] = {}     # this run's document, by path (loaded once, saved by settle)


def state_path(state_dir: str, node: str) -> str:
    return os.path.join(state_dir, f"fabric-state.{_node_tag(node)}.json")


def memory(opts: Any) -> dict[str, Any]:
    """This run's fabric memory (empty without a state dir or after a reboot)."""
    if not opts.state_dir:
        return _DOCS.setdefault("", {})
    path = state_path(opts.state_dir, opts.node)
    doc = _DOCS.get(path)
    if doc is None:
        from ..hw.kmsg import boot_id
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            doc = {}
        boot = boot_id() or None
        if not isinstance(doc, dict) or doc.get("boot_id") != boot:
            doc = {"boot_id": boot}             # counts and port history are per boot
        doc["_loaded"] = json.dumps(doc, sort_keys=True)
        _DOCS[path] = doc
    return doc


def fabric_root(opts: Any) -> str:
    """``[health] fabric_root`` for this node ("%n": the node's name, as the sandbox sets it)."""
    return opts.settings.fabric_root.replace("%n", opts.node)


def uptime(root: str) -> float | None:
    try:
        with open(os.path.join(root, "proc/uptime")) as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def debounce_counts(s: Any) -> dict[str, int]:
    counts = dict(DEFAULT_DEBOUNCE)
    for k, v in (s.debounce or {}).items():
        counts[str(k)] = int(v)
    return counts


def settle(findings: list[Finding], opts: Any) -> list[Finding]:
    """Apply boot grace and debounce to this run's findings; save the memory when acting."""
    s = opts.settings
    doc = memory(opts)
    up = uptime(fabric_root(opts)) if s.boot_grace_seconds > 0 else None
    grace_left = s.boot_grace_seconds - up if up is not None else 0.0
    counts = debounce_counts(s)
    old = doc.get("debounce") or {}
    new: dict[str, int] = {}
    out: list[Finding] = []
    for f in findings:
        if f.severity != DRAIN:
            out.append(f)
            continue
        if f.check in GRACE_CHECKS and grace_left > 0:
            out.append(Finding(f.check, WARN, f"{f.message} (boot grace: {grace_left:.0f} s left before "
                               "this drains)", f.gpu, f.xid))
            continue
        n = counts.get(f.check, 1)
        if n <= 1:
            out.append(f)
            continue
        # Same check, same GPU, same kind of fault (the message less its
        # numbers: a port, a link), so two faults of one check count apart.
        key = f"{f.check}|{f.gpu or ''}|{re.sub(r'[0-9.]+', '#', f.message)}"
        c = new[key] = int(old.get(key, 0)) + 1
        if c < n:
            out.append(Finding(f.check, WARN, f"{f.message} (seen in {c} of the {n} runs in a row before it "
                               "drains)", f.gpu, f.xid))
        else:
            out.append(f)
    doc["debounce"] = new
    path = state_path(opts.state_dir, opts.node) if opts.state_dir else ""
    _DOCS.pop(path, None)
    loaded = doc.pop("_loaded", None)
    if path and not opts.no_drain and json.dumps(doc, sort_keys=True) != loaded:
        from ..fsutil import atomic_write
        os.makedirs(opts.state_dir, mode=0o755, exist_ok=True)
        atomic_write(path, json.dumps(doc, sort_keys=True) + "\n", mode=0o600)
    return out
