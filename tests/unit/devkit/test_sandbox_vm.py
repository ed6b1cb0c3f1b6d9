"""The VM place's host side, without a VM: what it refuses, what it writes,
how it starts QEMU, and the guest's agent itself (run here on loopback)."""
from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_gpu.errors import SlurmGpuError, UsageError
from slurm_gpu_devkit.sandbox import machine, places, vm
from slurm_gpu_devkit.sandbox.options import SandboxOptions
from paths import ROOT

REPO = ROOT
AGENT = REPO / "scripts" / "vm" / "sg-vm-agent"


def mini():
    return machine.load(machine.resolve("mini-2numa"))


@pytest.mark.parametrize("tool,package", [("qemu-system-x86_64", "qemu-system-x86"),
                                          ("mke2fs", "e2fsprogs"), ("debootstrap", "debootstrap")])
def test_a_missing_tool_is_one_line_naming_its_debian_package(monkeypatch, tool, package) -> None:
    import shutil
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, path=None: None if name == tool else real(name, path=path))
    with pytest.raises(SlurmGpuError) as e:
        vm.require_tools({**vm.TOOLS, **vm.BUILD_TOOLS})
    assert f"{tool} is not installed (apt-get install {package})" in str(e.value)
    assert "\n" not in str(e.value)


def test_only_the_three_supported_slurms_run_in_a_vm() -> None:
    assert vm.suite_of(None) == ("22.05", "bookworm")
    assert vm.suite_of("24.11") == ("24.11", "trixie")
    assert vm.suite_of("26.05") == ("26.05", "sid")
    with pytest.raises(UsageError, match=r"22\.05, 24\.11, 26\.05"):
        vm.suite_of("23.02")


def test_the_vm_is_one_of_three_places_behind_one_interface() -> None:
    assert places.choose(SandboxOptions(vm=True)).name == "vm"
    assert {places.named(n).name for n in ("host", "debian-root", "vm")} == {"host", "debian-root", "vm"}
    assert places.named(None).name == "host"       # a state file from before places
    for p in (places.Host(), places.DebianRoot(), places.named("vm")):
        for method in ("prepare", "start", "client_argv", "run", "stop", "node_states", "fault"):
            assert callable(getattr(p, method)), (p.name, method)


def test_qemu_reaches_nothing_writes_no_image_and_fits_in_2_gib(tmp_path: Path) -> None:
    img = vm.Image(tmp_path)
    argv = vm.qemu_argv(img, tmp_path / "cfg.img", tmp_path / "console.log", 23456, "tcg", 2,
                        [[0], [1]])
    text = " ".join(argv)
    assert "user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:23456-:7000" in text   # loopback only
    assert f"file={img.root},format=raw,if=virtio,snapshot=on" in text          # cache untouched
    assert "readonly=on" in text and "-nodefaults" in argv and "-no-reboot" in argv
    # The guest's RAM and TCG's code buffer (QEMU's default: 1 GiB, resident
    # once filled), with ~200 MiB for QEMU itself, under 2 GiB.
    tb = int(argv[argv.index("-accel") + 1].removeprefix("tcg,tb-size="))
    assert int(argv[argv.index("-m") + 1]) + tb <= 2048 - 200
    kvm = vm.qemu_argv(img, tmp_path / "cfg.img", tmp_path / "console.log", 23456, "kvm", 2, [[0, 1]])
    assert kvm[kvm.index("-accel") + 1] == "kvm"
    # mini-2numa's two NUMA nodes, one CPU each, as the guest's own topology
    assert "node,nodeid=0,memdev=m0,cpus=0-0" in text and "node,nodeid=1,memdev=m1,cpus=1-1" in text
    assert vm.vm_topology(mini()) == (2, [[0], [1]])
    big = machine.load(machine.resolve("h100-sxm-8x"))
    assert vm.vm_topology(big) == (2, [[0, 1]])


