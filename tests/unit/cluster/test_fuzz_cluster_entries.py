"""Fault campaign, issue 24: hostile published entries and per-job MIG during publication (randomized).

1. Hostile entries: a random value (control characters, line separators,
   Slurm's own syntax, other types, over-long text) in a random field of one
   node's published model, or as its file name.  ``cluster render`` must
   either refuse with the node named, or render; and with
   ``--skip-unreadable`` always render the others.  No line outside the
   grammar of :mod:`test_cluster_hostile` may ever come out.
2. Per-job MIG: random sequences of jobs that take a GPU's MIG layout, end,
   and GPUs lost, with the health check's publishing between the steps.  No
   published model may ever hold a job's instance, and every published GPU's
   MIG state must be the baseline's.

``FIGURES`` counts what each run saw (the figures in the report).
"""
from __future__ import annotations

import copy
import os
from typing import Any

import pytest
from fuzzlib import NASTY, fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from slurm_gpu.cli import main
from slurm_gpu.cluster import modelfile, store
from slurm_gpu.hw import snapshot as snap

from test_cluster_hostile import GB200, H100, outside_grammar  # noqa: E402

EXAMPLES = int(os.environ.get("SLURM_GPU_FUZZ_EXAMPLES", "150"))
FIGURES: dict[str, int] = {"entries": 0, "refused": 0, "rendered": 0, "lines": 0, "outside": 0,
                           "mig_runs": 0, "publications": 0, "job_instances_published": 0, "not_published": 0}

_BASE = {m: snap.read_snapshot(m)["node"] for m in (H100, GB200)}
_SEPARATORS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\x00"]
_SLURM = ["Prolog=/tmp/evil.sh", " Prolog=/tmp/evil.sh", "#", "\\", "\\\n", '"', "'", "=", ":", ",", "(", "[1-3]",
          "\tEpilog=/x", "HealthCheckProgram=/x", "Include /etc/passwd"]
_pieces = st.sampled_from(NASTY + _SEPARATORS + _SLURM)
_text = st.one_of(
    st.lists(st.one_of(_pieces, st.text(max_size=8)), min_size=1, max_size=5).map("".join),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=40),
    st.sampled_from(["a" * 5000, "9" * 300]))
_value = st.one_of(_text, st.integers(-(1 << 70), 1 << 70), st.floats(allow_nan=True), st.booleans(), st.none(),
                   st.lists(st.integers(-5, 5), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


# field -> (on the first GPU, else on the node; the model's key; the value in a list)
_PLAIN = {"name": (True, "name", False), "minor": (True, "minor", False), "core": (True, "cores", True),
          "bus": (True, "pci_bus_id", False), "memory": (False, "memory_bytes", False),
          "note": (False, "notes", True)}


def _set(node: dict[str, Any], field: str, value: Any) -> None:
    g = node["gpus"][0]
    if field in _PLAIN:
        on_gpu, key, listed = _PLAIN[field]
        (g if on_gpu else node)[key] = [value] if listed else value
    elif field in ("profile", "gi_cap_minor", "gi_id"):
        inst = {"gi_id": 1, "ci_id": 0, "profile": "3g.40gb", "gi_profile_id": 2, "ci_profile_id": 2,
                "placement_start": 0, "placement_size": 4, "memory_bytes": 1 << 30, "sm_count": 60,
                "uuid": "MIG-1", "gi_cap_minor": 12, "ci_cap_minor": 13}
        inst[field] = value
        g["mig_enabled"], g["mig_instances"] = True, [inst]
    elif field.startswith("fabric_"):
        for gg in node["gpus"]:
            gg["fabric"] = dict(gg["fabric"], **{field[len("fabric_"):]: value})
    else:
        raise AssertionError(field)


FIELDS = ["name", "minor", "core", "bus", "memory", "note", "profile", "gi_cap_minor", "gi_id",
          "fabric_cluster_uuid", "fabric_state", "fabric_clique_id"]


@fuzz_settings(EXAMPLES)
@given(field=st.sampled_from(FIELDS + ["file name"]), value=_value)
def test_no_hostile_entry_ever_writes_a_line_outside_the_grammar(tmp_path_factory: pytest.TempPathFactory,
                                                                 field: str, value: Any) -> None:
    machine = GB200 if field.startswith("fabric_") else H100
    d = tmp_path_factory.mktemp("pub")
    base = _BASE[machine]
    for n in ("n1", "n2"):
        (d / f"{n}.json").write_text(modelfile.model_text(n, dict(base, hostname=n)))
    bad, name = copy.deepcopy(base), "n3"
    if field == "file name":
        name = value if isinstance(value, str) else repr(value)
    else:
        _set(bad, field, value)
    try:
        (d / f"{name}.json").write_text(modelfile.model_text("n3", dict(bad, hostname="n3")))
    except (OSError, ValueError, UnicodeEncodeError):
        return    # a name no file system takes, or a value JSON cannot carry: not an entry at all
    FIGURES["entries"] += 1
    import contextlib
    import io
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["cluster", "render", "--from", str(d)])
    assert rc in (0, 1)
    bad_lines = outside_grammar(out.getvalue())
    FIGURES["lines"] += len(out.getvalue().splitlines())
    FIGURES["outside"] += len(bad_lines)
    assert bad_lines == [], (field, value, bad_lines)
    assert all(ln.isascii() and ln.isprintable() for ln in err.getvalue().splitlines()), err.getvalue()
    FIGURES["refused" if rc else "rendered"] += 1
    o = d / "out"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["cluster", "render", "--from", str(d), "--skip-unreadable", "-o", str(o)]) == 0
    for f in o.iterdir():
        text = f.read_text()
        FIGURES["lines"] += len(text.splitlines())
        assert outside_grammar(text) == [], (field, value, f.name, outside_grammar(text))
    from slurm_gpu.confgen.hostlist import expand
    rendered = {n for ln in (o / "gres.conf").read_text().splitlines() if ln.startswith("NodeName=")
                for n in expand(ln.split()[0][len("NodeName="):])}
    assert {"n1", "n2"} <= rendered      # the healthy nodes are never lost (a valid third name may join them)


