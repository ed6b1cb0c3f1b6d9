"""Unit tests reach the product through its public names: a ratchet on the rest (issue 25 §5).

A test that calls ``ibnet._parse_lines`` or clears ``config._load``'s cache
pins a private name, so a refactoring that keeps every behaviour still
breaks it, and what it asserts is how the module is built rather than what
it does.  This counts, by ``ast``, each place a unit test reaches a private
name of ``slurm_gpu`` or ``slurm_gpu_devkit``:

* ``from slurm_gpu.x import _y`` (or a private module in the dotted path);
* ``module._y``, where ``module`` is a name bound by an import of ours;
* ``setattr``/``getattr``/``delattr``/``monkeypatch.setattr`` of such a
  module with the private name as a string.

``_fields_``-style names (one underscore each side: ctypes' and enum's own
protocol) are not private.  The count of each layer may fall, never rise:
lower its figure below when you remove uses, and see docs/development.md
(Test) for what to do instead of adding one.
"""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from paths import ROOT, UNIT

OURS = ("slurm_gpu", "slurm_gpu_devkit")

# layer -> the most private-name uses its unit tests may hold.  "" is the
# shared helpers directly in tests/unit/ (nvmlfake.py, fuzzlib.py ...).
CEILING: dict[str, int] = {
    "": 0,
    "acct": 0,
    "cli": 0,
    "cluster": 0,
    "common": 0,
    "confgen": 0,
    "devkit": 0,
    "health": 0,
    "hw": 0,
    "imex": 0,
    "jobs": 0,
    "mig": 0,
    "spank": 1,
}


def _private(name: str) -> bool:
    if name.startswith("__") or not name.startswith("_"):
        return False
    return not (name.endswith("_") and not name.endswith("__") and len(name) > 2)   # _fields_


def _ours(module: str | None) -> bool:
    return module is not None and module.split(".")[0] in OURS


def private_uses(source: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every private name of ours that *source* reaches."""
    tree = ast.parse(source)
    modules: dict[str, str] = {}         # local name -> what of ours it is bound to
    uses: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _ours(a.name):
                    local = a.asname or a.name.split(".")[0]
                    modules[local] = a.name if a.asname else local
                    if any(_private(p) for p in a.name.split(".")):
                        uses.append((node.lineno, a.name))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _ours(node.module):
            assert node.module is not None
            in_path = any(_private(p) for p in node.module.split("."))
            for a in node.names:
                if in_path or _private(a.name):
                    uses.append((node.lineno, f"{node.module}.{a.name}"))
                modules[a.asname or a.name] = f"{node.module}.{a.name}"

    def resolve(expr: ast.expr) -> str | None:
        chain: list[str] = []
        while isinstance(expr, ast.Attribute):
            chain.append(expr.attr)
            expr = expr.value
        if isinstance(expr, ast.Name) and expr.id in modules:
            return ".".join([modules[expr.id], *reversed(chain)])
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = resolve(node.value)
            if base is not None:
                uses.append((node.lineno, f"{base}.{node.attr}"))
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            target, what = node.args[0], node.args[1]
            if (name in ("setattr", "getattr", "delattr") and isinstance(what, ast.Constant)
                    and isinstance(what.value, str) and _private(what.value)):
                base = resolve(target)
                if base is not None:
                    uses.append((node.lineno, f"{base}.{what.value}"))
    return sorted(uses)


def _layer(path: Path) -> str:
    rel = path.relative_to(UNIT)
    return rel.parts[0] if len(rel.parts) > 1 else ""


def count_by_layer() -> tuple[Counter[str], dict[str, list[str]]]:
    counts: Counter[str] = Counter()
    where: dict[str, list[str]] = {}
    for path in sorted(UNIT.rglob("*.py")):
        uses = private_uses(path.read_text())
        layer = _layer(path)
        counts[layer] += len(uses)
        where.setdefault(layer, []).extend(f"{path.relative_to(ROOT)}:{line} {name}" for line, name in uses)
    return counts, where


def test_private_names_in_unit_tests_do_not_rise() -> None:
    counts, where = count_by_layer()
    assert set(counts) <= set(CEILING), f"a layer without a figure here: {sorted(set(counts) - set(CEILING))}"
    risen = {layer: (n, CEILING[layer]) for layer, n in counts.items() if n > CEILING[layer]}
    detail = "\n".join(u for layer in risen for u in where[layer])
    assert not risen, (f"private names of slurm_gpu reached by unit tests, (count, ceiling) by layer: {risen}; "
                       f"test through the public interface (docs/development.md, Test):\n{detail}")


def test_the_count_sees_every_way_in() -> None:
    src = '''
import slurm_gpu.config
import slurm_gpu.hw._private as priv
from slurm_gpu import config as cfg
from slurm_gpu.confgen import ibnet
from slurm_gpu.jobs.mps import _alive, public
from os import _exit
import ctypes
slurm_gpu.config._load.cache_clear()
cfg._load
ibnet._parse_lines(x)
ibnet.parse(x)._private_of_a_result
public._inner
monkeypatch.setattr(ibnet, "_SLICE", 3)
getattr(cfg, "_load")
setattr(ibnet, "parse", None)
nvml.c_struct._fields_
os._exit
'''
    assert [name for _, name in private_uses(src)] == [
        "slurm_gpu.hw._private",                     # a private module
        "slurm_gpu.jobs.mps._alive",
        "slurm_gpu.config._load",
        "slurm_gpu.config._load",
        "slurm_gpu.confgen.ibnet._parse_lines",
        "slurm_gpu.jobs.mps.public._inner",
        "slurm_gpu.confgen.ibnet._SLICE",
        "slurm_gpu.config._load",
    ]
