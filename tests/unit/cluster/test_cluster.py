"""slurm-gpu cluster: the collected directory, Slurm's view, drift and the folded report."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from slurm_gpu.cli import main
from slurm_gpu.cluster import modelfile, slurmview, store
from slurm_gpu.hw import snapshot as snap
from paths import ROOT

sys.path.insert(0, str(ROOT / "tests"))
from configfile import use_config  # noqa: E402
from machinedata import MACHINES_DIR  # noqa: E402

H100 = str(MACHINES_DIR / "h100-sxm-8x" / "snapshot.json")


@pytest.fixture(scope="module")
def recorded() -> dict[str, dict]:
    """One healthy recording and one with GPU 3 (bus 0000:3a:00.0 ... whichever is index 3) lost."""
    healthy = snap.rerecord(H100, hostname="x")
    bus3 = next(g["pci_bus_id"] for g in healthy["node"]["gpus"] if g["minor"] == 3)
    lost = snap.rerecord(H100, hostname="x", overlay={"gpus": {bus3: {"lost": True}}})
    return {"healthy": healthy, "lost": lost}


def _write(d: Path, name: str, data: dict) -> None:
    snap.write(str(d / f"{name}.json"), dict(data, hostname=name))


def _gres_conf(tmp: Path, names: list[str]) -> Path:
    from slurm_gpu.confgen import render_gres_conf
    node = snap.node_from_file(H100)
    p = tmp / "gres.conf"
    p.write_text(render_gres_conf({n: node for n in names}))
    return p


def _scontrol(tmp: Path, names: list[str], **over: str) -> Path:
    lines = []
    for n in names:
        fields = {"NodeName": n, "Arch": "x86_64", "CoresPerSocket": "48", "CPUAlloc": "0", "CPUEfctv": "192",
                  "CPUTot": "192", "CPULoad": "0.00", "AvailableFeatures": "(null)", "Gres": "gpu:nvidia_h100_80gb_hbm3:8(S:0-1)",
                  "NodeAddr": n, "RealMemory": "2000000", "Sockets": "2", "Boards": "1",
                  "State": "IDLE", "ThreadsPerCore": "2", "Partitions": "gpu"}
        fields.update({k.split("__")[1]: v for k, v in over.items() if k.split("__")[0] == n})
        lines.append(" ".join(f"{k}={v}" for k, v in fields.items())
                     + " OS=Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)"
                     + (" Reason=" + over[f"{n}__Reason"] if f"{n}__Reason" in over else ""))
    p = tmp / "show-node.txt"
    p.write_text("\n".join(lines) + "\n")
    return p


def _hw_layout() -> tuple[int, int, int, int]:
    from slurm_gpu.confgen.nodeline import socket_layout
    lay = socket_layout(snap.node_from_file(H100))
    return lay.cpus, lay.sockets, lay.cores_per_socket, lay.threads_per_core


def test_parse_show_node_oneliner_with_free_text() -> None:
    line = ("NodeName=gpu001 Arch=x86_64 CoresPerSocket=48 CPUAlloc=0 CPUTot=192 Gres=gpu:h100:8(S:0-1),mps:800 "
            "RealMemory=2000000 Sockets=2 State=IDLE+DRAIN ThreadsPerCore=2 Partitions=gpu,debug "
            "Reason=admin says CPUTot=1 Gres=gpu:9 [root@2026-01-01T00:00:00] Comment=Sockets=9")
    n = slurmview.parse_node_line(line)
    assert n is not None
    assert (n.cpus, n.sockets, n.cores_per_socket, n.threads_per_core, n.real_memory) == (192, 2, 48, 2, 2000000)
    assert slurmview.gpu_counts(n.gres) == {"h100": 8}
    assert n.unusable == "drained" and n.reason == "admin says CPUTot=1 Gres=gpu:9"
    assert n.partitions == ("gpu", "debug")
    down = slurmview.parse_node_line("NodeName=g2 CPUTot=4 State=DOWN* Gres=(null)")
    assert down is not None and down.unusable == "down" and down.gres == "" and "NOT_RESPONDING" in down.flags
    idle = slurmview.parse_node_line("NodeName=g3 State=IDLE*")
    assert idle is not None and idle.unusable == "not responding"
    assert slurmview.parse_node_line("garbage") is None


def test_gpu_counts_forms() -> None:
    assert slurmview.gpu_counts("gpu:4") == {"": 4}
    assert slurmview.gpu_counts("gpu:a100:2(S:0),gpu:h100:4(S:0-1),shard:8") == {"a100": 2, "h100": 4}
    assert slurmview.gpu_counts("") == {}


def test_store_reads_snapshots_and_models_and_lists_every_bad_entry(tmp_path: Path, recorded: dict) -> None:
    _write(tmp_path, "n1", recorded["healthy"])
    modelfile.publish(str(tmp_path), "n2", recorded["healthy"]["node"])
    (tmp_path / "n3.json").write_bytes(b"\x00\x01garbage")
    old = dict(recorded["healthy"], schema="slurm-gpu.snapshot/0")
    (tmp_path / "n4.json").write_text(json.dumps(old))
    full = (tmp_path / "n1.json").read_text()
    (tmp_path / "n5.json").write_text(full[: len(full) // 2])           # half-written
    (tmp_path / "n6.json").write_text("")
    text = (tmp_path / "n2.json").read_text()
    (tmp_path / "n7.json").write_text(text[:-200])                     # truncated model file
    (tmp_path / ".n8.json.abc.tmp").write_text("{")                    # an atomic write in progress
    os.mkfifo(tmp_path / "n9.json")                                     # named, never opened (it would block)
    (tmp_path / "n10.json").mkdir()
    col = store.load_dir(str(tmp_path))
    assert sorted(col.nodes) == ["n1", "n2"]
    assert col.nodes["n1"].gpus == col.nodes["n2"].gpus
    assert sorted(col.bad) == ["n10", "n3", "n4", "n5", "n6", "n7", "n9"]
    assert (col.bad["n9"].reason, col.bad["n10"].reason) == ("a FIFO, not a regular file",
                                                             "a directory, not a regular file")
    assert "not JSON" in col.bad["n3"].reason
    assert "unsupported schema 'slurm-gpu.snapshot/0'" in col.bad["n4"].reason
    assert "JSON" in col.bad["n5"].reason
    assert col.bad["n6"].reason == "empty file"
    assert "truncated" in col.bad["n7"].reason


def test_publish_writes_only_when_the_model_changed(tmp_path: Path, recorded: dict,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    node = recorded["healthy"]["node"]
    assert modelfile.publish(str(tmp_path), "n1", node) is True
    p = tmp_path / "n1.json"
    st = p.stat()
    # A later run, another second: the file's published_at would differ.
    later = modelfile.time.gmtime(modelfile.time.time() + 3600)
    monkeypatch.setattr(modelfile.time, "gmtime", lambda *a: later)
    assert modelfile.publish(str(tmp_path), "n1", json.loads(json.dumps(node))) is False
    assert p.stat().st_ino == st.st_ino and p.stat().st_mtime_ns == st.st_mtime_ns
    assert modelfile.publish(str(tmp_path), "n1", recorded["lost"]["node"]) is True
    assert p.stat().st_ino != st.st_ino
    doc = json.loads(p.read_text())
    assert doc["schema"] == modelfile.SCHEMA and doc["hash"] == modelfile.model_hash(recorded["lost"]["node"])
    assert list(doc)[:2] == ["schema", "hash"]


def test_publish_replaces_a_body_rewritten_under_the_right_hash(tmp_path: Path, recorded: dict) -> None:
    # Another node's root keeps n1's true hash in the head and changes the
    # body: the next publish must put n1's own model back.
    node = recorded["healthy"]["node"]
    assert modelfile.publish(str(tmp_path), "n1", node) is True
    p = tmp_path / "n1.json"
    doc = json.loads(p.read_text())
    doc["node"]["gpus"] = doc["node"]["gpus"][:1]
    p.write_text(json.dumps(doc, indent=1))
    assert modelfile.published_hash(str(p)) == modelfile.model_hash(node)
    assert modelfile.publish(str(tmp_path), "n1", node) is True
    assert json.loads(p.read_text())["node"] == json.loads(json.dumps(node))


def test_check_reports_the_node_lacking_a_gpu_and_folds_the_rest(tmp_path: Path, recorded: dict,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    names = [f"gpu{i:03d}" for i in range(1, 9)]
    d = tmp_path / "col"
    d.mkdir()
    for n in names:
        _write(d, n, recorded["lost" if n in ("gpu003", "gpu004") else "healthy"])
    cpus, sockets, cps, tpc = _hw_layout()
    over = {f"{n}__{k}": str(v) for n in names for k, v in
            (("CPUTot", cpus), ("Sockets", sockets), ("CoresPerSocket", cps), ("ThreadsPerCore", tpc))}
    over["gpu007__RealMemory"] = "99999999"
    sc = _scontrol(tmp_path, names, **over)
    gres = _gres_conf(tmp_path, names)
    rc = main(["cluster", "check", "--from", str(d), "--slurm-nodes-from", str(sc), "--gres-conf", str(gres),
               "--topology-conf", str(tmp_path / "none.conf")])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "8 node(s): 5 match, 3 differ" in out
    assert "gpu[003-004]: GPU 3 missing (gres.conf has /dev/nvidia3, the node does not)" in out
    assert "gpu[003-004]: Gres: Slurm gpu:nvidia_h100_80gb_hbm3:8, hardware gpu:nvidia_h100_80gb_hbm3:7" in out
    assert "gpu007: RealMemory: Slurm 99999999 MiB" in out
    assert "gpu001" not in out and "gpu008" not in out
    rc = main(["cluster", "check", "--from", str(d), "--slurm-nodes-from", str(sc), "--gres-conf", str(gres),
               "--nodes", "gpu[001-002,005-006]", "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert rc == 0 and rep["drift"] is False and rep["summary"] == {"nodes": 4, "match": 4, "differ": 0}


def test_check_lists_unreadable_uncollected_and_unknown_nodes(tmp_path: Path, recorded: dict,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "col"
    d.mkdir()
    _write(d, "n1", recorded["healthy"])
    _write(d, "stray", recorded["healthy"])
    (d / "n2.json").write_text("{\"schema\": \"slurm-gpu.snapshot/1\", \"hostn")
    sc = _scontrol(tmp_path, ["n1", "n2", "n3"], n3__State="IDLE+DRAIN")
    rc = main(["cluster", "check", "--from", str(d), "--slurm-nodes-from", str(sc), "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert rep["nodes"]["n2"][0].startswith("unreadable entry: bad snapshot JSON")
    assert rep["nodes"]["n3"] == ["no model collected (node drained)"]
    assert rep["nodes"]["stray"] == ["collected, but Slurm does not know this node"]


def test_check_names_a_missing_from_dir_before_asking_slurmctld(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from slurm_gpu.cluster import slurmview

    def no_slurmctld() -> None:
        raise AssertionError("slurmctld asked before --from was checked")
    monkeypatch.setattr(slurmview, "show_nodes", no_slurmctld)
    (tmp_path / "file").write_text("")
    for path, what in ((tmp_path / "nonexistent", "collection directory not found"),
                       (tmp_path / "file", "not a directory")):
        assert main(["cluster", "check", "--from", str(path)]) == 1
        err = capsys.readouterr().err
        assert err == f"slurm-gpu: {what} ({path})\n"


def test_render_gives_gres_topology_and_node_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gb = str(MACHINES_DIR / "gb200-nvl" / "snapshot.json")
    d = tmp_path / "col"
    d.mkdir()
    for i in range(1, 5):
        snap.write(str(d / f"nvl{i}.json"), snap.rerecord(gb, hostname=f"nvl{i}"))
    out = tmp_path / "out"
    assert main(["cluster", "render", "--from", str(d), "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["gres.conf", "nodes.conf", "topology.conf"]
    assert "NodeName=nvl[1-4]" in (out / "gres.conf").read_text()
    topo = (out / "topology.conf").read_text()
    assert "BlockName=block001 Nodes=nvl[1-4]" in topo
    assert (out / "nodes.conf").read_text().startswith("NodeName=nvl[1-4] CPUs=")
    (d / "nvl5.json").write_text("not json")
    capsys.readouterr()
    assert main(["cluster", "render", "--from", str(d)]) == 1
    assert "nvl5: unreadable entry" in capsys.readouterr().err
    # the same directory passes the topology check; a moved node is drift
    sc = _scontrol(tmp_path, [f"nvl{i}" for i in range(1, 5)])
    (tmp_path / "topo.conf").write_text("BlockName=b1 Nodes=nvl[1-3]\nBlockName=b2 Nodes=nvl4\nBlockSizes=2\n")
    (d / "nvl5.json").unlink()
    rc = main(["cluster", "check", "--from", str(d), "--slurm-nodes-from", str(sc),
               "--topology-conf", str(tmp_path / "topo.conf"), "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert rc == 1 and rep["topology"], rep


def test_health_check_publishes_only_a_changed_model(tmp_path: Path, recorded: dict,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    lost = tmp_path / "lost.json"
    snap.write(str(lost), recorded["lost"])
    pub = tmp_path / "pub"
    pub.mkdir()
    use_config(monkeypatch, tmp_path / "slurm-gpu.toml",
               f'[node]\nstate_dir = "{tmp_path}/state"\n[health]\nkernel_log = "/dev/null"\n'
               f'skip = ["os.thp", "os.swappiness", "os.governor", "os.memlock", "os.persistenced"]\n'
               f'[cluster]\npublish_dir = "{pub}"\n')

    def run(node: str, snapshot: str) -> None:
        assert main(["health", "--no-drain", "--node", node, "--snapshot", snapshot]) in (0, 1, 2)

    for n in ("n1", "n2"):
        run(n, H100)
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in pub.iterdir()}
    assert sorted(before) == ["n1.json", "n2.json"]
    run("n1", H100)
    run("n2", str(lost))
    after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in pub.iterdir()}
    assert after["n1.json"] == before["n1.json"]             # unchanged: not rewritten
    assert after["n2.json"] != before["n2.json"]             # changed: republished
    col = store.load_dir(str(pub))
    assert len(col.nodes["n1"].gpus) == 8 and len(col.nodes["n2"].gpus) == 7


def test_a_hung_publish_dir_is_left_behind_with_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The verdict is out before the publish: a publish_dir that never answers
    (a hung NFS server) must not hold the report until Slurm's kill."""
    import threading

    from slurm_gpu.cluster import modelfile
    from slurm_gpu.commands import health_run
    pub = tmp_path / "pub"
    pub.mkdir()
    use_config(monkeypatch, tmp_path / "slurm-gpu.toml",
               f'[node]\nstate_dir = "{tmp_path}/state"\n[health]\nkernel_log = "/dev/null"\n'
               f'[cluster]\npublish_dir = "{pub}"\n')
    release, entered = threading.Event(), threading.Event()

    def hung(*a: object, **kw: object) -> None:
        entered.set()
        release.wait(60)
    monkeypatch.setattr(modelfile, "publish_from_health", hung)
    monkeypatch.setattr(health_run, "PUBLISH_SECONDS", 0.2)
    try:
        rc = main(["health", "--no-drain", "--only", "gpu.xid", "--node", "n1", "--snapshot", H100])
        out = capsys.readouterr()
        assert entered.is_set() and rc == 0
        assert "slurm-gpu: health n1: ok" in out.out
        assert "model not published: [cluster] publish_dir did not answer in 0.2 s" in out.err
    finally:
        release.set()


