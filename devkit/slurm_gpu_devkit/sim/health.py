"""The simulator's health counters (ECC, remapped rows, retired pages, PCIe, clocks, fields).

Mixed into :class:`~slurm_gpu_devkit.sim.nvml.SimNvml`; each GPU's ``health``
facts answer, and a fault overlay (:mod:`slurm_gpu.hw.nvml_overlay`) changes them.
"""
from __future__ import annotations

from typing import Any

from slurm_gpu.hw import nvml_constants as C
from slurm_gpu.hw.nvml_api import Handle, NVMLError, NvmlStruct
from .base import SimBase


class HealthMixin(SimBase):
    """The health queries of NVML, answered from ``facts.gpus[i].health``."""

    def _health(self, fn: str, handle: Handle, args: tuple[Any, ...] = ()) -> dict[str, Any]:
        i, g = self._simple(fn, handle, args)
        return g.get("health") or {}

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, errorType: int, counterType: int) -> int:
        h = self._health("nvmlDeviceGetTotalEccErrors", handle, (errorType, counterType))
        if h.get("ecc") is False:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        kind = "uncorrected" if errorType == C.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "corrected"
        counter = "volatile" if counterType == C.NVML_VOLATILE_ECC else "aggregate"
        return int(h.get(f"ecc_{counter}_{kind}", 0))

    def nvmlDeviceGetEccMode(self, handle: Handle) -> list[int]:
        h = self._health("nvmlDeviceGetEccMode", handle)
        if h.get("ecc") is False:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        return [1, 1]

    def nvmlDeviceGetRemappedRows(self, device: Handle) -> tuple[int, int, int, int]:
        h = self._health("nvmlDeviceGetRemappedRows", device)
        rr = h.get("remapped_rows")
        if rr is None:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        return (int(rr.get("correctable", 0)), int(rr.get("uncorrectable", 0)), int(rr.get("pending", 0)),
                int(rr.get("failed", 0)))

    def nvmlDeviceGetRetiredPages(self, device: Handle, sourceFilter: int) -> list[int]:
        h = self._health("nvmlDeviceGetRetiredPages", device, (sourceFilter,))
        rp = h.get("retired_pages")
        if rp is None:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        key = "double_bit" if sourceFilter == C.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR else "single_bit"
        return list(rp.get(key, []))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Handle) -> int:
        h = self._health("nvmlDeviceGetRetiredPagesPendingStatus", device)
        rp = h.get("retired_pages")
        if rp is None:
            raise NVMLError(C.NVML_ERROR_NOT_SUPPORTED)
        return int(rp.get("pending", 0))

    def _pcie(self, fn: str, handle: Handle, key: str, default: int) -> int:
        h = self._health(fn, handle)
        return int((h.get("pcie") or {}).get(key, default))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Handle) -> int:
        return self._pcie("nvmlDeviceGetCurrPcieLinkGeneration", handle, "gen", 5)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Handle) -> int:
        return self._pcie("nvmlDeviceGetMaxPcieLinkGeneration", handle, "max_gen", 5)

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: Handle) -> int:
        return self._pcie("nvmlDeviceGetGpuMaxPcieLinkGeneration", handle, "max_gen", 5)

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Handle) -> int:
        return self._pcie("nvmlDeviceGetCurrPcieLinkWidth", handle, "width", 16)

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Handle) -> int:
        return self._pcie("nvmlDeviceGetMaxPcieLinkWidth", handle, "max_width", 16)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int:
        h = self._health("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return int(h.get("clocks_event_reasons", C.nvmlClocksEventReasonGpuIdle))

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        h = self._health("nvmlDeviceGetTemperature", handle, (sensor,))
        return int(h.get("temperature", 34))

    def nvmlDeviceGetFieldValues(self, handle: Handle, fieldIds: list[Any]) -> list[NvmlStruct]:
        h = self._health("nvmlDeviceGetFieldValues", handle, (list(fieldIds),))
        fields = {str(k): v for k, v in (h.get("fields") or {}).items()}
        out = []
        for fid in fieldIds:
            fid, scope = (fid if isinstance(fid, (tuple, list)) else (fid, 0))
            # A scoped field (a link's speed: scopeId = link) as "<field>:<scope>", else the field.
            v = fields.get(f"{fid}:{scope}", fields.get(str(fid)))
            ret = C.NVML_SUCCESS if v is not None else C.NVML_ERROR_NOT_SUPPORTED
            val = int(v or 0)
            out.append(NvmlStruct({"fieldId": fid, "scopeId": scope, "timestamp": 0, "latencyUsec": 0,
                                   "valueType": C.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "nvmlReturn": ret,
                                   "value": NvmlStruct({"dVal": float(val), "uiVal": val & 0xFFFFFFFF,
                                                        "ulVal": val, "ullVal": val, "sllVal": val,
                                                        "siVal": val, "usVal": val & 0xFFFF})}))
        return out
