"""The right GPU, always: Slurm's GPU index -> the GPU, on machines where NVML index != minor.

``SLURM_JOB_GPUS=k`` is the k-th GPU of slurmd's gres.conf device list
(:mod:`slurm_gpu.confgen.gresorder`), not NVML index k.  Every per-job path
(MPS devices, EXCLUSIVE_PROCESS compute mode, MIG instances, CPU locality,
SPANK binding) runs here on the recorded machines whose device minors are
not their NVML indices, against two gres.conf files: the project's own
(PCI order, Links=) and an admin's hand-written one (File= in minor order).
"""
from __future__ import annotations

import os
import pwd
import tempfile
from pathlib import Path

import pytest

from slurm_gpu.confgen.gresorder import node_minors, read_conf, slurm_minors
from slurm_gpu.confgen.grescheck import parse_gres_conf
from slurm_gpu.jobs import lifecycle
from slurm_gpu.jobs import state as js
from slurm_gpu.jobs.settings import JobsSettings, MigSettings, MpsSettings
from slurm_gpu.mig import instances
from slurm_gpu.hw import backend
from slurm_gpu.hw.gpus_nvml import NvmlGpus
from slurm_gpu_devkit.sim.mig import open_mig_sim
from mpsbinary import mps_control_for_jobs
from slurm_gpu_devkit.sim.state import init_state_for_machine
from paths import ROOT

MACHINES = ROOT / "tests" / "data" / "machines"
SKEWED = ["a100-sxm4-minors", "dgx-a100-permuted"]


# -- Slurm's order, from gres.conf ---------------------------------------------

def _conf(text: str):
    return parse_gres_conf(text.splitlines(), "gres.conf").get("*")


def test_without_autodetect_the_order_is_gres_conf_order() -> None:
    conf = _conf("AutoDetect=off\nName=gpu File=/dev/nvidia2\nName=gpu File=/dev/nvidia[0-1]\n")
    assert slurm_minors(conf, [0, 1, 2]) == [2, 0, 1]


def test_autodetect_sorts_by_file_then_links() -> None:
    conf = _conf("AutoDetect=nvml\nName=gpu File=/dev/nvidia10\nName=gpu File=/dev/nvidia2\n")
    assert slurm_minors(conf, [10, 2]) == [10, 2]          # NVML's order (links) wins
    conf = _conf("AutoDetect=nvml\nName=gpu File=/dev/nvidia1 Links=0,-1\n"
                 "Name=gpu File=/dev/nvidia0 Links=-1,0\n")
    assert slurm_minors(conf, [1, 0]) == [0, 1]            # conf Links= wins over NVML
    assert slurm_minors(_conf("AutoDetect=nvml\n"), [5, 3]) == [5, 3]
    assert slurm_minors(None, [5, 3]) == [5, 3]


# -- a whole node per machine ------------------------------------------------------

from test_jobs_lifecycle import _uid, close_node, own_node_name, processes_asked  # noqa: E402 - shared with the lifecycle tests


