"""Fixtures over every recorded machine (helpers live in ``machinedata``:
test modules import from there, never from ``conftest``, because pytest
loads every conftest.py under that one module name)."""
from __future__ import annotations

import pytest

from machinedata import all_machines, gpu_machines, hwloc_machines, load_machine


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for arg, names in (("machine_name", all_machines), ("hwloc_machine_name", hwloc_machines),
                       ("gpu_machine_name", gpu_machines)):
        if arg in metafunc.fixturenames:
            metafunc.parametrize(arg, names())


@pytest.fixture
def machine_node(machine_name: str):
    """The loaded Node of the machine this test instance runs for."""
    return load_machine(machine_name)


@pytest.fixture(autouse=True)
def _host_context_per_test():
    """hostctx holds what a SPANK host program names for the whole process
    (config file, node name); a test that sets it (SPANK dispatch) must not
    leave it to the next one (jobs.mps.adopt then looked for another node's
    cgroup)."""
    from slurm_gpu import hostctx
    saved = (hostctx.config_file, hostctx.node_name)
    yield
    hostctx.config_file, hostctx.node_name = saved


# The product's real runtime directories on this host, which tests reach
# through the installed commands: what a test run adds there is removed at
# the end, so `make test` leaves the machine's /run as it found it.
@pytest.fixture(autouse=True, scope="session")
def _host_run_left_as_found():
    from slurm_gpu_devkit.sandbox.hostrun import left_as_found
    with left_as_found():
        yield


def pytest_sessionstart(session: pytest.Session) -> None:
    """The runner's pre-exec helper (slurm-gpu-exec) is built on the node like
    the SPANK plugin; scripts/install.sh builds it into the venv.  A venv made
    before it existed gets it here, once, so that the tests that start MPS
    daemons (cgroups, CPUs) do not depend on how the venv was made."""
    import os

    from slurm_gpu import exechelper, runner
    if not os.access(runner.helper_path(), os.X_OK):
        try:
            exechelper.build()
        except Exception as e:  # noqa: BLE001 - those tests then say what is missing
            print(f"slurm-gpu: {runner.HELPER_NAME} not built: {e}")


@pytest.fixture
def isolated_config(tmp_path, monkeypatch):
    """A config of the test's own (state under tmp_path) and no SLURM_CONF,
    for tests that run the health check or the CLI in-process."""
    from configfile import use_config
    from slurm_gpu import config
    use_config(monkeypatch, tmp_path / "slurm-gpu.toml", f'[node]\nstate_dir = "{tmp_path}/state"\n')
    yield
    config.clear_cache()


@pytest.fixture
def sim_config(tmp_path, monkeypatch):
    """A simulated mini-2numa node as the test's config (``[node] nvml = "sim:…"``,
    state under tmp_path/var); yields the simulator's state file."""
    from machinedata import MACHINES_DIR
    from slurm_gpu import config
    from slurm_gpu_devkit.sim.state import init_state_for_machine
    sim = tmp_path / "sim.json"
    init_state_for_machine(str(MACHINES_DIR / "mini-2numa"), str(sim))
    conf = tmp_path / "c.toml"
    conf.write_text(f'[node]\nnvml = "sim:{sim}"\nstate_dir = "{tmp_path}/var"\n')
    monkeypatch.setenv("SLURM_GPU_CONFIG", str(conf))
    config.clear_cache()
    yield sim
    config.clear_cache()


@pytest.fixture(scope="session")
def planner(tmp_path_factory):
    """The binding planner (spank/sg_bind.c) compiled alone, as the plugin's inner half
    holds it, and loaded for slurm_gpu.binding (for the rest of the session): tests
    that plan use this fixture."""
    from slurm_gpu import binding
    from slurm_gpu.commands.spank import build_script
    ffi, lib = build_script().build_planner(tmp_path_factory.mktemp("planner"))
    binding.use_planner(ffi, lib)
    return ffi, lib
