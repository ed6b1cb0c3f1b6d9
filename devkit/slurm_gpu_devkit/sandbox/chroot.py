"""Running a sandbox's Slurm from a Debian root (24.11, 26.05), chrooted.

The whole product runs inside the root, not only the daemons: a venv made
from the root's own ``/usr/bin/python3`` at the same path as the host venv
(``ROOT/opt/slurm-gpu/venv``) holds a copy of the host venv's slurm-gpu, so
the prolog/epilog, the health check and the SPANK plugin (compiled inside
the root against that Slurm's ``slurm/spank.h``) are what a node running
that Slurm would run.

One idle *holder* process owns a private mount namespace in which the host's
``/dev``, ``/proc``, ``/sys``, ``/tmp``, ``/home``, the user database and the
sandbox directory are bound into the root at their own paths, and whose root
directory is the Debian root.  Daemons, hooks and clients enter it with
``nsenter --mount --root``: no mount is ever made in the host's namespace, so
nothing is left behind when the last process of the sandbox ends.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import shutil
import time
from pathlib import Path
from typing import Iterator, Sequence

from slurm_gpu.errors import SlurmGpuError
from slurm_gpu.fsutil import atomic_write
from slurm_gpu.runner import RunAs, run
from .layout import Layout

# Host paths visible inside the root at the same path (beside the sandbox dir).
RBINDS = ("/dev", "/proc", "/sys")            # with their submounts
BINDS = ("/tmp", "/home", "/etc/passwd", "/etc/group", "/etc/hosts")
# Writable places of the root that would otherwise be the shared cache's: each
# sandbox gets its own, empty, gone with its namespace (a job's leftovers there
# must not reach the next sandbox, nor the node cache and MPS pipes under /run).
PRIVATE = (("/run", "0755"), ("/var/tmp", "1777"))
CLIENTS = ("srun", "sbatch", "salloc", "sattach", "scontrol", "squeue", "sinfo", "scancel",
           "sacct", "sacctmgr", "sstat", "sbcast", "sprio", "sdiag")
READY = "chroot.ready"


def in_root(root: Path, path: str | os.PathLike[str]) -> Path:
    """The host path of *path* inside *root*."""
    return root / str(path).lstrip("/")


# -- the root's venv -----------------------------------------------------------
def _host_site(venv: Path) -> Path:
    sites = sorted(venv.glob("lib/python3*/site-packages"))
    if not sites or not (sites[0] / "slurm_gpu").is_dir():
        raise SlurmGpuError("slurm-gpu is not installed in the venv the sandbox uses; "
                            "run scripts/install.sh (SLURM_GPU_VENV)", str(venv))
    return sites[0]


def _requirements(site: Path) -> list[str]:
    """The project's install requirements, from the host venv's metadata."""
    reqs: list[str] = []
    for meta in site.glob("slurm_gpu-*.dist-info/METADATA"):
        for line in meta.read_text().splitlines():
            if line.startswith("Requires-Dist:") and "extra ==" not in line:
                reqs.append(line.split(":", 1)[1].strip())
    # cffi compiles the SPANK plugin with setuptools, which Python >= 3.12 venvs lack.
    return sorted(reqs) + ["setuptools"]


def _project_files(site: Path, venv: Path) -> list[tuple[Path, Path]]:
    """(host file, path relative to the venv) of the installed project, without bytecode."""
    out: list[tuple[Path, Path]] = []
    # The runtime and the devkit (whose entry points give the nodes the
    # simulator backend and the sandbox commands, as on the host).
    tops = [site / "slurm_gpu", *site.glob("slurm_gpu-*.dist-info"),
            site / "slurm_gpu_devkit", *site.glob("slurm_gpu_devkit-*.dist-info"), venv / "share" / "slurm-gpu"]
    for top in tops:
        if not top.exists():
            continue
        for p in sorted(top.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                out.append((p, p.relative_to(venv)))
    return out


def _digest(files: Sequence[tuple[Path, Path]], reqs: Sequence[str]) -> str:
    h = hashlib.sha256("\n".join(reqs).encode())
    for src, rel in files:
        st = src.stat()
        h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _namespace_script(root: Path, binds: Sequence[str], then: Sequence[str], *,
                      chroot: bool = True, private: bool = False) -> str:
    """sh text run in a fresh mount namespace: bind the host paths into *root*, then
    exec *then* chrooted in it (with ``chroot=False``: the caller appends what runs)."""
    q = shlex.quote
    lines = ["set -e"]
    for p in RBINDS:
        lines.append(f"mount --rbind {q(p)} {q(str(in_root(root, p)))}")
    for p, mode in (PRIVATE if private else ()):
        lines.append(f"mount -t tmpfs -o mode={mode},size=256m slurm-gpu {q(str(in_root(root, p)))}")
    done: list[str] = []
    for p in sorted(dict.fromkeys(binds), key=len):
        if any(p == d or p.startswith(d.rstrip("/") + "/") for d in done):
            continue   # already visible through a parent bind
        if not os.path.exists(p):
            continue
        target = in_root(root, p)
        make = f"mkdir -p {q(str(target))}" if os.path.isdir(p) else \
            f"mkdir -p {q(str(target.parent))} && touch {q(str(target))}"
        lines.append(f"[ -e {q(str(target))} ] || {{ {make}; }}")
        lines.append(f"mount --bind {q(p)} {q(str(target))}")
        done.append(p)
    if chroot:
        lines.append(f"exec chroot {q(str(root))} {' '.join(q(a) for a in then)}")
    return "\n".join(lines) + "\n"


# pip inside the root trusts what the host trusts (a site's TLS proxy CA) and
# uses the host's proxy settings.
PIP_BINDS = ("/etc/ssl/certs",)
PASS_ENV = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
            "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_DEFAULT_TIMEOUT")


def pip_binds() -> tuple[str, ...]:
    """The host's trust store, and the bundle its PIP_CERT names where that lies elsewhere."""
    cert = os.environ.get("PIP_CERT", "")
    return PIP_BINDS + ((cert,) if os.path.isabs(cert) and os.path.isfile(cert) else ())


