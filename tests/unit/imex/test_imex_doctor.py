"""doctor's imex.* checks: per-job IMEX needs a publish dir, the binaries, no
boot-time node-wide daemon, authenticated peers, and enough channels."""
from __future__ import annotations

from pathlib import Path

from slurm_gpu import config
from slurm_gpu.imex import doctor as d


def _facts(tmp: Path, monkeypatch, toml: str, slurm_conf: str, units: bool = False,
           base: str | None = None) -> d.ImexFacts:
    exe = tmp / "nvidia-imex"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    cfg = tmp / "sg.toml"
    cfg.write_text(toml.replace("EXE", str(exe)).replace("BASE", str(tmp / "imex.cfg")))
    if base is not None:
        (tmp / "imex.cfg").write_text(base)
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    config.clear_cache()
    if units:
        w = tmp / "root" / "etc" / "systemd" / "system" / "multi-user.target.wants"
        w.mkdir(parents=True)
        (w / "nvidia-imex.service").symlink_to("/lib/systemd/system/nvidia-imex.service")
    sc = tmp / "slurm.conf"
    sc.write_text(slurm_conf)
    from slurm_gpu.doctor import parse_slurm_conf
    return d.gather(parse_slurm_conf(slurm_conf, tmp), str(sc), systemd_root=str(tmp / "root"))


PER_JOB = '[imex]\nmode = "per-job"\ndaemon = "EXE"\nctl = "EXE"\nbase_config = "BASE"\n'


def test_off_is_one_ok_line(tmp_path, monkeypatch) -> None:
    f = _facts(tmp_path, monkeypatch, "", "")
    assert [c[:2] for c in d.check(f)] == [(d.OK, "imex.mode")]


def test_per_job_findings(tmp_path, monkeypatch) -> None:
    f = _facts(tmp_path, monkeypatch, PER_JOB, "SwitchType=switch/nvidia_imex\n"
               "SwitchParameters=imex_channel_count=2\nNodeName=gb[01-18] CPUs=144\n", units=True)
    got = {name: (status, msg) for status, name, msg in d.check(f)}
    assert got["imex.domains"][0] == d.CRITICAL and "publish_dir" in got["imex.domains"][1]
    assert got["imex.unit"][0] == d.CRITICAL and "enabled at boot" in got["imex.unit"][1]
    assert got["imex.auth"][0] == d.WARNING and "(absent)" in got["imex.auth"][1]
    assert got["imex.channels"] == (d.WARNING, "imex_channel_count=2 is below the 18 nodes slurm.conf "
                                    "names: with one job per node the channels run out (Slurm 25.11+ "
                                    "pends the next job, older releases fail it)")
    # root's binary in a tmp dir is fine when this test runs as root; either way it is named
    assert "imex.binaries" in got


def test_per_job_clean(tmp_path, monkeypatch) -> None:
    toml = PER_JOB + '[cluster]\npublish_dir = "/shared/models"\n'
    f = _facts(tmp_path, monkeypatch, toml, "NodeName=gb[01-18] CPUs=144\n",
               base="IMEX_ENABLE_AUTH_ENCRYPTION=1\nIMEX_AUTH_ENCRYPTION_MODE=SSL_TLS\nIMEX_AUTH_SOURCE=FILE\n")
    got = {name: status for status, name, _ in d.check(f)}
    assert got["imex.unit"] == got["imex.auth"] == got["imex.channels"] == d.OK
    assert "imex.domains" not in got


def test_auth_on_with_a_mode_imex_refuses_is_critical(tmp_path, monkeypatch) -> None:
    f = _facts(tmp_path, monkeypatch, PER_JOB, "", base="IMEX_ENABLE_AUTH_ENCRYPTION=1\nIMEX_AUTH_ENCRYPTION_MODE=SSL_TLS\n")
    got = {name: (status, msg) for status, name, msg in d.check(f)}
    assert got["imex.auth"][0] == d.CRITICAL and "IMEX_AUTH_SOURCE=''" in got["imex.auth"][1]


def _sysctl(tmp: Path, port_range: str, reserved: str) -> str:
    d = tmp / "sys" / "net" / "ipv4"
    d.mkdir(parents=True)
    (d / "ip_local_port_range").write_text(port_range)
    (d / "ip_local_reserved_ports").write_text(reserved)
    return str(tmp / "sys")


def test_ports_in_the_ephemeral_range_are_named_with_the_sysctl_that_reserves_them(tmp_path, monkeypatch) -> None:
    # Linux's default ephemeral range (32768-60999) covers the default job ports
    # 33792-49791 and the command port 50005 (NVIDIA's default IMEX_CMD_PORT).
    f = _facts(tmp_path, monkeypatch, PER_JOB, "")
    f2 = d.gather({}, str(tmp_path / "slurm.conf"), str(tmp_path / "root"),
                  sysctl_root=_sysctl(tmp_path, "32768\t60999\n", "33792-40000,50005\n"))
    assert f2.ephemeral == (32768, 60999) and f2.reserved == [(33792, 40000), (50005, 50005)]
    got = {name: (status, msg) for status, name, msg in d.check(f2)}
    status, msg = got["imex.ports"]
    assert status == d.WARNING
    assert "IMEX ports 40001-49791 lie in the ephemeral range 32768-60999" in msg
    assert "sysctl net.ipv4.ip_local_reserved_ports=40001-49791" in msg
    assert f.settings["port_base"] == 33792


def test_reserved_or_outside_ports_are_ok_and_an_unreadable_range_unknown(tmp_path, monkeypatch) -> None:
    _facts(tmp_path, monkeypatch, PER_JOB, "")
    f = d.gather({}, str(tmp_path / "slurm.conf"), str(tmp_path / "root"),
                 sysctl_root=_sysctl(tmp_path, "32768 60999", "33792-49791,50005"))
    assert {n: st for st, n, _ in d.check(f)}["imex.ports"] == d.OK
    f.ephemeral = (51000, 60999)
    f.reserved = []
    assert {n: st for st, n, _ in d.check(f)}["imex.ports"] == d.OK
    f.ephemeral = None
    assert {n: st for st, n, _ in d.check(f)}["imex.ports"] == d.UNKNOWN


def test_reserved_ports_syntax() -> None:
    assert d.port_ranges("8080,9148-9150\n") == [(8080, 8080), (9148, 9150)]
    assert d.port_ranges("\n") == [] and d.port_ranges("x,1-y") == []
