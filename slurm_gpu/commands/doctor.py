"""``slurm-gpu doctor [--json]``: this node's setup against what slurm-gpu needs.

One line per finding (``OK|WARNING|CRITICAL|UNKNOWN check: message``) and
Nagios exit codes, so it can run from a monitoring system or a package's
post-install test.  The checks are in :mod:`slurm_gpu.doctor`.
"""
from __future__ import annotations

import json

import click


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.option("--slurm-conf", metavar="PATH", default=None,
              help="slurm.conf to check [$SLURM_CONF, else /etc/slurm/slurm.conf, "
                   "else a configless slurmd's /run/slurm/conf/slurm.conf].")
@click.option("--node", metavar="NAME", default=None,
              help="This node's Slurm name, for gres.conf [$SLURMD_NODENAME, else the hostname].")
@click.option("--no-gres", is_flag=True, help="Skip the gres.conf comparison (it reads NVML).")
@click.option("--role", type=click.Choice(["gpu", "login"]), default="gpu", show_default=True,
              help="gpu: every check; login: the plugin, plugstack line, config file and venv "
                   "that srun/sbatch/salloc load (no slurmd, prolog, health check, gres.conf, GPUs).")
@click.pass_context
def doctor(ctx: click.Context, as_json: bool, slurm_conf: str | None, node: str | None,
           no_gres: bool, role: str) -> None:
    """Check this node's Slurm setup for slurm-gpu (exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN).

    Checks the plugstack line and that the SPANK plugin was built for this
    slurmd's version and starts an interpreter that still exists, that the
    config file it names (and the one the prolog and health check find)
    exists and loads, Prolog/Epilog/PrologFlags, HealthCheckProgram with its
    Interval and NodeState, gres.conf against the hardware, that the venv is
    readable by every user and writable by root only, that the package's
    last upgrade went live, and nvidia-persistenced; on a cgroup node, the
    cgroup mode, cgroup.conf's constraints, slurmd's Delegate=yes,
    IgnoreSystemd, 26.05's CgroupJobIdPaths and a running job's device limit.
    """
    from .. import doctor as d
    from .gres import drift
    facts = d.gather(slurm_conf, node, None if no_gres or role == "login" else drift, role=role)
    findings = d.run_checks(facts, role)
    status = d.worst(findings)
    if as_json:
        click.echo(json.dumps({"status": d.NAMES[status], "slurmd": facts.slurmd_version,
                               "slurm_conf": facts.slurm_conf_path,
                               "findings": [x.to_dict() for x in findings]}, indent=2))
    else:
        for x in findings:
            click.echo(x.line())
    ctx.exit(status)
