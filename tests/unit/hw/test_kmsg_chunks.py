"""read_file scans a kernel log in chunks: lines across chunk ends, lines
longer than a chunk and a last line still being written give exactly what
one scan of the whole file gives."""
from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gpu.hw import kmsg

XID = b"[  %d.000001] NVRM: Xid (PCI:0000:18:00): 13, pid=%d, name=a.out, Graphics SM Warp Exception\n"


@pytest.mark.parametrize("chunk", [7, 64, 100, 4096])
def test_chunked_scan_equals_one_scan(tmp_path: Path, monkeypatch, chunk: int) -> None:
    body = b""
    for i in range(40):
        body += XID % (i, i)
        body += b"[  %d.5] usb 1-1: " % i + b"x" * (i * 13) + b"\n"
        if i == 20:
            body += b"[  99.1] audit: " + b"y" * 900 + b"\n"      # longer than most chunks
    tail = b"[  100.0] NVRM: Xid (PCI:0000:18:00): 48, partial"      # no newline yet
    log = tmp_path / "kern.log"
    log.write_bytes(body + tail)
    want = kmsg.scan_buffer(body)
    monkeypatch.setattr(kmsg, "CHUNK", chunk)
    got, cur = kmsg.read_file(log)
    assert got == want and len(got) == 40
    assert cur.offset == len(body)                     # the partial line is read next time
    with open(log, "ab") as f:
        f.write(b"\n")
    more, cur2 = kmsg.read_file(log, cur)
    assert [x.text for x in more] == ["NVRM: Xid (PCI:0000:18:00): 48, partial"]
    assert cur2.offset == len(body + tail) + 1


def test_a_shorter_last_chunk_never_sees_the_last_chunks_bytes(tmp_path: Path, monkeypatch) -> None:
    """Every chunk is read into one buffer: what an earlier, longer chunk left
    past the new chunk's end (here: Xid lines) must not be scanned again."""
    xids = b"".join(XID % (i, i) for i in range(3))
    log = tmp_path / "kern.log"
    log.write_bytes(xids + b"[  9.0] usb 1-1: hi\n" + b"[  9.5] NVRM: Xid (PCI:0000:18:00): 48, partial")
    monkeypatch.setattr(kmsg, "CHUNK", len(xids))
    got, cur = kmsg.read_file(log)
    assert [x.text.split(",")[1] for x in got] == [" pid=0", " pid=1", " pid=2"]
    assert cur.offset == len(xids) + len(b"[  9.0] usb 1-1: hi\n")


@pytest.mark.parametrize("window", [20, 31, 64, 29_000])
def test_search_windows_miss_no_prefix_across_their_edges(window: int) -> None:
    """find_hits looks for each driver prefix in windows of *window* bytes:
    a prefix cut by a window's edge (at every offset), a pattern that fails
    where its literal matches (``nvidia-nvswitchX``) and the scan's own
    start/end give exactly what one search over the whole buffer gives;
    scan_buffer decides on those hits."""
    from slurm_gpu.hw import kmsg_scan
    lines = [b"[  1.0] NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n",
             b"[  1.1] nvidia-nvswitch2: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32\n",
             b"[  1.2] nvidia-nvswitchX: SXid (PCI:0000:05:00.0): 12028, not the driver's form\n",
             b"[  1.3] pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: 0000:03:00.0\n"]
    body = b"".join(b"[  0.%d] usb 1-1: " % pad + b"x" * pad + b"\n" + line
                    for pad in range(0, 70) for line in lines)
    one = len(body) + 1                                             # one window: plain bytes.find
    hits = kmsg_scan.find_hits(body, 0, len(body), one)
    assert [body[s:e].split(b":")[0] for _, s, e in hits] == [b"NVRM", b"nvidia-nvswitch2", b"AER"] * 70
    assert kmsg_scan.find_hits(body, 0, len(body), window) == hits
    assert kmsg_scan.find_hits(body, 0, len(body)) == hits          # the default window
    want = kmsg.scan_buffer(body)
    assert [k.text.split(":")[0] for k in want] == ["NVRM", "nvidia-nvswitch2", "0000"] * 70
    start, end = len(lines[0]) + 40, len(body) - 50
    part = kmsg_scan.find_hits(body, start, end, one)
    assert part and kmsg_scan.find_hits(body, start, end, window) == part
    assert kmsg.scan_buffer(body, start, end)[0].text == want[1].text      # the first line cut away
