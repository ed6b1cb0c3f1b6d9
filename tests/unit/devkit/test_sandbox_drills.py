"""`sandbox fault --list` and the named fault drills: each one, written as a
sandbox writes it (raw kernel records + an NVML overlay), gives the health
check exactly the outcome and drain reason the drill documents, and nothing
once cleared."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_gpu.cli import main
from slurm_gpu.health.findings import Finding, drain_reason
from slurm_gpu_devkit.sim import drills
from paths import ROOT

MACHINES = ROOT / "tests" / "data" / "machines"


pytestmark = pytest.mark.usefixtures("isolated_config")


def health(tmp_path: Path, capsys, machine: str, overlay: dict, kernel: str) -> tuple[str, str | None, list]:
    ov, kl = tmp_path / "ov.json", tmp_path / "kernel.log"
    ov.write_text(json.dumps(overlay))
    kl.write_text(kernel)
    main(["health", "--no-drain", "--json", "--node", "n1", "--kernel-log", str(kl),
          "--snapshot", str(MACHINES / machine / "snapshot.json"), "--overlay", str(ov)])
    doc = json.loads(capsys.readouterr().out)
    fs = [Finding(f["check"], f["severity"], f["message"], f.get("gpu")) for f in doc["findings"]]
    return doc["status"], drain_reason(fs), fs


def facts(machine: str) -> dict:
    return json.loads((MACHINES / machine / "facts.json").read_text())


@pytest.mark.parametrize("name", [n for n, d in drills.DRILLS.items() if not d.fabric])  # fabric: test_fabric_drills
@pytest.mark.parametrize("machine,gpu", [("h100-sxm-8x", 0), ("h100-sxm-8x", 5), ("dgx-a100-permuted", 3)])
def test_each_drill_gives_its_documented_outcome(tmp_path, capsys, name, machine, gpu):
    d = drills.DRILLS[name]
    bus = drills.gpu_bus(facts(machine), gpu)
    kernel = drills.kmsg_records(d.kernel_lines(bus), 1, 5_000_000)
    status, reason, fs = health(tmp_path, capsys, machine, d.overlay_for(bus), kernel)
    assert d.matches(reason, bus, gpu), (reason, fs)
    if d.drains:
        assert status == "drain" and reason.startswith(d.reason_for(bus, gpu)), fs
    else:
        assert status != "drain" and reason is None, fs
        assert any(f.check == "gpu.xid" and f.gpu == bus for f in fs), "the fault is seen, as info"
    # Cleared (the NVML half gone, the kernel line already counted): nothing drains.
    status, reason, fs = health(tmp_path, capsys, machine, {}, "")
    assert reason is None, fs


def test_kernel_half_alone_is_trusted_kernel_text(tmp_path, capsys):
    """The records a drill writes are what the kernel writes (facility 0): the
    reader takes them; the same text at facility 1 (a user's /dev/kmsg write) it refuses."""
    bus = drills.gpu_bus(facts("h100-sxm-8x"), 0)
    lines = drills.DRILLS["xid-79"].kernel_lines(bus)
    _, reason, _ = health(tmp_path, capsys, "h100-sxm-8x", {}, drills.kmsg_records(lines, 7, 1))
    assert reason == f"slurm-gpu: gpu.xid: Xid 79 on {bus}: GPU has fallen off the bus"
    forged = drills.kmsg_records(lines, 7, 1).replace("3,7,", "11,7,", 1)   # facility 1 (user), level 3
    _, reason, _ = health(tmp_path, capsys, "h100-sxm-8x", {}, forged)
    assert reason is None


def test_reason_match_leaves_out_only_the_more_count():
    d = drills.DRILLS["xid-48"]
    want = d.reason_for("0000:18:00.0", 0)
    assert d.matches(want, "0000:18:00.0", 0) and d.matches(want + " (+2 more)", "0000:18:00.0", 0)
    for bad in (None, "", want + " (+x more)", want + "!", want[:-1], "slurm-gpu: gpu.xid: Xid 48"):
        assert not d.matches(bad, "0000:18:00.0", 0), bad
    quiet = drills.DRILLS["xid-94"]
    assert quiet.matches(None, "b", 0) and quiet.matches("", "b", 0) and not quiet.matches(want, "b", 0)


def test_multiline_message_is_one_record():
    text = drills.kmsg_records(["a\nb", "c"], 10, 42)
    assert text == "3,10,42,-;a\\x0ab\n3,11,42,-;c\n"


def test_list_and_unknown_name(capsys):
    assert main(["sandbox", "fault", "--list"]) in (0, None)
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == list(drills.DRILLS)
    assert all(line.endswith(("; drains", "; does not drain")) for line in out)
    rc = main(["sandbox", "fault", "--dir", "/nonexistent", "n1", "xid-80"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith("slurm-gpu: unknown fault 'xid-80'; known: xid-79, xid-48,") and "recovery-reset" in err


def test_gpu_out_of_range_is_one_line():
    with pytest.raises(Exception, match=r"--gpu 8: the node has 8 GPU\(s\)"):
        drills.gpu_bus(facts("h100-sxm-8x"), 8)
