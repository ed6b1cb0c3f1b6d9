"""jobs/mpsprocs.py: which processes count as the job's MPS daemon tree,
asserted whole on a /proc tree written by the test (the functions take its
path): mutants of the uid and environment filters survived the MPS tests
that run real daemons (docs/development.md, mutation testing).  The files
carry the fields the kernel writes, in its layout (proc_pid_status(5),
proc_pid_stat(5)).
"""
from __future__ import annotations

from pathlib import Path

from slurm_gpu.jobs import mpsprocs

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
