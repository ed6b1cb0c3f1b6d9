"""Issue 24 §8: the hostlist/range helpers' results, caps and error lines, pinned exactly.

Mutation testing (mutmut, docs/development.md) found the expansion cap
never reached (the fuzz test's 40-character inputs stay far below it), the
``/dev/nvidia8..11`` folding of gres.conf File= ranges unpinned (no fixture
has more than 8 GPUs) and the error lines free to change.
"""
from __future__ import annotations

import pytest
from ClusterShell.NodeSet import NodeSet
from ClusterShell.RangeSet import RangeSet
from fuzzlib import outcome
from test_gres_generate import lines, make_node

from slurm_gpu.confgen import render_gres_conf
from slurm_gpu.confgen import hostlist as hl
from slurm_gpu.errors import InputError

CAP = hl.MAX_EXPANSION


def error(fn, *args) -> str:
    with pytest.raises(InputError) as e:
        fn(*args)
    return e.value.line()


def test_the_cap_is_2_to_the_17():
    assert CAP == 131072


def test_ranges_at_the_cap_expand_and_one_more_is_one_line():
    assert hl.parse_int_ranges(f"0-{CAP - 1}") == tuple(range(CAP))
    assert error(hl.parse_int_ranges, f"0-{CAP}", "Cores") == (
        f"slurm-gpu: range '0-{CAP}' expands to {CAP + 1} entries (at most {CAP}) (Cores)")
    assert error(hl.parse_int_ranges, f"[0-{CAP}]") == (
        f"slurm-gpu: range '[0-{CAP}]' expands to {CAP + 1} entries (at most {CAP})")


def test_hostlists_and_file_lists_past_the_cap_are_one_line():
    # len() of a NodeSet is computed without expanding it, so these are cheap
    assert error(hl.expand, f"n[1-{CAP + 1}]", "NodeName") == (
        f"slurm-gpu: hostlist 'n[1-{CAP + 1}]' expands to {CAP + 1} entries (at most {CAP}) (NodeName)")
    assert error(hl.expand, f"n[1-{CAP + 1}]") == (
        f"slurm-gpu: hostlist 'n[1-{CAP + 1}]' expands to {CAP + 1} entries (at most {CAP})")
    assert error(hl.expand_files, f"/dev/nvidia[0-{CAP}]", "File") == (
        f"slurm-gpu: file list '/dev/nvidia[0-{CAP}]' expands to {CAP + 1} entries (at most {CAP}) (File)")
    long = "n[1-999999]" + "x" * 100
    assert error(hl.expand, long)[:60] == f"slurm-gpu: hostlist {long[:60]!r}"[:60]


@pytest.mark.parametrize("fn,text,what,n", [
    (hl.expand, "n[1-99999999]", "hostlist", 99999999), (hl.expand, "n[0-9],m[0-2000000]", "hostlist", 2000011),
    (hl.parse_int_ranges, "0-99999999", "range", 10 ** 8),
    (hl.expand_files, "/dev/nvidia[0-99999999]", "file list", 10 ** 8),
    (lambda t, w: hl.fold(t.split(","), w), "a-b,n[1-99999999]", "host names", 99999999),
    (hl.expand, "1[-1000000]", "hostlist", 11000000), (hl.expand, "n1[0-9999999]", "hostlist", 19999990),
])
def test_a_huge_range_is_refused_before_clustershell_builds_it(fn, text, what, n):
    """These took 112-157 s of CPU each: ClusterShell builds every number of a range before the
    cap can be checked.  Now they are one line at once (fuzzlib's 5 s CPU check fails a hang)."""
    got = outcome(fn, text, "X")
    assert isinstance(got, InputError)
    assert got.line() == f"slurm-gpu: {what} {text!r} spans {n} numbers (at most 1048576 are read) (X)"


def test_only_brackets_hold_ranges_in_a_node_set():
    # names with dashes between numbers are names; 8x the cap of ranges is still read exactly
    assert hl.fold(["IBLEAF-0-1048576", "a-b"]) == "IBLEAF-0-1048576,a-b"
    assert hl.expand("IBLEAF-0-99999999") == ["IBLEAF-0-99999999"]
    assert error(hl.expand, f"n[1-{8 * CAP}]") == (
        f"slurm-gpu: hostlist 'n[1-{8 * CAP}]' expands to {8 * CAP} entries (at most {CAP})")
    assert error(hl.expand, f"n[1-{8 * CAP + 1}]") == (
        f"slurm-gpu: hostlist 'n[1-{8 * CAP + 1}]' spans {8 * CAP + 1} numbers (at most {8 * CAP} are read)")
    assert error(hl.parse_int_ranges, f"0-{8 * CAP - 1},{8 * CAP}-{8 * CAP + 5}/5") == (
        f"slurm-gpu: range '0-{8 * CAP - 1},{8 * CAP}-{8 * CAP + 5}/5' spans {8 * CAP + 2} numbers (at most "
        f"{8 * CAP} are read)")


