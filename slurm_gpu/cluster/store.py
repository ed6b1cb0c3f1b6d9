"""A directory of collected nodes: one file per node, read fast, bad entries one line each.

An entry ``DIR/<node>.json`` is either a full snapshot (``snapshot record``,
what ``cluster collect`` gathers) or a model file (``slurm-gpu.model/1``,
what the health check publishes).  Snapshots go through the bulk loader
(head + tail of the file, CPU parts shared between identical nodes), model
files through the same sharing.  Whatever cannot be read (garbage, an old
schema, a half-written file, a model this code cannot load) becomes one
:class:`BadEntry` line; it never stops the others from loading.
"""
from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError, SlurmGpuError, unreadable
from ..gcpause import freeze_if_large, gc_paused
from ..hw.snapshot_bulk import SnapshotLoader
from . import modelfile

_SCHEMA_RE = re.compile(rb'"schema"\s*:\s*"([^"]{0,100})"')
# What tells one box from another of the same kind, but never what Slurm is told.
_IDENTITY_KEYS = tuple(f'"{k}":{sp}"' for k in ("uuid", "serial", "hostname") for sp in (" ", ""))


def _blank_identity(text: str) -> str:
    """*text* with the values of ``uuid``, ``serial`` and ``hostname`` emptied.

    Plain splitting, about twice as fast as a regular expression over 10,000
    models; a value with an escaped quote leaves the text as it is (that
    node then shares nothing, which is only slower).
    """
    for key in _IDENTITY_KEYS:
        if key not in text:
            continue
        parts = text.split(key)
        out = [parts[0]]
        for part in parts[1:]:
            end = part.find('"')
            if end < 0 or "\\" in part[:end]:
                return text
            out.append(part[end:])
        text = key.join(out)
    return text


@dataclass(frozen=True)
class BadEntry:
    node: str
    path: str
    reason: str


@dataclass
class Collected:
    """Node name -> model, the entries that could not be read, and who else could write them."""

    nodes: dict[str, Any]
    where: dict[str, str]
    bad: dict[str, BadEntry]
    warnings: list[str] = field(default_factory=list)

    def refuse_unsafe(self, opts: Any = None) -> None:
        """Move every node whose model this render cannot use to :attr:`bad`.

        A hostile entry (a value no config line may carry, see
        :mod:`slurm_gpu.confgen.confsafe`) is treated like an unreadable one
        (issue 24): named in one line (``refused: ...``), then the render
        refuses or, with ``--skip-unreadable``, leaves it out.  So is a node
        whose GPUs cannot be named (no NVML name, not in pci.ids): one
        node's file never stops the others.  Checked once per kind of
        hardware (models of one kind share their parts, see
        :class:`SharedHardwareLoader`); names and fabric ids, which differ
        per node, for every node.
        """
        from ..confgen import block, confsafe
        from ..confgen.gres import GresOptions, _gpu_key, _same_objects, gres_records
        opts = opts or GresOptions()
        seen: dict[Any, str | None] = {}
        by_id: dict[Any, Any] = {}

        def kind_problem(name: str, node: Any) -> str | None:
            try:
                confsafe.check_node(name, node)
                gres_records(node, opts, where=name)
            except confsafe.UnsafeValue as e:
                return f"refused: {e.what}"
            except SlurmGpuError as e:
                return e.what
            return None

        def problem(name: str, node: Any) -> str | None:
            try:
                confsafe.node_name(name)
                block.node_domain(name, node)
            except confsafe.UnsafeValue as e:
                return f"refused: {e.what}"
            try:
                # The parts shared by identity first (bulk loads share them
                # between nodes of a kind), else what check_node and
                # gres_records read, by value; as text, since 0 == 0.0 == False
                # would let a hostile 0.0 pass as a checked 0.
                same = _same_objects(node) + (id(node.notes),)
                if same in by_id:
                    return by_id[same]
                key = repr((tuple(_gpu_key(g) for g in node.gpus), node.memory_bytes, node.notes))
                if key not in seen:
                    seen[key] = kind_problem(name, node)
                why = by_id[same] = seen[key]
                return why
            except TypeError:     # a value of the wrong type (a list for a name): checked on its own
                return kind_problem(name, node)

        for name, node in list(self.nodes.items()):
            why = problem(name, node)
            if why is not None:
                self.bad[name] = BadEntry(name, self.where.pop(name, ""), why)
                del self.nodes[name]


