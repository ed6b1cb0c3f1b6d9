"""``slurm-gpu sandbox up|down|status``: a real Slurm on this host with fake GPUs."""
from __future__ import annotations

import json
import time

import click


def _pairs(values: tuple[str, ...], opt: str) -> list[tuple[str, str]]:
    from slurm_gpu.errors import UsageError
    out = []
    for v in values:
        key, sep, val = v.partition("=")
        if not sep or not key:
            raise UsageError(f"expected KEY=VALUE, got {v!r}", opt)
        out.append((key, val))
    return out


def config_settings(settings: tuple[str, ...]) -> dict[str, dict[str, object]]:
    """``--set SECTION.KEY=VALUE`` options as the config sections they set (see :func:`_toml_value`)."""
    from slurm_gpu.errors import UsageError
    extra: dict[str, dict[str, object]] = {}
    for key, val in _pairs(settings, "--set"):
        sec, dot, name = key.partition(".")
        if not dot or not sec or not name:
            raise UsageError(f"expected SECTION.KEY=VALUE, got {key}={val}", "--set")
        extra.setdefault(sec, {})[name] = _toml_value(val)
    return extra


def _toml_value(text: str) -> object:
    """``5`` -> 5, ``true`` -> True, ``{"1" = 0}`` or ``[1, 2]`` -> a TOML inline
    table or array, anything else stays a string."""
    if text in ("true", "false"):
        return text == "true"
    if text[:1] in ("{", "["):
        import tomllib

        from slurm_gpu.errors import UsageError
        try:
            return tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"bad TOML value {text!r}: {e}", "--set") from None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


@click.group(short_help="Run a real Slurm on this machine with fake GPUs.")
def sandbox() -> None:
    """Run a real Slurm (Debian's slurmctld, slurmd, munge) on this machine.

    Each node is a `slurmd -N` modelled on a recorded GPU server: its
    slurm.conf line and gres.conf come from the machine model, and its GPUs
    are fake device files. Needs root.
    """


@sandbox.command("up")
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False),
              help="Directory for the whole sandbox (created if missing).")
