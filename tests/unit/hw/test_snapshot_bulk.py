"""The cluster-wide snapshot reader: what it returns is what a full decode returns.

:class:`slurm_gpu.hw.snapshot_bulk.SnapshotLoader` decodes each kind of node
once and fills in host name, GPU UUIDs and fabric per node (issue 15).  These
tests hold it to the plain path, ``Node.from_dict(json.loads(text))`` and
:func:`slurm_gpu.hw.snapshot.node_from_file`, over every recorded machine, a
mixed cluster rendered to gres.conf and topology.conf, and texts made to
fool a template (a stale answer would be a wrong gres.conf on thousands of
nodes).
"""
from __future__ import annotations

import dataclasses
import json
import random
import uuid
from pathlib import Path

import pytest
from fuzzlib import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from slurm_gpu.commands.confgen_io import load_nodes
from slurm_gpu.confgen import block, render_gres_conf, topology
from slurm_gpu.hw import snapshot as snap
from slurm_gpu.hw.model import Node
from slurm_gpu.hw.snapshot_bulk import SnapshotLoader
from paths import ROOT

MACHINES = ROOT / "tests" / "data" / "machines"
SNAPSHOTS = sorted(p for p in MACHINES.glob("*/snapshot.json"))
BASE = json.loads((MACHINES / "h100-sxm-8x" / "snapshot.json").read_text())["node"]
BASE_TEXT = json.dumps(BASE)


def plain(text: str) -> Node | type:
    """The reference: a full decode, or the type of exception it raises."""
    try:
        return Node.from_dict(json.loads(text))
    except Exception as e:  # noqa: BLE001 - the kind of failure is what is compared
        return type(e)


def bulk(loader: SnapshotLoader, text: str) -> Node | type:
    try:
        return loader.node_from_text(text)
    except Exception as e:  # noqa: BLE001
        return type(e)


def variant(d: dict, i: int, clique: int | None) -> dict:
    """*d* as another node of the same kind: its own host name, GPU UUIDs and fabric."""
    out = dict(d, hostname=f"n{i:05d}")
    out["gpus"] = [dict(g, uuid=f"GPU-{uuid.UUID(int=i * 64 + k)}",
                        fabric=None if clique is None else
                        {"cluster_uuid": "c1a5", "clique_id": clique, "state": "completed", "status": 0,
                         "health_mask": 0})
                   for k, g in enumerate(d["gpus"])]
    return out


@pytest.mark.parametrize("path", SNAPSHOTS, ids=lambda p: p.parent.name)
def test_every_recorded_machine_loads_as_the_full_decode(path: Path) -> None:
    loader = SnapshotLoader()
    for _ in range(2):      # the first load makes the template, the second uses it
        assert loader.fast_node(str(path)) == snap.node_from_file(str(path))


