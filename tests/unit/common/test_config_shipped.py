"""The shipped /etc/slurm-gpu/slurm-gpu.toml (packaging/common/slurm-gpu.toml)
lists every key of every section at the code's default, and reads as defaults."""
from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from slurm_gpu import config, config_sections
from paths import ROOT

REPO = ROOT
SHIPPED = REPO / "packaging" / "common" / "slurm-gpu.toml"


def test_every_key_is_listed_at_its_default() -> None:
    text = SHIPPED.read_text()
    uncommented = re.sub(r"(?m)^# ([a-z_]+ = )", r"\1", text)
    assert tomllib.loads(uncommented) == config_sections.defaults()


def test_as_shipped_it_is_all_defaults_and_valid() -> None:
    raw = tomllib.loads(SHIPPED.read_text())
    assert raw == {name: {} for name in config_sections.SECTIONS}
    assert config_sections.validate(str(SHIPPED)) == []


def test_every_section_the_code_reads_is_registered() -> None:
    # config.section(Cls, "name"...) anywhere in the package: a new section
    # must be added to config_sections.SECTIONS, hence to the shipped file
    read = set()
    for py in (REPO / "slurm_gpu").rglob("*.py"):
        read |= set(re.findall(r'section\(\s*(\w+)\s*,\s*"(\w+)"', py.read_text()))
    assert read, "the pattern found nothing"
    registered = {(ref.split(":")[1], name) for name, (ref, _) in config_sections.SECTIONS.items()}
    assert read <= registered, read - registered


def test_the_sh_hooks_read_it_as_accounting_off(tmp_path: Path) -> None:
    # the prolog/epilog read [acct] enabled with sh builtins: a comment line
    # must not switch accounting on
    marker = tmp_path / "python-started"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\n")
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "SLURM_GPU_CONFIG": str(SHIPPED), "SLURM_GPU_PYTHON": str(fake),
           "SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0", "SLURMD_NODENAME": "n1"}
    for hook in ("prolog.d", "epilog.d"):
        for script in sorted((REPO / hook).iterdir()):
            if "acct" in script.name:
                res = subprocess.run(["/bin/sh", str(script)], env=env, capture_output=True, timeout=30)
                assert res.returncode == 0 and not marker.exists(), (script, res.stderr)


def test_validate_reports_a_bad_file_and_unknown_sections(tmp_path: Path) -> None:
    import pytest

    from slurm_gpu.errors import InputError
    p = tmp_path / "c.toml"
    p.write_text("[mpss]\ncontrol = '/x'\n")
    assert config_sections.validate(str(p)) == ["mpss"]
    p.write_text("[mps]\ncontroll = '/x'\n")
    with pytest.raises(InputError) as ei:
        config_sections.validate(str(p))
    assert "unknown config key mps.controll" in ei.value.line()
    assert config.hostctx.config_file is None       # the process's own config is put back
