"""hwloc backend against the real hwloc tools, over every recorded machine XML.

The oracle is Debian's own ``hwloc-calc`` (run at test time): a GPU's local
cores are ``hwloc-calc -i F --li --intersect core pci=<bus id>``, its local
NUMA nodes ``--intersect numa``, with GPU-memory NUMA nodes left out.
"""
from __future__ import annotations

import os
import subprocess

import pytest
from machinedata import hwloc_calc as calc
from machinedata import hwloc_machines, machine_xml

from slurm_gpu.errors import InputError
from slurm_gpu.hw import hwloc
from slurm_gpu.hw.views import CpuView


# NVIDIA GPUs each real machine has (0: AMD GPUs only, or no GPU in the export).
EXPECTED_GPUS = {
    "dgx2": 16, "power9-6xv100": 6, "coral-butte-hwloc1": 4, "cts1-pascal": 2,
    "power8-gpudistances": 4, "pci-2n8c-normalio": 3, "pci-2n8c-wholeio": 3, "pci-2n6c": 3,
    "irregular-groups": 2, "epyc-corona": 0, "epyc-corona-p2": 0, "eas-tioga": 0, "gh200": 0,
    "uv-24numa": 0, "opteron-cpusets": 0, "dgx-spark": 0,
}




_views: dict[str, CpuView] = {}


def view(name: str) -> CpuView:
    if name not in _views:
        _views[name] = hwloc.read_cpu_view(str(machine_xml(name)))
    return _views[name]


def test_every_real_xml_is_covered() -> None:
    assert set(hwloc_machines()) >= set(EXPECTED_GPUS)


@pytest.mark.parametrize("name", sorted(EXPECTED_GPUS))
def test_nvidia_gpu_count(name: str) -> None:
    gpus = view(name).pci_gpus
    assert len(gpus) == EXPECTED_GPUS[name]
    assert [g.bus_id for g in gpus] == sorted(g.bus_id for g in gpus)


@pytest.mark.parametrize("name", hwloc_machines())
def test_gpu_locality_equals_hwloc_calc(name: str) -> None:
    xml = str(machine_xml(name))
    v = view(name)
    by_os = {n.os_index: n.index for n in v.numa_nodes}
    not_cpu = {m.os_index for m in v.gpu_memory_nodes}
    for g in v.pci_gpus:
        assert list(g.cores) == calc(xml, "--li", "--intersect", "core", f"pci={g.bus_id}"), g.bus_id
        numa_os = calc(xml, "--po", "--intersect", "numa", f"pci={g.bus_id}")
        assert list(g.numa_nodes) == [by_os[n] for n in numa_os if n not in not_cpu and n in by_os], g.bus_id


@pytest.mark.parametrize("name", hwloc_machines())
def test_nic_locality_equals_hwloc_calc(name: str) -> None:
    xml = str(machine_xml(name))
    v = view(name)
    by_os = {n.os_index: n.index for n in v.numa_nodes}
    text = machine_xml(name).read_text()
    for nic in v.nics:
        if text.count(f'pci_busid="{nic.pci_bus_id}"') > 1:
            # pci-2n8c-* reuse 0000:04:00.0 for a SAS controller and the HCA; hwloc-calc
            # pci= takes the first, so it cannot be the oracle for this NIC.
            continue
        numa_os = calc(xml, "--po", "--intersect", "numa", f"pci={nic.pci_bus_id}")
        assert list(nic.numa_nodes) == [by_os[n] for n in numa_os if n in by_os], nic.name


