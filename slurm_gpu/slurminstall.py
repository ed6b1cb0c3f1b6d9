"""Where this node's Slurm is installed: libslurm (its soname is the Slurm
major), ``slurm/spank.h`` and Slurm's plugin directory.

The layouts (read from each one's packaging):

* Debian/Ubuntu ``slurm-wlm`` (``libslurmNN``, ``libslurm-dev``):
  ``/usr/lib/<triplet>/libslurm.so.NN``, plugins in
  ``/usr/lib/<triplet>/slurm-wlm``, ``/usr/include/slurm``;
* SchedMD's own ``.deb`` packages, 23.11+ (``slurm-smd``, ``slurm-smd-dev``;
  SchedMD/slurm ``debian/rules``: a plain ``dh_auto_configure``, so
  ``--libdir=/usr/lib/<triplet>``): ``libslurm.so.NN`` in
  ``/usr/lib/<triplet>``, ``libslurmfull.so`` and the plugins in
  ``/usr/lib/<triplet>/slurm``, headers in ``/usr/include/slurm`` (slurm-smd-dev);
  none of Debian's package names;
* EL (SchedMD's ``slurm.spec``, EPEL): ``/usr/lib64/libslurm.so.NN``,
  ``/usr/lib64/slurm``, ``/usr/include/slurm`` (slurm-devel);
* a source build under a prefix (``/usr/local``, ``/opt/slurm``):
  ``<prefix>/lib[64]/libslurm.so.NN``, ``<prefix>/lib[64]/slurm``, ``<prefix>/include/slurm``.

libslurm's soname is ``SLURM_API_CURRENT`` (src/api/Makefile.am,
``-version-info $(current)``): 38 = 22.05, 42 = 24.11, 45 = 26.05
(:data:`slurm_gpu.slurmversion.API_RELEASES`), the same one-to-one map as
Slurm's own major.minor check of a plugin.

``python -m slurm_gpu.slurminstall check PLUGIN`` (the packages' triggers):
exit 0 when PLUGIN was built for the installed Slurm's major; 1 when it
should be (re)built: another major, no record, or none built yet while
``spank.h`` is now installed; 3 when there is no Slurm, or nothing to build with.
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

from . import slurmversion

TRIPLETS = ("x86_64-linux-gnu", "aarch64-linux-gnu", "powerpc64le-linux-gnu")
PREFIXES = ("/usr", "/usr/local", "/opt/slurm")
_SONAME = re.compile(r"libslurm\.so\.([0-9]{1,3})(?:\.|$)")


@dataclass(frozen=True)
class SlurmInstall:
    """One Slurm installation (paths as seen on the node, without the root)."""

    layout: str                  # "debian" (slurm-wlm), "schedmd" (slurm-smd), "el", "prefix"
    libslurm: str                # the libslurm.so.NN found
    api: int                     # NN, the soname
    include_dir: str | None      # the directory holding slurm/spank.h (None: no dev package)
    plugin_dir: str | None       # Slurm's own plugins

    @property
    def release(self) -> str | None:
        """``"26.05"`` for API 45 (None: a release this table does not know)."""
        return slurmversion.API_RELEASES.get(self.api)


def _lib_dirs(prefix: str) -> list[tuple[str, str]]:
    """(libdir, its plugin dir candidates' layout hint) under *prefix*, in lookup order."""
    out = [(f"{prefix}/lib/{t}", "deb") for t in TRIPLETS]
    return out + [(f"{prefix}/lib64", "el" if prefix == "/usr" else "prefix"),
                  (f"{prefix}/lib", "prefix")]


def _sonames(root: str, libdir: str) -> list[tuple[int, str]]:
    try:
        names = os.listdir(root.rstrip("/") + libdir)
    except OSError:
        return []
    out = []
    for n in names:
        m = _SONAME.match(n)
        if m:
            out.append((int(m.group(1)), f"{libdir}/libslurm.so.{m.group(1)}"))
    return sorted(set(out), reverse=True)


def _has_plugins(root: str, d: str) -> bool:
    try:
        return any(n.startswith(("proctrack_", "task_", "auth_")) and n.endswith(".so")
                   for n in os.listdir(root.rstrip("/") + d))
    except OSError:
        return False


def find(root: str = "/", prefixes: tuple[str, ...] = PREFIXES) -> SlurmInstall | None:
    """The Slurm installed under *root* (the newest libslurm soname of the first
    prefix that has one), or None."""
    r = root.rstrip("/")
    for prefix in prefixes:
        for libdir, hint in _lib_dirs(prefix):
            found = _sonames(root, libdir)
            if not found:
                continue
            api, lib = found[0]
            if hint == "deb" and _has_plugins(root, f"{libdir}/slurm-wlm"):
                layout, plugins = "debian", f"{libdir}/slurm-wlm"
            elif hint == "deb":
                layout, plugins = "schedmd", f"{libdir}/slurm"
            else:
                layout, plugins = hint, f"{libdir}/slurm"
            if not _has_plugins(root, plugins):
                plugins = None
            inc = f"{prefix}/include"
            return SlurmInstall(layout, lib, api, inc if os.path.isfile(f"{r}{inc}/slurm/spank.h") else None,
                                plugins)
    return None


def include_dir(root: str = "/") -> str | None:
    """The directory holding the installed Slurm's ``slurm/spank.h`` (None: none installed)."""
    inst = find(root)
    if inst is not None and inst.include_dir:
        return inst.include_dir
    for prefix in PREFIXES:
        if os.path.isfile(f"{root.rstrip('/')}{prefix}/include/slurm/spank.h"):
            return f"{prefix}/include"
    return None


DEV_PACKAGES = ("libslurm-dev (Debian, Ubuntu), slurm-smd-dev (SchedMD's .debs), "
                "slurm-devel (EL)")


MARKER = b"slurm-gpu-spank built-for-slurm="    # spank/slurm_gpu_spank.c's record in the .so


def plugin_built_for(so: str) -> str | None:
    """The Slurm version a built plugin records (None: not ours, or too old to say)."""
    try:
        with open(so, "rb") as f:
            data = f.read()
    except OSError:
        return None
    i = data.find(MARKER)
    if i < 0:
        return None
    end = data.find(b"\0", i)
    return data[i + len(MARKER):end].decode(errors="replace")


def check(plugin: str, root: str = "/") -> tuple[int, str]:
    """(exit status, one line): is *plugin* built for the installed Slurm's major?"""
    inst = find(root)
    if inst is None:
        return 3, "slurm-gpu: no libslurm.so.NN found (is Slurm installed?)"
    if not os.path.isfile(plugin):
        if include_dir(root):
            return 1, f"slurm-gpu: no plugin at {plugin} and Slurm's spank.h is installed: build it"
        return 3, f"slurm-gpu: no plugin at {plugin}, and no slurm/spank.h to build one ({DEV_PACKAGES})"
    built = plugin_built_for(plugin)
    if built is None:
        return 1, f"slurm-gpu: {plugin} records no Slurm version (an older slurm-gpu built it): rebuild it"
    have = inst.release or f"libslurm.so.{inst.api}"
    if slurmversion.major_minor(built) == inst.release:
        return 0, f"slurm-gpu: {plugin} built for Slurm {built}; installed: {have} ({inst.libslurm})"
    return 1, (f"slurm-gpu: {plugin} built for Slurm {built} but the installed Slurm is {have} "
               f"({inst.libslurm}): rebuild it")


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "check":
        print("usage: python -m slurm_gpu.slurminstall check PLUGIN", file=sys.stderr)
        return 2
    rc, line = check(argv[1])
    print(line, file=sys.stderr if rc else sys.stdout)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
