"""jobs/mpsprocs.py: which processes count as the job's MPS daemon tree,
asserted whole on a /proc tree written by the test (the functions take its
path): mutants of the uid and environment filters survived the MPS tests
that run real daemons (docs/development.md, mutation testing).  The files
carry the fields the kernel writes, in its layout (proc_pid_status(5),
proc_pid_stat(5)).

The rest runs real processes (``cat`` reading a pipe of the test's, so that
none outlives it) as the job user ``sgtest1``: what the PID-reuse checks,
the waits and the kills act on is the live kernel's ``/proc`` and pidfds.
"""
from __future__ import annotations

import errno
import os
import pwd
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu import procfs
from slurm_gpu.jobs import mps, mpsprocs
from slurm_gpu.jobs.settings import MpsSettings

PIPE = "/run/mps/100/pipe"


def _proc(root: Path, pid: int, ppid: int, uids: tuple[int, int, int, int], env: list[str],
          start: int = 4242) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    u = "\t".join(str(x) for x in uids)
    (d / "status").write_text(f"Name:\tnvidia-cuda-mps\nUmask:\t0022\nState:\tS (sleeping)\n"
                              f"Tgid:\t{pid}\nNgid:\t0\nPid:\t{pid}\nPPid:\t{ppid}\n"
                              f"TracerPid:\t0\nUid:\t{u}\nGid:\t{u}\nFDSize:\t64\n")
    rest = " ".join(["0"] * 17)         # pgrp .. num_threads, itrealvalue
    (d / "stat").write_text(f"{pid} (nvidia-cuda-mps) S {ppid} {rest} {start} 0 0\n")
    (d / "environ").write_bytes(b"".join(e.encode() + b"\0" for e in env))


def _node(tmp_path: Path) -> str:
    root = tmp_path / "proc"
    mine = [f"CUDA_MPS_PIPE_DIRECTORY={PIPE}", "HOME=/home/u"]
    _proc(root, 10, 1, (1001,) * 4, mine, start=500)            # the daemon
    _proc(root, 11, 1, (0,) * 4, mine)                          # root's: never
    _proc(root, 12, 1, (1001, 0, 1001, 1001), mine)             # setuid: never
    _proc(root, 13, 1, (1002,) * 4, mine, start=600)            # another user's
    _proc(root, 14, 1, (1001,) * 4, ["HOME=/home/u"])           # not bound to the pipe
    _proc(root, 15, 1, (1001,) * 4, [f"CUDA_MPS_PIPE_DIRECTORY={PIPE}2"])
    _proc(root, 20, 10, (1001,) * 4, ["HOME=/home/u"], start=700)   # dropped the variable
    _proc(root, 21, 20, (1001,) * 4, [], start=800)                   # and its child
    _proc(root, 22, 10, (1002,) * 4, [])                              # another user's child
    _proc(root, 23, 11, (1001,) * 4, [])                              # below root's process
    (root / "self").mkdir()
    return str(root)


def test_daemon_procs_takes_only_the_users_own_processes_bound_to_the_pipe(tmp_path: Path) -> None:
    proc = _node(tmp_path)
    assert mpsprocs.daemon_procs(PIPE, 1001, proc) == {10: (500, 1001)}
    assert mpsprocs.daemon_procs(PIPE, 1002, proc) == {13: (600, 1002)}
    assert mpsprocs.daemon_procs(PIPE, None, proc) == {10: (500, 1001), 13: (600, 1002)}
    assert mpsprocs.daemon_procs(PIPE, 0, proc) == {}
    assert mpsprocs.daemon_pids(PIPE, proc, 1001) == [10]


def test_daemon_tree_adds_the_users_descendants_only(tmp_path: Path) -> None:
    proc = _node(tmp_path)
    assert mpsprocs.daemon_tree(PIPE, 1001, proc) == {10: (500, 1001), 20: (700, 1001),
                                                      21: (800, 1001)}
    # without a known user: the bound processes alone, no tree
    assert mpsprocs.daemon_tree(PIPE, None, proc) == {10: (500, 1001), 13: (600, 1002)}


