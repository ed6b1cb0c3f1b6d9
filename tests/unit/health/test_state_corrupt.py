"""Issue 10, point 6: corrupt state is dropped with one warning, never fatal.

A health state, a kernel-log cursor or a job state file with wrong types,
negative offsets or absurd numbers must not make every later run exit 3, nor
blind the XID check until the next reboot.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_gpu.health import engine
from slurm_gpu.hw import kmsg
from kmsgfake import serving
from test_health_drain import R, XID79, opts, slurm  # noqa: F401  (slurm: the fixture)


def _state(tmp_path: Path, text: str) -> Path:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    p = Path(engine.state_file(state, "n1"))
    p.write_text(text)
    return p


def _log(tmp_path: Path) -> Path:
    log = tmp_path / "kern.log"
    log.write_text(XID79)
    return log


@pytest.mark.parametrize("memory", [
    '{"clean_runs": Infinity}', '{"clean_runs": 1e400}', '{"clean_runs": -3}', '{"clean_runs": 10000000000}',
    '{"clean_runs": true}', '{"pending_reason": "not ours"}', '{"drained_reason": 5}',
    '{"pending_reason": "slurm-gpu: x\\ny"}', '{"isolated": ["0000:07:00.0", {"a": 1}]}', '{"boot_id": []}',
])
def test_absurd_memory_is_dropped_with_one_warning(tmp_path, slurm, memory):
    log = _log(tmp_path)
    _state(tmp_path, '{"memory": %s}' % memory)
    r = engine.run(opts(tmp_path, log))
    assert r.broken is None and r.action == "drain" and slurm.updates[-1][4] == f"reason={R}"
    assert len([n for n in r.notes if "dropped" in n and "state" in n]) == 1, r.notes


@pytest.mark.parametrize("cursor", [
    {"files": {"LOG": {"inode": "INODE", "offset": -5, "mark": ""}}},
    {"files": {"LOG": {"inode": "INODE", "offset": -5}}},
    {"files": {"LOG": {"inode": -1, "offset": 0}}},
    {"files": {"LOG": {"inode": "INODE", "offset": 1 << 70}}},
    {"files": {"LOG": {"inode": "INODE", "offset": 3, "mark": "zz"}}},
    {"files": {"LOG": {"inode": "INODE", "offset": 3, "mark": "ab" * 5000}}},
    {"events": {"inode": 1, "offset": -7}},
    {"kmsg": {"boot_id": "b", "seq": -9}},
])
def test_bad_cursor_is_dropped_and_the_log_is_read_again(tmp_path, slurm, cursor):
    log = _log(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    (state / engine.EVENTS_FILE).write_text("")
    text = json.dumps({"cursor": cursor}).replace('"INODE"', str(log.stat().st_ino)).replace("LOG", str(log))
    _state(tmp_path, text)
    r = engine.run(opts(tmp_path, log))
    assert r.broken is None, r.broken
    assert r.action == "drain"
    assert len([n for n in r.notes if "dropped" in n]) == 1, r.notes
    assert not any("dropped" in n for n in engine.run(opts(tmp_path, log)).notes)   # rewritten: warned once


def test_a_state_of_unparseable_json_numbers_is_dropped(tmp_path, slurm):
    log = _log(tmp_path)
    _state(tmp_path, '{"memory": {"clean_runs": %s}}' % ("9" * 5000))
    r = engine.run(opts(tmp_path, log))
    assert r.broken is None and r.action == "drain"
    assert len([n for n in r.notes if "dropped" in n]) == 1


RECS = [b"6,10,100,-;usb 1-1: x\n", b"3,11,200,-;NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.\n"]


def test_a_kmsg_cursor_from_the_future_does_not_blind_the_check():
    # A cursor past every record this boot holds (a corrupt or hand-edited
    # file) would skip every record until reboot: it is dropped instead.
    with serving(RECS, boot="b"):
        lines, cur = kmsg.read_kmsg(kmsg.KmsgCursor("b", 10 ** 15), device="/dev/null")
    assert len(lines) == 1 and cur.seq == 11


def test_a_kmsg_cursor_at_the_last_record_reads_nothing_new():
    with serving(RECS, boot="b"):
        lines, cur = kmsg.read_kmsg(kmsg.KmsgCursor("b", 11), device="/dev/null")
    assert lines == [] and cur.seq == 11


def test_read_file_with_negative_offset_reads_from_the_top(tmp_path):
    log = _log(tmp_path)
    lines, cur = kmsg.read_file(log, kmsg.FileCursor(str(log), log.stat().st_ino, -4, ""))
    assert len(lines) == 1 and cur.offset == len(XID79)


def test_read_events_with_negative_offset_reads_from_the_top(tmp_path):
    ev = tmp_path / "ev.jsonl"
    ev.write_text(json.dumps({"event": "xid", "xid": 79, "gpu": "0000:02:00.0"}) + "\n")
    recs, doc = kmsg.read_events(str(ev), {"events": {"inode": ev.stat().st_ino, "offset": -3, "mark": ""}})
    assert [r["xid"] for r in recs] == [79]


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_state_path_that_is_no_file_is_moved_aside(tmp_path, slurm, kind):
    # A directory there failed every save (exit 3 forever); a FIFO blocked every read.
    log = _log(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    p = Path(engine.state_file(state, "n1"))
    p.mkdir() if kind == "directory" else os.mkfifo(p)
    r = engine.run(opts(tmp_path, log))
    assert r.broken is None and r.action == "drain"
    assert len([n for n in r.notes if "dropped" in n and "not a regular file" in n]) == 1, r.notes
    assert p.is_file() and Path(f"{p}.corrupt").exists()
    r2 = engine.run(opts(tmp_path, log))
    assert r2.broken is None and not any("dropped" in n for n in r2.notes)
