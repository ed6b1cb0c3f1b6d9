"""Parse a gres.conf and compare its meaning with another one.

Meaning, not text: ``File=/dev/nvidia[0-1]`` equals two ``File=`` lines,
``Cores=0-3`` equals ``Cores=0,1,2,3``, node ranges are expanded, key case
and comments do not matter.  Per node, each GPU is identified by its device
file(s) and compared on Type, Cores and Links; mps/shard counts per file.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ..errors import InputError
from . import hostlist
from .slurmconf import change_line, records

ALL_NODES = "*"
_SUFFIX = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
_KNOWN = {"nodename", "name", "type", "file", "multiplefiles", "cores", "cpus", "links", "count",
          "flags", "autodetect"}


@dataclass(frozen=True)
class Device:
    name: str
    type: str | None
    cores: tuple[int, ...]
    links: tuple[int, ...] | None


@dataclass
class NodeGres:
    autodetect: str | None = None
    devices: dict[tuple[str, str], Device] = field(default_factory=dict)  # (name, files) -> device
    counts: dict[tuple[str, str], int] = field(default_factory=dict)      # (name, type or files) -> count


def _count(text: str, where: str) -> int:
    t = text.strip().lower()
    mult = 1
    if t and t[-1] in _SUFFIX:
        mult, t = _SUFFIX[t[-1]], t[:-1]
    try:
        return int(t) * mult
    except ValueError:
        raise InputError(f"bad Count={text!r}", where) from None


def parse_gres_conf(lines: Iterable[str], source: str = "gres.conf") -> dict[str, NodeGres]:
    """Node name (or ``*`` for lines without NodeName) -> its GRES."""
    nodes: dict[str, NodeGres] = defaultdict(NodeGres)
    first_seen: dict[tuple[str, str, str], str] = {}   # (node, name, files) -> where
    for rec in records(lines, source):
        where = f"{source}:{rec.line}"
        for k, _ in rec.fields:
            if k not in _KNOWN:
                raise InputError(f"unknown gres.conf key {k!r}", where)
        names = hostlist.expand(rec.get("nodename"), where) if rec.get("nodename") else [ALL_NODES]
        auto = rec.get("autodetect")
        if auto is not None:
            for n in names:
                nodes[n].autodetect = auto.lower()
        name = rec.get("name")
        if name is None:
            if auto is None:
                raise InputError("gres.conf line without Name=", where)
            continue
        name = name.lower()
        gtype = rec.get("type")
        files_text = rec.get("file")
        multi = rec.get("multiplefiles")
        if files_text is not None and multi is not None:
            raise InputError("File and MultipleFiles are mutually exclusive", where)
        cores_text = rec.get("cores") or rec.get("cpus")
        cores = hostlist.parse_int_ranges(cores_text, where) if cores_text else ()
        links_text = rec.get("links")
        links: tuple[int, ...] | None = None
        if links_text:
            try:
                links = tuple(int(x) for x in links_text.split(","))
            except ValueError:
                raise InputError(f"bad Links={links_text!r}", where) from None
        count = _count(rec.get("count") or "", where) if rec.get("count") else None
        if multi is not None:
            keys = [",".join(sorted(hostlist.expand_files(multi, where)))]
        elif files_text is not None:
            keys = list(hostlist.expand_files(files_text, where))
        else:
            keys = []
        if links is not None and len(keys) > 1:
            raise InputError("Links= needs a line with a single device file", where)
        for n in names:
            ng = nodes[n]
            if name in ("gpu", "nic") or (keys and count is None):
                for k in keys:
                    # Slurm would count the device twice; a later line must not silently win.
                    seen = first_seen.setdefault((n, name, k), where)
                    if seen != where:
                        raise InputError(f"{name} device {k} of node {n} defined twice (first at {seen})",
                                         where)
                    ng.devices[(name, k)] = Device(name, gtype, cores, links)
                if not keys:
                    ng.counts[(name, gtype or "")] = ng.counts.get((name, gtype or ""), 0) + (count or 1)
            else:
                if keys:
                    for k in keys:  # mps/shard: Count per GPU file
                        ng.counts[(name, k)] = count or 0
                else:
                    ng.counts[(name, gtype or "")] = ng.counts.get((name, gtype or ""), 0) + (count or 0)
    return dict(nodes)


def _describe(d: Device) -> str:
    s = f"Type={d.type}" if d.type else "no Type"
    if d.cores:
        s += f" Cores={hostlist.int_ranges(d.cores)}"
    if d.links is not None:
        s += f" Links={','.join(map(str, d.links))}"
    return s


def shared_with_other_nodes(conf: Mapping[str, NodeGres], node: str) -> str | None:
    """Why this parsed gres.conf is not *node*'s alone (None when only *node* is named).

    A file with no ``NodeName=`` line, or naming any other node, is read by
    other nodes too (a cluster-wide file, often on a shared filesystem):
    rewriting it for one node would change theirs.
    """
    named = set(conf) - {ALL_NODES}
    if not named:
        return "gres.conf has no NodeName= lines: it is cluster-wide"
    others = sorted(named - {node}, key=hostlist.natural_key)
    if others:
        return f"gres.conf also configures other nodes ({hostlist.fold(others)})"
    return None


def effective(conf: Mapping[str, NodeGres], node: str) -> NodeGres:
    """A node's GRES with the file's NodeName-less lines applied."""
    mine = conf.get(node)
    glob = conf.get(ALL_NODES)
    if glob is None:
        return mine or NodeGres()
    out = NodeGres(autodetect=glob.autodetect, devices=dict(glob.devices), counts=dict(glob.counts))
    if mine:
        if mine.autodetect is not None:
            out.autodetect = mine.autodetect
        out.devices.update(mine.devices)
        out.counts.update(mine.counts)
    return out


def node_differences(a: NodeGres, b: NodeGres) -> list[str]:
    """``+``/``-``/``~`` lines from one node's GRES *a* (deployed) to *b* (wanted); [] when equal."""
    diffs: list[str] = []
    if (a.autodetect or "off") != (b.autodetect or "off"):
        diffs.append(f"AutoDetect: {a.autodetect or 'unset'} -> {b.autodetect or 'unset'}")
    for key in sorted(set(a.devices) | set(b.devices), key=lambda k: (k[0], hostlist.natural_key(k[1]))):
        line = change_line(f"{key[0]} {key[1]}", a.devices.get(key), b.devices.get(key), _describe)
        if line:
            diffs.append(line)
    for key in sorted(set(a.counts) | set(b.counts)):
        ca, cb = a.counts.get(key), b.counts.get(key)
        if ca != cb:
            diffs.append(f"~ {key[0]} {key[1] or '(any)'}: Count {ca if ca is not None else 'unset'} -> "
                         f"{cb if cb is not None else 'unset'}")
    return diffs


