"""The Python dispatcher and context modules, driven through a fake SPANK handle."""
from __future__ import annotations

import os
import resource

import pytest
from types import SimpleNamespace

from slurm_gpu import binding, nodefacts
from slurm_gpu import joboptions as options
from slurm_gpu.spank import dispatch, effects, nodecache
from test_binding import MINI
from paths import ROOT

# remote's binding runs the compiled planner (spank/sg_bind.c)
pytestmark = pytest.mark.usefixtures("planner")


class FakeSpank:
    """The surface of slurm_gpu.spank.api.Spank, recording what the plugin does."""

    def __init__(self, context: str, values: dict[int, str] | None = None,
                 env: dict[str, str] | None = None, args: list[str] | None = None,
                 task: int = 0, ntasks: int = 1, jobid: int = 7, stepid: int = 0) -> None:
        self.context = context
        self.values = values or {}
        self.env = dict(env or {})
        self.args = args or []
        self.items = {"S_TASK_ID": task, "S_JOB_LOCAL_TASK_COUNT": ntasks, "S_JOB_ID": jobid,
                      "S_JOB_STEPID": stepid}
        self.job_control: dict[str, str] = {}
        self.errors: list[str] = []
        self.verbose_lines: list[str] = []

    def option_value(self, which: int) -> str | None:
        return self.values.get(which)

    def plugstack_args(self) -> options.PluginArgs:
        # what spank/sg_args.c hands over for this argv (the same rules)
        return options.parse_plugstack_args(self.args)

    def getenv(self, name: str) -> str | None:
        return self.env.get(name)

    def setenv(self, name: str, value: str) -> None:
        self.env[name] = value

    def unsetenv(self, name: str) -> None:
        self.env.pop(name, None)

    def job_control_setenv(self, name: str, value: str) -> None:
        self.job_control[name] = value

    def item_u32(self, item: str) -> int:
        return self.items[item]

    item_int = item_u32

    def error(self, line: str) -> None:
        self.errors.append(line)

    def info(self, line: str) -> None:
        pass

    def verbose(self, line: str) -> None:
        self.verbose_lines.append(line)


@pytest.mark.parametrize("context", ["local", "allocator"])
def test_submit_side_validates_and_carries_options(context):
    sp = FakeSpank(context, {options.NUMA_BIND: "strict", options.MPS: "default",
                             options.MIG: "3g.40gb,2g.20gb", options.PROFILE: "inference"})
    for which in sp.values:
        assert dispatch.run_option(sp, which) == 0
    assert dispatch.run_hook(sp, "init_post_opt") == 0
    assert sp.job_control == {"SLURM_GPU_NUMA_BIND": "strict", "SLURM_GPU_MPS": "default",
                              "SLURM_GPU_MIG": "3g.40gb,2g.20gb",
                              "SLURM_GPU_PROFILE": "inference",
                              options.PROLOG_GATE: "1"}     # MPS/MIG give the prolog work
    assert sp.errors == []


@pytest.mark.parametrize("which,value,needle", [
    (options.NUMA_BIND, "sometimes", "--gpu-numa-bind"),
    (options.PROFILE, "gaming", "--gpu-profile"),
    (options.MPS, "0", "--gpu-mps"),
    (options.MIG, "x", "--gpu-mig"),
])
def test_bad_value_is_one_line_and_minus_one(which, value, needle):
    sp = FakeSpank("local", {which: value})
    assert dispatch.run_option(sp, which) == -1
    assert len(sp.errors) == 1
    assert sp.errors[0].startswith("slurm-gpu: bad value") and needle in sp.errors[0]


def test_unexpected_exception_is_caught_with_slurm_gpu_prefix(monkeypatch):
    from slurm_gpu.spank import local

    def boom(spank):
        raise KeyError("x")
    monkeypatch.setattr(local, "init_post_opt", boom)
    sp = FakeSpank("local", {options.MPS: "5"})
    assert dispatch.run_hook(sp, "init_post_opt") == -1
    assert sp.errors[0] == "slurm-gpu: internal error in init_post_opt: KeyError: 'x'"
    assert all(e.startswith("slurm-gpu:") for e in sp.errors)
    # one line for the user; the traceback only at verbose level
    assert len(sp.errors) == 1, sp.errors
    assert any("Traceback" in l for l in sp.verbose_lines)
    assert all(l.startswith("slurm-gpu:") for l in sp.verbose_lines)