def run_in_root(root: Path, argv: Sequence[str], timeout: float, *,
                binds: Sequence[str] = ()) -> None:
    """Run *argv* chrooted into *root* with /dev, /proc, /sys bound (raises on failure)."""
    script = _namespace_script(root, binds, argv)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    env.update({k: os.environ[k] for k in PASS_ENV if k in os.environ})
    cert = os.environ.get("PIP_CERT", "")
    if cert in binds:   # bound at the same path inside, so the root's pip can read it
        env["PIP_CERT"] = cert
    run(["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script],
        timeout=timeout, env=env)


class _Lock:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> "_Lock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def sync_venv(root: Path, venv: Path, timeout: float = 900) -> Path:
    """Make ``ROOT/<venv>`` a venv of the root's python3 holding the host venv's slurm-gpu.

    The dependencies are installed with the root's pip (once; again when the
    project's requirements change); the project itself is copied from the
    host venv whenever its files changed, so reinstalling the host venv
    updates every root at the next ``sandbox up``.  Returns the host path of
    the root's venv.
    """
    site = _host_site(venv)
    rv = in_root(root, venv)
    reqs = _requirements(site)
    files = _project_files(site, venv)
    with _Lock(in_root(root, venv.parent) / f".{venv.name}.sync.lock"):
        py = rv / "bin" / "python"
        if not py.exists():
            shutil.rmtree(rv, ignore_errors=True)
            run_in_root(root, ["/usr/bin/python3", "-m", "venv", str(venv)], timeout)
        deps_stamp = rv / ".slurm-gpu-requirements"
        if not deps_stamp.exists() or deps_stamp.read_text() != "\n".join(reqs):
            try:
                run_in_root(root, [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                                   "--disable-pip-version-check", *reqs], timeout, binds=pip_binds())
            except SlurmGpuError as e:
                raise SlurmGpuError(f"cannot install slurm-gpu's dependencies into the "
                                    f"{root.name} venv: {e.what}", str(rv)) from None
            atomic_write(deps_stamp, "\n".join(reqs))
        stamp = rv / ".slurm-gpu-tree"
        digest = _digest(files, reqs)
        if not stamp.exists() or stamp.read_text() != digest:
            _copy_project(files, site, rv, venv)
            # Job users' processes run this venv (the SPANK plugin, the MPS daemon).
            for p in [rv, *rv.rglob("*")]:
                if not p.is_symlink():
                    mode = p.stat().st_mode
                    os.chmod(p, mode | 0o444 | (0o111 if mode & 0o111 or p.is_dir() else 0))
            atomic_write(stamp, digest)
    return rv


def _copy_project(files: Sequence[tuple[Path, Path]], site: Path, rv: Path, venv: Path) -> None:
    rsites = sorted(rv.glob("lib/python3*/site-packages"))
    if not rsites:
        raise SlurmGpuError("the root's venv has no site-packages", str(rv))
    rsite_rel = rsites[0].relative_to(rv)
    site_rel = site.relative_to(site.parents[2])          # lib/python3.X/site-packages
    for old in [rsites[0] / "slurm_gpu", *rsites[0].glob("slurm_gpu-*.dist-info"),
                rsites[0] / "slurm_gpu_devkit", *rsites[0].glob("slurm_gpu_devkit-*.dist-info"),
                rv / "share" / "slurm-gpu"]:
        shutil.rmtree(old, ignore_errors=True)
    for src, rel in files:
        rel_s = str(rel)
        if rel_s.startswith(str(site_rel) + "/"):
            rel = rsite_rel / rel_s[len(str(site_rel)) + 1:]
        dst = rv / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    exe = rv / "bin" / "slurm-gpu"
    atomic_write(exe, f"#!{venv}/bin/python\n"
                      "import sys\nfrom slurm_gpu.cli import run\n"
                      "if __name__ == '__main__':\n    sys.exit(run())\n", mode=0o755)


# -- the holder of the mount namespace -----------------------------------------
def binds_for(layout: Layout, extra: Sequence[str] = ()) -> list[str]:
    return [*BINDS, str(layout.root), *extra]


def holder_argv(root: Path, layout: Layout, extra_binds: Sequence[str] = ()) -> list[str]:
    """argv of the idle process whose mount namespace the sandbox's processes share."""
    ready = layout.run / READY
    # Not chrooted itself (enter() chroots each command), and its working
    # directory is the sandbox's: whoever looks for the sandbox's processes
    # by their paths finds it.
    script = _namespace_script(root, binds_for(layout, extra_binds), [], chroot=False, private=True)
    script += f"cd {shlex.quote(str(layout.run))} && touch {shlex.quote(str(ready))} && exec sleep infinity\n"
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script]


