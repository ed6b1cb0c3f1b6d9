"""On a real GPU node: record live NVML, replay it, and get the same node."""
from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gpu.hw import nvml

pytestmark = pytest.mark.gpu


def _api():
    try:
        return nvml.open_api()
    except nvml.NvmlUnavailable as e:
        pytest.skip(e.what)


def test_record_live_then_replay_equal(tmp_path: Path) -> None:
    from slurm_gpu.hw import live, snapshot as snap
    nvml.close_api(_api())
    node = live.this_node(live.NodeSettings())
    out = tmp_path / "live.json"
    snap.write(str(out), snap.record())
    assert len(node.gpus) > 0
    for replayed in (snap.node_from_file(str(out)), snap.replay(snap.read_snapshot(str(out)), str(out))):
        assert replayed.gpus == node.gpus
        assert replayed.cores == node.cores and replayed.numa_nodes == node.numa_nodes


def test_live_answers_through_recorder_match() -> None:
    from slurm_gpu.hw.nvml_record import RecordingNvml
    from slurm_gpu.hw.nvml_replay import ReplayNvml
    api = _api()
    try:
        rec = RecordingNvml(api)
        view = nvml.read_view(rec)
        assert nvml.read_view(ReplayNvml(rec.records()), mig_minors=nvml.read_mig_minors()) == view
    finally:
        nvml.close_api(api)
