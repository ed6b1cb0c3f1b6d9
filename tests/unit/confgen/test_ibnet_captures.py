"""ibnetdiscover dumps as admins capture them: ``-g`` headers, ``2>&1`` warnings.

What ibnetdiscover itself prints besides the topology (linux-rdma/rdma-core
``infiniband-diags/ibnetdiscover.c`` and libibnetdisc) is skipped and named
in a note; anything else is still refused: a truncated or redacted dump, a
warning in the middle of the records, and ``-p`` (ports report) output.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from fuzzlib import fuzz_settings, mutated
from hypothesis import given
from hypothesis import strategies as st

from machinedata import ROOT
from slurm_gpu.cli import main
from slurm_gpu.confgen import ibnet
from slurm_gpu.errors import InputError

DATA = ROOT / "tests" / "data" / "ibnetdiscover"
DUMP = DATA / "topograph-example.out"
GROUPED = DATA / "grouped-chassis.out"
TEXT = DUMP.read_text()
# real libibnetdisc warnings (tests/data/ibnetdiscover/PROVENANCE.md)
WARNINGS = ("src/query_smp.c:199; umad (DR path slid 0; dlid 0; 0,1,19,5,18 Attr 0x11:0) bad status 110; "
            "Connection timed out\n"
            "src/query_smp.c:195; umad (DR path slid 0; dlid 0; 0,1,13,9,15 Attr 0x11:0) bad status 110; "
            "Connection timed out\n"
            "ibwarn: [1685596] mad_rpc_open_port: client_register for mgmt 1 failed\n")
# where dump_topology() prints "\nNon-Chassis Nodes\n": after the header, before the first switch
_FIRST = TEXT.index("\nvendid=")
GROUPED_PLAIN = TEXT[:_FIRST] + "\nNon-Chassis Nodes\n" + TEXT[_FIRST:]


def nodes_of(text: str, tmp_path: Path, name: str = "dump.out") -> dict[str, ibnet.IbNode]:
    """Both ways in: parse() of the text and parse_file() of it written out must agree."""
    p = tmp_path / name
    p.write_text(text)
    whole = ibnet.parse(text, str(p))
    from_file = ibnet.parse_file(str(p))
    assert whole.nodes == from_file.nodes and whole.notes == from_file.notes
    return from_file.nodes


def test_warnings_captured_with_2_and_1_are_skipped_and_noted(tmp_path: Path) -> None:
    p = tmp_path / "fabric.out"
    p.write_text(WARNINGS + TEXT)
    fab = ibnet.parse_file(str(p))
    assert fab.nodes == ibnet.parse(TEXT, "plain").nodes
    assert fab.notes == (
        f"{p}: skipped 3 lines of ibnetdiscover's own output that are not topology: "
        "lines 1-3 (libibnetdisc/libibmad warnings printed before the dump: "
        "'src/query_smp.c:199; umad (DR path slid 0; dlid 0; 0,1,19,5,18 Attr 0x11:0) bad status 110; "
        "Connection timed out' ...)",)
    assert nodes_of(WARNINGS + TEXT, tmp_path) == fab.nodes


def test_grouped_dump_without_chassis(tmp_path: Path) -> None:
    fab_nodes = nodes_of(GROUPED_PLAIN, tmp_path)
    assert fab_nodes == ibnet.parse(TEXT, "plain").nodes
    p = tmp_path / "g.out"
    p.write_text(GROUPED_PLAIN)
    line = GROUPED_PLAIN[:GROUPED_PLAIN.index("Non-Chassis")].count("\n") + 1
    assert ibnet.parse_file(str(p)).notes == (
        f"{p}: skipped 1 line of ibnetdiscover's own output that is not topology: "
        f"line {line} ('Non-Chassis Nodes', ibnetdiscover -g)",)


def _ungrouped(text: str) -> str:
    """The same fabric as ibnetdiscover prints it without -g (no chassis headers, no [ext N])."""
    import re
    keep = [l for l in text.splitlines(True) if not re.match(r"(Chassis \d+|Non-Chassis Nodes)", l)]
    return re.sub(r"\[ext \d+\]", "", "".join(keep))


def test_grouped_dump_with_a_chassis(tmp_path: Path) -> None:
    text = GROUPED.read_text()
    got = nodes_of(text, tmp_path)
    assert got == ibnet.parse(_ungrouped(text), "plain").nodes
    assert got["S-0002c90200000201"].ports == ((1, "H-0002c90300000010", 1), (2, "H-0002c90300000020", 1),
                                               (19, "S-0002c90200000101", 1))
    assert got["S-7cfe900300aa0001"].port(1) == (1, "S-0002c90200000202", 2)
    assert len(got) == 8
    fab = ibnet.parse_file(str(GROUPED))
    assert fab.notes == (
        f"{GROUPED}: skipped 2 lines of ibnetdiscover's own output that are not topology: "
        "line 6 ('Chassis 1 (guid 0x2c90200000100)', ibnetdiscover -g), "
        "line 38 ('Non-Chassis Nodes', ibnetdiscover -g)",)


def test_topology_render_reads_a_capture_and_says_what_it_skipped(tmp_path: Path, capsys) -> None:
    p = tmp_path / "fabric.out"
    p.write_text(WARNINGS + GROUPED_PLAIN)
    rc = main(["topology", "render", "--ibnetdiscover", str(p)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    plain = tmp_path / "plain.out"
    plain.write_text(TEXT)
    main(["topology", "render", "--ibnetdiscover", str(plain)])
    out_plain, _ = capsys.readouterr()
    assert out.replace(str(p), str(plain)) == out_plain
    assert (f"slurm-gpu: note: {p}: skipped 4 lines of ibnetdiscover's own output that are not topology: "
            "lines 1-3 (libibnetdisc/libibmad warnings") in err


@pytest.mark.parametrize("where", ["between records", "inside a record"])
def test_a_warning_in_the_middle_is_refused(tmp_path: Path, where: str) -> None:
    lines = TEXT.splitlines(True)
    at = lines.index("\n", 20) + (1 if where == "between records" else -2)
    bad = "".join(lines[:at] + [WARNINGS.splitlines(True)[0]] + lines[at:])
    with pytest.raises(InputError) as e:
        nodes_of(bad, tmp_path)
    assert e.value.where.endswith(f":{at + 1}")
    assert "unreadable line" in e.value.what


def test_a_header_inside_a_record_is_refused(tmp_path: Path) -> None:
    lines = GROUPED_PLAIN.splitlines(True)
    at = next(i for i, l in enumerate(lines) if l.startswith("[3]"))
    bad = "".join(lines[:at] + ["Non-Chassis Nodes\n"] + lines[at:])
    with pytest.raises(InputError) as e:
        nodes_of(bad, tmp_path)
    assert e.value.what == "ibnetdiscover dump: unreadable line" and e.value.where.endswith(f":{at + 1}")


def test_a_warning_like_line_not_from_ibnetdiscover_is_refused(tmp_path: Path) -> None:
    for line in ("src/query_smp.c:199; Prolog=/tmp/x\n", "src/evil.c:1; umad (x) bad status 110\n",
                 "ibwarn: something\n", "Chassis one\n", "Non-Chassis Nodes and more\n"):
        with pytest.raises(InputError) as e:
            nodes_of(line + TEXT, tmp_path)
        assert e.value.where.endswith(":1"), line


@pytest.mark.parametrize("frac", [0.3, 0.5, 0.9, 1.0])
def test_truncated_captures_are_still_refused(tmp_path: Path, frac: float) -> None:
    for text in (WARNINGS + TEXT, GROUPED_PLAIN, GROUPED.read_text()):
        lines = text.splitlines(True)
        # cut after a port line (its peer, or the link's other end, is then missing),
        # or at 1.0 in the middle of the last line
        at = next(i for i in range(int(len(lines) * frac) - 1, 0, -1) if lines[i].startswith("["))
        cut = "".join(lines[:at + 1]) if frac < 1 else text[:-5]
        with pytest.raises(InputError) as e:
            nodes_of(cut, tmp_path)
        assert e.value.what.startswith("truncated ibnetdiscover dump"), (frac, e.value.what)


def test_warnings_alone_are_not_a_dump(tmp_path: Path) -> None:
    with pytest.raises(InputError) as e:
        nodes_of(WARNINGS, tmp_path)
    assert e.value.what == "ibnetdiscover dump holds no topology: only ibnetdiscover's own messages"


@pytest.mark.parametrize("old,new", [
    ('"H-e09d7303007a4bd8"', '"H-XXXXXXXXXXXXXXXX"'),              # a redacted GUID
    ('[1]\t"H-e09d7303007a4bd8"[1]', "[1]\t<redacted>"),             # a redacted peer
    ("# Initiated from node", "...\n# Initiated from node"),        # an elided part
])
def test_redacted_dumps_are_still_refused(tmp_path: Path, old: str, new: str) -> None:
    assert old in TEXT
    with pytest.raises(InputError):
        nodes_of(TEXT.replace(old, new, 1), tmp_path)


def test_ports_report_is_refused_by_name(tmp_path: Path) -> None:
    # dump_ports_report(): "%2s %5d %2d 0x%016" PRIx64 " %s %s" then " - ..." or the node name
    report = ("SW    73 35 0x2c5eab0300b87b40 4x 106.25 Gbps - SW   236 32 0x2c5eab0300c26280 "
              "( 'MF0;A09-P1-IBLEAF-04-04:MQM9701/U1' - 'MF0;A10-P1-IBSPINE-02:MQM9701/U1' )\n"
              "CA   647  1 0xe09d7303007a4bd8 4x 106.25 Gbps - SW    73  1 0x2c5eab0300b87b40 "
              "( 'a08-p1-dgx-04-c01 mlx5_5' - 'MF0;A09-P1-IBLEAF-04-04:MQM9701/U1' )\n")
    for text in (report, WARNINGS + report):
        with pytest.raises(InputError) as e:
            nodes_of(text, tmp_path)
        assert e.value.what == ("ibnetdiscover dump: this is `ibnetdiscover -p` (ports report) output, "
                                "which has no topology records; run ibnetdiscover without -p")


def test_iberror_is_refused_by_name(tmp_path: Path) -> None:
    # ibexit() (infiniband-diags/ibdiag_common.c) prints to stdout, then exits -1
    with pytest.raises(InputError) as e:
        nodes_of(TEXT + "ibnetdiscover: iberror: failed: caching ibnetdiscover data failed\n", tmp_path)
    assert e.value.what == ("ibnetdiscover dump: ibnetdiscover failed here "
                            "('ibnetdiscover: iberror: failed: caching ibnetdiscover data failed')")


def test_warnings_longer_than_a_read_slice(tmp_path: Path) -> None:
    p = tmp_path / "fabric.out"
    p.write_text(WARNINGS * 50 + GROUPED.read_text())
    fab = ibnet.parse_file(str(p), slice_chars=64)
    assert fab.nodes == ibnet.parse(_ungrouped(GROUPED.read_text()), "plain").nodes
    assert "skipped 152 lines" in fab.notes[0]


def _fast(text: str) -> tuple[dict[str, ibnet.IbNode], tuple[str, ...]] | None:
    """parse()'s fast reader alone: the warnings first, then the records and -g headers."""
    fab = ibnet.read_fast(text, "d")
    return None if fab is None else (fab.nodes, fab.notes)


