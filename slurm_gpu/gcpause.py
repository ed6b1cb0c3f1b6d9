"""Cyclic garbage collection paused while a large, acyclic structure is built.

A cluster's node models or a 10,000-node fabric are millions of small
objects that all stay alive: each cyclic GC pass over them only costs time
(seconds at 10,000 nodes) and frees nothing, since they hold no cycles
(refcounting still frees them).  The builders pause collection while they
build, and freeze a large result so that later passes skip it too.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic collection inside the block; afterwards it is as it was."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def freeze_if_large(count: int, large: int) -> None:
    """Move everything alive now out of the collector's sight when *count* > *large*
    (a small result is not worth it: the passes over it cost nothing)."""
    if count > large:
        gc.freeze()
