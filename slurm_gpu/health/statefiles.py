"""Where one node's health-check state and lock live (shared by the check and
the epilog's user-problem drain, which takes the same lock: a module of its
own, so neither imports the other)."""
from __future__ import annotations

import os
import re


def _node_tag(node: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", node) or "_"


def state_file(state_dir: str | os.PathLike[str], node: str) -> str:
    """This node's state file.  Named per node: several slurmd on one host
    (multiple-slurmd, the sandbox) may share a state_dir without ``%n``, and
    one node's memory (our drain, its slurmd, its cursors) must not be another's."""
    return os.path.join(state_dir, f"health-state.{_node_tag(node)}.json")


def lock_file(state_dir: str | os.PathLike[str], node: str) -> str:
    """The lock one acting run of the check (or the epilog's drain) holds."""
    return os.path.join(state_dir, f"health.{_node_tag(node)}.lock")


def open_lock(path: str | os.PathLike[str]) -> int:
    """Open (creating it, 0600) one of the check's lock files; its fd.

    Never through a symlink, never blocking on a FIFO, and only a regular
    file of root (or this process's user) that nobody else may write: one
    a user planted in a state_dir they can write would let them hold the
    lock (every run gives up, nothing drains) or, as a link, have root
    create and lock a file anywhere.  InputError for such a file; OSError
    when it cannot be opened at all.
    """
    import errno

    from ..errors import InputError
    from ..hw.kmsg import trusted_stat
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InputError("lock file is a symbolic link: refused", os.fspath(path)) from None
        raise
    if not trusted_stat(os.fstat(fd)):
        os.close(fd)
        raise InputError("lock file is not root's regular file, or someone else may write it: refused",
                         os.fspath(path))
    return fd


def slurmd_run_lock_file(state_dir: str | os.PathLike[str], node: str) -> str:
    """The lock a slurmd-started run (``--slurm``) holds from start to exit."""
    return os.path.join(state_dir, f"health.{_node_tag(node)}.slurmd.lock")
