"""A stand-in for NVIDIA's ``nvidia-imex`` daemon and ``nvidia-imex-ctl`` (test rig only).

There is no GB200 and no IMEX binary on the machines the tests run on, so
the sandbox and the tests run this instead; slurm-gpu's adapter
(:mod:`slurm_gpu.imex`) runs it exactly as it runs the real binaries
(``[imex] daemon`` and ``ctl``).  What it copies, and from where:

NVIDIA IMEX Service user's guide (docs.nvidia.com/multi-node-nvlink-systems/imex-guide):

* ``config.html`` "IMEX Service Config Options": the config file is
  ``KEY=VALUE`` lines, read once at start-up ("restart the IMEX service"
  for a change to take effect).  Keys modelled: ``DAEMONIZE`` (default 1;
  the stand-in only runs in the foreground, ``DAEMONIZE=0``, and refuses 1
  rather than pretend), ``BIND_INTERFACE_IP`` (empty: "find an IP address
  in the IMEX_NODE_CONFIG_FILE that matches the IP addresses available via
  the system interface list"), ``SERVER_PORT`` (default 50000; ``-p`` on
  the command line overrides it), ``IMEX_NODE_CONFIG_FILE`` (default
  ``/etc/nvidia-imex/nodes_config.cfg``), ``IMEX_CMD_ENABLED``,
  ``IMEX_CMD_PORT`` (50005 in the Slurm prologs AWS ParallelCluster and
  Azure ship), ``IMEX_CMD_BIND_INTERFACE_IP``, ``IMEX_WAIT_FOR_QUORUM``,
  ``LOG_FILE_NAME``.  Other keys are accepted and ignored.
* ``deployment.html`` "Constraints": the nodes file lists the IP
  addresses of the domain's nodes; after connecting, each instance
  "verifies that its IP address map aligns with the configuration of every
  other instance's IP address map", and a discrepancy is a failure: a peer
  whose list differs is never counted as connected.
* ``connections.html`` "Connections, Quorum, and Clean up": IMEX "will be
  ready for processing immediately after starting" (no full quorum at
  start); only after an unclean shutdown does it wait for the former
  importers, unless ``IMEX_WAIT_FOR_QUORUM=NONE``, and that recovery
  quorum is skipped when the nodes file changed.  The stand-in keeps no
  imports, so it models the one part the prolog can see: a persist file
  (``<dir of LOG_FILE_NAME>/persist.dat`` here, ``/var/run/nvidia-imex/persist.dat``
  on a real node) left by a daemon that was killed, with the same nodes
  key, holds the new daemon in ``WAITING_FOR_RECOVERY`` until every peer of
  that list is connected, unless ``IMEX_WAIT_FOR_QUORUM=NONE``.
* ``signals.html``: SIGTERM, SIGINT and SIGQUIT shut it down, and "the
  signaled nvidia-imex instance will notify other nodes of the shutdown".
* ``cmdservice.html``: ``nvidia-imex-ctl [-i <IP> <PORT>|-c <config>]
  <-N|-q> [-j] [-H]``; ``-c`` defaults to ``/etc/nvidia-imex/config.cfg``;
  ``-N`` "gets the full status of the entire IMEX domain", ``-j`` makes
  that JSON, ``-H`` shows host names.

The comments of NVIDIA's own ``config.cfg`` (reproduced with the file in AWS
ParallelCluster's IMEX set-up script): ``IMEX_WAIT_FOR_QUORUM`` defaults to
``RECOVERY``; an empty ``IMEX_CMD_BIND_INTERFACE_IP`` "will bind to all
available interfaces" (the stand-in's ctl then asks 127.0.0.1); an empty
``LOG_FILE_NAME`` logs to stderr; the systemd unit runs ``nvidia-imex -c
<config>``.

NVIDIA/DCGM ``dcgmlib/src/imex/DcgmImexManager.cpp`` and ``dcgm_fields.h``:

* ``nvidia-imex-ctl -q`` prints one word, the daemon's state: INITIALIZING,
  STARTING_AUTH_SERVER, WAITING_FOR_PEERS, WAITING_FOR_RECOVERY, INIT_GPU,
  READY, SHUTTING_DOWN, UNAVAILABLE (the stand-in prints UNAVAILABLE when
  no daemon answers);
* ``-N -j``'s top-level ``status`` is UP, DOWN or DEGRADED, and its
  layout is the test's sample (``tests/data/imex``): ``nodes`` keyed by
  the node's index in the nodes file, each with ``status``, ``host``,
  ``connections``, ``version``, ``hostName``; plus ``timestamp``;
* without a readable nodes file the tools say "Failed to read node
  configuration file".

What the sources leave open, and the stand-in's choice (never relied on by
slurm-gpu beyond what is cited above): the peer wire protocol (JSON lines
over TCP here; gRPC on a real node), how UP/DEGRADED/DOWN are derived (UP:
every listed node READY and connected; DOWN: this daemon not READY or no
peer connected in a multi-node domain; DEGRADED otherwise), a peer's status
when unreachable (UNAVAILABLE, its connection INVALID, after Crusoe's "C
(Connected)" / "I (Invalid)" reading of ``-N``).  NVIDIA documents no exit
status for either tool: the stand-in exits 0 when it printed an answer and
1 otherwise, and slurm-gpu reads the printed answer, never the status.

Faults for drills (rig only, never a real key): ``--fault FILE`` names a
file whose first word is ``no-start`` (the daemon aborts at start, as the
guide says it does on an incompatible driver) or ``isolated`` (it neither
accepts nor makes peer connections: a firewalled node).
"""
from __future__ import annotations

