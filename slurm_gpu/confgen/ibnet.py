"""Parser for ``ibnetdiscover`` topology dumps (pure: lines in, graph out).

The dump lists every InfiniBand node (``Switch``, ``Ca``, ``Rt``) with its
connected ports::

    Switch  65 "S-2c5eab0300b87b40"   # "MF0;A09-P1-IBLEAF-04-04:MQM9701/U1" enhanced port 0 lid 73 lmc 0
    [1]     "H-e09d7303007a4bd8"[1](e09d7303007a4bd8)   # "a08-p1-dgx-04-c01 mlx5_5" lid 647 4xNDR
    Ca      1 "H-e09d7303007a4bd8"    # "a08-p1-dgx-04-c01 mlx5_5"
    [1](e09d7303007a4bd8)   "S-2c5eab0300b87b40"[1]   # lid 647 lmc 0 "MF0;..." lid 73 4xNDR

Every link appears twice, once from each end.  A dump cut short (a copy
that stopped, a full disk) therefore shows up as a peer that is never
described or a link seen from one end only; both are reported with the
file and line, never turned into a silently smaller topology.

Besides the records, a dump as admins capture it may hold what ibnetdiscover
itself prints: its libraries' warnings when stderr was captured too (``2>&1``),
and the grouping headers of ``ibnetdiscover -g``.  Those lines, and only
those, are skipped, and :attr:`IbFabric.notes` says which were (see
``_MESSAGE`` and ``_GROUP_HEADER`` for where each comes from).
"""
from __future__ import annotations

import io
import re
from bisect import bisect_left
from dataclasses import dataclass
from functools import partial
from typing import Iterable, NamedTuple, TextIO

from ..errors import InputError
from ..gcpause import freeze_if_large, gc_paused

_NODE = re.compile(r'^(Switch|Ca|Rt)\s+(\d+)\s+"([^"\n]+)"(.*)$')
# Port numbers are read with int(): bounded, so a 5,000-digit one is an
# unreadable line (one error naming it), not a ValueError from int().
# ibnetdiscover -g prints a chassis port's front-panel number after its own:
# "[13][ext 1]" (out_switch_port, out_ext_port); the port number is the first.
_PORT = re.compile(r'^\[(\d{1,5})\](?:\[ext \d{1,5}\])?(?:\([0-9A-Fa-fx]+\))?\s+"([^"\n]+)"\[(\d{1,5})\]')
_QUOTED = re.compile(r'"([^"]*)"')
# A match's group is a new string each time: 825,000 records at 100,000
# hosts made as many copies of "Ca" and "Switch" (42 MB); each kind is kept once.
_KINDS = {k: k for k in ("Switch", "Ca", "Rt")}

# What ibnetdiscover prints that is not topology (linux-rdma/rdma-core @ 691953d8).
# Its stderr, which a capture with 2>&1 puts first: discovery ends before the
# (buffered) dump is written.  libibnetdisc's IBND_ERROR (libibnetdisc/internal.h)
# is "<__FILE__>:<__LINE__>; <message>", the messages those of ibnetdisc.c,
# query_smp.c and chassis.c; libibmad's and libibumad's IBWARN (libibmad/mad.h,
# libibumad/umad.c) is "ibwarn: [<pid>] <function>: <message>".  Printable
# ASCII only: no escape sequence reaches the note an admin reads.
_MESSAGE = re.compile(
    r"(?:[\w./+-]{0,200}/)?(?:ibnetdisc|query_smp|chassis)\.c:\d{1,6}; "
    r"(?:umad \(|mad \(|umad_recv failed|umad_init failed|can't open (?:UMAD|MAD) port|Failed to |"
    r"Duplicate (?:Node|Port): |Error Occurred when trying|Internal [Ee]rror|Invalid |OOM|add port |"
    r"send failed|mad_build_pkt failed|outstanding SMP's|Unexpected node found|"
    r"fill_mellanox_chassis_record: )[ -~]*"
    r"|ibwarn: \[\d{1,10}\] \w{1,64}: [ -~]*")
