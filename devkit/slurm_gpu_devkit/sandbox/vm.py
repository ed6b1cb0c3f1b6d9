"""The nodes in a VM: a real systemd + cgroup v2 Debian node under QEMU.

``sandbox up --vm`` boots one VM holding the whole cluster: munge,
slurmctld and one slurmd per node as Debian's own systemd units (slurmd with
``Delegate=yes``), cgroup v2 with ``proctrack/cgroup`` and
``task/cgroup,task/affinity``, fake ``/dev/nvidiaN``, and slurm-gpu
installed from the project's ``.deb`` as docs/install.md says.  The image is
built from Debian packages by ``scripts/vm-image.sh`` and cached; this
module writes the per-sandbox config disk, starts QEMU, and talks to the
guest's command agent (``scripts/vm/sg-vm-agent``) over QEMU's user-mode
network (``restrict=on``: no traffic leaves; the agent's port is forwarded
from 127.0.0.1 only, and every request carries a token only root reads).
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from slurm_gpu.errors import SlurmGpuError, UsageError
from slurm_gpu.fsutil import atomic_write

# Slurm major.minor -> the Debian suite whose packages the VM runs.
SUITES = {"22.05": "bookworm", "24.11": "trixie", "26.05": "sid"}
DEFAULT_SLURM = "22.05"
DEFAULT_MACHINE = "mini-2numa"    # 2 NUMA nodes x 1 CPU, 2 GPUs: the VM's own topology
QEMU = "qemu-system-x86_64"
AGENT_PORT = 7000                 # inside the guest (scripts/vm/sg-vm-agent)
MEMORY_MIB = 1536                 # the bound: <= 2 GiB
# TCG's buffer of translated code, resident once filled (QEMU's default is
# 1 GiB since 5.0: a guest running the test tier filled it in 4 minutes, and
# QEMU's peak RSS was 1.9 GiB with only 0.6 GiB of the guest's RAM touched).
# Guest RAM + this + QEMU's own ~200 MiB stays under 2 GiB.
TCG_TB_MIB = 256
GUEST_CONF = "/etc/slurm/slurm.conf"
GUEST_TOML = "/etc/slurm-gpu/slurm-gpu.toml"
# Host tools -> the Debian package that has them.
TOOLS = {QEMU: "qemu-system-x86", "mke2fs": "e2fsprogs"}
BUILD_TOOLS = {"debootstrap": "debootstrap", "dpkg-deb": "dpkg"}
# What the image is built from, inside a checkout (its cache key, with the suite).
SOURCES = ("slurm_gpu", "devkit/slurm_gpu_devkit", "devkit/pyproject.toml", "prolog.d", "epilog.d",
           "spank", "templates", "packaging",
           "scripts/vm", "scripts/vm-image.sh", "scripts/build-deb.sh", "scripts/build-wheel.sh",
           "scripts/build-env.sh", "pyproject.toml", "setup.cfg", "docs/install.md")


def cache_dir() -> Path:
    return Path(os.environ.get("SLURM_GPU_CACHE", "/var/cache/slurm-gpu"))


def suite_of(version: str | None) -> tuple[str, str]:
    """(major.minor, suite) for ``--slurm``; one line naming the supported ones otherwise."""
    v = version or DEFAULT_SLURM
    if v not in SUITES:
        raise UsageError(f"unsupported Slurm {v!r} for --vm (supported: {', '.join(SUITES)})",
                         "--slurm")
    return v, SUITES[v]


def require_tools(names: dict[str, str]) -> None:
    """One line naming the Debian package of the first tool this host lacks."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    for tool, package in names.items():
        if shutil.which(tool, path=path) is None:
            raise SlurmGpuError(f"{tool} is not installed (apt-get install {package})",
                                "sandbox up --vm")


def checkout() -> Path:
    """The slurm-gpu checkout the image is built from (its scripts/ and devkit/):
    ``$SLURM_GPU_CHECKOUT``, the current directory (``make test``), or the
    one the runtime or this code is imported from."""
    import slurm_gpu
    here = Path(__file__).resolve()
    cands = [Path(os.environ["SLURM_GPU_CHECKOUT"])] if os.environ.get("SLURM_GPU_CHECKOUT") else []
    cands += [Path.cwd(), Path(slurm_gpu.__file__).resolve().parents[1], *here.parents]
    for d in cands:
        if (d / "scripts" / "vm-image.sh").is_file() and (d / "devkit").is_dir():
            return d
    raise SlurmGpuError("the VM image is built from a slurm-gpu checkout: run from one, or set "
                        "SLURM_GPU_CHECKOUT (scripts/vm-image.sh not found)", str(Path.cwd()))


