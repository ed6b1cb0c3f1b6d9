"""Shared pieces of the property tests (tests/unit/*/test_fuzz_*.py, issue 10).

The contract every parser keeps: any input ends in a result or one
``slurm-gpu:`` line (a :class:`SlurmGpuError`), never another exception, a
hang or a partial file.  :func:`outcome` checks it for one call;
:func:`mutated` makes inputs from real samples by splicing in the tokens that
break parsers (unbounded digits, nan/inf, deep nesting, NULs, quotes,
newlines, huge counts).

Runs are deterministic (``derandomize=True``, no example database), so CI
sees the same inputs every time; ``EXAMPLES`` records how many each test
tries (the counts in the issue's note).
"""
from __future__ import annotations

import signal
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Callable, Iterator

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from slurm_gpu.errors import SlurmGpuError

# One example must finish in this much CPU time: a parser that takes longer
# on a small input is a hang (slow CI boxes stay far below it).  CPU time, not
# wall-clock time: on a loaded machine a process may wait seconds for a core
# without running at all (issue 24: this check failed once under load while
# the example needed 20 ms of CPU).
EXAMPLE_SECONDS = 5


def fuzz_settings(n: int) -> settings:
    """Deterministic settings for *n* examples (no deadline: the alarm below is the hang check)."""
    return settings(max_examples=n, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


NASTY = [
    "9" * 5000, "-" + "9" * 4400, "1" * 300, "-1", "0", "-0", "4294967296", "18446744073709551616",
    "1e400", "-1e400", "nan", "NaN", "inf", "-inf", "Infinity", "0x", "0xZZ", "1.5", "1e3",
    "\x00", "\x7f", "\udcff", "\u202e", "é", "\u0661", "²", "\t", "\r", "\n", "\\x0a", " ", "",
    '"', "'", "\\", "=", "==", ",", ";", ":", "#", "*", "%", "%n", "[", "]", "{", "}", "(", ")",
    "[" * 300, "{" * 300, "(" * 300, "[" * 5000, "{\"a\":" * 3000, "[]", "{}", "null", "true", "false", "../", "/", "//",
    "&a [*a, *a]", "*a", "!!python/object:os.system", "<", ">", "<!--", "]]>", "&#0;", "&lol;",
]


@st.composite
def mutated(draw: Any, corpus: list[str], tokens: list[str] | None = None, max_ops: int = 6) -> str:
    """A sample from *corpus* with up to *max_ops* splices, deletions, duplications or a cut."""
    text = draw(st.sampled_from(corpus))
    toks = NASTY + (tokens or [])
    for _ in range(draw(st.integers(0, max_ops))):
        op = draw(st.sampled_from(["insert", "replace", "delete", "dup", "cut", "swapline"]))
        n = len(text)
        at = draw(st.integers(0, n)) if n else 0
        span = draw(st.integers(0, 40))
        if op == "insert":
            text = text[:at] + draw(st.sampled_from(toks)) + text[at:]
        elif op == "replace":
            text = text[:at] + draw(st.sampled_from(toks)) + text[at + span:]
        elif op == "delete":
            text = text[:at] + text[at + span:]
        elif op == "dup":
            text = text[:at + span] + text[at:at + span] * draw(st.integers(1, 50)) + text[at + span:]
        elif op == "cut":
            text = text[:at]
        else:
            lines = text.split("\n")
            if len(lines) > 2:
                i = draw(st.integers(0, len(lines) - 1))
                j = draw(st.integers(0, len(lines) - 1))
                lines[i], lines[j] = lines[j], lines[i]
                text = "\n".join(lines)
    return text


def json_values(keys: list[str]) -> st.SearchStrategy[Any]:
    """JSON-like documents whose object keys come from *keys* (so they reach the code's branches).

    Built once per key list: a recursive strategy is costly to set up, and
    a test that draws one per example spends its time there.
    """
    return _json_values(tuple(keys))


@lru_cache(maxsize=None)
def _json_values(keys: tuple[str, ...]) -> st.SearchStrategy[Any]:
    leaf = st.one_of(
        st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), st.sampled_from([-1, 0, 1, 2, 7, 79, 255]),
        st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(NASTY[:40]),
        st.text(max_size=12), st.sampled_from(keys))
    return st.recursive(leaf, lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.one_of(st.sampled_from(keys), st.text(max_size=6)), inner, max_size=6)),
        max_leaves=25)


class Hang(Exception):
    pass


# A call blocked without using CPU (a read that should not block) is caught
# by wall-clock time, set far beyond what any load stretches an example to.
BLOCKED_SECONDS = 300


@contextmanager
def deadline(seconds: float = EXAMPLE_SECONDS) -> Iterator[None]:
    """Fail with :class:`Hang` when the block uses more than *seconds* of CPU time
    (ITIMER_PROF: the process's user and system time; waiting for a core never
    counts), or stays blocked for :data:`BLOCKED_SECONDS`."""
    def busy(signum: int, frame: Any) -> None:
        raise Hang(f"no answer in {seconds} s of CPU time")

    def blocked(signum: int, frame: Any) -> None:
        raise Hang(f"blocked for {BLOCKED_SECONDS} s")
    old_prof = signal.signal(signal.SIGPROF, busy)
    old_alrm = signal.signal(signal.SIGALRM, blocked)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    signal.setitimer(signal.ITIMER_REAL, BLOCKED_SECONDS)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGALRM, old_alrm)
        signal.signal(signal.SIGPROF, old_prof)


def outcome(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """``fn(*args)``: its result, or the SlurmGpuError it raised (checked to be one clean line).

    Any other exception (ValueError, RecursionError, KeyError, ...) escapes
    and fails the property: the user would see a traceback.
    """
    with deadline():
        try:
            return fn(*args, **kw)
        except SlurmGpuError as e:
            line = e.line()
            assert line.startswith("slurm-gpu: ") and "\n" not in line and "Traceback" not in line, line
            return e
