"""One Slurm client (issue 25 §5): every drain and resume is one scontrol call
built in one place, and every reader of slurm.conf follows ``Include``.

Slurm's side is a stand-in ``scontrol`` found where the client looks for
Slurm's commands; it logs each ``update`` and answers ``show node`` with a
recorded node.  The real runner starts it.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gpu import slurmclient
from slurm_gpu.commands.spank import plugstack_conf
from slurm_gpu.doctor import gather
from slurm_gpu.health import actions, imex, userproblem
from slurm_gpu.health.nodestate import Memory
from slurm_gpu.mig import blockers
from paths import ROOT

SC = ROOT / "tests" / "data" / "xid" / "scontrol"
OURS = "slurm-gpu: gpu.remap: row remapping pending on 0000:19:00.0: reset the GPU"


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "updates"
    node = tmp_path / "node.txt"

    def answer(name: str) -> None:
        node.write_text((SC / name).read_text())

    (bindir / "scontrol").write_text(
        f'#!/bin/sh\nif [ "$1" = show ]; then cat {node}; else echo "$@" >> {log}; fi\n')
    (bindir / "scontrol").chmod(0o755)
    monkeypatch.setattr(slurmclient, "SEARCH_DIRS", (str(bindir),))
    answer("idle.txt")
    return answer, lambda: log.read_text().splitlines() if log.exists() else []


def test_every_drain_and_resume_is_the_one_update_line(slurm, tmp_path: Path) -> None:
    answer, updates = slurm
    assert actions.scontrol_path() == str(tmp_path / "bin" / "scontrol")
    out = actions.act("n1", "slurm-gpu: gpu.xid: Xid 79", Memory(), clean_runs_to_resume=1, timeout=10)
    assert (out.plan.action, out.error) == ("drain", None)
    assert userproblem.drain("n1", "slurm-gpu: job 5 left a process", 10) == "drained"
    answer("draining_ours.txt")
    out = actions.act("n1", None, Memory(drained_reason=OURS, clean_runs=5), clean_runs_to_resume=1,
                      timeout=10)
    assert (out.plan.action, out.error) == ("resume", None)
    assert updates() == ["update nodename=n1 state=drain reason=slurm-gpu: gpu.xid: Xid 79",
                         "update nodename=n1 state=drain reason=slurm-gpu: job 5 left a process",
                         "update nodename=n1 state=resume"]
    assert slurmclient.update_node_args("n1", state="drain", reason="r") == \
        ["update", "nodename=n1", "state=drain", "reason=r"]


def test_slurm_commands_are_found_where_the_client_looks(slurm, tmp_path: Path) -> None:
    assert slurmclient.command("scontrol") == str(tmp_path / "bin" / "scontrol")
    assert slurmclient.command("scontrol", "/opt/slurm/bin/scontrol") == "/opt/slurm/bin/scontrol"
    assert slurmclient.command("squeue") == "squeue"          # not there: the runner says so
    assert slurmclient.sibling("/opt/slurm/bin/scancel", "squeue") == "/opt/slurm/bin/squeue"


def test_slurm_conf_with_include_reads_the_same_everywhere(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    etc = tmp_path / "etc"
    (etc / "conf.d").mkdir(parents=True)
    (etc / "slurm.conf").write_text("ClusterName=c\nInclude conf.d/*.conf\n"
                                    f"Include {etc}/abs.conf\nNodeName=n1 CPUs=2\n")
    (etc / "conf.d" / "10-switch.conf").write_text("SwitchType=switch/nvidia_imex\n")
    (etc / "conf.d" / "20-acct.conf").write_text("AcctGatherEnergyType = acct_gather_energy/gpu\n"
                                                 "HealthCheckTimeout=8\n")
    (etc / "abs.conf").write_text(f"PlugStackConfig={etc}/stack.conf\n")
    conf = str(etc / "slurm.conf")
    keys = slurmclient.read_conf(conf)
    assert keys == {"clustername": "c", "switchtype": "switch/nvidia_imex",
                    "acctgatherenergytype": "acct_gather_energy/gpu", "healthchecktimeout": "8",
                    "plugstackconfig": f"{etc}/stack.conf"}
    assert slurmclient.health_check_timeout(keys) == 8
    assert imex.imex_configured(conf)
    proc = tmp_path / "proc"
    proc.mkdir()
    assert [b.name for b in blockers.find(str(proc), conf)] == ["slurmd GPU energy accounting"]
    assert plugstack_conf(conf) == etc / "stack.conf"
    f = gather(conf, role="login")
    assert f.conf_readable and f.conf == keys
    # $SLURM_CONF is the default for every reader
    monkeypatch.setenv("SLURM_CONF", conf)
    assert slurmclient.read_conf() == keys and plugstack_conf() == etc / "stack.conf"
    assert [b.name for b in blockers.find(str(proc))] == ["slurmd GPU energy accounting"]
