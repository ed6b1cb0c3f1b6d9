#!/opt/slurm-gpu/venv/bin/python
"""Build the constructed machines: facts.json, hwloc.xml and snapshot.json.

Run from the checkout root:  /opt/slurm-gpu/venv/bin/python tests/data/machines/build_machines.py [NAME...]

For every machine this writes ``facts.json`` (per-GPU NVML facts, from real
data where there is real data: see each PROVENANCE.md), an ``hwloc.xml``
made from hwloc's synthetic topology (``lstopo --input``) with PCI and OS
devices inserted, and then ``snapshot.json`` by running the project's REAL
adapters (``slurm_gpu.hw.nvml.read_view`` + health reads, through the
recorder) against the NVML simulator built from those facts.  ``dgx2`` keeps
the hwloc helper's real ``hwloc.xml`` and only gets facts + snapshot from
its nvml OS devices.
"""
from __future__ import annotations

import json
import re
import sys
import uuid as uuidlib
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent / "machines"   # -> devkit/slurm_gpu_devkit/machines
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from slurm_gpu.hw import snapshot as snap  # noqa: E402
from slurm_gpu.runner import run  # noqa: E402
from slurm_gpu_devkit.sim.nvml import SimNvml  # noqa: E402

REAL = Path("/work/shared/realdata")
GIB = 1024 ** 3
FACTS_SCHEMA = "slurm-gpu.facts/1"


# ------------------------------------------------------------ real facts

def parse_smi_q(path: Path) -> dict[str, Any]:
    """Per-GPU facts from a real ``nvidia-smi -q`` text dump."""
    text = path.read_text()
    driver = re.search(r"^Driver Version\s*:\s*(\S+)", text, re.M).group(1)
    cuda = re.search(r"^CUDA Version\s*:\s*(\S+)", text, re.M).group(1)
    major, minor = cuda.split(".")
    gpus = []
    for block in re.split(r"^GPU (?=[0-9A-F]{8}:)", text, flags=re.M)[1:]:
        def f(label: str, b: str = block) -> str:
            return re.search(rf"^\s*{re.escape(label)}\s*:\s*(.*?)\s*$", b, re.M).group(1)
        fb = re.search(r"FB Memory Usage\s*\n\s*Total\s*:\s*(\d+) MiB\s*\n\s*Reserved\s*:\s*(\d+) MiB", block)
        rr = re.search(r"Remapped Rows\s*\n\s*Correctable Error\s*:\s*(\S+)\s*\n\s*Uncorrectable Error\s*:\s*(\S+)"
                       r"\s*\n\s*Pending\s*:\s*(\S+)\s*\n\s*Remapping Failure Occurred\s*:\s*(\S+)", block)
        gen = re.search(r"PCIe Generation\s*\n\s*Max\s*:\s*(\d+)\s*\n\s*Current\s*:\s*(\d+)", block)
        width = re.search(r"Link Width\s*\n\s*Max\s*:\s*(\d+)x\s*\n\s*Current\s*:\s*(\d+)x", block)
        mig = re.search(r"MIG Mode\s*\n\s*Current\s*:\s*(\S+)\s*\n\s*Pending\s*:\s*(\S+)", block)
        g: dict[str, Any] = {
            "minor": int(f("Minor Number")), "uuid": f("GPU UUID"), "bus_id": f("Bus Id"),
            "name": f("Product Name"), "pci_device_id": f("Device Id"), "pci_subsystem_id": f("Sub System Id"),
            "serial": f("Serial Number"), "memory_mib": int(fb.group(1)), "memory_reserved_mib": int(fb.group(2)),
            "architecture": f("Product Architecture"),
            "health": {"persistence_mode": 1 if f("Persistence Mode") == "Enabled" else 0,
                       "pcie": {"max_gen": int(gen.group(1)), "gen": int(gen.group(2)),
                                "max_width": int(width.group(1)), "width": int(width.group(2))}},
        }
        if rr and rr.group(1) != "N/A":
            g["health"]["remapped_rows"] = {"correctable": int(rr.group(1)), "uncorrectable": int(rr.group(2)),
                                            "pending": int(rr.group(3) == "Yes"), "failed": int(rr.group(4) == "Yes")}
        recovery = re.search(r"^\s*GPU Recovery Action\s*:\s*(\S+)", block, re.M)
        if recovery:  # drivers that report it answer the NVML field; "None" is action 0
            actions = {"None": 0, "Reset": 1, "Reboot": 2, "Drain_P2P": 3, "Drain_and_Reset": 4}
            g["health"]["fields"] = {"230": actions.get(recovery.group(1), 0)}
        if mig and mig.group(1) != "N/A":
            g["mig"] = {"mode": int(mig.group(1) == "Enabled"), "pending": int(mig.group(2) == "Enabled"),
                        "max_devices": 7, "instances": []}
        gpus.append(g)
    gpus.sort(key=lambda g: g["minor"])
    return {"driver_version": driver, "cuda_driver_version": int(major) * 1000 + int(minor) * 10, "gpus": gpus}


