"""What other tools read: dcgm-exporter's job-mapping files and a Prometheus textfile.

**Job mapping** (dcgm-exporter ``--hpc-job-mapping-dir``): one file per
GPU, named by its index (``0``), or per MIG GPU instance, ``<gpu>.<gi>``
(``2.1``), holding the ids of the jobs using it, one per line.  The files
are a function of the registrations alone (:func:`sync_mapping`): the
prolog, the epilog and the sampler's sweep of finished jobs all call it,
under one lock, so a requeue, a failed epilog or a crash leaves no file
naming a finished job once any of them runs again.  Files of ours that
name no job are removed; files we did not write (no marker) are left.

**Prometheus textfile** (node_exporter's textfile collector): per GPU and
MIG instance, utilisation, memory, power, energy, and an idle-held flag;
per-job labels only with ``[acct] job_labels = true`` (a label per job id
makes one series per job: cardinality).
"""
from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..fsutil import atomic_write
from ..hw.gpustats import DeviceStats

MARK = ".slurm-gpu"    # a file in the mapping directory listing the files we own
_NAME = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,2})?")


def mapping_name(key: str) -> str:
    """``"2"`` -> ``2``; ``"2/gi1"`` -> ``2.1`` (dcgm-exporter's GPU.MIG naming)."""
    gpu, _, gi = key.partition("/gi")
    return f"{int(gpu)}.{int(gi)}" if gi else str(int(gpu))


def sync_mapping(directory: str, registrations: Mapping[str, Mapping[str, Any]]) -> None:
    """Make *directory* hold exactly the mapping the registrations give."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True, mode=0o755)
    want: dict[str, list[str]] = {}
    for jobid, reg in sorted(registrations.items(), key=lambda kv: int(kv[0])):
        for key in reg.get("devices", []):
            want.setdefault(mapping_name(key), []).append(jobid)
    fd = os.open(d / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            owned = {n for n in (d / MARK).read_text().split() if _NAME.fullmatch(n)}
        except OSError:
            owned = set()
        for name in owned - set(want):
            try:
                os.unlink(d / name)
            except FileNotFoundError:
                pass
        for name, jobs in want.items():
            text = "".join(f"{j}\n" for j in jobs)
            p = d / name
            try:
                if p.read_text() == text:
                    continue
            except OSError:
                pass
            atomic_write(p, text, mode=0o644)
        if owned != set(want):
            atomic_write(d / MARK, "".join(f"{n}\n" for n in sorted(want)), mode=0o644)
    finally:
        os.close(fd)


def _labels(d: DeviceStats, extra: Mapping[str, str] | None = None) -> str:
    lab = {"gpu": str(d.index), "UUID": d.uuid}
    if d.gi is not None:
        lab["GPU_I_ID"] = str(d.gi)
    lab.update(extra or {})
    return "{" + ",".join(f'{k}="{v}"' for k, v in lab.items()) + "}"


def textfile(stats: Iterable[DeviceStats], holders: Mapping[str, Sequence[str]], idle_flags: Mapping[str, bool],
             job_labels: bool) -> str:
    """The Prometheus exposition text for this sample."""
    rows: dict[str, list[str]] = {}
    helps = {
        "slurm_gpu_sm_utilization_percent": "SM busy percent (GPU: NVML utilisation; MIG: GPM)",
        "slurm_gpu_memory_used_bytes": "Device memory used",
        "slurm_gpu_power_watts": "Power draw (whole GPUs)",
        "slurm_gpu_energy_joules_total": "Energy counter since the driver loaded (whole GPUs)",
        "slurm_gpu_allocated": "1 when a job holds the device",
        "slurm_gpu_idle_held": "1 when a job has held the device idle longer than [acct] idle_minutes",
    }
    for d in stats:
        jobs = holders.get(d.key) or (holders.get(str(d.index)) if d.gi is not None else None)
        job = ",".join(jobs) if jobs else None        # a shared GPU: every holder, oldest first
        extra = {"jobid": job} if job_labels and job else None
        lab = _labels(d, extra)
        if d.sm is not None:
            rows.setdefault("slurm_gpu_sm_utilization_percent", []).append(f"{lab} {d.sm:g}")
        if d.mem_used is not None:
            rows.setdefault("slurm_gpu_memory_used_bytes", []).append(f"{lab} {d.mem_used}")
        if d.power_mw is not None:
            rows.setdefault("slurm_gpu_power_watts", []).append(f"{lab} {d.power_mw / 1000:g}")
        if d.energy_mj is not None:
            rows.setdefault("slurm_gpu_energy_joules_total", []).append(f"{lab} {d.energy_mj / 1000:.3f}")
        rows.setdefault("slurm_gpu_allocated", []).append(f"{lab} {1 if job else 0}")
        rows.setdefault("slurm_gpu_idle_held", []).append(f"{lab} {1 if idle_flags.get(d.key) else 0}")
    out = []
    for name, lines in rows.items():
        kind = "counter" if name.endswith("_total") else "gauge"
        out += [f"# HELP {name} {helps[name]}", f"# TYPE {name} {kind}"]
        out += [f"{name}{line}" for line in lines]
    return "\n".join(out) + "\n"


def write_textfile(path: str, text: str) -> None:
    atomic_write(path, text, mode=0o644, durable=False)
