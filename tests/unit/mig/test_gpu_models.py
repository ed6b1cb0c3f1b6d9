"""GPU models and their MIG tables (slurm_gpu/data/gpu_models.json).

Ground truth is NVIDIA's own default MIG configs (copies in tests/data/mig,
see PROVENANCE.md): every layout gpu-operator's and mig-parted's default
config ships must plan on every model it applies to, with exactly the
instances it asks for; a model is identified by PCI device id first and
NVML name second, and an unknown one is refused, never planned with a
look-alike's table.
"""
from __future__ import annotations

import json

import pytest
import yaml

from slurm_gpu.cli import main
from slurm_gpu.errors import UsageError
from slurm_gpu.mig.planner import Request, plan, plan_gpu
from slurm_gpu.mig.profiles import (find_model, identify, model_by_pci, models, pci_device)
from slurm_gpu.paths import data_file
from test_mig_planner import enabled_layouts
from paths import ROOT

DATA = ROOT / "tests" / "data" / "mig"

# Profiles gpu-operator's default config ships in unfiltered all-* entries
# with no model named in a comment or a device filter, and that no NVIDIA
# table we have lists: we refuse them rather than guess a model.
UNATTRIBUTED = {"3g.95gb", "4g.95gb", "7g.189gb"}


def _configs() -> dict[str, dict]:
    op = yaml.safe_load((DATA / "gpu-operator-0400_configmap.yaml").read_text())
    return {"gpu-operator": yaml.safe_load(op["data"]["config.yaml"]),
            "mig-parted": yaml.safe_load((DATA / "mig-parted-config-default.yaml").read_text())}


def _cases() -> tuple[list[tuple[str, str, str, dict[str, int]]], list[tuple[str, str, str]]]:
    """(source, config, model key, mig-devices) per layout and model it applies to;
    and (source, config, profile) for each profile that applies to no model."""
    cases, orphans = [], []
    for src, cfg in _configs().items():
        for name, devs, filt in enabled_layouts(cfg):
            if filt:
                # A filter names models exactly: each of its ids must be one we know.
                targets = []
                for f in filt:
                    m = model_by_pci(f)
                    assert m is not None, f"{src} {name}: device {f} is no known model"
                    targets.append(m)
            else:
                # By the models' own names, not a board variant's second name.
                targets = [m for m in models() if all(p in {q.name for q in m.profiles} for p in devs)]
            if not targets:
                orphans += [(src, name, p) for p in devs]
            for m in dict.fromkeys(targets):
                cases.append((src, name, m.key, dict(devs)))
    return cases, orphans


CASES, ORPHANS = _cases()


def test_cases_cover_every_model_and_new_generations() -> None:
    covered = {k for _, _, k, _ in CASES}
    assert covered == {m.key for m in models()}
    assert {"gb200", "gh200-144gb", "gh200-96gb", "h20", "b300", "gb300",
            "rtx-pro-6000-bw"} <= covered


def test_only_known_unattributed_profiles_apply_to_no_model() -> None:
    assert {p for _, _, p in ORPHANS} == UNATTRIBUTED
    for m in models():
        for p in UNATTRIBUTED:
            with pytest.raises(UsageError, match="is not a MIG profile"):
                plan(p, m)


@pytest.mark.parametrize("src,name,key,devs", CASES,
                         ids=[f"{s}-{n}-{k}" for s, n, k, _ in CASES])
def test_default_config_layout_plans_exactly(src: str, name: str, key: str,
                                             devs: dict[str, int]) -> None:
    m = find_model(key)
    assert m is not None
    reqs = [Request(p) for p, n in devs.items() for _ in range(n)]
    placed = plan_gpu(reqs, m)
    # By the model's own name: a board variant's name (GB200's 1g.24gb) plans as its profile.
    assert sorted(p.profile for p in placed) == sorted(m.profile(r.profile).name for r in reqs)
    taken: set[int] = set()
    for p in placed:
        prof = m.profile(p.profile)
        assert p.start in prof.starts and p.size == prof.size
        span = set(range(p.start, p.start + p.size))
        assert not span & taken, f"overlap in {name} on {key}"
        assert max(span) < m.memory_slices
        taken |= span
    assert sum(m.profile(p.profile).slices for p in placed) <= m.compute_slices
    # The config's count is the most the GPU holds: one more never fits (all-* layouts).
    if name.startswith("all-") and len(devs) == 1 and name != "all-balanced":
        (prof, n), = devs.items()
        with pytest.raises(UsageError):
            plan_gpu(reqs + [Request(prof)], m)