# ibnetdiscover -g (dump_topology, out_chassis): a chassis' first line, an Xsigo
# chassis' host name right after it, and the start of the switches in no chassis.
# "# Spine Nodes", "# Line Nodes", "# Chassis Switches", "# Chassis CAs" are comments.
_GROUP_HEADER = re.compile(r"Chassis \d{1,5}(?: \(guid 0x[0-9a-f]{1,16}\))?|Non-Chassis Nodes")
_XSIGO_HOSTNAME = re.compile(r"Hostname: [ -~]{1,200}")
# Output of other ibnetdiscover modes, which has no topology records:
# dump_ports_report() (-p) "%2s %5d %2d 0x%016x ...", list_node() (-l/-H/-S/-R)
# "%s\t : 0x%016x ports %d ...", and ibexit() (infiniband-diags/ibdiag_common.c)
# "<prog>: iberror: ..." before ibnetdiscover exits with an error.
_OTHER_MODES = (
    (re.compile(r"(?:SW|CA|RT) +\d{1,5} +\d{1,3} 0x[0-9a-f]{16} "),
     "this is `ibnetdiscover -p` (ports report) output, which has no topology records; "
     "run ibnetdiscover without -p"),
    (re.compile(r"(?:Switch|Ca|Router|\?\?\?)\t : 0x[0-9a-f]{16} ports \d+ "),
     "this is `ibnetdiscover -l` (node list) output, which has no links; "
     "run ibnetdiscover without -l, -H, -S or -R"),
)
_HEADER = re.compile(r"[A-Za-z]\w*=")
_BLANKS = re.compile(r"(?:[ \t]*\n)*")
_IBERROR = re.compile(r"[\w.-]{1,64}: iberror: ")


Port = tuple[int, str, int]     # (port, peer id, peer port)


class IbNode(NamedTuple):
    """One InfiniBand node (switch, channel adapter or router)."""

    id: str                      # ibnetdiscover's quoted id, e.g. "S-2c5eab0300b87b40"
    kind: str                    # "Switch", "Ca" or "Rt"
    desc: str                    # node description (first quoted string after '#')
    ports: tuple[Port, ...]      # connected ports, by port number, each listed once

    def port(self, number: int) -> Port | None:
        """The connected port *number*, or None."""
        return _find(self.ports, number)


def _find(ports: tuple[Port, ...], number: int) -> Port | None:
    # Ports are usually numbered 1..n with none missing: try there first.
    if 0 < number <= len(ports):
        p = ports[number - 1]
        if p[0] == number:
            return p
    i = bisect_left(ports, (number,))
    return ports[i] if i < len(ports) and ports[i][0] == number else None


@dataclass
class IbFabric:
    nodes: dict[str, IbNode]
    source: str
    notes: tuple[str, ...] = ()   # what of ibnetdiscover's own output was skipped


Skipped = list[tuple[int, str]]   # (line number, line) of a message or -g header skipped


# A fabric of 100,000 hosts is 825,000 nodes and 2.4 million ports, all kept
# while the tree is built, so they are kept small: nodes are tuples, not
# dataclass instances, and a node's ports one tuple, not a dict (an adapter's
# was 224 bytes).  Line numbers serve only the messages about a broken dump
# (3.2 million ints, and the counting): the fast reader below keeps none.  A
# dump it cannot read, or whose links do not hold, is read again by the
# careful reader, which keeps them and names the line.

