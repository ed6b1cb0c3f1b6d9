"""``ib.port`` and ``ib.errors``: InfiniBand ports, passively from sysfs (:mod:`slurm_gpu.hw.ib`).

``ib.port`` drains the node when a port is down although the baseline (or an
earlier run of this boot) had it ACTIVE, or runs below the baseline's rate.
``ib.errors`` drains when a port's symbol and receive errors rise by
``[health] ib_error_rise`` or more between two runs: two checks, because a
down port is debounced over runs while a rise of that size is already many
observations.  A port nobody expects up (an uncabled second port) is
info.  Ethernet (RoCE) ports are not this check's.  Counters, whether a port
was seen up and how long it has been down live in the fabric memory
(:mod:`.fabric_state`), per boot.
"""
from __future__ import annotations

import time
from typing import Any

from .findings import DRAIN, INFO, WARN, Finding, not_applicable

CHECK = "ib.port"
ERRORS = "ib.errors"


def expected_rates(opts: Any, health: Any) -> dict[str, float]:
    """port -> Gb/s the baseline of this node's GPU model expects (empty without one)."""
    from .baseline import load_for_check
    doc, _ = load_for_check(opts.settings.baseline)   # a bad one: no expectation (engine warns)
    names = [g.name for g in getattr(health, "gpus", None) or [] if getattr(g, "name", None)]
    model = ((doc or {}).get("models") or {}).get(names[0] if names else "") or {}
    ib = model.get("ib") if isinstance(model, dict) else None
    return {str(k): float(v) for k, v in (ib or {}).items() if isinstance(v, (int, float))}


def check_ports(ports: dict[str, Any] | None, expected: dict[str, float], mem: dict[str, Any],
                error_rise: int, now: float) -> tuple[list[Finding], dict[str, Any]]:
    """Findings for the InfiniBand ports, and the port memory to keep (pure)."""
    ib = {k: p for k, p in (ports or {}).items() if p.link_layer == "InfiniBand"}
    if not ib:
        return [not_applicable(CHECK, "no InfiniBand port on this node"),
                not_applicable(ERRORS, "no InfiniBand port on this node")], {}
    out: list[Finding] = []
    keep: dict[str, Any] = {}
    for name, p in ib.items():
        raw = mem.get(name)
        m: dict[str, Any] = raw if isinstance(raw, dict) else {}
        want_up = name in expected or bool(m.get("active"))
        rec: dict[str, Any] = {"active": bool(m.get("active")) or p.state == "ACTIVE",
                               "counters": dict(p.counters or {}), "down_total": float(m.get("down_total", 0))}
        if p.state != "ACTIVE":
            since = float(m.get("down_since") or now)
            rec["down_since"] = since
            if want_up:
                out.append(Finding(CHECK, DRAIN, f"InfiniBand port {name} is {p.state or 'gone'} "
                                   f"({p.phys_state or 'no physical state'}), expected ACTIVE"))
                # Time down in a finding of its own: the drain reason stays one stable text.
                out.append(Finding(CHECK, INFO, f"InfiniBand port {name} down for {now - since:.0f} s, "
                                   f"{rec['down_total'] + now - since:.0f} s in all this boot"))
            else:
                out.append(Finding(CHECK, INFO, f"InfiniBand port {name} is {p.state} ({p.phys_state}); "
                                   "no baseline expects it up"))
        else:
            if m.get("down_since"):
                rec["down_total"] += now - float(m["down_since"])
            want = expected.get(name)
            if want and p.rate is not None and p.rate < want:
                out.append(Finding(CHECK, DRAIN, f"InfiniBand port {name} at {p.rate:g} Gb/s ({p.width}), "
                                   f"expected {want:g} Gb/s"))
        raw_old = m.get("counters")
        old: dict[str, Any] = raw_old if isinstance(raw_old, dict) else {}
        # A counter lower than before was reset (driver reload, perfquery -R): no delta.
        d = {c: v - int(old[c]) for c, v in (p.counters or {}).items()
             if isinstance(old.get(c), int) and v >= int(old[c])}
        if d.get("link_downed"):
            out.append(Finding(ERRORS, WARN, f"InfiniBand port {name} went down {d['link_downed']} time(s) "
                               "since the last run"))
        errs = d.get("symbol_error", 0) + d.get("port_rcv_errors", 0)
        if error_rise and errs >= error_rise:
            out.append(Finding(ERRORS, DRAIN, f"InfiniBand port {name} errors rising: symbol_error "
                               f"+{d.get('symbol_error', 0)}, port_rcv_errors +{d.get('port_rcv_errors', 0)} "
                               "since the last run"))
        keep[name] = rec
    return out, keep


def run_check(opts: Any, health: Any, want: frozenset[str] = frozenset({CHECK, ERRORS})) -> list[Finding]:
    """``ib.port`` and ``ib.errors`` (those in *want*) over this node's sysfs
    (``[health] fabric_root``), with their memory: one read for both."""
    from ..hw.ib import read_ports
    from .fabric_state import fabric_root, memory
    s = opts.settings
    doc = memory(opts)
    findings, keep = check_ports(read_ports(fabric_root(opts)), expected_rates(opts, health),
                                 doc.get("ib") or {}, s.ib_error_rise, time.time())
    doc["ib"] = keep
    return [f for f in findings if f.check in want]
