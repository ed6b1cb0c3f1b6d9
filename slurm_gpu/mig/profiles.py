"""MIG profile and placement tables for every MIG-capable GPU we support.

Shipped as data (no NVML needed) so that ``slurm-gpu mig plan`` and the
SPANK-side validation work anywhere.  Provenance, per field:

* profile names, instance counts, fractions: NVIDIA MIG User Guide,
  "Supported MIG Profiles" (docs.nvidia.com/datacenter/tesla/mig-user-guide/
  supported-mig-profiles.html), copy in shared/realdata/mig/.
* NVML profile constants, memory MiB, SM counts, CI profiles and CI
  placements: NVIDIA/go-nvml ``pkg/nvml/mock/dgxa100|gpus`` tables
  (Apache-2.0), copies ``go-nvml__mock_gpus_<model>.go``.  H100 94 GB / NVL
  memory and SM counts come from the real ``nvidia-smi mig -lgip`` of an
  H100 NVL (driver 560.35.03).
* PCI device ids: mig-parted ``deployments/systemd/config-default.yaml``
  device filters (NVIDIA/mig-parted @ bd7160f, Apache-2.0).
* GPU-instance placements: real ``nvidia-smi mig -lgipp`` output (A100-40GB
  from NVIDIA's guide, H100 NVL, A30).  NVML placements count *memory*
  slices (8 on A100/H100/H200/B200, 4 on A30), so a 3g profile occupies
  4 slices at {0,4} and 7g occupies all 8: the go-nvml mock's compute-slice
  placements ({0,4}:3, {0}:7) are not what a real driver reports and are
  not used.  H100-80GB, H200 and B200 have the same 8-slice geometry as
  the A100 (guide's placement diagrams) and reuse the measured placements.
"""
from __future__ import annotations

from dataclasses import dataclass

# pynvml constants (NVML_GPU_INSTANCE_PROFILE_*), the "profile" argument of
# nvmlDeviceGetGpuInstanceProfileInfo.
GIP_1 = 0x0
GIP_2 = 0x1
GIP_3 = 0x2
GIP_4 = 0x3
GIP_7 = 0x4
GIP_1_REV1 = 0x7   # 1g + media extensions (+me)
GIP_2_REV1 = 0x8   # A30 2g + media extensions
GIP_1_REV2 = 0x9   # 1g with a double memory share (1g.20gb on H100)

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


@dataclass(frozen=True)
class GiProfile:
    """One GPU-instance profile of one GPU model."""

    name: str                  # "3g.40gb", "1g.10gb+me"
    nvml_profile: int          # NVML_GPU_INSTANCE_PROFILE_* constant
    id: int                    # profile info id ("ID" column of nvidia-smi mig -lgip)
    slices: int                # compute slices (the "Ng")
    instances: int             # most instances of this profile per GPU
    memory_mb: int
    sm_count: int
    starts: tuple[int, ...]    # memory-slice placements (nvidia-smi mig -lgipp)
    size: int                  # memory slices per placement

    @property
    def ci_sizes(self) -> dict[int, tuple[int, ...]]:
        return CI_PLACEMENTS[self.slices]


@dataclass(frozen=True)
class GpuModel:
    key: str                   # short name: a100-40gb
    title: str
    product_names: tuple[str, ...]   # NVML nvmlDeviceGetName answers
    pci_device_ids: tuple[int, ...]
    memory_slices: int
    compute_slices: int
    profiles: tuple[GiProfile, ...]

    def profile(self, name: str) -> GiProfile | None:
        for p in self.profiles:
            if p.name == name:
                return p
        return None

    def profile_by_id(self, pid: int) -> GiProfile | None:
        for p in self.profiles:
            if p.id == pid:
                return p
        return None


