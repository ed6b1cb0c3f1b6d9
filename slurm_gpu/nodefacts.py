"""The node's facts, read once and kept for every job step and prolog: the one node-fact cache.

Reading the node model (hwloc topology + NVML) costs ~100 ms and reading
the config means parsing TOML: far too slow to repeat in every slurmstepd
and every prolog.  GPUs, their order in gres.conf and their CPU locality do
not change while the machine is up and its files stay as they are.  So the
first caller builds one entry from **one** model read and stores it; later
callers (the SPANK step, the prolog) reuse it.

One file per (node, config file, gres.conf) under :data:`CACHE_DIR`, one
format (``marshal``: no import cost on the step path), one invalidation rule:
the entry holds while the **boot id** and every **input that can change**
(the config files, the ``[node]`` snapshot and simulator state, gres.conf:
mtime, size and inode) are what they were when it was built.  The inputs are
stamped *before* they are read, so an edit racing with a build leaves a stale
stamp (a rebuild next time), never old values under a new stamp.

The file is read as root in slurmstepd on every step, so it is trusted only
when root wrote it: a directory that is root's, not group/other-writable and
not a symlink; a regular file in it that is root's and not group/other
writable, opened without following a symlink or blocking on a FIFO.  Anything
else (garbage, another format, another key, a foreign owner) is a miss: the
caller rebuilds, never trusts it and never fails on it.

What is stored (plain data)::

    {"key", "boot_id", "stamps", "state_dir",
     "gpus": None | [entry | None, ...],   # Slurm's GPU index order; None: a
                                            # gres.conf device NVML does not have
     "sections": {name: {...}}}            # a caller's own settings (SPANK's)

with each GPU entry ``{"index" (NVML), "minor", "uuid", "name", "cpus",
"mems", "cpus_via"}``: ``cpus`` are the PUs of the GPU's local cores, else of
its NUMA nodes (``cpus_via`` says which: "cores", "numa" or ""), ``mems`` its
NUMA nodes' OS indices.  Each caller takes what it needs:
:func:`for_binding` (SPANK) and :func:`for_prolog` (MPS pinning, job state).

This module is imported in every bound job step: builtins only at import;
reading the config and the model happens in :func:`get` on a miss.
"""
from __future__ import annotations

import marshal
# posix, not os: importing os (its environ mapping pulls in
# _collections_abc) is ~1 ms of every bound step, which reads the cache
# through load() only.  The paths that build or write an entry import os.
import posix
import stat

from . import __version__
from .procfs import boot_id

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping, Sequence

CACHE_DIR = "/run/slurm-gpu/node-facts"
FORMAT = 1


# Slurm's built-in slurm.conf (Debian's and EL's packages), and the link a
# configless slurmd (--conf-server) makes to its SlurmdSpoolDir/conf-cache.
SLURM_CONF_DEFAULT = "/etc/slurm/slurm.conf"
SLURM_CONF_CONFIGLESS = "/run/slurm/conf/slurm.conf"


def slurm_conf_path(env: Mapping[str, str]) -> str:
    """slurm.conf as Slurm's own commands find it.

    ``$SLURM_CONF``, else the built-in path when it exists, else
    ``/run/slurm/conf/slurm.conf`` when it exists (src/common/read_config.c,
    _establish_config_source, 22.05 to 26.05).  slurmd exports SLURM_CONF
    to the prolog, epilog and slurmstepd, but not to HealthCheckProgram
    (slurmd.c: run_script_health_check) nor to an admin's shell: there, on
    a configless node, only the /run link finds it.
    """
    conf = env.get("SLURM_CONF")
    if conf:
        return conf
    for p in (SLURM_CONF_DEFAULT, SLURM_CONF_CONFIGLESS):
        try:
            posix.stat(p)
        except (OSError, ValueError):
            continue
        return p
    return SLURM_CONF_DEFAULT


