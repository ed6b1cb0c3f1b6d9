"""topology/tree from the real ibnetdiscover dump; parser truncation handling."""
from __future__ import annotations


import pytest

from machinedata import ROOT
from slurm_gpu.confgen import hostlist, ibnet, topocheck, topology, tree
from slurm_gpu.errors import InputError

DUMP = ROOT / "tests" / "data" / "ibnetdiscover" / "topograph-example.out"
GOLDEN = ROOT / "tests" / "data" / "golden"
LINES = DUMP.read_text().splitlines(True)


@pytest.fixture(scope="module")
def fabric() -> ibnet.IbFabric:
    return ibnet.parse_file(str(DUMP))


def test_parse_real_dump(fabric: ibnet.IbFabric) -> None:
    kinds = [n.kind for n in fabric.nodes.values()]
    assert kinds.count("Switch") == 40 and kinds.count("Ca") == 582
    leaf = fabric.nodes["S-2c5eab0300b87b40"]
    assert leaf.desc == "MF0;A09-P1-IBLEAF-04-04:MQM9701/U1"
    assert leaf.port(1) == leaf.ports[0] == (1, "H-e09d7303007a4bd8", 1)


def test_tree_of_real_dump(fabric: ibnet.IbFabric) -> None:
    t = tree.build_tree([fabric])
    leaves = [s for s in t.switches if s.level == 0]
    spines = [s for s in t.switches if s.level == 1]
    assert len(leaves) == 8 and len(spines) == 9 and t.fabrics == 1
    # 4 rail leaves of scalable unit 3 serve the same 18 DGX: one Slurm leaf.
    su3 = next(s for s in leaves if s.name == "A09-P1-IBLEAF-01-03")
    assert hostlist.fold(su3.nodes) == "a07-p1-dgx-03-c[01-18]"
    assert "A09-P1-IBLEAF-04-03" in su3.comment
    # Every host is under exactly one leaf, with its full name from "<host> <hca>".
    all_nodes = [n for s in leaves for n in s.nodes]
    assert len(all_nodes) == len(set(all_nodes))
    assert "a08-p1-dgx-04-c01" in all_nodes and not any(n.startswith(("MT4129", "Mellanox")) for n in all_nodes)
    assert all(set(s.switches) == {l.name for l in leaves} for s in spines)
    assert any("skipped" in n and "MT4129" in n for n in t.notes)


def test_nodes_filter_drops_non_slurm_hosts(fabric: ibnet.IbFabric) -> None:
    allowed = hostlist.expand("a0[5-8]-p1-dgx-0[1-4]-c[01-18],b0[5-8]-p1-dgx-0[5-8]-c[01-18]")
    t = tree.build_tree([fabric], tree.host_matcher(nodes=allowed))
    names = {n for s in t.switches for n in s.nodes}
    assert "B11-P1-CUFM-02" not in names and "ubuntu" not in names and "a07-p1-dgx-03-c01" in names


def test_nodes_subset_drops_leaves_of_left_out_hosts(fabric: ibnet.IbFabric) -> None:
    # Two DGX of each of two scalable units: the other 6 leaf groups serve only
    # left-out hosts.  They are two hops above the kept leaves (via the spines),
    # like a core switch, and must be dropped, not listed as the spines' parents.
    allowed = hostlist.expand("a07-p1-dgx-03-c[01-04],b05-p1-dgx-05-c[01-04]")
    t = tree.build_tree([fabric], tree.host_matcher(nodes=allowed))
    leaves = {s.name: s.nodes for s in t.switches if s.level == 0}
    assert leaves == {"A09-P1-IBLEAF-01-03": tuple(hostlist.expand("a07-p1-dgx-03-c[01-04]")),
                      "B09-P1-IBLEAF-01-05": tuple(hostlist.expand("b05-p1-dgx-05-c[01-04]"))}
    assert {s.level for s in t.switches} == {0, 1}
    assert all(set(s.switches) == set(leaves) for s in t.switches if s.level == 1)
    dropped, = (hostlist.expand(n.split(": ", 1)[1]) for n in t.notes if n.startswith("dropped"))
    assert len(dropped) == 23 and "A09-P1-IBLEAF-01-01" in dropped and "A09-P1-IBLEAF-02-03" not in dropped


