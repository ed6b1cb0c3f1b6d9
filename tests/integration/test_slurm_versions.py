"""The whole product on every supported Slurm: 22.05 (host), 24.11, 26.05.

One sandbox per version (``Sandbox(slurm=V)``, as ``slurm-gpu sandbox up
--slurm V``), two nodes modelled on ``mini-2numa`` (one GPU per NUMA node,
mapped on this host's two CPUs, so CPU binding is real), with the SPANK
plugin built against that version's spank.h, prolog/epilog, the health
check, the NVML simulator (MIG mode on) and NVIDIA's MPS control daemon.  Jobs run on
n1; the health drain is shown on n2.  The 24.11 and 26.05 daemons, hooks,
plugin and job tasks run chrooted in a Debian root (scripts/debian-root.sh):
a missing root skips those cases with the reason (no network here).
Accounting is on: that version's slurmdbd over a private MariaDB, and the
GPU sampler (``slurm-gpu monitor``) run as on a node of that version.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import ContextManager, Iterator

import pytest

from debianroot import unavailable
from sandboxlib import REPO, VERSIONS, Cluster, mps_mig_node_files
from slurm_gpu.acct import dbd
from slurm_gpu_devkit.sim.load import LOAD_SCHEMA, write_load

MACHINE = REPO / "tests" / "data" / "machines" / "mini-2numa"
INTERVAL = 2
ACCT_INTERVAL = 0.3
XID79 = "[74889.644138] NVRM: Xid (PCI:0000:ad:00): 79, GPU has fallen off the bus.\n"

# Run by the job's venv python: CPUs, memory policy (MPOL_PREFERRED is 1) and the GPU.
PROBE = r"""
import os, re
from slurm_gpu.spank.effects import get_mempolicy
cpus = re.search(r"Cpus_allowed_list:\s*(\S+)", open("/proc/self/status").read()).group(1)
mode, nodes = get_mempolicy()
print("TASK", os.environ.get("CUDA_VISIBLE_DEVICES", "-"), cpus, mode,
      ",".join(map(str, nodes)) or "-", os.environ.get("SLURM_GPU_BINDING", "-"), flush=True)
