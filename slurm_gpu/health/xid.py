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

Only the driver's own words count (issue 10).  The reader keeps kernel-written
lines only (``hw/kmsg.py``); here an event must *start* the line in one of
the driver's exact forms, and continuation lines of a multi-line record never
start one.  The driver's version-mismatch message echoes a string the client
chose, newlines included: every line of that record is dropped.  Inside an
Xid line only the driver's fields are read (code, bus id, the trailing
"caused by previous Xid N"), never the task name a job chose.  The finding's
message holds only our words: XID number, bus id, catalog text, and names
from fixed tables.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable, Mapping

from ..paths import data_path
from .findings import DRAIN, INFO, WARN, Finding

CHECK = "gpu.xid"

_BUS = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
# The driver's forms, matched from the start of the message: the Xid line
# ("..." where a reporter redacted the bus), the one-line "fallen off the bus"
# (NV_DEV_PRINTF prefixes "NVRM: GPU <bus>: "; older drivers "GPU at PCI:<bus>"),
# and the three-line one (nv.c) whose first line names the GPU.
# On a GPU in MIG mode the driver names the GPU (and compute) instance it
# attributes the Xid to: "(PCI:0000:01:00 GPU-I:05 GPU-CI:01)" (kernel_rc.c).
_XID = re.compile(r"NVRM: Xid \(PCI:(?P<bus>" + _BUS + r"|\.\.\.)(?: GPU-I:\d{1,4}(?: GPU-CI:\d{1,4})?)?\): "
                  r"(?P<code>\d{1,4})(?:,\s*(?P<rest>.*))?")
_OFF_BUS_ONE = re.compile(r"NVRM: GPU (?:at PCI:)?(?P<bus>" + _BUS + r"): GPU has fallen off the bus\.?\s*")
_OFF_BUS_3 = (re.compile(r"NVRM: The NVIDIA GPU (?P<bus>" + _BUS + r")\s*"),
              re.compile(r"NVRM: \(PCI ID: [0-9a-fA-F]{4}:[0-9a-fA-F]{4}\) installed in this system has\s*"),
              re.compile(r"NVRM: fallen off the bus and is not responding to commands\.\s*"))
_ECHOES_CLIENT = ("NVRM: API mismatch:",)   # driver messages that print a client-chosen string
# How many kept lines one record can hold, for a log without stamps: a printk
# record holds at most 1-2 KB of text (by kernel version), a kept line is at
# least "NVRM: " and its newline.  With stamps the stamp ends the record: a
# client string can hold any number of short "NVRM: " lines, so no line count
# may end the echo there (a count of 12 let the 13th line drain a node).
ECHO_MAX_LINES = 2048 // 7 + 1
SAME_SECOND = ("logged in the same second as the driver's \"API mismatch\" message, which echoes text a "
               "client chose, and the log's 1-second stamps cannot tell them apart")
NO_STAMP = ("logged after the driver's \"API mismatch\" message, which echoes text a client chose, in a log "
            "without time stamps")
# A stamp finer than a second ("12.345678", "...T11:43:09.123456", kmsg's
# microseconds): lines sharing one are one record, split by a syslog daemon.
_PRECISE = re.compile(r".*[.,]\d|\d+$")
_AER = re.compile(r"(?P<dev>" + _BUS + r"): AER: Uncorrected")
# Only at the end of the line: the task name (name=...) comes before it.
_CAUSE = re.compile(r"\bcaused by previous Xid (\d{1,4})\s*$", re.I)
_NVL5 = re.compile(r"^(?P<unit>[A-Z][A-Z0-9_/]*)\s+(?P<sev>Fatal|Non-?fatal)\b(?:.*?Link\s+(?P<link>-?\d+))?"
                   r"(?:\s*\((?P<words>0x[0-9a-fA-F]+(?:\s+0x[0-9a-fA-F]+)*))?", re.I)
_RECOVERY_TO = re.compile(r"^GPU recovery action changed from \S+(?: \([^)]*\))? to (0x[0-9a-fA-F]{1,8}|\d{1,9})\b",
                          re.I)


# NVML recovery actions after which the GPU runs nothing until it is reset or
# the machine restarts (the driver's recovery actions: GPU_RESET 1,
# NODE_REBOOT 2, BUS_RESET 6, SYSTEM_REBOOT 7).  DRAIN_P2P (3) and
# DRAIN_AND_RESET (4) let running work finish.
FATAL_RECOVERY = frozenset({1, 2, 6, 7})


