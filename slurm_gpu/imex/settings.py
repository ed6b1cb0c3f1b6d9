"""The ``[imex]`` config section: per-job IMEX domains (docs/imex.md)."""
from __future__ import annotations

from .. import config
from ..errors import InputError

MODES = ("off", "per-job")
CHANNEL_MODES = ("auto", "create", "slurm", "off")
ADDRESS_SOURCES = ("slurm.conf", "dns")
QUORUM = ("NONE", "RECOVERY")


class ImexSettings(config.Settings):
    """``[imex]``: one IMEX domain per job and NVLink domain, set up by the prolog."""

    mode: str = "off"                          # "per-job": the prolog starts the job's domain
    daemon: str = "/usr/bin/nvidia-imex"       # NVIDIA's daemon (run with DAEMONIZE=0, -c <job config>)
    ctl: str = "/usr/bin/nvidia-imex-ctl"
    base_config: str = "/etc/nvidia-imex/config.cfg"   # the site's keys (auth, logging) the job's config starts from
    # <base>/<jobid>/: config.cfg, nodes_config.cfg, imex.log, state.json, daemon; %n: node
    base_dir: str = "/run/slurm-gpu/imex"
    port_base: int = 33792                     # SERVER_PORT = port_base + jobid % port_range
    port_range: int = 16000                    # (AWS ParallelCluster's and Azure's rotation, against a race
                                               #  between consecutive jobs); ends at 49791, below cmd_port
    cmd_port: int = 50005                      # IMEX_CMD_PORT (on 127.0.0.1)
    timeout: float = 60.0                      # the prolog waits this long for the domain to be UP
    stop_timeout: float = 10.0                 # SIGTERM, then SIGKILL after this long
    wait_for_quorum: str = "NONE"              # IMEX_WAIT_FOR_QUORUM: NONE, or RECOVERY
    addresses: str = "slurm.conf"              # peers' IPs: NodeAddr in $SLURM_CONF (else name resolution), or "dns"
    channels: str = "auto"                     # auto: "slurm" under switch/nvidia_imex, else "create"; off
    channel: int = 0                           # the channel id created for the job's user ("create")
    channel_dir: str = "/dev/nvidia-caps-imex-channels"


def check(s: ImexSettings, where: str = "") -> ImexSettings:
    where = where or str(config.config_path() or "config")
    for key, value, allowed in (("mode", s.mode, MODES), ("channels", s.channels, CHANNEL_MODES),
                                ("addresses", s.addresses, ADDRESS_SOURCES),
                                ("wait_for_quorum", s.wait_for_quorum, QUORUM)):
        if value not in allowed:
            raise InputError(f"config key imex.{key} must be one of {', '.join(allowed)} (got {value!r})", where)
    if not 1024 <= s.port_base or s.port_base + s.port_range > 65536 or s.port_range < 1:
        raise InputError("config keys imex.port_base + imex.port_range must lie within 1024..65535", where)
    if not 1 <= s.cmd_port <= 65535:
        raise InputError("config key imex.cmd_port must be 1..65535", where)
    if s.port_base <= s.cmd_port < s.port_base + s.port_range:
        # one job in port_range would get the command port as its SERVER_PORT
        raise InputError(f"config key imex.cmd_port {s.cmd_port} lies in the job ports "
                         f"{s.port_base}-{s.port_base + s.port_range - 1} (imex.port_base, imex.port_range)", where)
    for key in ("daemon", "ctl", "base_dir", "channel_dir"):
        if not str(getattr(s, key)).startswith("/"):
            raise InputError(f"config key imex.{key} must be an absolute path", where)
    return s


def load(raw: dict | None = None) -> ImexSettings:
    """``[imex]``, validated, with ``%n`` expanded in the paths."""
    from ..hw.live import node_name
    s = check(config.section(ImexSettings, "imex", raw))
    name = node_name()
    for key in ("daemon", "ctl", "base_dir", "base_config", "channel_dir"):
        setattr(s, key, str(getattr(s, key)).replace("%n", name))
    return s


# This area's section of the node-fact entry (slurm_gpu.nodefacts): the prolog
# reads its settings from there, not from TOML.
SECTION = "imex"


def _section() -> dict:
    from .. import config as _c
    from ..cluster.modelfile import settings as cluster_settings
    s = load()
    return {"imex": vars(s), "publish_dir": cluster_settings(_c.load_raw()).publish_dir}


def cached(config_path: str | None, node: str, gres_conf: str | None) -> dict:
    """``{"imex": {...}, "publish_dir": str}`` from the node-fact entry."""
    from .. import nodefacts
    data = nodefacts.get(config_path, node, gres_conf, with_gpus=False, sections={SECTION: _section})
    return data["sections"][SECTION]