def test_a_job_user_of_uid_1_is_still_a_user_and_a_leaf_daemon_has_no_tree(tmp_path: Path) -> None:
    proc = _node(tmp_path)
    root = Path(proc)
    _proc(root, 30, 1, (1,) * 4, [f"CUDA_MPS_PIPE_DIRECTORY={PIPE}"], start=900)
    _proc(root, 31, 30, (1,) * 4, [], start=901)
    assert mpsprocs.daemon_procs(PIPE, 1, proc) == {30: (900, 1)}
    assert mpsprocs.daemon_tree(PIPE, 1, proc) == {30: (900, 1), 31: (901, 1)}
    assert mpsprocs.daemon_tree(PIPE, 1002, proc) == {13: (600, 1002)}     # no children


def test_a_process_gone_or_unreadable_mid_scan_is_skipped(tmp_path: Path) -> None:
    proc = _node(tmp_path)
    root = Path(proc)
    _proc(root, 8, 1, (1001,) * 4, [f"CUDA_MPS_PIPE_DIRECTORY={PIPE}"])
    (root / "8" / "stat").unlink()                          # exited after the status pass
    _proc(root, 9, 1, (1001,) * 4, [])
    (root / "9" / "environ").unlink()
    (root / "9" / "environ").mkdir()                        # environ unreadable
    uids = (1001,) * 4
    table = {8: (uids, 1), 9: (uids, 1), 10: (uids, 1)}     # scanned in this order
    assert mpsprocs.daemon_procs(PIPE, 1001, proc, table) == {10: (500, 1001)}


def test_daemon_tree_walks_on_past_a_bound_process_met_again(tmp_path: Path) -> None:
    """The MPS server is the control daemon's child and keeps the pipe
    variable, so the walk meets it again below the daemon: it must go on to
    the rest of the tree, not stop there.  This shape loses a process when
    the walk stops, whatever order /proc lists the processes in."""
    root = tmp_path / "proc"
    bound = [f"CUDA_MPS_PIPE_DIRECTORY={PIPE}"]
    _proc(root, 40, 1, (1001,) * 4, bound, start=400)          # control daemon
    _proc(root, 41, 40, (1001,) * 4, bound, start=410)         # server, bound too
    _proc(root, 42, 41, (1001,) * 4, [], start=420)            # the server's child
    _proc(root, 43, 41, (1001,) * 4, bound, start=430)         # a bound client of the server
    _proc(root, 44, 40, (1001,) * 4, [], start=440)            # the daemon's other child
    assert mpsprocs.daemon_tree(PIPE, 1001, str(root)) == {
        40: (400, 1001), 41: (410, 1001), 42: (420, 1001), 43: (430, 1001), 44: (440, 1001)}


def _job_user() -> tuple[int, int]:
    if os.geteuid() != 0:
        pytest.skip("needs root to run processes as the job user")
    try:
        pw = pwd.getpwnam("sgtest1")
    except KeyError:
        pytest.skip("user sgtest1 missing")
    return pw.pw_uid, pw.pw_gid


class _Procs:
    """Processes started by one test, each a ``cat`` that ends when its stdin closes."""

    def __init__(self) -> None:
        self.all: list[subprocess.Popen[bytes]] = []

    def cat(self, uid: int | None = None, gid: int | None = None,
            env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             env={"PATH": "/usr/bin:/bin", **(env or {})}, user=uid,
                             group=gid, extra_groups=[] if uid is not None else None)
        self.all.append(p)
        return p

    def leaderless(self, uid: int, gid: int) -> int:
        """A process of uid's whose main thread has exited (pthread_exit) while another
        thread runs on: ``Z`` in its ``/proc/PID/stat``, alive in ``task/*/stat``."""
        code = ("import ctypes, sys, threading\n"
                "threading.Thread(target=sys.stdin.buffer.read).start()\n"
                "ctypes.CDLL(None).pthread_exit(None)\n")
        p = subprocess.Popen(["/usr/bin/python3", "-I", "-c", code], stdin=subprocess.PIPE,
                             env={"PATH": "/usr/bin:/bin"}, user=uid, group=gid, extra_groups=[])
        self.all.append(p)
        deadline = time.monotonic() + 10
        while procfs.state(p.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert procfs.state(p.pid) == "Z" and len(os.listdir(f"/proc/{p.pid}/task")) == 2
        return p.pid

    def zombie(self, uid: int, gid: int) -> int:
        """A child of uid's that has exited and is not reaped yet."""
        p = self.cat(uid, gid)
        assert p.stdin is not None
        p.stdin.close()
        os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)    # exited, left unreaped
        return p.pid

    def end(self) -> None:
        for p in self.all:
            if p.stdin is not None:
                p.stdin.close()
            p.kill()
            p.wait()


