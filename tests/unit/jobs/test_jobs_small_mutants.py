"""jobs' small modules, what the prolog/epilog tests left open (mutmut on
``context.py``, ``settings.py``, ``locality.py`` and ``libc.py``, issue 24 §8).

Each is reached through its public names: the settings a config file
gives, the context the entry points build from it, the job's user and
GPUs as slurmd's environment names them, and the two system calls as the
kernel reports them back.
"""
from __future__ import annotations

import ctypes
import errno
import os
import pwd
from pathlib import Path
from typing import Any, Iterator

import pytest

from paths import ROOT
from slurm_gpu import config, nodefacts
from slurm_gpu.errors import HardwareError, InputError
from slurm_gpu.hw import Snapshot, live, load_node
from slurm_gpu.jobs import context, libc, lifecycle, settings
from slurm_gpu.jobs import state as js
from slurm_gpu.jobs.settings import JobsSettings, MigSettings, MpsSettings
from slurm_gpu.jobs.state import JobFailed
from slurm_gpu_devkit.sim.state import init_state_for_machine

MACHINE = ROOT / "tests" / "data" / "machines" / "h100-mig"
SNAPSHOT = str(MACHINE / "snapshot.json")


@pytest.fixture()
def conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The config file in effect (written by the test), node n7, a private fact cache."""
    p = tmp_path / "slurm-gpu.toml"
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(p))
    monkeypatch.setattr(nodefacts, "CACHE_DIR", str(tmp_path / "facts"))
    live.use_node_name("n7")
    config.clear_cache()
    yield p
    live.use_node_name(None)
    config.clear_cache()


def _load(conf: Path, text: str) -> tuple[JobsSettings, MpsSettings, MigSettings]:
    conf.write_text(text)
    config.clear_cache()
    return settings.load()


# -- settings.load ----------------------------------------------------------------

def test_load_reads_each_section_and_puts_the_node_name_in_the_mps_base(conf: Path) -> None:
    jobs, mps, mig = _load(conf, '[jobs]\non_internal_error = "pass"\nuser_error = "cancel"\n'
                                 '[mps]\nbase_dir = "/run/x/%n/mps/%n"\n'
                                 'default_active_thread_percentage = 100\n'
                                 '[mig]\ngres_conf = "/etc/slurm/gres.conf"\n')
    assert (jobs.on_internal_error, jobs.user_error) == ("pass", "cancel")
    assert (mps.base_dir, mps.default_active_thread_percentage) == ("/run/x/n7/mps/n7", 100)
    assert mig.gres_conf == "/etc/slurm/gres.conf"
    assert _load(conf, '[mps]\nbase_dir = "/run/x/%N"\n')[1].base_dir == "/run/x/%N"


@pytest.mark.parametrize("text, what", [
    ('[jobs]\nuser_error = "CANCEL"\n',
     "config key jobs.user_error must be one of fail_tasks, cancel (got 'CANCEL')"),
    ('[jobs]\non_internal_error = "Drain"\n',
     "config key jobs.on_internal_error must be one of drain, pass (got 'Drain')"),
    ("[mps]\ndefault_active_thread_percentage = 101\n",
     "config key mps.default_active_thread_percentage must be 0..100"),
])
def test_load_refuses_a_bad_value_naming_the_key_and_the_file(conf: Path, text: str, what: str) -> None:
    with pytest.raises(InputError) as e:
        _load(conf, text)
    assert (e.value.what, e.value.where) == (what, str(conf))


def test_cached_keeps_its_section_in_the_nodes_entry_without_reading_gpus(conf: Path,
                                                                         tmp_path: Path) -> None:
    conf.write_text("[jobs]\ntimeout = 7.0\n")
    gres = str(tmp_path / "gres.conf")
    got = settings.cached(str(conf), "n7", gres, health=False)
    assert (got["jobs"]["timeout"], got["health_state_dir"]) == (7.0, "")
    # The entry the SPANK step shares: keyed on this config and gres.conf.
    entry = nodefacts.load(str(conf), "n7", gres)
    assert entry is not None and entry["gpus"] is None
    assert sorted(entry["sections"]) == [settings.SECTION]


# -- context.default_context ------------------------------------------------------

def test_default_context_takes_each_part_from_the_config_and_the_environment(conf: Path,
                                                                           tmp_path: Path) -> None:
    sim = str(tmp_path / "sim.json")
    init_state_for_machine(str(MACHINE), sim)
    conf.write_text(f'[node]\nnvml = "sim:{sim}"\nstate_dir = "{tmp_path}/s/%n"\n'
                    f'[repair]\nuser_problem = true\n[health]\nstate_dir = "{tmp_path}/h/%n"\n'
                    '[jobs]\ntimeout = 7.0\n[mps]\nbase_dir = "/run/m/%n"\n'
                    '[mig]\ngres_conf = "/etc/g.conf"\n')
    env = {"SLURM_CONF": f"{tmp_path}/etc/slurm.conf"}
    ctx = lifecycle.default_context(env)                  # the epilog's: with the health part
    assert ctx.env is env
    assert (ctx.config_path, ctx.gres_conf, ctx.node_name) == (str(conf), f"{tmp_path}/etc/gres.conf",
                                                               "n7")
    assert (ctx.state_dir, ctx.health_state_dir) == (f"{tmp_path}/s/n7", f"{tmp_path}/h/n7")
    assert ctx.facts_dir == nodefacts.CACHE_DIR
    assert (ctx.jobs.timeout, ctx.mps.base_dir, ctx.mig.gres_conf) == (7.0, "/run/m/n7", "/etc/g.conf")
    entry = nodefacts.load(str(conf), "n7", f"{tmp_path}/etc/gres.conf")
    assert entry is not None and sorted(entry["sections"]) == sorted([settings.SECTION,
                                                                      settings.HEALTH_SECTION])
    assert ctx.open_api().count() == 4                     # [node] nvml: the simulator
    assert lifecycle.default_context(None).env is os.environ


def test_default_context_writes_to_the_driver_never_to_a_snapshot(conf: Path, tmp_path: Path) -> None:
    # A recording cannot change a GPU: [node] snapshot gives the node model,
    # while NVML (compute mode, MIG) is the driver's, here none.
    conf.write_text(f'[node]\nsnapshot = "{SNAPSHOT}"\nstate_dir = "{tmp_path}/s"\n')
    ctx = lifecycle.default_context({}, health=True)
    assert ctx.health_state_dir == ""                       # [repair] user_problem is off
    recorded = [g.uuid for g in load_node(Snapshot(SNAPSHOT)).gpus]
    # The context keeps the settings it was built with, even once the file changes.
    other = str(ROOT / "tests" / "data" / "machines" / "a100-sxm4-minors" / "snapshot.json")
    conf.write_text(f'[node]\nsnapshot = "{other}"\nstate_dir = "{tmp_path}/s"\n')
    config.clear_cache()
    assert [g.uuid for g in ctx.node().gpus] == recorded
    try:
        gpus = ctx.open_api()
    except Exception as e:  # noqa: BLE001 - no driver here
        assert "NVML" in str(e)
        return
    # a real GPU node: its own GPUs, never the recording's
    assert not {g.uuid for g in gpus.read_view().gpus} & set(recorded)


# -- context: the job's user and GPUs ---------------------------------------------

def _record(**kw: Any) -> js.JobRecord:
    return js.JobRecord("7", kw.pop("uid", None), kw.pop("gid", None), kw.pop("user", ""), **kw)


def test_job_user_from_slurmd_else_the_record_else_the_password_file() -> None:
    pw = pwd.getpwnam("root")
    groups = tuple(os.getgrouplist("root", 0))
    ju = context.job_user
    assert ju({"SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0", "SLURM_JOB_USER": "root"}) \
        == lifecycle.JobUser(0, 0, "root", groups)
    # slurmd's environment wins over the record, field by field
    rec = _record(uid=5, gid=6, user="nobody-here")
    assert ju({"SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0", "SLURM_JOB_USER": "root"}, rec) \
        == lifecycle.JobUser(0, 0, "root", groups)
    assert ju({}, rec) == lifecycle.JobUser(5, 6, "nobody-here", (6,))    # getgrouplist: its gid
    assert ju({}, _record(uid=0, gid=0, user="root")) == lifecycle.JobUser(0, 0, "root", groups)
    # no gid: the password file's, for a uid it knows; a gid of 0 is a gid
    assert ju({"SLURM_JOB_UID": "0"}) == lifecycle.JobUser(0, pw.pw_gid, "", ())
    assert ju({}, _record(uid=0)) == lifecycle.JobUser(0, pw.pw_gid, "", ())
    assert ju({"SLURM_JOB_UID": "0", "SLURM_JOB_GID": "x"}) == lifecycle.JobUser(0, pw.pw_gid, "", ())
    assert ju({"SLURM_JOB_UID": "0", "SLURM_JOB_GID": "12"}) == lifecycle.JobUser(0, 12, "", ())
    unknown = 2_000_000_007
    assert ju({"SLURM_JOB_UID": str(unknown)}) is None
    assert ju({"SLURM_JOB_UID": str(unknown), "SLURM_JOB_GID": "3"}) == lifecycle.JobUser(unknown, 3, "", ())
    for bad in ("", "x", "-1", "1.0", " 1"):
        assert ju({"SLURM_JOB_UID": bad, "SLURM_JOB_GID": "0"}) is None, bad
    assert ju({}) is None and ju({}, None) is None and ju({}, _record()) is None


def test_job_gpus_are_slurms_whole_gpus_else_the_shared_ones() -> None:
    jg = context.job_gpus
    assert jg({"SLURM_JOB_GPUS": " 2, 0 ,x,,3 ", "CUDA_VISIBLE_DEVICES": "5"}) == ([2, 0, 3], True)
    assert jg({"SLURM_JOB_GPUS": " ", "CUDA_VISIBLE_DEVICES": "1,4"}) == ([1, 4], False)
    assert jg({"CUDA_VISIBLE_DEVICES": "MIG-a,1"}) == ([1], False)
    assert jg({}) == ([], False)


# -- context.job_gpu_facts --------------------------------------------------------

def _facts_ctx(tmp_path: Path, gres_lines: list[str]) -> lifecycle.Context:
    model = load_node(Snapshot(SNAPSHOT))
    gres = tmp_path / "gres.conf"
    gres.write_text("AutoDetect=off\n" + "".join(f"NodeName=n1 Name=gpu {x}\n" for x in gres_lines))
    return lifecycle.Context({}, JobsSettings(), MpsSettings(), MigSettings(), str(tmp_path / "state"),
                             lambda: None, lambda: model, facts_dir=str(tmp_path / "facts"),
                             gres_conf=str(gres), node_name="n1")


def _minors() -> list[int]:
    return sorted(g.minor for g in load_node(Snapshot(SNAPSHOT)).gpus)


def test_job_gpu_facts_names_each_gpu_and_refuses_a_mig_slice_as_the_jobs(tmp_path: Path) -> None:
    m = _minors()
    ctx = _facts_ctx(tmp_path, [f"Type=h100_1g.10gb MultipleFiles=/dev/nvidia{m[1]},"
                                "/dev/nvidia-caps/nvidia-cap21,/dev/nvidia-caps/nvidia-cap22",
                                f"File=/dev/nvidia{m[0]}", f"File=/dev/nvidia{m[2]}"])
    by_minor = {g.minor: g for g in load_node(Snapshot(SNAPSHOT)).gpus}
    facts = context.job_gpu_facts(ctx, [2, 1])
    assert [(f["index"], f["minor"], f["uuid"]) for f in facts] == [
        (2, m[2], by_minor[m[2]].uuid), (1, m[0], by_minor[m[0]].uuid)]
    with pytest.raises(JobFailed) as e:
        context.job_gpu_facts(ctx, [1, 0])
    assert (e.value.what, e.value.where) == (
        "Slurm GPU index 0 is a MIG slice: --gpu-mps, --gpu-mig and --gpu-profile need whole GPUs "
        "(--gres=gpu:<whole GPU type>)", ctx.gres_conf)
    with pytest.raises(HardwareError) as h:
        context.job_gpu_facts(ctx, [3])
    assert (h.value.what, h.value.where) == (
        "Slurm GPU index 3 names no GPU of this node (gres.conf and NVML disagree)", ctx.gres_conf)


def test_a_gres_conf_unreadable_on_the_error_path_proves_nothing_against_the_job(tmp_path: Path) -> None:
    # The node's cache entry still holds the table (same stamp), while the
    # file now says nothing readable: a missing GPU is then the node's.
    m = _minors()
    ctx = _facts_ctx(tmp_path, [f"File=/dev/nvidia{m[0]}"])
    assert [f["minor"] for f in context.job_gpu_facts(ctx, [0])] == [m[0]]
    gres = Path(str(ctx.gres_conf))
    st = gres.stat()
    bad = b"Bogus" + b"=" * (st.st_size - 6) + b"\n"
    with open(gres, "r+b") as f:                            # same inode, same size
        f.write(bad)
    os.utime(gres, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(HardwareError, match="Slurm GPU index 1 names no GPU of this node"):
        context.job_gpu_facts(ctx, [1])


def test_the_gpu_table_is_cached_in_the_contexts_fact_directory(tmp_path: Path) -> None:
    m = _minors()
    ctx = _facts_ctx(tmp_path, [f"File=/dev/nvidia{m[1]}"])
    ctx.config_path = str(tmp_path / "slurm-gpu.toml")
    ctx.node_name = "n1"
    assert [f["minor"] for f in context.job_gpu_facts(ctx, [0])] == [m[1]]
    here = nodefacts.load(ctx.config_path, "n1", ctx.gres_conf, cache_dir=ctx.facts_dir)
    assert here is not None and here["gpus"] is not None
    # no fact directory: the state directory's (tests; a node has its own)
    ctx.facts_dir = ""
    context.job_gpu_facts(ctx, [0])
    assert nodefacts.load(ctx.config_path, "n1", ctx.gres_conf,
                          cache_dir=os.path.join(ctx.state_dir, "node-facts")) is not None


def test_a_missing_gpu_without_a_gres_conf_names_gres_conf(tmp_path: Path) -> None:
    ctx = _facts_ctx(tmp_path, [])
    ctx.gres_conf = None
    with pytest.raises(HardwareError) as e:
        context.job_gpu_facts(ctx, [len(_minors())])
    assert e.value.where == "gres.conf"


def test_gpu_table_by_default_takes_no_nodes_lines(tmp_path: Path) -> None:
    # No node name given: another node's lines are not this node's GPUs.
    from slurm_gpu.jobs.locality import gpu_table
    model = load_node(Snapshot(SNAPSHOT))
    m = _minors()
    gres = tmp_path / "gres.conf"
    gres.write_text(f"NodeName=XXXX Name=gpu File=/dev/nvidia{m[3]}\n")
    assert gpu_table(str(tmp_path / "facts"), None, lambda: model, str(gres)) == {}
    assert [g["minor"] for g in gpu_table(str(tmp_path / "facts"), None, lambda: model, str(gres),
                                          "XXXX").values()] == [m[3]]


def test_job_keeps_its_parts_and_saves_where_the_context_says(tmp_path: Path) -> None:
    ctx = _facts_ctx(tmp_path, [])
    rec = _record(uid=5, gid=6, user="u")
    user = lifecycle.JobUser(5, 6, "u", ())

    def api() -> None:
        return None

    job = context.Job(ctx, rec, user, api)
    assert (job.ctx, job.record, job.user, job.api, job.percentage, job.jobid) == (
        ctx, rec, user, api, None, "7")
    job.save_if_on_file()                                   # no file yet: none written
    assert not js.exists(ctx.state_dir, "7")
    job.save()
    assert js.load(ctx.state_dir, "7") == rec
    rec.error = "changed"
    job.save_if_on_file()
    loaded = js.load(ctx.state_dir, "7")
    assert loaded is not None and loaded.error == "changed"
    context.Job(ctx, _record(), None, api).save_if_on_file()   # a stand-in: never saved


def test_no_node_model_is_a_node_fault(tmp_path: Path) -> None:
    ctx = _facts_ctx(tmp_path, [])
    ctx.node = None
    with pytest.raises(HardwareError) as e:
        context.job_gpu_facts(ctx, [0])
    assert (e.value.what, e.value.where) == ("no node model to tell which GPUs the job holds", None)


# -- context.Context --------------------------------------------------------------

def test_a_context_without_a_log_writes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    ctx = lifecycle.Context({}, JobsSettings(), MpsSettings(), MigSettings(), "/nowhere", lambda: None)
    ctx.log("slurm-gpu: a line")
    assert capsys.readouterr() == ("", "slurm-gpu: a line\n")
    assert repr(ctx) == f"Context({vars(ctx)!r})" and repr(ctx).startswith("Context({'env': {}, ")
    assert (ctx.node, ctx.facts_dir, ctx.config_path, ctx.gres_conf, ctx.node_name,
            ctx.health_state_dir) == (None, "", None, None, "", "")


# -- libc -------------------------------------------------------------------------

def _subreaper() -> int:
    """PR_GET_CHILD_SUBREAPER (37): what the kernel holds for this process."""
    v = ctypes.c_int(-1)
    assert ctypes.CDLL(None, use_errno=True).prctl(37, ctypes.byref(v), 0, 0, 0) == 0
    return v.value


def test_set_child_subreaper_switches_the_kernels_flag_both_ways() -> None:
    before = _subreaper()
    try:
        assert libc.set_child_subreaper(True) is True
        assert _subreaper() == 1
        assert libc.set_child_subreaper(False) is True
        assert _subreaper() == 0
    finally:
        libc.set_child_subreaper(bool(before))


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_detach_mount_detaches_a_busy_mount(tmp_path: Path) -> None:
    import subprocess
    m = tmp_path / "m"
    m.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(m)], check=True)
    try:
        with open(m / "held", "w"):                         # busy: a plain umount fails
            libc.detach_mount(str(m))
            assert not os.path.ismount(m)
    finally:
        subprocess.run(["umount", "-l", str(m)], capture_output=True)


def test_detach_mount_raises_the_kernels_error(tmp_path: Path) -> None:
    with pytest.raises(OSError) as e:
        libc.detach_mount(str(tmp_path))                    # not a mount point
    assert (e.value.errno, e.value.strerror) == (errno.EINVAL, os.strerror(errno.EINVAL))
    with pytest.raises(OSError) as e:
        libc.detach_mount(str(tmp_path / "none"))
    assert (e.value.errno, e.value.strerror) == (errno.ENOENT, os.strerror(errno.ENOENT))


# -- __main__ (what prolog.d/epilog.d run) ----------------------------------------

def test_the_entry_point_runs_the_step_it_names_and_reports_a_failure_in_one_line(
        conf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import gc

    from slurm_gpu.jobs.__main__ import main
    # timeout 0: no watchdog thread, which would end this process later
    conf.write_text(f'[node]\nstate_dir = "{tmp_path}/s"\n[jobs]\ntimeout = 0\n')
    for k in ("SLURM_JOB_ID", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SLURM_CONF", f"{tmp_path}/etc/slurm.conf")
    gres = f"{tmp_path}/etc/gres.conf"
    umask = os.umask(0o022)
    try:
        assert main(["prolog"]) == 0                        # a job with no GPU: nothing to do
        assert capsys.readouterr().err == ""
        # Only the epilog reads the health check's part (the prolog never
        # looks for leftovers): it lands in the node's entry then.
        entry = nodefacts.load(str(conf), "n7", gres)
        assert entry is not None and sorted(entry["sections"]) == [settings.SECTION]
        assert main(["epilog"]) == 1
        assert capsys.readouterr().err == "slurm-gpu: bad job id '' (SLURM_JOB_ID) [epilog]\n"
        entry = nodefacts.load(str(conf), "n7", gres)
        assert entry is not None and sorted(entry["sections"]) == sorted([settings.SECTION,
                                                                          settings.HEALTH_SECTION])
        conf.write_text('[jobs]\ntimeout = "x"\n')
        config.clear_cache()
        assert main(["prolog"]) == 1
        assert capsys.readouterr().err == (f"slurm-gpu: config key jobs.timeout must be float "
                                           f"([jobs] in {conf}) [prolog]\n")
    finally:
        os.umask(umask)
        gc.unfreeze()


def test_a_watchdog_under_a_second_still_stops_the_prolog(tmp_path: Path) -> None:
    """Any positive ``[jobs] timeout`` arms the watchdog (here: a prolog
    blocked on the simulator's lock, which someone else holds)."""
    import fcntl
    import subprocess
    import sys
    if os.geteuid() != 0:
        pytest.skip("prolog/epilog run as root")
    sim = str(tmp_path / "sim.json")
    init_state_for_machine(str(MACHINE), sim)
    conf = tmp_path / "slurm-gpu.toml"
    conf.write_text(f'[node]\nnvml = "sim:{sim}"\nstate_dir = "{tmp_path}/state"\n'
                    '[jobs]\ntimeout = 0.5\n')
    env = {"SLURM_GPU_CONFIG": str(conf), "SLURM_JOB_ID": "9", "PYTHONPATH": str(ROOT),
           "SLURM_JOB_UID": "0", "SLURM_JOB_GPUS": "2", "SPANK_SLURM_GPU_MIG": "7g.80gb",
           "SLURMD_NODENAME": "n7", "SLURM_CONF": f"{tmp_path}/etc/slurm.conf"}
    fd = os.open(sim + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        r = subprocess.run([sys.executable, "-m", "slurm_gpu.jobs", "prolog"], env=env,
                           cwd="/", capture_output=True, text=True, timeout=20)
    finally:
        os.close(fd)
        entry = nodefacts.cache_file(str(conf), "n7", f"{tmp_path}/etc/gres.conf")
        if os.path.exists(entry):                           # the node's cache: leave none behind
            os.unlink(entry)
    assert (r.returncode, r.stderr) == (1, "slurm-gpu: prolog still running after 0.5 s, stopped "
                                           "by its watchdog ([jobs] timeout)\n")