def test_data_file_is_well_formed_and_sourced() -> None:
    doc = json.loads(data_file("gpu_models.json").read_text())
    assert doc["schema"] == 1
    seen_pci: dict[int, str] = {}
    seen_names: dict[str, str] = {}
    for m in models():
        prov = dict(m.provenance)
        assert set(prov) - {"aliases", "ci_sm"} == {"profiles", "memory_sm", "ids_placements", "pci_device_ids"}, m.key
        # Compute-instance SM counts are sourced (a real -lcip), and each one is a CI size the
        # GPU instance offers, smaller than it, with fewer SMs than the GPU instance has.
        assert any(p.ci_sm for p in m.profiles) == ("ci_sm" in prov), m.key
        for p in m.profiles:
            for ci, sms in p.ci_sm:
                assert ci in p.ci_sizes and ci < p.slices and p.sm_count and 0 < sms < p.sm_count, (m.key, p.name)
        # Every second name is sourced, names a profile of the model, and is no profile's own name.
        assert bool(m.aliases) == ("aliases" in prov), m.key
        for alias, name in m.aliases:
            assert m.profile(name) is not None and alias not in {p.name for p in m.profiles}
        assert all(prov.values())
        for x in m.pci_device_ids:
            assert x not in seen_pci, f"PCI 0x{x:04X} in {m.key} and {seen_pci[x]}"
            seen_pci[x] = m.key
        for n in m.product_names:
            assert n not in seen_names
            seen_names[n] = m.key
        assert m.pci_device_ids or m.product_names, m.key
        names = [p.name for p in m.profiles]
        assert len(set(names)) == len(names)
        for p in m.profiles:
            assert all(0 <= s and s + p.size <= m.memory_slices for s in p.starts), p.name
            assert p.instances <= len(p.starts)
            assert p.name.startswith(f"{p.slices}g.")