class Node:
    """One skewed machine in the simulator, its model, a gres.conf and the MPS control daemon."""

    def __init__(self, machine: str, gres_style: str) -> None:
        from slurm_gpu.confgen import render_gres_conf
        from slurm_gpu.hw import Snapshot, load_node
        self.base = Path(tempfile.mkdtemp(prefix="sg-gpuid-"))
        os.chmod(self.base, 0o755)
        self.sim = str(self.base / "sim.json")
        init_state_for_machine(str(MACHINES / machine), self.sim)
        self.model = load_node(Snapshot(str(MACHINES / machine / "snapshot.json")))
        self.gres = self.base / "gres.conf"
        if gres_style == "generated":
            self.gres.write_text(render_gres_conf({"n1": self.model}))
        else:   # an admin's hand-written file: one File= range in minor order, no Links
            minors = sorted(g.minor for g in self.model.gpus)
            self.gres.write_text("AutoDetect=off\n" + "".join(
                f"NodeName=n1 Name=gpu File=/dev/nvidia{m}\n" for m in minors))
        # What Slurm means by index k: the k-th /dev/nvidiaN line of gres.conf.
        from slurm_gpu.confgen.hostlist import expand_files
        self.slurm_minor = [int(f.rsplit("nvidia", 1)[1])
                            for line in self.gres.read_text().splitlines()
                            if line.startswith("NodeName=") and "File=/dev/nvidia" in line
                            for f in expand_files(line.split("File=")[1].split()[0])]
        self.uuid_of_minor = {g.minor: g.uuid for g in self.model.gpus}
        self.ctl = mps_control_for_jobs(self.base / "nvidia-cuda-mps-control")
        self.mps = MpsSettings(control=str(self.ctl), base_dir=str(self.base / "mps"),
                               start_timeout=10, quit_timeout=3, exclusive_process=True)
        self.state_dir = str(self.base / "state")
        self.logs: list[str] = []
        own_node_name(self.base)

    def api(self):
        return backend.open_gpus(backend.GpuSource("sim", self.sim))

    def mig(self, profile: str) -> str:
        """*profile* ("2x3g", "1g") with this machine's memory size: A100 80GB or 40GB."""
        big = self.model.gpus[0].memory_bytes > (60 << 30)
        return profile + {"3g": (".40gb", ".20gb"), "1g": (".10gb", ".5gb")}[profile[-2:]][not big]

    def ctx(self, jobid: str = "100", **env: str) -> lifecycle.Context:
        e = {"SLURM_JOB_ID": jobid, "SLURM_JOB_UID": str(_uid("sgtest1")),
             "SLURM_JOB_GID": str(pwd.getpwnam("sgtest1").pw_gid), "SLURM_JOB_USER": "sgtest1"}
        e.update(env)
        return lifecycle.Context(e, JobsSettings(epilog_kill_wait=1.0), self.mps, MigSettings(),
                                 self.state_dir, self.api, lambda: self.model, self.logs.append,
                                 gres_conf=str(self.gres), node_name="n1")

    def by_uuid(self) -> dict[str, tuple[int, tuple]]:
        """{UUID: (compute mode, MIG instances)} of every GPU."""
        api = open_mig_sim(self.sim)
        gpus = NvmlGpus(api)
        out = {}
        for i in range(api.nvmlDeviceGetCount()):
            h = api.nvmlDeviceGetHandleByIndex(i)
            inst = tuple(sorted((e.profile_id, e.start) for e in instances.list_instances(gpus, i)))
            out[api.nvmlDeviceGetUUID(h)] = (api.nvmlDeviceGetComputeMode(h), inst)
        return out

    def close(self) -> None:
        close_node(self.base, self.mps.base_dir)


