"""The binding planner (spank/sg_bind.c) through both of its front ends.

There is one planner.  A plain ``--gpu-numa-bind=prefer`` step calls it in
the outer C half with the binding table the Python path keeps
(:mod:`slurm_gpu.spank.bindtable`); every other bound step calls it from
:func:`slurm_gpu.spank.remote.bind_task` through cffi.  What must hold:

* for every recorded machine, Slurm GPU order (NVML's, gres.conf's in minor
  order, one with a device NVML lacks) and task environment, both paths do
  what the Python path did when it had its own planner
  (``tests/data/golden/binding-planner.json``), and the same as each other:
  the same system calls with the same arguments, the same
  ``SLURM_GPU_BINDING``, the same warning and error lines;
* a table that is stale, forged or odd in any way is refused, so the step
  goes to Python (which is what every other test of the step covers).

The harness (tests/unit/spank/cbind/harness.c) is compiled with spank/sg_bind.c
and fakes the system calls; it prints each call, as the Python side's fakes
below do.
"""
from __future__ import annotations

import hashlib
import json
import os
import posix
import shutil
import subprocess
from pathlib import Path

import pytest
from machinedata import all_machines, load_machine

from slurm_gpu import __version__, nodefacts
from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.joboptions import NumaBind
from slurm_gpu.procfs import boot_id
from slurm_gpu.spank import bindtable, effects, remote
from paths import ROOT

PREFIX = f"{__version__}:{nodefacts.FORMAT}"
NODE, CONFIG = "n1", "/etc/slurm-gpu/cbind-test.toml"
GOLDEN = json.loads((ROOT / "tests/data/golden/binding-planner.json").read_text())

pytestmark = pytest.mark.usefixtures("planner")


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> str:
    if not shutil.which("gcc"):
        pytest.skip("no gcc")
    out = tmp_path_factory.mktemp("cbind") / "harness"
    subprocess.run(["gcc", "-O2", "-Wall", "-Werror", f"-I{ROOT / 'spank'}", "-o", str(out),
                    "-Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc",
                    str(ROOT / "tests/unit/spank/cbind/harness.c"), str(ROOT / "spank/sg_bind.c")],
                   check=True)
    return str(out)


@pytest.fixture()
def cache(tmp_path) -> Path:
    d = tmp_path / "facts"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o700)
    return d


def _data(gpus, stamps) -> dict:
    return {"boot_id": boot_id(), "stamps": tuple(stamps), "gpus": gpus}


def write_table(cache: Path, gpus, nmap: dict[int, int], gres: str, stamps=()) -> Path:
    text = bindtable.render(_data(gpus, stamps), nmap, nodefacts.key(CONFIG, NODE, gres))
    assert text is not None
    p = Path(bindtable.path(CONFIG, NODE, gres, str(cache)))
    p.write_bytes(text)
    os.chmod(p, 0o600)
    return p


def run_c(harness: str, cache: Path, gres: str, env: dict[str, str], task: int, ntasks: int,
          allowed: tuple[int, ...], bound: tuple[int, ...] | None, aff_err: int = 0,
          mpol_err: int = 0, node: str = NODE) -> str:
    def v(name: str) -> str:
        return env.get(name, "@unset")
    res = subprocess.run([harness, str(cache), PREFIX, node, CONFIG, gres, v("SLURM_STEP_GPUS"),
                          v("CUDA_VISIBLE_DEVICES"), v("SLURM_GPUS_PER_TASK"), str(task),
                          str(ntasks), ",".join(map(str, allowed)),
                          "@none" if bound is None else ",".join(map(str, bound)),
                          str(aff_err), str(mpol_err)],
                         capture_output=True, text=True, check=True)
    first, _, rest = res.stdout.partition("\n")
    if first.startswith("name "):
        assert first == "name " + Path(bindtable.path(CONFIG, node, gres, str(cache))).name
    return rest if first.startswith("name ") else first + "\n" + rest


class _FakeSpank:
    def __init__(self, out: list[str]) -> None:
        self.out = out

    def setenv(self, name: str, value: str) -> None:
        self.out.append(f"setenv {name}={value}\n")


