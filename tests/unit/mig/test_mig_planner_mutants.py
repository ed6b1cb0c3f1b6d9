"""Issue 24 §8: the MIG planner's placements, caps and error lines, pinned exactly.

Mutation testing (mutmut, docs/development.md) found ``Placement.to_dict``
untested, the 64-entry and 1,024-character caps of ``parse_layout`` (a
user's ``--gpu-mig`` value) never reached, and most error lines free to
change.  A user reads those lines: they are compared whole here.
"""
from __future__ import annotations

import pytest

from slurm_gpu.errors import UsageError
from slurm_gpu.mig.planner import MAX_ENTRIES, Placement, Request, layout_text, parse_layout, plan, plan_gpu
from slurm_gpu.mig.profiles import find_model

H100 = find_model("h100-80gb")
A30 = find_model("a30")
GH200 = find_model("gh200-96gb")


def error(fn, *args, **kw) -> str:
    with pytest.raises(UsageError) as e:
        fn(*args, **kw)
    return e.value.line()


# ------------------------------------------------------------ parse_layout

def test_the_entry_cap_counts_every_instance_of_one_gpu():
    assert MAX_ENTRIES == 64
    assert parse_layout("64x1g.10gb") == [[Request("1g.10gb")] * 64]
    assert parse_layout("60x1g.10gb,4x2g.20gb") == [[Request("1g.10gb")] * 60 + [Request("2g.20gb")] * 4]
    for text in ("65x1g.10gb", "60x1g.10gb,5x2g.20gb", "64x1g.10gb,1g.10gb"):
        assert error(parse_layout, text) == "slurm-gpu: MIG layout has too many instances (--gpu-mig)"
    # the cap is per GPU layout
    assert [len(g) for g in parse_layout("64x1g.10gb;64x1g.10gb")] == [64, 64]


def test_the_length_cap_is_1024_characters():
    at_cap = " " * 1017 + "1g.10gb"
    assert len(at_cap) == 1024 and parse_layout(at_cap) == [[Request("1g.10gb")]]
    assert error(parse_layout, " " + at_cap) == "slurm-gpu: MIG layout too long (--gpu-mig)"
    # refused before any work: a huge count is not expanded
    assert error(parse_layout, "9" * 1100 + "x1g.10gb") == "slurm-gpu: MIG layout too long (--gpu-mig)"


@pytest.mark.parametrize("text,line", [
    ("", "slurm-gpu: empty MIG layout (--gpu-mig)"),
    (" \t", "slurm-gpu: empty MIG layout (--gpu-mig)"),
    (None, "slurm-gpu: empty MIG layout (--gpu-mig)"),
    ("0x1g.10gb", "slurm-gpu: bad count in MIG layout entry '0x1g.10gb' (--gpu-mig)"),
    ("0c.3g.40gb", "slurm-gpu: bad compute-instance size in MIG layout entry '0c.3g.40gb' (--gpu-mig)"),
    ("3g.40gb,,1g.10gb", "slurm-gpu: bad MIG layout entry '(empty)': expected e.g. 3g.40gb, 2x1g.10gb or "
                         "1c.3g.40gb (--gpu-mig)"),
    (" 3G.40GB , Bogus ", "slurm-gpu: bad MIG layout entry 'Bogus': expected e.g. 3g.40gb, 2x1g.10gb or "
                          "1c.3g.40gb (--gpu-mig)"),
])
def test_parse_layout_error_lines(text, line):
    assert error(parse_layout, text) == line


def test_parse_layout_reads_counts_ci_sizes_and_suffixes():
    assert parse_layout(" 2X1G.10GB , 1c.3g.40gb;1g.10gb+me,1g.12gb+me.all,1g.10gb-me,1g.24gb+gfx ") == [
        [Request("1g.10gb"), Request("1g.10gb"), Request("3g.40gb", 1)],
        [Request("1g.10gb+me"), Request("1g.12gb+me.all"), Request("1g.10gb-me"), Request("1g.24gb+gfx")]]
    assert parse_layout("1x3g.40gb") == [[Request("3g.40gb")]]


