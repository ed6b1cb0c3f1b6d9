"""A process of a job user's that no prolog started, for the hostile-user tests.

It forks away before the prolog runs (so it is no descendant of the test's
process, as a process of another job or an ssh session is not), then does
one thing on each request: what another process of the job user's on the
node can do to that job's MPS directories while the prolog works.
"""
from __future__ import annotations

import os
import subprocess
import sys


class Agent:
    """Runs *code* (the body of ``act(arg)``, with ``os``, ``socket`` and a
    ``keep`` list at hand) as *user* on each :meth:`do`."""

    HEAD = ("import os, sys, socket\n"
            "if os.fork():\n    os._exit(0)\n"
            "print(os.getpid(), flush=True)\nkeep = []\n"
            "def act(arg):\n")

    def __init__(self, code: str, env: dict[str, str] | None = None, user: str = "sgtest1") -> None:
        body = "".join("    " + ln + "\n" for ln in code.splitlines()) or "    pass\n"
        self.p = subprocess.Popen(
            [sys.executable, "-I", "-c", self.HEAD + body +
             "for line in sys.stdin:\n    act(line.strip())\n    print('done', flush=True)\n"],
            user=user, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env or {})
        self.pid = int(self.p.stdout.readline())
        self.p.wait()                       # the parent; the agent lives on, reparented

    def do(self, arg: str) -> None:
        self.p.stdin.write(arg + "\n")
        self.p.stdin.flush()
        assert self.p.stdout.readline().strip() == "done"

    def close(self) -> None:
        try:
            os.kill(self.pid, 9)
        except ProcessLookupError:
            pass
        self.p.stdin.close()
        self.p.stdout.close()


# What the campaign and the unit tests make the agent do (arg: the pipe or log directory).
RENAME_SOCKETS = ("for n in ('control', 'control_privileged'):\n"
                  "    os.rename(arg + '/' + n, arg + '/' + n + '.moved')\n")
REPLACE_SOCKETS = ("for n in ('control', 'control_privileged'):\n"
                   "    os.rename(arg + '/' + n, arg + '/' + n + '.old')\n"
                   "    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
                   "    s.bind(arg + '/' + n)\n    s.listen(8)\n    keep.append(s)\n")
PLANT_DIRS = "for n in ('control', 'control_privileged'):\n    os.mkdir(arg + '/' + n)\n"
PLANT_FIFOS = ("try:\n    os.unlink(arg + '/control.log')\nexcept OSError:\n    pass\n"
               "os.mkfifo(arg + '/control.log')\nos.mkfifo(arg + '/server.log.fifo')\n"
               "os.symlink('/etc/shadow', arg + '/shadow')\n")
# The pipe directory shut to its own daemon (its owner may chmod it).
CHMOD_DIR = "os.chmod(arg, 0)\n"
# Kill the daemon bound to this pipe directory the moment -d has returned, and
# remove its control.log: nothing the user can reach then says it started.
KILL_UNSEEN = ("want = ('CUDA_MPS_PIPE_DIRECTORY=' + arg).encode()\n"
               "for p in os.listdir('/proc'):\n"
               "    try:\n"
               "        env = open('/proc/' + p + '/environ', 'rb').read().split(b'\\0')\n"
               "    except (OSError, ValueError):\n"
               "        continue\n"
               "    if want in env and int(p) != os.getpid():\n"
               "        os.kill(int(p), 9)\n"
               "try:\n    os.unlink(os.path.dirname(arg) + '/log/control.log')\nexcept OSError:\n    pass\n")
