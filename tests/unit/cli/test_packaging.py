"""The packages' wheel pins (packaging/wheels.txt) are the versions the test
suite runs: the .deb and .rpm are built from a throw-away build venv, not
from the development venv that `make install` made (issue 23 #2), so the
pins are written down and must not drift from what was tested."""
from __future__ import annotations

import importlib.metadata as m
from pathlib import Path

import pytest
from paths import ROOT

PINS = ROOT / "packaging" / "wheels.txt"


def pins() -> dict[str, str]:
    out = {}
    for line in PINS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            out[name] = version
    return out


def test_every_runtime_dependency_is_pinned_once():
    got = pins()
    assert set(got) == {"nvidia-ml-py", "click", "jinja2", "markupsafe", "cffi", "pycparser",
                        "clustershell", "pyyaml"}
    assert all(v and v[0].isdigit() for v in got.values()), got


@pytest.mark.parametrize("name", sorted(pins()))
def test_pin_is_what_the_tests_run(name):
    try:
        have = m.version(name)
    except m.PackageNotFoundError:
        pytest.skip(f"{name} is not installed here")
    assert pins()[name] == have, (f"packaging/wheels.txt pins {name}=={pins()[name]} but the tests "
                                  f"run {have}: update the pin (or the venv)")


def test_venv_setup_takes_the_package_s_defaults_beside_it(tmp_path: Path) -> None:
    """The .rpm's setup-defaults (python3.11, every wheel shipped) make the one
    documented rerun command work on EL, whose /usr/bin/python3 (3.9) pip
    refuses; the environment still wins, and no other key is read."""
    import shutil
    import subprocess
    repo = ROOT
    lib = tmp_path / "lib"
    lib.mkdir()
    shutil.copy(repo / "packaging" / "common" / "venv-setup.sh", lib / "venv-setup.sh")
    spec = (repo / "packaging" / "rpm" / "slurm-gpu.spec").read_text()
    assert "printf 'SLURM_GPU_PYTHON=/usr/bin/python3.11\\nSLURM_GPU_SYSTEM_SITE=0\\n'" in spec
    assert "%{buildroot}/usr/lib/slurm-gpu/setup-defaults" in spec
    calls = tmp_path / "calls"

    def stub(name: str) -> Path:
        p = tmp_path / name
        # records how it was called, then fails: the script stops there (set -e)
        p.write_text(f'#!/bin/sh\necho "{name} $*" >>{calls}\nexit 1\n')
        p.chmod(0o755)
        return p

    py311, other = stub("python3.11"), stub("other")
    (lib / "setup-defaults").write_text(f"SLURM_GPU_PYTHON={py311}\nSLURM_GPU_SYSTEM_SITE=0\n"
                                        f"SLURM_GPU_BASE={tmp_path}/evil\n")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_GPU_BASE": str(tmp_path / "base")}

    def run(**extra: str) -> str:
        calls.write_text("")
        subprocess.run(["sh", str(lib / "venv-setup.sh"), "/wheels"], env={**env, **extra},
                       capture_output=True, text=True, timeout=60)
        return calls.read_text()

    got = run()
    assert got.startswith(f"python3.11 -m venv {tmp_path}/base/venv-"), got
    assert "--system-site-packages" not in got                  # SLURM_GPU_SYSTEM_SITE=0
    assert not (tmp_path / "evil").exists()
    assert run(SLURM_GPU_PYTHON=str(other)).startswith("other -m venv ")
    assert "--system-site-packages" in run(SLURM_GPU_SYSTEM_SITE="1")
    (lib / "setup-defaults").unlink()                            # the .deb ships none
    assert run(SLURM_GPU_PYTHON=str(other)).startswith(f"other -m venv --system-site-packages {tmp_path}/base/")


def rpm_scriptlet(name: str) -> str:
    """The body of *name* (``%post``) in the spec, as rpm runs it: with
    /bin/sh and no ``-e`` (a failing command does not stop it)."""
    spec = (ROOT / "packaging" / "rpm" / "slurm-gpu.spec").read_text()
    body = spec.split(f"\n{name}\n", 1)[1]
    return body.split("\n%", 1)[0].replace("%%", "%") + "\n"


