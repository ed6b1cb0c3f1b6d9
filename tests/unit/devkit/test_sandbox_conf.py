"""Pure parts of the sandbox: config text, TOML writer, names, machine lookup."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from slurm_gpu.errors import InputError
from slurm_gpu.hw.model import Node
from slurm_gpu_devkit.sandbox import conf, machine, registry
from slurm_gpu_devkit.sandbox.layout import Layout
from slurm_gpu_devkit.sandbox.toml import dumps


def small_node(ngpus: int = 2) -> Node:
    cores = [{"index": i, "os_index": i, "package": i // 2, "numa_node": i // 2, "pus": [i]}
             for i in range(4)]
    return Node.from_dict({
        "hostname": "box",
        "packages": [{"index": p, "os_index": p, "cores": [2 * p, 2 * p + 1]} for p in range(2)],
        "numa_nodes": [{"index": p, "os_index": p, "memory_bytes": 8 << 30, "cores": [2 * p, 2 * p + 1],
                        "pus": [2 * p, 2 * p + 1]} for p in range(2)],
        "cores": cores,
        "gpus": [{"index": g, "minor": g, "uuid": f"GPU-{g}", "pci_bus_id": f"0000:{0x10 + g:02x}:00.0",
                  "pci_device_id": 0x2330, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 80 << 30,
                  "numa_nodes": [g % 2], "cores": [2 * (g % 2), 2 * (g % 2) + 1]} for g in range(ngpus)],
        "memory_bytes": 16 << 30,
    })


def spec(tmp_path: Path, **kw) -> conf.ClusterSpec:
    nodes = tuple(conf.NodeSpec(f"n{i}", "vm", "127.0.0.1", 20000 + i) for i in (1, 2))
    return conf.ClusterSpec(layout=Layout.of(tmp_path), machine="small", model=small_node(),
                            ctld_host="vm", ctld_addr="127.0.0.1", ctld_port=20000, nodes=nodes, **kw)


def settings(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "=" in line and not line.startswith(("NodeName", "PartitionName")):
            k, v = line.split("=", 1)
            out[k] = v
    return out


def test_slurm_conf_private_paths_ports_and_memory(tmp_path):
    text = conf.slurm_conf(spec(tmp_path))
    s = settings(text)
    assert s["SlurmctldPort"] == "20000"
    assert s["AuthInfo"] == f"socket={tmp_path}/munge/munge.sock"
    assert s["StateSaveLocation"] == f"{tmp_path}/state"
    assert s["SlurmdParameters"] == "config_overrides"
    # 16 GiB over 4 CPUs: each CPU's default share, so jobs do not serialize on memory.
    assert s["DefMemPerCPU"] == str(16 * 1024 // 4)
    assert s["ClusterName"] == Layout.of(tmp_path).cluster_name
    assert "Prolog" not in s and "HealthCheckProgram" not in s
    lines = [l for l in text.splitlines() if l.startswith("NodeName=")]
    assert lines[0].startswith("NodeName=n1 CPUs=4 Sockets=2 CoresPerSocket=2 ThreadsPerCore=1 "
                               "RealMemory=16384 Gres=gpu:nvidia_h100_80gb_hbm3:2")
    assert "NodeAddr=127.0.0.1 Port=20001" in lines[0]
    assert "Port=20002" in lines[1]


def test_slurm_conf_hooks_and_overrides(tmp_path):
    s = settings(conf.slurm_conf(spec(tmp_path, prolog=True, epilog=True, health_interval=3,
                                      extra={"slurmdparameters": "l3cache_as_socket",
                                             "KillWait": "2", "TopologyPlugin": "topology/tree"})))
    assert s["Prolog"] == f"{tmp_path}/etc/prolog.d/*"
    assert s["PrologFlags"] == "Alloc"
    assert s["Epilog"] == f"{tmp_path}/etc/epilog.d/*"
    assert s["HealthCheckProgram"] == f"{tmp_path}/etc/healthcheck"
    assert s["HealthCheckInterval"] == "3"
    assert s["SlurmdParameters"] == "config_overrides,l3cache_as_socket"
    assert s["KillWait"] == "2"
    assert s["TopologyPlugin"] == "topology/tree"


def test_gres_conf_points_at_fake_devices(tmp_path):
    text = conf.gres_conf(spec(tmp_path))
    gpu_lines = [l for l in text.splitlines() if l.startswith("NodeName=")]
    assert any(f"File={tmp_path}/dev/nvidia0" in l for l in gpu_lines)
    assert all(l.startswith("NodeName=n[1-2] ") for l in gpu_lines)


def test_wrapper_quotes_and_exports(tmp_path):
    lay = Layout.of(tmp_path / "it's here")
    text = conf.wrapper_script(lay, ["/opt/venv/bin/python", "/x/prolog.d/50 mps"], "prolog")
    assert text.startswith("#!/bin/sh\n")
    assert "export SLURM_CONF='" in text and "SLURM_GPU_CONFIG=" in text and "PATH=/usr/sbin:" in text
    assert text.rstrip().endswith("'/x/prolog.d/50 mps' \"$@\"")
    assert "'\"'\"'" in text  # the quote in the path is escaped, not interpreted


def test_every_task_gets_the_nodes_config_through_the_task_prolog(tmp_path):
    import subprocess
    lay = Layout.of(tmp_path / "it's here")
    assert settings(conf.slurm_conf(spec(tmp_path)))["TaskProlog"] == f"{tmp_path}/etc/task-prolog"
    script = tmp_path / "task-prolog"
    script.write_text(conf.task_prolog_script(lay))
    # What slurmd reads from a TaskProlog's stdout: "export NAME=value", one a line.
    out = subprocess.run(["/bin/sh", str(script)], capture_output=True, text=True, check=True).stdout
    assert out == f"export SLURM_GPU_CONFIG={tmp_path}/it's here/etc/slurm-gpu.toml\n"


def test_node_config_merges_node_section(tmp_path):
    lay = Layout.of(tmp_path)
    cfg = conf.node_config(lay, Path("/m/snapshot.json"),
                           {"node": {"nvml": "sim:/tmp/s.json"}, "health": {"kernel_log": "/k"}})
    assert cfg["node"] == {"state_dir": f"{tmp_path}/var/%n", "snapshot": "/m/snapshot.json",
                           "nvml": "sim:/tmp/s.json"}
    assert cfg["health"] == {"kernel_log": "/k"}


def test_toml_round_trips_through_tomllib():
    data = {"node": {"snapshot": 'a "quoted"\\path\n', "n": 3, "f": 0.5, "on": True,
                     "list": ["x", 1]},
            "odd section": {"key.with.dots": "v"}}
    assert tomllib.loads(dumps(data, "header\nline")) == data


def test_toml_rejects_unknown_types():
    with pytest.raises(TypeError):
        dumps({"s": {"k": object()}})


def test_net_blocks_are_disjoint_slash30s():
    seen = set()
    for b in (0, 1, 63, 64, registry.NET_BLOCKS - 1):
        host, node = registry.net_addrs(b)
        assert host.rsplit(".", 1)[0] == node.rsplit(".", 1)[0]
        assert int(node.rsplit(".", 1)[1]) == int(host.rsplit(".", 1)[1]) + 1
        assert host not in seen
        seen.add(host)
    assert registry.net_addrs(registry.NET_BLOCKS - 1) == ("10.214.255.253", "10.214.255.254")


def test_layout_names_are_unique_per_directory(tmp_path):
    a, b = Layout.of(tmp_path / "a"), Layout.of(tmp_path / "b")
    assert a.cluster_name != b.cluster_name
    assert Layout.of(tmp_path / "a" / ".." / "a").cluster_name == a.cluster_name
    assert len(f"sg{a.key}h99") <= 15  # Linux interface name limit


def test_unknown_machine_names_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv(machine.ENV_VAR, str(tmp_path))
    with pytest.raises(InputError) as e:
        machine.resolve("no-such-machine")
    assert "unknown machine 'no-such-machine'" in e.value.line()
    assert str(tmp_path) in e.value.line()


def test_machine_dir_without_model_files_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="neither snapshot.json nor hwloc.xml"):
        machine.resolve(str(tmp_path / "empty"))


def test_machine_found_by_name_in_search_path(tmp_path, monkeypatch):
    d = tmp_path / "box"
    d.mkdir()
    (d / "hwloc.xml").write_text("<topology/>")
    monkeypatch.setenv(machine.ENV_VAR, str(tmp_path))
    m = machine.resolve("box")
    assert m.hwloc_xml == d / "hwloc.xml" and m.snapshot is None


def test_cgroup_conf_survives_a_machine_without_systemd():
    # On cgroup v2 without a reachable systemd, slurmd dies unless it may make
    # the cgroups itself; every Slurm we run (22.05, 24.11, 26.05) reads this key.
    lines = conf.cgroup_conf().splitlines()
    assert "IgnoreSystemdOnFailure=yes" in lines
    assert "IgnoreSystemd=yes" not in lines    # systemd, when it answers, still owns the scopes
