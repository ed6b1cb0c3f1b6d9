"""MIG: profile tables, the pure layout planner and NVML instance management."""
