"""Per-job IMEX domains (docs/imex.md): the prolog starts NVIDIA's ``nvidia-imex``
for the job's nodes of one NVLink domain, waits until the domain is UP, and
the epilog stops it.  ``domain`` is the pure part, ``addresses`` resolves
peers without ``scontrol``, ``daemon`` runs the binaries, ``job`` is the
prolog/epilog flow and ``hook`` its entry point."""
