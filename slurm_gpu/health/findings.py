"""What every check returns: findings, and the node status they add up to.

The ``--json`` output is a contract (issue 5)::

    {"node": str, "status": "ok"|"warn"|"drain",
     "findings": [{"check", "severity": "info"|"warn"|"drain", "gpu": <bus id|null>,
                   "xid": <int, XID findings only>,
                   "not_applicable": true (only on a check that does not apply here), "message"}]}

A check that does not apply to this node (no NVSwitch, no InfiniBand, no
node-wide IMEX) says so with one ``info`` finding marked not applicable: it
never drains, and a reader sees the check ran rather than passed.

Exit codes follow Nagios: 0 ok, 1 warn, 2 drain (critical), 3 unknown.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

INFO, WARN, DRAIN = "info", "warn", "drain"
_RANK = {INFO: 0, WARN: 1, DRAIN: 2}

EXIT_OK, EXIT_WARN, EXIT_CRITICAL, EXIT_UNKNOWN = 0, 1, 2, 3
# A --slurm run not started by slurmd (xid-watch's, an admin's) that left at
# once because slurmd's run holds the node: nothing checked, ask again soon
# (sysexits' EX_TEMPFAIL).  slurmd's own runs still exit 0 then: slurmd logs
# any other code as "error: health_check failed".
EXIT_SKIPPED = 75


@dataclass(frozen=True)
class Finding:
    """One observation by one check (``check`` is its dotted name)."""

    check: str
    severity: str
    message: str
    gpu: str | None = None     # PCI bus id, 0000:07:00.0
    xid: int | None = None
    # The fault kills or hangs whatever runs on this GPU (the catalog's "job"
    # column, a lost GPU, a double-bit ECC event): [health] on_fatal acts on
    # the jobs holding it.  Not part of the --json contract, nor of equality.
    fatal: bool = field(default=False, compare=False)
    applicable: bool = True

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"check": self.check, "severity": self.severity, "gpu": self.gpu}
        if self.xid is not None:
            d["xid"] = self.xid
        if not self.applicable:
            d["not_applicable"] = True
        d["message"] = self.message
        return d

    @property
    def rank(self) -> int:
        return _RANK[self.severity]


def not_applicable(check: str, why: str) -> Finding:
    """The one finding of a check that does not apply here (info: never drains)."""
    return Finding(check, INFO, f"not applicable: {why}", applicable=False)


def worst(findings: Iterable[Finding]) -> str:
    """The node status: the most severe finding (``info`` findings leave it ``ok``)."""
    r = max((f.rank for f in findings), default=0)
    return {0: "ok", 1: "warn", 2: "drain"}[r]


def exit_code(status: str) -> int:
    return {"ok": EXIT_OK, "warn": EXIT_WARN, "drain": EXIT_CRITICAL}.get(status, EXIT_UNKNOWN)


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Most severe first, then by check name, GPU and message, so the drain
    reason is stable: it does not follow which source (a counter, an NVML
    event, a kernel line) was read first."""
    return sorted(findings, key=lambda f: (-f.rank, f.check, f.gpu or "", f.xid or 0, f.message))


def drain_reason(findings: Iterable[Finding], limit: int = 200) -> str | None:
    """``slurm-gpu: <check>: <detail>`` for the first drain finding, or None."""
    drains = [f for f in sort_findings(findings) if f.severity == DRAIN]
    if not drains:
        return None
    f = drains[0]

    # "+N more" counts faults, not the sources that saw them: an NVML ECC
    # event and the ECC counter on one GPU are one fault, and whether
    # xid-watch's event was read before this run must not change the reason.
    # A finding with no GPU (an InfiniBand port, a service) is known by its
    # words, as they are printed (spaces collapsed).
    def fault(d: Finding) -> tuple[str, str | None, int | None, str]:
        return d.check, d.gpu, d.xid, " ".join(d.message.split()) if d.gpu is None else ""

    more = len({fault(d) for d in drains} - {fault(f)})
    suffix = f" (+{more} more)" if more else ""
    # Slurm stores reasons verbatim; keep them one short line without '='
    # surprises for `scontrol show node` readers.  A cut falls in the first
    # fault's words, never on the count.
    reason = " ".join(f"slurm-gpu: {f.check}: {f.message}".split())
    if len(reason) + len(suffix) > limit:
        reason = reason[: limit - 3 - len(suffix)] + "..."
    return reason + suffix
