"""The binding table: what the plugin's C half needs to bind a plain step without Python.

A step whose only work is ``--gpu-numa-bind=prefer`` spends ~8 ms starting
an interpreter in slurmstepd before it binds anything (docs/development.md,
"Where the time goes").  So beside the node-fact cache entry
(:mod:`slurm_gpu.nodefacts`) the Python path keeps a small text file that
the outer C half (``spank/sg_bind.c``) reads instead: the entry's key, boot
id and input stamps (the C half re-checks every one, as
:func:`slurm_gpu.nodefacts.load` does), the ``[spank] numa_node_map``, and
one line per Slurm GPU index with what :func:`slurm_gpu.nodefacts.for_binding`
gives the planner: the rows :func:`slurm_gpu.binding.rows` writes, which the
Python path hands the same planner (sg_bind.c) for every other step.  The C
half applies the plan as :mod:`slurm_gpu.spank.remote` does; a table it does
not take sends the step to Python, which rewrites the table when it differs
from the entry.

Format (ASCII, one record a line, every field checked by the reader)::

    slurm-gpu bind 1
    key <nodefacts key>
    boot <boot id>
    stamp <mtime_ns> <size> <ino> <path>    # or "stamp - - - <path>": absent
    map <model node> <host node>            # [spank] numa_node_map
    gpu <nvml index> <uuid or -> <cpus or -> <mems or ->
    missing                                 # a gres.conf GPU NVML lacks
    end

Imported only on the Python path of a bound step (builtins only).
"""
from __future__ import annotations

import posix

from .. import binding, nodefacts

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SUFFIX = ".bind"
HEADER = "slurm-gpu bind 1"
MAX_BYTES = 65536          # the C reader's limit; a bigger table is not written


def path(config_path: str | None, node: str, gres_conf: str | None,
         cache_dir: str | None = None) -> str:
    """The table beside the entry it was made from (the C half names it the same way)."""
    return nodefacts.cache_file(config_path, node, gres_conf, cache_dir) + SUFFIX


def _plain(text: str) -> bool:
    """Printable ASCII and not empty: a field the C reader takes as it is."""
    return bool(text) and text.isascii() and text.isprintable()


def render(data: dict[str, Any], numa_map: dict[int, int], key: str) -> bytes | None:
    """The table for a valid entry *data* with GPUs, or None when C cannot take it
    (a field it would misread): then every step keeps the Python path."""
    gpus = data.get("gpus")
    if gpus is None or not _plain(data.get("boot_id") or "") or not _plain(key):
        return None
    lines = [HEADER, f"key {key}", f"boot {data['boot_id']}"]
    for st in data["stamps"]:
        if not _plain(st[0]) or st[0] != st[0].strip():
            return None
        if len(st) == 2 and st[1] is None:
            lines.append(f"stamp - - - {st[0]}")
        elif len(st) == 4 and all(isinstance(v, int) and v >= 0 for v in st[1:]):
            lines.append(f"stamp {st[1]} {st[2]} {st[3]} {st[0]}")
        else:
            return None
    rows = binding.rows(nodefacts.for_binding(gpus), numa_map)
    if rows is None:
        return None
    lines += rows
    lines.append("end")
    out = ("\n".join(lines) + "\n").encode()
    return out if len(out) <= MAX_BYTES else None


def keep(data: dict[str, Any], numa_map: dict[int, int] | None, config_path: str | None,
         node: str, gres_conf: str | None, cache_dir: str | None = None) -> None:
    """Write the table of *data* unless the one there already says the same.

    Called on the Python path only (the C path never gets here), so the
    read and compare cost the steps that need it.  Same directory
    discipline as the entry: written only into a directory that root alone
    can write, atomically, 0600; a failure costs later steps their speed
    only, never this step its binding.  *numa_map* None (an entry without
    it): no table, and an older one is removed.
    """
    try:
        want = None if numa_map is None else render(data, numa_map,
                                                     nodefacts.key(config_path, node, gres_conf))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        want = None                     # an entry of another shape: Python binds every step
    target = path(config_path, node, gres_conf, cache_dir)
    name = target[target.rfind("/") + 1:]
    dfd = None
    try:
        # the entry's store made the directory; a warm step imports no os
        dfd = nodefacts.open_private_dir(target[:target.rfind("/")], create=False)
        if dfd is None:
            return
        if _current(dfd, name) == want:
            return
        if want is None:
            posix.unlink(name, dir_fd=dfd)      # C must not read an older one
            return
        from ..fsutil import atomic_write_at
        atomic_write_at(dfd, name, want, mode=0o600, durable=False)
    except (OSError, ValueError):
        pass
    finally:
        if dfd is not None:
            posix.close(dfd)


def _current(dfd: int, name: str) -> bytes | None:
    try:
        fd = posix.open(name, posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_NONBLOCK
                        | posix.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    try:
        return posix.read(fd, MAX_BYTES + 1)
    finally:
        posix.close(fd)