@pytest.mark.parametrize("count", ["1", "2"])       # rpm's $1: an install, an upgrade
def test_rpm_post_fails_when_the_venv_setup_keeps_the_old_tree(tmp_path: Path, count: str) -> None:
    """A failed plugin build over a live plugin (venv-setup.sh exits 1) must fail
    %post, so rpm says "scriptlet failed" as docs/install.md promises: rpm runs
    it without -e, and a later line's status was the scriptlet's (exit 0)."""
    import subprocess
    setup = tmp_path / "venv-setup.sh"
    setup.write_text("#!/bin/sh\necho 'slurm-gpu: SPANK plugin not built (...): the new venv was NOT put live' >&2\n"
                     "exit 1\n")
    setup.chmod(0o755)
    script = rpm_scriptlet("%post").replace("/usr/lib/slurm-gpu/venv-setup.sh", str(setup))
    script = script.replace("/usr/lib/slurm-gpu/", str(tmp_path / "lib") + "/")
    r = subprocess.run(["/bin/sh", "-s", count], input=script, capture_output=True, text=True, timeout=30,
                       env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    assert r.returncode != 0, r.stderr
    assert r.stderr.splitlines()[-1].startswith("slurm-gpu: not configured: "), r.stderr


def run_postinst(tmp_path: Path, setup_rc: int, enabled: str = "", active: str = "") -> tuple[int, str, str]:
    """packaging/debian/postinst configure on a systemd node, with stubs for
    venv-setup.sh (exit *setup_rc*), systemctl (*enabled*/*active*: the units
    it calls so) and deb-systemd-invoke, each recording its call."""
    import subprocess
    repo = ROOT
    calls = tmp_path / "calls"
    calls.write_text("")
    bin_ = tmp_path / "bin"
    bin_.mkdir()

    def stub(name: str, body: str) -> Path:
        p = bin_ / name
        p.write_text(f'#!/bin/sh\necho "{name} $*" >>{calls}\n{body}\n')
        p.chmod(0o755)
        return p
    setup = stub("venv-setup.sh", f"exit {setup_rc}")
    stub("systemctl", f'case "$*" in *is-enabled*{enabled or "none"}*) exit 0;; '
                      f'*is-active*{active or "none"}*) exit 0;; *is-*) exit 1;; esac')
    stub("deb-systemd-invoke", "exit 0")
    (tmp_path / "run-systemd").mkdir()
    script = ((repo / "packaging" / "debian" / "postinst").read_text()
              .replace("/usr/lib/slurm-gpu/venv-setup.sh", str(setup))
              .replace("/usr/lib/slurm-gpu/", f"{tmp_path}/lib/")
              .replace("/run/systemd/system", str(tmp_path / "run-systemd")))
    r = subprocess.run(["/bin/sh", "-s", "configure", "0.1.0-1"], input=script, capture_output=True, text=True,
                       timeout=30, env={"PATH": f"{bin_}:/usr/bin:/bin"})
    return r.returncode, calls.read_text(), r.stderr


def test_deb_postinst_reloads_systemd_even_when_the_new_tree_does_not_go_live(tmp_path: Path) -> None:
    # dpkg has unpacked the new unit files: systemd must read them, or it
    # runs the old ones and says "changed on disk" until someone reloads
    rc, calls, err = run_postinst(tmp_path, setup_rc=1, enabled="xid-watch")
    assert rc == 1 and err.splitlines()[-1].startswith("slurm-gpu: not configured: "), err
    assert "systemctl --system daemon-reload" in calls.splitlines()
    assert "deb-systemd-invoke" not in calls          # the units stay on the tree that stays live


@pytest.mark.parametrize(("enabled", "active", "want"), [
    ("xid-watch", "", ["deb-systemd-invoke restart slurm-gpu-xid-watch.service"]),   # enabled: as debhelper
    ("", "monitor", ["deb-systemd-invoke try-restart slurm-gpu-monitor.service"]),  # started by hand
    ("", "", []),                                                                    # neither: left alone
])
def test_deb_postinst_restarts_the_units_in_use_on_the_new_tree(tmp_path: Path, enabled: str, active: str,
                                                                want: list[str]) -> None:
    rc, calls, err = run_postinst(tmp_path, setup_rc=0, enabled=enabled, active=active)
    assert rc == 0, err
    assert [c for c in calls.splitlines() if c.startswith("deb-systemd-invoke")] == want


@pytest.mark.parametrize(("action", "stops"), [("upgrade", False), ("remove", True), ("deconfigure", True)])
def test_deb_prerm_leaves_the_units_running_through_an_upgrade(tmp_path: Path, action: str, stops: bool) -> None:
    # stopped here, an enabled xid-watch stayed stopped after every upgrade
    import subprocess
    repo = ROOT
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "systemctl").write_text(f'#!/bin/sh\necho "systemctl $*" >>{tmp_path}/calls\n')
    (bin_ / "systemctl").chmod(0o755)
    (tmp_path / "run-systemd").mkdir()
    script = (repo / "packaging" / "debian" / "prerm").read_text().replace("/run/systemd/system",
                                                                           str(tmp_path / "run-systemd"))
    r = subprocess.run(["/bin/sh", "-s", action, "0.1.1-1"], input=script, capture_output=True, text=True,
                       timeout=30, env={"PATH": f"{bin_}:/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    calls = (tmp_path / "calls").read_text() if (tmp_path / "calls").exists() else ""
    assert ("systemctl stop" in calls) == stops, calls