def fake_uuid(machine: str, i: int) -> str:
    """A constructed GPU UUID: stable, and clearly not a real board's."""
    return f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'slurm-gpu/{machine}/{i}')}"


def switch_peers(switches: list[str], per_switch: list[int]) -> list[dict[str, Any]]:
    """NVLink peers: link numbers spread over NVSwitch chips (e.g. 5,4,4,5 links)."""
    peers, link = [], 0
    for bus, n in zip(switches, per_switch):
        peers.append({"type": "switch", "bus_id": bus, "links": list(range(link, link + n))})
        link += n
    return peers


# ------------------------------------------------------------ hwloc XML

def synthetic_xml(desc: str) -> ET.ElementTree:
    res = run(["lstopo-no-graphics", "--input", desc, "--of", "xml", "-"], timeout=60)
    return ET.ElementTree(ET.fromstring(res.stdout.encode() if isinstance(res.stdout, str) else res.stdout))


def _bitmap(bits: set[int]) -> str:
    words = [0] * (max(bits) // 32 + 1 if bits else 1)
    for b in bits:
        words[b // 32] |= 1 << (b % 32)
    return ",".join(f"0x{w:08x}" for w in reversed(words))


def _bits(s: str) -> set[int]:
    out: set[int] = set()
    words = [w for w in s.split(",")]
    for i, w in enumerate(reversed(words)):
        v = int(w, 16) if w else 0
        out |= {i * 32 + b for b in range(32) if v >> b & 1}
    return out


class Xml:
    """Insert PCI devices (GPUs, NICs) and GPU-memory NUMA nodes into a synthetic XML."""

    def __init__(self, tree: ET.ElementTree, hostname: str) -> None:
        self.tree = tree
        self.root = tree.getroot()
        self.machine = self.root.find("object")
        for info in list(self.machine.findall("info")):
            if info.get("name") in ("Backend", "SyntheticDescription", "ProcessName"):
                self.machine.remove(info)
        # hwloc wants a parent's info elements before its child objects.
        self.machine.insert(0, ET.Element("info", name="HostName", value=hostname))
        self.machine.insert(0, ET.Element("info", name="Backend", value="Linux"))
        self.gp = 1 + max(int(e.get("gp_index", 0)) for e in self.root.iter("object"))
        self.parents = {c: p for p in self.root.iter("object") for c in p.findall("object")}

    def _next(self) -> str:
        self.gp += 1
        return str(self.gp)

    def numa_parent(self, numa_os: int) -> ET.Element:
        for o in self.root.iter("object"):
            if o.get("type") == "NUMANode" and o.get("os_index") == str(numa_os):
                return self.parents[o]
        raise KeyError(numa_os)

    def add_pci(self, numa_os: int, bus: str, pci_type: str, osdevs: list[tuple[str, str, dict[str, str]]],
                infos: dict[str, str] | None = None) -> None:
        parent = self.numa_parent(numa_os)
        b = int(bus.split(":")[1], 16)
        br = ET.SubElement(parent, "object", type="Bridge", gp_index=self._next(), bridge_type="0-1", depth="0",
                           bridge_pci=f"{bus.split(':')[0]}:[{b:02x}-{b:02x}]")
        dev = ET.SubElement(br, "object", type="PCIDev", gp_index=self._next(), pci_busid=bus, pci_type=pci_type,
                            pci_link_speed="31.507692")
        for k, v in (infos or {}).items():
            ET.SubElement(dev, "info", name=k, value=v)
        for name, ostype, oinfo in osdevs:
            od = ET.SubElement(dev, "object", type="OSDev", gp_index=self._next(), name=name, osdev_type=ostype)
            for k, v in oinfo.items():
                ET.SubElement(od, "info", name=k, value=v)

    def add_switch(self, numa_os: int, upstream: str, devices: list[tuple[str, str, list[Any], dict[str, str]]]
                   ) -> None:
        """A PCIe switch (PLX/Broadcom-like) under a host bridge, holding *devices*
        (bus id, pci_type, OS devices, infos): what nvidia-smi topo calls PIX."""
        parent = self.numa_parent(numa_os)
        dom = upstream.split(":")[0]
        buses = [int(upstream.split(":")[1], 16)] + [int(d[0].split(":")[1], 16) for d in devices]
        lo, hi = min(buses), max(buses)
        host = ET.SubElement(parent, "object", type="Bridge", gp_index=self._next(), bridge_type="0-1", depth="0",
                             bridge_pci=f"{dom}:[{lo:02x}-{hi:02x}]")
        sw = ET.SubElement(host, "object", type="Bridge", gp_index=self._next(), bridge_type="1-1", depth="1",
                           bridge_pci=f"{dom}:[{lo + 1:02x}-{hi:02x}]", pci_busid=upstream,
                           pci_type="0604 [1000:c030] [1000:a064] b0", pci_link_speed="31.507692")
        for bus, ptype, osdevs, infos in devices:
            dev = ET.SubElement(sw, "object", type="PCIDev", gp_index=self._next(), pci_busid=bus, pci_type=ptype,
                                pci_link_speed="31.507692")
            for k, v in infos.items():
                ET.SubElement(dev, "info", name=k, value=v)
            for name, ostype, oinfo in osdevs:
                od = ET.SubElement(dev, "object", type="OSDev", gp_index=self._next(), name=name, osdev_type=ostype)
                for k, v in oinfo.items():
                    ET.SubElement(od, "info", name=k, value=v)

    def add_gpu_memory_node(self, numa_os: int, cpu_numa_os: int, memory: int) -> None:
        """A GPU-memory NUMA node (Grace/POWER9 HBM), beside a CPU NUMA node."""
        parent = self.numa_parent(cpu_numa_os)
        cpuset = parent.get("cpuset")
        node = ET.Element("object", type="NUMANode", os_index=str(numa_os), cpuset=cpuset,
                          complete_cpuset=cpuset, nodeset=_bitmap({numa_os}), complete_nodeset=_bitmap({numa_os}),
                          gp_index=self._next(), subtype="GPUMemory", local_memory=str(memory))
        idx = max(i for i, c in enumerate(list(parent)) if c.tag == "object" and c.get("type") == "NUMANode") + 1
        parent.insert(idx, node)
        o: ET.Element | None = parent
        while o is not None:
            for attr in ("nodeset", "complete_nodeset", "allowed_nodeset"):
                if o.get(attr):
                    o.set(attr, _bitmap(_bits(o.get(attr)) | {numa_os}))
            o = self.parents.get(o)

    def text(self) -> str:
        ET.indent(self.tree)
        return ('<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE topology SYSTEM "hwloc2.dtd">\n'
                + ET.tostring(self.root, encoding="unicode") + "\n")


def gpu_osdevs(i: int, g: dict[str, Any]) -> list[tuple[str, str, dict[str, str]]]:
    return [(f"nvidia{g['minor']}", "1", {}),
            (f"nvml{i}", "5", {"Backend": "NVML", "GPUVendor": "NVIDIA Corporation", "GPUModel": g["name"],
                               "NVIDIAUUID": g["uuid"]})]


def pci_type(g: dict[str, Any]) -> str:
    dev = int(g["pci_device_id"], 16) >> 16 if isinstance(g["pci_device_id"], str) else g["pci_device_id"]
    sub = int(g.get("pci_subsystem_id", "0x0"), 16)
    return f"0302 [10de:{dev:04x}] [{sub & 0xffff:04x}:{sub >> 16:04x}] a1"


def pu_indexes(cores: int, threads: int, stride: int) -> str:
    """PU OS indices in logical order, Linux style: thread t of core c is c + t*stride."""
    return ",".join(str(c + t * stride) for c in range(cores) for t in range(threads))


# ------------------------------------------------------------ machines

def h100_sxm_8x() -> tuple[dict[str, Any], str]:
    facts = parse_smi_q(REAL / "nvidia-smi-q" / "thamada__H100SXMx8_nvidia-smi-q.txt")
    switches = [f"0000:{b:02x}:00.0" for b in (0xc5, 0xc6, 0xc7, 0xc8)]
    for i, g in enumerate(facts["gpus"]):
        g["index"] = i
        g["nvlink"] = {"count": 18, "version": 4, "peers": switch_peers(switches, [5, 4, 4, 5])}
        g["numa"] = 0 if i < 4 else 1
    x = Xml(synthetic_xml(f"pack:2 [numa(memory={1024 * GIB})] core:52 pu:2(indexes={pu_indexes(104, 2, 104)})"),
            "h100-sxm-8x")
    for i, g in enumerate(facts["gpus"]):
        x.add_pci(g.pop("numa"), _hw_bus(g["bus_id"]), pci_type(g), gpu_osdevs(i, g),
                  {"PCIVendor": "NVIDIA Corporation", "PCIDevice": "GH100 [H100 SXM5 80GB]"})
    return facts, x.text()


def _hw_bus(bus: str) -> str:
    from slurm_gpu.hw.model import normalize_bus_id
    return normalize_bus_id(bus)


def _gpu(machine: str, i: int, bus: str, name: str, dev: str, sub: str, mem: int, **kw: Any) -> dict[str, Any]:
    g = {"index": i, "minor": i, "uuid": fake_uuid(machine, i), "bus_id": bus, "name": name, "pci_device_id": dev,
         "pci_subsystem_id": sub, "memory_mib": mem,
         "health": {"persistence_mode": 1, "pcie": {"gen": kw.pop("gen", 5), "max_gen": kw.pop("max_gen", 5),
                                                    "width": 16, "max_width": 16},
                    "fields": {"230": 0},   # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: none
                    "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": 0, "failed": 0}}}
    g.update(kw)
    return g


def dgx_h100() -> tuple[dict[str, Any], str]:
    buses = ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
             "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"]
    switches = [f"0000:{b:02x}:00.0" for b in (0x05, 0x06, 0x07, 0x08)]
    gpus = [_gpu("dgx-h100", i, b, "NVIDIA H100 80GB HBM3", "0x233010DE", "0x16C110DE", 81559,
                 nvlink={"count": 18, "version": 4, "peers": switch_peers(switches, [5, 4, 4, 5])},
                 mig={"mode": 0, "pending": 0, "max_devices": 7, "instances": []})
            for i, b in enumerate(buses)]
    facts = {"driver_version": "550.54.15", "cuda_driver_version": 12040, "gpus": gpus}
    x = Xml(synthetic_xml(f"pack:2 [numa(memory={1024 * GIB})] core:56 pu:2(indexes={pu_indexes(112, 2, 112)})"),
            "dgx-h100")
    for i, g in enumerate(gpus):
        # Each GPU shares a PCIe switch with one ConnectX-7 (PIX), as on DGX H100.
        b = int(g["bus_id"][5:7], 16)
        nic = (f"0000:{b - 1:02x}:00.0", "0207 [15b3:1021] [15b3:0041] 00",
               [(f"mlx5_{i}", "3", {"NodeGUID": f"b83f:d203:00{i:02x}:0000"}), (f"ibp{i}s0", "2", {})],
               {"PCIDevice": "MT2910 Family [ConnectX-7]"})
        x.add_switch(0 if i < 4 else 1, f"0000:{b - 3:02x}:00.0",
                     [(g["bus_id"], pci_type(g), gpu_osdevs(i, g), {"PCIDevice": "GH100 [H100 SXM5 80GB]"}), nic])
    return facts, x.text()


