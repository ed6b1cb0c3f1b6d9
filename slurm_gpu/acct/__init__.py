"""Per-job GPU accounting: what each job did with each GPU and MIG instance.

* :mod:`.store` keeps the node's records: the jobs the prolog registered and
  their rolling aggregates, in a root-owned directory;
* :mod:`.aggregate` (pure) folds samples into aggregates and aggregates into
  the compact summary;
* :mod:`.attribution` (pure) gives each sample to a job: by the devices the
  job holds, then by the cgroup of each process on the device;
* :mod:`.monitor` is ``slurm-gpu monitor``, the sampler service;
* :mod:`.hooks` is the prolog/epilog step; :mod:`.dbd` writes the summary
  into the job's ``AdminComment`` in slurmdbd and reads it back;
* :mod:`.report` builds ``job report`` and ``report usage``;
* :mod:`.metrics` writes the Prometheus textfile and dcgm-exporter's
  job-mapping files.

See docs/accounting.md.
"""