def _eight_slice(mem: dict[str, tuple[int, int]], names: tuple[str, ...]) -> tuple[GiProfile, ...]:
    """The A100/H100/H200/B200 family: 7 compute, 8 memory slices.

    *mem* maps each profile name (in *names*' order 1g, 1g+me, 1g-double,
    2g, 3g, 4g, 7g) to (memory MiB, SM count).
    """
    one, one_me, one_dbl, two, three, four, seven = names
    spec = [  # name, nvml const, id, slices, instances, starts, size
        (one, GIP_1, 19, 1, 7, (0, 1, 2, 3, 4, 5, 6), 1),
        (one_me, GIP_1_REV1, 20, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
        (one_dbl, GIP_1_REV2, 15, 1, 4, (0, 2, 4, 6), 2),
        (two, GIP_2, 14, 2, 3, (0, 2, 4), 2),
        (three, GIP_3, 9, 3, 2, (0, 4), 4),
        (four, GIP_4, 5, 4, 1, (0,), 4),
        (seven, GIP_7, 0, 7, 1, (0,), 8),
    ]
    return tuple(GiProfile(n, c, i, s, k, mem[n][0], mem[n][1], st, sz)
                 for n, c, i, s, k, st, sz in spec)


def _family(prefix: tuple[str, str, str, str, str, str, str],
            mem_sm: tuple[tuple[int, int], ...]) -> tuple[GiProfile, ...]:
    return _eight_slice(dict(zip(prefix, mem_sm)), prefix)


A100_40 = GpuModel(
    "a100-40gb", "NVIDIA A100 40GB",
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB", "A100-SXM4-40GB", "A100-PCIE-40GB"),
    (0x20B0, 0x20B1, 0x20F1, 0x20F6), 8, 7,
    _family(("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
            ((4864, 14), (4864, 14), (9856, 14), (9856, 28), (19968, 42), (19968, 56), (40192, 98))))

A100_80 = GpuModel(
    "a100-80gb", "NVIDIA A100 80GB",
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-80GB", "NVIDIA A100 80GB PCIe", "A100-SXM4-80GB"),
    (0x20B2, 0x20B5, 0x20F3, 0x20F5), 8, 7,
    _family(("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
            ((9856, 14), (9856, 14), (19968, 14), (19968, 28), (40192, 42), (40192, 56), (80384, 98))))

H100_80 = GpuModel(
    "h100-80gb", "NVIDIA H100 80GB (SXM5, PCIe)",
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"),
    (0x2330, 0x2331, 0x2322, 0x2324), 8, 7,
    _family(("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
            ((10240, 16), (10240, 16), (20480, 16), (20480, 32), (40960, 48), (40960, 64), (81920, 112))))

_H100_94 = _family(("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
                   ((11008, 16), (11008, 16), (22144, 26), (22144, 32), (47488, 60), (47488, 64),
                    (95354, 132)))

H100_94 = GpuModel("h100-94gb", "NVIDIA H100 94GB (PCIe, SXM5)",
                   ("NVIDIA H100 94GB HBM2e", "NVIDIA H100 PCIe 94GB"), (), 8, 7, _H100_94)

H100_NVL = GpuModel("h100-nvl", "NVIDIA H100 NVL (94GB)", ("NVIDIA H100 NVL",), (0x2321, 0x233A), 8, 7,
                    _H100_94)

H200 = GpuModel(
    "h200", "NVIDIA H200 141GB",
    ("NVIDIA H200", "NVIDIA H200 141GB HBM3e", "NVIDIA H200 NVL"),
    (0x2335, 0x233B), 8, 7,
    _family(("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
            ((18432, 16), (18432, 16), (35840, 16), (35840, 32), (72704, 48), (72704, 64), (144384, 112))))

B200 = GpuModel(
    "b200", "NVIDIA B200 180GB",
    ("NVIDIA B200", "NVIDIA B200 180GB HBM3e"),
    (0x2901,), 8, 7,
    _family(("1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),
            ((23552, 18), (23552, 18), (46080, 18), (46080, 36), (92160, 54), (92160, 72), (184320, 126))))

# A30: 4 compute and 4 memory slices; real -lgip IDs 14/21/5/0 (+ 2g+me = 6,
# from the guide's A30 table), real -lgipp placements.
A30 = GpuModel(
    "a30", "NVIDIA A30 24GB",
    ("NVIDIA A30", "NVIDIA A30-PCIE-24GB"),
    (0x20B7,), 4, 4,
    (
        GiProfile("1g.6gb", GIP_1, 14, 1, 4, 5836, 14, (0, 1, 2, 3), 1),
        GiProfile("1g.6gb+me", GIP_1_REV1, 21, 1, 1, 5836, 14, (0, 1, 2, 3), 1),
        GiProfile("2g.12gb", GIP_2, 5, 2, 2, 11672, 28, (0, 2), 2),
        GiProfile("2g.12gb+me", GIP_2_REV1, 6, 2, 1, 11672, 28, (0, 2), 2),
        GiProfile("4g.24gb", GIP_4, 0, 4, 1, 23344, 56, (0,), 4),
    ))

MODELS: tuple[GpuModel, ...] = (A100_40, A100_80, H100_80, H100_94, H100_NVL, H200, B200, A30)


def _norm(s: str) -> str:
    return "".join(ch for ch in s.lower() if ch.isalnum())


def find_model(name: str) -> GpuModel | None:
    """The model for a short name (``h100-80gb``) or NVML product name."""
    n = _norm(name)
    for m in MODELS:
        if n == _norm(m.key) or any(n == _norm(p) for p in m.product_names):
            return m
    # Product names we have not seen verbatim: match on family + memory size.
    rules = (("a100", "40gb", A100_40), ("a100", "80gb", A100_80), ("h100", "nvl", H100_NVL),
             ("h100", "94gb", H100_94), ("h100", "80gb", H100_80), ("h100", "pcie", H100_80),
             ("h200", "", H200), ("b200", "", B200), ("a30", "", A30))
    for fam, extra, m in rules:
        if fam in n and extra in n and "gh200" not in n:
            return m
    return None


def model_names() -> list[str]:
    return [m.key for m in MODELS]
