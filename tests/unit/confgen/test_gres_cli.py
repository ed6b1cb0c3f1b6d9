"""`slurm-gpu gres` front end: inputs, bad input lines, apply semantics."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from machinedata import ROOT, machine_xml
from slurm_gpu.cli import main

XML = str(machine_xml("dgx2"))
PCI = str(ROOT / "tests" / "data" / "golden" / "nvidia.pci.ids")


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_render_named_hwloc_xmls_fold(capsys) -> None:
    rc, out, _ = run(capsys, "gres", "render", "--hwloc-xml", f"gpu1={XML}", "--hwloc-xml", f"gpu2={XML}")
    assert rc == 0
    assert "NodeName=gpu[1-2] Name=gpu Type=tesla_v100-sxm3-32gb-h File=/dev/nvidia[0-7] Cores=0-1" in out


def test_node_lines(capsys) -> None:
    rc, out, _ = run(capsys, "gres", "render", "--hwloc-xml", XML, "--node", "d1", "--node-lines", "--shards", "4")
    assert rc == 0
    assert out == ("NodeName=d1 CPUs=4 Sockets=2 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=1546833 "
                   "Gres=gpu:tesla_v100-sxm3-32gb-h:16,shard:64\n")


def test_mps_count_with_shards_is_one_line_usage_error(capsys) -> None:
    rc, out, err = run(capsys, "gres", "render", "--hwloc-xml", XML, "--node", "d1", "--mps-count", "100",
                       "--shards", "4")
    assert rc == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("slurm-gpu: --mps-count and --shards cannot both be set")


def test_hwloc_xml_without_node_is_usage_error(capsys) -> None:
    rc, _, err = run(capsys, "gres", "render", "--hwloc-xml", XML, "--hwloc-xml", f"b={XML}")
    assert rc == 2 and err.startswith("slurm-gpu: --hwloc-xml FILE needs --node")


def test_malformed_xml_one_line(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text(Path(XML).read_text()[:5000])
    rc, out, err = run(capsys, "gres", "render", "--hwloc-xml", f"n1={bad}")
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("slurm-gpu: ") and str(bad) in err


@pytest.mark.parametrize("content,where", [("{not json", ":1"), ('{"schema": 7}', "schema")])
def test_unreadable_snapshot_one_line(tmp_path: Path, capsys, content: str, where: str) -> None:
    snap = tmp_path / "n1.json"
    snap.write_text(content)
    rc, out, err = run(capsys, "gres", "render", "--snapshot", str(snap))
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and str(snap) in err and where in err


def test_missing_snapshot_and_empty_dir(tmp_path: Path, capsys) -> None:
    rc, _, err = run(capsys, "gres", "render", "--snapshot", str(tmp_path / "nope.json"))
    assert rc == 1 and "nope.json" in err
    rc, _, err = run(capsys, "gres", "render", "--snapshot", str(tmp_path))
    assert rc == 1 and "no *.json snapshots" in err


def test_output_is_atomic_and_never_partial(tmp_path: Path, capsys) -> None:
    out = tmp_path / "gres.conf"
    out.write_text("old\n")
    bad = tmp_path / "bad.xml"
    bad.write_text("<topology>")
    rc, _, _ = run(capsys, "gres", "render", "--hwloc-xml", f"n={bad}", "-o", str(out))
    assert rc == 1 and out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.xml", "gres.conf"]


def test_apply_writes_backup_then_is_idempotent(tmp_path: Path, capsys) -> None:
    conf = tmp_path / "gres.conf"
    conf.write_text("NodeName=d Name=gpu Type=x File=/dev/nvidia0\n")
    args = ["gres", "apply", "--config", str(conf), "--hwloc-xml", XML, "--node", "d"]
    rc, out, _ = run(capsys, *args)
    assert rc == 0 and "wrote" in out and "restart slurmd" in out and "drain" in out
    assert (tmp_path / "gres.conf.bak").read_text() == "NodeName=d Name=gpu Type=x File=/dev/nvidia0\n"
    mtime = os.stat(conf).st_mtime_ns
    rc, out, _ = run(capsys, *args)
    assert rc == 0 and "nothing written" in out and os.stat(conf).st_mtime_ns == mtime
    rc, out, _ = run(capsys, "gres", "check", "--config", str(conf), "--hwloc-xml", XML, "--node", "d")
    assert rc == 0 and "matches" in out


def test_check_reports_diff_exit_1(tmp_path: Path, capsys) -> None:
    conf = tmp_path / "gres.conf"
    conf.write_text("NodeName=d Name=gpu Type=tesla_v100-sxm3-32gb-h File=/dev/nvidia[0-15] Cores=0-3\n")
    rc, out, _ = run(capsys, "gres", "check", "--config", str(conf), "--hwloc-xml", XML, "--node", "d",
                     "--autodetect", "none")
    assert rc == 1
    assert "~ gpu /dev/nvidia0: Type=tesla_v100-sxm3-32gb-h Cores=0-3 -> Type=tesla_v100-sxm3-32gb-h Cores=0-1" in out


def _snapshot(path: Path, node_dict: dict) -> None:
    from slurm_gpu.hw import snapshot as snap
    path.write_text(json.dumps({"schema": snap.SCHEMA, "hostname": "d", "nvml": {"calls": []},
                                "hwloc_xml": Path(XML).read_text(), "node": node_dict}))


def test_derived_model_fast_path(tmp_path: Path, monkeypatch) -> None:
    """Only the head and the tail of a snapshot are read; the raw answers are not replayed."""
    from slurm_gpu.hw import snapshot_bulk as cmd
    from slurm_gpu.hw import HwlocXml, load_node, snapshot as snap

    node = load_node(HwlocXml(XML, hostname="d"))
    good = tmp_path / "good.json"
    _snapshot(good, node.to_dict())
    monkeypatch.setattr(snap, "replay", lambda *a, **k: pytest.fail("replayed"))
    monkeypatch.setattr(snap, "read_snapshot", lambda *a, **k: pytest.fail("read whole file"))
    got = cmd.load_snapshot_node(str(good))
    assert got.gpus == node.gpus and got.cores == node.cores
    assert got.sources == (f"snapshot:{good}",)


def test_stale_derived_model_falls_back_to_raw_answers(tmp_path: Path, monkeypatch) -> None:
    from slurm_gpu.hw import snapshot_bulk as cmd
    from slurm_gpu.hw import HwlocXml, load_node, snapshot as snap

    node = load_node(HwlocXml(XML, hostname="d"))
    stale = tmp_path / "stale.json"
    d = node.to_dict()
    d["gpus"][0]["nvlinks"] = [{"peer_kind": "gpu", "peer": "x", "links": 1, "renamed_field": 2}]
    _snapshot(stale, d)
    calls = []
    monkeypatch.setattr(snap, "replay", lambda data, path, **k: calls.append(path) or node)
    assert cmd.load_snapshot_node(str(stale)) is node
    assert calls == [str(stale)]


def test_live_node_named_after_slurmd(monkeypatch, capsys) -> None:
    from slurm_gpu.hw import HwlocXml, load_node

    node = load_node(HwlocXml(XML, hostname="whatever"))
    monkeypatch.setattr("slurm_gpu.hw.load_node", lambda *a, **k: node)
    monkeypatch.setenv("SLURMD_NODENAME", "gpu042")
    rc, out, _ = run(capsys, "gres", "render")
    assert rc == 0 and "NodeName=gpu042 Name=gpu" in out and "# input: gpu042=live" in out


def test_gpus_the_hardware_layer_left_out_are_reported(capsys, tmp_path: Path) -> None:
    """A lost GPU is missing from gres.conf: stderr must say so, per folded node set."""
    data = json.loads((ROOT / "tests" / "data" / "machines" / "h100-sxm-8x" / "snapshot.json").read_text())
    lost = "GPU index 3 unreadable: GPU is lost (NVML_ERROR_GPU_IS_LOST)"
    data["node"]["gpus"] = [g for g in data["node"]["gpus"] if g["index"] != 3]
    data["node"]["notes"] = [lost]
    for n in ("n1", "n2"):
        (tmp_path / f"{n}.json").write_text(json.dumps(data))
    rc, out, err = run(capsys, "gres", "render", "--snapshot", str(tmp_path))
    assert rc == 0 and out.count("Name=gpu ") == 7
    assert f"slurm-gpu: note: n[1-2]: {lost}\n" in err


@pytest.mark.parametrize("cmd", ["gres", "topology"])
def test_apply_follows_symlink_and_keeps_mode(tmp_path: Path, capsys, cmd: str) -> None:
    """/etc/slurm/gres.conf -> a shared copy stays a link; 0640 stays 0640."""
    shared = tmp_path / "shared"
    shared.mkdir()
    real = shared / f"{cmd}.conf"
    real.write_text("# old\n")
    os.chmod(real, 0o640)
    link = tmp_path / f"{cmd}.conf"
    link.symlink_to(real)
    inputs = (["--hwloc-xml", XML, "--node", "d"] if cmd == "gres" else
              ["--ibnetdiscover", str(ROOT / "tests" / "data" / "ibnetdiscover" / "topograph-example.out")])
    rc, out, _ = run(capsys, cmd, "apply", "--config", str(link), *inputs)
    assert rc == 0 and f"wrote {real} (previous kept as {real}.bak)" in out
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert "Name=gpu" in real.read_text() or "SwitchName=" in real.read_text()
    assert (shared / f"{cmd}.conf.bak").read_text() == "# old\n"
    assert os.stat(real).st_mode & 0o7777 == 0o640 and os.stat(f"{real}.bak").st_mode & 0o7777 == 0o640
    assert not (tmp_path / f"{cmd}.conf.bak").exists()


def test_check_flags_a_device_defined_twice(tmp_path: Path, capsys) -> None:
    conf = tmp_path / "gres.conf"
    conf.write_text("NodeName=d Name=gpu File=/dev/nvidia[0-1]\nNodeName=d Name=gpu Type=x File=/dev/nvidia1\n")
    rc, out, err = run(capsys, "gres", "check", "--config", str(conf), "--hwloc-xml", XML, "--node", "d")
    assert rc == 1 and out == ""
    assert err.splitlines()[-1] == (f"slurm-gpu: gpu device /dev/nvidia1 of node d defined twice "
                                    f"(first at {conf}:1) ({conf}:2)")


def test_apply_replaces_a_file_it_cannot_parse(tmp_path: Path, capsys) -> None:
    """A hand-made gres.conf with an Include (or a duplicate) is what apply should replace, not refuse."""
    conf = tmp_path / "gres.conf"
    conf.write_text("Include /etc/slurm/gres.d/site.conf\n")
    rc, out, err = run(capsys, "gres", "apply", "--config", str(conf), "--hwloc-xml", XML, "--node", "d")
    assert rc == 0 and f"wrote {conf}" in out and "restart slurmd" in out and "restart slurmctld too" in out
    assert f"slurm-gpu: note: previous file not understood: expected key=value, got 'Include' ({conf}:1)" in err
    assert "Name=gpu" in conf.read_text()
    assert (tmp_path / "gres.conf.bak").read_text() == "Include /etc/slurm/gres.d/site.conf\n"


def _h100(tmp_path: Path, gpus: int | None = None) -> Path:
    """n1.json: the recorded h100-sxm-8x, or with only its first *gpus* GPUs (NVML unavailable: 0)."""
    data = json.loads((ROOT / "tests" / "data" / "machines" / "h100-sxm-8x" / "snapshot.json").read_text())
    if gpus is not None:
        data["node"]["gpus"] = data["node"]["gpus"][:gpus]
        data["node"]["notes"] = ["NVML unavailable: NVML Shared Library Not Found (NVML_ERROR_LIBRARY_NOT_FOUND)"]
    d = tmp_path / f"in{gpus}"
    d.mkdir(exist_ok=True)
    (d / "n1.json").write_text(json.dumps(data))
    return d / "n1.json"


def test_apply_refuses_to_drop_gpus_the_deployed_file_has(tmp_path: Path, capsys) -> None:
    """A boot script running apply while NVML is unavailable must not wipe the node's GPUs."""
    conf = tmp_path / "gres.conf"
    rc, out, _ = run(capsys, "gres", "apply", "--config", str(conf), "--snapshot", str(_h100(tmp_path)))
    assert rc == 0 and conf.read_text().count("Name=gpu ") == 8
    deployed = conf.read_text()
    for gpus in (0, 5):
        rc, out, err = run(capsys, "gres", "apply", "--config", str(conf), "--snapshot", str(_h100(tmp_path, gpus)))
        assert rc == 3 and out == "", (rc, out, err)
        last = err.splitlines()[-1]
        assert last == (f"slurm-gpu: refusing to drop GPUs: n1 has 8 in the deployed file, the hardware read "
                        f"shows {gpus}; nothing written (--force writes it anyway) ({conf})"), err
        assert [l for l in err.splitlines() if not l.startswith("slurm-gpu: note:")] == [last]
        assert conf.read_text() == deployed and not (tmp_path / "gres.conf.bak").exists()
    rc, out, _ = run(capsys, "gres", "apply", "--config", str(conf), "--snapshot", str(_h100(tmp_path, 0)),
                     "--force")
    assert rc == 0 and "Name=gpu " not in conf.read_text()
    # more GPUs, or the same number renumbered, are no loss
    rc, out, _ = run(capsys, "gres", "apply", "--config", str(conf), "--snapshot", str(_h100(tmp_path, 5)))
    assert rc == 0 and conf.read_text().count("Name=gpu ") == 5


