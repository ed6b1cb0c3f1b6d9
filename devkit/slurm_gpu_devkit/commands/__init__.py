"""The devkit's ``slurm-gpu`` subcommands (entry-point group ``slurm_gpu.commands``)."""
