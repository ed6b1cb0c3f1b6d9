"""What a generated Slurm config may print: one allow-list per kind of value (pure).

Node models come from files one node's root writes (``[cluster]
publish_dir``, ``cluster collect``, a snapshot handed over), so every value
the generators print from them is input.  Slurm reads its config files with
one parser (``src/common/parse_config.c``, the same from 22.05 to 26.05):

* a line ends at ``\\n`` (``fgets``); whitespace (``isspace``: also ``\\r``,
  ``\\t``, ``\\v``, ``\\f``) separates ``Key=Value`` pairs, and a value in
  double quotes may hold spaces;
* an unescaped ``#`` starts a comment; ``\\`` escapes the next character and,
  at a line's end, joins the next line;
* inside values, ``,`` ``:`` and ``(`` separate ``Gres=`` items, and ``[``
  ``]`` ``,`` are hostlist syntax in ``NodeName=`` and ``File=``.

A GPU name ``x\\nProlog=/tmp/evil.sh`` would therefore be a line of its own,
and since 24.05 a further ``Prolog=`` adds a script that runs as root on every
node.  So each value a template prints passes one of the checks below; any
other character, type or length is an :class:`UnsafeValue` that names the
value (escaped) and where it came from.  Slurm itself checks none of this
(it takes any non-space token), so the rules are ours, and strict:

* node names: RFC 1123 host name characters plus ``_``, 64 characters at most
  (``HOST_NAME_MAX``), starting with a letter or digit;
* GRES types: letters, digits and ``_ . + -`` (NVML names underscored, MIG
  profiles such as ``1g.10gb+me``), 96 at most (``NVML_DEVICE_NAME_V2_BUFFER_SIZE``);
* device files: an absolute path of letters, digits and ``_ . + - /``;
* numbers: Python ``int`` (never ``bool``), within a stated range;
* comment text: printed with every character outside printable ASCII escaped.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

from ..errors import InputError

NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SWITCH_NAME = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]{0,63}")
GRES_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,95}")
DEV_PATH = re.compile(r"/[A-Za-z0-9_.+/-]{0,4000}")
UUID = re.compile(r"[A-Za-z0-9-]{1,64}")
PCI_BUS_ID = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")
# What a hostlist may hold once folded (names above, plus [ ] , and ranges).
HOSTLIST = re.compile(r"[A-Za-z0-9._\-\[\],]{1,1000000}")
# One-line text for comments and messages: printable ASCII only.
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")
SHOWN = 80                  # characters of a refused value quoted in a message

MAX_MINOR = (1 << 20) - 1   # Linux: 20-bit minor numbers
MAX_INDEX = 1 << 22         # core, NUMA and instance ids: far above any machine
MAX_COUNT = (1 << 63) - 1   # Slurm's 64-bit counts (Count=, RealMemory=)


class UnsafeValue(InputError):
    """A model value that no Slurm config line may carry."""


def shown(value: Any) -> str:
    """*value* as one printable-ASCII piece of a message, cut at :data:`SHOWN` characters."""
    text = value if isinstance(value, str) else repr(value)
    cut = len(text) > SHOWN
    text = text[:SHOWN]
    out = ascii(text)[1:-1] if _UNPRINTABLE.search(text) or "\\" in text else text
    return f"'{out}'" + (f"... ({len(value) if isinstance(value, str) else '?'} characters)" if cut else "")


def comment(text: str, limit: int = 1000) -> str:
    """*text* for a ``# ...`` line: every character outside printable ASCII escaped, one line."""
    text = text[:limit]
    if _UNPRINTABLE.search(text):
        text = _UNPRINTABLE.sub(lambda m: ascii(m.group(0))[1:-1], text)
    return text


def _text(value: Any, rx: re.Pattern[str], what: str, rule: str, where: str | None) -> str:
    if not isinstance(value, str):
        raise UnsafeValue(f"{what} is not text: {shown(value)}", where)
    if not rx.fullmatch(value):
        raise UnsafeValue(f"{what} {shown(value)} {rule}", where)
    return value


# Words slurm.conf reads as keywords, in any letter case: ``NodeName=DEFAULT``
# sets the defaults of every later node line (read_config.c compares with
# xstrcasecmp), ``Nodes=ALL`` names every node.  A node published as one of
# them would rewrite other nodes' lines.
RESERVED_NODE_NAMES = frozenset({"default", "all"})
# GPUs one node model may carry: far above any machine (an HGX has 8, an NVL72
# tray 4), and it bounds the Links= matrix a render prints (N^2 per node).
MAX_GPUS = 256


def node_name(value: Any, where: str | None = None) -> str:
    """A Slurm node name (see the module docstring)."""
    name = _text(value, NODE_NAME, "node name", "is not a Slurm node name (letters, digits, '.', '_', '-'; "
                 "at most 64, starting with a letter or digit)", where)
    if name.lower() in RESERVED_NODE_NAMES:
        raise UnsafeValue(f"node name {shown(name)} is a slurm.conf keyword (NodeName=DEFAULT sets every "
                          "later node's defaults, ALL names every node)", where)
    return name


def switch_name(value: Any, where: str | None = None) -> str:
    """A ``SwitchName=``: as a node name, but tree.switch_name may start one with '.' or '_'."""
    return _text(value, SWITCH_NAME, "switch name", "is not a Slurm switch name", where)


def hostlist(value: Any, where: str | None = None) -> str:
    """A folded hostlist of :func:`node_name` names."""
    return _text(value, HOSTLIST, "host list", "has characters a hostlist cannot hold", where)


def gres_type(value: Any, what: str = "GRES type", where: str | None = None) -> str:
    """A GRES ``Type=`` (and the type in ``Gres=gpu:<type>:<n>``)."""
    return _text(value, GRES_TYPE, what, "has characters outside [A-Za-z0-9_.+-] or is over 96 long "
                 "(Slurm's parser splits on them; name it with --type-map)", where)


