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


def test_live_gpus_interface_reads_match_the_node_model() -> None:
    """Read-only, through the one GPU interface (hw.backend.open_gpus): what
    every caller outside hw/ sees equals the live node model."""
    from slurm_gpu.hw import ThisNode, backend, live, load_node
    nvml.close_api(_api())
    node = load_node(ThisNode(live.NodeSettings()))
    gpus = backend.open_gpus(backend.LIVE)
    try:
        assert gpus.count() == len(node.gpus)
        view = gpus.read_view()
        assert sorted(g.uuid for g in view.gpus) == sorted(g.uuid for g in node.gpus)
        for g in node.gpus:
            i = gpus.find(uuid=g.uuid, minor=g.minor)      # NVML's index: not the model's order
            assert gpus.name(i) == g.name
            assert gpus.mig_mode(i) in (None, 0, 1)
            assert gpus.compute_mode(i) in (0, 1, 2, 3)
            if gpus.mig_mode(i) == 1:
                assert len(gpus.mig_devices(i)) == len(g.mig_instances)
    finally:
        gpus.close()
