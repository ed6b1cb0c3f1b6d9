"""Every part slurmd runs from prolog.d/epilog.d enters the same way (slurm_gpu.hookentry):
``prolog`` or ``epilog`` and nothing else, under umask 022 whatever slurmd's is."""
from __future__ import annotations

import importlib
import os

import pytest

from slurm_gpu import hookentry


@pytest.mark.parametrize("prog", ["slurm_gpu.acct", "slurm_gpu.imex.hook", "slurm_gpu.jobs"])
@pytest.mark.parametrize("argv", [[], ["teardown"], ["prolog", "epilog"], ["epilog", "7"]])
def test_each_part_answers_other_arguments_with_its_usage_line(prog: str, argv: list[str], capsys) -> None:
    main = importlib.import_module(prog if prog.endswith("hook") else prog + ".__main__").main
    assert main(argv) == 2
    assert capsys.readouterr().err == f"usage: python -m {prog} prolog|epilog\n"


@pytest.mark.parametrize("step", ["prolog", "epilog"])
def test_the_step_runs_under_umask_022_and_its_exit_status_is_returned(step: str) -> None:
    seen = []

    def run(what: str) -> int:
        seen.append((what, os.umask(0o077)))
        return 7

    old = os.umask(0o002)       # slurmd's, as it reaches the hook
    try:
        assert hookentry.run([step], "x", run) == 7
    finally:
        os.umask(old)
    assert seen == [(step, 0o022)]


@pytest.fixture()
def gc_as_found():
    import gc
    was = gc.isenabled()
    yield gc
    gc.unfreeze()
    (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("rc", [0, 1])
def test_the_step_runs_without_cyclic_gc_and_its_objects_are_frozen_for_the_exit(
        gc_as_found, rc: int) -> None:
    """A hook process imports modules that stay alive until it exits: no cyclic
    collection passes over them while it runs, nor at its exit (frozen)."""
    gc = gc_as_found
    gc.enable()
    gc.unfreeze()
    seen = []

    def run(what: str) -> int:
        seen.append(gc.isenabled())
        if rc:
            raise KeyError(what)
        return 0

    if rc:
        with pytest.raises(KeyError):
            hookentry.run(["epilog"], "x", run)
    else:
        assert hookentry.run(["prolog"], "x", run) == 0
    assert seen == [False]
    assert gc.isenabled() and gc.get_freeze_count() > 0
