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
    # The body too, not only the hash in its head: a body rewritten under
    # the right head (another node's root, root_squash's nobody) is replaced.
    if published_hash(path) == digest and _body_hash(path) == digest:
        return False
    atomic_write(path, model_text(name, node, digest))
    return True


def _body_hash(path: str) -> str | None:
    """:func:`model_hash` of the model the file at *path* holds (None: none readable)."""
    from ..fsutil import read_trusted
    raw = read_trusted(path, 64 << 20)
    try:
        doc = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    node = doc.get("node") if isinstance(doc, dict) else None
    return model_hash(node) if isinstance(node, dict) else None


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
    from ..hw import live
    jobs_dir = live.settings().state_dir
    held, why = job_mig_gpus(jobs_dir)
    if snapshot_node is None:
        from ..hw import load_node
        snapshot_node = load_node().to_dict()
    # Read again after the hardware: a prolog that started in between
    # recorded its GPUs before changing them (jobs/migjob.py), so it shows here.
    later, why_later = job_mig_gpus(jobs_dir)
    held.update(later)
    why = why or why_later
    if why:
        return f"model not published: {why}"
    if held:
        snapshot_node, why = with_baseline(snapshot_node, held, read_baseline(state_dir, name))
        if why:
            return f"model not published: {why}"
    elif state_dir:
        remember_baseline(state_dir, name, snapshot_node)
    written = publish(directory, name, snapshot_node)
    if s.publish_interval > 0 and state_dir:
        from ..fsutil import atomic_write
        os.makedirs(state_dir, exist_ok=True)
        atomic_write(_memo_path(state_dir, name), json.dumps({"at": time.time(), "boot_id": boot}) + "\n")
    return f"model published to {node_file(directory, name)}" if written else None


# --- A job's own MIG layout is never the node's hardware (issue 24 §3) ---
#
# While a --gpu-mig job runs, its GPU holds the instances the job asked for
# (jobs/migjob.py); the epilog puts the node's own layout back.  Published,
# those instances would become gres.conf lines (seven 1g.10gb GRES for one
# GPU) and drift for `cluster check`.  So the model published while a job
# holds a GPU's MIG layout takes that GPU's MIG state from the last model
# derived with no such job (node-local, beside the publish memo); the rest
# of the node (a GPU lost meanwhile) is published as it is.

def _baseline_path(state_dir: str, name: str) -> str:
    return os.path.join(state_dir, f"cluster-baseline.{re.sub(r'[^A-Za-z0-9._-]', '_', name)}.json")


def job_mig_gpus(jobs_state_dir: str | None) -> tuple[dict[str, str], str | None]:
    """({GPU UUID or ``minor:N``: job id} of every GPU a job's MIG layout holds, why none can be told).

    A job's record says it holds a GPU from before its first change to the
    GPU until the epilog has put the baseline back (``mig`` is then None).
    A record that cannot be read leaves the answer unknown: the caller
    publishes nothing rather than maybe a job's layout.
    """
    if not jobs_state_dir:
        return {}, None
    from ..jobs import state as jobstate
    out: dict[str, str] = {}
    for jobid in jobstate.list_jobs(jobs_state_dir):
        try:
            st = jobstate.load(jobs_state_dir, jobid, warn=lambda _m: None)
        except Exception as e:  # noqa: BLE001 - an unreadable record: we cannot tell what it holds
            return {}, f"cannot read job {jobid}'s record: {getattr(e, 'what', type(e).__name__)}"
        for rec in ((st.mig if st else None) or {}).get("gpus", []):
            if rec.get("uuid"):
                out[str(rec["uuid"])] = jobid
            if isinstance(rec.get("minor"), int):
                out[f"minor:{rec['minor']}"] = jobid
    return out, None


def remember_baseline(state_dir: str, name: str, node: Mapping[str, Any]) -> None:
    """Keep *node* (derived with no job holding a MIG layout) as this node's baseline, when it changed."""
    from ..fsutil import atomic_write
    digest = model_hash(node)
    path = _baseline_path(state_dir, name)
    if published_hash(path) == digest:
        return
    os.makedirs(state_dir, exist_ok=True)
    atomic_write(path, model_text(name, node, digest), mode=0o600)


def read_baseline(state_dir: str | None, name: str) -> dict[str, Any] | None:
    """The model :func:`remember_baseline` kept (None: none, or not one this code wrote)."""
    if not state_dir:
        return None
    try:
        fd = os.open(_baseline_path(state_dir, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            doc = json.loads(f.read(16 << 20))
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)
    node = doc.get("node") if isinstance(doc, dict) else None
    return node if isinstance(node, dict) and isinstance(node.get("gpus"), list) else None


def with_baseline(node: Mapping[str, Any], held: Mapping[str, str],
                  baseline: Mapping[str, Any] | None) -> tuple[dict[str, Any], str | None]:
    """*node* with each held GPU's MIG state taken from *baseline* (pure); or why that cannot be done."""
    def key(g: Mapping[str, Any]) -> str | None:
        if g.get("uuid") and g["uuid"] in held:
            return str(g["uuid"])
        k = f"minor:{g.get('minor')}"
        return k if k in held else None

    def ident(g: Mapping[str, Any]) -> tuple[Any, Any]:
        return g.get("uuid"), g.get("minor")

    base = {ident(g): g for g in (baseline or {}).get("gpus", []) if isinstance(g, dict)}
    gpus = []
    for g in node.get("gpus", []):
        k = key(g)
        if k is None:
            gpus.append(g)
            continue
        b = base.get(ident(g))
        if b is None:
            return dict(node), (f"job {held[k]} holds its own MIG layout on GPU {g.get('minor')} and this node "
                                f"has no baseline model{' for that GPU' if baseline else ' yet'}")
        gpus.append(dict(g, mig_enabled=b.get("mig_enabled"), mig_instances=b.get("mig_instances", [])))
    return dict(node, gpus=gpus), None
