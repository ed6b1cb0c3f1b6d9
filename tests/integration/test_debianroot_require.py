"""A Debian root that cannot be had skips the newer-Slurm tests, but fails
them under SLURM_GPU_REQUIRE_INTEGRATION=1 (what scripts/test.sh and CI set),
so a run without a mirror cannot pass by skipping Slurm 24.11 and 26.05."""
from __future__ import annotations

import pytest

from debianroot import debian_root


def _outcome() -> BaseException:
    """What debian_root raises for a suite debian-root.sh refuses (no network needed)."""
    try:
        debian_root("Not_A_Suite", "Slurm 99.99")
    except BaseException as e:  # noqa: BLE001  pytest's skip/fail outcomes are BaseExceptions
        return e
    raise AssertionError("debian_root returned a root for a bad suite name")


def test_unavailable_root_fails_under_require(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_GPU_REQUIRE_INTEGRATION", "1")
    out = _outcome()
    assert isinstance(out, pytest.fail.Exception), f"{type(out).__name__}: {out}"
    assert "SLURM_GPU_REQUIRE_INTEGRATION=1 but no Slurm 99.99 root" in str(out)
    assert "bad suite name" in str(out)


def test_unavailable_root_skips_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_GPU_REQUIRE_INTEGRATION", raising=False)
    out = _outcome()
    assert isinstance(out, pytest.skip.Exception), f"{type(out).__name__}: {out}"
    assert "no Slurm 99.99 root" in str(out) and "bad suite name" in str(out)
