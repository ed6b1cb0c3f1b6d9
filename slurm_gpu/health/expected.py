"""What gres.conf promises this node: the GPUs the health check expects to find."""
from __future__ import annotations

import os

from ..errors import InputError
from .gpu_checks import ExpectedGpus
from .settings import HealthSettings


def expected_gpus(path: str | None, node: str) -> ExpectedGpus | None:
    """What gres.conf promises *node* (None when there is no gres.conf)."""
    if not path or not os.path.exists(path):
        return None
    from ..confgen import gresconf
    try:
        with open(path) as f:
            conf = gresconf.parse(f, path)
    except OSError as e:
        raise InputError(f"cannot read gres.conf: {e.strerror}", path) from None
    mine = gresconf.node_gres(conf, node)  # NodeName-less lines apply to every node
    import re
    minors: set[int] = set()
    types: list[str] = []
    counted = 0
    for (name, files), dev in mine.devices.items():
        if name != "gpu":
            continue
        m = re.search(r"/nvidia(\d+)$", files)
        if m:
            minors.add(int(m.group(1)))
            types.append(dev.type or "")
        elif "nvidia-cap" not in files:
            counted += 1
    for (name, _t), n in mine.counts.items():
        if name == "gpu":
            counted += n
    total = len(minors) + counted
    if total == 0 and not any(k[0] == "gpu" for k in mine.devices):
        if mine.autodetect and mine.autodetect != "off":
            return None  # AutoDetect=nvml: slurmd counts the GPUs itself, the file promises none
        return ExpectedGpus(0, source=path)
    return ExpectedGpus(total, tuple(sorted(minors)), tuple(types), source=path)


def default_gres_conf(s: HealthSettings) -> str | None:
    if s.gres_conf:
        return s.gres_conf
    from ..nodefacts import gres_conf_path
    return gres_conf_path(os.environ)
