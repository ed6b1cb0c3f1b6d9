"""Option values and plugstack arguments of the SPANK plugin."""
from __future__ import annotations

import gzip
import re
import sys
from pathlib import Path

import pytest

from slurm_gpu.errors import UsageError
from slurm_gpu import joboptions as o
from paths import ROOT

SPANK = ROOT / "spank"


def _shim_text() -> str:
    """The outer half's own C sources and its internal header, together."""
    return "".join((SPANK / f).read_text() for f in ("sg_plugin.h", *_build_script().OUTER_SOURCES))


@pytest.mark.parametrize("value,expect", [
    ("strict", o.NumaBind("strict")), ("prefer", o.NumaBind("prefer")),
    ("off", o.NumaBind("off")), ("strict,verbose", o.NumaBind("strict", True)),
    ("verbose,prefer", o.NumaBind("prefer", True)),
])
def test_numa_bind_values(value, expect):
    assert o.parse_numa_bind(value) == expect


def test_numa_bind_verbose_alone_keeps_admin_default():
    args = o.parse_plugstack_args(["numa_bind=strict"])
    assert o.effective_numa_bind("verbose", args) == o.NumaBind("strict", True)
    assert o.effective_numa_bind(None, args) == o.NumaBind("strict")
    assert o.effective_numa_bind("off", args) == o.NumaBind("off")
    assert o.effective_numa_bind(None, o.PluginArgs()) == o.NumaBind("off")


@pytest.mark.parametrize("value", ["", "bogus", "strict,prefer", "strict,verbose,x", "STRICT"])
def test_numa_bind_bad(value):
    with pytest.raises(UsageError, match=r"^bad value .* for --gpu-numa-bind") as e:
        o.parse_numa_bind(value)
    assert e.value.line().startswith("slurm-gpu: bad value ")


def test_profile():
    assert [o.parse_profile(p) for p in o.PROFILES] == list(o.PROFILES)
    with pytest.raises(UsageError, match="--gpu-profile: expected training, inference or none"):
        o.parse_profile("fast")


@pytest.mark.parametrize("value,expect", [(None, "default"), ("default", "default"),
                                          ("1", "1"), ("100", "100"), ("050", "50"), ("25%", "25")])
def test_mps_values(value, expect):
    assert o.parse_mps(value) == expect


@pytest.mark.parametrize("value", ["0", "101", "-5", "half", "", "1.5"])
def test_mps_bad(value):
    with pytest.raises(UsageError, match="--gpu-mps: expected an active-thread percentage"):
        o.parse_mps(value)


def test_mig_syntax():
    assert o.parse_mig("3g.40gb,2g.20gb,2g.20gb") == "3g.40gb,2g.20gb,2g.20gb"
    for bad in ("", "bogus", "3g.40gb,,1g.10gb"):
        with pytest.raises(UsageError, match=r"^bad value .* for --gpu-mig") as e:
            o.parse_mig(bad)
        assert e.value.line().startswith("slurm-gpu: bad value ")


def test_mig_syntax_uses_the_planner():
    # The planner is installed with the package: counts and per-GPU groups are
    # accepted (the fallback below refuses "2x1g.12gb").
    assert o.parse_mig("3g.47gb,2x1g.12gb") == "3g.47gb,2x1g.12gb"
    assert o.parse_mig("3g.40gb;7g.80gb") == "3g.40gb;7g.80gb"


def test_mig_syntax_without_the_planner(monkeypatch):
    # the mps/mig area not installed: importing its planner fails
    monkeypatch.setitem(sys.modules, "slurm_gpu.mig.planner", None)
    with pytest.raises(UsageError, match=r"'2x1g\.12gb' is not a MIG profile name"):
        o.parse_mig("3g.47gb,2x1g.12gb")
    assert o.parse_mig("3g.40gb, 1c.3g.40gb,1g.10gb+me") == "3g.40gb,1c.3g.40gb,1g.10gb+me"
    for bad in ("", "bogus", "3g.40gb,,1g.10gb", "9g.80gb"):
        with pytest.raises(UsageError, match=r"--gpu-mig"):
            o.parse_mig(bad)


