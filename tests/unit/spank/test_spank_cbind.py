"""The plugin's C binding path (spank/sg_bind.c) against the Python path it stands in for.

A plain ``--gpu-numa-bind=prefer`` step binds in the outer C half from the
binding table the Python path keeps (:mod:`slurm_gpu.spank.bindtable`).
Two things must hold:

* for every recorded machine, Slurm GPU order (NVML's, gres.conf's in minor
  order, one with a device NVML lacks) and task environment, the C half does
  exactly what :func:`slurm_gpu.spank.remote._bind` does: the same system
  calls with the same arguments, the same ``SLURM_GPU_BINDING``, the same
  warning and error lines;
* a table that is stale, forged or odd in any way is refused, so the step
  goes to Python (which is what every other test of the step covers).

The harness (tests/unit/spank/cbind/harness.c) is compiled with spank/sg_bind.c
and fakes the system calls; it prints each call, as the Python side's fakes
below do.
"""
from __future__ import annotations

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
        _, maxnode = effects._words(nodes, 64)
        self.out.append(f"mempolicy {mode} {maxnode} {','.join(map(str, nodes))}\n")
        return self.err


def run_py(monkeypatch, gpus, nmap: dict[int, int], env: dict[str, str], task: int,
           ntasks: int, allowed: tuple[int, ...], bound: tuple[int, ...] | None,
           aff_err: int = 0, mpol_err: int = 0) -> str:
    """remote._bind, the Python path's own code, with its system calls faked."""
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
        m.setattr(remote, "_stderr", lambda line: out.append(f"say {line}\n"))
        step = remote.Step(NumaBind("prefer"), facts={"gpus": nodefacts.for_binding(gpus),
                                                      "numa_map": nmap})
        rc = 0
        try:
            remote._bind(_FakeSpank(out), step, {k: v for k, v in env.items()}, task, ntasks)
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
def test_c_binds_as_python_does_on_every_recorded_machine(machine, harness, cache, tmp_path,
                                                          monkeypatch) -> None:
    model = load_machine(machine)
    gres = str(tmp_path / "gres.conf")
    compared = 0
    for order, minors in _orders(model):
        gpus = nodefacts.gpu_facts(model, minors)
        for nmap in ({}, {1: 0}):
            write_table(cache, gpus, nmap, gres)
            for env, task, ntasks, allowed, bound in _cases(gpus, model):
                want = run_py(monkeypatch, gpus, nmap, env, task, ntasks, allowed, bound)
                got = run_c(harness, cache, gres, env, task, ntasks, allowed, bound)
                assert got == want, (machine, order, nmap, env, task, ntasks)
                compared += 1
    assert compared


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
    stamps = [nodefacts._stamp(str(cfg)), nodefacts._stamp(str(absent)),
              nodefacts._stamp(str(gres))]
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
    odd = [dict(gpus[0], uuid="GPU 1")] + gpus[1:]
    assert bindtable.render(_data(odd, []), {}, key) is None
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


# -- the values the C half takes ---------------------------------------------------------

def c_takes(harness: str, value: str) -> bool:
    """What init_post_opt asks of each GPU variable before the C half binds the step
    (sg_cbind.c sg_plain_var: sg_bind.c's sg_plain_env)."""
    res = subprocess.run([harness, "plain", value], capture_output=True, text=True, check=True)
    return res.stdout == "plain 1\n"


