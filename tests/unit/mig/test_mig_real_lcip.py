"""Compute instances against real ``nvidia-smi mig -lcip`` tables.

Every `-lcip` row of a capture in tests/data/mig (lcip-real-ampere.md, with
provenance per section) whose model is named must be what the MIG tables
plan: the GPU instance profile, the compute-instance profile id NVML gives
that CI size, as many CIs of that size as the driver offers, and the CI's
SM count.  A CI size no capture lists has no SM count (null), never a share
of the GPU instance's guessed: on Hopper the shares are not even (a 2g.20gb
offers a 1-slice CI of 16 SMs and another of 26, go-nvml issue 146)."""
from __future__ import annotations

import re

import pytest

from slurm_gpu.mig.planner import plan
from slurm_gpu.mig.profiles import CI_PLACEMENTS, CIP_BY_SLICES, find_model

from test_mig_real_lgip import sections

# |   0      2       MIG 1c.2g.12gb       0      0/2           14        2 ...
CI_ROW = re.compile(r"^\|\s+\d+\s+\d+\s+MIG (?:(\d+)c\.)?(\S+)\s+(\d+)\*?\s+\d+/(\d+)\s+(\d+)\s", re.M)


def _lcip() -> list[tuple[str, str, list[tuple[int | None, str, int, int, int]]]]:
    out = []
    for where, key, sec in sections():
        rows = [(int(c) if c else None, g, int(p), int(t), int(s)) for c, g, p, t, s in CI_ROW.findall(sec)]
        if key and rows:
            out.append((where, key, rows))
    return out


LCIP = _lcip()


def test_the_lcip_captures_cover_the_ampere_boards():
    assert {key for _, key, _ in LCIP} == {"a30", "a100-40gb", "a100-80gb"}
    assert sum(len(rows) for _, _, rows in LCIP) == 18
    # the Hopper rows (section Q) name no GPU: they are read, and go into no table
    hopper = [sec for where, key, sec in sections() if where.endswith(":Q")]
    assert len(hopper) == 1 and len(CI_ROW.findall(hopper[0])) == 2


@pytest.mark.parametrize("where,key,rows", LCIP, ids=[c[0] for c in LCIP])
def test_compute_instances_equal_the_real_lcip(where, key, rows):
    model = find_model(key)
    assert model is not None, key
    for ci, gi_name, ci_profile, total, sms in rows:
        gi = model.profile(gi_name)
        assert gi is not None, f"{where}: {gi_name} is not a {key} profile"
        size = ci or gi.slices
        assert CIP_BY_SLICES[size] == ci_profile, f"{where}: {size}c profile id"
        assert len(CI_PLACEMENTS[gi.slices][size]) == total, f"{where}: {size}c instances in {gi_name}"
        (placement,) = plan(f"{size}c.{gi_name}" if ci else gi_name, model)[0]
        assert (placement.ci_slices, placement.ci_profile, placement.sm_count) == (size, ci_profile, sms), where


@pytest.mark.parametrize("key,layout", [
    ("h100-80gb", "1c.3g.40gb"), ("h100-80gb", "2c.4g.40gb"), ("h100-nvl", "1c.7g.94gb"),
    ("h200", "3c.7g.141gb"), ("a100-40gb", "1c.7g.40gb"), ("a100-80gb", "3c.7g.80gb")])
def test_a_compute_instance_no_capture_lists_has_no_sm_count(key, layout):
    (p,) = plan(layout, find_model(key))[0]
    assert p.sm_count is None, (layout, p.sm_count)
    whole = plan(layout.split(".", 1)[1], find_model(key))[0][0]
    assert whole.sm_count == find_model(key).profile(whole.profile).sm_count    # the whole GI: -lgip's