def test_core_switch_above_spines_is_kept() -> None:
    # leaf - spine - core: the core has only a SHARP aggregation node (a Ca that is no host).
    text = _fabric_text(
        ("S-l1", "MF0;leaf1:X", [("H-1", 1), ("S-s1", 1)]),
        ("S-l2", "MF0;leaf2:X", [("H-2", 1), ("S-s2", 1)]),
        ("S-s1", "MF0;spine1:X", [("S-l1", 2), ("S-c", 1)]),
        ("S-s2", "MF0;spine2:X", [("S-l2", 2), ("S-c", 2)]),
        ("S-c", "MF0;core:X", [("S-s1", 2), ("S-s2", 2), ("H-agg", 1)]),
        hosts={"H-1": ("n1 mlx5_0", "S-l1", 1), "H-2": ("n2 mlx5_0", "S-l2", 1),
               "H-agg": ("Mellanox Technologies Aggregation Node", "S-c", 3)})
    t = tree.build_tree([ibnet.parse(text.splitlines(True), "f")])
    assert [(s.name, s.level, s.switches) for s in t.switches if s.level] == [
        ("spine1", 1, ("leaf1",)), ("spine2", 1, ("leaf2",)), ("core", 2, ("spine1", "spine2"))]
    assert t.fabrics == 1


def test_golden_and_round_trip(fabric: ibnet.IbFabric) -> None:
    t = tree.build_tree([fabric])
    inputs = [f"ibnetdiscover {DUMP.relative_to(ROOT)}"]
    conf = topology.render_topology(t, None, fmt="conf", inputs=inputs)
    yml = topology.render_topology(t, None, fmt="yaml", inputs=inputs)
    assert conf == (GOLDEN / "topograph-example.topology.conf").read_text()
    assert yml == (GOLDEN / "topograph-example.topology.yaml").read_text()
    a = topocheck.parse_conf(conf.splitlines(True))
    b = topocheck.parse_yaml(yml)
    assert topocheck.compare(a, b) == [] and len(a.switches) == 17


def _fabric_text(*switches: tuple[str, str, list[tuple[str, int]]], hosts: dict[str, tuple[str, str, int]]) -> str:
    """Tiny ibnetdiscover text: switches (id, desc, [(peer id, peer port)]) and hosts id -> (desc, sw, port)."""
    out = []
    for sid, desc, ports in switches:
        out.append(f'switchguid=0x1\nSwitch\t36 "{sid}"\t\t# "{desc}" enhanced port 0 lid 1 lmc 0\n')
        for i, (peer, pp) in enumerate(ports, 1):
            out.append(f'[{i}]\t"{peer}"[{pp}]\t\t# "x" lid 2 4xNDR\n')
        out.append("\n")
    for hid, (desc, sw, port) in hosts.items():
        out.append(f'caguid=0x2\nCa\t1 "{hid}"\t\t# "{desc}"\n[1](2)\t"{sw}"[{port}]\t\t# lid 3\n\n')
    return "".join(out)


def test_two_fabrics_and_a_switch_connected_to_nothing() -> None:
    text = _fabric_text(
        ("S-a", "MF0;leafA:X", [("H-1", 1), ("H-2", 1)]),
        ("S-b", "MF0;leafB:X", [("H-3", 1)]),
        ("S-z", "MF0;lonely:X", []),
        hosts={"H-1": ("n1 mlx5_0", "S-a", 1), "H-2": ("n2 mlx5_0", "S-a", 2), "H-3": ("n3 mlx5_0", "S-b", 1)})
    t = tree.build_tree([ibnet.parse(text.splitlines(True), "f")])
    assert [(s.name, s.nodes) for s in t.switches] == [("leafA", ("n1", "n2")), ("leafB", ("n3",))]
    assert t.fabrics == 2
    assert any("lonely" in n for n in t.notes) and any("share no switch" in n for n in t.notes)


def test_node_on_several_dumps_belongs_to_the_first() -> None:
    f1 = ibnet.parse(_fabric_text(("S-a", "MF0;ca:X", [("H-1", 1)]), hosts={"H-1": ("n1 mlx5_0", "S-a", 1)})
                     .splitlines(True), "compute")
    f2 = ibnet.parse(_fabric_text(("S-b", "MF0;st:X", [("H-9", 1)]), hosts={"H-9": ("n1 mlx5_1", "S-b", 1)})
                     .splitlines(True), "storage")
    t = tree.build_tree([f1, f2])
    assert [(s.name, s.nodes) for s in t.switches] == [("ca", ("n1",))]


