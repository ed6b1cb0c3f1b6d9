"""NVML adapter: the only module that imports pynvml, and the node model's GPU read.

:class:`PynvmlApi` is the driver behind the contract
(:class:`~slurm_gpu.hw.nvml_api.NvmlApi`); :func:`read_view` reads GPU
identity, NVLink peers, MIG instances and NVLink fabric membership through
any implementation of it: the driver (:func:`open_api`), a
:class:`~slurm_gpu.hw.nvml_replay.ReplayNvml` (snapshots), the simulator,
or a :class:`~slurm_gpu.hw.nvml_record.RecordingNvml` around any of them.
The same code runs in all four cases, which is what makes replay trustworthy.

Errors (the policy is :func:`slurm_gpu.hw.nvml_api.classify`'s): a failure
of the whole library (init, device count) raises
:class:`~slurm_gpu.errors.HardwareError` with one line; a GPU that cannot be
read (lost, no permission on its identity) is left out with a note; an
optional query that is absent (NVLink on PCIe cards, MIG, fabric) or denied
(NO_PERMISSION) just degrades.
"""
from __future__ import annotations

import os
from ctypes import byref
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..errors import HardwareError
from . import nvml_constants as C
from .busid import normalize_bus_id
from .nvml_api import NVMLError, NvmlApi, NvmlForward, NvmlHandle, Reader, describe, optional
from .nvml_structs import c_nvmlGpuFabricInfo_t, c_nvmlGpuFabricInfo_v2_t, c_nvmlGpuFabricInfo_v3_t

# The model's and the views' classes are imported where they are built: the
# health check reads only fabric fields here (read_fabric_fields), and
# loading them (14 dataclasses) cost it ~6 ms a run.
if TYPE_CHECKING:
    from .model import Fabric, MigInstance, NvLink
    from .views import NvmlGpu, NvmlView

MIB = 1024 * 1024

FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}

MIG_MINORS_PATH = "proc/driver/nvidia-caps/mig-minors"


class NvmlUnavailable(HardwareError):
    """NVML cannot be used on this machine at all (no library, no driver...)."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(what)
        self.code = code


class PynvmlApi(NvmlForward):
    """The driver, through nvidia-ml-py: each call of the contract is pynvml's.

    pynvml's errors become :class:`~slurm_gpu.hw.nvml_api.NVMLError` with
    the same code, so every backend fails alike; a function this
    nvidia-ml-py does not have (an old one on an old node) fails as
    ``FUNCTION_NOT_FOUND``, as the driver's own lookup would.
    """

    def __init__(self, module: Any) -> None:
        self._m = module

    def _call(self, fn: str, args: tuple[Any, ...]) -> Any:
        f = getattr(self._m, fn, None)
        if f is None:
            raise NVMLError(C.NVML_ERROR_FUNCTION_NOT_FOUND)
        try:
            return f(*args)
        except self._m.NVMLError as e:
            raise NVMLError(int(e.value)) from None

    def new_gpm_metrics(self) -> Any:
        return self._m.c_nvmlGpmMetricsGet_t()


def open_api() -> PynvmlApi:
    """The driver, initialised, or :class:`NvmlUnavailable` saying why not."""
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable("NVML unavailable: nvidia-ml-py (pynvml) is not installed", 12) from None
    api = PynvmlApi(pynvml)
    try:
        api.nvmlInit()
    except NVMLError as e:
        raise NvmlUnavailable(f"NVML unavailable: {describe(e)}", e.value) from None
    return api


def close_api(api: NvmlApi) -> None:
    """nvmlShutdown, ignoring errors: we are done with it either way."""
    try:
        api.nvmlShutdown()
    except Exception:  # noqa: BLE001 - shutdown failures change nothing for the caller
        pass


# /proc/driver/nvidia-caps/mig-minors as the driver lays it out: "config 1",
# "monitor 2", then per GPU minor 15 GPU instances x (1 GI access + 8 CI
# access) = 135 minors starting at 3.  Checked against real slurmd output
# (stackhpc: GPU 2 GI 2 -> cap291; deepops: GI 12 CI 0 -> cap111/cap112).
MIG_CAP_BASE = 3
MIG_CAPS_PER_GI = 9
MIG_GIS_PER_GPU = 15


def mig_cap_minor(gpu_minor: int, gi_id: int, ci_id: int | None = None) -> int:
    """The nvidia-caps minor of ``gpu<minor>/gi<id>[/ci<id>]/access`` in the driver's layout."""
    gi = MIG_CAP_BASE + (gpu_minor * MIG_GIS_PER_GPU + gi_id) * MIG_CAPS_PER_GI
    return gi if ci_id is None else gi + 1 + ci_id


