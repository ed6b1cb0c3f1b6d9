"""Per-job GPU setup on a node: state file, MPS daemon, MIG instances, prolog/epilog."""
