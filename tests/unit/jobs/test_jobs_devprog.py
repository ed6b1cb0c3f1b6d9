"""jobs/devprog.py: the MPS daemon's holding cgroup refuses every GPU but the job's
(cgroup v2; hostile review round 3, H4).

Run for real: the program is loaded into this kernel and attached to a cgroup v2
directory made for the test; a process moved there opens device nodes the test
made with mknod.  With no NVIDIA driver here an allowed ``195:N`` opens with
ENXIO (no such device), a refused one with EPERM, the cgroup's verdict
(``devcgroup_check_permission`` runs before the driver is looked up).
"""
from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurm_gpu.jobs import devprog

PROBE = """
import os, sys
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as f:
    f.write(str(os.getpid()))
for path in sys.argv[2:]:
    try:
        os.close(os.open(path, os.O_RDONLY))
        print(os.path.basename(path), "ok")
    except OSError as e:
        print(os.path.basename(path), e.errno)
"""


def _v2_root() -> str | None:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            head, _, tail = line.partition(" - ")
            if tail.split()[:1] == ["cgroup2"]:
                return head.split()[4]
    return None


@pytest.fixture
def v2_dir() -> Iterator[Path]:
    root = _v2_root()
    if os.geteuid() != 0 or root is None:
        pytest.skip("needs root and a cgroup v2 hierarchy")
    d = Path(root) / f"sg-devprog-test-{os.getpid()}"
    d.mkdir()
    try:
        yield d
    finally:
        for pid in (d / "cgroup.procs").read_text().split():
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        d.rmdir()


def _nodes(tmp_path: Path) -> list[str]:
    out = []
    for name, major, minor in (("nvidia0", 195, 0), ("nvidia1", 195, 1), ("nvidia7", 195, 7),
                               ("nvidiactl", 195, 255), ("null", 1, 3)):
        p = tmp_path / name
        os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(major, minor))
        out.append(str(p))
    return out


def _probe(cgroup: Path, nodes: list[str]) -> dict[str, str]:
    res = subprocess.run([sys.executable, "-I", "-c", PROBE, str(cgroup), *nodes],
                         capture_output=True, text=True, timeout=30, check=True)
    return dict(line.split() for line in res.stdout.splitlines())


def test_the_hold_refuses_every_gpu_but_the_jobs(tmp_path: Path, v2_dir: Path) -> None:
    nodes = _nodes(tmp_path)
    assert _probe(v2_dir, nodes) == {"nvidia0": str(errno.ENXIO), "nvidia1": str(errno.ENXIO),
                                     "nvidia7": str(errno.ENXIO), "nvidiactl": str(errno.ENXIO),
                                     "null": "ok"}        # no program: the driver's answer
    devprog.limit_gpus(str(v2_dir), [1])
    assert _probe(v2_dir, nodes) == {"nvidia0": str(errno.EPERM), "nvidia1": str(errno.ENXIO),
                                     "nvidia7": str(errno.EPERM), "nvidiactl": str(errno.ENXIO),
                                     "null": "ok"}


def test_a_job_of_several_gpus_keeps_them_all_and_a_bad_minor_is_ignored(
        tmp_path: Path, v2_dir: Path) -> None:
    nodes = _nodes(tmp_path)
    devprog.limit_gpus(str(v2_dir), [7, 0, 0, 255, -1, 300])
    assert _probe(v2_dir, nodes) == {"nvidia0": str(errno.ENXIO), "nvidia1": str(errno.EPERM),
                                     "nvidia7": str(errno.ENXIO), "nvidiactl": str(errno.ENXIO),
                                     "null": "ok"}


def test_the_program_is_slurms_layout() -> None:
    """Seven instructions read and test the device (type, major, minor), one test per
    allowed minor, then refuse (r0 = 0) and allow (r0 = 1): each 8 bytes."""
    code = devprog.program([3, 1])
    assert len(code) == 8 * (7 + 2 + 4)
    assert code[-32:] == bytes.fromhex("b700000000000000" "9500000000000000"
                                       "b700000001000000" "9500000000000000")


