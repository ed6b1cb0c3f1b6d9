"""``slurm-gpu inventory``: a thin click front end.

The body and the text rendering are in :mod:`slurm_gpu.commands.inventory_run`,
which :mod:`slurm_gpu.fastcli` also runs without click.
"""
from __future__ import annotations

import click

from .inventory_run import ranges, render_text, show, size  # noqa: F401 - their old home


@click.command()
@click.option("--hwloc-xml", "hwloc_xml", metavar="FILE",
              help="Read an lstopo XML export (hwloc 2.x or 1.x) instead of the live node; no NVML.")
@click.option("--snapshot", metavar="FILE",
              help="Replay a snapshot written by 'slurm-gpu snapshot record'.")
@click.option("--overlay", metavar="FILE",
              help="With --snapshot: apply a fault overlay (see docs/snapshots.md).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the inventory as JSON (GPUs ordered by minor number, or PCI bus id "
                   "with hwloc only).")
def inventory(hwloc_xml: str | None, snapshot: str | None, overlay: str | None,
              as_json: bool) -> None:
    """Show this node's packages, NUMA nodes, cores and GPUs.

    Without options the live node is read (hwloc plus NVML, or the snapshot
    named by the node config's [node] snapshot key).
    """
    show(hwloc_xml, snapshot, overlay, as_json)
