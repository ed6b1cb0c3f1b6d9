"""`slurm-gpu health` / `xid-watch` front ends: JSON contract, Nagios exit codes, modes, metrics."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from nvmlfake import Patched

from slurm_gpu.hw import nvml_constants
from slurm_gpu.hw.nvml_api import NVMLError
from slurm_gpu.hw.gpus_nvml import NvmlGpus
from slurm_gpu.cli import main
from paths import ROOT

H100 = str(ROOT / "tests" / "data" / "machines" / "h100-sxm-8x" / "snapshot.json")
XID79 = "[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.\n"
XID13 = "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception\n"


pytestmark = pytest.mark.usefixtures("isolated_config")


def run(args, capsys):
    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_contract_and_exit_2_for_drain(tmp_path, capsys):
    log = tmp_path / "k.log"
    log.write_text(XID79)
    rc, out, _ = run(["health", "--only", "gpu.xid", "--kernel-log", str(log), "--json", "--no-drain",
                      "--node", "n7"], capsys)
    doc = json.loads(out)
    assert rc == 2
    assert set(doc) == {"node", "status", "findings"} and doc["node"] == "n7" and doc["status"] == "drain"
    f = doc["findings"][0]
    assert set(f) == {"check", "severity", "gpu", "xid", "message"}
    assert (f["check"], f["severity"], f["gpu"], f["xid"]) == ("gpu.xid", "drain", "0000:02:00.0", 79)


def test_app_only_log_exit_0_and_info_finding(tmp_path, capsys):
    log = tmp_path / "k.log"
    log.write_text(XID13 * 3)
    rc, out, _ = run(["health", "--only", "gpu.xid", "--kernel-log", str(log), "--json", "--no-drain"], capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["status"] == "ok" and doc["findings"][0]["severity"] == "info"


def test_non_xid_findings_have_no_xid_key(capsys):
    rc, out, _ = run(["health", "--snapshot", H100, "--only", "gpu.persistence,gpu.count", "--json", "--no-drain",
                      "--gres-conf", "/nonexistent"], capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["status"] == "ok" and doc["findings"] == []


def test_warn_is_exit_1_and_slurm_mode_exit_0(tmp_path, capsys):
    ov = tmp_path / "ov.json"
    ov.write_text(json.dumps({"calls": [{"fn": "nvmlDeviceGetPersistenceMode", "gpu": 1, "result": 0}]}))
    args = ["health", "--snapshot", H100, "--overlay", str(ov), "--only", "gpu.persistence", "--no-drain"]
    rc, out, _ = run(args, capsys)
    assert rc == 1 and "persistence mode off" in out
    rc, _, _ = run(args + ["--slurm"], capsys)
    assert rc == 0


def test_unknown_check_is_a_usage_error(capsys):
    rc, _, err = run(["health", "--only", "gpu.nope", "--no-drain"], capsys)
    assert rc == 2 and err.startswith("slurm-gpu: unknown check 'gpu.nope'")


def test_missing_kernel_log_is_one_line(tmp_path, capsys):
    rc, _, err = run(["health", "--only", "gpu.xid", "--kernel-log", str(tmp_path / "none"), "--no-drain"], capsys)
    assert rc == 1 and err.strip().splitlines() == [f"slurm-gpu: kernel log not found ({tmp_path / 'none'})"]


def test_prom_file_is_written(tmp_path, capsys):
    log = tmp_path / "k.log"
    log.write_text(XID79 + XID13)
    prom = tmp_path / "health.prom"
    run(["health", "--only", "gpu.xid", "--kernel-log", str(log), "--no-drain", "--prom-file", str(prom),
         "--node", "n1"], capsys)
    text = prom.read_text()
    assert 'slurm_gpu_health_status{node="n1"} 2' in text
    assert 'slurm_gpu_health_xid{node="n1",gpu="0000:02:00.0",xid="79",severity="drain"} 1' in text
    assert 'slurm_gpu_health_findings{node="n1",check="gpu.xid",severity="info"} 1' in text


def test_hung_nvml_is_cut_off_and_drains(tmp_path, capsys):
    ov = tmp_path / "ov.json"
    ov.write_text(json.dumps({"calls": [{"fn": "nvmlDeviceGetTotalEccErrors", "gpu": 4, "hang": 60}]}))
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text(cfg.read_text() + "[health]\nnvml_call_timeout = 0.5\n")
    from slurm_gpu import config
    config.clear_cache()
    rc, out, _ = run(["health", "--snapshot", H100, "--overlay", str(ov), "--only", "gpu.nvml,gpu.ecc", "--json",
                      "--no-drain"], capsys)
    doc = json.loads(out)
    assert rc == 2 and doc["findings"][0]["check"] == "gpu.nvml" and "no answer" in doc["findings"][0]["message"]


def test_only_xid_needs_no_gpu_and_no_pynvml():
    # A fresh interpreter: `--only gpu.xid --kernel-log FILE` works on a machine with no GPU and never imports pynvml.
    code = ("import sys; from slurm_gpu.cli import main; rc = main(['health','--only','gpu.xid','--kernel-log',"
            "sys.argv[1],'--no-drain']); assert 'pynvml' not in sys.modules; sys.exit(rc)")
    log = ROOT / "tests" / "data" / "xid" / "real_kernel_xid_lines_from_issues.md"
    p = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, text=True, cwd=str(ROOT))
    assert p.returncode == 2, p.stderr
    assert "gpu.xid" in p.stdout


def test_xid_watch_writes_events_health_reads(tmp_path, capsys):
    ov = tmp_path / "ov.json"
    ov.write_text(json.dumps({"events": [{"type": "xid", "gpu": 3, "data": 79},
                                         {"type": "double_bit_ecc", "gpu": 1}]}))
    ev = tmp_path / "events.jsonl"
    rc, _, err = run(["xid-watch", "--snapshot", H100, "--overlay", str(ov), "--events-file", str(ev),
                      "--max-events", "2", "--timeout", "5"], capsys)
    assert rc == 0
    recs = [json.loads(l) for l in ev.read_text().splitlines()]
    assert [(r["event"], r.get("xid")) for r in recs] == [("xid", 79), ("dbe", None)]
    assert recs[0]["gpu"].startswith("0000:")
    from slurm_gpu.health import xid
    evs, direct = xid.events_from_nvml(recs)
    fs = xid.check_xid(evs) + direct
    assert {(f.check, f.severity) for f in fs} == {("gpu.xid", "drain"), ("gpu.ecc", "drain")}


def test_xid_watch_stops_cleanly_on_sigterm(tmp_path):
    import signal
    import time
    ev = tmp_path / "events.jsonl"
    p = subprocess.Popen([sys.executable, "-m", "slurm_gpu", "xid-watch", "--snapshot", H100, "--events-file", str(ev)],
                         cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    assert p.poll() is None                      # listening
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=10)
    assert p.returncode == 0 and "stopped after 0 events" in err


def test_a_bug_in_a_check_is_unknown_and_never_drains(tmp_path, capsys, monkeypatch):
    from slurm_gpu import runner
    from slurm_gpu.health import xid
    calls = []
    monkeypatch.setattr(runner, "run", lambda argv, *a, **k: calls.append(argv))

    def broken(events, *memo):
        raise KeyError("oops")
    monkeypatch.setattr(xid, "check_xid", broken)
    log = tmp_path / "k.log"
    log.write_text(XID79)
    for mode in ([], ["--slurm"]):
        rc, _, err = run(["health", "--only", "gpu.xid", "--kernel-log", str(log), *mode], capsys)
        assert rc == 3 and err.startswith("slurm-gpu: health check broke: KeyError") and calls == []


def test_slurm_mode_unreadable_configured_source_is_unknown(tmp_path, capsys):
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text(f'[node]\nstate_dir = "{tmp_path}/state"\n[health]\nkernel_log = "{tmp_path}/gone.log"\n')
    from slurm_gpu import config
    config.clear_cache()
    rc, _, err = run(["health", "--only", "gpu.xid", "--slurm"], capsys)
    assert rc == 3 and "kernel log not found" in err


def test_slurm_mode_error_after_the_check_says_the_prefix_once(tmp_path, capsys):
    """A SlurmGpuError escaping the check (here: the metrics file cannot be
    written) is one line with ``slurm-gpu:`` once (issue 25: it said
    ``slurm-gpu: health check incomplete: slurm-gpu: cannot write ...``)."""
    log = tmp_path / "kern.log"
    log.write_text("")
    rc, _, err = run(["health", "--only", "gpu.xid", "--kernel-log", str(log), "--slurm",
                      "--prom-file", str(tmp_path / "gone" / "x.prom")], capsys)
    assert rc == 3
    assert err == f"slurm-gpu: health check incomplete: cannot write x.prom: No such file or " \
                  f"directory ({tmp_path}/gone/x.prom)\n", err


def test_xid_watch_gpu_without_event_support_is_not_a_lost_gpu(tmp_path):
    # nvmlDeviceRegisterEvents answers NOT_SUPPORTED on GPUs/platforms without
    # XID events: that is no fault, and must not become a "GPU unavailable" drain.
    from slurm_gpu.health import watch, xid
    from slurm_gpu.hw import snapshot as snap
    base = snap.replay_api(snap.read_snapshot(H100), H100, None)

    seen = [0]

    def register(real, h, types, es):
        seen[0] += 1
        if seen[0] == 3:                         # the third GPU has no event support
            raise NVMLError(nvml_constants.NVML_ERROR_NOT_SUPPORTED)
        return real(h, types, es)
    ev = tmp_path / "events.jsonl"
    watch.watch(lambda: NvmlGpus(Patched(base, nvmlDeviceRegisterEvents=register)), str(ev), run_for=0.2)
    recs = [json.loads(l) for l in ev.read_text().splitlines()] if ev.exists() else []
    evs, direct = xid.events_from_nvml(recs)
    assert [f for f in xid.check_xid(evs) + direct if f.severity == "drain"] == []


def test_xid_watch_lost_gpu_is_recorded_once_a_minute_not_every_second(tmp_path):
    from slurm_gpu.health import watch
    from slurm_gpu.hw import snapshot as snap
    base = snap.replay_api(snap.read_snapshot(H100), H100, None)

    def lost(real, es, ms):
        raise NVMLError(nvml_constants.NVML_ERROR_GPU_IS_LOST)
    ev = tmp_path / "events.jsonl"
    watch.watch(lambda: NvmlGpus(Patched(base, nvmlEventSetWait_v2=lost)), str(ev), run_for=2.5)
    recs = [json.loads(l) for l in ev.read_text().splitlines()]
    assert [r["event"] for r in recs] == ["gpu_unavailable"]


def test_a_slurmd_run_leaves_at_once_while_the_nodes_previous_one_still_runs(tmp_path, capsys, monkeypatch):
    """slurmd starts HealthCheckProgram every HealthCheckInterval whether or
    not its last run finished (two slurmd in a 2-vCPU VM piled up a dozen
    runs): a run that finds the previous one going leaves before it checks
    or asks Slurm anything; an admin's run is not held back."""
    import fcntl
    import os
    from slurm_gpu import config, runner
    from slurm_gpu.health import engine
    from slurm_gpu.health.statefiles import slurmd_run_lock_file
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text(f'[node]\nstate_dir = "{tmp_path}/state"\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    config.clear_cache()
    calls: list = []
    monkeypatch.setattr(runner, "run", lambda argv, *a, **k: calls.append(argv) or
                        subprocess.CompletedProcess(argv, 1, "", "no Slurm here"))
    log = tmp_path / "k.log"
    log.write_text("")
    argv = ["health", "--only", "gpu.xid", "--kernel-log", str(log)]
    ran: list = []
    real = engine.run
    monkeypatch.setattr(engine, "run", lambda opts: ran.append(opts.node) or real(opts))
    os.makedirs(tmp_path / "state")
    fd = os.open(slurmd_run_lock_file(str(tmp_path / "state"), "n2"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)     # the previous run, still going
        rc, out, err = run(argv + ["--slurm"], capsys)
        assert (rc, out, err, ran, calls) == (     # 75: pytest is not slurmd (test_health_review4)
            75, "slurm-gpu: health n2: skipped: this node's previous run, started by slurmd, "
               "is still running\n", "", [], [])
        run(argv, capsys)                                  # an admin's run
        assert ran == ["n2"]
    finally:
        os.close(fd)
    _, out, _ = run(argv + ["--slurm"], capsys)            # the previous run ended
    assert ran == ["n2", "n2"] and "skipped" not in out, out