def test_validate_option_routes_by_id():
    assert o.validate_option(o.NUMA_BIND, "prefer,verbose") == "prefer,verbose"
    assert o.validate_option(o.MPS, None) == "default"
    with pytest.raises(UsageError):
        o.validate_option(o.PROFILE, "x")


def test_plugstack_args():
    a = o.parse_plugstack_args(["config=/etc/slurm-gpu/x.toml", "numa_bind=prefer"])
    assert a == o.PluginArgs("/etc/slurm-gpu/x.toml", o.NumaBind("prefer"))
    assert o.parse_plugstack_args([]) == o.PluginArgs()


@pytest.mark.parametrize("args,msg", [
    (["bogus=1"], "unknown plugstack argument 'bogus=1'"),
    (["config"], "unknown plugstack argument 'config'"),
    (["config=rel/path"], "must be an absolute path"),
    (["numa_bind=always"], "for plugstack numa_bind"),
    (["numa_bind=verbose"], "for plugstack numa_bind"),
    (["numa_bind=off", "numa_bind=strict"], "given twice"),
])
def test_plugstack_args_bad(args, msg):
    with pytest.raises(UsageError, match=re.escape(msg)):
        o.parse_plugstack_args(args)


def _build_script():
    from slurm_gpu.commands.spank import build_script
    return build_script()


def test_c_option_table_is_generated_from_the_python_declaration(monkeypatch):
    """SG_OPT_* ids, the spank_option table, env names and plugstack keys of the
    C shim come from options.OPTIONS: the .c file spells none of them."""
    c = _shim_text()
    assert '#include "sg_build.h"' in c
    for opt in o.OPTIONS:
        assert f'"{opt.name}"' not in c and f'"{opt.env}"' not in c
        assert not re.search(rf"#define {opt.c_name}\s", c)
    assert "sg_arg_keys[] = SG_ARG_KEYS;" in c and "sg_options[SG_NOPTS] = SG_OPTION_TABLE;" in c
    mod = _build_script()
    h = mod.generate_header()
    for opt in o.OPTIONS:
        assert re.search(rf"#define {opt.c_name} {opt.id}\b", h)
        row = re.search(rf'\{{ "{re.escape(opt.name)}", "([^"]*)", "((?:[^"\\]|\\.)*)", (\d), '
                        rf'{opt.c_name}, sg_opt_cb \}}', h)
        assert row and row.group(1) == opt.arginfo and int(row.group(3)) == opt.has_arg, opt.name
    keys = re.search(r"#define SG_ARG_KEYS \{([^}]*)\}", h).group(1)
    assert re.findall(r'"(\w+)"', keys) == list(o.PLUGSTACK_KEYS)
    envs = re.search(r"#define SG_ENV_NAMES \{([^}]*)\}", h).group(1)
    assert re.findall(r'"(\w+)"', envs) == [opt.env for opt in sorted(o.OPTIONS, key=lambda x: x.id)]
    # a new declaration reaches the C table with nothing else edited
    extra = o.Declared(len(o.OPTIONS), "gpu-extra", "X", "[slurm-gpu] extra", 1, "SLURM_GPU_EXTRA", True)
    monkeypatch.setattr(o, "OPTIONS", (*o.OPTIONS, extra))
    h2 = mod.generate_header()
    assert f"#define SG_OPT_EXTRA {extra.id}" in h2 and f"#define SG_NOPTS {len(o.OPTIONS)}" in h2
    assert '{ "gpu-extra", "X", "[slurm-gpu] extra", 1, SG_OPT_EXTRA, sg_opt_cb }' in h2
    from slurm_gpu.spank import dispatch
    for hook_id, name in dispatch.HOOKS.items():
        const = "SG_HOOK_" + {"init_post_opt": "INIT_POST_OPT",
                              "task_init_privileged": "TASK_PRIV", "task_init": "TASK_INIT"}[name]
        assert re.search(rf"#define {const}\s+{hook_id}\b", c)


