"""The one node-fact cache: its file, who may have written it, and when it is stale.

The file is read as root in every bound slurmstepd and in every prolog;
job users can read this code and plant files where they can write.  The
cache-file tests come from test_spank_dispatch.py, where they guarded the
SPANK-only cache this module replaced.
"""
from __future__ import annotations

import marshal
import os
from pathlib import Path

import pytest

from slurm_gpu import nodefacts, procfs
from slurm_gpu.hw import Snapshot, load_node
from paths import ROOT

MINI = ROOT / "tests" / "data" / "machines" / "mini-2numa" / "snapshot.json"
GRES = "/etc/x/gres.conf"


def _cache_entry() -> dict:
    return {"key": nodefacts.key("/x.toml", "n1", GRES), "boot_id": procfs.boot_id(),
            "stamps": (), "state_dir": "/run/x", "gpus": None, "sections": {}}


def test_cache_survives_garbage(tmp_path):
    f = nodefacts.cache_file("/x.toml", "n1", GRES, str(tmp_path))
    open(f, "wb").write(b"\x00garbage")
    assert nodefacts.load("/x.toml", "n1", GRES, str(tmp_path)) is None


@pytest.mark.parametrize("planted", [
    b"",                                                  # empty
    marshal.dumps([1, 2, 3]),                             # not a dict
    marshal.dumps({"key": "x"}),                          # another key, nothing else
    marshal.dumps({"gpus": None}),                        # no key at all
    None,                                                 # a valid entry with its sections broken
])
def test_foreign_or_broken_entries_are_misses_never_errors(tmp_path, planted):
    d = tmp_path / "cache"
    nodefacts.store(_cache_entry(), "/x.toml", "n1", GRES, str(d))
    f = nodefacts.cache_file("/x.toml", "n1", GRES, str(d))
    if planted is None:
        planted = marshal.dumps(dict(_cache_entry(), sections=["spank"]))
    Path(f).write_bytes(planted)
    assert nodefacts.load("/x.toml", "n1", GRES, str(d)) is None


def test_cache_written_by_someone_else_is_ignored(tmp_path):
    d = tmp_path / "cache"
    data = _cache_entry()
    nodefacts.store(data, "/x.toml", "n1", GRES, str(d))
    f = nodefacts.cache_file("/x.toml", "n1", GRES, str(d))
    assert os.stat(d).st_mode & 0o777 == 0o700
    assert os.stat(f).st_mode & 0o777 == 0o600
    assert nodefacts.load("/x.toml", "n1", GRES, str(d)) == data
    os.chmod(f, 0o666)                       # writable by others: not trusted
    assert nodefacts.load("/x.toml", "n1", GRES, str(d)) is None
    os.chmod(f, 0o600)
    os.chown(f, 65534, -1)                   # nobody's file, however private: not trusted
    assert nodefacts.load("/x.toml", "n1", GRES, str(d)) is None