def test_publish_replaces_a_fifo_or_symlink_without_blocking_or_following(tmp_path: Path, recorded: dict) -> None:
    import os
    node = recorded["healthy"]["node"]
    os.mkfifo(tmp_path / "n1.json")
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "n2.json").symlink_to(victim)
    assert modelfile.publish(str(tmp_path), "n1", node) is True      # would block forever on open(FIFO)
    assert modelfile.publish(str(tmp_path), "n2", node) is True
    assert victim.read_text() == "keep me"
    assert (tmp_path / "n1.json").is_file() and not (tmp_path / "n2.json").is_symlink()
    with pytest.raises(Exception):
        modelfile.node_file(str(tmp_path), "../etc")


def test_srun_reasons_per_node_and_general() -> None:
    from slurm_gpu.cluster.collect import srun_reasons
    per, general = srun_reasons(
        "srun: error: n5: task 4: Exited with exit code 1\n"
        "srun: error: n7: task 6: Killed\n"
        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
        "srun: error: Task launch for StepId=12.0 failed on node n9: Invalid node name specified\n"
        "srun: error: Unable to allocate resources: Invalid partition name specified\n")
    assert per == {"n5": "Exited with exit code 1", "n7": "Killed", "n9": "Invalid node name specified"}
    assert general == ["Unable to allocate resources: Invalid partition name specified"]


