"""pip inside a Debian root (Slurm 24.11/26.05 sandboxes) trusts what the
host's pip trusts: the host's store, and a PIP_CERT bundle kept elsewhere
(a site's TLS proxy CA), bound at the same path inside the root."""
from __future__ import annotations

from pathlib import Path

from slurm_gpu_devkit.sandbox import chroot


def _capture(monkeypatch) -> list[dict]:
    calls: list[dict] = []
    monkeypatch.setattr(chroot, "run", lambda argv, timeout, env: calls.append(
        {"script": argv[-1], "env": env}))
    return calls


def test_a_pip_cert_outside_the_store_is_bound_and_named(tmp_path: Path, monkeypatch) -> None:
    cert = tmp_path / "site-ca.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("PIP_CERT", str(cert))
    calls = _capture(monkeypatch)
    root = tmp_path / "root"
    chroot.run_in_root(root, ["pip", "install", "x"], 5, binds=chroot.pip_binds())
    assert calls[0]["env"]["PIP_CERT"] == str(cert)
    assert f"mount --bind {cert} {root}{cert}" in calls[0]["script"]


def test_no_pip_cert_or_a_missing_one_passes_nothing(tmp_path: Path, monkeypatch) -> None:
    calls = _capture(monkeypatch)
    monkeypatch.delenv("PIP_CERT", raising=False)
    chroot.run_in_root(tmp_path, ["pip"], 5, binds=chroot.pip_binds())
    monkeypatch.setenv("PIP_CERT", str(tmp_path / "absent.pem"))
    chroot.run_in_root(tmp_path, ["pip"], 5, binds=chroot.pip_binds())
    assert all("PIP_CERT" not in c["env"] for c in calls)
    assert chroot.pip_binds() == chroot.PIP_BINDS
