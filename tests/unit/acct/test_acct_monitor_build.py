"""``slurm-gpu monitor``'s setup: the XID events it reads name GPUs by bus id, so it must know each GPU's."""
from __future__ import annotations

from pathlib import Path

import pytest
from paths import ROOT

MACHINES = ROOT / "tests" / "data" / "machines"


def test_monitor_maps_every_gpu_bus_id_to_its_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the map read ``Gpu.bus_id`` (no such field: ``pci_bus_id``), failed, and was always empty:
    no XID was ever attributed to a job."""
    from slurm_gpu.commands.monitor import build
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text(f'[node]\nsnapshot = "{MACHINES / "h100-sxm-8x" / "snapshot.json"}"\n'
                   f'state_dir = "{tmp_path}/state"\n[acct]\nenabled = true\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    _, mon = build()
    assert len(mon.bus_index) == 8
    assert mon.bus_index["0000:18:00.0"] == 0 and sorted(mon.bus_index.values()) == list(range(8))
