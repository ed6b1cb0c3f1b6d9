"""The per-job IMEX flow: what the prolog sets up and the epilog takes down.

Failure policy (docs/imex.md, "Who is blamed"):

* this node's own daemon failed (it would not start, died, or never got
  READY itself): a node fault; with ``[jobs] on_internal_error = "drain"``
  the prolog exits 1, so Slurm drains this node and requeues the job;
* a peer's daemon never joined (the domain is not UP by the timeout, while
  ours is READY), or the job's peers cannot be resolved: the job fails
  (``scancel``), the line names the peers, and this node stays up: the
  peer's own prolog decides about the peer;
* a job that shares this node (it does not hold every GPU) gets no domain,
  with one line saying so; a node with no NVLink fabric is not touched.

The epilog is idempotent: it works from ``<base_dir>/<jobid>/state.json``,
written before the daemon starts and after every step.
"""
from __future__ import annotations

import json
import os
import stat
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping, Sequence

from ..errors import HardwareError, InputError, SlurmGpuError
from . import daemon, domain, teardown

POLL = 0.01                 # seconds between readiness polls (each one nvidia-imex-ctl run, ~1 ms for NVIDIA's)
STATE = "state.json"


class PeerFailure(SlurmGpuError):
    """The job cannot have its domain through no fault of this node."""


class Ctx:
    """What the IMEX prolog/epilog needs, injectable for tests (a plain class: no dataclasses import)."""

    def __init__(self, env: Mapping[str, str], imex: Mapping[str, Any], publish_dir: str,
                 node_name: str, *, on_internal_error: str = "drain", scancel: str = "/usr/bin/scancel",
                 log: Callable[[str], None] | None = None, proc_devices: str = "/proc/devices",
                 cancel: Callable[[str], None] | None = None,
                 own_gpus: Callable[[], Sequence[Mapping[str, Any] | None]] | None = None) -> None:
        import sys
        self.env = env
        self.imex = imex
        self.publish_dir = publish_dir
        self.node_name = node_name
        self.on_internal_error = on_internal_error
        self.scancel = scancel
        self.log: Callable[[str], None] = log or (lambda m: print(m, file=sys.stderr))
        self.proc_devices = proc_devices
        self.cancel = cancel or self._scancel
        # This node's GPUs (index, uuid, fabric: nodefacts.gpu_facts), read
        # here, never from the publish directory, which other nodes can write.
        self.own_gpus = own_gpus or (lambda: ())

    def _scancel(self, jobid: str) -> None:
        from .. import runner
        try:
            runner.run([self.scancel, jobid], 10, check=False)
        except SlurmGpuError as e:
            self.log(f"slurm-gpu: imex: could not cancel job {jobid}: {e.what}")


# -- files ------------------------------------------------------------------------------

from .teardown import EVENTS, EVENTS_MAX, event_logger  # noqa: F401 - the hook's and tests' names


def job_dir(base: str, jobid: str) -> str:
    from ..jobs.state import check_jobid
    return os.path.join(base, check_jobid(jobid))


def _root_dir(path: str, mode: int) -> None:
    """*path* as root's directory (created if missing); a symlink or foreign owner is refused."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise HardwareError("not a directory of ours (symlink, foreign owner or writable by others)", path)
    os.chmod(path, mode)


def save(path: str, st: dict[str, Any]) -> None:
    from ..fsutil import atomic_write
    atomic_write(os.path.join(path, STATE), json.dumps(st, sort_keys=True) + "\n", mode=0o644, durable=False)


def load(base: str, jobid: str) -> dict[str, Any] | None:
    """The job's record, or None; a foreign or corrupt file is an error."""
    path = os.path.join(job_dir(base, jobid), STATE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise InputError(f"cannot open IMEX job state: {e.strerror}", path) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 and st.st_uid != os.geteuid():
            raise InputError("IMEX job state is not root's regular file", path)
        try:
            doc = json.loads(f.read(1 << 20))
        except ValueError:
            raise InputError("IMEX job state is not JSON", path) from None
    if not isinstance(doc, dict) or doc.get("jobid") != jobid:
        raise InputError("IMEX job state is for another job", path)
    return doc


def read_model(publish_dir: str, name: str) -> dict[str, Any] | None:
    """*name*'s published model (``[cluster] publish_dir``, ``<dir>/<name>.json``), or None.

    The path as :func:`slurm_gpu.cluster.modelfile.node_file` makes it, without
    importing that module (dataclasses, typing, hashlib: ~14 ms of every prolog);
    *name* passed :func:`.domain.node_names`' check."""
    if not domain.plain_node_name(name):
        return None
    from ..fsutil import read_trusted
    # The same trust rule as cluster.modelfile.load: a model another user
    # could have written (a share writable by users, root_squash's nobody)
    # must not choose this job's IMEX peers.
    raw = read_trusted(os.path.join(publish_dir.replace("%n", name), f"{name}.json"), 16 << 20)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    node = doc.get("node") if isinstance(doc, dict) else None
    return node if isinstance(node, dict) else None


# -- channel ----------------------------------------------------------------------------

def make_channel(channel_dir: str, channel: int, uid: int, gid: int, proc_devices: str) -> str:
    """``<channel_dir>/channel<N>``, a character device for the job's user only (0600)."""
    from ..health.imex import channel_major
    major = channel_major(proc_devices)
    if major is None:
        raise HardwareError("the driver has no nvidia-caps-imex-channels device", proc_devices)
    try:
        os.mkdir(channel_dir, 0o755)
    except FileExistsError:
        pass
    path = os.path.join(channel_dir, f"channel{int(channel)}")
    try:
        os.unlink(path)                # a leftover (an earlier job's, a boot-time channel0)
    except FileNotFoundError:
        pass
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(major, int(channel)))
    os.chown(path, uid, gid)
    os.chmod(path, 0o600)
    return path