"""


@pytest.fixture(scope="module", params=VERSIONS)
def cluster(request, make_sandbox, job_users, sandbox_dir):
    from slurm_gpu_devkit.sandbox.install import DEFAULT_VENV
    version = request.param
    venv = DEFAULT_VENV
    files = mps_mig_node_files(f"versions-{version}", MACHINE, venv)
    side = sandbox_dir(f"versions-{version}-side")
    for n in ("n1", "n2"):
        (side / f"{n}.log").write_text("[    1.000000] Linux version 6.1.0\n")
    # 26.05: slurmctld's verdict reaches the health check (SLURM_NODE_IS_HEALTHY)
    extra_conf = {"SlurmctldParameters": "health_check_report"} if version == "26.05" else {}
    # GPUs 0 and 1 hold 4000 MiB (the simulator's scripted load), for the accounting case.
    st = json.loads(files["sim"].read_text())
    st["load_file"] = str(files["dir"] / "load.json")
    files["sim"].write_text(json.dumps(st))
    write_load(st["load_file"], {"schema": LOAD_SCHEMA, "t0": time.time(),
                                 "devices": {g: [{"t": 0, "sm": 70, "mem_mib": 4000}] for g in ("0", "1")}})
    try:
        c = make_sandbox(
            nodes=2, machine=str(MACHINE), spank=True, prolog=True, health=True,
            health_interval=INTERVAL, slurm=version, slurm_conf=extra_conf, accounting=True,
            extra_config={"node": {"nvml": f"sim:{files['sim']}"},
                          "acct": {"enabled": True, "interval": ACCT_INTERVAL},
                          "mps": {"control": str(files["ctl"]), "base_dir": str(files["mps"])},
                          "spank": {"numa_node_map": {"1": 0}},
                          "health": {"kernel_log": f"{side}/%n.log", "clean_runs_to_resume": 2}})
    except Exception as e:  # noqa: BLE001
        shutil.rmtree(files["dir"], ignore_errors=True)
        if "no Slurm" in str(e) and "root" in str(e):
            unavailable(str(e))
        raise
    c.side = side
    c.files = files
    yield c
    c.sb.down()       # before the next version's sandbox starts (make_sandbox's down repeats nothing)
    shutil.rmtree(files["dir"], ignore_errors=True)


def test_runs_the_asked_version(cluster: Cluster, request) -> None:
    want = request.node.callspec.params["cluster"]
    res = cluster.run(["scontrol", "version"])
    assert res.returncode == 0 and res.stdout.split()[-1].startswith(want + "."), res.stdout
    assert cluster.slurm_version.startswith(want + ".")
    assert cluster.sb.status()["slurm"].startswith(want + ".")


def test_numa_bind_prefer_binds_cpus_and_memory_to_the_gpus_numa_node(cluster: Cluster) -> None:
    from slurm_gpu_devkit.sandbox.machine import load, resolve
    model = load(resolve(str(MACHINE)))
    res = cluster.srun("-w", "n1", "--gres=gpu:1", "--gpu-numa-bind=prefer", cluster.python, "-c",
                       PROBE, user="sgtest1")
    assert res.returncode == 0, res.stderr
    row = [l.split() for l in res.stdout.splitlines() if l.startswith("TASK")][0]
    gpu = model.gpus[int(row[1])]
    numa = [n for n in model.numa_nodes if n.index in gpu.numa_nodes]
    want_cpus = ",".join(str(p) for n in numa for p in sorted(n.pus))
    assert row[2] == want_cpus, (row, want_cpus)          # the GPU's NUMA node's CPUs
    assert row[3] == "1", row                         # MPOL_PREFERRED
    assert row[4] == "0", row                         # model node -> host node 0 (numa_node_map)
    assert row[5].startswith(f"prefer;gpus={row[1]};cpus={row[2]}"), row


def test_plain_prefer_binds_in_c_from_the_binding_table(cluster: Cluster, tmp_path: Path) -> None:
    """A plain prefer step binds in the plugin's C half (spank/sg_bind.c) from the table
    the Python path keeps beside the node-fact entry.  Shown with a table whose GPU rows
    name the other GPU's CPUs: C follows it; Python would bind by its entry (and put
    the table right).  The table lives in the node's /run: read inside the sandbox."""
    from slurm_gpu.spank import bindtable
    lay = cluster.sb.layout
    table = bindtable.path(str(lay.config_toml), "n1", str(lay.gres_conf))

    def step() -> list[str]:
        res = cluster.srun("-w", "n1", "--gres=gpu:1", "-c2", "--gpu-numa-bind=prefer",
                           cluster.python, "-c", PROBE, user="sgtest1")
        assert res.returncode == 0, res.stderr
        return [l.split() for l in res.stdout.splitlines() if l.startswith("TASK")][0]

    first = step()
    read = cluster.run(["cat", table])
    assert read.returncode == 0, read.stderr
    text = read.stdout
    rows = [l.split(" ") for l in text.splitlines() if l.startswith("gpu ")]
    assert len(rows) == 2 and {r[3] for r in rows} == {"0", "1"}, text
    forged = "".join((" ".join(r[:3] + [{"0": "1", "1": "0"}[r[3]]] + r[4:]) if r[0] == "gpu"
                      else " ".join(r)) + "\n" for r in (l.split(" ") for l in text.splitlines()))
    src = tmp_path / "forged.bind"
    src.write_text(forged)
    os.chmod(tmp_path, 0o755)
    os.chmod(src, 0o644)
    try:
        assert cluster.run(["install", "-m", "600", str(src), table]).returncode == 0
        second = step()
        assert second[2] != first[2], (first, second)           # the table's CPUs: C bound it
        assert second[5].startswith(f"prefer;gpus={second[5].split(';')[1][5:]};cpus={second[2]};")
        assert cluster.run(["cat", table]).stdout == forged    # and no Python rewrote it
    finally:
        src.write_text(text)
        cluster.run(["install", "-m", "600", str(src), table])
    assert step()[2] == first[2]


