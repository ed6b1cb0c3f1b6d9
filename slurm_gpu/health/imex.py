"""``gpu.imex``: GB200/GB300 NVL fabric readiness where Slurm hands out IMEX channels.

Only when slurm.conf sets ``SwitchType=switch/nvidia_imex``: Slurm then
gives every job an IMEX channel (``/dev/nvidia-caps-imex-channels/channelN``,
made in the job's namespace with the driver's ``nvidia-caps-imex-channels``
major), and a job's multi-node NVLink memory works only while this node's
IMEX daemon is in a domain that is up.  The check reads:

* the driver's channel device major (``/proc/devices``): without it no
  channel can be made, whatever the daemon says;
* ``nvidia-imex-ctl -N -j`` (the IMEX command service; JSON layout as in
  NVIDIA/DCGM ``dcgmlib/src/tests/DcgmImexManagerTests.cpp``): the domain's
  ``status`` (UP, DEGRADED, DOWN) and each node's (READY, ...).

"Not ready" is **info** while no job runs here (the daemon may still be
gathering its peers, or waits for the next job's prolog to configure it);
with a job on the node it warns.  It never drains: a domain that is down
because a peer is is no fault of this node.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from .. import runner, slurmclient
from ..errors import CommandError
from .findings import INFO, WARN, Finding

CHECK = "gpu.imex"
IMEX_CTL = "nvidia-imex-ctl"
IMEX_SWITCH = "switch/nvidia_imex"


def imex_configured(slurm_conf: str) -> bool:
    """Whether slurm.conf selects the IMEX switch plugin (last SwitchType wins)."""
    conf = slurmclient.read_conf(slurm_conf) or {}
    return conf.get("switchtype", "").lower() == IMEX_SWITCH


def channel_major(proc_devices: str = "/proc/devices") -> int | None:
    try:
        with open(proc_devices, encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[1] == "nvidia-caps-imex-channels" and parts[0].isdigit():
                    return int(parts[0])
    except OSError:
        return None
    return None


@dataclass
class ImexStatus:
    """The IMEX daemon's answer: the domain's state and each node's."""

    domain: str | None            # UP, DEGRADED, DOWN; None: no answer
    nodes: dict[str, str]         # node id -> status (READY, ...)
    error: str | None = None


def parse_status(text: str) -> ImexStatus:
    try:
        doc = json.loads(text)
    except ValueError:
        first = (text.strip().splitlines() or ["no output"])[0][:160]
        return ImexStatus(None, {}, f"nvidia-imex-ctl gave no JSON: {first}")
    if not isinstance(doc, dict) or not isinstance(doc.get("status"), str):
        return ImexStatus(None, {}, "nvidia-imex-ctl JSON has no domain status")
    nodes = {str(k): str(v.get("status")) for k, v in (doc.get("nodes") or {}).items()
             if isinstance(v, dict) and isinstance(v.get("status"), str)}
    return ImexStatus(doc["status"].upper(), nodes)


def query(timeout: float) -> ImexStatus:
    exe = next((p for p in (os.path.join(d, IMEX_CTL) for d in runner.SAFE_PATH.split(":"))
                if os.access(p, os.X_OK)), None)
    if exe is None:
        return ImexStatus(None, {}, "nvidia-imex-ctl is not installed")
    try:
        res = runner.run([exe, "-N", "-j"], timeout, check=False)
    except CommandError as e:
        return ImexStatus(None, {}, f"nvidia-imex-ctl: {e.what}")
    return parse_status(res.stdout or res.stderr)


def jobs_running(proc: str = "/proc") -> bool:
    """Whether a job step runs here (a root ``slurmstepd: [<job>.<step>]`` process)."""
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return False
    from ..procfs import uids
    # slurmstepd is root's (every uid): a job user's process can take its
    # name, and its cmdline is its memory, which a FUSE file of the user's
    # can back so that reading it never returns; root's is neither.
    for pid in pids:
        if uids(pid, proc) != (0, 0, 0, 0):
            continue
        try:
            with open(f"{proc}/{pid}/cmdline", "rb") as f:
                head = f.read(64)
        except OSError:
            continue
        if head.startswith(b"slurmstepd: [") and not head.startswith(b"slurmstepd: [0]"):
            return True
    return False


def check(major: int | None, st: ImexStatus, busy: bool) -> list[Finding]:
    """Pure: the findings for what was read."""
    problems = []
    if major is None:
        problems.append("the driver has no nvidia-caps-imex-channels device (no IMEX channel can be made)")
    if st.error:
        problems.append(st.error)
    elif st.domain != "UP":
        problems.append(f"IMEX domain is {st.domain}")
    not_ready = sorted(k for k, v in st.nodes.items() if v.upper() != "READY")
    if not st.error and not_ready:
        problems.append(f"IMEX node(s) {','.join(not_ready)} not READY")
    if not problems:
        return [Finding(CHECK, INFO, f"IMEX ready (domain UP, {len(st.nodes)} node(s) READY)")]
    sev = WARN if busy else INFO
    tail = "" if busy else " (no job here needs a channel yet)"
    return [Finding(CHECK, sev, f"IMEX not ready: {'; '.join(problems)}{tail}")]


def per_job() -> bool:
    """Whether ``[imex] mode = "per-job"``: then there is no node-wide domain to look at."""
    from .. import config
    try:
        sec = config.load_raw().get("imex")
    except Exception:  # noqa: BLE001 - a bad config is doctor's finding, not this check's
        return False
    return isinstance(sec, dict) and sec.get("mode") == "per-job"


def run_check(timeout: float, slurm_conf: str | None = None, root: str = "/") -> list[Finding]:
    """gpu.imex for this node: nothing at all unless Slurm hands out IMEX channels.

    Under per-job IMEX (docs/imex.md) each job's prolog starts and checks its
    own domain, and between jobs no daemon runs: the node-wide check would
    only ever see "not ready", so it says once that it does not apply."""
    if per_job():
        return [Finding(CHECK, INFO, "not applicable: per-job IMEX ([imex] mode = \"per-job\"): "
                        "each job's prolog starts and checks its own domain")]
    if not imex_configured(slurmclient.conf_path(slurm_conf)):
        return []
    st = query(timeout)
    return check(channel_major(os.path.join(root, "proc/devices")), st,
                 jobs_running(os.path.join(root, "proc")))
