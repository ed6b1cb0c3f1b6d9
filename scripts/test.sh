#!/bin/bash
# Run the whole suite with the project's venv. pytest exits 5 when it
# collected nothing: treat that as a failure, since a suite that runs no test
# proves nothing.
set -uo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
VENV=${SLURM_GPU_VENV:-/opt/slurm-gpu/venv}
cd "$HERE"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@" tests
rc=$?
if [ $rc = 5 ]; then echo "slurm-gpu: pytest collected no tests" >&2; exit 1; fi
exit $rc
