#!/opt/slurm-gpu/venv/bin/python
"""Generate ``slurm_gpu/data/xid_catalog.json`` from NVIDIA's XID catalog.

Input: ``gpud__xid_catalog_generated.go`` in this directory (leptonai/gpud,
Apache-2.0, itself generated from NVIDIA's Xid-Catalog.xlsx; see
PROVENANCE.md).  The CSV beside it is a mechanical conversion of the same
table and is cross-checked here, so the two cannot drift apart.

Output: every catalog code with NVIDIA's immediate/investigatory resolution
buckets, plus the action slurm-gpu takes (``drain``/``warn``/``info``) and the
kind (``hardware``/``application``/``informational``/``nvlink5``/...), with the
reason for every deviation from the plain bucket mapping written into the
data.  The NVLink5 (Xid 144-150) decode rules are carried verbatim.

Run:  /opt/slurm-gpu/venv/bin/python tests/data/xid/build_xid_catalog.py
``tests/unit/test_xid_catalog.py`` checks the shipped file equals this output.
"""
from __future__ import annotations

import csv
import hashlib
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GO = HERE / "gpud__xid_catalog_generated.go"
CSV = HERE / "xid_catalog_from_gpud.csv"
OUT = HERE.parents[2] / "slurm_gpu" / "data" / "xid_catalog.json"

# NVIDIA's immediate-resolution bucket -> what a Slurm health check does.
BUCKET_ACTION: dict[str, tuple[str, str]] = {
    "RESET_GPU": ("drain", "hardware"),          # GPU must be reset before reuse
    "RESTART_BM": ("drain", "hardware"),         # bare-metal restart (e.g. 79)
    "CONTACT_SUPPORT": ("drain", "hardware"),
    "CHECK_MECHANICALS": ("drain", "hardware"),  # e.g. aux power not connected (54)
    "WORKFLOW_NVLINK_ERR": ("drain", "hardware"),
    "WORKFLOW_XID_48": ("drain", "hardware"),    # double-bit ECC
    "XID_154": ("drain", "recovery"),            # refined by the line's new action
    "WORKFLOW_NVLINK5_ERR": ("drain", "nvlink5"),  # refined by the 144-150 decode table
    "RESTART_VM": ("warn", "software"),          # confidential-computing VMs only
    "UPDATE_SWFW": ("warn", "software"),
    "CHECK_UVM": ("warn", "software"),
    "RESTART_APP": ("info", "application"),
    "WORKFLOW_XID_45": ("info", "application"),  # unless caused by a hardware Xid
    "IGNORE": ("info", "informational"),
}

# Codes where a production policy overrides the catalog's bucket, and (NO_BUCKET
# below) those it leaves without one.  Each entry: code -> (action, kind, why).
OVERRIDES: dict[int, tuple[str, str, str]] = {
    109: ("info", "application",
          "catalog says RESET_GPU, but a context-switch timeout is raised by the faulting "
          "application; NVIDIA's k8s-device-plugin ignores it (internal/rm/health.go)"),
    43: ("info", "application", "k8s-device-plugin application-error list"),
    13: ("info", "application", "k8s-device-plugin application-error list"),
    31: ("info", "application", "k8s-device-plugin application-error list"),
    45: ("info", "application",
         "k8s-device-plugin application-error list; a 45 caused by a hardware Xid takes that Xid's action"),
    68: ("info", "application", "k8s-device-plugin application-error list"),
}
# Codes the catalog leaves without a bucket: code -> (action, kind, what the fault is).
NO_BUCKET: dict[int, tuple[str, str, str]] = {
    162: ("info", "informational", "power smoothing capability came back"),
    163: ("warn", "power", "power smoothing disengaged"),
    164: ("warn", "power", "power smoothing circuitry near end of life"),
    165: ("warn", "power", "power smoothing circuitry exhausted"),
    166: ("warn", "nvlink", "confidential-computing link setup"),
    167: ("drain", "hardware", "PCIe fatal timeout"),
    168: ("drain", "hardware", "GPU memory capacity reduced"),
    169: ("drain", "hardware", "micro-controller halt, like Xid 62"),
    170: ("warn", "nvlink", "confidential-computing interrupt"),
    171: ("drain", "hardware", "uncorrectable DRAM error, companion of Xid 48"),
    172: ("drain", "hardware", "uncorrectable SRAM error, companion of Xid 48"),
}
OVERRIDES.update((code, (action, kind, f"{what} (no bucket in catalog)"))
                 for code, (action, kind, what) in NO_BUCKET.items())

# What a fault does to the job running on the GPU ("job": issue 27, on_fatal),
# from the same NVIDIA columns:
# * "fatal": NVIDIA's immediate action resets the GPU or restarts the machine
#   before the GPU runs work again, so every context on it is lost (the job is
#   dead or hung): the health check requeues the jobs holding that GPU;
# * "process": RESTART_APP (and the application list above): only the faulting
#   process dies (Xid 94, contained), its job decides what to do;
# * "none": the rest, and the driver's retirement records (a mnemonic with
#   RETIREMENT: Xid 64, 156): they log that a page or row retirement was
#   recorded, or failed to be, and the reset only activates it; the running
#   work goes on.
JOB_FATAL_BUCKETS = ("RESET_GPU", "RESTART_BM", "WORKFLOW_XID_48")
# Codes without a bucket (NO_BUCKET above): code -> (job, why).
JOB_OVERRIDES: dict[int, tuple[str, str]] = {
    167: ("fatal", "PCIe fatal timeout: the GPU stops answering"),
    169: ("fatal", "micro-controller halt, like Xid 62 (RESET_GPU)"),
    171: ("fatal", "companion of Xid 48 (WORKFLOW_XID_48)"),
    172: ("fatal", "companion of Xid 48 (WORKFLOW_XID_48)"),
}


