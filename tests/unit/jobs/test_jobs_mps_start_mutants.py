"""jobs.mps, what the prolog tests left open of the daemon's start (mutmut on
``_start_daemon``, ``_ended_early`` and ``_closed_to_others``, issue 24 §8).

Through the prolog (:func:`lifecycle.prolog`: the job's error, whole, or the
node's one line, and the MPS record its state file keeps).  The launchers here
are scripts of the test's, run as the job's user as NVIDIA's binary is: one
whose ``-d`` leaves ended processes behind, as a daemon killed at once does.
"""
from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from test_jobs_lifecycle import Env
from test_jobs_mps_mounts import _after_make_dirs, _mount
from test_jobs_mps_mutants import node  # noqa: F401 - the root + sgtest1 node fixture
from test_jobs_mps_rest_mutants import (_client_fails_after, _node_fault, _patch_run, _prolog,
                                        _script, _short, _user_failed, stop_daemon)

from slurm_gpu import runner
from slurm_gpu.jobs import lifecycle, libc, mps
from slurm_gpu.jobs import state as js
from slurm_gpu.jobs.mpsprocs import daemon_pids
from slurm_gpu.jobs.settings import MpsSettings
from slurm_gpu.procfs import start_time, state

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs the daemon as a job user")


def _no_subreaper(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel before 3.4 refuses PR_SET_CHILD_SUBREAPER (EINVAL), which
    :func:`libc.set_child_subreaper` answers with False."""
    monkeypatch.setattr(libc, "set_child_subreaper", lambda on: False)


# -- no subreaper: the daemon is the job user's process bound to the pipe ----------

def test_without_a_subreaper_the_daemon_is_the_users_process_bound_to_the_pipe(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another user's process naming the job's pipe directory is never taken for the
    daemon, and no daemon is recorded by PID (none was ours to collect)."""
    _no_subreaper(monkeypatch)
    pipe = f"{node.mps.base_dir}/100/pipe"
    other = subprocess.Popen(["/bin/sleep", "60"], env={"CUDA_MPS_PIPE_DIRECTORY": pipe},
                             user="nobody")
    try:
        rc, st = _prolog(node)
        assert rc == 0 and st is not None and st.mps is not None, node.logs
        assert st.phase == "ready" and st.mps["ready"] is True
        assert st.mps["pids"] == daemon_pids(pipe) and len(st.mps["pids"]) == 1
        assert other.pid not in st.mps["pids"]
        assert st.mps["daemon"] == []
        assert lifecycle.epilog(node.ctx()) == 0, node.logs
        assert other.poll() is None                 # never the epilog's to end
    finally:
        other.kill()
        other.wait()
    assert node.leftovers() == []


def test_without_a_subreaper_a_daemon_stopped_by_its_user_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_subreaper(monkeypatch)
    _short(node)
    _client_fails_after(monkeypatch, stop_daemon)
    assert _user_failed(node) == ("MPS control daemon was stopped before it answered "
                                  "(by a process of the job's user?) (job 100)")


# -- -d's processes ended before the prolog saw them: their exit statuses ------------

# A launcher whose -d forks one process per status, leaves them ended (zombies:
# the prolog, their subreaper, collects them once it exits) and exits 0; its
# client never finds a daemon, as NVIDIA's says.
_LAUNCHER = '''#!/usr/bin/python3
import os, sys, time
if sys.argv[1:] != ["-d"]:
    sys.stderr.write("Cannot find MPS control daemon process\\n")
    sys.exit(1)
kids = []
for how, n in %r:
    pid = os.fork()
    if pid == 0:
        if how == "signal":
            os.kill(os.getpid(), n)
        os._exit(n)
    kids.append(pid)
def ended(pid):
    with open("/proc/%%d/stat" %% pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"
while not all(ended(p) for p in kids):
    time.sleep(0.001)
if %r == "hang":
    time.sleep(60)
sys.exit(%r)
'''


@pytest.mark.parametrize("launcher", [0, 1, "hang"])                 # -d's own end: 1 or hung says nothing
@pytest.mark.parametrize("ends, how", [
    ([("exit", 1), ("signal", 9)], "killed by signal 9"),     # the signal names the cause
    ([("exit", 0), ("exit", 3)], "exit status 3"),            # -d's own 0 is no failure
])
def test_processes_of_the_launch_that_ended_badly_fail_the_job(
        node: Env, ends: list[tuple[str, int]], how: str, launcher: int | str) -> None:
    """An ended child of the prolog's process from before the launch (tests run
    many prologs in one process) is neither counted nor collected."""
    ctl = node.base / "ended-mps-control"
    ctl.write_text(_LAUNCHER % (ends, launcher, launcher if launcher != "hang" else 0))
    ctl.chmod(0o755)
    _short(node, str(ctl), 0.5)
    earlier = subprocess.Popen(["/bin/sh", "-c", "kill -9 $$"], user="sgtest1")
    while state(earlier.pid) != "Z":
        time.sleep(0.001)
    try:
        assert _user_failed(node) == (f"MPS control daemon exited before it answered ({how}; "
                                      "by a process of the job's user?) (job 100)")
    finally:
        assert earlier.wait() == -9


# -- a base job users cannot search: named as given, or as it resolves ---------------

def test_a_base_reached_through_a_symlink_into_a_closed_directory_is_the_nodes_fault(
        node: Env) -> None:
    """Every directory on the base's named path lets others search, but its symlink
    leads into one that does not: NVIDIA's launcher cannot reach the pipe."""
    closed = node.base / "closed"
    (closed / "real").mkdir(parents=True, mode=0o755)
    closed.chmod(0o700)
    (node.base / "link").symlink_to(closed / "real")
    base = node.base / "link" / "mps"
    node.mps = MpsSettings(control=node.mps.control, base_dir=str(base), start_timeout=5,
                           quit_timeout=1)
    assert _node_fault(node) == (f"slurm-gpu: MPS base directory is not searchable by job users "
                                 f"({closed} lacks the x bit for others) ({base})")


# -- what the record keeps of a start --------------------------------------------------

def test_the_record_keeps_the_daemon_by_pid_and_start_time_and_how_long_the_start_took(
        node: Env) -> None:
    t0 = time.monotonic()
    rc, st = _prolog(node)
    took = time.monotonic() - t0
    assert rc == 0 and st is not None and st.mps is not None, node.logs
    assert st.mps["ready"] is True
    (pid,) = st.mps["pids"]
    assert st.mps["daemon"] == [[pid, start_time(pid)]] and pid in daemon_pids(st.mps["pipe_dir"])
    assert isinstance(st.mps["start_s"], float) and 0 < st.mps["start_s"] <= took
    # One client session asked whether the daemon answers (NVIDIA's daemon logs each command).
    log = (Path(st.mps["log_dir"]) / "control.log").read_text()
    assert [x.split("Cmd:", 1)[1] for x in log.splitlines() if "Cmd:" in x] == ["get_server_list"]
    assert lifecycle.epilog(node.ctx()) == 0, node.logs
    assert node.leftovers() == []


def test_a_daemon_that_scrubbed_its_environment_is_recorded_and_ended_by_pid(node: Env) -> None:
    """The pipe variable gone from the daemon's environment (a process of its user's
    can make it exec anew without): known as the child the prolog collected."""
    ctl = _script(node, "scrubbed-mps-control",
                  '[ "$1" = -d ] && { env -u CUDA_MPS_PIPE_DIRECTORY /bin/sleep 60 >/dev/null 2>&1 & exit 0; }\n'
                  'cat > /dev/null\n')
    _short(node, ctl)
    rc, st = _prolog(node)
    assert rc == 0 and st is not None and st.mps is not None, node.logs
    (pid,) = st.mps["pids"]
    assert daemon_pids(st.mps["pipe_dir"]) == [] and st.mps["daemon"] == [[pid, start_time(pid)]]
    assert lifecycle.epilog(node.ctx()) == 0, node.logs
    assert node.leftovers() == [] and state(pid) in (None, "Z")         # ended (ours to reap)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or 0 not in os.sched_getaffinity(0),
                    reason="needs CPU 0 and another")
