"""Snapshots: one JSON file holding a node's NVML answers and hwloc XML.

Schema ``slurm-gpu.snapshot/1`` (full description in ``docs/snapshots.md``)::

    {"schema": "slurm-gpu.snapshot/1", "hostname": ..., "recorded_at": ISO time,
     "generator": "slurm-gpu 0.1.0", "source": "live" | "sim:<facts>",
     "nvml": {"calls": [{"fn", "dev", "args", "result" | "error" [, "out"]}...],
              "mig_minors": {"gpu0/gi1/access": 12, ...}},
     "hwloc_xml": "<?xml ...",
     "phys_memory_bytes": N (optional: the kernel's memory count, slurmd -C's),
     "node": Node.to_dict()}

Recording walks the same adapter the live code uses (:func:`nvml.read_view`
and the health reads) through :class:`~.nvml_record.RecordingNvml`, and the
derived model is produced by replaying what was just recorded, so the stored
``node`` is by construction what a replay gives.

Loading takes the fast path (parse JSON, ``Node.from_dict``; no hwloc, cffi
or pynvml import) when there is no overlay; with a fault overlay it replays
the recorded answers through the same adapter.
"""
from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any, Mapping

from ..errors import InputError, unreadable

if TYPE_CHECKING:   # the health check reads a snapshot's NVML answers, not its node
    from .model import Node
    from .nvml_api import NvmlApi

SCHEMA = "slurm-gpu.snapshot/1"


def _read_json(path: str, what: str) -> Any:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise unreadable(e, what, path) from None
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise InputError(f"{what} is not UTF-8 text", path) from None
    except json.JSONDecodeError as e:
        raise InputError(f"bad {what} JSON: {e.msg}", f"{path}:{e.lineno}:{e.colno}") from None
    except (ValueError, RecursionError) as e:   # a 5,000-digit number, nesting deeper than Python's stack
        raise InputError(f"bad {what} JSON: {type(e).__name__}: {str(e)[:80]}", path) from None


def read_snapshot(path: str) -> dict[str, Any]:
    """Parse and check a snapshot file (InputError naming the file and place)."""
    data = _read_json(path, "snapshot")
    if not isinstance(data, dict):
        raise InputError("snapshot must be a JSON object", path)
    schema = data.get("schema")
    if schema != SCHEMA:
        raise InputError(f"unsupported snapshot schema {schema!r} (want {SCHEMA!r})", f"{path}: schema")
    for key, kind in (("hostname", str), ("nvml", dict), ("hwloc_xml", str)):
        if not isinstance(data.get(key), kind):
            raise InputError(f"snapshot lacks {key!r} or it is not a {kind.__name__}", f"{path}: {key}")
    phys = data.get("phys_memory_bytes")
    if phys is not None and (type(phys) is not int or phys <= 0):
        raise InputError("snapshot phys_memory_bytes must be a positive integer", f"{path}: phys_memory_bytes")
    calls = data["nvml"].get("calls")
    if not isinstance(calls, list):
        raise InputError("snapshot nvml.calls must be a list", f"{path}: nvml.calls")
    for i, c in enumerate(calls):
        if not isinstance(c, dict) or not isinstance(c.get("fn"), str) or not ("result" in c or "error" in c):
            raise InputError("bad recorded call (needs fn and result or error)", f"{path}: nvml.calls[{i}]")
    return data


def load_overlay(path: str) -> dict[str, Any]:
    """Read a fault overlay file (JSON object, see docs/snapshots.md)."""
    data = _read_json(path, "overlay")
    if not isinstance(data, dict):
        raise InputError("overlay must be a JSON object", path)
    return data


def node_from_file(path: str, overlay: Mapping[str, Any] | None = None, *,
                   overlay_source: str = "overlay") -> Node:
    """The node recorded in snapshot *path*, optionally with a fault overlay
    (use :func:`slurm_gpu.hw.load_node` with :class:`~slurm_gpu.hw.sources.Snapshot`)."""
    path = os.fspath(path)
    data = read_snapshot(path)
    sources: tuple[str, ...] = (f"snapshot:{path}",)
    if not overlay and isinstance(data.get("node"), dict):
        from .model import Node
        try:
            node = Node.from_dict(data["node"])
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"bad derived model in snapshot: {type(e).__name__}: {e}", f"{path}: node") from None
        return _with_sources(node, sources)
    if overlay:
        sources = sources + (f"overlay:{overlay_source}",)
    return replay(data, path, overlay=overlay, overlay_source=overlay_source, sources=sources)


def _with_sources(node: Node, sources: tuple[str, ...]) -> Node:
    import dataclasses
    return dataclasses.replace(node, sources=sources)


def replay_api(data: Mapping[str, Any], path: str, overlay: Mapping[str, Any] | None = None,
               overlay_source: str = "overlay") -> NvmlApi:
    """A :class:`ReplayNvml` over a parsed snapshot, with the fault overlay applied."""
    from .nvml_replay import ReplayNvml
    api: NvmlApi
    try:
        api = ReplayNvml(data["nvml"]["calls"], where=path)
    except (KeyError, TypeError) as e:
        raise InputError(f"bad recorded call: {e}", f"{path}: nvml.calls") from None
    if overlay:
        from .nvml_overlay import OverlayNvml
        try:
            api = OverlayNvml(api, overlay)
        except ValueError as e:
            raise InputError(f"bad overlay: {e}", overlay_source) from None
    return api


