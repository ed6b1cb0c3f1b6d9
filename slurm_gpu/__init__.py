"""slurm-gpu: GPU-topology-aware tooling for Slurm clusters."""

__version__ = "0.1.0"
