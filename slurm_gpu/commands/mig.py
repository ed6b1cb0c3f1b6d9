"""``slurm-gpu mig``: plan layouts, apply the node baseline."""
from __future__ import annotations

import json

import click


@click.group()
def mig() -> None:
    """Plan and apply MIG layouts."""


@mig.command("plan")
@click.argument("layout")
@click.option("--model", "-m", required=True,
              help="GPU model: a100-40gb, a100-80gb, h100-80gb, h100-94gb, h100-nvl, h200, "
                   "b200, a30, or an NVML product name such as 'NVIDIA H100 80GB HBM3'.")
@click.option("--gpus", "ngpus", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Number of GPUs the layout is planned for.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan_cmd(layout: str, model: str, ngpus: int, as_json: bool) -> None:
    """Print where each instance of LAYOUT goes, or why it cannot fit."""
    from ..errors import UsageError
    from ..mig.planner import plan
    from ..mig.profiles import find_model, model_names

    m = find_model(model)
    if m is None:
        raise UsageError(f"unknown GPU model {model!r} (known: {', '.join(model_names())})",
                         "--model")
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
            click.echo(f"{gi:>3}  {p.name:<14} {p.gi_profile_id:>10} "
                       f"{f'{p.start}:{p.size}':>9}  {p.ci_slices:>2}c {p.memory_mb:>6}MiB "
                       f"{p.sm_count:>4}")
        used = sorted(s for p in g for s in range(p.start, p.start + p.size))
        free = [s for s in range(m.memory_slices) if s not in used]
        click.echo(f"{gi:>3}  free memory slices: {','.join(map(str, free)) or 'none'}")


@mig.command("profiles")
@click.option("--model", "-m", default=None, help="Only this GPU model.")
def profiles_cmd(model: str | None) -> None:
    """List the shipped MIG profile and placement tables."""
    from ..errors import UsageError
    from ..mig.profiles import MODELS, find_model

    models = MODELS
    if model:
        m = find_model(model)
        if m is None:
            raise UsageError(f"unknown GPU model {model!r}", "--model")
        models = (m,)
    for m in models:
        click.echo(f"{m.key}: {m.title} ({', '.join(m.product_names)})")
        for p in m.profiles:
            click.echo(f"  {p.name:<12} id {p.id:>2}  max {p.instances}  "
                       f"placements {{{','.join(map(str, p.starts))}}}:{p.size}  "
                       f"{p.memory_mb} MiB  {p.sm_count} SMs")
