"""topology/tree from an InfiniBand fabric: leaf and spine switches with hostlists.

Rules (all visible in real dumps, see tests/data/ibnetdiscover/):

* A host is a ``Ca`` whose node description reads ``<host> <hca>``
  (``a08-p1-dgx-04-c01 mlx5_5``, ``a06-p1-dgx-02-c01 HCA-6``).  Adapters
  still carrying the firmware default (``MT4129 ConnectX7 Mellanox
  Technologies``) or SHARP aggregation nodes name no host and are skipped,
  and counted in the notes.
* A GPU node has several HCAs (8 on a DGX), one per *rail*; in a
  rail-optimised fabric each rail of a scalable unit has its own leaf, and
  those leaves serve the same hosts.  Slurm wants each node under one leaf,
  so leaves that share most of their hosts merge into one Slurm leaf named
  after its first member; a host whose HCAs straddle groups goes to the
  group holding most of them.
* Upper levels come from hop distance to the leaves; a switch lists the
  next-lower switches it is cabled to.  Switches that reach no host are
  dropped (and named in the notes).  Disconnected fabrics stay separate
  trees: Slurm will not span a job across them.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from ..errors import InputError, UsageError
from ..gcpause import gc_paused
from . import hostlist
from .ibnet import IbFabric

DEFAULT_HOST_REGEX = (r"^(?P<host>[A-Za-z0-9][A-Za-z0-9._-]*)\s+"
                      r"(?:mlx\d+_\d+|HCA-\d+|hfi\d+_\d+|qib\d+|irdma\d*\S*|bnxt_re\d+|ib\d+|ibp\S+|rocep\S+)$")
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
# The SHARP aggregation node every Quantum switch carries is a Ca, but no host.
_AGGREGATION = re.compile(r"aggregation node", re.I)


@dataclass(frozen=True)
class Switch:
    """One Slurm switch line."""

    name: str
    level: int                     # 0 = leaf
    nodes: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()
    comment: str = ""


@dataclass(frozen=True)
class Tree:
    switches: tuple[Switch, ...]
    notes: tuple[str, ...]
    fabrics: int


def switch_name(desc: str, fallback: str) -> str:
    """``MF0;A09-P1-IBLEAF-04-04:MQM9701/U1`` -> ``A09-P1-IBLEAF-04-04`` (Slurm-safe)."""
    s = desc.split(";", 1)[1] if ";" in desc else desc
    s = s.split(":", 1)[0]
    s = _SAFE.sub("-", s).strip("-")
    if not s or s.lower().startswith(("mellanox", "mf0")):
        s = _SAFE.sub("-", fallback).strip("-")
    return s[:64]


def host_matcher(regex: str | None = None, *, keep_domain: bool = False,
                 nodes: Iterable[str] | None = None) -> Callable[[str], str | None]:
    """A function from a CA description to a Slurm node name (or None)."""
    try:
        rx = re.compile(regex or DEFAULT_HOST_REGEX)
    except re.error as e:
        raise UsageError(f"bad --host-regex: {e}") from None
    allowed = set(nodes) if nodes is not None else None
    group: str | int = "host" if "host" in rx.groupindex else 1

    def match(desc: str) -> str | None:
        m = rx.match(desc.strip())
        if not m:
            return None
        host = m.group(group)
        if not keep_domain:
            host = host.split(".", 1)[0]
        if allowed is not None and host not in allowed:
            return None
        if allowed is None and host == "localhost":
            return None  # an adapter whose host never set its name
        return host

    return match


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        p = self.parent.setdefault(x, x)
        while p != self.parent[p]:
            self.parent[p] = self.parent[self.parent[p]]
            p = self.parent[p]
        self.parent[x] = p
        return p

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def build_tree(fabrics: Sequence[IbFabric], match: Callable[[str], str | None] | None = None) -> Tree:
    """Slurm switches (leaves first) for one or more fabric dumps."""
    # The maps built here (hundreds of thousands of links at 10,000 nodes)
    # and the fabric they come from hold no cycles: a cyclic GC pass over
    # them only costs time (~0.1 s at 10,000 nodes), so it is paused.
    with gc_paused():
        return _build_tree(fabrics, match)


def _build_tree(fabrics: Sequence[IbFabric], match: Callable[[str], str | None] | None) -> Tree:
    match = match or host_matcher()
    notes: list[str] = []
    sw_names: dict[tuple[int, str], str] = {}
    used: set[str] = set()
    host_leaves: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # host -> leaf key -> HCAs
    sw_links: dict[str, set[str]] = defaultdict(set)
    edge: set[str] = set()         # switches cabled to an adapter (a leaf, whether or not its hosts are kept)
    skipped: list[str] = []
    seen_host_fabric: dict[str, int] = {}
    for fi, fab in enumerate(fabrics):
        for n in fab.nodes.values():
            if n.kind != "Switch":
                continue
            name = switch_name(n.desc, n.id)
            if name in used:
                name = f"{name}-{n.id.split('-')[-1][-6:]}"
            used.add(name)
            sw_names[(fi, n.id)] = name
        nodes = fab.nodes
        # "<dump>:<id>" of every switch, made once (a million ports name them at 100,000 nodes).
        switch_key = {nid: f"{fi}:{nid}" for nid, n in nodes.items() if n.kind == "Switch"}
        for n in nodes.values():
            if n.kind == "Switch":
                me = switch_key[n.id]
                links = sw_links[me]
                is_edge = False
                for _port, peer, _pp in n.ports:
                    key = switch_key.get(peer)
                    if key is not None:
                        links.add(key)
                    elif not is_edge:
                        pn = nodes[peer]
                        if pn.kind == "Ca" and not _AGGREGATION.search(pn.desc):
                            is_edge = True     # one adapter is enough: a leaf has hundreds
                if is_edge:
                    edge.add(me)
                continue
            if n.kind != "Ca":
                continue
            host = match(n.desc)
            if host is None:
                skipped.append(n.desc)
                continue
            first = seen_host_fabric.setdefault(host, fi)
            if first != fi:
                continue  # a node on several fabrics belongs to the first dump given
            mine = host_leaves[host]
            for _port, peer, _pp in n.ports:
                key = switch_key.get(peer)
                if key is not None:
                    mine[key] += 1
    if skipped:
        kinds = sorted(set(skipped))
        notes.append(f"skipped {len(skipped)} adapters whose description names no host "
                     f"({'; '.join(kinds[:3])}{'; ...' if len(kinds) > 3 else ''})")
    # Leaves and their hosts.
    leaf_hosts: dict[str, set[str]] = defaultdict(set)
    for host, leaves in host_leaves.items():
        for leaf in leaves:
            leaf_hosts[leaf].add(host)
    # Merge rail leaves: leaves sharing at least half of the smaller one's hosts.
    uf = _UnionFind()
    for leaf in leaf_hosts:
        uf.find(leaf)
    # Hosts of one scalable unit share one set of rail leaves: count leaf
    # pairs per distinct set, not per host (10,000 hosts x 8 rails).
    signatures: dict[tuple[str, ...], int] = defaultdict(int)
    for leaves in host_leaves.values():
        signatures[tuple(sorted(leaves))] += 1
    pair_shared: dict[tuple[str, str], int] = defaultdict(int)
    for ls, count in signatures.items():
        for i in range(len(ls)):
            for j in range(i + 1, len(ls)):
                pair_shared[(ls[i], ls[j])] += count
    for (a, b), shared in pair_shared.items():
        if 2 * shared >= min(len(leaf_hosts[a]), len(leaf_hosts[b])):
            uf.union(a, b)
    groups: dict[str, list[str]] = defaultdict(list)
    for leaf in leaf_hosts:
        groups[uf.find(leaf)].append(leaf)

    def sname(key: str) -> str:
        fi, nid = key.split(":", 1)
        return sw_names[(int(fi), nid)]

    # Switch names are sorted many times (each spine lists every leaf group): one key each.
    name_keys: dict[str, tuple[object, ...]] = {}

    def name_key(name: str) -> tuple[object, ...]:
        k = name_keys.get(name)
        if k is None:
            k = name_keys[name] = hostlist.natural_key(name)
        return k

    group_name: dict[str, str] = {}
    for root, members in groups.items():
        members.sort(key=lambda k: name_key(sname(k)))
        gname = sname(members[0])
        for m in members:
            group_name[m] = gname
    group_nodes: dict[str, list[str]] = defaultdict(list)
    straddling = 0
    unlinked: list[str] = []
    for host, leaves in host_leaves.items():
        per_group: dict[str, int] = defaultdict(int)
        for leaf, hcas in leaves.items():
            per_group[group_name[leaf]] += hcas
        if not per_group:
            unlinked.append(host)     # adapters with no port, or none cabled to a switch
            continue
        if len(per_group) == 1:
            best = next(iter(per_group))
        else:
            best = sorted(per_group.items(), key=lambda kv: (-kv[1], name_key(kv[0])))[0][0]
            straddling += 1
        group_nodes[best].append(host)
    if unlinked:
        unlinked.sort(key=hostlist.natural_key)
        notes.append(f"left out {len(unlinked)} hosts whose adapters are cabled to no switch: "
                     f"{hostlist.fold(unlinked)}")
    if straddling:
        notes.append(f"{straddling} hosts have HCAs under several leaf groups; each is listed under the "
                     "group holding most of its HCAs")
    # Levels above the leaves: BFS over switch links.  A leaf whose hosts
    # are all left out (--nodes, unnamed adapters) is two hops above the kept
    # leaves, through the spines, exactly like a core switch: it is told
    # apart by the adapters cabled to it, and dropped with the switches that
    # reach no host (else it would be listed as a parent of the spines).
    level: dict[str, int] = {leaf: 0 for leaf in leaf_hosts}
    frontier = list(leaf_hosts)
    while frontier:
        nxt: list[str] = []
        for s in frontier:
            for p in sw_links.get(s, ()):
                if p not in level and not (p in edge and level[s] >= 1):
                    level[p] = level[s] + 1
                    nxt.append(p)
        frontier = nxt
    all_switches = [f"{fi}:{n.id}" for fi, fab in enumerate(fabrics) for n in fab.nodes.values()
                    if n.kind == "Switch"]
    orphans = [sname(k) for k in all_switches if k not in level]
    if orphans:
        orphans.sort(key=name_key)
        notes.append(f"dropped {len(orphans)} switches that reach no (kept) host: "
                     f"{hostlist.fold(orphans)}")
    out: list[Switch] = []
    members_of: dict[str, list[str]] = defaultdict(list)
    for ms in groups.values():
        for m in ms:
            members_of[group_name[m]].append(sname(m))
    for gname, hosts in group_nodes.items():
        members = members_of[gname]
        comment = (f"{gname}: leaves {hostlist.fold(members)} serve the same hosts (rails)"
                   if len(members) > 1 else "")
        out.append(Switch(gname, 0, tuple(sorted(hosts, key=hostlist.natural_key)), (), comment))
    upper: dict[str, set[str]] = defaultdict(set)
    for s, lv in level.items():
        if lv == 0:
            continue
        mine = upper[s]
        for p in sw_links.get(s, ()):
            if level.get(p) == lv - 1:
                g = group_name.get(p) if lv == 1 else None
                mine.add(g if g is not None else sname(p))
    ordered: dict[frozenset[str], tuple[str, ...]] = {}   # every spine of a rail has the same children
    for s, children in upper.items():
        key = frozenset(children)
        kids = ordered.get(key)
        if kids is None:
            # sorted by text first: names with equal natural keys (a01, a1) keep one order, not the set's
            kids = ordered[key] = tuple(sorted(sorted(children), key=name_key))
        out.append(Switch(sname(s), level[s], (), kids))
    out.sort(key=lambda sw: (sw.level, name_key(sw.name)))
    # Connected components of the result = fabrics Slurm sees.
    # A switch joined to each of its children joins them all: chain each
    # distinct child list once (every spine of a rail lists the same
    # leaves) and join the switch to its first child.
    comp = _UnionFind()
    chained: set[tuple[str, ...]] = set()
    for sw in out:
        comp.find(sw.name)
        if sw.switches:
            if sw.switches not in chained:
                chained.add(sw.switches)
                for a, b in zip(sw.switches, sw.switches[1:]):
                    comp.union(a, b)
            comp.union(sw.name, sw.switches[0])
    nfab = len({comp.find(sw.name) for sw in out})
    if nfab > 1:
        notes.append(f"{nfab} fabrics share no switch: Slurm will not place a job across them")
    if not out:
        raise InputError("no host found in the ibnetdiscover dump (check --host-regex / --nodes)",
                         ", ".join(f.source for f in fabrics))
    return Tree(tuple(out), tuple(notes), nfab)