def test_prolog_gate_reads_the_declaration():
    """The prolog/epilog gate is the one variable local.py sets for options with
    ``prolog``; the jobs code reads the option values under the declared names."""
    from slurm_gpu.jobs import lifecycle
    from slurm_gpu.spank import local
    root = SPANK.parent
    gate = "${" + o.prolog_env(o.PROLOG_GATE) + "}"
    for script in ("prolog.d/50-slurm-gpu-jobs", "epilog.d/50-slurm-gpu-jobs"):
        text = (root / script).read_text()
        assert f'[ -n "{gate}" ]' in text
        assert not any(o.prolog_env(opt.env) in text for opt in o.OPTIONS), script
    assert lifecycle.ENV_MPS == o.prolog_env(o.ENV_NAMES[o.MPS])
    assert lifecycle.ENV_MIG == o.prolog_env(o.ENV_NAMES[o.MIG])

    class Fake:
        def __init__(self, values):
            self.values, self.env = values, {}

        def option_value(self, which):
            return self.values.get(which)

        def job_control_setenv(self, name, value):
            self.env[name] = value
    for values, gate_open in (({o.MPS: "50"}, True), ({o.MIG: "3g.40gb"}, True),
                              ({o.NUMA_BIND: "strict", o.PROFILE: "training"}, False), ({}, False)):
        f = Fake(values)
        assert local.init_post_opt(f) == 0
        assert (o.PROLOG_GATE in f.env) == gate_open, values
        assert {k for k in f.env if k != o.PROLOG_GATE} == {o.ENV_NAMES[w] for w in values}
    # one parser: the prolog takes what srun took, and refuses what srun refuses
    assert lifecycle.parse_mps("50") == 50 and lifecycle.parse_mps("default") is None
    with pytest.raises(UsageError, match="bad --gpu-mps value"):
        lifecycle.parse_mps("150")


def _slurm_long_options(cmd: str) -> set[str]:
    page = Path(f"/usr/share/man/man1/{cmd}.1.gz")
    if not page.exists():
        pytest.skip(f"no man page for {cmd}")
    text = gzip.decompress(page.read_bytes()).decode(errors="replace").replace("\\-", "-")
    return set(re.findall(r"\\fB--([a-z][a-z0-9-]*)", text))


@pytest.mark.parametrize("cmd", ["srun", "sbatch", "salloc"])
def test_names_do_not_clash_with_slurm(cmd):
    theirs = _slurm_long_options(cmd)
    assert "gpu-bind" in theirs and "profile" in theirs    # the page was really parsed
    for ours in o.OPTION_NAMES.values():
        assert ours not in theirs
        # getopt_long accepts unique prefixes: none of ours may be a prefix of theirs
        assert not any(t.startswith(ours) for t in theirs), ours


def test_spank_settings_sizes_and_map():
    import resource

    from slurm_gpu.errors import InputError
    from slurm_gpu.spank import settings
    assert settings.parse_size("", "k") is None
    assert settings.parse_size("unlimited", "k") == resource.RLIM_INFINITY
    assert settings.parse_size("64G", "k") == 64 << 30
    assert settings.parse_size("512mb", "k") == 512 << 20
    assert settings.parse_size("4096", "k") == 4096
    for bad in ("lots", "12Q", "-1"):
        with pytest.raises(InputError, match="bad size"):
            settings.parse_size(bad, "[spank] memlock_max")
    s = settings.load({"spank": {"numa_node_map": {"1": 0, "3": 1}}})
    assert s.numa_map() == {1: 0, 3: 1}
    with pytest.raises(InputError, match="numa_node_map"):
        settings.load({"spank": {"numa_node_map": {"x": 0}}})
    with pytest.raises(InputError, match="unknown config key spank.memlock"):
        settings.load({"spank": {"memlock": "1G"}})
    with pytest.raises(InputError, match="allocator_env.MALLOC_CONF must be a string"):
        settings.load({"spank": {"allocator_env": {"MALLOC_CONF": 1}}})


@pytest.mark.parametrize("value", ["\u00b2", "5\u00b9", "\u0665"])
def test_mps_percentage_takes_ascii_digits_only(value):
    with pytest.raises(UsageError, match="bad value .* for --gpu-mps"):
        o.parse_mps(value)