def epyc_a100_8numa() -> tuple[dict[str, Any], str]:
    # GPUs on the odd NUMA nodes of 2x EPYC NPS4, two per node (Azure NDv4 /
    # DGX A100 pattern); A100 SXM4 NV12: 12 links over 6 NVSwitch chips.
    return _a100_8numa("epyc-a100-8numa", list(range(8)), mig_mode=0)


def _a100_8numa(machine: str, minors: list[int], mig_mode: int) -> tuple[dict[str, Any], str]:
    """Eight A100 SXM4 40GB, two per odd NUMA node of 2x EPYC NPS4, at DGX A100's buses."""
    numa_of = [1, 1, 3, 3, 5, 5, 7, 7]
    buses = ["0000:07:00.0", "0000:0f:00.0", "0000:47:00.0", "0000:4e:00.0",
             "0000:87:00.0", "0000:90:00.0", "0000:b7:00.0", "0000:bd:00.0"]
    switches = [f"0000:{b:02x}:00.0" for b in (0xc4, 0xc5, 0xc6, 0xc7, 0xc8, 0xc9)]
    gpus = [_gpu(machine, i, b, "NVIDIA A100-SXM4-40GB", "0x20B010DE", "0x134F10DE", 40960,
                 gen=4, max_gen=4, minor=minors[i],
                 nvlink={"count": 12, "version": 3, "peers": switch_peers(switches, [2] * 6)},
                 mig={"mode": mig_mode, "pending": mig_mode, "max_devices": 7, "instances": []})
            for i, b in enumerate(buses)]
    facts = {"driver_version": "535.104.05", "cuda_driver_version": 12020, "gpus": gpus}
    x = Xml(synthetic_xml(f"pack:2 numa:4(memory={128 * GIB}) core:16 pu:2(indexes={pu_indexes(128, 2, 128)})"),
            machine)
    for i, g in enumerate(gpus):
        x.add_pci(numa_of[i], g["bus_id"], pci_type(g), gpu_osdevs(i, g), {"PCIDevice": "GA100 [A100 SXM4 40GB]"})
    return facts, x.text()