@lru_cache(maxsize=1)
def catalog() -> dict[str, Any]:
    """The shipped catalog (codes keyed by str(code), NVLink5 rules, provenance)."""
    with open(data_path("xid_catalog.json")) as f:
        return json.load(f)


@lru_cache(maxsize=1)
def known_units() -> frozenset[str]:
    """NVLink5 unit names the decode table knows (each alias of "A/B" rows too)."""
    names: set[str] = set()
    for rule in catalog()["nvlink5_rules"]:
        names.update(a for a in re.split(r"[/,() ]", rule["unit"]) if a)
    return frozenset(names)


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
    untrusted: str | None = None    # why the line is not proven the kernel's: warn, never drain


@dataclass
class Verdict:
    """What one XID report means: the action, its kind and our words for it."""

    action: str
    kind: str
    detail: str
    bucket: str = ""
    extra: list[str] = field(default_factory=list)
    job: str = "none"               # the catalog's "job": "fatal", "process" or "none"


# ------------------------------------------------------------------ parsing

def parse_lines(lines: Iterable[Any]) -> list[XidEvent]:
    """XID events in *lines* (objects with ``.text``, ``.when`` and ``.cont``), in order."""
    events: list[XidEvent] = []
    off_bus: tuple[str | None, int, Any] | None = None  # three-line "fallen off the bus": bus, lines seen, time
    last_aer: str | None = None
    # (timestamp, lines left, dmesg indents its record's lines, an indented line seen) of a client-echo record
    echo: tuple[Any, int, bool, bool] | None = None
    for ln in lines:
        text: str = ln.text
        cont = bool(getattr(ln, "cont", False))
        doubt = getattr(ln, "doubt", None)
        if doubt is not None:
            # Not proven the kernel's: reported (a warning), never part of a
            # sequence and never an event that drains.
            _add_doubt(events, text, ln, doubt)
            continue
        if echo is not None:
            if cont:
                echo = (echo[0], echo[1], echo[2], True)
                continue                             # the echoed record's own lines
            if echo[0] is None and echo[2] and echo[3]:
                # dmesg indented the record's own lines (the driver's trailer
                # always follows the client's text): a line it did not indent
                # is another record.  (dmesg -S indents none: never closed here.)
                echo = None
            elif echo[0] is None and echo[1] > 0:
                # No stamp to end the echoed record: every line inside the
                # window may be the client's text, whatever stamp it shows
                # (a forged one must not close the window).
                echo = (None, echo[1] - 1, echo[2], echo[3])
                _add_doubt(events, text, ln, NO_STAMP)
                continue
            elif ln.when == echo[0] and (ln.when is not None or echo[1] > 0):
                echo = (echo[0], echo[1] - 1, echo[2], echo[3])
                if ln.when is None or not _PRECISE.match(ln.when):
                    # One second (or no stamp) holds both the echoed client text
                    # and any other record: neither drained nor silently dropped.
                    _add_doubt(events, text, ln, NO_STAMP if ln.when is None else SAME_SECOND)
                continue                             # the same precise stamp: that record's line
            else:
                echo = None
        if off_bus is not None:
            bus, seen, first_when = off_bus
            if (cont or ln.when == first_when) and _OFF_BUS_3[seen].fullmatch(text):
                seen += 1
                if seen == len(_OFF_BUS_3):
                    events.append(XidEvent(code=79, gpu=bus, text="GPU has fallen off the bus (no Xid line)",
                                           when=ln.when, synthesized=True, after_aer=last_aer))
                    off_bus = None
                else:
                    off_bus = (bus, seen, first_when)
                continue
            off_bus = None
        if cont:
            continue                                 # a continuation never starts an event
        if text.startswith(_ECHOES_CLIENT):
            echo = (ln.when, ECHO_MAX_LINES, bool(getattr(ln, "indents", False)), False)
            continue
        a = _AER.match(text)
        if a:
            last_aer = normalize_bus(a.group("dev"))
            continue
        m = _XID.fullmatch(text)
        if m:
            events.append(_xid_event(m, ln.when, last_aer))
            continue
        m = _OFF_BUS_ONE.fullmatch(text)
        if m:
            events.append(XidEvent(code=79, gpu=normalize_bus(m.group("bus")),
                                   text="GPU has fallen off the bus (no Xid line)", when=ln.when,
                                   synthesized=True, after_aer=last_aer))
            continue
        m = _OFF_BUS_3[0].fullmatch(text)
        if m:
            off_bus = (normalize_bus(m.group("bus")), 1, ln.when)
    return events


