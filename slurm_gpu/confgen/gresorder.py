"""Slurm's GPU index on a node: which device ``SLURM_JOB_GPUS=2`` means.

``SLURM_JOB_GPUS``/``SLURM_STEP_GPUS`` (and ``CUDA_VISIBLE_DEVICES`` in the
prolog) hold, since Slurm 21.08, each GPU's position in slurmd's list of
gres/gpu devices, not the minor of ``/dev/nvidiaN`` and not NVML's index
(``common_gres_set_env`` takes ``gres_device->index``; SchedMD/slurm commit
0ebfd37834, bug 10933; the same in 22.05, 24.11 and 26.05).  That list is
built from gres.conf (``gres_node_config_load``):

* without AutoDetect, the ``File=`` devices in the order gres.conf lists
  them (a ``File=/dev/nvidia[0-3]`` range expanded in order);
* with AutoDetect (nvml, nvidia, full), slurmd merges them with the GPUs it
  detects and sorts the result by ``File`` (natural order), then by the
  position of ``-1`` in ``Links`` (``_sort_gpu_by_links_order``); detected
  GPUs always carry links in NVML enumeration order, so a line without
  ``Links=`` takes its GPU's NVML index.

So the same number names different GPUs on different nodes; this module
turns it into a device minor, from which :mod:`slurm_gpu.hw.gpuid` opens
the GPU.  Pure: the caller reads gres.conf and the node model.
"""
from __future__ import annotations

import os
import re
from typing import Any, Sequence

from ..errors import InputError
from .hostlist import natural_key

_MINOR = re.compile(r"/nvidia(\d+)$")


def _minor_of(files: str) -> int | None:
    """The GPU minor of a device key (``/dev/nvidia3`` or a MultipleFiles set)."""
    for f in files.split(","):
        m = _MINOR.search(f)
        if m:
            return int(m.group(1))
    return None


def _is_mig_slice(files: str) -> bool:
    """A MIG instance's gres/gpu line: its GPU plus ``/dev/nvidia-caps`` capabilities."""
    return "/nvidia-caps/" in files


def slurm_minors(conf: Any, nvml_minors: Sequence[int]) -> list[int | None]:
    """Device minors in Slurm's GPU index order; None where that index is a
    MIG slice (a ``MultipleFiles=`` line with ``/dev/nvidia-caps``).

    Each gres/gpu line is one Slurm index, a MIG slice too, so a slice keeps
    its place: a whole GPU listed after another GPU's slices has the index
    Slurm gives it (the slices once collapsed into their GPU's minor and
    shifted every later GPU onto its neighbour's index).  A slice is no
    whole GPU: the prolog refuses whole-GPU options on it as the job's.

    *conf* is this node's :class:`~slurm_gpu.confgen.grescheck.NodeGres`
    (None: no gres.conf); *nvml_minors* are the node's GPU minors in NVML
    index order (what AutoDetect sees).
    """
    nvml_pos = {m: i for i, m in enumerate(nvml_minors)}
    if conf is None:
        return list(nvml_minors)
    auto = (conf.autodetect or "off") != "off"
    listed: list[tuple[int, str, Any, bool]] = []
    for (name, files), dev in conf.devices.items():
        if name != "gpu":
            continue
        m = _minor_of(files)
        if m is None:
            continue
        if _is_mig_slice(files):
            listed.append((m, files, dev, True))
        elif all(m != x or sl for x, _, _, sl in listed):
            listed.append((m, files, dev, False))
    if not auto:
        return [None if sl else m for m, _, _, sl in listed]
    if not listed:
        return list(nvml_minors)          # AutoDetect alone: every GPU, NVML's order

    def links_pos(item: tuple[int, str, Any, bool]) -> tuple[int, int]:
        m, _files, dev, _slice = item
        if dev.links is not None and -1 in dev.links:
            return (0, dev.links.index(-1))
        if m in nvml_pos:
            return (0, nvml_pos[m])
        return (1, 0)                     # no links at all: Slurm sorts these last
    by_file = sorted(listed, key=lambda it: natural_key(it[1]))
    return [None if sl else m for m, _, _, sl in sorted(by_file, key=links_pos)]


def node_minors(gpus: Sequence[Any], conf: Any) -> list[int | None]:
    """:func:`slurm_minors` for a node model's GPUs (``index``, ``minor`` attributes)."""
    nvml_order = [int(g.minor if g.minor is not None else g.index)
                  for g in sorted(gpus, key=lambda g: g.index)]
    return slurm_minors(conf, nvml_order)


def read_conf(path: str | None, node: str) -> Any:
    """This node's gres.conf entries, or None when there is no file."""
    if not path or not os.path.exists(path):
        return None
    from .grescheck import effective, parse_gres_conf
    try:
        with open(path) as f:
            conf = parse_gres_conf(f, path)
    except OSError as e:
        raise InputError(f"cannot read gres.conf: {e.strerror}", path) from None
    return effective(conf, node)
