"""500 randomised job lifecycles leave nothing behind (SLURM_GPU_LIFECYCLES=N for more).

Most lifecycles drive the prolog/epilog entry points directly, in the real
sandbox environment (its slurm-gpu.toml, node name, NVML simulator state and
NVIDIA's MPS control daemon), so 500 fit in well under a few minutes; a subset goes through
real Slurm jobs.  Faults: scancel, a prolog killed at a random step (every
state-file write is a possible kill point, as SIGKILL can land anywhere), a
prolog killed for real with SIGKILL, a node restart (the epilog runs in a
fresh process/context with only the files on disk), the epilog run twice, a
node fault half-way, the epilog killed (simulated at each state write, and
for real), the state directory's disk full (a 256 KiB tmpfs), a corrupted
state file, an NVML call that hangs.  And a hostile job user (issue 24 §1),
with a process of their own on the node that the prolog did not start
(``tests/useragent.py``): the daemon's sockets moved away or replaced by
sockets of their own, the daemon killed and a look-alike process kept that
names the pipe directory, FIFOs and a symlink planted in the log directory,
directories planted where the sockets go before the daemon starts, a mount
in the pipe directory at the epilog; and slurmd restarted for real while a
prolog runs.  After each lifecycle there must be no daemon, no MPS
directory, no mount, no MIG instance and no state file left, no drain
without a node fault and none caused by a user.
"""
from __future__ import annotations

import json
import re
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sandboxlib import REPO, Cluster
from useragent import CHMOD_DIR, KILL_UNSEEN, PLANT_DIRS, PLANT_FIFOS, RENAME_SOCKETS, REPLACE_SOCKETS, Agent

MACHINE = REPO / "tests" / "data" / "machines" / "mini-2numa"
N_LIFECYCLES = int(os.environ.get("SLURM_GPU_LIFECYCLES", "500"))
LAYOUTS = ["7g.94gb", "3g.47gb,3g.47gb", "4g.47gb,2x1g.12gb", "2x2g.24gb", "1g.24gb",
           "3x1g.12gb", "1c.3g.47gb,4g.47gb", "1g.12gb+me,2g.24gb"]
BAD = ["4g.47gb,4g.47gb", "8x1g.12gb", "7g.80gb"]


class Killed(BaseException):
    """A SIGKILL: nothing after it runs, no handler sees it."""


@pytest.fixture(scope="module")
def cluster(make_sandbox, job_users, node_files) -> Cluster:
    return make_sandbox(machine=str(MACHINE), spank=True, prolog=True, extra_config={
        "node": {"nvml": f"sim:{node_files['sim']}"},
        "mps": {"control": str(node_files["ctl"]), "base_dir": str(node_files["mps"]),
                "quit_timeout": 2.0},
        "jobs": {"epilog_kill_wait": 1.0},
        "spank": {"numa_node_map": {"1": 0}}})


def _leftovers(node_files, state_dir: Path, jobid: str | None = None) -> list[str]:
    from slurm_gpu.jobs.mps import daemon_pids
    from slurm_gpu.mig import instances
    from slurm_gpu.hw import backend
    out = []
    jobs = state_dir / "jobs"
    files = sorted(p.name for p in jobs.glob("*.json*") if not p.name.endswith(".corrupt")) \
        if jobs.exists() else []
    if jobid is not None:
        files = [f for f in files if f.startswith(f"{jobid}.json")]
    out += [f"state file {f}" for f in files]
    dirs = sorted(p.name for p in node_files["mps"].iterdir())
    out += [f"mps dir {d}" for d in dirs if jobid is None or d == jobid]
    for d in dirs:
        if daemon_pids(node_files["mps"] / d / "pipe"):
            out.append(f"daemon of job {d}")
    # any process anywhere bound to an MPS pipe under our base is an orphan
    for p in daemon_pids_under(node_files["mps"]):
        out.append(f"orphan process {p}")
    with open("/proc/self/mountinfo") as f:
        out += [f"mount {ln.split()[4]}" for ln in f
                if ln.split()[4].startswith(f"{node_files['mps']}/")]
    gpus = backend.open_gpus(backend.GpuSource("sim", str(node_files["sim"])))
    for i in (0, 1):
        n = len(instances.list_instances(gpus, i))
        if n:
            out.append(f"{n} MIG instance(s) on GPU {i}")
    return out