def gb200_nvl() -> tuple[dict[str, Any], str]:
    # One GB200 NVL72 compute tray: 2 Grace (72 cores each), 4 Blackwell GPUs,
    # 18 NVLinks each to the rack's NVSwitch trays (not PCI-visible here), one
    # NVLink fabric clique.  Health mask: every field reports "false" (healthy).
    healthy_mask = 2 | 2 << 2 | 2 << 4 | 2 << 6
    fabric = {"cluster_uuid": "7e3f1c22-5a9b-4d0e-8c61-2f4a9b7d3e10", "clique_id": 32766, "state": "completed",
              "status": 0, "health_mask": healthy_mask}
    buses = ["0008:01:00.0", "0009:01:00.0", "0018:01:00.0", "0019:01:00.0"]
    gpus = [_gpu("gb200-nvl", i, b, "NVIDIA GB200", "0x294110DE", "0x20CA10DE", 189471, gen=5, max_gen=5,
                 nvlink={"count": 18, "version": 5, "peers": [{"type": "switch", "bus_id": "", "links": list(range(18))}]},
                 mig={"mode": 0, "pending": 0, "max_devices": 7, "instances": []}, fabric=dict(fabric))
            for i, b in enumerate(buses)]
    facts = {"driver_version": "570.133.20", "cuda_driver_version": 12080, "gpus": gpus}
    x = Xml(synthetic_xml(f"pack:2 [numa(memory={480 * GIB})] core:72 pu:1"), "gb200-nvl")
    for i, g in enumerate(gpus):
        x.add_pci(0 if i < 2 else 1, g["bus_id"], pci_type(g), gpu_osdevs(i, g), {"PCIDevice": "GB200"})
    for i in range(4):
        x.add_gpu_memory_node(2 + i, 0 if i < 2 else 1, 185 * GIB)
    return facts, x.text()


