"""Run ``slurm-gpu snapshot record`` on every node and gather the results, atomically.

Through Slurm (the default): **one job step with one task per node**::

    srun --job-name=slurm-gpu-collect-<token> --nodes=N --ntasks-per-node=1 --nodelist=<hostlist>
         --no-kill --kill-on-bad-exit=0 --output=<stage>/%N.out --error=<stage>/%N.err
         [--partition/--reservation/--account/--qos/--time ...]
         <venv>/bin/slurm-gpu snapshot record -o <stage>/%n.json

Why this shape:

* one srun is one job and one step: slurmctld schedules it once, and slurmd
  fans the launch out over its own tree (``TreeWidth``), so the cost on
  slurmctld does not grow with one RPC per node;
* ``--no-kill`` and ``--kill-on-bad-exit=0``: a node that dies, or a task
  that fails, takes nothing else down; the others finish;
* each task writes its snapshot **itself, atomically** into the stage
  directory (which must be visible from the nodes, like ``[cluster]
  publish_dir``), so a file that exists is complete: progress is read from
  the directory as nodes finish, and no snapshot ever crosses srun's I/O
  forwarding, which splits long lines and interleaves tasks;
* ``%N.err`` (per node, written by slurmstepd) carries the task's own
  one-line error, the reason shown for a failed node;
* at the deadline the job is cancelled by its unique name (``scancel
  --name``), which lets srun end cleanly; the runner's timeout is the
  backstop.

Each staged file is checked (:func:`slurm_gpu.cluster.store.load_entry`:
garbage, an old schema, a half-written file are a reason, never a crash)
and then renamed into ``DIR/<node>.json``, so DIR never holds a partial
entry.  ``--via clush`` runs the same command through ClusterShell (ssh, or
its local ``exec`` worker) for nodes Slurm cannot reach.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .. import runner, slurmclient
from ..errors import CommandError, SlurmGpuError

COLLECTED, FAILED, SKIPPED = "collected", "failed", "skipped"
_TASK_ERR = re.compile(r"^srun: error: ([^\s:]+): tasks? [\d,\-]+: (.+)$")
_NODE_ERR = re.compile(r"^srun: error: .*?(?:on node|Node failure on) ([^\s:]+):?\s*(.*)$")


@dataclass
class Outcome:
    node: str
    status: str                 # collected | failed | skipped
    detail: str = ""            # GPUs found, or the reason
    elapsed: float = 0.0


@dataclass
class Collection:
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    elapsed: float = 0.0

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes.values() if o.status == status)

    def to_json(self) -> dict[str, Any]:
        return {"summary": {s: self.count(s) for s in (COLLECTED, FAILED, SKIPPED)} | {
                    "nodes": len(self.outcomes), "seconds": round(self.elapsed, 3)},
                "nodes": {n: {"status": o.status, "detail": o.detail} for n, o in self.outcomes.items()}}


def default_command() -> str:
    """This venv's ``slurm-gpu``: the project installs the same venv path on every node."""
    return os.path.join(sys.prefix, "bin", "slurm-gpu")


def srun_argv(nodes: Sequence[str], stage: str, command: str, token: str, *,
              passthrough: Sequence[str] = ()) -> list[str]:
    """The one srun that runs ``snapshot record`` once on each of *nodes*."""
    from ..confgen.hostlist import fold
    return [slurmclient.command("srun"),
            f"--job-name=slurm-gpu-collect-{token}", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}",
            "--ntasks-per-node=1", f"--nodelist={fold(nodes)}", "--no-kill", "--kill-on-bad-exit=0",
            f"--output={stage}/%N.out", f"--error={stage}/%N.err", *passthrough,
            command, "snapshot", "record", "-o", f"{stage}/%n.json"]


