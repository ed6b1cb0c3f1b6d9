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

from ..errors import InputError, unreadable
from .model import Fabric, Gpu, Node, NumaNode

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

# What differs between two nodes of one kind: the host name, each GPU's
# and MIG device's UUID, the GPU's NVLink-fabric membership, and the
# memory of the node and of its NUMA nodes (the kernel's MemTotal, which
# firmware and kernel versions move by a few MB), and the kernel's own count
# (phys_memory_bytes, the last key).  Only values that are one
# JSON token or a flat object are cut out (a string with no escape, null,
# an integer, an object with no nesting): such a value is a whole JSON value
# wherever it sits, so the text around it parses the same whichever value
# stands there.
_TOKEN = (r'"[^"\\\x00-\x1f]*"|null|\{[^{}\[\]"]*(?:"[^"\\\x00-\x1f]*"[^{}\[\]"]*)*\}'
          r'|-?(?:0|[1-9][0-9]{0,30})')
# Before the CPU part (host name) and from the GPUs on (UUIDs, fabric, and
# the node's memory, the key before "gpu_memory_nodes" in Node.to_dict);
# in the CPU part, the NUMA nodes' memory.
_VOLATILE = re.compile(r'("(?:hostname|uuid|fabric|phys_memory_bytes)": '
                       r'|"memory_bytes": (?=[-0-9]+,\s*"gpu_memory_nodes": ))(' + _TOKEN + ')')
_CPU_VOLATILE = re.compile(r'("memory_bytes": )(' + _TOKEN + ')')
_VALUE = re.compile(_TOKEN)
# In the template text each cut-out value becomes the string "\u0000<n>":
# a NUL, which no value in a snapshot holds (texts that spell one are
# decoded the plain way), so the parsed template shows where each one went.
_NUL_ESCAPE = "\\u0000"


def _value(token: str) -> Any:
    """The value of one cut-out token (see _VOLATILE)."""
    c = token[0]
    if c == '"':
        return token[1:-1]      # no escape, no control character: the text is the value
    if c == "-" or c.isdigit():
        return int(token)       # an integer token (_TOKEN): what json.loads gives
    if token == "null":
        return None
    return json.loads(token)


@dataclasses.dataclass(frozen=True, slots=True)
class _Template:
    """A decoded model and where each cut-out value of its text goes.

    ``hostname`` and ``memory`` are the indices of the host name's and the
    node memory's values (or -1), ``numa`` those of each NUMA node's memory,
    ``gpus`` those of each GPU's UUID and fabric values and of its MIG
    devices' UUIDs (-1: that field is part of the template text itself).  ``pieces`` is the key text between the
    cut-out values: a text that is these pieces with one value token between
    each two is this template with those values, whatever found the tokens.
    """

    node: Any
    hostname: int
    memory: int
    numa: tuple[int, ...]
    gpus: tuple[tuple[int, int, tuple[int, ...]], ...]
    pieces: tuple[str, ...]
    phys: int = -1             # the index of phys_memory_bytes's value (or -1)

    def values_in(self, text: str) -> list[str] | None:
        """The value tokens of *text* when it is this template's pieces around them, else None."""
        pieces = self.pieces
        pos = len(pieces[0])
        if not text.startswith(pieces[0]):
            return None
        values = []
        value = _VALUE.match
        for piece in pieces[1:]:
            m = value(text, pos)
            if m is None:
                return None
            pos = m.end()
            if not text.startswith(piece, pos):
                return None
            values.append(m.group())
            pos += len(piece)
        return values if pos == len(text) else None


