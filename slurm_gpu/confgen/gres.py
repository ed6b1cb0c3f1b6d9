"""gres.conf from the hardware model.

One line per GPU (or per run of GPUs that share type and cores and carry no
``Links=``), MIG devices as ``MultipleFiles=`` lines named like Slurm's own
NVML AutoDetect, optional ``Name=mps``/``Name=shard`` counts, and identical
nodes folded into one hostlist so 10,000 nodes cost a handful of lines.

The work splits in two pure steps: :func:`gres_records` turns one node into
hashable :class:`GresLine` records (everything but the node name), then
:func:`build_gres_view` groups nodes with equal records and formats finished
strings for ``templates/gres.conf.j2``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from .. import __version__
from ..errors import InputError
from ..hw.model import Gpu, Node
from . import confsafe, hostlist, naming
from . import nodeline
from .nodeline import SocketLayout, gres_counts, socket_layout

GENERATOR = "slurm-gpu gres render"


@dataclass(frozen=True)
class GresOptions:
    """Choices that change gres.conf (all have Slurm-compatible defaults)."""

    dev_dir: str = "/dev"
    type_map: Mapping[str, str] = field(default_factory=dict)   # type, bus id or 0x<dev id> -> type
    pci_names: Mapping[int, str] = field(default_factory=dict)  # NVIDIA device id -> pci.ids name
    mps_count: int = 0            # Name=mps Count= per full GPU (0: none)
    shards: int = 0               # Name=shard Count= per full GPU (0: none)
    links: bool = True            # write Links= when a node has NVLink
    socket_mode: str = "auto"     # see nodeline.socket_layout
    autodetect: str = "off"       # global AutoDetect= line ("" for none)

    def __post_init__(self) -> None:
        # Slurm links gres/gpu with a single sharing gres per node (gres.c,
        # gres_init_node_config: one alt_gres_ns), and keeps a GPU from being
        # given as gres/gpu and as that gres at once; the other is not checked.
        # bench/bench_oversub.py saw it: with both, gres/gpu jobs ran on GPUs
        # that gres/mps and gres/shard jobs held.
        if self.mps_count and self.shards:
            from ..errors import UsageError
            raise UsageError("--mps-count and --shards cannot both be set: Slurm keeps gres/gpu apart "
                             "from only one sharing gres per node, so a GPU could be given as gres/gpu "
                             "and as the other at once")


@dataclass(frozen=True)
class GresLine:
    """One gres.conf record without its NodeName."""

    name: str
    type: str | None = None
    files: tuple[str, ...] = ()
    multiple_files: tuple[str, ...] = ()
    cores: tuple[int, ...] = ()
    links: tuple[int, ...] | None = None
    count: int | None = None

    def text(self) -> str:
        """``Name=gpu Type=... File=... Cores=... Links=...`` in Slurm syntax."""
        parts = [f"Name={self.name}"]
        if self.type:
            parts.append(f"Type={self.type}")
        if self.count is not None:
            parts.append(f"Count={self.count}")
        if self.files:
            parts.append(f"File={hostlist.fold_files(self.files)}")
        if self.multiple_files:
            parts.append(f"MultipleFiles={','.join(self.multiple_files)}")
        if self.cores:
            parts.append(f"Cores={hostlist.int_ranges(self.cores)}")
        if self.links is not None:
            parts.append(f"Links={','.join(str(x) for x in self.links)}")
        return " ".join(parts)


def mig_cap_minors(gpu_minor: int, gi_id: int, ci_id: int) -> tuple[int, int]:
    """The nvidia-caps minors of a GI and CI when the model does not carry them."""
    from ..hw.nvml import mig_cap_minor
    return mig_cap_minor(gpu_minor, gi_id), mig_cap_minor(gpu_minor, gi_id, ci_id)


def _links(gpus_by_bus: Sequence[Gpu], me: Gpu) -> tuple[int, ...]:
    return tuple(-1 if g is me else me.nvlink_to(g) for g in gpus_by_bus)


def _mig_active(g: Gpu) -> bool:
    return bool(g.mig_enabled) and bool(g.mig_instances)


def gres_records(node: Node, opts: GresOptions | None = None, *, where: str = "") -> tuple[GresLine, ...]:
    """The gres.conf records of one node, GPUs in PCI bus order.

    Slurm numbers GPUs by PCI bus id, and ``Links=`` positions follow that
    numbering, so lines come out in bus order.  GPUs without NVLink (or with
    ``links=False``) and equal type/cores fold into one ``File=`` range.
    """
    opts = opts or GresOptions()
    dev = opts.dev_dir.rstrip("/") or ""
    if dev:
        confsafe.dev_path(dev, "--dev-dir")
    gpus = sorted(node.gpus, key=lambda g: g.pci_bus_id)
    any_mig = any(_mig_active(g) for g in gpus)
    with_links = opts.links and not any_mig and len(gpus) > 1 and any(
        g.nvlink_to(h) for g in gpus for h in gpus if g is not h)
    out: list[GresLine] = []
    shares: list[GresLine] = []
    for g in gpus:
        if g.minor is None:
            raise InputError(f"GPU {g.pci_bus_id} has no minor number (/dev/nvidiaN unknown)", where or None)
        t = confsafe.gres_type(naming.gpu_type(g, pci_names=opts.pci_names, type_map=opts.type_map, where=where),
                               f"GPU {g.pci_bus_id}: GRES type", where or None)
        cores = tuple(sorted(g.cores))
        gfile = f"{dev}/nvidia{g.minor}"
        if _mig_active(g):
            for m in g.mig_instances:
                gi, ci = m.gi_cap_minor, m.ci_cap_minor
                if gi is None or ci is None:
                    gi, ci = mig_cap_minors(g.minor, m.gi_id, m.ci_id)
                out.append(GresLine(
                    name="gpu", type=confsafe.gres_type(naming.mig_type(t, m), f"GPU {g.pci_bus_id}: MIG GRES type",
                                                        where or None),
                    multiple_files=(gfile, f"{dev}/nvidia-caps/nvidia-cap{gi}",
                                    f"{dev}/nvidia-caps/nvidia-cap{ci}"),
                    cores=cores))
            continue
        line = GresLine(name="gpu", type=t, files=(gfile,), cores=cores,
                        links=_links(gpus, g) if with_links else None)
        prev = out[-1] if out else None
        if (prev is not None and line.links is None and prev.links is None and not prev.multiple_files
                and prev.type == t and prev.cores == cores):
            out[-1] = GresLine(name="gpu", type=t, files=prev.files + (gfile,), cores=cores)
        else:
            out.append(line)
        if opts.mps_count:
            shares.append(GresLine(name="mps", count=opts.mps_count, files=(gfile,)))
        if opts.shards:
            shares.append(GresLine(name="shard", count=opts.shards, files=(gfile,)))
    # mps lines first, then shard lines: Slurm reads them per name.
    out.extend(s for s in shares if s.name == "mps")
    out.extend(s for s in shares if s.name == "shard")
    return tuple(out)


def node_gres_summary(node: Node, opts: GresOptions | None = None, *, where: str = "",
                      records: Sequence[GresLine] | None = None) -> str:
    """slurm.conf ``Gres=`` value matching :func:`gres_records`."""
    recs = records if records is not None else gres_records(node, opts, where=where)
    types: list[str] = []
    mps = shard = 0
    for r in recs:
        if r.name == "gpu":
            n = len(r.files) if r.files else 1
            types.extend([r.type or ""] * n)
        elif r.name == "mps":
            mps += r.count or 0
        elif r.name == "shard":
            shard += r.count or 0
    return gres_counts(types, mps_total=mps, shard_total=shard)


def node_line(name: str, node: Node, *, gres: str | None = None, socket_mode: str = "auto",
              options: GresOptions | None = None, extra: Mapping[str, str] | None = None,
              layout: SocketLayout | None = None) -> str:
    """The slurm.conf line for *node* (:func:`slurm_gpu.confgen.nodeline.node_line`); by
    default ``Gres=`` is computed from the node's GPUs with the naming of
    :func:`gres_records` (*options*)."""
    if gres is None:
        gres = node_gres_summary(node, options if options is not None else GresOptions(), where=name)
    return nodeline.node_line(name, node, gres=gres, socket_mode=socket_mode, extra=extra, layout=layout)


@dataclass(frozen=True)
class GresGroup:
    """Nodes with identical gres.conf records.

    gres.conf says nothing about memory or sockets, so nodes that differ
    only there (real fleets: MemTotal varies by a few MiB between identical
    boxes) share one gres.conf block and get one slurm.conf line per kind.
    """

    nodes: str                     # folded hostlist
    lines: tuple[str, ...]         # finished "Name=gpu ..." strings
    node_lines: tuple[str, ...]    # matching slurm.conf lines (NodeName=<hostlist> ...), one per kind


@dataclass(frozen=True)
class GresView:
    """Everything ``gres.conf.j2`` needs; no logic left for the template."""

    generator: str
    version: str
    inputs: tuple[str, ...]
    autodetect: str
    groups: tuple[GresGroup, ...]
    notes: tuple[str, ...]         # cluster-level notes for the header and stderr
    slurmd_parameters: tuple[str, ...]

    def as_template_vars(self) -> dict[str, object]:
        return {"v": self}


def _gpu_key(g: Gpu) -> tuple[object, ...]:
    # Everything gres_records reads; UUIDs, serials and fabric ids differ per node
    # but never change a line, so identical hardware shares one computation.
    return (g.minor, g.pci_bus_id, g.pci_device_id, g.name, g.cores, g.nvlinks, g.mig_enabled,
            tuple((m.gi_id, m.ci_id, m.profile, m.gi_cap_minor, m.ci_cap_minor) for m in g.mig_instances))


def _fingerprint(node: Node) -> tuple[object, ...]:
    """What decides a node's gres lines and node line, cheap to hash."""
    return (tuple(_gpu_key(g) for g in node.gpus), id(node.packages), id(node.numa_nodes), id(node.cores),
            node.memory_bytes)