def test_every_option_reaches_the_tasks(cluster: Cluster) -> None:
    """--gpu-numa-bind=strict and --gpu-profile=inference act in the task (MPOL_BIND is 2;
    inference turns transparent huge pages off: THP_enabled 0)."""
    res = cluster.srun("-w", "n1", "--gres=gpu:1", "--gpu-numa-bind=strict", "--gpu-profile=inference",
                       "/bin/sh", "-c", "echo OPTS $SLURM_GPU_NUMA_BIND $SLURM_GPU_PROFILE; "
                       "grep THP_enabled /proc/self/status; " + cluster.python + " -c '" +
                       PROBE.replace("'", '"') + "'", user="sgtest1")
    assert res.returncode == 0, res.stderr
    assert "OPTS strict inference" in res.stdout
    assert re.search(r"THP_enabled:\s+0", res.stdout), res.stdout
    row = [l.split() for l in res.stdout.splitlines() if l.startswith("TASK")][0]
    assert row[3] == "2" and row[5].startswith("strict;"), row
    # a bad value fails in srun, before submission, in one line naming the option
    bad = cluster.srun("--gpu-mps=101", "true", user="sgtest1")
    ours = [l for l in bad.stderr.splitlines() if "slurm-gpu:" in l]
    assert bad.returncode != 0 and len(ours) == 1 and "--gpu-mps" in ours[0], bad.stderr


def test_gres_from_the_generator_is_what_slurm_schedules(cluster: Cluster) -> None:
    node = cluster.node("n1")
    assert re.match(r"gpu:[\w-]+:2\b", node.get("Gres", "")), node.get("Gres")
    res = cluster.srun("-w", "n1", "--gres=gpu:2", "/bin/sh", "-c", "echo GPUS $CUDA_VISIBLE_DEVICES",
                       user="sgtest1")
    assert res.returncode == 0 and "GPUS 0,1" in res.stdout, res.stdout + res.stderr
    jobid = cluster.sbatch("-w", "n1", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 20",
                           user="sgtest1", cwd="/tmp")
    cluster.wait_job(jobid, states={"RUNNING"})
    detail = cluster.run(["scontrol", "show", "job", "-d", str(jobid)]).stdout
    cluster.run(["scancel", str(jobid)])
    assert re.search(r"GRES=gpu(:[\w-]+)?:1\(IDX:[01]\)", detail), detail


def test_gpu_mps_50_job_gets_its_own_daemon(cluster: Cluster) -> None:
    ctl = cluster.files["ctl"]
    d = cluster.user_dir("sgtest1")
    out = d / "mps.out"
    jobid = cluster.sbatch("-w", "n1", "--gres=gpu:1", "--gpu-mps=50", "-o", str(out), "--wrap",
                           "echo PIPE=$CUDA_MPS_PIPE_DIRECTORY PCT=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; "
                           f"echo get_server_list | {ctl} && echo OWN_OK",
                           user="sgtest1", cwd=str(d))
    info = cluster.wait_job(jobid, timeout=60)
    text = out.read_text() if out.exists() else ""
    assert info["JobState"] == "COMPLETED", (info, text)
    m = re.search(r"PIPE=(\S+)", text)
    assert m and m.group(1) == f"{cluster.files['mps']}/{jobid}/pipe" and "OWN_OK" in text, text
    deadline = time.monotonic() + 20
    while Path(m.group(1)).parent.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(m.group(1)).parent.exists()        # the epilog stopped and removed it


def test_gpu_mig_job_gets_mig_devices_and_the_epilog_destroys_them(cluster: Cluster) -> None:
    from slurm_gpu.mig import instances
    from slurm_gpu.hw import backend
    res = cluster.srun("-w", "n1", "--gres=gpu:1", "--gpu-mig=3g.47gb", "/bin/sh", "-c",
                       "echo MIG=$CUDA_VISIBLE_DEVICES", user="sgtest1")
    assert res.returncode == 0, res.stderr
    assert re.search(r"MIG=MIG-\S+", res.stdout), res.stdout
    gpus = backend.open_gpus(backend.GpuSource("sim", str(cluster.files["sim"])))
    deadline = time.monotonic() + 15
    counts: list[int] = []
    while time.monotonic() < deadline:
        counts = [len(instances.list_instances(gpus, i)) for i in (0, 1)]
        if counts == [0, 0]:
            break
        time.sleep(0.1)
    assert counts == [0, 0]