def test_a_hostlist_at_the_cap_expands():
    names = hl.expand(f"n[1-{CAP}]")
    assert (len(names), names[0], names[-1]) == (CAP, "n1", f"n{CAP}")


def test_expand_results():
    assert hl.expand("gpu[001-003],gpu010") == ["gpu001", "gpu002", "gpu003", "gpu010"]
    assert hl.expand("") == []
    bad = error(hl.expand, "gpu[1-", "NodeName")
    assert bad.startswith("slurm-gpu: bad hostlist 'gpu[1-': ") and bad.endswith(" (NodeName)")


def test_fold_results():
    assert hl.fold(["gpu002", "gpu001", "gpu003", "gpu010"]) == "gpu[001-003,010]"
    assert hl.fold(["rack1n1", "rack1n2", "rack2n1", "rack2n2"]) == "rack1n[1-2],rack2n[1-2]"
    assert hl.fold(["gpu9", "gpu10", "gpu09"]) == "gpu[9,09-10]"      # ClusterShell keeps each padding
    assert hl.fold(["a-b", "gpu1"]) == "a-b,gpu1"          # not all "prefix<digits>": ClusterShell's fromlist
    assert hl.fold([]) == ""
    head = "slurm-gpu: cannot fold host names (longest 'n" + "1" * 59 + "'): "
    bad = error(hl.fold, ["n" + "1" * 5000, "n2"])
    assert bad.startswith(head) and len(bad) == len(head) + 80      # ClusterShell's words, cut at 80
    assert error(hl.fold, ["gpu[1"], "topology")[-11:] == " (topology)"


def test_int_ranges_round_trip():
    assert hl.int_ranges([8, 3, 2, 1, 0, 3]) == "0-3,8"
    assert hl.int_ranges([]) == ""
    assert hl.int_ranges([5]) == "5"
    assert hl.parse_int_ranges(" 0-3,8 ") == (0, 1, 2, 3, 8)
    assert hl.parse_int_ranges("[0-3,8]") == (0, 1, 2, 3, 8)
    assert hl.parse_int_ranges("[]") == () and hl.parse_int_ranges("  ") == ()
    assert hl.parse_int_ranges("8,0-1") == (0, 1, 8)
    bad = error(hl.parse_int_ranges, "[0-3", "Cores")
    assert bad.startswith("slurm-gpu: bad range '[0-3': ") and bad.endswith(" (Cores)")
    assert error(hl.parse_int_ranges, "x")[:len("slurm-gpu: bad range 'x': ")] == "slurm-gpu: bad range 'x': "


def test_natural_key():
    assert hl.natural_key("gpu010b2") == ("gpu", (2, "10"), "b", (1, "2"), "")
    assert hl.natural_key("000") == ("", (0, ""), "")
    assert sorted(["gpu10", "gpu2", "gpu[001-002]", "gpu003"], key=hl.natural_key) == [
        "gpu2", "gpu003", "gpu10", "gpu[001-002]"]


# ------------------------------------------------------------ gres.conf File=

@pytest.mark.parametrize("paths,folded", [
    (["/dev/nvidia3"], "/dev/nvidia3"),
    (["/dev/nvidia0", "/dev/nvidia1"], "/dev/nvidia[0-1]"),
    ([f"/dev/nvidia{i}" for i in range(8, 12)], "/dev/nvidia[8-11]"),
    ([f"/dev/nvidia{i}" for i in range(12)], "/dev/nvidia[0-11]"),
    (["/dev/nvidia10", "/dev/nvidia8", "/dev/nvidia9"], "/dev/nvidia[8-10]"),
    (["/dev/nvidia0", "/dev/nvidia2", "/dev/nvidia10"], "/dev/nvidia[0,2,10]"),
    (["/dev/nvidia0", "/dev/nvidia01"], "/dev/nvidia0,/dev/nvidia01"),      # a padded number stays itself
    (["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21"], "/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21"),
    (["/dev/nvidia0", "/dev/nvidiactl"], "/dev/nvidia0,/dev/nvidiactl"),
    (["/dev/nvidiactl", "/dev/nvidia0"], "/dev/nvidiactl,/dev/nvidia0"),
])
def test_fold_files(paths, folded):
    assert hl.fold_files(paths) == folded
    assert sorted(hl.expand_files(folded)) == sorted(paths)