def test_srun_argv_one_task_per_node_and_passthrough() -> None:
    from slurm_gpu.cluster.collect import srun_argv
    argv = srun_argv(["n1", "n2", "n3"], "/d/.incoming-x", "/opt/v/bin/slurm-gpu", "abcd",
                     passthrough=["--reservation=hw"])
    assert argv[1:9] == ["--job-name=slurm-gpu-collect-abcd", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1",
                         "--nodelist=n[1-3]", "--no-kill", "--kill-on-bad-exit=0", "--output=/d/.incoming-x/%N.out"]
    assert "--reservation=hw" in argv
    assert argv[-5:] == ["/opt/v/bin/slurm-gpu", "snapshot", "record", "-o", "/d/.incoming-x/%n.json"]


def test_plan_skips_unusable_and_fails_unknown_nodes() -> None:
    from slurm_gpu.cluster.collect import plan
    slurm = slurmview.parse_show_nodes("NodeName=n1 State=IDLE\nNodeName=n2 State=DOWN* Reason=dead [root@x]\n"
                                       "NodeName=n3 State=MIXED+DRAIN Reason=maint [root@x]\n")
    run, early = plan(["n1", "n2", "n3", "n4"], slurm)
    assert run == ["n1"]
    assert {n: (o.status, o.detail) for n, o in early.items()} == {
        "n2": ("skipped", "node down: dead"), "n3": ("skipped", "node drained: maint"),
        "n4": ("failed", "unknown to Slurm")}


