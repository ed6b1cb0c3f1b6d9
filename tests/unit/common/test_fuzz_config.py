"""Property tests: the TOML config, MIG layouts, mig-parted configs and SPANK option values."""
from __future__ import annotations

import math

import pytest
from fuzzlib import NASTY, fuzz_settings, mutated, outcome
from hypothesis import given
from hypothesis import strategies as st

from slurm_gpu import config
from slurm_gpu.health.settings import HealthSettings
from slurm_gpu.hw import live
from slurm_gpu.jobs.settings import JobsSettings, MigSettings, MpsSettings
from slurm_gpu.mig import baseline, planner, profiles
from slurm_gpu import joboptions as options
from slurm_gpu.spank import settings as spank_settings
from paths import ROOT

SECTIONS = {"health": HealthSettings, "jobs": JobsSettings, "mps": MpsSettings, "mig": MigSettings,
            "spank": spank_settings.SpankSettings, "node": live.NodeSettings}
KEYS = sorted({name for cls in SECTIONS.values() for name in config.field_names(cls)})
TOML_VALUES = ["1", "0", "-1", "3.5", "-0.5", "nan", "+inf", "-inf", "1e400", "9" * 30, "-" + "9" * 30,
               "true", "false", '""', '"x"', '"%n"', '"/dev/kmsg"', '"sim:/nope"', '"live"', '"drain"',
               '"pass"', '"16G"', '"unlimited"', '"99999999999999999999G"', "[]", '["gpu.pcie"]', "[1, 2]",
               "{}", '{ "0" = 1 }', '{ "x" = -1 }', '{ K = "v" }', "1979-05-27", "'''a\nb'''"]


@st.composite
def toml_text(draw):
    out = []
    for _ in range(draw(st.integers(1, 4))):
        out.append(f"[{draw(st.sampled_from(sorted(SECTIONS) + ['x', 'health.sub']))}]")
        for _ in range(draw(st.integers(0, 5))):
            out.append(f"{draw(st.sampled_from(KEYS))} = {draw(st.sampled_from(TOML_VALUES))}")
    text = "\n".join(out) + "\n"
    if draw(st.integers(0, 4)) == 0:
        text = draw(mutated([text], ["=", "[", '"', "\n"], max_ops=2))
    return text


@pytest.fixture(scope="module")
def cfg_file(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-config") / "slurm-gpu.toml"


def _numbers_sane(obj):
    for name in config.field_names(type(obj)):
        v = getattr(obj, name)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            assert math.isfinite(v) and 0 <= v <= config.MAX_NUMBER, (name, v)


def _read_afresh(path: str) -> dict:
    """The file as it is now: one path, rewritten for every example."""
    config.clear_cache()
    return config.load_raw(path)


@fuzz_settings(2000)
@given(text=toml_text())
def test_toml_config(cfg_file, text):
    cfg_file.write_text(text, errors="surrogatepass")
    raw = outcome(_read_afresh, str(cfg_file))
    if not isinstance(raw, dict):
        return
    for name, cls in SECTIONS.items():
        got = outcome(config.section, cls, name, raw)
        if isinstance(got, cls):
            _numbers_sane(got)
    outcome(spank_settings.load, raw)
    outcome(live.settings, raw)


LAYOUT_TOKENS = ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb", "1c.3g.40gb", "2x", "9" * 30 + "x", "0x",
                 "x1g.10gb", "1g.10gb+me", "1g.", "g.10gb", ";", ",", " ", "8c.1g.10gb"]


@fuzz_settings(2000)
@given(st.lists(st.one_of(st.sampled_from(LAYOUT_TOKENS), st.sampled_from(NASTY[:30]), st.text(max_size=5)),
                max_size=8).map("".join),
       st.sampled_from(["h100-80gb", "a100-40gb", "a30", "gb200"]), st.integers(1, 4))
def test_mig_layouts(text, model, ngpus):
    outcome(planner.parse_layout, text)
    outcome(planner.plan, text, profiles.find_model(model), ngpus)
    outcome(options.validate_option, options.MIG, text)