def _sliced(text: str, size: int) -> tuple[dict[str, ibnet.IbNode], tuple[str, ...]] | None:
    """parse_file()'s reader alone, over *text* in slices of *size* characters."""
    fab = ibnet.read_sliced([text[i:i + size] for i in range(0, len(text), size)], "d")
    return None if fab is None else (fab.nodes, fab.notes)


def test_the_fast_reader_reads_captures_itself() -> None:
    """-g headers and leading warnings do not send a big dump to the careful reader (bench_confgen)."""
    for text in (GROUPED_PLAIN, WARNINGS + GROUPED_PLAIN, GROUPED.read_text()):
        fast = _fast(text)
        assert fast is not None
        careful = ibnet.read_careful(text, "d")
        assert fast == (careful.nodes, careful.notes)
        for size in (50, 4096, 1 << 16):
            assert _sliced(text, size) == (careful.nodes, careful.notes), size


_SMALL_G = ("#\n# Topology file: generated on Sat Nov 28 13:00:00 2026\n#\n"
            + WARNINGS.splitlines(True)[0] + "\nChassis 1 (guid 0x2c90200000100)\n\n# Spine Nodes\n"
            + GROUPED.read_text().split("# Spine Nodes\n", 1)[1])


@fuzz_settings(1500)
@given(mutated([WARNINGS + GROUPED.read_text(), _SMALL_G, WARNINGS + TEXT[:3000]],
               ["Non-Chassis Nodes\n", "\nNon-Chassis Nodes\n", "Chassis 2\n", "\nChassis 3 (guid 0x1)\n",
                "Hostname: x\n", "[ext 1]", WARNINGS.splitlines(True)[0], WARNINGS.splitlines(True)[2],
                "\n\n", "# c\n", "vendid=0x1\n"]),
       st.integers(min_value=1, max_value=300))
