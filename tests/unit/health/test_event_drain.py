"""Event-driven drain (docs/health.md, `xid-watch`): a drain-class NVML event
or kernel line runs the health check at once; anything else does not, and a
line a user could have written never does."""
from __future__ import annotations

import json
import os

import pytest

from nvmlfake import Patched

from slurm_gpu.hw import nvml_constants
from slurm_gpu.hw.nvml_api import NVMLError
from slurm_gpu.health import watch
from slurm_gpu.hw.gpus_nvml import NvmlGpus
from slurm_gpu.hw import snapshot as snap
from paths import ROOT

H100 = str(ROOT / "tests" / "data" / "machines" / "h100-sxm-8x" / "snapshot.json")


def opener(overlay: dict):
    data = snap.read_snapshot(H100)
    return lambda: NvmlGpus(snap.replay_api(data, H100, overlay))


@pytest.mark.parametrize("events,drains", [
    ([{"type": "xid", "gpu": 3, "data": 79}], "gpu.xid: Xid 79 on 0000:"),
    ([{"type": "double_bit_ecc", "gpu": 1}], "gpu.ecc: NVML double-bit ECC event"),
    ([{"type": "xid", "gpu": 3, "data": 94}], None),          # contained: the process only
    ([{"type": "xid", "gpu": 3, "data": 13}], None),          # an application's error
    ([{"type": "xid", "gpu": 3, "data": 13}, {"type": "xid", "gpu": 2, "data": 48}], "gpu.xid: Xid 48 on 0000:"),
])
def test_nvml_events_trigger_only_when_drain_class(tmp_path, events, drains):
    calls: list[str] = []
    ev = tmp_path / "events.jsonl"
    n = watch.watch(opener({"events": events}), str(ev), max_events=len(events), run_for=5,
                    on_drain=calls.append)
    assert n == len(events) and len(ev.read_text().splitlines()) == n   # written before the trigger
    if drains is None:
        assert calls == []
    else:
        assert len(calls) == 1 and calls[0].startswith(f"NVML event: {drains}"), calls


KERNEL79 = "3,{seq},5000000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"


def test_kernel_follower_sees_only_new_trusted_lines(tmp_path):
    log = tmp_path / "kernel.log"
    log.write_text(KERNEL79.format(seq=1))            # before the listener: the check's, not a trigger
    k = watch.KernelFollower(str(log))
    assert watch.drain_finding(lines=k.poll()) is None
    with open(log, "a") as f:                          # a user's /dev/kmsg write: facility 1
        f.write(KERNEL79.format(seq=2).replace("3,2,", "11,2,"))
        f.write("4,3,5000001,-;NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, Graphics SM Warp Exception\n")
    assert watch.drain_finding(lines=k.poll()) is None
    with open(log, "a") as f:
        f.write(KERNEL79.format(seq=4))
    why = watch.drain_finding(lines=k.poll())
    assert why == "gpu.xid: Xid 79 on 0000:18:00.0: GPU has fallen off the bus"
    assert watch.drain_finding(lines=k.poll()) is None   # counted once


def test_listener_without_nvml_events_follows_the_kernel_log(tmp_path):
    """No GPU takes event registration (NOT_SUPPORTED): the kernel log alone triggers."""
    base = snap.replay_api(snap.read_snapshot(H100), H100, None)

    def refuse(real, h, types, es):
        raise NVMLError(nvml_constants.NVML_ERROR_NOT_SUPPORTED)
    no_events = Patched(base, nvmlDeviceRegisterEvents=refuse)
    log = tmp_path / "kernel.log"
    log.write_text("")
    k = watch.KernelFollower(str(log))
    with open(log, "a") as f:
        f.write(KERNEL79.format(seq=1))
    calls: list[str] = []
    watch.watch(lambda: NvmlGpus(no_events), str(tmp_path / "ev.jsonl"), run_for=1.0, on_drain=calls.append,
                kernel=k)
    assert calls == ["kernel log: gpu.xid: Xid 79 on 0000:18:00.0: GPU has fallen off the bus"]
    with pytest.raises(Exception, match="no GPU accepts NVML event registration"):
        watch.watch(lambda: NvmlGpus(no_events), str(tmp_path / "ev.jsonl"), run_for=0.5)


def test_trigger_runs_the_health_check_for_this_node(tmp_path, monkeypatch):
    from slurm_gpu import runner
    seen = []

    def fake_run(argv, timeout, **kw):
        seen.append((list(argv), kw["env"]))
        return runner.Completed(argv=tuple(argv), returncode=0, stdout="", stderr="")
    monkeypatch.setattr(runner, "run", fake_run)
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    monkeypatch.setenv("LD_PRELOAD", "/tmp/evil.so")
    assert watch.health_trigger("n7", timeout=30, settled=lambda: True)("NVML event: gpu.xid: Xid 79") is True
    (argv, env), = seen
    assert argv[1:] == ["-m", "slurm_gpu", "health", "--slurm", "--node", "n7"]
    assert env["SLURMD_NODENAME"] == "n7" and env["SLURM_CONF"] == "/etc/slurm/slurm.conf"
    assert "LD_PRELOAD" not in env


