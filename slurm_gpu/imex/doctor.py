"""``slurm-gpu doctor``'s IMEX checks (``imex.*``): what per-job IMEX needs on this node.

Pure checks over :class:`ImexFacts`, read once by :func:`gather`; they return
``(status, check, message)`` with doctor's Nagios statuses (0 OK, 1 WARNING,
2 CRITICAL, 3 UNKNOWN), which :mod:`slurm_gpu.doctor` turns into findings.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import Any

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
# The driver makes 2048 IMEX channels unless NVreg_ImexChannelCount says
# otherwise; Slurm's switch/nvidia_imex hands out imex_channel_count of them
# (SwitchParameters, default 2048), one per job.
DEFAULT_CHANNELS = 2048
UNIT = "nvidia-imex.service"


@dataclass
class ImexFacts:
    error: str | None = None                 # [imex] could not be read
    settings: dict[str, Any] = field(default_factory=dict)
    publish_dir: str = ""
    binaries: dict[str, tuple[int, int] | None] = field(default_factory=dict)   # path -> (uid, mode)
    unit_links: list[str] = field(default_factory=list)   # *.wants/nvidia-imex.service links
    base_config: dict[str, str] | None = None              # None: file absent
    switch: bool = False                                   # SwitchType=switch/nvidia_imex
    channel_count: int | None = None                       # SwitchParameters imex_channel_count
    nodes: int = 0                                         # nodes slurm.conf names
    ephemeral: tuple[int, int] | None = None               # net.ipv4.ip_local_port_range
    reserved: list[tuple[int, int]] = field(default_factory=list)   # net.ipv4.ip_local_reserved_ports


def _stat(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_uid, st.st_mode


def _kv(path: str) -> dict[str, str] | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


def _node_count(slurm_conf: str) -> int:
    from ..confgen.hostlist import expand
    try:
        with open(slurm_conf, encoding="utf-8", errors="replace") as f:
            text = f.read(16 << 20)
    except OSError:
        return 0
    names: set[str] = set()
    for line in text.replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0].strip()
        if line[:9].lower() != "nodename=":
            continue
        expr = line.split()[0].split("=", 1)[1]
        if expr.upper() == "DEFAULT":
            continue
        try:
            names.update(expand(expr))
        except Exception:  # noqa: BLE001 - a bad line is slurmctld's finding, not ours
            continue
    return len(names)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(1 << 16)
    except OSError:
        return None


def port_ranges(text: str) -> list[tuple[int, int]]:
    """``ip_local_reserved_ports``' form (Documentation/networking/ip-sysctl.rst):
    comma-separated ports and ``lo-hi`` ranges, e.g. ``8080,9148-9150``."""
    out = []
    for part in text.strip().split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit() and (hi.isdigit() or not hi):
            out.append((int(lo), int(hi or lo)))
    return out


def gather(conf: dict[str, str], slurm_conf: str, systemd_root: str = "/",
           sysctl_root: str = "/proc/sys") -> ImexFacts:
    """Read [imex], [cluster] publish_dir, the binaries, the boot units and slurm.conf's switch keys."""
    f = ImexFacts()
    try:
        from .. import config
        from ..cluster.modelfile import settings as cluster_settings
        from .settings import load
        s = load()
        f.settings = vars(s)
        f.publish_dir = cluster_settings(config.load_raw()).publish_dir
    except Exception as e:  # noqa: BLE001 - reported, not raised
        f.error = getattr(e, "what", None) or f"{type(e).__name__}: {e}"
        return f
    for key in ("daemon", "ctl"):
        f.binaries[s.__dict__[key]] = _stat(s.__dict__[key])
    for d in ("etc/systemd/system", "usr/lib/systemd/system", "lib/systemd/system"):
        f.unit_links += sorted(glob.glob(os.path.join(systemd_root, d, "*.wants", UNIT)))
    f.base_config = _kv(s.base_config)
    f.switch = conf.get("switchtype", "").strip().lower() == "switch/nvidia_imex"
    for part in conf.get("switchparameters", "").split(","):
        k, _, v = part.strip().partition("=")
        if k.strip().lower() == "imex_channel_count" and v.strip().isdigit():
            f.channel_count = int(v)
    f.nodes = _node_count(slurm_conf)
    rng = (_read(os.path.join(sysctl_root, "net/ipv4/ip_local_port_range")) or "").split()
    if len(rng) == 2 and all(x.isdigit() for x in rng):
        f.ephemeral = (int(rng[0]), int(rng[1]))
    f.reserved = port_ranges(_read(os.path.join(sysctl_root, "net/ipv4/ip_local_reserved_ports")) or "")
    return f


