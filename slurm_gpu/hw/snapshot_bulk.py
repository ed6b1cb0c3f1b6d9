"""Reading thousands of snapshots fast: the derived model from each file's tail.

``slurm-gpu gres``/``topology`` over a whole cluster load one snapshot per
node.  :func:`load_snapshot_node` reads only what it needs and falls back to
:func:`slurm_gpu.hw.snapshot.node_from_file` (and a replay of the raw answers)
whenever the fast path does not apply, so the result is always the model a
full load gives.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

from ..errors import InputError

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
        from .model import Node

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
        from . import snapshot as snap

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
    from . import snapshot as snap

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
        return snap.node_from_file(path)
    except InputError:
        # The derived model does not load with this code (schema drift): rebuild it from the raw data.
        return snap.replay(data, path)
