"""Peer addresses for ``nodes_config.cfg``, without ``scontrol``.

The prolog must not call ``scontrol`` (one RPC per node of every job, to a
controller that is busy starting jobs), so addresses come from what the node
already has:

* ``addresses = "slurm.conf"`` (the default): ``NodeAddr=`` of the node's
  ``NodeName=`` line in the slurm.conf slurmd passes as ``$SLURM_CONF``
  (configless sites: slurmd's cached copy), else ``NodeHostname=``, else
  the node name; a name is resolved with the system's resolver;
* ``addresses = "dns"``: the node name through the resolver alone.

Every node reads the same slurm.conf and resolver, so every node of the
domain writes the same list in the same order: an IP map that differs
between peers is a failure IMEX reports and never recovers from.
``Include`` lines are not followed (name the nodes in the main file, or use
``dns``).
"""
from __future__ import annotations

import socket

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Sequence

from ..errors import InputError


def _ip(text: str) -> str | None:
    for fam in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(fam, text)
            return text
        except (OSError, ValueError):
            continue
    return None


def resolve(name: str) -> str:
    """An IP address for *name* (an IPv4 answer first), or an error naming it."""
    ip = _ip(name)
    if ip:
        return ip
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise InputError(f"cannot resolve node address {name!r}: {e}", "imex addresses") from None
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    for info in infos:
        ip = _ip(str(info[4][0]))
        if ip:
            return ip
    raise InputError(f"no address for {name!r}", "imex addresses")


def slurm_conf_addresses(path: str, names: Sequence[str]) -> dict[str, str]:
    """NodeName -> NodeAddr (else NodeHostname) for *names*, from slurm.conf's ``NodeName=`` lines."""
    from ..confgen.hostlist import expand
    wanted = set(names)
    out: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(16 << 20)
    except OSError as e:
        raise InputError(f"cannot read slurm.conf: {e.strerror}", path) from None
    for line in text.replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line[:9].lower() == "nodename=":
            continue
        fields = {}
        for tok in line.split():
            k, eq, v = tok.partition("=")
            if eq:
                fields[k.lower()] = v
        node_expr = fields.get("nodename", "")
        if not node_expr or node_expr.upper() == "DEFAULT":
            continue
        try:
            nodes = expand(node_expr, path)
        except InputError:
            continue
        if not wanted.intersection(nodes):
            continue
        addr_expr = fields.get("nodeaddr") or fields.get("nodehostname") or ""
        addrs = nodes
        if addr_expr:
            try:
                addrs = expand(addr_expr, path)
            except InputError:
                addrs = [addr_expr]
            if len(addrs) != len(nodes):
                addrs = addrs * len(nodes) if len(addrs) == 1 else nodes
        for n, a in zip(nodes, addrs):
            if n in wanted:
                out[n] = a
    return out


def addresses(source: str, names: Sequence[str], slurm_conf: str | None) -> list[str]:
    """One IP per node of *names*, in order; an unknown node is an error naming it."""
    table: dict[str, str] = {}
    if source == "slurm.conf":
        if not slurm_conf:
            raise InputError("no SLURM_CONF in the prolog's environment", "imex addresses")
        table = slurm_conf_addresses(slurm_conf, names)
    out = []
    for n in names:
        out.append(resolve(table.get(n, n)))
    if len(set(out)) != len(out):
        dup = sorted({ip for ip in out if out.count(ip) > 1})[0]
        raise InputError(f"two nodes of the domain resolve to {dup}", "imex addresses")
    return out
