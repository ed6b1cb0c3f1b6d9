"""Data files shipped with slurm-gpu (read with slurm_gpu.paths.data_file)."""
