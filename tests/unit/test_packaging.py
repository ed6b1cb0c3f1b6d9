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
