"""``slurm-gpu gres render|check|apply``: gres.conf from the hardware model.

Thin front end: load node models (live, snapshots, hwloc XMLs; see
:mod:`.confgen_io`), call the pure generator in :mod:`slurm_gpu.confgen`,
print or write atomically.
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable, Mapping, Sequence

import click

from ..errors import InputError, UsageError
from .confgen_io import emit, input_options, load_nodes, node_notes, read_config


def _type_map(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        k, eq, v = item.partition("=")
        if not eq or not k or not v or any(c.isspace() for c in v):
            raise UsageError(f"--type-map wants KEY=TYPE (type, bus id or 0x<device id>), got {item!r}")
        out[k.lower() if k.lower().startswith("0x") else k] = v
    return out


def build_options(ctx_opts: Mapping[str, Any], nodes: Mapping[str, Any]) -> Any:
    """The :class:`~slurm_gpu.confgen.GresOptions` for the command line (pci.ids read only when needed)."""
    from ..confgen import GresOptions
    from ..confgen.pciids import driver_name, load_nvidia_names

    if ctx_opts["mps_count"] < 0 or ctx_opts["shards"] < 0:
        raise UsageError("--mps-count and --shards must be >= 0")
    # pci.ids only for GPUs that neither NVML nor NVIDIA's shipped name table names
    need_pci = any(g.name is None and driver_name(g.pci_device_id, g.pci_subsystem_id) is None
                   for n in nodes.values() for g in n.gpus)
    pci = load_nvidia_names(ctx_opts["pci_ids"]) if need_pci else {}
    return GresOptions(dev_dir=ctx_opts["dev_dir"], type_map=_type_map(ctx_opts["type_map"]),
                       pci_names=pci, mps_count=ctx_opts["mps_count"], shards=ctx_opts["shards"],
                       links=not ctx_opts["no_links"], socket_mode=ctx_opts["socket_mode"],
                       autodetect="" if ctx_opts["autodetect"] == "none" else ctx_opts["autodetect"])


def gres_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options every gres subcommand takes (inputs plus naming, sharing, sockets)."""
    return input_options(naming_options(f))


def naming_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Naming, sharing and socket options (also taken by ``slurm-gpu cluster``)."""
    opts = [
        click.option("--dev-dir", default="/dev", show_default=True, help="Directory of nvidia device files."),
        click.option("--type-map", multiple=True, metavar="KEY=TYPE",
                     help="Override Type= for a GPU type, PCI bus id or 0x<device id> (repeatable)."),
        click.option("--pci-ids", default="/usr/share/misc/pci.ids", show_default=True,
                     help="PCI id database for GPUs without an NVML name."),
        click.option("--mps-count", type=int, default=0, help="Add Name=mps Count=N per GPU."),
        click.option("--shards", type=int, default=0, help="Add Name=shard Count=N per GPU."),
        click.option("--no-links", is_flag=True, help="Never write Links=."),
        click.option("--socket-mode", type=click.Choice(["auto", "package", "numa"]), default="auto",
                     show_default=True, help="What slurm.conf Sockets= counts (numa needs "
                     "SlurmdParameters=numa_node_as_socket)."),
        click.option("--autodetect", type=click.Choice(["off", "nvml", "nvidia", "full", "none"]), default="off",
                     show_default=True,
                     help="Global AutoDetect= line (none: omit it; nvidia needs Slurm >= 24.11, full >= 26.05)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _render(kw: Mapping[str, Any]) -> tuple[str, Any, Any]:
    from ..confgen import gresconf

    nodes, where = load_nodes(kw["snapshots"], kw["hwloc_xmls"], kw["node"])
    opts = build_options(kw, nodes)
    inputs = [f"{n}={w}" if w != "live" else f"{n}=live" for n, w in list(where.items())[:20]]
    if len(where) > 20:
        inputs.append(f"... and {len(where) - 20} more")
    view = gresconf.view(nodes, opts, inputs=inputs, where=where)
    for note in node_notes(nodes) + list(view.notes):
        click.echo(f"slurm-gpu: note: {note}", err=True)
    return gresconf.text_of(view), view, nodes


@click.group()
def gres() -> None:
    """Generate, check and apply gres.conf."""


@gres.command()
@gres_options
@click.option("-o", "--output", metavar="FILE", help="Write here (atomically) instead of stdout.")
@click.option("--node-lines", is_flag=True, help="Print the matching slurm.conf NodeName= lines instead.")
def render(output: str | None, node_lines: bool, **kw: Any) -> None:
    """Print gres.conf for the given nodes (default: this node)."""
    text, view, _ = _render(kw)
    if node_lines:
        text = "".join(nl + "\n" for g in view.groups for nl in g.node_lines)
        if view.slurmd_parameters:
            text = f"SlurmdParameters={','.join(view.slurmd_parameters)}\n" + text
    emit(text, output)


@gres.command()
@gres_options
@click.option("--config", "config", required=True, metavar="PATH", help="Existing gres.conf to check.")
@click.pass_context
def check(ctx: click.Context, config: str, **kw: Any) -> None:
    """Compare an existing gres.conf with the generated one (exit 1 on difference)."""
    from ..confgen import gresconf

    text, _, _ = _render(kw)
    _, current = gresconf.read(config)
    diff = gresconf.differences(current, text)
    if diff:
        click.echo(f"slurm-gpu: {config} differs from the hardware (- {config}, + generated):")
        for line in diff:
            click.echo(line)
        ctx.exit(1)
    click.echo(f"slurm-gpu: {config} matches the hardware")


def drift(config: str, node: str) -> list[str]:
    """``gres check``'s differences for this node with the default options (for doctor)."""
    from ..confgen import gresconf

    kw = {p.name: p.default for p in check.params if p.name and p.name != "config"}
    kw.update(node=node, snapshots=(), hwloc_xmls=(), type_map=())
    text, _, _ = _render(kw)
    _, current = gresconf.read(config)
    # gres.conf may describe the whole cluster: only this node's lines count here
    return gresconf.differences(current, text, node)