def job_impact(row: dict, kind: str) -> str:
    """What the fault does to the job on the GPU: "fatal", "process" or "none"."""
    if row["code"] in JOB_OVERRIDES:
        return JOB_OVERRIDES[row["code"]][0]
    if kind == "application":
        return "process"
    if row["immediate"] in JOB_FATAL_BUCKETS and "RETIREMENT" not in row["mnemonic"]:
        return "fatal"
    return "none"


_STR = r'"((?:[^"\\]|\\.)*)"'


def _unquote(s: str) -> str:
    return json.loads(f'"{s}"')


def _one_line(v):
    """The spreadsheet's cells carry line breaks (Xid 62's description): a finding is one line."""
    return " ".join(v.split()) if isinstance(v, str) else v


def parse_catalog(text: str) -> list[dict]:
    body = text.split("var catalogEntries", 1)[1].split("\n}\n", 1)[0]
    pat = re.compile(r"\{Code: (\d+), Mnemonic: " + _STR + r", Description: " + _STR
                     + r", ImmediateResolution: " + _STR + r", InvestigatoryResolution: " + _STR + r"\}")
    rows = []
    for m in pat.finditer(body):
        rows.append({"code": int(m.group(1)), "mnemonic": _unquote(m.group(2)),
                     "description": _unquote(m.group(3)), "immediate": _unquote(m.group(4)),
                     "investigatory": _unquote(m.group(5))})
    return rows


def parse_nvlink_rules(text: str) -> list[dict]:
    body = text.split("var nvlinkRules", 1)[1]
    rules = []
    for line in body.splitlines():
        line = line.strip()
        if not line.startswith("{Xid:"):
            continue
        fields = dict(re.findall(r'(\w+): ("(?:[^"\\]|\\.)*"|0x[0-9a-fA-F]+|\d+)', line))
        rule = {}
        for k, v in fields.items():
            if v.startswith('"'):
                rule[k] = _unquote(v[1:-1])
            else:
                rule[k] = int(v, 0)
        rules.append({
            "xid": rule["Xid"], "unit": rule["Unit"],
            "intrinfo_v1": rule.get("IntrinfoPatternV1", ""),
            "intrinfo_v2": rule.get("IntrinfoPatternV2", ""),
            "error_status": rule["ErrorStatus"], "resolution": rule.get("Resolution", ""),
            "investigatory": rule.get("Investigatory", ""), "severity": rule.get("Severity", ""),
            "action2": rule.get("Action2", ""), "hw_sw": rule.get("HwSw", ""),
            "local_remote": rule.get("LocalRemote", ""),
        })
    return rules


def classify(row: dict) -> tuple[str, str, str]:
    code = row["code"]
    if code in OVERRIDES:
        return OVERRIDES[code]
    bucket = row["immediate"]
    if bucket not in BUCKET_ACTION:
        raise SystemExit(f"xid {code}: unmapped bucket {bucket!r}")
    action, kind = BUCKET_ACTION[bucket]
    return action, kind, ""


def build() -> dict:
    go_text = GO.read_text()
    rows = parse_catalog(go_text)
    with open(CSV, newline="") as f:
        csv_rows = {int(r["code"]): r for r in csv.DictReader(f)}
    if len(rows) != 172 or set(csv_rows) != {r["code"] for r in rows}:
        raise SystemExit(f"expected 172 codes, Go has {len(rows)}, CSV has {len(csv_rows)}")
    for r in rows:
        c = csv_rows[r["code"]]
        if (c["immediate_resolution"], c["investigatory_resolution"]) != (r["immediate"], r["investigatory"]):
            raise SystemExit(f"xid {r['code']}: Go and CSV disagree")
    codes = {}
    for r in rows:
        action, kind, why = classify(r)
        entry = {k: _one_line(v) for k, v in r.items()}
        entry.update({"action": action, "kind": kind, "job": job_impact(r, kind)})
        if why:
            entry["override"] = why
        codes[str(r["code"])] = entry
    rules = [{k: _one_line(v) for k, v in rule.items()} for rule in parse_nvlink_rules(go_text)]
    if not rules or {r["xid"] for r in rules} != set(range(144, 151)):
        raise SystemExit("NVLink5 decode table not found or incomplete")
    return {
        "schema": 1,
        "provenance": {
            "source": "NVIDIA Xid catalog (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), "
                      "as generated into leptonai/gpud components/accelerator/nvidia/xid/catalog_generated.go "
                      "@ 4a4565a0... (see tests/data/xid/PROVENANCE.md), Apache-2.0, data (c) NVIDIA",
            "go_sha256": hashlib.sha256(go_text.encode()).hexdigest(),
            "csv_sha256": hashlib.sha256(CSV.read_bytes()).hexdigest(),
            "generator": "tests/data/xid/build_xid_catalog.py",
        },
        "bucket_actions": {k: {"action": a, "kind": kd} for k, (a, kd) in sorted(BUCKET_ACTION.items())},
        "codes": codes,
        "nvlink5_rules": rules,
    }


def render() -> str:
    return json.dumps(build(), indent=1, sort_keys=False) + "\n"


if __name__ == "__main__":
    out = render()
    if "--check" in sys.argv:
        sys.exit(0 if OUT.read_text() == out else 1)
    OUT.write_text(out)
    print(f"wrote {OUT}")
