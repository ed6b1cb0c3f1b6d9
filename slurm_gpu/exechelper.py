"""``slurm-gpu-exec``: the small C program the runner starts commands through
when they must join cgroups or be pinned to CPUs before they run.

subprocess runs no Python between fork and exec (the health check forks
with a thread hung in libnvidia-ml), so what must happen in between is done
by ``spank/sg_exec.c``.  It is built on the node, like the SPANK plugin
(``slurm-gpu spank build`` and the installers build it), into
``<venv>/lib/slurm-gpu/``; statically linked where libc allows, so that its
start costs no dynamic loading.

    python -m slurm_gpu.exechelper [DEST]     # build it (default: :func:`path`)
"""
from __future__ import annotations

import os
import sys

from . import runner

NAME = runner.HELPER_NAME
SOURCE = "sg_exec.c"
path = runner.helper_path


def build(dest: str | None = None, cc: str = "cc") -> str:
    """Compile the helper into *dest* (default :func:`path`), atomically; returns *dest*.

    SlurmGpuError when no compiler (or no libc headers) can build it.
    """
    from .errors import CommandError, SlurmGpuError
    from .paths import resource_dir
    dest = dest or path()
    src = str(resource_dir("spank") / SOURCE)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = f"{dest}.tmp{os.getpid()}"
    flags = ["-O2", "-Wall", "-D_FORTIFY_SOURCE=2", "-o", tmp, src]
    why = ""
    try:
        for extra in (["-static"], []):     # static where libc.a is installed
            try:
                runner.run([cc, *extra, *flags], 120)
                break
            except CommandError as e:
                why = e.what
        else:
            raise SlurmGpuError(f"cannot build {NAME}: {why}", src)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return dest


def main(argv: list[str]) -> int:
    from .errors import SlurmGpuError
    try:
        print(build(argv[0] if argv else None))
    except SlurmGpuError as e:
        print(e.line(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