@pytest.fixture
def procs() -> Iterator[_Procs]:
    ps = _Procs()
    yield ps
    ps.end()


def _start(pid: int) -> int:
    st = procfs.start_time(pid)
    assert st is not None
    return st


def test_the_live_proc_by_default(tmp_path: Path, procs: _Procs) -> None:
    """mps calls daemon_procs and daemon_tree without a proc root."""
    uid, gid = _job_user()
    pipe = str(tmp_path / "pipe")
    d = procs.cat(uid, gid, {"CUDA_MPS_PIPE_DIRECTORY": pipe})
    procs.cat(uid, gid, {"CUDA_MPS_PIPE_DIRECTORY": pipe + "2"})
    want = {d.pid: (_start(d.pid), uid)}
    assert mpsprocs.daemon_procs(pipe, uid) == want
    assert mpsprocs.daemon_tree(pipe, uid) == want


def test_daemon_pids_takes_the_pipe_owner_else_any_user(tmp_path: Path) -> None:
    _job_user()
    root = tmp_path / "proc"
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    os.chown(pipe, 1001, 1001)
    bound = [f"CUDA_MPS_PIPE_DIRECTORY={pipe}"]
    _proc(root, 10, 1, (1001,) * 4, bound, start=500)
    _proc(root, 13, 1, (1002,) * 4, bound, start=600)      # another user's
    _proc(root, 11, 1, (0,) * 4, bound)                     # root's
    assert mpsprocs.daemon_pids(str(pipe), str(root)) == [10]
    pipe.rmdir()                                            # gone: the owner is unknown
    assert mpsprocs.daemon_pids(str(pipe), str(root)) == [10, 13]


def test_children_of_ours_are_the_users_live_children_of_every_thread(
        tmp_path: Path, procs: _Procs, monkeypatch: pytest.MonkeyPatch) -> None:
    uid, gid = _job_user()
    monkeypatch.chdir(tmp_path)                 # nothing relative resolves to /proc
    a = procs.cat(uid, gid)
    dead = procs.zombie(uid, gid)
    procs.cat()                                 # ours, but root's
    # A child forked by another thread is listed in that thread's children file.
    started, done = threading.Event(), threading.Event()
    from_thread: list[subprocess.Popen[bytes]] = []

    def fork() -> None:
        from_thread.append(procs.cat(uid, gid))
        started.set()
        done.wait()
    t = threading.Thread(target=fork)
    t.start()
    try:
        started.wait()
        b = from_thread[0]
        assert mpsprocs.children_of_ours(uid) == {a.pid: (_start(a.pid), uid),
                                                  b.pid: (_start(b.pid), uid)}
    finally:
        done.set()
        t.join()
    # Without /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN off): the
    # parent PIDs of one pass over the proc root; everything read from it.
    fake = tmp_path / "proc"
    me = os.getpid()
    _proc(fake, a.pid, me, (uid,) * 4, [], start=4242)
    _proc(fake, dead, me, (uid,) * 4, [], start=4243)          # a zombie (in that root too)
    zst = fake / str(dead) / "stat"
    zst.write_text(zst.read_text().replace(" S ", " Z ", 1))
    _proc(fake, b.pid, 1, (uid,) * 4, [], start=4244)          # not a child
    assert mpsprocs.children_of_ours(uid, str(fake)) == {a.pid: (4242, uid)}