def channel_mode(imex: Mapping[str, Any], slurm_conf: str | None) -> str:
    """"create", "slurm" (switch/nvidia_imex makes the channel: cooperate) or "off"."""
    mode = imex["channels"]
    if mode != "auto":
        return mode
    from ..health.imex import imex_configured
    return "slurm" if slurm_conf and imex_configured(slurm_conf) else "create"


# -- prolog -----------------------------------------------------------------------------

def _fail_line(jobid: str, what: str) -> str:
    return f"slurm-gpu: imex: job {jobid}: {what}"


def prolog(ctx: Ctx) -> int:
    """Set up the job's IMEX domain on this node; the exit status for slurmd."""
    s = ctx.imex
    if s["mode"] != "per-job":
        return 0
    from ..jobs.state import check_jobid
    jobid = check_jobid(ctx.env.get("SLURM_JOB_ID") or ctx.env.get("SLURM_JOBID", ""))
    me = ctx.node_name
    if not ctx.publish_dir:
        ctx.log(_fail_line(jobid, "no IMEX domain: [cluster] publish_dir is not set, so no node's "
                                  "NVLink domain is known (docs/imex.md)"))
        return 0
    # This node's own domain from its own GPUs: its published model is only
    # what the other nodes of the job read (another node's root, or `nobody`
    # on a root-squashed share, could rewrite it).
    gpus = [dict(g) for g in ctx.own_gpus() if g]
    mine, _ = domain.fabric_domain({"gpus": gpus})
    if mine is None:
        return 0                        # no NVLink fabric here: nothing to do
    from ..jobs.context import job_gpus
    held, whole = job_gpus(ctx.env)
    total = len(gpus)
    base = s["base_dir"]
    os.makedirs(os.path.dirname(base.rstrip("/")) or "/", 0o755, exist_ok=True)
    _root_dir(base, 0o755)
    path = job_dir(base, jobid)
    _clean_earlier_run(ctx, base, jobid)
    if not whole or len(set(held)) < total:
        line = _fail_line(jobid, f"shares node {me} (holds {len(set(held))} of {total} GPUs): "
                                 "per-job IMEX needs whole nodes (--exclusive); no IMEX domain")
        ctx.log(line)
        _root_dir(path, 0o755)
        save(path, {"jobid": jobid, "node": me, "phase": "refused", "error": line})
        return 0
    st: dict[str, Any] = {"jobid": jobid, "node": me, "phase": "starting", "domain": mine,
                          "uid": None, "daemon": None, "channel": None}
    try:
        uid = ctx.env.get("SLURM_JOB_UID", "")
        gid = ctx.env.get("SLURM_JOB_GID", "")
        st["uid"] = int(uid) if uid.isdigit() else None
        try:
            names = domain.node_names(ctx.env.get("SLURM_JOB_NODELIST") or ctx.env.get("SLURM_NODELIST", ""))
        except InputError as e:
            raise PeerFailure(f"imex: {e.what}", e.where) from None
        if me not in names:
            raise PeerFailure(f"imex: this node {me} is not in SLURM_JOB_NODELIST", "imex")
        domains = {n: (mine if n == me else domain.fabric_domain(read_model(ctx.publish_dir, n))[0])
                   for n in names}
        same, other = domain.group(names, domains, me)
        st["nodes"] = same
        st["other_nodes"] = other
        from .addresses import addresses
        try:
            ips = addresses(s["addresses"], same, ctx.env.get("SLURM_CONF"))
        except InputError as e:
            raise PeerFailure(f"imex: {e.what}", e.where) from None
        st["addresses"] = ips
        st["port"] = domain.server_port(jobid, s["port_base"], s["port_range"])
        _root_dir(path, 0o755)
        cfg, nodes_cfg, log = (os.path.join(path, n) for n in ("config.cfg", "nodes_config.cfg", "imex.log"))
        st["config"] = cfg
        try:
            with open(s["base_config"], encoding="utf-8") as f:
                base_text = f.read(1 << 20)
        except OSError:
            base_text = ""
        own = {"DAEMONIZE": "0", "SERVER_PORT": str(st["port"]), "IMEX_NODE_CONFIG_FILE": nodes_cfg,
               "IMEX_CMD_ENABLED": "1", "IMEX_CMD_PORT": str(s["cmd_port"]),
               "IMEX_CMD_BIND_INTERFACE_IP": "127.0.0.1", "IMEX_WAIT_FOR_QUORUM": s["wait_for_quorum"],
               "LOG_FILE_NAME": log, "BIND_INTERFACE_IP": ips[same.index(me)]}
        from ..fsutil import atomic_write
        atomic_write(nodes_cfg, domain.render_nodes(ips), mode=0o644, durable=False)
        atomic_write(cfg, domain.render_config(base_text, own), mode=0o644, durable=False)
        save(path, st)
        for ip, port in ((own["BIND_INTERFACE_IP"], st["port"]), ("127.0.0.1", int(s["cmd_port"]))):
            if _port_taken(ip, port):
                # Another process holds it (a job sharing the node, an outgoing
                # connection's ephemeral port): nvidia-imex would fail to bind, or
                # nvidia-imex-ctl would ask that process.  The job's failure, never
                # this node's.
                raise PeerFailure(f"imex: port {port} on {ip} is taken by another process; "
                                  "no IMEX domain for this job", "imex")
        st["daemon"] = daemon.start(s["daemon"], cfg, log)
        teardown.write_record(path, st["daemon"]["pid"], st["daemon"]["start"], None)
        save(path, st)
        _wait_ready(ctx, st, path, jobid)
        if channel_mode(s, ctx.env.get("SLURM_CONF")) == "create":
            if st["uid"] is None or not gid.isdigit():
                raise InputError("prolog environment lacks SLURM_JOB_UID/GID", "imex channel")
            st["channel"] = make_channel(s["channel_dir"], s["channel"], st["uid"], int(gid), ctx.proc_devices)
            teardown.write_record(path, st["daemon"]["pid"], st["daemon"]["start"], st["channel"])
        st["phase"] = "ready"
        save(path, st)
        if other:
            ctx.log(_fail_line(jobid, f"IMEX domain of {len(same)} node(s); {','.join(other)} "
                                      "in other NVLink domains (or none) get their own"))
        return 0
    except PeerFailure as e:
        line = e.line()
        ctx.log(f"{line} [the job fails; this node stays up]")
        _undo(ctx, st, path, line)
        ctx.cancel(jobid)
        return 0
    except Exception as e:  # noqa: BLE001 - this node's fault
        line = e.line() if isinstance(e, SlurmGpuError) else \
            f"slurm-gpu: imex: internal error: {type(e).__name__}: {e}"
        ctx.log(f"{line} [job {jobid}: node fault, on_internal_error={ctx.on_internal_error}]")
        _undo(ctx, st, path, line)
        if ctx.on_internal_error == "drain":
            return 1
        ctx.cancel(jobid)
        return 0