def test_hook_id_of_another_build_is_an_error():
    """A plugin built by an older slurm-gpu (hook 2 was user_init) is not silently ignored."""
    sp = FakeSpank("remote", {options.NUMA_BIND: "strict"}, {"SLURM_STEP_GPUS": "0"})
    assert dispatch.run_hook_id(sp, 2) == -1
    assert len(sp.errors) == 1 and "rebuild it with slurm-gpu spank build" in sp.errors[0]
    assert dispatch.run_hook_id(FakeSpank("slurmd"), 1) == 0


def test_contexts_without_work_do_nothing():
    for ctx in ("slurmd", "job_script", "error"):
        assert dispatch.run_hook(FakeSpank(ctx), "init_post_opt") == 0


@pytest.fixture
def applied(monkeypatch, tmp_path):
    """Record the system calls instead of making them on the test process."""
    calls: dict[str, object] = {}
    monkeypatch.setattr(effects, "set_affinity", lambda cpus: calls.__setitem__("cpus", cpus))
    monkeypatch.setattr(effects, "set_mempolicy",
                        lambda mode, nodes: calls.__setitem__("mempolicy", (mode, nodes)))
    monkeypatch.setattr(effects, "allowed_cpus", lambda: (0, 1, 2, 3))
    monkeypatch.setattr(effects, "get_mempolicy", lambda: calls.get("policy", (0, ())))
    monkeypatch.setattr(effects, "disable_thp", lambda: calls.__setitem__("thp", "off"))
    monkeypatch.setattr(effects, "raise_memlock",
                        lambda limit, hard: calls.setdefault("memlock", []).append((limit, hard)))
    loads = []
    monkeypatch.setattr("slurm_gpu.hw.load_node", lambda: loads.append(1) or MINI)
    calls["loads"] = loads
    monkeypatch.setattr(nodefacts, "CACHE_DIR", str(tmp_path / "cache"))
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text('[spank]\nnuma_node_map = { "1" = 0 }\nmemlock_max = "64G"\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    from slurm_gpu import config
    config.clear_cache()
    yield calls
    config.clear_cache()


def test_remote_binds_each_task_to_its_gpu(applied, capfd, monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    env = {"SLURM_STEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"}
    parent = FakeSpank("remote", {options.NUMA_BIND: "strict,verbose"}, env, ntasks=2)
    assert dispatch.run_hook(parent, "init_post_opt") == 0
    task1 = FakeSpank("remote", parent.values, env, task=1, ntasks=2)
    assert dispatch.run_hook(task1, "task_init") == 0, task1.errors
    assert applied["cpus"] == (2, 3)
    assert applied["mempolicy"] == (effects.MPOL_BIND, (0,))     # model node 1 -> host node 0
    assert task1.env["SLURM_GPU_BINDING"] == "strict;gpus=1;cpus=2-3;mems=1"
    err = capfd.readouterr().err
    assert "slurm-gpu: gpu-numa-bind=strict - n1, task  1 [" in err and "(MPOL_BIND)" in err


def test_remote_admin_default_prefer_applies_without_option(applied):
    env = {"SLURM_STEP_GPUS": "0"}
    sp = FakeSpank("remote", {}, env, args=["numa_bind=prefer"])
    assert dispatch.run_hook(sp, "init_post_opt") == 0
    assert dispatch.run_hook(sp, "task_init") == 0, sp.errors
    assert applied["mempolicy"] == (effects.MPOL_PREFERRED, (0,))


BATCH_STEP = 0xfffffffb          # SLURM_BATCH_SCRIPT


@pytest.mark.parametrize("stepid,env", [
    (0, {"SLURM_JOB_GPUS": "1"}),              # srun step without GPUs: Slurm unsets only STEP
    (BATCH_STEP, {"SLURM_STEP_GPUS": "1"}),    # batch step without GPUs: Slurm unsets only JOB
])
def test_remote_gpu_list_the_user_exported_binds_nothing(applied, stepid, env):
    """Slurm sets (and clears) SLURM_STEP_GPUS in a step and SLURM_JOB_GPUS in a
    batch step; the other one is whatever the user exported."""
    sp = FakeSpank("remote", {options.NUMA_BIND: "strict"}, env, stepid=stepid)
    assert dispatch.run_hook(sp, "init_post_opt") == 0, sp.errors
    assert dispatch.run_hook(sp, "task_init") == 0, sp.errors
    assert "cpus" not in applied and "mempolicy" not in applied
    assert "SLURM_GPU_BINDING" not in sp.env and applied["loads"] == []


def test_remote_batch_step_binds_to_the_jobs_gpus(applied):
    sp = FakeSpank("remote", {options.NUMA_BIND: "strict"},
                   {"SLURM_JOB_GPUS": "1", "SLURM_STEP_GPUS": "0"}, stepid=BATCH_STEP)
    assert dispatch.run_hook(sp, "init_post_opt") == 0, sp.errors
    assert dispatch.run_hook(sp, "task_init") == 0, sp.errors
    assert applied["cpus"] == (2, 3) and sp.env["SLURM_GPU_BINDING"].startswith("strict;gpus=1;")


@pytest.mark.parametrize("mode", ["strict", "prefer"])
def test_slurm_mem_bind_is_narrowed_never_replaced(applied, mode, monkeypatch, capfd):
    """task/affinity applied --mem-bind before task_init: an MPOL_BIND is in place."""
    applied["policy"] = (effects.MPOL_BIND, (0,))       # host node 0 = model nodes 0 and 1 here
    env = {"SLURM_STEP_GPUS": "1"}
    sp = FakeSpank("remote", {options.NUMA_BIND: mode}, env)
    dispatch.run_hook(sp, "init_post_opt")
    assert dispatch.run_hook(sp, "task_init") == 0, sp.errors
    assert applied["cpus"] == (2, 3)

    # Slurm bound memory to a node the GPU is not on (map 1 -> 1: host node 1)
    for k in ("cpus", "mempolicy"):
        applied.pop(k, None)
    monkeypatch.setattr(nodecache, "get", lambda *a, **k: dict(
        gpus=binding.locality(MINI), numa_map={}, memlock=None, state_dir="/x"))
    applied["policy"] = (effects.MPOL_BIND | 1 << 15, (0,))  # MPOL_F_STATIC_NODES
    sp = FakeSpank("remote", {options.NUMA_BIND: mode}, env)
    dispatch.run_hook(sp, "init_post_opt")
    rc = dispatch.run_hook(sp, "task_init")
    assert "cpus" not in applied and "mempolicy" not in applied, applied
    if mode == "strict":
        assert rc == -1
        assert sp.errors[0] == ("slurm-gpu: gpu-numa-bind=strict impossible: GPU 1 is local to "
                                "NUMA 1 but Slurm bound the memory of task 0 to NUMA 0 (task 0)")
    else:
        assert rc == 0 and sp.env["SLURM_GPU_BINDING"] == "prefer;gpus=1;none"
        assert "Slurm bound the memory of task 0 to NUMA 0" in capfd.readouterr().err


def test_remote_strict_impossible_fails_task(applied, monkeypatch):
    monkeypatch.setattr(effects, "allowed_cpus", lambda: (0,))
    env = {"SLURM_STEP_GPUS": "1"}
    sp = FakeSpank("remote", {options.NUMA_BIND: "strict"}, env)
    dispatch.run_hook(sp, "init_post_opt")
    assert dispatch.run_hook(sp, "task_init") == -1
    assert sp.errors[0].startswith("slurm-gpu: gpu-numa-bind=strict impossible")
    assert "cpus" not in applied


def test_remote_config_error_reaches_every_task(applied, tmp_path, monkeypatch):
    bad = tmp_path / "bad.toml"
    bad.write_text("[spank]\nno_such_key = 1\n")
    sp = FakeSpank("remote", {options.NUMA_BIND: "strict"}, {"SLURM_STEP_GPUS": "0"},
                   args=[f"config={bad}"])
    assert dispatch.run_hook(sp, "init_post_opt") == 0      # logged, reported per task
    assert "unknown config key spank.no_such_key" in sp.errors[0]
    assert dispatch.run_hook(sp, "task_init") == -1
    assert sp.errors[-1] == sp.errors[0]


def test_remote_profiles(applied):
    sp = FakeSpank("remote", {options.PROFILE: "inference"}, {"SLURM_RLIMIT_MEMLOCK": "65536"})
    dispatch.run_hook(sp, "init_post_opt")
    assert dispatch.run_hook(sp, "task_init_privileged") == 0
    assert dispatch.run_hook(sp, "task_init") == 0, sp.errors
    assert applied["thp"] == "off"
    assert applied["memlock"] == [(64 << 30, True), (64 << 30, False)]
    # Slurm applies SLURM_RLIMIT_MEMLOCK after task_init: it must carry ours
    assert sp.env["SLURM_RLIMIT_MEMLOCK"] == str(resource.getrlimit(resource.RLIMIT_MEMLOCK)[0])

    applied.clear()
    sp = FakeSpank("remote", {options.PROFILE: "training"})
    dispatch.run_hook(sp, "init_post_opt")
    assert dispatch.run_hook(sp, "task_init") == 0
    assert "thp" not in applied


def test_memlock_warning_of_the_privileged_hook_reaches_the_tasks_stderr(applied, monkeypatch,
                                                                          capfd):
    """task_init_privileged runs before slurmstepd connects the task's stdio
    (mgr.c: _pre_task_child_privileged, then _prepare_stdio): its warning is
    held and written by task_init, whose stderr is the job's."""
    def raise_memlock(limit: int, hard: bool) -> str | None:
        return "cannot raise the hard RLIMIT_MEMLOCK above 65536: denied" if hard else None
    monkeypatch.setattr(effects, "raise_memlock", raise_memlock)
    sp = FakeSpank("remote", {options.PROFILE: "training"})
    dispatch.run_hook(sp, "init_post_opt")
    assert dispatch.run_hook(sp, "task_init_privileged") == 0
    assert capfd.readouterr().err == ""           # not yet: stdio is slurmstepd's
    assert dispatch.run_hook(sp, "task_init") == 0, sp.errors
    assert capfd.readouterr().err == ("slurm-gpu: warning: --gpu-profile: cannot raise the hard "
                                      "RLIMIT_MEMLOCK above 65536: denied (task 0)\n")
    # said once: the next step's task (a new process) starts with none held
    dispatch.run_hook(sp, "init_post_opt")
    assert dispatch.run_hook(sp, "task_init") == 0
    assert capfd.readouterr().err == ""


def test_allocator_preload_only_when_library_exists(applied, tmp_path, monkeypatch):
    lib = tmp_path / "libjemalloc.so.2"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[spank]\nallocator_preload = "{lib}"\n'
                   '[spank.allocator_env]\nMALLOC_CONF = "background_thread:true"\n')
    sp = FakeSpank("remote", {options.PROFILE: "training"}, args=[f"config={cfg}"])
    dispatch.run_hook(sp, "init_post_opt")
    dispatch.run_hook(sp, "task_init")
    assert "LD_PRELOAD" not in sp.env and "MALLOC_CONF" not in sp.env
    lib.write_bytes(b"")
    sp = FakeSpank("remote", {options.PROFILE: "training"}, {"LD_PRELOAD": "/x.so"},
                   args=[f"config={cfg}"])
    dispatch.run_hook(sp, "init_post_opt")
    dispatch.run_hook(sp, "task_init")
    assert sp.env["LD_PRELOAD"] == f"{lib} /x.so"
    assert sp.env["MALLOC_CONF"] == "background_thread:true"


def test_mps_task_env_comes_from_job_state(applied, tmp_path, monkeypatch):
    from slurm_gpu.jobs import state as jobstate
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[node]\nstate_dir = "{tmp_path}/var/%n"\n')
    monkeypatch.setattr(jobstate, "load", lambda d, jobid: SimpleNamespace(d=d, jobid=jobid, mps=None))
    monkeypatch.setattr(jobstate, "task_env",
                        lambda st, t, n: {"CUDA_MPS_PIPE_DIRECTORY": f"{st.d}/{st.jobid}/{t}"})
    monkeypatch.setenv("SLURMD_NODENAME", "n3")          # slurmstepd's own environment
    sp = FakeSpank("remote", {options.MPS: "default"}, {"SLURMD_NODENAME": "../evil"},
                   args=[f"config={cfg}"], task=1, ntasks=2)  # the job's: user-controlled
    dispatch.run_hook(sp, "init_post_opt")
    assert dispatch.run_hook(sp, "task_init") == 0, sp.errors
    assert sp.env["CUDA_MPS_PIPE_DIRECTORY"] == f"{tmp_path}/var/n3/7/1"

    monkeypatch.setattr(jobstate, "load", lambda d, jobid: None)
    sp = FakeSpank("remote", {options.MPS: "default"}, args=[f"config={cfg}"])
    dispatch.run_hook(sp, "init_post_opt")
    assert dispatch.run_hook(sp, "task_init") == -1
    assert "no GPU state for job 7" in sp.errors[0]


def _in_child(fn) -> int:
    """Run *fn* in a forked child (it changes process state); return its exit code."""
    pid = os.fork()
    if pid == 0:
        try:
            fn()
            os._exit(0)
        except BaseException as e:  # noqa: BLE001
            os.write(2, f"{type(e).__name__}: {e}\n".encode())
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_real_mempolicy_and_thp_syscalls():
    def child() -> None:
        effects.set_mempolicy(effects.MPOL_BIND, (0,))
        assert effects.get_mempolicy() == (effects.MPOL_BIND, (0,))
        effects.set_mempolicy(effects.MPOL_PREFERRED, (0,))
        assert effects.get_mempolicy() == (effects.MPOL_PREFERRED, (0,))
        import ctypes
        effects.disable_thp()
        assert ctypes.CDLL(None).prctl(effects.PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1
        cpus = effects.allowed_cpus()
        effects.set_affinity(cpus[:1])
        assert effects.allowed_cpus() == cpus[:1]
    assert _in_child(child) == 0


def test_mempolicy_to_missing_node_is_an_error():
    def child() -> None:
        from slurm_gpu.errors import SlurmGpuError
        with pytest.raises(SlurmGpuError, match="set_mempolicy to NUMA node"):
            effects.set_mempolicy(effects.MPOL_BIND, (63,))
    assert _in_child(child) == 0


def test_memlock_is_raised_never_lowered():
    def child() -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        assert hard == resource.RLIM_INFINITY or hard >= 4096
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, hard))
        assert effects.raise_memlock(4096, hard=False) is None
        assert resource.getrlimit(resource.RLIMIT_MEMLOCK) == (4096, hard)
        assert effects.raise_memlock(1024, hard=False) is None      # never lowers
        assert resource.getrlimit(resource.RLIMIT_MEMLOCK) == (4096, hard)
        # beyond the hard limit as the user: capped at hard, not an error
        warning = effects.raise_memlock(resource.RLIM_INFINITY, hard=False)
        assert warning is None and resource.getrlimit(resource.RLIMIT_MEMLOCK)[0] == hard
        # raising the hard limit needs CAP_SYS_RESOURCE: done, or a warning
        warning = effects.raise_memlock(resource.RLIM_INFINITY, hard=True)
        got = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        assert got == (resource.RLIM_INFINITY,) * 2 or "hard RLIMIT_MEMLOCK" in warning
    assert _in_child(child) == 0