def test_children_of_ours_judge_liveness_in_the_proc_root_they_are_given(
        tmp_path: Path, procs: _Procs) -> None:
    """A child alive in the live /proc but a zombie in the given root is not live there."""
    uid, gid = _job_user()
    a = procs.cat(uid, gid)
    fake = tmp_path / "proc"
    _proc(fake, a.pid, os.getpid(), (uid,) * 4, [], start=4242)
    st = fake / str(a.pid) / "stat"
    st.write_text(st.read_text().replace(" S ", " Z ", 1))
    assert mpsprocs.children_of_ours(uid, str(fake)) == {}


def test_reap_ended_children_takes_only_the_users_ended_children_outside_skip(procs: _Procs) -> None:
    """Each ended child of uid's is waited for once, with its status; a live one, another
    user's, and one in *skip* are left to whoever waits on them."""
    uid, gid = _job_user()
    mpsprocs.reap_ended_children(uid)     # what earlier tests in this process left ended
    live = procs.cat(uid, gid)
    skipped = procs.zombie(uid, gid)
    ended = procs.cat(uid, gid)
    os.kill(ended.pid, 9)
    os.waitid(os.P_PID, ended.pid, os.WEXITED | os.WNOWAIT)
    roots = procs.cat()
    assert roots.stdin is not None
    roots.stdin.close()
    os.waitid(os.P_PID, roots.pid, os.WEXITED | os.WNOWAIT)
    got = mpsprocs.reap_ended_children(uid, frozenset({skipped}))
    assert [(os.WTERMSIG(st), leader) for st, leader in got if os.WIFSIGNALED(st)] == [(9, False)] \
        and len(got) == 1, got
    assert mpsprocs.reap_ended_children(uid, frozenset({skipped})) == []      # reaped once
    assert live.poll() is None
    # The skipped zombie, root's, and the live child: still ours to wait for.
    assert os.waitpid(skipped, os.WNOHANG)[0] == skipped
    assert os.waitpid(roots.pid, os.WNOHANG)[0] == roots.pid


def test_recorded_daemon_is_the_same_live_process_of_the_user(procs: _Procs) -> None:
    uid, gid = _job_user()
    a = procs.cat(uid, gid)
    rooted = procs.cat()
    dead = procs.zombie(uid, gid)
    start = _start(a.pid)

    def rec(pid: int, st: int) -> mps.MpsRecord:
        return {"daemon": [[pid, st]]}
    assert mps.recorded_daemon(rec(a.pid, start), uid) == {a.pid: (start, uid)}
    assert mps.recorded_daemon(rec(a.pid, start + 1), uid) == {}        # a recycled PID
    assert mps.recorded_daemon(rec(a.pid, start), uid + 1) == {}        # another user's
    assert mps.recorded_daemon(rec(rooted.pid, _start(rooted.pid)), uid) == {}
    assert mps.recorded_daemon(rec(dead, _start(dead)), uid) == {}      # exited


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "polling"])
def test_a_recorded_daemon_whose_main_thread_exited_is_still_found_and_killed(
        tmp_path: Path, procs: _Procs, monkeypatch: pytest.MonkeyPatch, pidfds: bool) -> None:
    """A daemon whose main thread called pthread_exit while another runs on (perhaps
    stuck in the driver) reads ``Z`` in /proc/PID/stat: still the job's, still
    killed, never taken for gone (review round 5, H3)."""
    uid, gid = _job_user()
    if not pidfds:
        _no_pidfds(monkeypatch)
    pid = procs.leaderless(uid, gid)
    start = _start(pid)
    assert mps.recorded_daemon({"daemon": [[pid, start]]}, uid) == {pid: (start, uid)}
    user = mps.JobUser(uid=uid, gid=gid, name="sgtest1")
    settings = MpsSettings(base_dir=str(tmp_path / "mps"))
    assert mps.stop(settings, {"daemon": [[pid, start]]}, "98765432", user) == \
        [f"MPS: killed stragglers {pid}"]
    assert procs.all[-1].wait(10) == -signal.SIGKILL