def test_hooks_run_in_the_order_they_need(cluster: Cluster) -> None:
    """Slurm runs the scripts of one Prolog=/Epilog= glob in reverse name order
    (slurm.conf(5) says so from 23.11.4; shown here on every version): the
    project's names must make the MIG/MPS prolog run before the accounting
    prolog (which registers the job's MIG instances), and the accounting
    epilog (which never fails) before the MIG/MPS epilog (whose failure stops
    the scripts after it).  A probe named ``<script>-probe`` sorts right after
    each script, so it runs right before it; each probe logs its name."""
    log = cluster.dir / "hook-order.log"
    probes = []
    try:
        for kind in ("prolog.d", "epilog.d"):
            for script in sorted((cluster.dir / "etc" / kind).iterdir()):
                probe = script.with_name(script.name + "-probe")
                probe.write_text(f"#!/bin/sh\necho {kind}/{script.name} >>{log}\n")
                probe.chmod(0o755)
                probes.append(probe)
        res = cluster.srun("-w", "n1", "/bin/true", user="sgtest1")
        assert res.returncode == 0, res.stderr
        # The probes stay until every epilog probe has run and the node is idle
        # again: slurmd globs epilog.d/* when the epilog starts, and a probe
        # removed after that fails the epilog and drains n1 for every later test
        # (waiting for two of the three epilog probes did that under load).
        epilogs = sum(p.parent.name == "epilog.d" for p in probes)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and (
                not log.exists() or log.read_text().count("epilog.d/") < epilogs
                or cluster.node_states().get("n1") not in ("idle", "mixed")):
            time.sleep(0.2)
        ran = log.read_text().split() if log.exists() else []
        assert cluster.node_states().get("n1") in ("idle", "mixed"), (ran, cluster.why_unavailable("n1"))
    finally:
        for p in probes:
            p.unlink(missing_ok=True)
        log.unlink(missing_ok=True)
    pro = [r.split("/")[1] for r in ran if r.startswith("prolog.d/")]
    epi = [r.split("/")[1] for r in ran if r.startswith("epilog.d/")]
    assert pro == sorted(pro, reverse=True) and epi == sorted(epi, reverse=True), ran
    order = {kind: [next(n for n in names if what in n) for what in ("jobs", "acct")]
             for kind, names in (("prolog", pro), ("epilog", epi))}
    assert pro.index(order["prolog"][0]) < pro.index(order["prolog"][1]), f"prolog order {pro}"
    assert epi.index(order["epilog"][1]) < epi.index(order["epilog"][0]), f"epilog order {epi}"


def _node_cli(cluster: Cluster, *args: str) -> tuple[list[str], dict[str, str]]:
    """``slurm-gpu ARGS`` as node n1 runs it: inside the Debian root for 24.11
    and 26.05 (that version's sacct and sacctmgr), with the sandbox's config."""
    exe = str(cluster.venv / "bin" / "slurm-gpu")
    argv, _ = cluster.sb.client_argv([exe, *args])
    env = {**cluster.env, "SLURM_GPU_CONFIG": str(cluster.dir / "etc" / "slurm-gpu.toml"),
           "SLURMD_NODENAME": "n1"}
    if argv[0] != exe:
        env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
    return argv, env


