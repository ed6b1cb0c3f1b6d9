"""The health-check registry is the one list the engine, --only, the CLI and the docs read."""
from __future__ import annotations

import re

import pytest

from slurm_gpu.errors import UsageError
from slurm_gpu.health import engine, registry
from slurm_gpu.health.gpu_checks import GPU_CHECKS
from slurm_gpu.health.os_checks import OS_CHECK_TABLE
from slurm_gpu.health.settings import HealthSettings
from paths import ROOT

DOCS = ROOT / "docs" / "health.md"


def test_report_order_is_unchanged():
    assert registry.ALL_CHECKS == engine.ALL_CHECKS == (
        "gpu.xid", "gpu.sxid", "gpu.nvml", "gpu.count", "gpu.remap", "gpu.retired_pages", "gpu.ecc",
        "gpu.recovery", "gpu.fabric", "gpu.fabric_registration", "gpu.nvlink", "gpu.nvlink_speed", "gpu.pcie",
        "gpu.thermal", "gpu.persistence", "gpu.imex", "os.thp", "os.swappiness", "os.governor", "os.memlock",
        "os.persistenced", "ib.port", "ib.errors", "svc.fabricmanager", "svc.imex", "svc.hostengine", "gpu.dcgm")


def test_every_check_has_one_gather_and_the_kind_tables_feed_it():
    gathers = {c.name: c.gather for c in registry.REGISTRY}
    assert len(gathers) == len(registry.REGISTRY)
    assert {n for n, g in gathers.items() if g == registry.NVML} == set(GPU_CHECKS)
    assert {n for n, g in gathers.items() if g == registry.OS} == set(OS_CHECK_TABLE)
    assert gathers["gpu.xid"] == gathers["gpu.sxid"] == registry.KMSG
    assert gathers["gpu.imex"] == gathers["gpu.dcgm"] == registry.OWN


def test_selection_reads_the_switches_and_skip():
    s = HealthSettings()
    on = engine.select_checks(None, s)
    assert "gpu.dcgm" not in on and "gpu.xid" in on
    s.skip = ["gpu.xid", "os.thp"]
    assert "gpu.xid" not in engine.select_checks(None, s) and "os.thp" not in engine.select_checks(None, s)
    assert engine.select_checks(["os.thp", "gpu.xid", "os.thp"], s) == ["os.thp", "gpu.xid"]
    with pytest.raises(UsageError, match="unknown check 'gpu.nope'; known: gpu.xid, gpu.sxid"):
        engine.select_checks(["gpu.nope"], s)
    assert registry.needs(["os.thp", "gpu.ecc"], registry.NVML)
    assert not registry.needs(["os.thp", "gpu.xid"], registry.NVML)


def test_docs_list_every_registered_check():
    documented = set(re.findall(r"^\| `([a-z]+\.[a-z_0-9]+)` \|", DOCS.read_text(), re.M))
    assert set(registry.ALL_CHECKS) <= documented
    assert documented - set(registry.ALL_CHECKS) == {"health.watchdog"}
