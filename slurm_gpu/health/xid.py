"""``gpu.xid``: classify NVIDIA XID reports with NVIDIA's own catalog.

Pure code: kernel lines (and ``xid-watch`` event records) in, findings out.

* The catalog (``slurm_gpu/data/xid_catalog.json``, generated from NVIDIA's
  Xid catalog, 172 codes) gives each code a resolution bucket, and the
  generator maps each bucket to an action: ``drain``, ``warn`` or ``info``.
* Application XIDs (13, 31, 43, 45, 68, 109 and every ``RESTART_APP`` code)
  are ``info``: a user's bug must never drain a node.
* ``... caused by previous Xid N`` makes the report follow N: a 45 after a
  hardware Xid takes that Xid's action, a 45 on its own stays an app error.
* NVLink5 XIDs 144-150 carry a unit, Fatal/Nonfatal, a link and six words;
  the first word (intrinfo) and the second (error status) select a row of
  NVIDIA's decode table, whose resolution decides the action.
* "GPU has fallen off the bus" without an Xid line (newer drivers print it
  on three lines) counts as Xid 79; a preceding PCIe AER report is named.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable

from ..paths import data_file
from .findings import DRAIN, INFO, WARN, Finding

CHECK = "gpu.xid"

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<bus>[^)]*)\):\s*(?P<code>\d+)\s*,?\s*(?P<rest>.*)")
_CAUSE = re.compile(r"caused by previous Xid (\d+)", re.I)
_NVL5 = re.compile(r"^(?P<unit>[A-Z][A-Z0-9_/]*)\s+(?P<sev>Fatal|Non-?fatal)\b(?:.*?Link\s+(?P<link>-?\d+))?"
                   r"(?:\s*\((?P<words>0x[0-9a-fA-F]+(?:\s+0x[0-9a-fA-F]+)*))?", re.I)
_BUS_IN_TEXT = re.compile(r"\b([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\b")
_RECOVERY_TO = re.compile(r"\bto\s+(0x[0-9a-fA-F]+|\d+)\s*(?:\((?P<name>[^)]*)\))?", re.I)


@lru_cache(maxsize=1)
def catalog() -> dict[str, Any]:
    """The shipped catalog (codes keyed by str(code), NVLink5 rules, provenance)."""
    with open(data_file("xid_catalog.json")) as f:
        return json.load(f)


def entry(code: int) -> dict[str, Any] | None:
    return catalog()["codes"].get(str(code))


def normalize_bus(raw: str) -> str | None:
    """``0000:02:00`` (Xid lines print no function) -> ``0000:02:00.0``; ``...`` -> None."""
    s = raw.strip().lower()
    m = re.fullmatch(r"(?:([0-9a-f]{4,8}):)?([0-9a-f]{2}):([0-9a-f]{2})(?:\.([0-7]))?", s)
    if not m:
        return None
    dom = int(m.group(1) or "0", 16) & 0xFFFF
    return f"{dom:04x}:{m.group(2)}:{m.group(3)}.{m.group(4) or '0'}"


@dataclass
class XidEvent:
    """One XID report, as parsed from a kernel line or an NVML event."""

    code: int
    gpu: str | None
    text: str = ""
    when: str | None = None
    cause: int | None = None
    source: str = "kernel"          # "kernel" or "nvml"
    synthesized: bool = False       # fallen-off-the-bus message without an Xid line
    after_aer: str | None = None    # PCIe device whose AER report came first
    unit: str | None = None         # NVLink5 decode
    log_severity: str | None = None
    link: int | None = None
    words: tuple[int, ...] = ()


@dataclass
class Verdict:
    action: str
    kind: str
    detail: str
    bucket: str = ""
    extra: list[str] = field(default_factory=list)


# ------------------------------------------------------------------ parsing

def parse_lines(lines: Iterable[Any]) -> list[XidEvent]:
    """XID events in *lines* (objects with ``.text`` and ``.when``), in order."""
    events: list[XidEvent] = []
    pending_bus: str | None = None      # "NVRM: The NVIDIA GPU <bus>" waiting for its 3rd line
    pending_age = 0
    last_aer: str | None = None
    for ln in lines:
        text = ln.text
        pending_age += 1
        if "AER: Uncorrected" in text:
            last_aer = text.split(": AER:", 1)[0].strip() or "PCIe"
            continue
        m = _XID.search(text)
        if m:
            rest = m.group("rest").strip()
            ev = XidEvent(code=int(m.group("code")), gpu=normalize_bus(m.group("bus")), text=rest,
                          when=ln.when)
            c = _CAUSE.search(rest)
            if c:
                ev.cause = int(c.group(1))
            if 144 <= ev.code <= 150:
                d = _NVL5.search(rest)
                if d:
                    ev.unit = d.group("unit").upper()
                    ev.log_severity = d.group("sev").lower().replace("-", "")
                    ev.link = int(d.group("link")) if d.group("link") else None
                    ev.words = tuple(int(w, 16) for w in (d.group("words") or "").split())
            if ev.code == 79 and last_aer:
                ev.after_aer = last_aer
            events.append(ev)
            continue
        low = text.lower()
        if "nvrm: the nvidia gpu" in low:
            b = _BUS_IN_TEXT.search(text)
            pending_bus, pending_age = (normalize_bus(b.group(1)) if b else None), 0
            if "fallen off the bus" not in low:
                continue
        if "fallen off the bus" in low:
            b = _BUS_IN_TEXT.search(text)
            bus = normalize_bus(b.group(1)) if b else (pending_bus if pending_age <= 3 else None)
            events.append(XidEvent(code=79, gpu=bus, text="GPU has fallen off the bus (no Xid line)",
                                   when=ln.when, synthesized=True, after_aer=last_aer))
            pending_bus = None
    return events


def events_from_nvml(records: Iterable[dict[str, Any]]) -> tuple[list[XidEvent], list[Finding]]:
    """Split ``xid-watch`` records into XID events and direct findings."""
    xids: list[XidEvent] = []
    direct: list[Finding] = []
    for r in records:
        kind = r.get("event")
        gpu = r.get("gpu")
        if kind == "xid" and isinstance(r.get("xid"), int):
            xids.append(XidEvent(code=r["xid"], gpu=gpu, when=r.get("time"), source="nvml"))
        elif kind == "dbe":
            direct.append(Finding("gpu.ecc", DRAIN, f"NVML double-bit ECC event on {gpu}", gpu))
        elif kind == "gpu_unavailable":
            direct.append(Finding("gpu.count", DRAIN, f"NVML reports GPU {gpu} unavailable", gpu))
        elif kind == "recovery_action":
            action = int(r.get("data") or 0)
            if action:
                from .gpu_checks import RECOVERY_NAMES
                direct.append(Finding("gpu.recovery", DRAIN,
                                      f"GPU {gpu} needs {RECOVERY_NAMES.get(action, f'recovery action {action}')}",
                                      gpu))
    return xids, direct


# ---------------------------------------------------------- classification

def _pattern_matches(pattern: str, value: int) -> bool:
    if len(pattern) != 32:
        return False
    for idx, ch in enumerate(pattern):
        bit = (value >> (31 - idx)) & 1
        if (ch == "1" and not bit) or (ch == "0" and bit):
            return False
    return True


def _unit_matches(rule_unit: str, log_unit: str) -> bool:
    norm = re.sub(r"[^A-Z0-9_]", "", log_unit.upper().replace("-", "_"))
    aliases = [a for a in re.split(r"[/,() ]", rule_unit) if a] + [rule_unit]
    return any(re.sub(r"[^A-Z0-9_]", "", a.upper()) == norm for a in aliases)


def decode_nvlink5(ev: XidEvent) -> dict[str, Any] | None:
    """The decode-table row for an NVLink5 event (unit, intrinfo, error status)."""
    if ev.unit is None or len(ev.words) < 2:
        return None
    intrinfo, status = ev.words[0], ev.words[1]
    for rule in catalog()["nvlink5_rules"]:
        if rule["xid"] != ev.code or rule["error_status"] != status:
            continue
        if not _unit_matches(rule["unit"], ev.unit):
            continue
        if _pattern_matches(rule["intrinfo_v2"], intrinfo) or _pattern_matches(rule["intrinfo_v1"], intrinfo):
            return rule
    return None


def _nvlink5_verdict(ev: XidEvent, base: dict[str, Any]) -> Verdict:
    fatal_in_log = ev.log_severity == "fatal"
    where = f" link {ev.link}" if ev.link is not None and ev.link >= 0 else ""
    rule = decode_nvlink5(ev)
    if rule is not None:
        sev = rule["severity"].lower()
        fatal = "fatal" in sev and "non-fatal" not in sev
        res = rule["resolution"]
        if res == "RESET_GPU":
            action = DRAIN
        elif res == "XID_154_EVAL":
            action = WARN       # the driver follows up with Xid 154 when a reset is needed
        else:
            action = WARN if fatal else INFO
        hint = rule["investigatory"]
        detail = f"{rule['unit']} {rule['severity']}{where}, status 0x{rule['error_status']:x}: {res}"
        if hint and hint not in ("IGNORE", "CONTACT_SUPPORT"):
            detail += f" ({hint})"
        return Verdict(action, "nvlink5", detail, res)
    if ev.unit is not None:
        # Not in the table: trust the driver's own Fatal/Nonfatal word.
        action = DRAIN if fatal_in_log else WARN
        return Verdict(action, "nvlink5", f"{ev.unit} {'Fatal' if fatal_in_log else 'Nonfatal'}{where}"
                       " (no decode-table row)", base["immediate"])
    if ev.source == "nvml":
        return Verdict(WARN, "nvlink5", f"{base['description']} (NVML event; the kernel line decides)",
                       base["immediate"])
    return Verdict(base["action"], "nvlink5", base["description"], base["immediate"])


def classify(ev: XidEvent, decoded: dict[tuple[int, str | None], Verdict] | None = None) -> Verdict:
    """The action for one event (``decoded``: verdicts of earlier events, for chains)."""
    base = entry(ev.code)
    if base is None:
        return Verdict(WARN, "unknown", f"Xid {ev.code} is not in NVIDIA's catalog", "")
    if 144 <= ev.code <= 150:
        return _nvlink5_verdict(ev, base)
    if ev.cause is not None:
        cause = entry(ev.cause)
        prior = (decoded or {}).get((ev.cause, ev.gpu))
        if prior is not None:
            v = Verdict(prior.action, prior.kind, f"{base['description'].split(' --')[0]}, "
                        f"caused by previous Xid {ev.cause} ({prior.detail})", base["immediate"])
            return v
        if cause is not None and cause["kind"] not in ("application", "informational"):
            return Verdict(cause["action"], cause["kind"],
                           f"{base['description'].split(' --')[0]}, caused by previous Xid {ev.cause} "
                           f"({cause['description']})", base["immediate"])
        return Verdict(INFO, "application", f"{base['description'].split(' --')[0]}, caused by previous "
                       f"Xid {ev.cause}", base["immediate"])
    if ev.code == 154:
        m = _RECOVERY_TO.search(ev.text)
        if m:
            to = int(m.group(1), 0)
            name = m.group("name") or f"action {to}"
            return Verdict(INFO if to == 0 else DRAIN, "recovery", f"GPU recovery action changed to {name}",
                           base["immediate"])
        if ev.source == "nvml":
            # An NVML event carries only the code, not the new action, and the
            # driver also reports 154 when the action goes back to None after a
            # reset.  The kernel line and gpu.recovery (the action itself) decide.
            return Verdict(WARN, "recovery", "GPU recovery action changed (NVML event; gpu.recovery reads "
                           "the action)", base["immediate"])
    desc = base["description"]
    if desc == "Unused":
        desc = f"{base['mnemonic']} (unused code on current drivers)"
    return Verdict(base["action"], base["kind"], desc.split(" --")[0], base["immediate"])


def check_xid(events: Iterable[XidEvent], memo: dict[str, dict[str, str]] | None = None) -> list[Finding]:
    """``gpu.xid``: one finding per (code, GPU), carrying its worst action and count.

    *memo* (updated in place) carries NVLink5 verdicts decoded from kernel
    lines between runs, so that "45 ... caused by previous Xid 145" follows
    the decoded 145 even when the cursor split the two lines across runs.
    """
    decoded: dict[tuple[int, str | None], Verdict] = {}
    for key, v in (memo or {}).items():
        code, _, gpu = key.partition("|")
        decoded[(int(code), gpu or None)] = Verdict(v["action"], v.get("kind", "nvlink5"), v.get("detail", ""))
    groups: dict[tuple[int, str | None], tuple[Verdict, XidEvent, int]] = {}
    rank = {INFO: 0, WARN: 1, DRAIN: 2}
    for ev in events:
        v = classify(ev, decoded)
        key = (ev.code, ev.gpu)
        prev = decoded.get(key)
        if prev is None or rank[v.action] >= rank[prev.action]:
            decoded[key] = v
        if memo is not None and 144 <= ev.code <= 150 and ev.source == "kernel":
            memo[f"{ev.code}|{ev.gpu or ''}"] = {"action": v.action, "kind": v.kind, "detail": v.detail}
        if key in groups:
            gv, gev, n = groups[key]
            if rank[v.action] > rank[gv.action]:
                groups[key] = (v, ev, n + 1)
            else:
                groups[key] = (gv, gev, n + 1)
        else:
            groups[key] = (v, ev, 1)
    out: list[Finding] = []
    for (code, gpu), (v, ev, n) in groups.items():
        msg = f"Xid {code} on {gpu or 'unknown GPU'}: {v.detail}"
        if ev.after_aer:
            msg += f", after a PCIe AER uncorrected error at {ev.after_aer}"
        if ev.synthesized:
            msg += " [driver printed no Xid line]"
        if v.kind == "application":
            msg += " [application error: node stays up]"
        if n > 1:
            msg += f" ({n} reports)"
        out.append(Finding(CHECK, v.action, msg, gpu, code))
    return out