@pytest.mark.parametrize("cut", [11, 500, 1885, 3000, 5000, 5963, len(LINES) - 2])
def test_truncated_dump_is_one_error_naming_file_and_line(cut: int) -> None:
    with pytest.raises(InputError) as e:
        ibnet.parse(LINES[:cut], "dump.out")
    msg = e.value.line()
    assert "truncated" in msg and "(dump.out:" in msg and "\n" not in msg


def test_line_cut_mid_way() -> None:
    text = "".join(LINES[:200]) + LINES[200][:15]
    with pytest.raises(InputError, match=r"last line is incomplete \(d:201\)"):
        ibnet.parse(text.splitlines(True), "d")


def test_garbage_line_named() -> None:
    with pytest.raises(InputError, match=r"unreadable line \(d:3\)"):
        ibnet.parse(LINES[:2] + ["what is this\n"] + LINES[2:], "d")


def test_eight_hca_dgx_units_merge_into_one_leaf_each() -> None:
    """DGX-style nodes with 8 HCAs, one per rail leaf: each scalable unit is one Slurm leaf."""
    switches, hosts = [], {}
    for su in (1, 2):
        for rail in range(8):
            sid = f"S-l{su}{rail}"
            ports = []
            for h in range(1, 5):
                hid = f"H-{su}{h}{rail}"
                ports.append((hid, 1))
                hosts[hid] = (f"dgx{su}{h:02d} mlx5_{rail}", sid, len(ports))
            ports += [("S-spine", (su - 1) * 8 + rail + 1)]
            switches.append((sid, f"MF0;su{su}-rail{rail}:X", ports))
    spine_ports = [(f"S-l{su}{rail}", 5) for su in (1, 2) for rail in range(8)]
    text = _fabric_text(*switches, ("S-spine", "MF0;spine:X", spine_ports), hosts=hosts)
    t = tree.build_tree([ibnet.parse(text.splitlines(True), "dgx.out")])
    leaves = [(s.name, s.nodes) for s in t.switches if s.level == 0]
    assert leaves == [("su1-rail0", ("dgx101", "dgx102", "dgx103", "dgx104")),
                      ("su2-rail0", ("dgx201", "dgx202", "dgx203", "dgx204"))]
    assert [(s.name, s.switches) for s in t.switches if s.level == 1] == [("spine", ("su1-rail0", "su2-rail0"))]


def test_fast_reader_equals_careful_reader() -> None:
    fast = ibnet.read_fast("".join(LINES), "d")
    careful = ibnet.read_careful(LINES, "d")
    assert fast is not None
    assert fast == careful


@pytest.mark.parametrize("rest,desc", [
    ('\t\t# "first" # "second"', "first"),           # the first quoted string after the first '#'
    ('\t\t# lid 5 "after" "more"', "after"),
    ('\t"before" # "after"', "after"),
    ('\t\t# no quote here', ""),
    ('\t\t# "unclosed', ""),
    ('', ""),
])
def test_fast_reader_reads_descriptions_as_the_careful_one(rest: str, desc: str) -> None:
    text = (f'Switch\t2 "S-a"{rest}\n[1]\t"H-1"[1]\t\t# "n1 mlx5_0"\n\n'
            f'Ca\t1 "H-1"{rest}\n[1](1) \t"S-a"[1]\t\t# lid 1\n')
    fast = ibnet.read_fast(text)
    careful = ibnet.read_careful(text)
    assert fast is not None
    assert [(n.desc, n.ports) for n in fast.nodes.values()] == \
        [(n.desc, n.ports) for n in careful.nodes.values()] == \
        [(desc, ((1, "H-1", 1),)), (desc, ((1, "S-a", 1),))]


