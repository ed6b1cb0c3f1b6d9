"""The SPANK plugin on a real Slurm: discovery, real binding, isolation, failures, bad values.

The sandbox models ``mini-2numa`` (2 NUMA nodes x 1 core; PU OS 0 and 1, one
GPU per NUMA node), which maps onto this host's two real CPUs, so the CPU
binding is real.  The host has a single NUMA node, so the sandbox-only
``[spank] numa_node_map`` sends model node 1 to host node 0 for set_mempolicy.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from sandboxlib import REPO, Cluster

MACHINE = os.environ.get("SLURM_GPU_SPANK_MACHINE", "mini-2numa")
OPTIONS = ("--gpu-numa-bind", "--gpu-profile", "--gpu-mps", "--gpu-mig")

# What each task reports about itself: run by the venv's python as the job user.
PROBE = r"""
import os, re, sys
from slurm_gpu.spank.effects import get_mempolicy
status = open("/proc/self/status").read()
cpus = re.search(r"Cpus_allowed_list:\s*(\S+)", status).group(1)
first = open("/proc/self/numa_maps").readline().split()
mode, nodes = get_mempolicy()
print("TASK", os.environ["SLURM_LOCALID"], os.environ.get("CUDA_VISIBLE_DEVICES", "-"),
      os.environ.get("SLURM_GPU_BINDING", "-"), cpus, first[1], mode,
      ",".join(map(str, nodes)) or "-", flush=True)
