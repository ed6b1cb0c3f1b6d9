"""The ``[spank]`` section of the node config file."""
from __future__ import annotations

import resource
from dataclasses import dataclass, field
from typing import Any

from .. import config
from ..errors import InputError

MAX_NUMA_NODES = 1 << 16     # Linux MAX_NUMNODES is at most 1024
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclass
class SpankSettings:
    """Admin settings for the SPANK plugin (all optional).

    memlock_max: RLIMIT_MEMLOCK given to tasks of ``--gpu-profile`` jobs
        ("unlimited", a size like "64G", or "" to leave Slurm's value).
    allocator_preload: a malloc library (jemalloc/tcmalloc) put in LD_PRELOAD
        for ``--gpu-profile`` tasks; ignored unless the file exists.
    allocator_env: environment for that allocator (e.g. MALLOC_CONF).
    numa_node_map: SANDBOX ONLY.  Maps a model NUMA node OS index (as a
        string key) to a host NUMA node for set_mempolicy, so a modelled
        2-NUMA machine can be bound for real on a 1-NUMA host.  Real nodes
        leave it empty.
    """

    memlock_max: str = "unlimited"
    allocator_preload: str = ""
    allocator_env: dict[str, Any] = field(default_factory=dict)
    numa_node_map: dict[str, Any] = field(default_factory=dict)

    def memlock_bytes(self) -> int | None:
        """The RLIMIT_MEMLOCK value, or None to leave the limit alone."""
        return parse_size(self.memlock_max, "[spank] memlock_max")

    def numa_map(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for k, v in self.numa_node_map.items():
            if (not (str(k).isascii() and str(k).isdigit() and len(str(k)) <= 5) or not isinstance(v, int)
                    or isinstance(v, bool) or not 0 <= v < MAX_NUMA_NODES):
                raise InputError(f"[spank] numa_node_map entry {k} = {v!r}: expected "
                                 "\"<model node>\" = <host node>")
            out[int(k)] = v
        return out


def parse_size(text: str, where: str) -> int | None:
    """"" -> None, "unlimited" -> RLIM_INFINITY, "64G" -> bytes."""
    t = text.strip().lower()
    if not t:
        return None
    if t in ("unlimited", "infinity"):
        return resource.RLIM_INFINITY
    num, unit = t.rstrip("kmgtb"), t[len(t.rstrip("kmgtb")):].rstrip("b")
    # isascii: '²'.isdigit() is true but int() refuses it; 19 digits fit RLIM_INFINITY's 64 bits
    if not (num.isascii() and num.isdigit() and len(num) <= 19) or unit not in _UNITS \
            or int(num) * _UNITS[unit] >= 1 << 63:
        raise InputError(f"bad size {text!r}: expected unlimited or a number with K/M/G/T",
                         where)
    return int(num) * _UNITS[unit]


def load(raw: dict[str, Any] | None = None) -> SpankSettings:
    """Read ``[spank]`` from the config in effect."""
    s = config.section(SpankSettings, "spank", raw)
    s.memlock_bytes()
    s.numa_map()
    for k, v in s.allocator_env.items():
        if not isinstance(v, str):
            raise InputError(f"[spank] allocator_env.{k} must be a string")
    return s
