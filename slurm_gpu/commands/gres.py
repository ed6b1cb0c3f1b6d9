"""``slurm-gpu gres render|check|apply``: gres.conf from the hardware model.

Thin front end: load node models (live, snapshots, hwloc XMLs), call the pure
generator in :mod:`slurm_gpu.confgen`, print or write atomically.  The node
loading helpers here are shared with ``slurm-gpu topology``.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import click

from ..errors import InputError, UsageError

# A snapshot (schema slurm-gpu.snapshot/1, docs/snapshots.md) carries its
# derived model as the last top-level key "node", after the raw NVML answers
# and hwloc XML that make up most of the file.  A cluster-wide render reads
# only the head (schema) and the tail (the model), so 10,000 nodes cost
# megabytes, not gigabytes; when the schema or the model does not fit this
# code, it falls back to replaying the raw answers.
_HEAD = 512
_TAIL = 32 * 1024
_SCHEMA_RE = re.compile(rb'"schema"\s*:\s*"([^"]*)"')
_NODE_KEY = b'"node":'
_CPU_START = '"packages": '
_CPU_END = '"gpus": '
_NO_CPU = '"packages": [], "numa_nodes": [], "cores": [], '


class SnapshotLoader:
    """Loads many snapshots, sharing the CPU part of nodes with identical hardware.

    On a 10,000-node cluster the packages/NUMA/cores of a node model are the
    bulk of its JSON and identical across nodes of one kind; only GPUs
    (UUIDs, fabric) differ.  The CPU part is decoded once per distinct text
    and reused (the model is frozen, so sharing is safe).
    """

    def __init__(self) -> None:
        self._cpu: dict[str, tuple[Any, Any, Any]] = {}

    def node_from_text(self, text: str) -> Any:
        from ..hw.model import Node

        a = text.find(_CPU_START)
        b = text.find(_CPU_END, a)
        if a < 0 or b < 0:
            return Node.from_dict(json.loads(text))
        cpu = self._cpu.get(text[a:b])
        if cpu is None:
            node = Node.from_dict(json.loads(text))
            self._cpu[text[a:b]] = (node.packages, node.numa_nodes, node.cores)
            return node
        node = Node.from_dict(json.loads(text[:a] + _NO_CPU + text[b:]))
        return dataclasses.replace(node, packages=cpu[0], numa_nodes=cpu[1], cores=cpu[2])

    def fast_node(self, path: str) -> Any:
        """The derived model read from the file's tail, or None when that is not possible."""
        from ..hw import snapshot as snap

        with open(path, "rb") as f:
            head = f.read(_HEAD)
            m = _SCHEMA_RE.search(head)
            if m is None or m.group(1).decode() != snap.SCHEMA:
                return None
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - _TAIL))
            tail = f.read()
            at = tail.rfind(_NODE_KEY)
            if at < 0 and size > _TAIL:  # a large node model (hundreds of cores): read it all
                f.seek(0)
                tail = f.read()
                at = tail.rfind(_NODE_KEY)
        if at < 0:
            return None
        text = tail[at + len(_NODE_KEY):].decode("utf-8", "strict").strip()
        # "node" must be the last top-level key: the text is one object and the closing brace.
        if not text.endswith("}") or not text.startswith("{"):
            return None
        body = text[:-1].rstrip()
        try:
            node = self.node_from_text(body)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            return None
        return dataclasses.replace(node, sources=(f"snapshot:{path}",))


def _fast_node(path: str, loader: SnapshotLoader | None = None) -> Any:
    return (loader or SnapshotLoader()).fast_node(path)


