"""Facts from /proc: process identities and the boot."""
from __future__ import annotations

import os


def parent_slurmd(max_depth: int = 3) -> str | None:
    """``pid:starttime`` of the slurmd that started us (HealthCheckProgram), else None.

    Looks a few generations up, so a wrapper script that runs us as a child
    instead of exec'ing still counts.
    """
    pid = os.getppid()
    for _ in range(max_depth):
        if pid <= 1:
            return None
        try:
            with open(f"/proc/{pid}/stat") as f:
                head, _, rest = f.read().rpartition(")")
            comm = head.split("(", 1)[1]
            fields = rest.split()
            if comm == "slurmd":
                return f"{pid}:{fields[19]}"
            pid = int(fields[1])
        except (OSError, IndexError, ValueError):
            return None
    return None
