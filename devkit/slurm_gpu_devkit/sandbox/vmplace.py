"""The nodes in a VM (``sandbox up --vm``): the :class:`~.places.Place` over :mod:`.vm`.

The whole cluster runs inside one QEMU guest; on the host there is one
process (QEMU, recorded in ``sandbox.json`` like any daemon) and files
under DIR: ``run/vm-config/`` (the config disk's tree) and
``run/vm-config.img``, ``log/console.log``.  ``down`` cancels the jobs
through the agent (so the epilogs run), then stops QEMU: the guest's disk
is a throw-away snapshot, so nothing of it outlives the VM.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from slurm_gpu.errors import SlurmGpuError, UsageError
from slurm_gpu.fsutil import atomic_write
from . import procs, registry, vm

if TYPE_CHECKING:
    from slurm_gpu.runner import RunAs

# The guest's sandbox directory: what `sandbox fault` (run in the guest) finds
# as DIR/var/<node>/{sim.json,kernel.log}, the simulated GPUs of each node.
GUEST_DIR = "/var/lib/slurm-gpu-sandbox"
SIM_DIR = GUEST_DIR + "/var"
MPS_CONTROL = "/usr/bin/nvidia-cuda-mps-control"
# `up` options the VM does not have, refused before anything starts: (flag, set?, why).
REFUSED: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("--netns", lambda o: bool(o.netns),
     "the VM's nodes share the guest's one network stack (each slurmd on its own port of 127.0.0.1)"),
    ("--accounting", lambda o: bool(o.accounting),
     "the VM's image has no slurmdbd and no MariaDB; use it without --vm"),
)


class Vm:
    """A systemd + cgroup v2 Debian node in QEMU."""

    name = "vm"
    default_machine = vm.DEFAULT_MACHINE

    # -- prepare ---------------------------------------------------------------
    def prepare(self, sb: Any) -> None:
        from . import versions
        o = sb.options
        for flag, on, why in REFUSED:
            if on(o):
                raise UsageError(f"{flag} is not available with --vm: {why}", "sandbox up --vm")
        mm, suite = vm.suite_of(o.slurm)
        vm.require_tools(vm.TOOLS)
        sb.layout.log.mkdir(parents=True, exist_ok=True)
        build_log = sb.layout.log / "vm-image.log"
        if versions.SUITES.get(mm):
            # The Debian root of that Slurm (scripts/debian-root.sh) is the
            # image's starting point: built once, shared with --slurm.
            versions.ensure_root(versions.SlurmRelease(mm, versions.SUITES[mm]))
        self.image = vm.ensure_image(suite, build_log)
        sb.release = versions.SlurmRelease(mm, None, None, self.image.slurm_full)

    # -- start -----------------------------------------------------------------
    def start(self, sb: Any, names: list[str]) -> None:
        L, o = sb.layout, sb.options
        port = registry.reserve_ports(1, L.root)[0]
        sb.state["reservations"]["ports"] = [port]
        token = vm.new_token()
        token_file = L.run / "vm-token"
        atomic_write(token_file, token + "\n", mode=0o600)
        tree, disk = L.run / "vm-config", L.run / "vm-config.img"
        self._write_config(sb, names, tree, token)
        vm.make_config_disk(tree, disk)
        console = L.log / "console.log"
        console.write_bytes(b"")
        cpus, numa = vm.vm_topology(sb.model)
        sb.state["vm"] = {"port": port, "console": str(console), "image": str(self.image.directory),
                          "cpus": cpus, "numa": numa}
        sb.state["nodes"] = [{"name": n, "addr": "127.0.0.1", "port": 6818 + i}
                             for i, n in enumerate(names)]
        sb._save()
        agent = vm.Agent(port, token)

        def launch(accel: str) -> procs.Proc:
            argv = vm.qemu_argv(self.image, disk, console, port, accel, cpus, numa)
            proc, child = procs.spawn("qemu", argv, log=L.log / "qemu.stdout", cwd=L.run,
                                      env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
            sb._children.append(child)
            sb._add_daemon(proc)
            return proc

        def probe(accel: str) -> bool:
            # A kernel that starts prints within a second or two, even under TCG.
            proc = launch(accel)
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline and procs.alive(proc):
                if console.stat().st_size > 0:
                    return True
                time.sleep(0.2)
            procs.stop([proc], grace=2.0, reap=sb._reap)
            sb.state["daemons"] = [d for d in sb.state["daemons"] if d["pid"] != proc.pid]
            sb._save()
            console.write_bytes(b"")
            return False

        t0 = time.monotonic()
        accel = "kvm" if vm.kvm_usable(console, probe) else "tcg"
        if not any(d["name"] == "qemu" for d in sb.state["daemons"]):
            launch(accel)
        sb.state["vm"]["accel"] = accel
        sb._save()
        qemu = procs.Proc.from_dict(next(d for d in sb.state["daemons"] if d["name"] == "qemu"))
        boot_timeout = o.boot_timeout
        sb.state["vm"]["boot_seconds"] = round(vm.wait_boot(agent, console, boot_timeout,
                                                            lambda: procs.alive(qemu)), 3)
        sb._save()
        self._wait_idle(sb, agent, names, max(o.timeout, 60.0), qemu)
        sb.state["idle_seconds"] = round(time.monotonic() - t0, 3)

    def _write_config(self, sb: Any, names: list[str], tree: Path, token: str) -> None:
        from slurm_gpu.confgen import GresOptions, gresconf
        from . import devices, install, nodesim
        from .toml import dumps
        o, L = sb.options, sb.layout
        prolog = o.prolog if o.prolog is not None else bool(install.scripts("prolog.d"))
        health = o.health if o.health is not None else True
        spank = o.spank if o.spank is not None else True
        guide = vm.guide_hooks(bool(prolog), o.health_interval if health else None)
        settings, lines = vm.guest_settings(
            L.cluster_name, sb.model, names, version=sb.release.version, guide=guide,
            gres_options=dict(o.gres_options), extra=dict(o.slurm_conf))
        gres = gresconf.render({n: sb.model for n in names},
                               GresOptions(dev_dir="/dev", **dict(o.gres_options)),
                               inputs=[sb.machine_label])
        plug = []
        if spank:   # the guide's plugstack line (docs/install.md)
            args = " ".join(f"{k}={v}" for k, v in o.spank_args.items())
            plug.append(f"required /opt/slurm-gpu/venv/lib/slurm-gpu/slurm_gpu_spank.so "
                        f"config={vm.GUEST_TOML}" + (f" {args}" if args else ""))
        extra_files: dict[str, bytes] = {}
        toml: dict[str, dict[str, Any]] = {"node": {"state_dir": "/var/lib/slurm-gpu/%n"},
                                           "repair": {"state_dir": "/var/lib/slurm-gpu/%n"}}
        snap = sb.machine.snapshot if sb.machine else None
        if snap is not None:
            extra_files["/etc/slurm-gpu/machine/snapshot.json"] = snap.read_bytes()
            toml["node"]["snapshot"] = "/etc/slurm-gpu/machine/snapshot.json"
        mdir = sb.machine.directory if sb.machine else None
        simulate = o.simulate
        if simulate is None:
            simulate = nodesim.available(mdir) and not nodesim.caller_configured(o.extra_config)
        if simulate:
            extra_files.update(self._sim_files(mdir, names, o.sim_mig))
            toml["node"]["nvml"] = f"sim:{SIM_DIR}/%n/{nodesim.STATE_NAME}"
            toml["mps"] = {"control": MPS_CONTROL, "base_dir": "/run/slurm-gpu/mps/%n"}
            toml["health"] = {"kernel_log": f"{SIM_DIR}/%n/{nodesim.KERNEL_LOG_NAME}"}
        for name, table in o.extra_config.items():
            toml.setdefault(name, {}).update(table)
        for name, text in o.etc_files.items():
            if "/" in name or name.startswith("."):
                raise UsageError(f"etc file name must be a plain file name: {name!r}")
            extra_files[f"/etc/slurm/{name}"] = text.encode()
        sb.state["hooks"] = {"prolog": bool(prolog), "epilog": bool(prolog), "health": bool(health),
                             "spank": bool(spank), "nvml_sim": bool(simulate)}
        devs = [(f"/dev/nvidia{m}", 195, m) for m in devices.gpu_minors(sb.model)]
        devs.append(("/dev/nvidiactl", 195, 255))
        devs += [(f"/dev/nvidia-caps/nvidia-cap{m}", 241, m) for m in devices.cap_minors(sb.model)]
        if not L.munge_key.exists():
            atomic_write(L.munge_key, os.urandom(1024), mode=0o400)
        vm.config_tree(tree, token=token, settings=settings, cgroup_conf=vm.guide_block("cgroup.conf"),
                       node_lines=lines, gres_conf=gres,
                       plugstack=plug, toml_text=dumps(toml, "slurm-gpu config of a sandbox VM "
                                                       "(generated by slurm-gpu sandbox up --vm)"),
                       munge_key=L.munge_key.read_bytes(), names=names, devices=devs,
                       extra_files=extra_files, machine=sb.machine_label)
        os.chmod(tree, 0o700)
        # The same config, readable on the host (what the guest runs with).
        atomic_write(L.slurm_conf, (tree / "files" / vm.GUEST_CONF.lstrip("/")).read_text())

    @staticmethod
    def _sim_files(mdir: Path | None, names: list[str], mig: str) -> dict[str, bytes]:
        """Each node's NVML simulator state, made as nodesim.prepare makes it."""
        import tempfile

        from ..sim.state import init_state_for_machine
        from . import nodesim
        assert mdir is not None
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "sim.json")
            init_state_for_machine(str(mdir), path)
            state = json.loads(Path(path).read_text())
        if mig == "per-job":
            nodesim.per_job_mig(state)
        text = (json.dumps(state, indent=1) + "\n").encode()
        out: dict[str, bytes] = {}
        for n in names:
            out[f"{SIM_DIR}/{n}/{nodesim.STATE_NAME}"] = text
            out[f"{SIM_DIR}/{n}/{nodesim.KERNEL_LOG_NAME}"] = b""
        return out

    def _wait_idle(self, sb: Any, agent: vm.Agent, names: list[str], timeout: float,
                   qemu: procs.Proc) -> None:
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            if not procs.alive(qemu):
                raise SlurmGpuError(f"the VM exited: {vm.console_tail(Path(sb.state['vm']['console']))}",
                                    sb.state["vm"]["console"])
            states = self._sinfo(agent)
            if states and all(states.get(n) == "idle" for n in names):
                return
            time.sleep(0.5)
        logs = agent.run(["sh", "-c", "tail -n 3 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd-*.log; "
                          "systemctl --failed --no-legend"], timeout=10)
        tail = " | ".join(l for l in logs.stdout.splitlines() if l.strip())[-600:]
        raise SlurmGpuError(f"the VM's nodes are not idle ({states or 'no answer from slurmctld'}): "
                            f"{tail}", "sandbox up --vm")

    @staticmethod
    def _sinfo(agent: vm.Agent) -> dict[str, str]:
        r = agent.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=10)
        if r.returncode != 0:
            return {}
        out = {}
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                out[parts[0]] = parts[1].lower()
        return out

    # -- use -------------------------------------------------------------------
    def agent(self, sb: Any) -> vm.Agent:
        st = sb.state.get("vm") or {}
        if not st.get("port"):
            raise SlurmGpuError("no VM recorded here", str(sb.layout.state_file))
        token = (sb.layout.run / "vm-token").read_text().strip()
        return vm.Agent(int(st["port"]), token)

    def client_argv(self, sb: Any, argv: Sequence[str], run_as: "RunAs | None",
                    cwd: str) -> tuple[list[str], "RunAs | None"]:
        # Root runs `sandbox run`, which asks the guest's agent (as the job
        # user, inside the guest, when one is given).
        user = None
        if run_as is not None:
            import pwd
            user = pwd.getpwuid(run_as.uid).pw_name
        return [sys.executable, "-m", "slurm_gpu", "sandbox", "run", "--dir", str(sb.dir),
                *(["--user", user] if user else []), "--", *argv], None

    def run(self, sb: Any, argv: Sequence[str], user: str | None, timeout: float) -> Any:
        return self.agent(sb).run(list(argv), user=user, timeout=timeout)

    def node_states(self, sb: Any) -> dict[str, str]:
        try:
            return self._sinfo(self.agent(sb))
        except (SlurmGpuError, OSError):
            return {}

    def fault(self, sb: Any, node: str, fault: str | None, gpu: int) -> str:
        # The same command, in the guest, on the guest's simulated GPUs; an
        # overlay file travels on stdin.
        argv = ["slurm-gpu", "sandbox", "fault", "--dir", GUEST_DIR, node]
        stdin = b""
        if fault is None:
            argv.append("--clear")
        elif os.path.isfile(fault):
            argv = ["sh", "-c", 'f=$(mktemp) && cat >"$f" && "$@" "$f"; rc=$?; rm -f "$f"; exit $rc',
                    "fault", *argv]
            stdin = Path(fault).read_bytes()
        else:
            argv += [fault, "--gpu", str(gpu)]
        r = self.agent(sb).run(argv, timeout=60, stdin=stdin)
        if r.returncode != 0:
            line = (r.stderr.strip().splitlines() or ["?"])[-1].removeprefix("slurm-gpu: ")
            raise SlurmGpuError(line, f"in the VM, node {node}")
        return r.stderr.strip()

    # -- stop ------------------------------------------------------------------
    def stop(self, sb: Any, grace: float) -> dict[str, Any]:
        state = sb.state or sb._read_state() or {}
        sb.state = state
        daemons = sb._daemons()
        report: dict[str, Any] = {"stopped": [], "killed": [], "swept": []}
        qemu = [p for p in daemons if procs.alive(p)]
        if qemu and state.get("vm", {}).get("port"):
            try:
                agent = self.agent(sb)
                if agent.ping(2.0):
                    # Jobs first, so their epilogs run (MPS daemons, MIG instances).
                    agent.run(["sh", "-c", "ids=$(squeue -h -o %A); [ -z \"$ids\" ] && exit 0; "
                               "scancel $ids; i=0; while [ $i -lt 150 ] && [ -n \"$(squeue -h -o %A)\" ]; "
                               "do sleep 0.1; i=$((i+1)); done"], timeout=30)
            except (SlurmGpuError, OSError):
                pass
        report["stopped"] = [p.name for p in qemu]
        # QEMU exits at once on TERM; the guest's disk is a discarded snapshot.
        report["killed"] += [p.name for p in procs.stop(qemu, grace=grace, reap=sb._reap)]
        sb._reap()
        res = state.get("reservations", {})
        registry.release("ports", res.get("ports", []), sb.layout.root)
        if state:
            state["daemons"] = []
            state["reservations"] = {"ports": [], "nets": [], "cgroup": []}
            state["down"] = True
            if sb.layout.run.is_dir():
                sb._save()
        return report


def quote(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
