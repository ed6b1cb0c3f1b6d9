"""``slurm-gpu cluster collect|check|render``: every node's model at once.

Thin front end over :mod:`slurm_gpu.cluster` (see docs/cluster.md).
"""
from __future__ import annotations

import json
import os
from typing import Any

import click

from ..confgen.confsafe import comment
from ..errors import InputError, UsageError
from .gres import build_options, naming_options


def _scope(nodes: str | None, partition: str | None, slurm: dict[str, Any] | None) -> list[str] | None:
    """The node names the command is about (None: every collected and every Slurm node)."""
    from ..confgen import hostlist
    names: list[str] | None = None
    if nodes:
        try:
            names = hostlist.expand(nodes)
        except InputError as e:
            raise UsageError(f"--nodes: {e.what}") from None
    if partition:
        if slurm is None:
            raise UsageError("--partition needs Slurm's node list, and scontrol did not answer")
        inpart = [n for n, s in slurm.items() if partition in s.partitions]
        if not inpart:
            raise UsageError(f"no node in partition {partition!r}")
        members = set(inpart)
        names = [n for n in (names or inpart) if n in members]
    return names


def _slurm_nodes(path: str | None) -> dict[str, Any]:
    from ..cluster import slurmview
    if path:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return slurmview.parse_show_nodes(f.read())
        except OSError as e:
            raise InputError(f"cannot read scontrol output: {e.strerror}", path) from None
    return slurmview.show_nodes()


def _beside_slurm_conf(name: str) -> str | None:
    conf = os.environ.get("SLURM_CONF")
    cands = [os.path.join(os.path.dirname(conf), name)] if conf else []
    cands += [f"/etc/slurm/{name}", f"/etc/slurm-llnl/{name}"]
    for p in cands:
        if os.path.exists(p):
            return p
    return cands[0] if conf else None


def _warn(col: Any, source: str) -> None:
    """Who besides root could have written the entries (store.load_dir): one line each."""
    for w in col.warnings:
        click.echo(f"slurm-gpu: warning: {w} ({comment(source)})", err=True)


@click.group()
def cluster() -> None:
    """Collect every node's model through Slurm; render and check the whole cluster."""


@cluster.command()
@click.option("--from", "source", required=True, metavar="DIR", help="Collected models (cluster collect, "
              "or [cluster] publish_dir).")
@click.option("--nodes", metavar="HOSTLIST", help="Only these nodes.")
@click.option("--partition", metavar="P", help="Only the nodes of this partition.")
@click.option("--gres-conf", metavar="PATH", help="Deployed gres.conf (default: beside $SLURM_CONF).")
@click.option("--topology-conf", metavar="PATH",
              help="Deployed topology.conf or topology.yaml (default: beside $SLURM_CONF).")