# Fast path: one regex pass over the whole text, a match per record (blank
# and comment lines before it, header lines, node line, first port line,
# other port lines), so a 650,000-line dump costs one short Python step per
# node, not per line, and the usual adapter record (one port) needs no other
# call.  Records must follow each other with nothing between; anything it
# does not recognise is handed to the line-by-line reader below, which names
# the exact line.
_SKIP = re.compile(r"(?:[ \t]*\n|#[^\n]*\n)*")
_PORT_TEXT = r'\[(\d{1,5})\](?:\[ext \d{1,5}\])?(?:\([0-9A-Fa-fx]+\))?[ \t]+"([^"\n]+)"\[(\d{1,5})\]'
_RECORD = re.compile(r'(?:[ \t]*\n|#[^\n]*\n)*(?:[A-Za-z]\w*=[^\n]*\n)*'
                     r'(Switch|Ca|Rt)[ \t]+\d+[ \t]+"([^"\n]+)"'
                     # the description: the first quoted string after the first '#'
                     r'(?:[^#\n]*#[^"\n]*"([^"\n]*)")?[^\n]*\n'
                     r'(?:' + _PORT_TEXT + r'[^\n]*\n((?:\[[^\n]*\n)*))?')
_PORTS = re.compile(r'^' + _PORT_TEXT + r'[^\n]*$', re.M)


def parse(lines: Iterable[str] | str, source: str = "<ibnetdiscover>") -> IbFabric:
    """Parse a dump; raise :class:`InputError` naming ``source:line`` on bad or truncated input."""
    text = lines if isinstance(lines, str) else "".join(lines)
    fabric = read_fast(text, source)
    if fabric is None or not links_hold(fabric.nodes):
        return read_careful(text, source)
    return fabric


# The readers parse() and parse_file() are made of.  The careful one is the
# reference; each fast one must read a dump as it does, or decline it, and
# parse() alone runs only one of them for a given text: so each is public,
# for tests that hold them to one another and for bench_confgen.

def read_fast(text: str, source: str = "<ibnetdiscover>") -> IbFabric | None:
    """The fast reader (one regex pass over *text*): the fabric, or None where it
    declines (then :func:`read_careful` reads it and names what is wrong).

    It reads past the libraries' warnings a ``2>&1`` capture puts first and
    ``ibnetdiscover -g`` headers, and names both in ``notes`` as the careful
    reader does.  It keeps no line numbers and does not check the links:
    :func:`parse` checks them with :func:`links_hold`.
    """
    start, skipped = _head(text)
    headers: list[int] = []
    nodes: dict[str, IbNode] = {}
    end = _read_into(nodes, text, start, headers)
    if end is None or not _complete(nodes, text, end):
        return None
    _add_headers(skipped, text, headers, 0, 0)
    return IbFabric(nodes, source, _notes(source, skipped))


def read_sliced(slices: Iterable[str], source: str = "<ibnetdiscover>") -> IbFabric | None:
    """The fast reader over a text given in consecutive slices, as :func:`parse_file`
    reads one: the fabric, or None where it declines.  Links are not checked."""
    skipped: Skipped = []
    nodes = _parse_slices(slices, skipped)
    return None if nodes is None else IbFabric(nodes, source, _notes(source, skipped))


def read_careful(lines: Iterable[str] | str, source: str = "<ibnetdiscover>") -> IbFabric:
    """The careful reader: line by line (a text is split at newlines only, as
    ``grep -n`` counts), naming the first line it cannot read and the line of
    a link seen from one end only."""
    return _parse_lines(_lines(lines) if isinstance(lines, str) else lines, source)


def _add_headers(skipped: Skipped, text: str, offsets: list[int], at: int, line: int) -> None:
    """Add the -g headers at *offsets* of *text* to *skipped* with their line numbers.

    *at* is an offset of *text* known to start line *line* + 1; each count
    goes on from the last header, so the text is counted at most once.
    """
    for off in offsets:
        line += text.count("\n", at, off)
        at = off
        skipped.append((line + 1, text[off:text.index("\n", off)]))


