"""The shape of the code: one hardware interface, and imports that only go one way.

Parsed from the source, so it holds for lazy imports inside functions too.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from paths import ROOT

PKG = ROOT / "slurm_gpu"
NVML_NAMES = re.compile(r"nvml[A-Z]|NVMLError|pynvml")
# The hardware layer is the only code of the runtime that may speak NVML (the
# devkit's simulator, outside slurm_gpu/, implements it).
NVML_ALLOWED = ("hw",)
DEVKIT = "slurm_gpu_devkit"
DEVKIT_PKG = ROOT / "devkit" / DEVKIT
DEVKIT_NVML_ALLOWED = ("sim",)


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


def test_no_nvml_names_outside_hw() -> None:
    # The runtime's hw/ and the devkit's simulator; not the sandbox nor anything else.
    hits = []
    for p in sorted([*PKG.rglob("*.py"), *DEVKIT_PKG.rglob("*.py")]):
        top = p.relative_to(PKG if p.is_relative_to(PKG) else DEVKIT_PKG).parts[0]
        if top in (NVML_ALLOWED if p.is_relative_to(PKG) else DEVKIT_NVML_ALLOWED):
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


def _devkit_references(path: Path, root: Path = ROOT) -> list[str]:
    """Where *path* imports the devkit or names it in a string that is not a
    docstring (``importlib.import_module("slurm_gpu_devkit...")`` counts)."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    hits = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names = [node.value] if DEVKIT in node.value else []
        hits += [f"{path.relative_to(root)}:{node.lineno}: {n}" for n in names
                 if n == DEVKIT or n.startswith(DEVKIT + ".") or (DEVKIT in n and not isinstance(node, (ast.Import, ast.ImportFrom)))]
    return hits


def test_the_runtime_never_imports_the_devkit() -> None:
    # The devkit (simulator, sandbox, machines) plugs in through entry points
    # (slurm_gpu.plugins); a node has only the runtime installed.
    assert [h for p in sorted(PKG.rglob("*.py")) for h in _devkit_references(p)] == []


def test_the_devkit_check_finds_devkit_imports(tmp_path: Path) -> None:
    # A checker that cannot fail proves nothing.
    bad = tmp_path / "bad.py"
    bad.write_text('"""Mentions slurm_gpu_devkit in a docstring: fine."""\n'
                   "import slurm_gpu_devkit.sim\nfrom slurm_gpu_devkit import sandbox\n"
                   "x = __import__('slurm_gpu_devkit.sim')\n")
    assert sorted(h.split(": ", 1)[1] for h in _devkit_references(bad, tmp_path)) == [
        "slurm_gpu_devkit", "slurm_gpu_devkit.sim", "slurm_gpu_devkit.sim"]


def test_no_simulator_branch_in_the_runtime() -> None:
    # The runtime knows registered backends by their scheme, never the simulator's.
    hits = []
    for p in sorted(PKG.rglob("*.py")):
        tree = ast.parse(p.read_text(), str(p))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    (node.value == "sim" or node.value.startswith("sim:")):
                hits.append(f"{p.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert hits == []


def test_the_cycle_finder_finds_cycles() -> None:
    # A checker that cannot fail proves nothing.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# CPython's C modules behind a public one are not the standard library's
# interface (issue 25 §3: no JSON through _json, no _signal): the runtime
# imports the public module.  _thread is documented in the library reference.
DOCUMENTED_PRIVATE = {"_thread"}


def _private_stdlib_imports(paths: list[Path], root: Path = ROOT) -> list[str]:
    import sys
    stdlib = getattr(sys, "stdlib_module_names", None)
    if stdlib is None:
        pytest.skip("sys.stdlib_module_names: Python >= 3.10")
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            for n in names:
                top = n.split(".")[0]
                if top.startswith("_") and top in stdlib and top not in DOCUMENTED_PRIVATE \
                        and top != "__future__":
                    out.append(f"{path.relative_to(root)}: {n}")
    return out


def test_the_runtime_imports_no_private_stdlib_module() -> None:
    assert _private_stdlib_imports(sorted(_modules().values())) == []


def test_the_private_stdlib_check_finds_them(tmp_path: Path) -> None:
    p = tmp_path / "m.py"
    p.write_text("import _json\nfrom _ctypes import dlopen\nimport _thread\nimport json\n"
                 "from __future__ import annotations\nfrom ._x import y\n")
    assert _private_stdlib_imports([p], tmp_path) == ["m.py: _json", "m.py: _ctypes"]