def _no_pidfds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux before 5.3 (RHEL 8's 4.18): pidfd_open(2) fails with ENOSYS."""
    def pidfd_open(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
    monkeypatch.setattr(os, "pidfd_open", pidfd_open)


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "polling"])
def test_epilog_kills_a_straggler_by_pid_and_start_time(
        tmp_path: Path, procs: _Procs, monkeypatch: pytest.MonkeyPatch, pidfds: bool) -> None:
    uid, gid = _job_user()
    if not pidfds:
        _no_pidfds(monkeypatch)
    p = procs.cat(uid, gid)
    user = mps.JobUser(uid=uid, gid=gid, name="sgtest1")
    settings = MpsSettings(base_dir=str(tmp_path / "mps"))
    info: mps.MpsRecord = {"daemon": [[p.pid, _start(p.pid)]]}
    assert mps.stop(settings, info, "98765431", user) == [f"MPS: killed stragglers {p.pid}"]
    assert p.wait() == -signal.SIGKILL


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "polling"])
def test_wait_gone_waits_for_the_exit(procs: _Procs, monkeypatch: pytest.MonkeyPatch,
                                      pidfds: bool) -> None:
    uid, gid = _job_user()
    if not pidfds:
        _no_pidfds(monkeypatch)
    p = procs.cat(uid, gid)
    reaped = procs.cat(uid, gid)
    ident = (_start(reaped.pid), uid)
    reaped.kill()
    reaped.wait()
    dead = procs.zombie(uid, gid)
    t = threading.Timer(0.05, p.kill)
    t.start()
    try:
        # No timeout in sight: it returns when the process exits.
        mpsprocs.wait_gone({reaped.pid: ident, dead: (_start(dead), uid),
                            p.pid: (_start(p.pid), uid)}, 600)
        assert os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    finally:
        t.cancel()


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "polling"])
def test_wait_gone_gives_up_at_the_timeout_not_before(
        procs: _Procs, monkeypatch: pytest.MonkeyPatch, pidfds: bool) -> None:
    uid, gid = _job_user()
    if not pidfds:
        _no_pidfds(monkeypatch)
    dead = procs.zombie(uid, gid)
    p = procs.cat(uid, gid)
    t0 = time.monotonic()
    mpsprocs.wait_gone({dead: (_start(dead), uid), p.pid: (_start(p.pid), uid)}, 0.05)
    assert time.monotonic() - t0 >= 0.05        # a lower bound: the wait's own promise
    assert p.poll() is None


def _in_thread(fn, *args):  # type: ignore[no-untyped-def]
    """fn(*args) in a thread; its result, or a failure if it is still blocked after 30 s
    (a safety bound, not a speed check: a blocked read never returns)."""
    box: list[object] = []
    t = threading.Thread(target=lambda: box.append(fn(*args)), daemon=True)
    t.start()
    t.join(30)
    assert box, f"{fn.__name__} blocked on a process's environment"
    return box[0]


def test_a_process_whose_environment_never_reads_is_skipped_not_waited_on(tmp_path: Path) -> None:
    """Reading /proc/PID/environ takes the target's mmap lock, which its own threads can
    hold while one waits on their user's FUSE server (procfs.read_each): such a read
    does not return.  Stood in for by a FIFO without a writer (open blocks) and a FIFO
    with one that never writes (read blocks): the scan goes on past both, and the
    daemon, bound to the pipe, is still found."""
    proc = _node(tmp_path)
    root = Path(proc)
    for pid in (5, 6):
        _proc(root, pid, 1, (1001,) * 4, [])
        (root / str(pid) / "environ").unlink()
        os.mkfifo(root / str(pid) / "environ")
    held = os.open(root / "6" / "environ", os.O_RDWR)       # a writer that never writes
    try:
        uids = (1001,) * 4
        table = {5: (uids, 1), 6: (uids, 1), 10: (uids, 1), 20: (uids, 10), 21: (uids, 20)}
        assert _in_thread(mpsprocs.daemon_procs, PIPE, 1001, proc, table) == {10: (500, 1001)}
        assert _in_thread(mpsprocs.daemon_tree, PIPE, 1001, proc) == {
            10: (500, 1001), 20: (700, 1001), 21: (800, 1001)}
    finally:
        os.close(held)                  # what still reads them (a thread given up) ends
        try:
            os.close(os.open(root / "5" / "environ", os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass                        # nothing waits on it