import hashlib
import json
import os
import selectors
import signal
import socket
import sys
import time
from typing import Any

DEFAULT_CONFIG = "/etc/nvidia-imex/config.cfg"
DEFAULT_NODES = "/etc/nvidia-imex/nodes_config.cfg"
VERSION = "570.00-standin"
NO_NODES_FILE = "Failed to read node configuration file"
STATES = ("INITIALIZING", "STARTING_AUTH_SERVER", "WAITING_FOR_PEERS", "WAITING_FOR_RECOVERY",
          "INIT_GPU", "READY", "SHUTTING_DOWN", "UNAVAILABLE")
RETRY = 0.05        # seconds between connection attempts to a missing peer


def read_config(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


def read_nodes(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [ln.strip() for ln in f if ln.strip() and not ln.strip().startswith("#")]


def nodes_key(nodes: list[str]) -> str:
    return hashlib.sha256("\n".join(nodes).encode()).hexdigest()[:16]


def _local_ip(nodes: list[str], port: int) -> str | None:
    """The first listed address this host can bind (the guide's interface match)."""
    for ip in nodes:
        fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_STREAM)
        try:
            s.bind((ip, 0))
            return ip
        except OSError:
            continue
        finally:
            s.close()
    return None


class _Conn:
    def __init__(self, sock: socket.socket, peer: int | None, outgoing: bool) -> None:
        self.sock = sock
        self.peer = peer            # index in the nodes file, once known
        self.outgoing = outgoing
        self.buf = b""
        self.ok = False             # hello exchanged and the node maps agree
        self.state = "UNAVAILABLE"


class Daemon:
    def __init__(self, cfg: dict[str, str], port: int | None, fault: str) -> None:
        self.cfg = cfg
        self.fault = fault
        self.port = port if port is not None else int(cfg.get("SERVER_PORT", "50000") or 50000)
        self.nodes = read_nodes(cfg.get("IMEX_NODE_CONFIG_FILE") or DEFAULT_NODES)
        self.key = nodes_key(self.nodes)
        me_ip = cfg.get("BIND_INTERFACE_IP") or _local_ip(self.nodes, self.port)
        if me_ip is None or me_ip not in self.nodes:
            raise SystemExit("nvidia-imex: no address of this host is in the node configuration file")
        self.me_ip: str = me_ip
        self.me = self.nodes.index(me_ip)
        self.state = "INITIALIZING"
        self.sel = selectors.DefaultSelector()
        self.peers: dict[int, _Conn] = {}
        self.pending: dict[int, float] = {i: 0.0 for i in range(len(self.nodes)) if i != self.me}
        self.stop = False
        log = cfg.get("LOG_FILE_NAME") or ""
        self.log_path = log
        self.persist = os.path.join(os.path.dirname(log), "persist.dat") if log else ""
        self.recovery: set[int] = set()

    def log(self, msg: str) -> None:
        line = time.strftime("[%Y-%m-%d %H:%M:%S] ") + msg + "\n"
        if self.log_path:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(line)
        else:
            sys.stderr.write(line)

    def _listen(self, ip: str, port: int) -> socket.socket:
        fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((ip, port))
        s.listen(64)
        s.setblocking(False)
        return s

    def start(self) -> None:
        self.srv = self._listen(self.me_ip, self.port)
        self.sel.register(self.srv, selectors.EVENT_READ, ("accept", None))
        if self.cfg.get("IMEX_CMD_ENABLED", "0") == "1":
            cmd_ip = self.cfg.get("IMEX_CMD_BIND_INTERFACE_IP") or "0.0.0.0"
            self.cmd = self._listen(cmd_ip, int(self.cfg.get("IMEX_CMD_PORT", "50005")))
            self.sel.register(self.cmd, selectors.EVENT_READ, ("cmd", None))
        # connections.html: recovery waits only after an unclean stop, with the same nodes file.
        if self.persist and os.path.exists(self.persist):
            try:
                with open(self.persist, encoding="utf-8") as f:
                    old = json.load(f)
            except (OSError, ValueError):
                old = {}
            if old.get("key") == self.key and self.cfg.get("IMEX_WAIT_FOR_QUORUM", "RECOVERY") != "NONE":
                self.recovery = {i for i in range(len(self.nodes)) if i != self.me}
        if self.persist:
            with open(self.persist, "w", encoding="utf-8") as f:
                json.dump({"key": self.key}, f)
        self.state = "WAITING_FOR_RECOVERY" if self.recovery else "READY"
        self.log(f"IMEX stand-in up: node {self.me} ({self.me_ip}:{self.port}), state {self.state}")

    # -- peers -------------------------------------------------------------

    def _hello(self) -> bytes:
        return (json.dumps({"hello": self.me, "key": self.key, "state": self.state}) + "\n").encode()

    def _connect_missing(self) -> None:
        if self.fault == "isolated":
            return
        now = time.monotonic()
        for i, due in list(self.pending.items()):
            if i in self.peers or now < due:
                continue
            self.pending[i] = now + RETRY
            ip = self.nodes[i]
            fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
            s = socket.socket(fam, socket.SOCK_STREAM)
            s.settimeout(0.2)
            try:
                s.connect((ip, self.port))
            except OSError:
                s.close()
                continue
            s.setblocking(False)
            c = _Conn(s, i, True)
            self.peers[i] = c
            self.sel.register(s, selectors.EVENT_READ, ("peer", c))
            self._send(c, self._hello())

    def _send(self, c: _Conn, data: bytes) -> None:
        try:
            c.sock.setblocking(True)
            c.sock.sendall(data)
            c.sock.setblocking(False)
        except OSError:
            self._drop(c)

    def _drop(self, c: _Conn) -> None:
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()
        if c.peer is not None and self.peers.get(c.peer) is c:
            del self.peers[c.peer]
            self.pending[c.peer] = time.monotonic() + RETRY

    def _on_peer(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._drop(c)
            return
        c.buf += data
        while b"\n" in c.buf:
            line, c.buf = c.buf.split(b"\n", 1)
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "hello" in msg:
                idx = int(msg["hello"])
                if msg.get("key") != self.key:
                    # deployment.html: IP map discrepancies are failures, never a domain.
                    self.log(f"node {idx}: IP address map differs from ours; connection refused")
                    self._drop(c)
                    return
                if not c.outgoing:
                    if idx in self.peers and self.peers[idx] is not c:
                        # both dialled at once: keep the lower index's outgoing connection
                        if self.me < idx:
                            self._drop(c)
                            return
                        self._drop(self.peers[idx])
                    c.peer = idx
                    self.peers[idx] = c
                    self._send(c, self._hello())
                c.ok = True
                c.state = str(msg.get("state", "UNAVAILABLE"))
                self.recovery.discard(idx)
            elif "state" in msg and c.peer is not None:
                c.state = str(msg["state"])
            elif msg.get("bye"):
                self._drop(c)
                return

    def _broadcast_state(self) -> None:
        data = (json.dumps({"state": self.state}) + "\n").encode()
        for c in list(self.peers.values()):
            if c.ok:
                self._send(c, data)

    # -- command service ---------------------------------------------------

    def domain(self, hostnames: bool) -> dict[str, Any]:
        nodes: dict[str, Any] = {}
        ready = 0
        for i, ip in enumerate(self.nodes):
            if i == self.me:
                st = self.state
                conns = {str(j): {"host": self.nodes[j],
                                  "status": "CONNECTED" if (j in self.peers and self.peers[j].ok) else "INVALID",
                                  "changed": True}
                         for j in range(len(self.nodes)) if j != self.me}
            else:
                c = self.peers.get(i)
                st = c.state if c and c.ok else "UNAVAILABLE"
                conns = {}
            ready += st == "READY"
            name = socket.gethostname() if (hostnames and i == self.me) else ""
            nodes[str(i)] = {"status": st, "host": ip, "connections": conns, "changed": True,
                             "version": VERSION, "hostName": name}
        connected = sum(1 for c in self.peers.values() if c.ok)
        if ready == len(self.nodes):
            status = "UP"
        elif self.state != "READY" or (len(self.nodes) > 1 and connected == 0):
            status = "DOWN"
        else:
            status = "DEGRADED"
        return {"nodes": nodes, "timestamp": time.strftime("%m/%d/%Y %H:%M:%S.000"), "status": status}

    def _on_cmd(self) -> None:
        try:
            s, _ = self.cmd.accept()
        except OSError:
            return
        s.settimeout(1.0)
        try:
            req = s.recv(4096).decode().strip()
            if req == "q":
                out = self.state
            else:
                out = json.dumps(self.domain(req == "NH"))
            s.sendall((out + "\n").encode())
        except OSError:
            pass
        finally:
            s.close()

    # -- loop --------------------------------------------------------------

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
            signal.signal(sig, lambda *_: setattr(self, "stop", True))
        self.start()
        last = ""
        while not self.stop:
            self._connect_missing()
            for key, _ in self.sel.select(RETRY):
                kind, c = key.data
                if kind == "accept":
                    try:
                        s, _ = self.srv.accept()
                    except OSError:
                        continue
                    if self.fault == "isolated":
                        s.close()
                        continue
                    s.setblocking(False)
                    nc = _Conn(s, None, False)
                    self.sel.register(s, selectors.EVENT_READ, ("peer", nc))
                elif kind == "cmd":
                    self._on_cmd()
                else:
                    self._on_peer(c)
            if self.state == "WAITING_FOR_RECOVERY" and not self.recovery:
                self.state = "READY"
            if self.state != last:
                self._broadcast_state()
                last = self.state
        self.state = "SHUTTING_DOWN"
        for c in list(self.peers.values()):        # signals.html: notify the other nodes
            if c.ok:
                self._send(c, b'{"bye": true}\n')
        if self.persist:
            try:
                os.unlink(self.persist)            # a clean stop leaves no recovery to wait for
            except OSError:
                pass
        self.log("IMEX stand-in shut down")
        return 0


def daemon_main(argv: list[str]) -> int:
    cfg_path, port, fault = DEFAULT_CONFIG, None, ""
    it = iter(argv)
    for a in it:
        if a in ("-c", "--config"):
            cfg_path = next(it, "")
        elif a in ("-p", "--port"):
            port = int(next(it, "0"))
        elif a == "--fault":
            try:
                with open(next(it, ""), encoding="utf-8") as f:
                    fault = (f.read().split() or [""])[0]
            except OSError:
                fault = ""
        else:
            print(f"nvidia-imex: unknown option {a}", file=sys.stderr)
            return 1
    try:
        cfg = read_config(cfg_path)
    except OSError as e:
        print(f"nvidia-imex: cannot read {cfg_path}: {e.strerror}", file=sys.stderr)
        return 1
    if cfg.get("DAEMONIZE", "1") != "0":
        print("nvidia-imex stand-in: runs in the foreground only (set DAEMONIZE=0)", file=sys.stderr)
        return 1
    if fault == "no-start":
        print("nvidia-imex: loaded driver stack version is not compatible; aborting", file=sys.stderr)
        return 1
    try:
        d = Daemon(cfg, port, fault)
    except OSError:
        print(NO_NODES_FILE, file=sys.stderr)
        return 1
    try:
        return d.run()
    except OSError as e:
        d.log(f"nvidia-imex: {e}")
        print(f"nvidia-imex: {e}", file=sys.stderr)
        return 1


def ask(ip: str, port: int, request: str, timeout: float) -> bytes:
    """The command service's answer line to one *request* (``q``, ``N`` or ``NH``):
    the exchange ``nvidia-imex-ctl`` makes, for the ctl and for readiness polls."""
    with socket.create_connection((ip, port), timeout=timeout) as s:
        s.sendall(request.encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return data


def ctl_main(argv: list[str]) -> int:
    cfg_path, ip_port, what, as_json, hostnames = DEFAULT_CONFIG, None, "", False, False
    it = iter(argv)
    for a in it:
        if a == "-c":
            cfg_path = next(it, "")
        elif a == "-i":
            ip_port = (next(it, ""), next(it, "0"))
        elif a in ("-q", "-N"):
            what = a
        elif a == "-j":
            as_json = True
        elif a == "-H":
            hostnames = True
        else:
            print(f"nvidia-imex-ctl: unknown option {a}", file=sys.stderr)
            return 1
    if not what:
        print("Usage: nvidia-imex-ctl [-i <IP> <PORT>|-c <nvidia-imex config.cfg path>] <-N|-q> [-j] [-H]",
              file=sys.stderr)
        return 1
    if ip_port is None:
        try:
            cfg = read_config(cfg_path)
            read_nodes(cfg.get("IMEX_NODE_CONFIG_FILE") or DEFAULT_NODES)
        except OSError:
            print(NO_NODES_FILE)
            return 1
        ip_port = (cfg.get("IMEX_CMD_BIND_INTERFACE_IP") or "127.0.0.1", cfg.get("IMEX_CMD_PORT", "50005"))
    try:
        data = ask(ip_port[0], int(ip_port[1]), "q" if what == "-q" else ("NH" if hostnames else "N"), 2.0)
    except (OSError, ValueError):
        print("UNAVAILABLE" if what == "-q" else "Connection to the IMEX daemon failed")
        return 1
    text = data.decode().strip()
    if what == "-q" or as_json:
        print(text)
        return 0
    doc = json.loads(text)
    for k, n in doc["nodes"].items():
        print(f"Node #{k} - {n['host']:<16} - {n['status']:<12} - Version: {n['version']}")
    print(f"Domain State: {doc['status']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "ctl":
        return ctl_main(args[1:])
    if args and args[0] == "daemon":
        return daemon_main(args[1:])
    print("usage: python -m ...imex_standin daemon|ctl ARGS", file=sys.stderr)
    return 2


def write_wrappers(directory: str, python: str, fault_file: str = "",
                   script: str | None = None) -> tuple[str, str]:
    """``nvidia-imex`` and ``nvidia-imex-ctl`` scripts in *directory* running this
    module (*script*: its path as the hooks see it, e.g. in a venv)."""
    # The file itself, not ``-m`` (importing the devkit's sim package costs ~90 ms a
    # run): it needs the standard library only.  *script* "venv:<venv>" finds the
    # venv's installed copy by a glob when the wrapper runs, so the same wrapper works
    # in a Debian root, whose venv has the same path but another python3.N.
    if script and script.startswith("venv:"):
        rel = "/".join(__name__.split(".")) + ".py"
        target = "\"$f\""
        find = f"for f in '{script[5:]}'/lib/python3*/site-packages/{rel}; do :; done\n"
    else:
        target, find = repr(script or os.path.abspath(__file__)), ""
    paths = []
    for name, sub in (("nvidia-imex", "daemon"), ("nvidia-imex-ctl", "ctl")):
        extra = f" --fault '{fault_file}'" if (fault_file and sub == "daemon") else ""
        # A missing fault file is no fault (the stand-in reads it at start).
        text = (f"#!/bin/sh\n# slurm-gpu test rig: stand-in for NVIDIA's {name} ({__name__}).\n"
                f"{find}exec '{python}' -I {target} {sub}{extra} \"$@\"\n")
        path = os.path.join(directory, name)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
        paths.append(path)
    return paths[0], paths[1]


if __name__ == "__main__":
    sys.exit(main())