def replay(data: Mapping[str, Any], path: str, *, overlay: Mapping[str, Any] | None = None,
           overlay_source: str = "overlay", sources: tuple[str, ...] | None = None,
           xml_source: str | None = None) -> Node:
    """Rebuild the node from the recorded answers through the real adapters.

    *xml_source* names the XML in error messages when it came from a file of
    its own (``snapshot record --hwloc-xml``) rather than from *path*.
    """
    from . import hwloc
    cpu = hwloc.read_cpu_view(xml_text=data["hwloc_xml"], hostname=data["hostname"],
                              source=xml_source or f"{path}: hwloc_xml",
                              phys_memory_bytes=data.get("phys_memory_bytes"))
    api = replay_api(data, path, overlay, overlay_source)
    minors = data["nvml"].get("mig_minors") or {}
    from .merge import derive_node
    try:
        return derive_node(cpu, api, mig_minors=minors, sources=sources or (f"snapshot:{path}",), init=True)
    except REPLAY_DATA_ERRORS as e:
        # A recorded answer of a shape real NVML never gives (a hand edit, a
        # damaged file) fails inside the adapter: one line naming the file.
        raise InputError(f"bad recorded NVML answers: {type(e).__name__}: {str(e)[:120]}", f"{path}: nvml") from None


REPLAY_DATA_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError, RecursionError)


def record(*, api: NvmlApi | None = None, hwloc_xml: str | None = None, hostname: str | None = None,
           mig_minors: Mapping[str, int] | None = None, source: str = "live",
           init_error: int | None = None, hwloc_source: str | None = None,
           phys_memory_bytes: int | None = None) -> dict[str, Any]:
    """Record this machine (or *api*, e.g. the simulator) as snapshot data.

    *api* must already be initialised; with *api* None the real NVML is
    opened, and a machine without a usable driver is recorded as such
    (``nvmlInit`` failing with its error code).  *hwloc_source* names the
    file *hwloc_xml* was read from, for error messages.  *phys_memory_bytes*
    goes with a given *hwloc_xml*; the live machine's is read.
    """
    from . import nvml
    from .nvml_record import RecordingNvml
    if hwloc_xml is None:
        from . import hwloc
        hwloc_xml = hwloc.live_xml()
        phys_memory_bytes = hwloc.phys_memory()
    if not hostname:
        import socket
        hostname = socket.gethostname()
    calls: list[dict[str, Any]] = []
    used_minors: dict[str, int] = {}
    opened = False
    if api is None and init_error is None:  # the driver
        try:
            api = nvml.open_api()
            opened = True
        except nvml.NvmlUnavailable as e:
            init_error = e.code
    if init_error is not None or api is None:
        calls = [{"fn": "nvmlInit", "dev": "", "args": [], "error": init_error}]
    else:
        rec = RecordingNvml(api)
        all_minors = mig_minors if mig_minors is not None else None
        try:
            view = nvml.read_view(rec, mig_minors=all_minors)
            _record_health(rec)
        finally:
            if opened:
                nvml.close_api(api)
        calls = rec.records()
        for g in view.gpus:
            for m in g.mig_instances:
                if m.gi_cap_minor is not None:
                    used_minors[f"gpu{g.minor}/gi{m.gi_id}/access"] = m.gi_cap_minor
                if m.ci_cap_minor is not None:
                    used_minors[f"gpu{g.minor}/gi{m.gi_id}/ci{m.ci_id}/access"] = m.ci_cap_minor
    from .. import __version__
    data: dict[str, Any] = {
        "schema": SCHEMA, "hostname": hostname,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "generator": f"slurm-gpu {__version__}", "source": source,
        "nvml": {"calls": calls, "mig_minors": dict(sorted(used_minors.items()))},
        "hwloc_xml": hwloc_xml,
    }
    if phys_memory_bytes is not None:
        data["phys_memory_bytes"] = phys_memory_bytes
    node = replay(data, "<recording>", xml_source=hwloc_source)
    data["node"] = node.to_dict()  # last key: snapshot_bulk reads it from the file's tail
    return data


def _record_health(rec: NvmlApi) -> None:
    """Run the health reads through the recorder so snapshots carry them too."""
    try:
        from . import nvml_health
    except ImportError:
        return
    try:
        nvml_health.read_health(rec)
    except Exception:  # noqa: BLE001 - answers (and errors) are recorded either way
        pass


def write(path: str, data: Mapping[str, Any]) -> None:
    """Write snapshot *data* to *path* atomically."""
    from ..fsutil import atomic_write
    atomic_write(path, json.dumps(data, indent=1) + "\n")


def rerecord(path: str, *, hostname: str, overlay: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Record again the machine a snapshot models, through the same recorder.

    For a node whose ``[node] snapshot`` stands in for its hardware (the
    sandbox): the recorded answers are replayed through
    :class:`~.nvml_record.RecordingNvml` exactly as live answers would be,
    so the result is what ``snapshot record`` gives on the real machine,
    under this node's name.  With a fault *overlay* (a lost GPU...), the
    result is a recording of the machine with that fault.
    """
    data = read_snapshot(path)
    api = replay_api(data, path, overlay)
    init_error = None
    from .nvml_api import NVMLError
    try:
        api.nvmlInit()
    except NVMLError as e:  # recorded on a machine without a usable NVML
        init_error = e.value
    return record(api=None if init_error is not None else api, hwloc_xml=data["hwloc_xml"], hostname=hostname,
                  mig_minors=data["nvml"].get("mig_minors") or {}, source=f"snapshot:{path}",
                  init_error=init_error, hwloc_source=f"{path}: hwloc_xml",
                  phys_memory_bytes=data.get("phys_memory_bytes"))
