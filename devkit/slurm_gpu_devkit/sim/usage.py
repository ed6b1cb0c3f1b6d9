"""The simulator's answers to NVML's usage queries, from the scripted load.

Mixed into :class:`~slurm_gpu_devkit.sim.nvml.SimNvml`.  What a real driver
answers, and so what this answers:

* ``nvmlDeviceGetUtilizationRates``, ``nvmlDeviceGetPowerUsage`` (mW),
  ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver loaded): on a
  GPU; on a MIG device handle they are NOT_SUPPORTED;
* processes (:meth:`UsageMixin.scripted_processes`, listed by the
  simulator's ``nvmlDeviceGetComputeRunningProcesses`` after the state's
  ``processes``): on the GPU, every process with its GPU/compute instance
  ids (0xFFFFFFFF without MIG);
* per-process utilisation (``nvmlDeviceGetProcessUtilization(device,
  lastSeenTimeStamp)``): NVML's documentation (NVML API Reference,
  nvmlDeviceGetProcessUtilization) says it returns one
  ``nvmlProcessUtilizationSample_t`` (pid, timeStamp in µs, smUtil, memUtil,
  encUtil, decUtil) per running process "that had some non-zero utilization
  during the last sample period", only samples newer than
  ``lastSeenTimeStamp``, and NVML_ERROR_NOT_FOUND when there is none.  A
  process's ``sm`` in the load (``{"pid": 7, "sm": 60}``) is its smUtil; the
  sample is stamped with the load's clock.  Whole GPUs only: a MIG device
  handle, or a GPU in MIG mode (whose utilisation NVML does not give either),
  answers NOT_SUPPORTED;
* GPM (``nvmlGpmQueryDeviceSupport``, ``nvmlGpmSampleAlloc/Get/Free``,
  ``nvmlGpmMigSampleGet``, ``nvmlGpmMetricsGet``): Hopper and later only;
  ``NVML_GPM_METRIC_SM_UTIL`` is the SM busy percentage between two samples;
* accounting (``nvmlDeviceGetAccountingMode``, ``nvmlDeviceGetAccountingStats``):
  only when the load sets ``"accounting": true`` (``nvidia-smi -am 1``);
  ``gpuUtilization`` is the process's device's mean since the load started.
"""
from __future__ import annotations

from typing import Any

from slurm_gpu.hw import nvml_constants as C
from slurm_gpu.hw.nvml_api import Handle, NVMLError, NvmlStruct
from .base import SimBase
from . import load as L

NO_INSTANCE = 0xFFFFFFFF
MIB = 1024 * 1024