class SharedHardwareLoader(SnapshotLoader):
    """For comparisons: nodes whose models differ only in identity share one model.

    GPU UUIDs, serials and host names are blanked before decoding, so a
    10,000-node cluster of a few kinds of box (and NVLink cliques) is decoded
    a few hundred times, not 10,000; equal hardware is then the same object,
    which lets :func:`slurm_gpu.cluster.drift.compare` work out each kind once.
    The models it returns have no UUIDs: use it only where they do not matter.
    """

    def __init__(self) -> None:
        super().__init__()
        self.models: dict[str, Any] = {}

    def node_from_text(self, text: str) -> Any:
        # The CPU part (most of the text, never an identity) is left unscanned.
        a = text.find('"packages": ')
        b = text.find('"gpus": ', a) if a >= 0 else -1
        if b < 0:
            key = _blank_identity(text)
        else:
            key = _blank_identity(text[:a]) + text[a:b] + _blank_identity(text[b:])
        node = self.models.get(key)
        if node is None:
            node = self.models[key] = super().node_from_text(key)
        return node


def _scandir(directory: str) -> Any:
    """``os.scandir(directory)``, its failures as one InputError line each."""
    try:
        return os.scandir(directory)
    except NotADirectoryError:
        raise InputError("not a directory", directory) from None
    except OSError as e:
        raise unreadable(e, "collection directory", directory, "list") from None
    except ValueError:   # a NUL in the path
        raise InputError("bad collection directory name", repr(directory)[:80]) from None


def entries(directory: str) -> list[tuple[str, str, bool]]:
    """``(node name, path, regular file)`` for every ``*.json`` in *directory*,
    sorted; dot files (temporaries) skipped.

    A ``*.json`` that is not a regular file (a FIFO, a directory, a socket,
    a symbolic link) is listed too, flagged: :func:`load_dir` names it as
    unreadable instead of skipping it without a word, and never opens it.
    """
    return [(n, p, kind == "") for n, p, kind, _ in _listing(directory)]


_KINDS = {stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a directory",
          stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}


def _listing(directory: str) -> list[tuple[str, str, str, bool]]:
    """``(node, path, "" for a regular file or what else it is, others could write it)``, sorted.

    One ``lstat`` per entry (never following a link): a link could point
    anywhere this reader may read, and an entry that is not root's (or this
    user's), or that group or others may write, is warned about.
    """
    me = os.geteuid()
    with _scandir(directory) as it:
        try:
            found = []
            for e in it:
                if not e.name.endswith(".json") or e.name.startswith("."):
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    found.append((e.name[:-5], e.path, "gone while listed", False))
                    continue
                kind = "" if stat.S_ISREG(st.st_mode) else _KINDS.get(stat.S_IFMT(st.st_mode), "not a file")
                found.append((e.name[:-5], e.path, kind, _others_may_write(st, me)))
        except OSError as e:
            raise InputError(f"cannot list collection directory: {e.strerror}", directory) from None
    from ..confgen.hostlist import natural_key
    return sorted(found, key=lambda x: natural_key(x[0]))


def _others_may_write(st: os.stat_result, me: int) -> bool:
    return st.st_uid not in (0, me) or bool(st.st_mode & 0o022)