def _exposed(ports: list[tuple[int, int]], ephemeral: tuple[int, int],
             reserved: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of *ports* inside the ephemeral range and not reserved."""
    out = []
    for lo, hi in ports:
        lo, hi = max(lo, ephemeral[0]), min(hi, ephemeral[1])
        p = lo
        while p <= hi:
            r = next(((a, b) for a, b in reserved if a <= p <= b), None)
            if r:
                p = r[1] + 1
                continue
            nxt = min([a for a, _ in reserved if a > p] + [hi + 1])
            out.append((p, min(hi, nxt - 1)))
            p = nxt
    return out


def _ports_check(s: dict[str, Any], f: ImexFacts) -> tuple[int, str, str]:
    """The job's SERVER_PORT rotates over port_base..port_base+port_range-1 and
    IMEX_CMD_PORT is fixed: where the kernel may hand those ports to any
    outgoing connection (the ephemeral range), a connection that holds one when
    a job starts makes the prolog fail that job (never the node). Reserving
    them keeps the kernel off them; a listener can still bind them."""
    base, span, cmd = int(s.get("port_base", 0)), int(s.get("port_range", 0)), int(s.get("cmd_port", 0))
    if f.ephemeral is None:
        return (UNKNOWN, "imex.ports", "net.ipv4.ip_local_port_range not readable")
    exposed = _exposed([(base, base + span - 1), (cmd, cmd)], f.ephemeral, f.reserved)
    if not exposed:
        return (OK, "imex.ports", f"job ports {base}-{base + span - 1} and command port {cmd} are "
                "outside the ephemeral range or reserved")
    text = ",".join(f"{a}-{b}" if a != b else str(a) for a, b in exposed)
    return (WARNING, "imex.ports", f"IMEX ports {text} lie in the ephemeral range "
            f"{f.ephemeral[0]}-{f.ephemeral[1]} (net.ipv4.ip_local_port_range) and are not reserved: an "
            "outgoing connection can hold a job's port and fail that job; reserve them "
            f"(sysctl net.ipv4.ip_local_reserved_ports={text}) or move [imex] port_base/cmd_port")


def check(f: ImexFacts) -> list[tuple[int, str, str]]:
    if f.error:
        return [(UNKNOWN, "imex.mode", f"[imex] not read: {f.error}")]
    s = f.settings
    if s.get("mode") != "per-job":
        return [(OK, "imex.mode", "off: no per-job IMEX domains (node-wide IMEX, if any, is "
                 "the gpu.imex health check's)")]
    out: list[tuple[int, str, str]] = [(OK, "imex.mode", "per-job")]
    if not f.publish_dir:
        out.append((CRITICAL, "imex.domains", "[cluster] publish_dir is not set: no node's NVLink "
                    "domain is known, so no job gets an IMEX domain (set it to a directory every "
                    "node shares)"))
    for path, st in f.binaries.items():
        if st is None:
            out.append((CRITICAL, "imex.binaries", f"{path} does not exist: every exclusive job on "
                        "an NVLink-fabric node drains it ([imex] daemon/ctl)"))
        elif st[0] != 0 or st[1] & 0o022 or not st[1] & 0o111:
            out.append((CRITICAL, "imex.binaries", f"{path} is not root's executable, or is writable "
                        "by group or others: the prolog runs it as root"))
    if all(st is not None for st in f.binaries.values()) and f.binaries:
        out.append((OK, "imex.binaries", ", ".join(f.binaries)))
    if f.unit_links:
        out.append((CRITICAL, "imex.unit", f"{UNIT} is enabled at boot ({f.unit_links[0]}): a "
                    "node-wide daemon holds the command port and keeps a domain of its own "
                    "between jobs (systemctl disable nvidia-imex)"))
    else:
        out.append((OK, "imex.unit", f"{UNIT} not enabled at boot"))
    base = f.base_config or {}
    auth = base.get("IMEX_ENABLE_AUTH_ENCRYPTION", "0")
    mode = base.get("IMEX_AUTH_ENCRYPTION_MODE", "")
    # NVIDIA's config.cfg: with auth on, "an empty or unexpected value [of the
    # mode, and for SSL_TLS of IMEX_AUTH_SOURCE] will prevent initialization".
    if auth == "1" and mode not in ("SSL_TLS", "GSS_AUTH_ENCRYPT", "GSS_AUTH_ONLY"):
        out.append((CRITICAL, "imex.auth", f"IMEX_AUTH_ENCRYPTION_MODE={mode!r} in {s.get('base_config')}: "
                    "nvidia-imex will not start, so every job's domain fails"))
    elif auth == "1" and mode == "SSL_TLS" and base.get("IMEX_AUTH_SOURCE") not in ("FILE", "ENV_PATH", "ENV_VAL"):
        out.append((CRITICAL, "imex.auth", f"IMEX_AUTH_SOURCE={base.get('IMEX_AUTH_SOURCE', '')!r} in "
                    f"{s.get('base_config')}: nvidia-imex will not start with SSL_TLS"))
    elif auth == "1":
        out.append((OK, "imex.auth", f"peer connections authenticated ({mode})"))
    else:
        where = s.get("base_config") if f.base_config is not None else f"{s.get('base_config')} (absent)"
        out.append((WARNING, "imex.auth", "IMEX_ENABLE_AUTH_ENCRYPTION is not 1 in "
                    f"{where}: peer connections are neither authenticated nor encrypted, so any host "
                    "that reaches a node's SERVER_PORT can talk to a job's daemon"))
    if f.switch:
        count = f.channel_count if f.channel_count is not None else DEFAULT_CHANNELS
        if f.nodes and count < f.nodes:
            out.append((WARNING, "imex.channels", f"imex_channel_count={count} is below the {f.nodes} "
                        "nodes slurm.conf names: with one job per node the channels run out (Slurm "
                        "25.11+ pends the next job, older releases fail it)"))
        elif count > DEFAULT_CHANNELS:
            out.append((WARNING, "imex.channels", f"imex_channel_count={count} exceeds the driver's "
                        f"default {DEFAULT_CHANNELS} channels (NVreg_ImexChannelCount): raise both"))
        else:
            out.append((OK, "imex.channels", f"switch/nvidia_imex hands out {count} channels for "
                        f"{f.nodes} node(s); the prolog leaves the channel to it"))
    elif s.get("channels") in ("auto", "create"):
        out.append((OK, "imex.channels", "no switch/nvidia_imex: the prolog makes the job's channel "
                    f"{s.get('channel')} for the job's user alone"))
    out.append(_ports_check(s, f))
    return out
