#!/usr/bin/env python3
"""Rebuild slurm_gpu/data/nvidia_gpu_names.json from NVIDIA's driver sources.

Usage: build.py GITDIR [COMMIT] > slurm_gpu/data/nvidia_gpu_names.json

GITDIR is a clone of NVIDIA/open-gpu-kernel-modules.  Two files of that
repository are read, at COMMIT (default HEAD) and, for the name history, at
every commit that changed the name table:

* README.md, "Compatible GPUs": the bare-metal products NVIDIA lists, one row
  per (device id[, subsystem vendor, subsystem device]).  Only those rows are
  kept: the name table also holds vGPU profile names (``NVIDIA H200X-1-18C``)
  that a bare-metal node never reports.
* src/nvidia/generated/g_nv_name_released.h, ``sChipsReleased``: the table
  ``rm_get_device_name()`` (src/nvidia/arch/nvalloc/unix/src/osapi.c)
  searches for /proc/driver/nvidia/gpus/*/information ``Model:``.
  The entries are ``{ devID, subSystemID, subSystemVendorID, name }``.

Only the device ids in DEVICES are taken (datacenter GPUs from Ampere on,
and the RTX PRO 6000 Blackwell editions); each must have README rows.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

DEVICES = [
    # Ampere
    0x20B0, 0x20B2, 0x20B3, 0x20B5, 0x20B6, 0x20B7, 0x20BD, 0x20F1, 0x20F3, 0x20F5, 0x20F6,
    0x2235, 0x2236, 0x2237, 0x25B6,
    # Hopper
    0x230E, 0x2321, 0x2322, 0x2324, 0x2329, 0x232C, 0x2330, 0x2331, 0x2335, 0x2339, 0x233A, 0x233B,
    0x2342, 0x2348,
    # Ada
    0x26B5, 0x26B9, 0x26BA, 0x27B8,
    # Blackwell
    0x2901, 0x2941, 0x3182, 0x31C2, 0x2BB1, 0x2BB4, 0x2BB5,
]
TABLE = "src/nvidia/generated/g_nv_name_released.h"
_ROW = re.compile(r"^\|\s*(.+?)\s*\|\s*([0-9A-F]{4})(?: ([0-9A-F]{4}) ([0-9A-F]{4}))?\s*\|$")
_ENTRY = re.compile(r'\{\s*0x([0-9A-Fa-f]{4}),\s*0x([0-9A-Fa-f]{4}),\s*0x([0-9A-Fa-f]{4}),\s*"([^"]*)"\s*\}')


def git(gitdir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", gitdir, *args], check=True, capture_output=True,
                          text=True).stdout


def table(text: str) -> dict[tuple[int, int, int], str]:
    """(device, subsystem vendor, subsystem device) -> name from sChipsReleased."""
    out = {}
    for dev, subdev, subven, name in _ENTRY.findall(text):
        out[(int(dev, 16), int(subven, 16), int(subdev, 16))] = name
    return out


def main() -> None:
    gitdir = sys.argv[1]
    commit = git(gitdir, "rev-parse", sys.argv[2] if len(sys.argv) > 2 else "HEAD").strip()
    version = git(gitdir, "log", "-1", "--format=%s", commit).strip()
    readme = git(gitdir, "show", f"{commit}:README.md")
    rows: list[tuple[int, int, int, str]] = []
    for line in readme.splitlines():
        m = _ROW.match(line)
        if m and int(m.group(2), 16) in DEVICES:
            rows.append((int(m.group(2), 16), int(m.group(3) or "0", 16), int(m.group(4) or "0", 16), m.group(1)))
    now = table(git(gitdir, "show", f"{commit}:{TABLE}"))
    # in version order: the repository's history interleaves release branches
    history = sorted(((c.split(" ", 1)[1], table(git(gitdir, "show", f"{c.split(' ', 1)[0]}:{TABLE}")))
                      for c in git(gitdir, "log", "--format=%H %s", commit, "--", TABLE).splitlines()
                      if re.fullmatch(r"[0-9a-f]+ [0-9]+(?:\.[0-9]+)+", c)),   # releases, not reverts
                     key=lambda vt: tuple(int(x) for x in vt[0].split(".")))
    entries = []
    for dev, sv, sd, name in rows:
        assert now.get((dev, sv, sd)) == name, (hex(dev), name, now.get((dev, sv, sd)))
        seen = [(v, t[(dev, sv, sd)]) for v, t in history if (dev, sv, sd) in t]
        e = {"device": f"0x{dev:04x}", "subsystem": f"{sv:04x}:{sd:04x}" if sv or sd else None,
             "name": name, "since": seen[0][0]}
        older = {}
        for v, n in seen:
            if n != name:
                older.setdefault(n, []).append(v)
        if older:
            e["earlier_names"] = [{"name": n, "drivers": f"{vs[0]}..{vs[-1]}"} for n, vs in older.items()]
        entries.append(e)
    missing = sorted(set(DEVICES) - {e[0] for e in rows})
    assert not missing, [hex(d) for d in missing]
    doc = {
        "schema": 1,
        "about": ("NVIDIA's own product names of datacenter GPUs by PCI device id and subsystem id, "
                  "for naming GPUs that only hwloc (lstopo XML) describes. Slurm's AutoDetect=nvidia types a GPU by "
                  "the 'Model:' line of /proc/driver/nvidia/gpus/<bus>/information, which the driver takes from "
                  "this table (rm_get_device_name); AutoDetect=nvml by nvmlDeviceGetName, which gives the same "
                  "names on the recorded machines. A device id whose subsystem is not listed, and no row with "
                  "subsystem null, has no known name: the driver prints 'Unknown'."),
        "provenance": {
            "repository": "NVIDIA/open-gpu-kernel-modules",
            "commit": commit,
            "driver": version,
            "rows": "README.md, 'Compatible GPUs' (bare-metal products only; vGPU profile names left out)",
            "names": f"{TABLE} (sChipsReleased, searched by rm_get_device_name in "
                     "src/nvidia/arch/nvalloc/unix/src/osapi.c)",
            "since": "the first driver release of that repository whose table has the row "
                     "(the repository starts at 515.43.04)",
            "rebuild": "tests/data/nvidia-names/build.py",
        },
        "gpus": entries,
    }
    # one entry per line: reviewable diffs
    head = json.dumps({k: v for k, v in doc.items() if k != "gpus"}, indent=1)[:-2]
    body = ",\n".join("  " + json.dumps(e) for e in entries)
    print(f'{head},\n "gpus": [\n{body}\n ]\n}}')


if __name__ == "__main__":
    main()
