"""The cffi bindings themselves: bitmaps, object access, XML export, lifetime."""
from __future__ import annotations

import pytest
from machinedata import machine_xml

from slurm_gpu.hw import hwloc_ffi as H


@pytest.mark.parametrize("text,bits", [
    ("", ()), ("0", (0,)), ("0-3,8", (0, 1, 2, 3, 8)), ("5,64-66", (5, 64, 65, 66)),
    ("2,10-", (2,)),  # an infinite tail (never in a topology's cpusets) is ignored
])
def test_list_masks(text: str, bits: tuple[int, ...]) -> None:
    assert H.mask_bits(H.list_to_mask(text)) == bits


def test_library_is_hwloc2() -> None:
    assert H.api_version().startswith("2.")


def test_objects_by_type_in_logical_order() -> None:
    with H.Topology(machine_xml("uv-24numa").read_bytes(), keep_all=True) as t:
        numa = t.objects(H.OBJ_NUMANODE)
        assert [o.logical_index for o in numa] == list(range(24))
        pus = t.objects(H.OBJ_PU)
        assert len(pus) == 384
        assert sum(bin(t.bitmap(o.cpuset)).count("1") for o in t.objects(H.OBJ_CORE)) == 384
        assert t.infos(t.root())["HostName"] == "uv2000"


def test_io_objects_kept_for_xml_and_export_round_trip() -> None:
    data = machine_xml("pci-2n8c-wholeio").read_bytes()
    with H.Topology(data, keep_all=True) as t:
        n_all = len(t.objects(H.OBJ_PCI_DEVICE))
        text = t.export_xml()
    with H.Topology(data) as t:  # important I/O only
        n_important = len(t.objects(H.OBJ_PCI_DEVICE))
    assert n_all > n_important > 0
    with H.Topology(text.encode(), keep_all=True) as t:
        assert len(t.objects(H.OBJ_PCI_DEVICE)) == n_all


def test_load_error_and_idempotent_close() -> None:
    with pytest.raises(H.HwlocLoadError) as ei:
        H.Topology(b"<topology", keep_all=True)
    assert ei.value.step == "hwloc_topology_load"
    t = H.Topology(machine_xml("dgx2").read_bytes())
    t.close()
    t.close()