def _add_doubt(events: list[XidEvent], text: str, ln: Any, why: str) -> None:
    """An event for a driver line that is not proven the kernel's (``untrusted`` says why and where)."""
    at = getattr(ln, "at", -1)
    where = f"{why}; byte {at} of the kernel log" if isinstance(at, int) and at >= 0 else why
    m = _XID.fullmatch(text)
    if m:
        ev = _xid_event(m, ln.when, None)
    else:
        m = _OFF_BUS_ONE.fullmatch(text) or _OFF_BUS_3[0].fullmatch(text)
        if m is None:
            return
        ev = XidEvent(code=79, gpu=normalize_bus(m.group("bus")), text="GPU has fallen off the bus (no Xid line)",
                      when=ln.when, synthesized=True)
    ev.untrusted = where
    events.append(ev)


def _xid_event(m: re.Match[str], when: str | None, last_aer: str | None) -> XidEvent:
    rest = (m.group("rest") or "").strip()
    ev = XidEvent(code=int(m.group("code")), gpu=normalize_bus(m.group("bus")), text=rest, when=when)
    c = _CAUSE.search(rest)
    if c:
        ev.cause = int(c.group(1))
    if 144 <= ev.code <= 150:
        d = _NVL5.match(rest)
        if d:
            ev.unit = d.group("unit").upper()
            ev.log_severity = d.group("sev").lower().replace("-", "")
            link = d.group("link")
            ev.link = int(link) if link and len(link) <= 4 else None
            ev.words = tuple(int(w, 16) for w in (d.group("words") or "").split()[:6] if len(w) <= 10)
    if ev.code == 79 and last_aer:
        ev.after_aer = last_aer
    return ev


