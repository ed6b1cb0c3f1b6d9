"""``echo``: click.echo's output for command bodies that also run without click.

The fast entry (:mod:`slurm_gpu.fastcli`) runs ``health`` and ``inventory``
without importing click (it costs about as much as the interpreter's start).
Their bodies print through this: under click it *is* ``click.echo``; without
it, the same bytes: a newline added, ANSI escapes stripped when the stream is
not a terminal (kernel-log text must not colour an admin's log), flushed.
The fast entry only runs when stdout and stderr are not ASCII streams, the
one case where click would re-wrap them.
"""
from __future__ import annotations

import sys

# click._compat._ansi_re
_ANSI = r"\033\[[0-?]*[ -/]*[@-~]"


def echo(message: str = "", err: bool = False) -> None:
    click = sys.modules.get("click")
    if click is not None:
        click.echo(message, err=err)
        return
    stream = sys.stderr if err else sys.stdout
    if stream is None:
        return
    out = message + "\n"
    if "\033" in out and not _isatty(stream):
        import re
        out = re.sub(_ANSI, "", out)
    stream.write(out)
    stream.flush()


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - click's isatty: anything odd is "not a terminal"
        return False
