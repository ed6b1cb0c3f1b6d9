"""Property tests: the ibnetdiscover and gres.conf parsers end in a result or one line."""
from __future__ import annotations

from unittest import mock

import pytest
from fuzzlib import fuzz_settings, mutated, outcome
from hypothesis import given
from hypothesis import strategies as st

from slurm_gpu.confgen import grescheck, hostlist, ibnet, topocheck
from slurm_gpu.errors import InputError
from slurm_gpu.health.nodestate import parse_show_node
from paths import ROOT

DATA = ROOT / "tests" / "data"
_REAL = (DATA / "ibnetdiscover" / "topograph-example.out").read_text()

IBNET = [
    # two switches and two adapters, every link seen from both ends (the real dump's syntax)
    "vendid=0x2c9\ndevid=0xd2f2\nswitchguid=0x2c5eab0300b87b40(2c5eab0300b87b40)\n"
    'Switch\t65 "S-a"\t\t# "MF0;LEAF-1:MQM9701/U1" enhanced port 0 lid 73 lmc 0\n'
    '[1]\t"H-1"[1](e09d7303007a4bd8) \t\t# "node1 mlx5_5" lid 647 4xNDR\n'
    '[2]\t"S-b"[2]\t\t# "MF0;SPINE-1:MQM9701/U1" lid 236 4xNDR\n'
    "\n"
    'Switch\t65 "S-b"\t\t# "MF0;SPINE-1:MQM9701/U1" enhanced port 0 lid 236 lmc 0\n'
    '[1]\t"H-2"[1](e09d730300859298) \t\t# "node2 mlx5_5" lid 641 4xNDR\n'
    '[2]\t"S-a"[2]\t\t# "MF0;LEAF-1:MQM9701/U1" lid 73 4xNDR\n'
    "\n"
    "vendid=0x2c9\ndevid=0x1021\ncaguid=0xe09d7303007a4bd8\n"
    'Ca\t1 "H-1"\t\t# "node1 mlx5_5"\n'
    '[1](e09d7303007a4bd8) \t"S-a"[1]\t\t# lid 647 lmc 0 "MF0;LEAF-1:MQM9701/U1" lid 73 4xNDR\n'
    "\n"
    'Ca\t1 "H-2"\t\t# "node2 mlx5_5"\n'
    '[1](e09d730300859298) \t"S-b"[1]\t\t# lid 641 lmc 0 "MF0;SPINE-1:MQM9701/U1" lid 236 4xNDR\n',
    _REAL[:4000],
]

GRES = [
    "# gres.conf\nAutoDetect=off\n"
    "NodeName=gpu[01-04] Name=gpu Type=h100 File=/dev/nvidia[0-3] Cores=0-51\n"
    "NodeName=gpu[01-04] Name=gpu Type=h100 File=/dev/nvidia[4-7] Cores=52-103\n"
    "NodeName=gpu[01-04] Name=mps Count=400 File=/dev/nvidia[0-3]\n",
    "Name=gpu File=/dev/nvidia0 Links=-1,18,18,18\nName=gpu File=/dev/nvidia1 Flags=nvidia_gpu_env\n"
    "NodeName=n1 Name=gpu Type=a100 MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21\n"
    "NodeName=n1 Name=shard Count=8G\nNodeName=n[1-3] AutoDetect=nvml\n",
]
GRES_TOKENS = ["NodeName=", "Name=gpu", "File=/dev/nvidia[0-", "Count=", "Count=99999999999999999999T",
               "Cores=", "Links=", "Type=", "AutoDetect=", "n[1-", "n[1-99999999]", "n[0-9999]",
               "[1-3,5]", "\\\n"]


@fuzz_settings(2000)
@given(mutated(IBNET, ["[", '"S-a"', '"H-1"[1]', "Switch\t", "Ca\t", "[99999]", "lid"]))
def test_ibnetdiscover_parser(text):
    outcome(ibnet.parse, text, "dump")


@fuzz_settings(2000)
@given(mutated(IBNET, ["[", '"S-a"', '"H-1"[1]', "Switch\t", "Ca\t", "[99999]", "lid", "#", '# "x"', "\n\n",
                       "\n#c\n", "vendid=0x1\n", "[2]\t\"S-b\"[1]\n", " Ca\t1 \"H-9\"\n"]))