def h100_mig() -> tuple[dict[str, Any], str]:
    # 4x H100 SXM5 modelled on the real `slurmd -G` of stackhpc's io-io-gpu-02:
    # GPUs 0,1 whole; GPU 2: 4g.40gb (GI 2) + 3x 1g.10gb (GI 7,8,9);
    # GPU 3: 4g.40gb (GI 1) + 3x 1g.10gb (GI 11,12,13).  Memory/SMs from that
    # node's real `nvidia-smi mig -lgip`.  The GI ids are the recorded ones
    # (they depend on the driver's creation history, not only on placement);
    # H100 allows 4g.40gb only at {0}:4, so the 1g instances sit at 4, 5, 6.
    from slurm_gpu_devkit.sim.nvml import mig_uuid
    recorded_gi = {2: (2, (7, 8, 9)), 3: (1, (11, 12, 13))}
    buses = ["0000:06:00.0", "0000:0c:00.0", "0000:46:00.0", "0000:4c:00.0"]
    gpus = []
    for i, b in enumerate(buses):
        g = _gpu("h100-mig", i, b, "NVIDIA H100 80GB HBM3", "0x233010DE", "0x16C110DE", 81559,
                 mig={"mode": 1 if i >= 2 else 0, "pending": 1 if i >= 2 else 0, "max_devices": 7, "instances": []},
                 nvlink={"count": 18, "version": 4,
                         "peers": switch_peers([f"0000:{x:02x}:00.0" for x in (0xa5, 0xa6, 0xa7, 0xa8)], [5, 4, 4, 5])})
        if i >= 2:
            big_gi, small_gis = recorded_gi[i]
            insts = [{"gi_id": big_gi, "gi_profile_id": 5, "profile": "4g.40gb",
                      "start": 0, "size": 4, "slices": 4, "memory_mb": 40448, "sm_count": 64,
                      "cis": [{"ci_id": 0, "ci_profile_id": 3, "start": 0, "slices": 4, "sm_count": 64}]}]
            for gi_id, s in zip(small_gis, (4, 5, 6)):
                insts.append({"gi_id": gi_id, "gi_profile_id": 19, "profile": "1g.10gb",
                              "start": s, "size": 1, "slices": 1, "memory_mb": 9984, "sm_count": 16,
                              "cis": [{"ci_id": 0, "ci_profile_id": 0, "start": 0, "slices": 1, "sm_count": 16}]})
            for gi in insts:
                for ci in gi["cis"]:
                    ci["uuid"] = mig_uuid(g["uuid"], gi["gi_id"], ci["ci_id"])
            g["mig"]["instances"] = insts
        gpus.append(g)
    facts = {"driver_version": "550.90.07", "cuda_driver_version": 12040, "gpus": gpus}
    x = Xml(synthetic_xml(f"pack:2 [numa(memory={512 * GIB})] core:32 pu:2(indexes={pu_indexes(64, 2, 64)})"),
            "io-io-gpu-02")
    for i, g in enumerate(gpus):
        x.add_pci(0 if i < 2 else 1, g["bus_id"], pci_type(g), gpu_osdevs(i, g), {"PCIDevice": "GH100 [H100 SXM5 80GB]"})
    return facts, x.text()


