"""gres.conf as one service: render, read, check and apply.

Every caller that writes or compares a gres.conf goes through here:
``slurm-gpu gres render|check|apply`` (and ``doctor``'s drift), ``mig apply``
(rewrites this node's file after a MIG change), the health check's
``--isolate-bad-gpu`` (this node's file without the bad GPU) and the sandbox
(its nodes' file).  Rendering is the pure generator of
:mod:`slurm_gpu.confgen.gres`; checking is :mod:`slurm_gpu.confgen.grescheck`
(``gres check`` semantics: a parsed comparison, nodes with identical
differences folded); applying is :func:`slurm_gpu.fsutil.replace_config`
(atomic, links, mode and owner kept, a backup).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from ..errors import InputError, SlurmGpuError

# The checking half (grescheck, slurmconf: dataclasses, shlex) is imported
# where a file is read or compared: `gres render` alone pays nothing for it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .grescheck import NodeGres

__all__ = ["apply", "differences", "node_gres", "parse", "read", "refuse_shared", "render", "restart_advice",
           "text_of", "view"]


def render(nodes: Mapping[str, Any], options: Any = None, *, inputs: Sequence[str] | None = None,
           where: Mapping[str, str] | None = None) -> str:
    """gres.conf text for *nodes* (Slurm node name -> Node) with these ``GresOptions``."""
    from .gres import render_gres_conf
    return render_gres_conf(nodes, options=options, inputs=inputs, where=where)


def view(nodes: Mapping[str, Any], options: Any, *, inputs: Sequence[str] | None = None,
         where: Mapping[str, str] | None = None) -> Any:
    """The finished view model of the file (groups, node lines, notes) for ``gres render``."""
    from .gres import build_gres_view
    return build_gres_view(nodes, options, inputs=inputs, where=where)


def text_of(v: Any) -> str:
    """gres.conf text of a :func:`view`."""
    from .templating import render as render_template
    return render_template("gres.conf.j2", v.as_template_vars())


def parse(lines: Iterable[str], source: str = "gres.conf") -> dict[str, NodeGres]:
    """Parse gres.conf text (InputError naming *source* and line)."""
    from .grescheck import parse_gres_conf
    return parse_gres_conf(lines, source)


def read(path: str) -> tuple[str, dict[str, NodeGres]]:
    """(text, parsed) of the gres.conf at *path* (InputError naming it when unreadable)."""
    from pathlib import Path
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise InputError(f"cannot read {Path(path).name}: {e.strerror}", path) from None
    return text, parse(text.splitlines(True), path)


def differences(current: Mapping[str, NodeGres], wanted_text: str, node: str | None = None) -> list[str]:
    """``gres check``: readable differences from *current* to the generated text ([] when equal);
    with *node*, only that node's lines count (a cluster-wide file checked on one node)."""
    from .grescheck import compare, effective
    wanted = parse(wanted_text.splitlines(True), "generated")
    if node is not None:
        return compare({node: effective(current, node)}, {node: effective(wanted, node)})
    return compare(current, wanted)


def node_gres(conf: Mapping[str, NodeGres], node: str) -> NodeGres:
    """*node*'s GRES in a parsed file, NodeName-less lines applied."""
    from .grescheck import effective
    return effective(conf, node)


def refuse_shared(conf: Mapping[str, NodeGres], node: str, why: str, path: str) -> None:
    """SlurmGpuError unless the parsed file configures *node* alone: a file other
    nodes read is never rewritten for one node.  *why* says what would have happened."""
    from .grescheck import shared_with_other_nodes
    shared = shared_with_other_nodes(conf, node)
    if shared:
        raise SlurmGpuError(f"{shared}{why}", path)


def restart_advice(current: Mapping[str, NodeGres], wanted: Mapping[str, NodeGres]) -> list[str]:
    """What Slurm needs after replacing *current* by *wanted* (gres.conf(5) rules)."""
    from .grescheck import restart_advice as advice
    return advice(current, wanted)


def apply(path: str, text: str, *, backup: str | None = ".bak", keep_first_backup: bool = False) -> str:
    """Write *text* to *path* (atomically, keeping links, mode and owner); returns the file written."""
    from ..fsutil import replace_config
    return replace_config(path, text, backup=backup, keep_first_backup=keep_first_backup)
