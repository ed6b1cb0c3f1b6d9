"""Per-job IMEX on the packaged gb200-nvl machine: a 2-node exclusive job gets
a ready domain from the prolog (the test rig's nvidia-imex stand-in, through
the same adapter as on a real node), and a domain that never becomes ready
fails the job without draining a node (docs/imex.md).

On every supported Slurm: 24.11 and 26.05 run from their Debian roots (a
missing root skips them with the reason), and their slurmd, unlike 22.05's,
reverse-resolves every connection, which hung the namespaced nodes' RPCs
while a node's DNS query could leave its namespace (docs/sandbox.md,
"Namespaces")."""
from __future__ import annotations

import pytest

from debianroot import unavailable
from sandboxlib import VERSIONS


@pytest.fixture(scope="module", params=VERSIONS)
def cluster(request, make_sandbox, job_users):
    try:
        c = make_sandbox(nodes=2, machine="gb200-nvl", prolog=True, netns=True, slurm=request.param,
                         extra_config={"imex": {"timeout": 4.0}})
    except Exception as e:  # noqa: BLE001
        if "no Slurm" in str(e) and "root" in str(e):
            unavailable(str(e))
        raise
    yield c
    c.sb.down()      # before the next version's sandbox starts (make_sandbox's own stop is at the module's end)


def _status_cmd(cluster) -> list[str]:
    return ["env", f"SLURM_GPU_CONFIG={cluster.dir}/etc/slurm-gpu.toml",
            str(cluster.venv / "bin" / "slurm-gpu"), "imex", "status"]


def test_an_exclusive_two_node_job_gets_a_ready_domain(cluster):
    # a batch job whose step runs `imex status` on both nodes (sbatch, not an
    # interactive srun: a Debian root's client cannot take task I/O from a netns node)
    d = cluster.user_dir("sgtest1")
    out = d / "imex-status.out"
    jobid = cluster.sbatch("-N2", "--exclusive", "--gres=gpu:4", "-o", str(out), "--wrap",
                           "srun " + " ".join(_status_cmd(cluster)), user="sgtest1", cwd=str(d))
    info = cluster.wait_job(jobid, timeout=60)
    text = out.read_text() if out.exists() else ""
    assert info["JobState"] == "COMPLETED", (info, text, cluster.log("n1")[-3000:])
    heads = [ln for ln in text.splitlines() if ln.startswith("job ")]
    assert len(heads) == 2 and all(h.endswith("status UP") for h in heads), text
    rows = sorted({tuple(ln.split()[0::2]) for ln in text.splitlines() if ln.startswith("  n")})
    assert rows == [("n1", "READY"), ("n2", "READY")], text
    # the epilog stopped both daemons and removed the job's files
    for n in cluster.nodes:
        cluster.wait_node_state(n, "idle")
        assert [p.name for p in (cluster.dir / "var" / n / "imex").iterdir()] in ([], ["events.log"])


def test_a_domain_that_never_becomes_ready_fails_the_job_and_drains_nothing(cluster):
    fault = cluster.dir / "var" / "n2" / "imex-fault"
    fault.write_text("isolated\n")          # n2's daemon runs but never meets n1
    try:
        jobid = cluster.sbatch("-N2", "--exclusive", "--gres=gpu:4", "--wrap", "sleep 30", user="sgtest1")
        info = cluster.wait_job(jobid, timeout=60)
        assert info["JobState"] in ("CANCELLED", "FAILED"), info
        # slurmd keeps no output of a prolog that exits 0: the lines are in each node's events.log
        events = {n: (cluster.dir / "var" / n / "imex" / "events.log").read_text() for n in cluster.nodes}
        assert "peer(s) n2 (UNAVAILABLE) not READY" in events["n1"], events
        assert "peer(s) n1 (UNAVAILABLE) not READY" in events["n2"], events
        for n in cluster.nodes:
            cluster.wait_node_state(n, "idle")
    finally:
        fault.unlink()