def _same_objects(node: Node) -> tuple[object, ...]:
    """A cheaper stand-in for _fingerprint while *node*'s parts are alive: the
    identity of the tuples nodes of one kind share (hw/snapshot_bulk.py's
    templates), so equal keys mean the very same inputs; hashing those
    tuples' contents 10,000 times is most of _fingerprint's cost."""
    return (tuple((g.minor, g.pci_bus_id, g.pci_device_id, g.name, id(g.cores), id(g.nvlinks), g.mig_enabled,
                   id(g.mig_instances)) for g in node.gpus),
            id(node.packages), id(node.numa_nodes), id(node.cores), node.memory_bytes)


def build_gres_view(nodes: Mapping[str, Node], opts: GresOptions | None = None, *,
                    inputs: Sequence[str] = (), where: Mapping[str, str] | None = None) -> GresView:
    """Group identical nodes and format every line (pure).

    *nodes* maps Slurm node names to models; *where* maps node names to the
    file they came from, for error messages.
    """
    opts = opts or GresOptions()
    where = where or {}
    # Identical hardware is common (10,000 nodes, a few shapes): compute each
    # distinct node's records once.
    by_same: dict[tuple[object, ...], list[str]] = {}
    first_same: dict[tuple[object, ...], Node] = {}
    for name, node in nodes.items():
        try:
            same = _same_objects(node)
            lst = by_same.get(same)
        except TypeError:    # an unhashable value where a name or number belongs
            confsafe.check_node(name, node, where.get(name, name))
            raise
        if lst is None:
            # Every value printed below comes from these models: checked
            # once per kind of hardware (confsafe), every name on its own.
            confsafe.check_node(name, node, where.get(name, name))
            by_same[same] = [name]
            first_same[same] = node
        else:
            confsafe.node_name(name, where.get(name, name))
            lst.append(name)
    by_fp: dict[tuple[object, ...], list[str]] = {}
    first: dict[tuple[object, ...], Node] = {}
    for same, names in by_same.items():    # in the order of each group's first node
        fp = _fingerprint(first_same[same])
        if fp in by_fp:
            by_fp[fp].extend(names)
        else:
            by_fp[fp] = names
            first[fp] = first_same[same]
    # Nodes whose records are equal but whose fingerprints differ (e.g. other
    # UUIDs) still share lines; merge on the records themselves, and within
    # one gres.conf block keep apart what changes the slurm.conf line.
    merged: dict[tuple[GresLine, ...], dict[tuple[object, ...], tuple[list[str], Node, SocketLayout]]] = {}
    for fp, names in by_fp.items():
        node = first[fp]
        recs = gres_records(node, opts, where=where.get(names[0], names[0]))
        lay = socket_layout(node, opts.socket_mode)
        kinds = merged.setdefault(recs, {})
        kind = (lay.sockets, lay.cores_per_socket, lay.threads_per_core, lay.cpus, lay.mode, node.memory_bytes)
        if kind in kinds:
            kinds[kind][0].extend(names)
        else:
            kinds[kind] = (list(names), node, lay)
    groups: list[GresGroup] = []
    params: list[str] = []
    notes: list[str] = []
    plain_sockets = False      # some nodes need no SlurmdParameters
    for recs, kinds in merged.items():
        node_lines: list[tuple[str, str]] = []
        for names, node, lay in kinds.values():
            ns = hostlist.fold(names)
            gres = node_gres_summary(node, opts, records=recs)
            node_lines.append((ns, nodeline.node_line(ns, node, gres=gres, layout=lay)))
            if lay.slurmd_parameters is None:
                plain_sockets = True
            elif lay.slurmd_parameters not in params:
                params.append(lay.slurmd_parameters)
            for n in lay.notes:
                notes.append(f"{ns}: {n}")
        node_lines.sort(key=lambda x: hostlist.natural_key(x[0]))
        # Folding 10,000 names costs; the usual single kind reuses its fold.
        folded = node_lines[0][0] if len(kinds) == 1 else hostlist.fold(
            [n for names, _, _ in kinds.values() for n in names])
        groups.append(GresGroup(nodes=folded, lines=tuple(r.text() for r in recs),
                                node_lines=tuple(line for _, line in node_lines)))
    groups.sort(key=lambda g: hostlist.natural_key(g.nodes))
    if len(params) > 1 or (params and plain_sockets):
        notes.append("nodes need different SlurmdParameters: slurm.conf holds one value for all "
                     "slurmd; give each node group its own slurm.conf via configless includes or "
                     "choose --socket-mode explicitly")
    notes += autodetect_notes(opts.autodetect, nodes.values())
    if opts.shards or opts.mps_count:
        # slurmctld before 23.11.5 cleared a GPU's "shared gres in use" bit when any one
        # sharing job on it ended (_job_dealloc; SchedMD commit 30eacbe571, bug 19110).
        # No gres.conf avoids it: measured in tests/integration/test_shared_gres_slurm.py.
        shared = "shard" if opts.shards else "mps"
        notes.append(f"Slurm before 23.11.5 can give a GPU whole (gres/gpu) while a gres/{shared} job still "
                     f"runs on it, once another gres/{shared} job on that GPU ends (SchedMD bug 19110): "
                     "share GPUs on 23.11.5 or later")
    return checked_view(GresView(generator=GENERATOR, version=__version__, inputs=tuple(inputs),
                                 autodetect=opts.autodetect, groups=tuple(groups), notes=tuple(notes),
                                 slurmd_parameters=tuple(params)))


