"""jobs.mps, what the prolog/epilog tests left open of the daemon's environment
and CPU list (mutmut on ``_env`` and ``_cpu_list``, issue 24 §8).

Both are seen where they land on the node: the daemon's environment in
``/proc/<pid>/environ`` (what it was exec'd with: NVIDIA's binary, see
test_mps_control.py), its CPU list in the job's record (:func:`state.load`).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from test_jobs_lifecycle import Env
from test_jobs_mps_mutants import node  # noqa: F401 - the same root + sgtest1 node fixture

from slurm_gpu import runner
from slurm_gpu.jobs import lifecycle
from slurm_gpu.jobs import state as js


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode()
    return dict(x.split("=", 1) for x in raw.split("\0") if x)


@pytest.mark.parametrize("gpus, cpus", [("0,1", "0,1"), ("0,2", "0")])
def test_the_daemon_gets_exactly_its_pipe_log_devices_and_cpus(node: Env, gpus: str, cpus: str) -> None:
    # The test node's GPU i is local to CPU i % 2 (Env.node): two GPUs on
    # either CPU give both, two on CPU 0 give it once.  Nothing of the
    # prolog's own environment (root's HOME, slurmd's variables) reaches the
    # daemon, which runs as the job's user.
    ctx = node.ctx(SLURM_JOB_GPUS=gpus, SPANK_SLURM_GPU_MPS="default", HOME="/root",
                   CUDA_VISIBLE_DEVICES="9")
    assert lifecycle.prolog(ctx) == 0, node.logs
    st = js.load(node.state_dir, "100")
    assert st is not None and st.mps is not None and st.error is None
    devices = ",".join(g["uuid"] for g in st.gpus)
    assert len(st.gpus) == 2 and devices.count("GPU-") == 2
    assert st.mps["cpus"] == cpus
    assert st.mps["devices"] == devices
    assert len(st.mps["pids"]) == 1
    assert _environ(st.mps["pids"][0]) == {
        "PATH": runner.SAFE_PATH, "HOME": "/", "CUDA_VISIBLE_DEVICES": devices,
        "CUDA_MPS_PIPE_DIRECTORY": st.mps["pipe_dir"], "CUDA_MPS_LOG_DIRECTORY": st.mps["log_dir"]}
    assert st.mps["pipe_dir"] == f"{node.mps.base_dir}/100/pipe"
    assert st.mps["log_dir"] == f"{node.mps.base_dir}/100/log"
    assert lifecycle.epilog(ctx) == 0, node.logs
    assert node.leftovers() == []