def daemon_pids_under(base: Path) -> list[int]:
    want = f"CUDA_MPS_PIPE_DIRECTORY={base}/".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes()
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        if want in env and stat.split(") ", 1)[1][0] != "Z":
            out.append(int(name))
    return out


# Faults that are the node's (or Slurm's): a drain (exit 1) is right for these only.
NODE_FAULTS = {"fault", "killed", "sigkill", "full_disk", "nvml_hang", "epilog_killed",
               "epilog_sigkill"}
# A hostile job user's doing (issue 24 §1): never a drain.  What another process of
# theirs does to the job's MPS directories, and when (just before the prolog's first
# client session, just before it starts the daemon, or as soon as -d returned).
ATTACKS = {"renamed_sockets": (RENAME_SOCKETS, "pipe", "session"),
           "replaced_sockets": (REPLACE_SOCKETS, "pipe", "session"),
           "look_alike": ("", "pipe", "session"),
           "fifo": (PLANT_FIFOS, "log", "session"),
           "planted": (PLANT_DIRS, "pipe", "start"),
           "chmod_pipe": (CHMOD_DIR, "pipe", "start"),
           "kill_unseen": (KILL_UNSEEN, "pipe", "launched"),
           "mount": ("", "pipe", "epilog")}


def _fill(d: Path) -> Path:
    """Fill the small tmpfs under the job state directory: the next write gets ENOSPC."""
    filler = d / ".filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


@pytest.fixture(scope="module")
def small_jobs_fs(cluster: Cluster):
    """The node's job state directory on a 256 KiB tmpfs (a full disk is a real ENOSPC)."""
    jobs = cluster.dir / "var" / cluster.nodes[0] / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "sg-jobs", str(jobs)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {res.stderr.strip()}")
    yield jobs
    subprocess.run(["umount", "-l", str(jobs)], capture_output=True)


def _run_killed(script: str, env: dict[str, str], delay: float) -> int:
    """Run prolog.d/epilog.d's script for real and SIGKILL its process group after *delay* s."""
    p = subprocess.Popen(["/bin/sh", str(REPO / script)], env=env, start_new_session=True)
    time.sleep(delay)
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return p.wait()