def test_node_facts_are_cached_until_the_config_changes(applied, tmp_path):
    env = {"SLURM_STEP_GPUS": "0"}
    for _ in range(3):
        sp = FakeSpank("remote", {options.NUMA_BIND: "strict"}, env)
        assert dispatch.run_hook(sp, "init_post_opt") == 0, sp.errors
        assert dispatch.run_hook(sp, "task_init") == 0, sp.errors
    assert len(applied["loads"]) == 1
    # one entry, and the binding table the plugin's C half reads beside it
    names = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len(names) == 2 and names[1] == names[0] + ".bind", names
    table = (tmp_path / "cache" / names[1]).read_text()
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text(cfg.read_text() + "# touched\n")
    os.utime(cfg, ns=(1, 1))
    sp = FakeSpank("remote", {options.NUMA_BIND: "strict"}, env)
    dispatch.run_hook(sp, "init_post_opt")
    assert len(applied["loads"]) == 2
    # the table follows the rebuilt entry (new stamps), or C would refuse it forever
    new_table = (tmp_path / "cache" / names[1]).read_text()
    assert new_table != table and f"stamp {1} " in new_table
    # a step without GPUs or binding does not need (or load) the model
    sp = FakeSpank("remote", {options.PROFILE: "training"}, {})
    nodecache_files = set((tmp_path / "cache").iterdir())
    assert dispatch.run_hook(sp, "init_post_opt") == 0 and len(applied["loads"]) == 2
    assert set((tmp_path / "cache").iterdir()) == nodecache_files


