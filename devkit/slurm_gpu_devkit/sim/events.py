"""The simulator's event sets: ``state["events"]`` is a queue of pending events
that ``nvmlEventSetWait`` hands out once, to whichever process waits first
(:func:`inject_event`)."""
from __future__ import annotations

import time
from typing import Any, Mapping

from slurm_gpu.hw import nvml_constants as C
from slurm_gpu.hw.busid import normalize_bus_id
from slurm_gpu.hw.nvml_api import Handle, NVMLError, NvmlStruct
from .base import SimBase


class EventsMixin(SimBase):
    """NVML's event-set calls, answered from the state's event queue."""

    def nvmlEventSetCreate(self) -> Handle:
        self._check_init()
        return Handle("eventset")

    def nvmlDeviceRegisterEvents(self, handle: Handle, eventTypes: int, eventSet: Handle) -> None:
        self._simple("nvmlDeviceRegisterEvents", handle, (eventTypes,))

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        self._gpu(handle)
        return (C.nvmlEventTypeXidCriticalError | C.nvmlEventTypeDoubleBitEccError
                | C.nvmlEventTypeSingleBitEccError)

    def nvmlEventSetWait_v2(self, eventSet: Handle, timeoutms: int) -> NvmlStruct:
        """Hand out the oldest pending event from the state, once."""
        self._check_init()
        deadline = time.monotonic() + timeoutms / 1000.0
        while True:
            if self.state.get("events"):
                with self.edit() as st:
                    ev = st["events"].pop(0) if st.get("events") else None
                if ev is not None:
                    return _event_struct(ev, self._gpus())
            if time.monotonic() >= deadline:
                raise NVMLError(C.NVML_ERROR_TIMEOUT)
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def nvmlEventSetFree(self, eventSet: Handle) -> None:
        return None


_EVENT_TYPES = {"xid": C.nvmlEventTypeXidCriticalError, "double_bit_ecc": C.nvmlEventTypeDoubleBitEccError,
                "single_bit_ecc": C.nvmlEventTypeSingleBitEccError}


def _event_struct(ev: Mapping[str, Any], gpus: list[dict[str, Any]]) -> NvmlStruct:
    gpu = ev.get("gpu", 0)
    if isinstance(gpu, str) and not gpu.startswith("gpu"):
        b = normalize_bus_id(gpu)
        gpu = next((i for i, g in enumerate(gpus) if normalize_bus_id(g["bus_id"]) == b), 0)
    key = gpu if isinstance(gpu, str) else f"gpu{int(gpu)}"
    et = ev.get("type", "xid")
    return NvmlStruct({"device": Handle(key), "eventType": _EVENT_TYPES.get(et, et) if isinstance(et, str) else et,
                       "eventData": int(ev.get("data", 0)), "gpuInstanceId": int(ev.get("gpu_instance", 0xFFFFFFFF)),
                       "computeInstanceId": int(ev.get("compute_instance", 0xFFFFFFFF))})


def inject_event(sim: Any, gpu: int | str, data: int, type: str = "xid") -> None:
    """Queue an NVML event (e.g. XID 79 on a bus id) for the next nvmlEventSetWait."""
    with sim.edit() as st:
        st.setdefault("events", []).append({"gpu": gpu, "type": type, "data": int(data)})