class _FakeCalls:
    """effects' system calls, printed as the harness prints them."""

    def __init__(self, out: list[str], err: int) -> None:
        self.out, self.err = out, err

    def set_mempolicy(self, mode: int, nodes: tuple[int, ...]) -> int:
        _, maxnode = effects.nodemask(nodes, 64)
        self.out.append(f"mempolicy {mode} {maxnode} {','.join(map(str, nodes))}\n")
        return self.err


def run_py(monkeypatch, gpus, nmap: dict[int, int], env: dict[str, str], task: int,
           ntasks: int, allowed: tuple[int, ...], bound: tuple[int, ...] | None,
           aff_err: int = 0, mpol_err: int = 0, mode: str = "prefer") -> str:
    """remote.bind_task, the Python path's own code, with its system calls faked."""
    out: list[str] = []

    def setaffinity(pid: int, cpus) -> None:
        out.append(f"affinity {','.join(map(str, cpus))}\n")
        if aff_err:
            raise OSError(aff_err, os.strerror(aff_err))

    with monkeypatch.context() as m:
        m.setattr(effects, "allowed_cpus", lambda: allowed)
        m.setattr(effects, "get_mempolicy", lambda: (0, ()) if bound is None else (2, bound))
        m.setattr(posix, "sched_setaffinity", setaffinity)
        m.setattr(effects, "_calls", _FakeCalls(out, mpol_err))
        real_write = posix.write

        def write(fd: int, data: bytes) -> int:        # the task's stderr
            if fd != 2:
                return real_write(fd, data)
            out.append("say " + data.decode())
            return len(data)
        m.setattr(posix, "write", write)
        step = remote.Step(NumaBind(mode), facts={"gpus": nodefacts.for_binding(gpus),
                                                  "numa_map": nmap})
        rc = 0
        try:
            remote.bind_task(_FakeSpank(out), step, {k: v for k, v in env.items()}, task, ntasks)
        except SlurmGpuError as e:
            out.append(f"error {e.line()}\n")
            rc = -1
    return "".join(out) + f"rc {rc}\n"


def _orders(model) -> list[tuple[str, list[int] | None]]:
    minors = sorted(int(g.minor if g.minor is not None else g.index) for g in model.gpus)
    orders: list[tuple[str, list[int] | None]] = [("nvml", None), ("minor", minors)]
    if minors:
        orders.append(("missing", minors[:1] + [max(minors) + 1000] + minors[1:]))
    return orders