def test_500_random_lifecycles(cluster: Cluster, node_files, small_jobs_fs, monkeypatch) -> None:
    """N lifecycles (SLURM_GPU_LIFECYCLES, default 500), faults from every side.

    Prolog or epilog killed at every state write (and for real, SIGKILL),
    the node restarted between prolog and epilog (the epilog knows only the
    job id and the disk), the state file's disk full at a random write (a
    real ENOSPC from a small tmpfs), the state file corrupted, an NVML call
    that hangs (the simulator's lock held: the prolog's watchdog ends it),
    MIG creation and MPS control failing.  A killed epilog is what Slurm
    answers with a drain; what it left is cleaned by the next prolog's
    sweep.  Afterwards nothing may be left, no user error may have drained
    the node, and no drain may have come without a node fault.
    """
    import pwd

    from slurm_gpu import config
    from slurm_gpu.jobs import lifecycle, sweep
    from slurm_gpu.jobs import state as js
    conf = cluster.dir / "etc" / "slurm-gpu.toml"
    node = cluster.nodes[0]
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(conf))
    monkeypatch.setenv("SLURMD_NODENAME", node)
    monkeypatch.setenv("SLURM_CONF", str(cluster.dir / "etc" / "slurm.conf"))   # squeue in the sweep
    config.clear_cache()
    state_dir = Path(lifecycle.default_context({}).state_dir)
    # The real prolog/epilog processes: this venv, and a short watchdog for the hung-NVML case.
    python = os.environ.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv") + "/bin/python"
    quick = cluster.dir / "etc" / "slurm-gpu-quick.toml"
    text = conf.read_text()
    quick.write_text(text.replace("[jobs]\n", "[jobs]\ntimeout = 1.5\n", 1) if "[jobs]\n" in text
                     else text + "\n[jobs]\ntimeout = 1.5\n")
    rng = random.Random(int(os.environ.get("SLURM_GPU_LIFECYCLE_SEED", "4")))
    users = [pwd.getpwnam(u) for u in ("sgtest1", "sgtest2")]
    real_save, real_remove = js.save, js.remove
    counts: dict[str, int] = {}
    drains = {"node fault": 0, "wrong": 0, "user": 0}
    aside: list[str] = []
    t0 = time.monotonic()

    def ctx_of(env: dict[str, str]) -> lifecycle.Context:
        return lifecycle.default_context(env)

    def dying_after(k: int, real):
        calls = {"n": 0}

        def f(*a, **kw):
            calls["n"] += 1
            if calls["n"] == k:
                raise Killed()
            return real(*a, **kw)
        return f

    for i in range(N_LIFECYCLES):
        jobid = str(900000 + i)
        u = rng.choice(users)
        kind = rng.choices(["mig", "mps", "both", "none", "bad"], [45, 20, 10, 10, 15])[0]
        event = rng.choice(["normal", "scancel", "killed", "restart", "twice", "fault",
                            "full_disk", "corrupt", "epilog_killed"])
        if kind in ("mps", "both") and rng.random() < 0.5:
            event = rng.choice(sorted(ATTACKS))
        if i % 50 == 7:
            event = "sigkill"          # a real SIGKILL of a real prolog process
        elif i % 50 == 27:
            event = "epilog_sigkill"   # ... and of a real epilog process
        elif i % 50 == 17:
            event, kind = "nvml_hang", "mig"
        env = {"SLURM_JOB_ID": jobid, "SLURM_JOB_UID": str(u.pw_uid),
               "SLURM_JOB_GID": str(u.pw_gid), "SLURM_JOB_USER": u.pw_name,
               "SLURMD_NODENAME": node,
               "SLURM_JOB_GPUS": rng.choice(["0", "1", "0,1"])}
        if kind in ("mig", "both"):
            env["SPANK_SLURM_GPU_MIG"] = rng.choice(LAYOUTS)
        if kind == "bad":
            env["SPANK_SLURM_GPU_MIG"] = rng.choice(BAD)
        if kind in ("mps", "both"):
            env["SPANK_SLURM_GPU_MPS"] = rng.choice(["default", "25", "100"])
        counts[f"{kind}/{event}"] = counts.get(f"{kind}/{event}", 0) + 1
        # The SPANK plugin's gate for prolog.d/epilog.d: without it sh exits before Python.
        gate = {"SPANK_SLURM_GPU_PROLOG": "1"} if kind != "none" else {}
        full = dict(env, SLURM_GPU_CONFIG=str(conf), PATH="/usr/bin:/bin", SLURM_GPU_PYTHON=python,
                    SLURM_CONF=str(cluster.dir / "etc" / "slurm.conf"), **gate)
        rc: int | None = None
        filler: Path | None = None
        agent: Agent | None = None
        if event in ATTACKS:
            code, where, when = ATTACKS[event]
            pipe = node_files["mps"] / jobid / "pipe"
            agent = Agent(code, user=u.pw_name,
                          env={"CUDA_MPS_PIPE_DIRECTORY": str(pipe)} if event == "look_alike" else None)
            target = str(node_files["mps"] / jobid / where)
            from slurm_gpu import runner
            from slurm_gpu.jobs import mps
            if when == "session":
                real_control = mps.control

                def first_session(settings, user, pipe_, log, command, _r=real_control, _a=agent,
                                  _t=target, _e=event, **kw):
                    monkeypatch.setattr(mps, "control", _r)
                    if _e == "look_alike":      # the user kills the daemon, keeps the look-alike
                        for pid in mps.daemon_pids(pipe_):
                            if pid != _a.pid:
                                os.kill(pid, signal.SIGKILL)
                    else:
                        _a.do(_t)
                    return _r(settings, user, pipe_, log, command, **kw)
                monkeypatch.setattr(mps, "control", first_session)
            elif when in ("start", "launched"):
                real_run = runner.run

                def around_start(argv, *a, _r=real_run, _a=agent, _t=target, _w=when, **kw):
                    if list(argv)[1:] != ["-d"]:
                        return _r(argv, *a, **kw)
                    monkeypatch.setattr(runner, "run", _r)
                    if _w == "start":
                        _a.do(_t)
                    res = _r(argv, *a, **kw)
                    if _w == "launched":
                        _a.do(_t)
                    return res
                monkeypatch.setattr(runner, "run", around_start)
        if event == "sigkill":
            _run_killed("prolog.d/50-slurm-gpu-jobs", full, rng.uniform(0.0, 0.4))
        elif event == "nvml_hang":
            # Every MIG-mode read hangs for a minute (the simulator's fault overlay,
            # as a sick GPU would): the prolog's watchdog must end it as a node fault.
            from slurm_gpu_devkit.sim.state import StateFile
            sim = StateFile(str(node_files["sim"]))
            with sim.edit() as st:
                st["overlay"] = {"calls": [{"fn": fn, "hang": 60} for fn in
                                           ("nvmlDeviceGetMigMode", "nvmlDeviceGetName")]}
            try:
                res = subprocess.run(["/bin/sh", str(REPO / "prolog.d" / "50-slurm-gpu-jobs")],
                                     env=dict(full, SLURM_GPU_CONFIG=str(quick)), timeout=30,
                                     capture_output=True, text=True)
            finally:
                with sim.edit() as st:
                    st.pop("overlay", None)
            rc = res.returncode
            assert rc == 1 and "watchdog" in res.stderr, (res.stderr, sorted(
                (f.name, f.stat().st_size) for f in small_jobs_fs.iterdir()))
        else:
            if event == "killed":
                monkeypatch.setattr(js, "save", dying_after(rng.randint(1, 8), real_save))
            if event == "full_disk":
                k = rng.randint(1, 6)
                calls = {"n": 0}

                def filling(sd, st, _k=k, _c=calls):
                    nonlocal filler
                    _c["n"] += 1
                    if _c["n"] == _k:
                        filler = _fill(small_jobs_fs)
                    real_save(sd, st)
                monkeypatch.setattr(js, "save", filling)
            if event == "fault":
                from slurm_gpu.mig import instances
                real_create = instances.create_placement

                def failing(api, dev, p, where, _r=real_create):
                    if rng.random() < 0.5:
                        raise instances.MigError("cannot create GPU instance: Unknown Error",
                                                 where, 999)
                    return _r(api, dev, p, where)
                monkeypatch.setattr(instances, "create_placement", failing)
                from slurm_gpu.errors import CommandError
                from slurm_gpu.jobs import mps
                real_control = mps.control

                def control(settings, user, pipe, log, command, _r=real_control, **kw):
                    if command.startswith("set_default") and rng.random() < 0.7:
                        raise CommandError("nvidia-cuda-mps-control failed: simulated")
                    return _r(settings, user, pipe, log, command, **kw)
                monkeypatch.setattr(mps, "control", control)
            try:
                rc = lifecycle.prolog(ctx_of(env))
                assert rc in (0, 1)
            except Killed:
                pass
            monkeypatch.setattr(js, "save", real_save)
            monkeypatch.undo() if event == "fault" or event in ATTACKS else None
            monkeypatch.setenv("SLURM_GPU_CONFIG", str(conf))
            monkeypatch.setenv("SLURMD_NODENAME", node)
            monkeypatch.setenv("SLURM_CONF", str(cluster.dir / "etc" / "slurm.conf"))
            if filler is not None:
                filler.unlink()                       # the admin frees the disk
        if rc == 1:
            drains["node fault" if event in NODE_FAULTS else "wrong"] += 1
            if (kind == "bad" or event in ATTACKS) and event not in NODE_FAULTS:
                drains["user"] += 1
        user_mount: Path | None = None
        if event == "mount" and (node_files["mps"] / jobid / "pipe").is_dir():
            # The user mounts a filesystem in the pipe directory (FUSE on a real
            # node; a tmpfs made as root here): the epilog must detach it, not drain.
            user_mount = node_files["mps"] / jobid / "pipe" / "mnt"
            subprocess.run(["/bin/mkdir", str(user_mount)], user=u.pw_name, check=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "sg-user", str(user_mount)],
                           check=True)
            counts["mount/made"] = counts.get("mount/made", 0) + 1
        if event == "corrupt":
            sf = state_dir / "jobs" / f"{jobid}.json"
            if sf.exists():
                sf.write_bytes(sf.read_bytes()[: rng.randint(0, 40)] + b"\xff{garbage")
        epilog_env = dict(env)
        if event in ("restart", "sigkill"):
            # slurmd restarted: the epilog knows only the job id and what is on disk
            epilog_env = {"SLURM_JOB_ID": jobid, "SLURMD_NODENAME": node}
        if event == "scancel":
            epilog_env["SLURM_JOB_EXIT_CODE"] = "15"
        if event in ("epilog_killed", "epilog_sigkill"):
            if event == "epilog_killed":
                k = rng.randint(1, 4)
                monkeypatch.setattr(js, "save", dying_after(k, real_save))
                monkeypatch.setattr(js, "remove", dying_after(k, real_remove))
                try:
                    lifecycle.epilog(ctx_of(epilog_env))
                except Killed:
                    drains["node fault"] += 1         # slurmd drains on a killed epilog
                monkeypatch.setattr(js, "save", real_save)
                monkeypatch.setattr(js, "remove", real_remove)
            else:
                _run_killed("epilog.d/50-slurm-gpu-jobs", full, rng.uniform(0.0, 0.3))
                drains["node fault"] += 1
            # The job is gone; the next prolog on the node sweeps what it left.
            for line in sweep.sweep(ctx_of({"SLURM_JOB_ID": "1", "SLURMD_NODENAME": node}),
                                    lifecycle.teardown, exclude="1"):
                assert "incomplete" not in line, line
        else:
            erc = lifecycle.epilog(ctx_of(epilog_env))
            assert erc == 0, (jobid, event)
            if event == "twice":
                assert lifecycle.epilog(ctx_of(epilog_env)) == 0
        if agent is not None:
            agent.close()
        left = _leftovers(node_files, state_dir, jobid)
        if user_mount is not None and left:
            subprocess.run(["umount", "-l", str(user_mount)], capture_output=True)
        assert left == [], f"lifecycle {i} ({kind}/{event}, job {jobid}): {left}"
        for f in small_jobs_fs.glob("*.corrupt"):   # the admin reads and removes them
            assert event == "corrupt" and f.name.startswith(jobid), f.name
            aside.append(f.name)
            f.unlink()
    elapsed = time.monotonic() - t0
    assert _leftovers(node_files, state_dir) == []
    assert drains["wrong"] == 0 and drains["user"] == 0, drains
    # Only damaged records are set aside (for the admin), one per corrupted lifecycle at most.
    assert len(aside) <= sum(n for k, n in counts.items() if k.endswith("/corrupt"))
    print(f"\n{N_LIFECYCLES} lifecycles in {elapsed:.1f} s: 0 orphaned daemons, directories, MIG "
          f"instances or state files ({len(aside)} corrupt records set aside for the admin); "
          f"drains {drains}; {sorted(counts.items())}")