def _head(text: str, first_line: int = 1) -> tuple[int, Skipped]:
    """Where the records start after the libraries' warnings a ``2>&1`` capture put first, and those lines.

    (0, []) when the text starts with no warning: blank lines alone are the
    records' reader's to judge.
    """
    pos = 0
    skipped: Skipped = []
    no = first_line - 1
    while True:
        blanks = _BLANKS.match(text, pos).end()     # runs of blank lines in one step
        no += text.count("\n", pos, blanks)
        pos = blanks
        end = text.find("\n", pos)
        if end < 0:
            break                 # an unfinished line is no whole message
        line = text[pos:end]
        if not _MESSAGE.fullmatch(line):
            break
        no += 1
        skipped.append((no, line))
        pos = end + 1
    return (pos, skipped) if skipped else (0, [])


def _notes(source: str, skipped: Skipped) -> tuple[str, ...]:
    """One note naming what of ibnetdiscover's own output was skipped (none when nothing was)."""
    if not skipped:
        return ()
    parts: list[str] = []
    warnings = [(no, line) for no, line in skipped if _MESSAGE.fullmatch(line)]
    if warnings:
        first, last = warnings[0][0], warnings[-1][0]
        shown = warnings[0][1][:160]
        parts.append(f"lines {first}-{last} (libibnetdisc/libibmad warnings printed before the dump: "
                     f"'{shown}' ...)" if len(warnings) > 1 else
                     f"line {first} (a libibnetdisc/libibmad warning printed before the dump: '{shown}')")
    headers = [(no, line) for no, line in skipped if not _MESSAGE.fullmatch(line)]
    parts += [f"line {no} ('{line}', ibnetdiscover -g)" for no, line in headers[:5]]
    if len(headers) > 5:
        parts.append(f"and {len(headers) - 5} more -g headers")
    n = len(skipped)
    return (f"{source}: skipped {n} line{'s' if n > 1 else ''} of ibnetdiscover's own output that "
            f"{'are' if n > 1 else 'is'} not topology: " + ", ".join(parts),)


def _lines(text: str) -> Iterable[str]:
    """*text*'s lines, broken at newlines only, as the fast reader and ``grep -n`` count them."""
    # str.splitlines() also breaks at \f, \x1c, \u2028...: a description
    # holding one would shift the line of every later message.
    return io.StringIO(text, newline="\n")


def _parse_slices(slices: Iterable[str], skipped: Skipped | None = None) -> dict[str, IbNode] | None:
    """The fast reader over a text given in consecutive slices, as read from a file.

    Each slice is read up to its last blank line (no record holds one, so
    every record ends before it); what follows waits for the next slice.  A
    record cut anywhere else, or a node-like text in a comment found before
    its record, is something between two records: None, and parse_file
    reads the whole text again.  What of ibnetdiscover's own output is
    skipped (the libraries' warnings first, :func:`_head`; -g headers) is
    added to *skipped*.
    """
    nodes: dict[str, IbNode] = {}
    if skipped is None:
        skipped = []
    head = True                   # only warnings and blank lines read so far
    # -g headers are read here only where their line numbers are known: lines
    # are counted while they may come.  A -g dump prints one before its first
    # record, and "Non-Chassis Nodes" is its last; any other is the careful
    # reader's to judge.
    counting = True
    lines_before = 0              # lines before *text*, while counting

    def read(text: str, start: int) -> int | None:
        nonlocal counting, lines_before
        had = bool(nodes)
        offsets: list[int] | None = [] if counting else None
        pos = _read_into(nodes, text, start, offsets)
        if pos is None:
            return None
        if offsets:
            _add_headers(skipped, text, offsets, 0, lines_before)
            counting = not any(text.startswith("Non-Chassis Nodes", o) for o in offsets)
        elif nodes and not had:
            counting = False      # records without a header before them: no -g dump
        if counting:
            lines_before += text.count("\n", 0, pos)
        return pos

    pending: list[str] = []
    for piece in slices:
        cut = piece.rfind("\n\n") + 1
        if not cut:
            pending.append(piece)
            continue
        pending.append(piece[:cut])
        text = "".join(pending)
        start = 0
        if head:
            start, more = _head(text, lines_before + 1)
            skipped += more
            if more and start == len(text):
                lines_before += text.count("\n")   # still warnings: the records start in a later slice
                pending = [piece[cut:]]
                continue
            head = False
        pos = read(text, start)
        if pos is None:
            return None
        pending = [text[pos:], piece[cut:]]
    text = "".join(pending)
    start = 0
    if head:
        start, more = _head(text, lines_before + 1)
        skipped += more
    pos = read(text, start)
    return nodes if pos is not None and _complete(nodes, text, pos) else None


