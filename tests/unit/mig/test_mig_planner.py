"""The MIG planner against the real tables (NVIDIA's lgipp outputs, mig-parted configs)."""
from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from slurm_gpu.cli import main
from slurm_gpu.errors import UsageError
from slurm_gpu.mig.planner import Request, parse_layout, plan, plan_gpu
from slurm_gpu.mig.profiles import MODELS, find_model
from paths import ROOT

DATA = ROOT / "tests" / "data" / "mig"


def _lgipp_sections() -> dict[str, dict[int, tuple[tuple[int, ...], int]]]:
    """{section letter: {profile id: (starts, size)}} from the real -lgipp outputs."""
    text = (DATA / "lgip-lgipp-real-outputs.md").read_text()
    out: dict[str, dict[int, tuple[tuple[int, ...], int]]] = {}
    parts = re.split(r"\n## ([A-Z])\. ", text)
    for letter, sec in zip(parts[1::2], parts[2::2]):
        rows = re.findall(r"Profile ID\s+(\d+) Placements?\s*: \{([\d,]+)\}:(\d+)", sec)
        if rows:
            out[letter] = {int(p): (tuple(int(s) for s in starts.split(",")), int(size))
                           for p, starts, size in rows}
    return out


@pytest.mark.parametrize("letter,model", [("A", "a30"), ("B", "h100-nvl"), ("D", "a100-40gb")])
def test_placements_equal_real_lgipp(letter: str, model: str) -> None:
    real = _lgipp_sections()[letter]
    m = find_model(model)
    assert m is not None
    ours = {p.id: (p.starts, p.size) for p in m.profiles if p.id in real}
    assert ours == real
    # every profile the real GPU listed is one we know
    assert set(real) <= {p.id for p in m.profiles}


def enabled_layouts(config: dict[str, Any]) -> Iterator[tuple[str, dict[str, int], list[str]]]:
    """(config name, mig-devices, device-filter: [] for any GPU) of each entry of a
    mig-parted style config that enables MIG with instances."""
    for name, entries in config["mig-configs"].items():
        for e in entries:
            devs = e.get("mig-devices") or {}
            if not e.get("mig-enabled") or not devs:
                continue
            filt = e.get("device-filter")
            yield name, devs, [filt] if isinstance(filt, str) else filt or []


def _parted_layouts() -> list[tuple[str, str, dict[str, int]]]:
    data = yaml.safe_load((DATA / "mig-parted-config-default.yaml").read_text())
    out = []
    for name, devs, filt in enabled_layouts(data):
        ids = {int(f, 16) >> 16 for f in filt} if filt else None
        for m in MODELS:
            if ids is not None and not ids & set(m.pci_device_ids):
                continue
            # By the model's own names: an unfiltered layout of another model's
            # names does not apply through a board variant's second name (GB200's 1g.24gb).
            if all(p in {q.name for q in m.profiles} for p in devs):
                out.append((name, m.key, devs))
    return out


PARTED = _parted_layouts()


def test_parted_configs_cover_every_model() -> None:
    assert {k for _, k, _ in PARTED} == {m.key for m in MODELS}


@pytest.mark.parametrize("name,model,devs", PARTED, ids=[f"{n}-{k}" for n, k, _ in PARTED])
def test_every_mig_parted_layout_plans(name: str, model: str, devs: dict[str, int]) -> None:
    m = find_model(model)
    reqs = [Request(p) for p, n in devs.items() for _ in range(n)]
    placed = plan_gpu(reqs, m)
    assert sorted(p.profile for p in placed) == sorted(r.profile for r in reqs)
    spans = sorted((p.start, p.start + p.size) for p in placed)
    for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
        assert a1 <= b0, f"overlap in {name} on {model}: {spans}"
    for p in placed:
        assert p.start in m.profile(p.profile).starts


def test_guide_example_placement() -> None:
    # NVIDIA guide: 3g.20gb,1g.5gb,2g.10gb,1g.5gb fits (3g at 4, 1g at 0/1, 2g at 2)
    # (the guide's -lgi shows 3g at 4:4; the rest shares slices 0-3)
    got = plan("3g.20gb,1g.5gb,2g.10gb,1g.5gb", find_model("a100-40gb"))[0]
    assert [p.start for p in got if p.profile == "3g.20gb"] == [4]
    used = sorted(s for p in got if p.profile != "3g.20gb" for s in range(p.start, p.start + p.size))
    assert used == [0, 1, 2, 3]


