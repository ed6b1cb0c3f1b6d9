"""Whether root may trust a path: nobody but root could have changed what it leads to.

The prolog and epilog run as root and create, read and remove files under
configured directories (``[mps] base_dir``, ``[node] state_dir``).  If any
directory on the way were writable by a job user, the user could rename an
entry and plant a symlink in its place, and root would then create or remove
files wherever it points.  So every directory on the path, and on the path
it resolves to, must be owned by root (or the caller, when not root) and not
writable by group or others, unless it is sticky like ``/tmp`` (there only an
entry's owner may rename it).  Symlinks on the way must be root's.
"""
from __future__ import annotations

import os
import stat


def _owner_ok(st: os.stat_result) -> bool:
    return st.st_uid in (0, os.geteuid())


def _parents(p: str) -> list[str]:
    """The directories above the normalized absolute path *p*, nearest first
    (``Path.parents`` without pathlib's ~3 ms of imports)."""
    out: list[str] = []
    while True:
        d = os.path.dirname(p)
        if d == p:
            return out
        out.append(d)
        p = d


def untrusted_ancestor(path: str | os.PathLike[str]) -> str | None:
    """The first directory above *path* that a non-root user could change, or None."""
    p = os.path.abspath(path)
    seen: set[str] = set()
    for chain in (_parents(p), _parents(os.path.realpath(p))):
        for d in chain:
            if d in seen:
                continue
            seen.add(d)
            try:
                st = os.lstat(d)
            except FileNotFoundError:
                continue        # created later by root, under a checked parent
            except OSError:
                return str(d)
            if stat.S_ISLNK(st.st_mode):
                if not _owner_ok(st):
                    return str(d)
                continue
            if not stat.S_ISDIR(st.st_mode) or not _owner_ok(st):
                return str(d)
            if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
                return str(d)
    return None