def test_layout_text_folds_runs():
    reqs = [Request("1g.10gb")] * 3 + [Request("3g.40gb", 1), Request("3g.40gb", 1), Request("1g.10gb")]
    assert layout_text(reqs) == "3x1g.10gb,2x1c.3g.40gb,1g.10gb"
    assert layout_text([]) == ""
    assert Request("3g.40gb", 2).text == "2c.3g.40gb" and Request("3g.40gb").text == "3g.40gb"


# ------------------------------------------------------------ placements

def test_placements_are_exactly_these():
    got = plan("1c.3g.40gb,2x2g.20gb", H100)[0]
    assert [p.to_dict() for p in got] == [
        {"profile": "3g.40gb", "name": "1c.3g.40gb", "gi_profile_id": 9, "start": 4, "size": 4, "ci_slices": 1,
         "ci_profile": 0, "ci_start": 0, "memory_mb": 40448, "sm_count": None},
        {"profile": "2g.20gb", "name": "2g.20gb", "gi_profile_id": 14, "start": 0, "size": 2, "ci_slices": 2,
         "ci_profile": 1, "ci_start": 0, "memory_mb": 20096, "sm_count": 32},
        {"profile": "2g.20gb", "name": "2g.20gb", "gi_profile_id": 14, "start": 2, "size": 2, "ci_slices": 2,
         "ci_profile": 1, "ci_start": 0, "memory_mb": 20096, "sm_count": 32},
    ]
    assert got[0] == Placement("3g.40gb", 9, 2, 4, 4, 1, 0, 0, 40448, None)


def test_a_whole_gpu_and_a_model_without_published_sizes():
    assert [p.to_dict() for p in plan("7g.96gb", GH200)[0]] == [
        {"profile": "7g.96gb", "name": "7g.96gb", "gi_profile_id": 0, "start": 0, "size": 8, "ci_slices": 7,
         "ci_profile": 4, "ci_start": 0, "memory_mb": None, "sm_count": None}]
    p = plan("2c.4g.40gb", H100)[0][0]
    assert (p.name, p.ci_slices, p.ci_profile, p.sm_count) == ("2c.4g.40gb", 2, 1, None)
    # a compute instance's SMs: what a real -lcip lists for its size (A100 80GB), else
    # none (no H100 -lcip lists 1c.7g.94gb), never a share of the GPU instance's
    p = plan("2c.3g.40gb", find_model("a100-80gb"))[0][0]
    assert (p.name, p.sm_count) == ("2c.3g.40gb", 28) and type(p.sm_count) is int
    p = plan("1c.7g.94gb", find_model("h100-nvl"))[0][0]
    assert (p.name, p.sm_count) == ("1c.7g.94gb", None)
    assert len(plan("1g.10gb", H100)) == 1                                        # one GPU unless told


def test_largest_profiles_are_placed_first_and_ties_keep_request_order():
    got = plan("1g.10gb,1g.20gb,2g.20gb,2g.20gb", H100)[0]
    assert [(p.profile, p.start) for p in got] == [("1g.10gb", 6), ("1g.20gb", 4), ("2g.20gb", 0), ("2g.20gb", 2)]


def test_occupied_slices_are_avoided():
    got = plan_gpu([Request("1g.10gb"), Request("1g.10gb")], H100, occupied=frozenset({0, 1, 5}))
    assert [p.start for p in got] == [2, 3]
    assert plan("2g.20gb", H100, 2, occupied=[frozenset({0, 1}), frozenset({0, 1, 2, 3})]) == [
        [Placement("2g.20gb", 14, 1, 2, 2, 2, 1, 0, 20096, 32)],
        [Placement("2g.20gb", 14, 1, 4, 2, 2, 1, 0, 20096, 32)]]


# ------------------------------------------------------------ plan errors