def test_gpu_job_summary_lands_in_slurmdbd_and_job_report_reads_it(cluster: Cluster) -> None:
    """A job with a GPU runs while the sampler runs; the epilog stores its
    summary in that version's slurmdbd (sacctmgr), and `slurm-gpu job report`
    reads it back through that version's sacct."""
    argv, env = _node_cli(cluster, "monitor")
    log = cluster.files["dir"] / "monitor.log"
    monitor = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"),
                               start_new_session=True)
    try:
        jobid = cluster.sbatch("-w", "n1", "--gres=gpu:1", "--wrap", "sleep 3", user="sgtest1")
        info = cluster.wait_job(jobid, timeout=60)
        assert info["JobState"] == "COMPLETED", info
        deadline = time.monotonic() + 30
        while True:
            out = cluster.run(["sacct", "-n", "-P", "-X", "-j", str(jobid), "-o",
                               "User,State,AllocTRES,AdminComment"]).stdout.strip()
            if dbd.KEY in out or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        user, state, tres, comment = out.split("|", 3)
        assert (user, state) == ("sgtest1", "COMPLETED") and "gres/gpu=1" in tres, out
        part = (dbd.parse(comment) or {}).get("n1")
        assert part is not None, (out, log.read_text()[-2000:])
        (gpu,) = part["held"]
        # MIG mode is on (for the --gpu-mig case), so NVML gives no whole-GPU
        # utilisation; memory and the energy counter are still the GPU's.
        d = part["dev"][gpu]
        assert d["n"] >= 1 and d["mem"] == 4000 and d["j"] > 0, part
        argv, env = _node_cli(cluster, "job", "report", str(jobid), "--json")
        rep = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert rep.returncode == 0, rep.stderr
        got = json.loads(rep.stdout)
        devs = {d["device"]: d for d in got["devices"]}
        assert devs[gpu]["mem"] == 4000 and devs[gpu]["j"] == d["j"], got
    finally:
        os.killpg(monitor.pid, signal.SIGTERM)
        try:
            monitor.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(monitor.pid, signal.SIGKILL)
            monitor.wait()


def test_health_drains_on_xid79_and_resumes(cluster: Cluster) -> None:
    with open(cluster.side / "n2.log", "a") as f:
        f.write(XID79)
    cluster.wait_node_state("n2", re.compile(r"drain(ed|ing)"), timeout=4 * INTERVAL + 10)
    res = cluster.run(["scontrol", "show", "node", "-o", "n2"])
    assert "Reason=slurm-gpu: gpu.xid: Xid 79" in res.stdout, res.stdout
    # The fault is gone (the log rotated): two clean runs resume the node.
    (cluster.side / "n2.log").write_text("[    1.000000] Linux version 6.1.0\n")
    cluster.wait_node_state("n2", "idle", timeout=6 * INTERVAL + 10)


def _release_into_failure(cluster: Cluster, jobid: int, out: Path, broken: ContextManager[object]) -> str:
    """Release the held job *jobid* while *broken* holds on the node: the job
    FAILED; its output (*out*, "" when it never ran)."""
    with broken:
        assert cluster.run(["scontrol", "release", str(jobid)]).returncode == 0
        info = cluster.wait_job(jobid, timeout=30)
    assert info["JobState"] == "FAILED", info
    return out.read_text() if out.exists() else ""


def _assert_never_drained(cluster: Cluster, node: str) -> None:
    res = cluster.run(["sinfo", "-h", "-n", node, "-o", "%T %E"])
    assert res.stdout.split()[0] in ("idle", "mixed"), res.stdout


def test_bad_plugstack_argument_on_the_node_fails_the_job_not_the_node(cluster: Cluster) -> None:
    """The job was submitted with a good plugstack.conf; the node's is bad when it
    starts.  26.05: slurm_spank_init_failure_mode makes init's refusal a job
    failure; before 25.05 the plugin fails the tasks instead (an init or
    pre-task hook failure there drains the node: "batch job complete failure")."""
    d = cluster.user_dir("sgtest1")
    out = d / "badarg.out"
    plugstack = cluster.sb.layout.plugstack_conf
    good = plugstack.read_text()
    jobid = cluster.sbatch("-H", "-w", "n1", "-o", str(out), "--wrap", "echo RAN", user="sgtest1",
                           cwd=str(d))

    @contextmanager
    def bad_plugstack() -> Iterator[None]:
        try:
            plugstack.write_text(good.replace("config=", "bogus=1 config=", 1))
            yield
        finally:
            plugstack.write_text(good)
    text = _release_into_failure(cluster, jobid, out, bad_plugstack())
    assert "RAN" not in text
    log = cluster.log("n1")
    assert "slurm-gpu: unknown plugstack argument 'bogus=1'" in log
    _assert_never_drained(cluster, "n1")


