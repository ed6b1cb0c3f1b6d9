"""``gpu.dcgm``: NVIDIA DCGM's active diagnostic (``dcgmi diag -r 1|2|3 -j``), opt-in.

Parses both JSON layouts dcgmi writes (tests/data/dcgm/PROVENANCE.md):

* DCGM 4: ``{"DCGM Diagnostic": {"test_categories": [{"category", "tests":
  [{"name", "results": [{"entity_group": "GPU", "entity_id": N, "status":
  "Pass|Fail|Warn|Skip", "warnings": [{"warning", "error_id",
  "error_severity", ...}], "info": [...]}], "test_summary": {...}}]}]}}``;
* DCGM 3: ``{"DCGM GPU Diagnostic": {...}}`` with ``"gpu_ids": "0,1"`` and
  upper-case statuses;
* either one's refusal: ``{"DCGM Diagnostic": {"runtime_error": "...",
  "version": ...}}``.

Verdicts: a ``Fail`` result drains its GPU unless every warning it carries
has severity ``DCGM_ERROR_MONITOR`` (1: "can perform workload, but needs to
be monitored"), which warns; a refusal because of MIG is a clear skip (the
diagnostic needs whole GPUs); any other refusal or unparsable output warns
(the check could not judge); no ``dcgmi`` installed: skipped, said once.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from .. import runner
from ..errors import CommandError
from .findings import DRAIN, INFO, WARN, Finding

# DCGM's test names (memory, sm_stress, pcie, targeted_power, ...).
_TEST_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_ ]{0,39}")

CHECK = "gpu.dcgm"
DCGMI = "dcgmi"
MONITOR = 1           # DCGM_ERROR_MONITOR (dcgmlib/dcgm_errors.h)
_ROOTS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")


@dataclass
class GpuFailure:
    gpu: int
    test: str
    severity: int | None           # worst error_severity of its warnings (None: none given)
    messages: list[str] = field(default_factory=list)


@dataclass
class DiagResult:
    status: str                    # "pass" | "fail" | "skip" | "error"
    detail: str = ""
    failures: list[GpuFailure] = field(default_factory=list)


def dcgmi_path() -> str | None:
    for d in runner.SAFE_PATH.split(":") + ["/usr/local/bin"]:
        p = os.path.join(d, DCGMI)
        if os.access(p, os.X_OK):
            return p
    return None


def _gpus(result: dict[str, Any]) -> list[int]:
    if result.get("entity_group", "GPU") == "GPU" and isinstance(result.get("entity_id"), int):
        return [result["entity_id"]]
    ids = result.get("gpu_ids")
    if isinstance(ids, str):
        return [int(x) for x in ids.split(",") if x.strip().isdigit()]
    if isinstance(ids, int):
        return [ids]
    return []


def parse(text: str) -> DiagResult:
    """One verdict from dcgmi's JSON output."""
    start = text.find("{")
    try:
        doc = json.loads(text[start:]) if start >= 0 else None
    except ValueError:
        doc = None
    root = next((doc[k] for k in _ROOTS if isinstance(doc, dict) and isinstance(doc.get(k), dict)), None)
    if root is None:
        first = (text.strip().splitlines() or ["no output"])[0][:200]
        return DiagResult("error", f"dcgmi gave no diagnostic JSON: {first}")
    err = root.get("runtime_error")
    if isinstance(err, str) and err.strip():
        line = " ".join(err.split())
        if "MIG" in line:
            return DiagResult("skip", f"DCGM refuses MIG GPUs: {line}")
        return DiagResult("error", f"dcgmi diag could not run: {line}")
    fails: dict[tuple[int, str], GpuFailure] = {}
    ran = 0
    for cat in root.get("test_categories") or ():
        for test in (cat.get("tests") or ()) if isinstance(cat, dict) else ():
            if not isinstance(test, dict):
                continue
            for res in test.get("results") or ():
                if not isinstance(res, dict):
                    continue
                status = str(res.get("status", "")).lower()
                ran += status in ("pass", "fail", "warn")
                if status != "fail":
                    continue
                warns = [w for w in res.get("warnings") or () if isinstance(w, dict)]
                sev = [w["error_severity"] for w in warns if isinstance(w.get("error_severity"), int)]
                for gpu in _gpus(res):
                    f = fails.setdefault((gpu, str(test.get("name"))),
                                         GpuFailure(gpu, str(test.get("name")), None))
                    f.severity = max(sev + ([f.severity] if f.severity is not None else []), default=None)
                    f.messages += [str(w.get("warning", "")).strip() for w in warns if w.get("warning")]
    if fails:
        return DiagResult("fail", f"{len(fails)} failed test result(s)", list(fails.values()))
    if not ran:
        return DiagResult("error", "dcgmi diag reported no test results")
    return DiagResult("pass", f"{ran} result(s) passed")


def run(level: int, timeout: float) -> DiagResult:
    """Run ``dcgmi diag -r LEVEL -j`` (a skip when DCGM is not installed)."""
    exe = dcgmi_path()
    if exe is None:
        return DiagResult("skip", "DCGM is not installed (no dcgmi): gpu.dcgm skipped")
    try:
        res = runner.run([exe, "diag", "-r", str(int(level)), "-j"], timeout, check=False)
    except CommandError as e:
        return DiagResult("error", f"dcgmi diag: {e.what}")
    # dcgmi exits non-zero on a failed or refused diagnostic; the JSON says which.
    return parse(res.stdout or res.stderr)


def findings(r: DiagResult, bus_of: dict[int, str] | None = None) -> list[Finding]:
    """The check's findings (DCGM's GPU ids are NVML indices)."""
    bus_of = bus_of or {}
    if r.status == "pass":
        return [Finding(CHECK, INFO, f"dcgmi diag passed ({r.detail})")]
    if r.status == "skip":
        return [Finding(CHECK, INFO, r.detail)]
    if r.status == "error":
        return [Finding(CHECK, WARN, r.detail)]
    out = []
    for f in r.failures:
        sev = WARN if f.severity == MONITOR else DRAIN
        test = f.test if _TEST_NAME.fullmatch(f.test) else "(unnamed test)"
        msg = f"dcgmi diag {test} failed on GPU {f.gpu}"
        # DCGM's own text is read only in a warning: a drain reason carries
        # only our words, so that our resume can always recognise it.
        if f.messages and sev == WARN:
            msg += f": {f.messages[0]}"
        if sev == WARN:
            msg += " (DCGM: monitor)"
        out.append(Finding(CHECK, sev, msg, bus_of.get(f.gpu)))
    return out