def _cases(gpus, model) -> list[tuple[dict[str, str], int, int, tuple[int, ...], tuple[int, ...] | None]]:
    """(env, task, ntasks, allowed CPUs, bound host nodes) for one machine."""
    n = len(gpus)
    every = tuple(sorted(p for c in model.cores for p in c.pus))
    half = every[:max(1, len(every) // 2)]
    nodes = sorted({m for g in gpus if g for m in g["mems"]}) or [0]
    uuids = [g["uuid"] for g in gpus if g and g["uuid"]]
    out = []
    for k in range(min(n, 8)):
        out.append(({"SLURM_STEP_GPUS": str(k)}, 0, 1, every, None))
        out.append(({"SLURM_STEP_GPUS": str(k), "CUDA_VISIBLE_DEVICES": "0"}, 0, 1, half, None))
        out.append(({"SLURM_STEP_GPUS": str(k), "CUDA_VISIBLE_DEVICES": str(k)}, 0, 1, every,
                    (nodes[0],)))
        out.append(({"SLURM_STEP_GPUS": str(k)}, 0, 1, every[-1:], (nodes[-1],)))
    if n:
        all_ = f"0-{n - 1}"
        for ntasks in (1, 2, 3):
            for task in range(ntasks):
                out.append(({"SLURM_STEP_GPUS": all_, "CUDA_VISIBLE_DEVICES": ",".join(
                    map(str, range(n)))}, task, ntasks, every, None))
                out.append(({"SLURM_STEP_GPUS": all_, "SLURM_GPUS_PER_TASK": "h100:2"}, task,
                            ntasks, half, None))
                out.append(({"SLURM_STEP_GPUS": all_, "SLURM_GPUS_PER_TASK": "99999999999"},
                            task, ntasks, every, None))
        # a task id Slurm never gives (S_TASK_ID < 0): C indexed out of bounds
        out.append(({"SLURM_STEP_GPUS": all_}, -1, 2, every, None))
        out.append(({"SLURM_STEP_GPUS": all_}, -7, 3, every, None))
        out.append(({"SLURM_STEP_GPUS": f"{n - 1},0"}, 0, 1, every, tuple(nodes)))
        out.append(({"SLURM_STEP_GPUS": f"0,{n}"}, 0, 1, every, None))
        out.append(({"SLURM_STEP_GPUS": "0", "CUDA_VISIBLE_DEVICES": "MIG-x"}, 0, 1, every, None))
        out.append(({"SLURM_STEP_GPUS": " 0 , 1-1 "}, 0, 1, every, None))
        out.append(({"SLURM_STEP_GPUS": "0,,1"}, 0, 1, every, None))
        out.append(({"SLURM_STEP_GPUS": "0", "CUDA_VISIBLE_DEVICES": "5,0"}, 0, 1, every, None))
        out.append(({"SLURM_STEP_GPUS": str(n - 1), "CUDA_VISIBLE_DEVICES": "1"}, 0, 1, every,
                    None))
        out.append(({"SLURM_STEP_GPUS": f"{n - 1},0", "CUDA_VISIBLE_DEVICES": "1"}, 0, 1,
                    every, None))
        out.append(({"SLURM_STEP_GPUS": "0"}, 0, 1, (), None))
        out.append(({"SLURM_STEP_GPUS": "0"}, 0, 1, every, (999,)))
    for u in uuids[-2:]:
        out.append(({"SLURM_STEP_GPUS": "0", "CUDA_VISIBLE_DEVICES": f"{u},nope,{u}"}, 0, 1,
                    every, None))
    out.append(({}, 0, 1, every, None))
    out.append(({"SLURM_STEP_GPUS": "x"}, 0, 1, every, None))
    return out


@pytest.mark.parametrize("machine", all_machines())
def test_both_paths_bind_as_recorded_on_every_recorded_machine(machine, harness, cache, tmp_path,
                                                               monkeypatch) -> None:
    model = load_machine(machine)
    gres = str(tmp_path / "gres.conf")
    outputs = []
    for order, minors in _orders(model):
        gpus = nodefacts.gpu_facts(model, minors)
        for nmap in ({}, {1: 0}):
            write_table(cache, gpus, nmap, gres)
            for env, task, ntasks, allowed, bound in _cases(gpus, model):
                want = run_py(monkeypatch, gpus, nmap, env, task, ntasks, allowed, bound)
                got = run_c(harness, cache, gres, env, task, ntasks, allowed, bound)
                assert got == want, (machine, order, nmap, env, task, ntasks)
                outputs.append(want)
    assert outputs and digest("".join(outputs)) == GOLDEN["machines"][machine]


def test_machines_where_nvml_index_is_not_the_minor_bind_by_gres_position(
        harness, cache, tmp_path, monkeypatch) -> None:
    """The Slurm index is the gres.conf position, not NVML's index: the table keeps it
    (here gres.conf lists the devices in descending minor order)."""
    gres = str(tmp_path / "gres.conf")
    for machine in ("a100-sxm4-minors", "dgx-a100-permuted"):
        model = load_machine(machine)
        minors = sorted((int(g.minor) for g in model.gpus), reverse=True)
        gpus = nodefacts.gpu_facts(model, minors)
        assert [g["index"] for g in gpus] != list(range(len(gpus)))     # the point of these
        write_table(cache, gpus, {}, gres)
        for k in range(len(gpus)):
            env = {"SLURM_STEP_GPUS": str(k)}
            every = tuple(sorted(p for c in model.cores for p in c.pus))
            got = run_c(harness, cache, gres, env, 0, 1, every, None)
            assert f"gpus={gpus[k]['index']};" in got
            assert got == run_py(monkeypatch, gpus, {}, env, 0, 1, every, None)


def test_failing_system_calls_say_what_python_says(harness, cache, tmp_path, monkeypatch) -> None:
    model = load_machine("mini-2numa")
    gpus = nodefacts.gpu_facts(model, None)
    gres = str(tmp_path / "gres.conf")
    write_table(cache, gpus, {1: 0}, gres)
    every = tuple(sorted(p for c in model.cores for p in c.pus))
    env = {"SLURM_STEP_GPUS": "1"}
    for aff, mpol in ((22, 0), (0, 22), (0, 1)):
        want = run_py(monkeypatch, gpus, {1: 0}, env, 0, 1, every, None, aff, mpol)
        assert want.count("error ") == (1 if aff else 0)
        assert run_c(harness, cache, gres, env, 0, 1, every, None, aff, mpol) == want
    env = {"SLURM_STEP_GPUS": "0,1"}                      # a CPU list, not a tuple's repr
    want = run_py(monkeypatch, gpus, {1: 0}, env, 0, 1, every, None, 22, 0)
    assert want.endswith("error slurm-gpu: sched_setaffinity to CPUs 0-1 failed: Invalid "
                         "argument\nrc -1\n")
    assert run_c(harness, cache, gres, env, 0, 1, every, None, 22, 0) == want
    want = run_py(monkeypatch, gpus, {1: 0}, env, 0, 1, every, None, 0, 1)
    assert ("say slurm-gpu: warning: gpu-numa-bind=prefer: memory policy not set: set_mempolicy "
            "to NUMA node(s) 0 failed: Operation not permitted (task 0)\n") in want


# -- a table is used only while it is what the entry would say ------------------------------

@pytest.fixture()
def table(harness, cache, tmp_path):
    """A valid table with two stamped inputs (one absent) and how to run the C side on it."""
    model = load_machine("mini-2numa")
    gpus = nodefacts.gpu_facts(model, None)
    cfg = tmp_path / "slurm-gpu.toml"
    cfg.write_text("[spank]\n")
    gres = tmp_path / "gres.conf"
    gres.write_text("AutoDetect=off\n")
    absent = tmp_path / "absent.toml"
    stamps = [nodefacts.stamp(str(cfg)), nodefacts.stamp(str(absent)),
              nodefacts.stamp(str(gres))]
    path = write_table(cache, gpus, {}, str(gres), stamps)

    def run(node: str = NODE) -> str:
        return run_c(harness, cache, str(gres), {"SLURM_STEP_GPUS": "0"}, 0, 1, (0, 1, 2, 3),
                     None, node=node)
    assert "setenv SLURM_GPU_BINDING=prefer;gpus=0;cpus=" in run()
    return {"path": path, "run": run, "cfg": cfg, "gres": gres, "absent": absent,
            "cache": cache, "gpus": gpus, "stamps": stamps, "harness": harness}


def test_loading_a_table_allocates_after_its_size(table) -> None:
    """The reader sizes its arrays from the file (a few hundred bytes), not from
    its limits: it used to take 4 MiB for ids in every bound step."""
    res = subprocess.run([table["harness"], str(table["cache"]), PREFIX, NODE, CONFIG,
                          str(table["gres"]), "0", "@unset", "@unset", "0", "1", "0-3", "@none",
                          "0", "0"], capture_output=True, text=True, check=True)
    size = table["path"].stat().st_size
    most = int(res.stderr.split("load-maxalloc ")[1].split()[0])
    assert 0 < most <= 8 * size, (most, size)


def test_the_c_planner_keeps_no_state_between_calls(tmp_path) -> None:
    """No static or global data in sg_bind.c: each call's scratch is its own."""
    if not shutil.which("gcc") or not shutil.which("nm"):
        pytest.skip("no gcc or nm")
    obj = tmp_path / "sg_bind.o"
    subprocess.run(["gcc", "-c", "-O2", f"-I{ROOT / 'spank'}", "-o", str(obj),
                    str(ROOT / "spank/sg_bind.c")], check=True)
    syms = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout
    data = [line for line in syms.splitlines() if line.split()[-2:-1] in (["b"], ["B"], ["d"], ["D"])]
    assert data == []


REFUSED = "load refused\n"


def test_a_changed_input_is_refused(table) -> None:
    cfg = table["cfg"]
    st = cfg.stat()
    os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert table["run"]() == REFUSED


def test_a_resized_input_is_refused(table) -> None:
    st = table["gres"].stat()
    table["gres"].write_text("AutoDetect=nvml\n")
    os.utime(table["gres"], ns=(st.st_atime_ns, st.st_mtime_ns))
    assert table["run"]() == REFUSED


def test_a_replaced_input_is_refused(table, tmp_path) -> None:
    cfg = table["cfg"]
    st = cfg.stat()
    new = tmp_path / "new.toml"
    new.write_text(cfg.read_text())
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    keep = tmp_path / "keep"            # hold the old inode, so the new one differs
    os.link(cfg, keep)
    os.replace(new, cfg)
    assert cfg.stat().st_ino != st.st_ino and cfg.stat().st_size == st.st_size
    assert table["run"]() == REFUSED


def test_an_input_that_appears_is_refused(table) -> None:
    table["absent"].write_text("")
    assert table["run"]() == REFUSED


def test_an_input_that_disappears_is_refused(table) -> None:
    table["cfg"].unlink()
    assert table["run"]() == REFUSED


def _rewrite(table, old: str, new: str) -> None:
    p = table["path"]
    text = p.read_text()
    assert old in text
    p.write_text(text.replace(old, new, 1))


def test_another_boot_is_refused(table) -> None:
    _rewrite(table, f"boot {boot_id()}", "boot 00000000-0000-0000-0000-000000000000")
    assert table["run"]() == REFUSED


def test_another_key_is_refused(table) -> None:
    _rewrite(table, f"key {PREFIX}:", "key 0.0.0:1:")
    assert table["run"]() == REFUSED


def test_a_table_for_another_node_is_not_found(table) -> None:
    assert table["run"](node="n2") == REFUSED


@pytest.mark.parametrize("old,new", [
    ("slurm-gpu bind 1", "slurm-gpu bind 2"),
    ("end\n", ""),                                  # cut short
    ("end\n", "end\ngpu 0 - 0 0\n"),                # something after the end
    ("\ngpu ", "\ngpu  "),
    ("\ngpu 0 ", "\ngpu x "),
    ("\nstamp ", "\nstamp 1 "),
    ("end\n", "end"),
    ("end\n", "end\n\0"),
    ("\ngpu ", "\nfrob\ngpu "),
    (" 0 0\n", " 1-0 0\n"),                         # a backwards range
    (" 0 0\n", " 0, 0\n"),                          # a trailing comma
    (" 0 0\n", " 0,0 0\n"),                         # not ascending
])
def test_a_malformed_table_is_refused(table, old, new) -> None:
    _rewrite(table, old, new)
    assert table["run"]() == REFUSED


def test_a_table_others_can_write_is_refused(table) -> None:
    os.chmod(table["path"], 0o620)
    assert table["run"]() == REFUSED
    os.chmod(table["path"], 0o600)
    os.chmod(table["cache"], 0o770)
    assert table["run"]() == REFUSED


def test_a_symlinked_table_or_directory_is_refused(table, tmp_path) -> None:
    p = table["path"]
    real = tmp_path / "real"
    os.replace(p, real)
    os.symlink(real, p)
    assert table["run"]() == REFUSED


def test_a_fifo_or_oversized_table_is_refused(table) -> None:
    p = table["path"]
    p.write_bytes(p.read_bytes() + b"#" * bindtable.MAX_BYTES)
    assert table["run"]() == REFUSED
    p.unlink()
    os.mkfifo(p, 0o600)
    assert table["run"]() == REFUSED


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_table_of_another_owner_is_refused(table) -> None:
    os.chown(table["path"], 65534, 65534)
    assert table["run"]() == REFUSED
    os.chown(table["path"], 0, 0)
    os.chown(table["cache"], 65534, 65534)
    assert table["run"]() == REFUSED


def test_render_refuses_what_c_would_misread() -> None:
    model = load_machine("mini-2numa")
    gpus = nodefacts.gpu_facts(model, None)
    key = nodefacts.key(CONFIG, NODE, "/g")
    assert bindtable.render(_data(gpus, [("/a b", None)]), {}, key) is not None
    assert bindtable.render(_data(gpus, [("/a\nb", None)]), {}, key) is None
    assert bindtable.render(_data(gpus, []), {}, nodefacts.key(CONFIG, "nö", "/g")) is None
    odd = [dict(gpus[0], uuid="GPU 1")] + gpus[1:]       # NVML's never are: no one names it
    assert b"\ngpu 0 - " in bindtable.render(_data(odd, []), {}, key)
    assert bindtable.render(_data(None, []), {}, key) is None
    assert bindtable.render(dict(_data(gpus, []), boot_id=""), {}, key) is None


def test_keep_writes_rewrites_and_removes_the_table(cache, tmp_path) -> None:
    """The Python path puts the table right: written when missing, rewritten when it
    differs from the entry, removed when the entry cannot have one."""
    model = load_machine("mini-2numa")
    gpus = nodefacts.gpu_facts(model, None)
    gres = str(tmp_path / "gres.conf")
    path = Path(bindtable.path(CONFIG, NODE, gres, str(cache)))
    data = _data(gpus, [])
    bindtable.keep(data, {}, CONFIG, NODE, gres, str(cache))
    want = bindtable.render(data, {}, nodefacts.key(CONFIG, NODE, gres))
    assert path.read_bytes() == want and path.stat().st_mode & 0o777 == 0o600
    path.write_bytes(want.replace(b"gpu 0 ", b"gpu 7 "))
    bindtable.keep(data, {}, CONFIG, NODE, gres, str(cache))
    assert path.read_bytes() == want
    bindtable.keep(data, None, CONFIG, NODE, gres, str(cache))         # no numa_map known
    assert not path.exists()
    bindtable.keep({"gpus": "odd"}, {}, CONFIG, NODE, gres, str(cache))  # never raises
    assert not path.exists()


# -- any value a job can hold ------------------------------------------------------------

def _uuid_gpus():
    model = load_machine("mini-2numa")
    return model, [dict(g, uuid=f"u{k}") for k, g in enumerate(nodefacts.gpu_facts(model, None))]


def test_every_value_binds_on_both_paths_as_recorded(harness, cache, tmp_path, monkeypatch) -> None:
    """Any GPU variable binds on the C path as on the Python path, as recorded: a list of
    4097 copies of a uuid (the C half once took it at init_post_opt but did not read it,
    leaving the task unbound) and non-ASCII blanks around a number (once read as no GPU,
    then sent to Python: the planner strips them as str.strip() does)."""
    model, gpus = _uuid_gpus()
    gres = str(tmp_path / "gres.conf")
    write_table(cache, gpus, {}, gres)
    every = tuple(sorted(p for c in model.cores for p in c.pus))
    for case in GOLDEN["values"]:
        env, task, ntasks = case["env"], case["task"], case["ntasks"]
        got = run_c(harness, cache, gres, env, task, ntasks, every, None)
        want = run_py(monkeypatch, gpus, {}, env, task, ntasks, every, None)
        assert got == want and digest(want) == case["sha256"], (env, want[:300], case["head"])


def test_hostile_task_variables_bind_on_both_paths_as_recorded(harness, cache, tmp_path,
                                                               monkeypatch) -> None:
    """Seeded random GPU variables a job user could export (huge, negative, empty and
    backwards entries, blanks, uuids and MIG names, duplicates, non-ASCII): both paths
    bind as recorded."""
    model = load_machine("dgx-a100-permuted")
    gpus = nodefacts.gpu_facts(model, None)
    gres = str(tmp_path / "gres.conf")
    write_table(cache, gpus, {1: 0}, gres)
    every = tuple(sorted(p for c in model.cores for p in c.pus))
    choices = (every, every[: len(every) // 2], every[-1:])
    for case in GOLDEN["hostile"]:
        env, task, ntasks, allowed = (case["env"], case["task"], case["ntasks"],
                                      choices[case["allowed"]])
        got = run_c(harness, cache, gres, env, task, ntasks, allowed, None)
        want = run_py(monkeypatch, gpus, {1: 0}, env, task, ntasks, allowed, None)
        assert got == want == case["want"], env
    assert len(GOLDEN["hostile"]) == 150


def test_hostile_variables_in_both_modes_bind_as_recorded(harness, cache, tmp_path,
                                                          monkeypatch) -> None:
    """Seeded random variables with numbers of any size, every Unicode blank, uuids, a
    gres.conf GPU NVML lacks, a NUMA node map and a --mem-bind policy, strict and prefer:
    the Python path binds as recorded, and the C path (prefer) as the Python path."""
    model = load_machine("dgx-a100-permuted")
    minors = sorted(int(g.minor) for g in model.gpus)
    tables = {False: nodefacts.gpu_facts(model, None),
              True: nodefacts.gpu_facts(model, minors[:2] + [999] + minors[2:])}
    gres = str(tmp_path / "gres.conf")
    every = tuple(sorted(p for c in model.cores for p in c.pus))
    choices = (every, every[: len(every) // 2], every[-1:])
    bounds = (None, (0,), (1,), (5,))
    c_compared = 0
    for case in GOLDEN["hostile_modes"]:
        gpus, nmap = tables[case["missing"]], dict(case["map"])
        args = (case["env"], case["task"], case["ntasks"], choices[case["allowed"]],
                bounds[case["bound"]])
        want = run_py(monkeypatch, gpus, nmap, *args, mode=case["mode"])
        assert want == case["want"], case
        if case["mode"] == "prefer":
            write_table(cache, gpus, nmap, gres)
            assert run_c(harness, cache, gres, *args) == want, case
            c_compared += 1
    assert c_compared > 50


def test_a_uuid_of_a_gpu_outside_the_step_binds_the_steps_gpus(harness, cache, tmp_path,
                                                                monkeypatch) -> None:
    """A task's CUDA_VISIBLE_DEVICES may name another GPU's uuid (the user's export):
    it narrows the step's GPUs like a number does, so it counts as unknown.  The planner
    once bound such a task to that GPU's CPUs and NUMA node and named it in
    SLURM_GPU_BINDING."""
    model, gpus = _uuid_gpus()
    gres = str(tmp_path / "gres.conf")
    write_table(cache, gpus, {}, gres)
    every = tuple(sorted(p for c in model.cores for p in c.pus))
    plain = run_py(monkeypatch, gpus, {}, {"SLURM_STEP_GPUS": "0"}, 0, 1, every, None)
    assert "gpus=0;" in plain
    for cvd in ("u1", "u1,u1", "nope,u1"):
        env = {"SLURM_STEP_GPUS": "0", "CUDA_VISIBLE_DEVICES": cvd}
        assert run_py(monkeypatch, gpus, {}, env, 0, 1, every, None) == plain, cvd
        assert run_c(harness, cache, gres, env, 0, 1, every, None) == plain, cvd
    # a uuid of the step still narrows it
    env = {"SLURM_STEP_GPUS": "0,1"}
    assert "gpus=1,0;" in run_py(monkeypatch, gpus, {}, dict(env, CUDA_VISIBLE_DEVICES="u1,u0"),
                                 0, 1, every, None)
    assert "gpus=1;" in run_c(harness, cache, gres, dict(env, CUDA_VISIBLE_DEVICES="u9,u1"),
                              0, 1, every, None)


def test_a_uuid_list_of_more_than_4096_entries_is_not_a_gpu_list(harness, cache, tmp_path,
                                                                monkeypatch) -> None:
    """As a number list is not (binding.py's rules): such a list binds the step's GPUs,
    as no CUDA_VISIBLE_DEVICES does, and is not matched entry by entry against the
    table, which took seconds of the task's start for a long list and a large table."""
    model, gpus = _uuid_gpus()
    gres = str(tmp_path / "gres.conf")
    write_table(cache, gpus, {}, gres)
    every = tuple(sorted(p for c in model.cores for p in c.pus))
    step = {"SLURM_STEP_GPUS": "0-1"}
    plain = run_py(monkeypatch, gpus, {}, step, 0, 1, every, None)
    assert "gpus=0,1;" in plain
    for n, want_one in ((4096, True), (4097, False), (5000, False)):
        env = dict(step, CUDA_VISIBLE_DEVICES=",".join(["u1"] * n))
        got = run_c(harness, cache, gres, env, 0, 1, every, None)
        assert got == run_py(monkeypatch, gpus, {}, env, 0, 1, every, None)
        assert (got != plain and "gpus=1,1," in got) if want_one else got == plain, n
