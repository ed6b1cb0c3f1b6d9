"""A stand-in for ``nvidia-cuda-mps-control`` on machines without a GPU.

It behaves the way the project's code relies on the real binary behaving
(CUDA MPS documentation, "nvidia-cuda-mps-control" man page):

* ``nvidia-cuda-mps-control -d`` starts the control daemon in the
  background and returns at once; the daemon listens in
  ``$CUDA_MPS_PIPE_DIRECTORY`` (default ``/tmp/nvidia-mps``) and logs to
  ``$CUDA_MPS_LOG_DIRECTORY/control.log`` (default ``/var/log/nvidia-mps``).
  A second ``-d`` on the same pipe directory fails: "An instance of this
  daemon is already running".
* Without arguments it is a client: it reads commands from stdin, one per
  line, sends them to the daemon over one connection and prints the
  answers.  With no daemon it
  prints "Cannot find MPS control daemon process" and exits 1.
* Commands: ``quit [-t SECONDS]``, ``get_server_list``, ``start_server -uid UID``,
  ``shutdown_server PID [-f]``, ``set_default_active_thread_percentage N``,
  ``get_default_active_thread_percentage``,
  ``set_default_device_pinned_mem_limit DEV VALUE``,
  ``get_default_device_pinned_mem_limit DEV``.

The daemon accepts only clients of its own uid (or root), checked with
SO_PEERCRED, in addition to the 0700 pipe directory.  ``start_server``
forks a placeholder "server" process so that ``get_server_list`` and the
epilog's straggler handling have a real PID to deal with.

NVIDIA's real binary runs without a GPU and is what the tests, benchmarks
and the sandbox use (:mod:`.mps_real`, ``scripts/fetch-mps.sh``); this
stand-in is kept for the one thing that needs a GPU, a live server after
``start_server``, and its answers and log lines are the real 535 daemon's
(``50.0``, ``Unknown command "x"``, ``Server 99 not found``), checked
against it side by side by tests/unit/jobs/test_mps_control.py.

Run it through :func:`write_wrapper`, which makes an executable file the
``[mps] control`` setting can point at.
"""
from __future__ import annotations

from typing import Any
import fcntl
import os
import signal
import socket
import stat
import struct
import sys
import time
from pathlib import Path

SOCKET_NAME = "control"
LOG_NAME = "control.log"


def _dirs() -> tuple[Path, Path]:
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")
    log = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY") or "/var/log/nvidia-mps")
    return pipe, log


