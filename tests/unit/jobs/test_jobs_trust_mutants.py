"""jobs/trust.py: which directory on the way to a root-written path a user could change.

Each case asserts the directory named, whole: the mutants mutmut made of
trust.py survived the state and lifecycle tests, which only see "refused"
(docs/development.md, mutation testing).  Needs root to give directories
and symlinks away.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_gpu.jobs.trust import untrusted_ancestor

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files away")

USER = 1000             # any uid but root's


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    """A root-owned 0755 directory under pytest's root-owned tmp (itself under sticky /tmp)."""
    d = tmp_path / "r"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    assert untrusted_ancestor(d / "x") is None
    return d


@pytest.mark.parametrize("mode,bad", [(0o775, True), (0o757, True), (0o1777, False), (0o700, False)])
def test_a_writable_directory_counts_unless_sticky(root: Path, mode: int, bad: bool) -> None:
    d = root / "d"
    d.mkdir()
    os.chmod(d, mode)
    assert untrusted_ancestor(d / "later" / "x") == (str(d) if bad else None)   # later: not made yet


@pytest.mark.parametrize("uid", [1, USER])              # 1: daemon, a system user but not root
def test_a_directory_of_another_owner_counts(root: Path, uid: int) -> None:
    d = root / "d"
    d.mkdir(mode=0o755)
    os.chown(d, uid, -1)
    assert untrusted_ancestor(d / "x") == str(d)


def test_the_nearest_untrusted_directory_is_named(root: Path) -> None:
    (root / "a" / "b").mkdir(parents=True)
    os.chmod(root / "a", 0o777)
    os.chmod(root / "a" / "b", 0o777)
    assert untrusted_ancestor(root / "a" / "b" / "x") == str(root / "a" / "b")


def test_a_file_on_the_way_counts(root: Path) -> None:
    (root / "f").write_text("")
    assert untrusted_ancestor(root / "f" / "x") == str(root / "f")
    # lstat below a file fails with ENOTDIR, not "does not exist yet"
    assert untrusted_ancestor(root / "f" / "sub" / "x") == str(root / "f" / "sub")


def test_symlinks_on_the_way_must_be_roots_and_lead_to_trusted_directories(root: Path) -> None:
    (root / "real").mkdir(mode=0o755)
    (root / "link").symlink_to(root / "real")
    assert untrusted_ancestor(root / "link" / "x") is None              # root's link, root's dir
    os.lchown(root / "link", USER, -1)
    assert untrusted_ancestor(root / "link" / "x") == str(root / "link")
    os.lchown(root / "link", 0, -1)
    os.chmod(root / "real", 0o777)
    # the link's own chain is clean: the directory it resolves to is not
    assert untrusted_ancestor(root / "link" / "x") == str(root / "real")



def test_a_roots_symlink_in_a_writable_directory_counts(root: Path) -> None:
    """The user could replace the link itself: the directory holding it is named."""
    (root / "real").mkdir(mode=0o755)
    (root / "open").mkdir()
    os.chmod(root / "open", 0o777)
    (root / "open" / "link").symlink_to(root / "real")
    assert untrusted_ancestor(root / "open" / "link" / "x") == str(root / "open")
    # a directory not made yet below the link hides neither what is above it nor the link
    assert untrusted_ancestor(root / "open" / "link" / "later" / "x") == str(root / "open")