def test_expand_files():
    assert hl.expand_files("/dev/nvidia[8-11],/dev/x") == (
        "/dev/nvidia8", "/dev/nvidia9", "/dev/nvidia10", "/dev/nvidia11", "/dev/x")
    assert hl.expand_files("/dev/a,,/dev/b,") == ("/dev/a", "/dev/b")
    assert hl.expand_files("/dev/nvidia[0-8/2]") == ("/dev/nvidia0", "/dev/nvidia2", "/dev/nvidia4", "/dev/nvidia6",
                                                     "/dev/nvidia8")
    bad = error(hl.expand_files, "/dev/nvidia[0-", "File")
    assert bad.startswith("slurm-gpu: bad file list '/dev/nvidia[0-': ") and bad.endswith(" (File)")


def test_twelve_gpus_fold_past_nvidia9():
    text = render_gres_conf({"n1": make_node(gpus=12, nvswitch=False)})
    assert lines(text) == [
        "NodeName=n1 Name=gpu Type=nvidia_h100_80gb_hbm3 File=/dev/nvidia[0-5] Cores=0-3",
        "NodeName=n1 Name=gpu Type=nvidia_h100_80gb_hbm3 File=/dev/nvidia[6-11] Cores=4-7",
    ]


def _clustershell_words(fn, text: str) -> str:
    """What ClusterShell itself says about *text*, as our line quotes it (cut at 80)."""
    try:
        fn(text)
    except Exception as e:  # noqa: BLE001 - ClusterShell raises several types
        return str(e)[:80]
    raise AssertionError(f"ClusterShell accepted {text!r}")


@pytest.mark.parametrize("fn,what,text,cs", [
    (hl.expand, "bad hostlist", "n[" + "1" * 5000 + "]", NodeSet),
    (hl.parse_int_ranges, "bad range", "1" * 5000, RangeSet),
    (hl.expand_files, "bad file list", "/dev/nvidia[" + "1" * 5000 + "]", lambda t: NodeSet(t, autostep=None)),
])
def test_error_lines_quote_60_characters_and_80_of_clustershells_words(fn, what, text, cs):
    words = _clustershell_words(cs, text)
    assert len(words) == 80
    assert error(fn, text, "W") == f"slurm-gpu: {what} {text[:60]!r}: {words} (W)"
    assert error(fn, text) == f"slurm-gpu: {what} {text[:60]!r}: {words}"


def test_cap_lines_quote_60_characters():
    text = "n[1-200000]" + ",m1" * 30
    assert error(hl.expand, text) == f"slurm-gpu: hostlist {text[:60]!r} expands to 200001 entries (at most {CAP})"


def test_a_bracket_on_one_side_only_is_no_range():
    for text in ("5]", "0-3]", "[0-3"):
        assert error(hl.parse_int_ranges, text).startswith(f"slurm-gpu: bad range {text!r}: ")


def test_bounds_of_18_characters_are_counted_and_longer_ones_are_not():
    lo, hi = "1" + "0" * 17, "9" * 18
    assert error(hl.expand, f"n[{lo}-{hi}]") == (
        f"slurm-gpu: hostlist 'n[{lo}-{hi}]' spans {int(hi) - int(lo) + 1} numbers (at most {8 * CAP} are read)")
    padded = "0" * 18 + "1"                    # 19 characters: left to ClusterShell (which refuses the padding)
    assert error(hl.expand, f"n[{padded}-{8 * CAP + 1}]").startswith(f"slurm-gpu: bad hostlist 'n[{padded}-")


def test_bounds_of_19_digits_are_left_to_clustershell():
    # int() refuses 4,300 digits and more: a long lower bound is ClusterShell's to refuse, in one line
    for fn, what in ((hl.parse_int_ranges, "bad range"), (hl.expand, "bad hostlist"),
                     (hl.expand_files, "bad file list")):
        text = "9" * 5001 + "0-51" if fn is hl.parse_int_ranges else "n[" + "9" * 5001 + "0-51]"
        assert error(fn, text).startswith(f"slurm-gpu: {what} {text[:60]!r}: ")
    assert error(hl.expand, "n[0-" + "9" * 19 + "]") == (
        "slurm-gpu: bad hostlist 'n[0-9999999999999999999]': range too large")
    assert error(hl.expand, "n[0-" + "9" * 18 + "]") == (
        "slurm-gpu: hostlist 'n[0-999999999999999999]' spans 1000000000000000000 numbers (at most 1048576 are read)")


def test_spans_count_every_range_exactly():
    threshold = 8 * CAP
    assert error(hl.expand, "n[0-2000000/0]") == (
        f"slurm-gpu: hostlist 'n[0-2000000/0]' spans 2000001 numbers (at most {threshold} are read)")   # step 0 is 1
    text = f"0-{threshold - 1},7-7"
    assert error(hl.parse_int_ranges, text) == (
        f"slurm-gpu: range {text!r} spans {threshold + 1} numbers (at most {threshold} are read)")
    text = "0-99999999" + ",1" * 30
    assert error(hl.parse_int_ranges, text) == (
        f"slurm-gpu: range {text[:60]!r} spans 100000000 numbers (at most {threshold} are read)")
