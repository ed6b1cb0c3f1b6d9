"""InfiniBand ports, read passively from ``/sys/class/infiniband`` (no MAD, no umad).

The kernel's formats (drivers/infiniband/core/sysfs.c): ``state`` and
``phys_state`` are "<n>: <NAME>", ``rate`` is "<Gb> Gb/sec (<width> <speed>)",
each counter one decimal number.  Every reader takes a root, so tests point
it at a fixture tree (tests/data/ib) and the sandbox at a node's own copy.
"""
from __future__ import annotations

import os
import re

from .plain import Plain

COUNTERS = ("link_downed", "symbol_error", "port_rcv_errors")
_RATE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec(?:\s*\(([^)]*)\))?")


class IbPort(Plain):
    """One port: ``name`` is "<hca>/<port>" (mlx5_0/1)."""

    __slots__ = ("name", "state", "phys_state", "rate", "width", "link_layer", "counters")
    _defaults = {"rate": None, "width": "", "link_layer": "InfiniBand", "counters": None}
    name: str
    state: str                     # ACTIVE, DOWN, INIT, ARMED (the name after "<n>: ")
    phys_state: str                # LinkUp, Polling, Disabled, ...
    rate: float | None             # Gb/s
    width: str                     # "4X NDR"
    link_layer: str                # InfiniBand | Ethernet
    counters: dict[str, int] | None  # COUNTERS -> int


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _name(text: str | None) -> str:
    # "4: ACTIVE" -> "ACTIVE"; a bare word stays itself.
    return (text or "").split(":", 1)[-1].strip()


def read_ports(root: str = "/") -> dict[str, IbPort] | None:
    """Every port under *root*/sys/class/infiniband (None: no such directory, no IB here)."""
    base = os.path.join(root, "sys/class/infiniband")
    try:
        hcas = sorted(os.listdir(base))
    except OSError:
        return None
    out: dict[str, IbPort] = {}
    for hca in hcas:
        pdir = os.path.join(base, hca, "ports")
        try:
            ports = sorted(os.listdir(pdir), key=lambda p: (len(p), p))
        except OSError:
            continue
        for p in ports:
            d = os.path.join(pdir, p)
            m = _RATE.match(_read(os.path.join(d, "rate")) or "")
            counters: dict[str, int] = {}
            for c in COUNTERS:
                v = _read(os.path.join(d, "counters", c))
                if v is not None and v.isdigit():
                    counters[c] = int(v)
            out[f"{hca}/{p}"] = IbPort(f"{hca}/{p}", _name(_read(os.path.join(d, "state"))),
                                       _name(_read(os.path.join(d, "phys_state"))),
                                       float(m.group(1)) if m else None, (m.group(2) or "") if m else "",
                                       (_read(os.path.join(d, "link_layer")) or "InfiniBand"), counters)
    return out
