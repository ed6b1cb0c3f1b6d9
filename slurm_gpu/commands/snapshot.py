"""``slurm-gpu snapshot record|show``: record this node, or replay a recording."""
from __future__ import annotations

import json

import click


@click.group()
def snapshot() -> None:
    """Record or replay a node's hardware answers (NVML + hwloc)."""


@snapshot.command("record")
@click.option("-o", "--output", "output", required=True, metavar="FILE",
              help="Snapshot file to write (atomically); '-' for stdout; %n is the Slurm node name.")
@click.option("--hwloc-xml", metavar="FILE", help="Use this lstopo XML instead of the live topology.")
@click.option("--nvml", "nvml_source", metavar="BACKEND:PATH",
              help="Record a registered GPU backend (the devkit's sim:STATE), not the driver.")
@click.option("--hostname", metavar="NAME", help="Host name to record (default: this host's).")
@click.option("--live", is_flag=True, help="Record the live NVML and hwloc even when [node] points elsewhere.")
def record(output: str, hwloc_xml: str | None, nvml_source: str | None, hostname: str | None, live: bool) -> None:
    """Record this node's NVML answers and hwloc topology into FILE.

    "This node" is what every component sees: the [node] config section's
    backend or snapshot when one is set (the sandbox), else the live
    machine.  Without a usable NVML (no driver, no GPU) the snapshot records
    that, and replays as a node with zero GPUs and a note saying why.
    """
    import sys

    from ..errors import InputError, UsageError
    from ..hw import live as hwlive
    from ..hw import snapshot as snap
    xml = None
    if hwloc_xml:
        try:
            with open(hwloc_xml) as f:
                xml = f.read()
        except OSError as e:
            raise InputError(f"cannot read hwloc XML: {e.strerror}", hwloc_xml) from None
    plugin: tuple[str, str] | None = None
    if nvml_source:
        plugin = hwlive.NodeSettings(nvml=nvml_source).nvml_plugin
        if plugin is None or not plugin[0] or not plugin[1]:
            raise UsageError(f"expected BACKEND:PATH, got {nvml_source!r}", "--nvml")
    configured = None if (live or plugin or hwloc_xml) else hwlive.settings()
    if configured is not None and configured.nvml_plugin:
        plugin = configured.nvml_plugin
    if configured is not None and not plugin and configured.snapshot:
        data = snap.rerecord(configured.snapshot, hostname=hostname or hwlive.node_name())
    else:
        api = None
        mig_minors = None
        source = "live"
        if plugin:
            from ..hw import backend
            api, _ = backend.open_api(backend.GpuSource(*plugin))
            # The optional calls of a registered backend (hw/backend.py).
            minors_of = getattr(api, "mig_minors", None)
            mig_minors = minors_of() if minors_of is not None else None
            source = f"{plugin[0]}:{plugin[1]}"
            if xml is None:
                xml_of = getattr(api, "hwloc_xml", None)
                xml = xml_of() if xml_of is not None else None
        data = snap.record(api=api, hwloc_xml=xml, hostname=hostname, mig_minors=mig_minors, source=source,
                           hwloc_source=hwloc_xml)
    node = data["node"]
    if output != "-":
        output = output.replace("%n", hwlive.node_name())
        snap.write(output, data)
    else:
        import json as _json
        sys.stdout.write(_json.dumps(data) + "\n")
        sys.stdout.flush()
    click.echo(f"slurm-gpu: recorded {len(node['gpus'])} GPU(s), {len(data['nvml']['calls'])} NVML answers "
               f"to {output if output != '-' else 'stdout'}", err=output == "-")


@snapshot.command("show")
@click.argument("file", metavar="FILE")
@click.option("--overlay", metavar="FILE", help="Fault overlay (JSON) applied while replaying.")
@click.option("--replay", "force_replay", is_flag=True,
              help="Rebuild from the recorded answers even without an overlay.")
@click.option("--json", "as_json", is_flag=True, help="Print the inventory JSON.")
def show(file: str, overlay: str | None, force_replay: bool, as_json: bool) -> None:
    """Replay snapshot FILE (optionally with a fault overlay) and print the node."""
    from ..hw import Snapshot, load_node
    from ..hw import snapshot as snap
    from ..hw.model import inventory_json
    ov = snap.load_overlay(overlay) if overlay else None
    if force_replay and not ov:
        data = snap.read_snapshot(file)
        node = snap.replay(data, file)
    else:
        node = load_node(Snapshot(file, ov, overlay_source=overlay or "overlay"))
    if as_json:
        click.echo(json.dumps(inventory_json(node), indent=2))
        return
    try:
        from .inventory_run import render_text
    except ImportError:  # pragma: no cover - inventory command not in this checkout
        click.echo(json.dumps(inventory_json(node), indent=2))
        return
    for line in render_text(node):
        click.echo(line)