class _FakeLib:
    """The few cffi ``lib`` functions :class:`slurm_gpu.spank.api.Spank` uses in srun."""

    def __init__(self, ffi, values: dict[int, bytes]) -> None:
        self.ffi = ffi
        self.values = {k: ffi.new("char[]", v) for k, v in values.items()}
        self.errors: list[str] = []

    def spank_context(self) -> int:
        return 1                                   # S_CTX_LOCAL

    def sg_option_value(self, which: int):
        return self.values.get(which, self.ffi.NULL)

    def slurm_error(self, fmt: bytes, arg) -> None:
        assert fmt == b"%s"
        self.errors.append(self.ffi.string(arg).decode())


@pytest.mark.parametrize("which,raw,needle", [
    (options.MPS, b"5\xff", "--gpu-mps"),
    (options.MIG, b"\xff", "--gpu-mig"),
    (options.NUMA_BIND, b"strict\xfe", "--gpu-numa-bind"),
    (options.PROFILE, b"\xc3", "--gpu-profile"),
])
def test_value_that_is_not_utf8_is_a_bad_value_not_a_traceback(which, raw, needle):
    import cffi

    from slurm_gpu.spank.api import Spank
    ffi = cffi.FFI()
    lib = _FakeLib(ffi, {which: raw})
    assert dispatch.run_option(Spank(ffi, lib), which) == -1
    assert len(lib.errors) == 1, lib.errors
    assert lib.errors[0].startswith("slurm-gpu: bad value") and needle in lib.errors[0]


