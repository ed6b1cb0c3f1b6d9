"""slurm-gpu doctor: each check over hand-made facts, the exit status, the CLI."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_gpu import doctor as d


def facts(tmp_path: Path, **kw) -> d.Facts:
    so = tmp_path / "slurm_gpu_spank.so"
    so.write_bytes(b"\x7fELF...slurm-gpu-spank built-for-slurm=24.11.5\0...")
    (tmp_path / "slurm_gpu_spank_py.so").write_bytes(b"")
    base = dict(slurm_conf_path="/etc/slurm/slurm.conf",
                conf={"prolog": "/etc/slurm/prolog.d/*", "epilog": "/etc/slurm/epilog.d/*",
                      "prologflags": "Alloc,Contain", "healthcheckprogram": "/usr/bin/hc",
                      "healthcheckinterval": "300", "healthchecknodestate": "ANY"},
                conf_readable=True, slurmd_version="24.11.5",
                plugstack_lines=[("/etc/slurm/plugstack.conf", f"required {so} config=/etc/x.toml")],
                plugin_built_for={str(so): d.plugin_built_for(str(so))},
                gres_drift=[], venv=str(tmp_path))
    base.update(kw)
    return d.Facts(**base)


def lines(f: d.Facts) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for x in d.run_checks(f):
        out.setdefault(x.check, []).append(x.line())
    return out


def test_healthy_node_is_ok(tmp_path):
    f = facts(tmp_path)
    assert d.worst(d.run_checks(f)) == d.OK, d.run_checks(f)
    assert lines(f)["spank.plugin"] == [f"OK spank.plugin: built for Slurm 24.11.5, slurmd is 24.11.5 "
                                        f"({tmp_path}/slurm_gpu_spank.so)"]


def test_plugin_built_for_another_slurm_is_critical(tmp_path):
    f = facts(tmp_path, slurmd_version="26.05.5")
    got = lines(f)["spank.plugin"]
    assert got[0].startswith("CRITICAL spank.plugin: built for Slurm 24.11.5 but slurmd is 26.05.5")
    assert d.worst(d.run_checks(f)) == d.CRITICAL
    # a patch release is fine: Slurm checks major.minor
    assert d.worst(d.run_checks(facts(tmp_path, slurmd_version="24.11.9"))) == d.OK


@pytest.mark.parametrize("change,check,status", [
    ({"plugstack_lines": []}, "spank.plugstack", "WARNING"),
    ({"conf": {"prolog": "/p", "epilog": "/e", "healthcheckprogram": "/h",
               "healthcheckinterval": "60"}}, "slurm.prologflags", "WARNING"),
    ({"conf": {}}, "slurm.healthcheck", "WARNING"),
    ({"gres_drift": ["~ n1 gpu 0: File=/dev/nvidia0 -> File=/dev/nvidia1"]}, "gres.conf", "CRITICAL"),
    ({"gres_drift": None, "gres_error": "NVML unavailable"}, "gres.conf", "UNKNOWN"),
    ({"venv_unreadable": "/opt/slurm-gpu/venv/lib"}, "venv", "CRITICAL"),
    ({"gpus_present": True, "persistenced": False}, "nvidia.persistenced", "WARNING"),
    ({"slurmd_version": None}, "slurm.version", "UNKNOWN"),
    ({"conf_readable": False}, "slurm.conf", "CRITICAL"),
    ({"slurmd_version": "22.05.8", "conf": {"grestypes": "gpu,shard"}}, "slurm.shared_gres", "WARNING"),
    ({"slurmd_version": "23.11.4", "conf": {"grestypes": "gpu,mps"}}, "slurm.shared_gres", "WARNING"),
])
def test_each_problem_is_one_line(tmp_path, change, check, status):
    f = facts(tmp_path, **change)
    found = [x for x in d.run_checks(f) if x.check == check and x.status != d.OK]
    assert found and d.NAMES[found[0].status] == status, d.run_checks(f)


def test_bad_plugstack_argument_and_optional_line(tmp_path):
    so = tmp_path / "slurm_gpu_spank.so"
    f = facts(tmp_path, plugstack_lines=[("p", f"optional {so} bogus=1")])
    got = "\n".join(lines(f)["spank.plugstack"])
    assert "WARNING spank.plugstack: 'optional' plugin" in got
    assert "CRITICAL spank.plugstack: unknown plugstack argument 'bogus=1'" in got


def test_plugin_without_record_is_reported(tmp_path):
    (tmp_path / "old").mkdir()
    so = tmp_path / "old" / "slurm_gpu_spank.so"
    so.write_bytes(b"\x7fELF old plugin")
    (tmp_path / "old" / "slurm_gpu_spank_py.so").write_bytes(b"")
    f = facts(tmp_path, plugstack_lines=[("p", f"required {so}")], plugin_built_for={str(so): None})
    assert any("records no Slurm version" in l for l in lines(f)["spank.plugin"])


def test_unreadable_venv_file_is_found(tmp_path):
    os.chmod(tmp_path, 0o755)
    (tmp_path / "lib").mkdir(mode=0o755)
    secret = tmp_path / "lib" / "x.py"
    secret.write_text("")
    os.chmod(secret, 0o600)
    assert d.first_unreadable(tmp_path) == str(secret)
    os.chmod(secret, 0o644)
    assert d.first_unreadable(tmp_path) is None


def test_slurm_conf_and_plugstack_parsing(tmp_path):
    (tmp_path / "plugstack.conf.d").mkdir()
    (tmp_path / "plugstack.conf.d" / "gpu.conf").write_text("required /x/slurm_gpu_spank.so\n")
    (tmp_path / "plugstack.conf").write_text(f"# c\ninclude {tmp_path}/plugstack.conf.d/*.conf\n"
                                             "optional /y/other.so a=b\n")
    (tmp_path / "extra.conf").write_text("HealthCheckInterval=30\n")
    conf = d.parse_slurm_conf("Prolog=/p/*  # x\nNodeName=n1 CPUs=2\nPrologFlags=Alloc\n"
                              "include extra.conf\n", tmp_path)
    assert conf == {"prolog": "/p/*", "prologflags": "Alloc", "healthcheckinterval": "30"}
    got = [l for _, l in d.plugstack_lines(tmp_path / "plugstack.conf")]
    assert got == ["required /x/slurm_gpu_spank.so", "optional /y/other.so a=b"]


def test_cli_json_and_exit_code(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from slurm_gpu.commands.doctor import doctor
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"PlugStackConfig={tmp_path}/plugstack.conf\nPrologFlags=Alloc\n")
    (tmp_path / "plugstack.conf").write_text("")
    res = CliRunner().invoke(doctor, ["--json", "--no-gres", "--slurm-conf", str(conf)])
    data = json.loads(res.output)
    assert res.exit_code == 1 and data["status"] == "WARNING"   # no plugin, prolog, health check
    assert {x["check"] for x in data["findings"]} >= {"spank.plugstack", "slurm.prolog",
                                                       "slurm.healthcheck", "venv"}


@pytest.mark.parametrize("change,status,text", [
    ({"gpus_present": True, "mps_control_stat": None}, "CRITICAL",
     "/usr/bin/nvidia-cuda-mps-control does not exist: every --gpu-mps job fails on this node"),
    ({"gpus_present": True, "mps_control_stat": (0, 0o100644)}, "CRITICAL", "is not an executable file"),
    ({"gpus_present": True, "mps_control_stat": (1000, 0o100755)}, "CRITICAL", "is not root's"),
    ({"gpus_present": True, "mps_control_stat": (0, 0o100775)}, "CRITICAL", "writable by group"),
    ({"gpus_present": True, "mps_control_stat": (0, 0o040755)}, "CRITICAL", "is not an executable file"),
    ({"gpus_present": True, "mps_control_stat": (0, 0o100755)}, "OK", "(root's, executable)"),
    ({"gpus_present": True, "mps_enabled": False}, "OK", "[mps] enabled = false"),
    ({"gpus_present": False, "mps_control_stat": None}, "OK", "no NVIDIA driver"),
    ({"mps_error": "config key mps.x"}, "UNKNOWN", "[mps] not read"),
])
def test_mps_control_binary_is_checked(tmp_path, change, status, text):
    """Issue 23 #5: [mps] control exists, is executable and root's (a node without it
    drained on every --gpu-mps job before)."""
    f = facts(tmp_path, mps_control="/usr/bin/nvidia-cuda-mps-control", **change)
    got = [x for x in d.run_checks(f) if x.check == "mps.control"]
    assert len(got) == 1 and d.NAMES[got[0].status] == status and text in got[0].message, got


def test_gather_reads_the_mps_settings(tmp_path, monkeypatch):
    ctl = tmp_path / "ctl"
    ctl.write_text("#!/bin/sh\n")
    ctl.chmod(0o755)
    conf = tmp_path / "slurm-gpu.toml"
    conf.write_text(f'[mps]\ncontrol = "{ctl}"\nenabled = false\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(conf))
    f = d.gather(slurm_conf=str(tmp_path / "slurm.conf"))
    assert (f.mps_enabled, f.mps_control, f.mps_control_stat) == \
        (False, str(ctl), (os.getuid(), os.stat(ctl).st_mode))


# ------------------------------------------------- [health] kernel_log: who wrote it

def test_a_kernel_log_that_cannot_prove_its_sender_is_a_warning(tmp_path):
    from slurm_gpu.hw import kmsg
    syslog = tmp_path / "messages"
    syslog.write_text("Nov 28 20:14:44 n1 systemd[1]: Started x.\nNov 28 20:14:45 n1 kernel: usb 1-1: new device\n")
    state, why = kmsg.sender_proof(str(syslog))
    assert state == "unproven" and "logger -t kernel" in why
    f = facts(tmp_path, kernel_log=(str(syslog), state, why))
    [got] = lines(f)["health.kernel_log"]
    assert got.startswith(f"WARNING health.kernel_log: {syslog} cannot prove who wrote its lines (")
    assert got.endswith("its GPU fault lines only warn, and drain or requeue only where NVML proves the GPU "
                        "dead; name /dev/kmsg (the default) or a journalctl -k -o export/json file")
    assert d.worst(d.run_checks(f)) == d.WARNING


@pytest.mark.parametrize("text", [
    "[    1.000000] usb 1-1: new device\n",                                  # dmesg
    "6,1234,5678,-;usb 1-1: new device\n",                                  # /dev/kmsg records (the sandbox's)
    '{"_TRANSPORT": "kernel", "MESSAGE": "usb 1-1: new device"}\n',         # journalctl -o json
])
def test_a_kernel_log_whose_format_proves_the_sender_is_ok(tmp_path, text):
    from slurm_gpu.hw import kmsg
    log = tmp_path / "k.log"
    log.write_text(text)
    state, why = kmsg.sender_proof(str(log))
    assert state == "proven", why
    assert lines(facts(tmp_path, kernel_log=(str(log), state, why)))["health.kernel_log"][0].startswith(
        f"OK health.kernel_log: {log}: ")
    assert kmsg.sender_proof("/dev/kmsg")[0] == "proven"


@pytest.mark.parametrize("text, says", [
    # Docker's json-file log: JSON, but no journald field says who sent it
    ('{"log":"[ 1.0] NVRM: Xid (PCI:0000:cb:00): 79, GPU has fallen off the bus.\\n","stream":"stdout",'
     '"time":"2026-11-28T20:14:44.1Z"}\n', "_TRANSPORT"),
    # kubelet's CRI container log
    ("2026-11-28T20:14:44.123456789Z stdout F [ 1.0] usb 1-1: new device\n", "container"),
    # journalctl -o verbose in its old, tab-indented form
    ("Sat 2026-11-28 20:14:44.000000 UTC [s=0123456789abcdef0123456789abcdef;i=1;b=0123456789abcdef0123456789abcdef;"
     "m=1;t=1;x=1]\n\t_TRANSPORT=kernel\n\tMESSAGE=usb 1-1: new device\n", "tab"),
])
def test_a_kernel_log_whose_every_xid_only_warns_is_not_called_proven(tmp_path, text, says):
    """The health check reads every line of these formats as unproven (a warning, never a
    drain): doctor must say so too, not "proven" from the lines' look."""
    from slurm_gpu.hw import kmsg
    log = tmp_path / "k.log"
    log.write_text(text * 3)
    state, why = kmsg.sender_proof(str(log))
    assert state == "unproven" and says in why, (state, why)
    got = lines(facts(tmp_path, kernel_log=(str(log), state, why)))["health.kernel_log"][0]
    assert got.startswith(f"WARNING health.kernel_log: {log} cannot prove who wrote its lines (")


