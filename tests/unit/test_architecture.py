"""The shape of the code: one hardware interface, and imports that only go one way.

Parsed from the source, so it holds for lazy imports inside functions too.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "slurm_gpu"
NVML_NAMES = re.compile(r"nvml[A-Z]|NVMLError|pynvml")
# The hardware layer and the simulator are the only code that may speak NVML.
NVML_ALLOWED = ("hw", "sim")


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the slurm_gpu modules it imports (at any depth of its code)."""
    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in mods else origin for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != mod and t.startswith("slurm_gpu"):
                    found.add(t)
        graph[mod] = found
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _package(mod: str) -> str:
    # slurm_gpu.hw.nvml -> slurm_gpu.hw; top-level modules (slurm_gpu.errors) are units of their own.
    return ".".join(mod.split(".")[:2])


def test_no_nvml_names_outside_hw_and_sim() -> None:
    hits = []
    for p in sorted(PKG.rglob("*.py")):
        if p.relative_to(PKG).parts[0] in NVML_ALLOWED:
            continue
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if NVML_NAMES.search(line):
                hits.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()}")
    assert hits == []


def test_no_import_cycle_between_modules() -> None:
    assert _cycles(_imports(_modules())) == []


def test_no_import_cycle_between_packages() -> None:
    graph: dict[str, set[str]] = {}
    for mod, targets in _imports(_modules()).items():
        graph.setdefault(_package(mod), set()).update(_package(t) for t in targets if _package(t) != _package(mod))
    assert _cycles(graph) == []


def test_hw_never_imports_the_simulator() -> None:
    graph = _imports(_modules())
    assert {(m, t) for m, ts in graph.items() for t in ts
            if m.startswith("slurm_gpu.hw") and t.startswith("slurm_gpu.sim")} == set()


def test_the_cycle_finder_finds_cycles() -> None:
    # A checker that cannot fail proves nothing.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
