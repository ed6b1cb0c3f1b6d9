"""``gpu.sxid``: NVSwitch SXid reports from the kernel log, classified.

The NVSwitch driver prints (open-gpu-kernel-modules, ``NVSWITCH_PRINT_SXID``)::

    nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up
    nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 22013, Non-fatal, Link 60 Minion Link DLREQ interrupt
    nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 22013, Severity 0 Engine instance 60 Sub-engine instance 00

The lines come from the same trusted reader as the XIDs (``hw/kmsg.py``:
kernel-written records only, the driver's prefix at the start of the
message; a line it cannot prove the kernel's only ever warns, like in
``gpu.xid``); here an event must match the driver's exact form, and only its
numbers are kept (the code, the switch's bus id, the link, Fatal or not),
never free text.  The catalog (``slurm_gpu/data/sxid_catalog.json``, from
NVIDIA's Fabric Manager User Guide via gpud) says whether a code is
potentially or always fatal and how to recover:

* always fatal, or the driver says ``Fatal``: drain (the fabric needs a host
  restart; NVIDIA: "Restart the host to reset the entire fabric/system");
* a non-fatal report of a code that can be fatal, or one NVIDIA pairs with a
  reboot or an inspection: warn;
* other non-fatal reports (corrected ECC, link error rates): info;
* a code not in the catalog: drain when Fatal, else warn.

The detail lines that repeat the code ("Severity 0 Engine instance ...")
are not reports of their own and are skipped.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any, Iterable

from ..paths import data_path
from .findings import DRAIN, INFO, WARN, Finding

CHECK = "gpu.sxid"
_BUS = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_SXID = re.compile(r"nvidia-nvswitch(?P<dev>\d{1,3}): SXid \(PCI:(?P<bus>" + _BUS + r")\): (?P<code>\d{5}), "
                   r"(?P<sev>Fatal|Non-fatal)(?:, Link (?P<link>\d{1,3})\b)?")


@lru_cache(maxsize=1)
def catalog() -> dict[str, Any]:
    with open(data_path("sxid_catalog.json"), encoding="utf-8") as f:
        return json.load(f)["codes"]


def parse_lines(lines: Iterable[Any]) -> list[dict[str, Any]]:
    """SXid reports in *lines* (kernel lines from ``hw/kmsg``), in order."""
    out = []
    for ln in lines:
        if getattr(ln, "cont", False):
            continue
        m = _SXID.match(ln.text)
        if m:
            ev = {"switch": int(m.group("dev")), "bus": m.group("bus").lower(), "code": int(m.group("code")),
                  "fatal": m.group("sev") == "Fatal",
                  "link": int(m.group("link")) if m.group("link") else None, "when": ln.when}
            doubt = getattr(ln, "doubt", None)
            if doubt is not None:
                # not proven the kernel's (hw/kmsg): a warning, never a drain
                at = getattr(ln, "at", -1)
                ev["untrusted"] = f"{doubt}; byte {at} of the kernel log" if isinstance(at, int) and at >= 0 else doubt
            out.append(ev)
    return out


def classify(ev: dict[str, Any]) -> tuple[str, str]:
    """(severity, catalog text) for one report."""
    e = catalog().get(str(ev["code"]))
    if e is None:
        return (DRAIN if ev["fatal"] else WARN), "not in NVIDIA's SXid catalog"
    text = e["name"] or "NVSwitch error"
    if e["always_fatal"]:
        return DRAIN, f"{text} (always fatal: restart the host to reset the fabric)"
    if ev["fatal"]:
        return DRAIN, f"{text} (fatal{': ' + e['recovery'] if e['recovery'] else ''})"
    if e["potential_fatal"] or e["event_type"] == "EventTypeFatal":
        return WARN, f"{text} (non-fatal report of an error that can be fatal)"
    return INFO, text


def check_sxid(events: list[dict[str, Any]]) -> list[Finding]:
    """One finding per (code, switch), with its worst severity and count."""
    rank = {INFO: 0, WARN: 1, DRAIN: 2}
    groups: dict[tuple[int, str, bool], tuple[str, str, dict[str, Any], int]] = {}
    for ev in events:
        sev, text = classify(ev)
        if ev.get("untrusted"):
            sev = INFO if sev == INFO else WARN
            text = f"{text}: not trusted ({ev['untrusted']}): not drained"
        key = (ev["code"], ev["bus"], bool(ev.get("untrusted")))
        if key in groups:
            s0, t0, e0, n = groups[key]
            groups[key] = (sev, text, ev, n + 1) if rank[sev] > rank[s0] else (s0, t0, e0, n + 1)
        else:
            groups[key] = (sev, text, ev, 1)
    out = []
    for (code, bus, _), (sev, text, ev, n) in groups.items():
        where = f" link {ev['link']}" if ev["link"] is not None else ""
        msg = f"SXid {code} on NVSwitch {bus}{where}: {text}" + (f" ({n} reports)" if n > 1 else "")
        out.append(Finding(CHECK, sev, msg, None))
    return out
