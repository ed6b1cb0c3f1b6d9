"""The shipped MIG tables against real ``nvidia-smi mig -lgip`` tables.

Every profile row of every real capture in tests/data/mig (provenance in each
section's header and in PROVENANCE.md) must be a profile of the model it was
captured on, with the driver's profile id, instance count and SM count.
go-nvml's mock tables, where the SM counts first came from, contradict these
rows on H100 SXM, H200 and B200 (1g.20gb: 16 SMs there, 26 on the board).
The memory column is compared only on the models whose memory figures come
from these captures, and not in a section marked ``memory: skip``: it moves
with the driver (B200's 1g: 22.00 GiB in one report, 20.50 in another; the
A100 80GB's 7g: 79.00 in one, 78.75 under driver 550.54.14)."""
from __future__ import annotations

import re

import pytest

from slurm_gpu.mig.profiles import find_model
from paths import ROOT

DATA = ROOT / "tests" / "data" / "mig"
ROW = re.compile(r"^\|\s+\d+\s+MIG (\S+)\s+(\d+)\s+\d+/(\d+)\s+([\d.]+)\s+(?:Yes|No)\s+(\d+)\s", re.M)
# The older captures' sections have no `model:` line.
OLDER = {"A": "a30", "B": "h100-nvl", "C": "a100-80gb"}
MEMORY_FROM_CAPTURES = {"h100-80gb", "h100-pcie", "h100-nvl", "h200", "b200", "a30", "a100-40gb", "a100-80gb"}
FILES = ("lgip-lgipp-real-outputs.md", "lgip-real-hopper-blackwell.md", "lcip-real-ampere.md")


def sections() -> list[tuple[str, str | None, str]]:
    """(where, model key or None, text) of every captured section (tests/unit/mig/test_mig_real_lcip.py too)."""
    out = []
    for name in FILES:
        parts = re.split(r"\n## ([A-Z])\. ", (DATA / name).read_text())
        for letter, sec in zip(parts[1::2], parts[2::2]):
            m = re.search(r"^model: (\S+)$", sec, re.M)
            key = m.group(1) if m else OLDER.get(letter)
            out.append((f"{name}:{letter}", None if key == "none" else key, sec))
    return out


def _captures() -> list[tuple[str, str, list[tuple[str, int, int, float, int]], bool]]:
    """(section, model key, rows of (name, id, instances, GiB, SMs), memory compared) per captured table."""
    out = []
    for where, key, sec in sections():
        rows = [(n, int(i), int(t), float(g), int(s)) for n, i, t, g, s in ROW.findall(sec)]
        if key and rows:
            out.append((where, key, rows, key in MEMORY_FROM_CAPTURES and not re.search(r"^memory: skip", sec, re.M)))
    return out


CAPTURES = _captures()


def test_the_captures_cover_the_boards_in_question() -> None:
    keys = {key for _, key, _, _ in CAPTURES}
    assert {"h100-80gb", "h100-pcie", "h200", "b200", "gb200", "h100-nvl", "a100-80gb", "a30"} <= keys
    # a row the parser skipped would pass unseen: every capture has its 4 to 7 rows
    assert all(4 <= len(rows) <= 7 for _, _, rows, _ in CAPTURES)
    # the memory figures of every model that takes them from here are held to a capture
    assert MEMORY_FROM_CAPTURES <= {key for _, key, _, memory in CAPTURES if memory}


@pytest.mark.parametrize("where,key,rows,memory", CAPTURES, ids=[c[0] for c in CAPTURES])
def test_table_equals_the_real_lgip(where: str, key: str, rows: list[tuple[str, int, int, float, int]],
                                    memory: bool) -> None:
    model = find_model(key)
    assert model is not None, key
    for name, pid, total, gib, sms in rows:
        p = model.profile(name)
        assert p is not None, f"{where}: {name} is not a {key} profile"
        assert (p.id, p.instances, p.sm_count) == (pid, total, sms), f"{where}: {name}"
        if memory and p.memory_mb is not None:
            # -lgip prints GiB with two decimals (19.62 for 19.625)
            assert abs(p.memory_mb / 1024 - gib) < 0.01, f"{where}: {name} {p.memory_mb} MiB vs {gib} GiB"
