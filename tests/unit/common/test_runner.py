"""The command chokepoint: no shell, timeouts kill the whole process group."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from slurm_gpu.errors import CommandError
from slurm_gpu.runner import RunAs, run
from paths import ROOT



def test_runs_argv_without_a_shell() -> None:
    # A shell would expand this; argv passing must hand it over verbatim.
    res = run(["/bin/echo", "$(id -u); `id`"], timeout=5)
    assert res.stdout == "$(id -u); `id`\n"
    assert res.ok


def _seconds_to_time_out(script: str) -> float:
    """How long run() took to give up on sh *script* with a 0.5 s timeout."""
    t0 = time.monotonic()
    with pytest.raises(CommandError, match="timed out after 0.5 s"):
        run(["/bin/sh", "-c", script], timeout=0.5)
    return time.monotonic() - t0


def test_timeout_kills_the_process_group(tmp_path) -> None:
    pidfile = tmp_path / "child.pid"
    assert _seconds_to_time_out(f"sleep 30 & echo $! > {pidfile}; wait") < 5
    grandchild = int(pidfile.read_text())
    # The grandchild was in the same process group and must be gone too.
    for _ in range(50):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("grandchild survived the timeout")


def test_timeout_says_whether_the_command_was_stopped() -> None:
    """A command stopped (SIGSTOP) when its time runs out is told apart from one that
    ran and hung: run as a job user, only that user (or root) could have stopped it."""
    from slurm_gpu.runner import TimedOut
    with pytest.raises(TimedOut, match="was stopped") as e:
        run(["/bin/sh", "-c", "kill -STOP $$"], timeout=0.5)
    assert e.value.stopped
    with pytest.raises(TimedOut) as e:
        run(["/bin/sleep", "30"], timeout=0.2)
    assert not e.value.stopped and "stopped" not in str(e.value)


def test_failure_carries_first_stderr_line() -> None:
    with pytest.raises(CommandError) as ei:
        run(["/bin/sh", "-c", "echo 'bad thing' >&2; echo more >&2; exit 3"], timeout=5)
    assert "sh failed: bad thing" in ei.value.line()
    assert ei.value.line().startswith("slurm-gpu: ")


def test_check_false_returns_status() -> None:
    res = run(["/bin/sh", "-c", "exit 4"], timeout=5, check=False)
    assert res.returncode == 4 and not res.ok


def test_missing_command() -> None:
    with pytest.raises(CommandError, match="command not found: /nonexistent/tool"):
        run(["/nonexistent/tool"], timeout=5)


def test_environment_is_not_inherited(monkeypatch) -> None:
    monkeypatch.setenv("LD_PRELOAD_EVIL", "x")
    res = run(["/usr/bin/env"], timeout=5)
    assert "LD_PRELOAD_EVIL" not in res.stdout
    assert "PATH=/usr/sbin:/usr/bin:/sbin:/bin" in res.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
def test_run_as_drops_privileges() -> None:
    res = run(["/usr/bin/id", "-u"], timeout=5, run_as=RunAs(uid=65534, gid=65534))
    assert res.stdout.strip() == "65534"


def test_timeout_returns_although_a_daemon_holds_the_pipes(tmp_path) -> None:
    # The grandchild leaves the process group (setsid) and keeps stdout open:
    # killpg cannot reach it, and waiting for EOF would hang for its lifetime.
    pidfile = tmp_path / "daemon.pid"
    took = _seconds_to_time_out(f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 60' & sleep 30")
    try:
        os.kill(int(pidfile.read_text()), 9)
    except (OSError, ValueError):
        pass
    assert took < 5, f"run() waited {took:.1f} s for a daemon's pipes"


# What the runner guarantees the child, whether subprocess starts it alone or
# through the pre-exec helper (cgroups, CPUs).

def test_no_descriptor_but_stdio_reaches_the_child(tmp_path) -> None:
    f = open(tmp_path / "secret", "w")
    fd = f.fileno()
    os.set_inheritable(fd, True)               # even one marked inheritable
    try:
        res = run(["/bin/ls", "/proc/self/fd"], timeout=5)
    finally:
        f.close()
    # ls's own directory fd is the only one beyond 0..2
    assert sorted(res.stdout.split(), key=int)[:3] == ["0", "1", "2"]
    assert len(res.stdout.split()) == 4 and str(fd) not in res.stdout.split()


def test_sigpipe_and_sigxfsz_are_back_to_default_in_the_child() -> None:
    # Python ignores both; an ignored signal stays ignored across exec.
    line = next(ln for ln in run(["/bin/cat", "/proc/self/status"], timeout=5).stdout.splitlines()
                if ln.startswith("SigIgn:"))
    ignored = int(line.split()[1], 16)
    assert not ignored & (1 << (13 - 1)) and not ignored & (1 << (25 - 1))


def test_large_output_on_both_streams_and_large_input() -> None:
    res = run(["/bin/sh", "-c", "head -c 300000 /dev/zero; head -c 300000 /dev/zero >&2"], timeout=10)
    assert len(res.stdout) == 300000 and len(res.stderr) == 300000
    assert run(["/bin/cat"], timeout=10, input="x" * 500000).stdout == "x" * 500000


def test_input_the_child_does_not_read_is_dropped() -> None:
    assert run(["/bin/true"], timeout=5, input="x" * 500000).ok


def test_output_is_text_with_universal_newlines_and_no_decode_error() -> None:
    res = run(["/usr/bin/printf", "a\\r\\nb\\rc\\377"], timeout=5)
    assert res.stdout == "a\nb\nc\ufffd"


def test_a_killed_child_reports_minus_the_signal() -> None:
    assert run(["/bin/sh", "-c", "kill -9 $$"], timeout=5, check=False).returncode == -9


def test_nul_in_argv_or_env_is_one_line() -> None:
    with pytest.raises(CommandError, match="NUL"):
        run(["/bin/echo", "a\0b"], timeout=5)
    with pytest.raises(CommandError, match="bad environment variable"):
        run(["/bin/true"], timeout=5, env={"A=B": "1"})


def test_a_file_that_is_not_executable() -> None:
    with pytest.raises(CommandError, match="cannot run /etc/passwd: Permission denied"):
        run(["/etc/passwd"], timeout=5)


def test_a_cgroup_that_cannot_be_joined(tmp_path) -> None:
    with pytest.raises(CommandError, match="cannot start /bin/true in its cgroup"):
        run(["/bin/true"], timeout=5, join_cgroups=[str(tmp_path / "nope" / "cgroup.procs")])


def test_a_parent_with_stdio_closed(tmp_path) -> None:
    # slurmd may start us with 0..2 closed: the pipes then land on them.
    import subprocess
    import sys
    code = ("import os, sys; sys.path.insert(0, %r); from slurm_gpu.runner import run\n"
            "os.close(0); os.close(1); os.close(2)\n"
            "r = run(['/bin/sh', '-c', 'read x; echo out $x; echo err >&2'], 5, input='in\\n')\n"
            "h = run(['/bin/sh', '-c', 'read x; echo out $x; echo err >&2'], 5, input='in\\n',\n"
            "        cpus=sorted(os.sched_getaffinity(0))[-1:])\n"     # through the pre-exec helper
            "open(%r, 'w').write(repr((r.stdout, r.stderr, h.stdout, h.stderr)))\n"
            % (str(ROOT), str(tmp_path / "r")))
    subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL, timeout=30, check=True)
    assert (tmp_path / "r").read_text() == repr(("out in\n", "err\n") * 2)


def test_cpus_pin_the_command() -> None:
    cpu = sorted(os.sched_getaffinity(0))[-1]
    status = run(["/bin/cat", "/proc/self/status"], timeout=5, cpus=[cpu]).stdout
    assert f"Cpus_allowed_list:\t{cpu}\n" in status
    with pytest.raises(CommandError, match="cannot start /bin/true on its CPUs"):
        run(["/bin/true"], timeout=5, cpus=[4095])


def test_a_command_that_exits_while_its_daemon_holds_the_pipes(tmp_path) -> None:
    # The command itself exits at once; a grandchild it left (its own
    # session) keeps stdout open past the timeout: one timeout line, and the
    # command's exit status, already collected, is not waited for twice.
    pidfile = tmp_path / "daemon.pid"
    script = f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 60' & exit 0"
    try:
        with pytest.raises(CommandError, match="timed out after 0.5 s"):
            run(["/bin/sh", "-c", script], timeout=0.5)
    finally:
        for _ in range(50):
            if pidfile.exists() and pidfile.read_text().strip():
                break
            time.sleep(0.02)
        try:
            os.kill(int(pidfile.read_text()), 9)
        except (OSError, ValueError):
            pass


def test_without_the_pre_exec_helper_one_line_says_how_to_build_it(tmp_path, monkeypatch) -> None:
    from slurm_gpu import runner
    monkeypatch.setattr(runner, "helper_path", lambda: str(tmp_path / "slurm-gpu-exec"))
    with pytest.raises(CommandError, match="cannot start /bin/true in its cgroup: slurm-gpu-exec "
                                           r"is not built \(slurm-gpu spank build\)"):
        run(["/bin/true"], timeout=5, join_cgroups=[str(tmp_path / "cgroup.procs")])
    assert run(["/bin/true"], timeout=5).ok         # commands without cgroups or CPUs need no helper


def test_through_the_helper_the_command_gets_stdio_only_and_default_signals() -> None:
    cpu = sorted(os.sched_getaffinity(0))[-1]
    fds = run(["/bin/ls", "/proc/self/fd"], timeout=5, cpus=[cpu]).stdout.split()
    assert sorted(fds, key=int)[:3] == ["0", "1", "2"] and len(fds) == 4    # its report pipe closed at exec
    line = next(ln for ln in run(["/bin/cat", "/proc/self/status"], timeout=5, cpus=[cpu]).stdout.splitlines()
                if ln.startswith("SigIgn:"))
    assert not int(line.split()[1], 16) & ((1 << 12) | (1 << 24))              # SIGPIPE, SIGXFSZ


@pytest.mark.parametrize("ident", [["-u", "abc", "-g", "abc"], ["-u", "1000", "-g", "x"], ["-u", "", "-g", ""]])
def test_the_helper_never_stays_root_on_an_identity_it_cannot_read(tmp_path, ident) -> None:
    # runner.py always passes numbers; the helper itself must still refuse
    # anything else rather than skip the drop and exec the command as root.
    from slurm_gpu.paths import resource_dir
    exe = tmp_path / "slurm-gpu-exec"
    subprocess.run(["cc", "-O2", "-o", str(exe), str(resource_dir("spank") / "sg_exec.c")], check=True)
    r = subprocess.run([str(exe), *ident, "--", "/usr/bin/id", "-u"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 255 and r.stdout == "", (r.returncode, r.stdout)


@pytest.mark.parametrize("through_helper", [False, True])
def test_a_user_at_their_process_limit_is_their_doing(through_helper) -> None:
    # slurmd may run with a finite LimitNPROC, which its children inherit.
    # Since Linux 3.1 setresuid succeeds over the limit and execve then fails
    # with EAGAIN (kernel/sys.c set_user, fs/exec.c PF_NPROC_EXCEEDED): a
    # user with too many processes of their own, not a node fault.  The
    # kernel counts the user's other processes (set_user runs before this
    # one is counted), so the user needs one: limit 0, one process.
    import resource
    from slurm_gpu.errors import Consequence, consequence
    other = subprocess.Popen(["/bin/sleep", "30"], user=65534, group=65534, extra_groups=[])
    old = resource.getrlimit(resource.RLIMIT_NPROC)
    resource.setrlimit(resource.RLIMIT_NPROC, (0, old[1]))
    try:
        with pytest.raises(CommandError) as e:
            run(["/usr/bin/id", "-u"], timeout=5, run_as=RunAs(uid=65534, gid=65534),
                cpus=sorted(os.sched_getaffinity(0))[-1:] if through_helper else ())
    finally:
        resource.setrlimit(resource.RLIMIT_NPROC, old)
        other.kill()
        other.wait()
    assert e.value.what == ("cannot run /usr/bin/id as uid 65534: that user has as many "
                            "processes as its limit allows (RLIMIT_NPROC)")
    assert consequence(e.value) == Consequence.USER
    # root is not limited: the same command as root runs
    resource.setrlimit(resource.RLIMIT_NPROC, (0, old[1]))
    try:
        assert run(["/usr/bin/id", "-u"], timeout=5).stdout == "0\n"
    finally:
        resource.setrlimit(resource.RLIMIT_NPROC, old)


@pytest.fixture()
def stalling_fuse(tmp_path):  # type: ignore[no-untyped-def]
    from fusestall import StallingFuse, available
    if not available():
        pytest.skip("no FUSE here (/dev/fuse, root)")
    d = tmp_path / "fuse"
    d.mkdir()
    fs = StallingFuse(str(d))
    try:
        yield fs
    finally:
        fs.close()


@pytest.mark.parametrize("through_helper", [False, True])
def test_a_command_that_survives_its_kill_is_given_up_not_waited_for(stalling_fuse, through_helper) -> None:
    """A command blocked in a FUSE request its server took waits uninterruptibly: the
    kill at the time out stays pending (second hostile review round 3, H2: a job's
    user mounted FUSE on their pipe directory and the prolog never returned).  The
    runner waits a bounded time for the kill, then gives the command up."""
    import threading
    from slurm_gpu.runner import TimedOut
    box: list[BaseException] = []

    def call() -> None:
        try:
            run(["/bin/cat", f"{stalling_fuse.mountpoint}/x"], timeout=0.5,
                cpus=sorted(os.sched_getaffinity(0))[-1:] if through_helper else ())
        except BaseException as e:  # noqa: BLE001
            box.append(e)
    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(30)
    assert box, "the runner waited for a command it could not end"
    e = box[0]
    assert isinstance(e, TimedOut) and e.stuck and not e.stopped, repr(e)
    assert e.what == ("cat timed out after 0.5 s and could not be ended (blocked in the kernel, "
                      "in request_wait_answer)")
    assert e.blocked_in == "request_wait_answer"        # fs/fuse/dev.c
    assert stalling_fuse.requests >= 1


def test_a_command_still_on_its_way_out_after_the_kill_is_waited_for_not_given_up(
        monkeypatch) -> None:
    """Killed at its time out, a command that holds much memory runs on in the kernel
    while its address space is torn down (``R``: exit_mmap), longer than
    :data:`runner.KILL_WAIT` on a loaded node: no process stuck in the kernel, and
    never reported as one (a stuck MPS client is a node fault).  Here 1 GiB against
    a 1 ms KILL_WAIT."""
    from slurm_gpu import runner
    from slurm_gpu.runner import TimedOut
    monkeypatch.setattr(runner, "KILL_WAIT", 0.001)
    with pytest.raises(TimedOut) as caught:
        run(["/usr/bin/python3", "-c", "b = bytearray(1 << 30); print(1, flush=True)\n"
             "import time; time.sleep(60)"], timeout=3)
    assert not caught.value.stuck, repr(caught.value)


def test_a_killed_command_still_runnable_at_the_cap_is_not_called_stuck(stalling_fuse, monkeypatch) -> None:
    """A command run as a user can be kept runnable, not exiting, by that user (SCHED_IDLE
    on a starved CPU): still ``R`` when the wait for its exit ends, it was reported as
    blocked in the kernel, which an MPS client's caller takes for a node fault (review
    round 5, R5).  Only a command still blocked (``D``, ``S``) is given up stuck."""
    from slurm_gpu import procfs, runner
    from slurm_gpu.runner import TimedOut
    monkeypatch.setattr(runner, "KILL_WAIT", 0.01)
    monkeypatch.setattr(runner, "EXIT_CAP", 0.2)
    monkeypatch.setattr(procfs, "state", lambda pid, proc="/proc": "R")
    with pytest.raises(TimedOut) as caught:
        run(["/bin/cat", f"{stalling_fuse.mountpoint}/x"], timeout=0.5)
    assert not caught.value.stuck, repr(caught.value)