def test_a_kernel_log_whose_first_line_nests_too_deep_is_judged_without_a_traceback(tmp_path):
    """A first line json.loads cannot take (RecursionError, not ValueError) is no journal
    record (kmsg_scan.journal_json, as the health check parses it): like a line cut at
    doctor's 4 KiB head, it says nothing of the sender, and the tail is judged."""
    from slurm_gpu.hw import kmsg
    log = tmp_path / "k.log"
    log.write_text('{"a": ' + "[" * 3000 + "\n[    1.000000] usb 1-1: new device\n")
    state, why = kmsg.sender_proof(str(log))
    assert state == "proven", (state, why)


def test_a_kernel_log_doctor_cannot_read_is_unknown(tmp_path):
    from slurm_gpu.hw import kmsg
    state, why = kmsg.sender_proof(str(tmp_path / "gone.log"))
    assert state == "unknown"
    assert lines(facts(tmp_path, kernel_log=(str(tmp_path / "gone.log"), state, why)))["health.kernel_log"][0] \
        .startswith(f"UNKNOWN health.kernel_log: {tmp_path}/gone.log: ")
    # A fresh node's file source (root's, no line yet) is fine: each line is
    # judged by its format when read (the VM's doctor test said UNKNOWN here).
    (tmp_path / "empty.log").write_text("")
    os.chmod(tmp_path / "empty.log", 0o644)
    state, why = kmsg.sender_proof(str(tmp_path / "empty.log"))
    assert state == "empty"
    assert lines(facts(tmp_path, kernel_log=(str(tmp_path / "empty.log"), state, why)))["health.kernel_log"][0] \
        .startswith(f"OK health.kernel_log: {tmp_path}/empty.log: empty so far")