@pytest.mark.parametrize("name", hwloc_machines())
def test_cores_and_numa_numbering_follow_hwloc(name: str) -> None:
    xml = str(machine_xml(name))
    v = view(name)
    assert len(v.cores) == calc(xml, "--number-of", "core", "all")[0]
    assert [c.index for c in v.cores] == list(range(len(v.cores)))
    # CPU NUMA nodes: hwloc's logical order with GPU-memory nodes taken out, numbered densely.
    order = calc(xml, "--po", "--intersect", "numa", "all")
    gpu_mem = {m.os_index for m in v.gpu_memory_nodes}
    cpu_os = [n.os_index for n in v.numa_nodes]
    assert [n for n in order if n in set(cpu_os)] == cpu_os
    assert [n.index for n in v.numa_nodes] == list(range(len(v.numa_nodes)))
    assert not gpu_mem & set(cpu_os)
    for i in sorted({0, len(v.cores) // 2, len(v.cores) - 1}):
        assert list(v.cores[i].pus) == calc(xml, "--po", "--intersect", "pu", f"core:{i}")
    for n in v.numa_nodes:
        assert set(n.cores) == {c.index for c in v.cores if set(c.pus) & set(n.pus)}
    assert v.memory_bytes == sum(n.memory_bytes for n in v.numa_nodes)


def test_power9_gpu_memory_nodes_are_not_cpu_numa_nodes() -> None:
    v = view("power9-6xv100")
    assert [n.os_index for n in v.numa_nodes] == [0, 8]
    assert sorted(m.os_index for m in v.gpu_memory_nodes) == [250, 251, 252, 253, 254, 255]
    assert {m.gpu_bus_id for m in v.gpu_memory_nodes} == {g.bus_id for g in v.pci_gpus}
    assert all(m.memory_bytes == 16106127360 for m in v.gpu_memory_nodes)
    # hwloc-calc, which still sees the GPU nodes, numbers the second CPU node 4; live hwloc
    # hides them (as Slurm sees it), so that node is CPU NUMA node 1.
    xml = str(machine_xml("power9-6xv100"))
    assert calc(xml, "--li", "--intersect", "numa", "pci=0007:00:00.0") == [4, 5, 6, 7]
    g = {g.bus_id: g for g in v.pci_gpus}["0007:00:00.0"]
    assert g.numa_nodes == (1,) and g.cores == (4, 5, 6, 7)


def test_hwloc1_xml_loads_with_gpu_memory_nodes() -> None:
    xml = machine_xml("coral-butte-hwloc1")
    head = xml.read_text()[:400]
    assert "<topology>" in head and 'version="2' not in head
    v = view("coral-butte-hwloc1")
    assert [n.os_index for n in v.numa_nodes] == [0, 8]
    assert len(v.cores) == 44 and len(v.packages) == 2
    assert sorted(m.os_index for m in v.gpu_memory_nodes) == [252, 253, 254, 255]
    assert [(g.bus_id, g.device_id, g.numa_nodes) for g in v.pci_gpus] == [
        ("0004:04:00.0", 0x1DB1, (0,)), ("0004:05:00.0", 0x1DB1, (0,)),
        ("0035:03:00.0", 0x1DB1, (1,)), ("0035:04:00.0", 0x1DB1, (1,))]
    # Nearest NICs are the HCAs on the GPU's own socket.
    assert v.pci_gpus[0].nics == ("mlx5_0", "mlx5_1")
    assert v.pci_gpus[3].nics == ("mlx5_2", "mlx5_3")


def test_restricted_topologies() -> None:
    v = view("opteron-cpusets")  # 10 allowed PUs, 2 CPU-less nodes, cores without NUMA
    assert len(v.cores) == 10 and not v.pci_gpus
    assert [n.os_index for n in v.numa_nodes] == [1, 2, 3]
    assert not v.gpu_memory_nodes  # CPU-less nodes on a machine without NVIDIA GPUs
    assert v.cores[0].numa_node is None
    irr = view("irregular-groups")  # allowed cpuset excludes the GPUs' locality
    assert len(irr.cores) == 16
    assert all(g.cores == () and g.numa_nodes == () for g in irr.pci_gpus)


def test_gpu_names_come_from_cuda_or_nvml_os_devices() -> None:
    assert {g.name for g in view("dgx2").pci_gpus} == {"Tesla V100-SXM3-32GB-H"}
    assert [g.name for g in view("pci-2n8c-normalio").pci_gpus] == [None, None, "Tesla K40m"]
    assert {g.name for g in view("cts1-pascal").pci_gpus} == {"Tesla P100-PCIE-16GB"}


def test_hwloc_xml_hostname_and_override() -> None:
    assert view("cts1-pascal").hostname == "pascal4"
    assert hwloc.read_cpu_view(str(machine_xml("cts1-pascal")), hostname="gpu001").hostname == "gpu001"


# A small hand-written topology: one socket, a GPU behind a PCIe switch with an HCA
# (mlx5_1), another HCA (mlx5_0) on a different host bridge of the same socket, and
# an Ethernet NIC.  The GPU carries an ``nvidia3`` OS device and a CUDA device.
SWITCH_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
 <object type="Machine" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" allowed_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" allowed_nodeset="0x00000001" gp_index="1">
  <info name="HostName" value="switchbox"/>
  <object type="Package" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="2">
   <object type="NUMANode" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="3" local_memory="1073741824"/>
   <object type="Core" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="4">
    <object type="PU" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="5"/>
   </object>
   <object type="Core" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="6">
    <object type="PU" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="7"/>
   </object>
   <object type="Bridge" gp_index="10" bridge_type="0-1" depth="0" bridge_pci="0000:[01-01]">
    <object type="PCIDev" gp_index="11" pci_busid="0000:01:00.0" pci_type="0207 [15b3:101b] [15b3:0007] 00" pci_link_speed="0.000000">
     <object type="OSDev" gp_index="12" name="mlx5_0" osdev_type="3"/>
     <object type="OSDev" gp_index="13" name="ib0" osdev_type="2"/>
    </object>
    <object type="PCIDev" gp_index="14" pci_busid="0000:01:00.1" pci_type="0200 [8086:1521] [8086:0001] 01" pci_link_speed="0.000000">
     <object type="OSDev" gp_index="15" name="eno1" osdev_type="2"/>
    </object>
   </object>
   <object type="Bridge" gp_index="20" bridge_type="0-1" depth="0" bridge_pci="0000:[10-13]">
    <object type="Bridge" gp_index="21" bridge_type="1-1" depth="1" bridge_pci="0000:[11-13]" pci_busid="0000:10:00.0" pci_type="0604 [10b5:9797] [0000:0000] 00" pci_link_speed="0.000000">
     <object type="PCIDev" gp_index="22" pci_busid="0000:12:00.0" pci_type="0302 [10de:2330] [10de:16c1] a1" pci_link_speed="0.000000">
      <object type="OSDev" gp_index="23" name="nvidia3" osdev_type="1"/>
      <object type="OSDev" gp_index="24" name="cuda0" subtype="CUDA" osdev_type="5">
       <info name="GPUModel" value="NVIDIA H100 80GB HBM3"/>
      </object>
     </object>
     <object type="PCIDev" gp_index="25" pci_busid="0000:13:00.0" pci_type="0207 [15b3:101b] [15b3:0007] 00" pci_link_speed="0.000000">
      <object type="OSDev" gp_index="26" name="mlx5_1" osdev_type="3"/>
     </object>
    </object>
   </object>
  </object>
 </object>
</topology>
"""


def test_nearest_nics_follow_pci_hierarchy_then_numa() -> None:
    v = hwloc.read_cpu_view(xml_text=SWITCH_XML)
    assert v.hostname == "switchbox"
    [g] = v.pci_gpus
    assert g.minor == 3 and g.name == "NVIDIA H100 80GB HBM3" and g.device_id == 0x2330
    assert g.cores == (0, 1) and g.numa_nodes == (0,)
    # mlx5_1 shares the GPU's PCIe switch; mlx5_0 is only on the same socket; the
    # Ethernet NIC is not RDMA-capable while RDMA NICs exist.
    assert g.nics == ("mlx5_1", "mlx5_0")
    assert {(n.name, n.pci_bus_id) for n in v.nics} == {
        ("mlx5_0", "0000:01:00.0"), ("eno1", "0000:01:00.1"), ("mlx5_1", "0000:13:00.0")}


# -- bad input: one line naming the file (and the line) -----------------------------

def _one_line(e: InputError) -> str:
    line = e.line()
    assert "\n" not in line and line.startswith("slurm-gpu: ")
    return line


def test_truncated_xml_names_file_and_line(tmp_path) -> None:
    bad = tmp_path / "cut.xml"
    text = machine_xml("dgx2").read_text()
    bad.write_text(text[: len(text) // 2])
    with pytest.raises(InputError) as ei:
        hwloc.read_cpu_view(str(bad))
    line = _one_line(ei.value)
    assert "malformed hwloc XML" in line and f"({bad} line " in line


def test_broken_markup_reports_its_line(tmp_path) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text('<?xml version="1.0"?>\n<topology version="2.0">\n  <object type="Machine" <oops/>\n</topology>\n')
    with pytest.raises(InputError) as ei:
        hwloc.read_cpu_view(str(bad))
    assert _one_line(ei.value).endswith(f"({bad} line 3)")


@pytest.mark.parametrize("content,needle", [
    ("", "hwloc XML is empty"),
    ('<?xml version="1.0"?>\n<foo/>\n', "root element is <foo>"),
    ('<?xml version="1.0"?>\n<topology version="2.0"><object type="Banana"/></topology>\n',
     "not a valid hwloc topology"),
    ('<?xml version="1.0"?>\n<topology version="3.0"><object type="Machine"/></topology>\n',
     "hwloc XML format 3.0 is newer than this libhwloc"),
])
def test_not_a_topology(tmp_path, content: str, needle: str) -> None:
    bad = tmp_path / "x.xml"
    bad.write_text(content)
    with pytest.raises(InputError) as ei:
        hwloc.read_cpu_view(str(bad))
    line = _one_line(ei.value)
    assert needle in line and str(bad) in line


def test_missing_file(tmp_path) -> None:
    with pytest.raises(InputError) as ei:
        hwloc.read_cpu_view(str(tmp_path / "nope.xml"))
    assert "No such file" in _one_line(ei.value)


def test_bad_xml_text_names_its_source() -> None:
    with pytest.raises(InputError) as ei:
        hwloc.read_cpu_view(xml_text="<topology", source="snap.json")
    assert "(snap.json line 1)" in _one_line(ei.value)


# -- the live machine --------------------------------------------------------------

def test_live_topology_loads_and_round_trips() -> None:
    v = hwloc.read_cpu_view()
    assert v.cores and v.numa_nodes and v.packages
    pus = {pu for c in v.cores for pu in c.pus}
    assert os.sched_getaffinity(0) <= pus
    text = hwloc.live_xml()
    assert text.lstrip().startswith("<?xml") and "<topology" in text
    # the XML has no kernel memory count: a snapshot records it beside
    assert hwloc.read_cpu_view(xml_text=text, phys_memory_bytes=v.phys_memory_bytes) == v
    assert v.phys_memory_bytes == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_xml_text_and_path_agree() -> None:
    path = machine_xml("dgx2")
    assert hwloc.read_cpu_view(xml_text=path.read_text()) == view("dgx2")
    with pytest.raises(ValueError):
        hwloc.read_cpu_view(str(path), xml_text="x")


def test_memory_tiers_are_not_cpu_numa_nodes() -> None:
    # Sapphire-Rapids-Max-like: an HBM node attached beside the DRAM node, same cpuset.
    hbm = ('<object type="NUMANode" os_index="2" cpuset="0x00000003" complete_cpuset="0x00000003" '
           'nodeset="0x00000004" complete_nodeset="0x00000004" gp_index="30" subtype="HBM" '
           'local_memory="17179869184"/>\n   <object type="Core" os_index="0"')
    text = (SWITCH_XML.replace('<object type="Core" os_index="0"', hbm, 1)
            .replace('nodeset="0x00000001" complete_nodeset="0x00000001" allowed_nodeset="0x00000001"',
                     'nodeset="0x00000005" complete_nodeset="0x00000005" allowed_nodeset="0x00000005"'))
    v = hwloc.read_cpu_view(xml_text=text)
    assert [n.os_index for n in v.numa_nodes] == [0]
    assert not v.gpu_memory_nodes
    assert v.memory_bytes == 1073741824
    assert v.pci_gpus[0].numa_nodes == (0,)


def test_live_load_leaves_environment_alone(monkeypatch) -> None:
    monkeypatch.delenv("HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES", raising=False)
    hwloc.read_cpu_view()
    assert "HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES" not in os.environ
    monkeypatch.setenv("HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES", "0")
    hwloc.read_cpu_view()
    assert os.environ["HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES"] == "0"


def test_live_power9_from_sysfs_tree(tmp_path, monkeypatch) -> None:
    """The live path on a real POWER9 /sys tree (hwloc's HWLOC_FSROOT).

    Live hwloc hides GPU-memory NUMA nodes, so the default ``hwloc-calc`` numbers the CPU
    nodes 0 and 1: the model must say exactly that, and still list the GPU memory.
    """
    import tarfile

    with tarfile.open(machine_xml("power9-6xv100").with_name("sysfs.tar.bz2")) as tar:
        # Python 3.11.2 has no extraction filters: check the (project's own) names instead.
        assert all(not m.name.startswith("/") and ".." not in m.name.split("/") for m in tar)
        tar.extractall(tmp_path)
    root = str(tmp_path / "nvidiagpunumanodes")
    monkeypatch.setenv("HWLOC_FSROOT", root)
    monkeypatch.delenv("HWLOC_KEEP_NVIDIA_GPU_NUMA_NODES", raising=False)
    v = hwloc.read_cpu_view()
    assert [(n.index, n.os_index) for n in v.numa_nodes] == [(0, 0), (1, 8)]
    assert sorted((m.os_index, m.gpu_bus_id) for m in v.gpu_memory_nodes) == [
        (250, "0035:05:00.0"), (251, "0035:04:00.0"), (252, "0007:00:00.0"),
        (253, "0006:00:00.0"), (254, "0004:06:00.0"), (255, "0004:05:00.0")]
    assert len(v.pci_gpus) == 6
    env = dict(os.environ, HWLOC_FSROOT=root)
    for g in v.pci_gpus:
        for what, mine in (("core", g.cores), ("numa", g.numa_nodes)):
            out = subprocess.run(["hwloc-calc", "--li", "--intersect", what, f"pci={g.bus_id}"],
                                 env=env, capture_output=True, text=True, check=True).stdout.strip()
            assert list(mine) == [int(x) for x in out.split(",")], (g.bus_id, what)
    # ... and the XML exported with the GPU nodes kept reads back to the same model.
    assert v == view("power9-6xv100")


def test_node_invariants_on_every_machine(machine_node) -> None:
    """What every consumer relies on, for every machine (snapshot or XML)."""
    node = machine_node
    core_ids = [c.index for c in node.cores]
    assert core_ids == list(range(len(node.cores)))
    assert [n.index for n in node.numa_nodes] == list(range(len(node.numa_nodes)))
    all_pus = [pu for c in node.cores for pu in c.pus]
    assert len(all_pus) == len(set(all_pus))
    numa_os = {n.os_index for n in node.numa_nodes}
    assert not numa_os & {m.os_index for m in node.gpu_memory_nodes}
    for n in node.numa_nodes:
        assert set(n.cores) <= set(core_ids)
        assert set(node.pus_of_cores(n.cores)) <= set(n.pus)
    for c in node.cores:
        assert c.numa_node is None or c.index in node.numa_nodes[c.numa_node].cores
        assert c.index in node.packages[[p.index for p in node.packages].index(c.package)].cores
    nic_names = {n.name for n in node.nics}
    for g in node.gpus:
        assert set(g.cores) <= set(core_ids)
        assert set(g.numa_nodes) <= {n.index for n in node.numa_nodes}
        assert set(g.nics) <= nic_names
        assert g.pci_bus_id == g.pci_bus_id.lower() and len(g.pci_bus_id) == 12