def wait_ready(layout: Layout, alive: "callable[[], bool]", timeout: float = 15) -> None:  # type: ignore[valid-type]
    ready = layout.run / READY
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if not alive() or time.monotonic() > deadline:
            log = layout.log / "chroot.stdout"
            text = log.read_text(errors="replace").strip() if log.exists() else ""
            raise SlurmGpuError(f"sandbox: cannot set up the Debian root's namespace: "
                                f"{text.splitlines()[-1] if text else 'no output'}", str(log))
        time.sleep(0.01)


CD_EXEC = 'cd "$0" && exec "$@"'


def enter(holder: int, root: Path, wd: str = "/", run_as: RunAs | None = None) -> list[str]:
    """The argv prefix that runs a command inside the holder's namespace, chrooted, in *wd*.

    ``nsenter --mount --root`` puts us at the holder's root directory (not
    the namespace's own root: where the sandbox itself runs chrooted, as in
    CI's fresh Debian root, that would be the outer machine's, and every path
    would name the wrong file), then ``chroot`` enters the Debian root
    (dropping to *run_as* there) and a shell changes to *wd*.  (``nsenter
    --wd`` opens the directory in the caller's namespace, which the chrooted
    process then cannot name.)
    """
    argv = ["nsenter", f"--target={holder}", "--mount", "--root", "--", "chroot"]
    if run_as is not None:
        groups = ",".join(str(g) for g in (run_as.groups or (run_as.gid,)))
        argv += [f"--userspec={run_as.uid}:{run_as.gid}", f"--groups={groups}"]
    return argv + [str(root), "/bin/sh", "-c", CD_EXEC, wd]


def mntns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/mnt").st_ino
    except OSError:
        return None


def in_mntns(inode: int | None, root: str | None = None) -> set[int]:
    """PIDs living in the mount namespace *inode* (every process of a chrooted sandbox).

    With *root*, only those chrooted in it: a namespace inode can be reused
    once its namespace is gone, and a stranger's process must never match.
    """
    found: set[int] = set()
    if inode is None:
        return found
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}/ns/mnt").st_ino != inode:
                    continue
                if root is not None and not os.readlink(f"/proc/{name}/root").startswith(root):
                    continue
            except OSError:
                continue
            found.add(int(name))
    return found


def visible_prefixes(layout: Layout, extra: Sequence[str] = ()) -> list[str]:
    return [p for p in binds_for(layout, extra) if os.path.isdir(p)]


def write_clients(layout: Layout, root: Path, version: str,
                  extra_binds: Sequence[str] = ()) -> Iterator[Path]:
    """``DIR/bin/<client>`` wrappers running the root's Slurm clients (as root).

    A job user cannot enter a mount namespace; run their commands through
    :meth:`Sandbox.client_argv` (root enters, then drops to the user).
    """
    q = shlex.quote
    pidfile = layout.run / "chroot.pid"
    cases = "|".join(f"{q(p.rstrip('/'))}|{q(p.rstrip('/'))}/*" for p in visible_prefixes(layout, extra_binds))
    layout.bin.mkdir(exist_ok=True)
    os.chmod(layout.bin, 0o755)
    for name in CLIENTS:
        path = layout.bin / name
        atomic_write(path, "#!/bin/sh\n"
                     f"# generated by slurm-gpu sandbox up: Slurm {version}'s {name}, run in the "
                     "sandbox's Debian root\n"
                     'if [ "$(id -u)" != 0 ]; then\n'
                     f"  echo \"slurm-gpu: the Slurm {version} sandbox's clients run as root; run a job "
                     f"user's command with Sandbox.client_argv ({path})\" >&2; exit 1\nfi\n"
                     f"pid=$(cat {q(str(pidfile))} 2>/dev/null) || "
                     f"{{ echo \"slurm-gpu: sandbox not running ({layout.root})\" >&2; exit 1; }}\n"
                     f'case "$PWD" in {cases}) wd=$PWD ;; *) wd=/ ;; esac\n'
                     f'cd / && exec nsenter --target="$pid" --mount --root -- chroot {q(str(root))} '
                     f'/bin/sh -c {q(CD_EXEC)} "$wd" /usr/bin/{name} "$@"\n',
                     mode=0o755)
        yield path
