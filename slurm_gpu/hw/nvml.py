"""NVML adapter: the only module that imports pynvml.

:func:`read_view` reads GPU identity, NVLink peers, MIG instances and NVLink
fabric membership through an *api* object with pynvml's surface: the real
``pynvml`` module (:func:`open_api`), a :class:`~slurm_gpu.hw.nvml_replay.ReplayNvml`
(snapshots), the simulator (:mod:`slurm_gpu_devkit.sim`), or a
:class:`~slurm_gpu.hw.nvml_record.RecordingNvml` around any of them.  The
same code runs in all four cases, which is what makes replay trustworthy.

Errors: a failure of the whole library (init, device count) raises
:class:`~slurm_gpu.errors.HardwareError` with one line; a GPU that cannot be
read (lost, no permission) is left out with a note; an optional query the
driver does not support (NVLink on PCIe cards, MIG, fabric) just degrades.
"""
from __future__ import annotations

import os
from ctypes import byref
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..errors import HardwareError
from .busid import normalize_bus_id

# The model's and the views' classes are imported where they are built: the
# health check reads only fabric fields here (read_fabric_fields), and
# loading them (14 dataclasses) cost it ~6 ms a run.
if TYPE_CHECKING:
    from .model import Fabric, MigInstance, NvLink
    from .views import NvmlGpu, NvmlView

MIB = 1024 * 1024

# Answers meaning "this query does not apply here", not "the GPU is broken".
_OPTIONAL = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT",
             "NVML_ERROR_NOT_FOUND", "NVML_ERROR_NO_PERMISSION", "NVML_ERROR_NO_DATA")

FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}

MIG_MINORS_PATH = "proc/driver/nvidia-caps/mig-minors"


class NvmlUnavailable(HardwareError):
    """NVML cannot be used on this machine at all (no library, no driver...)."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(what)
        self.code = code


def open_api() -> Any:
    """The real pynvml module, initialised, or :class:`NvmlUnavailable` saying why not."""
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable("NVML unavailable: nvidia-ml-py (pynvml) is not installed", 12) from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise NvmlUnavailable(f"NVML unavailable: {e} ({_err_name(pynvml, e.value)})", e.value) from None
    return pynvml


def close_api(api: Any) -> None:
    """nvmlShutdown, ignoring errors: we are done with it either way."""
    try:
        api.nvmlShutdown()
    except Exception:  # noqa: BLE001 - shutdown failures change nothing for the caller
        pass


def _err_name(api: Any, code: int) -> str:
    # The codes are NVML's, identical for pynvml, the replay and the simulator.
    from .nvml_replay import error_name
    return error_name(code)


class _Reader:
    """Holds the api and the few helpers every query needs."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.optional = tuple(getattr(api, n) for n in _OPTIONAL if hasattr(api, n))

    def err(self, e: Exception) -> str:
        code = getattr(e, "value", None)
        return f"{e} ({_err_name(self.api, code)})" if isinstance(code, int) else str(e)

    def must(self, fn: str, *args: Any) -> Any:
        """A call that must work; any NVML error is a HardwareError."""
        try:
            return getattr(self.api, fn)(*args)
        except self.api.NVMLError as e:
            raise HardwareError(f"NVML {fn} failed: {self.err(e)}") from None

    def maybe(self, fn: str, *args: Any, default: Any = None) -> Any:
        """An optional query: 'not supported' and its kind give *default*.

        A function this pynvml does not have at all (an old nvidia-ml-py on
        an old node) is "not supported" too: the driver would not have it either.
        """
        call = getattr(self.api, fn, None)
        if call is None:
            return default
        try:
            return call(*args)
        except self.api.NVMLError as e:
            if e.value in self.optional:
                return default
            raise


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