def test_a_directory_that_is_no_cgroup_is_an_error(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to load a BPF program")
    with pytest.raises(OSError):
        devprog.limit_gpus(str(tmp_path), [0])


def test_a_gpu_mps_prolog_limits_its_v2_hold_to_the_jobs_gpus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prolog's hold (no job cgroup yet: 22.05, no RunInJob) on cgroup v2: the daemon
    and anything it is made to start there reach the job's GPU, no other; the epilog
    removes the hold with its program (review round 3, H4)."""
    from slurm_gpu.jobs import jobcgroup
    root = _v2_root()
    if os.geteuid() != 0 or root is None:
        pytest.skip("needs root and a cgroup v2 hierarchy")
    top = f"{root}/sg-devprog-hold-{os.getpid()}"
    monkeypatch.setattr(jobcgroup, "hold_dirs", lambda jobid, node, mountinfo="": [
        f"{top}/{jobcgroup.HOLD}/{node}/job_{jobid}"])
    try:
        _hold_reaches_the_jobs_gpu_alone(tmp_path, lambda hold: hold[:1])
    finally:
        for d in sorted(Path(top).glob("**/"), key=lambda p: -len(p.parts)):
            d.rmdir()


def test_a_gpu_mps_prolog_limits_its_v1_hold_to_the_jobs_gpus(tmp_path: Path) -> None:
    """On cgroup v1 the hold is made in the devices hierarchy too, with a
    ``devices.deny`` line for every other GPU minor: the daemon and what it starts
    there reach the job's GPU, no other, until the first step moves it; the epilog
    removes both (review round 3, H4)."""
    from slurm_gpu.jobs import jobcgroup
    if os.geteuid() != 0 or not any(v == 1 and "devices" in c for _p, v, c in jobcgroup.mounts()):
        pytest.skip("needs root and a cgroup v1 devices hierarchy")
    _hold_reaches_the_jobs_gpu_alone(
        tmp_path, lambda hold: [h for h in hold if os.path.exists(os.path.join(h, "devices.deny"))])


def _hold_reaches_the_jobs_gpu_alone(tmp_path: Path, limited: Callable[[list[str]], list[str]],
                                     before: Callable[[str], None] = lambda node: None) -> None:
    """Prolog a --gpu-mps job of GPU 0 (no job cgroup: the hold); in the hold's directory
    *limited* picks (exactly one), a process reaches the job's GPU minor (ENXIO: no
    driver here) and not the next (EPERM); the epilog removes every hold directory."""
    from test_jobs_lifecycle import Env

    from slurm_gpu.jobs import lifecycle
    from slurm_gpu.jobs import state as js
    from slurm_gpu import hostctx
    node = Env()
    try:
        before(hostctx.node_name or "")
        ctx = node.ctx(SLURM_JOB_GPUS="0", SPANK_SLURM_GPU_MPS="default")
        assert lifecycle.prolog(ctx) == 0, node.logs
        st = js.load(node.state_dir, "100")
        assert st is not None and st.mps and st.mps.get("hold")
        dirs = limited(st.mps["hold"] or [])
        assert len(dirs) == 1, st.mps["hold"]
        minor = st.gpus[0]["minor"]
        assert st.mps["hold_devices"] == f"the job's GPUs only (/dev/nvidia{minor})"
        (tmp_path / "dev").mkdir()
        mine, other = tmp_path / "dev" / "mine", tmp_path / "dev" / "other"
        os.mknod(mine, stat.S_IFCHR | 0o600, os.makedev(195, minor))
        os.mknod(other, stat.S_IFCHR | 0o600, os.makedev(195, minor + 1))
        assert _probe(Path(dirs[0]), [str(mine), str(other)]) == {
            "mine": str(errno.ENXIO), "other": str(errno.EPERM)}
        assert lifecycle.epilog(ctx) == 0, node.logs
        assert node.leftovers() == [] and not any(os.path.exists(h) for h in st.mps["hold"])
    finally:
        node.close()


def test_a_hold_left_by_an_earlier_run_of_the_job_does_not_keep_its_limit(tmp_path: Path) -> None:
    """A requeued job's prolog finds its hold left over from the earlier run (an epilog
    that could not remove it), limited to that run's GPU: the new run's hold is made
    afresh, reaching the GPU it has now, not the one it had then."""
    from slurm_gpu.jobs import devprog, jobcgroup
    if os.geteuid() != 0 or not any(v == 1 and "devices" in c for _p, v, c in jobcgroup.mounts()):
        pytest.skip("needs root and a cgroup v1 devices hierarchy")

    def earlier_run(node: str) -> None:
        for h in jobcgroup.make_hold(jobcgroup.hold_dirs("100", node)):
            if os.path.exists(os.path.join(h, "devices.deny")):
                devprog.limit_gpus_v1(h, [])        # every GPU refused, the job's now too
    _hold_reaches_the_jobs_gpu_alone(
        tmp_path, lambda hold: [h for h in hold if os.path.exists(os.path.join(h, "devices.deny"))],
        before=earlier_run)
