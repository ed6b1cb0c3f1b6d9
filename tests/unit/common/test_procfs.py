"""procfs: the one reader of the boot id and /proc/PID/stat, over a fixture tree."""
from __future__ import annotations

import os

from slurm_gpu import procfs


def _proc(tmp_path, pid: int, comm: str, state: str, ppid: int, start: int) -> None:
    d = tmp_path / str(pid)
    d.mkdir(parents=True)
    # fields 3..22 of proc(5): state, ppid, then 17 more, then starttime (field 22)
    rest = [state, str(ppid)] + ["0"] * 17 + [str(start), "0", "0"]
    (d / "stat").write_bytes(f"{pid} ({comm}) ".encode() + " ".join(rest).encode() + b"\n")


def test_boot_id_and_stat_fields(tmp_path):
    (tmp_path / "sys/kernel/random").mkdir(parents=True)
    (tmp_path / "sys/kernel/random/boot_id").write_text("0f1e-boot\n")
    assert procfs.boot_id(str(tmp_path)) == "0f1e-boot"
    assert procfs.boot_id(str(tmp_path / "nowhere")) == ""
    # A job user names their process ") S 1 (" to confuse parsers: the last ')' ends the name.
    _proc(tmp_path, 42, "evil) Z 1 (x", "S", 7, 123456)
    assert procfs.stat(42, str(tmp_path))[0] == "evil) Z 1 (x"
    assert procfs.state(42, str(tmp_path)) == "S"
    assert procfs.parent(42, str(tmp_path)) == 7
    assert procfs.start_time(42, str(tmp_path)) == 123456
    assert procfs.stat(43, str(tmp_path)) is None and procfs.start_time(43, str(tmp_path)) is None


def test_parent_slurmd_walks_up_to_slurmd(tmp_path, monkeypatch):
    _proc(tmp_path, 300, "sh", "S", 200, 5)
    _proc(tmp_path, 200, "slurmd", "S", 1, 777)
    monkeypatch.setattr(os, "getppid", lambda: 300)
    assert procfs.parent_slurmd(proc=str(tmp_path)) == "200:777"
    assert procfs.parent_slurmd(max_depth=1, proc=str(tmp_path)) is None
    _proc(tmp_path, 400, "slurmd (fake", "S", 1, 9)     # not slurmd: its name only starts so
    monkeypatch.setattr(os, "getppid", lambda: 400)
    assert procfs.parent_slurmd(proc=str(tmp_path)) is None


def test_the_live_proc_agrees_with_os():
    st = procfs.stat(os.getpid())
    assert st is not None and procfs.parent(os.getpid()) == os.getppid()
    assert procfs.state(os.getpid()) in ("R", "S")


def _task(root, pid, tid, state, wchan):  # type: ignore[no-untyped-def]
    d = root / str(pid) / "task" / str(tid)
    d.mkdir(parents=True)
    rest = " ".join(["0"] * 17)
    (d / "stat").write_text(f"{tid} (x) {state} 1 {rest} 4242 0 0\n")
    (d / "wchan").write_text(wchan)


def test_a_process_counts_as_held_in_fuse_when_any_thread_waits_there(tmp_path) -> None:
    """/proc/PID/wchan is the leader's alone: every thread is read (review round 4, M4).
    One in a FUSE wait is enough, the others may wait behind it in the VFS (round 5,
    H2); whether FUSE was all that held it shows once the user's connections are
    aborted (the MPS tests: a process still stuck then is the node's)."""
    root = tmp_path
    _task(root, 10, 10, "D", "request_wait_answer")
    _task(root, 10, 11, "S", "futex_wait_queue")             # asleep, killable: ends with SIGKILL
    _task(root, 11, 11, "Z", "0")                            # the leader gone, a thread in FUSE
    _task(root, 11, 12, "D", "fuse_lock_inode")
    _task(root, 12, 12, "D", "request_wait_answer")
    _task(root, 12, 13, "D", "filename_create")               # behind 12's lock, or a driver's
    _task(root, 13, 13, "R", "0")
    _task(root, 14, 14, "D", "os_acquire_mutex")              # stuck in the driver
    assert procfs.in_fuse_request(10, str(root)) == "request_wait_answer"
    assert procfs.in_fuse_request(11, str(root)) == "fuse_lock_inode"
    assert procfs.in_fuse_request(12, str(root)) == "request_wait_answer"
    assert procfs.in_fuse_request(13, str(root)) == ""
    assert procfs.in_fuse_request(14, str(root)) == ""
    assert procfs.in_fuse_request(99, str(root)) == ""        # gone


def test_read_each_waits_for_a_worker_that_is_only_slow_not_stuck(tmp_path) -> None:
    """A loaded node (stop 32's CI: unit tests, QEMU and debootstrap beside the
    integration tests) makes a read take longer than *wait* while the worker runs,
    blocked nowhere: here READ_CAP bytes against a 0.2 ms wait.  Nothing is given up
    (a process skipped there was an MPS daemon taken for gone, and a drain)."""
    f = tmp_path / "big"
    f.write_bytes(b"A" * procfs.READ_CAP)
    f.read_bytes()                      # in the page cache: a read runs, never waits on a disk
    got = procfs.read_each([str(f)] * 3, wait=0.0002, give_up=1)
    assert [len(g) if g is not None else None for g in got] == [procfs.READ_CAP] * 3


def test_read_each_leaves_no_reader_thread_behind(tmp_path) -> None:
    """Once every path is read, its worker has ended before read_each returns: a
    daemon thread still running when a hook's interpreter exits crashed it
    (SIGSEGV at finalization, CPython 3.11: the epilog 'killed by signal 11' that
    drained the node in stop 32's CI)."""
    import threading
    f = tmp_path / "environ"
    f.write_bytes(b"A=1\0")
    for _ in range(20):
        assert procfs.read_each([str(f)] * 5) == [b"A=1\0"] * 5
        assert [t.name for t in threading.enumerate() if t.name == "sg-proc-read"] == []


def test_read_each_reads_no_more_than_an_environment_can_hold(tmp_path) -> None:
    """execve(2) bounds argv plus environ to 6 MiB (3/4 of _STK_LIM); a process can point
    its environment at GiBs of zeros afterwards (prctl PR_SET_MM_MAP, no privilege),
    which a root scan would read, then split, in full: seconds and GiBs of root's
    memory per process (review round 5, R4).  At most READ_CAP bytes are read."""
    f = tmp_path / "environ"
    with open(f, "wb") as out:
        out.truncate(procfs.READ_CAP + (4 << 20))        # sparse: zeros, as such a map reads
    got = procfs.read_each([str(f)])
    assert got[0] is not None and len(got[0]) == procfs.READ_CAP
