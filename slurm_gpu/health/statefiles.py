"""Where one node's health-check state and lock live (shared by the check and
the epilog's user-problem drain, which takes the same lock: a module of its
own, so neither imports the other)."""
from __future__ import annotations

import os
import re


def _node_tag(node: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", node) or "_"


def state_file(state_dir: str | os.PathLike[str], node: str) -> str:
    """This node's state file.  Named per node: several slurmd on one host
    (multiple-slurmd, the sandbox) may share a state_dir without ``%n``, and
    one node's memory (our drain, its slurmd, its cursors) must not be another's."""
    return os.path.join(state_dir, f"health-state.{_node_tag(node)}.json")


def lock_file(state_dir: str | os.PathLike[str], node: str) -> str:
    """The lock one acting run of the check (or the epilog's drain) holds."""
    return os.path.join(state_dir, f"health.{_node_tag(node)}.lock")


def slurmd_run_lock_file(state_dir: str | os.PathLike[str], node: str) -> str:
    """The lock a slurmd-started run (``--slurm``) holds from start to exit."""
    return os.path.join(state_dir, f"health.{_node_tag(node)}.slurmd.lock")