def test_cached_step_imports_neither_config_nor_hw() -> None:
    """With a warm node cache a step pays only for hostctx: importing
    slurm_gpu.config or slurm_gpu.hw costs ~25 ms each, which is the whole
    budget of a bound step (issue 3: <= 2x a step without the plugin)."""
    import subprocess
    import sys
    root = ROOT
    # A fresh interpreter with only the plugin's own imports (this test module
    # imports the model through test_binding).
    code = f"""
import sys
sys.path.insert(0, {str(root)!r})
from slurm_gpu.spank import nodecache, remote
from slurm_gpu.joboptions import PluginArgs
class Handle:
    def plugstack_args(self): return PluginArgs("/etc/slurm-gpu/x.toml")
    def option_value(self, which): return None
    def getenv(self, name): return None
    def item_u32(self, item): return 0
nodecache.get = lambda *a, **k: {{"memlock": None, "allocator_preload": "", "allocator_env": {{}},
                                  "numa_map": {{}}, "state_dir": "/nonexistent", "gpus": None}}
remote._load_step(Handle())
from slurm_gpu import hostctx
assert hostctx.config_file == "/etc/slurm-gpu/x.toml", hostctx.config_file
heavy = sorted(m for m in sys.modules if m in ("slurm_gpu.config", "tomllib") or m.startswith("slurm_gpu.hw"))
print("HEAVY", heavy)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout, out.stdout
