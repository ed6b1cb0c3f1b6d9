"""What the sandbox benchmarks share: their options and work directory, Slurm
clients as root or as a job user, a job's record, polling, and the node's
simulator load (bench_oversub.py, bench_util.py, bench_recovery.py,
bench_placement.py)."""
from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

JOB_USERS = ("sgtest1", "sgtest2")


def sandbox_options(ap: argparse.ArgumentParser) -> None:
    """The options every sandbox benchmark takes: ``--smoke`` and the sandbox's ``--slurm``."""
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--slurm", default=None, help="Slurm version of the sandbox (default: the host's)")


def workdir(name: str) -> Path:
    """A new directory for a sandbox: 0755, so its daemons and job users can reach what is inside."""
    d = Path(tempfile.mkdtemp(prefix=f"bench-{name}."))
    os.chmod(d, 0o755)
    return d


def client(sb: Any, argv: list[str], user: str | None = None, check: bool = True, cwd: str = "/tmp",
           timeout: float = 60) -> str:
    """A Slurm client's stdout, as root or as *user* (inside the root on a Debian root's Slurm)."""
    import pwd

    from slurm_gpu.runner import SAFE_PATH, RunAs, run
    run_as = None
    env = dict(sb.env)
    if user:
        pw = pwd.getpwnam(user)
        run_as = RunAs(pw.pw_uid, pw.pw_gid, tuple(os.getgrouplist(user, pw.pw_gid)))
        env.update(HOME=pw.pw_dir, USER=user, LOGNAME=user)
    wrapped, run_as = sb.client_argv(argv, run_as, cwd)
    if wrapped != argv:
        env["PATH"] = SAFE_PATH
    return run(wrapped, timeout=timeout, env=env, run_as=run_as, cwd=cwd if wrapped == argv else "/",
               check=check).stdout


def sbatch(sb: Any, args: list[str], user: str | None = None, cwd: str = "/tmp") -> str:
    return client(sb, ["sbatch", "--parsable", *args], user, cwd=cwd).strip().split(";")[0]


def job(sb: Any, jid: str) -> dict[str, str]:
    """``scontrol -d show job -o`` as a dict, with ``IDX``: Slurm's GPU indices (empty once forgotten)."""
    out = client(sb, ["scontrol", "-d", "show", "job", "-o", jid], check=False)
    d = dict(w.split("=", 1) for w in out.split() if "=" in w)
    idx = re.search(r"GRES=\S*?\(IDX:([0-9,\-]+)\)", out)
    d["IDX"] = idx.group(1) if idx else ""
    return d


def indices(text: str) -> list[int]:
    """``0-1,3`` -> [0, 1, 3]."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def until(probe: Callable[[], Any], timeout: float, what: str, step: float = 0.2) -> Any:
    """probe()'s first true answer; exit naming *what* after *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = probe()
        if v:
            return v
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: {what} not there after {timeout:g} s")
        time.sleep(step)


def use_load_file(sb: Any, node: str, load: Path) -> Path:
    """Point *node*'s simulator at the scripted load *load*; returns the state file."""
    from slurm_gpu_devkit.sandbox import nodesim
    from slurm_gpu_devkit.sim import open_sim
    state = sb.layout.var / node / nodesim.STATE_NAME
    with open_sim(str(state)).edit() as st:
        st["load_file"] = str(load)
    return state


def slurm_gpu_minors(gres_conf: str, node: str) -> list[int]:
    """Device minors of *node*'s gres/gpu lines in gres.conf's order: Slurm's GPU index order
    without AutoDetect (what the sandbox writes), read here independently of the product."""
    from slurm_gpu.confgen.hostlist import expand
    out: list[int] = []
    for line in gres_conf.splitlines():
        words = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if words.get("Name") != "gpu" or node not in expand(words.get("NodeName", node)):
            continue
        first = (words.get("File") or words.get("MultipleFiles", "")).split(",")[0]
        for name in expand(os.path.basename(first)):
            m = re.fullmatch(r"nvidia(\d+)", name)
            if m:
                out.append(int(m.group(1)))
    return out