def events_from_nvml(records: Iterable[dict[str, Any]]) -> tuple[list[XidEvent], list[Finding]]:
    """Split ``xid-watch`` records into XID events and direct findings."""
    xids: list[XidEvent] = []
    direct: list[Finding] = []
    for r in records:
        kind = r.get("event")
        raw_gpu = r.get("gpu")
        gpu = normalize_bus(raw_gpu) if isinstance(raw_gpu, str) and len(raw_gpu) <= 16 else None
        code = r.get("xid")
        if kind == "xid" and isinstance(code, int) and not isinstance(code, bool) and 0 <= code < 10000:
            xids.append(XidEvent(code=r["xid"], gpu=gpu, when=r.get("time"), source="nvml"))
        elif kind == "dbe":
            direct.append(Finding("gpu.ecc", DRAIN, f"NVML double-bit ECC event on {gpu}", gpu, fatal=True))
        elif kind == "gpu_unavailable":
            direct.append(Finding("gpu.count", DRAIN, f"NVML reports GPU {gpu} unavailable", gpu, fatal=True))
        elif kind == "recovery_action":
            action = r.get("data") or 0
            if not isinstance(action, int) or isinstance(action, bool) or not 0 <= action < 1 << 32:
                continue
            if action:
                from .gpu_checks import RECOVERY_NAMES
                direct.append(Finding("gpu.recovery", DRAIN,
                                      f"GPU {gpu} needs {RECOVERY_NAMES.get(action, f'recovery action {action}')}",
                                      gpu, fatal=action in FATAL_RECOVERY))
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
        return Verdict(action, "nvlink5", detail, res, job="fatal" if res == "RESET_GPU" else "none")
    if ev.unit is not None:
        # Not in the table: trust the driver's own Fatal/Nonfatal word.  The
        # unit is named only when the catalog knows it (a reason carries no log text).
        action = DRAIN if fatal_in_log else WARN
        unit = ev.unit if ev.unit in known_units() else "NVLink unit"
        return Verdict(action, "nvlink5", f"{unit} {'Fatal' if fatal_in_log else 'Nonfatal'}{where}"
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
            return Verdict(prior.action, prior.kind, f"{base['description'].split(' --')[0]}, "
                           f"caused by previous Xid {ev.cause} ({prior.detail})", base["immediate"], job=prior.job)
        if cause is not None and cause["kind"] not in ("application", "informational"):
            return Verdict(cause["action"], cause["kind"],
                           f"{base['description'].split(' --')[0]}, caused by previous Xid {ev.cause} "
                           f"({cause['description']})", base["immediate"], job=cause.get("job", "none"))
        return Verdict(INFO, "application", f"{base['description'].split(' --')[0]}, caused by previous "
                       f"Xid {ev.cause}", base["immediate"])
    if ev.code == 154:
        m = _RECOVERY_TO.search(ev.text)
        if m:
            from .gpu_checks import RECOVERY_NAMES
            to = int(m.group(1), 0)
            name = RECOVERY_NAMES.get(to, f"action {to}")
            return Verdict(INFO if to == 0 else DRAIN, "recovery", f"GPU recovery action changed to {name}",
                           base["immediate"], job="fatal" if to in FATAL_RECOVERY else "none")
        if ev.source == "nvml":
            # An NVML event carries only the code, not the new action, and the
            # driver also reports 154 when the action goes back to None after a
            # reset.  The kernel line and gpu.recovery (the action itself) decide.
            return Verdict(WARN, "recovery", "GPU recovery action changed (NVML event; gpu.recovery reads "
                           "the action)", base["immediate"])
    desc = base["description"]
    if desc == "Unused":
        desc = f"{base['mnemonic']} (unused code on current drivers)"
    return Verdict(base["action"], base["kind"], desc.split(" --")[0], base["immediate"], job=base.get("job", "none"))


def check_xid(events: Iterable[XidEvent], memo: dict[str, dict[str, str]] | None = None,
              confirmed: Mapping[str, str] | None = None) -> list[Finding]:
    """``gpu.xid``: one finding per (code, GPU), carrying its worst action and count.

    *memo* (updated in place) carries NVLink5 verdicts decoded from kernel
    lines between runs, so that "45 ... caused by previous Xid 145" follows
    the decoded 145 even when the cursor split the two lines across runs.

    *confirmed* (bus id -> what NVML says, ``onfatal.nvml_confirms``): GPUs
    whose NVML state in this run proves them dead (lost, or needing a reset or
    reboot).  A report not proven the kernel's that names such a GPU is
    classified as the kernel's would be: NVML, which no user can write,
    proves the fault; the line only names it.
    """
    decoded: dict[tuple[int, str | None], Verdict] = {}
    for key, v in (memo or {}).items():
        code, _, gpu = key.partition("|")
        decoded[(int(code), gpu or None)] = Verdict(v["action"], v.get("kind", "nvlink5"), v.get("detail", ""))
    groups: dict[tuple[int, str | None], tuple[Verdict, XidEvent, int]] = {}
    rank = {INFO: 0, WARN: 1, DRAIN: 2}
    doubts: list[XidEvent] = []
    backed: dict[tuple[int, str | None], str] = {}
    for ev in events:
        if ev.untrusted is not None:
            if not (ev.gpu and confirmed and ev.gpu in confirmed):
                doubts.append(ev)   # feeds no chain, no memo and no trusted report's verdict
                continue
            backed[(ev.code, ev.gpu)] = confirmed[ev.gpu]
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
        if (code, gpu) in backed:
            msg += f" [log line not proven the kernel's; NVML: {backed[(code, gpu)]}]"
        out.append(Finding(CHECK, v.action, msg, gpu, code, fatal=v.action == DRAIN and v.job == "fatal"))
    return out + _doubt_findings(doubts)


def _doubt_findings(events: list[XidEvent]) -> list[Finding]:
    """One warning per (code, GPU) for reports whose kernel origin is not proven.

    What the report would have meant decides only between info (an
    application error) and warn; such a report never drains.
    """
    groups: dict[tuple[int, str | None], tuple[Verdict, XidEvent, int]] = {}
    for ev in events:
        v = classify(ev)
        key = (ev.code, ev.gpu)
        if key in groups:
            gv, gev, n = groups[key]
            groups[key] = (v, ev, n + 1) if gv.action == INFO and v.action != INFO else (gv, gev, n + 1)
        else:
            groups[key] = (v, ev, 1)
    out: list[Finding] = []
    for (code, gpu), (v, ev, n) in groups.items():
        msg = f"Xid {code} on {gpu or 'unknown GPU'}: {v.detail}: not trusted ({ev.untrusted}): not drained"
        if n > 1:
            msg += f" ({n} reports)"
        out.append(Finding(CHECK, INFO if v.action == INFO else WARN, msg, gpu, code))
    return out