def mini_2numa() -> tuple[dict[str, Any], str]:
    # The two real H100 NVL boards of thamada's H100NVLx2 dump (names, UUIDs,
    # bus ids, memory), renumbered minors 0/1, NVLink-bridged to each other
    # (NV12); one per NUMA node of a 2 x 1 core x 1 PU machine whose PU OS
    # indices 0 and 1 exist on this 2-CPU host.
    real = parse_smi_q(REAL / "nvidia-smi-q" / "thamada__H100NVLx2_nvidia-smi-q.txt")
    gpus = real["gpus"]
    for i, g in enumerate(gpus):
        g["index"] = i
        g["minor"] = i
        other = gpus[1 - i]["bus_id"]
        g["nvlink"] = {"count": 18, "version": 4, "peers": [{"type": "gpu", "bus_id": other, "links": list(range(12))}]}
    for i, g in enumerate(gpus):
        g["nvlink"]["peers"][0]["bus_id"] = _hw_bus(gpus[1 - i]["bus_id"])
    x = Xml(synthetic_xml(f"pack:2 [numa(memory={8 * GIB})] core:1 pu:1"), "mini-2numa")
    for i, g in enumerate(gpus):
        x.add_pci(i, _hw_bus(g["bus_id"]), pci_type(g), gpu_osdevs(i, g), {"PCIDevice": "GH100 [H100 NVL]"})
    return real, x.text()