_STEP = st.one_of(st.tuples(st.just("start"), st.integers(0, 7), st.integers(1, 7)),
                  st.tuples(st.just("end"), st.integers(0, 7)),
                  st.tuples(st.just("lose"), st.integers(0, 7)),
                  st.tuples(st.just("publish")))


@fuzz_settings(EXAMPLES)
@given(steps=st.lists(_STEP, min_size=1, max_size=12), published_first=st.booleans())
def test_no_jobs_mig_instance_is_ever_published(tmp_path_factory: pytest.TempPathFactory,
                                                monkeypatch_module: Any, steps: list[tuple[Any, ...]],
                                                published_first: bool) -> None:
    from slurm_gpu.jobs import state as jobstate
    d = tmp_path_factory.mktemp("mig")
    pub, state = d / "pub", d / "state"
    pub.mkdir()
    (d / "c.toml").write_text(f'[node]\nstate_dir = "{state}"\n[cluster]\npublish_dir = "{pub}"\n')
    monkeypatch_module.setenv("SLURM_GPU_CONFIG", str(d / "c.toml"))
    FIGURES["mig_runs"] += 1
    baseline = copy.deepcopy(_BASE[H100])
    for g in baseline["gpus"]:
        g["mig_enabled"] = True
    live = copy.deepcopy(baseline)
    jobs: dict[int, int] = {}          # GPU minor -> job id
    if published_first:
        modelfile.publish_from_health("n1", copy.deepcopy(live), str(state))
    next_job = [100]
    for step in steps + [("publish",)]:
        kind = step[0]
        gpu = next((g for g in live["gpus"] if g["minor"] == (step[1] if len(step) > 1 else -1)), None)
        if kind == "start" and gpu is not None and gpu["minor"] not in jobs:
            jobid = next_job[0] = next_job[0] + 1
            st_ = jobstate.new(str(jobid), uid=1000, gid=1000, user="u")
            st_.gpus = [{"index": gpu["index"], "uuid": gpu["uuid"], "minor": gpu["minor"]}]
            st_.mig = {"layout": "x", "ready": True, "gpus": [
                {"index": gpu["index"], "uuid": gpu["uuid"], "minor": gpu["minor"], "baseline": [],
                 "baseline_removed": False, "instances": []}]}
            jobstate.save(str(state), st_)        # recorded before the GPU changes (jobs/migjob.py)
            gpu["mig_instances"] = [{"gi_id": 7 + i, "ci_id": 0, "profile": "1g.10gb", "gi_profile_id": 19,
                                     "ci_profile_id": 0, "placement_start": i, "placement_size": 1,
                                     "memory_bytes": 10 << 30, "sm_count": 16, "uuid": f"MIG-job-{jobid}-{i}",
                                     "gi_cap_minor": None, "ci_cap_minor": None} for i in range(step[2])]
            jobs[gpu["minor"]] = jobid
        elif kind == "end" and gpu is not None and gpu["minor"] in jobs:
            gpu["mig_instances"] = []             # the epilog restores the baseline, then drops the record
            jobstate.remove(str(state), str(jobs.pop(gpu["minor"])))
        elif kind == "lose" and gpu is not None:
            live["gpus"] = [g for g in live["gpus"] if g is not gpu]
            if gpu["minor"] in jobs:
                jobstate.remove(str(state), str(jobs.pop(gpu["minor"])))
        elif kind == "publish":
            note = modelfile.publish_from_health("n1", copy.deepcopy(live), str(state))
            FIGURES["publications"] += 1
            if note and note.startswith("model not published"):
                FIGURES["not_published"] += 1
            if (pub / "n1.json").exists():
                node = store.load_dir(str(pub)).nodes["n1"]
                leaked = [m.uuid for g in node.gpus for m in g.mig_instances if m.uuid.startswith("MIG-job-")]
                FIGURES["job_instances_published"] += len(leaked)
                assert leaked == [], (steps, leaked)
                assert all(g.mig_enabled is True and g.mig_instances == () for g in node.gpus)


@pytest.fixture(scope="module")
def monkeypatch_module() -> Any:
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_zz_figures() -> None:
    """Print the campaign's figures (run with -s to see them)."""
    print("\nslurm-gpu fault campaign (issue 24 §2/§3):", FIGURES)
