"""The ctypes structures callers build and pass to NVML by reference (nvml.h's layout).

Apart from :mod:`slurm_gpu.hw.nvml_api` so that only the code that passes
one (fabric reads, MIG instance creation) imports ctypes.
"""
from __future__ import annotations

import ctypes

from . import nvml_constants as C

# Same field layout as nvml.h's, so a caller builds them the same whatever
# the backend: pynvml hands them to the C library by reference, replay and
# simulator fill them in.


class c_nvmlGpuFabricInfo_t(ctypes.Structure):
    _fields_ = [
        ("clusterUuid", ctypes.c_uint8 * C.NVML_GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
    ]


class c_nvmlGpuFabricInfo_v2_t(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_uint8 * C.NVML_GPU_FABRIC_UUID_LEN),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
        ("healthMask", ctypes.c_uint32),
    ]

    def __init__(self) -> None:
        super().__init__(version=C.nvmlGpuFabricInfo_v2)


class c_nvmlGpuFabricInfo_v3_t(ctypes.Structure):
    # nvml.h (R570+; NVIDIA/go-nvml gen/nvml/nvml.h @ 2f9e261f): v2 plus
    # ``unsigned char healthSummary`` (NVML_GPU_FABRIC_HEALTH_SUMMARY_*).
    _fields_ = [*c_nvmlGpuFabricInfo_v2_t._fields_, ("healthSummary", ctypes.c_ubyte)]

    def __init__(self) -> None:
        super().__init__(version=C.nvmlGpuFabricInfo_v3)


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class c_nvmlComputeInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]
