"""JSON for the per-job state files, without importing :mod:`json`.

``json`` imports ``re`` (and with it ``enum``, ``functools``, ...), ~6 ms of
every prolog, epilog and ``--gpu-mps`` job step, for files of a few hundred
bytes.  Both directions here use ``_json``, the C accelerator that ``json``
itself runs on (present in every CPython build): its scanner for reading, its
string escaper for writing.  :func:`dumps` writes exactly what
``json.dumps(obj, indent=1, sort_keys=True)`` writes (tests compare them);
:func:`loads` accepts exactly what ``json.loads`` accepts and raises
``ValueError`` where it does.
"""
from __future__ import annotations

from _json import encode_basestring_ascii as _quote
from _json import make_scanner as _make_scanner

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_WS = " \t\n\r"


class _Context:
    """The attributes ``_json.make_scanner`` reads: json.JSONDecoder's defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> float:
        return {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}[name]


_scan = _make_scanner(_Context())


def loads(text: str | bytes) -> Any:
    """Parse one JSON document; ValueError (or RecursionError) when it is not one."""
    if isinstance(text, (bytes, bytearray)):
        # our files are ASCII; a UTF-8 BOM is skipped as json does (without
        # the utf-8-sig codec, whose lookup is one more import)
        raw = bytes(text)
        text = (raw[3:] if raw.startswith(b"\xef\xbb\xbf") else raw).decode("utf-8")
    elif text.startswith("\ufeff"):
        raise ValueError("Unexpected UTF-8 BOM (decode using utf-8-sig)")
    start = len(text) - len(text.lstrip(_WS))
    try:
        obj, end = _scan(text, start)
    except StopIteration as e:
        raise ValueError(f"Expecting value: char {e.value}") from None
    if text[end:].strip(_WS):
        raise ValueError(f"Extra data: char {end}")
    return obj


def _float(o: float) -> str:
    if o != o:
        return "NaN"
    if o in (float("inf"), float("-inf")):
        return "Infinity" if o > 0 else "-Infinity"
    return float.__repr__(o)


def _key(k: Any) -> str:
    if isinstance(k, str):
        return k
    if k is True:
        return "true"
    if k is False:
        return "false"
    if k is None:
        return "null"
    if isinstance(k, float):
        return _float(k)
    if isinstance(k, int):
        return int.__repr__(k)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(k).__name__}")


def _encode(o: Any, level: int, out: list[str]) -> None:
    if isinstance(o, str):
        out.append(_quote(o))
    elif o is None:
        out.append("null")
    elif o is True:
        out.append("true")
    elif o is False:
        out.append("false")
    elif isinstance(o, int):
        out.append(int.__repr__(o))
    elif isinstance(o, float):
        out.append(_float(o))
    elif isinstance(o, (list, tuple)):
        if not o:
            out.append("[]")
            return
        inner = "\n" + " " * (level + 1)
        out.append("[")
        for i, v in enumerate(o):
            out.append(inner if i == 0 else "," + inner)
            _encode(v, level + 1, out)
        out.append("\n" + " " * level + "]")
    elif isinstance(o, dict):
        if not o:
            out.append("{}")
            return
        inner = "\n" + " " * (level + 1)
        out.append("{")
        for i, (k, v) in enumerate(sorted(o.items())):
            out.append(inner if i == 0 else "," + inner)
            out.append(_quote(_key(k)) + ": ")
            _encode(v, level + 1, out)
        out.append("\n" + " " * level + "}")
    else:
        raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def dumps(obj: Any) -> str:
    """``json.dumps(obj, indent=1, sort_keys=True)``: the state files' format."""
    out: list[str] = []
    _encode(obj, 0, out)
    return "".join(out)