def test_nodes_of_one_kind_keep_their_own_identity() -> None:
    loader = SnapshotLoader()
    texts = [json.dumps(variant(BASE, i, i // 18)) for i in range(40)]
    got = [loader.node_from_text(t) for t in texts]
    assert got == [plain(t) for t in texts]
    assert len({n.hostname for n in got}) == 40
    assert len({g.uuid for n in got for g in n.gpus}) == 40 * len(BASE["gpus"])
    assert [n.gpus[0].fabric.clique_id for n in got] == [i // 18 for i in range(40)]
    # One kind of node: one template, shared parts (the answer is frozen data).
    assert len(loader._templates) == 1
    assert got[0].cores is got[39].cores and got[0].gpus[3].nvlinks is got[39].gpus[3].nvlinks
    assert got[0].numa_nodes is got[39].numa_nodes and got[0].packages is got[39].packages


def test_mig_nodes_of_one_kind_share_a_template() -> None:
    """MIG device UUIDs differ per node like GPU UUIDs: one template, each node its own UUIDs."""
    base = json.loads((MACHINES / "h100-mig" / "snapshot.json").read_text())["node"]
    loader = SnapshotLoader()
    texts = []
    for i in range(6):
        d = variant(base, i, None)
        for g in d["gpus"]:
            g["mig_instances"] = [dict(m, uuid=f"MIG-{i}-{g['index']}-{k}") for k, m in enumerate(g["mig_instances"])]
        texts.append(json.dumps(d))
    got = [loader.node_from_text(t) for t in texts]
    assert got == [plain(t) for t in texts]
    assert got[5].gpus[2].mig_instances[1].uuid == "MIG-5-2-1"
    assert len(loader._templates) == 1 and loader._templates[next(iter(loader._templates))] is not None


def test_nodes_that_all_differ_are_decoded_plainly_without_keeping_their_text() -> None:
    """A template per node would cost two decodes and 17 KB a node: after a trial, plain decoding."""
    loader = SnapshotLoader()
    texts = [json.dumps(dict(variant(BASE, i, 0), notes=[f"GPU {i % 8} lost"] * (1 + i // 8))) for i in range(200)]
    got = [loader.node_from_text(t) for t in texts]
    assert got == [plain(t) for t in texts]
    assert loader._plain and not loader._templates      # the trial's templates are let go
    # ...while a cluster of one kind keeps its one template.
    loader = SnapshotLoader()
    for i in range(200):
        loader.node_from_text(json.dumps(variant(BASE, i, 0)))
    assert not loader._plain and len(loader._templates) == 1


@pytest.mark.parametrize("indent", [None, 1])   # snapshot record writes indent=1
def test_nodes_whose_memory_differs_share_a_template(indent: int | None) -> None:
    """MemTotal moves by a few MB with firmware and kernel: node and NUMA memory are cut out too."""
    loader = SnapshotLoader()
    texts = []
    for i in range(40):
        d = dict(variant(BASE, i, 0), memory_bytes=BASE["memory_bytes"] - 4096 * i,
                 phys_memory_bytes=BASE["memory_bytes"] + 8192 * i)    # the kernel's (slurmd -C's)
        d["numa_nodes"] = [dict(n, memory_bytes=n["memory_bytes"] - 2048 * i - k) for k, n in enumerate(d["numa_nodes"])]
        texts.append(json.dumps(d, indent=indent))
    got = [loader.node_from_text(t) for t in texts]
    assert got == [plain(t) for t in texts]
    assert got[39].memory_bytes == BASE["memory_bytes"] - 4096 * 39
    assert got[39].phys_memory_bytes == BASE["memory_bytes"] + 8192 * 39
    assert [n.memory_bytes for n in got[39].numa_nodes] == \
        [n["memory_bytes"] - 2048 * 39 - k for k, n in enumerate(BASE["numa_nodes"])]
    assert len(loader._templates) == 1 and got[1].cores is got[39].cores


def test_a_node_that_differs_anywhere_else_gets_its_own_answer() -> None:
    """Anything outside host name, UUIDs and fabric is part of the key: never served from another node."""
    loader = SnapshotLoader()
    loader.node_from_text(json.dumps(variant(BASE, 1, 0)))
    changes = []
    for field, value in (("memory_bytes", 1), ("pci_bus_id", "0000:99:00.0"), ("name", "other"),
                         ("cores", [0]), ("minor", 9), ("mig_enabled", True)):
        d = variant(BASE, 2, 0)
        d["gpus"][5] = dict(d["gpus"][5], **{field: value})
        changes.append(d)
    d = variant(BASE, 3, 0)
    d["cores"] = d["cores"][:-1]
    changes.append(d)
    d = variant(BASE, 4, 0)
    d["gpus"][0]["nvlinks"] = d["gpus"][0]["nvlinks"][:1]
    changes.append(d)
    for d in changes:
        text = json.dumps(d)
        assert loader.node_from_text(text) == plain(text)


TRICKY = [
    # a UUID with an escape, null, an object: still the value a full decode gives
    ('"uuid": "GPU-', '"uuid": "GPU-\\u0041'),
    ('"uuid": "GPU-', '"uuid": null, "x": "'),
    ('"hostname": "n', '"hostname": "\\u0000n'),          # spells the template's own marker
    ('"fabric": {', '"fabric": "not an object", "f": {'),  # a full decode raises: so must the loader
    ('"fabric": {', '"fabric": {}, "f": {'),               # an empty fabric is None, as from_dict reads it
    ('"uuid": "GPU-', '"uuid": "a", "uuid": "GPU-'),        # duplicate keys: the last wins
    ('"fabric": {"cluster_uuid": "c1a5"', '"fabric": {"cluster_uuid": "c}1{a5"'),
    ('"nics": []', '"nics": [], "hostname": "inner"'),     # a GPU key named like a node's
    ('"mig_instances": []', '"mig_instances": [{"uuid": "MIG-1"}]'),
    ('"memory_bytes": 2199023255552', '"memory_bytes": 2199023255552.5'),   # a float: not an integer token
    ('"memory_bytes": 2199023255552', '"memory_bytes": -0'),
    ('"memory_bytes": 2199023255552', '"memory_bytes": 1e3'),
    ('"memory_bytes": 2199023255552', '"memory_bytes": null'),
    ('"memory_bytes": 85520809984', '"memory_bytes": 7'),                  # a GPU's: part of the key
]


@pytest.mark.parametrize("old,new", TRICKY)
def test_texts_made_to_fool_a_template(old: str, new: str) -> None:
    loader = SnapshotLoader()
    for i in range(3):
        text = json.dumps(variant(BASE, i, 0))
        assert loader.node_from_text(text) == plain(text)
        bad = text.replace(old, new, 1 + i)
        assert new in bad
        assert bulk(loader, bad) == plain(bad)
        assert loader.node_from_text(text) == plain(text)   # and the honest node still loads right


@pytest.mark.parametrize("edit", [lambda t: t + " x", lambda t: t + "}", lambda t: t[:-1], lambda t: " " + t,
                                  lambda t: t.replace('"uuid": "GPU-', '"uuid": nullx, "y": "GPU-', 1)])
def test_a_text_around_a_known_template_that_is_not_one(edit) -> None:
    """Text before, after or inside the template's pieces: decoded (or refused) as a full decode would."""
    loader = SnapshotLoader()
    for i in range(2):
        loader.node_from_text(json.dumps(variant(BASE, i, 0)))
    bad = edit(json.dumps(variant(BASE, 5, 0)))
    assert bulk(loader, bad) == plain(bad)


_LOADER = SnapshotLoader()   # shared across examples: templates made by one example serve the next
_TOKENS = ['"memory_bytes": 1', '"memory_bytes": -1', '"memory_bytes": 01', '"memory_bytes": 1.5',
           ', "gpu_memory_nodes": ', '"uuid": "GPU-x"', '"uuid": null', '"uuid": {"a": 1}', '"fabric": null', '"fabric": {}',
           '"fabric": {"cluster_uuid": "u", "clique_id": 3, "state": "s", "status": 0}', '"hostname": "h"',
           '"\\u0000"', '"\\u0041"', '"uuid": "a", "uuid": "b"', ', "fabric": 1', '{', '}', '"', ',', '[]',
           '"hostname": ', '"uuid": ', '"fabric": ', '1e400', 'NaN']


@fuzz_settings(1500)
@given(st.integers(0, 50), st.lists(st.tuples(st.sampled_from(_TOKENS), st.integers(0, 10 ** 6),
                                              st.integers(0, 12)), max_size=3))
def test_fuzz_loader_equals_full_decode(i: int, edits: list[tuple[str, int, int]]) -> None:
    text = json.dumps(variant(BASE, i, i % 3 if i % 4 else None))
    for tok, at, span in edits:
        at %= len(text) + 1
        text = text[:at] + tok + text[at + span:]
    got, want = bulk(_LOADER, text), plain(text)
    if isinstance(want, Node):
        assert got == want
    else:
        assert got is want or not isinstance(got, Node)


def _write(d: Path, name: str, src: Path, i: int, clique: int | None) -> None:
    data = json.loads(src.read_text())
    data["hostname"] = name
    data["node"] = variant(data["node"], i, clique)
    d.joinpath(f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")


def test_a_mixed_cluster_renders_as_from_full_decodes(tmp_path: Path) -> None:
    """gres.conf and block topology.conf byte for byte the same as from node_from_file."""
    rnd = random.Random(15)
    kinds = [MACHINES / m / "snapshot.json" for m in ("h100-sxm-8x", "gb200-nvl", "h100-mig",
                                                       "dgx-a100-permuted", "mini-2numa")]
    chunk = [rnd.choice(kinds) for _ in range(17)]    # an NVLink clique of 18 is one kind of node
    for i in range(1, 301):
        _write(tmp_path, f"gpu{i:04d}", chunk[(i - 1) // 18], i, (i - 1) // 18 if rnd.random() < 0.9 else None)
    nodes, where = load_nodes([str(tmp_path)], [], None)
    ref = {name: snap.node_from_file(path) for name, path in where.items()}
    assert list(nodes) == list(ref) and nodes == ref
    assert render_gres_conf(nodes, inputs=["x"]) == render_gres_conf(ref, inputs=["x"])
    blocks = topology.render_topology(None, block.build_blocks(nodes, [18, 36], drop_small=True), inputs=["x"])
    assert blocks == topology.render_topology(None, block.build_blocks(ref, [18, 36], drop_small=True),
                                              inputs=["x"])
    assert "BlockName=" in blocks


def test_models_made_without_init_are_the_ones_init_makes() -> None:
    # _fill copies a template's __dict__ instead of calling the frozen
    # dataclass's __init__: the same object only while the model classes
    # have no __post_init__ and no slots.
    from slurm_gpu.hw.model import Gpu

    for cls in (Gpu, Node):
        assert not hasattr(cls, "__post_init__") and "__slots__" not in vars(cls)
    loader = SnapshotLoader()
    for i in range(3):      # the first makes the template, the others are filled from it
        text = json.dumps(variant(BASE, i, i))
        got, want = loader.node_from_text(text), plain(text)
        assert got == want and hash(got.gpus[0]) == hash(want.gpus[0])
        assert list(vars(got)) == list(vars(want))
        assert [list(vars(g)) for g in got.gpus] == [list(vars(g)) for g in want.gpus]
        assert repr(got) == repr(want)


def _old_body(tail: bytes, start: int) -> str | type | None:
    """What fast_node took for the node's text before it decoded only that slice:
    everything after the key decoded, stripped, less the closing brace."""
    try:
        text = tail[start:].decode("utf-8", "strict").strip()
    except UnicodeDecodeError as e:
        return type(e)
    if not text.endswith("}") or not text.startswith("{"):
        return None
    return text[:-1].rstrip()


@pytest.mark.parametrize("tail", [
    b' {"a": 1}\n', b'{"a": 1}', b'{}', b'{', b'}', b'', b'  \n', b' {"a": 1} \n}', b'{"a": 1}x',
    b'\x1c{"a": 1}\x1f', b'\t{"a": 1\r\n}\x0b\x0c', '\u00a0{"a": 1}'.encode(), '{"a": 1}\u2003'.encode(),
    '{"a": 1\u00a0}'.encode(), '{"a": "\u00e9"\u3000}\n'.encode(), b'{"a": "\xff"}', b'{"a": 1}\xff',
    b'\xc3{"a": 1}', '{"é": 1\x85}'.encode(), b'x{"a": 1}', b'x\xff{"a": 1}', b'{"a": 1} \xe2\x80', b'\x00{"a": 1}',
])
def test_a_snapshots_node_is_found_as_the_old_decode_and_strip_found_it(tail: bytes, tmp_path: Path) -> None:
    """fast_node reads the node's object after its key, less the snapshot's closing
    brace, as decoding all of it and ``str.strip`` did: ASCII and Unicode spaces
    around either brace, other bytes there, and bytes that are no UTF-8.  In each
    tail ``{"a": 1`` stands for the node's object: here a real node's."""
    tail = tail.replace(b'{"a": 1', BASE_TEXT.encode())
    path = tmp_path / "snapshot.json"
    for before in (b"", b'"x": 1, '):
        text = b'{"schema": "' + snap.SCHEMA.encode() + b'", ' + before + b'"node":' + tail
        path.write_bytes(text)
        body = _old_body(text, len(text) - len(tail))
        if body is UnicodeDecodeError:
            with pytest.raises(UnicodeDecodeError):
                SnapshotLoader().fast_node(str(path))
            continue
        want = plain(body) if isinstance(body, str) else None
        if isinstance(want, Node):
            want = dataclasses.replace(want, sources=(f"snapshot:{path}",))
        assert SnapshotLoader().fast_node(str(path)) == (want if isinstance(want, Node) else None)


def test_tail_sized_after_a_small_model_still_finds_a_large_one(tmp_path: Path) -> None:
    # The tail read is sized after the last model: a larger one next is read again, whole.
    small = min(SNAPSHOTS, key=lambda p: len(json.dumps(json.loads(p.read_text())["node"])))
    large = max(SNAPSHOTS, key=lambda p: len(json.dumps(json.loads(p.read_text())["node"])))
    assert small != large
    loader = SnapshotLoader()
    for path in (small, large, small, large):
        hint = loader._tail_hint
        assert loader.fast_node(str(path)) == snap.node_from_file(str(path))
    assert hint < 4096     # the last large one was read after a small one
