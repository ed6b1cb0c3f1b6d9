"""Per-job IMEX domains: the prolog/epilog flow (slurm_gpu.imex.job) over the
test rig's nvidia-imex stand-in, two or three "nodes" on 127.0.0.x of this host."""
from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu import hw
from slurm_gpu.imex import domain, job
from slurm_gpu.imex.settings import ImexSettings
from slurm_gpu_devkit.sim.imex_standin import write_wrappers
from paths import ROOT

MACHINES = ROOT / "tests" / "data" / "machines"
GB200 = MACHINES / "gb200-nvl" / "snapshot.json"
H100 = MACHINES / "h100-sxm-8x" / "snapshot.json"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the job directory is root's")


def _model(path: Path, clique: int | None = None) -> dict[str, Any]:
    d = hw.load_node(hw.Snapshot(str(path))).to_dict()
    if clique is not None:
        for g in d["gpus"]:
            g["fabric"]["clique_id"] = clique
    return d


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Rig:
    def __init__(self, tmp: Path, nodes: dict[str, dict[str, Any]]) -> None:
        self.tmp = tmp
        self.publish = tmp / "models"
        self.publish.mkdir()
        for name, model in nodes.items():
            (self.publish / f"{name}.json").write_text(json.dumps({"schema": "x", "node": model}))
        self.names = list(nodes)
        self.models = dict(nodes)           # what each node's own NVML says
        lines = [f"NodeName={n} NodeAddr=127.0.0.{i + 1} CPUs=1" for i, n in enumerate(self.names)]
        self.slurm_conf = tmp / "slurm.conf"
        self.slurm_conf.write_text("ClusterName=t\n" + "\n".join(lines) + "\n")
        # Ports the kernel hands out now: a fixed port can be held by another
        # test's daemon, or sit in TIME_WAIT after the previous test (CI saw
        # EADDRINUSE on the squatter's bind).
        self.port = _free_port()
        self.cmd_ports = {n: _free_port() for n in nodes}
        self.logs: dict[str, list[str]] = {n: [] for n in nodes}
        self.cancelled: list[str] = []

    def ctx(self, name: str, env: dict[str, str], fault: str = "", **kw: Any) -> job.Ctx:
        d = self.tmp / f"bin-{name}"
        d.mkdir(exist_ok=True)
        ff = ""
        if fault:
            (d / "fault").write_text(fault)
            ff = str(d / "fault")
        daemon, ctl = write_wrappers(str(d), sys.executable, ff)
        s = ImexSettings(mode="per-job", daemon=daemon, ctl=ctl, base_dir=str(self.tmp / f"run-{name}"),
                         base_config=str(self.tmp / "no-base.cfg"), port_base=self.port, port_range=1,
                         cmd_port=self.cmd_ports[name], channels="off", **kw)
        own = self.models[name]
        return job.Ctx({"SLURM_CONF": str(self.slurm_conf), **env}, vars(s), str(self.publish), name,
                       log=self.logs[name].append, cancel=self.cancelled.append,
                       own_gpus=lambda: own.get("gpus") or [])


def _env(jobid: str, nodelist: str, gpus: str = "0,1,2,3") -> dict[str, str]:
    return {"SLURM_JOB_ID": jobid, "SLURM_JOB_NODELIST": nodelist, "SLURM_JOB_GPUS": gpus,
            "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0"}


