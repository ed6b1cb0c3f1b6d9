"""IMEX for a sandbox of NVLink-fabric nodes (the packaged ``gb200-nvl``): the test
rig's ``nvidia-imex`` stand-in (:mod:`slurm_gpu_devkit.sim.imex_standin`) as each
node's ``[imex] daemon``/``ctl``, and every node's model published where the
prolog groups nodes by NVLink domain (``[cluster] publish_dir``).

All of it only with ``--netns``: a domain lists one address per node, and
without network namespaces every node is 127.0.0.1, so such a sandbox keeps
``[imex] mode = "off"`` and nothing here is written.  The channel device is not made
(``channels = "off"``): the host's driver has no ``nvidia-caps-imex-channels``.

A node's daemon reads ``DIR/var/<node>/imex-fault`` at start (the stand-in's
``--fault``): ``no-start`` (it aborts) or ``isolated`` (it never meets its
peers), so a test can make a domain that never becomes ready.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from slurm_gpu.hw.model import Node
from .layout import Layout

FAULT_NAME = "imex-fault"
BIN_DIR = "imex-bin"


def has_fabric(model: Node) -> bool:
    from slurm_gpu.imex.domain import fabric_domain
    return fabric_domain(model.to_dict())[0] is not None


def prepare(layout: Layout, model: Node, nodes: Sequence[str], venv: Path, netns: bool) -> dict[str, dict[str, Any]]:
    """Write the stand-in's wrappers and the published models; the toml keys for them ({} without fabric)."""
    if not netns or not has_fabric(model):
        return {}
    from slurm_gpu.cluster.modelfile import publish
    from ..sim import imex_standin
    from .nodesim import site_packages
    # The devkit's copy in the hooks' venv, found when the wrapper runs: a Debian
    # root's venv has the same path but another python (another site-packages).
    installed = site_packages(venv)
    script = f"venv:{venv}" if installed and (installed / "slurm_gpu_devkit" / "sim" /
                                              "imex_standin.py").is_file() else None
    models = layout.var / "models"
    models.mkdir(mode=0o755, exist_ok=True)
    data = model.to_dict()
    for name in nodes:
        node_dir = layout.var / name
        (node_dir / BIN_DIR).mkdir(mode=0o755, parents=True, exist_ok=True)
        imex_standin.write_wrappers(str(node_dir / BIN_DIR), str(venv / "bin" / "python"),
                                    str(node_dir / FAULT_NAME),
                                    script=script)
        publish(str(models), name, data)
    return {"imex": {"mode": "per-job",
                     "daemon": f"{layout.var}/%n/{BIN_DIR}/nvidia-imex",
                     "ctl": f"{layout.var}/%n/{BIN_DIR}/nvidia-imex-ctl",
                     "base_dir": f"{layout.var}/%n/imex",
                     "base_config": f"{layout.etc}/nvidia-imex.cfg",
                     "channels": "off", "timeout": 20.0},
            "cluster": {"publish_dir": str(models)}}
