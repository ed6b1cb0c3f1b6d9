"""Checking hwloc XML before libhwloc sees it, and saying why it was refused.

Split from :mod:`slurm_gpu.hw.hwloc` (pure move): libhwloc's XML reader
crashes on some broken input, so only XML these rules pass reaches it.
"""
from __future__ import annotations

import re

from . import hwloc_ffi as H

# libhwloc's XML import trusts that the file is one of its own exports.
# hwloc 2.9.0 dereferences NULL (SIGSEGV; lstopo too) on well-formed files
# that break that, e.g. an object with a set but not its complete_* twin, or
# (format 2) objects in places hwloc never puts them.  These rules, found by
# tests/unit/hw/test_fuzz_hw.py, hold for every export hwloc writes.
_TWINS = (("cpuset", "complete_cpuset"), ("nodeset", "complete_nodeset"))
# hwloc's bitmap syntax (zero words between commas may be left out); a set
# that starts with a comma trips an assert() in hwloc_bitmap_sscanf (SIGABRT).
_BITMAP = re.compile(r"(?:0xf\.\.\.f,)?0x[0-9a-fA-F]{1,8}(?:,(?:0x[0-9a-fA-F]{1,8})?)*")
# libhwloc reads the raw text: an entity (declared or not) would reach it
# unexpanded while expat checks the expanded value, so only the five
# predefined ones pass (no export has any other).
_OTHER_ENTITY = re.compile(rb"&(?!(?:amp|lt|gt|quot|apos);)|<!ENTITY")
_MEMORY = {"NUMANode", "MemCache"}
_IO = {"Bridge", "PCIDev", "OSDev"}


def _malformed(data: bytes) -> tuple[str, int] | None:
    """Why *data* is not XML that libhwloc can safely be given (message, line), or None."""
    from xml.parsers import expat

    ent = _OTHER_ENTITY.search(data)
    if ent is not None:
        return "malformed hwloc XML: an entity or character reference", data.count(b"\n", 0, ent.start()) + 1
    parser = expat.ParserCreate()
    bad: list[tuple[str, int]] = []
    stack: list[str | None] = []            # object types of the open <object>s (None: other element)
    version: list[str] = []
    roots = [0]

    def fail(what: str) -> None:
        if not bad:
            bad.append((f"malformed hwloc XML: {what}", parser.CurrentLineNumber))

    def start(name: str, attrs: dict[str, str]) -> None:
        if name == "topology" and not stack:
            version.append(attrs.get("version", ""))
        for key, value in attrs.items():
            if key.endswith(("cpuset", "nodeset")) and not _BITMAP.fullmatch(value):
                fail(f"{key}={value[:40]!r} is not an hwloc bitmap")
        if name != "object":
            stack.append(None)
            return
        kind = attrs.get("type", "")
        for have, twin in _TWINS:
            if have in attrs and twin not in attrs:
                fail(f"object with {have} but no {twin}")
        parent = next((t for t in reversed(stack) if t is not None), None)
        if version and version[0].startswith("2"):
            if parent is None:
                roots[0] += 1
                if roots[0] > 1 or stack[-1:] != [None] or len(stack) != 1:
                    fail("more than one root object")
            elif parent in _MEMORY and kind not in _MEMORY | {"Misc"}:
                fail(f"{kind} object inside a {parent}")
            elif parent in _IO and kind not in _IO | {"Misc"}:
                fail(f"{kind} object inside a {parent}")
        stack.append(kind)

    parser.StartElementHandler = start
    parser.EndElementHandler = lambda name: stack.pop()
    try:
        parser.Parse(data, True)
    except expat.ExpatError as e:
        return f"malformed hwloc XML: {expat.errors.messages[e.code]}", e.lineno
    except (LookupError, ValueError) as e:      # an encoding="..." Python does not know
        return f"malformed hwloc XML: {str(e)[:80]}", 1
    return bad[0] if bad else None


def _why_rejected(data: bytes) -> tuple[str, int | None]:
    """hwloc says only 'invalid'; a quick expat parse finds the reason and line."""
    from xml.parsers import expat

    bad = _malformed(data)
    if bad is not None:
        return bad
    root: list[tuple[str, dict[str, str]]] = []
    parser = expat.ParserCreate()
    parser.StartElementHandler = lambda name, attrs: root.append((name, attrs)) if not root else None
    parser.Parse(data, True)
    if root and root[0][0] != "topology":
        return f"not an hwloc topology XML: the root element is <{root[0][0]}>", None
    version = root[0][1].get("version", "") if root else ""
    if version and not version.startswith(("1.", "2.")):
        return f"hwloc XML format {version} is newer than this libhwloc reads (hwloc API {H.api_version()})", None
    return "hwloc rejected the topology XML (well-formed, but not a valid hwloc topology)", None
