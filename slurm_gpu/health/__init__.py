"""The GPU node health check: gather once, run small pure checks, act on Slurm.

* ``findings``: the Finding type, node status and Nagios exit codes.
* ``xid``: ``gpu.xid`` over NVIDIA's XID catalog (kernel log, xid-watch events).
* ``gpu_checks``: the NVML ``gpu.*`` checks; ``os_checks``: the ``os.*`` audit.
* ``nodestate``: parse ``scontrol show node -o`` and decide drain/resume (pure).
* ``actions``: apply the decision through ``slurm_gpu.runner`` with the state file.
* ``engine``: gather sources under a watchdog and run the selected checks.
"""