DATA = ROOT / "tests" / "data" / "mig"
MIG_YAML = [
    "version: v1\nmig-configs:\n  all-disabled:\n    - devices: all\n      mig-enabled: false\n"
    "  balanced:\n    - devices: [0, 1]\n      device-filter: [\"0x233010DE\", \"0x20B010DE\"]\n"
    "      mig-enabled: true\n      mig-devices:\n        \"1g.10gb\": 2\n        \"2g.20gb\": 1\n"
    "        \"3g.40gb\": 1\n    - devices: all\n      mig-enabled: true\n      mig-devices: {}\n",
    (DATA / "mig-parted-config-default.yaml").read_text()[:2500],
]
YAML_TOKENS = ["devices: ", "all", "[0, 1]", "mig-enabled: ", "mig-devices:", "device-filter: ", "0xZZ",
               "99999999999999999999999", "- ", "  ", ": ", "&a [*a]", "*a", "!!binary AAAA", "? ", "|",
               "{ a: [ { b: [ { c: ", "\"1g.10gb\": 10000000000000"]


@pytest.fixture(scope="module")
def yaml_file(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-mig") / "mig.yaml"


@fuzz_settings(1000)
@given(text=mutated(MIG_YAML, YAML_TOKENS), select=st.sampled_from([None, "balanced", "all-disabled", "x"]))
def test_mig_parted_configs(yaml_file, text, select):
    yaml_file.write_text(text, errors="surrogatepass")
    entries = outcome(baseline.load_config, str(yaml_file), select)
    if isinstance(entries, list):
        outcome(baseline.wanted, entries, [(0, 0x233010DE), (1, 0x20B010DE), (2, None)], "mig.yaml")


OPTION_VALUES = ["strict", "prefer", "off", "verbose", "strict,verbose", ",", "", "50", "100", "0", "101",
                 "50%", "default", "9" * 5000, "\u0661", "²", "training", "inference", "none", "3g.40gb",
                 "config=/etc/x", "numa_bind=strict", "config=rel", "numa_bind=", "x=y", "config"]


@fuzz_settings(2500)
@given(st.integers(-1, 5), st.one_of(st.none(), st.sampled_from(OPTION_VALUES), st.sampled_from(NASTY),
                                     st.text(max_size=12)),
       st.lists(st.one_of(st.sampled_from(OPTION_VALUES), st.text(max_size=10)), max_size=4))
def test_spank_option_values(which, value, plugstack):
    outcome(options.validate_option, which, value)
    args = outcome(options.parse_plugstack_args, plugstack)
    if isinstance(args, options.PluginArgs):
        outcome(options.effective_numa_bind, value, args)


def test_a_5000_digit_mps_percentage_is_one_line():
    from slurm_gpu.errors import UsageError
    assert isinstance(outcome(options.validate_option, options.MPS, "9" * 5000), UsageError)


MIG_ENTRY = st.fixed_dictionaries(
    {"devices": st.one_of(st.just("all"), st.lists(st.integers(-2, 9), max_size=3), st.sampled_from(NASTY[:20]),
                          st.lists(st.lists(st.integers(0, 2), max_size=2), max_size=2)),
     "mig-enabled": st.one_of(st.booleans(), st.sampled_from(["yes", 1, None]))},
    optional={"device-filter": st.one_of(st.sampled_from(["0x233010DE", "0x20B010DE", "zz", "", "0x" + "f" * 40]),
                                         st.lists(st.sampled_from(["0x233010DE", "zz", 5, True]), max_size=3),
                                         st.integers(-1, 1 << 40)),
              "mig-devices": st.one_of(st.dictionaries(st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb", "x", ""]),
                                                       st.one_of(st.integers(-1, 10), st.sampled_from(
                                                           [10 ** 12, 1 << 70, True, "2", None])), max_size=3),
                                       st.sampled_from([[], "x", None]))})


@fuzz_settings(1000)
@given(entries=st.lists(MIG_ENTRY, max_size=3))
def test_mig_parted_entries(yaml_file, entries):
    import yaml
    yaml_file.write_text(yaml.safe_dump({"version": "v1", "mig-configs": {"c": entries}}))
    got = outcome(baseline.load_config, str(yaml_file), "c")
    if isinstance(got, list):
        outcome(baseline.wanted, got, [(0, 0x233010DE), (1, 0x20B010DE), (2, None)], "mig.yaml")


@pytest.mark.parametrize("entry", [
    {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 10 ** 12}},   # was MemoryError
    {"devices": "all", "mig-enabled": True, "device-filter": ["zz"]},                 # was ValueError
    {"devices": [[1]], "mig-enabled": True},
])
def test_mig_parted_entry_errors_are_one_line(entry):
    from slurm_gpu.errors import InputError
    assert isinstance(outcome(baseline.wanted, [entry], [(0, None)], "mig.yaml"), InputError)