@click.option("--slurm-nodes-from", "slurm_file", metavar="FILE",
              help="Read `scontrol show node --oneliner` output from FILE instead of asking slurmctld.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@naming_options
@click.pass_context
def check(ctx: click.Context, source: str, nodes: str | None, partition: str | None, gres_conf: str | None,
          topology_conf: str | None, slurm_file: str | None, as_json: bool, **kw: Any) -> None:
    """Compare every collected node with Slurm's view, gres.conf and topology.conf (exit 1 on drift)."""
    from ..cluster import drift, store
    from ..confgen import gresconf, topocheck
    from .confgen_io import read_config
    store.require_dir(source)
    slurm = _slurm_nodes(slurm_file)
    scope = _scope(nodes, partition, slurm)
    col = store.load_dir(source, set(scope) if scope is not None else None, identity=False)
    opts = build_options(kw, col.nodes)
    col.refuse_unsafe(opts)
    _warn(col, source)
    notes: list[str] = []
    gres_path = gres_conf or _beside_slurm_conf("gres.conf")
    current_gres = None
    if gres_path and os.path.exists(gres_path):
        _, current_gres = gresconf.read(gres_path)
    else:
        notes.append(f"no gres.conf{f' at {gres_path}' if gres_path else ''}: not checked")
    topo: list[str] = []
    if scope is None:
        tpath = topology_conf or _beside_slurm_conf("topology.conf")
        if not topology_conf and (tpath is None or not os.path.exists(tpath)):
            tpath = _beside_slurm_conf("topology.yaml") or tpath
        current_topo = None
        if tpath and os.path.exists(tpath):
            text = read_config(tpath)
            current_topo = (topocheck.parse_yaml(text, tpath) if tpath.endswith((".yaml", ".yml"))
                            else topocheck.parse_conf(text.splitlines(True), tpath))
        topo, tnotes = drift.topology_drift(col.nodes, current_topo, tpath or "topology.conf")
        notes += tnotes
    else:
        notes.append("topology not checked for a subset of nodes (--nodes/--partition)")
    rep = drift.compare(col.nodes, slurm, gres_conf=current_gres, opts=opts,
                        unreadable={n: b.reason for n, b in col.bad.items()}, scope=scope, topology=topo,
                        notes=notes)
    if as_json:
        click.echo(json.dumps(rep.to_json(), indent=1))
    else:
        s = rep.summary()
        click.echo(f"slurm-gpu: cluster check: {s['nodes']} node(s): {s['match']} match, {s['differ']} differ"
                   + (", topology differs" if rep.topology else ""))
        for line in rep.lines():
            click.echo(line)
        for n in rep.notes:
            click.echo(f"slurm-gpu: note: {n}", err=True)
    if rep.drift:
        ctx.exit(1)


@cluster.command()
@click.option("--from", "source", required=True, metavar="DIR", help="Collected models.")
@click.option("-o", "--output", metavar="DIR",
              help="Write gres.conf, topology.conf (or .yaml) and nodes.conf here (atomically); default stdout.")
@click.option("--format", "fmt", type=click.Choice(["conf", "yaml"]), default="conf", show_default=True,
              help="topology.conf, or topology.yaml (Slurm >= 25.05).")
@click.option("--block-sizes", metavar="N[,N...]", help="Slurm BlockSizes (default: inferred).")
@click.option("--placeholders", is_flag=True, help="topograph layout (Slurm >= 26.05), see topology render.")
@click.option("--drop-small-blocks", is_flag=True, help="Leave out NVLink domains smaller than BlockSizes[0].")
@click.option("--skip-unreadable", is_flag=True,
              help="Render without the nodes whose entry cannot be read (default: refuse).")
@naming_options
def render(source: str, output: str | None, fmt: str, block_sizes: str | None, placeholders: bool,
           drop_small_blocks: bool, skip_unreadable: bool, **kw: Any) -> None:
    """gres.conf plus the block topology (from the collected NVLink cliques), in one call."""
    from ..cluster import store
    from ..confgen import block, topology
    from ..confgen.gres import build_gres_view
    from ..confgen.templating import render as render_template
    from .confgen_io import emit, node_notes
    col = store.load_dir(source)
    opts = build_options(kw, col.nodes)
    col.refuse_unsafe(opts)
    _warn(col, source)
    for b in col.bad.values():
        click.echo(f"slurm-gpu: {comment(b.node)}: unreadable entry: {comment(b.reason)} ({comment(b.path)})",
                   err=True)
    if col.bad and not skip_unreadable:
        raise InputError(f"{len(col.bad)} unreadable entr{'y' if len(col.bad) == 1 else 'ies'}: fix or remove "
                         "them, or pass --skip-unreadable", source)
    if not col.nodes:
        raise InputError("no collected node models", source)
    inputs = [f"{len(col.nodes)} node models from {source}"]
    view = build_gres_view(col.nodes, opts, inputs=inputs, where=col.where)
    for note in node_notes(col.nodes) + list(view.notes):
        click.echo(f"slurm-gpu: note: {note}", err=True)
    files = {"gres.conf": render_template("gres.conf.j2", view.as_template_vars())}
    nodes_text = "".join(nl + "\n" for g in view.groups for nl in g.node_lines)
    if view.slurmd_parameters:
        nodes_text = f"SlurmdParameters={','.join(view.slurmd_parameters)}\n" + nodes_text
    files["nodes.conf"] = nodes_text
    if any(g.fabric is not None for n in col.nodes.values() for g in n.gpus):
        sizes = None
        if block_sizes:
            try:
                sizes = [int(x) for x in block_sizes.split(",")]
            except ValueError:
                raise UsageError(f"--block-sizes wants N[,N...], got {block_sizes!r}") from None
        b = block.build_blocks(col.nodes, sizes, placeholders=placeholders, drop_small=drop_small_blocks)
        files[f"topology.{fmt}"] = topology.render_topology(None, b, fmt=fmt, inputs=inputs)
        for n in b.notes:
            click.echo(f"slurm-gpu: note: {n}", err=True)
    else:
        click.echo("slurm-gpu: note: no collected node reports an NVLink fabric clique: no block topology",
                   err=True)
    if output:
        os.makedirs(output, exist_ok=True)
        for name, text in files.items():
            emit(text, os.path.join(output, name))
        click.echo(f"slurm-gpu: wrote {', '.join(files)} to {output} ({len(col.nodes)} nodes)")
        return
    for name, text in files.items():
        click.echo(f"# ---- {name} ----")
        click.echo(text, nl=False)


@cluster.command()
@click.option("-o", "--output", "directory", required=True, metavar="DIR",
              help="Where the snapshots go, one DIR/<node>.json per node (created; must be visible from "
                   "the nodes with --via slurm).")
@click.option("--nodes", metavar="HOSTLIST", help="Nodes to collect (default: every node, or the partition's).")
@click.option("--partition", metavar="P", help="Collect this partition's nodes, in a job in this partition.")
@click.option("--reservation", metavar="R", help="Run the collection job in this reservation.")
@click.option("--account", metavar="A", help="Charge the collection job to this account.")
@click.option("--qos", metavar="Q", help="QOS of the collection job.")
@click.option("--time", "time_limit", metavar="T", help="Time limit of the collection job (srun --time).")
@click.option("--srun-arg", "srun_args", multiple=True, metavar="ARG",
              help="Any further srun option, e.g. --srun-arg=--mem=1G (repeatable).")
@click.option("--via", type=click.Choice(["slurm", "clush"]), default="slurm", show_default=True,
              help="slurm: one srun task per node; clush: ClusterShell, for nodes Slurm cannot reach.")
@click.option("--clush-worker", type=click.Choice(["ssh", "exec"]), default="ssh", show_default=True,
              help="ClusterShell worker for --via clush (exec: run locally per node, like clush -R exec).")
@click.option("--include-unavailable", is_flag=True,
              help="With --via clush: also try nodes Slurm reports down or drained.")
@click.option("--command", "command", metavar="PATH",
              help="slurm-gpu on the nodes (default: this venv's, the same path on every node).")
@click.option("--timeout", type=float, default=600.0, show_default=True,
              help="Seconds until nodes that have not answered are reported failed.")
@click.option("--json", "as_json", is_flag=True, help="Print the per-node report as JSON.")
@click.pass_context
def collect(ctx: click.Context, directory: str, nodes: str | None, partition: str | None,
            reservation: str | None, account: str | None, qos: str | None, time_limit: str | None,
            srun_args: tuple[str, ...], via: str, clush_worker: str, include_unavailable: bool,
            command: str | None, timeout: float, as_json: bool) -> None:
    """Run `slurm-gpu snapshot record` on every node and gather the snapshots into DIR.

    Each node is reported collected, failed (with the reason) or skipped
    (down or drained in Slurm); exit 1 unless every node was collected.
    """
    from ..cluster import collect as col
    from ..cluster import slurmview
    from ..confgen import hostlist
    from ..errors import SlurmGpuError
    if timeout <= 0:
        raise UsageError("--timeout must be > 0")
    slurm = None
    try:
        slurm = slurmview.show_nodes()
    except SlurmGpuError as e:
        if via == "slurm" or not nodes:
            raise
        click.echo(f"slurm-gpu: note: no node states from Slurm ({e.what}): trying every node", err=True)
    targets = _scope(nodes, partition, slurm) or sorted(slurm or {}, key=hostlist.natural_key)
    if not targets:
        raise UsageError("no nodes to collect")
    run_on, early = col.plan(targets, slurm if not (via == "clush" and include_unavailable) else None)
    os.makedirs(directory, exist_ok=True)

    def report(o: Any, done: int, total: int) -> None:
        click.echo(f"slurm-gpu: [{done}/{total}] {o.node}: {o.status}"
                   + (f": {o.detail}" if o.detail else ""), err=True)

    done_before = 0
    for o in early.values():
        done_before += 1
        report(o, done_before, len(targets))
    result = col.Collection()
    if run_on:
        def shifted(o: Any, done: int, total: int) -> None:
            report(o, done + done_before, len(targets))
        cmd = command or col.default_command()
        if via == "slurm":
            passthrough = [f"--{k}={v}" for k, v in (("partition", partition), ("reservation", reservation),
                                                      ("account", account), ("qos", qos), ("time", time_limit))
                           if v] + list(srun_args)
            result = col.via_slurm(directory, run_on, passthrough=passthrough, command=cmd, timeout=timeout,
                                   report=shifted)
        else:
            result = col.via_clush(directory, run_on, command=cmd, timeout=timeout, report=shifted,
                                   worker=clush_worker)
    outcomes = {**early, **result.outcomes}
    final = col.Collection(outcomes={n: outcomes[n] for n in targets}, elapsed=result.elapsed)
    if as_json:
        click.echo(json.dumps(final.to_json(), indent=1))
    else:
        by: dict[tuple[str, str], list[str]] = {}
        for o in final.outcomes.values():
            if o.status != col.COLLECTED:
                by.setdefault((o.status, o.detail), []).append(o.node)
        for (status, detail), ns in by.items():
            stale = [n for n in ns if os.path.exists(os.path.join(directory, f"{n}.json"))]
            click.echo(f"{hostlist.fold(ns)}: {status}: {detail}"
                       + (f" (previous model kept for {hostlist.fold(stale)})" if stale else ""))
        click.echo(f"slurm-gpu: cluster collect: {final.count(col.COLLECTED)} collected, "
                   f"{final.count(col.FAILED)} failed, {final.count(col.SKIPPED)} skipped, of {len(targets)} "
                   f"node(s) in {final.elapsed:.1f} s into {directory}")
    if final.count(col.COLLECTED) != len(targets):
        ctx.exit(1)