def _bind_fails(ip: str, port: int, reuse: bool) -> bool:
    """Whether binding TCP *port* on *ip* fails with EADDRINUSE."""
    import errno
    import socket
    fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as so:
        if reuse:
            so.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            so.bind((ip, port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def _port_taken(ip: str, port: int) -> bool:
    """Whether a TCP *port* on *ip* is bound by someone (SO_REUSEADDR: a closed
    connection's TIME_WAIT, e.g. the previous job's daemon, does not count)."""
    return _bind_fails(ip, port, reuse=True)


def _port_held(ip: str, port: int) -> bool:
    """Whether anything at all holds *port* on *ip*: a plain bind (no
    SO_REUSEADDR) also fails for a socket only bound with SO_REUSEADDR, which
    neither :func:`_port_taken` nor ``/proc/net/tcp`` sees, and for TIME_WAIT."""
    return _bind_fails(ip, port, reuse=False)


def _clean_earlier_run(ctx: Ctx, base: str, jobid: str) -> None:
    """A requeued job's earlier run here (its epilog never ran): stop what it left first."""
    try:
        old = load(base, jobid)
    except InputError:
        old = None
    if old is None:
        return
    note = daemon.stop(old.get("daemon"), float(ctx.imex["stop_timeout"]))
    if note:
        ctx.log(f"slurm-gpu: imex: job {jobid}: earlier run: {note}")
    _remove_channel(old)


def _wait_ready(ctx: Ctx, st: dict[str, Any], path: str, jobid: str) -> None:
    s = ctx.imex
    same: list[str] = st["nodes"]
    me = same.index(ctx.node_name)
    end = time.monotonic() + float(s["timeout"])
    status: str | None = None
    nodes: list[dict[str, str]] = []
    while True:
        code = daemon.reap(st["daemon"]["pid"])
        if code is not None or not daemon.alive(st["daemon"]):
            held = [p for ip, p in ((st["addresses"][me], st["port"]), ("127.0.0.1", int(s["cmd_port"])))
                    if _port_held(ip, p)]
            if held:
                # Its ports are held now that it is gone: someone took one
                # between our check and its bind (a process listening late, a
                # socket bound with SO_REUSEADDR, an outgoing connection).
                # Not proven this node's fault: the job fails, the node stays up.
                raise PeerFailure(f"imex: this node's nvidia-imex exited (status {code}) while port(s) "
                                  f"{', '.join(map(str, held))} are held by another process; no IMEX "
                                  "domain for this job", os.path.join(path, "imex.log"))
            raise HardwareError(f"imex: this node's nvidia-imex exited (status {code}) before the domain "
                                "was UP; see its log", os.path.join(path, "imex.log"))
        status, nodes = daemon.domain_status(s["ctl"], st["config"])
        if domain.domain_up(status, nodes, len(same)):
            return
        if time.monotonic() >= end:
            break
        time.sleep(POLL)
    by_index = {n["index"]: n["status"] for n in nodes}
    own = by_index.get(str(me)) or daemon.query(s["ctl"], st["config"])
    t = float(s["timeout"])
    if own != "READY":
        raise HardwareError(f"imex: this node's nvidia-imex is {own} after {t:g} s (domain {status})",
                            os.path.join(path, "imex.log"))
    late = [f"{same[int(k)]} ({v})" for k, v in sorted(by_index.items(), key=lambda kv: int(kv[0]))
            if v != "READY" and k.isdigit() and int(k) < len(same)]
    missing = [f"{same[i]} (no answer)" for i in range(len(same)) if str(i) not in by_index]
    raise PeerFailure(f"imex: IMEX domain not UP after {t:g} s (domain {status}): peer(s) "
                      f"{', '.join(late + missing) or '?'} not READY", f"job {jobid}")


def _undo(ctx: Ctx, st: dict[str, Any], path: str, line: str) -> None:
    """Stop what the prolog started; the record stays (phase failed) for ``imex status`` and the epilog."""
    try:
        note = daemon.stop(st.get("daemon"), float(ctx.imex["stop_timeout"]))
        if note:
            ctx.log(f"slurm-gpu: imex: job {st['jobid']}: {note}")
        _remove_channel(st)
    except Exception as e:  # noqa: BLE001 - the epilog retries
        ctx.log(f"slurm-gpu: imex: job {st['jobid']}: cleanup incomplete, the epilog retries: {e}")
    st["phase"] = "failed"
    st["error"] = line
    if os.path.isdir(path):
        save(path, st)


def _remove_channel(st: dict[str, Any]) -> None:
    ch = st.get("channel")
    if ch:
        try:
            os.unlink(ch)
        except FileNotFoundError:
            pass
        st["channel"] = None


# -- epilog -----------------------------------------------------------------------------

def epilog(ctx: Ctx) -> int:
    """Stop the job's daemon, remove its channel and its directory; idempotent (:mod:`.teardown`)."""
    return teardown.epilog(ctx.env, ctx.imex["base_dir"], float(ctx.imex["stop_timeout"]), ctx.log,
                           ctx.on_internal_error)
