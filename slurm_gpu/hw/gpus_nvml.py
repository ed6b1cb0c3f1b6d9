"""The one adapter from the NVML contract to the :class:`~slurm_gpu.hw.gpus.Gpus` protocol.

The api implements :class:`~slurm_gpu.hw.nvml_api.NvmlApi`: the driver, a
snapshot replay (:mod:`slurm_gpu.hw.nvml_replay`), the simulator or a
recorder around any of them; :mod:`slurm_gpu.hw.backend` picks it.  Every
NVML error becomes a :class:`GpuError` with NVML's message, code and the
call that failed; which codes mean "none" is :func:`~slurm_gpu.hw.nvml_api.classify`'s.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from . import nvml_constants as C
from .busid import normalize_bus_id
from .gpudata import INSTANCE_LOOKUP, GpuError, GpuEvent, GpuInstance, MigDevice
from .nvml_api import ABSENT, NVMLError, NvmlApi, NvmlHandle, classify
from .plain import Plain

if TYPE_CHECKING:
    from .gpustats import StatsReader
    from .views import NvmlView

MAX_GI_ID = 15   # GI ids are partition numbers 0..14 on every MIG GPU so far
MAX_CI_ID = 8

# The event kinds xid-watch listens to, with the names its records use.
_EVENT_KINDS = ((C.nvmlEventTypeXidCriticalError, "xid"), (C.nvmlEventTypeDoubleBitEccError, "dbe"),
                (C.nvmlEventTypeGpuUnavailableError, "gpu_unavailable"),
                (C.nvmlEventTypeGpuRecoveryAction, "recovery_action"))


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def gpu_error(e: NVMLError, call: str) -> GpuError:
    """The NVML error *e* of *call* as our :class:`GpuError`."""
    return GpuError(str(e), e.value, e.name, call)


class GpuProcess(Plain):
    """A process holding a compute context on a GPU."""

    __slots__ = ("pid", "used_memory")
    pid: int
    used_memory: int | None


class NvmlGpus:
    """:class:`~slurm_gpu.hw.gpus.Gpus` over an :class:`~slurm_gpu.hw.nvml_api.NvmlApi`.

    ``api`` stays reachable for the rest of ``slurm_gpu.hw`` (the health
    reader watches each raw call under a deadline); nothing outside hw/ uses it.
    """

    def __init__(self, api: NvmlApi, closer: Callable[[NvmlApi], None] | None = None) -> None:
        self.api = api
        self._closer = closer
        self._handles: dict[int, NvmlHandle] = {}

    # -- helpers -------------------------------------------------------------
    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except NVMLError as e:
            raise gpu_error(e, fn.__name__) from None

    def _present(self, fn: Callable[..., Any], *args: Any, call: str | None = None) -> Any:
        """``fn(*args)``, or None where NVML answers that there is no such thing."""
        try:
            return fn(*args)
        except NVMLError as e:
            if classify(e.value) == ABSENT:
                return None
            raise gpu_error(e, call or fn.__name__) from None

    def _compute_instances(self, gi: NvmlHandle) -> Iterator[tuple[int, NvmlHandle]]:
        """(id, handle) of each compute instance of GPU instance *gi*."""
        # Probing ids: the simulator's handles are not ctypes arrays.
        for cid in range(MAX_CI_ID):
            ci = self._present(self.api.nvmlGpuInstanceGetComputeInstanceById, gi, cid)
            if ci is not None:
                yield cid, ci

    def _dev(self, index: int) -> NvmlHandle:
        h = self._handles.get(index)
        if h is None:
            h = self._handles[index] = self._call(self.api.nvmlDeviceGetHandleByIndex, index)
        return h

    # -- reading -------------------------------------------------------------
    def count(self) -> int:
        return int(self._call(self.api.nvmlDeviceGetCount))

    def find(self, *, uuid: str | None = None, minor: int | None = None) -> int:
        from .gpuid import nvml_index
        return nvml_index(self.api, uuid=uuid, minor=minor)

    def name(self, index: int) -> str:
        return _s(self._call(self.api.nvmlDeviceGetName, self._dev(index)))

    def pci_device_id(self, index: int) -> int:
        return int(self._call(self.api.nvmlDeviceGetPciInfo, self._dev(index)).pciDeviceId)

    def bus_id(self, index: int) -> str:
        return normalize_bus_id(_s(self._call(self.api.nvmlDeviceGetPciInfo, self._dev(index)).busId))

    def read_view(self, *, mig_minors: Mapping[str, int] | Callable[[], Mapping[str, int]] | None = None
                  ) -> NvmlView:
        from .nvml import read_view
        return read_view(self.api, mig_minors=mig_minors)

    def processes(self, index: int) -> list[GpuProcess]:
        out = self._call(self.api.nvmlDeviceGetComputeRunningProcesses, self._dev(index))
        return [GpuProcess(int(p.pid), getattr(p, "usedGpuMemory", None)) for p in out]

    # -- compute mode --------------------------------------------------------
    def compute_mode(self, index: int) -> int:
        return int(self._call(self.api.nvmlDeviceGetComputeMode, self._dev(index)))

    def set_compute_mode(self, index: int, mode: int) -> None:
        self._call(self.api.nvmlDeviceSetComputeMode, self._dev(index), int(mode))

    # -- MIG -----------------------------------------------------------------
    def check(self, index: int) -> None:
        self._dev(index)

    def mig_mode(self, index: int) -> int | None:
        # ABSENT: a GPU without MIG; denied is not "no MIG"
        modes = self._present(self.api.nvmlDeviceGetMigMode, self._dev(index))
        return None if modes is None else int(modes[0])

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        self._call(self.api.nvmlDeviceSetMigMode, self._dev(index), 1 if enabled else 0)

    def gpu_instance_profile_id(self, index: int, profile: int) -> int:
        return int(self._call(self.api.nvmlDeviceGetGpuInstanceProfileInfo, self._dev(index), profile).id)

    def gpu_instances(self, index: int) -> list[GpuInstance]:
        # Probing ids: the simulator's handles are not ctypes arrays.
        api, dev = self.api, self._dev(index)
        out = []
        for gid in range(MAX_GI_ID):
            gi = self._present(api.nvmlDeviceGetGpuInstanceById, dev, gid)
            if gi is None:      # no instance with this id
                continue
            info = self._call(api.nvmlGpuInstanceGetInfo, gi)
            cis = []
            for cid, ci in self._compute_instances(gi):
                cinfo = self._call(api.nvmlComputeInstanceGetInfo, ci)
                cis.append((cid, int(cinfo.profileId), int(cinfo.placement.start)))
            out.append(GpuInstance(gid, int(info.profileId), int(info.placement.start),
                                   int(info.placement.size), tuple(cis)))
        return out

    def mig_devices(self, index: int) -> list[MigDevice]:
        return list(self._iter_mig_devices(index))

    def _iter_mig_devices(self, index: int) -> Iterator[MigDevice]:
        api, dev = self.api, self._dev(index)
        n = self._call(api.nvmlDeviceGetMaxMigDeviceCount, dev)
        for j in range(n):
            m = self._present(api.nvmlDeviceGetMigDeviceHandleByIndex, dev, j)
            if m is None:       # no MIG device at this index
                continue
            u = self._call(api.nvmlDeviceGetUUID, m)
            yield MigDevice(int(self._call(api.nvmlDeviceGetGpuInstanceId, m)),
                            int(self._call(api.nvmlDeviceGetComputeInstanceId, m)), _s(u))

    def create_gpu_instance(self, index: int, profile_id: int, start: int, size: int) -> int:
        from ctypes import byref

        from .nvml_structs import c_nvmlGpuInstancePlacement_t
        api, dev = self.api, self._dev(index)
        pl = c_nvmlGpuInstancePlacement_t(start, size)
        gi = self._call(api.nvmlDeviceCreateGpuInstanceWithPlacement, dev, profile_id, byref(pl))
        return int(self._call(api.nvmlGpuInstanceGetInfo, gi).id)

    def create_compute_instance(self, index: int, gi_id: int, ci_profile: int, start: int, size: int) -> int:
        from ctypes import byref

        from .nvml_structs import c_nvmlComputeInstancePlacement_t
        api, dev = self.api, self._dev(index)
        gi = self._call(api.nvmlDeviceGetGpuInstanceById, dev, gi_id)
        pl = c_nvmlComputeInstancePlacement_t(start, size)
        ci = self._call(api.nvmlGpuInstanceCreateComputeInstanceWithPlacement, gi, ci_profile, byref(pl))
        return int(self._call(api.nvmlComputeInstanceGetInfo, ci).id)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> bool:
        api = self.api
        gi = self._present(api.nvmlDeviceGetGpuInstanceById, self._dev(index), gi_id, call=INSTANCE_LOOKUP)
        if gi is None:
            return False
        for _, ci in self._compute_instances(gi):
            self._call(api.nvmlComputeInstanceDestroy, ci)
        self._call(api.nvmlGpuInstanceDestroy, gi)
        return True

    # -- events --------------------------------------------------------------
    def listen(self) -> "NvmlEvents":
        return NvmlEvents(self)

    # -- usage ---------------------------------------------------------------
    def stats_reader(self) -> StatsReader:
        from .gpustats import StatsReader
        return StatsReader(self.api)

    # -- lifetime ------------------------------------------------------------
    def close(self) -> None:
        if self._closer is not None:
            self._closer(self.api)


def _bus(api: NvmlApi, h: NvmlHandle) -> str | None:
    try:
        return normalize_bus_id(_s(api.nvmlDeviceGetPciInfo(h).busId))
    except Exception:  # noqa: BLE001 - a lost GPU has no PCI info; the event still counts
        return None


class NvmlEvents:
    """An NVML event set for the critical kinds in :data:`_EVENT_KINDS`."""

    def __init__(self, gpus: NvmlGpus) -> None:
        self._gpus = gpus
        self.wanted = 0
        for kind, _ in _EVENT_KINDS:
            self.wanted |= kind
        self._set = gpus._call(gpus.api.nvmlEventSetCreate)
        self._buses: dict[Any, str | None] = {}

    def register(self, index: int) -> None:
        api = self._gpus.api
        try:
            h = api.nvmlDeviceGetHandleByIndex(index)
            try:
                supported = int(api.nvmlDeviceGetSupportedEventTypes(h))
            except NVMLError:
                supported = self.wanted     # cannot tell: ask for all, the driver refuses what it lacks
            api.nvmlDeviceRegisterEvents(h, self.wanted & supported, self._set)
        except NVMLError as e:
            raise gpu_error(e, "nvmlDeviceRegisterEvents") from None
        self._buses[getattr(h, "key", id(h))] = _bus(api, h)

    def wait(self, timeout_ms: int) -> GpuEvent | None:
        api = self._gpus.api
        try:
            ev = api.nvmlEventSetWait_v2(self._set, timeout_ms)
        except NVMLError as e:
            if e.value == C.NVML_ERROR_TIMEOUT:
                return None
            raise gpu_error(e, "nvmlEventSetWait") from None
        etype = int(ev.eventType)
        kind = next((name for bit, name in _EVENT_KINDS if etype & bit), "other")
        dev = ev.device
        gpu = self._buses.get(getattr(dev, "key", id(dev))) or _bus(api, dev)
        return GpuEvent(kind, gpu, int(ev.eventData), etype)

    def close(self) -> None:
        try:
            self._gpus.api.nvmlEventSetFree(self._set)
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
