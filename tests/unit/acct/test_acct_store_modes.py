"""The node's accounting records are root's alone (0700 directories, 0600 files):
they name each job's user, account and GPUs, which Slurm's ``PrivateData``
may hide from other users.  Records an older version left readable are
tightened when the store is next used."""
from __future__ import annotations

import os
import stat

from slurm_gpu.acct.store import KINDS, Store


def mode(p) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_new_records_are_private(tmp_path):
    store = Store(tmp_path / "acct")
    store.write("jobs", "5", {"jobid": "5", "user": "alice", "devices": ["0"]})
    store.write("agg", "5", {"jobid": "5", "devices": {}})
    store.write("pending", "5", {"jobid": "5"})
    store.mark_ended("6")
    assert mode(tmp_path / "acct") == 0o700
    for kind in KINDS:
        assert mode(tmp_path / "acct" / kind) == 0o700, kind
    for p in (store.path("jobs", "5"), store.path("agg", "5"), store.path("pending", "5"), store.path("ended", "6")):
        assert mode(p) == 0o600, p
    assert store.read("jobs", "5")["user"] == "alice"


def test_records_an_older_version_left_readable_are_tightened(tmp_path):
    root = tmp_path / "acct"
    for kind in KINDS:
        (root / kind).mkdir(parents=True)
        os.chmod(root / kind, 0o755)
    os.chmod(root, 0o775)                  # made under umask 002 by an older version
    old = root / "jobs" / "5.json"
    old.write_text('{"jobid": "5", "user": "alice", "devices": ["0"]}')
    os.chmod(old, 0o644)
    (root / "ended" / "4").write_text("1\n")
    os.chmod(root / "ended" / "4", 0o644)
    store = Store(root)
    store.ensure()
    assert mode(root) == 0o700 and all(mode(root / k) == 0o700 for k in KINDS)
    assert mode(old) == 0o600 and mode(root / "ended" / "4") == 0o600
    assert list(store.registrations()) == ["5"]


def test_a_kind_directory_others_can_write_is_refused(tmp_path):
    import pytest
    from slurm_gpu.errors import InputError
    store = Store(tmp_path / "acct")
    store.ensure()
    os.chmod(tmp_path / "acct" / "jobs", 0o777)
    with pytest.raises(InputError):
        Store(tmp_path / "acct").ensure()
