"""Issue 24 §2: whoever writes one entry of a publish/collect directory must not write the cluster's config.

A node's root (or ``nobody`` on an NFS root_squash export) controls its
entry's every byte.  ``cluster render`` prints strings from those entries into
gres.conf, nodes.conf and topology.conf, which Slurm's parser
(src/common/parse_config.c) splits at newlines and whitespace, cuts at ``#``,
joins after a trailing ``\\``; a GPU name ``x\\nProlog=/tmp/evil.sh`` would
be a line of its own, run as root on every node.  Every line these tests get
back must match the grammar below, written here independently of the
product's own checks; a hostile entry is named in one line and refused, or
left out with ``--skip-unreadable``.
"""
from __future__ import annotations

import copy
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from slurm_gpu.cli import main
from slurm_gpu.cluster import modelfile, store
from slurm_gpu.hw import snapshot as snap
from paths import ROOT

sys.path.insert(0, str(ROOT / "tests"))
from machinedata import MACHINES_DIR  # noqa: E402

H100 = str(MACHINES_DIR / "h100-sxm-8x" / "snapshot.json")
GB200 = str(MACHINES_DIR / "gb200-nvl" / "snapshot.json")

# The grammar of what may come out (stricter than Slurm needs, and enough).
_HL = r"[A-Za-z0-9._\-\[\],]+"                 # a node name or folded hostlist
_T = r"[A-Za-z0-9][A-Za-z0-9_.+\-]*"          # a GRES type
_F = r"/[A-Za-z0-9._+/\-\[\],]+"              # a device file (folded ranges allowed)
_R = r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*"        # a core list
GRAMMAR = [re.compile(p) for p in (
    r"",
    r"#[\x20-\x7e]*",
    r"AutoDetect=(?:off|nvml|nvidia|full)",
    rf"NodeName={_HL} Name=(?:gpu|mps|shard)(?: Type={_T})?(?: Count=\d+)?(?: File={_F})?"
    rf"(?: MultipleFiles={_F}(?:,{_F})*)?(?: Cores={_R})?(?: Links=-?\d+(?:,-?\d+)*)?",
    r"SlurmdParameters=[a-z_]+(?:,[a-z_]+)*",
    rf"NodeName={_HL} CPUs=\d+ Sockets=\d+ CoresPerSocket=\d+ ThreadsPerCore=\d+ RealMemory=\d+"
    rf"(?: Gres=gpu:{_T}:\d+(?:,gpu:{_T}:\d+)*(?:,mps:\d+)?(?:,shard:\d+)?)?",
    rf"BlockName=[A-Za-z0-9_]+(?: Nodes={_HL})?",
    r"BlockSizes=\d+(?:,\d+)*",
)]


def outside_grammar(text: str) -> list[str]:
    """Every line of *text* no rule allows (split the way any reader might: \\r, \\v, \\u2028 too)."""
    return [ln for ln in text.splitlines() if not any(g.fullmatch(ln) for g in GRAMMAR)]


def _model(machine: str) -> dict[str, Any]:
    return snap.read_snapshot(machine)["node"]


def _write_model(d: Path, name: str, node: dict[str, Any]) -> Path:
    p = d / f"{name}.json"
    p.write_text(modelfile.model_text(name, dict(node, hostname=name)))
    return p


def _collection(d: Path, names: list[str], machine: str = H100) -> dict[str, Any]:
    d.mkdir(exist_ok=True)
    base = _model(machine)
    for n in names:
        _write_model(d, n, base)
    return base


HOSTILE = ["NVIDIA H100\nProlog=/tmp/evil.sh", "NVIDIA H100\rProlog=/tmp/evil.sh", "NVIDIA\x00H100",
           "NVIDIA H100 #x", "NVIDIA=H100", 'NVIDIA "H100"', "NVIDIA 'H100'", "NVIDIA H100\u2028Prolog=/x",
           "NVIDIA H100\u2029Prolog=/x", "NVIDIA H100\x85Prolog=/x", "NVIDIA\x0bH100", "NVIDIA\x0cH100",
           "NVIDIA H100\\", "gpu:h100,mps", "NVIDIA (H100)", "NVIDIA H100é", "N" * 5000]


def _edit_gpu_name(node: dict[str, Any], value: Any) -> None:
    node["gpus"][0]["name"] = value