def test_the_guest_runs_cgroup_v2_with_the_guides_own_lines() -> None:
    guide = vm.guide_hooks(prolog=True, health_interval=7, repo=REPO)
    settings, lines = vm.guest_settings("sgabc", mini(), ["n1", "n2"], version="24.11", guide=guide,
                                        gres_options={}, extra={"KillWait": "9"})
    s = dict(settings)
    assert s["ProctrackType"] == "proctrack/cgroup"
    assert s["TaskPlugin"] == "task/cgroup,task/affinity"
    assert s["Prolog"] == "/usr/lib/slurm-gpu/prolog.d/*" and s["Epilog"] == "/usr/lib/slurm-gpu/epilog.d/*"
    assert s["PrologFlags"] == "Alloc" and s["PrologEpilogTimeout"] == "180"
    assert s["HealthCheckProgram"] == "/usr/lib/slurm-gpu/healthcheck"
    assert s["HealthCheckInterval"] == "7"
    assert s["KillWait"] == "9" and "config_overrides" in s["SlurmdParameters"]
    assert s["SlurmctldPidFile"] == "/run/slurmctld/slurmctld.pid"     # 24.11's unit: User=slurm
    assert [l.split()[0] for l in lines] == ["NodeName=n1", "NodeName=n2"]
    assert "Port=6818" in lines[0] and "Port=6819" in lines[1]
    bare = dict(vm.guide_hooks(prolog=False, health_interval=None, repo=REPO))
    assert bare == {"ProctrackType": "proctrack/cgroup", "TaskPlugin": "task/cgroup,task/affinity",
                    "GresTypes": "gpu"}
    assert [l.split("#")[0].strip() for l in vm.guide_block("cgroup.conf", REPO).splitlines()] == [
        "CgroupPlugin=autodetect", "ConstrainCores=yes", "ConstrainDevices=yes", "ConstrainRAMSpace=yes"]


def test_the_config_disk_tree(tmp_path: Path) -> None:
    settings, lines = vm.guest_settings("sgabc", mini(), ["n1", "n2"], version="22.05",
                                        guide=vm.guide_hooks(False, None, REPO), gres_options={},
                                        extra={})
    d = tmp_path / "cfg"
    vm.config_tree(d, token="t0k", settings=settings, cgroup_conf="ConstrainDevices=yes\n",
                   node_lines=lines, gres_conf="# gres\n",
                   plugstack=["required x.so"], toml_text="[node]\n", munge_key=b"k" * 32,
                   names=["n1", "n2"], devices=[("/dev/nvidia0", 195, 0), ("/dev/nvidiactl", 195, 255)],
                   extra_files={"/etc/slurm-gpu/machine/snapshot.json": b"{}"}, machine="mini")
    f = d / "files"
    assert "ProctrackType=proctrack/cgroup" in (f / "etc/slurm/slurm.conf").read_text()
    assert "ConstrainDevices=yes" in (f / "etc/slurm/cgroup.conf").read_text().splitlines()
    assert stat.S_IMODE((f / "etc/munge/munge.key").stat().st_mode) == 0o400
    assert stat.S_IMODE((d / "token").stat().st_mode) == 0o400
    assert stat.S_IMODE(d.stat().st_mode) == 0o700          # the token and key: root's alone
    disk = tmp_path / "cfg.img"
    vm.make_config_disk(d, disk)
    assert stat.S_IMODE(disk.stat().st_mode) == 0o600 and disk.stat().st_size == 32 << 20
    assert (d / "devices").read_text() == "/dev/nvidia0 195 0 0666\n/dev/nvidiactl 195 255 0666\n"
    assert (f / "etc/default/slurmd").read_text() == 'SLURMD_OPTIONS="-N n1"\n'
    assert "slurmd@n2.service" in (d / "setup.sh").read_text()
    assert (f / "etc/slurm/plugstack.conf.d/slurm-gpu.conf").read_text() == "required x.so\n"


