"""Did topology help?  Finished multi-node jobs against the deployed topology.

Pure functions over plain data (``report placement`` reads sacct, sinfo and
the topology file and hands them here):

* the topology's *domains*: a ``topology/block`` file's base blocks, or a
  ``topology/tree`` file's leaf switches (a switch with ``Nodes=``);
* per job: how many domains its nodes spanned, against the fewest that could
  hold that many nodes (largest domains first);
* for the cluster: the share of jobs placed at that minimum, and the mean
  excess (domains spanned beyond it);
* per domain now: its free and healthy nodes, and (block) the largest
  ``--segment`` it can still serve, since Slurm places a segment inside one
  base block.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from ..confgen import hostlist
from ..confgen.topocheck import TopoMeaning


@dataclass(frozen=True)
class Domain:
    """A leaf switch or a base block: the nodes one hop (or one block) holds together."""

    name: str
    nodes: frozenset[str]


@dataclass(frozen=True)
class JobPlacement:
    job: str
    nodes: int
    spanned: int                   # domains the job's nodes touched
    minimum: int | None            # the fewest that hold that many nodes (None: the topology cannot)
    outside: int = 0               # the job's nodes in no domain

    @property
    def at_minimum(self) -> bool:
        return self.minimum is not None and not self.outside and self.spanned <= self.minimum

    @property
    def excess(self) -> int | None:
        return None if self.minimum is None else self.spanned + self.outside - self.minimum


@dataclass
class Summary:
    kind: str                      # "block" or "tree"
    jobs: list[JobPlacement] = field(default_factory=list)

    @property
    def at_minimum_share(self) -> float | None:
        return sum(j.at_minimum for j in self.jobs) / len(self.jobs) if self.jobs else None

    @property
    def mean_excess(self) -> float | None:
        xs = [j.excess for j in self.jobs if j.excess is not None]
        return sum(xs) / len(xs) if xs else None


def domains(meaning: TopoMeaning) -> tuple[str, list[Domain]]:
    """``("block", base blocks)`` when the file has blocks, else ``("tree", leaf switches)``."""
    if meaning.blocks:
        return "block", [Domain(f"block #{i + 1}", b) for i, b in enumerate(meaning.blocks) if b]
    leaves = [Domain(name, nodes) for name, (nodes, _) in meaning.switches.items() if nodes]
    return "tree", sorted(leaves, key=lambda d: hostlist.natural_key(d.name))


def min_domains(n: int, sizes: Iterable[int]) -> int | None:
    """The fewest domains whose nodes add up to *n* (largest first), or None when all cannot."""
    total, k = 0, 0
    for s in sorted(sizes, reverse=True):
        if total >= n:
            break
        total += s
        k += 1
    return k if total >= n else None


def place(job: str, nodes: Sequence[str], doms: Sequence[Domain]) -> JobPlacement:
    where = {n: d.name for d in doms for n in d.nodes}
    touched = {where[n] for n in nodes if n in where}
    outside = sum(1 for n in nodes if n not in where)
    return JobPlacement(job, len(nodes), len(touched), min_domains(len(nodes), (len(d.nodes) for d in doms)),
                        outside)


def summarize(kind: str, doms: Sequence[Domain], jobs: Iterable[tuple[str, Sequence[str]]]) -> Summary:
    """Every multi-node job of *jobs* (job id, its node names) against *doms*."""
    out = Summary(kind)
    for job, nodes in jobs:
        if len(nodes) > 1:
            out.jobs.append(place(job, nodes, doms))
    return out


def free_now(doms: Sequence[Domain], states: Mapping[str, str], kind: str) -> list[dict[str, object]]:
    """Per domain: its nodes, the free and healthy ones now (sinfo's ``idle``),
    and for blocks the largest ``--segment`` it can still serve."""
    out: list[dict[str, object]] = []
    for d in doms:
        free = sorted((n for n in d.nodes if states.get(n) == "idle"), key=hostlist.natural_key)
        row: dict[str, object] = {"domain": d.name, "nodes": len(d.nodes), "free": len(free),
                                  "free_nodes": hostlist.fold(free) if free else ""}
        if kind == "block":
            row["largest_segment"] = len(free)
        out.append(row)
    return out


def view(s: Summary, now: list[dict[str, object]] | None = None) -> dict[str, object]:
    """The JSON contract of ``report placement --json``."""
    share, excess = s.at_minimum_share, s.mean_excess
    return {
        "topology": s.kind,
        "jobs": [{"job": j.job, "nodes": j.nodes, "spanned": j.spanned, "minimum": j.minimum,
                  "outside": j.outside, "at_minimum": j.at_minimum} for j in s.jobs],
        "cluster": {"jobs": len(s.jobs),
                    "at_minimum_share": None if share is None else round(share, 4),
                    "mean_excess": None if excess is None else round(excess, 4)},
        "now": now or [],
    }


def format_view(v: Mapping[str, object]) -> str:
    """The text of ``report placement``."""
    kind = v["topology"]
    unit = "leaf switches" if kind == "tree" else "blocks"
    c = v["cluster"]
    assert isinstance(c, dict)
    lines = [f"multi-node jobs: {c['jobs']}, topology/{kind}"]
    if c["jobs"]:
        lines.append(f"placed on the fewest {unit} possible: {100 * c['at_minimum_share']:.1f}% of jobs; "
                     f"mean excess {c['mean_excess']:.2f} {unit} a job")
        lines.append(f"{'job':>12}  {'nodes':>5}  {unit:>14}  {'minimum':>7}  outside")
        jobs = v["jobs"]
        assert isinstance(jobs, list)
        for j in jobs:
            m = "-" if j["minimum"] is None else str(j["minimum"])
            lines.append(f"{j['job']:>12}  {j['nodes']:>5}  {j['spanned']:>14}  {m:>7}  {j['outside']}")
    now = v["now"]
    assert isinstance(now, list)
    if now:
        lines.append(f"now, per {'block' if kind == 'block' else 'leaf switch'}: free and healthy nodes"
                     + (", largest --segment" if kind == "block" else ""))
        for r in now:
            seg = f"  segment<={r['largest_segment']}" if "largest_segment" in r else ""
            lines.append(f"  {r['domain']}: {r['free']}/{r['nodes']} free {r['free_nodes']}{seg}")
    return "\n".join(lines) + "\n"