def test_collect_via_clush_exec_gathers_atomically_and_reports_bad_nodes(tmp_path: Path, recorded: dict) -> None:
    """ClusterShell's exec worker runs the real `snapshot record` once per node on this host.

    n2's machine file is half-written (record fails), n3's command prints
    garbage and exits 0, n4 hangs past the timeout; n1 and n5 are collected.
    """
    import os
    import stat
    from slurm_gpu.cluster.collect import via_clush
    machines = tmp_path / "machines"
    machines.mkdir()
    for n in ("n1", "n4", "n5"):
        (machines / f"{n}.json").symlink_to(H100)
    (machines / "n2.json").write_text(Path(H100).read_text()[:5000])
    cfg = tmp_path / "node.toml"
    cfg.write_text(f'[node]\nsnapshot = "{machines}/%n.json"\n')
    wrapper = tmp_path / "slurm-gpu"
    wrapper.write_text(f"""#!/bin/sh
case "$SLURMD_NODENAME" in
  n3) echo '{{"schema": "slurm-gpu.snapshot/1", "garbage'; exit 0 ;;
  n4) sleep 30 ;;
esac
SLURM_GPU_CONFIG={cfg} PYTHONPATH={ROOT} exec {sys.executable} -m slurm_gpu "$@"
""")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "col"
    out.mkdir()
    seen: list[str] = []
    res = via_clush(str(out), ["n1", "n2", "n3", "n4", "n5"], command=str(wrapper), timeout=5,
                    report=lambda o, done, total: seen.append(f"{done}/{total} {o.node} {o.status}"),
                    worker="exec")
    st = {n: (o.status, o.detail) for n, o in res.outcomes.items()}
    assert st["n1"] == ("collected", "8 GPU(s)") and st["n5"] == ("collected", "8 GPU(s)")
    assert st["n2"][0] == "failed" and "bad snapshot JSON" in st["n2"][1]
    assert st["n3"][0] == "failed" and st["n3"][1].startswith("bad snapshot:")
    assert st["n4"] == ("failed", "no answer within 5 s")
    assert len(seen) == 5 and seen[-1].startswith("5/5")
    assert sorted(os.listdir(out)) == ["n1.json", "n5.json"]          # no stage dir, no partial entry
    assert json.loads((out / "n1.json").read_text())["hostname"] == "n1"


