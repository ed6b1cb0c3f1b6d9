from __future__ import annotations

from dataclasses import dataclass

import pytest

from slurm_gpu import config
from slurm_gpu.errors import InputError
from paths import ROOT


@dataclass(frozen=True)
class Demo:
    timeout: float = 20.0
    name: str = "x"
    enabled: bool = True


def _write(tmp_path, text: str, monkeypatch):
    p = tmp_path / "slurm-gpu.toml"
    p.write_text(text)
    monkeypatch.setenv(config.ENV_VAR, str(p))
    config.clear_cache()
    return p


def test_a_file_is_read_once_until_the_cache_is_cleared(monkeypatch, tmp_path) -> None:
    p = _write(tmp_path, "[demo]\ntimeout = 5\n", monkeypatch)
    assert config.section(Demo, "demo") == Demo(timeout=5.0)
    p.write_text("[demo]\ntimeout = 7\n")
    assert config.section(Demo, "demo") == Demo(timeout=5.0)     # parsed once per process
    config.clear_cache()
    assert config.section(Demo, "demo") == Demo(timeout=7.0)
    config.clear_cache()


def test_defaults_without_file(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(config.ENV_VAR, raising=False)
    assert config.section(Demo, "demo", raw={}) == Demo()


def test_values_and_int_to_float(monkeypatch, tmp_path) -> None:
    _write(tmp_path, "[demo]\ntimeout = 5\nname = 'y'\n", monkeypatch)
    assert config.section(Demo, "demo") == Demo(timeout=5.0, name="y")


def test_unknown_key_is_an_error(monkeypatch, tmp_path) -> None:
    p = _write(tmp_path, "[demo]\ntimout = 5\n", monkeypatch)
    with pytest.raises(InputError) as ei:
        config.section(Demo, "demo")
    assert "unknown config key demo.timout" in ei.value.line()
    assert str(p) in ei.value.line()


def test_wrong_type_is_an_error(monkeypatch, tmp_path) -> None:
    _write(tmp_path, "[demo]\nenabled = 'yes'\n", monkeypatch)
    with pytest.raises(InputError, match="demo.enabled must be bool"):
        config.section(Demo, "demo")


def test_bad_toml_names_the_file(monkeypatch, tmp_path) -> None:
    p = _write(tmp_path, "[demo\n", monkeypatch)
    with pytest.raises(InputError) as ei:
        config.load_raw()
    assert ei.value.line().startswith("slurm-gpu: bad config") and str(p) in ei.value.line()


def test_use_config_wins_over_environment_without_putenv(monkeypatch, tmp_path) -> None:
    env_file = tmp_path / "env.toml"
    env_file.write_text("[demo]\nname = 'env'\n")
    mine = tmp_path / "mine.toml"
    mine.write_text("[demo]\nname = 'mine'\n")
    monkeypatch.setenv(config.ENV_VAR, str(env_file))
    try:
        config.use_config(str(mine))
        assert config.config_path() == mine
        assert config.section(Demo, "demo").name == "mine"
        import os
        assert os.environ[config.ENV_VAR] == str(env_file)   # the environment is untouched
    finally:
        config.use_config(None)
    assert config.config_path() == env_file


def test_use_node_name_wins_over_environment(monkeypatch) -> None:
    from slurm_gpu.hw import live
    monkeypatch.setenv("SLURMD_NODENAME", "from-env")
    try:
        live.use_node_name("n7")
        assert live.node_name() == "n7"
    finally:
        live.use_node_name(None)
    assert live.node_name() == "from-env"


def test_named_default_path_that_is_missing_means_defaults(monkeypatch, tmp_path) -> None:
    # install.md's plugstack line names the default path; a node without the
    # file (deleted, or installed from a checkout) must get the defaults, not
    # fail every --gpu-profile/--gpu-mps/--gpu-mig step with "config file not found"
    missing = tmp_path / "etc" / "slurm-gpu.toml"
    monkeypatch.setattr(config, "DEFAULT_PATH", str(missing))
    config.clear_cache()
    config.use_config(str(missing))
    try:
        assert config.load_raw() == {}
        assert config.section(Demo, "demo") == Demo()
        # any other named file that is missing stays an error naming it
        other = tmp_path / "site.toml"
        config.use_config(str(other))
        with pytest.raises(InputError) as ei:
            config.load_raw()
        assert ei.value.line() == f"slurm-gpu: config file not found ({other})"
    finally:
        config.use_config(None)
        config.clear_cache()


def test_install_guide_plugstack_names_the_default_path() -> None:

    from slurm_gpu import joboptions
    guide = (ROOT / "docs" / "install.md").read_text()
    line = next(l for l in guide.splitlines() if l.startswith("required ") and "slurm_gpu_spank.so" in l)
    assert joboptions.parse_plugstack_args(line.split()[2:]).config == config.DEFAULT_PATH