def _complete(nodes: dict[str, IbNode], text: str, pos: int) -> bool:
    """At least one record, and nothing but blank and comment lines after the last one."""
    return bool(nodes) and _SKIP.match(text, pos).end() == len(text)


def _read_into(nodes: dict[str, IbNode], text: str, start: int = 0,
               headers: list[int] | None = None) -> int | None:
    """Add the records that fill *text* from *start* to *nodes*; where the last one ends.

    None for something between two records, an id seen before, an
    unreadable port line or ports not listed in increasing order (never so
    in ibnetdiscover's output; the careful reader sorts them).  With
    *headers*, ``ibnetdiscover -g`` headers between records are read past
    as the careful reader does, and their offsets in *text* added to it.
    """
    pos = start
    fresh = not nodes            # no record before *start*: a header needs no blank line before it
    ports_re = _PORTS.findall
    kinds = _KINDS
    new = tuple.__new__
    for r in _RECORD.finditer(text, start):
        if r.start() != pos and (headers is None or not _group_gap(text, pos, r.start(), fresh and pos == start,
                                                                     headers)):
            return None          # something between two records: the careful reader names it
        pos = r.end()
        kind, nid, desc, port, peer, peer_port, more = r.groups()
        if nid in nodes:
            return None
        if port is None:
            ports: tuple[Port, ...] = ()
        elif not more:
            ports = ((int(port), peer, int(peer_port)),)
        else:
            found = ports_re(more)
            if len(found) != more.count("\n"):
                return None
            last = int(port)
            listed = [(last, peer, int(peer_port))]
            for p, pe, pp in found:
                number = int(p)
                if number <= last:
                    return None
                last = number
                listed.append((number, pe, int(pp)))
            ports = tuple(listed)
        nodes[nid] = new(IbNode, (nid, kinds[kind], desc or "", ports))
    return pos


def _group_gap(text: str, at: int, end: int, blank: bool, headers: list[int]) -> bool:
    """Whether text[at:end], between two records, is blank lines, comments and -g headers (added to *headers*).

    The careful reader's rule: a header only after a blank line (*blank*:
    no record line before *at*), and an Xsigo ``Hostname:`` only right after
    a chassis header.
    """
    if text[end - 1] != "\n" and text[end] != "\n":
        return False             # a record starts inside a line
    # (a record's match may start with the newline that ends the gap's last line)
    chassis = False
    while at < end:
        eol = text.index("\n", at)
        line = text[at:eol]
        stripped = line.strip()
        if not stripped:
            blank = True
        elif stripped[0] != "#":
            if not blank or not (_GROUP_HEADER.fullmatch(line) or
                                 (chassis and _XSIGO_HOSTNAME.fullmatch(line))):
                return False
            headers.append(at)
            chassis = line.startswith("Chassis")
        at = eol + 1
    return True