@click.option("--nodes", "-N", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Number of nodes (slurmd processes), named n1..nN (see --node-prefix).")
@click.option("--machine", "-m", default=None, metavar="NAME|PATH",
              help="Machine to model: a recorded machine shipped with slurm-gpu (e.g. h100-mig, "
                   "dgx-h100, mini-2numa) or a directory/snapshot/hwloc XML path.  "
                   "[default: h100-sxm-8x]")
@click.option("--node-prefix", default="n", show_default=True,
              help="Node names are <prefix>1..<prefix>N.")
@click.option("--netns", is_flag=True, help="Run each node in its own network + UTS namespace.")
@click.option("--prolog/--no-prolog", default=None,
              help="Install the project's prolog.d/epilog.d.  [default: when present]")
@click.option("--health/--no-health", default=None,
              help="Run `slurm-gpu health --slurm` as HealthCheckProgram.  [default: when installed]")
@click.option("--health-interval", type=click.IntRange(1), default=5, show_default=True,
              help="HealthCheckInterval in seconds.")
@click.option("--spank/--no-spank", default=None,
              help="Build and load the SPANK plugin.  [default: when installed]")
@click.option("--sim/--no-sim", "simulate", default=None,
              help="Give each node the NVML simulator and the MPS control stand-in, so "
                   "--gpu-mps/--gpu-mig jobs and health faults work without a GPU.  "
                   "[default: when the machine has NVML facts]")
@click.option("--mig-mode", type=click.Choice(["per-job", "recorded"]), default="per-job",
              show_default=True,
              help="per-job: MIG mode on (no instances) for MIG-capable GPUs recorded without "
                   "instances, so --gpu-mig jobs can carve them; recorded: as recorded.")
@click.option("--spank-arg", multiple=True, metavar="KEY=VALUE",
              help="Extra plugstack.conf argument for the SPANK plugin (repeatable).")
@click.option("--set", "settings", multiple=True, metavar="SECTION.KEY=VALUE",
              help="Add a key to DIR/etc/slurm-gpu.toml, e.g. health.kernel_log=/tmp/k.log "
                   "or 'spank.numa_node_map={\"1\" = 0}' (TOML inline table).")
@click.option("--slurm-conf", "slurm_conf", multiple=True, metavar="KEY=VALUE",
              help="Set or override a slurm.conf parameter (repeatable).")
@click.option("--type-map", multiple=True, metavar="KEY=TYPE",
              help="GPU type for gres.conf, by NVML/pci.ids type, bus id or 0x<device id> "
                   "(repeatable; as in `slurm-gpu gres render`).")
@click.option("--cgroup", is_flag=True, help="Use proctrack/cgroup and task/cgroup.")
@click.option("--accounting", is_flag=True,
              help="Start slurmdbd with a private MariaDB under DIR, so sacct works.")
@click.option("--timeout", type=click.FloatRange(1), default=30.0, show_default=True,
              help="Seconds to wait for every node to be idle.")
@click.option("--slurm", "slurm", default=None, metavar="VERSION",
              help="Slurm release to run: 22.05 (Debian 12's), 24.11 (Debian 13 root) or 26.05 "
                   "(sid root), built once under /var/cache/slurm-gpu.  [default: the host's]")
@click.option("--vm", is_flag=True,
              help="Run the nodes in a systemd + cgroup v2 Debian VM (QEMU); see docs/sandbox.md.")
@click.option("--boot-timeout", type=click.FloatRange(1), default=240.0, show_default=True,
              help="With --vm: seconds until the VM's guest answers.")
def up_cmd(directory: str, nodes: int, machine: str | None, node_prefix: str, netns: bool, prolog: bool | None,
           health: bool | None, health_interval: int, spank: bool | None,
           simulate: bool | None, mig_mode: str, spank_arg: tuple[str, ...],
           settings: tuple[str, ...], slurm_conf: tuple[str, ...], type_map: tuple[str, ...],
           cgroup: bool, accounting: bool, timeout: float, slurm: str | None, vm: bool,
           boot_timeout: float) -> None:
    """Start a sandbox and print `export SLURM_CONF=...`."""
    from slurm_gpu.runner import SAFE_PATH
    from ..sandbox import Sandbox, SandboxOptions, require_root

    require_root()
    extra = config_settings(settings)
    opts = SandboxOptions(
        nodes=nodes, machine=machine, netns=netns, prolog=prolog, health=health,
        health_interval=health_interval, spank=spank, simulate=simulate, sim_mig=mig_mode,
        spank_args=dict(_pairs(spank_arg, "--spank-arg")),
        extra_config=extra, slurm_conf=dict(_pairs(slurm_conf, "--slurm-conf")), cgroup=cgroup,
        accounting=accounting,
        timeout=timeout, node_prefix=node_prefix, slurm=slurm, vm=vm, boot_timeout=boot_timeout,
        gres_options={"type_map": dict(_pairs(type_map, "--type-map"))} if type_map else {})
    sb = Sandbox(directory, opts).up()
    hooks = [k for k, v in sb.state.get("hooks", {}).items() if v]
    if accounting:
        hooks.append("accounting")
    names = sb.node_names
    span = names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"
    click.echo(f"slurm-gpu: sandbox up: Slurm {sb.slurm_version}, {len(names)} node(s) {span} modelled on "
               f"{sb.machine_label}, idle in {sb.state['up_seconds']:.2f} s"
               f"{' (' + ', '.join(hooks) + ')' if hooks else ''}", err=True)
    if vm:
        st = sb.state["vm"]
        click.echo(f"slurm-gpu: sandbox up: VM ({st['accel']}) booted in {st['boot_seconds']:.1f} s; "
                   f"run commands in it with: slurm-gpu sandbox run --dir {sb.dir} -- CMD", err=True)
        return
    click.echo(f"export SLURM_CONF={sb.conf}")
    if sb.env["PATH"] != SAFE_PATH:   # a Slurm from a Debian root: its clients are wrappers
        click.echo(f"export PATH={sb.layout.bin}:$PATH")


@sandbox.command("down")
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False),
              help="The sandbox directory given to `up`.")
def down_cmd(directory: str) -> None:
    """Stop everything `up` started in DIR (by recorded PID), remove its namespaces."""
    from slurm_gpu.errors import SlurmGpuError
    from ..sandbox import Sandbox, require_root
    from ..sandbox.layout import Layout

    require_root()
    if not Layout.of(directory).state_file.exists():
        raise SlurmGpuError("no sandbox recorded here", str(Layout.of(directory).state_file))
    t0 = time.monotonic()
    rep = Sandbox.attach(directory).down()
    killed = f", {len(rep['killed'])} needed KILL" if rep["killed"] else ""
    click.echo(f"slurm-gpu: sandbox down: stopped {len(rep['stopped'])} daemon(s){killed} "
               f"in {time.monotonic() - t0:.2f} s", err=True)


@sandbox.command("fault")
@click.option("--dir", "directory", type=click.Path(file_okay=False),
              help="The sandbox directory given to `up`.")
@click.option("--node", "node_opt", default=None, help="The node (same as NODE), e.g. n2.")
@click.option("--gpu", type=click.IntRange(0), default=0, show_default=True,
              help="The GPU (its NVML index, as nvidia-smi numbers it) a named fault hits.")
