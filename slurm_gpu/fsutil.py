"""Atomic file writes: nothing is ever half-written.

A reader (slurmd, the epilog, an admin) sees either the old file or the new
one.  The temporary file lives in the same directory so ``os.replace`` is a
rename on one filesystem, and it is fsynced before the rename so a crash
cannot leave an empty file behind.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import SlurmGpuError


def atomic_write(path: str | os.PathLike[str], data: str | bytes, *, mode: int = 0o644,
                 uid: int | None = None, gid: int | None = None) -> None:
    """Write *data* to *path* atomically with permissions *mode*."""
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise SlurmGpuError(f"cannot write {path.name}: {e.strerror}", str(path)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fchmod(f.fileno(), mode)
            if uid is not None or gid is not None:
                os.fchown(f.fileno(), -1 if uid is None else uid, -1 if gid is None else gid)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError):
            raise SlurmGpuError(f"cannot write {path.name}: {e.strerror}", str(path)) from None
        raise
