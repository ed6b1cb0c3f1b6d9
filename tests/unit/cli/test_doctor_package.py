"""doctor's package checks: the interpreter a plugin starts still exists
(issue 23 #4), a venv setup that did not go live (#3), a venv someone but
root can change (issue 24 §5)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from slurm_gpu import __version__
from slurm_gpu import doctor as d


def plugin(tmp_path: Path, inner: bytes) -> str:
    lib = tmp_path / "lib"
    lib.mkdir(exist_ok=True)
    so = lib / "slurm_gpu_spank.so"
    so.write_bytes(b"\x7fELF...slurm-gpu-spank built-for-slurm=24.11.5\0...")
    (lib / "slurm_gpu_spank_py.so").write_bytes(b"\x7fELF\0" + inner + b"\0tail")
    return str(so)


def facts(so: str, **kw) -> d.Facts:
    base = dict(venv=sys.prefix, slurm_conf_path="/etc/slurm/slurm.conf", conf={}, conf_readable=True,
                slurmd_version="24.11.5", plugstack_lines=[("/etc/slurm/plugstack.conf", f"required {so}")],
                plugin_built_for={so: d.plugin_built_for(so)}, plugin_runs={so: d.plugin_runs(so)})
    base.update(kw)
    return d.Facts(**base)


def found(f: d.Facts, check: str) -> list[str]:
    return [x.line() for x in d.run_checks(f) if x.check == check]


def test_plugin_whose_tree_was_removed_is_critical(tmp_path):
    gone = "/opt/slurm-gpu/venv-20260101T000000.1-1/bin/python"
    so = plugin(tmp_path, b"slurm-gpu-spank-py python=" + gone.encode() + b" version=" + __version__.encode())
    assert d.plugin_runs(so) == (gone, __version__)
    got = found(facts(so), "spank.tree")
    assert got == [f"CRITICAL spank.tree: {so} starts {gone}, which no longer exists (an upgrade removed "
                   "that venv tree): every step with a --gpu-* option fails; slurm-gpu spank install"]
    assert d.worst(d.run_checks(facts(so))) == d.CRITICAL


def test_plugin_built_before_the_record_is_read_too(tmp_path):
    # what `spank install` copied before this change: SG_PYTHON compiled in, no record
    gone = "/opt/slurm-gpu/venv-20260101T000000.1-1/bin/python"
    so = plugin(tmp_path, b"/usr/lib/python3.11\0" + gone.encode())
    assert d.plugin_runs(so) == (gone, None)
    assert found(facts(so), "spank.tree")[0].startswith("CRITICAL spank.tree:")


def test_live_plugin_is_ok_and_a_stale_copy_is_not(tmp_path):
    so = plugin(tmp_path, b"slurm-gpu-spank-py python=" + sys.executable.encode() + b" version="
                + __version__.encode())
    assert found(facts(so), "spank.tree") == [f"OK spank.tree: {so} starts {sys.executable}"]
    so = plugin(tmp_path, b"slurm-gpu-spank-py python=" + sys.executable.encode() + b" version=0.0.1")
    assert found(facts(so), "spank.tree")[0].startswith(
        f"CRITICAL spank.tree: {so} was built by slurm-gpu 0.0.1, the venv runs {__version__}")


def test_setup_that_kept_the_old_tree_is_reported(tmp_path):
    tree = tmp_path / "venv-B"
    tree.mkdir()
    (tmp_path / "venv").symlink_to("venv-B")
    assert d.setup_failed(str(tree)) is None
    (tmp_path / "setup-failed").write_text("slurm-gpu: SPANK plugin not built (x);\n the new venv was not put live\n")
    assert d.setup_failed(str(tree)) == "slurm-gpu: SPANK plugin not built (x); the new venv was not put live"
    # a plain venv (make install) has no such record, whatever lies beside it
    assert d.setup_failed(str(tmp_path / "elsewhere")) is None
    so = plugin(tmp_path, b"")
    f = facts(so, setup_failed=d.setup_failed(str(tree)))
    assert found(f, "package.setup") == ["CRITICAL package.setup: the last upgrade did not go live: "
                                         "slurm-gpu: SPANK plugin not built (x); the new venv was not put live"]


def test_venv_writable_by_others_is_found(tmp_path):
    os.chmod(tmp_path, 0o755)
    tree = tmp_path / "venv-A"
    (tree / "lib").mkdir(parents=True, mode=0o755)
    (tree / "lib" / "x.py").write_text("")
    (tmp_path / "venv").symlink_to("venv-A")
    assert d.first_writable(str(tmp_path / "venv")) is None
    os.chmod(tree / "lib" / "x.py", 0o664)
    assert d.first_writable(str(tmp_path / "venv")) == f"{tree}/lib/x.py (mode 0664)"
    os.chmod(tree / "lib" / "x.py", 0o644)
    os.chown(tree / "lib", 1000, 0)
    assert d.first_writable(str(tmp_path / "venv")) == f"{tree}/lib (owner uid 1000)"
    os.chown(tree / "lib", 0, 0)
    os.chmod(tmp_path, 0o775)          # the directory holding the link: the link can be replaced
    assert d.first_writable(str(tmp_path / "venv")) == f"{tmp_path} (mode 0775)"
    so = plugin(tmp_path, b"")
    assert found(facts(so, venv_writable=f"{tmp_path} (mode 0775)"), "venv.owner")[0].startswith(
        f"CRITICAL venv.owner: {tmp_path} (mode 0775) can be changed by someone but root")


def test_plugin_of_another_tree_that_still_exists_is_a_warning(tmp_path):
    # a copy `spank install` made before this change, one upgrade later: its tree is
    # still there (kept one upgrade back), the next upgrade removes it
    old = tmp_path / "venv-OLD"
    (old / "bin").mkdir(parents=True)
    (old / "bin" / "python").write_text("")
    so = plugin(tmp_path, b"slurm-gpu-spank-py python=" + str(old / "bin" / "python").encode()
                + b" version=" + __version__.encode())
    got = found(facts(so), "spank.tree")
    assert got == [f"WARNING spank.tree: {so} starts {old}/bin/python, not this venv's ({sys.prefix}): an "
                   "upgrade removes a tree it does not run from; slurm-gpu spank install"]
    # started through the venv link of this very tree: fine
    (tmp_path / "venv").symlink_to(sys.prefix)
    so = plugin(tmp_path, b"slurm-gpu-spank-py python=" + str(tmp_path / "venv" / "bin" / "python").encode()
                + b" version=" + __version__.encode())
    assert found(facts(so), "spank.tree")[0].startswith("OK spank.tree:")


def unit(enabled: str, active: str, reload: str = "no") -> dict[str, str]:
    return {"LoadState": "loaded", "UnitFileState": enabled, "ActiveState": active, "NeedDaemonReload": reload}


def test_an_enabled_xid_watch_that_is_not_running_is_a_warning(tmp_path):
    # what an upgrade did: prerm stopped it, postinst never started it again
    so = plugin(tmp_path, b"slurm-gpu-spank-py python=" + sys.executable.encode())
    got = found(facts(so, units={d.XID_WATCH: unit("enabled", "inactive")}), "systemd.units")
    assert got == ["WARNING systemd.units: slurm-gpu-xid-watch.service is enabled but inactive: NVML events "
                   "between two health checks are lost (systemctl restart slurm-gpu-xid-watch)"]
    assert found(facts(so, units={d.XID_WATCH: unit("enabled", "active")}), "systemd.units") == [
        "OK systemd.units: slurm-gpu-xid-watch.service enabled, active"]
    assert found(facts(so, units={d.XID_WATCH: unit("disabled", "inactive")}), "systemd.units") == [
        "OK systemd.units: slurm-gpu-xid-watch.service disabled, inactive"]
    assert found(facts(so), "systemd.units") == []          # no systemd: not gathered


def test_a_unit_file_changed_under_systemd_or_failed_is_a_warning(tmp_path):
    so = plugin(tmp_path, b"slurm-gpu-spank-py python=" + sys.executable.encode())
    got = found(facts(so, units={"slurm-gpu-monitor.service": unit("disabled", "failed", reload="yes"),
                                 d.XID_WATCH: unit("disabled", "inactive")}), "systemd.units")
    assert got == ["WARNING systemd.units: slurm-gpu-monitor.service changed on disk since systemd loaded it: "
                   "systemctl daemon-reload",
                   "WARNING systemd.units: slurm-gpu-monitor.service failed (journalctl -u "
                   "slurm-gpu-monitor.service; systemctl restart slurm-gpu-monitor.service)"]


def test_gather_units_asks_systemctl_for_the_packages_units_it_knows():
    asked = []

    def run(argv, timeout):
        asked.append(argv[2])
        if argv[2] == d.XID_WATCH:
            return 0, "LoadState=loaded\nUnitFileState=enabled\nActiveState=active\nNeedDaemonReload=no\n"
        return 0, "LoadState=not-found\nUnitFileState=\nActiveState=inactive\n"   # package removed
    assert d.gather_units(run) == {d.XID_WATCH: unit("enabled", "active")}
    assert asked == list(d.UNITS)