def test_install_guides_config_path_gives_working_job_options(cluster: Cluster) -> None:
    """docs/install.md's plugstack line names /etc/slurm-gpu/slurm-gpu.toml; on a
    node without that file (deleted, or never made) a --gpu-profile step must run
    on the defaults, not fail with "config file not found"."""
    from slurm_gpu import config
    guide = (REPO / "docs" / "install.md").read_text()
    line = next(l for l in guide.splitlines() if l.startswith("required ") and "slurm_gpu_spank.so" in l)
    named = next(w for w in line.split() if w.startswith("config="))
    assert named == f"config={config.DEFAULT_PATH}"
    root = (cluster.sb.release.root if cluster.sb.release else None) or Path("/")
    if (Path(str(root)) / config.DEFAULT_PATH.lstrip("/")).exists():
        pytest.skip(f"{config.DEFAULT_PATH} exists on this machine")
    plugstack = cluster.sb.layout.plugstack_conf
    good = plugstack.read_text()
    cache = Path("/run/slurm-gpu/node-facts")
    run_dir_was = cache.parent.exists()
    before = set(cache.iterdir()) if cache.is_dir() else set()
    try:
        plugstack.write_text(re.sub(r"config=\S+", named, good, count=1))
        res = cluster.srun("-w", "n1", "--gpu-profile=inference", "/bin/sh", "-c",
                           "grep THP_enabled /proc/self/status", user="sgtest1")
    finally:
        plugstack.write_text(good)
        # the host's node-fact cache (22.05 runs unchrooted, on the default [node] state_dir)
        if not run_dir_was:
            shutil.rmtree(cache.parent, ignore_errors=True)
        for p in (set(cache.iterdir()) if cache.is_dir() else set()) - before:
            p.unlink(missing_ok=True)
    assert res.returncode == 0 and "config file not found" not in res.stderr, res.stderr
    assert re.search(r"THP_enabled:\s+0", res.stdout), res.stdout    # the profile acted


def _plugin_for(version: str, out_dir: Path) -> Path:
    """A plugin built for *version* (host's Slurm, or inside that version's Debian root)."""
    from slurm_gpu.runner import run
    from slurm_gpu_devkit.sandbox import chroot, versions
    from slurm_gpu_devkit.sandbox.install import DEFAULT_VENV
    out = out_dir / f"plugin-{version}" / "slurm_gpu_spank.so"
    rel = versions.resolve(version)
    if not rel.chrooted:
        run([str(DEFAULT_VENV / "bin" / "slurm-gpu"), "spank", "build", "-o", str(out)], timeout=300)
        return out
    try:
        rel = versions.ensure_root(rel)
    except Exception as e:  # noqa: BLE001
        unavailable(str(e))
    assert rel.root is not None
    chroot.sync_venv(rel.root, DEFAULT_VENV)
    chroot.run_in_root(rel.root, [str(DEFAULT_VENV / "bin" / "slurm-gpu"), "spank", "build", "-o",
                                  str(out)], 300, binds=("/tmp",))
    return out


def test_plugin_built_for_another_slurm_says_both_versions(cluster: Cluster, request) -> None:
    version = request.node.callspec.params["cluster"]
    other = "24.11" if version == "22.05" else "22.05"
    plugin = _plugin_for(other, Path(cluster.side))
    plugstack = cluster.sb.layout.plugstack_conf
    good = plugstack.read_text()
    doctor = [str(cluster.venv / "bin" / "slurm-gpu"), "doctor", "--json", "--no-gres",
              "--slurm-conf", str(cluster.sb.conf)]
    try:
        plugstack.write_text(good.replace(str(cluster.sb.layout.lib / "slurm_gpu_spank.so"), str(plugin)))
        res = cluster.srun("-w", "n1", "true", user="sgtest1")
        stale = cluster.run(doctor)
    finally:
        plugstack.write_text(good)
    fresh = cluster.run(doctor)
    # doctor, run where slurmd runs, says the same about the node
    import json
    assert stale.returncode == 2, stale.stdout + stale.stderr
    found = {x["check"]: x for x in json.loads(stale.stdout)["findings"] if x["check"] == "spank.plugin"}
    assert found["spank.plugin"]["status"] == "CRITICAL"
    assert f"built for Slurm {other}." in found["spank.plugin"]["message"]
    assert f"slurmd is {version}." in found["spank.plugin"]["message"]
    found = [x for x in json.loads(fresh.stdout)["findings"] if x["check"] == "spank.plugin"]
    assert found[0]["status"] == "OK" and f"built for Slurm {version}." in found[0]["message"], found
    assert res.returncode != 0
    ours = [l for l in res.stderr.splitlines() if "slurm-gpu:" in l]
    assert len(ours) == 1, res.stderr
    assert f"built for Slurm {other}." in ours[0] and f"runs under Slurm {version}" in ours[0], ours