def compare(current: Mapping[str, NodeGres], wanted: Mapping[str, NodeGres]) -> list[str]:
    """Readable differences, nodes with identical differences folded; [] when equal."""
    names = sorted((set(current) | set(wanted)) - {ALL_NODES}, key=hostlist.natural_key)
    if not names:
        names = [ALL_NODES]
    by_diff: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for n in names:
        diffs = node_differences(effective(current, n), effective(wanted, n))
        if diffs:
            by_diff[tuple(diffs)].append(n)
    out: list[str] = []
    for diffs, ns in by_diff.items():
        out.append(f"{hostlist.fold(ns) if ns != [ALL_NODES] else '(all nodes)'}:")
        out.extend(f"  {d}" for d in diffs)
    return out


def restart_advice(current: Mapping[str, NodeGres], wanted: Mapping[str, NodeGres]) -> list[str]:
    """What Slurm needs after replacing *current* by *wanted* (gres.conf(5) rules)."""
    names = sorted((set(current) | set(wanted)) - {ALL_NODES}, key=hostlist.natural_key) or [ALL_NODES]
    restart: list[str] = []
    drain: list[str] = []
    cores = False
    for n in names:
        a, b = effective(current, n), effective(wanted, n)
        if a.devices != b.devices or a.counts != b.counts or (a.autodetect or "off") != (b.autodetect or "off"):
            restart.append(n)
            if set(a.devices) != set(b.devices):
                drain.append(n)
            for k in set(a.devices) & set(b.devices):
                if a.devices[k].cores != b.devices[k].cores:
                    cores = True
    out: list[str] = []
    if not restart:
        return ["slurm-gpu: gres.conf meaning unchanged: nothing to reload"]
    if drain:
        out.append(f"slurm-gpu: GPU devices added or removed on {hostlist.fold(drain)}: drain those nodes "
                   "before restarting slurmd (jobs using changed GRES are aborted)")
    out.append(f"slurm-gpu: GRES changed on {hostlist.fold(restart) if restart != [ALL_NODES] else 'all nodes'}: "
               "restart slurmd there (scontrol reconfigure is not enough for GRES)")
    if cores:
        out.append("slurm-gpu: Cores= changed: restart slurmctld too")
    return out