def test_the_daemon_runs_on_the_cpus_local_to_the_jobs_gpus(node: Env) -> None:
    # The test node's GPUs 0 and 2 are local to CPU 0 (Env.node).
    ctx = node.ctx(SLURM_JOB_GPUS="0,2", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    assert st is not None and st.mps is not None and st.mps["cpus"] == "0"
    assert [os.sched_getaffinity(p) for p in st.mps["pids"]] == [{0}]
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert node.leftovers() == []


# -- a launcher that fails: its own word, or the evidence in the job's directories ----

@pytest.mark.parametrize("out, err, said", [
    ("", "cannot open the device\\nsecond line", "cannot open the device"),
    ("on stdout only", "", "on stdout only"),
    ("", "", "exit status 3"),
])
def test_a_launcher_that_fails_fails_the_job_with_its_first_word(
        node: Env, out: str, err: str, said: str) -> None:
    """Everything -d waits on is the job user's: its failure fails the job, saying why."""
    ctl = _script(node, "failing-mps-control", f'printf "{out}"; printf "{err}" >&2; exit 3\n')
    _short(node, ctl)
    assert _user_failed(node) == (f"MPS control daemon could not start: failing-mps-control -d "
                                  f"failed: {said} (its directories and daemon are the job's "
                                  "user's) (job 100)")


def test_a_launcher_that_exits_on_an_entry_its_user_planted_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory where the daemon's socket goes: NVIDIA's daemon exits 1 without a word."""
    _short(node, timeout=5)

    def plant(pipe: str, log: str) -> None:
        os.mkdir(os.path.join(pipe, "control"))
        os.chown(os.path.join(pipe, "control"), os.stat(pipe).st_uid, -1)
    _after_make_dirs(monkeypatch, plant)
    assert _user_failed(node) == ("MPS control daemon could not start: its pipe directory was "
                                  "changed by a process of the job's user (found 'control') "
                                  "(job 100)")


def test_a_launcher_that_timed_out_with_its_log_directory_mounted_over_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    _short(node)
    _after_make_dirs(monkeypatch, lambda pipe, log: _mount("-t", "tmpfs", "sg-over", log))

    def timed_out(res: Any) -> Any:
        raise runner.TimedOut("nvidia-cuda-mps-control timed out after 1 s", "launcher")
    _patch_run(monkeypatch, launcher=timed_out)
    try:
        assert _user_failed(node) == ("MPS control daemon could not start: log was mounted over "
                                      "by a process of the job's user (job 100)")
    finally:
        subprocess.run(["umount", "-l", f"{node.mps.base_dir}/100/log"], capture_output=True)


def test_a_daemon_that_answers_only_at_the_third_try_starts(node: Env) -> None:
    """Until the daemon listens, NVIDIA's client exits 1 with "Cannot find MPS control
    daemon process" (before sending anything): the prolog asks again until it answers."""
    tries = node.base / "tries"
    ctl = _script(node, "slow-mps-control",
                  f'[ "$1" = -d ] || [ "$(wc -l < {tries})" -ge 2 ] || {{ echo >> {tries}; '
                  'echo "Cannot find MPS control daemon process" >&2; exit 1; }\n'
                  f'exec {node.mps.control} "$@"\n')
    tries.write_text("")
    tries.chmod(0o666)
    _short(node, ctl, 5)
    rc, st = _prolog(node)
    assert rc == 0 and st is not None and st.mps is not None and st.phase == "ready", node.logs
    assert tries.read_text() == "\n\n" and len(st.mps["pids"]) == 1
    assert lifecycle.epilog(node.ctx()) == 0, node.logs
    assert node.leftovers() == []


def test_a_client_answered_by_no_process_of_the_launch_records_the_users_bound_to_the_pipe(
        node: Env) -> None:
    """-d left nothing alive, yet a client got its answer: whatever of the job user's
    is bound to the pipe answered, and is recorded so that the epilog ends it."""
    ctl = _script(node, "empty-mps-control", '[ "$1" = -d ] && exit 0\ncat > /dev/null\n')
    _short(node, ctl)
    pipe = f"{node.mps.base_dir}/100/pipe"
    # Started before the job, and not of the prolog's process tree (its parent gone).
    theirs = int(subprocess.run(["/bin/sh", "-c", "/bin/sleep 60 >/dev/null 2>&1 & echo $!"],
                                env={"CUDA_MPS_PIPE_DIRECTORY": pipe}, user="sgtest1",
                                capture_output=True, text=True, check=True).stdout)
    try:
        rc, st = _prolog(node)
        assert rc == 0 and st is not None and st.mps is not None, node.logs
        assert st.mps["pids"] == [theirs] and st.mps["daemon"] == []
        assert lifecycle.epilog(node.ctx()) == 0, node.logs
        assert state(theirs) in (None, "Z")
    finally:
        if state(theirs) not in (None, "Z"):
            os.kill(theirs, 9)
    assert node.leftovers() == []


def _before_the_first_client(monkeypatch: pytest.MonkeyPatch, act: Callable[[str, str], None]) -> None:
    """Run *act(pipe, log)* once the daemon was launched and looked for, before the
    prolog's first client session (which then runs for real)."""
    real = mps.control

    def control(settings: Any, user: Any, pipe: str, log: str, cmd: str, **kw: Any) -> Any:
        monkeypatch.setattr(mps, "control", real)
        act(pipe, log)
        return real(settings, user, pipe, log, cmd, **kw)
    monkeypatch.setattr(mps, "control", control)


def test_a_daemon_seen_at_the_launch_and_killed_with_its_log_removed_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen once, its vanishing is its user's doing, whatever is left to tell of it."""
    def kill(pipe: str, log: str) -> None:
        for p in daemon_pids(pipe):
            os.kill(p, 9)
            while state(p) not in (None, "Z"):
                time.sleep(0.001)
        os.unlink(os.path.join(log, "control.log"))
    _before_the_first_client(monkeypatch, kill)
    _short(node)
    assert _user_failed(node) == ("MPS control daemon exited before it answered (stopped by a "
                                  "process of the job's user?) (job 100)")


def test_a_daemon_whose_socket_its_user_removed_before_any_client_fails_the_job(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVIDIA's client finds no daemon without its sockets (exit 1, at once) until the
    start's time is up: the daemon runs, so its user's doing."""
    def unlink(pipe: str, log: str) -> None:
        for name in ("control", "control_privileged"):
            os.unlink(os.path.join(pipe, name))
    _before_the_first_client(monkeypatch, unlink)
    _short(node, timeout=0.3)
    assert _user_failed(node) == ("MPS control daemon runs but its sockets are gone (control "
                                  "moved away, control_privileged moved away; by a process of "
                                  "the job's user?) (job 100)")


def test_a_client_gets_at_least_half_a_second_to_answer(node: Env) -> None:
    """A daemon that runs (no stop, its sockets its own) and a client that never
    answers: the job fails after the client's least wait, even when the start's own
    time (0.4 s here) is shorter."""
    ctl = _script(node, "hung-mps-control",
                  '[ "$1" = -d ] && { /bin/sleep 60 >/dev/null 2>&1 & exit 0; }\nexec /bin/sleep 60\n')
    _short(node, ctl, 0.4)
    assert _user_failed(node) == ("MPS control daemon runs but did not answer (hung-mps-control timed out "
                                  "after 0.5 s; a process of the job's user may hold its socket) (job 100)")


def test_a_base_parent_another_prolog_made_first_is_passed_over(
        node: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two jobs' prologs on a fresh node make the same missing base: the one that
    finds a parent made by the other goes on with the rest."""
    base = node.base / "a" / "b" / "mps"
    node.mps = MpsSettings(control=node.mps.control, base_dir=str(base), start_timeout=5,
                           quit_timeout=1)
    real = os.mkdir

    def mkdir(path: Any, *a: Any, **kw: Any) -> None:
        if str(path) == str(node.base / "a") and not os.path.lexists(path):
            real(path, 0o755)                       # the other prolog, a moment earlier
        real(path, *a, **kw)
    monkeypatch.setattr(os, "mkdir", mkdir)
    rc, st = _prolog(node)
    assert rc == 0 and st is not None and st.phase == "ready", node.logs
    assert [stat.S_IMODE(os.stat(d).st_mode) for d in (base.parent, base)] == [0o755, 0o755]
    assert lifecycle.epilog(node.ctx()) == 0, node.logs
    assert node.leftovers() == []