def test_real_slurm_subset(cluster: Cluster, node_files) -> None:
    """Real jobs: normal MPS+MIG batch job, scancel while running, bad layout."""
    state_dir = cluster.dir / "var" / cluster.nodes[0]
    d = cluster.user_dir("sgtest1")
    script = d / "sleep.sh"
    script.write_text("#!/bin/sh\necho MPS=$CUDA_MPS_PIPE_DIRECTORY MIG=$CUDA_VISIBLE_DEVICES\n"
                      "sleep ${1:-0}\n")
    script.chmod(0o755)
    jobs = []
    for args, sleep, cancel in ((["--gpu-mps=50"], "0", False),
                                (["--gpu-mig=2x2g.24gb", "--gpu-mps"], "0", False),
                                (["--gpu-mig=3g.47gb", "--gpu-mps=default"], "60", True),
                                (["--gpu-mps"], "60", True),
                                (["--gpu-mig=4g.47gb,4g.47gb"], "0", False)):
        jid = cluster.sbatch("--gres=gpu:1", "-o", str(d / "slurm-%j.out"), *args, str(script),
                             sleep, user="sgtest1", cwd=str(d))
        jobs.append((jid, cancel))
    for jid, cancel in jobs:
        if cancel:
            cluster.wait_job(jid, states={"RUNNING"}, timeout=60)
            cluster.run(["scancel", str(jid)])
    for jid, _ in jobs:
        cluster.wait_job(jid, timeout=60)
    deadline = time.monotonic() + 30
    while _leftovers(node_files, state_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _leftovers(node_files, state_dir) == []
    # "planned": idle, with the backfill scheduler planning a job on it (Slurm 22.05+); never drained
    assert cluster.node_states()[cluster.nodes[0]] in ("idle", "mixed", "planned"), \
        cluster.why_unavailable(cluster.nodes[0])
    out = (d / f"slurm-{jobs[1][0]}.out").read_text()
    assert "MIG=MIG-" in out and "MPS=" in out
    bad = cluster.job(jobs[4][0])
    assert bad.get("JobState") == "FAILED"


def _slurmd_pid(name: str, conf: Path) -> int | None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:1] == [b"/usr/sbin/slurmd"] and name.encode() in argv and \
                str(conf).encode() in argv:
            return int(pid)
    return None


