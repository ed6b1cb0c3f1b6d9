"""A /dev/kmsg that serves given records (tests of the kmsg reader).

A FIFO would block and a regular file gives all records to one read(), so
the records are served one per ``os.read`` call, as the kernel does, through
the reader module's ``os.read``; the boot id is fixed.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator
from unittest import mock

from slurm_gpu.hw import kmsg


@contextmanager
def serving(records: Iterable[bytes], boot: str = "boot-a") -> Iterator[None]:
    it = iter(list(records))

    def fake_read(fd: int, n: int) -> bytes:
        try:
            return next(it)
        except StopIteration:
            raise BlockingIOError from None
    with mock.patch.object(kmsg.os, "read", fake_read), mock.patch.object(kmsg, "boot_id", lambda: boot):
        yield