def source_key(repo: Path, suite: str) -> str:
    """A hash of every file the image's slurm-gpu is built from: an unchanged
    checkout reuses the cached image without building the .deb again."""
    h = hashlib.sha256(suite.encode())
    for top in SOURCES:
        p = repo / top
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file()
                                                and "__pycache__" not in f.parts)
        for f in files:
            h.update(str(f.relative_to(repo)).encode() + b"\0")
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


@dataclass(frozen=True)
class Image:
    directory: Path

    @property
    def root(self) -> Path:
        return self.directory / "root.img"

    @property
    def kernel(self) -> Path:
        return self.directory / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.directory / "initrd.img"

    @property
    def slurm_full(self) -> str:
        from .versions import parse_version
        try:
            return parse_version((self.directory / "slurm-version").read_text()) or "?"
        except OSError:
            return "?"


def ensure_image(suite: str, log: Path) -> Image:
    """The cached image of *suite*, built (or rebuilt) when its sources changed."""
    repo = checkout()
    key = source_key(repo, suite)
    img = Image(cache_dir() / f"vm-{suite}")
    if (img.directory / "source-key").is_file() and \
            (img.directory / "source-key").read_text().strip() == key and img.root.is_file():
        _check_kernel(img)
        return img
    require_tools(BUILD_TOOLS)
    deb, devkit = _deb(repo, log)
    mps = _script(["bash", str(repo / "scripts" / "fetch-mps.sh")], dict(os.environ), log, None)
    argv = ["bash", str(repo / "scripts" / "vm-image.sh"), suite, str(deb),
            mps if mps and os.access(mps, os.X_OK) else "", str(devkit)]
    _script(argv, dict(os.environ), log, f"building the {suite} VM image")
    atomic_write(img.directory / "source-key", key + "\n")
    _check_kernel(img)
    return img


def _deb(repo: Path, log: Path) -> tuple[Path, Path]:
    """The checkout's .deb (scripts/build-deb.sh) and the devkit's wheel (the
    simulator the guest's GPUs are, and `sandbox fault` there), built once
    per source state and shared by the three suites' images."""
    key = source_key(repo, "deb")[:16]
    out = cache_dir() / "vm-deb" / key
    deb, whl = out / "slurm-gpu.deb", out / "devkit"
    if deb.is_file() and any(whl.glob("*.whl")):
        return deb, next(whl.glob("*.whl"))
    out.parent.mkdir(parents=True, exist_ok=True)
    for old in out.parent.iterdir():
        shutil.rmtree(old, ignore_errors=True)     # an older checkout's
    tmp = out.parent / f".build.{os.getpid()}"
    try:
        env = {**os.environ, "SLURM_GPU_DIST": str(tmp / "dist")}
        _script(["bash", str(repo / "scripts" / "build-deb.sh")], env, log, "building the .deb")
        _script(["bash", "-ec", '. scripts/build-env.sh; build_env "$1/venv"; '
                 'tar -C devkit --exclude=./build --exclude="*.egg-info" -cf - . | '
                 '{ mkdir "$1/tree"; tar -xf - -C "$1/tree"; }; '
                 '"$BPY" -m pip wheel -q --no-deps --disable-pip-version-check -w "$1/devkit" "$1/tree"',
                 "devkit-wheel", str(tmp)], {**os.environ}, log, "building the devkit's wheel",
                cwd=repo)
        (tmp / "devkit").rename(tmp / "whl")
        tmp.joinpath("out").mkdir()
        os.replace(next((tmp / "dist").glob("slurm-gpu_*_all.deb")), tmp / "out" / "slurm-gpu.deb")
        os.replace(tmp / "whl", tmp / "out" / "devkit")
        os.replace(tmp / "out", out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return deb, next(whl.glob("*.whl"))


def _check_kernel(img: Image) -> None:
    if not img.kernel.is_file() or not img.initrd.is_file():
        raise SlurmGpuError("the VM image has no kernel (its root lacks linux-image-amd64; "
                            "rebuild: rm -r " + str(img.directory) + ")", str(img.kernel))


def _script(argv: list[str], env: dict[str, str], log: Path,
            what: str | None, cwd: Path | None = None) -> str | None:
    """Run a build script; its one-line error (or the log's tail) on failure."""
    with open(log, "ab") as err:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, env=env, check=False,
                           cwd=cwd)
    if p.returncode != 0:
        if what is None:
            return None
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["?"]
        line = tail[0].removeprefix("slurm-gpu: ")
        raise SlurmGpuError(f"{what} failed: {line}", str(log))
    return p.stdout.decode().strip().splitlines()[-1] if p.stdout.strip() else ""