def test_cache_dir_that_is_a_symlink_is_neither_read_nor_written(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    link = tmp_path / "cache"
    link.symlink_to(elsewhere)
    nodefacts.store(_cache_entry(), "/x.toml", "n1", GRES, str(link))
    assert list(elsewhere.iterdir()) == [], "root wrote through a symlinked cache dir"
    nodefacts.store(_cache_entry(), "/x.toml", "n1", GRES, str(elsewhere))
    assert nodefacts.load("/x.toml", "n1", GRES, str(elsewhere)) == _cache_entry()
    assert nodefacts.load("/x.toml", "n1", GRES, str(link)) is None


def test_cache_dir_others_can_write_is_not_used(tmp_path):
    d = tmp_path / "cache"
    d.mkdir()
    os.chmod(d, 0o777)
    nodefacts.store(_cache_entry(), "/x.toml", "n1", GRES, str(d))
    assert list(d.iterdir()) == []


def test_cache_file_that_is_a_symlink_or_fifo_is_ignored_without_blocking(tmp_path):
    import signal
    d = tmp_path / "cache"
    nodefacts.store(_cache_entry(), "/x.toml", "n1", GRES, str(d))
    f = Path(nodefacts.cache_file("/x.toml", "n1", GRES, str(d)))
    real = d / "real"
    f.rename(real)
    f.symlink_to(real)                      # root-owned target, private: still not followed
    assert nodefacts.load("/x.toml", "n1", GRES, str(d)) is None
    f.unlink()
    os.mkfifo(f, 0o600)

    def hung(*_):
        raise TimeoutError("nodefacts.load blocked on a FIFO")
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(5)
    try:
        assert nodefacts.load("/x.toml", "n1", GRES, str(d)) is None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_cache_file_stays_in_the_cache_dir(tmp_path):
    for node in ("../../etc/evil", "/abs", "n1/x", ".."):
        f = nodefacts.cache_file("/x.toml", node, GRES, str(tmp_path))
        assert os.path.dirname(f) == str(tmp_path), f
    assert nodefacts.cache_file("/x.toml", "a/b", GRES, "/c") != \
        nodefacts.cache_file("/x.toml", "a_b", GRES, "/c")
    # another gres.conf is another entry: its GPU order may differ
    assert nodefacts.cache_file("/x.toml", "n1", GRES, "/c") != \
        nodefacts.cache_file("/x.toml", "n1", "/etc/y/gres.conf", "/c")


def test_entry_of_another_boot_or_an_unknown_boot_is_stale(tmp_path, monkeypatch):
    d = str(tmp_path / "cache")
    nodefacts.store(_cache_entry(), "/x.toml", "n1", GRES, d)
    assert nodefacts.load("/x.toml", "n1", GRES, d) is not None
    monkeypatch.setattr(nodefacts, "boot_id", lambda: "another-boot")
    assert nodefacts.load("/x.toml", "n1", GRES, d) is None
    monkeypatch.setattr(nodefacts, "boot_id", lambda: "")   # /proc unreadable: could be any boot
    nodefacts.store(dict(_cache_entry(), boot_id=""), "/x.toml", "n1", GRES, d)
    assert nodefacts.load("/x.toml", "n1", GRES, d) is None


@pytest.fixture()
def node_env(tmp_path, monkeypatch):
    """A config naming the mini-2numa snapshot, gres.conf beside $SLURM_CONF; model reads counted."""
    from slurm_gpu import config
    snap = tmp_path / "snapshot.json"
    snap.write_bytes(MINI.read_bytes())
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text(f'[node]\nsnapshot = "{snap}"\nstate_dir = "{tmp_path / "state"}"\n')
    gres = tmp_path / "gres.conf"
    gres.write_text("AutoDetect=off\nName=gpu File=/dev/nvidia0\nName=gpu File=/dev/nvidia1\n")
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    config.clear_cache()
    reads: list[int] = []
    model = load_node(Snapshot(str(snap)))

    def read_node():
        reads.append(1)
        return model
    yield {"cfg": str(cfg), "snap": snap, "gres": gres, "reads": reads, "read_node": read_node,
           "dir": str(tmp_path / "cache"), "model": model}
    config.clear_cache()


def _get(e, **kw):
    return nodefacts.get(e["cfg"], "n1", str(e["gres"]), read_node=e["read_node"],
                         cache_dir=e["dir"], **kw)


def test_one_model_read_serves_the_prolog_and_the_step(node_env):
    e = node_env
    sections = {"spank": lambda: {"memlock": None}}
    prolog = _get(e, with_gpus=True)                          # what jobs.locality asks for
    step = _get(e, with_gpus=True, sections=sections)         # what the SPANK step asks for
    assert len(e["reads"]) == 1, "the step read the model again"
    assert step["gpus"] == prolog["gpus"] and step["sections"] == {"spank": {"memlock": None}}
    # a step that binds nothing, then the next prolog: still the one read
    assert _get(e, with_gpus=False, sections=sections)["gpus"] == prolog["gpus"]
    assert _get(e, with_gpus=True)["sections"] == {"spank": {"memlock": None}}
    assert len(e["reads"]) == 1
    assert len(os.listdir(e["dir"])) == 1


@pytest.mark.parametrize("change", ["config", "snapshot", "gres", "boot"])
def test_a_changed_input_is_read_again_never_served_stale(node_env, change, monkeypatch):
    e = node_env
    first = _get(e, with_gpus=True, sections={"spank": lambda: {"v": 1}})
    assert [g["minor"] for g in first["gpus"]] == [0, 1]
    if change == "config":
        Path(e["cfg"]).write_text(Path(e["cfg"]).read_text() + "# edited\n")
        os.utime(e["cfg"], ns=(1, 1))
    elif change == "snapshot":
        e["snap"].write_text(e["snap"].read_text() + " ")
        os.utime(e["snap"], ns=(1, 1))
    elif change == "gres":       # same size, same inode: only the mtime tells
        e["gres"].write_text("AutoDetect=off\nName=gpu File=/dev/nvidia1\nName=gpu File=/dev/nvidia0\n")
        os.utime(e["gres"], ns=(1, 1))
    else:
        monkeypatch.setattr(nodefacts, "boot_id", lambda: "the-next-boot")
    again = _get(e, with_gpus=True, sections={"spank": lambda: {"v": 2}})
    assert len(e["reads"]) == 2
    assert again["sections"] == {"spank": {"v": 2}}, "a section of the old entry was kept"
    want = [1, 0] if change == "gres" else [0, 1]
    assert [g["minor"] for g in again["gpus"]] == want


def test_gres_conf_device_without_a_gpu_keeps_every_later_index(node_env):
    """Slurm GPU 1 is /dev/nvidia1 whatever happened to /dev/nvidia7 before it."""
    e = node_env
    e["gres"].write_text("AutoDetect=off\nName=gpu File=/dev/nvidia7\nName=gpu File=/dev/nvidia1\n")
    gpus = _get(e, with_gpus=True)["gpus"]
    assert gpus[0] is None and gpus[1]["minor"] == 1
    assert sorted(nodefacts.for_prolog(gpus)) == [1]


def test_gres_conf_path_follows_slurm_conf():
    assert nodefacts.gres_conf_path({"SLURM_CONF": "/etc/slurm/x/slurm.conf"}) == "/etc/slurm/x/gres.conf"


@pytest.fixture
def configless(tmp_path: Path, monkeypatch) -> Path:
    """A configless node: no /etc/slurm/slurm.conf, slurmd's /run/slurm/conf
    link to its conf-cache (SlurmdSpoolDir/conf-cache), and no SLURM_CONF,
    as slurmd runs HealthCheckProgram and as an admin's shell has it."""
    cache = tmp_path / "spool" / "conf-cache"
    cache.mkdir(parents=True)
    (cache / "slurm.conf").write_text("ClusterName=c\nHealthCheckTimeout=40\n")
    (cache / "gres.conf").write_text("Name=gpu File=/dev/nvidia0\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "conf").symlink_to(cache)
    monkeypatch.setattr(nodefacts, "SLURM_CONF_DEFAULT", str(tmp_path / "etc" / "slurm.conf"))
    monkeypatch.setattr(nodefacts, "SLURM_CONF_CONFIGLESS", str(tmp_path / "run" / "conf" / "slurm.conf"))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    return tmp_path


def test_configless_node_finds_slurmd_s_cached_slurm_conf(configless: Path) -> None:
    from slurm_gpu import slurmclient
    from slurm_gpu.health.expected import default_gres_conf
    from slurm_gpu.health.settings import HealthSettings
    link = str(configless / "run" / "conf")
    assert nodefacts.slurm_conf_path({}) == f"{link}/slurm.conf"
    assert nodefacts.gres_conf_path({}) == f"{link}/gres.conf"
    # the health check's HealthCheckTimeout and gres.conf, without SLURM_CONF
    assert slurmclient.conf_path() == f"{link}/slurm.conf"          # doctor, spank install, gpu.imex
    assert slurmclient.health_check_timeout(slurmclient.read_conf()) == 40.0
    assert default_gres_conf(HealthSettings()) == f"{link}/gres.conf"
    # SLURM_CONF (the prolog's, slurmstepd's) and the built-in file come first
    assert nodefacts.slurm_conf_path({"SLURM_CONF": "/x/slurm.conf"}) == "/x/slurm.conf"
    (configless / "etc").mkdir()
    (configless / "etc" / "slurm.conf").write_text("")
    assert nodefacts.slurm_conf_path({}) == str(configless / "etc" / "slurm.conf")
    assert nodefacts.gres_conf_path({}) != f"{link}/gres.conf"


def test_warm_step_reads_the_entry_without_config_or_hw(node_env, monkeypatch, tmp_path) -> None:
    """The real cached path, not a stub: a bound step with a warm entry on disk imports
    neither slurm_gpu.config (TOML) nor slurm_gpu.hw (the model), and gets the GPUs."""
    import subprocess
    import sys
    from slurm_gpu.spank import nodecache
    e = node_env
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))    # gres.conf beside it
    monkeypatch.setattr("slurm_gpu.hw.load_node", lambda *a: e["model"])
    warm = nodecache.get(e["cfg"], "n1", with_gpus=True, cache_dir=e["dir"])
    assert [g["minor"] for g in warm["gpus"]] == [0, 1]
    code = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from slurm_gpu.spank import nodecache
