"""The simulator's machine: per-GPU facts, and a state file shared by processes.

A machine is described by ``facts.json`` (format in ``docs/snapshots.md``):
the driver version and, per GPU, the facts NVML would report (index, minor,
UUID, bus id, PCI device id, name, memory, NVLinks, MIG mode and instances,
fabric, health counters).  Like NVIDIA's go-nvml mock machines, everything
the fake answers is derived from these facts.

At run time (``[node] nvml = "sim:<state file>"``) the prolog, epilog, health
check and SPANK plugin are separate processes, so what changes (MIG
instances, compute mode, injected faults, pending XID events) lives in one
JSON state file, read fresh when it changed and rewritten atomically under an
exclusive ``flock`` on ``<state>.lock``.
"""
from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
from typing import Any, Iterator

from slurm_gpu.errors import InputError
from slurm_gpu.fsutil import atomic_write

FACTS_SCHEMA = "slurm-gpu.facts/1"
STATE_SCHEMA = "slurm-gpu.simstate/1"


def load_facts(path: str) -> dict[str, Any]:
    """Read and check a machine's ``facts.json``."""
    try:
        with open(path) as f:
            facts = json.load(f)
    except FileNotFoundError:
        raise InputError("facts file not found", path) from None
    except json.JSONDecodeError as e:
        raise InputError(f"bad facts JSON: {e.msg}", f"{path}:{e.lineno}:{e.colno}") from None
    except OSError as e:
        raise InputError(f"cannot read facts: {e.strerror}", path) from None
    check_facts(facts, path)
    return facts


def check_facts(facts: Any, where: str) -> None:
    """Reject facts the fake could not answer from (one line naming the place)."""
    if not isinstance(facts, dict) or facts.get("schema") != FACTS_SCHEMA:
        raise InputError(f"not a facts file (schema must be {FACTS_SCHEMA})", where)
    gpus = facts.get("gpus")
    if not isinstance(gpus, list):
        raise InputError("facts need a \"gpus\" list", where)
    for i, g in enumerate(gpus):
        for key in ("uuid", "bus_id", "name", "pci_device_id", "memory_mib"):
            if key not in g:
                raise InputError(f"gpus[{i}] lacks \"{key}\"", where)


def new_state(facts: dict[str, Any], *, hwloc_xml: str | None = None) -> dict[str, Any]:
    """A fresh simulator state for *facts* (no faults, baseline MIG layout)."""
    return {"schema": STATE_SCHEMA, "facts": copy.deepcopy(facts), "hwloc_xml": hwloc_xml,
            "overlay": {}, "events": [], "compute_mode": {}}


def init_state(facts_path: str, state_path: str, *, hwloc_xml_path: str | None = None) -> None:
    """Create *state_path* from a machine's facts (and optionally its hwloc XML)."""
    facts = load_facts(facts_path)
    xml = None
    if hwloc_xml_path:
        with open(hwloc_xml_path) as f:
            xml = f.read()
    atomic_write(state_path, json.dumps(new_state(facts, hwloc_xml=xml), indent=1) + "\n")


def init_state_for_machine(machine_dir: str, state_path: str) -> None:
    """Create *state_path* for a machine directory (``facts.json`` plus its hwloc XML).

    The XML is the directory's ``hwloc.xml``, else the one inside its
    ``snapshot.json``, so ``[node] nvml = "sim:<state>"`` models the whole machine.
    """
    facts_path = os.path.join(machine_dir, "facts.json")
    xml_path = os.path.join(machine_dir, "hwloc.xml")
    if os.path.isfile(xml_path):
        init_state(facts_path, state_path, hwloc_xml_path=xml_path)
        return
    facts = load_facts(facts_path)
    xml = None
    snap_path = os.path.join(machine_dir, "snapshot.json")
    if os.path.isfile(snap_path):
        from slurm_gpu.hw.snapshot import read_snapshot
        xml = read_snapshot(snap_path)["hwloc_xml"]
    atomic_write(state_path, json.dumps(new_state(facts, hwloc_xml=xml), indent=1) + "\n")


class StateFile:
    """The JSON state shared by every process that opens ``sim:<path>``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._data: dict[str, Any] | None = None

    def read(self) -> dict[str, Any]:
        """The current state (re-read only when the file changed)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise InputError("simulator state file not found", self.path) from None
        stamp = (st.st_mtime_ns, st.st_ino)
        if self._data is None or stamp != self._stamp:
            self._data = self._load()
            self._stamp = stamp
        return self._data

    def _load(self) -> dict[str, Any]:
        try:
            with open(self.path) as f:
                data = json.load(f)
        except json.JSONDecodeError as e:
            raise InputError(f"bad simulator state: {e.msg}", f"{self.path}:{e.lineno}") from None
        except OSError as e:
            raise InputError(f"cannot read simulator state: {e.strerror}", self.path) from None
        if not isinstance(data, dict) or data.get("schema") != STATE_SCHEMA:
            raise InputError(f"not a simulator state file (schema must be {STATE_SCHEMA})", self.path)
        return data

    @contextlib.contextmanager
    def edit(self) -> Iterator[dict[str, Any]]:
        """Lock, yield the freshest state for changing, then write it atomically."""
        lock_path = self.path + ".lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            data = self._load()
            yield data
            atomic_write(self.path, json.dumps(data, indent=1) + "\n")
            self._data = None
        finally:
            os.close(fd)


class MemoryState:
    """The same interface over a dict (building machines, unit tests)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.path = "<memory>"
        self._data = data

    def read(self) -> dict[str, Any]:
        return self._data

    @contextlib.contextmanager
    def edit(self) -> Iterator[dict[str, Any]]:
        yield self._data