class SnapshotLoader:
    """Loads many snapshots, decoding each kind of node once.

    On a 10,000-node cluster most node models differ only in host name,
    GPU UUIDs and NVLink fabric: the CPUs, NUMA nodes, GPU locality and
    NVLinks (most of the JSON) repeat.  The text with those values cut out
    is the key of a template decoded once; a node whose text gives the same
    key is the template with its own values put back.  Equal key text is
    equal input, so the answer is the one a full decode gives (each template
    is checked against a full decode when it is made, and a text it cannot
    represent is decoded in full every time).  The model is frozen, so
    sharing its parts between nodes is safe.
    """

    def __init__(self) -> None:
        self._templates: dict[str, _Template | None] = {}
        self._fabrics: dict[str, Any] = {}
        self._sentinels: list[str] = []
        self._last: _Template | None = None
        # Nodes that all differ (in memory size, say) make a template each
        # that serves no other node: after _TRIAL such nodes, with fewer
        # reuses than templates, every text is decoded the plain way.
        self._made = 0
        self._reused = 0
        self._plain = False
        self._tail_hint = _TAIL

    def node_from_text(self, text: str) -> Any:
        """The model in the JSON text of a snapshot's ``node`` value."""
        if _NUL_ESCAPE in text:
            return _decode(text)
        # Nodes of one kind come in runs (files sorted by name): try the
        # template the last node used before cutting this text up.
        last = self._last
        if last is not None:
            values = last.values_in(text)
            if values is not None:
                self._reused += 1
                return self._fill(last, values)
        if self._plain:
            return _decode(text)
        # The CPU part (packages, NUMA nodes, cores: most of the text) is
        # scanned for memory sizes alone.
        a = text.find('"packages": ')
        b = text.find('"gpus": ', a) if a >= 0 else -1
        if b < 0:
            a = b = len(text)
        # each [text, key, value, text, key, value, ..., text]
        parts = [_VOLATILE.split(text[:a]), _CPU_VOLATILE.split(text[a:b]), _VOLATILE.split(text[b:])]
        values = [v for p in parts for v in p[2::3]]
        while len(self._sentinels) < len(values):
            self._sentinels.append(f'"{_NUL_ESCAPE}{len(self._sentinels)}"')
        n = 0
        for p in parts:
            k = len(p) // 3
            p[2::3] = self._sentinels[n:n + k]
            n += k
        key = "".join("".join(p) for p in parts)
        template = self._templates.get(key, _MISSING)
        if template is _MISSING:
            node = _decode(text)          # errors go to the caller, as without templates
            template = self._templates[key] = self._make_template(key, values, node)
            self._made += 1
            if self._made >= _TRIAL and self._reused < self._made:
                self._plain = True
                self._templates.clear()
            if template is None:
                return node
        elif template is None:
            return _decode(text)
        else:
            self._reused += 1
        self._last = template
        return self._fill(template, values)

    def _fabric(self, token: str) -> Any:
        fabric = self._fabrics.get(token, _MISSING)
        if fabric is _MISSING:
            v = _value(token)
            fabric = self._fabrics[token] = Fabric(**v) if v else None   # as Node.from_dict reads it
        return fabric

    def _fill(self, t: _Template, values: list[str]) -> Any:
        node = t.node
        fabrics = self._fabrics
        gpus = []
        for g, (u, f, migs) in zip(node.gpus, t.gpus):
            if f < 0:
                fabric = g.fabric
            else:
                fabric = fabrics.get(values[f], _MISSING)
                if fabric is _MISSING:
                    fabric = self._fabric(values[f])
            mig_instances = g.mig_instances
            if migs:
                mig_instances = tuple(m if i < 0 else dataclasses.replace(m, uuid=_value(values[i]))
                                      for m, i in zip(mig_instances, migs))
            gpu = _new(Gpu)
            fields = gpu.__dict__
            fields.update(g.__dict__)
            if u >= 0:
                fields["uuid"] = _value(values[u])
            fields["mig_instances"] = mig_instances
            fields["fabric"] = fabric
            gpus.append(gpu)
        numa_nodes = node.numa_nodes
        if t.numa:
            # The template holds its first node's values: equal memory sizes keep its
            # NumaNodes and their tuple (gres groups nodes by that tuple's identity).
            mine = tuple(n if i < 0 or (m := _value(values[i])) == n.memory_bytes and
                         type(m) is type(n.memory_bytes) else
                         NumaNode(n.index, n.os_index, m, n.cores, n.pus)
                         for n, i in zip(numa_nodes, t.numa))
            if any(a is not b for a, b in zip(mine, numa_nodes)):
                numa_nodes = mine
        new = _new(Node)
        fields = new.__dict__
        fields.update(node.__dict__)
        if t.hostname >= 0:
            fields["hostname"] = _value(values[t.hostname])
        fields["numa_nodes"] = numa_nodes
        fields["gpus"] = tuple(gpus)
        if t.memory >= 0:
            fields["memory_bytes"] = _value(values[t.memory])
        if t.phys >= 0:
            fields["phys_memory_bytes"] = _value(values[t.phys])
        return new

    def _make_template(self, key: str, values: list[str], node: Any) -> _Template | None:
        """The template for *key*, or None when its cut-out values do not all land where _fill puts them."""
        try:
            d = json.loads(key)
        except (json.JSONDecodeError, RecursionError):
            return None
        found: list[int] = []

        def take(obj: dict[str, Any], field: str, placeholder: Any) -> int:
            v = obj.get(field)
            if isinstance(v, str) and v[:1] == "\x00":
                obj[field] = placeholder
                found.append(int(v[1:]))
                return found[-1]
            return -1

        if not isinstance(d, dict) or not isinstance(d.get("gpus"), list) or \
                not all(isinstance(g, dict) and isinstance(g.get("mig_instances", []), list) and
                        all(isinstance(m, dict) for m in g.get("mig_instances", [])) for g in d["gpus"]) or \
                not isinstance(d.get("numa_nodes"), list) or not all(isinstance(n, dict) for n in d["numa_nodes"]):
            return None
        hostname = take(d, "hostname", "")
        memory = take(d, "memory_bytes", 0)
        phys = take(d, "phys_memory_bytes", None)
        numa = tuple(take(n, "memory_bytes", 0) for n in d["numa_nodes"])
        numa = numa if any(i >= 0 for i in numa) else ()
        gpus = tuple((take(g, "uuid", None), take(g, "fabric", None),
                      tuple(take(m, "uuid", "") for m in g.get("mig_instances", [])))
                     for g in d["gpus"])
        gpus = tuple((u, f, migs if any(i >= 0 for i in migs) else ()) for u, f, migs in gpus)
        # Every value cut out must be one of these fields, once: otherwise a
        # node of this key could differ somewhere _fill does not look.
        if sorted(found) != list(range(len(values))):
            return None
        try:
            pieces = []
            rest = key
            for i in range(len(values)):
                before, _, rest = rest.partition(self._sentinels[i])
                pieces.append(before)
            pieces.append(rest)
            if "".join(p + s for p, s in zip(pieces, self._sentinels[:len(values)])) + rest != key:
                return None
            t = _Template(Node.from_dict(d), hostname, memory, numa, gpus, tuple(pieces), phys)
            filled = self._fill(t, values)
            ok = filled == node
            t = dataclasses.replace(t, node=filled)   # real values where the placeholders were
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, RecursionError):
            return None
        return t if ok else None

    def fast_node(self, path: str) -> Any:
        """The derived model read from the file's tail, or None when that is not possible."""
        from . import snapshot as snap

        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            head = os.pread(fd, _HEAD, 0)
            m = _SCHEMA_RE.search(head)
            if m is None or m.group(1).decode() != snap.SCHEMA:
                return None
            size = os.fstat(fd).st_size
            # The last model's size, with room to spare, rather than _TAIL:
            # fewer pages copied per file.  The smaller tail is the end of the
            # larger one, so the last "node": found in it is the same one; when
            # it holds none, the larger tail is read as before.
            want = self._tail_hint
            start = max(0, size - want)
            tail = os.pread(fd, size - start, start)
            at = tail.rfind(_NODE_KEY)
            if at < 0 and start > 0 and want < _TAIL:
                start = max(0, size - _TAIL)
                tail = os.pread(fd, size - start, start)
                at = tail.rfind(_NODE_KEY)
            if at < 0 and start > 0:  # a large node model (hundreds of cores): read it all
                tail = _read_all(fd)
                at = tail.rfind(_NODE_KEY)
        finally:
            os.close(fd)
        if at < 0:
            return None
        body = _object_body(tail, at + len(_NODE_KEY))
        if body is None:
            return None
        self._tail_hint = min(_TAIL, (len(tail) - at) * 5 // 4 + 512)
        try:
            node = self.node_from_text(body)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, RecursionError):
            return None
        return _with_sources(node, (f"snapshot:{path}",))