def test_slurmd_restart_while_job_runs(cluster: Cluster, node_files) -> None:
    """A real slurmd restart: the epilog run by the new slurmd still cleans everything."""
    name = cluster.nodes[0]
    conf = cluster.dir / "etc" / "slurm.conf"
    state_dir = cluster.dir / "var" / name
    d = cluster.user_dir("sgtest1")
    script = d / "long.sh"
    script.write_text("#!/bin/sh\nsleep 120\n")
    script.chmod(0o755)
    jid = cluster.sbatch("--gres=gpu:1", "--gpu-mps=30", "--gpu-mig=2x2g.24gb", "-o", "/dev/null",
                         str(script), user="sgtest1", cwd=str(d))
    cluster.wait_job(jid, states={"RUNNING"}, timeout=60)
    sf = state_dir / "jobs" / f"{jid}.json"
    deadline = time.monotonic() + 30      # RUNNING is reported while the prolog still runs
    while time.monotonic() < deadline and not (
            sf.exists() and json.loads(sf.read_text()).get("phase") == "ready"):
        time.sleep(0.1)
    assert json.loads(sf.read_text())["phase"] == "ready"
    assert (node_files["mps"] / str(jid)).is_dir()
    assert _slurmd_pid(name, conf) is not None
    new = _restart_slurmd(cluster, name)
    try:
        cluster.wait_node_state(name, re.compile("mixed|allocated|idle"), timeout=30)
        assert cluster.job(jid).get("JobState") == "RUNNING"   # the job survived the restart
        cluster.run(["scancel", str(jid)])
        cluster.wait_job(jid, timeout=60)
        deadline = time.monotonic() + 30
        while _leftovers(node_files, state_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _leftovers(node_files, state_dir) == []
    finally:
        _stop(new)


def _stop(slurmd: subprocess.Popen) -> None:
    """End a slurmd this module started: SIGTERM, SIGKILL after 10 s."""
    slurmd.terminate()
    try:
        slurmd.wait(timeout=10)
    except subprocess.TimeoutExpired:
        slurmd.kill()
        slurmd.wait()


def _restart_slurmd(cluster: Cluster, name: str, how: int = signal.SIGTERM) -> subprocess.Popen:
    conf = cluster.dir / "etc" / "slurm.conf"
    old = _slurmd_pid(name, conf)
    if old is not None:                 # none: an earlier test's restarted slurmd was stopped
        os.kill(old, how)
        deadline = time.monotonic() + 15
        while Path(f"/proc/{old}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    log = open(cluster.dir / "log" / f"slurmd-{name}.restart.stdout", "ab")
    try:
        return subprocess.Popen(["/usr/sbin/slurmd", "-D", "-N", name, "-f", str(conf)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                cwd=str(cluster.dir), env=dict(cluster.env), start_new_session=True)
    finally:
        log.close()


def test_slurmd_restart_during_prolog(cluster: Cluster, node_files) -> None:
    """slurmd restarted for real while a --gpu-mps prolog runs (the daemon's start slowed
    by a wrapper, so the restart lands inside it), stopped (SIGTERM: slurmd waits for
    its prolog) or killed (SIGKILL) four times: whatever Slurm makes of
    the job, nothing of it is left, and the node is never drained for it by us."""
    name = cluster.nodes[0]
    state_dir = cluster.dir / "var" / name
    conf = cluster.dir / "etc" / "slurm-gpu.toml"
    before = conf.read_text()
    slow = node_files["dir"] / "slow-mps-control"
    slow.write_text(f'#!/bin/sh\n[ "$1" = -d ] && sleep 2\nexec {node_files["ctl"]} "$@"\n')
    slow.chmod(0o755)
    conf.write_text(before.replace(f'control = "{node_files["ctl"]}"', f'control = "{slow}"', 1))
    assert str(slow) in conf.read_text()
    d = cluster.user_dir("sgtest1")
    script = d / "short.sh"
    script.write_text("#!/bin/sh\nsleep 1\n")
    script.chmod(0o755)
    outcomes: list[str] = []
    drained: list[str] = []
    slurmd: subprocess.Popen | None = None
    # A TERMINATE_JOB lost to the restart is sent again only from slurmctld's
    # purge pass, once KillWait + 2 * MessageTimeout have passed: every 60 s,
    # or every MinJobAge seconds (at least 10) when that is shorter
    # (src/slurmctld/controller.c _slurmctld_background, job_mgr.c
    # _list_find_job_old).  Each of the four rounds waited for it: about 240 s.
    # MinJobAge=10 for this test only (the module's other tests read finished
    # jobs later than that); slurmctld reads it again at reconfigure.
    sconf = cluster.dir / "etc" / "slurm.conf"
    sbefore = sconf.read_text()
    assert re.search(r"(?m)^MinJobAge=\d+$", sbefore)
    sconf.write_text(re.sub(r"(?m)^MinJobAge=\d+$", "MinJobAge=10", sbefore))
    assert cluster.run(["scontrol", "reconfigure"]).returncode == 0
    try:
        if _slurmd_pid(name, cluster.dir / "etc" / "slurm.conf") is None:
            slurmd = _restart_slurmd(cluster, name)     # the test before stopped its own
            cluster.wait_node_state(name, re.compile("idle|mixed"), timeout=30)
        for how in (signal.SIGTERM, signal.SIGKILL, signal.SIGTERM, signal.SIGKILL):
            jid = cluster.sbatch("--gres=gpu:1", "--gpu-mps=default", "-o", "/dev/null", str(script),
                                 user="sgtest1", cwd=str(d))
            sf = state_dir / "jobs" / f"{jid}.json"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (node_files["mps"] / str(jid) / "log").exists():
                time.sleep(0.02)
            assert sf.exists(), "the prolog did not start"
            phase = json.loads(sf.read_text()).get("phase")
            new = _restart_slurmd(cluster, name, how)
            if slurmd is not None:
                slurmd.wait(timeout=30)
            slurmd = new
            outcomes.append(f"{signal.Signals(how).name} in phase {phase}")
            cluster.wait_node_state(name, re.compile(r"\S+"), timeout=30)
            try:
                info = cluster.wait_job(jid, timeout=30)
                seen = info.get("JobState", "?")
            except AssertionError:
                # Still "RUNNING, Reason=Prolog" (slurmctld waits for the killed slurmd's
                # prolog-complete message) or requeued: the admin or the user cancels it.
                info = cluster.job(jid)
                seen = f"{info.get('JobState')}({info.get('Reason')}), scancelled"
                cluster.run(["scancel", str(jid)])
                info = cluster.wait_job(jid, timeout=60)
            deadline = time.monotonic() + 30
            while _leftovers(node_files, state_dir) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _leftovers(node_files, state_dir) == []
            node = cluster.node(name)
            reason = node.get("Reason", "")
            outcomes.append(f"{seen}/{node.get('State')}/{reason or '-'}")
            if "DRAIN" in node.get("State", "") or reason:
                drained.append(f"job {jid}: {node.get('State')} {reason}")
                cluster.run(["scontrol", "update", f"nodename={name}", "state=resume"])
    finally:
        conf.write_text(before)
        sconf.write_text(sbefore)
        cluster.run(["scontrol", "reconfigure"])
        if slurmd is not None:
            _stop(slurmd)
    print(f"\nslurmd restarted during a prolog: {outcomes}; drains: {drained}")
    assert drained == []