@pytest.fixture(params=[(m, s) for m in SKEWED for s in ("generated", "hand-written")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def skewed(request):
    if os.geteuid() != 0:
        pytest.skip("prolog/epilog run as root")
    n = Node(*request.param)
    yield n
    n.close()


def test_the_machines_really_are_skewed() -> None:
    from slurm_gpu.hw import Snapshot, load_node
    for m in SKEWED:
        node = load_node(Snapshot(str(MACHINES / m / "snapshot.json")))
        assert any(g.index != g.minor for g in node.gpus), m


def test_mps_and_compute_mode_land_on_the_job_gpu(skewed: Node) -> None:
    for k, minor in enumerate(skewed.slurm_minor):
        want = skewed.uuid_of_minor[minor]
        before = skewed.by_uuid()
        ctx = skewed.ctx(SLURM_JOB_GPUS=str(k), SPANK_SLURM_GPU_MPS="default")
        assert lifecycle.prolog(ctx) == 0, skewed.logs
        st = js.load(skewed.state_dir, "100")
        assert st.error is None, st.error
        assert [g["uuid"] for g in st.gpus] == [want]
        assert st.gpus[0]["minor"] == minor
        assert st.mps["devices"] == want                 # the daemon's CUDA_VISIBLE_DEVICES
        after = skewed.by_uuid()
        changed = {u for u in after if after[u] != before[u]}
        assert changed == {want} and after[want][0] == 3    # EXCLUSIVE_PROCESS, on that GPU only
        assert lifecycle.epilog(ctx) == 0, skewed.logs
        assert skewed.by_uuid() == before


def test_mig_instances_land_on_the_job_gpu(skewed: Node) -> None:
    last = len(skewed.slurm_minor) - 1
    for k in (0, last):
        want = skewed.uuid_of_minor[skewed.slurm_minor[k]]
        before = skewed.by_uuid()
        ctx = skewed.ctx(SLURM_JOB_GPUS=str(k), SPANK_SLURM_GPU_MIG=skewed.mig("2x3g"))
        assert lifecycle.prolog(ctx) == 0, skewed.logs
        st = js.load(skewed.state_dir, "100")
        assert st.error is None, st.error
        after = skewed.by_uuid()
        assert {u for u in after if after[u] != before[u]} == {want}
        assert len(after[want][1]) == 2
        assert lifecycle.epilog(ctx) == 0, skewed.logs
        assert skewed.by_uuid() == before


def test_a_job_gpu_missing_from_gres_conf_is_a_node_fault_not_a_guess(skewed: Node) -> None:
    before = skewed.by_uuid()
    ctx = skewed.ctx(SLURM_JOB_GPUS=str(len(skewed.slurm_minor)), SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(ctx) == 1                       # drains: gres.conf and NVML disagree
    assert "names no GPU" in " ".join(skewed.logs)
    assert skewed.by_uuid() == before


def test_other_jobs_gpu_is_recognised_by_uuid(skewed: Node) -> None:
    a = skewed.ctx("100", SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MPS="default")
    assert lifecycle.prolog(a) == 0, skewed.logs
    b = skewed.ctx("101", SLURM_JOB_GPUS="1", SPANK_SLURM_GPU_MIG=skewed.mig("1g"))
    assert lifecycle.prolog(b) == 0
    assert "also used by job 100" in (js.load(skewed.state_dir, "101").error or "")
    for c in (b, a):
        assert lifecycle.epilog(c) == 0


def test_spank_binding_binds_to_the_job_gpu(skewed: Node, planner) -> None:
    from slurm_gpu.binding import locality, plan_task
    loc = locality(skewed.model, node_minors(skewed.model.gpus, read_conf(str(skewed.gres), "n1")))
    by_minor = {g.minor: g for g in skewed.model.gpus}
    allowed = [p for c in skewed.model.cores for p in c.pus]
    for k, minor in enumerate(skewed.slurm_minor):
        g = by_minor[minor]
        b = plan_task(loc, {"SLURM_STEP_GPUS": str(k)}, mode="strict", local_task=0, ntasks=1,
                      allowed=allowed)
        assert b.gpus == (g.index,)
        assert set(b.cpus) == set(skewed.model.pus_of_cores(g.cores))


def test_locality_cache_follows_gres_conf(skewed: Node) -> None:
    from slurm_gpu.jobs.locality import gpu_table
    cache = os.path.join(skewed.state_dir, "node-facts")
    t1 = gpu_table(cache, None, lambda: skewed.model, str(skewed.gres), "n1")
    assert [t1[k]["minor"] for k in sorted(t1)] == skewed.slurm_minor
    # The admin rewrites gres.conf in the other order: the cache must not keep the old one.
    skewed.gres.write_text("AutoDetect=off\n" + "".join(
        f"NodeName=n1 Name=gpu File=/dev/nvidia{m}\n" for m in reversed(skewed.slurm_minor)))
    t2 = gpu_table(cache, None, lambda: skewed.model, str(skewed.gres), "n1")
    assert [t2[k]["minor"] for k in sorted(t2)] == list(reversed(skewed.slurm_minor))


def test_epilog_leftover_check_reads_the_job_gpu(skewed: Node, monkeypatch) -> None:
    """[repair] user_problem: the processes looked at are those of the job's GPU, not NVML index k."""
    seen = processes_asked(monkeypatch)
    api = open_mig_sim(skewed.sim)
    nvml_of_minor = {api.nvmlDeviceGetMinorNumber(api.nvmlDeviceGetHandleByIndex(i)): i
                     for i in range(api.nvmlDeviceGetCount())}
    for k, minor in enumerate(skewed.slurm_minor):
        ctx = skewed.ctx(SLURM_JOB_GPUS=str(k))
        ctx.health_state_dir = str(skewed.base / "health")
        seen.clear()
        assert lifecycle.epilog(ctx) == 0
        assert seen == [[nvml_of_minor[minor]]], (k, minor)


def test_mig_slice_lines_keep_their_slurm_index() -> None:
    conf = _conf("AutoDetect=off\n"
                 "Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21,/dev/nvidia-caps/nvidia-cap22\n"
                 "Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap30,/dev/nvidia-caps/nvidia-cap31\n"
                 "Name=gpu File=/dev/nvidia[1-2]\n")
    assert slurm_minors(conf, [0, 1, 2]) == [None, None, 1, 2]