# -- the guest's configuration --------------------------------------------------
def guide_block(name: str, repo: Path | None = None) -> str:
    """The code block after ``<!-- lifecycle: NAME -->`` in docs/install.md:
    the VM is configured with the guide's own lines, as scripts/test-deb.sh
    installs with them (the guide cannot drift from what is tested)."""
    text = ((repo or checkout()) / "docs" / "install.md").read_text()   # first block of the name
    marker = f"<!-- lifecycle: {name} -->"
    if marker not in text:
        raise SlurmGpuError(f"docs/install.md has no {name!r} block", "docs/install.md")
    rest = text.split(marker, 1)[1].split("```", 2)
    return rest[1].split("\n", 1)[1] if len(rest) > 2 else ""


def guide_settings(name: str, repo: Path | None = None) -> list[tuple[str, str]]:
    """``Key=Value`` lines of a guide block (comments and ``NodeName=`` left out)."""
    out = []
    for line in guide_block(name, repo).splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" in line and not line.startswith("NodeName="):
            k, v = line.split("=", 1)
            out.append((k.strip(), v.strip()))
    return out


def guest_settings(cluster: str, model: Any, names: Sequence[str], *, version: str,
                   guide: Sequence[tuple[str, str]], gres_options: dict[str, Any],
                   extra: dict[str, str]) -> tuple[list[tuple[str, str]], list[str]]:
    """slurm.conf of the VM's cluster: Debian's paths and units, then the
    guide's lines (*guide*: its cgroup and hook lines), then the caller's."""
    from slurm_gpu.confgen import GresOptions, node_line, socket_layout
    from .conf import merge_settings
    opts = GresOptions(dev_dir="/dev", **gres_options)
    lay = socket_layout(model, opts.socket_mode)
    params = ["config_overrides"] + ([lay.slurmd_parameters] if lay.slurmd_parameters else [])
    def_mem = max(model.memory_bytes // (1024 * 1024) // max(lay.cpus, 1), 1)
    s: list[tuple[str, str]] = [
        # The VM is named after its first node, as a real node is (slurmd
        # and the project's `%n` both take it from the hostname).
        ("ClusterName", cluster), ("SlurmctldHost", names[0]),
        ("SlurmUser", "slurm"), ("AuthType", "auth/munge"), ("CredType", "cred/munge"),
        ("StateSaveLocation", "/var/lib/slurm/slurmctld"),
        ("SlurmdSpoolDir", "/var/lib/slurm/slurmd/%n"),
        # Debian's units: 22.05's run as root with no runtime directory; from
        # 24.11 slurmctld runs as slurm in /run/slurmctld, slurmd in /run/slurm.
        *((("SlurmctldPidFile", "/run/slurmctld.pid"), ("SlurmdPidFile", "/run/slurmd-%n.pid"))
          if version == "22.05" else
          (("SlurmctldPidFile", "/run/slurmctld/slurmctld.pid"),
           ("SlurmdPidFile", "/run/slurm/slurmd-%n.pid"))),
        ("SlurmctldLogFile", "/var/log/slurm/slurmctld.log"),
        ("SlurmdLogFile", "/var/log/slurm/slurmd-%n.log"),
        ("SelectType", "select/cons_tres"), ("SelectTypeParameters", "CR_Core_Memory"),
        ("DefMemPerCPU", str(def_mem)), ("GresTypes", "gpu"),
        ("SlurmdParameters", ",".join(params)), ("ReturnToService", "2"),
        ("MpiDefault", "none"), ("JobAcctGatherType", "jobacct_gather/cgroup"),
        ("MinJobAge", "300"), ("KillWait", "5"), ("InactiveLimit", "0"),
        ("SlurmdTimeout", "300"), ("MessageTimeout", "20"),
    ]
    lines = [node_line(n, model, options=opts,
                       extra={"NodeHostname": names[0], "NodeAddr": "127.0.0.1",
                              "Port": str(6818 + i), "State": "UNKNOWN"})
             for i, n in enumerate(names)]
    return merge_settings(merge_settings(s, dict(guide)), extra), lines


def guide_hooks(prolog: bool, health_interval: int | None,
                repo: Path | None = None) -> list[tuple[str, str]]:
    """The guide's slurm.conf lines the sandbox's options keep: its cgroup
    lines always, its hook lines for the hooks asked for."""
    out = []
    for k, v in guide_settings("slurm.conf", repo):
        if k.startswith(("Prolog", "Epilog")) and not prolog:
            continue
        if k.startswith("HealthCheck"):
            if health_interval is None:
                continue
            if k == "HealthCheckInterval":
                v = str(health_interval)
        out.append((k, v))
    return out


def config_tree(directory: Path, *, token: str, settings: list[tuple[str, str]], cgroup_conf: str,
                node_lines: list[str], gres_conf: str, plugstack: list[str],
                toml_text: str, munge_key: bytes, names: Sequence[str],
                devices: Sequence[tuple[str, int, int]], extra_files: dict[str, bytes],
                machine: str) -> None:
    """Write the config disk's tree (see scripts/vm/sg-vm-setup)."""
    from slurm_gpu import __version__
    from slurm_gpu.confgen.templating import render
    shutil.rmtree(directory, ignore_errors=True)
    # The tree holds the agent's token (root in the guest) and the munge key:
    # no other host user may read it, not even while files are written 0644
    # before their final mode.
    directory.mkdir(mode=0o700, parents=True)
    os.chmod(directory, 0o700)
    files = directory / "files"

    def put(rel: str, data: str | bytes, mode: int = 0o644) -> None:
        p = files / rel.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        os.chmod(p, mode)
    view = {"generator": "slurm-gpu sandbox up --vm", "version": __version__, "root": "(VM)",
            "machine": machine, "settings": settings, "extra_lines": [], "node_lines": node_lines}
    put(GUEST_CONF, render("sandbox.slurm.conf.j2", {"v": view}))
    put("/etc/slurm/gres.conf", gres_conf)
    put("/etc/slurm/cgroup.conf", "# docs/install.md's cgroup.conf (slurm-gpu sandbox up --vm)\n" + cgroup_conf)
    put("/etc/slurm/plugstack.conf.d/slurm-gpu.conf", "".join(f"{l}\n" for l in plugstack))
    put(GUEST_TOML, toml_text)
    put("/etc/munge/munge.key", munge_key, 0o400)
    put("/etc/hosts", f"127.0.0.1 localhost\n127.0.1.1 {names[0]}\n")
    # Debian's slurmd.service is the first node; slurmd@NAME (scripts/vm) the others.
    put("/etc/default/slurmd", f"SLURMD_OPTIONS=\"-N {names[0]}\"\n")
    for rel, data in extra_files.items():
        put(rel, data)
    (directory / "hostname").write_text(names[0] + "\n")
    (directory / "devices").write_text("".join(f"{p} {ma} {mi} 0666\n" for p, ma, mi in devices))
    (directory / "token").write_text(token + "\n")
    os.chmod(directory / "token", 0o400)
    setup = ["#!/bin/sh", "set -e"]
    setup += [f"systemctl --no-block start slurmd@{n}.service" for n in names[1:]]
    (directory / "setup.sh").write_text("\n".join(setup) + "\n")
    os.chmod(directory / "setup.sh", 0o755)


def make_config_disk(tree: Path, image: Path) -> None:
    image.unlink(missing_ok=True)
    # Created 0600 before mke2fs writes the token and key into it.
    os.close(os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    p = subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", "-L", "sgconfig", "-d", str(tree),
                        str(image), "32M"], capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise SlurmGpuError(f"mke2fs -d failed: {p.stderr.strip()}", str(image))
    os.chmod(image, 0o600)


# -- QEMU ------------------------------------------------------------------------
def qemu_argv(img: Image, config: Path, console: Path, port: int, accel: str,
              cpus: int, numa: Sequence[Sequence[int]]) -> list[str]:
    """QEMU for the node: no default devices, virtio disk and NIC, the
    serial console into a file, user-mode network that reaches nothing."""
    argv = [QEMU, "-name", "slurm-gpu-sandbox", "-nodefaults", "-no-user-config",
            "-accel", f"tcg,tb-size={TCG_TB_MIB}" if accel == "tcg" else accel,
            "-cpu", "max" if accel == "tcg" else "host",
            "-m", str(MEMORY_MIB),
            "-smp", f"{cpus},sockets={max(len(numa), 1)},cores={cpus // max(len(numa), 1)},threads=1",
            "-kernel", str(img.kernel), "-initrd", str(img.initrd),
            "-append", "root=/dev/vda rw console=ttyS0 quiet panic=-1",
            # snapshot=on: the cached image is never written; the guest's
            # writes go to a temporary file QEMU deletes on exit.
            "-drive", f"file={img.root},format=raw,if=virtio,snapshot=on",
            "-drive", f"file={config},format=raw,if=virtio,readonly=on",
            "-netdev", f"user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:{AGENT_PORT}",
            "-device", "virtio-net-pci,netdev=n0",
            "-serial", f"file:{console}", "-display", "none", "-no-reboot"]
    if len(numa) > 1:
        per = MEMORY_MIB // len(numa)
        for i, cpu_list in enumerate(numa):
            argv += ["-object", f"memory-backend-ram,id=m{i},size={per}M",
                     "-numa", f"node,nodeid={i},memdev=m{i},cpus={cpu_list[0]}-{cpu_list[-1]}"]
    return argv


def vm_topology(model: Any) -> tuple[int, list[list[int]]]:
    """(vCPUs, CPUs per NUMA node): the model's own when it is this small
    (mini-2numa: binding inside the job's cpuset is real), else 2 CPUs, one node."""
    pus = sorted(p for n in model.numa_nodes for p in n.pus)
    if 1 < len(model.numa_nodes) and len(pus) <= 4 and pus == list(range(len(pus))) \
            and len(pus) % len(model.numa_nodes) == 0:
        return len(pus), [sorted(n.pus) for n in model.numa_nodes]
    return 2, [[0, 1]]


# -- the agent -------------------------------------------------------------------
@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


class Agent:
    """The guest's command agent, reached on 127.0.0.1:*port*."""

    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token

    def _call(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        req = {"token": self.token, **req}
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(json.dumps(req).encode() + b"\n")
            f = s.makefile("rb")
            line = f.readline()
        if not line:
            raise ConnectionError("the agent closed the connection")
        return json.loads(line)

    def ping(self, timeout: float = 3.0) -> bool:
        try:
            return self._call({"op": "ping"}, timeout).get("rc") == 0
        except (OSError, ValueError):
            return False

    def run(self, argv: Sequence[str], *, user: str | None = None, timeout: float = 300.0,
            cwd: str | None = None, env: dict[str, str] | None = None,
            stdin: bytes = b"") -> Result:
        req = {"argv": list(argv), "user": user, "cwd": cwd, "timeout": timeout,
               "env": env or {}, "stdin": base64.b64encode(stdin).decode()}
        try:
            r = self._call(req, timeout + 30.0)
        except (OSError, ValueError) as e:
            raise SlurmGpuError(f"the VM's agent did not answer: {e}", f"127.0.0.1:{self.port}") from None
        return Result(int(r["rc"]), base64.b64decode(r.get("out", "")).decode(errors="replace"),
                      base64.b64decode(r.get("err", "")).decode(errors="replace"))


def console_tail(console: Path, lines: int = 5) -> str:
    try:
        text = console.read_text(errors="replace")
    except OSError:
        return "(no console output)"
    tail = [l.strip() for l in text.replace("\r", "").splitlines() if l.strip()][-lines:]
    return " | ".join(tail) or "(no console output)"


def wait_boot(agent: Agent, console: Path, timeout: float, alive: Callable[[], bool]) -> float:
    """Seconds until the guest's agent answers; one line with the console's
    tail when QEMU exits or *timeout* passes."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if not alive():
            raise SlurmGpuError(f"the VM exited during boot: {console_tail(console)}", str(console))
        if agent.ping(2.0):
            return time.monotonic() - t0
        time.sleep(0.5)
    raise SlurmGpuError(f"the VM did not boot within {timeout:g} s: {console_tail(console)}",
                        str(console))


def kvm_usable(console: Path, probe: Callable[[str], bool]) -> bool:
    """KVM when it works: this machine's /dev/kvm exists but boots no kernel
    (no console output at all), so the verdict is remembered per host boot."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    from .registry import REGISTRY
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot_id = "?"
    verdict = REGISTRY / "kvm"
    try:
        v = json.loads(verdict.read_text())
        if v.get("boot_id") == boot_id:
            return bool(v["ok"])
    except (OSError, ValueError, KeyError):
        pass
    ok = probe("kvm")
    verdict.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(verdict, json.dumps({"boot_id": boot_id, "ok": ok}) + "\n")
    return ok


def new_token() -> str:
    return secrets.token_hex(24)


def build(versions_: Sequence[str]) -> list[Path]:
    """Build (or find cached) the image of each Slurm in *versions_*: what
    ``scripts/test.sh`` runs in the background while the unit tests run."""
    from . import versions
    out = []
    for v in versions_:
        mm, suite = suite_of(v)
        if versions.SUITES.get(mm):
            versions.ensure_root(versions.SlurmRelease(mm, versions.SUITES[mm]))
        log = cache_dir() / f"vm-{suite}-build.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        out.append(ensure_image(suite, log).directory)
    return out


if __name__ == "__main__":
    import sys
    try:
        for d in build(sys.argv[1:] or list(SUITES)):
            print(d)
    except SlurmGpuError as e:
        print(f"slurm-gpu: {e}", file=sys.stderr)
        sys.exit(1)
