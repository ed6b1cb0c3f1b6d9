"""The test rig's /run bookkeeping (devkit sandbox.hostrun): what a run adds is
removed, what was there stays, and an outer snapshot (scripts/test.sh runs
unit and integration side by side) turns the per-session one off."""
from __future__ import annotations

import json
from pathlib import Path

from slurm_gpu_devkit.sandbox import hostrun


def _dirs(tmp: Path) -> tuple[str, ...]:
    return (str(tmp / "run" / "facts"), str(tmp / "run"))


def test_restore_removes_what_the_run_added_and_keeps_the_rest(tmp_path: Path) -> None:
    dirs = _dirs(tmp_path)
    Path(dirs[0]).mkdir(parents=True)
    Path(dirs[0], "old").write_text("x")
    reg = str(tmp_path / "registry")
    snap = json.loads(json.dumps(hostrun.snapshot(dirs, reg)))     # as `save` writes it
    Path(dirs[0], "new").write_text("y")
    Path(dirs[1], "job-dir").mkdir()
    hostrun.restore(snap, reg)
    assert sorted(p.name for p in Path(dirs[0]).iterdir()) == ["old"]
    assert sorted(p.name for p in Path(dirs[1]).iterdir()) == ["facts"]


def test_an_outer_snapshot_leaves_the_inner_one_idle(tmp_path: Path, monkeypatch) -> None:
    dirs = _dirs(tmp_path)
    monkeypatch.setenv(hostrun.OUTER, "1")
    with hostrun.left_as_found(dirs, str(tmp_path / "registry")):
        Path(dirs[0]).mkdir(parents=True)
        Path(dirs[0], "other-run").write_text("z")
    assert Path(dirs[0], "other-run").exists()       # the other pytest run still uses it
    monkeypatch.delenv(hostrun.OUTER)
    with hostrun.left_as_found(dirs, str(tmp_path / "registry")):
        Path(dirs[0], "mine").write_text("z")
    assert not Path(dirs[0], "mine").exists()


def test_the_command_line_saves_and_restores(tmp_path: Path, monkeypatch) -> None:
    dirs = _dirs(tmp_path)
    monkeypatch.setattr(hostrun, "RUN_DIRS", dirs)
    monkeypatch.setattr(hostrun, "REGISTRY", str(tmp_path / "registry"))
    monkeypatch.setattr(hostrun.snapshot, "__defaults__", (dirs, str(tmp_path / "registry")))
    monkeypatch.setattr(hostrun.restore, "__defaults__", (str(tmp_path / "registry"),))
    f = str(tmp_path / "snap.json")
    assert hostrun.main(["save", f]) == 0
    Path(dirs[1]).mkdir(parents=True)
    assert hostrun.main(["restore", f]) == 0
    assert not Path(dirs[1]).exists()               # the run made it: it goes
    assert hostrun.main(["bogus"]) == 2
