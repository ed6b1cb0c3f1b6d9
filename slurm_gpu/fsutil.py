"""Atomic file writes: nothing is ever half-written.

A reader (slurmd, the epilog, an admin) sees either the old file or the new
one.  The temporary file lives in the same directory so ``os.replace`` is a
rename on one filesystem; it is fsynced before the rename so a crash cannot
leave an empty file behind, and the directory is fsynced after it so the
rename itself survives a crash.

:func:`replace_config` is the one way to rewrite a Slurm config file
(``gres``/``topology apply``, ``health --isolate-bad-gpu``, ``mig apply``).
"""
from __future__ import annotations

import errno
import os
import tempfile

from .errors import SlurmGpuError
from .ownedfile import read_owned


class WriteError(SlurmGpuError):
    """A file could not be written; ``errno`` says why (ENOSPC: a full filesystem)."""

    def __init__(self, what: str, where: str | None, err: int | None) -> None:
        super().__init__(what, where)
        self.errno = err


def atomic_write(path: str | os.PathLike[str], data: str | bytes, *, mode: int = 0o644,
                 uid: int | None = None, gid: int | None = None, durable: bool = True) -> None:
    """Write *data* to *path* atomically with permissions *mode*.

    ``durable=False`` skips both fsyncs (file and directory): readers still
    never see half a file, but a crash may leave the old content.  For files rewritten every few
    seconds (the sampler's aggregates, metrics), where one lost rewrite
    costs nothing and an fsync each time costs disk flushes.
    """
    path = os.fspath(path)
    name, parent = os.path.basename(path), os.path.dirname(path) or "."
    raw = data.encode() if isinstance(data, str) else data
    try:
        # exclusive, 0600, never through an existing file or symlink
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=parent)
    except OSError as e:
        raise WriteError(f"cannot write {name}: {e.strerror}", path, e.errno) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fchmod(f.fileno(), mode)
            if uid is not None or gid is not None:
                os.fchown(f.fileno(), -1 if uid is None else uid, -1 if gid is None else gid)
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            _fsync_dir(parent)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError):
            raise WriteError(f"cannot write {name}: {e.strerror}", path, e.errno) from None
        raise


def atomic_write_at(dir_fd: int, name: str, data: bytes, *, mode: int = 0o600,
                    durable: bool = True) -> None:
    """Write *data* to *name* in the directory open as *dir_fd*, atomically.

    For a directory the caller has checked (owner, mode, not a symlink) and
    holds open: every step is relative to that fd, so a path swapped after
    the check cannot redirect the write.  The temporary file is created
    exclusively (never an existing file or symlink) and removed on failure.
    Raises OSError.
    """
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)       # not narrowed or widened by the umask
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        if durable:
            try:
                os.fsync(dir_fd)
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
                    raise
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def read_trusted(path: str | os.PathLike[str], limit: int) -> bytes | None:
    """The first *limit* bytes of *path* when it is a regular file that root or
    this process's user owns and nobody else may write; else None.

    Never follows a symlink and never blocks on a FIFO: for files in shared
    directories (the accounting store, the cluster publish directory) that a
    user or another node could have planted or replaced.
    """
    try:
        return read_owned(path, limit, (0, os.geteuid()), others_may_write=False)
    except OSError:
        return None


def _fsync_dir(d: str) -> None:
    """Make a rename in *d* durable (a crash after it must not bring the old file back)."""
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return                      # a directory we cannot open (no read permission): the rename stands
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):  # filesystems without directory fsync
            raise
    finally:
        os.close(fd)


def replace_config(path: str | os.PathLike[str], text: str, *, backup: str | None = ".bak",
                   keep_first_backup: bool = False) -> str:
    """Atomically replace a config file other programs read; return the path written.

    * follows a symlink (``/etc/slurm/gres.conf`` -> a managed copy) and
      writes its target, instead of replacing the link with a plain file;
    * keeps the file's mode and owner (Slurm config files are often
      ``0640 root:slurm``);
    * first copies the previous content to ``<target><backup>`` with the same
      mode and owner (with *keep_first_backup*, an existing backup is kept:
      it holds the original, before any of our rewrites).
    """
    target = os.path.realpath(path)
    try:
        with open(target, "rb") as f:
            st = os.fstat(f.fileno())
            old: bytes | None = f.read()
        mode, uid, gid = st.st_mode & 0o7777, st.st_uid, st.st_gid
    except FileNotFoundError:
        old, mode, uid, gid = None, 0o644, None, None
    except OSError as e:
        raise SlurmGpuError(f"cannot read {os.path.basename(target)}: {e.strerror}", target) from None
    if old is not None and backup:
        bpath = target + backup
        if not (keep_first_backup and os.path.lexists(bpath)):
            atomic_write(bpath, old, mode=mode, uid=uid, gid=gid)
    atomic_write(target, text, mode=mode, uid=uid, gid=gid)
    return target
