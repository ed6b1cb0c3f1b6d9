"""Inputs and outputs shared by ``slurm-gpu gres`` and ``slurm-gpu topology``.

Which nodes to model (live, snapshots, hwloc XMLs, named ``NAME=FILE``), the
notes the hardware layer left on them, and reading and replacing the Slurm
config files these commands check and apply.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import click

from ..errors import InputError, UsageError
from ..gcpause import freeze_if_large, gc_paused

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
    from ..hw.snapshot_bulk import SnapshotLoader

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
    with gc_paused():
        _load_inputs(snapshots, hwloc_xmls, node, single, add, loader)
    freeze_if_large(len(nodes), 100)
    if not nodes:
        name = node or _short_hostname()
        add(name, "live", load_node)
    return nodes, where


def _load_inputs(snapshots: Sequence[str], hwloc_xmls: Sequence[str], node: str | None, single: bool,
                 add: Callable[[str, str, Callable[[], Any]], None], loader: Any) -> None:
    from ..hw import HwlocXml, load_node
    from ..hw.snapshot_bulk import load_snapshot_node

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
        add(name, path, lambda path=path, name=name: load_node(HwlocXml(path, hostname=name)))


def input_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options naming where node models come from (shared with topology)."""
    f = click.option("--node", metavar="NAME", help="Slurm node name for the live node or a single input.")(f)
    f = click.option("--hwloc-xml", "hwloc_xmls", multiple=True, metavar="[NAME=]FILE",
                     help="lstopo XML of a node (repeatable as NAME=FILE).")(f)
    f = click.option("--snapshot", "snapshots", multiple=True, metavar="[NAME=]FILE|DIR",
                     help="Snapshot of a node (repeatable; a directory means every *.json in it, "
                          "named after the file).")(f)
    return f


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
    from ..confgen.confsafe import comment
    return [comment(f"{hostlist.fold(names)}: {note}") for note, names in by_note.items()]


def emit(text: str, output: str | None) -> None:
    """Write a rendered file to *output* atomically, or to stdout."""
    if output:
        from ..fsutil import atomic_write
        atomic_write(output, text)
    else:
        import sys
        sys.stdout.write(text)


def read_config(path: str) -> str:
    """A config file's text (InputError naming it when unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise InputError(f"cannot read {Path(path).name}: {e.strerror}", path) from None
