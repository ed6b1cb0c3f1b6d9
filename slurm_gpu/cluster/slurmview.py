"""What Slurm believes about its nodes: ``scontrol show node --oneliner``, parsed.

``--oneliner`` rather than ``--json``: Slurm 22.05's scontrol has no
``--json`` for nodes, and the JSON field names changed between data_parser
versions (v0.0.38 .. v0.0.44), while the one-line ``Key=Value`` form has
carried ``CPUTot Sockets CoresPerSocket ThreadsPerCore RealMemory Gres
State`` unchanged from 22.05 to 26.05.  Values of those keys contain no
spaces; the free-text fields that may (``Reason``, ``Comment``, ``OS``,
``Extra``) come after them on the line, and only the *first* ``Key=`` of
each name is taken, so admin-written text cannot shadow a real field.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from .. import runner
from ..errors import CommandError

_TOKEN = re.compile(r"(?:^|(?<=\s))([A-Za-z]+)=(\S*)")
_REASON = re.compile(r"(?:^|\s)Reason=(.*?)(?:\s\[[^\]\s]*@[^\]\s]*\]|\s(?:Comment|Extra)=|$)")
# Base states and flags that mean "no job step will start here now" (sinfo/scontrol spellings).
_UNUSABLE_BASE = {"DOWN", "FUTURE", "UNKNOWN", "DRAINED", "DRAINING", "FAIL", "FAILING", "POWERED_DOWN"}
_UNUSABLE_FLAGS = {"DRAIN", "NOT_RESPONDING", "POWERED_DOWN", "POWER_DOWN", "POWERING_DOWN", "POWERING_UP",
                   "FAIL", "REBOOT_ISSUED", "REBOOT_REQUESTED", "MAINTENANCE"}
_STATE_SUFFIX = {"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP", "%": "POWERING_DOWN",
                 "!": "POWER_DOWN", "$": "MAINTENANCE", "@": "REBOOT_REQUESTED", "^": "REBOOT_ISSUED",
                 "-": "PLANNED"}


@dataclass(frozen=True)
class SlurmNode:
    """One node as slurmctld sees it (``None`` where the line lacks a field)."""

    name: str
    cpus: int | None
    sockets: int | None
    cores_per_socket: int | None
    threads_per_core: int | None
    real_memory: int | None            # MiB
    gres: str                          # "" for none
    base: str                          # IDLE, MIXED, DOWN, ...
    flags: frozenset[str]
    reason: str | None = None
    partitions: tuple[str, ...] = ()

    @property
    def state(self) -> str:
        return "+".join([self.base, *sorted(self.flags)])

    @property
    def unusable(self) -> str | None:
        """Why no collection step can run here (``"drained"``, ``"down"``...), None when it can."""
        if "DRAIN" in self.flags or self.base in ("DRAINED", "DRAINING"):
            return "drained"
        if self.base == "DOWN":
            return "down"
        bad = sorted(self.flags & _UNUSABLE_FLAGS) or ([self.base] if self.base in _UNUSABLE_BASE else [])
        return bad[0].lower().replace("_", " ") if bad else None


def _fields(line: str) -> dict[str, str]:
    """``Key=Value`` tokens of one line, the first of each name winning (see the module docstring)."""
    out: dict[str, str] = {}
    for k, v in _TOKEN.findall(line):
        out.setdefault(k, v)
    return out


def _int(f: dict[str, str], key: str) -> int | None:
    try:
        return int(f[key])
    except (KeyError, ValueError):
        return None


def parse_node_line(line: str) -> SlurmNode | None:
    """One ``scontrol show node -o`` line (None for a line that is not a node)."""
    if not line.startswith("NodeName="):
        return None
    f = _fields(line)
    name = f.get("NodeName")
    if not name:
        return None
    raw = f.get("State") or "UNKNOWN"
    extra = {_STATE_SUFFIX[c] for c in raw if c in _STATE_SUFFIX}
    parts = raw.rstrip("".join(_STATE_SUFFIX)).split("+")
    gres = f.get("Gres", "")
    r = _REASON.search(line) if "Reason=" in line else None
    return SlurmNode(
        name=name, cpus=_int(f, "CPUTot"), sockets=_int(f, "Sockets"),
        cores_per_socket=_int(f, "CoresPerSocket"), threads_per_core=_int(f, "ThreadsPerCore"),
        real_memory=_int(f, "RealMemory"), gres="" if gres in ("(null)", "N/A") else gres,
        base=parts[0].upper(), flags=frozenset(x.upper() for x in parts[1:] if x) | extra,
        reason=(r.group(1).strip() or None) if r else None,
        partitions=tuple(x for x in f.get("Partitions", "").split(",") if x))


def parse_show_nodes(text: str) -> dict[str, SlurmNode]:
    """Every node of ``scontrol show node --oneliner`` output, by name."""
    out: dict[str, SlurmNode] = {}
    for line in text.splitlines():
        n = parse_node_line(line)
        if n is not None:
            out[n.name] = n
    return out


def gpu_counts(gres: str) -> dict[str, int]:
    """``gpu:h100:8(S:0-1),gpu:a100:2,mps:400`` -> ``{"h100": 8, "a100": 2}`` (``""`` for untyped)."""
    out: dict[str, int] = {}
    for item in re.split(r",(?![^()]*\))", gres):
        item = item.split("(", 1)[0].strip()
        parts = item.split(":")
        if not parts or parts[0] != "gpu":
            continue
        if len(parts) == 2:
            typ, count = "", parts[1]
        elif len(parts) >= 3:
            typ, count = parts[1], parts[-1]
        else:
            typ, count = "", "1"
        try:
            n = int(count)
        except ValueError:
            n = 1
        out[typ] = out.get(typ, 0) + n
    return out


def scontrol() -> str:
    from ..slurmclient import command
    return command("scontrol")


def show_nodes(names: Iterable[str] | None = None, timeout: float = 60.0) -> dict[str, SlurmNode]:
    """Ask slurmctld (one RPC for all nodes, or for the hostlist *names*)."""
    argv = [scontrol(), "show", "node", "--oneliner"]
    if names is not None:
        from ..confgen.hostlist import fold
        argv.append(fold(names))
    res = runner.run(argv, timeout, check=False)
    if res.returncode != 0 and not res.stdout.strip():
        first = (res.stderr.strip() or f"exit status {res.returncode}").splitlines()[0]
        raise CommandError(f"scontrol show node failed: {first}", "scontrol show node")
    return parse_show_nodes(res.stdout)
