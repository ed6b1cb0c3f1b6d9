"""gres.conf generator rules on constructed nodes (naming, Links, MIG, sharing, folding, sockets)."""
from __future__ import annotations

import pytest

from slurm_gpu.confgen import GresOptions, node_line, render_gres_conf, socket_layout
from slurm_gpu.confgen.gres import gres_records, mig_cap_minors
from slurm_gpu.confgen.grescheck import compare, parse_gres_conf
from slurm_gpu.confgen.naming import autodetect_name, mig_type, pci_ids_name
from slurm_gpu.confgen.pciids import parse_vendor
from slurm_gpu.errors import InputError, UsageError
from slurm_gpu.hw.model import (PEER_GPU, PEER_NVSWITCH, Core, Fabric, Gpu, MigInstance, Node, NumaNode,
                                NvLink, Package)

H100 = "NVIDIA H100 80GB HBM3"


def make_node(*, packages: int = 2, numa_per_pkg: int = 1, cores_per_numa: int = 4, tpc: int = 2,
              gpus: int = 4, name: str | None = H100, nvswitch: bool = True, mig: bool = False,
              device_id: int = 0x2330, fabric: Fabric | None = None) -> Node:
    cores, numas, pkgs = [], [], []
    ci = pu = ni = 0
    for p in range(packages):
        pc = []
        for _ in range(numa_per_pkg):
            nc, npus = [], []
            for _ in range(cores_per_numa):
                pus = tuple(range(pu, pu + tpc))
                pu += tpc
                cores.append(Core(ci, ci, p, ni, pus))
                nc.append(ci)
                npus += pus
                ci += 1
            numas.append(NumaNode(ni, ni, 64 << 30, tuple(nc), tuple(npus)))
            pc += nc
            ni += 1
        pkgs.append(Package(p, p, tuple(pc)))
    out = []
    for i in range(gpus):
        n = numas[i * len(numas) // gpus]
        migs: tuple[MigInstance, ...] = ()
        if mig and i == 1:
            migs = (MigInstance(1, 0, "3g.40gb", 9, 2, 0, 4, 40 << 30, 60, "MIG-a", 30, 31),
                    MigInstance(2, 0, "1g.10gb", 19, 0, 4, 1, 10 << 30, 16, "MIG-b", None, None))
        out.append(Gpu(i, i, f"GPU-{i}", f"0000:{0x18 + 0x10 * i:02x}:00.0", device_id, name, 80 << 30,
                       (n.index,), n.cores,
                       (NvLink(PEER_NVSWITCH, "nvswitch", 18),) if nvswitch else (),
                       mig and i == 1, migs, fabric))
    return Node("h", tuple(pkgs), tuple(numas), tuple(cores), tuple(out), sum(n.memory_bytes for n in numas))


def lines(text: str) -> list[str]:
    return [l for l in text.splitlines() if l.startswith("NodeName=")]


def test_autodetect_naming_follows_gpu_nvml_c() -> None:
    assert autodetect_name("NVIDIA H100 80GB HBM3") == "nvidia_h100_80gb_hbm3"
    assert autodetect_name("Tesla V100-SXM3-32GB-H") == "tesla_v100-sxm3-32gb-h"
    # MIG: parent cut at the first '-' then _<profile>, as in the stackhpc slurmd -G output.
    m = MigInstance(1, 0, "1g.10gb", 19, 0, 0, 1, 0, 16, "", None, None)
    assert mig_type("nvidia_h100_80gb_hbm3", m) == "nvidia_h100_80gb_hbm3_1g.10gb"
    assert mig_type("nvidia_a100-sxm4-40gb", m) == "nvidia_a100_1g.10gb"


def test_pci_ids_reader_and_naming() -> None:
    text = ["# c\n", "10de  NVIDIA Corporation\n", "\t2330  GH100 [H100 SXM5 80GB]\n",
            "\t\t10de 16c1  subsystem\n", "\t1db5  GV100GL [Tesla V100 SXM2 32GB]\n", "10df  Other\n",
            "\t2330  not nvidia\n"]
    names = parse_vendor(text)
    assert names == {0x2330: "GH100 [H100 SXM5 80GB]", 0x1db5: "GV100GL [Tesla V100 SXM2 32GB]"}
    assert pci_ids_name(names[0x2330]) == "h100_sxm5_80gb"


def test_hwloc_only_gpu_named_from_pci_ids_and_type_map_wins() -> None:
    node = make_node(name=None, nvswitch=False, gpus=2)
    recs = gres_records(node, GresOptions(pci_names={0x2330: "GH100 [H100 SXM5 80GB]"}))
    assert {r.type for r in recs} == {"h100_sxm5_80gb"}
    recs = gres_records(node, GresOptions(pci_names={0x2330: "GH100 [H100 SXM5 80GB]"},
                                          type_map={"h100_sxm5_80gb": "h100"}))
    assert {r.type for r in recs} == {"h100"}
    recs = gres_records(node, GresOptions(type_map={"0x2330": "h100x"}))
    assert {r.type for r in recs} == {"h100x"}


def test_unknown_gpu_is_an_error_naming_the_place() -> None:
    node = make_node(name=None, device_id=0x9999, gpus=1)
    with pytest.raises(InputError) as e:
        gres_records(node, GresOptions(), where="nodes/x.json")
    assert "10de:9999" in e.value.line() and "(nodes/x.json)" in e.value.line()


def test_nvswitch_links_and_one_gpu_per_line() -> None:
    text = render_gres_conf({"g1": make_node()})
    got = lines(text)
    assert got == [
        "NodeName=g1 Name=gpu Type=nvidia_h100_80gb_hbm3 File=/dev/nvidia0 Cores=0-3 Links=-1,18,18,18",
        "NodeName=g1 Name=gpu Type=nvidia_h100_80gb_hbm3 File=/dev/nvidia1 Cores=0-3 Links=18,-1,18,18",
        "NodeName=g1 Name=gpu Type=nvidia_h100_80gb_hbm3 File=/dev/nvidia2 Cores=4-7 Links=18,18,-1,18",
        "NodeName=g1 Name=gpu Type=nvidia_h100_80gb_hbm3 File=/dev/nvidia3 Cores=4-7 Links=18,18,18,-1",
    ]


def test_direct_nvlinks_counted_per_peer() -> None:
    node = make_node(nvswitch=False, gpus=2)
    g0, g1 = node.gpus
    g0 = Gpu(**{**g0.__dict__, "nvlinks": (NvLink(PEER_GPU, g1.pci_bus_id, 4),)})
    g1 = Gpu(**{**g1.__dict__, "nvlinks": (NvLink(PEER_GPU, g0.pci_bus_id, 4),)})
    node = Node(**{**node.__dict__, "gpus": (g1, g0)})  # order in the model must not matter
    assert [r.links for r in gres_records(node)] == [(-1, 4), (4, -1)]
    assert [r.links for r in gres_records(node, GresOptions(links=False))] == [None, None]


def test_pcie_gpus_fold_into_file_ranges_and_dev_dir() -> None:
    text = render_gres_conf({"n1": make_node(nvswitch=False)}, dev_dir="/sb/dev")
    assert lines(text) == [
        "NodeName=n1 Name=gpu Type=nvidia_h100_80gb_hbm3 File=/sb/dev/nvidia[0-1] Cores=0-3",
        "NodeName=n1 Name=gpu Type=nvidia_h100_80gb_hbm3 File=/sb/dev/nvidia[2-3] Cores=4-7",
    ]


def test_identical_nodes_fold_into_hostlists() -> None:
    a, b = make_node(), make_node(nvswitch=False)
    nodes = {f"gpu{i:03d}": a for i in range(1, 129)} | {"gpu200": b, "gpu201": b}
    text = render_gres_conf(nodes)
    assert {l.split()[0] for l in lines(text)} == {"NodeName=gpu[001-128]", "NodeName=gpu[200-201]"}
    assert "#   NodeName=gpu[001-128] CPUs=16 Sockets=2 CoresPerSocket=4 ThreadsPerCore=2 " \
           "RealMemory=131072 Gres=gpu:nvidia_h100_80gb_hbm3:4" in text


def test_nodes_differing_only_in_memory_share_gres_lines() -> None:
    """Identical boxes whose MemTotal differs by a few MiB: one gres.conf block, exact node lines."""
    from dataclasses import replace
    a = make_node()
    b = replace(a, memory_bytes=a.memory_bytes - (3 << 20))
    nodes = {f"gpu{i:03d}": a for i in (1, 2, 4)} | {"gpu003": b}
    text = render_gres_conf(nodes)
    assert {l.split()[0] for l in lines(text)} == {"NodeName=gpu[001-004]"}
    assert "#   NodeName=gpu[001-002,004] CPUs=16 Sockets=2 CoresPerSocket=4 ThreadsPerCore=2 RealMemory=131072 " in text
    assert "#   NodeName=gpu003 CPUs=16 Sockets=2 CoresPerSocket=4 ThreadsPerCore=2 RealMemory=131069 " in text


def test_mig_lines_match_slurm_autodetect() -> None:
    text = render_gres_conf({"m": make_node(mig=True, nvswitch=False)})
    got = lines(text)
    assert ("NodeName=m Name=gpu Type=nvidia_h100_80gb_hbm3_3g.40gb MultipleFiles=/dev/nvidia1,"
            "/dev/nvidia-caps/nvidia-cap30,/dev/nvidia-caps/nvidia-cap31 Cores=0-3") in got
    # cap minors unknown in the model: the driver's mig-minors layout (GPU 1, GI 2 -> 3+(15+2)*9).
    assert ("NodeName=m Name=gpu Type=nvidia_h100_80gb_hbm3_1g.10gb MultipleFiles=/dev/nvidia1,"
            "/dev/nvidia-caps/nvidia-cap156,/dev/nvidia-caps/nvidia-cap157 Cores=0-3") in got
    assert not any("Links=" in l for l in got)
    assert "Gres=gpu:nvidia_h100_80gb_hbm3:3,gpu:nvidia_h100_80gb_hbm3_3g.40gb:1," \
           "gpu:nvidia_h100_80gb_hbm3_1g.10gb:1" in text


def test_mig_cap_minor_layout_matches_real_slurmd_output() -> None:
    # stackhpc slurmd -G (4x H100): GPU 2 GI 2 -> cap291, GPU 3 GI 1 -> cap417, GPU 2 GI 7 -> cap336
    assert mig_cap_minors(2, 2, 0)[0] == 291
    assert mig_cap_minors(3, 1, 0)[0] == 417
    assert mig_cap_minors(2, 7, 0)[0] == 336
    # deepops slurmd debug: GI 12 CI 0 -> cap111,cap112
    assert mig_cap_minors(0, 12, 0) == (111, 112)


def test_mps_and_shard_counts_per_gpu() -> None:
    text = render_gres_conf({"s": make_node(nvswitch=False, gpus=2)}, options=GresOptions(mps_count=100))
    assert "NodeName=s Name=mps Count=100 File=/dev/nvidia0" in lines(text)
    assert "Gres=gpu:nvidia_h100_80gb_hbm3:2,mps:200\n" in text
    text = render_gres_conf({"s": make_node(nvswitch=False, gpus=2)}, options=GresOptions(shards=8))
    assert "NodeName=s Name=shard Count=8 File=/dev/nvidia1" in lines(text)
    assert "Gres=gpu:nvidia_h100_80gb_hbm3:2,shard:16\n" in text


def test_mps_and_shards_on_one_node_are_refused() -> None:
    """Slurm keeps gres/gpu apart from one sharing gres per node (gres_init_node_config
    links a single shared gres to gres/gpu): with both, bench/bench_oversub.py saw a
    GPU given as gres/gpu to one job and as gres/mps or gres/shard to others at once."""
    with pytest.raises(UsageError, match="^--mps-count and --shards cannot both be set"):
        GresOptions(mps_count=100, shards=8)


def test_eight_numa_epyc_switches_to_numa_sockets() -> None:
    node = make_node(packages=2, numa_per_pkg=4, gpus=4, nvswitch=False)
    lay = socket_layout(node)
    assert (lay.mode, lay.sockets, lay.cores_per_socket, lay.slurmd_parameters) == \
        ("numa", 8, 4, "numa_node_as_socket")
    assert node_line("e1", node).startswith("NodeName=e1 CPUs=64 Sockets=8 CoresPerSocket=4 ThreadsPerCore=2")
    text = render_gres_conf({"e1": node})
    assert "# slurm.conf needs: SlurmdParameters=numa_node_as_socket" in text
    # Forcing packages keeps Sockets=2 and says binding is partial.
    lay = socket_layout(node, "package")
    assert lay.sockets == 2 and not lay.aligned and any("enforce-binding" in n for n in lay.notes)


def test_two_socket_box_keeps_packages() -> None:
    lay = socket_layout(make_node())
    assert (lay.mode, lay.sockets, lay.aligned, lay.slurmd_parameters) == ("package", 2, True, None)


def test_render_parse_round_trip_on_constructed_nodes() -> None:
    nodes = {"a1": make_node(), "a2": make_node(mig=True, nvswitch=False),
             "a3": make_node(packages=2, numa_per_pkg=4, nvswitch=False)}
    text = render_gres_conf(nodes, options=GresOptions(mps_count=100))
    parsed = parse_gres_conf(text.splitlines(True))
    assert compare(parsed, parsed) == []
    assert set(parsed) == {"*", "a1", "a2", "a3"}
    assert parsed["*"].autodetect == "off"
    assert len(parsed["a2"].devices) == 5  # 3 full GPUs + 2 MIG devices (keyed by their files)
