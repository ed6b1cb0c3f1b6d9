"""cffi ABI-mode bindings to the system libhwloc 2.x (``libhwloc.so.15``).

ABI mode needs no compiler: the declarations below are copied from hwloc 2.x's
``hwloc.h``, whose struct layouts are part of the ``.so.15`` ABI.  Only what
:mod:`slurm_gpu.hw.hwloc` needs is declared.  Several convenience functions of
``hwloc.h`` (``hwloc_get_nbobjs_by_type``, ``hwloc_get_obj_by_type``,
``hwloc_get_pcidev_by_busid`` ...) are ``static inline`` and so not in the
library; we use ``hwloc_get_type_depth`` with the ``*_by_depth`` calls instead.

cffi is imported on first use, never at module import, so commands that replay
a snapshot with a derived model do not pay for it.
"""
from __future__ import annotations

import os
from typing import Any, Iterator

from ..errors import HardwareError

SONAME = "libhwloc.so.15"

# hwloc_obj_type_t (hwloc 2.x order)
OBJ_MACHINE, OBJ_PACKAGE, OBJ_CORE, OBJ_PU = 0, 1, 2, 3
OBJ_GROUP, OBJ_NUMANODE, OBJ_BRIDGE, OBJ_PCI_DEVICE, OBJ_OS_DEVICE, OBJ_MISC = 12, 13, 14, 15, 16, 17
# hwloc_obj_osdev_type_t
OSDEV_BLOCK, OSDEV_GPU, OSDEV_NETWORK, OSDEV_OPENFABRICS, OSDEV_DMA, OSDEV_COPROC = range(6)
# hwloc_type_filter_e
FILTER_KEEP_ALL, FILTER_KEEP_NONE, FILTER_KEEP_STRUCTURE, FILTER_KEEP_IMPORTANT = 0, 1, 2, 3
# hwloc_get_type_depth() special answers
DEPTH_UNKNOWN, DEPTH_MULTIPLE = -1, -2
# hwloc_topology_export_xml flags: write the hwloc 1.x format (for old readers)
EXPORT_XML_FLAG_V1 = 1 << 0