def test_ibnetdiscover_fast_reader_equals_careful_reader(text):
    """Whatever the whole-text reader accepts, the line-by-line one reads the same (issue 15's rewrite)."""
    fast = ibnet.read_fast(text, "d")
    if fast is None:
        return
    try:
        careful = ibnet.read_careful(text, "d")
    except InputError:
        # The careful reader also checks the links: then so does parse() after the fast one
        # (and the quick mirror test inside links_hold never passes a broken link).
        assert not ibnet.links_hold(fast.nodes)
        return
    assert ibnet.links_hold(fast.nodes)
    assert {k: (v.kind, v.desc, v.ports) for k, v in fast.nodes.items()} == \
        {k: (v.kind, v.desc, v.ports) for k, v in careful.nodes.items()}
    assert fast.notes == careful.notes


@fuzz_settings(1000)
@given(st.text(alphabet="[]()\"#=\t\n 0123456789SCHabx-wcRt", max_size=300))
def test_ibnetdiscover_parser_on_raw_text(text):
    outcome(ibnet.parse, text, "dump")


def test_a_5000_digit_port_is_one_line():
    text = IBNET[0].replace('[2]\t"S-b"[2]', "[" + "9" * 5000 + ']\t"S-b"[2]', 1)
    assert isinstance(outcome(ibnet.parse, text, "dump"), InputError)
    text = IBNET[0].replace('[2]\t"S-b"[2]', '[2]\t"S-b"[' + "9" * 5000 + "]", 1)
    assert isinstance(outcome(ibnet.parse, text, "dump"), InputError)


@fuzz_settings(2000)
@given(mutated(GRES, GRES_TOKENS))
def test_gres_conf_check_parser(text):
    conf = outcome(grescheck.parse_gres_conf, text.splitlines(True), "gres.conf")
    if isinstance(conf, dict):
        for node in list(conf)[:3]:
            outcome(grescheck.shared_with_other_nodes, conf, node)
            outcome(grescheck.effective, conf, node)


# Ranges past the expansion cap, some far past it (ClusterShell builds every
# number of a range before its size can be asked: minutes for n[1-99999999]).
_BIG = st.builds(lambda p, a, b, step, more: f"{p}[{a}-{b}{step}{more}]",
                 st.sampled_from(["n", "gpu", "", "1", "n9"]), st.sampled_from(["", "0", "1", "3"]),
                 st.sampled_from([999, 1000, 1001, 5000, 10 ** 6, 99999999, 10 ** 12, 10 ** 19]),
                 st.sampled_from(["", "/2", "/1000"]), st.sampled_from(["", ",5-9", ",0-99999999", ",1-800"]))


@fuzz_settings(1500)
@given(st.one_of(st.text(alphabet="abn0123456789[]-,^", max_size=40), _BIG))
def test_hostlist_expansion(text):
    """A result within the cap or one line, never a hang; the cap is lowered to 1,000 so that
    40-character inputs reach it (test_hostlist_mutants.py pins the real one)."""
    with mock.patch.object(hostlist, "MAX_EXPANSION", 1000):
        for fn, where in ((hostlist.expand, "NodeName"), (hostlist.parse_int_ranges, "Cores"),
                          (hostlist.expand_files, "File")):
            got = outcome(fn, text, where)
            assert isinstance(got, InputError) or len(got) <= 1000


_NAME = st.one_of(
    st.builds(lambda p, z, n: f"{p}{z}{n}", st.sampled_from(["gpu", "n", "a.b-", "x_", "GPU", "gpu-", "r1n", "r01n",
                                                           "a08-p1-dgx-04-c", "IBLEAF-0-", "0a", "9" * 70 + "x"]),
              st.sampled_from(["", "0", "00", "9"]), st.integers(0, 10 ** 20)),
    st.text(alphabet="gpu-0123456789._[],\u0661", max_size=10))


