"""Option values and plugstack arguments of the SPANK plugin."""
from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

from slurm_gpu.errors import UsageError
from slurm_gpu.spank import options as o

SHIM = Path(__file__).resolve().parents[2] / "spank" / "slurm_gpu_spank.c"


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
    with pytest.raises(UsageError, match=r"^slurm-gpu: bad value .* for --gpu-numa-bind"):
        o.parse_numa_bind(value)


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
        with pytest.raises(UsageError, match=r"^slurm-gpu: bad value .* for --gpu-mig"):
            o.parse_mig(bad)


def test_mig_syntax_without_the_planner(monkeypatch):
    monkeypatch.setattr(o, "_mig_planner_parser", lambda: None)
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


def test_shim_agrees_with_python_ids_and_keys():
    """The C shim and the Python side share option ids, env names and keys."""
    c = SHIM.read_text()
    for which, name in o.OPTION_NAMES.items():
        const = {0: "SG_OPT_NUMA_BIND", 1: "SG_OPT_PROFILE", 2: "SG_OPT_MPS", 3: "SG_OPT_MIG"}[which]
        assert re.search(rf"#define {const}\s+{which}\b", c)
        assert f'"{name}"' in c
        assert f'"{o.ENV_NAMES[which]}"' in c
    keys = re.search(r"sg_arg_keys\[\] = \{([^}]*)\}", c).group(1)
    assert re.findall(r'"(\w+)"', keys) == list(o.PLUGSTACK_KEYS)
    from slurm_gpu.spank import dispatch
    for hook_id, name in dispatch.HOOKS.items():
        const = "SG_HOOK_" + {"init_post_opt": "INIT_POST_OPT",
                              "task_init_privileged": "TASK_PRIV", "task_init": "TASK_INIT"}[name]
        assert re.search(rf"#define {const}\s+{hook_id}\b", c)


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