"""


@pytest.fixture(scope="module")
def prolog_dump(tmp_path_factory) -> Path:
    """A Prolog that records the SPANK_* variables it sees, one file per job."""
    from sandboxlib import new_sandbox_dir
    d = new_sandbox_dir("spank-prolog")
    (d / "env").mkdir()
    script = d / "prolog.sh"
    script.write_text("#!/bin/sh\n/usr/bin/env | /bin/grep '^SPANK_SLURM_GPU' "
                      f"> {d}/env/$SLURM_JOB_ID\nexit 0\n")
    script.chmod(0o755)
    yield d
    import shutil
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(make_sandbox, job_users, prolog_dump) -> Cluster:
    if "/" not in MACHINE and not (REPO / "tests" / "data" / "machines" / MACHINE).is_dir():
        pytest.fail(f"machine {MACHINE} missing from tests/data/machines (nvml+snapshot area)")
    return make_sandbox(machine=MACHINE, spank=True,
                        extra_config={"spank": {"numa_node_map": {"1": 0}}},
                        slurm_conf={"Prolog": str(prolog_dump / "prolog.sh"),
                                    "PrologFlags": "Alloc"})


def _venv_python() -> str:
    return "/opt/slurm-gpu/venv/bin/python"


def _next_jobid(c: Cluster) -> int:
    """Submit a trivial valid job; its id tells how many jobs were created so far."""
    return c.sbatch("-o", "/dev/null", "--wrap", "true")


def test_help_lists_every_option(cluster):
    for cmd in ("srun", "sbatch", "salloc"):
        res = cluster.run([cmd, "--help"])
        text = res.stdout + res.stderr
        for opt in OPTIONS:
            assert opt in text, f"{cmd} --help lacks {opt}"
        assert text.count("[slurm-gpu]") == len(OPTIONS)
        assert "conflict" not in res.stderr.lower(), res.stderr


def test_strict_binds_each_task_to_its_gpu(cluster):
    res = cluster.srun("-n2", "--gpus-per-task=1", "--gpu-numa-bind=strict,verbose",
                       _venv_python(), "-c", PROBE, user="sgtest1")
    assert res.returncode == 0, res.stderr
    rows = sorted(line.split()[1:] for line in res.stdout.splitlines() if line.startswith("TASK"))
    assert len(rows) == 2, res.stdout
    seen = set()
    for localid, cvd, binding_env, cpus, numa_policy, mode, nodes in rows:
        gpu = re.search(r"gpus=(\d+)", binding_env).group(1)
        # mini-2numa: GPU N sits on NUMA node N whose only PU is OS CPU N
        assert cpus == gpu, rows
        assert binding_env == f"strict;gpus={gpu};cpus={gpu};mems={gpu}"
        assert mode == "2" and nodes == "0"          # MPOL_BIND to host node 0 (mapped)
        assert numa_policy == "bind:0"
        seen.add(cpus)
    assert seen == {"0", "1"}, "both tasks were bound to the same GPU's cores"
    verbose = [l for l in res.stderr.splitlines() if "gpu-numa-bind=strict" in l]
    assert len(verbose) == 2 and all("(MPOL_BIND)" in l for l in verbose), res.stderr


def test_prefer_on_one_gpu_sets_preferred_policy(cluster):
    res = cluster.srun("--gpus=1", "--gpu-numa-bind=prefer", _venv_python(), "-c", PROBE,
                       user="sgtest1")
    assert res.returncode == 0, res.stderr
    row = [l.split() for l in res.stdout.splitlines() if l.startswith("TASK")][0]
    assert row[3].startswith("prefer;gpus=0;cpus=0;") and row[4] == "0"
    assert row[6] == "1" and row[5].startswith("prefer")  # MPOL_PREFERRED


def test_tasks_see_the_options(cluster):
    res = cluster.srun("--gpu-profile=inference", "--gpu-numa-bind=off", "/bin/sh", "-c",
                       "echo $SLURM_GPU_PROFILE $SLURM_GPU_NUMA_BIND; "
                       "grep -c . /proc/self/status >/dev/null", user="sgtest1")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["inference", "off"]


def test_impossible_binding_strict_fails_prefer_warns(cluster):
    # Slurm pins the task to CPU 1, its GPU 0 sits on NUMA node 0 (CPU 0)
    args = ("--gpus=1", "-c2", "--cpu-bind=map_cpu:1")
    res = cluster.srun(*args, "--gpu-numa-bind=strict", "true", user="sgtest1")
    assert res.returncode != 0
    assert "slurm-gpu: gpu-numa-bind=strict impossible: GPU 0 is local to CPUs 0" in res.stderr
    res = cluster.srun(*args, "--gpu-numa-bind=prefer", _venv_python(), "-c", PROBE,
                       user="sgtest1")
    assert res.returncode == 0, res.stderr
    assert "slurm-gpu: warning: gpu-numa-bind=prefer not applied" in res.stderr
    row = [l.split() for l in res.stdout.splitlines() if l.startswith("TASK")][0]
    assert row[3] == "prefer;gpus=0;none"
    assert row[4] == "1" and row[6] == "0"       # Slurm's CPU kept, default memory policy


def test_sbatch_options_reach_prolog_batch_step_and_steps(cluster, prolog_dump):
    out = cluster.user_dir("sgtest1") / "batch.out"
    jobid = cluster.sbatch("--gpus=2", "-n2", "--gpu-numa-bind=strict", "--gpu-profile=training",
                           "-o", str(out), "--wrap",
                           f"echo BATCH $SLURM_GPU_NUMA_BIND $SLURM_GPU_PROFILE; "
                           f"srun -n2 {_venv_python()} -c '{PROBE}'",
                           user="sgtest1")
    info = cluster.wait_job(jobid)
    assert info["JobState"] == "COMPLETED", (info, out.read_text() if out.exists() else "")
    text = out.read_text()
    assert "BATCH strict training" in text
    rows = sorted(l.split()[1:] for l in text.splitlines() if l.startswith("TASK"))
    assert [r[3] for r in rows] == ["0", "1"], text      # each task on its own GPU's CPU
    env = (prolog_dump / "env" / str(jobid)).read_text().split()
    assert sorted(env) == ["SPANK_SLURM_GPU_NUMA_BIND=strict", "SPANK_SLURM_GPU_PROFILE=training"]


def test_values_reach_the_prolog_normalised_with_or_without_python(cluster, prolog_dump):
    """Canonical values go from C straight to the prolog; others through
    Python, which normalises them: the prolog sees the same either way."""
    for given, seen in (("--gpu-numa-bind=prefer,verbose", "prefer,verbose"),
                        ("--gpu-numa-bind=verbose,prefer", "prefer,verbose"),
                        ("--gpu-numa-bind= off", "off")):
        jobid = cluster.sbatch("--gpus=1", given, "--gpu-profile=inference", "-o", "/dev/null",
                               "--wrap", "true", user="sgtest1")
        info = cluster.wait_job(jobid)
        assert info["JobState"] == "COMPLETED", info
        env = (prolog_dump / "env" / str(jobid)).read_text().split()
        assert sorted(env) == [f"SPANK_SLURM_GPU_NUMA_BIND={seen}",
                               "SPANK_SLURM_GPU_PROFILE=inference"], (given, env)


def test_blanks_around_the_mode_still_bind(cluster):
    """srun's Python accepts ' strict' (it strips tokens): slurmstepd's C half
    must see the same mode, or the step runs unbound with no word said."""
    res = cluster.run(["srun", "--gpus=1", "--gpu-numa-bind= strict ,verbose", "true"],
                      user="sgtest1")
    assert res.returncode == 0, res.stderr
    assert f"gpu-numa-bind=strict - {cluster.nodes[0]}, task  0" in res.stderr, res.stderr


def test_user_cannot_steer_the_node_name(cluster):
    res = cluster.run(["srun", "--gpus=1", "--gpu-numa-bind=strict,verbose", "true"],
                      user="sgtest1", env={"SLURMD_NODENAME": "../../evil"})
    assert res.returncode == 0, res.stderr
    node = cluster.nodes[0]
    assert f"gpu-numa-bind=strict - {node}, task  0" in res.stderr, res.stderr
    assert "evil" not in res.stderr


@pytest.mark.parametrize("exported", [
    # CUDA_VISIBLE_DEVICES exported by the user does not make a GPU step
    {"CUDA_VISIBLE_DEVICES": "1"},
    # Slurm unsets a user's SLURM_STEP_GPUS in a step without GPUs, but
    # leaves SLURM_JOB_GPUS alone: it must not be taken for the step's GPUs
    {"SLURM_JOB_GPUS": "1"},
], ids=["cuda-visible-devices", "job-gpus"])
def test_step_without_gpus_is_not_bound(cluster, exported):
    res = cluster.run(["srun", "--gpu-numa-bind=strict,verbose", _venv_python(), "-c", PROBE],
                      user="sgtest1", env=exported)
    assert res.returncode == 0, res.stderr
    row = [l.split() for l in res.stdout.splitlines() if l.startswith("TASK")][0]
    assert row[3] == "-" and row[6] == "0", row     # no SLURM_GPU_BINDING, default policy
    assert "gpu-numa-bind=strict -" not in res.stderr


def test_no_python_without_options(cluster, tmp_path):
    """srun without our options never starts Python; nor with values the C
    half passes on as they are (a bound step's --gpu-numa-bind=prefer); a
    value Python must normalise or check does."""
    def opened(*args: str) -> str:
        trace = cluster.dir / "strace.out"
        res = cluster.run(["strace", "-f", "-qq", "-e", "trace=openat", "-o", str(trace),
                           "srun", *args, "true"])
        assert res.returncode == 0, res.stderr
        text = trace.read_text()
        trace.unlink()
        return text
    assert "_cffi_backend" not in opened("-N1")
    assert "_cffi_backend" not in opened("-N1", "--gpu-profile=none")
    assert "_cffi_backend" not in opened("-N1", "--gpus=1", "--gpu-numa-bind=prefer")
    assert "_cffi_backend" in opened("-N1", "--gpu-numa-bind=verbose,prefer")
    # slurmd loads the plugin but never starts Python: the backend is not mapped
    pids = [d["pid"] for d in cluster.sb.status()["daemons"]
            if d["name"].startswith("slurmd") and d["alive"]]
    assert pids
    for pid in pids:
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "slurm_gpu_spank.so" in maps and "_cffi_backend" not in maps


def test_poisoned_python_environment_still_runs(cluster):
    evil = cluster.user_dir("sgtest1") / "evil"
    (evil / "encodings").mkdir(parents=True, exist_ok=True)
    (evil / "encodings" / "__init__.py").write_text("raise SystemExit('poisoned encodings')\n")
    (evil / "slurm_gpu").mkdir(exist_ok=True)
    (evil / "slurm_gpu" / "__init__.py").write_text("raise SystemExit('poisoned slurm_gpu')\n")
    os.system(f"chown -R sgtest1 {evil}")
    env = {"PYTHONPATH": str(evil), "PYTHONHOME": str(evil), "PYTHONSTARTUP": str(evil),
           "PYTHONNOUSERSITE": "", "PYTHONUSERBASE": str(evil)}
    res = cluster.run(["srun", "--gpus=1", "--gpu-numa-bind=strict", "--gpu-profile=training",
                       "/bin/sh", "-c", "echo ok $PYTHONHOME $SLURM_GPU_BINDING"],
                      user="sgtest1", env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["ok", str(evil), "strict;gpus=0;cpus=0;mems=0"]


def test_python_failure_fails_step_but_not_slurm(cluster):
    toml = cluster.dir / "etc" / "slurm-gpu.toml"
    good = toml.read_text()
    try:
        toml.write_text(good + "\n[spank.allocator_env]\nX = 1\n")    # wrong type: a Python error
        res = cluster.srun("--gpus=1", "--gpu-numa-bind=strict", "true", user="sgtest1")
        assert res.returncode != 0
        assert "slurm-gpu: [spank] allocator_env.X must be a string" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
    finally:
        toml.write_text(good)
    node = cluster.nodes[0]
    state = cluster.node_states()[node]
    assert not re.search(r"drain|down|fail", state), state      # a user error never drains
    ok = cluster.srun("--gpus=1", "--gpu-numa-bind=strict", "true", user="sgtest1")
    assert ok.returncode == 0, ok.stderr
    for name in ("slurmctld", node):
        assert "Segmentation" not in cluster.log(name) and "fatal" not in cluster.log(name).lower()


def _build_plugin(out: Path, **kw) -> Path:
    from slurm_gpu.commands.spank import build_script
    mod = build_script()
    out.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(out.parent, 0o755)
    return mod.build(out, python="/opt/slurm-gpu/venv/bin/python", tmpdir=str(out.parent / "t"),
                     **kw)


@pytest.mark.parametrize("breakage", ["no-stdlib", "no-inner-half"])
def test_interpreter_that_cannot_start_is_an_error(cluster, breakage):
    """Never cffi's silent 'returns 0', never an exit() inside srun."""
    so = _build_plugin(cluster.dir / "broken" / breakage / "slurm_gpu_spank.so",
                       sys_path=["/nonexistent/lib/python3.11"])
    if breakage == "no-inner-half":
        so.with_name("slurm_gpu_spank_py.so").unlink()
    plugstack = cluster.sb.layout.plugstack_conf
    good = plugstack.read_text()
    try:
        plugstack.write_text(f"required {so}\n")
        before = _next_jobid(cluster)
        # a value srun's C half leaves to Python (it normalises it)
        res = cluster.srun("--gpu-numa-bind=verbose,strict", "true", user="sgtest1")
        assert res.returncode != 0
        ours = [l for l in res.stderr.splitlines() if "slurm-gpu:" in l]
        want = "cannot start Python" if breakage == "no-stdlib" else "cannot load"
        assert ours and want in ours[0], res.stderr
        assert "Fatal Python error" not in res.stderr
        assert _next_jobid(cluster) == before + 1          # nothing was submitted
        # without our options Python is never needed: srun still works
        assert cluster.srun("true", user="sgtest1").returncode == 0
    finally:
        plugstack.write_text(good)


@pytest.mark.parametrize("arg,msg", [
    ("bogus=1", "slurm-gpu: unknown plugstack argument 'bogus=1'"),
    ("numa_bind=always", "slurm-gpu: bad plugstack argument 'numa_bind=always'"),
    ("numa_bind=verbose", "slurm-gpu: bad plugstack argument 'numa_bind=verbose'"),
    # the C shim must refuse what the Python side refuses, or only bound steps fail
    ("numa_bind=prefer numa_bind=strict", "slurm-gpu: plugstack argument numa_bind given twice"),
    ("config=etc/slurm-gpu.toml", "slurm-gpu: plugstack argument config=etc/slurm-gpu.toml "
     "must be an absolute path"),
])
def test_bad_plugstack_arguments_are_fatal(cluster, arg, msg):
    plugstack = cluster.sb.layout.plugstack_conf
    good = plugstack.read_text()
    line = next(l for l in good.splitlines() if l.startswith("required"))
    keys = {a.split("=", 1)[0] for a in arg.split()}
    line = " ".join(t for t in line.split() if t.split("=", 1)[0] not in keys)
    try:
        plugstack.write_text(f"{line} {arg}\n")
        res = cluster.srun("true", user="sgtest1")
        assert res.returncode != 0 and msg in res.stderr, res.stderr
    finally:
        plugstack.write_text(good)


BAD = [
    ("--gpu-numa-bind=sometimes", "--gpu-numa-bind"),
    ("--gpu-numa-bind=strict,prefer", "--gpu-numa-bind"),
    ("--gpu-profile=gaming", "--gpu-profile"),
    ("--gpu-mps=0", "--gpu-mps"),
    ("--gpu-mps=101", "--gpu-mps"),
    ("--gpu-mig=7g.80gb,,", "--gpu-mig"),
    ("--gpu-mig=big", "--gpu-mig"),
]


def test_bad_values_fail_before_submission(cluster):
    before = _next_jobid(cluster)
    for opt, name in BAD:
        for cmd in (["srun", opt, "true"], ["sbatch", opt, "-o", "/dev/null", "--wrap", "true"],
                    ["salloc", opt, "true"]):
            res = cluster.run(cmd, user="sgtest1", timeout=30)
            assert res.returncode != 0, (cmd, res.stdout)
            ours = [l for l in res.stderr.splitlines() if "slurm-gpu:" in l]
            assert len(ours) == 1, (cmd, res.stderr)
            assert f"for {name}" in ours[0] and opt.split("=", 1)[1] in ours[0]
            assert "Traceback" not in res.stderr
    after = _next_jobid(cluster)
    assert after == before + 1, f"{after - before - 1} job(s) were submitted by bad options"


def test_node_cache_serves_job_users(cluster):
    """The per-node cache is read and written as root, also for a job user's step.

    slurmstepd runs user_init with the job user's effective uid; work done
    there could neither read nor write the root-only cache, so every step of
    every non-root user paid for a TOML parse and a node-model load.
    """
    from slurm_gpu import nodefacts
    cfg = str(cluster.dir / "etc" / "slurm-gpu.toml")
    gres = str(cluster.dir / "etc" / "gres.conf")
    node = cluster.nodes[0]
    cache = Path(nodefacts.cache_file(cfg, node, gres))
    cache.unlink(missing_ok=True)
    res = cluster.srun("--gpus=1", "--gpu-numa-bind=strict", "true", user="sgtest1")
    assert res.returncode == 0, res.stderr
    assert cache.is_file(), "a job user's bound step did not build the node cache"
    st = cache.stat()
    assert st.st_uid == 0 and st.st_mode & 0o777 == 0o600
    data = nodefacts.load(cfg, node, gres)
    assert data is not None and data["gpus"] and "spank" in data["sections"], data


def test_plain_prefer_binds_from_the_table_until_an_input_changes(cluster):
    """A plain prefer step binds in the plugin's C half from the binding table the
    Python path keeps (spank/sg_bind.c, slurm_gpu/spank/bindtable.py); a changed
    input sends the next step to Python, which rebuilds the entry and the table.

    Which half bound the task shows with a table that says something else
    (GPU 0 local to CPU 1): C follows it, Python binds by the entry and
    rewrites the table."""
    from sandboxlib import TEST_SLURM
    if TEST_SLURM:
        pytest.skip("reads the host's /run; test_slurm_versions.py covers the chrooted Slurms")
    from slurm_gpu import nodefacts
    from slurm_gpu.spank import bindtable
    cfg = str(cluster.dir / "etc" / "slurm-gpu.toml")
    gres = str(cluster.dir / "etc" / "gres.conf")
    table = Path(bindtable.path(cfg, cluster.nodes[0], gres))

    def bound_cpus(*opts: str) -> str:
        # -c2: the task may use both CPUs, so either table can be followed
        res = cluster.srun("--gpus=1", "-c2", *opts, _venv_python(), "-c", PROBE,
                           user="sgtest1")
        assert res.returncode == 0, res.stderr
        row = [l.split() for l in res.stdout.splitlines() if l.startswith("TASK")][0]
        assert row[3].startswith("prefer;gpus=0;cpus="), row
        return row[4]

    assert bound_cpus("--gpu-numa-bind=prefer") == "0"
    st = table.stat()
    assert st.st_uid == 0 and st.st_mode & 0o777 == 0o600
    text = table.read_text()
    gpu0 = next(l for l in text.splitlines() if l.startswith("gpu "))
    assert gpu0.endswith(" 0 0"), text
    forged = text.replace(gpu0, gpu0[:-len(" 0 0")] + " 1 0")
    table.write_text(forged)
    assert bound_cpus("--gpu-numa-bind=prefer") == "1"          # the C half, from the table
    assert table.read_text() == forged
    # verbose is Python's: it binds by the entry and puts the table right
    assert bound_cpus("--gpu-numa-bind=prefer,verbose") == "0"
    assert table.read_text() == text
    table.write_text(forged)
    before = os.stat(cfg)
    os.utime(cfg, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    assert bound_cpus("--gpu-numa-bind=prefer") == "0"          # stale: Python
    fresh = table.read_text()
    assert fresh != forged and nodefacts.load(cfg, cluster.nodes[0], gres) is not None
    assert f"stamp {before.st_mtime_ns + 1_000_000} " in fresh
    assert bound_cpus("--gpu-numa-bind=prefer") == "0"


@pytest.mark.parametrize("shape", [("-n2", "--gpus=2"), ("-n2", "--gpus-per-task=1"),
                                   ("-n2", "--gpus=1"), ("-n2", "--gpus=2", "-c1")])
def test_c_and_python_bind_each_task_alike(cluster, shape):
    """The same multi-task step bound by the C half (plain prefer) and by Python
    (prefer,verbose): every task gets the same CPUs, policy and SLURM_GPU_BINDING."""
    def rows(mode: str) -> list[list[str]]:
        res = cluster.srun(*shape, f"--gpu-numa-bind={mode}", _venv_python(), "-c", PROBE,
                           user="sgtest1")
        assert res.returncode == 0, res.stderr
        return sorted(l.split() for l in res.stdout.splitlines() if l.startswith("TASK"))
    cluster.srun("--gpus=1", "--gpu-numa-bind=prefer", "true", user="sgtest1")  # the table
    python = rows("prefer,verbose")
    c = rows("prefer")
    assert len(c) == int(shape[0][2:]) and c == python, (c, python)