facts = nodecache.get({e["cfg"]!r}, "n1", with_gpus=True, cache_dir={e["dir"]!r})
print("GPUS", [g["minor"] for g in facts["gpus"]])
heavy = sorted(m for m in sys.modules if m in ("slurm_gpu.config", "tomllib", "slurm_gpu.fsutil")
               or m.startswith("slurm_gpu.hw") or m.startswith("slurm_gpu.confgen"))
print("HEAVY", heavy)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, SLURM_CONF=str(tmp_path / "slurm.conf")))
    assert out.returncode == 0, out.stderr
    assert "GPUS [0, 1]" in out.stdout and "HEAVY []" in out.stdout, out.stdout


def test_warm_bound_step_imports_no_os(node_env, monkeypatch, tmp_path) -> None:
    """The plugin's interpreter has no site (so no os at start): a bound step with a
    warm entry reads it, finds gres.conf from slurmstepd's SLURM_CONF and asks for
    its CPUs without importing os, whose environ mapping costs ~1 ms a step."""
    import subprocess
    import sys
    from slurm_gpu.spank import nodecache
    e = node_env
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    monkeypatch.setattr("slurm_gpu.hw.load_node", lambda *a: e["model"])
    nodecache.get(e["cfg"], "n1", with_gpus=True, cache_dir=e["dir"])
    code = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from slurm_gpu.spank import dispatch, effects, nodecache, remote
facts = nodecache.get({e["cfg"]!r}, "n1", with_gpus=True, cache_dir={e["dir"]!r})
print("GPUS", [g["minor"] for g in facts["gpus"]], bool(effects.allowed_cpus()))
print("OS", "os" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                         text=True, timeout=60,
                         env=dict(os.environ, SLURM_CONF=str(tmp_path / "slurm.conf")))
    assert out.returncode == 0, out.stderr
    assert "GPUS [0, 1] True" in out.stdout and "OS False" in out.stdout, out.stdout


@pytest.mark.parametrize("conf", ["/etc/slurm/slurm.conf", "/etc/slurm//slurm.conf", "slurm.conf",
                                  "/slurm.conf", "//slurm.conf", "a/b/slurm.conf", "/a/b/",
                                  "/a/b//", "///", "a//"])
def test_gres_conf_path_is_os_path_join_of_dirname(conf):
    assert nodefacts.gres_conf_path({"SLURM_CONF": conf}) == \
        os.path.join(os.path.dirname(conf), "gres.conf")
