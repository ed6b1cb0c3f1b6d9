"""doctor: the config file that the plugstack line (and the hooks' lookup)
names must exist and load; --role login checks only what a login node needs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_gpu import config
from slurm_gpu import doctor as d
from slurm_gpu.commands.doctor import doctor
from paths import ROOT


@pytest.fixture(autouse=True)
def _default_elsewhere(tmp_path, monkeypatch):
    # this host's own /etc/slurm-gpu must not decide the tests
    monkeypatch.setattr(config, "DEFAULT_PATH", str(tmp_path / "etc-default.toml"))
    monkeypatch.delenv(config.ENV_VAR, raising=False)
    config.clear_cache()
    yield
    config.clear_cache()


def node(tmp_path: Path, plugin_args: str) -> Path:
    """slurm.conf and plugstack.conf naming a plugin built for this host's slurmd."""
    so = tmp_path / "slurm_gpu_spank.so"
    so.write_bytes(b"\x7fELF...slurm-gpu-spank built-for-slurm=24.11.5\0")
    (tmp_path / "slurm_gpu_spank_py.so").write_bytes(b"")
    (tmp_path / "plugstack.conf").write_text(f"required {so} {plugin_args}\n")
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"PlugStackConfig={tmp_path}/plugstack.conf\n")
    return conf


def config_lines(res) -> list[str]:
    return [l for l in res.output.splitlines() if " config:" in l]


def test_missing_named_config_is_one_critical_line(tmp_path):
    missing = tmp_path / "site.toml"
    conf = node(tmp_path, f"config={missing}")
    res = CliRunner().invoke(doctor, ["--no-gres", "--slurm-conf", str(conf)])
    assert res.exit_code == d.CRITICAL, res.output
    bad = [l for l in config_lines(res) if l.startswith("CRITICAL")]
    assert len(bad) == 1 and str(missing) in bad[0] and "not found" in bad[0], res.output


@pytest.mark.parametrize("text,want", [
    ("[mps\n", "bad config"),
    ("[mps]\ncontroll = '/x'\n", "unknown config key mps.controll"),
    ("[jobs]\non_internal_error = 'maybe'\n", "jobs.on_internal_error"),
    ("[repair]\nrma_failures = 0\n", "rma_failures"),
])
def test_config_that_does_not_load_is_critical(tmp_path, text, want):
    site = tmp_path / "site.toml"
    site.write_text(text)
    conf = node(tmp_path, f"config={site}")
    res = CliRunner().invoke(doctor, ["--no-gres", "--slurm-conf", str(conf)])
    bad = [l for l in config_lines(res) if l.startswith("CRITICAL")]
    assert res.exit_code == d.CRITICAL and len(bad) == 1, res.output
    assert str(site) in bad[0] and want in bad[0], bad


def test_a_fifo_or_directory_is_reported_without_blocking(tmp_path):
    import os
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    for bad in (fifo, tmp_path):
        conf = node(tmp_path, f"config={bad}")
        res = CliRunner().invoke(doctor, ["--no-gres", "--slurm-conf", str(conf)])
        crit = [l for l in config_lines(res) if l.startswith("CRITICAL")]
        assert len(crit) == 1 and "not a regular file" in crit[0] and str(bad) in crit[0], res.output


def test_missing_file_at_the_default_path_means_defaults(tmp_path):
    conf = node(tmp_path, f"config={config.DEFAULT_PATH}")
    res = CliRunner().invoke(doctor, ["--no-gres", "--json", "--slurm-conf", str(conf)])
    got = [x for x in json.loads(res.output)["findings"] if x["check"] == "config"]
    assert got and all(x["status"] == "OK" for x in got), got
    assert "default" in got[0]["message"]


def test_shipped_file_loads_and_unknown_section_warns(tmp_path, monkeypatch):
    site = tmp_path / "site.toml"
    monkeypatch.setenv(config.ENV_VAR, str(site))     # the hooks read the same file
    site.write_text((ROOT / "packaging/common/slurm-gpu.toml").read_text())
    conf = node(tmp_path, f"config={site}")
    res = CliRunner().invoke(doctor, ["--no-gres", "--slurm-conf", str(conf)])
    assert [l.split(":")[0] for l in config_lines(res)] == ["OK config"] * len(config_lines(res)), res.output
    site.write_text("[mpss]\ncontrol = '/x'\n")
    res = CliRunner().invoke(doctor, ["--no-gres", "--slurm-conf", str(conf)])
    assert any(l.startswith("WARNING config:") and "[mpss]" in l for l in config_lines(res)), res.output


def test_hooks_read_another_file_than_the_plugin(tmp_path, monkeypatch):
    site = tmp_path / "site.toml"
    site.write_text("")
    other = tmp_path / "other.toml"
    other.write_text("")
    monkeypatch.setenv(config.ENV_VAR, str(other))
    conf = node(tmp_path, f"config={site}")
    res = CliRunner().invoke(doctor, ["--no-gres", "--slurm-conf", str(conf)])
    warn = [l for l in config_lines(res) if l.startswith("WARNING")]
    assert len(warn) == 1 and str(site) in warn[0] and str(other) in warn[0], res.output


def test_login_role_checks_what_a_login_node_needs(tmp_path):
    site = tmp_path / "site.toml"
    site.write_text("")
    conf = node(tmp_path, f"config={site}")
    res = CliRunner().invoke(doctor, ["--role", "login", "--json", "--slurm-conf", str(conf)])
    checks = {x["check"] for x in json.loads(res.output)["findings"]}
    assert {"spank.plugstack", "spank.plugin", "config", "venv"} <= checks, res.output
    # no slurmd, prolog, health check, gres.conf or GPU driver on a login node
    assert not checks & {"slurm.prolog", "slurm.epilog", "slurm.prologflags", "slurm.healthcheck",
                         "gres.conf", "nvidia.persistenced"}, checks
    assert "UNKNOWN" not in {x["status"] for x in json.loads(res.output)["findings"]
                             if x["check"] != "spank.plugin" and x["check"] != "slurm.version"}
    # a missing config file is as critical there: srun and sbatch check the options
    conf = node(tmp_path, f"config={tmp_path / 'gone.toml'}")
    res = CliRunner().invoke(doctor, ["--role", "login", "--slurm-conf", str(conf)])
    assert res.exit_code == d.CRITICAL and any(l.startswith("CRITICAL config:") for l in res.output.splitlines())


def test_role_gpu_is_every_check(tmp_path):
    site = tmp_path / "site.toml"
    site.write_text("")
    conf = node(tmp_path, f"config={site}")
    res = CliRunner().invoke(doctor, ["--role", "gpu", "--no-gres", "--json", "--slurm-conf", str(conf)])
    checks = {x["check"] for x in json.loads(res.output)["findings"]}
    assert {"slurm.prolog", "slurm.healthcheck", "config", "spank.plugin", "nvidia.persistenced"} <= checks
    res = CliRunner().invoke(doctor, ["--role", "laptop", "--slurm-conf", str(conf)])
    assert res.exit_code == 2 and "laptop" in res.output