def test_shared_gres_on_a_slurm_that_keeps_it_apart(tmp_path):
    """Slurm 23.11.5 fixed a GPU given whole while a gres/shard or gres/mps job runs on it
    (SchedMD commit 30eacbe571, bug 19110): before it, doctor says so where the node shares GPUs."""
    got = lines(facts(tmp_path, slurmd_version="22.05.8", conf={"grestypes": "gpu,shard"}))
    assert got["slurm.shared_gres"] == [
        "WARNING slurm.shared_gres: Slurm 22.05.8 can give a GPU whole (gres/gpu) while a gres/shard job "
        "still runs on it, once another gres/shard job on that GPU ends (fixed in 23.11.5: SchedMD bug 19110)"]
    for version, types in (("23.11.5", "gpu,shard"), ("24.11.5", "gpu,mps"), ("26.05.5", "gpu,shard"),
                           ("22.05.8", "gpu"), (None, "gpu,shard")):
        f = facts(tmp_path, slurmd_version=version, conf={"grestypes": types})
        assert "slurm.shared_gres" not in lines(f), (version, types)


@pytest.mark.parametrize("link", [False, True])
def test_proc_kmsg_as_the_kernel_log_is_refused_unread(tmp_path, monkeypatch, link):
    """/proc/kmsg is the kernel's syslog(2) buffer: each read takes its messages from
    the syslog daemon (rsyslog's imklog), and an empty one raised BlockingIOError in
    doctor (second hostile review, LOW).  Neither doctor nor the health check reads
    it; both name /dev/kmsg."""
    from slurm_gpu.errors import InputError
    from slurm_gpu.hw import kmsg
    src = "/proc/kmsg"
    if link:
        (tmp_path / "k").symlink_to(src)
        src = str(tmp_path / "k")
    monkeypatch.setattr(os, "pread", lambda *a: pytest.fail("read /proc/kmsg"))
    monkeypatch.setattr(os, "read", lambda *a: pytest.fail("read /proc/kmsg"))
    state, why = kmsg.sender_proof(src)
    assert (state, why) == ("unknown", kmsg.PROC_KMSG_WHY)
    assert lines(facts(tmp_path, kernel_log=(src, state, why)))["health.kernel_log"][0] == (
        f"UNKNOWN health.kernel_log: {src}: {kmsg.PROC_KMSG_WHY}")
    with pytest.raises(InputError) as e:
        kmsg.read_file(src)
    assert e.value.line() == f"slurm-gpu: kernel log is {kmsg.PROC_KMSG_WHY} ({src})"


