"""MIG profile and placement tables of every MIG-capable GPU model we know.

The tables are data, ``slurm_gpu/data/gpu_models.json``, each model with its
provenance (NVIDIA's MIG User Guide, mig-parted's and gpu-operator's default
MIG configs, go-nvml's mock tables, real ``nvidia-smi mig -lgip/-lgipp``
outputs).  No NVML is needed, so ``slurm-gpu mig plan`` and the SPANK-side
validation work anywhere.

A GPU is identified exactly: by its PCI device id first (what mig-parted's
``device-filter`` matches), its NVML name second.  A model that is in
neither list is refused with one line naming the known ones; it is never
planned with another model's table, because profile names collide across
models with different geometry (``1g.35gb`` is 4 instances on an H200 and
7 on a GB300).

NVML placements count *memory* slices (8 on A100/H100/H200/B200-class GPUs,
4 on A30, 12 on RTX PRO 6000 Blackwell, whose driver's ``-lgipp`` places a
1g at {0,3,6,9}:3), so a 3g profile occupies 4 slices at {0,4} and 7g
occupies all 8.

A model may know a profile by a second name (``aliases``): a board variant
whose driver names it differently from production boards of the same GPU
(GB200: ``1g.24gb`` for ``1g.23gb``).  Any other name is refused.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import UsageError
from ..paths import data_file

# NVML_COMPUTE_INSTANCE_PROFILE_*: on real drivers the CI profile info id
# equals this constant (``nvidia-smi mig -cgi 9 -C`` prints "profile ... (ID 2)"
# for the 3-slice CI).
CIP_BY_SLICES = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}

# Compute-instance placements inside a GPU instance with N compute slices
# (go-nvml mock, identical for every model): {gi_slices: {ci_slices: starts}}.
CI_PLACEMENTS: dict[int, dict[int, tuple[int, ...]]] = {
    1: {1: (0,)},
    2: {1: (0, 1), 2: (0,)},
    3: {1: (0, 1, 2), 2: (0,), 3: (0,)},
    4: {1: (0, 1, 2, 3), 2: (0, 2), 4: (0,)},
    7: {1: (0, 1, 2, 3, 4, 5, 6), 2: (0, 2, 4), 3: (0, 4), 7: (0,)},
}

NVIDIA_VENDOR = 0x10DE


@dataclass(frozen=True)
class GiProfile:
    """One GPU-instance profile of one GPU model."""

    name: str                  # "3g.40gb", "1g.10gb+me", "1g.24gb+gfx"
    nvml_profile: int          # NVML_GPU_INSTANCE_PROFILE_* constant
    id: int | None             # profile info id (-lgip "ID"); None: not published, ask the driver
    slices: int                # compute slices (the "Ng")
    instances: int             # most instances of this profile per GPU
    memory_mb: int | None      # None: NVIDIA publishes no figure for this model
    sm_count: int | None
    starts: tuple[int, ...]    # memory-slice placements (nvidia-smi mig -lgipp)
    size: int                  # memory slices per placement
    # SMs of a compute instance smaller than the GPU instance, by its compute
    # slices, as a real `nvidia-smi mig -lcip` lists them.  The shares are not
    # even on every board (a Hopper 2g.20gb offers 1-slice CIs of 16 and of 26
    # SMs), so a size no capture lists has none.
    ci_sm: tuple[tuple[int, int], ...] = ()

    @property
    def ci_sizes(self) -> dict[int, tuple[int, ...]]:
        return CI_PLACEMENTS[self.slices]

    def ci_sm_count(self, ci_slices: int) -> int | None:
        """SMs of a compute instance of *ci_slices* in this GPU instance; None: no source gives it."""
        if ci_slices == self.slices:
            return self.sm_count           # the whole GPU instance: -lgip's figure
        return dict(self.ci_sm).get(ci_slices)

    @property
    def media(self) -> bool:
        """Holds media engines beyond its share (+me, +me.all): one such per GPU."""
        return "+me" in self.name


@dataclass(frozen=True)
class GpuModel:
    key: str                   # short name: a100-40gb
    title: str
    product_names: tuple[str, ...]   # the driver's device name answers
    pci_device_ids: tuple[int, ...]  # PCI device ids (vendor 0x10DE)
    memory_slices: int
    compute_slices: int
    profiles: tuple[GiProfile, ...]
    provenance: tuple[tuple[str, str], ...] = ()
    aliases: tuple[tuple[str, str], ...] = ()   # (a board variant's name, the profile's name)

    def profile(self, name: str) -> GiProfile | None:
        name = dict(self.aliases).get(name, name)
        for p in self.profiles:
            if p.name == name:
                return p
        return None

    def profile_by_id(self, pid: int) -> GiProfile | None:
        for p in self.profiles:
            if p.id is not None and p.id == pid:
                return p
        return None

    @property
    def complete(self) -> bool:
        """Every figure a driver reports is known (what the NVML simulator needs)."""
        return all(p.id is not None and p.memory_mb is not None and p.sm_count is not None
                   for p in self.profiles)


def _profile(d: dict[str, Any]) -> GiProfile:
    return GiProfile(str(d["name"]), int(d["nvml_profile"]),
                     None if d["id"] is None else int(d["id"]), int(d["slices"]),
                     int(d["instances"]),
                     None if d["memory_mib"] is None else int(d["memory_mib"]),
                     None if d["sm_count"] is None else int(d["sm_count"]),
                     tuple(int(s) for s in d["placements"]), int(d["size"]),
                    tuple(sorted((int(k), int(v)) for k, v in (d.get("ci_sm_counts") or {}).items())))


def _model(d: dict[str, Any]) -> GpuModel:
    return GpuModel(str(d["key"]), str(d["title"]), tuple(d["nvml_names"]),
                    tuple(int(x, 16) for x in d["pci_device_ids"]),
                    int(d["memory_slices"]), int(d["compute_slices"]),
                    tuple(_profile(p) for p in d["profiles"]),
                    tuple(sorted(d.get("provenance", {}).items())),
                    tuple(sorted(d.get("aliases", {}).items())))


@lru_cache(maxsize=1)
def models() -> tuple[GpuModel, ...]:
    """Every known model, from the shipped data file (read once)."""
    with open(data_file("gpu_models.json"), encoding="utf-8") as f:
        doc = json.load(f)
    return tuple(_model(m) for m in doc["models"])


def __getattr__(name: str) -> Any:
    # MODELS stays importable without reading the data file at import time.
    if name == "MODELS":
        return models()
    raise AttributeError(name)


def _norm(s: str) -> str:
    # Case, spaces and punctuation only: "NVIDIA A100-SXM4-40GB" == "nvidia a100 sxm4 40gb".
    return "".join(ch for ch in s.lower() if ch.isalnum())


def pci_device(pci_id: int | str | None) -> int | None:
    """The 16-bit PCI device id of an NVML ``pciDeviceId`` (0x233010DE), a
    mig-parted filter ("0x233010DE") or a bare device id (0x2330); None for
    another vendor's id or nothing."""
    if pci_id is None or pci_id == "":
        return None
    v = int(pci_id, 16) if isinstance(pci_id, str) else int(pci_id)
    if v > 0xFFFF:
        if v & 0xFFFF != NVIDIA_VENDOR:
            return None
        v >>= 16
    return v


def find_model(name: str) -> GpuModel | None:
    """The model for a short name (``h100-80gb``) or an exact NVML product name."""
    n = _norm(name)
    if not n:
        return None
    for m in models():
        if n == _norm(m.key) or any(n == _norm(p) for p in m.product_names):
            return m
    return None


def model_by_pci(pci_id: int | str | None) -> GpuModel | None:
    dev = pci_device(pci_id)
    if dev is None:
        return None
    for m in models():
        if dev in m.pci_device_ids:
            return m
    return None


def identify(pci_id: int | str | None, name: str) -> GpuModel | None:
    """The model of one GPU: PCI device id first, NVML name second, else None."""
    return model_by_pci(pci_id) or find_model(name)


def model_names() -> list[str]:
    return [m.key for m in models()]


def unknown_model(what: str, where: str) -> UsageError:
    """The one-line refusal for a model we have no table for."""
    return UsageError(f"unknown GPU model {what!r}; MIG tables exist for: "
                      f"{', '.join(model_names())}", where)