def parse_mig_minors(text: str) -> dict[str, int]:
    """``/proc/driver/nvidia-caps/mig-minors`` -> ``{"gpu0/gi1/access": 12, ...}``."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def read_mig_minors(root: str = "/") -> dict[str, int]:
    """The nvidia-caps minor numbers (empty when the file is absent: no MIG driver)."""
    try:
        with open(os.path.join(root, MIG_MINORS_PATH)) as f:
            return parse_mig_minors(f.read())
    except OSError:
        return {}


def read_view(api: NvmlApi, *, mig_minors: Mapping[str, int] | Callable[[], Mapping[str, int]] | None = None
              ) -> NvmlView:
    """Read every GPU's identity, NVLink peers, MIG instances and fabric.

    *mig_minors* maps ``gpu<minor>/gi<id>[/ci<id>]/access`` to a
    ``/dev/nvidia-caps`` minor; by default it is read from this machine's
    ``/proc`` only when a GPU has MIG enabled.
    """
    from .views import NvmlGpu, NvmlView
    r = Reader(api)
    raw_driver = r.maybe(api.nvmlSystemGetDriverVersion)
    driver = _s(raw_driver) if raw_driver is not None else None  # pynvml before 11.515 returns bytes
    try:
        count = api.nvmlDeviceGetCount()
    except NVMLError as e:
        raise HardwareError(f"NVML nvmlDeviceGetCount failed: {describe(e)}") from None
    notes: list[str] = []
    gpus: list[NvmlGpu] = []
    raw: list[tuple[int, Any, NvmlGpu]] = []
    for index in range(count):
        try:
            handle = api.nvmlDeviceGetHandleByIndex(index)
            g = _read_gpu(r, index, handle)
        except NVMLError as e:
            notes.append(f"GPU index {index} unreadable: {describe(e)}")
            continue
        raw.append((index, handle, g))
    known = {g.bus_id for _, _, g in raw}
    minors_cache: list[Mapping[str, int]] = []

    def minors() -> Mapping[str, int]:
        if not minors_cache:
            if mig_minors is None:
                minors_cache.append(read_mig_minors())
            elif callable(mig_minors):
                minors_cache.append(mig_minors())
            else:
                minors_cache.append(mig_minors)
        return minors_cache[0]

    for index, handle, g in raw:
        try:
            links = _read_nvlinks(r, handle, known)
            mig_enabled, insts = _read_mig(r, handle, g, minors, notes)
            fabric = _read_fabric(r, handle)
        except NVMLError as e:
            notes.append(f"GPU {g.bus_id} unreadable: {describe(e)}")
            continue
        gpus.append(NvmlGpu(index=g.index, minor=g.minor, uuid=g.uuid, bus_id=g.bus_id, device_id=g.device_id,
                            name=g.name, memory_bytes=g.memory_bytes, nvlinks=links, mig_enabled=mig_enabled,
                            mig_instances=insts, fabric=fabric))
    return NvmlView(driver_version=driver, gpus=tuple(gpus), notes=tuple(notes))


def _read_gpu(r: Reader, index: int, h: NvmlHandle) -> NvmlGpu:
    from .views import NvmlGpu
    api = r.api
    pci = api.nvmlDeviceGetPciInfo(h)
    bus = normalize_bus_id(pci.busId if isinstance(pci.busId, str) else pci.busId.decode())
    mem = r.maybe(api.nvmlDeviceGetMemoryInfo, h)
    minor = r.maybe(api.nvmlDeviceGetMinorNumber, h)
    return NvmlGpu(
        index=index, minor=minor, uuid=_s(api.nvmlDeviceGetUUID(h)), bus_id=bus,
        device_id=(pci.pciDeviceId >> 16) & 0xFFFF, name=_s(api.nvmlDeviceGetName(h)),
        memory_bytes=int(mem.total) if mem is not None else None,
    )


def _s(v: Any) -> str:
    # pynvml before 11.515 returns char arrays as bytes; structure fields
    # (PciInfo.busId) are bytes in every version.
    return v.decode() if isinstance(v, bytes) else str(v)


def _read_nvlinks(r: Reader, h: NvmlHandle, gpu_buses: set[str]) -> tuple[NvLink, ...]:
    from .model import PEER_CPU, PEER_GPU, PEER_NVSWITCH, NvLink
    api = r.api
    counts: dict[tuple[str, str], int] = {}
    for link in range(C.NVML_NVLINK_MAX_LINKS):
        try:
            active = api.nvmlDeviceGetNvLinkState(h, link)
        except NVMLError as e:
            if optional(e.value):
                break  # no NVLink at all, or past this GPU's last link
            raise
        if not active:
            continue
        pci = r.maybe(api.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
        peer = normalize_bus_id(_s(pci.busId)) if pci is not None and _s(pci.busId) else ""
        kind_code = r.maybe(api.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
        if kind_code == C.NVML_NVLINK_DEVICE_TYPE_UNKNOWN:
            kind_code = None  # the driver could not tell: judge by the remote PCI address, as Slurm does
        if kind_code == C.NVML_NVLINK_DEVICE_TYPE_GPU or (kind_code is None and peer in gpu_buses):
            kind = PEER_GPU
        elif kind_code == C.NVML_NVLINK_DEVICE_TYPE_IBMNPU:
            kind = PEER_CPU
        else:
            kind = PEER_NVSWITCH
        if not peer:
            peer = kind
        counts[(kind, peer)] = counts.get((kind, peer), 0) + 1
    return tuple(NvLink(k, p, n) for (k, p), n in sorted(counts.items()))


def _read_mig(r: Reader, h: NvmlHandle, g: NvmlGpu, minors: Callable[[], Mapping[str, int]],
              notes: list[str]) -> tuple[bool | None, tuple[MigInstance, ...]]:
    from .model import MigInstance
    api = r.api
    mode = r.maybe(api.nvmlDeviceGetMigMode, h)
    if mode is None:
        return None, ()
    current = mode[0]
    if current != C.NVML_DEVICE_MIG_ENABLE:
        return False, ()
    insts: list[MigInstance] = []
    for j in range(r.maybe(api.nvmlDeviceGetMaxMigDeviceCount, h, default=0) or 0):
        mig = r.maybe(api.nvmlDeviceGetMigDeviceHandleByIndex, h, j)
        if mig is None:
            continue  # NOT_FOUND: no MIG device at this index
        gi_id = api.nvmlDeviceGetGpuInstanceId(mig)
        ci_id = api.nvmlDeviceGetComputeInstanceId(mig)
        # Attributes are optional like in Slurm's gpu_nvml.c: the profile
        # comes from the name first, and a driver that refuses attributes on
        # a MIG handle must not cost the whole GPU.
        attrs = r.maybe(api.nvmlDeviceGetAttributes, mig)
        name = _s(r.maybe(api.nvmlDeviceGetName, mig, default="") or "")
        try:
            profile = mig_profile_name(name, attrs)
        except ValueError:
            notes.append(f"GPU {g.bus_id} MIG device {j}: neither profile name nor attributes readable; "
                         "left out")
            continue
        gi_profile = ci_profile = start = -1
        size = int(attrs.gpuInstanceSliceCount) if attrs is not None else -1
        gi = r.maybe(api.nvmlDeviceGetGpuInstanceById, h, gi_id)
        if gi is not None:
            info = r.maybe(api.nvmlGpuInstanceGetInfo, gi)
            if info is not None:
                gi_profile, start, size = int(info.profileId), int(info.placement.start), int(info.placement.size)
            ci = r.maybe(api.nvmlGpuInstanceGetComputeInstanceById, gi, ci_id)
            cinfo = r.maybe(api.nvmlComputeInstanceGetInfo, ci) if ci is not None else None
            if cinfo is not None:
                ci_profile = int(cinfo.profileId)
        else:
            notes.append(f"GPU {g.bus_id} MIG GI {gi_id}: profile and placement unreadable (needs root)")
        caps = minors() if g.minor is not None else {}
        gi_minor = caps.get(f"gpu{g.minor}/gi{gi_id}/access")
        ci_minor = caps.get(f"gpu{g.minor}/gi{gi_id}/ci{ci_id}/access")
        insts.append(MigInstance(
            gi_id=int(gi_id), ci_id=int(ci_id), profile=profile,
            gi_profile_id=gi_profile, ci_profile_id=ci_profile, placement_start=start, placement_size=size,
            memory_bytes=int(attrs.memorySizeMB) * MIB if attrs is not None else 0,
            sm_count=int(attrs.multiprocessorCount) if attrs is not None else 0,
            uuid=_s(api.nvmlDeviceGetUUID(mig)), gi_cap_minor=gi_minor, ci_cap_minor=ci_minor,
        ))
    insts.sort(key=lambda m: (m.gi_id, m.ci_id))
    return True, tuple(insts)


def mig_profile_name(device_name: str, attrs: Any | None) -> str:
    """``3g.40gb`` (or ``1c.3g.40gb``) like Slurm's gpu/nvml plugin derives it.

    The MIG device's name ends in ``MIG 3g.40gb``.  Slurm lower-cases the
    name, turns spaces into ``_`` and takes what follows ``mig_``, so we do
    the same to get the same Type.  When a driver leaves the profile out of
    the name, it is rebuilt from the attributes (memory rounded up to GB).
    """
    slurm_name = device_name.lower().replace(" ", "_")
    marker = "mig_"
    if marker in slurm_name:
        return slurm_name.split(marker, 1)[1]
    if attrs is None:
        raise ValueError(f"MIG profile of {device_name!r} unknown without attributes")
    gi = int(attrs.gpuInstanceSliceCount)
    ci = int(attrs.computeInstanceSliceCount)
    gb = (int(attrs.memorySizeMB) + 1023) // 1024
    prefix = f"{ci}c." if ci != gi else ""
    return f"{prefix}{gi}g.{gb}gb"


def format_fabric_uuid(raw: Any) -> str:
    """16 bytes of cluster UUID -> ``xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``."""
    b = bytes(int(x) & 0xFF for x in raw)
    h = b.hex()
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _read_fabric(r: Reader, h: NvmlHandle) -> Fabric | None:
    fields = read_fabric_fields(r, h)
    if fields is None:
        return None
    from .model import Fabric
    # The node model keeps the registration; the summary is the health check's.
    return Fabric(**{k: v for k, v in fields.items() if k != "health_summary"})


def read_fabric_fields(r: Reader, h: NvmlHandle) -> dict[str, Any] | None:
    """The GPU's NVLink fabric membership as :class:`~slurm_gpu.hw.model.Fabric`'s
    fields (None: not supported); the health check's ``gpu.fabric`` reads these."""
    api = r.api
    info: Any = None
    # The newest structure first: a driver older than a structure version
    # answers ARGUMENT_VERSION_MISMATCH (nvml.h), and then gets the one before.
    for struct in (c_nvmlGpuFabricInfo_v3_t, c_nvmlGpuFabricInfo_v2_t):
        try:
            info = struct()
            api.nvmlDeviceGetGpuFabricInfoV(h, byref(info))
            break
        except NVMLError as e:
            if not optional(e.value) and e.value != C.NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
                raise
            info = None
            if e.value != C.NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
                break
    if info is None:
        try:  # drivers before the versioned call (R535 and older)
            info = c_nvmlGpuFabricInfo_t()
            api.nvmlDeviceGetGpuFabricInfo(h, byref(info))
        except NVMLError as e2:
            if not optional(e2.value):
                raise
            return None
    state = int(info.state)
    if state == C.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
        return None
    return {"cluster_uuid": format_fabric_uuid(info.clusterUuid), "clique_id": int(info.cliqueId),
            "state": FABRIC_STATES.get(state, str(state)), "status": int(info.status),
            "health_mask": int(getattr(info, "healthMask", 0)),
            "health_summary": int(getattr(info, "healthSummary", 0))}
