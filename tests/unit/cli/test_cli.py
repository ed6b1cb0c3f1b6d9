"""The CLI's error contract: one line, stable exit codes, traceback only with --debug."""
from __future__ import annotations

import click

from slurm_gpu import cli
from slurm_gpu.errors import InputError


def _install(monkeypatch, cmd: click.Command) -> None:
    monkeypatch.setitem(cli.COMMANDS, "boom", "tests.unit.test_cli:_placeholder")
    monkeypatch.setattr(cli.LazyGroup, "get_command",
                        lambda self, ctx, name: cmd if name == "boom" else None)


def test_usage_error_exits_2(capsys) -> None:
    assert cli.main(["no-such-command"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slurm-gpu: ") and err.count("\n") == 1


def test_project_error_is_one_line_exit_1(monkeypatch, capsys) -> None:
    @click.command()
    def boom() -> None:
        raise InputError("not a snapshot", "/tmp/x.json line 3")

    _install(monkeypatch, boom)
    assert cli.main(["boom"]) == 1
    err = capsys.readouterr().err
    assert err == "slurm-gpu: not a snapshot (/tmp/x.json line 3)\n"


def test_bug_is_one_line_without_debug(monkeypatch, capsys) -> None:
    @click.command()
    def boom() -> None:
        raise KeyError("oops")

    _install(monkeypatch, boom)
    monkeypatch.delenv("SLURM_GPU_DEBUG", raising=False)
    assert cli.main(["boom"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: KeyError" in err
    assert "Traceback" not in err


def test_debug_shows_traceback(monkeypatch, capsys) -> None:
    @click.command()
    def boom() -> None:
        raise InputError("bad", "here")

    _install(monkeypatch, boom)
    assert cli.main(["--debug", "boom"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.rstrip().endswith("slurm-gpu: bad (here)")


def test_help_lists_every_registered_command(capsys) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert name in out