def _log(log_dir: Path, msg: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    try:
        with open(log_dir / LOG_NAME, "a", encoding="utf-8") as f:
            # "[2026-11-24 14:39:24.957 Control  7932] ..." as the real daemon writes it
            f.write(f"[{stamp}.{int(time.time() * 1000) % 1000:03d} Control {os.getpid():5d}] "
                    f"{msg}\n")
    except OSError:
        pass


class _Daemon:
    def __init__(self, pipe: Path, log: Path) -> None:
        self.pipe = pipe
        self.log = log
        self.percentage = 100.0
        self.pinned: dict[int, str] = {}
        self.servers: dict[int, int] = {}   # pid -> uid
        self.quitting = False

    def handle(self, lines: list[str], peer_uid: int) -> str:
        """One client session: its commands in order, over one connection.

        The real 535 daemon logs "Accepting connection..." and "NEW UI" once
        per client, then "Cmd:<line>" and the answer of each command, and
        "UI closed" at the end; after ``quit`` it takes no further command.
        """
        for msg in ("Accepting connection...", "NEW UI"):
            _log(self.log, msg)
        out = []
        for line in lines:
            words = line.split()
            if not words:
                continue
            _log(self.log, f"Cmd:{line}")
            reply = self._answer(words[0], words[1:])
            if reply:
                _log(self.log, reply.rstrip("\n"))
            out.append(reply)
            if self.quitting:
                return "".join(out)
        _log(self.log, "UI closed")
        return "".join(out)

    def _answer(self, cmd: str, args: list[str]) -> str:
        if cmd == "quit":
            self.quitting = True
            return ""
        if cmd == "get_server_list":
            self._reap()
            return "".join(f"{pid}\n" for pid in sorted(self.servers))
        if cmd == "start_server" and len(args) == 2 and args[0] == "-uid" and args[1].isdigit():
            # The one thing that needs a GPU: the real daemon's server exits
            # with status 1 without one; here a placeholder stays up.
            pid = self._spawn_server()
            self.servers[pid] = int(args[1])
            _log(self.log, f"Starting new server {pid} for user {args[1]}")
            return ""
        if cmd == "shutdown_server" and args and args[0].isdigit():
            pid = int(args[0])
            if pid not in self.servers:
                return f"Server {pid} not found\n"
            os.kill(pid, signal.SIGKILL if "-f" in args else signal.SIGTERM)
            self._reap(wait=True)
            return ""
        if cmd == "set_default_active_thread_percentage" and len(args) == 1:
            # An invalid value is logged and the current one answered (exit 0).
            try:
                value = float(args[0])
            except ValueError:
                value = -1.0
            if 0 < value <= 100:
                self.percentage = value
            else:
                _log(self.log, "Invalid percentage, expected between (0.0, 100.0]")
            return f"{self.percentage:.1f}\n"
        if cmd == "get_default_active_thread_percentage" and not args:
            return f"{self.percentage:.1f}\n"
        if cmd == "set_default_device_pinned_mem_limit" and len(args) == 2 and args[0].isdigit():
            self.pinned[int(args[0])] = args[1]
            return ""
        if cmd == "get_default_device_pinned_mem_limit" and len(args) == 1 and args[0].isdigit():
            if int(args[0]) not in self.pinned:
                _log(self.log, "No default pinned memory limit set for the device!")
                return ""
            return f"{self.pinned[int(args[0])]}\n"
        return f'Unknown command "{cmd}"\n'

    def _spawn_server(self) -> int:
        pid = os.fork()
        if pid == 0:  # placeholder server: sleeps until killed
            try:
                # Drop the daemon's sockets, or clients would wait for EOF forever.
                os.closerange(3, 65536)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                while True:
                    time.sleep(3600)
            finally:
                os._exit(0)
        return pid

    def _reap(self, wait: bool = False) -> None:
        for pid in list(self.servers):
            try:
                done, _ = os.waitpid(pid, 0 if wait else os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.servers.pop(pid, None)

    def shutdown(self) -> None:
        for pid in list(self.servers):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self._reap(wait=True)


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _serve(d: _Daemon, sock: socket.socket) -> None:
    me = os.getuid()
    while not d.quitting:
        try:
            conn, _ = sock.accept()
        except InterruptedError:
            continue
        with conn:
            uid = _peer_uid(conn)
            data = b""
            conn.settimeout(5)
            try:
                while True:                   # the whole session: the client half-closes
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            except OSError:
                continue
            if uid not in (me, 0):
                _log(d.log, f"User {uid} did not send valid credentials")
                conn.sendall(b"\x01Access denied\n")
                continue
            reply = d.handle(data.decode(errors="replace").splitlines(), uid)
            try:
                conn.sendall(b"\x00" + reply.encode())
            except OSError:
                pass
    d.shutdown()


def _daemon_main() -> int:
    pipe, log = _dirs()
    sock_path = pipe / SOCKET_NAME
    lock = pipe / "control_lock"
    try:
        # As the real 535 binary: it opens control_lock in the pipe directory
        # first; where it cannot (missing, mode 000, mounted over, out of
        # inodes) it prints this on stdout and exits 1.
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError:
        print(f"Cannot access CUDA_MPS_PIPE_DIRECTORY={pipe}")
        return 1
    try:
        # A running daemon holds a write lock on it (the real one's test for
        # another instance: a socket someone else bound at "control" it replaces).
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(fd, fcntl.LOCK_UN)
    except OSError:
        print("An instance of this daemon is already running")   # stdout, as the real one
        return 1
    finally:
        os.close(fd)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid:
        os.close(wfd)
        ok = os.read(rfd, 1)
        os.close(rfd)
        return 0 if ok == b"1" else 1
    os.close(rfd)
    try:
        os.setsid()
        held = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        fcntl.lockf(held, fcntl.LOCK_EX | fcntl.LOCK_NB)    # for the daemon's life
        os.chdir("/")
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        try:
            sock_path.unlink()
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(sock_path))
        os.chmod(sock_path, stat.S_IRUSR | stat.S_IWUSR)
        sock.listen(16)
        d = _Daemon(pipe, log)
        _log(log, f"Starting control daemon using socket {sock_path}")
        _log(log, "To connect CUDA applications to this daemon, set env "
                  f"CUDA_MPS_PIPE_DIRECTORY={pipe}")
        def _quit(*_: Any) -> None:
            d.quitting = True
            sock.close()
        signal.signal(signal.SIGTERM, _quit)
        os.write(wfd, b"1")
        os.close(wfd)
        try:
            _serve(d, sock)
        except OSError:
            d.shutdown()
        try:
            sock_path.unlink()
        except OSError:
            pass
        _log(log, "Exit with status 0")
    finally:
        os._exit(0)


def _connect(sock_path: Path) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(sock_path))
    except OSError:
        s.close()
        return None
    return s


def _client_main() -> int:
    """Send every line of stdin over one connection, print the answers.

    As the real client: one session per invocation, so a batch of commands
    is one "NEW UI" in control.log; with no daemon listening nothing is
    sent and it exits 1.
    """
    pipe, _ = _dirs()
    lines = [line.strip() for line in sys.stdin]
    lines = [line for line in lines if line]
    if not lines:
        return 0
    s = _connect(pipe / SOCKET_NAME)
    if s is None:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    with s:
        s.sendall("".join(line + "\n" for line in lines).encode())
        s.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    if not data:
        return 0
    status, body = data[:1], data[1:].decode(errors="replace")
    if status != b"\x00":
        sys.stderr.write(body)
        return 1
    sys.stdout.write(body)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args in (["-d"], ["--daemon"]):
        return _daemon_main()
    if not args:
        return _client_main()
    if args in (["-h"], ["--help"]):
        print("usage: nvidia-cuda-mps-control [-d | -h]")
        return 0
    print(f"Invalid option: {' '.join(args)}", file=sys.stderr)
    return 1


def write_wrapper(path: str | os.PathLike[str], *, python: str | None = None,
                  source_root: str | None = None) -> Path:
    """Write an executable ``nvidia-cuda-mps-control`` stand-in at *path*."""
    from slurm_gpu_devkit import SOURCE_ROOT

    python = python or sys.executable or "/opt/slurm-gpu/venv/bin/python"
    root = source_root or str(SOURCE_ROOT)
    if any(c in root + python for c in "'\"\\$`"):
        raise ValueError("unsafe path for the MPS stand-in wrapper")
    p = Path(path)
    p.write_text("#!/bin/sh\n"
                 "# slurm-gpu stand-in for nvidia-cuda-mps-control (no GPU on this machine)\n"
                 f"exec {python} -I -c 'import sys; sys.path.insert(0, \"{root}\"); "
                 "from slurm_gpu_devkit.sim.mps_control import main; sys.exit(main())' \"$@\"\n")
    p.chmod(0o755)
    return p


if __name__ == "__main__":
    sys.exit(main())
