"""One network + UTS namespace per node (``--netns``).

Each node gets a veth pair: the host side carries 10.214.x.1/30, the node
side (inside the namespace) 10.214.x.2/30 with a route to the sandboxes'
10.214.0.0/16 back to the host, so every node reaches slurmctld on the first
node's host-side address (all host-side addresses are local to the root
namespace), and forwarding on the host-side veths lets nodes reach each
other through the host.

No default route: nothing beyond the host answers a namespace (no NAT), so
with one, a DNS query from a node (the host's resolv.conf) went out and
waited out the resolver's timeout (glibc: 5 s, 2 tries) on every name or
address not in /etc/hosts.  Slurm 24.11's slurmd names every connection it
accepts by a reverse lookup (conmgr ``_resolve_fd`` -> ``sockaddr_to_string``
-> ``xgetnameinfo``, a failure is not cached), so each RPC to it took 10 s,
slurmctld's ``MessageTimeout``: the prolog's ``REQUEST_LAUNCH_PROLOG`` reply
failed (``_rpc_prolog: Error talking to slurmctld``) and jobs hung in
COMPLETING.  Without the route the query fails at once (ENETUNREACH), as it
does in the root namespace, and the lookup falls back to the address.

slurmd enters its namespace with ``setns(2)`` in the child before exec, like
``nsenter --net`` does, and unshares a UTS namespace to carry the node's own
hostname.  ``ip netns exec`` is not used: it remounts /sys, and slurmd then
fails with "No filesystem mounted on /sys/fs/cgroup".
"""
from __future__ import annotations

import ctypes
import os
from dataclasses import asdict, dataclass
from typing import Callable

from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.runner import run
from .registry import NET_RANGE

CLONE_NEWNET = 0x40000000
CLONE_NEWUTS = 0x04000000
NETNS_DIR = "/run/netns"


@dataclass(frozen=True)
class NodeNet:
    node: str
    netns: str          # name under /run/netns
    veth_host: str
    veth_node: str
    host_addr: str
    node_addr: str
    block: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> "NodeNet":
        return cls(**d)  # type: ignore[arg-type]


def plan(key: str, nodes: list[str], blocks: list[int]) -> list[NodeNet]:
    """Names and addresses for each node (interface names stay <= 15 chars)."""
    from .registry import net_addrs
    out = []
    for i, (node, block) in enumerate(zip(nodes, blocks)):
        host, peer = net_addrs(block)
        out.append(NodeNet(node=node, netns=f"sg{key}-{node}", veth_host=f"sg{key}h{i}",
                           veth_node=f"sg{key}n{i}", host_addr=host, node_addr=peer, block=block))
    return out


def host_addresses() -> set[str]:
    """IPv4 addresses configured anywhere in the root namespace."""
    res = run(["ip", "-o", "-4", "addr", "show"], timeout=10)
    out = set()
    for line in res.stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            out.add(parts[parts.index("inet") + 1].split("/")[0])
    return out


def create(n: NodeNet) -> None:
    """Make the namespace and its veth pair, addresses, routes."""
    # Inside the namespace through nsenter, not `ip -n`: like `ip netns exec`,
    # `ip -n` remounts / and /sys, which fails where / is no mount point (chroot).
    inside = ["nsenter", f"--net={os.path.join(NETNS_DIR, n.netns)}", "ip"]
    steps = [
        ["ip", "netns", "add", n.netns],
        ["ip", "link", "add", n.veth_host, "type", "veth", "peer", "name", n.veth_node,
         "netns", n.netns],
        ["ip", "addr", "add", f"{n.host_addr}/30", "dev", n.veth_host],
        ["ip", "link", "set", n.veth_host, "up"],
        [*inside, "addr", "add", f"{n.node_addr}/30", "dev", n.veth_node],
        [*inside, "link", "set", n.veth_node, "up"],
        [*inside, "link", "set", "lo", "up"],
        # Only the sandboxes' range, never "default": see the module's docstring.
        [*inside, "route", "add", NET_RANGE, "via", n.host_addr],
    ]
    for argv in steps:
        run(argv, timeout=10)
    allow_node_to_node(n)


def allow_node_to_node(n: NodeNet) -> None:
    """Route packets that arrive on this node's host-side veth on to the other nodes.

    Slurm talks node to node: a multi-node step's slurmstepds report
    completion up a tree of their peers, and slurmd forwards messages along
    ``TreeWidth``.  Without routing, a 32-node step leaves its tree parents
    waiting on children they cannot hear, until Slurm drains them with
    "Kill task failed".  IPv4 forwarding is switched on for this interface
    only (``conf/<veth>/forwarding``; the global ``ip_forward`` stays as
    it is), so nothing outlives ``down``, which deletes the veth.
    """
    path = f"/proc/sys/net/ipv4/conf/{n.veth_host}/forwarding"
    try:
        with open(path, "w") as f:
            f.write("1\n")
    except OSError as e:
        raise SlurmGpuError(f"cannot enable forwarding on {n.veth_host}: {e.strerror}", path) from None


def destroy(n: NodeNet) -> None:
    """Remove the veth pair and the namespace; missing pieces are fine."""
    run(["ip", "link", "del", n.veth_host], timeout=10, check=False)
    run(["ip", "netns", "del", n.netns], timeout=10, check=False)


def exists(n: NodeNet) -> bool:
    return os.path.exists(os.path.join(NETNS_DIR, n.netns))


def inode(n: NodeNet) -> int | None:
    try:
        return os.stat(os.path.join(NETNS_DIR, n.netns)).st_ino
    except OSError:
        return None


def enter(n: NodeNet) -> Callable[[], None]:
    """A ``preexec_fn`` that moves the child into the node's namespaces.

    Runs between fork and exec; libc is resolved here, in the parent, so
    the child only makes system calls.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    path = os.path.join(NETNS_DIR, n.netns).encode()
    name = n.node.encode()

    def _pre() -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns")
        finally:
            os.close(fd)
        if libc.unshare(CLONE_NEWUTS) != 0:
            raise OSError(ctypes.get_errno(), "unshare")
        if libc.sethostname(name, len(name)) != 0:
            raise OSError(ctypes.get_errno(), "sethostname")

    return _pre


def check_tools() -> None:
    if not os.path.exists("/usr/sbin/ip") and not os.path.exists("/sbin/ip"):
        raise SlurmGpuError("--netns needs iproute2's ip command (apt-get install iproute2)")
    if not os.path.exists("/usr/bin/nsenter"):
        raise SlurmGpuError("--netns needs util-linux's nsenter (apt-get install util-linux)")
