"""Finding the installed Slurm (libslurm's soname = its major, spank.h, its
plugin directory) in every layout a node has, and the packages that use it.

Layouts from each vendor's packaging: Debian's slurm-wlm (libslurmNN,
libslurm-dev; the real Debian 12 host and the trixie/sid roots below),
SchedMD's slurm-smd .debs (SchedMD/slurm debian/rules, slurm-26-05-3-1:
libslurm.so.NN in /usr/lib/<triplet>, libslurmfull.so and plugins in
/usr/lib/<triplet>/slurm, headers in slurm-smd-dev), EL (slurm.spec:
/usr/lib64, /usr/lib64/slurm, slurm-devel) and a source build under a prefix.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from slurm_gpu import doctor, slurminstall
from slurm_gpu.slurminstall import SlurmInstall, check, find, include_dir
from paths import ROOT

REPO = ROOT
T = "x86_64-linux-gnu"


def tree(tmp: Path, files: list[str]) -> str:
    for f in files:
        (tmp / f.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (tmp / f.lstrip("/")).write_bytes(b"")
    return str(tmp)


DEBIAN = [f"/usr/lib/{T}/libslurm.so.42.0.0", f"/usr/lib/{T}/libslurm.so.42",
          f"/usr/lib/{T}/slurm-wlm/proctrack_cgroup.so", f"/usr/lib/{T}/slurm-wlm/task_cgroup.so",
          "/usr/include/slurm/spank.h"]
SMD = [f"/usr/lib/{T}/libslurm.so.45.0.0", f"/usr/lib/{T}/libslurm.so.45", f"/usr/lib/{T}/libslurm.so",
       f"/usr/lib/{T}/slurm/libslurmfull.so", f"/usr/lib/{T}/slurm/auth_munge.so",
       f"/usr/lib/{T}/slurm/task_cgroup.so", "/usr/include/slurm/spank.h", "/usr/include/slurm/slurm.h"]
EL = ["/usr/lib64/libslurm.so.42", "/usr/lib64/libslurm.so.42.0.0", "/usr/lib64/slurm/proctrack_cgroup.so"]
PREFIX = ["/opt/slurm/lib/libslurm.so.45", "/opt/slurm/lib/slurm/task_affinity.so",
          "/opt/slurm/include/slurm/spank.h"]


@pytest.mark.parametrize("files, want", [
    (DEBIAN, SlurmInstall("debian", f"/usr/lib/{T}/libslurm.so.42", 42, "/usr/include", f"/usr/lib/{T}/slurm-wlm")),
    (SMD, SlurmInstall("schedmd", f"/usr/lib/{T}/libslurm.so.45", 45, "/usr/include", f"/usr/lib/{T}/slurm")),
    (EL, SlurmInstall("el", "/usr/lib64/libslurm.so.42", 42, None, "/usr/lib64/slurm")),
    (PREFIX, SlurmInstall("prefix", "/opt/slurm/lib/libslurm.so.45", 45, "/opt/slurm/include", "/opt/slurm/lib/slurm")),
    # an upgrade that left the old soname beside the new: the newest counts
    (DEBIAN + [f"/usr/lib/{T}/libslurm.so.38"], SlurmInstall("debian", f"/usr/lib/{T}/libslurm.so.42", 42,
                                                              "/usr/include", f"/usr/lib/{T}/slurm-wlm")),
    ([], None),
])
def test_every_layout(tmp_path: Path, files: list[str], want: SlurmInstall | None) -> None:
    assert find(tree(tmp_path, files)) == want


def test_release_is_the_soname_one_to_one() -> None:
    assert [SlurmInstall("x", "", api, None, None).release for api in (38, 42, 45, 99)] == \
        ["22.05", "24.11", "26.05", None]


@pytest.mark.parametrize("root, api", [("/", 38), ("/var/cache/slurm-gpu/trixie-root", 42),
                                       ("/var/cache/slurm-gpu/sid-root", 45)])
def test_real_debian_installs(root: str, api: int) -> None:
    """Debian 12's own Slurm (this host) and the 24.11/26.05 roots, where built."""
    if not os.path.exists(os.path.join(root, "usr/sbin/slurmd")):
        pytest.skip(f"no Slurm under {root}")
    inst = find(root)
    assert inst is not None and inst.api == api and inst.layout == "debian"
    assert inst.plugin_dir == f"/usr/lib/{T}/slurm-wlm" and inst.include_dir == "/usr/include"


def plugin(path: Path, version: str | None) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF" + (b"slurm-gpu-spank built-for-slurm=" + version.encode() + b"\0"
                                   if version else b"") + b"tail")
    return str(path)


def test_check_compares_the_plugins_record_with_the_soname(tmp_path: Path) -> None:
    root = tree(tmp_path / "r", SMD)
    assert check(plugin(tmp_path / "a.so", "26.05.3"), root)[0] == 0
    rc, line = check(plugin(tmp_path / "b.so", "24.11.5"), root)
    assert rc == 1 and "built for Slurm 24.11.5 but the installed Slurm is 26.05" in line
    assert check(plugin(tmp_path / "c.so", None), root)[0] == 1            # an older slurm-gpu's
    assert check(str(tmp_path / "none.so"), root)[0] == 1                  # spank.h is here: build one
    no_dev = tree(tmp_path / "e", EL)
    rc, line = check(str(tmp_path / "none.so"), no_dev)
    assert rc == 3 and "slurm-smd-dev" in line
    assert check(plugin(tmp_path / "d.so", "26.05.3"), str(tmp_path / "empty"))[0] == 3