def test_apply_prints_the_node_line_slurm_conf_needs(tmp_path: Path, capsys) -> None:
    conf = tmp_path / "gres.conf"
    snap = _h100(tmp_path)
    rc, out, _ = run(capsys, "gres", "render", "--snapshot", str(snap), "--node-lines")
    node_line = out.strip().splitlines()[-1]
    assert node_line.startswith("NodeName=n1 ") and "Gres=gpu:" in node_line
    rc, out, _ = run(capsys, "gres", "apply", "--config", str(conf), "--snapshot", str(snap))
    assert rc == 0
    assert f"slurm-gpu: slurm.conf's node line must say the same (every node's copy):\n{node_line}\n" in out
    assert "restart slurmctld" in out and "slurmd" in out
    # nothing written: nothing to say about slurm.conf
    rc, out, _ = run(capsys, "gres", "apply", "--config", str(conf), "--snapshot", str(snap))
    assert rc == 0 and "node line" not in out


@pytest.mark.parametrize("pages,page_size,want", [
    # (uint64_t)((float)pages * (page_size / 1048576.0)), as slurmd -C
    # computes it (get_mach_stat.c), worked with cc on x86_64: the float
    # rounds the page count, up as often as down, above 2^24 pages.
    (6171021, 4096, 24105),
    (528360702, 4096, 2063909),          # the exact figure is 2063908
    (134217727, 4096, 524288),           # 524287
    (33030000, 65536, 2064375),          # aarch64 64 KiB pages
])
def test_node_line_real_memory_is_slurmd_s(tmp_path: Path, capsys, pages: int, page_size: int,
                                           want: int) -> None:
    """RealMemory= is what slurmd -C prints, not hwloc's NUMA nodes' sum
    (which is short of the kernel's total in VMs, and leaves out onlined
    GPU memory on Grace), whether the snapshot loads fast or is replayed."""
    from slurm_gpu.hw import snapshot as snap
    data = snap.record(hwloc_xml=Path(XML).read_text(), hostname="d", init_error=9,
                       phys_memory_bytes=pages * page_size)
    path = tmp_path / "d.json"
    snap.write(str(path), data)
    rc, out, _ = run(capsys, "gres", "render", "--snapshot", str(path), "--node-lines")
    assert rc == 0 and f" RealMemory={want}\n" in out, out
    node = snap.node_from_file(str(path), overlay={"gpus": {}})       # replayed
    assert node.phys_memory_bytes == pages * page_size