def test_cli_status_names_the_version_and_up_refuses_others(cluster: Cluster, cli, request) -> None:
    version = request.node.callspec.params["cluster"]
    res = cli("sandbox", "status", "--dir", str(cluster.dir))
    assert res.returncode == 0, res.stderr
    line = next(l for l in res.stdout.splitlines() if l.startswith("slurm "))
    assert line.split()[1].startswith(version + "."), line
    assert ("chrooted from" in line) == (version != "22.05"), line
    bad = cli("sandbox", "up", "--dir", str(cluster.side / "never"), "--slurm", "23.02")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        "slurm-gpu: cannot run Slurm 23.02: this sandbox runs 22.05 (host), 24.11, 26.05 (--slurm)"]
    assert not (cluster.side / "never").exists()


def test_python_that_cannot_start_in_slurmstepd_fails_the_step_not_the_node(cluster: Cluster) -> None:
    """The venv (or the plugin's Python half) gone on the node after submission:
    the step fails with one line in the job's output; the node stays in service."""
    d = cluster.user_dir("sgtest1")
    out = d / "nopy.out"
    inner = cluster.sb.layout.lib / "slurm_gpu_spank_py.so"
    jobid = cluster.sbatch("-H", "-w", "n1", "--gpus=1", "--gpu-numa-bind=strict", "-o", str(out),
                           "--wrap", "echo RAN", user="sgtest1", cwd=str(d))
    aside = inner.with_name(inner.name + ".aside")

    @contextmanager
    def no_inner_half() -> Iterator[None]:
        inner.rename(aside)
        try:
            yield
        finally:
            aside.rename(inner)
    text = _release_into_failure(cluster, jobid, out, no_inner_half())
    ours = [l for l in text.splitlines() if "slurm-gpu:" in l]
    assert "RAN" not in text and len(ours) == 1 and "could not start" in ours[0], text
    _assert_never_drained(cluster, "n1")


def test_a_sandbox_started_from_inside_a_chroot_runs_in_its_own_root(tmp_path: Path) -> None:
    """CI runs the suite chrooted in a fresh Debian root.  `nsenter --mount`
    alone put the sandbox's processes at the mount namespace's own root, the
    outer machine's: the 24.11 plugin was built into the outer /tmp, and every
    24.11/26.05 test failed there.  Here the whole host is bound onto a
    directory and chrooted into, with fresh /tmp and /run as in CI."""
    from debianroot import debian_root
    debian_root("trixie", "a 24.11 sandbox")
    from slurm_gpu_devkit.sandbox.install import DEFAULT_VENV
    outer = tmp_path / "outer"
    outer.mkdir()
    inner = ("set -e; d=/tmp/sb; trap '" f"{DEFAULT_VENV}/bin/slurm-gpu sandbox down --dir $d >/dev/null 2>&1' EXIT; "
             f"eval \"$({DEFAULT_VENV}/bin/slurm-gpu sandbox up --dir $d --slurm 24.11 --machine mini-2numa "
             "--spank --no-prolog --no-health 2>/dev/null)\"; "
             "test -s $d/lib/slurm_gpu_spank.so; $d/bin/srun -N1 -n1 /bin/echo STEP-RAN")
    script = ('R=$1; mount --bind / "$R" && mount -t proc proc "$R/proc" && mount --rbind /sys "$R/sys" && '
              'mount --rbind /dev "$R/dev" && mount -t tmpfs tmpfs "$R/run" && '
              'mount -t tmpfs tmpfs "$R/tmp" && chmod 1777 "$R/tmp" && '
              'exec chroot "$R" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root /bin/sh -c "$2"')
    res = subprocess.run(["unshare", "-m", "--propagation", "private", "/bin/sh", "-c", script, "_",
                          str(outer), inner], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "STEP-RAN"
    assert not (Path("/tmp/sb").exists())      # nothing of it reached the outer /tmp