@pytest.mark.parametrize("text, warns", [
    ("# mount_max = 1000\n#user_allow_other\n", False),          # fuse3's shipped file
    ("user_allow_other\n", True),
    ("  user_allow_other   \n", True),
    ("user_allow_other_x\n", False),
])
def test_fuse_user_allow_other_is_a_warning_where_mps_runs(tmp_path, text, warns):
    """With user_allow_other in /etc/fuse.conf a job's user can mount FUSE over their MPS
    directories that answers root too, and hold the prolog or epilog in a request their
    server never answers (fourth hostile review, M5).  fuse(8): the option lets
    non-root users use allow_other."""
    conf = tmp_path / "fuse.conf"
    conf.write_text(text)
    f = facts(tmp_path, fuse_allow_other=d.read_fuse_allow_other(str(conf)))
    got = lines(f).get("fuse.allow_other", [])
    if warns:
        assert got == [f"WARNING fuse.allow_other: {conf} sets user_allow_other: a job's user can mount "
                       "FUSE in their --gpu-mps directories that root's prolog and epilog then wait on "
                       "(remove it, or set [mps] enabled = false)"]
    else:
        assert got == []
    f = facts(tmp_path, fuse_allow_other=d.read_fuse_allow_other(str(conf)), mps_enabled=False)
    assert lines(f).get("fuse.allow_other", []) == []
    assert d.read_fuse_allow_other(str(tmp_path / "none")) is None
