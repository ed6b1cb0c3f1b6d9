"""Usage reads: what each GPU and MIG instance is doing now (for ``slurm-gpu monitor``).

Plain data out (:class:`DeviceStats`), an :class:`~slurm_gpu.hw.nvml_api.NvmlApi`
in (the driver, the simulator, a replay), so the same code runs on a GPU
node and in the sandbox.  This is the sampling half of the narrow GPU
interface; it takes no job or Slurm knowledge.

What NVML offers, and so what is read:

* a whole GPU: ``nvmlDeviceGetUtilizationRates`` (SM busy %, over the
  driver's last sample period), ``nvmlDeviceGetMemoryInfo`` (used bytes),
  ``nvmlDeviceGetPowerUsage`` (mW), ``nvmlDeviceGetTotalEnergyConsumption``
  (mJ, a counter since the driver loaded: energy over a job is a
  difference, exact whatever the sampling interval) and
  ``nvmlDeviceGetComputeRunningProcesses`` (PIDs, memory, and the MIG
  GPU/compute instance of each), and each process's own SM share from
  ``nvmlDeviceGetProcessUtilization`` (samples newer than the last read;
  a process without one since had no SM activity; NOT_SUPPORTED leaves it
  unknown), so a GPU several jobs share (gres/shard, gres/mps) can be split
  between them;
* a MIG instance: utilisation, power and energy are not supported on MIG
  device handles.  On Hopper and later, GPM gives the SM utilisation of each
  GPU instance between two samples (``nvmlGpmMigSampleGet`` +
  ``nvmlGpmMetricsGet``, ``NVML_GPM_METRIC_SM_UTIL``); the reader keeps the
  previous sample, so the first read of an instance has no utilisation yet.
  Without GPM (A100, A30) and with accounting mode on, the busiest
  process's ``nvmlDeviceGetAccountingStats().gpuUtilization`` stands in.
  Otherwise utilisation is None (unknown, never reported as idle).
  Memory comes from ``nvmlDeviceGetMemoryInfo`` on the MIG device handle.

Errors: a GPU that cannot be read this time (lost, busy) is left out and
named in :attr:`StatsReader.errors`; a query that is not supported leaves
its field None.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from . import nvml_constants as C
from .nvml_api import NVMLError, NvmlApi, NvmlHandle, Reader

NO_INSTANCE = 0xFFFFFFFF


@dataclass(frozen=True)
class ProcUse:
    """A process using a GPU (or one of its MIG instances)."""

    pid: int
    mem_bytes: int | None
    gi: int | None = None         # GPU instance id; None without MIG
    ci: int | None = None
    sm: float | None = None       # its SM % (nvmlDeviceGetProcessUtilization); None: NVML cannot say


@dataclass(frozen=True)
class DeviceStats:
    """One GPU (``gi`` None) or one MIG GPU instance, now."""

    index: int                    # the GPU's NVML index
    gi: int | None
    uuid: str
    sm: float | None              # SM busy %, None when NVML cannot say
    mem_used: int | None          # bytes
    mem_total: int | None
    power_mw: int | None          # whole GPUs only
    energy_mj: int | None         # counter; whole GPUs only
    procs: tuple[ProcUse, ...] = ()
    sm_source: str = ""           # "util", "gpm", "accounting" or ""
    fraction: float = 1.0         # of a whole GPU: compute slices / the GPU's (MIG), else 1

    @property
    def key(self) -> str:
        """``"2"`` for GPU 2, ``"2/gi1"`` for its GPU instance 1 (the load and state key)."""
        return str(self.index) if self.gi is None else f"{self.index}/gi{self.gi}"


@dataclass
class StatsReader:
    """Reads every GPU and MIG instance; keeps GPM samples between reads."""

    api: NvmlApi
    errors: list[str] = field(default_factory=list)
    _gpm: dict[str, Any] = field(default_factory=dict)
    _gpm_ok: dict[int, bool] = field(default_factory=dict)
    _proc_ts: dict[int, int] = field(default_factory=dict)    # GPU -> newest per-process sample seen (µs)

    def _maybe(self, fn: Any, *args: Any) -> Any:
        return Reader(self.api).maybe(fn, *args)

    def read(self) -> list[DeviceStats]:
        """Every device's stats now (GPUs in index order, each followed by its MIG instances)."""
        api = self.api
        self.errors = []
        out: list[DeviceStats] = []
        for i in range(int(api.nvmlDeviceGetCount())):
            try:
                out.extend(self._gpu(i))
            except NVMLError as e:
                self.errors.append(f"GPU {i}: {e}")
        return out

    def _gpu(self, i: int) -> list[DeviceStats]:
        api = self.api
        h = api.nvmlDeviceGetHandleByIndex(i)
        uuid = _s(api.nvmlDeviceGetUUID(h))
        procs = tuple(_procs(self._maybe(api.nvmlDeviceGetComputeRunningProcesses, h) or ()))
        mig_on = (self._maybe(api.nvmlDeviceGetMigMode, h) or [0])[0] == C.NVML_DEVICE_MIG_ENABLE
        if procs and not mig_on:
            util = self._proc_util(i, h)
            procs = tuple(dataclasses.replace(p, sm=util.get(p.pid, 0.0) if util is not None else None)
                          for p in procs)
        mem = self._maybe(api.nvmlDeviceGetMemoryInfo, h)
        util = None if mig_on else self._maybe(api.nvmlDeviceGetUtilizationRates, h)
        gpu = DeviceStats(
            index=i, gi=None, uuid=uuid, sm=float(util.gpu) if util is not None else None,
            mem_used=int(mem.used) if mem is not None else None,
            mem_total=int(mem.total) if mem is not None else None,
            power_mw=_int(self._maybe(api.nvmlDeviceGetPowerUsage, h)),
            energy_mj=_int(self._maybe(api.nvmlDeviceGetTotalEnergyConsumption, h)),
            procs=procs, sm_source="util" if util is not None else "")
        out = [gpu]
        if mig_on:
            out.extend(self._mig(i, h, procs))
        return out

    def _proc_util(self, i: int, h: NvmlHandle) -> dict[int, float] | None:
        """pid -> mean SM % of its samples since the last read; None when NVML cannot say.

        NOT_FOUND means no process had SM activity since then (NVML lists
        only processes with non-zero utilisation): every process is at 0.
        """
        try:
            samples = self.api.nvmlDeviceGetProcessUtilization(h, self._proc_ts.get(i, 0))
        except NVMLError as e:
            # NOT_FOUND here is NVML's "no sample since then", not "absent"; pynvml
            # raises NVMLError(NVML_SUCCESS) when the size probe finds no sample at all.
            if e.value in (C.NVML_ERROR_NOT_FOUND, C.NVML_SUCCESS):
                return {}
            return None          # optional: never a reason to lose the GPU's other figures
        sums: dict[int, list[float]] = {}
        for smp in samples or ():
            sums.setdefault(int(smp.pid), []).append(float(smp.smUtil))
            self._proc_ts[i] = max(self._proc_ts.get(i, 0), int(smp.timeStamp))
        return {pid: min(sum(v) / len(v), 100.0) for pid, v in sums.items()}

    def _mig(self, i: int, h: NvmlHandle, procs: tuple[ProcUse, ...]) -> list[DeviceStats]:
        api = self.api
        count = self._maybe(api.nvmlDeviceGetMaxMigDeviceCount, h) or 0
        # A GPU has as many compute slices as MIG devices at most (7 on A100/H100, 4 on A30).
        seen: dict[int, DeviceStats] = {}
        for j in range(int(count)):
            mh = self._maybe(api.nvmlDeviceGetMigDeviceHandleByIndex, h, j)
            if mh is None:
                continue
            gi = int(api.nvmlDeviceGetGpuInstanceId(mh))
            if gi in seen:          # one entry per GPU instance (its first compute instance's UUID)
                continue
            uuid = _s(api.nvmlDeviceGetUUID(mh))
            mem = self._maybe(api.nvmlDeviceGetMemoryInfo, mh)
            mine = tuple(p for p in procs if p.gi == gi)
            sm, source = self._gpm_util(i, h, gi)
            if sm is None:
                sm, source = self._accounting_util(h, mine)
            attrs = self._maybe(api.nvmlDeviceGetAttributes, mh)
            slices = int(getattr(attrs, "gpuInstanceSliceCount", 0) or 0) if attrs is not None else 0
            frac = min(slices / int(count), 1.0) if slices and count else 1.0
            seen[gi] = DeviceStats(index=i, gi=gi, uuid=uuid, sm=sm,
                                   mem_used=int(mem.used) if mem is not None else None,
                                   mem_total=int(mem.total) if mem is not None else None,
                                   power_mw=None, energy_mj=None, procs=mine, sm_source=source,
                                   fraction=round(frac, 4))
        return list(seen.values())

    def _gpm_util(self, i: int, h: NvmlHandle, gi: int) -> tuple[float | None, str]:
        api = self.api
        if i not in self._gpm_ok:
            sup = self._maybe(api.nvmlGpmQueryDeviceSupport, h)
            self._gpm_ok[i] = bool(sup is not None and getattr(sup, "isSupportedDevice", 0))
        if not self._gpm_ok[i]:
            return None, ""
        key = f"{i}/gi{gi}"
        sample = api.nvmlGpmSampleAlloc()
        try:
            api.nvmlGpmMigSampleGet(h, gi, sample)
        except NVMLError:
            api.nvmlGpmSampleFree(sample)
            return None, ""
        prev = self._gpm.pop(key, None)
        self._gpm[key] = sample
        if prev is None:
            return None, ""
        try:
            mg = api.new_gpm_metrics()
            mg.version = C.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = 1
            mg.sample1, mg.sample2 = prev, sample
            mg.metrics[0].metricId = C.NVML_GPM_METRIC_SM_UTIL
            api.nvmlGpmMetricsGet(mg)
            if mg.metrics[0].nvmlReturn != 0:
                return None, ""
            return float(mg.metrics[0].value), "gpm"
        except NVMLError:
            return None, ""
        finally:
            api.nvmlGpmSampleFree(prev)

    def _accounting_util(self, h: NvmlHandle, procs: tuple[ProcUse, ...]) -> tuple[float | None, str]:
        if not procs or self._maybe(self.api.nvmlDeviceGetAccountingMode, h) != C.NVML_FEATURE_ENABLED:
            return None, ""
        best = None
        for p in procs:
            st = self._maybe(self.api.nvmlDeviceGetAccountingStats, h, p.pid)
            if st is not None:
                best = max(best or 0.0, float(st.gpuUtilization))
        return (best, "accounting") if best is not None else (None, "")

    def forget(self, keys: set[str]) -> None:
        """Drop GPM samples of instances that no longer exist (bounded memory)."""
        for k in [k for k in self._gpm if k not in keys]:
            try:
                self.api.nvmlGpmSampleFree(self._gpm.pop(k))
            except NVMLError:
                pass

    def close(self) -> None:
        self.forget(set())


def _s(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _int(v: Any) -> int | None:
    return int(v) if v is not None else None


def _procs(raw: Any) -> list[ProcUse]:
    out = []
    for p in raw:
        gi = int(getattr(p, "gpuInstanceId", NO_INSTANCE))
        ci = int(getattr(p, "computeInstanceId", NO_INSTANCE))
        mem = getattr(p, "usedGpuMemory", None)
        out.append(ProcUse(pid=int(p.pid), mem_bytes=int(mem) if mem is not None else None,
                           gi=None if gi == NO_INSTANCE else gi, ci=None if ci == NO_INSTANCE else ci))
    return out
