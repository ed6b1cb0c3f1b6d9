"""Slurm hostlist and range syntax, through ClusterShell (never our own parser).

Slurm's ``NodeName=gpu[001-128]``, ``File=/dev/nvidia[0-3]`` and
``Cores=0-3,8-11`` are all the same bracket/range notation that ClusterShell's
NodeSet and RangeSet implement.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Sequence

from ..errors import InputError

# ClusterShell is imported by the functions that use it: the prolog and the
# SPANK plugin only sort gres.conf lines (natural_key), and importing it
# costs them about 8 ms per run (python -X importtime).

_TRAILING_INT = re.compile(r"^(.*?)(\d+)$")
_DIGIT_RUNS = re.compile(r"(\d+)")
# Bad input must be one line, never a hang: a range that expands to more
# names or numbers than any cluster has is refused before it is expanded,
# and ClusterShell's own ValueError (int() of a 5,000-digit bound) is ours.
MAX_EXPANSION = 1 << 17    # no Slurm cluster has more nodes; no node more cores


def _errors() -> tuple[type[BaseException], ...]:
    from ClusterShell.NodeSet import NodeSetParseError
    from ClusterShell.RangeSet import RangeSetParseError
    return (NodeSetParseError, RangeSetParseError, ValueError, OverflowError, RecursionError,
            AssertionError)  # ClusterShell asserts "range too large"


def natural_key(text: str) -> tuple[object, ...]:
    """Sort key that puts ``gpu2`` before ``gpu10`` and ``gpu[001-002]`` before ``gpu003``.

    Digit runs compare by value without int() (which refuses 4,300+ digits):
    by length once leading zeros are gone, then by the digits themselves.
    """
    parts: list[Any] = _DIGIT_RUNS.split(text)    # text, digits, text, ..., text
    for i in range(1, len(parts), 2):
        digits = parts[i].lstrip("0")
        parts[i] = (len(digits), digits)
    return tuple(parts)


def _bounded(n: int, what: str, text: str, where: str) -> None:
    if n > MAX_EXPANSION:
        raise InputError(f"{what} {text[:60]!r} expands to {n} entries (at most {MAX_EXPANSION})", where or None)


# ClusterShell builds every number of a range before its size can be asked
# (n[1-99999999]: 157 s of CPU, issue 24), so the ranges written in the text
# are added up first.  Up to 8x the cap they are read (about 0.5 s at worst)
# and the exact count decides; more is refused unread.  In a node set only
# brackets hold ranges (IBLEAF-0-1048576 is one name), and the digits just
# before a bracket lead both bounds (ClusterShell reads n1[0-5] as n[10-15],
# and 1[-5] as 1-15).  Bounds of 19 digits and more are left to ClusterShell,
# which refuses them at once.
_RANGE = re.compile(r"(\d*)-(\d+)(?:/(\d+))?")
_BRACKET = re.compile(r"(\d*)\[([^\]]*)\]?")


def _spans(text: str, what: str, where: str, nodeset: bool = True) -> None:
    total = 0
    parts = _BRACKET.findall(text) if nodeset else [("", text)]
    for lead, body in parts:
        for m in _RANGE.finditer(body):
            lo, hi = lead + m.group(1), lead + m.group(2)
            if not lo or len(lo) > 18 or len(hi) > 18 or len(m.group(3) or "") > 18:
                continue
            step = int(m.group(3) or 1) or 1
            if int(hi) >= int(lo):
                total += (int(hi) - int(lo)) // step + 1
    if total > 8 * MAX_EXPANSION:
        raise InputError(f"{what} {text[:60]!r} spans {total} numbers (at most {8 * MAX_EXPANSION} are read)",
                         where or None)


# A prefix of name characters not ending in a digit, then the number folded
# (fold_axis -1); long names and numbers are left to fromlist, errors and all.
_PLAIN_NAME = re.compile(r"([A-Za-z0-9_.-]{0,63}[A-Za-z_.-])([0-9]{1,18})")


def _one_pattern(names: list[str]) -> str | None:
    """``gpu[01,02,...],gpu[100],rack1n[7]`` for names that are all a prefix
    and a number (one bracket per prefix and digit count, so no bracket mixes
    paddings); None when any name is not."""
    groups: dict[tuple[str, int], list[str]] = {}
    match = _PLAIN_NAME.fullmatch
    for name in names:
        m = match(name)
        if m is None:
            return None
        digits = m.group(2)
        groups.setdefault((m.group(1), len(digits)), []).append(digits)
    return ",".join(f"{prefix}[{','.join(numbers)}]" for (prefix, _), numbers in groups.items()) or None


def fold(names: Iterable[str], where: str = "") -> str:
    """``['gpu001', 'gpu002']`` -> ``gpu[001-002]``.

    Only the last number of a name is folded (``rack1n[1-2],rack2n[1-2]``,
    never ``rack[1-2]n[1-2]``): Slurm's hostlist parser reads one bracket
    range per name, ClusterShell would happily fold several axes.
    """
    from ClusterShell.NodeSet import NodeSet
    names = list(names)
    # 10,000 names cost ClusterShell one parse each (~8 us); "prefix<digits>"
    # names (the usual cluster) go to it as one "prefix[d1,d2,...]" pattern
    # per prefix and digit count, which it parses and folds 3x faster to the
    # same set (gpu99999 beside gpu100000 is two brackets, not fromlist's
    # 0.8 s for 100,000 names).
    pattern = _one_pattern(names)
    if pattern is None:
        _spans(",".join(names), "host names", where)     # fromlist reads brackets in a name
    try:
        ns = NodeSet(pattern) if pattern is not None else NodeSet.fromlist(names)
        ns.fold_axis = (-1,)
        return str(ns)
    except _errors() as e:
        # Names come from snapshots and fabric dumps; one that ClusterShell
        # cannot hold (a 5,000-digit number: int() refuses it) is bad input,
        # not a traceback.
        bad = max(names, key=len) if names else ""
        raise InputError(f"cannot fold host names (longest {bad[:60]!r}): {str(e)[:80]}", where or None) from None


def expand(hostlist: str, where: str = "") -> list[str]:
    """``gpu[001-003]`` -> ``['gpu001', 'gpu002', 'gpu003']``."""
    from ClusterShell.NodeSet import NodeSet
    _spans(hostlist, "hostlist", where)
    try:
        ns = NodeSet(hostlist)
        _bounded(len(ns), "hostlist", hostlist, where)
        return list(ns)
    except _errors() as e:
        raise InputError(f"bad hostlist {hostlist[:60]!r}: {str(e)[:80]}", where or None) from None


def int_ranges(values: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``0-3,8`` (Slurm's Cores= syntax)."""
    from ClusterShell.RangeSet import RangeSet
    vals = sorted(set(values))
    if not vals:
        return ""
    return str(RangeSet.fromlist([str(v) for v in vals]))