def test_a_vm_that_exits_during_boot_is_one_line_with_its_console_tail(tmp_path: Path) -> None:
    console = tmp_path / "console.log"
    console.write_text("[    0.1] Linux version 6.1\r\n[    2.0] Kernel panic - not syncing: VFS\r\n")
    agent = vm.Agent(1, "x")        # nothing listens on port 1
    with pytest.raises(SlurmGpuError) as e:
        vm.wait_boot(agent, console, 60.0, alive=lambda: False)
    msg = str(e.value)
    assert "\n" not in msg and "exited during boot" in msg and "Kernel panic - not syncing: VFS" in msg


@pytest.fixture
def agent(tmp_path: Path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, str(AGENT)],
                         env={**os.environ, "SG_VM_AGENT_TOKEN": str(token),
                              "SG_VM_AGENT_PORT": str(port), "SG_VM_AGENT_ADDR": "127.0.0.1"})
    try:
        a = vm.Agent(port, "s3cret")
        while not a.ping(1.0):
            assert p.poll() is None, "the agent exited"
            time.sleep(0.05)
        yield a
    finally:
        p.kill()
        p.wait()


def test_the_agent_runs_commands_and_refuses_a_wrong_token(agent: vm.Agent) -> None:
    r = agent.run(["sh", "-c", "echo out; echo err >&2; cat; exit 3"], stdin=b"in\n", timeout=30)
    assert (r.returncode, r.stdout, r.stderr) == (3, "out\nin\n", "err\n")
    assert agent.run(["/nonexistent"], timeout=5).returncode == 127
    bad = vm.Agent(agent.port, "wrong")
    r = bad.run(["touch", "/tmp/should-not-exist"], timeout=5)
    assert r.returncode == 126 and "bad token" in r.stderr
    assert not bad.ping()


@pytest.mark.parametrize("v2_base", ["", "unified/"])
def test_down_removes_a_nodes_empty_cgroups_on_v1_and_v2(tmp_path: Path, v2_base: str) -> None:
    """cgroup/v1 names a node's cgroups slurm_<node>; cgroup/v2 <node>_slurmstepd.scope
    under system.slice (at the root, or in a hybrid's unified mount).  Both go at down."""
    from slurm_gpu_devkit.sandbox import teardown
    v1 = tmp_path / "memory" / "slurm_n1" / "uid_0" / "job_3"
    v2 = tmp_path / v2_base / "system.slice" / "n1_slurmstepd.scope" / "job_3" / "step_0"
    other = tmp_path / v2_base / "system.slice" / "n2_slurmstepd.scope"
    for d in (v1, v2, other):
        d.mkdir(parents=True)
    teardown.remove_cgroups(["n1"], root=tmp_path)
    assert not (tmp_path / "memory" / "slurm_n1").exists()
    assert not (tmp_path / v2_base / "system.slice" / "n1_slurmstepd.scope").exists()
    assert other.is_dir()


@pytest.mark.parametrize("flag, option, why", [
    ("--netns", "netns", "the VM's nodes share the guest's one network stack"),
    ("--accounting", "accounting", "the VM's image has no slurmdbd and no MariaDB"),
])
def test_netns_and_accounting_are_refused_with_one_line_before_anything_starts(
        tmp_path: Path, monkeypatch, flag: str, option: str, why: str) -> None:
    from types import SimpleNamespace
    from slurm_gpu_devkit.sandbox import vmplace
    touched: list[str] = []
    monkeypatch.setattr(vm, "require_tools", lambda tools: touched.append("tools"))
    monkeypatch.setattr(vm, "ensure_image", lambda *a: touched.append("image"))
    sb = SimpleNamespace(options=SandboxOptions(vm=True, **{option: True}), layout=None)
    with pytest.raises(UsageError) as e:
        vmplace.Vm().prepare(sb)
    line = e.value.line()
    assert line.startswith(f"slurm-gpu: {flag} is not available with --vm: {why}") and \
        line.endswith(" (sandbox up --vm)") and "\n" not in line, line
    assert e.value.exit_code == 2 and touched == []
