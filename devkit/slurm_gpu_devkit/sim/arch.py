"""The architecture of a modelled GPU (what nvmlDeviceGetArchitecture answers)."""
from __future__ import annotations

from typing import Any, Mapping

from slurm_gpu.hw import nvml_constants as C

_ARCH_BY_NAME = (("GB200", "BLACKWELL"), ("B200", "BLACKWELL"), ("B100", "BLACKWELL"), ("H100", "HOPPER"),
                 ("H200", "HOPPER"), ("GH200", "HOPPER"), ("H800", "HOPPER"), ("A100", "AMPERE"),
                 ("A30", "AMPERE"), ("A40", "AMPERE"), ("A10", "AMPERE"), ("V100", "VOLTA"), ("P100", "PASCAL"),
                 ("T4", "TURING"), ("L40", "ADA"), ("L4", "ADA"))


def architecture(g: Mapping[str, Any]) -> int:
    """NVML_DEVICE_ARCH_* of a GPU: its ``architecture`` fact, else from its product name."""
    name = g.get("architecture")
    if not name:
        name = next((arch for key, arch in _ARCH_BY_NAME if key in g.get("name", "")), "UNKNOWN")
    return int(getattr(C, f"NVML_DEVICE_ARCH_{str(name).upper()}", C.NVML_DEVICE_ARCH_UNKNOWN))
