from __future__ import annotations

import pytest

from slurm_gpu.hw.model import (PEER_GPU, PEER_NVSWITCH, Core, Gpu, Node, NumaNode, NvLink, Package,
                                normalize_bus_id)


@pytest.mark.parametrize("raw,want", [
    ("00000000:07:00.0", "0000:07:00.0"),
    ("0000:B7:00.0", "0000:b7:00.0"),
    ("07:00.0", "0000:07:00.0"),
    ("0002:1a:0.1", "0002:1a:00.1"),
])
def test_normalize_bus_id(raw: str, want: str) -> None:
    assert normalize_bus_id(raw) == want


def test_normalize_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        normalize_bus_id("gpu0")


def _gpu(bus: str, links: tuple[NvLink, ...]) -> Gpu:
    return Gpu(index=0, minor=0, uuid=None, pci_bus_id=bus, pci_device_id=None, name=None,
               memory_bytes=None, numa_nodes=(0,), cores=(0,), nvlinks=links)


def test_nvlink_counts_direct_and_switch_paths() -> None:
    a = _gpu("0000:01:00.0", (NvLink(PEER_GPU, "0000:02:00.0", 4), NvLink(PEER_NVSWITCH, "0000:a0:00.0", 18)))
    b = _gpu("0000:02:00.0", (NvLink(PEER_GPU, "0000:01:00.0", 4), NvLink(PEER_NVSWITCH, "0000:a0:00.0", 18)))
    c = _gpu("0000:03:00.0", ())
    assert a.nvlink_to(b) == 22
    assert a.nvlink_to(c) == 0


def test_node_round_trips_through_dict() -> None:
    node = Node(
        hostname="n1",
        packages=(Package(0, 0, (0, 1)),),
        numa_nodes=(NumaNode(0, 0, 1 << 30, (0, 1), (0, 1, 2, 3)),),
        cores=(Core(0, 0, 0, 0, (0, 2)), Core(1, 1, 0, 0, (1, 3))),
        gpus=(_gpu("0000:01:00.0", (NvLink(PEER_NVSWITCH, "nvswitch", 18),)),),
        memory_bytes=1 << 30,
    )
    again = Node.from_dict(node.to_dict())
    assert again == node
    assert again.threads_per_core == 2 and again.cpu_count == 4
    assert again.pus_of_cores([1]) == (1, 3)
