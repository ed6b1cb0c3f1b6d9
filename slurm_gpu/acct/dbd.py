"""The job summary in slurmdbd: the ``slurm-gpu:`` part of the job's AdminComment.

Why ``sacctmgr modify job`` (tested on Slurm 22.05, 24.11 and 26.05, docs/accounting.md):
the epilog runs after the job ended in slurmctld (state COMPLETING), and
``scontrol update job AdminComment=`` then answers "Job has already
finished"; so does it from EpilogSlurmctld.  ``sacctmgr -i modify job where
jobid=ID set AdminComment=...`` writes the stored record directly and works
from any host where sacctmgr can reach slurmdbd as root (or a Slurm
operator).  sacctmgr stores the value with every quote turned into a
backtick, and before Slurm 23.02 lower-cased too (SchedMD commit 933bf55,
bug 14338; measured: 22.05.8 lowers it, 24.11.5 and 26.05.5 keep it), so:

* our part is written in a form that survives that: ``slurm-gpu:`` followed
  by a JSON object whose quotes are backticks (all keys and values are lower
  case); :func:`parse` turns the backticks back;
* another tool's text is kept as it is, our part appended after a space;
  text that sacctmgr would alter (quotes; upper case where sacctmgr is
  older than 23.02) is never rewritten: the summary is then kept on the
  node and the job report says why.

Each node of a job writes its own key of the object (read, merge, write,
read back).  Two nodes racing lose one write; the read-back sees it and the
summary stays pending on that node until a later retry confirms it.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import SlurmGpuError
from ..runner import run

KEY = "slurm-gpu:"
_DECODER = json.JSONDecoder()


# The first Slurm whose sacctmgr stores AdminComment's case as given.
KEEPS_CASE_SINCE = (23, 2)


def sacctmgr_form(text: str, keeps_case: bool = False) -> str:
    """What sacctmgr stores when asked to store *text* (*keeps_case*: Slurm 23.02+)."""
    return (text if keeps_case else text.lower()).replace('"', "`").replace("'", "`")


def encode(parts: Mapping[str, Any]) -> str:
    # Always lower case: one stored form, whichever sacctmgr wrote it.
    return KEY + sacctmgr_form(json.dumps(dict(parts), separators=(",", ":"), sort_keys=True))


def sacctmgr_keeps_case(sacctmgr: str, timeout: float, env: Mapping[str, str] | None = None) -> bool:
    """Whether this sacctmgr stores AdminComment's case as given (``sacctmgr -V``
    says 23.02 or later).  Unknown counts as no: another tool's text is then
    left alone rather than lower-cased."""
    try:
        res = run([sacctmgr, "-V"], timeout, check=False, env=env)
    except SlurmGpuError:
        return False
    m = re.search(r"(\d+)\.(\d+)", res.stdout if res.returncode == 0 else "")
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= KEEPS_CASE_SINCE


def split(comment: str) -> tuple[str, dict[str, Any] | None]:
    """(the other tools' text, our object or None) of an AdminComment.

    The comment is anyone's text: a value that does not decode (nested too
    deep included) is not ours, and of ours only what :func:`clean` keeps is
    returned.
    """
    i = comment.find(KEY)
    tries = 0
    while i >= 0 and tries < 16:
        tries += 1
        rest = comment[i + len(KEY):]
        try:
            obj, end = _DECODER.raw_decode(rest.replace("`", '"'))
        except (ValueError, RecursionError):
            i = comment.find(KEY, i + 1)
            continue
        if isinstance(obj, dict):
            other = (comment[:i].rstrip() + " " + rest[end:].lstrip()).strip()
            return other, clean(obj)
        i = comment.find(KEY, i + 1)
    return comment.strip(), None


# What a summary may hold (aggregate.summary): anything else in a stored
# comment is dropped, so a report never prints a forged line or trips on a type.
_NODE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_DEVICE = re.compile(r"[0-9]{1,4}(?:/gi[0-9]{1,3})?")
_DEVICE_NUMBERS = ("sm", "smx", "mem", "idle", "n", "j", "s", "mt", "fr", "leak", "sh")
_PART_NUMBERS = ("v", "iv", "nosamples", "trunc")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def clean(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Our object with only well-formed node parts and device figures."""
    out: dict[str, Any] = {}
    for node, part in obj.items():
        if not (isinstance(node, str) and _NODE.fullmatch(node) and isinstance(part, dict)):
            continue
        p: dict[str, Any] = {k: part[k] for k in _PART_NUMBERS if _number(part.get(k))}
        devs = part.get("dev")
        p["dev"] = {}
        for key, d in (devs.items() if isinstance(devs, dict) else ()):
            if isinstance(key, str) and _DEVICE.fullmatch(key) and isinstance(d, dict):
                c = {k: d[k] for k in _DEVICE_NUMBERS if _number(d.get(k))}
                xids = d.get("xid")
                if isinstance(xids, list):
                    c["xid"] = [int(x) for x in xids[:8] if _number(x) and 0 <= x < 1000]
                p["dev"][key] = c
        held = part.get("held")
        if isinstance(held, list):
            p["held"] = [k for k in held if isinstance(k, str) and _DEVICE.fullmatch(k)]
        out[node] = p
    return out


