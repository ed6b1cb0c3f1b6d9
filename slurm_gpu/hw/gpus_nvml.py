"""The one adapter from an NVML api object to the :class:`~slurm_gpu.hw.gpus.Gpus` protocol.

The api object has pynvml's surface: the real pynvml module, a snapshot
replay (:mod:`slurm_gpu.hw.nvml_replay`), the simulator (:mod:`slurm_gpu_devkit.sim`)
or a recorder around any of them; :mod:`slurm_gpu.hw.backend` picks it.
Only documented pynvml calls are used, with pynvml's conventions (ctypes
placement structs).  Every vendor error becomes a :class:`GpuError` with
the vendor's message, code and the call that failed.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from .gpudata import INSTANCE_LOOKUP, GpuError, GpuEvent, GpuInstance, MigDevice
from .busid import normalize_bus_id
from .plain import Plain

if TYPE_CHECKING:
    from .views import NvmlView

MAX_GI_ID = 15   # GI ids are partition numbers 0..14 on every MIG GPU so far
MAX_CI_ID = 8

# The event kinds xid-watch listens to, with the names its records use.
_EVENT_KINDS = (("nvmlEventTypeXidCriticalError", "xid"), ("nvmlEventTypeDoubleBitEccError", "dbe"),
                ("nvmlEventTypeGpuUnavailableError", "gpu_unavailable"),
                ("nvmlEventTypeGpuRecoveryAction", "recovery_action"))


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def gpu_error(api: Any, e: Exception, call: str) -> GpuError:
    """The vendor exception *e* of *call* as our :class:`GpuError`."""
    code = getattr(e, "value", None)
    from .nvml_replay import error_name
    return GpuError(str(e), code, error_name(code) if isinstance(code, int) else "", call)


class GpuProcess(Plain):
    """A process holding a compute context on a GPU."""

    __slots__ = ("pid", "used_memory")
    pid: int
    used_memory: int | None


class NvmlGpus:
    """:class:`~slurm_gpu.hw.gpus.Gpus` over an api object with pynvml's surface.

    ``api`` stays reachable for the rest of ``slurm_gpu.hw`` (the health
    reader watches each raw call under a deadline); nothing outside hw/ uses it.
    """

    def __init__(self, api: Any, closer: Callable[[Any], None] | None = None) -> None:
        self.api = api
        self._closer = closer
        self._handles: dict[int, Any] = {}

    # -- helpers -------------------------------------------------------------
    def _call(self, call: str, *args: Any) -> Any:
        try:
            return getattr(self.api, call)(*args)
        except self.api.NVMLError as e:
            raise gpu_error(self.api, e, call) from None

    def _dev(self, index: int) -> Any:
        h = self._handles.get(index)
        if h is None:
            h = self._handles[index] = self._call("nvmlDeviceGetHandleByIndex", index)
        return h

    def _codes(self, *names: str) -> tuple[int, ...]:
        return tuple(int(getattr(self.api, n)) for n in names if hasattr(self.api, n))

    # -- reading -------------------------------------------------------------
    def count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def find(self, *, uuid: str | None = None, minor: int | None = None) -> int:
        from .gpuid import nvml_index
        return nvml_index(self.api, uuid=uuid, minor=minor)

    def name(self, index: int) -> str:
        return _s(self._call("nvmlDeviceGetName", self._dev(index)))

    def pci_device_id(self, index: int) -> int:
        return int(self._call("nvmlDeviceGetPciInfo", self._dev(index)).pciDeviceId)

    def bus_id(self, index: int) -> str:
        return normalize_bus_id(_s(self._call("nvmlDeviceGetPciInfo", self._dev(index)).busId))

    def read_view(self, *, mig_minors: Mapping[str, int] | Callable[[], Mapping[str, int]] | None = None
                  ) -> NvmlView:
        from .nvml import read_view
        return read_view(self.api, mig_minors=mig_minors)

    def processes(self, index: int) -> list[GpuProcess]:
        out = self._call("nvmlDeviceGetComputeRunningProcesses", self._dev(index))
        return [GpuProcess(int(p.pid), getattr(p, "usedGpuMemory", None)) for p in out]

    # -- compute mode --------------------------------------------------------
    def compute_mode(self, index: int) -> int:
        return int(self._call("nvmlDeviceGetComputeMode", self._dev(index)))

    def set_compute_mode(self, index: int, mode: int) -> None:
        self._call("nvmlDeviceSetComputeMode", self._dev(index), int(mode))

    # -- MIG -----------------------------------------------------------------
    def check(self, index: int) -> None:
        self._dev(index)

    def mig_mode(self, index: int) -> int | None:
        dev = self._dev(index)
        try:
            return int(self.api.nvmlDeviceGetMigMode(dev)[0])
        except self.api.NVMLError as e:
            if e.value == self.api.NVML_ERROR_NOT_SUPPORTED:
                return None
            raise gpu_error(self.api, e, "nvmlDeviceGetMigMode") from None

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        self._call("nvmlDeviceSetMigMode", self._dev(index), 1 if enabled else 0)

    def gpu_instance_profile_id(self, index: int, profile: int) -> int:
        return int(self._call("nvmlDeviceGetGpuInstanceProfileInfo", self._dev(index), profile).id)

    def gpu_instances(self, index: int) -> list[GpuInstance]:
        # Probing ids: the simulator's handles are not ctypes arrays.
        api, dev = self.api, self._dev(index)
        absent = self._codes("NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT")
        out = []
        for gid in range(MAX_GI_ID):
            try:
                gi = api.nvmlDeviceGetGpuInstanceById(dev, gid)
            except api.NVMLError as e:
                if e.value in absent:
                    continue
                raise gpu_error(api, e, "nvmlDeviceGetGpuInstanceById") from None
            info = self._call("nvmlGpuInstanceGetInfo", gi)
            cis = []
            for cid in range(MAX_CI_ID):
                try:
                    ci = api.nvmlGpuInstanceGetComputeInstanceById(gi, cid)
                except api.NVMLError:
                    continue
                cinfo = self._call("nvmlComputeInstanceGetInfo", ci)
                cis.append((cid, int(cinfo.profileId), int(cinfo.placement.start)))
            out.append(GpuInstance(gid, int(info.profileId), int(info.placement.start),
                                   int(info.placement.size), tuple(cis)))
        return out

    def mig_devices(self, index: int) -> list[MigDevice]:
        return list(self._iter_mig_devices(index))

    def _iter_mig_devices(self, index: int) -> Iterator[MigDevice]:
        api, dev = self.api, self._dev(index)
        n = self._call("nvmlDeviceGetMaxMigDeviceCount", dev)
        for j in range(n):
            try:
                m = api.nvmlDeviceGetMigDeviceHandleByIndex(dev, j)
            except api.NVMLError:
                continue
            u = self._call("nvmlDeviceGetUUID", m)
            yield MigDevice(int(self._call("nvmlDeviceGetGpuInstanceId", m)),
                            int(self._call("nvmlDeviceGetComputeInstanceId", m)), _s(u))

    def create_gpu_instance(self, index: int, profile_id: int, start: int, size: int) -> int:
        import ctypes
        api, dev = self.api, self._dev(index)
        pl = api.c_nvmlGpuInstancePlacement_t()
        pl.start = start
        pl.size = size
        gi = self._call("nvmlDeviceCreateGpuInstanceWithPlacement", dev, profile_id, ctypes.byref(pl))
        return int(self._call("nvmlGpuInstanceGetInfo", gi).id)

    def create_compute_instance(self, index: int, gi_id: int, ci_profile: int, start: int, size: int) -> int:
        import ctypes
        api, dev = self.api, self._dev(index)
        gi = self._call("nvmlDeviceGetGpuInstanceById", dev, gi_id)
        pl = api.c_nvmlComputeInstancePlacement_t()
        pl.start = start
        pl.size = size
        ci = self._call("nvmlGpuInstanceCreateComputeInstanceWithPlacement", gi, ci_profile, ctypes.byref(pl))
        return int(self._call("nvmlComputeInstanceGetInfo", ci).id)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> bool:
        api, dev = self.api, self._dev(index)
        absent = self._codes("NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT")
        try:
            gi = api.nvmlDeviceGetGpuInstanceById(dev, gi_id)
        except api.NVMLError as e:
            if e.value in absent:
                return False
            raise gpu_error(api, e, INSTANCE_LOOKUP) from None
        for cid in range(MAX_CI_ID):
            try:
                ci = api.nvmlGpuInstanceGetComputeInstanceById(gi, cid)
            except api.NVMLError as e:
                if e.value in absent:
                    continue
                raise gpu_error(api, e, "nvmlGpuInstanceGetComputeInstanceById") from None
            self._call("nvmlComputeInstanceDestroy", ci)
        self._call("nvmlGpuInstanceDestroy", gi)
        return True

    # -- events --------------------------------------------------------------
    def listen(self) -> "NvmlEvents":
        return NvmlEvents(self)

    # -- usage ---------------------------------------------------------------
    def stats_reader(self) -> Any:
        from .gpustats import StatsReader
        return StatsReader(self.api)

    # -- lifetime ------------------------------------------------------------
    def close(self) -> None:
        if self._closer is not None:
            self._closer(self.api)


def _bus(api: Any, h: Any) -> str | None:
    try:
        return normalize_bus_id(_s(api.nvmlDeviceGetPciInfo(h).busId))
    except Exception:  # noqa: BLE001 - a lost GPU has no PCI info; the event still counts
        return None


class NvmlEvents:
    """An NVML event set for the critical kinds in :data:`_EVENT_KINDS`."""

    def __init__(self, gpus: NvmlGpus) -> None:
        self._gpus = gpus
        api = gpus.api
        self.wanted = 0
        for const, _ in _EVENT_KINDS:
            self.wanted |= int(getattr(api, const, 0))
        self._set = gpus._call("nvmlEventSetCreate")
        self._buses: dict[Any, str | None] = {}

    def register(self, index: int) -> None:
        api = self._gpus.api
        try:
            h = api.nvmlDeviceGetHandleByIndex(index)
            try:
                supported = int(api.nvmlDeviceGetSupportedEventTypes(h))
            except api.NVMLError:
                supported = self.wanted
            api.nvmlDeviceRegisterEvents(h, self.wanted & supported, self._set)
        except api.NVMLError as e:
            raise gpu_error(api, e, "nvmlDeviceRegisterEvents") from None
        self._buses[getattr(h, "key", id(h))] = _bus(api, h)

    def wait(self, timeout_ms: int) -> GpuEvent | None:
        api = self._gpus.api
        try:
            ev = api.nvmlEventSetWait_v2(self._set, timeout_ms)
        except api.NVMLError as e:
            if e.value == api.NVML_ERROR_TIMEOUT:
                return None
            raise gpu_error(api, e, "nvmlEventSetWait") from None
        etype = int(ev.eventType)
        kind = next((name for const, name in _EVENT_KINDS if etype & int(getattr(api, const, 0))), "other")
        dev = ev.device
        gpu = self._buses.get(getattr(dev, "key", id(dev))) or _bus(api, dev)
        return GpuEvent(kind, gpu, int(ev.eventData), etype)

    def close(self) -> None:
        try:
            self._gpus.api.nvmlEventSetFree(self._set)
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
