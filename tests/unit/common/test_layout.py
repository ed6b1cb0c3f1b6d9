"""Unit tests sit in one directory per product layer (docs/development.md).

The layers are ``UNIT_LAYERS`` in tests/paths.py, the one list of them.
"""
from __future__ import annotations

from collections import defaultdict

from paths import ROOT, UNIT, UNIT_LAYERS


def _test_files() -> list:
    return sorted(p for p in UNIT.rglob("test_*.py") if "__pycache__" not in p.parts)


def test_no_unit_test_file_sits_outside_a_layer() -> None:
    misplaced = [str(p.relative_to(ROOT)) for p in _test_files()
                 if len(p.relative_to(UNIT).parts) != 2 or p.parent.name not in UNIT_LAYERS]
    assert misplaced == [], (f"unit tests go in tests/unit/<layer>/, layer one of {sorted(UNIT_LAYERS)} "
                             f"(tests/paths.py, docs/development.md): {misplaced}")


def test_every_layer_is_a_directory_with_tests() -> None:
    empty = [layer for layer in UNIT_LAYERS if not list((UNIT / layer).glob("test_*.py"))]
    assert empty == []


def test_unit_test_basenames_are_unique() -> None:
    # pytest's default import mode imports each test module under its basename
    by_name: dict[str, list[str]] = defaultdict(list)
    for p in _test_files():
        by_name[p.name].append(str(p.relative_to(ROOT)))
    assert {n: ps for n, ps in by_name.items() if len(ps) > 1} == {}


def test_the_layer_table_in_the_docs_is_the_list() -> None:
    doc = (ROOT / "docs" / "development.md").read_text()
    rows = [line.split("|")[1].strip().strip("`").rstrip("/") for line in doc.splitlines()
            if line.strip().startswith("| `") and line.split("|")[1].strip().endswith("/`")]
    assert rows == list(UNIT_LAYERS)