def _both(ctxs: list[job.Ctx]) -> list[int]:
    rcs = [0] * len(ctxs)

    def run(i: int) -> None:
        rcs[i] = job.prolog(ctxs[i])

    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(ctxs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    return rcs


def _alive(st: dict[str, Any]) -> bool:
    from slurm_gpu.imex import daemon
    return daemon.alive(st["daemon"])


def test_two_exclusive_nodes_get_one_ready_domain_and_the_epilog_removes_it(tmp_path: Path, monkeypatch,
                                                                           capsys) -> None:
    rig = Rig(tmp_path, {"n1": _model(GB200), "n2": _model(GB200)})
    ctxs = [rig.ctx(n, _env("4242", "n[1-2]"), timeout=20.0) for n in ("n1", "n2")]
    assert _both(ctxs) == [0, 0], rig.logs
    states = [job.load(c.imex["base_dir"], "4242") for c in ctxs]
    for st in states:
        assert st and st["phase"] == "ready" and st["nodes"] == ["n1", "n2"], st
        assert st["addresses"] == ["127.0.0.1", "127.0.0.2"] and _alive(st)
    # every node writes the same nodes file: the IP map IMEX insists on
    files = {Path(c.imex["base_dir"], "4242", "nodes_config.cfg").read_text() for c in ctxs}
    assert files == {"127.0.0.1\n127.0.0.2\n"}
    cfg = Path(ctxs[0].imex["base_dir"], "4242", "config.cfg").read_text()
    assert f"SERVER_PORT={rig.port}\n" in cfg and "IMEX_WAIT_FOR_QUORUM=NONE\n" in cfg
    # `slurm-gpu imex status` inside the job: the domain, its nodes, each one's state
    conf = tmp_path / "n1.toml"
    conf.write_text(f'[imex]\nbase_dir = "{ctxs[0].imex["base_dir"]}"\nctl = "{ctxs[0].imex["ctl"]}"\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(conf))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    from slurm_gpu import config
    from slurm_gpu.cli import main
    config.clear_cache()
    assert main(["imex", "status"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("job 4242  node n1  IMEX domain 7e3f1c22-") and out[0].endswith("status UP")
    assert [ln.split() for ln in out[1:]] == [["n1", "127.0.0.1", "READY"], ["n2", "127.0.0.2", "READY"]]
    assert main(["imex", "status", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ready"] and [n["state"] for n in doc["nodes"]] == ["READY", "READY"]
    for c, st in zip(ctxs, states):
        assert job.epilog(c) == 0 and job.epilog(c) == 0       # idempotent
        assert not _alive(st) and not Path(c.imex["base_dir"], "4242").exists()
    assert rig.cancelled == []


def test_a_peer_that_never_joins_fails_the_job_and_names_it_its_own_failure_drains(tmp_path: Path) -> None:
    rig = Rig(tmp_path, {"n1": _model(GB200), "n2": _model(GB200)})
    ok = rig.ctx("n1", _env("77", "n[1-2]"), timeout=1.5)
    bad = rig.ctx("n2", _env("77", "n[1-2]"), fault="no-start", timeout=1.5)
    assert _both([ok, bad]) == [0, 1]
    assert rig.cancelled == ["77"]
    line = next(m for m in rig.logs["n1"] if "not UP" in m)
    assert "peer(s) n2 (UNAVAILABLE) not READY" in line and "this node stays up" in line
    assert any("this node's nvidia-imex exited" in m and "node fault" in m for m in rig.logs["n2"])
    st = job.load(ok.imex["base_dir"], "77")
    assert st and st["phase"] == "failed" and not _alive(st)
    assert job.epilog(ok) == 0 and job.epilog(bad) == 0
    assert not Path(ok.imex["base_dir"], "77").exists()


def test_a_port_another_process_holds_fails_the_job_never_drains(tmp_path: Path) -> None:
    # A process of another job on the node (or an outgoing connection) took
    # the job's port first: the job fails, the node stays up, no daemon runs.
    import socket
    rig = Rig(tmp_path, {"n1": _model(GB200), "n2": _model(GB200)})
    c = rig.ctx("n1", _env("41", "n[1-2]"), timeout=1.5)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", c.imex["port_base"]))
        squatter.listen()
        assert job.prolog(c) == 0
    assert rig.cancelled == ["41"]
    assert any("is taken by another process" in m and "this node stays up" in m for m in rig.logs["n1"])
    st = job.load(c.imex["base_dir"], "41")
    assert st and st["phase"] == "failed" and not st.get("daemon")
    assert job.epilog(c) == 0


def test_a_shared_node_is_refused_with_one_line_and_no_daemon(tmp_path: Path) -> None:
    rig = Rig(tmp_path, {"n1": _model(GB200), "n2": _model(GB200)})
    c = rig.ctx("n1", _env("9", "n[1-2]", gpus="0,1"))
    assert job.prolog(c) == 0
    (line,) = rig.logs["n1"]
    assert line == ("slurm-gpu: imex: job 9: shares node n1 (holds 2 of 4 GPUs): per-job IMEX "
                    "needs whole nodes (--exclusive); no IMEX domain")
    st = job.load(c.imex["base_dir"], "9")
    assert st and st["phase"] == "refused" and "daemon" not in st
    from slurm_gpu.commands.imex import status_of
    got = status_of(c.imex["base_dir"], c.imex["ctl"], "9")
    assert not got["ready"] and got["error"] == line


def test_imex_status_exit_codes(tmp_path: Path, monkeypatch, capsys) -> None:
    from slurm_gpu import config
    from slurm_gpu.cli import main
    base = tmp_path / "imex"
    (base / "9").mkdir(parents=True)
    (base / "9" / "state.json").write_text('{"jobid": "9", "node": "n1", "phase": "refused", '
                                           '"error": "slurm-gpu: imex: job 9: shares node n1"}')
    conf = tmp_path / "c.toml"
    conf.write_text(f'[imex]\nbase_dir = "{base}"\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(conf))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    config.clear_cache()
    assert main(["imex", "status", "--job", "9"]) == 1
    assert "slurm-gpu: imex: job 9: shares node n1" in capsys.readouterr().out
    assert main(["imex", "status", "--job", "10"]) == 1
    assert capsys.readouterr().err.strip() == f"slurm-gpu: job 10 has no IMEX domain on this node ({base})"
    assert main(["imex", "status", "--job", "x/1"]) == 2
    assert main(["imex", "status"]) == 2
    assert "run it inside a job" in capsys.readouterr().err


def test_a_node_without_nvlink_fabric_is_left_alone(tmp_path: Path) -> None:
    rig = Rig(tmp_path, {"n1": _model(H100)})
    c = rig.ctx("n1", _env("9", "n1", gpus="0,1,2,3,4,5,6,7"))
    assert job.prolog(c) == 0 and rig.logs["n1"] == []
    assert not Path(c.imex["base_dir"], "9").exists()


def test_one_domain_per_nvlink_domain() -> None:
    a, b = _model(GB200), _model(GB200, clique=7)
    doms = {"n1": domain.fabric_domain(a)[0], "n2": domain.fabric_domain(a)[0],
            "n3": domain.fabric_domain(b)[0], "n4": None}
    assert doms["n1"] != doms["n3"] and doms["n1"] and doms["n1"].endswith("/32766")
    assert domain.group(["n1", "n3", "n2", "n4"], doms, "n1") == (["n1", "n2"], ["n3", "n4"])
    assert domain.group(["n1", "n3", "n2", "n4"], doms, "n3") == (["n3"], ["n1", "n2", "n4"])
    assert domain.fabric_domain(_model(H100)) == (None, "no NVLink fabric")


@pytest.mark.parametrize("nodelist", ["n1,../../etc/passwd", "n1,n$(reboot)", "n1,'x'", "n[1-999999999]"])
def test_a_hostile_nodelist_fails_the_job_never_reaches_a_file_or_the_config(tmp_path: Path,
                                                                             nodelist: str) -> None:
    rig = Rig(tmp_path, {"n1": _model(GB200)})
    c = rig.ctx("n1", _env("5", nodelist))
    assert job.prolog(c) == 0
    assert rig.cancelled == ["5"] and "the job fails" in rig.logs["n1"][-1]
    assert not Path(c.imex["base_dir"], "5", "nodes_config.cfg").exists()


def test_the_port_rotates_per_job_and_the_site_config_is_kept_but_ours_wins() -> None:
    assert domain.server_port("33", 33792, 16384) == 33825
    assert domain.server_port(str(16384 + 33), 33792, 16384) == 33825 != domain.server_port("34", 33792, 16384)
    text = domain.render_config("IMEX_ENABLE_AUTH_ENCRYPTION=1\nSERVER_PORT=50000\n# note\n",
                                {"SERVER_PORT": "33825", "DAEMONIZE": "0"})
    assert text.splitlines()[1:] == ["IMEX_ENABLE_AUTH_ENCRYPTION=1", "# note", "SERVER_PORT=33825", "DAEMONIZE=0"]


def test_the_sh_gates_start_python_only_for_per_job_mode_and_a_left_job_dir(tmp_path: Path) -> None:
    import subprocess
    repo = ROOT
    marker = tmp_path / "python-started"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\n")
    fake.chmod(0o755)
    conf = tmp_path / "sg.toml"
    base = tmp_path / "imex-%n"
    env = {"PATH": "/usr/bin:/bin", "SLURM_GPU_CONFIG": str(conf), "SLURM_GPU_PYTHON": str(fake),
           "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"}

    def runs(kind: str) -> bool:
        marker.unlink(missing_ok=True)
        script = next((repo / f"{kind}.d").glob("*-slurm-gpu-imex"))
        res = subprocess.run(["/bin/sh", str(script)], env=env, capture_output=True, timeout=30)
        assert res.returncode == 0, res.stderr
        return marker.exists()

    for text in ("", '[imex]\n# mode = "per-job"\n', '[imex]\nmode = "off"\n',
                 '[other]\nmode = "per-job"\n[imex]\n'):
        conf.write_text(text)
        assert not runs("prolog") and not runs("epilog"), text
    conf.write_text(f'[imex]\nmode = "per-job"   # on\nbase_dir = "{base}"\n')
    assert runs("prolog") and not runs("epilog")
    (tmp_path / "imex-n1" / "7").mkdir(parents=True)
    assert runs("epilog")
    conf.write_text(f"[imex]\nmode = 'off'\nbase_dir = '{base}'\n")   # turned off with a job left
    assert not runs("prolog") and runs("epilog")


def test_imex_domains_are_topology_blocks_domains() -> None:
    # one IMEX domain per NVLink domain is one per topology/block base block
    # (confgen.block), which is where Slurm's per-segment channels match
    import copy

    from slurm_gpu.confgen.block import node_domain
    from slurm_gpu.hw.model import Node
    base = _model(GB200)
    variants = [base, _model(GB200, clique=5), _model(H100)]
    v = copy.deepcopy(base)
    v["gpus"][1]["fabric"]["state"] = "in_progress"
    variants.append(v)
    v = copy.deepcopy(base)
    v["gpus"][2]["fabric"]["clique_id"] = 9
    variants.append(v)
    for d in variants:
        assert domain.fabric_domain(d)[0] == node_domain("n1", Node.from_dict(d))[0]


def test_the_channel_is_the_job_users_alone_and_the_switch_plugin_keeps_its_own(tmp_path: Path) -> None:
    import stat as st
    proc = tmp_path / "devices"
    proc.write_text("Character devices:\n195 nvidia\n234 nvidia-caps-imex-channels\n")
    path = job.make_channel(str(tmp_path / "ch"), 3, 4321, 4322, str(proc))
    s = os.lstat(path)
    assert path.endswith("/ch/channel3") and st.S_ISCHR(s.st_mode) and st.S_IMODE(s.st_mode) == 0o600
    assert (os.major(s.st_rdev), os.minor(s.st_rdev), s.st_uid, s.st_gid) == (234, 3, 4321, 4322)
    proc.write_text("Character devices:\n195 nvidia\n")
    from slurm_gpu.errors import HardwareError
    with pytest.raises(HardwareError, match="no nvidia-caps-imex-channels"):
        job.make_channel(str(tmp_path / "ch"), 3, 1, 1, str(proc))
    conf = tmp_path / "slurm.conf"
    conf.write_text("SwitchType=switch/nvidia_imex\n")
    assert job.channel_mode({"channels": "auto"}, str(conf)) == "slurm"
    conf.write_text("SwitchType=switch/none\n")
    assert job.channel_mode({"channels": "auto"}, str(conf)) == "create"
    assert job.channel_mode({"channels": "off"}, str(conf)) == "off"


def test_a_requeued_job_stops_what_its_earlier_run_left(tmp_path: Path) -> None:
    rig = Rig(tmp_path, {"n1": _model(GB200)})
    c = rig.ctx("n1", _env("31", "n1"), timeout=10.0)
    assert job.prolog(c) == 0
    first = job.load(c.imex["base_dir"], "31")
    assert first and _alive(first)
    assert job.prolog(c) == 0                   # no epilog in between (slurmd restarted, requeue)
    second = job.load(c.imex["base_dir"], "31")
    assert second and second["phase"] == "ready" and _alive(second) and not _alive(first)
    assert any("earlier run: nvidia-imex" in m for m in rig.logs["n1"])
    assert job.epilog(c) == 0 and not _alive(second)


def test_the_event_log_keeps_what_slurmd_throws_away(tmp_path: Path, capfd) -> None:
    log = job.event_logger(str(tmp_path))
    log("slurm-gpu: imex: job 1: something")
    assert capfd.readouterr().err == "slurm-gpu: imex: job 1: something\n"
    assert (tmp_path / "events.log").read_text().endswith(" slurm-gpu: imex: job 1: something\n")
    (tmp_path / "events.log").write_text("x" * (job.EVENTS_MAX + 1))
    log("next")
    assert (tmp_path / "events.log.1").stat().st_size > job.EVENTS_MAX
    assert (tmp_path / "events.log").read_text().endswith(" next\n")


def test_the_epilog_path_imports_no_json_re_or_socket() -> None:
    import subprocess
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            "from slurm_gpu.imex import hook, teardown, settings; "
            "from slurm_gpu import config, nodefacts; from slurm_gpu.hw import live; "
            "from slurm_gpu.jobs import settings as js; from slurm_gpu.jobs.__main__ import _watchdog; "
            "bad = {'json', 're', 'socket', 'slurm_gpu.imex.job', 'ClusterShell'} & set(sys.modules); "
            "print(sorted(bad))")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=str(ROOT))
    assert out.stdout.strip() == "[]", out


def test_a_published_model_others_could_write_does_not_choose_the_peers(tmp_path: Path) -> None:
    # The same trust rule as cluster check: a model file group- or
    # world-writable (a share users can write) is no model.
    doc = {"node": {"name": "g1", "gpus": []}}
    f = tmp_path / "g1.json"
    f.write_text(json.dumps(doc))
    os.chmod(f, 0o644)
    assert job.read_model(str(tmp_path), "g1") == doc["node"]
    os.chmod(f, 0o666)
    assert job.read_model(str(tmp_path), "g1") is None


def test_no_job_port_is_the_command_port() -> None:
    # With the old defaults (33792 + jobid % 16384, command port 50005) job
    # 16213 was given SERVER_PORT 50005, the port of IMEX_CMD_PORT.
    from slurm_gpu.errors import InputError
    from slurm_gpu.imex.settings import check
    d = ImexSettings()
    assert not d.port_base <= d.cmd_port < d.port_base + d.port_range
    with pytest.raises(InputError, match="imex.cmd_port 50005 lies in the job ports 40000-50999"):
        check(ImexSettings(port_base=40000, port_range=11000), "t.toml")


def test_a_port_taken_between_the_check_and_the_daemons_bind_fails_the_job_never_drains(
        tmp_path: Path, monkeypatch) -> None:
    # A user's process listens on the job's port just after the prolog's check
    # (the race a hostile review won 5 of 5): nvidia-imex cannot bind and exits.
    # With its port held by someone else, that exit proves no node fault.
    import socket

    from slurm_gpu.imex import daemon
    rig = Rig(tmp_path, {"n1": _model(GB200)})
    c = rig.ctx("n1", _env("43", "n1"), timeout=3)
    real_start = daemon.start

    def start_once_the_squatter_listens(*a: Any, **kw: Any) -> Any:    # the check has passed
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", c.imex["port_base"]))
        squatter.listen()
        return real_start(*a, **kw)
    monkeypatch.setattr(daemon, "start", start_once_the_squatter_listens)
    with socket.socket() as squatter:
        assert job.prolog(c) == 0                   # on_internal_error=drain: 1 were it the node's
        assert squatter.getsockname()[1] == c.imex["port_base"]
    assert rig.cancelled == ["43"]
    line = next(m for m in rig.logs["n1"] if "exited" in m)
    assert f"port(s) {c.imex['port_base']} are held by another process" in line and "this node stays up" in line
    st = job.load(c.imex["base_dir"], "43")
    assert st and st["phase"] == "failed" and not _alive(st)
    assert job.epilog(c) == 0


def test_this_nodes_domain_comes_from_its_own_gpus_never_from_the_publish_directory(tmp_path: Path) -> None:
    # Another node's root rewrote n1.json with a GB200 body: n1 (an H100 node,
    # no NVLink fabric) must not start nvidia-imex for it, and a forged clique
    # must not choose n1's peers.
    rig = Rig(tmp_path, {"n1": _model(GB200), "n2": _model(GB200)})
    rig.models["n1"] = _model(H100)
    c = rig.ctx("n1", _env("51", "n[1-2]", gpus="0,1,2,3,4,5,6,7"))
    assert job.prolog(c) == 0 and rig.cancelled == [] and rig.logs["n1"] == []
    assert not Path(c.imex["base_dir"], "51").exists()
    rig.models["n1"] = _model(GB200, clique=7)          # n1's own clique differs from what n1.json says
    c = rig.ctx("n1", _env("52", "n[1-2]"), timeout=1.5)
    assert job.prolog(c) == 0
    st = job.load(c.imex["base_dir"], "52")
    assert st and st["nodes"] == ["n1"] and st["other_nodes"] == ["n2"]
    assert job.epilog(c) == 0