def _trust_warnings(directory: str, listed: list[tuple[str, str, str, bool]]) -> list[str]:
    """Who besides root (or this user) could have written what a config is rendered from."""
    out: list[str] = []
    try:
        st = os.stat(directory)
    except OSError:
        return out
    if st.st_uid not in (0, os.geteuid()):
        out.append(f"the directory belongs to uid {st.st_uid}, not root: that user can add or replace "
                   "node entries")
    if st.st_mode & 0o022:
        out.append("the directory is writable by group or others: any local user can add or replace "
                   "node entries")
    loose = [n for n, _, kind, others in listed if others and kind != "a symbolic link"]
    if loose:
        from ..confgen import confsafe
        from ..confgen.hostlist import fold
        names = [n for n in loose if confsafe.NODE_NAME.fullmatch(n)]
        shown = fold(names) if len(names) == len(loose) else f"{len(loose)} entries"
        out.append(f"entr{'ies' if len(loose) > 1 else 'y'} {shown} {'are' if len(loose) > 1 else 'is'} "
                   f"not root's or {'are' if len(loose) > 1 else 'is'} writable by group or others: "
                   f"{'they are' if len(loose) > 1 else 'it is'} trusted for the cluster's config")
    return out


def require_dir(directory: str) -> None:
    """InputError unless *directory* is a directory we can list: checked
    before slurmctld is asked, so a mistyped ``--from`` is what gets named."""
    _scandir(directory).close()


def load_entry(path: str, loader: Any) -> Any:
    """The model in one entry (InputError with the reason when unusable)."""
    from ..hw import snapshot as snap
    from ..hw.snapshot_bulk import load_snapshot_node
    try:  # the common case, a well-formed snapshot: head and tail only, one open
        node = loader.fast_node(path)
    except (OSError, UnicodeDecodeError):
        node = None
    if node is not None:
        return node
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror}", path) from None
    m = _SCHEMA_RE.search(head)
    schema = m.group(1).decode("utf-8", "replace") if m else None
    if schema == modelfile.SCHEMA:
        return _model_file_node(path, loader)
    if schema is None:
        if not head.strip():
            raise InputError("empty file", path)
        if not head.lstrip().startswith(b"{"):
            raise InputError("not a snapshot or model file (not JSON)", path)
    elif schema != snap.SCHEMA:
        raise InputError(f"unsupported schema {schema!r} (want {snap.SCHEMA!r} or {modelfile.SCHEMA!r})", path)
    return load_snapshot_node(path, loader)


MAX_MODEL_BYTES = 16 << 20


def _model_file_node(path: str, loader: Any) -> Any:
    import dataclasses
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_MODEL_BYTES + 1)
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror}", path) from None
    if len(raw) > MAX_MODEL_BYTES:   # an 8-GPU model is about 14 KB: whoever wrote this wants our memory
        raise InputError(f"model file over {MAX_MODEL_BYTES >> 20} MiB", path)
    text = raw.decode("utf-8", "replace")
    key = '"node":'
    at = text.rfind(key)
    body = text[at + len(key):].rstrip()
    if at < 0 or not body.endswith("}}"):
        raise InputError("truncated model file (no complete \"node\")", path)
    try:
        node = loader.node_from_text(body[:-1])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise InputError(f"bad model: {type(e).__name__}: {e}", path) from None
    return dataclasses.replace(node, sources=(f"model:{path}",))


def load_dir(directory: str, only: set[str] | None = None, *, identity: bool = True) -> Collected:
    """Every entry of *directory* (or only the nodes in *only*), bad ones listed, never raised.

    ``identity=False``: models without GPU UUIDs and serials, equal hardware
    shared (:class:`SharedHardwareLoader`), for ``cluster check``.
    """
    loader: Any = SnapshotLoader() if identity else SharedHardwareLoader()
    out = Collected({}, {}, {})
    with gc_paused():   # thousands of models stay alive
        listed = _listing(directory)
        out.warnings = _trust_warnings(directory, listed)
        for name, path, kind, _ in listed:
            if only is not None and name not in only:
                continue
            if kind:
                out.bad[name] = BadEntry(name, path, f"{kind}, not a regular file")
                continue
            try:
                out.nodes[name] = load_entry(path, loader)
                out.where[name] = path
            except SlurmGpuError as e:
                out.bad[name] = BadEntry(name, path, e.what)
            except (UnicodeDecodeError, RecursionError, MemoryError) as e:
                out.bad[name] = BadEntry(name, path, f"unreadable: {type(e).__name__}")
    freeze_if_large(len(out.nodes), 100)
    return out
