"""The ``slurm-gpu`` command: a thin click front end.

Subcommands are registered explicitly in :data:`COMMANDS` but imported only
when used, so ``slurm-gpu inventory`` does not pay for jinja2 or cffi.  Other
installed distributions add commands through the ``slurm_gpu.commands``
entry-point group (the devkit's ``sandbox``: :mod:`slurm_gpu.plugins`), looked
up only for a name that is not one of ours, or to list them in ``--help``.  All
errors become one line ``slurm-gpu: <what> (<where>)``; exit status 1 for a
failure, 2 for a usage error; a traceback only with ``--debug``.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from . import __version__
from .errors import EXIT_FAILURE, EXIT_USAGE, SlurmGpuError

# name -> "module:attribute"; the order is the order of --help.
COMMANDS: dict[str, str] = {
    "inventory": "slurm_gpu.commands.inventory:inventory",
    "snapshot": "slurm_gpu.commands.snapshot:snapshot",
    "gres": "slurm_gpu.commands.gres:gres",
    "topology": "slurm_gpu.commands.topology:topology",
    "cluster": "slurm_gpu.commands.cluster:cluster",
    "spank": "slurm_gpu.commands.spank:spank",
    "job": "slurm_gpu.commands.job:job",
    "imex": "slurm_gpu.commands.imex:imex",
    "mig": "slurm_gpu.commands.mig:mig",
    "health": "slurm_gpu.commands.health:health",
    "xid-watch": "slurm_gpu.commands.health:xid_watch",
    "doctor": "slurm_gpu.commands.doctor:doctor",
    "monitor": "slurm_gpu.commands.monitor:monitor",
    "report": "slurm_gpu.commands.report:report",
}

HELP = {
    "inventory": "Show this node's GPUs, NUMA nodes and cores.",
    "snapshot": "Record or replay a node's hardware answers.",
    "gres": "Generate and check gres.conf.",
    "topology": "Generate and check topology.conf.",
    "cluster": "Collect every node's model through Slurm; render and check the cluster.",
    "spank": "Build and install the SPANK plugin.",
    "job": "Per-job GPU state on this node.",
    "imex": "Per-job IMEX domains: the job's domain and its nodes' states.",
    "mig": "Plan and apply MIG layouts.",
    "health": "GPU node health check (HealthCheckProgram).",
    "xid-watch": "Listen for NVML events for the health check.",
    "doctor": "Check this node's Slurm setup for slurm-gpu (Nagios codes).",
    "monitor": "Sample GPU use per job (node service).",
    "report": "Cluster GPU usage from slurmdbd.",
}


PLUGIN_GROUP = "slurm_gpu.commands"


def _plugin_names() -> list[str]:
    from . import plugins
    return [n for n in plugins.names(PLUGIN_GROUP) if n not in COMMANDS]


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS) + _plugin_names()

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            from . import plugins
            ep = plugins.find(PLUGIN_GROUP, name)
            cmd: click.Command | None = ep.load() if ep is not None else None
            return cmd
        mod_name, attr = target.split(":")
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name == mod_name:
                return None  # command not built yet in this checkout
            raise
        return getattr(mod, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Listing help must not import every subcommand module.
        rows = [(n, HELP.get(n, "")) for n in COMMANDS]
        # A plugin's one-line help is its command's: loading it imports only that
        # module (its command group), and only where the plugin is installed.
        for n in _plugin_names():
            cmd = self.get_command(ctx, n)
            rows.append((n, cmd.get_short_help_str() if cmd is not None else ""))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar="SLURM_GPU_DEBUG", help="Show tracebacks.")
@click.version_option(__version__, prog_name="slurm-gpu")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """GPU-topology-aware tooling for Slurm."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _debug_requested(argv: list[str]) -> bool:
    return "--debug" in argv or os.environ.get("SLURM_GPU_DEBUG", "") not in ("", "0")


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = _debug_requested(args)
    try:
        rv: Any = cli.main(args=args, prog_name="slurm-gpu", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.exceptions.Abort:
        click.echo("slurm-gpu: aborted", err=True)
        return EXIT_FAILURE
    except click.UsageError as e:
        click.echo(f"slurm-gpu: {e.format_message()}"
                   + (f" ({e.ctx.command_path})" if e.ctx else ""), err=True)
        return EXIT_USAGE
    except click.ClickException as e:
        click.echo(f"slurm-gpu: {e.format_message()}", err=True)
        return e.exit_code
    except SlurmGpuError as e:
        if debug:
            import traceback
            traceback.print_exc()
        click.echo(e.line(), err=True)
        return e.exit_code
    except BrokenPipeError:
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - the one place that turns bugs into one line
        if debug:
            import traceback
            traceback.print_exc()
        click.echo(f"slurm-gpu: internal error: {type(e).__name__}: {e}"
                   + ("" if debug else " (run with --debug for a traceback)"), err=True)
        return EXIT_FAILURE


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