@fuzz_settings(1500)
@given(st.lists(_NAME, max_size=12))
def test_fold_is_clustershells_fold(names):
    """hostlist.fold's one-pattern path folds to what NodeSet.fromlist does, name by name (issue 15)."""
    from ClusterShell.NodeSet import NodeSet

    def fromlist():
        ns = NodeSet.fromlist(list(names))
        ns.fold_axis = (-1,)
        return str(ns)
    got = want = None
    try:
        want = fromlist()
    except Exception as e:  # noqa: BLE001 - the same failure either way
        want = type(e)
    try:
        got = hostlist.fold(names)
    except Exception as e:  # noqa: BLE001
        got = type(e)
    # where ClusterShell fails, ours is one line (InputError), never its traceback
    assert got == (InputError if isinstance(want, type) else want)


def test_a_name_with_a_5000_digit_number_folds_to_one_line():
    with pytest.raises(InputError, match="cannot fold host names"):
        hostlist.fold(["n" + "1" * 5000, "n2"])
    with pytest.raises(InputError, match="cannot fold host names"):
        hostlist.fold(["gpu[1"])


@fuzz_settings(1000)
@given(st.lists(st.text(alphabet="gpu-0123456789.[]\u0661", max_size=12), max_size=8))
def test_natural_key_orders_as_its_definition(names):
    """Digit runs by value (length once leading zeros are gone, then digits), the rest as text."""
    import re

    def definition(text):
        parts = re.split(r"(\d+)", text)
        return tuple((len(p.lstrip("0")), p.lstrip("0")) if i % 2 else p for i, p in enumerate(parts))
    assert [hostlist.natural_key(n) for n in names] == [definition(n) for n in names]
    assert sorted(names, key=hostlist.natural_key) == sorted(names, key=definition)


TOPO = [
    "# topology.conf\nSwitchName=leaf1 Nodes=gpu[001-004]\nSwitchName=leaf2 Nodes=gpu[005-008]\n"
    "SwitchName=spine Switches=leaf[1-2] LinkSpeed=400\n",
    "BlockName=b1 Nodes=gpu[001-018]\nBlockName=b2 Nodes=gpu[019-036]\nBlockSizes=18,36\n",
]
TOPO_YAML = [
    "- topology: default\n  cluster_default: true\n  tree:\n    switches:\n      - switch: s1\n"
    "        nodes: gpu[001-004]\n      - switch: top\n        children: s1\n",
    "- topology: nvl\n  block:\n    block_sizes: [18, 36]\n    blocks:\n      - block: b1\n        nodes: gpu[001-018]\n",
]


@fuzz_settings(1500)
@given(mutated(TOPO, ["SwitchName=", "Switches=", "Nodes=", "BlockName=", "BlockSizes=", "n[1-99999999]", "9" * 30]))
def test_topology_conf_check_parser(text):
    outcome(topocheck.parse_conf, text.splitlines(True), "topology.conf")


@fuzz_settings(800)
@given(mutated(TOPO_YAML, ["- ", "switch: ", "children: ", "block_sizes: [", "nodes: ", "&a [*a, *a]", "*a"]))
def test_topology_yaml_check_parser(text):
    outcome(topocheck.parse_yaml, text, "topology.yaml")


SHOW_NODE = [(DATA / "xid" / "scontrol" / n).read_text() for n in ("draining_ours.txt", "admin_drained.txt", "idle.txt")]


@fuzz_settings(1000)
@given(mutated(SHOW_NODE, ["Reason=", " [root@2026-11-22T05:20:00]", "State=", "+DRAIN", "Comment=", "Extra="]))
def test_scontrol_show_node_parser(text):
    outcome(parse_show_node, text)


@fuzz_settings(1000)
@given(mutated(IBNET, ["[", '"S-a"', "Switch\t", "Ca\t", "#", '# "x"', "\n\n", "\n#c\n", "vendid=0x1\n",
                       '#Ca\t1 "H-9"\n']),
       st.integers(min_value=1, max_value=200))
def test_ibnetdiscover_slices_read_as_the_whole_text(text, size):
    """parse_file's slice-by-slice reading gives the whole-text reader's nodes, or declines."""
    sliced = ibnet.read_sliced([text[i:i + size] for i in range(0, len(text), size)], "d")
    if sliced is None:
        return
    whole = ibnet.read_fast(text, "d")
    assert whole is not None
    assert list(sliced.nodes.items()) == list(whole.nodes.items()) and sliced.notes == whole.notes
