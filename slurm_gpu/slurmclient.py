"""The one place that talks to Slurm: its command paths, the node updates, slurm.conf.

* :func:`command`: where ``scontrol``, ``squeue``, ``sinfo``, ``scancel``
  are (Slurm runs prolog, epilog and HealthCheckProgram with no PATH), or a
  path the configuration names;
* :func:`drain`, :func:`resume`, :func:`update_node`, :func:`show_node`: the
  ``scontrol`` calls every part of slurm-gpu makes on a node, each built here
  once;
* :func:`read_conf` / :func:`conf_path`: slurm.conf's top-level settings,
  following ``Include`` as slurmctld does, for every reader.

Every command goes through :func:`slurm_gpu.runner.run`, so a timeout kills
the command's process group and nothing here needs a shell.
"""
from __future__ import annotations

import glob
import os

from . import runner

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Mapping, Sequence

# Slurm's client commands: the runner's PATH, then where a source build puts them.
SEARCH_DIRS: tuple[str, ...] = tuple(runner.SAFE_PATH.split(":")) + ("/usr/local/bin", "/usr/local/sbin")
DEFAULT_CONF = "/etc/slurm/slurm.conf"        # Slurm's built-in (nodefacts.SLURM_CONF_DEFAULT)
# Lines that are not top-level settings (their keys repeat per node/partition).
_SKIP = ("nodename", "partitionname", "nodeset", "frontendname", "downnodes")
_MAX_INCLUDE_DEPTH = 5


def command(name: str, configured: str | None = None) -> str:
    """Slurm's command *name* by absolute path; *configured* (a config key's value) wins.

    A path a config key names is taken as it is (the admin chose it); else the
    first executable in :data:`SEARCH_DIRS`; else the bare name, so that the
    runner's error says "command not found: scontrol".
    """
    if configured and configured != name:
        return configured
    for d in SEARCH_DIRS:
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    return name


def sibling(configured: str, name: str) -> str:
    """Slurm's command *name* beside a configured one (``squeue`` beside ``[jobs] scancel``)."""
    d = os.path.dirname(configured)
    return os.path.join(d, name) if d else command(name)


def scontrol(args: Sequence[str], timeout: float, *, check: bool = True,
             path: str | None = None) -> runner.Completed:
    """``scontrol ARGS``; *path*: a configured scontrol."""
    return runner.run([command("scontrol", path), *args], timeout, check=check)


def update_node_args(node: str, **fields: str) -> list[str]:
    """``update nodename=NODE key=value ...`` (the keys in the order given)."""
    return ["update", f"nodename={node}", *(f"{k}={v}" for k, v in fields.items())]


def update_node(node: str, timeout: float, *, path: str | None = None, check: bool = True,
                **fields: str) -> runner.Completed:
    """``scontrol update nodename=NODE key=value ...``."""
    return scontrol(update_node_args(node, **fields), timeout, check=check, path=path)


def drain(node: str, reason: str, timeout: float, *, path: str | None = None) -> None:
    """Drain *node* with *reason*; CommandError when scontrol fails."""
    update_node(node, timeout, path=path, state="drain", reason=reason)


def resume(node: str, timeout: float, *, path: str | None = None) -> None:
    """Resume *node*; CommandError when scontrol fails."""
    update_node(node, timeout, path=path, state="resume")


def show_node(node: str, timeout: float) -> runner.Completed:
    """``scontrol show node -o NODE``, whatever its exit status (the caller reads "not found")."""
    return scontrol(["show", "node", "-o", node], timeout, check=False)


# ----------------------------------------------------------------- slurm.conf

def conf_path(path: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """slurm.conf: *path*, else as Slurm's commands find it: ``$SLURM_CONF``,
    else the default when it exists, else a configless slurmd's
    ``/run/slurm/conf/slurm.conf`` (:func:`slurm_gpu.nodefacts.slurm_conf_path`)."""
    if path:
        return path
    from .nodefacts import slurm_conf_path
    return slurm_conf_path(os.environ if env is None else env)


def parse_conf(text: str, base: str, depth: int = 0) -> dict[str, str]:
    """Top-level settings of slurm.conf *text* (*base*: its directory, for ``Include``).

    Not a full parser: ``Key=Value`` settings, node and partition lines
    skipped, ``Include`` (a glob, relative to *base*) followed.  Keys are
    lower-case; the value is its first word; the last setting wins, as in
    Slurm.
    """
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.lower().startswith("include ") and depth < _MAX_INCLUDE_DEPTH:
            pattern = line.split(None, 1)[1].strip()
            for inc in sorted(glob.glob(os.path.join(glob.escape(base), pattern))):
                try:
                    with open(inc, encoding="utf-8", errors="replace") as f:
                        out.update(parse_conf(f.read(), os.path.dirname(inc), depth + 1))
                except OSError:
                    pass
            continue
        key, eq, value = line.partition("=")
        key = key.strip()
        if not eq or not key or " " in key or "\t" in key or key.lower() in _SKIP:
            continue
        out[key.lower()] = value.strip().split()[0] if value.strip() else ""
    return out


def read_conf(path: str | None = None) -> dict[str, str] | None:
    """Settings of slurm.conf at *path* (default :func:`conf_path`); None when unreadable."""
    p = conf_path(path)
    try:
        with open(p, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    return parse_conf(text, os.path.dirname(p))


def health_check_timeout(conf: Mapping[str, str] | None) -> float | None:
    """``HealthCheckTimeout`` in seconds (Slurm >= 26.05; before it, slurmd kills at 60 s)."""
    v = (conf or {}).get("healthchecktimeout", "")
    try:
        t = float(v)
    except ValueError:
        return None
    return t if t > 0 else None