_CDEF = """
typedef uint64_t hwloc_uint64_t;
typedef struct hwloc_topology * hwloc_topology_t;
typedef struct hwloc_bitmap_s * hwloc_bitmap_t;
typedef const struct hwloc_bitmap_s * hwloc_const_bitmap_t;
typedef hwloc_bitmap_t hwloc_cpuset_t;
typedef hwloc_bitmap_t hwloc_nodeset_t;
typedef int hwloc_obj_type_t;
typedef int hwloc_obj_osdev_type_t;
typedef int hwloc_obj_bridge_type_t;
typedef int hwloc_type_filter_e;

struct hwloc_info_s { char *name; char *value; };

struct hwloc_pcidev_attr_s {
  unsigned short domain;
  unsigned char bus, dev, func;
  unsigned short class_id;
  unsigned short vendor_id, device_id, subvendor_id, subdevice_id;
  unsigned char revision;
  float linkspeed;
};
struct hwloc_memory_page_type_s { hwloc_uint64_t size; hwloc_uint64_t count; };
struct hwloc_numanode_attr_s {
  hwloc_uint64_t local_memory;
  unsigned page_types_len;
  struct hwloc_memory_page_type_s *page_types;
};
struct hwloc_bridge_attr_s {
  union { struct hwloc_pcidev_attr_s pci; } upstream;
  hwloc_obj_bridge_type_t upstream_type;
  union { struct { unsigned short domain; unsigned char secondary_bus, subordinate_bus; } pci; } downstream;
  hwloc_obj_bridge_type_t downstream_type;
  unsigned depth;
};
struct hwloc_osdev_attr_s { hwloc_obj_osdev_type_t type; };
union hwloc_obj_attr_u {
  struct hwloc_numanode_attr_s numanode;
  struct hwloc_pcidev_attr_s pcidev;
  struct hwloc_bridge_attr_s bridge;
  struct hwloc_osdev_attr_s osdev;
};

struct hwloc_obj {
  hwloc_obj_type_t type; char *subtype; unsigned os_index; char *name;
  hwloc_uint64_t total_memory; union hwloc_obj_attr_u *attr; int depth; unsigned logical_index;
  struct hwloc_obj *next_cousin; struct hwloc_obj *prev_cousin; struct hwloc_obj *parent;
  unsigned sibling_rank; struct hwloc_obj *next_sibling; struct hwloc_obj *prev_sibling;
  unsigned arity; struct hwloc_obj **children; struct hwloc_obj *first_child;
  struct hwloc_obj *last_child; int symmetric_subtree;
  unsigned memory_arity; struct hwloc_obj *memory_first_child;
  unsigned io_arity; struct hwloc_obj *io_first_child;
  unsigned misc_arity; struct hwloc_obj *misc_first_child;
  hwloc_cpuset_t cpuset; hwloc_cpuset_t complete_cpuset;
  hwloc_nodeset_t nodeset; hwloc_nodeset_t complete_nodeset;
  struct hwloc_info_s *infos; unsigned infos_count; void *userdata; hwloc_uint64_t gp_index;
};
typedef struct hwloc_obj * hwloc_obj_t;

unsigned hwloc_get_api_version(void);
int hwloc_topology_init(hwloc_topology_t *topologyp);
int hwloc_topology_load(hwloc_topology_t topology);
void hwloc_topology_destroy(hwloc_topology_t topology);
int hwloc_topology_set_xmlbuffer(hwloc_topology_t topology, const char *buffer, int size);
int hwloc_topology_set_all_types_filter(hwloc_topology_t topology, hwloc_type_filter_e filter);
int hwloc_topology_set_io_types_filter(hwloc_topology_t topology, hwloc_type_filter_e filter);
int hwloc_topology_export_xmlbuffer(hwloc_topology_t topology, char **xmlbuffer, int *buflen, unsigned long flags);
void hwloc_free_xmlbuffer(hwloc_topology_t topology, char *xmlbuffer);
int hwloc_get_type_depth(hwloc_topology_t topology, hwloc_obj_type_t type);
unsigned hwloc_get_nbobjs_by_depth(hwloc_topology_t topology, int depth);
hwloc_obj_t hwloc_get_obj_by_depth(hwloc_topology_t topology, int depth, unsigned idx);
int hwloc_bitmap_list_snprintf(char *buf, size_t buflen, hwloc_const_bitmap_t bitmap);
"""

_state: dict[str, Any] = {}


def ffi_lib() -> tuple[Any, Any]:
    """Return ``(ffi, lib)``, importing cffi and opening libhwloc on first use."""
    if "lib" not in _state:
        import cffi  # lazy: ~20 ms, only paid when hwloc is really used

        ffi = cffi.FFI()
        ffi.cdef(_CDEF)
        try:
            lib = ffi.dlopen(SONAME)
        except OSError as e:
            raise HardwareError(f"cannot load {SONAME} (install Debian's libhwloc15): {e}") from e
        major = lib.hwloc_get_api_version() >> 16
        if major != 2:
            raise HardwareError(f"{SONAME} reports hwloc API {major}.x; hwloc 2.x is required")
        _state["ffi"], _state["lib"] = ffi, lib
    return _state["ffi"], _state["lib"]


def api_version() -> str:
    """The loaded library's API version (2.9.x reports ``2.8.0``: the API did not change)."""
    _, lib = ffi_lib()
    v = lib.hwloc_get_api_version()
    return f"{v >> 16}.{(v >> 8) & 0xff}.{v & 0xff}"


class HwlocLoadError(Exception):
    """hwloc refused the input; carries errno when hwloc set one."""

    def __init__(self, step: str, errno: int) -> None:
        super().__init__(f"{step} failed: {os.strerror(errno) if errno else 'no reason given'}")
        self.step = step
        self.errno = errno


