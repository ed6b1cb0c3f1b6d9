"""Property tests: the hwloc XML loader, snapshot JSON and fault overlays end in a result or one line."""
from __future__ import annotations

import copy
import json

import pytest
from fuzzlib import fuzz_settings, json_values, mutated, outcome
from hypothesis import given
from hypothesis import strategies as st

from slurm_gpu.health.gpu_checks import run_gpu_checks
from slurm_gpu import hw
from slurm_gpu.hw import hwloc, snapshot
from slurm_gpu.hw.nvml_health import read_health
from paths import ROOT

MACHINES = ROOT / "tests" / "data" / "machines"
XMLS = [(MACHINES / m / "hwloc.xml").read_text() for m in ("mini-2numa", "opteron-cpusets", "coral-butte-hwloc1")]
XML_TOKENS = ["<object type=\"Package\" os_index=\"0\" cpuset=\"0x", "cpuset=\"0xffffffff", "os_index=\"",
              "<info name=\"PCIVendor\" value=\"NVIDIA\"/>", "type=\"PCIDev\"", "pci_busid=\"0000:",
              "<distances2", "nbobjs=\"", "</object>", "<object type=\"NUMANode\"", "local_memory=\"",
              "<!DOCTYPE t [<!ENTITY a \"aaaaaaaa\"><!ENTITY b \"&a;&a;&a;&a;&a;&a;\">]>", "&b;",
              "version=\"2.0\"", "<topology>", "osdev_type=\"", "<object type=\"OSDev\" name=\"nvidia0\""]
SNAP = MACHINES / "mini-2numa" / "snapshot.json"
SNAP_TEXT = SNAP.read_text()
SNAP_DATA = json.loads(SNAP_TEXT)


@fuzz_settings(2000)
@given(mutated(XMLS, XML_TOKENS))
def test_hwloc_xml_loader(text):
    outcome(hwloc.read_cpu_view, xml_text=text, hostname="n1", source="fuzz.xml")


@pytest.fixture(scope="module")
def snap_file(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-snap") / "s.json"


@fuzz_settings(1000)
@given(text=mutated([SNAP_TEXT[:6000] + SNAP_TEXT[-3000:], SNAP_TEXT], ['"result": ', '"error": ', '{"$handle": "gpu',
                                                                       '"fn": "nvmlDeviceGet', '"args": [',
                                                                       '"schema": "slurm-gpu.snapshot/1"']))
def test_snapshot_json_text(snap_file, text):
    snap_file.write_text(text, errors="surrogatepass")
    outcome(hw.load_node, hw.Snapshot(str(snap_file)))


CALL_KEYS = ["fn", "dev", "args", "result", "error", "$handle", "gpu0", "gpu1", "$struct", "value"]


@fuzz_settings(700)
@given(st.data())
def test_snapshot_recorded_answers(data):
    """Each replayed NVML answer swapped for something else: replay derives a node or says one line."""
    doc = copy.deepcopy(SNAP_DATA)
    doc.pop("node", None)
    calls = doc["nvml"]["calls"]
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(calls) - 1))
        field = data.draw(st.sampled_from(["result", "error", "args", "dev", "fn", "whole"]))
        value = data.draw(json_values(CALL_KEYS))
        if field == "whole":
            calls[i] = value
        elif isinstance(calls[i], dict):
            calls[i][field] = value
    if data.draw(st.booleans()):
        doc["nvml"]["mig_minors"] = data.draw(json_values(["0", "1", "gpu0"]))
    outcome(snapshot.replay, doc, "fuzz.json")


OVERLAY_KEYS = ["gpus", "calls", "events", "comment", "lost", "fn", "gpu", "args", "result", "error", "hang",
                "out", "type", "data", "gpu_instance", "compute_instance", "xid", "double_bit_ecc",
                "nvmlDeviceGetRemappedRows", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetCount", "0", "1",
                "0000:18:00.0", "NVML_ERROR_GPU_IS_LOST", "GPU_IS_LOST"]


def _health(doc, overlay):
    api = snapshot.replay_api(doc, "fuzz.json", overlay, "fuzz-overlay")
    h = read_health(api)
    return run_gpu_checks(h, None, ["gpu.count", "gpu.ecc", "gpu.remap", "gpu.retired_pages", "gpu.recovery",
                                    "gpu.pcie", "gpu.thermal", "gpu.persistence", "gpu.fabric"], 60, None)


@fuzz_settings(700)
@given(json_values(OVERLAY_KEYS))
def test_fault_overlays(overlay):
    if isinstance(overlay, dict):
        for calls in (overlay.get("calls"),):
            if isinstance(calls, list):       # a hang is real time: keep them short
                for c in calls:
                    if isinstance(c, dict) and isinstance(c.get("hang"), (int, float)):
                        c["hang"] = min(abs(c["hang"]), 0.001) if c["hang"] == c["hang"] else 0
    outcome(snapshot.replay, SNAP_DATA, "fuzz.json", overlay=overlay)
    outcome(_health, SNAP_DATA, overlay)


@pytest.mark.parametrize("name", ["segv-broken-attribute.xml", "segv-no-complete-nodeset.xml",
                                  "segv-two-roots.xml", "segv-undefined-entity.xml",
                                  "abort-bitmap-leading-comma.xml"])
def test_xml_that_crashes_libhwloc_is_refused_first(name):
    # Found by the fuzzer: libhwloc 2.9.0 (and lstopo) die with SIGSEGV on each
    # (tests/data/hwloc-fuzz/PROVENANCE.md).  Run in a child: on old code the
    # crash would take the test process with it.
    import subprocess
    import sys
    path = ROOT / "tests" / "data" / "hwloc-fuzz" / name
    code = ("import sys\nfrom slurm_gpu.hw import hwloc\nfrom slurm_gpu.errors import InputError\n"
            "try:\n    hwloc.read_cpu_view(xml_path=sys.argv[1])\nexcept InputError as e:\n    print(e.line())\n")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                       cwd=str(ROOT), timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr[-300:])
    assert r.stdout.startswith("slurm-gpu: malformed hwloc XML") and f"{name} line " in r.stdout
