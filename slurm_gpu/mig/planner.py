"""Pure MIG planner: a layout string -> GPU/compute-instance placements.

Layout grammar (what ``--gpu-mig`` takes)::

    layout   := gpu ( ";" gpu )*          one gpu layout for every GPU of the job,
                                          or one per GPU, in the job's GPU order
    gpu      := entry ( "," entry )*
    entry    := [ COUNT "x" ] [ CI "c." ] PROFILE
    PROFILE  := e.g. 3g.40gb, 1g.10gb+me  (the GPU model's GI profile names)

``2x1g.10gb`` is two ``1g.10gb`` instances; ``1c.3g.40gb`` is a ``3g.40gb``
GPU instance holding one 1-slice compute instance (the nvidia-smi
``-lcip`` naming).  Without a ``c.`` prefix the compute instance spans the
whole GPU instance.  Placement follows the driver's rules from the real
tables in :mod:`slurm_gpu.mig.profiles`: each profile may start only at its
listed memory-slice offsets, instances may not overlap, per-profile
instance limits hold, and the compute slices add up to at most the GPU's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import UsageError
from .profiles import CI_PLACEMENTS, CIP_BY_SLICES, GiProfile, GpuModel

MAX_ENTRIES = 64   # a GPU holds at most 7; this only bounds parsing work

# Suffixes as NVIDIA names them: +me (media extensions), +me.all (all media
# engines), -me (none), +gfx (graphics, RTX PRO Blackwell).
_ENTRY = re.compile(r"^(?:(\d+)x)?(?:(\d+)c\.)?(\d+g\.\d+gb(?:\+me\.all|\+me|\+gfx|-me)?)$")


@dataclass(frozen=True)
class Request:
    """One instance asked for: GI profile name and CI size (None = whole GI)."""

    profile: str
    ci_slices: int | None = None

    @property
    def text(self) -> str:
        return f"{self.ci_slices}c.{self.profile}" if self.ci_slices else self.profile


@dataclass(frozen=True)
class Placement:
    """One planned GPU instance with its single compute instance."""

    profile: str              # GI profile name
    gi_profile_id: int | None  # NVML profile info id (-lgip "ID"); None: ask the driver
    nvml_profile: int         # NVML_GPU_INSTANCE_PROFILE_* constant
    start: int                # memory-slice placement
    size: int
    ci_slices: int            # compute slices of the CI
    ci_profile: int           # NVML_COMPUTE_INSTANCE_PROFILE_* constant
    ci_start: int
    memory_mb: int | None     # None: not published for this model
    sm_count: int | None

    @property
    def name(self) -> str:
        gi_slices = int(self.profile.split("g.", 1)[0])
        if self.ci_slices == gi_slices:
            return self.profile
        return f"{self.ci_slices}c.{self.profile}"

    def to_dict(self) -> dict:
        return {"profile": self.profile, "name": self.name, "gi_profile_id": self.gi_profile_id,
                "start": self.start, "size": self.size, "ci_slices": self.ci_slices,
                "ci_profile": self.ci_profile, "ci_start": self.ci_start,
                "memory_mb": self.memory_mb, "sm_count": self.sm_count}


def parse_layout(text: str) -> list[list[Request]]:
    """Syntax check only (no GPU model needed): the per-GPU request lists."""
    where = "--gpu-mig"
    if not isinstance(text, str) or not text.strip():
        raise UsageError("empty MIG layout", where)
    if len(text) > 1024:
        raise UsageError("MIG layout too long", where)
    gpus: list[list[Request]] = []
    for gpu_text in text.strip().split(";"):
        reqs: list[Request] = []
        for raw in gpu_text.split(","):
            item = raw.strip().lower()
            m = _ENTRY.match(item)
            if not m:
                shown = raw.strip() or "(empty)"
                raise UsageError(f"bad MIG layout entry {shown!r}: expected e.g. 3g.40gb, "
                                 "2x1g.10gb or 1c.3g.40gb", where)
            count = int(m.group(1)) if m.group(1) else 1
            ci = int(m.group(2)) if m.group(2) else None
            if count < 1:
                raise UsageError(f"bad count in MIG layout entry {item!r}", where)
            if ci is not None and ci < 1:
                raise UsageError(f"bad compute-instance size in MIG layout entry {item!r}", where)
            if len(reqs) + count > MAX_ENTRIES:
                raise UsageError("MIG layout has too many instances", where)
            reqs.extend([Request(m.group(3), ci)] * count)
        gpus.append(reqs)
    return gpus


def layout_text(requests: list[Request]) -> str:
    """The compact form of *requests* (runs of one entry become ``Nx``)."""
    parts: list[str] = []
    i = 0
    while i < len(requests):
        j = i
        while j < len(requests) and requests[j] == requests[i]:
            j += 1
        n = j - i
        parts.append(f"{n}x{requests[i].text}" if n > 1 else requests[i].text)
        i = j
    return ",".join(parts)


def _resolve(req: Request, model: GpuModel, where: str) -> GiProfile:
    prof = model.profile(req.profile)
    if prof is None:
        valid = ", ".join(p.name for p in model.profiles)
        raise UsageError(f"{req.profile} is not a MIG profile of the {model.title} "
                         f"(valid: {valid})", where)
    if req.ci_slices is not None and req.ci_slices not in prof.ci_sizes:
        sizes = ", ".join(f"{c}c" for c in sorted(prof.ci_sizes))
        raise UsageError(f"{req.text}: a {prof.name} instance takes compute instances of "
                         f"{sizes}", where)
    return prof


def plan_gpu(requests: list[Request], model: GpuModel, *,
             occupied: frozenset[int] = frozenset(), where: str = "--gpu-mig") -> list[Placement]:
    """Placements for *requests* on one GPU whose memory slices *occupied* are taken.

    Raises :class:`UsageError` with one line saying why the layout cannot fit.
    """
    profs = [_resolve(r, model, where) for r in requests]
    text = layout_text(requests)
    counts: dict[str, int] = {}
    for p in profs:
        counts[p.name] = counts.get(p.name, 0) + 1
    for name, n in counts.items():
        p = model.profile(name)
        assert p is not None
        if n > p.instances:
            raise UsageError(f"MIG layout {text} asks for {n} x {name}; the {model.title} "
                             f"has room for at most {p.instances}", where)
    me = [p.name for p in profs if p.media]
    if len(me) > 1:
        raise UsageError(f"MIG layout {text} has {len(me)} media-extension (+me) instances; "
                         "a GPU has one", where)
    used = sum(p.slices for p in profs)
    if used > model.compute_slices:
        raise UsageError(f"MIG layout {text} needs {used} compute slices; the {model.title} "
                         f"has {model.compute_slices}", where)
    mem = sum(p.size for p in profs)
    free = model.memory_slices - len(occupied)
    if mem > free:
        raise UsageError(f"MIG layout {text} needs {mem} of {model.memory_slices} memory "
                         f"slices; {free} are free", where)
    # Largest first: the big profiles have the fewest placements.
    order = sorted(range(len(profs)), key=lambda i: (-profs[i].size, -profs[i].slices, i))
    chosen: dict[int, int] = {}

    def place(k: int, taken: int) -> bool:
        if k == len(order):
            return True
        i = order[k]
        p = profs[i]
        for start in p.starts:
            mask = ((1 << p.size) - 1) << start
            if taken & mask:
                continue
            chosen[i] = start
            if place(k + 1, taken | mask):
                return True
        return False

    taken0 = 0
    for s in occupied:
        taken0 |= 1 << s
    if not place(0, taken0):
        starts = "; ".join(f"{p.name} at {{{','.join(map(str, p.starts))}}}:{p.size}"
                           for p in sorted(set(profs), key=lambda q: -q.size))
        extra = " with the node's existing instances" if occupied else ""
        raise UsageError(f"MIG layout {text} has no valid placement{extra} on the "
                         f"{model.title} ({starts})", where)
    out = []
    for i, (req, p) in enumerate(zip(requests, profs)):
        ci = req.ci_slices or p.slices
        out.append(Placement(p.name, p.id, p.nvml_profile, chosen[i], p.size, ci,
                             CIP_BY_SLICES[ci], CI_PLACEMENTS[p.slices][ci][0],
                             p.memory_mb, p.ci_sm_count(ci)))
    return out


def plan(text: str, model: GpuModel, ngpus: int = 1, *,
         occupied: list[frozenset[int]] | None = None) -> list[list[Placement]]:
    """Plan *text* for *ngpus* GPUs of *model*: one placement list per GPU."""
    gpus = parse_layout(text)
    if len(gpus) == 1:
        gpus = gpus * ngpus
    elif len(gpus) != ngpus:
        raise UsageError(f"MIG layout names {len(gpus)} GPU layouts but the job has "
                         f"{ngpus} GPU(s) here", "--gpu-mig")
    occ = occupied or [frozenset()] * ngpus
    return [plan_gpu(reqs, model, occupied=occ[i]) for i, reqs in enumerate(gpus)]
