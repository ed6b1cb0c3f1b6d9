"""500 randomised job lifecycles leave nothing behind.

Most lifecycles drive the prolog/epilog entry points directly, in the real
sandbox environment (its slurm-gpu.toml, node name, NVML simulator state and
MPS stand-in), so 500 fit in well under a few minutes; a subset goes through
real Slurm jobs.  Faults: scancel, a prolog killed at a random step (every
state-file write is a possible kill point, as SIGKILL can land anywhere), a
prolog killed for real with SIGKILL, a node restart (the epilog runs in a
fresh process/context with only the files on disk), the epilog run twice, a
node fault half-way.  After each lifecycle there must be no daemon, no MPS
directory, no MIG instance and no state file left.
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
    files = sorted(p.name for p in jobs.glob("*.json")) if jobs.exists() else []
    if jobid is not None:
        files = [f for f in files if f == f"{jobid}.json"]
    out += [f"state file {f}" for f in files]
    dirs = sorted(p.name for p in node_files["mps"].iterdir())
    out += [f"mps dir {d}" for d in dirs if jobid is None or d == jobid]
    for d in dirs:
        if daemon_pids(node_files["mps"] / d / "pipe"):
            out.append(f"daemon of job {d}")
    # any process anywhere bound to an MPS pipe under our base is an orphan
    for p in daemon_pids_under(node_files["mps"]):
        out.append(f"orphan process {p}")
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


def test_500_random_lifecycles(cluster: Cluster, node_files, monkeypatch) -> None:
    import pwd

    from slurm_gpu import config
    from slurm_gpu.jobs import lifecycle
    from slurm_gpu.jobs import state as js
    conf = cluster.dir / "etc" / "slurm-gpu.toml"
    node = cluster.nodes[0]
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(conf))
    monkeypatch.setenv("SLURMD_NODENAME", node)
    config._load.cache_clear()
    state_dir = Path(lifecycle.default_context({}).state_dir)
    rng = random.Random(int(os.environ.get("SLURM_GPU_LIFECYCLE_SEED", "4")))
    users = [pwd.getpwnam(u) for u in ("sgtest1", "sgtest2")]
    real_save = js.save
    counts: dict[str, int] = {}
    t0 = time.monotonic()
    for i in range(N_LIFECYCLES):
        jobid = str(900000 + i)
        u = rng.choice(users)
        kind = rng.choices(["mig", "mps", "both", "none", "bad"], [45, 20, 10, 10, 15])[0]
        event = rng.choice(["normal", "scancel", "killed", "restart", "twice", "fault"])
        if i % 50 == 7:
            event = "sigkill"          # a real SIGKILL of a real prolog process
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
        if kind != "none":
            env["SPANK_SLURM_GPU_PROLOG"] = "1"      # the SPANK plugin's prolog gate
        counts[f"{kind}/{event}"] = counts.get(f"{kind}/{event}", 0) + 1
        if event == "sigkill":
            full = dict(env, SLURM_GPU_CONFIG=str(conf), PATH="/usr/bin:/bin",
                        SLURM_GPU_PYTHON=os.environ.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv")
                        + "/bin/python")
            p = subprocess.Popen(["/bin/sh", str(REPO / "prolog.d" / "50-slurm-gpu-jobs")],
                                 env=full, start_new_session=True)
            time.sleep(rng.uniform(0.0, 0.4))
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        else:
            if event == "killed":
                k = rng.randint(1, 8)
                calls = {"n": 0}

                def dying(sd, st, _k=k, _c=calls):
                    _c["n"] += 1
                    if _c["n"] == _k:
                        raise Killed()
                    real_save(sd, st)
                monkeypatch.setattr(js, "save", dying)
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
                rc = lifecycle.prolog(lifecycle.default_context(env))
                assert rc in (0, 1)
            except Killed:
                pass
            monkeypatch.setattr(js, "save", real_save)
            monkeypatch.undo() if event == "fault" else None
            monkeypatch.setenv("SLURM_GPU_CONFIG", str(conf))
            monkeypatch.setenv("SLURMD_NODENAME", node)
        epilog_env = dict(env)
        if event in ("restart", "sigkill"):
            # slurmd restarted: the epilog knows only the job id and what is on disk
            epilog_env = {"SLURM_JOB_ID": jobid, "SLURMD_NODENAME": node}
        if event == "scancel":
            epilog_env["SLURM_JOB_EXIT_CODE"] = "15"
        assert lifecycle.epilog(lifecycle.default_context(epilog_env)) == 0, jobid
        if event == "twice":
            assert lifecycle.epilog(lifecycle.default_context(epilog_env)) == 0
        left = _leftovers(node_files, state_dir, jobid)
        assert left == [], f"lifecycle {i} ({kind}/{event}, job {jobid}): {left}"
    elapsed = time.monotonic() - t0
    assert _leftovers(node_files, state_dir) == []
    print(f"\n{N_LIFECYCLES} lifecycles in {elapsed:.1f} s; {sorted(counts.items())}")


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
    assert cluster.node_states()[cluster.nodes[0]] in ("idle", "mixed")
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
    old = _slurmd_pid(name, conf)
    assert old is not None
    os.kill(old, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while Path(f"/proc/{old}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = open(cluster.dir / "log" / f"slurmd-{name}.restart.stdout", "ab")
    new = subprocess.Popen(["/usr/sbin/slurmd", "-D", "-N", name, "-f", str(conf)],
                           stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                           cwd=str(cluster.dir), env=dict(cluster.env), start_new_session=True)
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
        new.terminate()
        try:
            new.wait(timeout=10)
        except subprocess.TimeoutExpired:
            new.kill()
        log.close()