def load_snapshot_node(path: str, loader: SnapshotLoader | None = None) -> Any:
    """A node from a snapshot file: the derived model when usable, else replay of the raw answers."""
    from ..hw import snapshot as snap

    try:
        node = _fast_node(path, loader)
    except FileNotFoundError:
        raise InputError("snapshot not found", path) from None
    except IsADirectoryError:
        raise InputError("snapshot is a directory", path) from None
    except OSError as e:
        raise InputError(f"cannot read snapshot: {e.strerror}", path) from None
    except UnicodeDecodeError:
        node = None
    if node is not None:
        return node
    data = snap.read_snapshot(path)  # InputError naming file and place for bad files
    try:
        return snap.load_node(path)
    except InputError:
        # The derived model does not load with this code (schema drift): rebuild it from the raw data.
        return snap.replay(data, path)


def _short_hostname() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".", 1)[0]


def _split_named(value: str) -> tuple[str | None, str]:
    name, eq, path = value.partition("=")
    if eq and name and "/" not in name:
        return name, path
    return None, value


def load_nodes(snapshots: Sequence[str], hwloc_xmls: Sequence[str], node: str | None,
               ) -> tuple[dict[str, Any], dict[str, str]]:
    """Slurm node name -> Node, and node name -> source file, from the CLI inputs."""
    from ..hw import load_node

    nodes: dict[str, Any] = {}
    where: dict[str, str] = {}
    loader = SnapshotLoader()

    def add(name: str, src: str, loader: Callable[[], Any]) -> None:
        if name in nodes:
            raise UsageError(f"node {name} given twice", src)
        nodes[name] = loader()
        where[name] = src

    single = len(snapshots) + len(hwloc_xmls) == 1
    # Thousands of node models are millions of small objects that all stay
    # alive: cyclic GC passes over them only cost time (seconds at 10,000
    # nodes), so collection is paused while loading and the result frozen.
    gc_was = gc.isenabled()
    gc.disable()
    try:
        _load_inputs(snapshots, hwloc_xmls, node, single, add, loader)
    finally:
        if gc_was:
            gc.enable()
    if len(nodes) > 100:
        gc.freeze()
    if not nodes:
        name = node or _short_hostname()
        add(name, "live", load_node)
    return nodes, where


def _load_inputs(snapshots: Sequence[str], hwloc_xmls: Sequence[str], node: str | None, single: bool,
                 add: Callable[[str, str, Callable[[], Any]], None], loader: SnapshotLoader) -> None:
    from ..hw import load_node

    for value in snapshots:
        name, path = _split_named(value)
        if name is None and os.path.isdir(path):
            try:
                files = sorted((e.name[:-5], e.path) for e in os.scandir(path)
                               if e.name.endswith(".json") and e.is_file())
            except OSError as e:
                raise InputError(f"cannot list snapshot directory: {e.strerror}", path) from None
            if not files:
                raise InputError("no *.json snapshots in directory", path)
            for stem, fp in files:
                add(stem, fp, lambda fp=fp: load_snapshot_node(fp, loader))
            continue
        if name is None:
            name = node if (node and single) else Path(path).stem
        add(name, path, lambda path=path: load_snapshot_node(path, loader))
    for value in hwloc_xmls:
        name, path = _split_named(value)
        if name is None:
            if not (node and single):
                raise UsageError("--hwloc-xml FILE needs --node NAME (or write NAME=FILE)")
            name = node
        if not os.path.isfile(path):
            raise InputError("cannot read hwloc XML: no such file", path)
        add(name, path, lambda path=path, name=name: load_node(hwloc_xml=path, hostname=name))