def read_view(api: Any, *, mig_minors: Mapping[str, int] | Callable[[], Mapping[str, int]] | None = None
              ) -> NvmlView:
    """Read every GPU's identity, NVLink peers, MIG instances and fabric.

    *mig_minors* maps ``gpu<minor>/gi<id>[/ci<id>]/access`` to a
    ``/dev/nvidia-caps`` minor; by default it is read from this machine's
    ``/proc`` only when a GPU has MIG enabled.
    """
    from .views import NvmlGpu, NvmlView
    r = _Reader(api)
    driver = r.maybe("nvmlSystemGetDriverVersion")
    if driver is not None:
        driver = _s(driver)  # pynvml before 11.515 returns bytes
    count = r.must("nvmlDeviceGetCount")
    notes: list[str] = []
    gpus: list[NvmlGpu] = []
    raw: list[tuple[int, Any, NvmlGpu]] = []
    for index in range(count):
        try:
            handle = api.nvmlDeviceGetHandleByIndex(index)
            g = _read_gpu(r, index, handle)
        except api.NVMLError as e:
            notes.append(f"GPU index {index} unreadable: {r.err(e)}")
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
        except api.NVMLError as e:
            notes.append(f"GPU {g.bus_id} unreadable: {r.err(e)}")
            continue
        gpus.append(NvmlGpu(index=g.index, minor=g.minor, uuid=g.uuid, bus_id=g.bus_id, device_id=g.device_id,
                            name=g.name, memory_bytes=g.memory_bytes, nvlinks=links, mig_enabled=mig_enabled,
                            mig_instances=insts, fabric=fabric))
    return NvmlView(driver_version=driver, gpus=tuple(gpus), notes=tuple(notes))


def _read_gpu(r: _Reader, index: int, h: Any) -> NvmlGpu:
    from .views import NvmlGpu
    api = r.api
    pci = api.nvmlDeviceGetPciInfo(h)
    bus = normalize_bus_id(pci.busId if isinstance(pci.busId, str) else pci.busId.decode())
    mem = r.maybe("nvmlDeviceGetMemoryInfo", h)
    minor = r.maybe("nvmlDeviceGetMinorNumber", h)
    return NvmlGpu(
        index=index, minor=minor, uuid=_s(api.nvmlDeviceGetUUID(h)), bus_id=bus,
        device_id=(pci.pciDeviceId >> 16) & 0xFFFF, name=_s(api.nvmlDeviceGetName(h)),
        memory_bytes=int(mem.total) if mem is not None else None,
    )


def _s(v: Any) -> str:
    # pynvml before 11.515 returns char arrays as bytes; structure fields
    # (PciInfo.busId) are bytes in every version.
    return v.decode() if isinstance(v, bytes) else str(v)