def parse(comment: str) -> dict[str, Any] | None:
    """Our object (node -> summary part) in an AdminComment, or None."""
    return split(comment)[1]


def merged(comment: str, node: str, part: Mapping[str, Any], keeps_case: bool = False) -> str | None:
    """The AdminComment with this node's part set, or None when writing it
    through sacctmgr would alter another tool's text."""
    other, ours = split(comment)
    if other and sacctmgr_form(other, keeps_case) != other:
        return None
    ours = dict(ours or {})
    ours[node.lower()] = part
    return (other + " " if other else "") + encode(ours)


@dataclass(frozen=True)
class Outcome:
    stored: bool
    why: str = ""             # when not stored
    final: bool = False       # not worth retrying (another tool's text would be altered)


def delimiter() -> str:
    """A field delimiter for ``sacct -P --delimiter``, new for each call.

    AdminComment is printed as stored, newlines included: with ``|`` a
    comment holding a newline and a line of ``|``-separated fields would
    read as a record of its own.  A delimiter nobody can guess is in no
    comment, so a line that lacks it continues the record before it.
    """
    return f"|sg{os.urandom(8).hex()}|"      # not secrets: it costs a report ~30 ms of imports


def records(text: str, delim: str, nfields: int) -> list[list[str]]:
    """sacct ``-n -P --delimiter DELIM`` output -> records of *nfields* fields;
    a line without the delimiter continues the last field (AdminComment, last)."""
    out: list[list[str]] = []
    for line in text.split("\n"):
        parts = line.split(delim)
        if len(parts) == nfields:
            out.append(parts)
        elif len(parts) == 1 and out:
            out[-1][-1] += "\n" + line
        # else: not a record of ours (a stray line before the first record)
    if out and text.endswith("\n") and out[-1][-1].endswith("\n"):
        out[-1][-1] = out[-1][-1][:-1]
    return out


def read_comment(sacct: str, jobid: str, timeout: float, env: Mapping[str, str] | None = None) -> str | None:
    """The job's AdminComment as slurmdbd has it; None when the job is not (yet) there."""
    d = delimiter()
    res = run([sacct, "-n", "-P", "--delimiter", d, "-X", "-j", jobid, "-o", "JobIDRaw,AdminComment"],
              timeout, check=False, env=env)
    if res.returncode != 0:
        raise SlurmGpuError(f"sacct failed: {(res.stderr or res.stdout).strip()[:200]}", "slurmdbd")
    last = None
    for jid, comment in records(res.stdout, d, 2):
        if jid == jobid:
            last = comment        # a requeued job has several records: the newest is last
    return last


def store(settings: Any, jobid: str, node: str, part: Mapping[str, Any],
          env: Mapping[str, str] | None = None) -> Outcome:
    """Merge this node's *part* into the job's AdminComment; read back to confirm."""
    t = settings.dbd_timeout
    try:
        current = read_comment(settings.sacct, jobid, t, env)
        if current is None:
            return Outcome(False, "job not in slurmdbd yet")
        value = merged(current, node, part)
        if value is None and merged(current, node, part, keeps_case=True) is not None:
            # Only upper case stood in the way: asked only then, which sacctmgr this is.
            if sacctmgr_keeps_case(settings.sacctmgr, t, env):
                value = merged(current, node, part, keeps_case=True)
        if value is None:
            return Outcome(False, "AdminComment holds text that sacctmgr would alter", final=True)
        want = (parse(value) or {}).get(node.lower())
        if (parse(current) or {}).get(node.lower()) != want:
            res = run([settings.sacctmgr, "-i", "modify", "job", "where", f"jobid={jobid}", "set",
                       f"AdminComment={value}"], t, check=False, env=env)
            if res.returncode != 0:
                return Outcome(False, f"sacctmgr: {(res.stderr or res.stdout).strip()[:200]}")
            back = read_comment(settings.sacct, jobid, t, env)
            if (parse(back or "") or {}).get(node.lower()) != want:
                return Outcome(False, "not confirmed on read-back (a concurrent write?)")
        return Outcome(True)
    except SlurmGpuError as e:
        return Outcome(False, e.what)
