"""jobs.jobcgroup, what its first tests left open (mutmut, issue 24 §8).

A fake cgroup tree (plain directories and a mountinfo naming them), as in
test_jobs_cgroup.py; ownership and modes need root, so those tests skip
without it.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from slurm_gpu import procfs
from slurm_gpu.jobs import jobcgroup

HOLD, NAME = jobcgroup.HOLD, jobcgroup.NAME
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="ownership needs root")


def _dirs(base: Path, *rel: str) -> None:
    for r in rel:
        (base / r).mkdir(parents=True, exist_ok=True)


@pytest.fixture
def umask0() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


# -- mounts ------------------------------------------------------------------

def test_mounts_reads_only_cgroup_mounts_by_their_type(tmp_path: Path) -> None:
    mi = tmp_path / "mi"
    mi.write_text(
        "1 0 0:1 / /short - cgroup2\n"                               # too few fields: skipped
        "2 0 0:2 / - cgroup2 cgroup2 rw\n"                           # no mount point: skipped
        "36 25 0:31 / /cg/mem - cgroup none rw,memory,nosuid\n"      # exactly 5 fields before " - "
        "37 25 0:32 / /cg/my\\040cpu rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
        "38 25 0:33 / /cg/systemd rw - cgroup cgroup rw,xattr,name=systemd\n"
        "39 25 0:34 / /cg/unified rw shared:9 - cgroup2 - rw\n"      # the source is "-"
        "40 25 0:35 / /cg/src rw - tmpfs cgroup2 rw\n"              # named cgroup2, not one
        "41 25 0:36 / /cg/two rw - cgroup2 none rw\n"
        "42 25 0:37 / /cg/pids rw - cgroup my\x0bsource rw,pids\n")       # \x0b is no separator
    assert jobcgroup.mounts(str(mi)) == [
        ("/cg/mem", 1, ("memory",)), ("/cg/my cpu", 1, ("cpu", "cpuacct")),
        ("/cg/unified", 2, ()), ("/cg/two", 2, ()), ("/cg/pids", 1, ("pids",))]
    assert jobcgroup.mounts(str(tmp_path / "absent")) == []


def test_mounts_split_lines_and_fields_where_the_kernel_does(tmp_path: Path) -> None:
    """A user's FUSE mount may name any byte but the four the kernel escapes:
    a byte that is no UTF-8, a form feed, \\x1c-\\x1e, \\x85 or \\x0b must neither
    stop the read (the prolog on every later job of the node) nor cut a line."""
    mi = tmp_path / "mi"
    odd = "\f\x0b\x1c\x1d\x1e\x85"
    mi.write_bytes(
        b"50 25 0:40 / /home/u/\xff\xfe rw,nosuid - fuse.sshfs u@h:/ rw\n"
        + f"51 25 0:41 / /home/u/a{odd}b rw - fuse.x src rw\n".encode()
        + f"52 25 0:42 / /cg/a{odd}b rw - cgroup2 cgroup2 rw\n".encode()
        + b"53 25 0:43 / /cg/f rw - cgroup cgroup rw,freezer\n")
    assert jobcgroup.mounts(str(mi)) == [(f"/cg/a{odd}b", 2, ()), ("/cg/f", 1, ("freezer",))]


@pytest.mark.skipif(not os.path.isdir("/sys/fs/cgroup"), reason="no cgroup filesystem")
def test_the_default_mountinfo_is_this_process_s() -> None:
    found = jobcgroup.mounts()
    assert found == jobcgroup.mounts("/proc/self/mountinfo")
    if not found:
        pytest.skip("no cgroup mount here")
    assert jobcgroup.hold_dirs("7", "n1") == jobcgroup.hold_dirs("7", "n1", "/proc/self/mountinfo") != []
    assert jobcgroup.job_dirs("4294967290", None) == []


def test_job_dirs_reads_the_default_mountinfo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[str] = []

    def mounts(mountinfo: str) -> list[tuple[str, int, tuple[str, ...]]]:
        seen.append(mountinfo)
        return []
    monkeypatch.setattr(jobcgroup, "mounts", mounts)
    jobcgroup.job_dirs("7", 1001)
    jobcgroup.hold_dirs("7", "n1")
    assert seen == ["/proc/self/mountinfo"] * 2


# -- job_dirs and the layouts ------------------------------------------------

def _v1(tmp_path: Path) -> str:
    mi = tmp_path / "mi"
    mi.write_text(f"36 25 0:31 / {tmp_path}/memory rw - cgroup cgroup rw,memory\n")
    return str(mi)


def _v2(tmp_path: Path) -> str:
    mi = tmp_path / "mi"
    mi.write_text(f"30 25 0:26 / {tmp_path}/u rw - cgroup2 cgroup2 rw\n")
    return str(mi)


@root_only
def test_an_unsafe_node_name_looks_at_every_layout_and_takes_only_a_single_match(tmp_path: Path) -> None:
    mi = _v1(tmp_path)
    _dirs(tmp_path, "memory/slurm_n1/uid_1001/job_7", "memory/slurm/uid_1001/job_7")
    assert jobcgroup.job_dirs("7", 1001, node="n1", mountinfo=mi) == [f"{tmp_path}/memory/slurm_n1/uid_1001/job_7"]
    for node in (".", "..", "a/b", "n*"):
        assert jobcgroup.job_dirs("7", 1001, node=node, mountinfo=mi) == [], node


@root_only
def test_v1_plain_slurm_root_any_uid_and_a_sluid_with_dashes(tmp_path: Path) -> None:
    mi = _v1(tmp_path)
    _dirs(tmp_path, "memory/slurm/uid_1001/job_7", "memory/slurm/uid_1001/ab-12")
    job = f"{tmp_path}/memory/slurm/uid_1001/job_7"
    assert jobcgroup.job_dirs("7", 1001, node="n1", mountinfo=mi) == [job]
    assert jobcgroup.job_dirs("7", None, mountinfo=mi) == [job]
    assert jobcgroup.job_dirs("9", 1001, "ab-12", mountinfo=mi) == [f"{tmp_path}/memory/slurm/uid_1001/ab-12"]


@root_only
def test_v1_wildcards_read_every_directory_and_skip_what_is_no_match(tmp_path: Path) -> None:
    mi = _v1(tmp_path)
    _dirs(tmp_path, "memory/slurm_a/uid_1001/job_7", "memory/slurm_b/uid_1002",
          "memory/other/uid_1001/job_8", "memory/slurm_c/x_1001/job_8")
    (tmp_path / "memory" / "slurm_0").write_text("")        # a file: no directory to list
    assert jobcgroup.job_dirs("7", None, mountinfo=mi) == [f"{tmp_path}/memory/slurm_a/uid_1001/job_7"]
    assert jobcgroup.job_dirs("8", None, mountinfo=mi) == []
    _dirs(tmp_path, "memory/slurm/uid_1001/job_9")          # "slurm*" takes "slurm" itself
    assert jobcgroup.job_dirs("9", None, mountinfo=mi) == [f"{tmp_path}/memory/slurm/uid_1001/job_9"]


@root_only
def test_v2_scopes_with_and_without_system_slice_and_no_hidden_one(tmp_path: Path) -> None:
    mi = _v2(tmp_path)
    u = tmp_path / "u"
    _dirs(u, "system.slice/n1_slurmstepd.scope/job_7", "system.slice/n2_slurmstepd.scope/job_7",
          "system.slice/slurmstepd.scope/job_8", "n3_slurmstepd/job_9",
          "system.slice/.x_slurmstepd.scope/job_10")
    assert jobcgroup.job_dirs("7", 1001, node="n2", mountinfo=mi) == [f"{u}/system.slice/n2_slurmstepd.scope/job_7"]
    assert jobcgroup.job_dirs("7", 1001, mountinfo=mi) == []            # two nodes': none
    assert jobcgroup.job_dirs("8", 1001, node="n1", mountinfo=mi) == [f"{u}/system.slice/slurmstepd.scope/job_8"]
    assert jobcgroup.job_dirs("9", 1001, node="n3", mountinfo=mi) == [f"{u}/n3_slurmstepd/job_9"]
    assert jobcgroup.job_dirs("9", 1001, mountinfo=mi) == [f"{u}/n3_slurmstepd/job_9"]
    assert jobcgroup.job_dirs("10", 1001, mountinfo=mi) == []


@root_only
def test_a_job_directory_must_be_roots_and_a_directory(tmp_path: Path) -> None:
    mi = _v1(tmp_path)
    _dirs(tmp_path, "memory/slurm/uid_1001/job_7", "memory/slurm/uid_1001")
    os.chown(tmp_path / "memory/slurm/uid_1001/job_7", 1001, 1001)
    (tmp_path / "memory/slurm/uid_1001/job_8").write_text("")
    assert jobcgroup.job_dirs("7", 1001, mountinfo=mi) == []
    assert jobcgroup.job_dirs("8", 1001, mountinfo=mi) == []


def test_ours_lists_only_the_job_directories_that_hold_ours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("ownership needs root")
    monkeypatch.setattr(jobcgroup, "mounts", lambda mountinfo="": [(str(tmp_path / "u"), 2, ())])
    scope = tmp_path / "u" / "system.slice" / "n1_slurmstepd.scope"
    _dirs(scope, f"job_7/{NAME}", "job_8", f"s9/{NAME}")
    _dirs(tmp_path / "u" / "system.slice" / "n2_slurmstepd.scope", f"job_7/{NAME}")
    assert jobcgroup.ours("7", 1001, node="n1") == [f"{scope}/job_7/{NAME}"]
    assert jobcgroup.ours("8", 1001, node="n1") == []
    assert jobcgroup.ours("9", 1001, "s9", "n1") == [f"{scope}/s9/{NAME}"]
    monkeypatch.setattr(jobcgroup, "mounts", lambda mountinfo="": [(str(tmp_path / "m"), 1, ("memory",))])
    _dirs(tmp_path / "m" / "slurm", f"uid_1001/job_7/{NAME}", f"uid_1002/job_7/{NAME}")
    assert jobcgroup.ours("7", 1002) == [f"{tmp_path}/m/slurm/uid_1002/job_7/{NAME}"]


# -- make, join, members -----------------------------------------------------

@root_only
def test_make_creates_0755_copies_cpuset_on_v1_only_and_takes_an_existing_one(tmp_path: Path, umask0: None) -> None:
    v1, v2 = tmp_path / "v1" / "job_7", tmp_path / "v2" / "job_7"
    _dirs(tmp_path, "v1/job_7", "v2/job_7")
    for d in (v1, v2):
        (d / "cpuset.cpus").write_text("0-3\n")
        (d / "cpuset.mems").write_text("1\n")
    (v2 / "cgroup.subtree_control").write_text("")
    assert jobcgroup.make([str(v1), str(v2)]) == [f"{v1}/{NAME}", f"{v2}/{NAME}"]
    assert (v1 / NAME).stat().st_mode & 0o7777 == 0o755
    assert ((v1 / NAME / "cpuset.cpus").read_text(), (v1 / NAME / "cpuset.mems").read_text()) == ("0-3", "1")
    assert sorted(os.listdir(v2 / NAME)) == []
    assert jobcgroup.make([str(v1)]) == [f"{v1}/{NAME}"]         # the prolog run again
    os.chown(v1 / NAME, 1001, 1001)
    with pytest.raises(FileExistsError):
        jobcgroup.make([str(v1)])


def test_join_writes_the_pid_everywhere_and_members_reads_every_cgroup(tmp_path: Path) -> None:
    _dirs(tmp_path, "a", "b", "c")
    jobcgroup.join(4242, [str(tmp_path / "a"), str(tmp_path / "b")])
    assert (tmp_path / "a" / "cgroup.procs").read_text() == (tmp_path / "b" / "cgroup.procs").read_text() == "4242"
    (tmp_path / "b" / "cgroup.procs").write_text("17\nx\n18\n")
    assert jobcgroup.members([str(tmp_path / d) for d in ("a", "b", "c", "absent")]) == {4242, 17, 18}


# -- kill_all, kill_pid ------------------------------------------------------

def test_kill_all_writes_cgroup_kill_where_there_is_one(tmp_path: Path) -> None:
    _dirs(tmp_path, "a", "b")
    for d in ("a", "b"):
        (tmp_path / d / "cgroup.procs").write_text("")
    (tmp_path / "a" / "cgroup.kill").write_text("")
    assert jobcgroup.kill_all([str(tmp_path / "a"), str(tmp_path / "b")], 1.0) == set()
    assert (tmp_path / "a" / "cgroup.kill").read_text() == "1"
    assert not (tmp_path / "b" / "cgroup.kill").exists()


def test_kill_all_returns_the_members_left_at_the_deadline(tmp_path: Path) -> None:
    p = subprocess.Popen(["/bin/true"])
    p.wait()                                       # gone, but a fake cgroup keeps listing it
    (tmp_path / "cgroup.procs").write_text(f"{p.pid}\n{os.getpid()}\n")
    assert jobcgroup.kill_all([str(tmp_path)], 0.05) == {p.pid}


@pytest.mark.parametrize("recycled", [True, False])
def test_kill_pid_spares_a_recycled_pid(monkeypatch: pytest.MonkeyPatch, recycled: bool) -> None:
    p = subprocess.Popen(["/bin/sleep", "60"])
    try:
        real = procfs.start_time(p.pid)
        assert real is not None
        seen = iter([real, real + recycled])       # a new process took the pid between the reads
        monkeypatch.setattr(procfs, "start_time", lambda pid, proc="/proc": next(seen) if pid == p.pid else None)
        jobcgroup.kill_pid(p.pid)
        p.terminate()                              # the exit status names the first fatal signal
        assert p.wait(timeout=5) == (-15 if recycled else -9)
    finally:
        p.kill()
        p.wait()


# -- remove ------------------------------------------------------------------

def test_remove_takes_ours_then_the_job_and_uid_directories_when_empty(tmp_path: Path) -> None:
    _dirs(tmp_path, f"m/slurm_n1/uid_1/job_7/{NAME}", f"m/slurm_n1/uid_1/job_8/{NAME}", "m/slurm_n1/uid_1/job_8/step_0",
          f"v2/scope/job_9/{NAME}", "plain/x")
    jobcgroup.remove([f"{tmp_path}/m/slurm_n1/uid_1/job_8/{NAME}"])
    assert sorted(os.listdir(tmp_path / "m/slurm_n1/uid_1/job_8")) == ["step_0"]
    jobcgroup.remove([f"{tmp_path}/m/slurm_n1/uid_1/job_7/{NAME}"])
    assert sorted(os.listdir(tmp_path / "m/slurm_n1/uid_1")) == ["job_8"]
    (tmp_path / "m/slurm_n1/uid_1/job_8/step_0").rmdir()
    jobcgroup.remove([f"{tmp_path}/m/slurm_n1/uid_1/job_8/{NAME}", f"{tmp_path}/m/slurm_n1/uid_1/job_6/{NAME}"])
    assert os.listdir(tmp_path / "m/slurm_n1") == []              # the slurm root stays
    _dirs(tmp_path, f"m/slurm_n1/uid_1/job_5/{NAME}", "m/slurm_n1/uid_1/job_5/step_0", f"m/slurm_n1/uid_1/job_4/{NAME}")
    jobcgroup.remove([f"{tmp_path}/m/slurm_n1/uid_1/job_5/{NAME}", f"{tmp_path}/m/slurm_n1/uid_1/job_4/{NAME}"])
    assert sorted(os.listdir(tmp_path / "m/slurm_n1/uid_1")) == ["job_5"]    # job_5 busy, job_4 gone
    jobcgroup.remove([f"{tmp_path}/v2/scope/job_9/{NAME}"])
    assert os.listdir(tmp_path / "v2/scope") == []                # no uid_ above: the scope stays
    jobcgroup.remove([f"{tmp_path}/plain/x"])
    assert os.listdir(tmp_path / "plain") == []


def test_remove_a_hold_takes_its_empty_parents(tmp_path: Path) -> None:
    _dirs(tmp_path, f"f/{HOLD}/n1/job_7", f"f/{HOLD}/n1/job_8", f"f/{HOLD}/n2/job_9")
    jobcgroup.remove([f"{tmp_path}/f/{HOLD}/n1/job_7"])
    assert os.listdir(tmp_path / f"f/{HOLD}/n1") == ["job_8"]
    jobcgroup.remove([f"{tmp_path}/f/{HOLD}/n1/job_8"])
    assert os.listdir(tmp_path / f"f/{HOLD}") == ["n2"]
    jobcgroup.remove([f"{tmp_path}/f/{HOLD}/n2/job_9"])
    assert os.listdir(tmp_path / "f") == []


# -- the hold ----------------------------------------------------------------

def test_hold_never_in_a_hierarchy_with_cpuset_and_in_one_v2_mount(tmp_path: Path) -> None:
    mi = tmp_path / "mi"
    mi.write_text("1 0 0:1 / /cg/cf rw - cgroup cgroup rw,cpuset,freezer\n"
                  "2 0 0:2 / /cg/mem rw - cgroup cgroup rw,memory\n")
    assert jobcgroup.hold_dirs("7", "n1", str(mi)) == [f"/cg/mem/{HOLD}/n1/job_7"]
    mi.write_text("1 0 0:1 / /u1 rw - cgroup2 cgroup2 rw\n2 0 0:2 / /u2 rw - cgroup2 cgroup2 rw\n")
    assert jobcgroup.hold_dirs("7", "n1", str(mi)) == [f"/u1/{HOLD}/n1/job_7"]
    for node in ("n/1", "n*", ".n"):
        assert jobcgroup.hold_dirs("7", node, str(mi)) == [], node


@root_only
def test_make_hold_makes_roots_0755_directories_or_refuses(tmp_path: Path, umask0: None) -> None:
    d = f"{tmp_path}/f/{HOLD}/n1/job_7"
    assert jobcgroup.make_hold([d]) == [d]
    assert os.stat(d).st_mode & 0o7777 == 0o755
    assert jobcgroup.make_hold([d]) == [d]                       # already there
    os.chown(d, 1001, 1001)
    with pytest.raises(OSError, match=f"^{d} is not root's directory$"):
        jobcgroup.make_hold([d])


@root_only
@pytest.mark.parametrize("gone", [2, 5])
def test_make_hold_retries_when_an_epilog_removes_the_parents(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gone: int) -> None:
    real = os.makedirs
    calls: list[str] = []

    def makedirs(name: str, mode: int = 0o777, exist_ok: bool = False) -> None:
        if name == d:                              # not the recursive calls for the parents
            calls.append(name)
            if len(calls) <= gone:
                raise FileNotFoundError(name)
        real(name, mode, exist_ok)
    d = f"{tmp_path}/f/{HOLD}/n1/job_7"
    monkeypatch.setattr(os, "makedirs", makedirs)
    if gone < 5:
        assert jobcgroup.make_hold([d]) == [d]
    else:                                          # five tries, then the check refuses
        with pytest.raises(OSError, match="is not root's directory"):
            jobcgroup.make_hold([d])
    assert len(calls) == min(gone + 1, 5)


def test_is_hold_shapes(tmp_path: Path) -> None:
    assert jobcgroup.is_hold(f"/{HOLD}/n1/job_7", "7", ["/"])
    assert not jobcgroup.is_hold(f"{HOLD}/n1/job_7", "7", ["/", ""])
    assert jobcgroup.is_hold(f"/x/.cg/{HOLD}/n1/job_7", "7", ["/x/.cg/"])
    assert not jobcgroup.is_hold(f"/cg/{HOLD}/.n1/job_7", "7", ["/cg"])
    assert not jobcgroup.is_hold(f"/cg/x/../{HOLD}/n1/job_7", "7", ["/cg/x/.."])
    assert jobcgroup.is_hold(f"/cg/{HOLD}/n1/job_7", "7", ["/cg//"])
    assert jobcgroup.is_hold(f"/cgX/{HOLD}/n1/job_7", "7", ["/cgX"])


# -- descendants -------------------------------------------------------------

def test_descendants_read_the_given_proc_tree(tmp_path: Path) -> None:
    tree = {5: 1, 6: 5, 7: 6, 8: 1, 9: 8}
    for pid, ppid in tree.items():
        _dirs(tmp_path, str(pid))
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (x) S {ppid} 0 0\n")
    for bad in range(20, 40):                          # gone or unreadable: skipped, not the end
        _dirs(tmp_path, str(bad))
    _dirs(tmp_path, "self")
    assert jobcgroup.descendants([5], str(tmp_path)) == {5, 6, 7}
    assert jobcgroup.descendants([8, 5, 5], str(tmp_path)) == {5, 6, 7, 8, 9}
    assert jobcgroup.descendants([], str(tmp_path)) == set()
