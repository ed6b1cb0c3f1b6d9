"""Another tool's AdminComment in upper case, e.g. ``NHC: Disk OK``.

sacctmgr lower-cased AdminComment before Slurm 23.02 (SchedMD commit
933bf55) and keeps its case since (measured on 24.11.5 and 26.05.5).
On 24.11 and 26.05 the summary used to stay on the node, as if sacctmgr
would still alter that text.  ``dbd.store`` runs here against a stand-in
sacct and sacctmgr that store the value as that Slurm's sacctmgr does.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_gpu.acct import dbd

# $DB/comment holds the stored AdminComment; $DB/version what `sacctmgr -V` says.
SACCT = """#!/bin/sh
d='|'
c=$(cat "$(dirname "$0")/comment")
while [ $# -gt 0 ]; do [ "$1" = --delimiter ] && d=$2; shift; done
printf '42%s%s\\n' "$d" "$c"
"""
SACCTMGR = """#!/bin/sh
d=$(dirname "$0")
if [ "$1" = -V ]; then cat "$d/version"; exit 0; fi
for a; do case "$a" in AdminComment=*) v=${a#AdminComment=} ;; esac; done
case "$(cat "$d/version")" in
  *" 22."*) v=$(printf '%s' "$v" | tr 'A-Z' 'a-z') ;;
esac
printf '%s' "$v" | tr "\\"'" '``' >"$d/comment"
echo " Modified jobs..."
"""


@dataclass
class Settings:
    sacct: str
    sacctmgr: str
    dbd_timeout: float = 10.0


def _dbd(tmp_path: Path, version: str, comment: str) -> Settings:
    for name, text in (("sacct", SACCT), ("sacctmgr", SACCTMGR)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    (tmp_path / "version").write_text(version + "\n")
    (tmp_path / "comment").write_text(comment)
    return Settings(str(tmp_path / "sacct"), str(tmp_path / "sacctmgr"))


PART = {"dev": {"0": {"sm": 80.0, "n": 3}}, "held": ["0"], "iv": 10.0, "v": 1}


@pytest.mark.parametrize("version", ["slurm-wlm 24.11.5", "slurm 26.05.5", "slurm 23.02.0"])
def test_upper_case_text_is_kept_and_the_summary_stored_where_sacctmgr_keeps_case(tmp_path, version):
    s = _dbd(tmp_path, version, "NHC: Disk OK")
    out = dbd.store(s, "42", "n1", PART)
    assert out.stored, out
    stored = (tmp_path / "comment").read_text()
    assert stored.startswith("NHC: Disk OK slurm-gpu:")
    assert dbd.parse(stored)["n1"]["dev"]["0"]["sm"] == 80.0


def test_upper_case_text_is_left_alone_where_sacctmgr_lowers_it(tmp_path):
    s = _dbd(tmp_path, "slurm-wlm 22.05.8", "NHC: Disk OK")
    out = dbd.store(s, "42", "n1", PART)
    assert not out.stored and out.final
    assert (tmp_path / "comment").read_text() == "NHC: Disk OK"


def test_quoted_text_is_left_alone_on_every_version(tmp_path):
    s = _dbd(tmp_path, "slurm 26.05.5", '{"owner":"x"}')
    out = dbd.store(s, "42", "n1", PART)
    assert not out.stored and out.final
    assert (tmp_path / "comment").read_text() == '{"owner":"x"}'


def test_an_unreadable_version_counts_as_lowering(tmp_path):
    s = _dbd(tmp_path, "garbage", "NHC: Disk OK")
    assert not dbd.store(s, "42", "n1", PART).stored