def test_fast_and_sliced_readers_skip_what_the_careful_one_skips(text: str, size: int) -> None:
    try:
        careful = ibnet.read_careful(text, "d")
    except InputError:
        careful = None
    for got in (_fast(text), _sliced(text, size)):
        if got is None:
            continue          # declined: parse() reads it with the careful reader
        if careful is None:
            # the careful reader refuses only what the fast one passes on to it: a broken link
            assert not ibnet.links_hold(got[0])
            continue
        assert got == (careful.nodes, careful.notes)


def test_xsigo_hostname_only_right_after_a_chassis_header(tmp_path: Path) -> None:
    """out_chassis() prints "Hostname: <desc>" after the chassis line of an Xsigo chassis, nowhere else."""
    text = GROUPED.read_text()
    chassis = "Chassis 1 (guid 0x2c90200000100)\n"
    ok = text.replace(chassis, chassis + "Hostname: xsigo-01\n")
    assert nodes_of(ok, tmp_path) == ibnet.parse(_ungrouped(text), "plain").nodes
    assert "line 7 ('Hostname: xsigo-01', ibnetdiscover -g)" in ibnet.parse(ok, "d").notes[0]
    bad = text.replace("Non-Chassis Nodes\n", "Non-Chassis Nodes\nHostname: xsigo-01\n")
    with pytest.raises(InputError) as e:
        nodes_of(bad, tmp_path)
    assert e.value.where.endswith(":39")
