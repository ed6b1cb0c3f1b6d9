#!/bin/bash
# The Debian 13 ("trixie") root with Slurm 24.11 for the topology/block
# integration tests: scripts/debian-root.sh trixie (kept under this name for
# existing callers; SLURM_GPU_TRIXIE_ROOT still overrides the path).
#
#   scripts/trixie-root.sh            # build if missing, print the path
#   scripts/trixie-root.sh --rebuild  # throw the cache away first
exec bash "$(dirname "$0")/debian-root.sh" trixie "$@"
