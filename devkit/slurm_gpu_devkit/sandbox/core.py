"""The :class:`Sandbox`: a real Slurm on this host, modelled on a GPU server.

``up`` starts a private munged, slurmctld and one ``slurmd -N`` per node,
each node claiming the modelled machine's CPUs, memory and GPUs (fake device
files).  Everything ``up`` starts or reserves is recorded in
``DIR/run/sandbox.json`` as soon as it exists, so ``down`` (in this process
or another) stops exactly that, even after a failed ``up``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

from slurm_gpu.errors import SlurmGpuError, UsageError
from slurm_gpu.fsutil import atomic_write
from slurm_gpu.hw.model import Node
from slurm_gpu.runner import RunAs
from . import accounting, chroot, conf, configs, devices, netns, places, procs, registry, versions
from .layout import Layout
from .machine import Machine, load, resolve
from .options import SandboxOptions, require_root
from .versions import SlurmRelease

STATE_VERSION = 1
SAFE_PATH = conf.SAFE_PATH


class Sandbox:
    """One sandbox directory; ``up()`` to start, ``down()`` to stop.

    >>> sb = Sandbox("/tmp/sb", SandboxOptions(nodes=2)).up()
    >>> sb.env["SLURM_CONF"]
    '/tmp/sb/etc/slurm.conf'
    >>> sb.down()
    """

    def __init__(self, directory: str | os.PathLike[str],
                 options: SandboxOptions | None = None, **kw: Any) -> None:
        self.layout = Layout.of(directory)
        self.options = options or SandboxOptions(**kw)
        if options is not None and kw:
            raise TypeError("give SandboxOptions or keyword options, not both")
        self.state: dict[str, Any] = {}
        self._children: list[subprocess.Popen[bytes]] = []
        self.model: Node | None = self.options.model
        self.machine: Machine | None = None
        self.release: SlurmRelease | None = None
        self._place: "places.Place | None" = None

    # -- public read-only views -------------------------------------------------
    @property
    def dir(self) -> Path:
        return self.layout.root

    @property
    def conf(self) -> Path:
        return self.layout.slurm_conf

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm clients (srun, sbatch, scontrol) of this sandbox.

        A Slurm from a Debian root puts ``DIR/bin`` first: wrappers that run
        that Slurm's clients inside the root (as root; see :meth:`client_argv`).
        """
        path = f"{self.layout.bin}:{SAFE_PATH}" if self._holder() else SAFE_PATH
        return {"SLURM_CONF": str(self.conf), "PATH": path}

    @property
    def slurm_version(self) -> str:
        """The Slurm this sandbox runs, e.g. ``24.11.5``."""
        return str(self.state.get("slurm", {}).get("full") or versions.host_version() or "?")

    def _holder(self) -> int | None:
        ch = self.state.get("chroot")
        return int(ch["holder"]) if ch and ch.get("holder") else None

    def client_argv(self, argv: Sequence[str], run_as: "RunAs | None" = None,
                    cwd: str = "/") -> tuple[list[str], "RunAs | None"]:
        """(argv, identity to drop to) that run a client command of this sandbox.

        On the host's Slurm that is *argv* itself.  On a Slurm from a Debian
        root, root enters the sandbox's namespace and root first and only
        then drops to the job user (a user cannot enter a namespace); in a
        VM, the command goes to the guest's agent (``sandbox run``).
        """
        return self.place.client_argv(self, argv, run_as, cwd)

    def run_client(self, argv: Sequence[str], user: str | None = None,
                   timeout: float = 300.0) -> Any:
        """Run *argv* where the nodes run, as root or *user* (``sandbox run``)."""
        return self.place.run(self, argv, user, timeout)

    def fault(self, node: str, fault: str | None, gpu: int = 0) -> str:
        """Inject a named fault drill or an overlay file on *node* (None clears);
        returns the line ``sandbox fault`` prints (the drain reason to expect)."""
        return self.place.fault(self, node, fault, gpu)

    @property
    def place(self) -> "places.Place":
        """Where the nodes run (recorded in the state file)."""
        if self._place is None:
            self._place = (places.named(self.state["place"]) if self.state.get("place")
                           else places.choose(self.options) if not self.state
                           else places.named("debian-root" if self.state.get("chroot") else "host"))
        return self._place

    def _root(self) -> Path:
        return Path(self.state["slurm"]["root"])

    @property
    def node_names(self) -> list[str]:
        if self.state.get("nodes"):
            return [n["name"] for n in self.state["nodes"]]
        return [f"{self.options.node_prefix}{i}" for i in range(1, self.options.nodes + 1)]

    @classmethod
    def attach(cls, directory: str | os.PathLike[str]) -> "Sandbox":
        """The sandbox recorded in *directory* (for ``down`` and ``status``)."""
        sb = cls(directory)
        sb.state = sb._read_state() or {}
        return sb

    # -- state file -------------------------------------------------------------
    def _read_state(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.layout.state_file.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise SlurmGpuError(f"unreadable sandbox state: {e}", str(self.layout.state_file)) from None

    def _save(self) -> None:
        atomic_write(self.layout.state_file, json.dumps(self.state, indent=1) + "\n")

    def _daemons(self) -> list[procs.Proc]:
        return [procs.Proc.from_dict(d) for d in self.state.get("daemons", [])]

    def _add_daemon(self, proc: procs.Proc) -> None:
        self.state.setdefault("daemons", []).append(proc.to_dict())
        self._save()

    def _reap(self) -> None:
        for p in self._children:
            p.poll()

    def _log_of(self, name: str) -> Path:
        if name == "slurmctld":
            cand = [self.layout.slurmctld_log, self.layout.log / "slurmctld.stdout"]
        elif name == "munged":
            cand = [self.layout.log / "munged.log"]
        else:
            cand = [self.layout.slurmd_log(name), self.layout.log / f"slurmd-{name}.stdout"]
        for c in cand:
            if c.exists() and c.stat().st_size:
                return c
        return cand[0]

    def _dead_daemon(self) -> str | None:
        self._reap()
        for p in self._daemons():
            if not procs.alive(p):
                return p.name
        return None

    # -- up ---------------------------------------------------------------------
    def up(self) -> "Sandbox":
        """Start the sandbox and wait until every node is idle; returns self."""
        require_root()
        o = self.options
        if o.nodes < 1:
            raise UsageError("a sandbox needs at least one node", "--nodes")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]{0,15}", o.node_prefix):
            raise UsageError(f"node prefix must be a letter then up to 15 letters or digits, "
                             f"got {o.node_prefix!r}", "--node-prefix")
        old = self._read_state()
        if old and any(procs.alive(procs.Proc.from_dict(d)) for d in old.get("daemons", [])):
            raise SlurmGpuError("a sandbox is already running here; run `slurm-gpu sandbox down` "
                                "first", str(self.layout.root))
        if old:
            # A previous run that crashed may have left namespaces or reservations.
            Sandbox.attach(self.layout.root).down()
        t0 = time.monotonic()
        self._place = places.choose(o)
        self.place.prepare(self)
        assert self.release is not None     # every place's prepare sets it
        if self.model is None:
            self.machine = resolve(o.machine or getattr(self.place, "default_machine", None))
            self.model = load(self.machine)
        if not self.model.gpus:
            raise SlurmGpuError("the machine model has no GPUs", self.machine_label)
        L = self.layout
        for d in (L.root, *L.dirs()):
            d.mkdir(parents=True, exist_ok=True)
        # Fresh logs, so a start-up error shows this run's lines, not the last run's;
        # no hook wrappers of an earlier run (Prolog= is a glob over the directory).
        for f in L.log.iterdir():
            if f.is_file():
                f.unlink()
        for kind in ("prolog.d", "epilog.d"):
            shutil.rmtree(L.etc / kind, ignore_errors=True)
        # Job users must reach slurm.conf and the munge socket.
        for d in (L.root, L.etc, L.munge, L.dev, L.lib, L.var):
            os.chmod(d, 0o755)
        names = [f"{o.node_prefix}{i}" for i in range(1, o.nodes + 1)]
        self.state = {"version": STATE_VERSION, "dir": str(L.root), "cluster": L.cluster_name,
                      "machine": self.machine_label, "daemons": [], "netns": [],
                      "reservations": {"ports": [], "nets": [], "cgroup": []}, "cgroup": o.cgroup,
                      "place": self.place.name,
                      "slurm": {"version": self.release.version, "full": self.release.full,
                                "root": str(self.release.root) if self.release.root else None}}
        self._save()
        try:
            self.place.start(self, names)
        except BaseException:
            self.down()
            raise
        self.state["up_seconds"] = round(time.monotonic() - t0, 3)
        self._save()
        return self

    @property
    def machine_label(self) -> str:
        if self.machine is not None:
            return str(self.machine.directory or self.machine.label)
        return self.state.get("machine") or (self.model.hostname if self.model else "?")

    def _up(self, names: list[str]) -> None:
        o, L = self.options, self.layout
        extra_ports = 2 if o.accounting else 0       # MariaDB, slurmdbd
        ports = registry.reserve_ports(1 + len(names) + extra_ports, L.root)
        self.state["reservations"]["ports"] = ports
        if o.accounting:
            self.state["accounting"] = {"db_port": ports[-2], "dbd_port": ports[-1]}
            ports = ports[:-2]
        self._save()
        if o.cgroup:
            self.state["reservations"]["cgroup"] = registry.reserve_names("cgroup", names, L.root)
            self._save()
        ctld_port, node_ports = ports[0], ports[1:]
        host = socket.gethostname().split(".")[0]
        nets: list[netns.NodeNet] = []
        if o.netns:
            netns.check_tools()
            blocks = registry.reserve_nets(len(names), L.root, netns.host_addresses())
            self.state["reservations"]["nets"] = blocks
            nets = netns.plan(L.key, names, blocks)
            for n in nets:
                self.state["netns"].append(n.to_dict())
                self._save()
                netns.create(n)
            specs = tuple(conf.NodeSpec(n.node, n.node, n.node_addr, p) for n, p in zip(nets, node_ports))
            ctld_addr = nets[0].host_addr
        else:
            specs = tuple(conf.NodeSpec(n, host, "127.0.0.1", p) for n, p in zip(names, node_ports))
            ctld_addr = "127.0.0.1"
        self.state["nodes"] = [{"name": s.name, "addr": s.addr, "port": s.port} for s in specs]
        self.state["ctld_port"] = ctld_port
        self.state["ctld_addr"] = ctld_addr
        self._save()

        devices.make_devices(L.dev, self.model)
        if self.release is not None and self.release.chrooted:
            self._start_holder()
        configs.write_configs(self, specs, host, ctld_addr, ctld_port)
        for n in specs:
            (L.spool / n.name).mkdir(exist_ok=True)
        self._start_daemons(nets, ctld_addr, ctld_port)
        self.state["idle_seconds"] = round(self._wait_idle(), 3)

    def _start_holder(self) -> None:
        """Start the process whose namespace the chrooted daemons, hooks and clients share."""
        L = self.layout
        assert self.release is not None and self.release.root is not None
        (L.run / chroot.READY).unlink(missing_ok=True)
        proc, child = procs.spawn("chroot", chroot.holder_argv(self.release.root, L),
                                  log=L.log / "chroot.stdout", cwd=L.run,
                                  env={"PATH": SAFE_PATH})
        self._children.append(child)
        self._add_daemon(proc)
        chroot.wait_ready(L, lambda: procs.alive(proc))
        atomic_write(L.run / "chroot.pid", f"{proc.pid}\n")
        self.state["chroot"] = {"holder": proc.pid, "mntns": chroot.mntns_inode(proc.pid)}
        self._save()
        list(chroot.write_clients(L, self.release.root, self.release.version))

    def _in_root(self, wd: str = "/") -> list[str]:
        """argv prefix running a command in the chrooted sandbox (empty on the host's Slurm)."""
        holder = self._holder()
        return chroot.enter(holder, self._root(), wd) if holder else []

    def _start_daemons(self, nets: list[netns.NodeNet], ctld_addr: str, ctld_port: int) -> None:
        L = self.layout
        env = {"PATH": SAFE_PATH, "SLURM_CONF": str(L.slurm_conf)}
        if not L.munge_key.exists():
            atomic_write(L.munge_key, os.urandom(1024), mode=0o400)
        L.munge_socket.unlink(missing_ok=True)
        pre = self._in_root(str(L.run))
        proc, child = procs.spawn("munged", [
            *pre, "/usr/sbin/munged", "--foreground", f"--socket={L.munge_socket}",
            f"--key-file={L.munge_key}", f"--pid-file={L.run}/munged.pid",
            f"--log-file={L.log}/munged.log", f"--seed-file={L.munge}/seed"],
            log=L.log / "munged.stdout", cwd=L.run, env=env)
        self._children.append(child)
        self._add_daemon(proc)
        from .waiting import wait_path
        wait_path(L.munge_socket, 10.0, "munged", L.log / "munged.log", self._dead_daemon)
        os.chmod(L.munge_socket, 0o777)
        if self.options.accounting:
            self._start_accounting(env, pre)

        proc, child = procs.spawn("slurmctld", [*pre, "/usr/sbin/slurmctld", "-D", "-c", "-f", str(L.slurm_conf)],
                                  log=L.log / "slurmctld.stdout", cwd=L.run, env=env)
        self._children.append(child)
        self._add_daemon(proc)
        from .waiting import wait_listening
        wait_listening(ctld_addr, ctld_port, 15.0, "slurmctld", self._log_of("slurmctld"),
                       self._dead_daemon)
        by_node = {n.node: n for n in nets}
        for name in self.node_names:
            enter_net = netns.enter(by_node[name]) if name in by_node else None
            proc, child = procs.spawn(f"slurmd:{name}",
                                      [*pre, "/usr/sbin/slurmd", "-D", "-N", name, "-f", str(L.slurm_conf)],
                                      log=L.log / f"slurmd-{name}.stdout", cwd=L.run, env=env,
                                      preexec=enter_net)
            self._children.append(child)
            self._add_daemon(proc)
        self._start_node_services(pre, by_node)

    def _start_node_services(self, pre: list[str], by_node: dict[str, Any]) -> None:
        """What the package runs on a GPU node beside slurmd, for every node
        whose GPUs the simulator models: ``xid-watch`` (its NVML event
        listener, which drains at once on a fault) when the health check is
        installed, and ``monitor`` (the accounting sampler) when ``[acct]
        enabled`` is on, each as its systemd unit runs it.  ``down`` stops
        them with the daemons."""
        hooks = self.state.get("hooks", {})
        if not hooks.get("nvml_sim"):
            return
        services = (["xid-watch"] if hooks.get("health") else []) + \
            (["monitor"] if self._acct_enabled() else [])
        from .install import install_node_service
        L = self.layout
        for service in services:
            wrapper = install_node_service(L, self.options.venv, service)
            for name in self.node_names:
                enter_net = netns.enter(by_node[name]) if name in by_node else None
                # xid-watch is told its node; the monitor, as on a real node,
                # takes it from the environment (SLURMD_NODENAME, else the host name).
                argv = [*pre, str(wrapper)] + (["--node", name] if service == "xid-watch" else [])
                proc, child = procs.spawn(f"{service}:{name}", argv,
                                          log=L.log / f"{service}-{name}.log", cwd=L.run,
                                          env={"PATH": SAFE_PATH, "SLURMD_NODENAME": name},
                                          preexec=enter_net)
                self._children.append(child)
                self._add_daemon(proc)

    def _acct_enabled(self) -> bool:
        """``[acct] enabled`` in the config ``up`` wrote (the monitor exits at once without it)."""
        import tomllib
        try:
            with open(self.layout.config_toml, "rb") as f:
                return tomllib.load(f).get("acct", {}).get("enabled") is True
        except (OSError, tomllib.TOMLDecodeError):
            return False

    def _start_accounting(self, env: dict[str, str], pre: list[str]) -> None:
        """MariaDB, then slurmdbd, then the cluster's registration (before slurmctld).

        MariaDB runs on the host; slurmdbd and ``sacctmgr`` are the
        sandbox's Slurm's (*pre* enters a Debian root's namespace).
        """
        from .waiting import wait_listening
        L, acct = self.layout, self.state["accounting"]
        db = accounting.Paths.of(L)
        accounting.init_db(db)
        proc, child = procs.spawn("mariadbd", accounting.mariadbd_argv(db, acct["db_port"]),
                                  log=L.log / "mariadbd.stdout", cwd=db.root, env=env)
        self._children.append(child)
        self._add_daemon(proc)
        accounting.wait_ready(db, 30.0, self._dead_daemon)
        password = accounting.make_db_user(db)
        atomic_write(L.etc / "slurmdbd.conf",
                     accounting.slurmdbd_conf(L, acct["dbd_port"], acct["db_port"], password),
                     mode=0o600)
        proc, child = procs.spawn("slurmdbd", [*pre, "/usr/sbin/slurmdbd", "-D"],
                                  log=L.log / "slurmdbd.stdout", cwd=L.run, env=env)
        self._children.append(child)
        self._add_daemon(proc)
        wait_listening("127.0.0.1", acct["dbd_port"], 30.0, "slurmdbd", L.log / "slurmdbd.log",
                       self._dead_daemon)
        # self.env: a Debian root's sacctmgr through DIR/bin (the host's is 22.05).
        accounting.register(L.cluster_name, {**env, **self.env},
                            accounting.existing_users(list(self.options.accounting_users)))

    def _wait_idle(self) -> float:
        from .waiting import wait_idle

        def log_of(name: str) -> Path:
            return self._log_of(name)
        return wait_idle(self.node_names, self.env, timeout=self.options.timeout, logs=log_of,
                         check_alive=self._dead_daemon)

    # -- down -------------------------------------------------------------------
    def down(self, *, grace: float = 5.0) -> dict[str, Any]:
        """Stop everything ``up`` started; returns what was done.

        Jobs are cancelled first so their epilogs run (MPS daemons, MIG
        instances are cleaned by the project's epilog), then slurmd and
        slurmctld get TERM, then KILL after *grace* seconds, then munged.
        Processes those daemons left behind (slurmstepd is not slurmd's
        child) are found by their open files under DIR and by namespace.
        """
        return self.place.stop(self, grace=grace)

    # -- status -----------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Daemons (alive or not) and node states, as plain data."""
        state = self.state or self._read_state() or {}
        daemons = [{"name": p.name, "pid": p.pid, "alive": procs.alive(p)} for p in self._daemons()]
        nodes: dict[str, str] = {}
        if any(d["alive"] and d["name"] in ("slurmctld", "qemu") for d in daemons):
            nodes = self.place.node_states(self)
        return {"dir": str(self.layout.root), "cluster": state.get("cluster"),
                "machine": state.get("machine"), "conf": str(self.conf),
                "slurm": state.get("slurm", {}).get("full") or versions.host_version(),
                "place": state.get("place", "host"), "vm": state.get("vm"),
                "slurm_root": state.get("slurm", {}).get("root"),
                "running": any(d["alive"] for d in daemons), "daemons": daemons,
                "nodes": nodes, "up_seconds": state.get("up_seconds"),
                "netns": [n["netns"] for n in state.get("netns", [])]}

    def __enter__(self) -> "Sandbox":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()


def remove_dir(directory: str | os.PathLike[str]) -> None:
    """Delete a stopped sandbox's directory (refuses while daemons run)."""
    sb = Sandbox.attach(directory)
    if sb.status()["running"]:
        raise SlurmGpuError("sandbox still running", str(sb.dir))
    shutil.rmtree(sb.dir, ignore_errors=True)