def gres_conf_path(env: Mapping[str, str]) -> str | None:
    """gres.conf beside ``$SLURM_CONF`` (slurmd exports it) or the configless
    cache's slurm.conf, else the usual places."""
    conf = env.get("SLURM_CONF")
    if not conf and slurm_conf_path(env) == SLURM_CONF_CONFIGLESS:
        conf = SLURM_CONF_CONFIGLESS
    if conf:
        return _join(_dirname(conf), "gres.conf")
    for p in ("/etc/slurm/gres.conf", "/etc/slurm-llnl/gres.conf"):
        try:
            posix.stat(p)
        except (OSError, ValueError):
            continue
        return p
    return None


def _dirname(path: str) -> str:
    """``os.path.dirname`` (POSIX), without importing os."""
    head = path[:path.rfind("/") + 1]
    if head and head != "/" * len(head):
        head = head.rstrip("/")
    return head


def _join(head: str, name: str) -> str:
    """``os.path.join(head, name)`` for a relative *name*, without importing os."""
    return f"{head}{name}" if not head or head.endswith("/") else f"{head}/{name}"


# -- the file ------------------------------------------------------------------------

def stamp(path: str | None) -> tuple[Any, ...] | None:
    """What an entry records of one input: ``(path, mtime_ns, size, inode)``
    (``stat()`` following links), ``(path, None)`` when it does not exist,
    None for no path.  The binding table carries these too, and the C half
    re-checks them the same way (spank/sg_bind.c, stamp_holds)."""
    if not path:
        return None
    try:
        st = posix.stat(path)
    except OSError:
        return (path, None)
    return (path, st.st_mtime_ns, st.st_size, st.st_ino)


def _private(st: posix.stat_result) -> bool:
    return st.st_uid == posix.geteuid() and not st.st_mode & 0o022


def _open_dir(cache_dir: str, *, create: bool) -> int | None:
    """An fd of the cache directory if only we can write it, else None.

    The directory itself must not be a symlink (O_NOFOLLOW) and must be ours
    and not group/other-writable: root writes and trusts what is in it.
    Every later access is relative to this fd, so the checked directory is
    the one used.
    """
    if create:
        import os
        parent = os.path.dirname(cache_dir.rstrip("/"))
        os.makedirs(parent, mode=0o755, exist_ok=True)
        try:
            os.mkdir(cache_dir, 0o700)
        except FileExistsError:
            pass
    fd = posix.open(cache_dir, posix.O_RDONLY | posix.O_DIRECTORY | posix.O_NOFOLLOW
                    | posix.O_CLOEXEC)
    if not _private(posix.fstat(fd)):
        posix.close(fd)
        return None
    return fd


def _key(config_path: str | None, node: str, gres_conf: str | None) -> str:
    # spank/sg_cbind.c builds the same key (and cache_file's name) for
    # the binding table: keep the two in step
    return f"{__version__}:{FORMAT}:{node}:{config_path or ''}:{gres_conf or ''}"


key = _key                  # the entry's key, for the binding table (spank.bindtable)
open_private_dir = _open_dir


def cache_file(config_path: str | None, node: str, gres_conf: str | None,
               cache_dir: str | None = None) -> str:
    import zlib
    # the node name only makes the file recognisable; the crc tells entries apart
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in node)
    crc = zlib.crc32(_key(config_path, node, gres_conf).encode())
    return _join(cache_dir or CACHE_DIR, f"{safe}-{crc:08x}")


def load(config_path: str | None, node: str, gres_conf: str | None,
         cache_dir: str | None = None) -> dict[str, Any] | None:
    """The stored entry, or None when missing, stale or not trustworthy."""
    path = cache_file(config_path, node, gres_conf, cache_dir)
    dfd = fd = None
    try:
        dfd = _open_dir(_dirname(path), create=False)
        if dfd is None:
            return None
        # O_NOFOLLOW: never a symlink; O_NONBLOCK: a FIFO must not hang
        # slurmstepd.  Only a regular file that we (root) wrote: marshal is
        # not meant for data others could have planted.
        fd = posix.open(path[path.rfind("/") + 1:],
                        posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_NONBLOCK | posix.O_CLOEXEC,
                        dir_fd=dfd)
        st = posix.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) and _private(st)):
            return None
        with open(fd, "rb") as f:
            fd = None
            data = marshal.load(f)
    except (OSError, EOFError, ValueError, TypeError):
        return None
    finally:
        for d in (fd, dfd):
            if d is not None:
                posix.close(d)
    return data if _valid(data, _key(config_path, node, gres_conf)) else None


