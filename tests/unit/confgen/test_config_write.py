"""Issue 10, points 4 and 7: config writes keep what other programs rely on.

* ``health --isolate-bad-gpu`` and ``mig apply`` never rewrite a gres.conf that
  other nodes read (no ``NodeName=`` lines, or other nodes named);
* every config write (``fsutil.replace_config``) writes a symlink's target,
  keeps mode and owner, and keeps a backup;
* ``atomic_write`` fsyncs the directory after the rename.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from slurm_gpu import fsutil
from slurm_gpu.health import engine
from test_health_isolate import H100, PENDING, gres_for, node_env, opts  # noqa: F401


def _owner(p: Path) -> tuple[int, int, int]:
    st = os.stat(p)
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


def _as_shared(tmp_path: Path, text: str) -> tuple[Path, Path]:
    """*text* in a file under shared/, reached through an /etc-like symlink, mode 0640, odd owner."""
    real = tmp_path / "shared" / "gres.conf"
    real.parent.mkdir()
    real.write_text(text)
    os.chmod(real, 0o640)
    if os.geteuid() == 0:
        os.chown(real, 1234, 5678)
    link = tmp_path / "etc-gres.conf"
    link.symlink_to(real)
    return link, real


def test_replace_config_writes_the_target_and_keeps_mode_owner_and_a_backup(tmp_path):
    link, real = _as_shared(tmp_path, "old\n")
    before = _owner(real)
    assert fsutil.replace_config(link, "new\n") == str(real)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == "new\n" and _owner(real) == before
    bak = Path(str(real) + ".bak")
    assert bak.read_text() == "old\n" and _owner(bak) == before
    # keep_first_backup: the original survives later rewrites
    fsutil.replace_config(link, "newer\n", backup=".orig", keep_first_backup=True)
    fsutil.replace_config(link, "newest\n", backup=".orig", keep_first_backup=True)
    assert Path(str(real) + ".orig").read_text() == "new\n" and real.read_text() == "newest\n"


def test_replace_config_of_a_new_file(tmp_path):
    p = tmp_path / "topology.conf"
    fsutil.replace_config(p, "x\n")
    assert p.read_text() == "x\n" and not Path(str(p) + ".bak").exists()


def test_atomic_write_fsyncs_the_directory_after_the_rename(tmp_path, monkeypatch):
    synced: list[tuple[str, bool]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        synced.append(("fsync", stat.S_ISDIR(os.fstat(fd).st_mode)))
        return real_fsync(fd)

    def replace(a, b):
        synced.append(("rename", False))
        return real_replace(a, b)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    fsutil.atomic_write(tmp_path / "f", "x")
    assert synced == [("fsync", False), ("rename", False), ("fsync", True)]


# ------------------------------------------------------------ isolate

def test_isolate_refuses_a_gres_conf_without_nodename_lines_and_drains(tmp_path, node_env):
    # Rendered for one node, then made cluster-wide: NodeName= dropped from every line.
    gres = gres_for(tmp_path, ["n1"])
    import re
    gres.write_text(re.sub(r"^NodeName=\S+ ", "", gres.read_text(), flags=re.M))
    before = gres.read_text()
    assert not re.search(r"^NodeName=", before, re.M) and "Name=gpu" in before
    r = engine.run(opts(tmp_path, gres, PENDING))
    assert r.status == "drain" and r.action == "drain" and gres.read_text() == before
    assert any("cluster-wide" in n for n in r.notes), r.notes
    assert not any(c[1] == "reconfigure" for c in node_env)


def test_isolate_writes_a_symlinked_gres_conf_s_target_keeping_mode_owner(tmp_path, node_env):
    made = gres_for(tmp_path, ["n1"])
    link, real = _as_shared(tmp_path, made.read_text())
    made.unlink()
    before, owner = real.read_text(), _owner(real)
    o = opts(tmp_path, link, PENDING)
    r = engine.run(o)
    assert r.action == "none" and r.status == "warn", r
    assert link.is_symlink() and real.read_text().count("Name=gpu") == 7
    assert _owner(real) == owner
    orig = Path(str(real) + ".slurm-gpu.orig")
    assert orig.read_text() == before and _owner(orig) == owner


# ------------------------------------------------------------ mig apply

MIG_YAML = ("version: v1\nmig-configs:\n  balanced:\n    - devices: [1]\n"
            "      mig-enabled: true\n      mig-devices:\n        \"3g.47gb\": 1\n"
            "        \"2g.24gb\": 1\n        \"1g.12gb\": 2\n")


@pytest.fixture
def mig_node(tmp_path, request):
    if os.geteuid() != 0:
        pytest.skip("MIG changes need root (as NVML)")
    from slurm_gpu.hw import live
    sim = request.getfixturevalue("sim_config")
    live.use_node_name("n1")
    cfg = tmp_path / "mig.yaml"
    cfg.write_text(MIG_YAML)
    yield sim, cfg
    live.use_node_name(None)


@pytest.mark.parametrize("gres", ["Name=gpu File=/dev/nvidia[0-1]\n",
                                  "NodeName=n1 Name=gpu File=/dev/nvidia0\nNodeName=n2 Name=gpu File=/dev/nvidia0\n",
                                  "NodeName=n[1-4] Name=gpu File=/dev/nvidia[0-1]\n"])
def test_mig_apply_refuses_a_shared_gres_conf_before_changing_anything(tmp_path, mig_node, capsys, gres):
    from slurm_gpu.cli import main
    sim, cfg = mig_node
    g = tmp_path / "gres.conf"
    g.write_text(gres)
    facts = json.loads(sim.read_text())["facts"]
    assert main(["mig", "apply", str(cfg), "-c", "balanced", "--gres-conf", str(g)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("slurm-gpu: gres.conf ") and "nothing changed" in err
    assert g.read_text() == gres and json.loads(sim.read_text())["facts"] == facts


def test_mig_apply_writes_a_symlinked_per_node_gres_conf_s_target(tmp_path, mig_node, capsys):
    from slurm_gpu.cli import main
    sim, cfg = mig_node
    link, real = _as_shared(tmp_path, "NodeName=n1 Name=gpu File=/dev/nvidia[0-1]\n")
    owner = _owner(real)
    assert main(["mig", "apply", str(cfg), "-c", "balanced", "--gres-conf", str(link)]) == 0
    assert link.is_symlink() and "3g.47gb" in real.read_text() and _owner(real) == owner
    assert Path(str(real) + ".bak").read_text() == "NodeName=n1 Name=gpu File=/dev/nvidia[0-1]\n"