@click.option("--clear", is_flag=True, help="Remove the node's injected faults.")
@click.option("--list", "list_", is_flag=True, help="List the named faults and what each does.")
@click.argument("node", required=False)
@click.argument("fault", required=False, metavar="NAME|OVERLAY")
def fault_cmd(directory: str | None, node_opt: str | None, gpu: int, clear: bool, list_: bool,
              node: str | None, fault: str | None) -> None:
    """Inject a named fault (`--list`) or a fault overlay file (docs/snapshots.md).

    A named fault writes what a real one makes, together: the driver's kernel
    line into the node's simulated kernel log, and NVML's view (an event, a
    counter, a lost GPU) into its simulator.  The node's health check, prolog
    and SPANK plugin see it at their next read, as on a GPU node whose
    hardware broke; `--clear` repairs the NVML half.
    """
    from slurm_gpu.errors import UsageError
    from ..sandbox import require_root
    from ..sim import drills

    if list_:
        click.echo(drills.listing(), nl=False)
        return
    if node_opt is not None:          # the older `--node N [OVERLAY]` form
        if fault is None and node is not None:
            node, fault = node_opt, node
        elif node is None:
            node = node_opt
        else:
            raise UsageError("give the node once (NODE or --node)", "sandbox fault")
    if not directory:
        raise UsageError("give the sandbox directory (--dir D)", "sandbox fault")
    if not node:
        raise UsageError("give the node (sandbox fault --dir D NODE NAME)", "sandbox fault")
    require_root()   # the simulator state and the kernel log are root's, as a GPU is
    if clear == (fault is not None):
        raise UsageError("give a fault name (--list), an overlay file, or --clear", "sandbox fault")
    from ..sandbox import Sandbox
    click.echo(Sandbox.attach(directory).fault(node, None if clear else fault, gpu), err=True)


@sandbox.command("run", context_settings={"ignore_unknown_options": True,
                                          "allow_interspersed_args": False})
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False),
              help="The sandbox directory given to `up`.")
@click.option("--user", "user", default=None, metavar="NAME",
              help="Run as this job user (root enters a Debian root first, then drops).")
@click.option("--timeout", type=click.FloatRange(1), default=300.0, show_default=True,
              help="Seconds before the command is killed.")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
def run_cmd(directory: str, user: str | None, timeout: float, argv: tuple[str, ...]) -> None:
    """Run a Slurm client command (srun, sbatch, sinfo...) against the sandbox.

    The same on every --slurm: on the host's Slurm it is the command itself,
    on a Debian root's Slurm it runs inside that root.  Prints the command's
    output and exits with its status.
    """
    from slurm_gpu.errors import SlurmGpuError
    from ..sandbox import Sandbox, require_root
    from ..sandbox.layout import Layout

    require_root()
    if not Layout.of(directory).state_file.exists():
        raise SlurmGpuError("no sandbox recorded here", str(Layout.of(directory).state_file))
    res = Sandbox.attach(directory).run_client(list(argv), user, timeout)
    click.echo(res.stdout, nl=False)
    click.echo(res.stderr, nl=False, err=True)
    raise click.exceptions.Exit(res.returncode)


@sandbox.command("status")
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False),
              help="The sandbox directory given to `up`.")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status_cmd(directory: str, as_json: bool) -> None:
    """Show the sandbox's daemons and node states (exit 1 when it is not running)."""
    from slurm_gpu.errors import SlurmGpuError
    from ..sandbox import Sandbox
    from ..sandbox.layout import Layout

    if not Layout.of(directory).state_file.exists():
        raise SlurmGpuError("no sandbox recorded here", str(Layout.of(directory).state_file))
    st = Sandbox.attach(directory).status()
    if as_json:
        click.echo(json.dumps(st, indent=2))
    else:
        click.echo(f"sandbox  {st['dir']}  cluster {st['cluster']}  machine {st['machine']}")
        root = f"  (chrooted from {st['slurm_root']})" if st.get("slurm_root") else ""
        click.echo(f"slurm    {st.get('slurm') or '?'}{root}")
        click.echo(f"conf     {st['conf']}")
        for d in st["daemons"]:
            click.echo(f"daemon   {d['name']:<12} pid {d['pid']:<8} {'running' if d['alive'] else 'gone'}")
        for n, s in st["nodes"].items():
            click.echo(f"node     {n:<12} {s}")
        for ns in st["netns"]:
            click.echo(f"netns    {ns}")
        if not st["daemons"]:
            click.echo("stopped")
    if not st["running"]:
        raise click.exceptions.Exit(1)