def _valid(data: Any, key: str) -> bool:
    """The entry is ours, of this format and boot, and no input changed since."""
    if not (isinstance(data, dict) and data.get("key") == key and isinstance(data.get("sections"), dict)
            and isinstance(data.get("stamps"), tuple) and "gpus" in data):
        return False
    now = boot_id()
    if not now or data.get("boot_id") != now:
        return False                    # an unknown boot id could be any boot
    for st in data["stamps"]:
        if not (isinstance(st, tuple) and st and stamp(st[0]) == st):
            return False
    return True


def store(data: dict[str, Any], config_path: str | None, node: str, gres_conf: str | None,
          cache_dir: str | None = None) -> None:
    """Write the entry atomically; a failure only costs the next caller time."""
    import os

    from .fsutil import atomic_write_at
    path = cache_file(config_path, node, gres_conf, cache_dir)
    dfd = None
    try:
        dfd = _open_dir(os.path.dirname(path), create=True)
        if dfd is None:
            return                          # not ours alone: never write there
        # durable=False: /run is tmpfs, and a lost write costs one rebuild
        atomic_write_at(dfd, os.path.basename(path), marshal.dumps(data), mode=0o600, durable=False)
    except (OSError, ValueError):
        pass
    finally:
        if dfd is not None:
            os.close(dfd)


# -- building an entry (the slow path) ------------------------------------------------

def _inputs(config_path: str | None, gres_conf: str | None) -> tuple[tuple[Any, ...], str]:
    """(stamps of every input that can change, the state directory).

    Stamped before anything is read: see the module docstring.  Every place
    :func:`slurm_gpu.config.config_path` looks counts (a config may appear).
    """
    import os
    import sys

    from . import config
    from .hw import live
    candidates = [config_path, str(config.config_path() or ""), "/etc/slurm-gpu/slurm-gpu.toml",
                  os.path.join(sys.prefix, "etc", "slurm-gpu", "slurm-gpu.toml")]
    stamps = [stamp(p) for p in dict.fromkeys(candidates)]
    n = live.settings()
    stamps += [stamp(n.snapshot or None), stamp(n.nvml_plugin[1] if n.nvml_plugin else None), stamp(gres_conf)]
    return tuple(st for st in stamps if st is not None), n.state_dir


def gpu_facts(model: Any, slurm_minors: Sequence[int | None] | None) -> list[dict[str, Any] | None]:
    """Each GPU's identity and locality, in Slurm's GRES index order.

    *slurm_minors* is that order as device minors (from gres.conf, see
    :mod:`slurm_gpu.confgen.gresorder`); None: NVML's order, which is what
    Slurm uses with AutoDetect.  A minor that names no GPU of the model
    (gres.conf lists a device NVML does not have) is a None entry, so every
    later GPU keeps its Slurm index.  Pure.
    """
    numa = {n.index: n for n in model.numa_nodes}
    pus_of = {c.index: c.pus for c in model.cores}
    by_minor = {int(g.minor if g.minor is not None else g.index): g for g in model.gpus}
    if slurm_minors is None:
        slurm_minors = [int(g.minor if g.minor is not None else g.index)
                        for g in sorted(model.gpus, key=lambda g: g.index)]
    out: list[dict[str, Any] | None] = []
    for minor in slurm_minors:
        g = by_minor.get(minor) if minor is not None else None     # None: a MIG slice
        if g is None:
            out.append(None)
            continue
        cpus = tuple(sorted({pu for c in g.cores for pu in pus_of.get(c, ())}))
        via = "cores" if cpus else ""
        if not cpus:
            cpus = tuple(sorted({p for i in g.numa_nodes if i in numa for p in numa[i].pus}))
            via = "numa" if cpus else ""
        f = getattr(g, "fabric", None)
        out.append({"index": g.index, "minor": g.minor, "uuid": g.uuid, "name": g.name,
                    "cpus": cpus, "mems": tuple(sorted({numa[i].os_index for i in g.numa_nodes
                                                        if i in numa})),
                    "cpus_via": via,
                    # the IMEX prolog's own NVLink domain (imex.domain.fabric_domain)
                    "fabric": {"cluster_uuid": f.cluster_uuid, "clique_id": f.clique_id,
                               "state": f.state, "status": f.status} if f else None})
    return out