@pytest.mark.parametrize("pci,name,key", [
    # GB200 was planned with B200's table by the old name match ("b200" in "gb200").
    (0x294110DE, "NVIDIA GB200", "gb200"),
    (None, "NVIDIA GB200", "gb200"),
    (0x290110DE, "NVIDIA B200", "b200"),
    # PCI id first: a GH200 144G reporting the 96GB part's name is still the 144G.
    (0x234810DE, "NVIDIA GH200 480GB", "gh200-144gb"),
    (0x232910DE, "NVIDIA H20", "h20"),
    (0x318210DE, "", "b300"),
    (0x31C210DE, "", "gb300"),
    (0x2BB510DE, "NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000-bw"),
    (None, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000-bw"),
    (0x233010DE, "whatever", "h100-80gb"),
    ("0x233510DE", "", "h200"),
    (0x2335, "", "h200"),
])
def test_identify_pci_first_then_name(pci, name: str, key: str) -> None:
    m = identify(pci, name)
    assert m is not None and m.key == key


@pytest.mark.parametrize("pci,name", [
    (None, "NVIDIA H100 80GB HBM2e"),        # old fuzzy match: "h100" + "80gb"
    (None, "NVIDIA A100 96GB"),              # old fuzzy match: "a100"
    (None, "NVIDIA GB300"),                  # no published NVML name: PCI id only
    (None, "NVIDIA H200 NVL 2"),
    (0x1DB610DE, "Tesla V100-PCIE-32GB"),
    (0x233010AB, "other vendor"),            # not NVIDIA's vendor id
    (None, ""),
])
def test_unknown_models_are_refused(pci, name: str) -> None:
    assert identify(pci, name) is None


def test_pci_device_forms() -> None:
    assert pci_device(0x294110DE) == pci_device("0x294110DE") == pci_device(0x2941) == 0x2941
    assert pci_device(0x29411002) is None and pci_device(None) is None


def test_gb200_profiles_are_its_own(capsys) -> None:
    assert main(["mig", "plan", "7g.186gb", "--model", "0x294110DE"]) == 0
    assert "7g.186gb" in capsys.readouterr().out
    rc = main(["mig", "plan", "7g.180gb", "--model", "NVIDIA GB200"])
    err = capsys.readouterr().err
    assert rc == 2 and "not a MIG profile of the NVIDIA GB200" in err
    got = plan("2x1g.23gb,2g.47gb,3g.93gb", find_model("gb200"))[0]
    assert sorted((p.profile, p.start) for p in got) == [
        ("1g.23gb", 2), ("1g.23gb", 3), ("2g.47gb", 0), ("3g.93gb", 4)]


@pytest.mark.parametrize("model", ["NVIDIA H100 80GB HBM2e", "0x1DB6", "gh300", "NVIDIA GB300"])
def test_plan_cli_refuses_unknown_model_in_one_line(model: str, capsys) -> None:
    rc = main(["mig", "plan", "1g.10gb", "--model", model])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("slurm-gpu: unknown GPU model")
    assert "gb200" in err and "rtx-pro-6000-bw" in err and "(--model)" in err


def test_rtx_pro_suffixes_and_media_rule() -> None:
    m = find_model("rtx-pro-6000-bw")
    got = plan("1g.24gb+gfx,1g.24gb-me,2g.48gb", m)[0]
    # The driver's own grid (-lgipp): 12 units, a 1g at {0,3,6,9}:3, a 2g at {0,6}:6.
    assert sorted((p.profile, p.start, p.size) for p in got) == [
        ("1g.24gb+gfx", 6, 3), ("1g.24gb-me", 9, 3), ("2g.48gb", 0, 6)]
    assert {p.profile: p.gi_profile_id for p in got} == {"1g.24gb+gfx": 47, "1g.24gb-me": 67, "2g.48gb": 5}
    assert got[0].memory_mb is None    # the real tables disagree by driver: not guessed
    with pytest.raises(UsageError, match="media-extension"):
        plan("1g.24gb+me,1g.24gb+me.all", m)
    with pytest.raises(UsageError, match="at most"):
        plan("5x1g.24gb", m)


def test_rtx_pro_ids_are_the_real_lgip_table() -> None:
    # bigstack-oss/cubecos#312, bottlerocket-kernel-kit#300, container-engine-accelerators#563:
    # nvidia-smi mig -lgip on RTX PRO 6000 Blackwell Server Edition (0x2BB510DE).
    m = identify(0x2BB510DE, "")
    assert {p.name: (p.id, p.sm_count) for p in m.profiles} == {
        "1g.24gb": (14, 46), "1g.24gb+me": (21, 46), "1g.24gb+gfx": (47, 46), "1g.24gb+me.all": (65, 46),
        "1g.24gb-me": (67, 46), "2g.48gb": (5, 94), "2g.48gb+gfx": (35, 94), "2g.48gb+me.all": (64, 94),
        "2g.48gb-me": (66, 94), "4g.96gb": (0, 188), "4g.96gb+gfx": (32, 188)}
    assert [m.profile_by_id(i).name for i in (14, 5, 0)] == ["1g.24gb", "2g.48gb", "4g.96gb"]


def test_gb200_board_variant_names_are_known_and_others_refused() -> None:
    # gpu-operator#1303 (a GB200 board naming 1g.24gb) and mig-parted#227 (production: 1g.23gb).
    m = identify(0x294110DE, "NVIDIA GB200")
    assert m.profile("1g.24gb") is m.profile("1g.23gb") and m.profile("1g.24gb").id == 19
    assert m.profile("1g.24gb+me").id == 20
    got = plan("1g.24gb,2g.47gb", m)[0]
    assert sorted((p.profile, p.gi_profile_id) for p in got) == [("1g.23gb", 19), ("2g.47gb", 14)]
    for bad in ("1g.22gb", "1g.24gb+gfx", "2g.48gb"):
        with pytest.raises(UsageError, match="is not a MIG profile"):
            plan(bad, m)
    # Another model does not learn GB200's variant names.
    with pytest.raises(UsageError, match="is not a MIG profile"):
        plan("1g.24gb", find_model("b200"))


def test_profiles_cli_lists_provenance(capsys) -> None:
    assert main(["mig", "profiles", "--model", "gb200"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gb200: NVIDIA GB200") and "PCI 0x2941" in out
    assert "7g.186gb" in out and "# profiles:" in out and "mig-parted" in out
