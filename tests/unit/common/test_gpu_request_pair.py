"""Nothing we write or run asks for GPUs with both ``--gres=gpu`` and ``--gpus-per-node``.

Slurm 26.05 refuses the pair in srun, sbatch and salloc ("--gpus-per-node and
--gres=gpu are mutually exclusive.", ``_validate_gres_vs_gpus_per_node`` in
src/common/slurm_opt.c, slurm-26-05-3-1; CHANGELOG/slurm-26.05.md, 26.05.0rc1),
also when ``--gpus-per-node`` comes from the environment
(``SBATCH_``/``SALLOC_``/``SLURM_GPUS_PER_NODE``).  A job submitted with
``--gpus-per-node`` exports ``SLURM_GPUS_PER_NODE``, so an ``srun --gres=gpu:N``
inside it fails too.  So: no command line in the docs, scripts, benches,
templates, tests or code holds both, no file that sets ``--gpus-per-node``
(``#SBATCH``, an environment variable, an argv element) also asks with
``--gres=gpu``, and what we run gets none of those variables from the caller.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from paths import ROOT

GRES_GPU = re.compile(r"--gres(?:=|\s+)[\"']?(?:[\w:.]+,)*gpu\b")
PER_NODE = re.compile(r"--gpus-per-node\b|\b(?:SBATCH|SALLOC|SLURM)_GPUS_PER_NODE\b")
ENV_VARS = ("SBATCH_GPUS_PER_NODE", "SALLOC_GPUS_PER_NODE", "SLURM_GPUS_PER_NODE")


def _units(path: str, text: str) -> list[tuple[str, list[str]]]:
    """(kind, logical lines) of one file: markdown's fenced blocks and inline
    code spans, else the whole file with backslash continuations joined."""
    if not path.endswith(".md"):
        return [("file", text.replace("\\\n", " ").splitlines())]
    out: list[tuple[str, list[str]]] = []
    block: list[str] | None = None
    prose: list[str] = []
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if block is None:
                block = []
            else:
                out.append(("file", "".join(block).replace("\\\n", " ").splitlines()))
                block = None
            continue
        if block is not None:
            block.append(line + "\n")
        elif line.startswith("    "):           # an indented code block: one command a line
            out.append(("file", [line]))
        else:
            prose.append(line)
    out += [("span", [s]) for s in re.findall(r"`([^`]+)`", "\n".join(prose))]
    return out


def problems(path: str, text: str) -> list[str]:
    """Where *text* (the file at *path*) asks for GPUs both ways."""
    out = []
    for kind, lines in _units(path, text):
        both = [f"{path}: {line.strip()[:120]}" for line in lines
                if GRES_GPU.search(line) and PER_NODE.search(line)]
        sets, asks = PER_NODE.search("\n".join(lines)), GRES_GPU.search("\n".join(lines))
        if not both and kind == "file" and sets and asks:
            both = [f"{path}: {sets.group(0)} and {asks.group(0)} in one script"]
        out += both
    return out


def _files() -> list[Path]:
    out = [ROOT / "README.md", ROOT / "Makefile"]
    for d in ("docs", "scripts", "templates", "packaging", "bench", "slurm_gpu", "devkit", "tests", "prolog.d",
              "epilog.d", "spank"):
        out += [p for p in (ROOT / d).rglob("*") if p.is_file() and "__pycache__" not in p.parts
                and "build" not in p.parts and not any(x.endswith(".egg-info") for x in p.parts)
                and p.suffix not in (".json", ".xml", ".gz", ".so", ".whl", ".pyc")]
    return [p for p in out if p.is_file() and p.resolve() != Path(__file__).resolve()]


@pytest.mark.parametrize("path, text, bad", [
    ("a.md", "    srun --gres=gpu:1 --gpus-per-node=1 true\n", True),
    ("a.md", "```\nsbatch --gpus-per-node=2 \\\n  --gres=gpu:h100:2 job.sh\n```\n", True),
    ("a.md", "Run `srun --gpus-per-node=1 --gres=shard:1,gpu:1 x`.\n", True),
    ("job.sh", "#!/bin/sh\n#SBATCH --gpus-per-node=4\nsrun --gres=gpu:1 ./a\n", True),
    ("t.py", 'env = {"SLURM_GPUS_PER_NODE": "1"}\nrun(["srun", "--gres=gpu:1", "x"], env=env)\n', True),
    ("job.sh", "export SBATCH_GPUS_PER_NODE=1\nsbatch --gres gpu:2 x.sh\n", True),
    # what is fine: one way per script, or both named apart in prose
    ("a.md", "Never pass `--gres=gpu:N` with `--gpus-per-node`: 26.05 refuses the pair.\n", False),
    ("a.md", "```\nsrun --gres=gpu:2 x\n```\n```\nsrun --gpus-per-node=2 x\n```\n", False),
    ("t.py", 'run(["srun", "--gpus=1", "x"])\nrun(["srun", "--gres=gpu:1", "y"])\n', False),
    ("t.py", 'run(["srun", "--gres=shard:2", "--gpus-per-node=1", "y"])\n', False),
])
def test_the_scanner_finds_the_pair(path: str, text: str, bad: bool) -> None:
    assert bool(problems(path, text)) is bad


def test_nothing_we_write_asks_for_gpus_both_ways() -> None:
    found = [p for f in _files() for p in problems(str(f.relative_to(ROOT)), f.read_text(errors="replace"))]
    assert found == []


def test_commands_we_run_never_inherit_gpus_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """An admin running slurm-gpu inside a job submitted with --gpus-per-node
    has SLURM_GPUS_PER_NODE set; the srun, scontrol and sacctmgr we start must
    not see it (runner.run's environment is PATH and SLURM_CONF only)."""
    from slurm_gpu import runner
    for k in ENV_VARS:
        monkeypatch.setenv(k, "2")
    res = runner.run([sys.executable, "-c", "import os, json; print(json.dumps(sorted(os.environ)))"],
                     timeout=30)
    seen = set(__import__("json").loads(res.stdout))
    assert not seen & set(ENV_VARS), seen
    assert os.environ["SLURM_GPUS_PER_NODE"] == "2"        # the caller's own stays
