"""Other distributions plug into slurm-gpu through entry points (slurm_gpu.plugins):
a backend scheme for ``[node] nvml = "<scheme>:<path>"`` and ``slurm-gpu``
subcommands, loaded only when named.  A stand-in distribution is made on disk
(a module and its ``.dist-info``) and run in a fresh interpreter."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from paths import ROOT


PLUGIN = '''
import json
import click

LOADED = True


class Api:
    """Answers nothing but what the test asks: which path it was opened on."""
    def __init__(self, path):
        self.path = path


def open_backend(path):
    return Api(path), None


@click.command(short_help="A command another distribution adds.")
@click.argument("word")
def hello(word):
    click.echo(json.dumps({"hello": word}))
'''


def _distribution(site: Path) -> None:
    (site / "sg_plugin_probe.py").write_text(PLUGIN)
    info = site / "sg_plugin_probe-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sg-plugin-probe\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[slurm_gpu.backends]\nprobe = sg_plugin_probe:open_backend\n\n"
                                           "[slurm_gpu.commands]\nhello = sg_plugin_probe:hello\n")


def _python(site: Path, code: str) -> subprocess.CompletedProcess[str]:
    """*code* in a fresh interpreter with the stand-in distribution installed in *site*."""
    _distribution(site)
    # Only the checkout's runtime and the stand-in: not the devkit.
    pre = f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(site)!r}]\n"
    return subprocess.run([sys.executable, "-I", "-c", pre + code], capture_output=True, text=True, timeout=60)


def _ok(site: Path, code: str) -> str:
    """What *code* printed; it must exit 0."""
    out = _python(site, code)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_registered_command_is_listed_and_runs(tmp_path: Path) -> None:
    out = _ok(tmp_path, "from slurm_gpu.cli import main\n"
                        "rc = main(['hello', 'world'])\n"
                        "assert 'sg_plugin_probe' in sys.modules\n"
                        "sys.exit(rc)\n")
    assert json.loads(out) == {"hello": "world"}
    out = _ok(tmp_path, "from slurm_gpu.cli import main\nsys.exit(main(['--help']))\n")
    assert "hello" in out and "A command another distribution adds." in out


def test_a_plugin_is_not_imported_for_a_command_of_the_runtime(tmp_path: Path) -> None:
    _ok(tmp_path, "from slurm_gpu.cli import main\n"
                  "rc = main(['snapshot', '--help'])\n"
                  "assert 'sg_plugin_probe' not in sys.modules, 'plugin imported'\n"
                  "assert 'importlib.metadata' not in sys.modules, 'entry points scanned'\n"
                  "sys.exit(rc)\n")


def test_an_unknown_command_is_a_usage_error(tmp_path: Path) -> None:
    out = _python(tmp_path, "from slurm_gpu.cli import main\nsys.exit(main(['nope']))\n")
    assert out.returncode == 2
    assert out.stderr.startswith("slurm-gpu: No such command 'nope'.")


def test_node_nvml_names_a_registered_backend(tmp_path: Path) -> None:
    out = _ok(tmp_path, "from slurm_gpu.hw import backend, live\n"
                        "s = live.NodeSettings(nvml='probe:/some/where')\n"
                        "api, close = backend.open_api(backend.source_for(s))\n"
                        "print(type(api).__module__, api.path)\n")
    assert out.split() == ["sg_plugin_probe", "/some/where"]


def test_an_unregistered_backend_is_one_input_error(tmp_path: Path) -> None:
    out = _ok(tmp_path, "from slurm_gpu.hw import backend\n"
                        "from slurm_gpu.errors import InputError\n"
                        "try:\n    backend.open_api(backend.GpuSource('absent', '/x'))\n"
                        "except InputError as e:\n    print(e.line())\n")
    assert out.strip() == "slurm-gpu: unknown GPU backend 'absent' (absent:/x)"


def test_entry_points_are_read_as_importlib_metadata_reads_them(tmp_path: Path) -> None:
    # slurm_gpu.plugins reads entry_points.txt itself (importlib.metadata costs
    # ~30 ms to import); it must find what the standard library finds.
    out = _ok(tmp_path, "import importlib.metadata as m\nfrom slurm_gpu import plugins\n"
                        "for g in ('console_scripts', 'slurm_gpu.backends', 'slurm_gpu.commands'):\n"
                        "    ours = sorted((e.name, e.value) for e in plugins.entry_points(g))\n"
                        "    std = sorted({e.name: (e.name, e.value) for e in m.entry_points(group=g)}.values())\n"
                        "    assert ours == std, (g, ours, std)\n"
                        "print(sorted(e.name for e in plugins.entry_points('slurm_gpu.commands')))\n")
    assert "hello" in out
