"""A node's derived model as one small file, with a timestamp and a hash.

Schema ``slurm-gpu.model/1``::

    {"schema": "slurm-gpu.model/1", "hash": "sha256:<hex>", "hostname": "gpu001",
     "published_at": "2026-11-24T14:00:00Z", "generator": "slurm-gpu 0.1.0",
     "node": Node.to_dict()}

``hash`` is the SHA-256 of the model's canonical JSON and comes second, so
:func:`publish` decides "unchanged" from the file's first few hundred bytes:
an unchanged node costs one small read of the shared directory and no write,
and ``published_at`` is when the model last *changed*.

The health check publishes this way when ``[cluster] publish_dir`` is set
(:func:`publish_from_health`); ``slurm-gpu cluster check|render --from DIR``
read these files and full snapshots alike.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from dataclasses import dataclass
from typing import Any, Mapping

SCHEMA = "slurm-gpu.model/1"
_HEAD = 256
_HASH_RE = re.compile(rb'"hash"\s*:\s*"([^"]{1,200})"')


@dataclass(frozen=True)
class ClusterSettings:
    """The ``[cluster]`` section of the config file."""

    # Where the health check publishes this node's model ("" = never); "%n" = node name.
    publish_dir: str = ""
    # Derive and compare the model at most this often (seconds; 0 = every health run).
    # Between two, a run touches neither the hardware read nor the shared directory;
    # a reboot starts a new interval at once.
    publish_interval: float = 0.0


def model_hash(node: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of the model's canonical JSON (key order and spacing do not matter)."""
    canon = json.dumps(node, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canon.encode()).hexdigest()


def model_text(name: str, node: Mapping[str, Any], digest: str | None = None, *,
               stamp: str | None = None) -> str:
    """The file text; ``schema`` and ``hash`` first (see module docstring)."""
    from .. import __version__
    doc = {"schema": SCHEMA, "hash": digest or model_hash(node), "hostname": name,
           "published_at": stamp or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "generator": f"slurm-gpu {__version__}", "node": node}
    return json.dumps(doc, separators=(",", ":")) + "\n"


def published_hash(path: str) -> str | None:
    """The hash in the head of an existing model file (None: no file, or none readable)."""
    # Never follow a symlink or block on a FIFO someone left there: either is
    # "no hash", and the atomic rename then replaces it with a plain file.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        head = os.read(fd, _HEAD)
    except OSError:
        return None
    finally:
        os.close(fd)
    m = _HASH_RE.search(head)
    return m.group(1).decode("ascii", "replace") if m else None


def node_file(directory: str, name: str) -> str:
    """``<directory>/<name>.json``; *name* must be a plain node name."""
    if not name or "/" in name or name.startswith(".") or "\0" in name:
        from ..errors import InputError
        raise InputError(f"bad node name {name!r}", directory)
    return os.path.join(directory, f"{name}.json")


def publish(directory: str, name: str, node: Mapping[str, Any]) -> bool:
    """Write *node*'s model to ``directory/name.json`` when it changed; True when written."""
    from ..fsutil import atomic_write
    path = node_file(directory, name)
    digest = model_hash(node)
    if published_hash(path) == digest:
        return False
    atomic_write(path, model_text(name, node, digest))
    return True


def settings(raw: dict[str, Any] | None = None) -> ClusterSettings:
    from .. import config
    return config.section(ClusterSettings, "cluster", raw)


def _memo_path(state_dir: str, name: str) -> str:
    return os.path.join(state_dir, f"cluster-publish.{re.sub(r'[^A-Za-z0-9._-]', '_', name)}.json")


def _due(state_dir: str | None, name: str, interval: float, boot: str) -> bool:
    """True unless this node was published less than *interval* seconds ago, in this boot."""
    if interval <= 0 or not state_dir:
        return True
    try:
        with open(_memo_path(state_dir, name), "rb") as f:
            memo = json.loads(f.read(4096))
        at = float(memo["at"])
        return memo.get("boot_id") != boot or not (0 <= time.time() - at < interval)
    except (OSError, ValueError, KeyError, TypeError):
        return True     # no memo, or a broken one: derive now (it is rewritten below)


def publish_from_health(name: str, snapshot_node: Mapping[str, Any] | None,
                        state_dir: str | None = None) -> str | None:
    """The health check's hook: publish this node's model when ``[cluster] publish_dir`` is set.

    *snapshot_node* is the derived model of the snapshot the run replayed
    (already parsed), else this node is read as configured
    (:func:`slurm_gpu.hw.load_node`).  With ``publish_interval``, a memo
    in *state_dir* (node-local) skips the whole step until the interval has
    passed or the node rebooted.  Returns a line for the run's notes when
    something was written, None otherwise.
    """
    s = settings()
    if not s.publish_dir:
        return None
    from ..hw import kmsg
    boot = kmsg.boot_id()
    if not _due(state_dir, name, s.publish_interval, boot):
        return None
    directory = s.publish_dir.replace("%n", name)
    if snapshot_node is None:
        from ..hw import load_node
        snapshot_node = load_node().to_dict()
    written = publish(directory, name, snapshot_node)
    if s.publish_interval > 0 and state_dir:
        from ..fsutil import atomic_write
        os.makedirs(state_dir, exist_ok=True)
        atomic_write(_memo_path(state_dir, name), json.dumps({"at": time.time(), "boot_id": boot}) + "\n")
    return f"model published to {node_file(directory, name)}" if written else None