def dev_path(value: Any, what: str = "device file", where: str | None = None) -> str:
    """An absolute device path for ``File=``/``MultipleFiles=``."""
    return _text(value, DEV_PATH, what, "is not an absolute path of [A-Za-z0-9_.+/-]", where)


def uuid(value: Any, what: str, where: str | None = None) -> str:
    return _text(value, UUID, what, "is not a UUID (letters, digits and '-', at most 64)", where)


def bus_id(value: Any, where: str | None = None) -> str:
    return _text(value, PCI_BUS_ID, "PCI bus id", "is not a PCI bus id (DDDD:BB:DD.F)", where)


def number(value: Any, what: str, lo: int = 0, hi: int = MAX_COUNT, where: str | None = None) -> int:
    """An ``int`` (not a ``bool``, float or text) with ``lo <= value <= hi``."""
    if type(value) is not int or not lo <= value <= hi:
        raise UnsafeValue(f"{what} {shown(value)} is not a whole number from {lo} to {hi}", where)
    return value


def numbers(values: Iterable[Any], what: str, lo: int = 0, hi: int = MAX_INDEX,
            where: str | None = None) -> None:
    for v in values:
        number(v, what, lo, hi, where)


def line_text(value: Any, what: str, where: str | None = None, limit: int = 1000) -> str:
    """Free text the tools print on one line (a note): printable ASCII, *limit* long at most."""
    if not isinstance(value, str):
        raise UnsafeValue(f"{what} is not text: {shown(value)}", where)
    if len(value) > limit or _UNPRINTABLE.search(value):
        raise UnsafeValue(f"{what} {shown(value)} is not one line of printable ASCII "
                          f"(at most {limit} characters)", where)
    return value


_FABRIC_STATE = re.compile(r"[a-z_]{1,32}")


def check_node(name: Any, node: Any, where: str | None = None) -> None:
    """Every value of one node model that a generator prints or quotes (UnsafeValue otherwise).

    The GPU's NVML name is printed only as its GRES type, which
    :func:`slurm_gpu.confgen.gres.gres_records` checks once the type map
    and pci.ids have had their say; here it only has to be text.
    """
    node_name(name, where)
    number(node.memory_bytes, "memory size", where=where)
    if len(node.gpus) > MAX_GPUS:
        raise UnsafeValue(f"{len(node.gpus)} GPUs in one node model (at most {MAX_GPUS})", where)
    for n in node.notes:
        line_text(n, "hardware note", where)
    for g in node.gpus:
        bus = bus_id(g.pci_bus_id, where)
        gw = f"GPU {bus}"
        if g.minor is not None:
            number(g.minor, f"{gw}: minor number", 0, MAX_MINOR, where)
        if g.pci_device_id is not None:
            number(g.pci_device_id, f"{gw}: PCI device id", 0, 0xFFFF, where)
        if g.name is not None and not isinstance(g.name, str):
            raise UnsafeValue(f"{gw}: name is not text: {shown(g.name)}", where)
        numbers(g.cores, f"{gw}: core index", where=where)
        for link in g.nvlinks:
            number(link.links, f"{gw}: NVLink count", 0, 1 << 16, where)
        if g.mig_enabled is not None and type(g.mig_enabled) is not bool:
            raise UnsafeValue(f"{gw}: mig_enabled is not true or false: {shown(g.mig_enabled)}", where)
        for m in g.mig_instances:
            number(m.gi_id, f"{gw}: MIG GPU instance id", 0, MAX_INDEX, where)
            number(m.ci_id, f"{gw}: MIG compute instance id", 0, MAX_INDEX, where)
            gres_type(m.profile, f"{gw}: MIG profile", where)
            for cap in (m.gi_cap_minor, m.ci_cap_minor):
                if cap is not None:
                    number(cap, f"{gw}: MIG capability minor", 0, MAX_MINOR, where)
        if g.fabric is not None:
            check_fabric(g.fabric, gw, where)


def check_fabric(f: Any, gw: str, where: str | None = None) -> None:
    """The NVLink fabric values that name a block (topology.conf comments, notes)."""
    uuid(f.cluster_uuid, f"{gw}: fabric cluster UUID", where)
    number(f.clique_id, f"{gw}: fabric clique id", 0, (1 << 32) - 1, where)
    _text(f.state, _FABRIC_STATE, f"{gw}: fabric state", "is not a state word", where)
    number(f.status, f"{gw}: fabric status", -(1 << 31), (1 << 32) - 1, where)


# A finished config record: Key=Value pairs, one space between, values of
# printable ASCII without the characters Slurm's parser gives a meaning
# (whitespace, '#', '\\', quotes) and without '='.
_VALUE = r"[!$-&(-<>-\[\]-~]+"     # printable ASCII but space " # ' = \\
RECORD = re.compile(f"[A-Za-z]+={_VALUE}(?: [A-Za-z]+={_VALUE})*")


def record(line: str, what: str = "generated line") -> str:
    """*line* when it is one ``Key=Value ...`` record (UnsafeValue otherwise): the last gate."""
    if not RECORD.fullmatch(line):
        raise UnsafeValue(f"{what} {shown(line)} is not one Key=Value record of plain values")
    return line


def check_text(text: str, what: str) -> str:
    """A rendered file: printable ASCII and newlines only (UnsafeValue otherwise)."""
    m = re.search(r"[^\x20-\x7e\n]", text)
    if m:
        line = text.count("\n", 0, m.start()) + 1
        raise UnsafeValue(f"{what} line {line} holds {shown(m.group(0))}, which no config line may")
    return text