def test_check_cli_one_line_and_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert slurminstall.main(["check"]) == 2
    assert slurminstall.main(["check", str(tmp_path / "x.so")]) in (1, 3)
    assert len(capsys.readouterr().err.strip().splitlines()) == 2


def test_include_dir_falls_back_to_a_prefix(tmp_path: Path) -> None:
    assert include_dir(tree(tmp_path / "a", PREFIX)) == "/opt/slurm/include"
    assert include_dir(tree(tmp_path / "b", EL)) is None


def test_doctor_names_the_command_that_rebuilds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package's venv: the package's own setup, as recorded by venv-setup.sh;
    a plain venv: spank build (with -o for a copy elsewhere, --include-dir for a prefix Slurm)."""
    base = tmp_path / "opt"
    tree_ = base / "venv-20261128T000000.1-1"
    (tree_ / "lib" / "slurm-gpu").mkdir(parents=True)
    os.symlink(tree_.name, base / "venv")
    so = str(tree_ / "lib" / "slurm-gpu" / "slurm_gpu_spank.so")
    cmd = "SLURM_GPU_PYTHON=/usr/bin/python3.11 /usr/lib/slurm-gpu/venv-setup.sh /usr/share/slurm-gpu/wheels"
    (base / "setup-command").write_text(cmd + "\n")
    assert doctor.rebuild_command(so, str(tree_)) == cmd
    monkeypatch.setattr(slurminstall, "include_dir", lambda root="/": "/opt/slurm/include")
    assert doctor.rebuild_command("/etc/slurm/spank/slurm_gpu_spank.so", str(tree_)) == \
        "slurm-gpu spank build -o /etc/slurm/spank/slurm_gpu_spank.so --include-dir /opt/slurm/include"
    plain = tmp_path / "venv"
    assert doctor.rebuild_command(str(plain / "lib" / "slurm-gpu" / "slurm_gpu_spank.so"), str(plain)) == \
        "slurm-gpu spank build --include-dir /opt/slurm/include"


def test_doctor_refuses_a_plugin_of_another_major_with_that_command(tmp_path: Path) -> None:
    so = plugin(tmp_path / "lib" / "slurm_gpu_spank.so", "24.11.5")
    (tmp_path / "lib" / "slurm_gpu_spank_py.so").write_bytes(b"")
    cmd = "/usr/lib/slurm-gpu/venv-setup.sh /usr/share/slurm-gpu/wheels"
    f = doctor.Facts("/etc/slurm/slurm.conf", {}, True, "26.05.5", [("p", f"required {so}")],
                     {so: doctor.plugin_built_for(so)}, rebuild=cmd)
    found = [x for x in doctor.check_plugin(f) if x.check == "spank.plugin"]
    assert found[0].line() == (f"CRITICAL spank.plugin: built for Slurm 24.11.5 but slurmd is 26.05.5: Slurm "
                               f"will refuse it; rebuild it ({cmd}) ({so})")


# -- the packages ----------------------------------------------------------------------------
def control_field(name: str) -> list[list[str]]:
    text = (REPO / "packaging" / "debian" / "control.in").read_text()
    m = re.search(rf"^{name}: (.*)$", text, re.M)
    assert m, name
    return [[a.split()[0] for a in dep.split("|")] for dep in m.group(1).split(",")]


def test_deb_accepts_debians_and_schedmds_slurm() -> None:
    rec = control_field("Recommends")
    for debian, smd in (("slurmd", "slurm-smd-slurmd"), ("slurm-client", "slurm-smd-client"),
                        ("libslurm-dev", "slurm-smd-dev")):
        assert [debian, smd] in rec, rec
    assert not any("slurm" in a for dep in control_field("Depends") for a in dep)   # no Slurm hard dependency


def test_deb_trigger_watches_every_layout_discovery_knows() -> None:
    """The trigger's paths are the headers and each .deb layout's plugin directory
    (Debian's slurm-wlm, SchedMD's slurm), for every architecture discovery reads."""
    lines = [l.split() for l in (REPO / "packaging" / "debian" / "triggers").read_text().splitlines()
             if l.strip() and not l.startswith("#")]
    assert all(l[0] == "interest-noawait" and len(l) == 2 for l in lines)
    paths = {l[1] for l in lines}
    want = {"/usr/include/slurm/spank.h"} | {f"/usr/lib/{t}/{d}" for t in slurminstall.TRIPLETS[:2]
                                               for d in ("slurm-wlm", "slurm")}
    assert paths == want
    build = (REPO / "scripts" / "build-deb.sh").read_text()
    assert 'packaging/debian/triggers" "$root/DEBIAN/triggers"' in build
    postinst = (REPO / "packaging" / "debian" / "postinst").read_text()
    assert "triggered)" in postinst and "slurm_gpu.slurminstall check" in postinst


def test_rpm_file_trigger_and_removal() -> None:
    spec = (REPO / "packaging" / "rpm" / "slurm-gpu.spec").read_text()
    assert "%transfiletriggerin -- /usr/include/slurm /usr/lib64/slurm" in spec
    for text in (spec, (REPO / "packaging" / "debian" / "postrm").read_text()):
        assert "/opt/slurm-gpu/setup-command" in text        # what venv-setup.sh writes goes on removal
    setup = (REPO / "packaging" / "common" / "venv-setup.sh").read_text()
    assert '"$BASE/setup-command"' in setup


def test_a_missing_spank_h_names_every_vendors_dev_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_gpu.commands.spank import build_plugin
    from slurm_gpu.errors import SlurmGpuError
    with pytest.raises(SlurmGpuError, match="libslurm-dev .*slurm-smd-dev .*slurm-devel"):
        build_plugin(tmp_path / "x.so", include_dir=str(tmp_path))