class SimGpmSample:
    """What ``nvmlGpmSampleAlloc`` hands out: filled by a SampleGet."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.t = 0.0
        self.sm_seconds = 0.0
        self.freed = False


class UsageMixin(SimBase):
    """NVML usage queries answered from ``state["load"]`` (see module docstring)."""

    # -- helpers ------------------------------------------------------------

    def _load_key(self, h: Handle) -> tuple[int, dict[str, Any], str, bool]:
        """(index, facts, load key, is a MIG handle) of a GPU or MIG device handle."""
        i, g = self._gpu(h)
        mig = self._mig_of(h)
        if mig:
            return i, g, f"{i}/gi{int(mig[0]['gi_id'])}", True
        return i, g, str(i), False

    def _now_values(self, key: str) -> dict[str, Any]:
        tls, idle = L.timelines(self.state)
        tl = tls.get(key)
        t = L.now(self.state)
        if tl is None:
            return {"sm": 0.0, "mem_util": 0.0, "mem_mib": 0, "power_w": idle, "pids": []}
        return tl.at(t)

    def _gpu_keys(self, i: int) -> list[str]:
        tls, _ = L.timelines(self.state)
        return [k for k in tls if k == str(i) or k.startswith(f"{i}/gi")]

    def _no_mig(self, h: Handle) -> tuple[int, dict[str, Any], str]:
        i, g, key, is_mig = self._load_key(h)
        if is_mig:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        return i, g, key

    # -- utilisation, memory, power, energy ---------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> NvmlStruct:
        i, g, key = self._no_mig(handle)
        v = self._now_values(key)
        return NvmlStruct({"gpu": int(round(float(v["sm"]))), "memory": int(round(float(v["mem_util"])))})

    def scripted_memory_used(self, handle: Handle) -> tuple[int, int] | None:
        """(used, total) bytes from the load, or None when the device is not scripted."""
        i, g, key, is_mig = self._load_key(handle)
        keys = [key] if is_mig else self._gpu_keys(i)
        if not keys:
            return None
        used = sum(int(self._now_values(k)["mem_mib"]) for k in keys) * MIB
        if is_mig:
            mig = self._mig_of(handle)
            assert mig is not None      # is_mig: a MIG device handle
            total = int(mig[0]["memory_mb"]) * MIB
        else:
            total = int(g["memory_mib"]) * MIB
        return used, total

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        i, g, key = self._no_mig(handle)
        return int(float(self._now_values(key)["power_w"]) * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Handle) -> int:
        i, g, key = self._no_mig(handle)
        tls, idle = L.timelines(self.state)
        t = L.now(self.state)
        tl = tls.get(key)
        base = float(g.get("energy_mj", 0))
        if tl is None:
            return int(base + idle * t * 1000)
        return int(base + (idle * tl.t0 + tl.integral("power_w", t)) * 1000)

    # -- processes ----------------------------------------------------------

    def scripted_processes(self, handle: Handle) -> list[NvmlStruct]:
        """The load's processes on a GPU (all its instances) or MIG device, as NVML lists them."""
        i, g, key, is_mig = self._load_key(handle)
        keys = [key] if is_mig else self._gpu_keys(i)
        out = []
        for k in keys:
            gi = int(k.split("/gi")[1]) if "/gi" in k else NO_INSTANCE
            ci = 0 if "/gi" in k else NO_INSTANCE
            for pid, mem in L.pid_list(self._now_values(k)["pids"]):
                out.append(NvmlStruct({"pid": pid, "usedGpuMemory": mem * MIB,
                                       "gpuInstanceId": gi, "computeInstanceId": ci}))
        return out


    def nvmlDeviceGetProcessUtilization(self, handle: Handle, timeStamp: int) -> list[NvmlStruct]:
        i, g, key = self._no_mig(handle)
        if int((g.get("mig") or {}).get("mode", 0) or 0) == 1:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        now_us = int(L.now(self.state) * 1e6)
        out = []
        if now_us > int(timeStamp):
            for pid, sm in L.pid_sm(self._now_values(key)["pids"]):
                if sm > 0:
                    out.append(NvmlStruct({"pid": pid, "timeStamp": now_us, "smUtil": int(round(sm)),
                                           "memUtil": 0, "encUtil": 0, "decUtil": 0}))
        if not out:
            raise NVMLError(C.NVML_ERROR_NOT_FOUND)
        return out

    # -- accounting ---------------------------------------------------------

    def _accounting_on(self) -> bool:
        return bool((L.state_load(self.state) or {}).get("accounting"))

    def nvmlDeviceGetAccountingMode(self, handle: Handle) -> int:
        self._gpu(handle)
        return C.NVML_FEATURE_ENABLED if self._accounting_on() else C.NVML_FEATURE_DISABLED

    def nvmlDeviceGetAccountingStats(self, handle: Handle, pid: int) -> NvmlStruct:
        i, g, key, is_mig = self._load_key(handle)
        if not self._accounting_on():
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        tls, _ = L.timelines(self.state)
        t = L.now(self.state)
        for k in ([key] if is_mig else self._gpu_keys(i)):
            tl = tls[k]
            pids = dict(L.pid_list(tl.at(t)["pids"]))
            if int(pid) in pids:
                span = max(t - tl.t0, 1e-9)
                return NvmlStruct({"gpuUtilization": int(round(tl.integral("sm", t) / span)),
                                   "memoryUtilization": int(round(float(tl.at(t)["mem_util"]))),
                                   "maxMemoryUsage": pids[int(pid)] * MIB,
                                   "time": int(span * 1000), "startTime": int(tl.t0 * 1e6),
                                   "isRunning": 1, "reserved": [0] * 5})
        raise NVMLError(C.NVML_ERROR_NOT_FOUND)

    # -- GPM ----------------------------------------------------------------

    def _gpm_supported(self, g: dict[str, Any]) -> bool:
        from .arch import architecture
        return architecture(g) >= C.NVML_DEVICE_ARCH_HOPPER and architecture(g) != C.NVML_DEVICE_ARCH_UNKNOWN

    def nvmlGpmQueryDeviceSupport(self, device: Handle) -> NvmlStruct:
        i, g = self._gpu(device)
        return NvmlStruct({"version": 1, "isSupportedDevice": 1 if self._gpm_supported(g) else 0})

    def nvmlGpmSampleAlloc(self) -> SimGpmSample:
        self._check_init()
        return SimGpmSample()

    def nvmlGpmSampleFree(self, gpmSample: SimGpmSample) -> None:
        gpmSample.freed = True

    def _gpm_fill(self, key: str, g: dict[str, Any], sample: Any) -> Any:
        if not isinstance(sample, SimGpmSample) or sample.freed:
            raise NVMLError(C.NVML_ERROR_INVALID_ARGUMENT)
        if not self._gpm_supported(g):
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        tls, _ = L.timelines(self.state)
        t = L.now(self.state)
        tl = tls.get(key)
        sample.key, sample.t = key, t
        sample.sm_seconds = tl.integral("sm", t) if tl else 0.0
        return sample

    def nvmlGpmSampleGet(self, device: Handle, gpmSample: Any) -> Any:
        i, g, key = self._no_mig(device)
        return self._gpm_fill(key, g, gpmSample)

    def nvmlGpmMigSampleGet(self, device: Handle, gpuInstanceId: int, gpmSample: Any) -> Any:
        i, g, key = self._no_mig(device)
        if not any(int(gi["gi_id"]) == int(gpuInstanceId) for gi in (g.get("mig") or {}).get("instances", [])):
            raise NVMLError(C.NVML_ERROR_NOT_FOUND)
        return self._gpm_fill(f"{i}/gi{int(gpuInstanceId)}", g, gpmSample)

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        self._check_init()
        s1, s2 = metricsGet.sample1, metricsGet.sample2
        if not (isinstance(s1, SimGpmSample) and isinstance(s2, SimGpmSample)) or s1.key != s2.key \
                or s1.key is None:
            raise NVMLError(C.NVML_ERROR_INVALID_ARGUMENT)
        span = s2.t - s1.t
        for j in range(int(metricsGet.numMetrics)):
            m = metricsGet.metrics[j]
            if m.metricId == C.NVML_GPM_METRIC_SM_UTIL and span > 0:
                m.value = (s2.sm_seconds - s1.sm_seconds) / span
                m.nvmlReturn = C.NVML_SUCCESS
            else:
                m.value = 0.0
                m.nvmlReturn = C.NVML_ERROR_NOT_SUPPORTED
        return metricsGet
