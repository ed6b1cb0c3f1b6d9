"""The values the SPANK plugin's C half passes on without starting Python."""
from __future__ import annotations

import re
import sys

import pytest

from slurm_gpu import joboptions as o
from slurm_gpu.errors import UsageError
from paths import ROOT


@pytest.mark.parametrize("opt", o.OPTIONS, ids=lambda x: x.name)
def test_canonical_values_are_what_python_passes_on_unchanged(opt) -> None:
    vals = o.c_canonical_values(opt.id)
    if opt.prolog:
        assert vals == ()            # the prolog gate is Python's to set
    for v in vals:
        assert o.validate_option(opt.id, v) == v


def test_numa_bind_and_profile_need_no_python_in_srun() -> None:
    assert set(o.c_canonical_values(o.NUMA_BIND)) == {
        "strict", "prefer", "off", "strict,verbose", "prefer,verbose", "off,verbose"}
    assert o.c_canonical_values(o.PROFILE) == ("training", "inference", "none")
    # what C must leave to Python: normalised forms and mistakes
    for v in ("verbose,prefer", " prefer", "verbose", "prefer,strict", "PREFER"):
        assert v not in o.c_canonical_values(o.NUMA_BIND)
    with pytest.raises(UsageError):
        o.validate_option(o.NUMA_BIND, "prefer,strict")


def test_header_carries_the_canonical_table() -> None:
    root = ROOT
    sys.path.insert(0, str(root / "spank"))
    try:
        import build_plugin
    finally:
        sys.path.pop(0)
    try:
        header = build_plugin.generate_header()
    except Exception as e:  # noqa: BLE001 - no slurm headers on this machine
        pytest.skip(f"no Slurm headers: {e}")
    m = re.search(r"#define SG_CANONICAL \{ (.*) \}", header)
    assert m
    assert '"prefer,verbose", ' in m.group(1) and '"inference", ' in m.group(1)
    assert m.group(1).count("NULL") == 2 + 2     # two tables end in NULL, MPS and MIG have none