def _read_gpus(read_node: Callable[[], Any], gres_conf: str | None, node: str) -> list[Any]:
    from .confgen.gresorder import node_minors, read_conf
    model = read_node()
    return gpu_facts(model, node_minors(model.gpus, read_conf(gres_conf, node)))


def build(config_path: str | None, node: str, gres_conf: str | None, *, with_gpus: bool,
          sections: Mapping[str, Callable[[], dict[str, Any]]] | None = None,
          read_node: Callable[[], Any] | None = None,
          old: dict[str, Any] | None = None) -> dict[str, Any]:
    """A fresh entry; the parts of *old* (a valid entry) are kept when no input changed."""
    stamps, state_dir = _inputs(config_path, gres_conf)
    data: dict[str, Any] = {"key": _key(config_path, node, gres_conf), "boot_id": boot_id(),
                            "stamps": stamps, "state_dir": state_dir, "gpus": None, "sections": {}}
    if old is not None and old.get("stamps") == stamps and old.get("boot_id") == data["boot_id"]:
        data["gpus"] = old["gpus"]
        data["sections"] = dict(old["sections"])
    for name, make in (sections or {}).items():
        if name not in data["sections"]:
            data["sections"][name] = make()
    if with_gpus and data["gpus"] is None:
        if read_node is None:
            from .hw import load_node as read_node
        data["gpus"] = _read_gpus(read_node, gres_conf, node)
    return data


def get(config_path: str | None, node: str, gres_conf: str | None, *, with_gpus: bool,
        sections: Mapping[str, Callable[[], dict[str, Any]]] | None = None,
        read_node: Callable[[], Any] | None = None, cache_dir: str | None = None) -> dict[str, Any]:
    """This node's entry: from the cache, else built (only what is missing) and stored.

    *sections*: the caller's own settings, by name, and how to read them;
    *read_node*: how to read the model (default :func:`slurm_gpu.hw.load_node`).
    """
    data = load(config_path, node, gres_conf, cache_dir)
    if data is not None and (data["gpus"] is not None or not with_gpus) \
            and all(name in data["sections"] for name in (sections or ())):
        return data
    data = build(config_path, node, gres_conf, with_gpus=with_gpus, sections=sections,
                 read_node=read_node, old=data)
    if data["boot_id"]:
        store(data, config_path, node, gres_conf, cache_dir)
    return data


# -- what each caller takes ------------------------------------------------------------

def for_binding(gpus: Sequence[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """The SPANK binding's locality table (:mod:`slurm_gpu.binding`): CPUs with the
    NUMA fallback, and mems, at Slurm's GPU index.  A gres.conf device NVML does
    not have stays in its place as ``{"missing": index}``: the binding refuses it,
    and every later GPU keeps its index.  Builtins only: called in every bound step."""
    return [{"index": None, "minor": None, "uuid": None, "cpus": (), "mems": (), "missing": k}
            if g is None else
            {"index": g["index"], "minor": g["minor"], "uuid": g["uuid"], "cpus": g["cpus"],
             "mems": g["mems"]} for k, g in enumerate(gpus)]


def for_prolog(gpus: Sequence[dict[str, Any] | None]) -> dict[int, dict[str, Any]]:
    """{Slurm GPU index: {"minor", "uuid", "name", "cpus"}} for the prolog.

    ``cpus`` (what the MPS daemon is pinned to) are the local
    cores' PUs only: a GPU whose locality has no core gets none, as before the
    caches were merged (see CHANGELOG).  A gres.conf device NVML does not have
    is absent: the prolog refuses it as a node fault.
    """
    out: dict[int, dict[str, Any]] = {}
    for k, g in enumerate(gpus):
        if g is None:
            continue
        minor = g["minor"] if g["minor"] is not None else g["index"]
        out[k] = {"minor": int(minor), "uuid": g["uuid"], "name": g["name"],
                  "cpus": list(g["cpus"]) if g["cpus_via"] == "cores" else []}
    return out
