"""Where a sandbox's nodes run: one interface, three implementations.

* :class:`Host`: this host's own Slurm (Debian 12's 22.05), the daemons
  started directly;
* :class:`DebianRoot`: a newer Slurm from a Debian root, the daemons
  chrooted in one private mount namespace (``--slurm 24.11|26.05``);
* :class:`~slurm_gpu.sandbox.vmplace.Vm`: a systemd + cgroup v2 Debian node
  in QEMU (``--vm``), the daemons as Debian's systemd units.

:class:`~slurm_gpu.sandbox.core.Sandbox` does what is common (refusing a
second ``up``, the state file, the model, ``down`` from any process) and
asks its place for the rest; ``sandbox.json`` records the place's name, so
``Sandbox.attach`` finds it again.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence

from slurm_gpu.errors import SlurmGpuError

if TYPE_CHECKING:
    from slurm_gpu.runner import RunAs


class Place(Protocol):
    """What a sandbox needs from where its nodes run."""

    name: str

    def prepare(self, sb: Any) -> None:
        """Check this host can run it and get what it runs from (roots, images)."""

    def start(self, sb: Any, names: list[str]) -> None:
        """Start every daemon of the cluster and wait until every node is idle."""

    def client_argv(self, sb: Any, argv: Sequence[str], run_as: "RunAs | None",
                    cwd: str) -> tuple[list[str], "RunAs | None"]:
        """(argv, identity to drop to) that run a Slurm client command there."""

    def run(self, sb: Any, argv: Sequence[str], user: str | None, timeout: float) -> Any:
        """Run *argv* there as root or *user*; a result with returncode/stdout/stderr."""

    def stop(self, sb: Any, grace: float) -> dict[str, Any]:
        """Stop everything ``start`` started (idempotent, from any process)."""

    def node_states(self, sb: Any) -> dict[str, str]:
        """sinfo's state of each node (empty when its controller is not running)."""

    def fault(self, sb: Any, node: str, fault: str | None, gpu: int) -> str:
        """Inject a named drill or an overlay file on *node* (None: clear); the line to print."""


class Host:
    """The host's own Slurm, its daemons this host's processes."""

    name = "host"

    def prepare(self, sb: Any) -> None:
        from . import accounting, versions
        from .options import require_slurm
        o = sb.options
        sb.release = versions.ensure_root(versions.resolve(o.slurm))
        require_slurm(sb.release.root)
        if o.accounting:
            # The slurmdbd of the Slurm that runs: the host's, or the root's.
            accounting.require(sb.release.root, sb.release.suite)

    def start(self, sb: Any, names: list[str]) -> None:
        sb._up(names)

    def client_argv(self, sb: Any, argv: Sequence[str], run_as: "RunAs | None",
                    cwd: str) -> tuple[list[str], "RunAs | None"]:
        return list(argv), run_as

    def run(self, sb: Any, argv: Sequence[str], user: str | None, timeout: float) -> Any:
        from slurm_gpu.runner import SAFE_PATH, run
        full, drop = self.client_argv(sb, argv, _run_as(user), str(sb.dir))
        # The system PATH: inside a Debian root that finds the root's own
        # clients (DIR/bin's wrappers are for root on the host).
        return run(full, timeout, env={**sb.env, "PATH": SAFE_PATH}, check=False, run_as=drop,
                   cwd=str(sb.dir))

    def stop(self, sb: Any, grace: float) -> dict[str, Any]:
        from . import teardown
        return teardown.down(sb, grace=grace)

    def node_states(self, sb: Any) -> dict[str, str]:
        from .waiting import node_states
        try:
            return node_states(sb.env)
        except SlurmGpuError:
            return {}

    def fault(self, sb: Any, node: str, fault: str | None, gpu: int) -> str:
        import os

        from ..sim import drills
        from . import nodesim
        layout = sb.layout
        if fault is None:
            nodesim.set_fault(layout, node, {})
            return f"slurm-gpu: sandbox fault: cleared on {node}"
        if fault in drills.DRILLS or not os.path.isfile(fault):
            bus, reason = nodesim.drill(layout, node, fault, gpu)
            then = f"expect: {reason}" if reason else "expect: no drain"
            return f"slurm-gpu: sandbox fault: {fault} on {node} GPU {gpu} ({bus}); {then}"
        from slurm_gpu.hw.snapshot import load_overlay
        nodesim.set_fault(layout, node, load_overlay(fault))
        return f"slurm-gpu: sandbox fault: injected {fault} on {node}"


class DebianRoot(Host):
    """A Debian root's Slurm: the host's processes, chrooted in one mount namespace."""

    name = "debian-root"

    def prepare(self, sb: Any) -> None:
        from . import chroot
        super().prepare(sb)
        assert sb.release.root is not None
        chroot.sync_venv(sb.release.root, sb.options.venv)

    def client_argv(self, sb: Any, argv: Sequence[str], run_as: "RunAs | None",
                    cwd: str) -> tuple[list[str], "RunAs | None"]:
        # Root enters the sandbox's namespace and root first and only then
        # drops to the job user (a user cannot enter a namespace); the
        # command is looked up on the root's PATH.
        from . import chroot
        holder = sb._holder()
        if holder is None:
            return list(argv), run_as
        return [*chroot.enter(holder, sb._root(), cwd, run_as), *argv], None


def _run_as(user: str | None) -> "RunAs | None":
    import os
    import pwd

    from slurm_gpu.errors import UsageError
    from slurm_gpu.runner import RunAs
    if user is None:
        return None
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise UsageError(f"no such user {user!r}", "--user") from None
    return RunAs(pw.pw_uid, pw.pw_gid, tuple(os.getgrouplist(user, pw.pw_gid)))


def named(name: str | None) -> Place:
    """The place a state file records (``host`` for sandboxes from before places)."""
    if name == "vm":
        from .vmplace import Vm
        return Vm()
    if name == "debian-root":
        return DebianRoot()
    return Host()


def choose(options: Any) -> Place:
    """The place *options* ask for."""
    if getattr(options, "vm", False):
        from .vmplace import Vm
        return Vm()
    from . import versions
    return DebianRoot() if versions.resolve(options.slurm).chrooted else Host()