class Topology:
    """One loaded hwloc topology.  Objects are cffi pointers valid while it lives.

    ``xml`` (bytes) loads an XML export instead of the live machine.  With
    ``keep_all`` every object type, I/O included, is kept, exactly like
    ``hwloc-calc`` does; otherwise I/O objects are filtered to the
    "important" ones (GPUs, NICs, storage and the bridges above them).
    """

    def __init__(self, xml: bytes | None = None, *, keep_all: bool = False) -> None:
        ffi, lib = ffi_lib()
        self._ffi, self._lib = ffi, lib
        p = ffi.new("hwloc_topology_t *")
        if lib.hwloc_topology_init(p) != 0:
            raise HwlocLoadError("hwloc_topology_init", ffi.errno)
        self._t = p[0]
        try:
            if keep_all:
                lib.hwloc_topology_set_all_types_filter(self._t, FILTER_KEEP_ALL)
            else:
                lib.hwloc_topology_set_io_types_filter(self._t, FILTER_KEEP_IMPORTANT)
            if xml is not None:
                # cffi passes bytes NUL-terminated; hwloc wants the size with the NUL.
                self._xml_keepalive = xml
                if lib.hwloc_topology_set_xmlbuffer(self._t, xml, len(xml) + 1) != 0:
                    raise HwlocLoadError("hwloc_topology_set_xmlbuffer", ffi.errno)
            if lib.hwloc_topology_load(self._t) != 0:
                raise HwlocLoadError("hwloc_topology_load", ffi.errno)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Free the topology (idempotent)."""
        t, self._t = getattr(self, "_t", None), None
        if t is not None:
            self._lib.hwloc_topology_destroy(t)

    def __enter__(self) -> "Topology":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    # -- object access -----------------------------------------------------
    def objects(self, obj_type: int) -> list[Any]:
        """All objects of *obj_type* in logical-index order ([] when none)."""
        depth = self._lib.hwloc_get_type_depth(self._t, obj_type)
        if depth == DEPTH_UNKNOWN:
            return []
        if depth == DEPTH_MULTIPLE:
            raise ValueError(f"hwloc type {obj_type} exists at several depths")
        n = self._lib.hwloc_get_nbobjs_by_depth(self._t, depth)
        return [self._lib.hwloc_get_obj_by_depth(self._t, depth, i) for i in range(n)]

    def root(self) -> Any:
        return self._lib.hwloc_get_obj_by_depth(self._t, 0, 0)

    def export_xml(self) -> str:
        """The topology as hwloc 2.x XML text."""
        ffi, lib = self._ffi, self._lib
        buf = ffi.new("char **")
        size = ffi.new("int *")
        if lib.hwloc_topology_export_xmlbuffer(self._t, buf, size, 0) != 0:
            raise HwlocLoadError("hwloc_topology_export_xmlbuffer", ffi.errno)
        try:
            return ffi.string(buf[0]).decode("utf-8", "replace")
        finally:
            lib.hwloc_free_xmlbuffer(self._t, buf[0])

    # -- small helpers on objects -------------------------------------------
    def string(self, p: Any) -> str | None:
        return None if p == self._ffi.NULL else self._ffi.string(p).decode("utf-8", "replace")

    def infos(self, obj: Any) -> dict[str, str]:
        """An object's info name/value pairs (first value wins on duplicates)."""
        out: dict[str, str] = {}
        for i in range(obj.infos_count):
            name = self.string(obj.infos[i].name)
            if name is not None and name not in out:
                out[name] = self.string(obj.infos[i].value) or ""
        return out

    def bitmap(self, bm: Any) -> int:
        """A cpuset/nodeset as a Python int bit mask (0 for NULL)."""
        if bm == self._ffi.NULL:
            return 0
        n = self._lib.hwloc_bitmap_list_snprintf(self._ffi.NULL, 0, bm)
        buf = self._ffi.new("char[]", n + 1)
        self._lib.hwloc_bitmap_list_snprintf(buf, n + 1, bm)
        return list_to_mask(self._ffi.string(buf).decode())

    def io_children(self, obj: Any) -> Iterator[Any]:
        c = obj.io_first_child
        while c != self._ffi.NULL:
            yield c
            c = c.next_sibling

    def is_null(self, p: Any) -> bool:
        return p == self._ffi.NULL


def list_to_mask(text: str) -> int:
    """hwloc list syntax (``0-3,8,10-``) to a bit mask; an open end is ignored."""
    mask = 0
    for part in text.split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not sep:
            mask |= 1 << int(lo)
        elif hi:
            mask |= ((1 << (int(hi) + 1)) - 1) ^ ((1 << int(lo)) - 1)
    return mask


def mask_bits(mask: int) -> tuple[int, ...]:
    """Indices of the set bits of *mask*, ascending."""
    return tuple(i for i, c in enumerate(reversed(bin(mask)[2:])) if c == "1")