_MISSING: Any = object()
_TRIAL = 64
# _fill makes each Gpu and Node as a copy of its template's __dict__ with
# the node's own values put in, not through the class: a frozen dataclass's
# __init__ sets every field with object.__setattr__, ~1.2 us for a Gpu's 14
# fields, about 1 s for the 800,000 GPUs of 100,000 nodes; the copy takes a
# third of that.  The model classes have no __post_init__ and no slots
# (tests/unit/hw/test_snapshot_bulk.py checks both), so the object is the one
# __init__ would make.
_new = object.__new__


def _with_sources(node: Any, sources: tuple[str, ...]) -> Any:
    """``dataclasses.replace(node, sources=sources)``, made the way _fill makes nodes."""
    new = _new(type(node))
    fields = new.__dict__
    fields.update(node.__dict__)
    fields["sources"] = sources
    return new


# What str.strip() removes among ASCII characters; any other byte ends the
# strip here (see _object_body).
_STRIP = frozenset(b" \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f")


def _object_body(tail: bytes, start: int) -> str | None:
    """The text of the object from *start* to the end of *tail*, less its closing brace.

    What ``tail[start:].decode().strip()``, a check that it is ``{...}``,
    and ``[:-1].rstrip()`` give (None when it is no object), decoding only
    that slice (a node's model is ~17 KB: four copies of it cost ~5 us).
    A non-ASCII byte next to what would be stripped (Unicode spaces that
    str.strip also removes) takes the plain way.
    """
    end = len(tail)
    while start < end and tail[start] in _STRIP:
        start += 1
    while end > start and tail[end - 1] in _STRIP:
        end -= 1
    if end - start < 2 or tail[start] != 0x7B or tail[end - 1] != 0x7D:     # '{' ... '}'
        if start < end and (tail[start] >= 0x80 or tail[end - 1] >= 0x80):
            return _object_body_plain(tail, start)
        tail[start:end].decode("utf-8", "strict")       # a decode error is an error either way
        return None
    end -= 1
    while end > start and tail[end - 1] in _STRIP:
        end -= 1
    if tail[end - 1] >= 0x80:
        return _object_body_plain(tail, start)
    return str(memoryview(tail)[start:end], "utf-8", "strict")


def _object_body_plain(tail: bytes, start: int) -> str | None:
    text = tail[start:].decode("utf-8", "strict").strip()
    if not text.endswith("}") or not text.startswith("{"):
        return None
    return text[:-1].rstrip()


def _decode(text: str) -> Any:
    return Node.from_dict(json.loads(text))


def _read_all(fd: int) -> bytes:
    chunks = []
    pos = 0
    while chunk := os.pread(fd, 1 << 20, pos):
        chunks.append(chunk)
        pos += len(chunk)
    return b"".join(chunks)


def _fast_node(path: str, loader: SnapshotLoader | None = None) -> Any:
    return (loader or SnapshotLoader()).fast_node(path)


def load_snapshot_node(path: str, loader: SnapshotLoader | None = None) -> Any:
    """A node from a snapshot file: the derived model when usable, else replay of the raw answers."""
    from . import snapshot as snap

    try:
        node = _fast_node(path, loader)
    except OSError as e:
        raise unreadable(e, "snapshot", path) from None
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
