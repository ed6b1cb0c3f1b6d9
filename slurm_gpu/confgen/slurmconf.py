"""Tokenizer for Slurm's ``key=value`` config files (gres.conf, topology.conf).

Follows Slurm's own parser where it matters: ``#`` starts a comment, a
trailing backslash continues the line, keys are case-insensitive, values may
be double-quoted.  Each record keeps its line number for messages.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from ..errors import InputError


@dataclass(frozen=True)
class Record:
    line: int
    fields: tuple[tuple[str, str], ...]   # (lower-case key, value) in order

    def get(self, key: str, default: str | None = None) -> str | None:
        for k, v in self.fields:
            if k == key:
                return v
        return default

    @property
    def first_key(self) -> str:
        return self.fields[0][0]


def change_line(label: str, old: Any, new: Any, describe: Callable[[Any], str]) -> str | None:
    """``+ label: new``, ``- label: old``, ``~ label: old -> new`` or None when equal."""
    if old is None:
        return f"+ {label}: {describe(new)}"
    if new is None:
        return f"- {label}: {describe(old)}"
    if old != new:
        return f"~ {label}: {describe(old)} -> {describe(new)}"
    return None


def records(lines: Iterable[str], source: str) -> list[Record]:
    """Split a config file into records; raise naming ``source:line`` on junk."""
    out: list[Record] = []
    buf = ""
    start = 0
    for no, raw in enumerate(lines, 1):
        text = raw.rstrip("\n")
        if "#" in text:
            text = text[:text.index("#")]
        if not buf:
            start = no
        if text.endswith("\\"):
            buf += text[:-1] + " "
            continue
        text = (buf + text).strip()
        buf = ""
        if not text:
            continue
        try:
            tokens = shlex.split(text, posix=True)
        except ValueError as e:
            raise InputError(f"unreadable line: {e}", f"{source}:{start}") from None
        fields: list[tuple[str, str]] = []
        for tok in tokens:
            key, eq, value = tok.partition("=")
            if not eq or not key:
                raise InputError(f"expected key=value, got {tok!r}", f"{source}:{start}")
            fields.append((key.lower(), value))
        out.append(Record(start, tuple(fields)))
    if buf.strip():
        raise InputError("file ends with a line continuation", f"{source}:{start}")
    return out