def checked_view(v: GresView) -> GresView:
    """*v* as the template may print it: every record one ``Key=Value`` line of plain values,
    every comment escaped to printable ASCII (:mod:`.confsafe`, the last gate before the template)."""
    from dataclasses import replace
    if v.autodetect not in ("", "off", "nvml", "nvidia", "full"):
        raise confsafe.UnsafeValue(f"AutoDetect {confsafe.shown(v.autodetect)} is not a Slurm choice")
    for p in v.slurmd_parameters:
        confsafe.record(f"SlurmdParameters={p}")
    for g in v.groups:
        confsafe.hostlist(g.nodes)
        for line in g.lines:
            confsafe.record(f"NodeName={g.nodes} {line}")
        for nl in g.node_lines:
            confsafe.record(nl)
    return replace(v, inputs=tuple(confsafe.comment(i) for i in v.inputs),
                   notes=tuple(confsafe.comment(n) for n in v.notes))


def autodetect_notes(autodetect: str, nodes: Iterable[Node]) -> list[str]:
    """What an AutoDetect= line cannot do on these nodes, per Slurm version (gres.conf(5))."""
    out = []
    if autodetect == "nvml":
        out.append("AutoDetect=nvml needs a Slurm built with gpu_nvml.so; Debian's, OpenHPC's and "
                   "Slinky's are not, and their slurmd then ignores it: keep the explicit lines")
    elif autodetect == "nvidia":
        ns = list(nodes)
        if any(g.mig_instances for n in ns for g in n.gpus):
            out.append("AutoDetect=nvidia (Slurm >= 24.11) does not detect MIG instances: "
                       "the MultipleFiles= lines below stay explicit")
        if any(g.nvlinks for n in ns for g in n.gpus):
            out.append("AutoDetect=nvidia (Slurm >= 24.11) does not detect NVLinks: the Links= "
                       "values below are what binds GPU pairs")
    elif autodetect == "full":
        out.append("AutoDetect=full needs Slurm >= 26.05 (tries NVML, then the NVIDIA, RSMI, "
                   "oneAPI and NRT plugins, until one finds GPUs)")
    return out


def render_gres_conf(nodes: Mapping[str, Node], *, dev_dir: str = "/dev",
                     options: GresOptions | None = None, inputs: Sequence[str] | None = None,
                     where: Mapping[str, str] | None = None) -> str:
    """gres.conf text for *nodes* (keyed by Slurm node name).

    Identical nodes fold into hostlist ranges.  *dev_dir* replaces ``/dev``
    in every ``File=`` (the sandbox's fake devices); *options* carries the
    rest (type map, pci.ids names, mps/shard counts); when both are given,
    *dev_dir* wins unless it is the default.
    """
    from dataclasses import replace

    from .templating import render

    opts = options or GresOptions()
    if dev_dir != "/dev" or options is None:
        opts = replace(opts, dev_dir=dev_dir)
    if inputs is None:
        seen: dict[str, None] = {}
        for n in nodes.values():
            seen.update(dict.fromkeys(n.sources))
            if len(seen) > 20:
                break
        inputs = list(seen)[:20]
    view = build_gres_view(nodes, opts, inputs=inputs, where=where)
    return render("gres.conf.j2", view.as_template_vars())
