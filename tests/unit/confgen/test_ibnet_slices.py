"""parse_file reads a dump in slices: the same nodes, lines and messages as the whole text gives."""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable

import pytest

from machinedata import ROOT
from slurm_gpu.confgen import ibnet
from slurm_gpu.errors import InputError

DUMP = ROOT / "tests" / "data" / "ibnetdiscover" / "topograph-example.out"
TEXT = DUMP.read_text()


def _view(nodes: dict[str, ibnet.IbNode]) -> list[tuple[str, ibnet.IbNode]]:
    return list(nodes.items())


def _sliced(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("size", [1, 2, 7, 100, 4096, 1 << 16, len(TEXT)])
def test_slices_of_the_real_dump_read_as_the_whole_text(size: int) -> None:
    whole = ibnet.read_fast(TEXT)
    assert whole is not None
    sliced = ibnet.read_sliced(_sliced(TEXT, size))
    assert sliced is not None
    assert _view(sliced.nodes) == _view(whole.nodes) and sliced.notes == whole.notes == ()


@pytest.mark.parametrize("size", [3, 64, 1000])
def test_parse_file_in_small_slices_equals_parse(tmp_path: Path, size: int) -> None:
    path = tmp_path / "fabric.out"
    path.write_text(TEXT)
    assert _view(ibnet.parse_file(str(path), size).nodes) == _view(ibnet.parse(TEXT, str(path)).nodes)


def _message(read: Callable[[], object]) -> str:
    with pytest.raises(InputError) as e:
        read()
    return e.value.line()


@pytest.mark.parametrize("broken", [
    # a link seen from one end only, far down the file: the line comes from the slices' count
    lambda t: t.replace('"H-e09d7303007a4bd8"[1]', '"H-e09d7303007a4bd8"[2]', 1),
    # a garbage line: the slices decline, the whole text is read again and the careful reader names it
    lambda t: t.replace("\n\n", "\n\nwhat is this\n", 300),
    # cut in the middle of a record
    lambda t: t[:len(t) // 2],
    # a peer never described
    lambda t: t.replace('Ca\t1 "H-e09d7303007a4bd8"', 'Ca\t1 "H-gone"', 1),
])
def test_a_broken_dump_gives_the_same_message_read_in_slices(tmp_path: Path, broken: Callable[[str], str]) -> None:
    text = broken(TEXT)
    path = tmp_path / "fabric.out"
    path.write_text(text)
    got = _message(lambda: ibnet.parse_file(str(path), 256))
    assert got == _message(lambda: ibnet.parse(text, str(path)))
    assert "\n" not in got and f"({path}:" in got


def test_crlf_dump_reads_as_text_mode_did(tmp_path: Path) -> None:
    """Universal newlines, also where a slice ends between \\r and \\n."""
    path = tmp_path / "fabric.out"
    path.write_bytes(TEXT.replace("\n", "\r\n").encode())
    assert _view(ibnet.parse_file(str(path), 333).nodes) == _view(ibnet.parse(TEXT, str(path)).nodes)


def test_a_node_line_quoted_in_a_comment_before_its_record(tmp_path: Path) -> None:
    """The slices may decline what the whole text reads (a record-like comment at a cut): same result."""
    text = TEXT.replace("\n\n", '\n\n#Ca\t1 "H-x"\t# "n mlx5_0"\n\n', 5)
    path = tmp_path / "fabric.out"
    path.write_text(text)
    assert _view(ibnet.parse_file(str(path), 64).nodes) == _view(ibnet.parse(text, str(path)).nodes)


def test_a_pipe_is_read_whole(tmp_path: Path) -> None:
    fifo = tmp_path / "fabric.fifo"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "w") as f:
            f.write(TEXT)

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        nodes = ibnet.parse_file(str(fifo)).nodes
    finally:
        writer.join()
    assert _view(nodes) == _view(ibnet.parse(TEXT, str(fifo)).nodes)


def test_each_kind_is_one_string_object() -> None:
    # 825,000 records at 100,000 hosts: a copy of "Ca" each was 42 MB.
    fast, careful = ibnet.read_fast(TEXT), ibnet.read_careful(TEXT)
    assert fast is not None and fast.nodes and careful.nodes
    kinds = [n.kind for fab in (fast, careful) for n in fab.nodes.values()]
    assert set(kinds) == {"Switch", "Ca"}
    assert len({id(k) for k in kinds}) == 2        # one object per kind, across both readers


def _grep_n(text: str, needle: str) -> int:
    """The line ``grep -n`` gives for the first line holding *needle*."""
    return text[:text.index(needle)].count("\n") + 1


@pytest.mark.parametrize("read", ["file", "text"])
def test_a_broken_link_names_the_line_grep_finds(tmp_path: Path, read: str) -> None:
    """The fast reader keeps no line numbers: the careful one, reading again, names the same line as grep -n.

    A form feed and a \\x1c in a description (str.splitlines() breaks at both) must not shift it.
    """
    text = TEXT.replace('"a08-p1-dgx-04-c01 mlx5_5"', '"a08-p1-dgx-04-c01\x0c\x1c mlx5_5"')
    # a peer port that names another port: the message is about the peer's record line
    text = text.replace('"H-e09d7303007a4bd8"[1]', '"H-e09d7303007a4bd8"[2]', 1)
    path = tmp_path / "fabric.out"
    path.write_text(text)
    msg = _message((lambda: ibnet.parse_file(str(path), 4096)) if read == "file"
                   else (lambda: ibnet.parse(text, "x")))
    assert "H-e09d7303007a4bd8 port 2 does not link back to S-2c5eab0300b87b40 port 1" in msg
    line = _grep_n(text, 'Ca\t1 "H-e09d7303007a4bd8"')
    assert msg.endswith(f":{line})")


def test_a_peer_never_described_names_the_port_line(tmp_path: Path) -> None:
    text = TEXT.replace('Ca\t1 "H-e09d7303007a4bd8"', 'Ca\t1 "H-gone"', 1)
    path = tmp_path / "fabric.out"
    path.write_text(text)
    msg = _message(lambda: ibnet.parse_file(str(path)))
    assert "H-e09d7303007a4bd8 (linked from S-2c5eab0300b87b40 port 1) is never described" in msg
    line = _grep_n(text, '"H-e09d7303007a4bd8"[1]')
    assert msg.endswith(f"{path}:{line})")


def test_crossed_cables_the_mirror_test_refuses_still_read_as_before(tmp_path: Path) -> None:
    """The rule is that a port's peer names this node back; a dump that only keeps that is still read.

    (The fast check that each link's far port names this port back refuses
    it: S-a port 1 reaches S-b port 1, which names S-a port 2.)
    """
    text = ('Switch\t2 "S-a"\t# "MF0;a:X"\n[1]\t"S-b"[1]\n[2]\t"S-b"[2]\n\n'
            'Switch\t2 "S-b"\t# "MF0;b:X"\n[1]\t"S-a"[2]\n[2]\t"S-a"[1]\n\n')
    fast = ibnet.read_fast(text)
    assert fast is not None and ibnet.links_hold(fast.nodes)
    nodes = fast.nodes
    assert nodes["S-a"].port(1) == (1, "S-b", 1) and nodes["S-b"].port(1) == (1, "S-a", 2)   # crossed
    path = tmp_path / "fabric.out"
    path.write_text(text)
    assert ibnet.parse_file(str(path)).nodes == ibnet.parse(text).nodes == nodes
    assert nodes["S-b"].ports == ((1, "S-a", 2), (2, "S-a", 1))
