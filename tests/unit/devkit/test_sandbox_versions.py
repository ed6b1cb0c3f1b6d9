"""Which Slurm a sandbox runs (``sandbox up --slurm``), and the chroot plumbing's pure parts."""
from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gpu.errors import UsageError
from slurm_gpu_devkit.sandbox import chroot, versions
from slurm_gpu_devkit.sandbox.layout import Layout


@pytest.fixture
def host_2205(monkeypatch):
    monkeypatch.setattr(versions, "host_version", lambda: "22.05.8")


def test_unsupported_version_names_the_ones_it_can_run(host_2205):
    with pytest.raises(UsageError) as e:
        versions.resolve("23.02")
    assert e.value.what == "cannot run Slurm 23.02: this sandbox runs 22.05 (host), 24.11, 26.05"
    with pytest.raises(UsageError):
        versions.resolve("latest")


def test_versions_map_to_host_or_suite(host_2205):
    assert versions.resolve(None) == versions.SlurmRelease("22.05", None, None, "22.05.8")
    assert versions.resolve("22.05").chrooted is False
    assert versions.resolve("24.11") == versions.SlurmRelease("24.11", "trixie")
    assert versions.resolve("26.05.5").suite == "sid"


def test_a_root_holding_another_release_is_refused(tmp_path, host_2205, monkeypatch):
    from slurm_gpu import runner
    from slurm_gpu.errors import SlurmGpuError
    root = tmp_path / "sid-root"
    root.mkdir()
    (root / ".slurm-version").write_text("slurm-wlm 26.11.0\n")
    monkeypatch.setattr(runner, "run", lambda *a, **k: runner.Completed(tuple(a[0]), 0, f"{root}\n", ""))
    with pytest.raises(SlurmGpuError, match="the sid root holds Slurm 26.11.0, not 26.05"):
        versions.ensure_root(versions.resolve("26.05"))


def test_namespace_script_binds_each_path_once_and_quotes(tmp_path, monkeypatch):
    root = tmp_path / "root"
    sb = tmp_path / "my sandbox"
    sb.mkdir()
    ran: list[list[str]] = []
    monkeypatch.setattr(chroot, "run", lambda argv, **kw: ran.append(list(argv)))

    def script(binds: list[str]) -> str:
        """The sh text run_in_root runs in its fresh mount namespace."""
        chroot.run_in_root(root, ["/bin/true"], 5, binds=binds)
        argv = ran.pop()
        assert argv[:4] == ["unshare", "--mount", "--propagation", "private"] and argv[-3:-1] == ["/bin/sh", "-c"]
        return argv[-1]

    text = script(["/tmp", "/tmp/x", str(sb)])
    assert text.count("mount --bind /tmp ") == 1      # what /tmp shows is not bound again
    assert "/tmp/x" not in text and str(sb) not in text
    text = script([str(sb)])
    assert f"mount --bind '{sb}' '{root}{sb}'" in text   # a path with a space stays one word
    assert text.rstrip().endswith(f"exec chroot {root} /bin/true")
    holder = chroot.holder_argv(root, Layout.of(sb))
    assert holder[:4] == ["unshare", "--mount", "--propagation", "private"]
    assert "exec chroot" not in holder[-1] and "exec sleep infinity" in holder[-1]


def test_enter_drops_to_the_user_inside_the_root():
    from slurm_gpu.runner import RunAs
    argv = chroot.enter(42, Path("/r"), "/home/u", RunAs(1001, 1001, (1001, 27)))
    assert argv[:5] == ["nsenter", "--target=42", "--mount", "--root", "--"]
    assert "--userspec=1001:1001" in argv and "--groups=1001,27" in argv
    assert argv[-3:] == ["-c", chroot.CD_EXEC, "/home/u"]


def test_client_wrappers_refuse_job_users(tmp_path):
    lay = Layout.of(tmp_path)
    lay.run.mkdir()
    made = list(chroot.write_clients(lay, Path("/r"), "24.11"))
    assert {p.name for p in made} >= {"srun", "sbatch", "scontrol", "sinfo"}
    text = (lay.bin / "srun").read_text()
    assert "clients run as root" in text and "/usr/bin/srun" in text and "nsenter" in text