def parse_int_ranges(text: str, where: str = "") -> tuple[int, ...]:
    """``0-3,8`` -> ``(0, 1, 2, 3, 8)``; also accepts ``[0-3]``."""
    t = text.strip()
    if t.startswith("[") and t.endswith("]"):
        t = t[1:-1]
    if not t:
        return ()
    from ClusterShell.RangeSet import RangeSet
    _spans(text, "range", where, nodeset=False)
    try:
        rs = RangeSet(t)
        _bounded(len(rs), "range", text, where)
        return tuple(sorted(int(x) for x in rs))
    except _errors() as e:
        raise InputError(f"bad range {text[:60]!r}: {str(e)[:80]}", where or None) from None


def fold_files(paths: Sequence[str]) -> str:
    """``/dev/nvidia0,/dev/nvidia1`` -> ``/dev/nvidia[0-1]`` when they share a prefix.

    Paths that do not end in a number, or that differ in prefix, stay a comma
    list (which Slurm also accepts).
    """
    if len(paths) == 1:
        return paths[0]
    prefix = None
    nums: list[str] = []
    for p in paths:
        m = _TRAILING_INT.match(p)
        if not m or (prefix is not None and m.group(1) != prefix) or (len(m.group(2)) > 1 and m.group(2)[0] == "0"):
            return ",".join(paths)
        prefix = m.group(1)
        nums.append(m.group(2))
    from ClusterShell.RangeSet import RangeSet
    return f"{prefix}[{RangeSet.fromlist(nums)}]"


def expand_files(text: str, where: str = "") -> tuple[str, ...]:
    """Expand a File=/MultipleFiles= value: ``/dev/nvidia[0-1],/dev/x`` -> paths."""
    from ClusterShell.NodeSet import NodeSet
    try:
        if "[" not in text:
            return tuple(p for p in text.split(",") if p)
        _spans(text, "file list", where)
        ns = NodeSet(text, autostep=None)
        _bounded(len(ns), "file list", text, where)
        return tuple(ns)
    except _errors() as e:
        raise InputError(f"bad file list {text[:60]!r}: {str(e)[:80]}", where or None) from None