@pytest.mark.parametrize("version", ["22.05", "24.11", "26.05"])
def test_real_scontrol_oneliner_of_every_supported_slurm(version: str, tmp_path: Path, recorded: dict,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "tests" / "data" / "slurm" / f"show-node-{version}.txt"
    nodes = slurmview.parse_show_nodes(path.read_text())
    assert sorted(nodes) == ["n1", "n2", "n3", "n4"]
    cpus, sockets, cps, tpc = _hw_layout()
    for n in nodes.values():
        assert (n.cpus, n.sockets, n.cores_per_socket, n.threads_per_core) == (cpus, sockets, cps, tpc)
        assert n.real_memory == 2097152 and n.partitions == ("debug",)
        assert slurmview.gpu_counts(n.gres) == {"nvidia_h100_80gb_hbm3": 8}
    assert nodes["n1"].unusable is None
    assert nodes["n2"].unusable == "drained"
    assert nodes["n2"].reason == "slurm-gpu: gpu.xid: Xid 79 on GPU 3 (fell off the bus)"
    d = tmp_path / "col"
    d.mkdir()
    for n in nodes:
        _write(d, n, recorded["lost" if n == "n3" else "healthy"])
    rc = main(["cluster", "check", "--from", str(d), "--slurm-nodes-from", str(path), "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert rc == 1 and [g["nodes"] for g in rep["groups"]] == ["n3"], rep


def test_check_with_an_autodetect_gres_conf_compares_counts_not_device_lines(
        tmp_path: Path, recorded: dict, capsys: pytest.CaptureFixture[str]) -> None:
    names = ["g1", "g2"]
    d = tmp_path / "col"
    d.mkdir()
    _write(d, "g1", recorded["healthy"])
    _write(d, "g2", recorded["lost"])
    cpus, sockets, cps, tpc = _hw_layout()
    over = {f"{n}__{k}": str(v) for n in names for k, v in
            (("CPUTot", cpus), ("Sockets", sockets), ("CoresPerSocket", cps), ("ThreadsPerCore", tpc))}
    sc = _scontrol(tmp_path, names, **over)
    gres = tmp_path / "gres.conf"
    gres.write_text("AutoDetect=nvml\n")
    rc = main(["cluster", "check", "--from", str(d), "--slurm-nodes-from", str(sc), "--gres-conf", str(gres),
               "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert rep["nodes"]["g1"] == []
    assert rep["nodes"]["g2"][0].startswith("Gres: Slurm gpu:nvidia_h100_80gb_hbm3:8, hardware "
                                            "gpu:nvidia_h100_80gb_hbm3:7")


def test_publish_interval_skips_the_step_until_due_or_reboot(tmp_path: Path, recorded: dict,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """With publish_interval, a run inside the interval neither derives nor touches the shared directory."""
    from slurm_gpu.cluster import modelfile as mf
    pub, state = tmp_path / "pub", tmp_path / "state"
    pub.mkdir()
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[cluster]\npublish_dir = "{pub}"\npublish_interval = 3600\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    boot = ["boot-a"]
    monkeypatch.setattr("slurm_gpu.hw.kmsg.boot_id", lambda: boot[0])
    healthy, lost = recorded["healthy"]["node"], recorded["lost"]["node"]
    assert mf.publish_from_health("n1", healthy, str(state)) is not None
    assert mf.publish_from_health("n1", lost, str(state)) is None          # inside the interval: skipped
    assert len(store.load_dir(str(pub)).nodes["n1"].gpus) == 8
    boot[0] = "boot-b"                                                       # a reboot: due at once
    assert mf.publish_from_health("n1", lost, str(state)) is not None
    assert len(store.load_dir(str(pub)).nodes["n1"].gpus) == 7
    (state / "cluster-publish.n1.json").write_text("{broken")               # a broken memo: due
    assert mf.publish_from_health("n1", healthy, str(state)) is not None


def _with_mig(node: dict, minor: int, profiles: list[str]) -> dict:
    """*node* with MIG mode on for GPU *minor* and these instances on it."""
    import copy
    out = copy.deepcopy(node)
    g = next(g for g in out["gpus"] if g["minor"] == minor)
    g["mig_enabled"] = True
    g["mig_instances"] = [{"gi_id": 7 + i, "ci_id": 0, "profile": p, "gi_profile_id": 19, "ci_profile_id": 0,
                           "placement_start": i, "placement_size": 1, "memory_bytes": 10 << 30, "sm_count": 16,
                           "uuid": f"MIG-job-{i}", "gi_cap_minor": None, "ci_cap_minor": None}
                          for i, p in enumerate(profiles)]
    return out


def test_a_jobs_own_mig_layout_is_never_published_as_the_nodes_hardware(
        tmp_path: Path, recorded: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 24 §3: while a --gpu-mig job runs, the published model keeps the node's baseline."""
    from slurm_gpu.cluster import modelfile as mf
    from slurm_gpu.jobs import state as jobstate
    pub, state = tmp_path / "pub", tmp_path / "state"
    pub.mkdir()
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[node]\nstate_dir = "{state}"\n[cluster]\npublish_dir = "{pub}"\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    baseline = _with_mig(recorded["healthy"]["node"], 0, [])             # MIG on, no instance: the admin's layout
    during = _with_mig(recorded["healthy"]["node"], 0, ["1g.10gb"] * 7)  # the job's own seven instances
    gpu0 = next(g for g in baseline["gpus"] if g["minor"] == 0)
    assert mf.publish_from_health("n1", baseline, str(state)) is not None
    first = (pub / "n1.json").stat().st_mtime_ns

    st = jobstate.new("4242", uid=1000, gid=1000, user="u")
    st.gpus = [{"index": 0, "uuid": gpu0["uuid"], "minor": 0}]
    st.mig = {"layout": "7x1g.10gb", "ready": True, "gpus": [
        {"index": 0, "uuid": gpu0["uuid"], "minor": 0, "model": "h100-80gb", "baseline": [],
         "baseline_removed": False, "instances": [{"profile": "1g.10gb", "gi_profile_id": 19, "start": i, "size": 1,
                                                   "gi_id": 7 + i, "ci_id": 0, "uuid": f"MIG-job-{i}"}
                                                  for i in range(7)]}]}
    jobstate.save(str(state), st)
    mf.publish_from_health("n1", during, str(state))
    col = store.load_dir(str(pub))
    g0 = next(g for g in col.nodes["n1"].gpus if g.minor == 0)
    assert g0.mig_enabled is True and g0.mig_instances == ()
    assert (pub / "n1.json").stat().st_mtime_ns == first                  # the baseline: nothing to rewrite
    capsys.readouterr()
    assert main(["cluster", "render", "--from", str(pub)]) == 0
    assert "1g.10gb" not in capsys.readouterr().out
    # Another GPU lost while the job runs: that is published, the job's layout still is not.
    bus3 = next(g["pci_bus_id"] for g in during["gpus"] if g["minor"] == 3)
    lost_during = dict(during, gpus=[g for g in during["gpus"] if g["pci_bus_id"] != bus3])
    assert mf.publish_from_health("n1", lost_during, str(state)) is not None
    n1 = store.load_dir(str(pub)).nodes["n1"]
    assert len(n1.gpus) == 7 and next(g for g in n1.gpus if g.minor == 0).mig_instances == ()
    # The job ended: what the node now has is published as before.
    jobstate.remove(str(state), "4242")
    assert mf.publish_from_health("n1", baseline, str(state)) is not None
    assert len(store.load_dir(str(pub)).nodes["n1"].gpus) == 8
    # A node that never published a baseline before a job changed its GPU publishes nothing.
    jobstate.save(str(state), st)
    fresh = tmp_path / "fresh-state"
    cfg.write_text(f'[node]\nstate_dir = "{fresh}"\n[cluster]\npublish_dir = "{pub}"\n')
    jobstate.save(str(fresh), st)
    note = mf.publish_from_health("n2", during, str(fresh))
    assert note == ("model not published: job 4242 holds its own MIG layout on GPU 0 and this node has no "
                    "baseline model yet")
    assert not (pub / "n2.json").exists()