def _parse_lines(lines: Iterable[str], source: str) -> IbFabric:
    """The careful reader: line by line, naming the first line it cannot read."""
    # id -> (kind, desc, port -> Port): a port listed twice keeps its last line.
    found: dict[str, tuple[str, str, dict[int, Port]]] = {}
    node_lines: dict[str, int] = {}
    port_lines: dict[tuple[str, int], int] = {}
    cur: str | None = None
    pending_header = 0           # line of a vendid=/...guid= header not yet followed by its node
    last_no = 0
    last_text = ""
    skipped: Skipped = []        # ibnetdiscover's own lines that are not topology
    head = True                  # nothing but blank lines and the libraries' warnings so far
    after_chassis = False        # the last line that was not blank is a "Chassis N" header
    for no, raw in enumerate(lines, 1):
        last_no, last_text = no, raw
        line = raw.strip()
        if not line:
            cur = None
            continue
        if head:
            # the warnings of a 2>&1 capture come first, whole lines only
            if raw.endswith("\n") and _MESSAGE.fullmatch(raw.rstrip("\n")):
                skipped.append((no, raw.rstrip("\n")))
                continue
            head = False
        c = line[0]
        if c == "#":
            continue
        if cur is None and not pending_header and raw.endswith("\n"):
            # ibnetdiscover -g headers, between records only
            bare = raw.rstrip("\n")
            if _GROUP_HEADER.fullmatch(bare) or (after_chassis and _XSIGO_HOSTNAME.fullmatch(bare)):
                skipped.append((no, bare))
                after_chassis = bare.startswith("Chassis")
                continue
        after_chassis = False
        if c == "[":
            if cur is None:
                raise InputError("ibnetdiscover dump: port line outside a node record", f"{source}:{no}")
            m = _PORT.match(line)
            if m is None:
                raise InputError(_bad(raw, "unreadable port line"), f"{source}:{no}")
            port = int(m.group(1))
            found[cur][2][port] = (port, m.group(2), int(m.group(3)))
            port_lines[(cur, port)] = no
            continue
        m = _NODE.match(line)
        if m is not None:
            rest = m.group(4)
            hash_at = rest.find("#")
            q = _QUOTED.search(rest, hash_at) if hash_at >= 0 else None
            nid = m.group(3)
            if nid in found:
                raise InputError(f"ibnetdiscover dump: node {nid} described twice", f"{source}:{no}")
            found[nid] = (_KINDS[m.group(1)], q.group(1) if q else "", {})
            cur = nid
            node_lines[nid] = no
            pending_header = 0
            continue
        if _HEADER.match(line):
            # vendid=, devid=, sysimgguid=, switchguid=, caguid=, rtguid= (the fast reader's rule)
            if not pending_header:
                pending_header = no
            continue
        raise InputError(_bad(raw, _unreadable(line)), f"{source}:{no}")
    if last_no == 0:
        raise InputError("ibnetdiscover dump is empty", source)
    if not found and skipped and head:
        raise InputError("ibnetdiscover dump holds no topology: only ibnetdiscover's own messages", source)
    if pending_header:
        raise InputError("truncated ibnetdiscover dump: ends inside a node record", f"{source}:{pending_header}")
    if last_text and not last_text.endswith("\n") and last_text.strip().startswith("["):
        # A cut in the middle of a port line can still match the regex.
        raise InputError("truncated ibnetdiscover dump: last line is incomplete", f"{source}:{last_no}")
    nodes = {nid: IbNode(nid, kind, desc, tuple(sorted(ports.values())))
             for nid, (kind, desc, ports) in found.items()}
    broken = _broken_link(nodes)
    if broken is not None:
        message, nid, port = broken
        line_no = node_lines[nid] if port is None else port_lines[(nid, port)]
        raise InputError(message, f"{source}:{line_no}")
    return IbFabric(nodes, source, _notes(source, skipped))


def _unreadable(line: str) -> str:
    """What a line no record holds is: another ibnetdiscover mode's output, its error, or unreadable."""
    for pattern, what in _OTHER_MODES:
        if pattern.match(line):
            return what
    if _IBERROR.match(line):
        shown = "".join(c if " " <= c <= "~" else "?" for c in line[:160])
        return f"ibnetdiscover failed here ('{shown}')"
    return "unreadable line"


def _bad(raw: str, what: str) -> str:
    # A line without its newline is where a copy stopped.
    if not raw.endswith("\n"):
        return "truncated ibnetdiscover dump: last line is incomplete"
    return f"ibnetdiscover dump: {what}"