@pytest.mark.parametrize("model", [m.key for m in MODELS])
def test_full_gpu_and_overfull_per_model(model: str) -> None:
    m = find_model(model)
    whole = max(m.profiles, key=lambda p: p.slices)
    assert plan(whole.name, m)[0][0].size == m.memory_slices
    smallest = next(p for p in m.profiles if p.slices == 1 and not p.name.endswith("+me"))
    plan(f"{smallest.instances}x{smallest.name}", m)
    with pytest.raises(UsageError):
        plan(f"{smallest.instances + 1}x{smallest.name}", m)


IMPOSSIBLE = [
    ("4g.40gb,4g.40gb", "at most 1"),
    ("3g.40gb,3g.40gb,1g.10gb", "memory slices"),
    ("4g.40gb,2g.20gb,2g.20gb", "compute slices"),
    ("8x1g.10gb", "at most 7"),
    ("1g.10gb+me,1g.10gb+me", "at most 1"),
    ("3g.41gb", "not a MIG profile"),
    ("5c.3g.40gb", "compute instances of 1c, 2c, 3c"),
    ("4x1g.20gb,1g.10gb", "memory slices"),
    ("4g.40gb,1g.20gb,1g.20gb,1g.20gb", "memory slices"),
    ("bogus", "bad MIG layout entry"),
    ("3g.40gb,,1g.10gb", "bad MIG layout entry"),
]


@pytest.mark.parametrize("layout,why", IMPOSSIBLE)
def test_impossible_layouts_one_clear_line(layout: str, why: str, capsys) -> None:
    rc = main(["mig", "plan", layout, "--model", "NVIDIA H100 80GB HBM3"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("slurm-gpu: ")
    assert why in err
    assert "Traceback" not in err


def test_plan_cli_prints_placements(capsys) -> None:
    assert main(["mig", "plan", "3g.40gb,2g.20gb,2g.20gb", "--model", "h100-80gb"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"3g\.40gb\s+9\s+4:4", out)
    assert re.search(r"2g\.20gb\s+14\s+0:2", out) and re.search(r"2g\.20gb\s+14\s+2:2", out)
    assert "free memory slices: none" in out
    assert main(["mig", "plan", "2g.20gb", "--model", "h100-80gb"]) == 0
    assert "free memory slices: 2,3,4,5,6,7" in capsys.readouterr().out


def test_plan_cli_unknown_model(capsys) -> None:
    assert main(["mig", "plan", "1g.5gb", "--model", "v100"]) == 2
    assert "unknown GPU model" in capsys.readouterr().err


@pytest.mark.parametrize("name,key", [
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA A100 80GB PCIe", "a100-80gb"), ("NVIDIA H100 80GB HBM3", "h100-80gb"),
    ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA H200", "h200"), ("NVIDIA H200 141GB HBM3e", "h200"), ("NVIDIA B200", "b200"),
    ("NVIDIA A30", "a30"), ("h100-94gb", "h100-94gb"), ("NVIDIA GH200 480GB", "gh200-96gb"),
    ("Tesla V100-SXM2-32GB", None)])
def test_find_model(name: str, key: str | None) -> None:
    m = find_model(name)
    assert (m.key if m else None) == key


def test_per_gpu_layouts_and_counts() -> None:
    m = find_model("a30")
    got = plan("4g.24gb;2x2g.12gb", m, 2)
    assert [len(g) for g in got] == [1, 2]
    with pytest.raises(UsageError, match="names 2 GPU layouts"):
        plan("4g.24gb;2x2g.12gb", m, 3)


def test_occupied_slices_block_placement() -> None:
    m = find_model("h100-80gb")
    with pytest.raises(UsageError, match="no valid placement with the node's existing"):
        plan_gpu([Request("4g.40gb")], m, occupied=frozenset({1}))
    got = plan_gpu([Request("3g.40gb")], m, occupied=frozenset({1}))
    assert got[0].start == 4


def test_ci_profile_entry() -> None:
    p = plan("1c.3g.40gb,4g.40gb", find_model("h100-80gb"))[0]
    ci = next(x for x in p if x.profile == "3g.40gb")
    assert (ci.ci_slices, ci.ci_profile, ci.name) == (1, 0, "1c.3g.40gb")


def test_parse_layout_syntax_only() -> None:
    assert parse_layout(" 2x1g.10gb , 1c.3g.40gb ") == [
        [Request("1g.10gb"), Request("1g.10gb"), Request("3g.40gb", 1)]]
    for bad in ("", "0x1g.10gb", "3g", "3g.40gb;", "1g.10gb+mex"):
        with pytest.raises(UsageError):
            parse_layout(bad)
