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
# through the installed commands (prologs, health runs, `spank` hooks run as
# subprocesses with a test's own config): what a test run adds there is
# removed at the end, so `make test` leaves the machine's /run as it found it.
_HOST_RUN_DIRS = ("/run/slurm-gpu/node-facts", "/run/slurm-gpu/spank-cache", "/run/slurm-gpu/mps",
                  "/run/slurm-gpu")
# The sandbox registry (reservations of ports, nets and cgroups) is removed
# only when this run made it: where it was there before, a sandbox started
# by hand (`make demo`, `sandbox up`) may still hold what is in it.
_REGISTRY = "/run/slurm-gpu-sandbox"


def _listing(path: str) -> set[str] | None:
    import os
    try:
        return set(os.listdir(path))
    except OSError:
        return None


@pytest.fixture(autouse=True, scope="session")
def _host_run_left_as_found():
    import os
    import shutil
    before = {d: _listing(d) for d in _HOST_RUN_DIRS}
    registry_was = os.path.lexists(_REGISTRY)
    yield
    if not registry_was and os.path.isdir(_REGISTRY) and not os.path.islink(_REGISTRY):
        if not any(os.listdir(os.path.join(_REGISTRY, d)) for d in os.listdir(_REGISTRY)
                   if os.path.isdir(os.path.join(_REGISTRY, d))):
            shutil.rmtree(_REGISTRY, ignore_errors=True)   # nothing reserved: only our own bookkeeping
    for d in _HOST_RUN_DIRS:          # deepest first: a directory we made goes once emptied
        was = before[d]
        now = _listing(d)
        if now is None:
            continue
        for name in now - (was or set()):
            p = os.path.join(d, name)
            if os.path.isdir(p) and not os.path.islink(p):
                if p not in _HOST_RUN_DIRS:
                    shutil.rmtree(p, ignore_errors=True)
            else:
                try:
                    os.unlink(p)
                except OSError:
                    pass
        if was is None:
            try:
                os.rmdir(d)
            except OSError:
                pass