def links_hold(nodes: dict[str, IbNode]) -> bool:
    """Whether every link is seen from both ends, each port's peer naming it back
    (the rule whose first break :func:`read_careful` names with its line)."""
    return _links_mirror(nodes) or _broken_link(nodes) is None


def _links_mirror(nodes: dict[str, IbNode]) -> bool:
    """Whether every port's peer port names it back; each link looked at once, from its lower end.

    The rule a dump must keep (:func:`_broken_link`) only asks that a
    port's peer name this node back.  A dump that passes this stricter test
    keeps it: each mirrored pair covers two ports, no port is in two pairs,
    and the pairs count every port.  It costs half the lookups; a dump
    that fails it is judged by the rule itself.
    """
    get = nodes.get
    pairs = 0
    ports_seen = 0
    for nid, n in nodes.items():
        ports_seen += len(n.ports)
        for port, peer, pport in n.ports:
            if peer > nid or (peer == nid and pport > port):
                p = get(peer)
                if p is None:
                    return False
                theirs = p.ports
                # _find, inlined: 1.2 million lookups at 100,000 hosts
                if 0 < pport <= len(theirs) and theirs[pport - 1][0] == pport:
                    back: Port | None = theirs[pport - 1]
                else:
                    back = _find(theirs, pport)
                if back is None or back[1] != nid or back[2] != port:
                    return False
                pairs += 1
    return 2 * pairs == ports_seen


def _broken_link(nodes: dict[str, IbNode]) -> tuple[str, str, int | None] | None:
    """The first link seen from one end only: (message, node id, port); the line to name is
    that port's, or the node's when port is None."""
    get = nodes.get
    for nid, n in nodes.items():
        for port, peer, pport in n.ports:
            p = get(peer)
            if p is None:
                return (f"truncated ibnetdiscover dump: {peer} (linked from {nid} port {port}) "
                        "is never described", nid, port)
            back = p.port(pport)
            if back is None or back[1] != nid:
                return (f"truncated ibnetdiscover dump: {peer} port {pport} does not link back to "
                        f"{nid} port {port}", peer, None)
    return None


def parse_file(path: str, slice_chars: int | None = None) -> IbFabric:
    """Read and parse a dump file (the one I/O helper here; front ends call it).

    A seekable file is read *slice_chars* characters at a time (default
    :data:`SLICE_CHARS`), and read again whole where the slices decline.
    """
    # A 10,000-node fabric is ~100,000 nodes and ports that all survive the
    # parse; frozen, the passes while the tree is built and rendered skip it.
    try:
        with gc_paused(), open(path, encoding="utf-8", errors="replace") as f:
            fabric = _read_file(f, path, SLICE_CHARS if slice_chars is None else slice_chars)
    except OSError as e:
        raise InputError(f"cannot read ibnetdiscover dump: {e.strerror}", path) from None
    freeze_if_large(len(fabric.nodes), 1000)
    return fabric


# parse_file reads the dump in slices of this many characters.  The whole
# text at 100,000 hosts is 250 MB, held twice while it is read (bytes and
# decoded): ~120,000 fresh pages, which cost ~9 us each rather than ~2 while
# the snapshots just read fill the page cache.  A slice this small stays
# under glibc's mmap threshold, so each one reuses the last one's memory.
SLICE_CHARS = 1 << 16


def _read_file(f: TextIO, source: str, slice_chars: int) -> IbFabric:
    """Parse an open dump: the fast reader slice by slice; the whole text again when it declines."""
    if f.seekable():
        fabric = read_sliced(iter(partial(f.read, slice_chars), ""), source)
        if fabric is not None and links_hold(fabric.nodes):
            return fabric
        f.seek(0)
        if fabric is not None:
            return read_careful(f, source)   # read, but a link is broken: this names its line
    return parse(f.read(), source)