def test_every_value_the_c_half_takes_binds_as_python(harness, cache, tmp_path,
                                                      monkeypatch) -> None:
    """A task's GPU variables are read by the C half only when they are what it reads as
    binding.py does; the rest goes to Python (at init_post_opt) or, when a task's own
    values differ from the step's, is said to be not a plain list.  4097 copies of a
    uuid were taken at init_post_opt but not read by the planner (the task was left
    unbound, Python binds it), and a non-ASCII blank around a number was read silently
    as no GPU (Python strips it)."""
    model = load_machine("mini-2numa")
    gpus = [dict(g, uuid=f"u{k}") for k, g in enumerate(nodefacts.gpu_facts(model, None))]
    gres = str(tmp_path / "gres.conf")
    write_table(cache, gpus, {}, gres)
    every = tuple(sorted(p for c in model.cores for p in c.pus))
    envs = [{"SLURM_STEP_GPUS": "0", "CUDA_VISIBLE_DEVICES": ",".join(["u1"] * k)}
            for k in (4095, 4096, 4097, 5000)]
    envs += [{"SLURM_STEP_GPUS": "1\xa0"}, {"SLURM_STEP_GPUS": "0-1", "CUDA_VISIBLE_DEVICES": "1\xa0"},
             {"SLURM_STEP_GPUS": "0-1", "SLURM_GPUS_PER_TASK": "\u20031"},
             {"SLURM_STEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "\x1c1"}]
    for env in envs:
        taken = all(c_takes(harness, v) for v in env.values())
        for task, ntasks in ((0, 1), (1, 2)):
            got = run_c(harness, cache, gres, env, task, ntasks, every, None)
            want = run_py(monkeypatch, gpus, {}, env, task, ntasks, every, None)
            if taken:
                assert got == want, env
            else:
                # refused, and saying so: an inherited SLURM_GPU_BINDING never claims a binding
                assert got == ("setenv SLURM_GPU_BINDING=prefer;gpus=;none\n"
                               f"say slurm-gpu: warning: gpu-numa-bind=prefer not applied: this "
                               f"task's GPU variables are not a plain GPU list (task {task})\n"
                               "rc 0\n"), env
    assert c_takes(harness, ",".join(["u1"] * 4096))
    assert not c_takes(harness, ",".join(["u1"] * 4097))
    assert not c_takes(harness, "1234567890") and c_takes(harness, "123456789")


def test_hostile_task_variables_bind_as_python_or_are_refused(harness, cache, tmp_path,
                                                              monkeypatch) -> None:
    """Seeded random GPU variables a job user could export (huge, negative, empty and
    backwards entries, blanks, uuids and MIG names, duplicates, non-ASCII): what the C
    half takes binds as Python binds; the rest is refused with the one warning."""
    import random
    rng = random.Random(20261124)
    model = load_machine("dgx-a100-permuted")
    gpus = nodefacts.gpu_facts(model, None)
    gres = str(tmp_path / "gres.conf")
    write_table(cache, gpus, {1: 0}, gres)
    n = len(gpus)
    uuid = gpus[1]["uuid"]
    toks = ["0", "1", str(n - 1), str(n), "-1", "", " ", " 1 ", "00", "999999999", "1000000000",
            "0-3", "3-0", f"0-{n - 1}", "0-4095", "0-999999999", "-", "1-", "1-2-3", "x", "1e3",
            uuid, uuid, "MIG-" + uuid, uuid[:-1], " " + uuid, "GPU-0", "MIG-1", "\uff10", "1\xa0",
            "\u00b2", "\t0"]
    every = tuple(sorted(p for c in model.cores for p in c.pus))
    compared = refused = 0
    for _ in range(150):
        env = {"SLURM_STEP_GPUS": ",".join(rng.choice(toks) for _ in range(rng.choice((1, 2, 4)))),
               "CUDA_VISIBLE_DEVICES": ",".join(rng.choice(toks) for _ in range(rng.choice((1, 3))))}
        if rng.random() < 0.5:
            env["SLURM_GPUS_PER_TASK"] = rng.choice(["2", "h100:3", " 1 ", "0", "99999999999", "x"])
        ntasks = rng.choice((1, 2, 3, 8))
        task = rng.randrange(ntasks)
        allowed = rng.choice((every, every[: len(every) // 2], every[-1:]))
        got = run_c(harness, cache, gres, env, task, ntasks, allowed, None)
        want = run_py(monkeypatch, gpus, {1: 0}, env, task, ntasks, allowed, None)
        if all(c_takes(harness, v) for v in env.values()):
            assert got == want, env
            compared += 1
        elif got != want:
            assert "this task's GPU variables are not a plain GPU list" in got, env
            refused += 1
    assert compared > 50 and refused, (compared, refused)