def test_trigger_retries_while_another_run_holds_the_lock(monkeypatch):
    from slurm_gpu import runner
    rcs = iter([1, 0])
    seen = []

    def fake_run(argv, timeout, **kw):
        seen.append(1)
        return runner.Completed(argv=tuple(argv), returncode=next(rcs), stdout="",
                                stderr="slurm-gpu: health check broke: another health check is running")
    monkeypatch.setattr(runner, "run", fake_run)
    monkeypatch.setattr(watch.time, "sleep", lambda s: None)
    watch.health_trigger("n1", timeout=30, settled=lambda: True)("x")
    assert len(seen) == 2


class Clock:
    """Fake seconds for :func:`watch.watch`: only sleeps move the clock (the
    replay's event wait sleeps 50 ms a loop), so the retry delays and the
    trigger gap run at their real values and no test waits for them.
    *writes* maps a time on this clock to a kernel line appended then."""

    def __init__(self, monkeypatch, log, writes: dict[float, str]) -> None:
        self.now = 0.0
        self.log = log
        self.writes = sorted(writes.items())
        monkeypatch.setattr(watch.time, "monotonic", lambda: self.now)
        monkeypatch.setattr(watch.time, "sleep", self.sleep)

    def sleep(self, s: float) -> None:
        self.now += s
        while self.writes and self.writes[0][0] <= self.now + 1e-9:
            with open(self.log, "a") as f:
                f.write(self.writes.pop(0)[1])


def watch_kernel(tmp_path, monkeypatch, writes, answers, run_for):
    """Run the watch on a kernel log for *run_for* fake seconds; the fake times
    (rounded to the loop's 50 ms) at which it asked for a health run, each
    answered by the next of *answers* (True: the node is now drained)."""
    log = tmp_path / "kernel.log"
    log.write_text("")
    clock = Clock(monkeypatch, log, writes)
    k = watch.KernelFollower(str(log))
    said = iter(answers)
    asked: list[float] = []

    def on_drain(why):
        assert why == "kernel log: gpu.xid: Xid 79 on 0000:18:00.0: GPU has fallen off the bus"
        asked.append(round(clock.now, 2))
        return next(said)
    watch.watch(opener({}), str(tmp_path / "ev.jsonl"), run_for=run_for, on_drain=on_drain, kernel=k)
    return asked


def test_a_run_that_left_the_node_undrained_is_asked_again_then_given_up(tmp_path, monkeypatch, capsys):
    """slurmd not responding (or booting): the check owes the drain to a later
    run, and with HealthCheckInterval=300 that run must come from xid-watch."""
    asked = watch_kernel(tmp_path, monkeypatch, {1.0: KERNEL79.format(seq=1), 70.0: KERNEL79.format(seq=2)},
                         [False] * 6 + [False, True], run_for=120)
    first = asked[:6]
    # at once, then 2, 4, 8, 15, 30 s apart (the next 50 ms loop), then left
    assert [round(t - first[0]) for t in first] == [0, 2, 6, 14, 29, 59] and first[0] == pytest.approx(1.0, abs=0.06)
    assert "node still not drained; left to the periodic check" in capsys.readouterr().err
    # a new fault after that is asked about afresh; drained: nothing more
    assert [round(t) for t in asked[6:]] == [70, 72], asked


def test_watch_reruns_until_the_node_is_drained(tmp_path, monkeypatch):
    asked = watch_kernel(tmp_path, monkeypatch, {0.5: KERNEL79.format(seq=1)}, [False, True], run_for=10)
    assert len(asked) == 2


def test_cli_never_triggers_for_a_replay(tmp_path, monkeypatch):
    """--snapshot/--events-file are drills: no health run on the real node."""
    from slurm_gpu import runner
    monkeypatch.setattr(runner, "run", lambda *a, **k: pytest.fail("ran the health check"))
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text(f'[node]\nstate_dir = "{tmp_path}/state"\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(cfg))
    from slurm_gpu import config
    config.clear_cache()
    ov = tmp_path / "ov.json"
    ov.write_text(json.dumps({"events": [{"type": "xid", "gpu": 3, "data": 79}]}))
    from slurm_gpu.cli import main
    assert main(["xid-watch", "--snapshot", H100, "--overlay", str(ov), "--events-file",
                 str(tmp_path / "e.jsonl"), "--max-events", "1", "--timeout", "5"]) == 0


def test_triggers_within_the_gap_are_one_run_at_its_end(tmp_path, monkeypatch):
    """A user who can write drain-class-looking lines the check then refuses
    (an echo split across polls) costs one run per gap, not one per line
    (security review F4)."""
    lines = {0.5 * (i + 1): KERNEL79.format(seq=i + 1) for i in range(24)}   # a line every 0.5 s for 12 s
    asked = watch_kernel(tmp_path, monkeypatch, lines, [True] * 24, run_for=30)
    # the first at once, the rest coalesced: one run at the end of each 5 s gap
    assert [round(t - asked[0]) for t in asked] == [0, 5, 10, 15] and asked[0] == pytest.approx(0.5, abs=0.06)


def test_a_skipped_check_triggers_nothing():
    assert watch.drain_finding(records=[{"event": "xid", "xid": 79, "gpu": "0000:18:00.0"}]) is not None
    assert watch.drain_finding(records=[{"event": "xid", "xid": 79, "gpu": "0000:18:00.0"}],
                               skip=("gpu.xid",)) is None


def test_kmsg_follower_reads_only_what_came_after_it(tmp_path):
    """The /dev/kmsg follower keeps one descriptor at the end of the ring, not a
    re-read of it every poll (security review, minor)."""
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("no readable /dev/kmsg")
    k = watch.KernelFollower("/dev/kmsg")
    assert k._fd is not None and k.poll() == []
    k.close()