@pytest.mark.parametrize("value", HOSTILE, ids=[repr(v)[:30] for v in HOSTILE])
def test_a_hostile_gpu_name_is_refused_by_default_and_left_out_when_asked(
        tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "pub"
    base = _collection(d, ["n1", "n2"])
    bad = copy.deepcopy(base)
    _edit_gpu_name(bad, value)
    _write_model(d, "n3", bad)
    rc = main(["cluster", "render", "--from", str(d)])
    cap = capsys.readouterr()
    assert rc == 1
    assert outside_grammar(cap.out) == [] and "Prolog" not in cap.out
    named = [ln for ln in cap.err.splitlines() if ln.startswith("slurm-gpu: n3: ")]
    assert len(named) == 1 and "refused" in named[0], cap.err
    assert all(ln.isascii() and ln.isprintable() for ln in cap.err.splitlines())
    out = tmp_path / "out"
    assert main(["cluster", "render", "--from", str(d), "--skip-unreadable", "-o", str(out)]) == 0
    for f in out.iterdir():
        text = f.read_text()
        assert outside_grammar(text) == [], (f.name, outside_grammar(text))
        assert "n3" not in text.replace("# input", "")
    assert "NodeName=n[1-2] " in (out / "gres.conf").read_text()


def _hostile_edits() -> list[tuple[str, str, Any]]:
    """(test id, machine, edit) for every model value the generators print or compute from."""
    def gpu(field: str, value: Any) -> Any:
        def edit(n: dict[str, Any]) -> None:
            n["gpus"][0][field] = value
        return edit

    def mig(field: str, value: Any) -> Any:
        def edit(n: dict[str, Any]) -> None:
            g = n["gpus"][0]
            g["mig_enabled"] = True
            inst = {"gi_id": 1, "ci_id": 0, "profile": "3g.40gb", "gi_profile_id": 2, "ci_profile_id": 2,
                    "placement_start": 0, "placement_size": 4, "memory_bytes": 1 << 30, "sm_count": 60,
                    "uuid": "MIG-1", "gi_cap_minor": 12, "ci_cap_minor": 13}
            inst[field] = value
            g["mig_instances"] = [inst]
        return edit

    def fabric(field: str, value: Any) -> Any:
        def edit(n: dict[str, Any]) -> None:
            for g in n["gpus"]:
                g["fabric"] = dict(g["fabric"], **{field: value})
        return edit

    def node(field: str, value: Any) -> Any:
        def edit(n: dict[str, Any]) -> None:
            n[field] = value
        return edit

    def cores(value: Any) -> Any:
        def edit(n: dict[str, Any]) -> None:
            n["gpus"][0]["cores"] = [value]
        return edit

    return [
        ("minor-text", H100, gpu("minor", "0 Prolog=/tmp/evil.sh")),
        ("minor-negative", H100, gpu("minor", -1)),
        ("minor-float", H100, gpu("minor", 1.5)),
        ("minor-bool", H100, gpu("minor", True)),
        ("minor-zero-float", H100, gpu("minor", 0.0)),      # == 0, the healthy nodes' value (found by the campaign)
        ("mig-enabled-zero", H100, gpu("mig_enabled", 0)),  # == False
        ("minor-huge", H100, gpu("minor", 1 << 70)),
        ("cores-text", H100, cores("0\nProlog=/tmp/evil.sh")),
        ("cores-negative", H100, cores(-3)),
        ("mig-profile-newline", H100, mig("profile", "3g.40gb\nProlog=/tmp/evil.sh")),
        ("mig-profile-space", H100, mig("profile", "3g.40gb Prolog=/tmp/evil.sh")),
        ("mig-cap-text", H100, mig("gi_cap_minor", "12 Prolog=/tmp/evil.sh")),
        ("memory-text", H100, node("memory_bytes", "1 Prolog=/tmp/evil.sh")),
        ("memory-float", H100, node("memory_bytes", 1.5e12)),
        ("memory-negative", H100, node("memory_bytes", -1)),
        ("note-newline", H100, node("notes", ["NVML lost GPU 3\nProlog=/tmp/evil.sh"])),
        ("fabric-uuid-newline", GB200, fabric("cluster_uuid", "7e3f\nProlog=/tmp/evil.sh")),
        ("fabric-uuid-long", GB200, fabric("cluster_uuid", "7" * 5000)),
        ("fabric-state-newline", GB200, fabric("state", "bad\nProlog=/tmp/evil.sh")),
        ("fabric-clique-text", GB200, fabric("clique_id", "1\nProlog=/tmp/evil.sh")),
    ]


@pytest.mark.parametrize("machine,edit", [e[1:] for e in _hostile_edits()], ids=[e[0] for e in _hostile_edits()])
def test_every_printed_model_value_is_checked(tmp_path: Path, machine: str, edit: Any,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "pub"
    base = _collection(d, ["n1", "n2"], machine)
    bad = copy.deepcopy(base)
    edit(bad)
    _write_model(d, "n3", bad)
    rc = main(["cluster", "render", "--from", str(d)])
    cap = capsys.readouterr()
    assert rc == 1 and outside_grammar(cap.out) == [], cap.out
    named = [ln for ln in cap.err.splitlines() if ln.startswith("slurm-gpu: n3: ")]
    assert len(named) == 1, cap.err
    assert all(ln.isascii() and ln.isprintable() for ln in cap.err.splitlines()), cap.err
    out = tmp_path / "out"
    assert main(["cluster", "render", "--from", str(d), "--skip-unreadable", "-o", str(out)]) == 0
    for f in out.iterdir():
        assert outside_grammar(f.read_text()) == [], f.name
    assert "NodeName=n[1-2] " in (out / "gres.conf").read_text()


NAMES = ["n 3", "n\n3", "n\r3", "n#3", "n=3", 'n"3', "n\\3", "n,3", "n[3]", "n:3", "n\u20283", "né3", "-n3",
         "n" * 100]


@pytest.mark.parametrize("name", NAMES, ids=[repr(n)[:20] for n in NAMES])
def test_an_entry_whose_file_name_is_no_node_name_is_refused(tmp_path: Path, name: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "pub"
    base = _collection(d, ["n1", "n2"])
    try:
        _write_model(d, name, base)
    except OSError:
        pytest.skip("the file system refuses this name")
    rc = main(["cluster", "render", "--from", str(d)])
    cap = capsys.readouterr()
    assert rc == 1 and outside_grammar(cap.out) == [], cap.out
    assert all(ln.isascii() and ln.isprintable() for ln in cap.err.splitlines()), cap.err
    assert "not a Slurm node name" in cap.err
    out = tmp_path / "out"
    assert main(["cluster", "render", "--from", str(d), "--skip-unreadable", "-o", str(out)]) == 0
    for f in out.iterdir():
        assert outside_grammar(f.read_text()) == [], f.name


def test_cluster_check_names_a_hostile_entry_and_prints_none_of_it(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "pub"
    base = _collection(d, ["n1", "n2"])
    bad = copy.deepcopy(base)
    bad["gpus"][0]["name"] = "NVIDIA H100\nProlog=/tmp/evil.sh"
    bad["notes"] = ["x\x1b[2J\nProlog=/tmp/evil.sh"]
    _write_model(d, "n3", bad)
    sc = tmp_path / "show-node.txt"
    sc.write_text("".join(f"NodeName={n} CPUTot=192 Sockets=2 CoresPerSocket=48 ThreadsPerCore=2 "
                          f"RealMemory=2000000 Gres=gpu:nvidia_h100_80gb_hbm3:8 State=IDLE\n" for n in ("n1", "n2", "n3")))
    rc = main(["cluster", "check", "--from", str(d), "--slurm-nodes-from", str(sc), "--json"])
    cap = capsys.readouterr()
    rep = json.loads(cap.out)
    assert rc == 1
    assert rep["nodes"]["n3"] and rep["nodes"]["n3"][0].startswith("unreadable entry: refused:"), rep["nodes"]["n3"]
    assert "Prolog" not in cap.out.replace("\\nProlog", "") and "\x1b" not in cap.out + cap.err


def test_a_symlinked_entry_is_refused_never_followed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "pub"
    _collection(d, ["n1", "n2"])
    elsewhere = tmp_path / "elsewhere.json"
    snap.write(str(elsewhere), snap.rerecord(H100, hostname="n3"))
    (d / "n3.json").symlink_to(elsewhere)
    rc = main(["cluster", "render", "--from", str(d)])
    err = capsys.readouterr().err
    assert rc == 1
    assert [ln for ln in err.splitlines() if ln.startswith("slurm-gpu: n3: ")] == [
        f"slurm-gpu: n3: unreadable entry: a symbolic link, not a regular file ({d}/n3.json)"]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_directory_or_entry_others_could_write_is_warned_about(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "pub"
    _collection(d, ["n1", "n2", "n3"])
    os.chmod(d, 0o755)
    assert main(["cluster", "render", "--from", str(d)]) == 0
    assert "warning" not in capsys.readouterr().err
    os.chmod(d, 0o1777)
    os.chown(d / "n2.json", 65534, 65534)
    os.chmod(d / "n3.json", 0o666)
    assert main(["cluster", "render", "--from", str(d)]) == 0
    warn = [ln for ln in capsys.readouterr().err.splitlines() if "warning" in ln]
    assert warn == [
        f"slurm-gpu: warning: the directory is writable by group or others: any local user can add or "
        f"replace node entries ({d})",
        f"slurm-gpu: warning: entries n[2-3] are not root's or are writable by group or others: "
        f"they are trusted for the cluster's config ({d})"], warn


def _snapshot_with(tmp_path: Path, machine: str, edit: Any, name: str = "n3") -> Path:
    data = snap.rerecord(machine, hostname=name)
    edit(data["node"])
    p = tmp_path / f"{name}.json"
    snap.write(str(p), data)
    return p


def test_gres_render_of_one_hostile_snapshot_is_one_line_and_no_file(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    def edit(n: dict[str, Any]) -> None:
        n["gpus"][0]["name"] = "NVIDIA H100\nProlog=/tmp/evil.sh"
    p = _snapshot_with(tmp_path, H100, edit)
    out = tmp_path / "gres.conf"
    rc = main(["gres", "render", "--snapshot", f"n3={p}", "-o", str(out)])
    cap = capsys.readouterr()
    assert rc == 1 and not out.exists() and "Prolog" not in cap.out
    lines = cap.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("slurm-gpu: GPU 0000:18:00.0: GRES type "), lines
    # and a --node name that no slurm.conf can hold
    good = _snapshot_with(tmp_path, H100, lambda n: None, "ok")
    assert main(["gres", "render", "--snapshot", str(good), "--node", "n3 Prolog=/x", "--node-lines"]) == 1
    cap = capsys.readouterr()
    assert "Prolog" not in cap.out and "not a Slurm node name" in cap.err


def test_topology_render_refuses_a_hostile_fabric_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "snaps"
    d.mkdir()
    for i in (1, 2):
        snap.write(str(d / f"nvl{i}.json"), snap.rerecord(GB200, hostname=f"nvl{i}"))

    def edit(n: dict[str, Any]) -> None:
        for g in n["gpus"]:
            g["fabric"]["cluster_uuid"] = "7e3f\nPrologSlurmctld=/tmp/evil.sh"
    _snapshot_with(d, GB200, edit, "nvl3")
    rc = main(["topology", "render", "--snapshot", str(d)])
    cap = capsys.readouterr()
    assert rc == 1 and "PrologSlurmctld" not in cap.out
    assert len(cap.err.splitlines()) == 1 and "fabric cluster UUID" in cap.err, cap.err


def test_an_oversized_model_file_is_one_unreadable_entry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 20 MB model file (an 8-GPU model is about 14 KB) is refused before it is read whole."""
    d = tmp_path / "pub"
    base = _collection(d, ["n1", "n2"])
    _write_model(d, "n3", dict(base, notes=["x" * 1000] * 20_000))
    col = store.load_dir(str(d))
    assert sorted(col.nodes) == ["n1", "n2"] and col.bad["n3"].reason == "model file over 16 MiB"


@pytest.mark.parametrize("name", ["DEFAULT", "default", "Default", "ALL", "all"])
def test_an_entry_named_after_a_slurm_conf_keyword_is_refused(tmp_path: Path, name: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """NodeName=DEFAULT sets every later node line's defaults (Slurm compares without
    case): one node's file would rewrite the others' Gres= (security review F2)."""
    d = tmp_path / "pub"
    base = _collection(d, ["n1", "n2"])
    small = copy.deepcopy(base)
    small["gpus"] = small["gpus"][:1]
    _write_model(d, name, small)
    rc = main(["cluster", "render", "--from", str(d)])
    cap = capsys.readouterr()
    assert rc == 1 and "is a slurm.conf keyword" in cap.err, cap.err
    assert not re.search(r"NodeName=(?i:default|all)\b", cap.out)
    out = tmp_path / "out"
    assert main(["cluster", "render", "--from", str(d), "--skip-unreadable", "-o", str(out)]) == 0
    for f in out.iterdir():
        assert not re.search(r"NodeName=(?i:default|all)\b", f.read_text()), f.name


def test_a_model_with_absurdly_many_gpus_is_refused_before_the_render(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Links= grows with the square of the GPUs: 5,000 took minutes (security review F5)."""
    d = tmp_path / "pub"
    base = _collection(d, ["n1", "n2"])
    big = copy.deepcopy(base)
    g = big["gpus"][0]
    big["gpus"] = [dict(g, index=i, minor=i, uuid=f"GPU-{i:08d}", pci_bus_id=f"0000:{i // 32:02x}:{i % 32:02x}.0",
                        nvlinks=[]) for i in range(300)]
    _write_model(d, "n3", big)
    rc = main(["cluster", "render", "--from", str(d)])
    cap = capsys.readouterr()
    assert rc == 1 and "300 GPUs in one node model (at most 256)" in cap.err, cap.err
