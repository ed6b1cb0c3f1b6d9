"""gres.conf parser and meaning comparison (Slurm syntax, errors with file:line)."""
from __future__ import annotations

import pytest

from slurm_gpu.confgen.grescheck import compare, parse_gres_conf, restart_advice
from slurm_gpu.errors import InputError


def parse(text: str):
    return parse_gres_conf(text.splitlines(True), "g.conf")


def test_ranges_comments_case_and_continuations() -> None:
    a = parse("# header\nAutoDetect=off\nNodeName=n[1-2] Name=gpu Type=h100 File=/dev/nvidia[0-1] "
              "Cores=0-3  # two GPUs\nnodename=n[1-2] NAME=gpu type=h100 \\\n  file=/dev/nvidia2 COREs=4,5,6,7\n")
    b = parse("NodeName=n1 Name=gpu Type=h100 File=/dev/nvidia0 Cores=0,1,2,3\n"
              "NodeName=n1 Name=gpu Type=h100 File=/dev/nvidia1 Cores=0-3\n"
              "NodeName=n1 Name=gpu Type=h100 File=/dev/nvidia2 Cores=4-7\n"
              "NodeName=n2 Name=gpu Type=h100 File=/dev/nvidia[0-2] Cores=0-3\n")
    diff = compare(a, b)
    assert diff == ["n2:", "  ~ gpu /dev/nvidia2: Type=h100 Cores=4-7 -> Type=h100 Cores=0-3"]


def test_global_lines_apply_to_every_node() -> None:
    a = parse("AutoDetect=off\nName=gpu Type=t File=/dev/nvidia[0-1]\n")
    b = parse("AutoDetect=off\nNodeName=x Name=gpu Type=t File=/dev/nvidia0\nNodeName=x Name=gpu Type=t File=/dev/nvidia1\n")
    assert compare(a, b) == []


def test_autodetect_and_counts_are_compared() -> None:
    a = parse("NodeName=x AutoDetect=nvml\nNodeName=x Name=mps Count=1K File=/dev/nvidia0\n")
    b = parse("NodeName=x Name=mps Count=1000 File=/dev/nvidia0\n")
    assert compare(a, b) == ["x:", "  AutoDetect: nvml -> unset", "  ~ mps /dev/nvidia0: Count 1024 -> 1000"]


def test_multiple_files_compare_as_a_set() -> None:
    a = parse("NodeName=x Name=gpu Type=a_1g.10gb MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap12,"
              "/dev/nvidia-caps/nvidia-cap13\n")
    b = parse("NodeName=x Name=gpu Type=a_1g.10gb MultipleFiles=/dev/nvidia-caps/nvidia-cap[12-13],/dev/nvidia0\n")
    assert compare(a, b) == []


def test_links_compare_and_need_one_file() -> None:
    a = parse("NodeName=x Name=gpu File=/dev/nvidia0 Links=-1,2\nNodeName=x Name=gpu File=/dev/nvidia1 Links=2,-1\n")
    b = parse("NodeName=x Name=gpu File=/dev/nvidia0 Links=-1,4\nNodeName=x Name=gpu File=/dev/nvidia1 Links=4,-1\n")
    assert len(compare(a, b)) == 3
    with pytest.raises(InputError, match=r"single device file \(g.conf:1\)"):
        parse("NodeName=x Name=gpu File=/dev/nvidia[0-1] Links=-1,2\n")


@pytest.mark.parametrize("text,where", [
    ("NodeName=x Name=gpu Bogus=1\n", "g.conf:1"),
    ("\n\nNodeName=x Name=gpu File=/dev/nvidia0 Cores=0-x\n", "g.conf:3"),
    ("NodeName=x gpu\n", "g.conf:1"),
    ("NodeName=x[1-\n", "g.conf:1"),
    ("NodeName=x Name=gpu File=/dev/a MultipleFiles=/dev/b\n", "g.conf:1"),
    ("NodeName=x Name=mps Count=lots\n", "g.conf:1"),
    ("NodeName=x Name=gpu \\\n", "g.conf:1"),
])
def test_bad_lines_name_file_and_line(text: str, where: str) -> None:
    with pytest.raises(InputError) as e:
        parse(text)
    assert e.value.line().endswith(f"({where})")


def test_restart_advice() -> None:
    a = parse("NodeName=x Name=gpu Type=t File=/dev/nvidia0 Cores=0-3\n")
    assert restart_advice(a, a) == ["slurm-gpu: gres.conf meaning unchanged: nothing to reload"]
    b = parse("NodeName=x Name=gpu Type=t File=/dev/nvidia0 Cores=4-7\n")
    adv = restart_advice(a, b)
    assert any("restart slurmd" in l for l in adv) and any("slurmctld" in l for l in adv)
    c = parse("NodeName=x Name=gpu Type=t File=/dev/nvidia[0-1] Cores=0-3\n")
    assert any("drain" in l for l in restart_advice(a, c))