def _read_nvlinks(r: _Reader, h: Any, gpu_buses: set[str]) -> tuple[NvLink, ...]:
    from .model import PEER_CPU, PEER_GPU, PEER_NVSWITCH, NvLink
    api = r.api
    counts: dict[tuple[str, str], int] = {}
    for link in range(api.NVML_NVLINK_MAX_LINKS):
        try:
            active = api.nvmlDeviceGetNvLinkState(h, link)
        except api.NVMLError as e:
            if e.value in r.optional:
                break  # no NVLink at all, or past this GPU's last link
            raise
        if not active:
            continue
        pci = r.maybe("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
        peer = normalize_bus_id(_s(pci.busId)) if pci is not None and _s(pci.busId) else ""
        kind_code = r.maybe("nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
        if kind_code == getattr(api, "NVML_NVLINK_DEVICE_TYPE_UNKNOWN", 0xFF):
            kind_code = None  # the driver could not tell: judge by the remote PCI address, as Slurm does
        if kind_code == api.NVML_NVLINK_DEVICE_TYPE_GPU or (kind_code is None and peer in gpu_buses):
            kind = PEER_GPU
        elif kind_code == api.NVML_NVLINK_DEVICE_TYPE_IBMNPU:
            kind = PEER_CPU
        else:
            kind = PEER_NVSWITCH
        if not peer:
            peer = kind
        counts[(kind, peer)] = counts.get((kind, peer), 0) + 1
    return tuple(NvLink(k, p, n) for (k, p), n in sorted(counts.items()))


def _read_mig(r: _Reader, h: Any, g: NvmlGpu, minors: Callable[[], Mapping[str, int]],
              notes: list[str]) -> tuple[bool | None, tuple[MigInstance, ...]]:
    from .model import MigInstance
    api = r.api
    mode = r.maybe("nvmlDeviceGetMigMode", h)
    if mode is None:
        return None, ()
    current = mode[0]
    if current != api.NVML_DEVICE_MIG_ENABLE:
        return False, ()
    insts: list[MigInstance] = []
    for j in range(r.maybe("nvmlDeviceGetMaxMigDeviceCount", h, default=0) or 0):
        mig = r.maybe("nvmlDeviceGetMigDeviceHandleByIndex", h, j)
        if mig is None:
            continue  # NOT_FOUND: no MIG device at this index
        gi_id = api.nvmlDeviceGetGpuInstanceId(mig)
        ci_id = api.nvmlDeviceGetComputeInstanceId(mig)
        # Attributes are optional like in Slurm's gpu_nvml.c: the profile
        # comes from the name first, and a driver that refuses attributes on
        # a MIG handle must not cost the whole GPU.
        attrs = r.maybe("nvmlDeviceGetAttributes", mig)
        name = _s(r.maybe("nvmlDeviceGetName", mig, default="") or "")
        try:
            profile = mig_profile_name(name, attrs)
        except ValueError:
            notes.append(f"GPU {g.bus_id} MIG device {j}: neither profile name nor attributes readable; "
                         "left out")
            continue
        gi_profile = ci_profile = start = -1
        size = int(attrs.gpuInstanceSliceCount) if attrs is not None else -1
        gi = r.maybe("nvmlDeviceGetGpuInstanceById", h, gi_id)
        if gi is not None:
            info = r.maybe("nvmlGpuInstanceGetInfo", gi)
            if info is not None:
                gi_profile, start, size = int(info.profileId), int(info.placement.start), int(info.placement.size)
            ci = r.maybe("nvmlGpuInstanceGetComputeInstanceById", gi, ci_id)
            cinfo = r.maybe("nvmlComputeInstanceGetInfo", ci) if ci is not None else None
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


def _version_mismatch(api: Any) -> int:
    # pynvml versions before R525 lack the constant; the code is NVML's 25.
    return int(getattr(api, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 25))


def _read_fabric(r: _Reader, h: Any) -> Fabric | None:
    fields = read_fabric_fields(r, h)
    if fields is None:
        return None
    from .model import Fabric
    return Fabric(**fields)


def read_fabric_fields(r: _Reader, h: Any) -> dict[str, Any] | None:
    """The GPU's NVLink fabric membership as :class:`~slurm_gpu.hw.model.Fabric`'s
    fields (None: not supported); the health check's ``gpu.fabric`` reads these."""
    api = r.api
    health = 0
    try:
        info = api.c_nvmlGpuFabricInfoV_t()
        api.nvmlDeviceGetGpuFabricInfoV(h, byref(info))
        health = int(info.healthMask)
    except (api.NVMLError, AttributeError) as e:
        # A driver older than the structure version answers ARGUMENT_VERSION_MISMATCH.
        if isinstance(e, api.NVMLError) and e.value not in r.optional + (_version_mismatch(api),):
            raise
        try:  # drivers before the versioned call (R535 and older)
            info = api.c_nvmlGpuFabricInfo_t()
            api.nvmlDeviceGetGpuFabricInfo(h, byref(info))
        except (api.NVMLError, AttributeError) as e2:
            if isinstance(e2, api.NVMLError) and e2.value not in r.optional:
                raise
            return None
    state = int(info.state)
    if state == api.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
        return None
    return {"cluster_uuid": format_fabric_uuid(info.clusterUuid), "clique_id": int(info.cliqueId),
            "state": FABRIC_STATES.get(state, str(state)), "status": int(info.status), "health_mask": health}
