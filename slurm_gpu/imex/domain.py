"""The pure part of a per-job IMEX domain: which of the job's nodes share
this node's NVLink domain, the daemon's port, the files it reads, and what
``nvidia-imex-ctl`` answered.

Everything that comes from the job (``SLURM_JOB_NODELIST``, the job id) is
user input as far as this module is concerned: node names are checked
against a plain pattern before they name a file, and nothing from the job
reaches the daemon's config but validated IP addresses and numbers.
"""
from __future__ import annotations

import json
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Mapping, Sequence

from ..errors import InputError

# Slurm node names as a file name and a config value may carry them.
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_NODES = 4096            # no NVLink domain (NVL72: 18 trays) comes near this

# nvidia-imex-ctl -q answers (NVIDIA/DCGM dcgm_fields.h, DCGM_FI_IMEX_DAEMON_STATUS).
DAEMON_STATES = ("INITIALIZING", "STARTING_AUTH_SERVER", "WAITING_FOR_PEERS", "WAITING_FOR_RECOVERY",
                 "INIT_GPU", "READY", "SHUTTING_DOWN", "UNAVAILABLE")
# Keys the job's config sets whatever the site's base config says (config.html).
OWN_KEYS = ("DAEMONIZE", "SERVER_PORT", "IMEX_NODE_CONFIG_FILE", "IMEX_CMD_ENABLED", "IMEX_CMD_PORT",
            "IMEX_CMD_BIND_INTERFACE_IP", "IMEX_WAIT_FOR_QUORUM", "LOG_FILE_NAME", "BIND_INTERFACE_IP")


def plain_node_name(name: str) -> bool:
    return bool(_NODE_NAME.match(name))


def node_names(nodelist: str) -> list[str]:
    """The job's nodes, in Slurm's order; a name that is not a plain node name is refused."""
    from ..confgen.hostlist import expand
    text = nodelist.strip()
    if not text:
        raise InputError("no SLURM_JOB_NODELIST in the prolog's environment", "imex")
    names = expand(text, "SLURM_JOB_NODELIST")
    if len(names) > MAX_NODES:
        raise InputError(f"{len(names)} nodes in SLURM_JOB_NODELIST, more than any IMEX domain", "imex")
    for n in names:
        if not _NODE_NAME.match(n):
            raise InputError(f"bad node name {n[:40]!r}", "SLURM_JOB_NODELIST")
    return names


def fabric_domain(model: Mapping[str, Any] | None) -> tuple[str | None, str]:
    """``("<cluster uuid>/<clique id>", "")`` for a node model (a published
    ``node`` dict), or ``(None, why)``: no fabric, or registration not done.

    The same rule as topology/block (:func:`slurm_gpu.confgen.block.node_domain`):
    every GPU in one clique, registration completed with status 0.
    """
    if not isinstance(model, dict):
        return None, "no model"
    fabrics: list[dict[str, Any]] = [g["fabric"] for g in model.get("gpus") or ()
                                     if isinstance(g, dict) and isinstance(g.get("fabric"), dict)]
    if not fabrics:
        return None, "no NVLink fabric"
    pairs = {(str(f.get("cluster_uuid")), f.get("clique_id")) for f in fabrics}
    if len(pairs) > 1:
        return None, f"GPUs report {len(pairs)} different fabric cliques"
    bad = [f for f in fabrics if f.get("state") != "completed" or f.get("status") != 0]
    if bad:
        return None, f"fabric registration {bad[0].get('state')} (status {bad[0].get('status')})"
    (uuid, clique), = pairs
    if not uuid or set(uuid.replace("-", "")) <= {"0"}:
        return None, "no NVLink fabric (cluster UUID is zero)"
    return f"{uuid}/{clique}", ""


def group(names: Sequence[str], domains: Mapping[str, str | None], me: str) -> tuple[list[str], list[str]]:
    """(this node's IMEX domain, the job's nodes in other NVLink domains), in the job's order.

    One IMEX domain per NVLink domain: a config that spans two NVLink
    domains is one of the known failure modes, so a node of another domain
    is never listed, and every node of the job computes the same split from
    the same published models.
    """
    mine = domains.get(me)
    same = [n for n in names if domains.get(n) == mine]
    return same, [n for n in names if domains.get(n) != mine]


def server_port(jobid: str, base: int, span: int) -> int:
    """``SERVER_PORT`` for the job: consecutive jobs never share a port (the race
    AWS ParallelCluster and Azure rotate the port against)."""
    return base + int(jobid) % span


def render_config(base_text: str, own: Mapping[str, str]) -> str:
    """The job's ``config.cfg``: the site's base config (auth, log level...)
    without the keys the job sets, then those keys."""
    out = ["# nvidia-imex config for one job, written by slurm-gpu (docs/imex.md)"]
    for line in base_text.splitlines():
        key = line.split("=", 1)[0].strip()
        if "=" in line and key in own:
            continue
        out.append(line)
    out += [f"{k}={v}" for k, v in own.items()]
    return "\n".join(out) + "\n"


def render_nodes(ips: Sequence[str]) -> str:
    """``nodes_config.cfg``: one address a line, the same file on every node of the domain."""
    return "".join(f"{ip}\n" for ip in ips)


def parse_query(text: str) -> str:
    """``nvidia-imex-ctl -q``'s one word; anything else is UNAVAILABLE."""
    word = text.strip().upper()
    return word if word in DAEMON_STATES else "UNAVAILABLE"


def parse_domain(text: str) -> tuple[str | None, list[dict[str, str]]]:
    """``nvidia-imex-ctl -N -j``: (domain status, [{"index", "host", "status"}]) in index order."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None, []
    if not isinstance(doc, dict) or not isinstance(doc.get("status"), str):
        return None, []
    nodes = []
    raw: dict[str, Any] = doc["nodes"] if isinstance(doc.get("nodes"), dict) else {}
    for k, v in raw.items():
        if isinstance(v, dict):
            nodes.append({"index": str(k), "host": str(v.get("host", "")), "status": str(v.get("status", "")).upper()})
    nodes.sort(key=lambda n: int(n["index"]) if n["index"].isdigit() else 1 << 30)
    return doc["status"].upper(), nodes


def domain_up(status: str | None, nodes: Sequence[Mapping[str, str]], expected: int) -> bool:
    return status == "UP" and len(nodes) == expected and all(n["status"] == "READY" for n in nodes)
