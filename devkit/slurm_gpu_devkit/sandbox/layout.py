"""Where everything of one sandbox lives under its directory.

One directory holds the whole cluster (config, fake devices, munge key and
socket, logs, spool, state), so ``rm -rf DIR`` after ``down`` removes every
trace and two sandboxes in two directories never share a file.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Layout:
    """The paths of one sandbox; ``root`` is absolute and resolved."""

    root: Path

    @classmethod
    def of(cls, directory: str | Path) -> "Layout":
        return cls(Path(directory).expanduser().resolve())

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def dev(self) -> Path:
        return self.root / "dev"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def munge(self) -> Path:
        return self.root / "munge"

    @property
    def var(self) -> Path:
        return self.root / "var"

    @property
    def lib(self) -> Path:
        return self.root / "lib"

    @property
    def bin(self) -> Path:
        """Client wrappers of a sandbox whose Slurm runs from a Debian root."""
        return self.root / "bin"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.etc / "gres.conf"

    @property
    def plugstack_conf(self) -> Path:
        return self.etc / "plugstack.conf"

    @property
    def config_toml(self) -> Path:
        return self.etc / "slurm-gpu.toml"

    @property
    def munge_socket(self) -> Path:
        return self.munge / "munge.sock"

    @property
    def munge_key(self) -> Path:
        return self.munge / "munge.key"

    @property
    def state_file(self) -> Path:
        """What ``up`` started (PIDs, ports, namespaces); ``down`` reads it."""
        return self.run / "sandbox.json"

    def slurmd_log(self, node: str) -> Path:
        return self.log / f"slurmd-{node}.log"

    @property
    def slurmctld_log(self) -> Path:
        return self.log / "slurmctld.log"

    @property
    def key(self) -> str:
        """A short id unique to this directory (cluster name, interface names)."""
        return hashlib.sha1(str(self.root).encode()).hexdigest()[:6]

    @property
    def cluster_name(self) -> str:
        return f"sg{self.key}"

    def dirs(self) -> tuple[Path, ...]:
        return (self.etc, self.dev, self.run, self.log, self.spool, self.state, self.munge,
                self.var, self.lib)
