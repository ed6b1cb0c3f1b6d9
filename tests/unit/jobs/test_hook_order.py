"""The hook scripts' names put them in the order they need under Slurm's rule:
one Prolog=/Epilog= glob runs in reverse name order (slurm.conf(5), 23.11.4 on;
tests/integration/test_slurm_versions.py shows it on 22.05, 24.11 and 26.05)."""
from __future__ import annotations

import re
from paths import ROOT

REPO = ROOT


def slurm_order(kind: str) -> list[str]:
    # glob(3) sorts by strcoll; our names are lower-case ASCII, so byte order is the locale's
    names = [p.name for p in (REPO / kind).iterdir() if p.is_file()]
    assert all(re.fullmatch(r"[0-9]{2}-[a-z0-9-]+", n) for n in names), names
    return sorted(names, reverse=True)


def test_prolog_makes_mig_instances_before_accounting_registers_them() -> None:
    order = slurm_order("prolog.d")
    jobs, acct = (next(n for n in order if w in n) for w in ("jobs", "acct"))
    assert order.index(jobs) < order.index(acct), order


def test_epilog_accounting_runs_before_the_teardown_that_may_fail() -> None:
    order = slurm_order("epilog.d")
    jobs, acct = (next(n for n in order if w in n) for w in ("jobs", "acct"))
    assert order.index(acct) < order.index(jobs), order


def test_install_guide_names_the_order() -> None:
    guide = (REPO / "docs" / "install.md").read_text()
    for kind in ("prolog.d", "epilog.d"):
        first, then = slurm_order(kind)[:2]
        assert re.search(rf"`{kind}/{first}`[^|]*\| `{kind}/{then}`", guide), (kind, first, then)
