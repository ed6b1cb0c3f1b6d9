"""The one way to read a file in a directory where someone else could have put
something (a job user's MPS log, the accounting store, IMEX job records).

Never through a symlink (``O_NOFOLLOW``), never blocking on a FIFO
(``O_NONBLOCK``), and only a regular file of an expected owner is read;
the callers say what they do with a refusal.  Imported by the epilogs'
light paths: builtins only.
"""
from __future__ import annotations

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Container


def read_owned(path: str | os.PathLike[str], limit: int, owners: Container[int], *,
               others_may_write: bool = True) -> bytes:
    """The first *limit* bytes of *path*, a regular file that one of *owners* owns
    (and, unless *others_may_write*, that neither its group nor others may write).

    Raises FileNotFoundError when nothing is there, and OSError when something
    else is (a symlink, a FIFO, another owner's file) or it cannot be read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in owners or \
                not others_may_write and st.st_mode & 0o022:
            raise OSError(f"{os.fspath(path)} is not our regular file")
        return f.read(limit)
