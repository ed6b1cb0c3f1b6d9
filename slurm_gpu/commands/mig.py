"""``slurm-gpu mig``: plan layouts, apply the node baseline."""
from __future__ import annotations

import json

import click


@click.group()
def mig() -> None:
    """Plan and apply MIG layouts."""


def _or_dash(v: int | None) -> str:
    return "-" if v is None else str(v)


def _mib(v: int | None) -> str:
    return "-" if v is None else f"{v}MiB"


def _model_arg(text: str):  # type: ignore[no-untyped-def]
    """--model: a short name, an NVML name or a PCI device id; refused if unknown."""
    import re

    from ..mig.profiles import find_model, model_by_pci, unknown_model

    t = text.strip()
    m = model_by_pci(t) if re.fullmatch(r"0x[0-9a-fA-F]{1,8}", t) else find_model(t)
    if m is None:
        raise unknown_model(text, "--model")
    return m


@mig.command("plan")
@click.argument("layout")
@click.option("--model", "-m", required=True,
              help="GPU model: a short name (slurm-gpu mig profiles lists them), a PCI device "
                   "id such as 0x2941, or an NVML product name such as 'NVIDIA H100 80GB HBM3'.")
@click.option("--gpus", "ngpus", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Number of GPUs the layout is planned for.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan_cmd(layout: str, model: str, ngpus: int, as_json: bool) -> None:
    """Print where each instance of LAYOUT goes, or why it cannot fit."""
    from ..mig.planner import plan

    m = _model_arg(model)
    gpus = plan(layout, m, ngpus)
    if as_json:
        click.echo(json.dumps({"model": m.key, "gpus": [[p.to_dict() for p in g] for g in gpus]},
                              indent=2))
        return
    click.echo(f"# {m.title}: {m.compute_slices} compute / {m.memory_slices} memory slices")
    click.echo(f"{'GPU':>3}  {'INSTANCE':<14} {'GI-PROFILE':>10} {'PLACEMENT':>9}  "
               f"{'CI':>3} {'MEMORY':>9} {'SMS':>4}")
    for gi, g in enumerate(gpus):
        for p in g:
            click.echo(f"{gi:>3}  {p.name:<14} {_or_dash(p.gi_profile_id):>10} "
                       f"{f'{p.start}:{p.size}':>9}  {p.ci_slices:>2}c "
                       f"{_mib(p.memory_mb):>9} {_or_dash(p.sm_count):>4}")
        used = sorted(s for p in g for s in range(p.start, p.start + p.size))
        free = [s for s in range(m.memory_slices) if s not in used]
        click.echo(f"{gi:>3}  free memory slices: {','.join(map(str, free)) or 'none'}")


@mig.command("profiles")
@click.option("--model", "-m", default=None, help="Only this GPU model.")
def profiles_cmd(model: str | None) -> None:
    """List the shipped MIG profile and placement tables."""
    from ..mig.profiles import models as all_models

    models = (_model_arg(model),) if model else all_models()
    for m in models:
        pci = ", ".join(f"0x{x:04X}" for x in m.pci_device_ids) or "none published"
        click.echo(f"{m.key}: {m.title} (PCI {pci}; {', '.join(m.product_names) or 'no NVML name'})")
        for p in m.profiles:
            click.echo(f"  {p.name:<15} id {_or_dash(p.id):>2}  max {p.instances}  "
                       f"placements {{{','.join(map(str, p.starts))}}}:{p.size}  "
                       f"{_or_dash(p.memory_mb)} MiB  {_or_dash(p.sm_count)} SMs")
        for what, source in m.provenance:
            click.echo(f"  # {what}: {source}")


@mig.command("apply")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--select", "-c", default=None, help="Which entry of mig-configs to apply.")
@click.option("--check", "check_only", is_flag=True,
              help="Only report drift; exit 1 when the node differs from the config.")
@click.option("--gres-conf", default=None,
              help="Regenerate this gres.conf after a change (default: [mig] gres_conf).")
def apply_cmd(config: str, select: str | None, check_only: bool, gres_conf: str | None) -> None:
    """Make this node's MIG layout match CONFIG (mig-parted format); acts only on drift."""
    from ..errors import SlurmGpuError
    from ..hw import live
    from ..jobs import state as jobstate
    from ..jobs.settings import load
    from ..mig import baseline

    _, _, mig_settings = load()
    node = live.settings()
    entries = baseline.load_config(config, select)
    from ..hw import backend
    gpus = backend.open_gpus(backend.source_for(node, writes=True))
    diffs = baseline.diff(gpus, entries, config)
    drift = [d for d in diffs if d.drift]
    for d in diffs:
        state = "drift: " + "; ".join(d.actions) if d.drift else "ok"
        click.echo(f"GPU {d.index} ({d.name}): {state}")
    if check_only:
        if drift:
            raise SlurmGpuError(f"{len(drift)} GPU(s) differ from the MIG config", config)
        return
    if not drift:
        click.echo("slurm-gpu: MIG layout already matches; nothing changed")
        return
    out = gres_conf or mig_settings.gres_conf
    if out:
        _refuse_shared_gres_conf(out)      # before anything changes: a shared file is never rewritten
    # Jobs record their GPUs by UUID (their "index" is Slurm's, not NVML's).
    busy: dict[int, str] = {}
    for jobid in jobstate.list_jobs(node.state_dir):
        st = jobstate.load(node.state_dir, jobid)
        for g in st.gpus if st else ():
            if isinstance(g, dict) and (g.get("uuid") or g.get("minor") is not None):
                busy[gpus.find(uuid=g.get("uuid"), minor=g.get("minor"))] = jobid
            else:   # recorded by an older version: which GPU is unknown, so every one is busy
                busy.update({d.index: jobid for d in diffs})
    for line in baseline.apply(gpus, diffs, busy, config):
        click.echo(f"slurm-gpu: changed {line}")
    if out:
        from ..confgen import GresOptions, gresconf
        from ..hw import ThisNode, load_node
        text = gresconf.render({node_name(): load_node(ThisNode(node))}, GresOptions(dev_dir=mig_settings.dev_dir))
        target = gresconf.apply(out, text)
        click.echo(f"slurm-gpu: wrote {target} (previous kept as {target}.bak); "
                   "restart slurmd to pick up the new MIG GRES")


def _refuse_shared_gres_conf(path: str) -> None:
    """Refuse a gres.conf that other nodes read too: mig apply writes only this node's lines."""
    import os

    from ..confgen import gresconf
    if not os.path.exists(path):
        return
    _, conf = gresconf.read(path)
    gresconf.refuse_shared(conf, node_name(), ": mig apply would rewrite it for this node alone; nothing "
                           "changed (point --gres-conf / [mig] gres_conf at a per-node file, or use "
                           "AutoDetect=nvml)", path)


def node_name() -> str:
    from ..hw.live import node_name as nn
    return nn()