def srun_reasons(stderr: str) -> tuple[dict[str, str], list[str]]:
    """srun's stderr: per-node failure reasons, and the errors about the whole step."""
    per: dict[str, str] = {}
    general: list[str] = []
    for line in stderr.splitlines():
        line = line.strip()
        m = _TASK_ERR.match(line) or _NODE_ERR.match(line)
        if m:
            per.setdefault(m.group(1), m.group(2).strip() or line)
        elif line.startswith("srun: error:"):
            general.append(line[len("srun: error:"):].strip())
    return per, general


def _err_lines(path: str) -> tuple[str | None, str | None]:
    """(the task's last ``slurm-gpu:`` line, the last line at all) of a node's stderr file."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return None, None
    mine = [ln for ln in lines if ln.startswith("slurm-gpu:")]
    return (mine[-1] if mine else None), (lines[-1] if lines else None)


class Gatherer:
    """Moves finished, valid stage files into DIR and reports each node once."""

    def __init__(self, directory: str, stage: str, targets: Sequence[str],
                 report: Callable[[Outcome, int, int], None]) -> None:
        from ..hw.snapshot_bulk import SnapshotLoader
        self.dir, self.stage, self.targets = directory, stage, set(targets)
        self.total = len(targets)
        self.report = report
        self.done: dict[str, Outcome] = {}
        self.loader = SnapshotLoader()
        self.t0 = time.monotonic()

    def finish(self, o: Outcome) -> None:
        if o.node in self.done:
            return
        o.elapsed = o.elapsed or time.monotonic() - self.t0
        self.done[o.node] = o
        self.report(o, len(self.done), self.total)

    def accept(self, node: str, staged: str) -> None:
        """Check one complete staged file and rename it into DIR (or fail the node)."""
        from . import modelfile, store
        try:
            model = store.load_entry(staged, self.loader)
            os.replace(staged, modelfile.node_file(self.dir, node))
        except SlurmGpuError as e:
            self.finish(Outcome(node, FAILED, f"bad snapshot: {e.what}"))
            return
        except OSError as e:
            self.finish(Outcome(node, FAILED, f"cannot store: {e.strerror}"))
            return
        self.finish(Outcome(node, COLLECTED, f"{len(model.gpus)} GPU(s)"))

    def sweep(self) -> None:
        try:
            names = os.listdir(self.stage)
        except OSError:
            return
        for fn in names:
            if not fn.endswith(".json") or fn.startswith("."):
                continue       # atomic writes in progress are dot files
            node = fn[:-5]
            if node in self.targets and node not in self.done:
                self.accept(node, os.path.join(self.stage, fn))


def via_slurm(directory: str, targets: Sequence[str], *, passthrough: Sequence[str], command: str,
              timeout: float, report: Callable[[Outcome, int, int], None], poll: float = 0.2) -> Collection:
    """Collect *targets* with one srun (see the module docstring)."""
    import secrets
    token = secrets.token_hex(4)
    stage = tempfile.mkdtemp(prefix=".incoming-", dir=directory)
    os.chmod(stage, 0o755)
    g = Gatherer(directory, stage, targets, report)
    argv = srun_argv(targets, stage, command, token, passthrough=passthrough)
    env = {"PATH": runner.SAFE_PATH}
    for k in ("SLURM_CONF", "SLURM_GPU_CONFIG"):   # the sandbox's config reaches the tasks
        if k in os.environ:
            env[k] = os.environ[k]
    result: dict[str, Any] = {}

    def run_srun() -> None:
        try:
            result["res"] = runner.run(argv, timeout + 30, env=env, check=False)
        except CommandError as e:
            result["error"] = e.what

    th = threading.Thread(target=run_srun, daemon=True)
    th.start()
    deadline = time.monotonic() + timeout
    cancelled = False
    try:
        while th.is_alive():
            th.join(poll)
            g.sweep()
            if not cancelled and time.monotonic() > deadline and len(g.done) < len(targets):
                cancelled = True
                scancel = slurmclient.command("scancel")
                try:
                    runner.run([scancel, f"--name=slurm-gpu-collect-{token}"], 30, env=env, check=False)
                except CommandError:
                    pass
        g.sweep()
        res = result.get("res")
        per, general = srun_reasons(res.stderr if res is not None else "")
        if "error" in result:
            general.insert(0, result["error"])
        for node in targets:
            if node in g.done:
                continue
            mine, last = _err_lines(os.path.join(stage, f"{node}.err"))
            if mine or per.get(node):
                reason = mine or per[node]
            elif cancelled:    # the stderr file then ends with slurmstepd's "STEP ... CANCELLED"
                reason = f"no answer within {timeout:g} s (node killed or unreachable)"
            else:
                reason = last or (general[0] if general else "no snapshot written (node killed or unreachable)")
            g.finish(Outcome(node, FAILED, reason))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return Collection(outcomes={n: g.done[n] for n in targets}, elapsed=time.monotonic() - g.t0)


def via_clush(directory: str, targets: Sequence[str], *, command: str, timeout: float,
              report: Callable[[Outcome, int, int], None], worker: str = "ssh", fanout: int = 64) -> Collection:
    """Collect through ClusterShell: ``<command> snapshot record -o -`` per node, stdout gathered per node.

    ``worker="exec"`` runs the command locally once per node with
    ``SLURMD_NODENAME`` set to it (ClusterShell's ``exec`` worker, as
    ``clush -R exec``): for a sandbox whose nodes share this host.
    """
    from ClusterShell.Event import EventHandler
    from ClusterShell.NodeSet import NodeSet
    from ClusterShell.Task import task_self

    from ..fsutil import atomic_write
    stage = tempfile.mkdtemp(prefix=".incoming-", dir=directory)
    g = Gatherer(directory, stage, targets, report)
    remote = " ".join(shlex.quote(a) for a in (command, "snapshot", "record", "-o", "-"))
    if worker == "exec":
        remote = "env SLURMD_NODENAME=%h " + remote

    class Handler(EventHandler):  # type: ignore[misc]
        def ev_hup(self, w: Any, node: str, rc: int) -> None:
            out = bytes(w.node_buffer(node) or b"")
            if rc == 0 and out.strip():
                staged = os.path.join(stage, f"{node}.json")
                try:
                    atomic_write(staged, out + b"\n")
                except SlurmGpuError as e:
                    g.finish(Outcome(node, FAILED, f"cannot stage: {e.what}"))
                    return
                g.accept(node, staged)
                return
            err = bytes(w.node_error_buffer(node) or b"").decode("utf-8", "replace").strip().splitlines()
            mine = [ln for ln in err if ln.startswith("slurm-gpu:")]
            why = (mine or err or [f"exit status {rc}"])[-1]
            g.finish(Outcome(node, FAILED, why if rc else f"empty output ({why})"))

    task = task_self()
    task.set_info("fanout", fanout)
    try:
        w = task.shell(remote, nodes=str(NodeSet.fromlist(list(targets))), handler=Handler(), timeout=timeout,
                       stderr=True, remote=worker != "exec")
        task.resume()
        for node in w.iter_keys_timeout():
            g.finish(Outcome(node, FAILED, f"no answer within {timeout:g} s"))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    for node in targets:
        if node not in g.done:
            g.finish(Outcome(node, FAILED, "unreachable (no exit status from ClusterShell)"))
    return Collection(outcomes={n: g.done[n] for n in targets}, elapsed=time.monotonic() - g.t0)


def plan(targets: Sequence[str], slurm: Mapping[str, Any] | None) -> tuple[list[str], dict[str, Outcome]]:
    """(nodes to run on, nodes skipped with the reason) from Slurm's node states."""
    run: list[str] = []
    skipped: dict[str, Outcome] = {}
    for n in targets:
        s = slurm.get(n) if slurm is not None else None
        if slurm is not None and s is None:
            skipped[n] = Outcome(n, FAILED, "unknown to Slurm")
        elif s is not None and s.unusable:
            skipped[n] = Outcome(n, SKIPPED, f"node {s.unusable}" + (f": {s.reason}" if s.reason else ""))
        else:
            run.append(n)
    return run, skipped
