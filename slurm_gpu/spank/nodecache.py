"""What every job step needs from this node, cached between steps.

A bound step needs the ``[spank]`` and ``[node]`` settings and each GPU's
locality.  Reading them means parsing TOML and loading the node model (on a
real node: hwloc plus NVML), far too slow to repeat in every slurmstepd.  The
first step that needs them builds them and stores the plain result with
``marshal`` (no import cost) under :data:`CACHE_DIR`; later steps reuse it
while the boot id and the config, snapshot and simulator files are unchanged
(same mtime, size and inode).  A step that cannot read or write the cache
just does the slow path.
"""
from __future__ import annotations

import marshal
import os
import stat

from .. import __version__
from ..procfs import boot_id

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CACHE_DIR = "/run/slurm-gpu/spank-cache"
NVML_DEADLINE = 10.0      # seconds a cache miss may spend reading NVML/hwloc in slurmstepd
FORMAT = 1


def _stamp(path: str | None) -> tuple[Any, ...] | None:
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return (path, None)
    return (path, st.st_mtime_ns, st.st_size, st.st_ino)


def _private(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _open_dir(cache_dir: str, *, create: bool) -> int | None:
    """An fd of the cache directory if only we can write it, else None.

    The directory itself must not be a symlink (O_NOFOLLOW) and must be ours
    and not group/other-writable: root writes and trusts what is in it.
    Every later access is relative to this fd, so the checked directory is
    the one used.
    """
    if create:
        parent = os.path.dirname(cache_dir.rstrip("/"))
        os.makedirs(parent, mode=0o755, exist_ok=True)
        try:
            os.mkdir(cache_dir, 0o700)
        except FileExistsError:
            pass
    fd = os.open(cache_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not _private(st):
        os.close(fd)
        return None
    return fd


def _key(config_path: str | None, node: str) -> str:
    return f"{__version__}:{FORMAT}:{node}:{config_path or ''}"


def cache_file(config_path: str | None, node: str, cache_dir: str | None = None) -> str:
    import zlib
    # the node name only makes the file recognisable; the crc tells nodes apart
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in node)
    return os.path.join(cache_dir or CACHE_DIR,
                        f"{safe}-{zlib.crc32(_key(config_path, node).encode()):08x}")


def load(config_path: str | None, node: str, cache_dir: str | None = None) -> dict[str, Any] | None:
    """The cached facts, or None when missing, stale or not trustworthy."""
    path = cache_file(config_path, node, cache_dir)
    dfd = fd = None
    try:
        dfd = _open_dir(os.path.dirname(path), create=False)
        if dfd is None:
            return None
        # O_NOFOLLOW: never a symlink; O_NONBLOCK: a FIFO must not hang
        # slurmstepd.  Only a regular file that we (root) wrote: marshal is
        # not meant for data others could have planted.
        fd = os.open(os.path.basename(path),
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) and _private(st)):
            return None
        with os.fdopen(fd, "rb") as f:
            fd = None
            data = marshal.load(f)
    except (OSError, EOFError, ValueError, TypeError):
        return None
    finally:
        for d in (fd, dfd):
            if d is not None:
                os.close(d)
    if not isinstance(data, dict) or data.get("key") != _key(config_path, node):
        return None
    if data.get("boot_id") != boot_id():
        return None
    for stamp in data.get("stamps", ()):
        if _stamp(stamp[0]) != stamp:
            return None
    return data


def build(config_path: str | None, node: str, *, with_gpus: bool) -> dict[str, Any]:
    """Read settings (and, with *with_gpus*, the node model): the slow path."""
    import sys

    from .. import config
    from ..hw import live
    from . import settings as spank_settings
    # stamp before reading, so an edit racing with this build makes the
    # entry stale instead of storing old values under the new stamp;
    # every place config.config_path() looks counts (a config may appear)
    candidates = [config_path, str(config.config_path() or ""), "/etc/slurm-gpu/slurm-gpu.toml",
                  os.path.join(sys.prefix, "etc", "slurm-gpu", "slurm-gpu.toml")]
    stamps = [_stamp(p) for p in dict.fromkeys(candidates)]
    s = spank_settings.load()
    n = live.settings()
    from ..confgen.gresorder import gres_conf_path
    gres_conf = gres_conf_path(os.environ)
    stamps += [_stamp(n.snapshot or None), _stamp(n.sim_state), _stamp(gres_conf)]
    data: dict[str, Any] = {
        "key": _key(config_path, node),
        "boot_id": boot_id(),
        "stamps": tuple(st for st in stamps if st is not None),
        "memlock": s.memlock_bytes(),
        "allocator_preload": s.allocator_preload,
        "allocator_env": {str(k): str(v) for k, v in s.allocator_env.items()},
        "numa_map": s.numa_map(),
        "state_dir": n.state_dir,
        "gpus": None,
    }
    if with_gpus:
        from .. import binding
        from ..confgen.gresorder import node_minors, read_conf
        from ..hw import load_node
        from ..hw.deadline import bounded
        # slurmstepd has no watchdog over us: a hung NVML read would hang the step.
        model = bounded(load_node, NVML_DEADLINE, "reading the node model (NVML, hwloc)")
        data["gpus"] = binding.locality(model, node_minors(model.gpus, read_conf(gres_conf, node)))
    return data


def store(data: dict[str, Any], config_path: str | None, node: str,
          cache_dir: str | None = None) -> None:
    """Write the cache atomically; failures only cost the next step time."""
    path = cache_file(config_path, node, cache_dir)
    name = os.path.basename(path)
    tmp = f".{name}.{os.getpid()}.tmp"
    dfd = None
    try:
        dfd = _open_dir(os.path.dirname(path), create=True)
        if dfd is None:
            return                          # not ours alone: never write there
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dfd)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(fd, 0o600)
            marshal.dump(data, f)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except (OSError, ValueError):
        if dfd is not None:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
    finally:
        if dfd is not None:
            os.close(dfd)


def get(config_path: str | None, node: str, *, with_gpus: bool,
        cache_dir: str | None = None) -> dict[str, Any]:
    """Cached facts for this node; rebuilt (and stored) when stale or incomplete."""
    data = load(config_path, node, cache_dir)
    if data is not None and (data["gpus"] is not None or not with_gpus):
        return data
    data = build(config_path, node, with_gpus=with_gpus)
    store(data, config_path, node, cache_dir)
    return data