def _type_map(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        k, eq, v = item.partition("=")
        if not eq or not k or not v or any(c.isspace() for c in v):
            raise UsageError(f"--type-map wants KEY=TYPE (type, bus id or 0x<device id>), got {item!r}")
        out[k.lower() if k.lower().startswith("0x") else k] = v
    return out


def build_options(ctx_opts: Mapping[str, Any], nodes: Mapping[str, Any]) -> Any:
    from ..confgen import GresOptions
    from ..confgen.pciids import load_nvidia_names

    if ctx_opts["mps_count"] < 0 or ctx_opts["shards"] < 0:
        raise UsageError("--mps-count and --shards must be >= 0")
    need_pci = any(g.name is None for n in nodes.values() for g in n.gpus)
    pci = load_nvidia_names(ctx_opts["pci_ids"]) if need_pci else {}
    return GresOptions(dev_dir=ctx_opts["dev_dir"], type_map=_type_map(ctx_opts["type_map"]),
                       pci_names=pci, mps_count=ctx_opts["mps_count"], shards=ctx_opts["shards"],
                       links=not ctx_opts["no_links"], socket_mode=ctx_opts["socket_mode"],
                       autodetect="" if ctx_opts["autodetect"] == "none" else ctx_opts["autodetect"])


def input_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options naming where node models come from (shared with topology)."""
    f = click.option("--node", metavar="NAME", help="Slurm node name for the live node or a single input.")(f)
    f = click.option("--hwloc-xml", "hwloc_xmls", multiple=True, metavar="[NAME=]FILE",
                     help="lstopo XML of a node (repeatable as NAME=FILE).")(f)
    f = click.option("--snapshot", "snapshots", multiple=True, metavar="[NAME=]FILE|DIR",
                     help="Snapshot of a node (repeatable; a directory means every *.json in it, "
                          "named after the file).")(f)
    return f


def gres_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--dev-dir", default="/dev", show_default=True, help="Directory of nvidia device files."),
        click.option("--type-map", multiple=True, metavar="KEY=TYPE",
                     help="Override Type= for a GPU type, PCI bus id or 0x<device id> (repeatable)."),
        click.option("--pci-ids", default="/usr/share/misc/pci.ids", show_default=True,
                     help="PCI id database for GPUs without an NVML name."),
        click.option("--mps-count", type=int, default=0, help="Add Name=mps Count=N per GPU."),
        click.option("--shards", type=int, default=0, help="Add Name=shard Count=N per GPU."),
        click.option("--no-links", is_flag=True, help="Never write Links=."),
        click.option("--socket-mode", type=click.Choice(["auto", "package", "numa"]), default="auto",
                     show_default=True, help="What slurm.conf Sockets= counts (numa needs "
                     "SlurmdParameters=numa_node_as_socket)."),
        click.option("--autodetect", type=click.Choice(["off", "nvml", "nvidia", "none"]), default="off",
                     show_default=True, help="Global AutoDetect= line (none: omit it)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return input_options(f)


def node_notes(nodes: Mapping[str, Any]) -> list[str]:
    """The hardware layer's notes (a GPU NVML could not read, no NVML at all), nodes folded.

    A GPU left out of the model is left out of gres.conf too; the admin
    must hear about it before ``apply`` writes a file without it.
    """
    from ..confgen import hostlist

    by_note: dict[str, list[str]] = {}
    for name, node in nodes.items():
        for note in node.notes:
            by_note.setdefault(note, []).append(name)
    return [f"{hostlist.fold(names)}: {note}" for note, names in by_note.items()]


def _render(kw: Mapping[str, Any]) -> tuple[str, Any, Any]:
    from ..confgen.gres import build_gres_view
    from ..confgen.templating import render

    nodes, where = load_nodes(kw["snapshots"], kw["hwloc_xmls"], kw["node"])
    opts = build_options(kw, nodes)
    inputs = [f"{n}={w}" if w != "live" else f"{n}=live" for n, w in list(where.items())[:20]]
    if len(where) > 20:
        inputs.append(f"... and {len(where) - 20} more")
    view = build_gres_view(nodes, opts, inputs=inputs, where=where)
    for note in node_notes(nodes) + list(view.notes):
        click.echo(f"slurm-gpu: note: {note}", err=True)
    return render("gres.conf.j2", view.as_template_vars()), view, nodes


@click.group()
def gres() -> None:
    """Generate, check and apply gres.conf."""


@gres.command()
@gres_options
@click.option("-o", "--output", metavar="FILE", help="Write here (atomically) instead of stdout.")
@click.option("--node-lines", is_flag=True, help="Print the matching slurm.conf NodeName= lines instead.")
def render(output: str | None, node_lines: bool, **kw: Any) -> None:
    """Print gres.conf for the given nodes (default: this node)."""
    from ..fsutil import atomic_write

    text, view, _ = _render(kw)
    if node_lines:
        text = "".join(nl + "\n" for g in view.groups for nl in g.node_lines)
        if view.slurmd_parameters:
            text = f"SlurmdParameters={','.join(view.slurmd_parameters)}\n" + text
    if output:
        atomic_write(output, text)
    else:
        sys.stdout.write(text)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise InputError(f"cannot read {Path(path).name}: {e.strerror}", path) from None


def replace_config(config: str, text: str, old: str | None, *, backup: bool) -> str:
    """Atomically replace a Slurm config file; return the path written.

    Follows a symlink (``/etc/slurm/gres.conf`` -> a shared copy) instead of
    replacing the link with a plain file, and keeps the file's mode and
    owner (slurm.conf(5) files are often ``0640 root:slurm``).  The previous
    text goes to ``<file>.bak`` beside the real file first.
    """
    from ..fsutil import atomic_write

    target = os.path.realpath(config)
    try:
        st = os.stat(target)
        mode, uid, gid = st.st_mode & 0o7777, st.st_uid, st.st_gid
    except FileNotFoundError:
        mode, uid, gid = 0o644, None, None
    if old is not None and backup:
        atomic_write(target + ".bak", old, mode=mode, uid=uid, gid=gid)
    atomic_write(target, text, mode=mode, uid=uid, gid=gid)
    return target


@gres.command()
@gres_options
@click.option("--config", "config", required=True, metavar="PATH", help="Existing gres.conf to check.")
@click.pass_context
def check(ctx: click.Context, config: str, **kw: Any) -> None:
    """Compare an existing gres.conf with the generated one (exit 1 on difference)."""
    from ..confgen.grescheck import compare, parse_gres_conf

    text, _, _ = _render(kw)
    current = parse_gres_conf(_read(config).splitlines(True), config)
    wanted = parse_gres_conf(text.splitlines(True), "generated")
    diff = compare(current, wanted)
    if diff:
        click.echo(f"slurm-gpu: {config} differs from the hardware (- {config}, + generated):")
        for line in diff:
            click.echo(line)
        ctx.exit(1)
    click.echo(f"slurm-gpu: {config} matches the hardware")


@gres.command()
@gres_options
@click.option("--config", "config", required=True, metavar="PATH", help="gres.conf to write.")
@click.option("--no-backup", is_flag=True, help="Do not keep PATH.bak.")
def apply(config: str, no_backup: bool, **kw: Any) -> None:
    """Write gres.conf when it changed (atomic, backup), then say what to restart."""
    from ..confgen.grescheck import parse_gres_conf, restart_advice

    text, _, _ = _render(kw)
    old = _read(config) if os.path.exists(config) else None
    if old == text:
        click.echo(f"slurm-gpu: {config} is up to date; nothing written")
        return
    wanted = parse_gres_conf(text.splitlines(True), "generated")
    understood = True
    try:
        current = parse_gres_conf(old.splitlines(True), config) if old is not None else {}
    except InputError as e:
        # Replacing a broken or hand-made file is what apply is for; only the
        # advice gets coarser (treat every device as new).
        click.echo(f"slurm-gpu: note: previous file not understood: {e.what} ({e.where})", err=True)
        current, understood = {}, False
    target = replace_config(config, text, old, backup=not no_backup)
    click.echo(f"slurm-gpu: wrote {target}" + (f" (previous kept as {target}.bak)" if old is not None
                                               and not no_backup else ""))
    for line in restart_advice(current, wanted):
        click.echo(line)
    if not understood:
        click.echo("slurm-gpu: the previous file could not be compared: restart slurmctld too")
