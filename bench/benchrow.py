"""The issue-15 table row a benchmark prints beside its own report.

Each benchmark prints one ``ROW`` line per figure of the table (what was
measured, its floor measured in the same run, the goal, and whether it was
met); ``bench/run_all.py`` collects them into one table.  ``--smoke`` (the
test suite's quick run: small sizes, one repeat) checks that every path
works and prints its rows, but judges no timing.
"""
from __future__ import annotations

import sys


def row(path: str, measured: str, floor: str, goal: str, ok: bool, smoke: bool = False) -> bool:
    """Print one table row; returns *ok* (always True for a smoke run)."""
    verdict = "smoke" if smoke else ("ok" if ok else "MISSED")
    print(f"ROW\t{path}\t{measured}\t{floor}\t{goal}\t{verdict}", flush=True)
    return ok or smoke


def goal_for(goal: float, floor: float, issue_floor: float) -> float:
    """*goal* as the issue set it beside *issue_floor*, scaled by how much
    slower the floor is in this run (a loaded machine: 2 cores, many users).

    The issue's goals are absolute figures measured next to a floor (python
    start 12.9 ms, grep 17 ms, ...); when this run's floor is slower, the
    goal grows by the same factor, so the verdict judges our code, not the
    load.  A faster floor never tightens it.
    """
    return goal * max(1.0, floor / issue_floor)


def goal_text(goal: float, scaled: float, unit: str = "ms") -> str:
    if scaled <= goal * 1.005:
        return f"<= {goal:g} {unit}"
    return f"<= {goal:g} {unit} (x{scaled / goal:.1f} load: {scaled:.0f})"


def python() -> str:
    """The interpreter to measure: the one running the benchmark (its venv)."""
    return sys.executable
