"""``slurm-gpu topology render|check|apply``: topology.conf / topology.yaml.

Tree from ``ibnetdiscover`` dumps (``--ibnetdiscover FILE``, repeatable, one
per fabric), blocks from the NVLink fabric cliques in node snapshots.
"""
from __future__ import annotations

import os
from typing import Any, Callable

import click

from ..errors import InputError, UsageError
from ..fsutil import replace_config
from .confgen_io import emit, input_options, load_nodes, read_config


def topo_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options every topology subcommand takes (inputs plus tree/block choices)."""
    opts = [
        click.option("--ibnetdiscover", "dumps", multiple=True, metavar="FILE",
                     help="ibnetdiscover output, one file per fabric (tree)."),
        click.option("--plugin", type=click.Choice(["auto", "tree", "block"]), default="auto",
                     show_default=True, help="auto: tree with --ibnetdiscover, block with snapshots."),
        click.option("--format", "fmt", type=click.Choice(["conf", "yaml"]), default="conf",
                     show_default=True, help="topology.conf, or topology.yaml (Slurm >= 25.05)."),
        click.option("--block-sizes", metavar="N[,N...]", help="Slurm BlockSizes (default: inferred)."),
        click.option("--placeholders", is_flag=True,
                     help="topograph layout: keep short blocks, pad with empty BlockName lines "
                          "(Slurm 26.05 accepts them; 24.11 refuses them)."),
        click.option("--drop-small-blocks", is_flag=True,
                     help="Leave out NVLink domains smaller than BlockSizes[0] instead of failing."),
        click.option("--host-regex", metavar="REGEX",
                     help="How a CA description names its host (group 'host')."),
        click.option("--nodes", "node_filter", metavar="HOSTLIST",
                     help="Only these Slurm nodes in the tree (e.g. skip UFM servers)."),
        click.option("--keep-domain", is_flag=True, help="Keep DNS domains in host names."),
    ]
    for o in reversed(opts):
        f = o(f)
    return input_options(f)


def _render(kw: dict[str, Any]) -> str:
    from ..confgen import block, hostlist, ibnet, topology, tree

    plugin = kw["plugin"]
    want_tree = plugin == "tree" or (plugin == "auto" and bool(kw["dumps"]))
    want_block = plugin == "block" or (plugin == "auto" and bool(kw["snapshots"] or kw["hwloc_xmls"]))
    if kw["fmt"] == "conf" and plugin == "auto" and want_tree and want_block:
        want_block = False  # topology.conf holds one plugin; yaml can hold both
    if want_tree and not kw["dumps"]:
        raise UsageError("the tree topology needs --ibnetdiscover FILE")
    if want_block and not (kw["snapshots"] or kw["hwloc_xmls"]):
        raise UsageError("the block topology needs node snapshots (--snapshot)")
    if not (want_tree or want_block):
        raise UsageError("nothing to render: give --ibnetdiscover FILE and/or --snapshot")
    inputs: list[str] = []
    t = b = None
    fabrics: list[Any] = []
    if want_tree:
        fabrics = [ibnet.parse_file(p) for p in kw["dumps"]]
        try:
            allowed = hostlist.expand(kw["node_filter"]) if kw["node_filter"] else None
        except InputError as e:  # a bad option value is a usage error (exit 2)
            raise UsageError(f"--nodes: {e.what}") from None
        match = tree.host_matcher(kw["host_regex"], keep_domain=kw["keep_domain"], nodes=allowed)
        t = tree.build_tree(fabrics, match)
        inputs += [f"ibnetdiscover {p}" for p in kw["dumps"]]
    if want_block:
        nodes, where = load_nodes(kw["snapshots"], kw["hwloc_xmls"], kw["node"])
        sizes = None
        if kw["block_sizes"]:
            try:
                sizes = [int(x) for x in kw["block_sizes"].split(",")]
            except ValueError:
                raise UsageError(f"--block-sizes wants N[,N...], got {kw['block_sizes']!r}") from None
        b = block.build_blocks(nodes, sizes, placeholders=kw["placeholders"],
                               drop_small=kw["drop_small_blocks"])
        srcs = sorted(set(os.path.dirname(w) or w for w in where.values()))
        inputs += [f"snapshots of {len(nodes)} nodes from {', '.join(srcs[:3])}" + (" ..." if len(srcs) > 3 else "")]
    text = topology.render_topology(t, b, fmt=kw["fmt"], inputs=inputs)
    for n in tuple(n for f in fabrics for n in f.notes) + (t.notes if t else ()) + (b.notes if b else ()):
        click.echo(f"slurm-gpu: note: {n}", err=True)
    return text


def _meaning(text: str, source: str, fmt: str) -> Any:
    from ..confgen import topocheck

    if fmt == "yaml":
        return topocheck.parse_yaml(text, source)
    return topocheck.parse_conf(text.splitlines(True), source)


def _fmt_of(path: str, fmt: str) -> str:
    return "yaml" if path.endswith((".yaml", ".yml")) else fmt


@click.group()
def topology() -> None:
    """Generate, check and apply topology.conf / topology.yaml."""


@topology.command()
@topo_options
@click.option("-o", "--output", metavar="FILE", help="Write here (atomically) instead of stdout.")
def render(output: str | None, **kw: Any) -> None:
    """Print the topology file."""
    text = _render(kw)
    emit(text, output)


@topology.command()
@topo_options
@click.option("--config", required=True, metavar="PATH", help="Existing topology.conf/.yaml.")
@click.pass_context
def check(ctx: click.Context, config: str, **kw: Any) -> None:
    """Compare an existing topology file with the generated one (exit 1 on difference)."""
    from ..confgen import topocheck

    kw["fmt"] = _fmt_of(config, kw["fmt"])
    text = _render(kw)
    diff = topocheck.compare(_meaning(read_config(config), config, kw["fmt"]), _meaning(text, "generated", kw["fmt"]))
    if diff:
        click.echo(f"slurm-gpu: {config} differs from the fabric (- {config}, + generated):")
        for line in diff:
            click.echo(f"  {line}")
        ctx.exit(1)
    click.echo(f"slurm-gpu: {config} matches the fabric")


@topology.command()
@topo_options
@click.option("--config", required=True, metavar="PATH", help="topology.conf/.yaml to write.")
@click.option("--no-backup", is_flag=True, help="Do not keep PATH.bak.")
def apply(config: str, no_backup: bool, **kw: Any) -> None:
    """Write the topology file when it changed (atomic, backup), then say how to reload."""
    from ..confgen import topocheck

    kw["fmt"] = _fmt_of(config, kw["fmt"])
    text = _render(kw)
    old = read_config(config) if os.path.exists(config) else None
    if old == text:
        click.echo(f"slurm-gpu: {config} is up to date; nothing written")
        return
    wanted = _meaning(text, "generated", kw["fmt"])
    try:
        same = old is not None and not topocheck.compare(_meaning(old, config, kw["fmt"]), wanted)
    except InputError as e:
        # A broken or hand-made previous file is what apply is for: replace it.
        click.echo(f"slurm-gpu: note: previous file not understood: {e.what} ({e.where})", err=True)
        same = False
    target = replace_config(config, text, backup=None if no_backup else ".bak")
    click.echo(f"slurm-gpu: wrote {target}" + (f" (previous kept as {target}.bak)" if old is not None
                                               and not no_backup else ""))
    if same:
        click.echo("slurm-gpu: topology meaning unchanged (comments only): nothing to reload")
    else:
        click.echo("slurm-gpu: run `scontrol reconfigure` (or restart slurmctld) to load the new topology")