def dgx2() -> tuple[dict[str, Any], str]:
    # Facts from the real DGX-2 XML's nvml OS devices (names, UUIDs, serials,
    # bus ids); memory 32 GB V100; NVLink: 6 links per GPU, one to each of the
    # 6 NVSwitch chips of its baseboard (DGX-2 architecture), switch bus ids
    # constructed.
    xml_path = HERE / "dgx2" / "hwloc.xml"
    tree = ET.parse(xml_path)
    gpus = []
    for pci in tree.getroot().iter("object"):
        if pci.get("type") != "PCIDev":
            continue
        for od in pci.findall("object"):
            if od.get("type") == "OSDev" and re.fullmatch(r"nvml\d+", od.get("name", "")):
                info = {i.get("name"): i.get("value") for i in od.findall("info")}
                m = re.search(r"\[10de:([0-9a-f]{4})\] \[([0-9a-f]{4}):([0-9a-f]{4})\]", pci.get("pci_type"))
                gpus.append({"index": int(od.get("name")[4:]), "bus_id": pci.get("pci_busid"),
                             "name": info["GPUModel"], "uuid": info["NVIDIAUUID"], "serial": info.get("NVIDIASerial"),
                             "pci_device_id": f"0x{m.group(1).upper()}10DE",
                             "pci_subsystem_id": f"0x{m.group(3).upper()}{m.group(2).upper()}",
                             "memory_mib": 32768})
    gpus.sort(key=lambda g: g["index"])
    for g in gpus:
        g["minor"] = g["index"]
        board = 0 if g["index"] < 8 else 1
        sw = [f"0000:{0xf0 + board * 8 + k:02x}:00.0" for k in range(6)]  # unused by the XML's PCI tree
        g["nvlink"] = {"count": 6, "version": 2, "peers": switch_peers(sw, [1] * 6)}
        g["health"] = {"persistence_mode": 1, "retired_pages": {"single_bit": [], "double_bit": [], "pending": 0},
                       "pcie": {"gen": 3, "max_gen": 3, "width": 16, "max_width": 16}}
    facts = {"driver_version": "410.104", "cuda_driver_version": 10000, "gpus": gpus}
    return facts, xml_path.read_text()


