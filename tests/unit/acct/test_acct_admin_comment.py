"""AdminComment is input: another tool's (or an operator's) text, stored as
they wrote it, newlines and all.  Neither ``report usage`` nor ``job report``
may crash on it, and none of it may become a row of its own.

The fake ``sacct`` prints what the real one prints with ``-n -P``: fields
joined by the delimiter (``--delimiter``, ``|`` by default; print_fields.c
prints it with ``%s``, so any string works), each value as stored, and a
newline at the end of each record only.
"""
from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

import pytest

from slurm_gpu.acct import dbd, report

FAKE = r'''
import json, sys
rows = json.load(open(sys.argv[0] + ".json"))
args = sys.argv[1:]
delim = args[args.index("--delimiter") + 1] if "--delimiter" in args else "|"
fields = args[args.index("-o") + 1].split(",")
want = args[args.index("-j") + 1] if "-j" in args else None
for r in rows:
    if want is None or r["JobIDRaw"] == want:
        sys.stdout.write(delim.join(r.get(f, "") for f in fields) + "\n")
'''

GOOD = dbd.encode({"n1": {"v": 1, "iv": 10.0, "dev": {"0": {"sm": 50.0, "idle": 0.0, "n": 3}}, "held": ["0"]}})


def row(jobid: str, comment: str, user: str = "u1", gpus: int = 1) -> dict[str, str]:
    return {"JobIDRaw": jobid, "User": user, "Account": "a", "Partition": "p", "NodeList": "n1",
            "State": "COMPLETED", "Start": "2026-01-01T00:00:00", "End": "2026-01-01T01:00:00",
            "ElapsedRaw": "3600", "AllocTRES": f"cpu=1,gres/gpu={gpus}", "AdminComment": comment}


@pytest.fixture
def sacct(tmp_path):
    exe = tmp_path / "sacct"
    exe.write_text(f"#!{sys.executable}\n{FAKE}")
    exe.chmod(0o755)

    def serve(rows: list[dict[str, str]]) -> str:
        Path(str(exe) + ".json").write_text(json.dumps(rows))
        return str(exe)
    return serve


FORGED = ("nhc:ok\n999|victim|acct|part|n1|COMPLETED|2026-01-01T00:00:00|2026-01-01T01:00:00|3600|"
          "gres/gpu=8|nhc:ok")


def test_a_newline_in_admin_comment_adds_no_row(sacct):
    exe = sacct([row("10", FORGED + " " + GOOD), row("11", GOOD, user="u2")])
    rows = report.fetch_period(exe, "2026-01-01", "2026-01-02")
    assert sorted(r.jobid for r in rows) == ["10", "11"]
    ten = next(r for r in rows if r.jobid == "10")
    assert ten.user == "u1" and ten.summary and ten.summary["n1"]["dev"]["0"]["sm"] == 50.0
    since, until = (datetime.strptime(t, "%Y-%m-%dT%H:%M:%S").timestamp()      # as sacct's times are read
                    for t in ("2026-01-01T00:00:00", "2026-01-01T01:00:00"))
    u = report.usage(rows, since, until, "user")
    assert u.jobs == 2 and set(u.by) == {"u1", "u2"}
    assert report.fetch_job(exe, "999") is None


def test_the_epilog_reads_a_newline_bearing_comment_whole(sacct):
    exe = sacct([row("10", "line one\n10|" + GOOD)])
    assert dbd.read_comment(exe, "10", 10.0) == "line one\n10|" + GOOD


@pytest.mark.parametrize("comment", [
    "slurm-gpu:" + "[" * 100000,
    "slurm-gpu:" + "{`a`:" * 50000,
    "slurm-gpu:{`n1`:5}",
    "slurm-gpu:{`n1`:{`dev`:[1,2]}}",
    "slurm-gpu:{`n1`:{`dev`:{`0`:5}}}",
    "slurm-gpu:{`n1`:{`dev`:{`0`:{`sm`:`high`,`idle`:[1],`mem`:{},`xid`:`x`,`j`:true}}}}",
    "slurm-gpu:{`n1`:{`dev`:{`0\\nfake line`:{`sm`:1}},`held`:[`0\\nx`, 5]}}",
    "slurm-gpu:{`n1\\nfake`:{`dev`:{`0`:{`sm`:1}}}}",
    "slurm-gpu:{`n1`:{`dev`:{`0`:{`sm`:NaN,`idle`:Infinity}}}}",
    "slurm-gpu:" * 5000,
])
def test_hostile_admin_comments_neither_crash_nor_forge(sacct, comment):
    exe = sacct([row("10", comment)])
    rows = report.fetch_period(exe, "2026-01-01", "2026-01-02")
    assert [r.jobid for r in rows] == ["10"]
    report.usage_view(report.usage(rows, 0.0, 2e9, "user"), 0.0, 2e9, 8.0, "user")
    view = report.job_view(report.fetch_job(exe, "10"), "10", None, None)
    text = report.format_job(view)
    json.dumps(view, allow_nan=False)
    for line in text.splitlines()[2:]:
        assert line.startswith(("  n1 ", "  - ", "  (")), text
    assert "fake" not in text


def test_a_clean_summary_keeps_its_figures():
    obj = dbd.parse(GOOD)
    assert obj == {"n1": {"v": 1, "iv": 10.0, "dev": {"0": {"sm": 50.0, "idle": 0.0, "n": 3}}, "held": ["0"]}}
