"""[health] on_fatal: the jobs holding a GPU a fatal fault hit are requeued (or cancelled) and released,
against recorded `scontrol -d show job -o` output (tests/data/slurm), through a fake runner.run."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slurm_gpu import runner
from slurm_gpu.errors import CommandError
from slurm_gpu.health import engine, jobctl, onfatal
from slurm_gpu.health.findings import DRAIN, Finding
from paths import ROOT

DATA = ROOT / "tests" / "data" / "slurm"
BUS0, BUS5 = "0000:18:00.0", "0000:ab:00.0"
INDEX = {BUS0: 0, "0000:2a:00.0": 1, BUS5: 5}


def recorded(version: str) -> dict[str, str]:
    lines = (DATA / f"show-job-d-{version}.txt").read_text().splitlines()
    return {re.match(r"JobId=(\d+)", ln).group(1): ln for ln in lines}


@pytest.mark.parametrize("version", ["22.05", "26.05"])
def test_the_gpus_each_job_holds_per_node_from_real_slurm(version):
    jobs = [jobctl.parse_job(ln) for ln in recorded(version).values()]
    both, one = jobs
    assert both.state == "RUNNING" and both.requeue and both.batch and not both.admin_comment
    assert both.gpus == {"n[1-2]": (0, 1)}
    assert not one.requeue and one.admin_comment and one.gpus == {"n1": (4, 5, 6)}


class FakeJobs:
    """squeue and scontrol for two running jobs on n1 (the 26.05 recording); a requeue
    goes through COMPLETING for `completing` polls, then PENDING, as slurmctld does."""

    def __init__(self, completing: int = 2) -> None:
        self.lines = recorded("26.05")
        self.calls: list[list[str]] = []
        self.completing = completing
        self.polls: dict[str, int] = {}

    def state(self, jid: str, state: str) -> None:
        self.lines[jid] = re.sub(r"JobState=\S+", f"JobState={state}", self.lines[jid])

    def run(self, argv, timeout, check=True, **kw):
        argv = list(argv)
        self.calls.append(argv)
        name = argv[0].rsplit("/", 1)[-1]
        if name == "squeue":
            return runner.Completed(tuple(argv), 0, "".join(f"{j}\n" for j in self.lines), "")
        if name == "scancel":
            self.state(argv[1], "CANCELLED")
            return runner.Completed(tuple(argv), 0, "", "")
        if argv[1:4] == ["-d", "show", "job"]:
            jid = argv[-1]
            if "JobState=COMPLETING" in self.lines[jid]:
                self.polls[jid] = self.polls.get(jid, 0) + 1
                if self.polls[jid] > self.completing:
                    self.state(jid, "PENDING")
            return runner.Completed(tuple(argv), 0, self.lines[jid] + "\n", "")
        if argv[1] == "requeue":
            self.state(argv[2], "COMPLETING")
            return runner.Completed(tuple(argv), 0, "", "")
        if argv[1] == "update":
            return runner.Completed(tuple(argv), 0, "", "")
        raise AssertionError(argv)

    def did(self) -> list[list[str]]:
        return [c[1:] for c in self.calls if c[0].rsplit("/", 1)[-1] == "scancel" or c[1] in ("requeue", "update")]


@pytest.fixture
def jobs(monkeypatch):
    fake = FakeJobs()
    monkeypatch.setattr(runner, "run", fake.run)
    return fake


def xid79(bus: str = BUS0) -> Finding:
    return Finding("gpu.xid", DRAIN, f"Xid 79 on {bus}: GPU has fallen off the bus", bus, 79, fatal=True)


def far() -> float:
    import time
    return time.monotonic() + 10


def test_the_job_on_the_faulty_gpu_is_requeued_named_and_released_the_other_is_left_alone(jobs):
    out = onfatal.act("n1", [xid79()], INDEX, "requeue", far(), timeout=5, sleep=lambda s: None)
    assert jobs.did() == [
        ["update", "JobId=5", "AdminComment=slurm-gpu: Xid 79 on GPU 0000:18:00.0 of n1: requeued"],
        ["requeue", "5"],
        ["update", "JobId=5", "StartTime=now"]]
    assert [s["action"] for s in out.steps] == ["requeue", "release"] and not out.owed and not out.errors
    assert jobs.polls["5"] == 3      # released only once Slurm finished the requeue (PENDING)


def test_a_job_that_cannot_be_requeued_is_cancelled_and_its_admin_comment_kept(jobs):
    out = onfatal.act("n1", [xid79(BUS5)], INDEX, "requeue", far(), timeout=5)
    assert jobs.did() == [["6"]]                     # scancel 6; job 6 already has an AdminComment
    assert out.steps[0]["action"] == "cancel" and out.steps[0]["reason"] == f"slurm-gpu: Xid 79 on GPU {BUS5} of n1"


def test_a_job_requeued_twice_already_is_cancelled_not_sent_to_the_next_node(jobs):
    # It may be what breaks the GPUs: requeued at once again, it would drain node after node.
    assert "Restarts=0" in jobs.lines["5"]
    jobs.lines["5"] = jobs.lines["5"].replace("Restarts=0", f"Restarts={onfatal.MAX_REQUEUES}")
    onfatal.act("n1", [xid79()], INDEX, "requeue", far(), timeout=5, sleep=lambda s: None)
    assert jobs.did() == [
        ["update", "JobId=5", "AdminComment=slurm-gpu: Xid 79 on GPU 0000:18:00.0 of n1: cancelled"], ["5"]]


def test_cancel_mode_cancels_and_none_does_nothing(jobs):
    onfatal.act("n1", [xid79()], INDEX, "cancel", far(), timeout=5)
    assert jobs.did()[-1] == ["5"]
    n = len(jobs.calls)
    onfatal.act("n1", [xid79()], INDEX, "none", far(), timeout=5)
    assert len(jobs.calls) == n


def test_a_fault_that_kills_nothing_or_an_unknown_gpu_requeues_nothing(jobs):
    contained = Finding("gpu.xid", DRAIN, "Xid 64 ...", BUS0, 64)          # drains, kills nothing
    assert onfatal.act("n1", [contained], INDEX, "requeue", far(), timeout=5).steps == []
    out = onfatal.act("n1", [xid79("0000:99:00.0")], INDEX, "requeue", far(), timeout=5)
    assert out.steps == [] and "Slurm index is unknown" in out.errors[0]
    assert jobs.calls == []


def test_a_requeue_still_completing_at_the_deadline_is_owed_then_released_later(jobs):
    import time
    jobs.completing = 10 ** 6
    out = onfatal.act("n1", [xid79()], INDEX, "requeue", time.monotonic() + 0.3, timeout=5)
    assert out.owed.keys() == {"5"} and [s["action"] for s in out.steps] == ["requeue"]
    jobs.state("5", "PENDING")
    later = onfatal.FatalOutcome(owed=out.owed)
    onfatal.release(later, far(), timeout=5)
    assert later.owed == {} and jobs.did()[-1] == ["update", "JobId=5", "StartTime=now"]


def test_squeue_failing_is_a_note_never_an_exception(monkeypatch):
    def fail(argv, timeout, **kw):
        raise CommandError("squeue failed: Unable to contact slurm controller")
    monkeypatch.setattr(runner, "run", fail)
    out = onfatal.act("n1", [xid79()], INDEX, "requeue", far(), timeout=5)
    assert out.steps == [] and "Unable to contact" in out.errors[0]


# ------------------------------------------------------------- in the health run

XID79_LINE = "[74889.644138] NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n"


class NodeAndJobs(FakeJobs):
    def __init__(self, node_state: str) -> None:
        super().__init__(completing=0)
        self.node = (f"NodeName=n1 Arch=x86_64 CoresPerSocket=1 State={node_state} ThreadsPerCore=1 "
                     "Partitions=debug\n")

    def run(self, argv, timeout, check=True, **kw):
        if list(argv)[1:3] == ["show", "node"]:
            self.calls.append(list(argv))
            return runner.Completed(tuple(argv), 0, self.node, "")
        if list(argv)[1] == "update" and list(argv)[2].startswith("nodename="):
            self.calls.append(list(argv))
            self.node = self.node.replace("State=ALLOCATED ", "State=ALLOCATED+DRAIN ")
            return runner.Completed(tuple(argv), 0, "", "")
        return super().run(argv, timeout, check, **kw)


def run_health(tmp_path, fake, monkeypatch, **settings):
    from slurm_gpu.health.settings import HealthSettings
    monkeypatch.setattr(runner, "run", fake.run)
    tmp_path.mkdir(exist_ok=True)
    log = tmp_path / "kern.log"
    log.write_text(XID79_LINE)
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    (state / "health-state.n1.json").write_text(json.dumps({"gpu_index": INDEX}))
    s = HealthSettings(kernel_log=str(log), **settings)
    return engine.run(engine.Options(node="n1", settings=s, state_dir=str(state), only=["gpu.xid"]))


def test_the_run_that_drains_for_a_fatal_xid_requeues_the_job_on_that_gpu(tmp_path, monkeypatch):
    fake = NodeAndJobs("ALLOCATED")
    rep = run_health(tmp_path, fake, monkeypatch)
    assert rep.action == "drain"
    assert [s["action"] for s in rep.jobs] == ["requeue", "release"] and rep.jobs[0]["job"] == "5"
    names = [c[1] for c in fake.calls]
    assert names.index("requeue") > max(i for i, c in enumerate(fake.calls) if "state=drain" in c)


def test_nothing_is_requeued_while_the_node_is_not_drained_or_with_on_fatal_none(tmp_path, monkeypatch):
    fake = NodeAndJobs("ALLOCATED+MAINTENANCE+RESERVED")     # in maintenance: the run does not drain
    rep = run_health(tmp_path, fake, monkeypatch)
    assert rep.jobs == [] and "on_fatal: the node is not drained: no job requeued" in rep.notes
    fake = NodeAndJobs("ALLOCATED")
    rep = run_health(tmp_path / "b", fake, monkeypatch, on_fatal="none")
    assert rep.action == "drain" and rep.jobs == [] and not any("requeue" in c for c in fake.calls)


def test_on_fatal_accepts_only_its_three_modes():
    from slurm_gpu.health.settings import HealthSettings
    with pytest.raises(ValueError):
        HealthSettings(on_fatal="kill")


# --------------------------------------- who wrote the line: only a proven sender acts

XID79_TEXT = "NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=a.out, GPU has fallen off the bus."
# What `logger -t kernel "NVRM: Xid ..."` (any local user) leaves in each text
# log a site may name as [health] kernel_log: the same bytes the kernel's own line makes there.
FORGEABLE = {name: f"{head}kernel: {XID79_TEXT}\n" for name, head in [
    ("rsyslog traditional", "Nov 28 20:14:44 n1 "),
    ("rsyslog, no host", "Nov 28 20:14:44 "),
    ("rsyslog RFC 3339", "2026-11-28T20:14:44.123456+00:00 n1 "),
    ("journalctl short-unix", "1764360884.123456 n1 "),
    ("journalctl short-full", "Sat 2026-11-28 20:14:44 UTC n1 "),
    ("journalctl short-monotonic", "[74889.644138] n1 "),
    ("an excerpt", ""),
]}
# Formats whose sender is proven: a /dev/kmsg record's facility (userspace
# cannot claim 0), journald's own _TRANSPORT field, dmesg (it reads /dev/kmsg,
# which only root can write).
PROVEN = {
    "kmsg record": f"3,1234,74889644138,-;{XID79_TEXT}\n",
    "journal JSON": json.dumps({"_TRANSPORT": "kernel", "SYSLOG_FACILITY": "0", "MESSAGE": XID79_TEXT,
                                "__REALTIME_TIMESTAMP": "1764360884123456"}) + "\n",
    "dmesg": f"[74889.644138] {XID79_TEXT}\n",
}


def run_health_with(tmp_path, fake, monkeypatch, text, **kw):
    global XID79_LINE
    old, XID79_LINE = XID79_LINE, text
    try:
        return run_health(tmp_path, fake, monkeypatch, **kw)
    finally:
        XID79_LINE = old


@pytest.mark.parametrize("fmt", sorted(FORGEABLE))
def test_a_kernel_tag_any_user_can_write_neither_drains_nor_requeues(tmp_path, monkeypatch, fmt):
    fake = NodeAndJobs("ALLOCATED")
    rep = run_health_with(tmp_path, fake, monkeypatch, FORGEABLE[fmt])
    assert rep.action != "drain" and rep.jobs == []
    assert not any(c[1] in ("requeue", "update") or c[0].endswith("scancel") for c in fake.calls), fake.calls
    [f] = [f for f in rep.findings if f.check == "gpu.xid"]
    assert f.severity == "warn" and f.xid == 79 and not f.fatal
    assert "not trusted" in f.message and "logger -t kernel" in f.message


@pytest.mark.parametrize("fmt", sorted(PROVEN))
def test_a_line_whose_sender_is_proven_drains_and_requeues(tmp_path, monkeypatch, fmt):
    fake = NodeAndJobs("ALLOCATED")
    rep = run_health_with(tmp_path, fake, monkeypatch, PROVEN[fmt])
    assert rep.action == "drain" and [s["action"] for s in rep.jobs] == ["requeue", "release"]


def test_the_kernel_log_follower_starts_no_run_for_a_forgeable_line(tmp_path):
    from slurm_gpu.health.watch import KernelFollower, drain_finding
    # a kernel reader's output (a file whose first line is a syslog text line proves nothing: TEXT_LOG)
    log = tmp_path / "kmsg.log"
    log.write_text("6,1,1000,-;usb 1-1: new high-speed USB device\n")
    follow = KernelFollower(str(log))
    with open(log, "a") as f:
        f.write(FORGEABLE["rsyslog traditional"])
    assert drain_finding(lines=follow.poll()) is None
    with open(log, "a") as f:
        f.write(PROVEN["kmsg record"])
    assert drain_finding(lines=follow.poll()).startswith("gpu.xid: Xid 79 on 0000:18:00.0")


H100 = str(ROOT / "tests" / "data" / "machines" / "h100-sxm-8x" / "snapshot.json")


def nvml(overlay=None):
    from slurm_gpu.hw import snapshot as snap
    from slurm_gpu.hw.gpus_nvml import NvmlGpus
    data = snap.read_snapshot(H100)
    return lambda: NvmlGpus(snap.replay_api(data, H100, overlay))


def run_with_nvml(tmp_path, fake, monkeypatch, text, overlay):
    from slurm_gpu.health.settings import HealthSettings
    monkeypatch.setattr(runner, "run", fake.run)
    (tmp_path / "kern.log").write_text(text)
    state = tmp_path / "state"
    state.mkdir()
    (state / "health-state.n1.json").write_text(json.dumps({"gpu_index": INDEX}))
    s = HealthSettings(kernel_log=str(tmp_path / "kern.log"))
    return engine.run(engine.Options(node="n1", settings=s, state_dir=str(state), only=["gpu.xid", "gpu.count"],
                                     nvml_opener=nvml(overlay)))


def test_a_forgeable_line_acts_when_nvml_proves_that_gpu_dead(tmp_path, monkeypatch):
    # The GPU at 0000:18:00.0 is lost: NVML answers GPU_IS_LOST and tells no bus
    # id; the run knew that bus from its state file (gpu_index).
    fake = NodeAndJobs("ALLOCATED")
    rep = run_with_nvml(tmp_path, fake, monkeypatch, FORGEABLE["rsyslog traditional"], {"gpus": {BUS0: {"lost": True}}})
    assert rep.action == "drain" and [s["action"] for s in rep.jobs] == ["requeue", "release"]
    [f] = [f for f in rep.findings if f.check == "gpu.xid"]
    assert f.severity == "drain" and f.fatal and f.gpu == BUS0
    assert f.message.endswith("[log line not proven the kernel's; NVML: GPU no longer answers NVML]")


def test_a_forgeable_line_on_a_healthy_gpu_stays_a_warning_with_nvml_read(tmp_path, monkeypatch):
    # Another GPU is lost: that proves nothing about the GPU the line names.
    fake = NodeAndJobs("ALLOCATED")
    rep = run_with_nvml(tmp_path, fake, monkeypatch, FORGEABLE["rsyslog traditional"],
                        {"gpus": {"0000:2a:00.0": {"lost": True}}})
    [f] = [f for f in rep.findings if f.check == "gpu.xid"]
    assert f.severity == "warn" and not f.fatal
    assert rep.jobs == [] and not any(c[1] == "requeue" or c[0].endswith("scancel") for c in fake.calls)


def test_what_nvml_proves_dead():
    from slurm_gpu.hw.nvml_health import GpuHealth, NvmlHealth
    gpus = [GpuHealth(0, lost="NVML_ERROR_GPU_IS_LOST"), GpuHealth(1, "0000:2a:00.0", recovery_action=1),
            GpuHealth(2, "0000:3a:00.0", recovery_action=3), GpuHealth(3, "0000:5d:00.0", ecc_volatile_uncorrected=2),
            GpuHealth(5, BUS5)]
    known = {BUS0: 0, "0000:2a:00.0": 1, "0000:3a:00.0": 2, "0000:5d:00.0": 3, BUS5: 5, "0000:99:00.0": 5}
    got = onfatal.nvml_confirms(NvmlHealth(available=True, gpus=gpus), known)
    # lost (by elimination), reset needed; a P2P drain or an ECC count kills no job; a stale
    # bus whose index a live GPU has proves nothing
    assert got == {BUS0: "GPU no longer answers NVML", "0000:2a:00.0": "needs a GPU reset"}
    assert onfatal.nvml_confirms(NvmlHealth(available=True, gpus=gpus[1:]), known) == {"0000:2a:00.0": "needs a GPU reset"}
    assert onfatal.nvml_confirms(NvmlHealth(available=True, gpus=gpus[1:]), known, expected_count=5)[BUS0]
    assert onfatal.nvml_confirms(NvmlHealth(available=False, gpus=gpus), known) == {}


# ------------------------------------ a job's free text spelling Slurm's own fields

VERSIONS = ["22.05", "24.11", "26.05"]


def hostile(version: str, name: str = "hostile") -> str:
    """Real `scontrol -d show job -o` output (tests/data/slurm/PROVENANCE.md): a --no-requeue job on GPU 4
    of n1 whose name, comment and output path spell Requeue=1, other GPUs and other nodes."""
    return (DATA / f"show-job-{name}-{version}.txt").read_text()


class OneJob(FakeJobs):
    """squeue and scontrol serving one recorded job verbatim (its real state: RUNNING)."""

    def __init__(self, jid: str, text: str) -> None:
        super().__init__()
        self.lines = {jid: text.rstrip("\n")}


@pytest.mark.parametrize("version", VERSIONS)
def test_fields_spelt_in_a_job_s_free_text_are_never_read_as_slurm_s(version):
    text = hostile(version)
    assert "JobName=x Requeue=1 Restarts=0 BatchFlag=1 JobState=RUNNING" in text and " Requeue=0 " in text
    view = jobctl.parse_job(text, "2")
    assert view.job_id == "2" and view.unreadable == "a free-text field such as its name or comment spells JobState="
    assert not view.requeue and view.gpus == {}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("gpu", [0, 3, 4])      # spelt in its name, spelt in its output path, really held
def test_a_job_with_spelt_fields_is_left_alone_with_a_note(monkeypatch, version, gpu):
    fake = OneJob("2", hostile(version))
    monkeypatch.setattr(runner, "run", fake.run)
    bus = "0000:5d:00.0"
    out = onfatal.act("n1", [xid79(bus)], {bus: gpu}, "requeue", far(), timeout=5, sleep=lambda s: None)
    assert fake.did() == [] and out.steps == []
    assert out.errors == ["on_fatal: job 2 left alone: its scontrol text is ambiguous (a free-text field such as "
                          "its name or comment spells JobState=)"]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_newline_in_a_job_name_cannot_make_a_record_of_its_own(monkeypatch, version):
    text = hostile(version, "newline-name")
    assert text.startswith("JobId=3 JobName=a\nJobId=9 JobState=RUNNING Requeue=1 ")
    view = jobctl.parse_job(text, "3")
    assert view.job_id == "3" and view.unreadable
    assert jobctl.parse_job(text, "9") is None or jobctl.parse_job(text, "9").unreadable


@pytest.mark.parametrize("version", VERSIONS)
def test_recorded_plain_jobs_of_every_version_parse_exactly(version):
    path = DATA / f"show-job-d-{version}.txt"
    both, one = [jobctl.parse_job(ln) for ln in path.read_text().splitlines()]
    assert (both.state, both.requeue, both.batch, both.restarts, both.admin_comment, both.unreadable) == (
        "RUNNING", True, True, 0, False, None)
    assert both.gpus == {"n[1-2]": (0, 1)} and one.gpus == {"n1": (4, 5, 6)}
    assert (one.requeue, one.admin_comment) == (False, True)


def test_an_event_file_someone_but_root_could_write_proves_nothing(tmp_path, monkeypatch):
    # [health] events_file in a shared directory (/tmp/xid-%n.jsonl): a user who made the
    # file first, or can write it, would write "NVML events" that drain and requeue.
    import os
    from slurm_gpu.health.settings import HealthSettings
    fake = NodeAndJobs("ALLOCATED")
    monkeypatch.setattr(runner, "run", fake.run)
    (tmp_path / "kern.log").write_text("")
    ev = tmp_path / "xid-events.jsonl"
    ev.write_text(json.dumps({"time": 1.0, "event": "xid", "xid": 79, "gpu": BUS0, "data": 79}) + "\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / "health-state.n1.json").write_text(json.dumps({"gpu_index": INDEX}))
    s = HealthSettings(kernel_log=str(tmp_path / "kern.log"), events_file=str(ev))

    def run():
        return engine.run(engine.Options(node="n1", settings=s, state_dir=str(state), only=["gpu.xid"]))
    os.chmod(ev, 0o622)
    rep = run()
    assert rep.action != "drain" and rep.jobs == [] and "not root's" in (rep.broken or ""), rep
    if os.geteuid() == 0:
        os.chmod(ev, 0o600)
        os.chown(ev, 1001, 1001)
        rep = run()
        assert rep.action != "drain" and rep.jobs == [] and "not root's" in (rep.broken or "")
        os.chown(ev, 0, 0)
    rep = run()                                       # root's, 0600: xid-watch's own file
    assert rep.action == "drain" and rep.jobs[0]["action"] == "requeue"


def test_a_kernel_log_file_someone_but_root_may_write_proves_nothing(tmp_path, monkeypatch):
    # Any format (dmesg's here) is what its writer says when a user can write the file itself.
    import os
    fake = NodeAndJobs("ALLOCATED")
    rep = run_health_with(tmp_path, fake, monkeypatch, PROVEN["dmesg"])
    assert rep.action == "drain"                           # root's, 0644: as before
    log = tmp_path / "b" / "kern.log"
    fake = NodeAndJobs("ALLOCATED")
    real_write = Path.write_text

    def write_open(self, text, *a, **kw):                  # the rig writes the log: make it everyone's
        n = real_write(self, text, *a, **kw)
        if self.name == "kern.log":
            os.chmod(self, 0o666)
        return n
    monkeypatch.setattr(Path, "write_text", write_open)
    rep = run_health_with(tmp_path / "b", fake, monkeypatch, PROVEN["dmesg"])
    assert rep.action != "drain" and rep.jobs == []
    [f] = [f for f in rep.findings if f.check == "gpu.xid"]
    assert f.severity == "warn" and "not root's, or someone else may write it" in f.message
    from slurm_gpu.hw import kmsg
    assert kmsg.sender_proof(str(log))[0] == "unproven"


def test_a_job_without_gpu_detail_reads_as_holding_none(monkeypatch):
    # A requeued job waiting to start may print no JOB_GRES=/detail: still readable (released), holding nothing.
    line = recorded("26.05")["5"].replace("JobState=RUNNING", "JobState=PENDING")
    line = line.replace(" JOB_GRES=gpu:nvidia_h100_80gb_hbm3:4 Nodes=n[1-2] CPU_IDs=0-1 Mem=20164 "
                        "GRES=gpu:nvidia_h100_80gb_hbm3:2(IDX:0-1) MinCPUsNode=1", "")
    view = jobctl.parse_job(line)
    assert (view.state, view.requeue, view.unreadable, view.gpus) == ("PENDING", True, None, {})
    # (a running job always prints them: one spelt in its text makes two, and it is left alone)