def a100_sxm4_minors() -> tuple[dict[str, Any], str]:
    # The four real A100-SXM4-80GB boards of thamada's A100SXMx4 dump, KEPT
    # with their real minor numbers 3, 4, 5, 6 (NVML indices 0..3): a node
    # where /dev/nvidiaN is not /dev/nvidia<index>.  MIG mode is enabled
    # (the dump has it off) so the per-job MIG path runs on it.
    facts = parse_smi_q(REAL / "nvidia-smi-q" / "thamada__A100SXMx4_nvidia-smi-q.txt")
    for i, g in enumerate(facts["gpus"]):
        g["index"] = i
        g["mig"] = {"mode": 1, "pending": 1, "max_devices": 7, "instances": []}
        # One real board has a row remap pending (a reset due): a healthy node here.
        g["health"].get("remapped_rows", {}).update(pending=0, failed=0)
    x = Xml(synthetic_xml(f"pack:2 [numa(memory={512 * GIB})] core:32 pu:2(indexes={pu_indexes(64, 2, 64)})"),
            "a100-sxm4-minors")
    for i, g in enumerate(facts["gpus"]):
        x.add_pci(0 if i < 2 else 1, _hw_bus(g["bus_id"]), pci_type(g), gpu_osdevs(i, g),
                  {"PCIDevice": "GA100 [A100 SXM4 80GB]"})
    return facts, x.text()


# Minor numbers in an order that is not the PCI (NVML index) order.  NVIDIA:
# "[the minor number] is assigned at boot time ... It is *not* guaranteed"
# to follow the index (NVIDIA/nvidia-docker#1432); NVIDIA/nvidia-installer#21
# shows an A100 node whose minors differ from its GPU numbers; Slurm commit
# 0ebfd37834 (bug 10933) stopped using minors for CUDA_VISIBLE_DEVICES
# because they are "not guaranteed to be in order of PCI bus ID".
DGX_A100_PERMUTED_MINORS = [2, 3, 0, 1, 6, 7, 4, 5]


def dgx_a100_permuted() -> tuple[dict[str, Any], str]:
    # DGX A100: the real index -> PCI bus table of NVIDIA's GDS guide
    # (shared/realdata/topo-matrix/nvidia-gds-benchmarking-guide__dgx2_topo-mp.txt,
    # section 5.2), GPUs two per odd NUMA node of 2x EPYC NPS4 like
    # epyc-a100-8numa, minors permuted (DGX_A100_PERMUTED_MINORS), MIG on.
    return _a100_8numa("dgx-a100-permuted", DGX_A100_PERMUTED_MINORS, mig_mode=1)


MACHINES: dict[str, Callable[[], tuple[dict[str, Any], str]]] = {
    "h100-sxm-8x": h100_sxm_8x, "dgx-h100": dgx_h100, "epyc-a100-8numa": epyc_a100_8numa,
    "gb200-nvl": gb200_nvl, "h100-mig": h100_mig, "mini-2numa": mini_2numa, "dgx2": dgx2,
    "a100-sxm4-minors": a100_sxm4_minors, "dgx-a100-permuted": dgx_a100_permuted,
}


def build(name: str) -> None:
    facts, xml = MACHINES[name]()
    facts = {"schema": FACTS_SCHEMA, **facts}
    d = HERE / name
    d.mkdir(exist_ok=True)
    (d / "facts.json").write_text(json.dumps(facts, indent=1) + "\n")
    if name != "dgx2":
        (d / "hwloc.xml").write_text(xml)
    sim = SimNvml.from_facts(facts, hwloc_xml=xml)
    sim.nvmlInit()
    hostname = re.search(r'name="HostName" value="([^"]+)"', xml)
    data = snap.record(api=sim, hwloc_xml=xml, hostname=hostname.group(1) if hostname else name,
                       mig_minors=sim.mig_minors(), source="sim:facts.json")
    data["recorded_at"] = "2026-11-22T00:00:00Z"   # stable output: rebuilding changes nothing
    snap.write(str(d / "snapshot.json"), data)
    node = data["node"]
    print(f"{name}: {len(node['gpus'])} GPUs, {len(node['numa_nodes'])} NUMA, {len(node['cores'])} cores, "
          f"{len(data['nvml']['calls'])} NVML answers; notes: {node['notes']}")


if __name__ == "__main__":
    for n in sys.argv[1:] or list(MACHINES):
        build(n)
