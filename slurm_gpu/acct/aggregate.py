"""Rolling per-job aggregates and the compact summary (pure: data in, data out).

One aggregate per (job, device), where a device is a GPU (``"2"``) or a MIG
GPU instance (``"2/gi1"``).  Its size is fixed whatever the job's length:
counts, sums, maxima and the energy counter's last reading with the energy
counted so far, so memory and disk stay bounded.  Samples come at a fixed
interval, so means and the idle fraction are per sample; energy is the sum
of the driver's counter's increases (the job's weighted part of each on a
shared GPU), exact whatever the interval.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

MAX_XIDS = 8             # distinct XIDs kept per device
SUMMARY_VERSION = 1


def new_device(held: bool, uuid: str = "") -> dict[str, Any]:
    return {"held": held, "uuid": uuid, "n": 0, "known": 0, "sm_sum": 0.0, "sm_max": 0.0,
            "idle": 0, "mem_max": 0, "e_first": None, "e_last": None, "t_first": None, "t_last": None,
            "xids": []}


def add_sample(agg: dict[str, Any], t: float, *, sm: float | None, mem: int | None,
               energy_mj: int | None, idle_threshold: float, busy: bool = False,
               weight: float = 1.0, share: float | None = None) -> None:
    """Fold one sample into a device aggregate.

    *sm* None (NVML cannot say, e.g. the first GPM sample) counts towards
    the sample count but not towards means or idleness.  *busy* marks a
    sample whose device had the job's processes on it but no utilisation
    figure: never counted as idle.  *energy_mj* is the device's counter; the
    job is given *weight* of its increase since the job's previous sample
    (1 on a device it holds alone).  *share*: the device was shared
    (gres/shard, gres/mps) and this was the job's part of it.
    """
    agg["n"] += 1
    if agg["t_first"] is None:
        agg["t_first"] = t
    agg["t_last"] = t
    if share is not None:
        agg["sh_n"] = agg.get("sh_n", 0) + 1
        agg["sh_sum"] = agg.get("sh_sum", 0.0) + float(share)
    if sm is not None:
        agg["known"] += 1
        agg["sm_sum"] += float(sm)
        agg["sm_max"] = max(agg["sm_max"], float(sm))
        if float(sm) <= idle_threshold and not busy:
            agg["idle"] += 1
            agg["run"] = agg.get("run", 0) + 1      # consecutive idle samples (idle policy)
        else:
            agg["run"] = 0
    if mem is not None:
        agg["mem_max"] = max(agg["mem_max"], int(mem))
    if energy_mj is not None:
        if agg["e_first"] is None:
            agg["e_first"] = energy_mj
            agg["e_sum"] = 0.0
        else:
            # An aggregate from before e_sum: what it counted is last - first.
            counted = agg.get("e_sum", agg["e_last"] - agg["e_first"])
            # A counter that went back restarted (driver reload): keep what was counted so far.
            agg["e_sum"] = counted + max(energy_mj - agg["e_last"], 0) * float(weight)
        agg["e_last"] = energy_mj


def add_xid(agg: dict[str, Any], xid: int) -> None:
    if xid not in agg["xids"] and len(agg["xids"]) < MAX_XIDS:
        agg["xids"].append(int(xid))


def device_summary(agg: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of one device: mean/max SM %, max memory MiB, energy J, idle fraction, XIDs."""
    known = agg["known"]
    out: dict[str, Any] = {
        "sm": round(agg["sm_sum"] / known, 1) if known else None,
        "smx": round(agg["sm_max"], 1) if known else None,
        "mem": int(agg["mem_max"] // (1024 * 1024)),
        "idle": round(agg["idle"] / known, 3) if known else None,
        "n": agg["n"],
    }
    if agg["e_first"] is not None and agg["e_last"] is not None:
        out["j"] = int(agg.get("e_sum", agg["e_last"] - agg["e_first"]) // 1000)
    if agg["t_first"] is not None:
        out["s"] = int(round(agg["t_last"] - agg["t_first"]))
    if agg["xids"]:
        out["xid"] = list(agg["xids"])
    if agg.get("mt"):
        out["mt"] = int(agg["mt"] // (1024 * 1024))
    if agg.get("sh_n"):
        # Shared (gres/shard, gres/mps): its figures are its processes', and it
        # held on average this part of the GPU (whole while it was alone).
        out["sh"] = 1
        out["fr"] = round((agg["sh_sum"] + (agg["n"] - agg["sh_n"])) / agg["n"] * agg.get("fr", 1.0), 4)
    elif agg.get("fr", 1.0) != 1.0:
        out["fr"] = agg["fr"]            # a MIG instance: its fraction of a whole GPU
    if not agg["held"]:
        out["leak"] = 1                  # used by the job's processes but not allocated to it
    return out


def summary(node: str, devices: Mapping[str, Mapping[str, Any]], interval: float,
            max_bytes: int) -> dict[str, Any]:
    """This node's part of a job's summary, at most *max_bytes* of compact JSON.

    When too big (many MIG instances, leaked devices), leaked devices go
    first, then XID lists, then sample counts, so the held devices' core
    figures are what survives.
    """
    devs = {k: device_summary(v) for k, v in sorted(devices.items(), key=lambda kv: _order(kv[0]))}
    part = {"v": SUMMARY_VERSION, "iv": interval, "dev": devs}
    for trim in (_drop_leaks, _drop_xids, _drop_counts):
        if len(encode_part(node, part)) <= max_bytes:
            return part
        trim(part)
    while len(encode_part(node, part)) > max_bytes and part["dev"]:
        part["dev"].pop(list(part["dev"])[-1])
        part["trunc"] = 1
    return part


def _order(key: str) -> tuple[int, int]:
    gpu, _, gi = key.partition("/gi")
    return int(gpu), int(gi) if gi else -1


def _drop_leaks(part: dict[str, Any]) -> None:
    part["dev"] = {k: v for k, v in part["dev"].items() if not v.get("leak")}


def _drop_xids(part: dict[str, Any]) -> None:
    for v in part["dev"].values():
        v.pop("xid", None)


def _drop_counts(part: dict[str, Any]) -> None:
    for v in part["dev"].values():
        v.pop("n", None)
        v.pop("mt", None)


def encode_part(node: str, part: Mapping[str, Any]) -> str:
    return json.dumps({node: part}, separators=(",", ":"), sort_keys=True)

