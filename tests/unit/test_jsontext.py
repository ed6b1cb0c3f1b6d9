"""The state files' JSON without the json module: the same text out, the same verdicts in."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_gpu import jsontext

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=400, deadline=None)
@given(values)
def test_dumps_writes_what_json_writes_and_loads_reads_it_back(v: object) -> None:
    text = jsontext.dumps(v)
    assert text == json.dumps(v, indent=1, sort_keys=True)
    assert _same(jsontext.loads(text), json.loads(text))
    assert _same(jsontext.loads(text.encode()), json.loads(text.encode()))


def test_tuples_and_non_string_keys_as_json_writes_them() -> None:
    v = {"t": (1, (2,)), 3: "int key", 1.5: "float", True: "bool", None: "none"}
    assert jsontext.dumps({"a": v["t"]}) == json.dumps({"a": v["t"]}, indent=1, sort_keys=True)
    for k in (3, 1.5, True, None):
        assert jsontext.dumps({k: 1}) == json.dumps({k: 1}, indent=1, sort_keys=True)
    with pytest.raises(TypeError):
        jsontext.dumps({"x": object()})


@settings(max_examples=600, deadline=None)
@given(st.text(alphabet='{}[]":,0123456789.eE+-tfnrulasNIinfyT \t\n\r\\\x00\x1fé\ufeff', max_size=24))
def test_loads_accepts_and_refuses_what_json_does(text: str) -> None:
    try:
        want: object = json.loads(text)
    except (ValueError, RecursionError):
        want = ValueError
    try:
        got: object = jsontext.loads(text)
    except (ValueError, RecursionError):
        got = ValueError
    assert got is want is ValueError or _same(got, want)


@pytest.mark.parametrize("raw", [b"\xff{}", b"{} \x00", b"\xef\xbb\xbf{}", b"{\"a\": 1}\n\n"])
def test_bytes_as_json_reads_them(raw: bytes) -> None:
    try:
        want: object = json.loads(raw)
    except ValueError:
        want = ValueError
    try:
        got: object = jsontext.loads(raw)
    except ValueError:
        got = ValueError
    assert got == want