def test_node_line_real_memory_without_the_kernel_s_count(capsys) -> None:
    """An hwloc XML carries no kernel count: the CPU NUMA nodes' memory, as before."""
    rc, out, _ = run(capsys, "gres", "render", "--hwloc-xml", XML, "--node", "d1", "--node-lines")
    assert rc == 0 and " RealMemory=1546833 Gres=" in out


def test_snapshot_with_a_bad_phys_memory_is_one_line(tmp_path: Path, capsys) -> None:
    from slurm_gpu.hw import snapshot as snap
    data = snap.record(hwloc_xml=Path(XML).read_text(), hostname="d", init_error=9)
    data["phys_memory_bytes"] = "lots"
    path = tmp_path / "d.json"
    path.write_text(json.dumps(data))
    rc, _, err = run(capsys, "gres", "render", "--snapshot", str(path))
    assert rc != 0
    assert err.strip() == (f"slurm-gpu: snapshot phys_memory_bytes must be a positive integer "
                           f"({path}: phys_memory_bytes)")


def test_live_node_line_real_memory_matches_slurmd_c(capsys) -> None:
    """On this machine: the same figure as Debian's real slurmd -C."""
    import shutil
    import subprocess
    slurmd = shutil.which("slurmd") or "/usr/sbin/slurmd"
    if not os.access(slurmd, os.X_OK):
        pytest.skip("no slurmd on this machine")
    theirs = subprocess.run([slurmd, "-C"], capture_output=True, text=True, timeout=60).stdout
    rc, out, _ = run(capsys, "gres", "render", "--node-lines")
    field = [f for f in theirs.split() if f.startswith("RealMemory=")]
    assert rc == 0 and field and f" {field[0]}" in out.split("\n")[-2] + "\n", (theirs, out)