@pytest.mark.parametrize("text", [
    'Switch\t2 "S-a"\n[1]\t"H-1"[1]\nxx\n',                  # a line the fast reader does not know
    'Switch\t2 "S-a"\n[1]\t"H-1"[1]\n[2] "S-b"\n',            # an unreadable port line after a good one
    'Switch\t2 "S-a"\n[x]\t"H-1"[1]\n',                       # an unreadable first port line
    'Switch\t2 "S-a"\n[1]\t"H-1"[1]\n# c\n[2]\t"H-2"[1]\n',   # a comment between port lines
    'Switch\t2 "S-a"\n[1]\t"H-1"[1]',                         # no newline at the end
    ' Switch\t2 "S-a"\n',                                      # indented
])
def test_fast_reader_hands_what_it_does_not_know_to_the_careful_one(text: str) -> None:
    assert ibnet.read_fast(text) is None


def test_spines_list_leaves_with_equal_natural_keys_in_one_order() -> None:
    """a01 and a1 sort equal by natural key: every spine lists them by text, whatever the set order."""
    leaves = [("S-l1", "MF0;a1:X"), ("S-l2", "MF0;a01:X"), ("S-l3", "MF0;a001:X")]
    # leaf k: port 1 its host, port 1+i spine i (its port k)
    text = _fabric_text(
        *[(lid, desc, [(f"H-{k}", 1)] + [(f"S-s{i}", k) for i in range(1, 4)])
          for k, (lid, desc) in enumerate(leaves, 1)],
        *[(f"S-s{i}", f"MF0;spine{i}:X", [(lid, 1 + i) for lid, _ in leaves]) for i in range(1, 4)],
        hosts={f"H-{k}": (f"n{k} mlx5_0", lid, 1) for k, (lid, _) in enumerate(leaves, 1)})
    t = tree.build_tree([ibnet.parse(text.splitlines(True), "f")])
    assert [(s.name, s.switches) for s in t.switches if s.level == 1] == \
        [(f"spine{i}", ("a001", "a01", "a1")) for i in range(1, 4)]


@pytest.mark.parametrize("order", [(3, 1, 2), (1, 2, 2), (2, 1)])
def test_ports_out_of_order_or_twice_are_read_by_the_careful_reader(order: tuple[int, ...]) -> None:
    """ibnetdiscover lists a node's ports in increasing order; otherwise: sorted, a port twice keeps its last line."""
    lines = "".join(f'[{n}]\t"H-{n}x{i}"[1]\n' for i, n in enumerate(order))
    text = f'Switch\t9 "S-a"\t# "MF0;a:X"\n{lines}\n'
    text += "".join(f'Ca\t1 "H-{n}x{i}"\t# "n{n} mlx5_0"\n[1](1) \t"S-a"[{n}]\n\n' for i, n in enumerate(order)
                    if i == max(j for j, m in enumerate(order) if m == n))
    assert ibnet.read_fast(text) is None
    want = tuple(sorted({n: (n, f"H-{n}x{i}", 1) for i, n in enumerate(order)}.values()))
    assert ibnet.parse(text).nodes["S-a"].ports == want


def test_a_port_is_found_by_number_with_ports_missing() -> None:
    n = ibnet.IbNode("S-a", "Switch", "", ((0, "H-0", 1), (2, "H-2", 1), (3, "H-3", 1), (7, "H-7", 1)))
    assert [n.port(k) for k in (0, 1, 2, 3, 4, 7, 8, -1)] == \
        [(0, "H-0", 1), None, (2, "H-2", 1), (3, "H-3", 1), None, (7, "H-7", 1), None, None]


def test_a_host_whose_adapter_reaches_no_switch_is_left_out_and_named() -> None:
    """An adapter record with no port line (or only a host-to-host cable): a note, not an IndexError."""
    text = ('Switch\t2 "S-1"\t# "MF0;leaf1:X"\n[1]\t"H-2"[1]\n\n'
            'Ca\t1 "H-2"\t# "node02 mlx5_0"\n[1](2) \t"S-1"[1]\n\n'
            'Ca\t1 "H-3"\t# "node03 mlx5_0"\n\n'
            'Ca\t1 "H-4"\t# "node04 mlx5_0"\n[1](4) \t"H-5"[1]\n\n'
            'Ca\t1 "H-5"\t# "node05 mlx5_0"\n[1](5) \t"H-4"[1]\n\n')
    t = tree.build_tree([ibnet.parse(text, "d")])
    assert [(s.name, s.nodes) for s in t.switches] == [("leaf1", ("node02",))]
    assert "left out 3 hosts whose adapters are cabled to no switch: node[03-05]" in t.notes