EXIT_REFUSED = 3      # gres apply would drop GPUs the deployed file has (docs/gres.md)
_GPU_FILE = re.compile(r"nvidia(\d+)$")


def gpu_count(ng: Any) -> int:
    """Physical GPUs of one node's parsed GRES: distinct /dev/nvidiaN files of its
    gpu lines (a MIG line's MultipleFiles= starts with its GPU's), plus File-less Count=."""
    minors = {m.group(1) for name, files in ng.devices if name == "gpu"
              for f in files.split(",") if (m := _GPU_FILE.search(f))}
    return len(minors) + sum(c for (name, _), c in ng.counts.items() if name == "gpu")


def _gres_summary(ng: Any) -> dict[tuple[str, str], int]:
    """What slurm.conf's ``Gres=`` says of a node: a count per (name, type)."""
    out: dict[tuple[str, str], int] = {}
    for (name, _), d in ng.devices.items():
        out[(name, d.type or "")] = out.get((name, d.type or ""), 0) + 1
    for (name, key), c in ng.counts.items():
        out[(name, key)] = out.get((name, key), 0) + c
    return out


@gres.command()
@gres_options
@click.option("--config", "config", required=True, metavar="PATH", help="gres.conf to write.")
@click.option("--no-backup", is_flag=True, help="Do not keep PATH.bak.")
@click.option("--force", is_flag=True, help="Write even when the hardware read shows fewer GPUs than "
              "PATH has (a GPU really removed); without it that is refused, exit 3.")
@click.pass_context
def apply(ctx: click.Context, config: str, no_backup: bool, force: bool, **kw: Any) -> None:
    """Write gres.conf when it changed (atomic, backup), then say what to restart.

    Refuses (exit 3, nothing written) to drop GPUs the deployed file has:
    NVML unavailable at boot reads as a node without GPUs.
    """
    from ..confgen import gresconf

    text, view, nodes = _render(kw)
    old = read_config(config) if os.path.exists(config) else None
    if old == text:
        click.echo(f"slurm-gpu: {config} is up to date; nothing written")
        return
    wanted = gresconf.parse(text.splitlines(True), "generated")
    understood = True
    try:
        current = gresconf.parse(old.splitlines(True), config) if old is not None else {}
    except InputError as e:
        # Replacing a broken or hand-made file is what apply is for; only the
        # advice gets coarser (treat every device as new).
        click.echo(f"slurm-gpu: note: previous file not understood: {e.what} ({e.where})", err=True)
        current, understood = {}, False
    if not force:
        for n in nodes:
            had, has = gpu_count(gresconf.node_gres(current, n)), gpu_count(gresconf.node_gres(wanted, n))
            if has < had:
                click.echo(f"slurm-gpu: refusing to drop GPUs: {n} has {had} in the deployed file, the "
                           f"hardware read shows {has}; nothing written (--force writes it anyway) ({config})",
                           err=True)
                ctx.exit(EXIT_REFUSED)
    target = gresconf.apply(config, text, backup=None if no_backup else ".bak")
    click.echo(f"slurm-gpu: wrote {target}" + (f" (previous kept as {target}.bak)" if old is not None
                                               and not no_backup else ""))
    for line in gresconf.restart_advice(current, wanted):
        click.echo(line)
    if not understood:
        click.echo("slurm-gpu: the previous file could not be compared: restart slurmctld too")
    if not understood or any(_gres_summary(gresconf.node_gres(current, n))
                             != _gres_summary(gresconf.node_gres(wanted, n)) for n in nodes):
        # slurmctld checks a node's gres.conf against slurm.conf's Gres=: a node
        # whose slurmd reports fewer GRES than that is drained (invalid).
        click.echo("slurm-gpu: slurm.conf's node line must say the same (every node's copy):")
        for g in view.groups:
            for nl in g.node_lines:
                click.echo(nl)
        click.echo("slurm-gpu: then restart slurmctld and slurmd on every node (Slurm 22.05: "
                   "node changes need a restart; 23.11 and later: or scontrol reconfigure)")