@pytest.mark.parametrize("layout,line", [
    ("3g.41gb", "slurm-gpu: 3g.41gb is not a MIG profile of the NVIDIA H100 80GB (SXM5) (valid: 1g.10gb, "
                "1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb) (--gpu-mig)"),
    ("5c.3g.40gb", "slurm-gpu: 5c.3g.40gb: a 3g.40gb instance takes compute instances of 1c, 2c, 3c (--gpu-mig)"),
    ("8x1g.10gb", "slurm-gpu: MIG layout 8x1g.10gb asks for 8 x 1g.10gb; the NVIDIA H100 80GB (SXM5) has "
                  "room for at most 7 (--gpu-mig)"),
    ("2x4g.40gb", "slurm-gpu: MIG layout 2x4g.40gb asks for 2 x 4g.40gb; the NVIDIA H100 80GB (SXM5) has "
                  "room for at most 1 (--gpu-mig)"),
    ("4g.40gb,2g.20gb,2g.20gb", "slurm-gpu: MIG layout 4g.40gb,2x2g.20gb needs 8 compute slices; the NVIDIA H100 "
                                "80GB (SXM5) has 7 (--gpu-mig)"),
    ("3g.40gb,3g.40gb,1g.10gb", "slurm-gpu: MIG layout 2x3g.40gb,1g.10gb needs 9 of 8 memory slices; 8 are free "
                                "(--gpu-mig)"),
    ("4x1g.20gb,1g.10gb", "slurm-gpu: MIG layout 4x1g.20gb,1g.10gb needs 9 of 8 memory slices; 8 are free "
                          "(--gpu-mig)"),
])
def test_plan_error_lines(layout, line):
    assert error(plan, layout, H100) == line


def test_media_extensions_one_per_gpu():
    # A30: 1g.6gb+me and 2g.12gb+me are both media instances (one engine per GPU)
    assert error(plan, "1g.6gb+me,2g.12gb+me", A30) == (
        "slurm-gpu: MIG layout 1g.6gb+me,2g.12gb+me has 2 media-extension (+me) instances; a GPU has one (--gpu-mig)")
    assert [p.profile for p in plan("1g.6gb+me,2g.12gb", A30)[0]] == ["1g.6gb+me", "2g.12gb"]


def test_exactly_full_gpus_fit():
    assert [p.start for p in plan("4g.40gb,3g.40gb", H100)[0]] == [0, 4]          # 7 of 7 compute slices
    assert len(plan("4x1g.20gb", H100)[0]) == 4                                   # 8 of 8 memory slices
    assert [p.start for p in plan_gpu([Request("2g.20gb")] * 3, H100, occupied=frozenset({6, 7}))] == [0, 2, 4]
    assert error(plan_gpu, [Request("4g.40gb"), Request("1g.10gb")], H100, occupied=frozenset({7, 6, 5, 4})) == (
        "slurm-gpu: MIG layout 4g.40gb,1g.10gb needs 5 of 8 memory slices; 4 are free (--gpu-mig)")
    assert error(plan_gpu, [Request("4g.40gb")], H100, occupied=frozenset({1}), where="job 7") == (
        "slurm-gpu: MIG layout 4g.40gb has no valid placement with the node's existing instances on the NVIDIA "
        "H100 80GB (SXM5) (4g.40gb at {0}:4) (job 7)")


def test_no_placement_names_every_profiles_starts_largest_first():
    assert error(plan_gpu, [Request("1g.10gb"), Request("2g.20gb")], H100, occupied=frozenset({1, 3, 5})) == (
        "slurm-gpu: MIG layout 1g.10gb,2g.20gb has no valid placement with the node's existing instances on the "
        "NVIDIA H100 80GB (SXM5) (2g.20gb at {0,2,4}:2; 1g.10gb at {0,1,2,3,4,5,6}:1) (--gpu-mig)")


def test_per_gpu_layout_count_must_match():
    assert error(plan, "4g.24gb;2x2g.12gb", A30, 3) == (
        "slurm-gpu: MIG layout names 2 GPU layouts but the job has 3 GPU(s) here (--gpu-mig)")
    assert [len(g) for g in plan("2g.12gb", A30, 3)] == [1, 1, 1]
    assert [[p.start for p in g] for g in plan("4g.24gb;2x2g.12gb", A30, 2)] == [[0], [0, 2]]
