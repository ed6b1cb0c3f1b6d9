"""The packages' wheel pins (packaging/wheels.txt) are the versions the test
suite runs: the .deb and .rpm are built from a throw-away build venv, not
from the development venv that `make install` made (issue 23 #2), so the
pins are written down and must not drift from what was tested."""
from __future__ import annotations

import importlib.metadata as m
from pathlib import Path

import pytest

PINS = Path(__file__).resolve().parents[2] / "packaging" / "wheels.txt"


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
    repo = Path(__file__).resolve().parents[2]
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
    spec = (Path(__file__).resolve().parents[2] / "packaging" / "rpm" / "slurm-gpu.spec").read_text()
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
