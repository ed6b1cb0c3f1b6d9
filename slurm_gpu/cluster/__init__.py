"""The whole cluster at once: collect every node's model, render and check.

* :mod:`.modelfile`: the published/collected model file (derived model, hash,
  timestamp) and the health check's publishing hook;
* :mod:`.store`: reading a directory of collected nodes, one line per bad entry;
* :mod:`.slurmview`: what Slurm believes (``scontrol show node``, ``sinfo``);
* :mod:`.drift`: pure comparison and the folded report;
* :mod:`.collect`: running ``snapshot record`` on every node through Slurm
  (or ClusterShell) and gathering the results atomically.
"""
