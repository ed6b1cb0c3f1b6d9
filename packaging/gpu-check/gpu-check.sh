#!/bin/sh
# slurm-gpu's check of a real GPU machine, from the directory
# `make gpu-check-bundle` wrote (docs/development.md, the first thing to run
# on any GPU machine).  No network, nothing installed or changed outside one
# temporary directory: a venv there from this machine's CPython 3.10-3.13 and
# the bundle's wheels, then gpu_check.py: tests/gpu, a snapshot recorded and
# replayed against live NVML, the accounting sampler, an MPS control daemon
# and server started and stopped (compute modes left as they are), one
# summary.  The bundle directory itself is only read.
#   sh gpu-check.sh             GPU_CHECK_PYTHON=/usr/bin/python3.12 sh gpu-check.sh
# Results (summary.txt, snapshot.json, logs) stay in $GPU_CHECK_OUT (default:
# a new /tmp/slurm-gpu-gpu-check.XXXXXX), printed at the end.
# Exit 0: every check passed; 1: one failed; 3: cannot run here (no
# CPython 3.10-3.13, no venv); 77: no NVML (no NVIDIA driver): nothing to check.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
say() { echo "slurm-gpu: gpu-check: $*"; }
OUT=${GPU_CHECK_OUT:-}
made=
if [ -z "$OUT" ]; then
    OUT=$(mktemp -d "${TMPDIR:-/tmp}/slurm-gpu-gpu-check.XXXXXX") || { say "cannot make a temporary directory"; exit 3; }
    made=1
fi
mkdir -p "$OUT" || { say "cannot make $OUT"; exit 3; }
# The venv goes at the end, whatever happens; the results stay (all of $OUT
# when there was nothing to check and we made it: no NVML).
rc=3
cleanup() {
    rm -rf "$OUT/venv"
    if [ -n "$made" ] && [ "$rc" = 77 ]; then rm -rf "$OUT"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
PY=${GPU_CHECK_PYTHON:-}
if [ -z "$PY" ]; then
    for p in python3.13 python3.12 python3.11 python3.10 python3; do
        c=$(command -v "$p" 2>/dev/null) || continue
        if "$c" -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null; then
            PY=$c
            break
        fi
    done
fi
[ -n "$PY" ] || { say "no CPython 3.10 to 3.13 on PATH (set GPU_CHECK_PYTHON)"; exit 3; }
# No ensurepip needed (Debian and Ubuntu split it into python3-venv): the
# bundle's own pip wheel installs into a venv made without pip.
"$PY" -m venv --without-pip "$OUT/venv" >"$OUT/venv.log" 2>&1 ||
    { say "$PY cannot make a venv: $(tail -1 "$OUT/venv.log")"; exit 3; }
pip=$(ls "$HERE"/wheels/pip-*.whl 2>/dev/null | head -1)
[ -n "$pip" ] || { say "no pip wheel in $HERE/wheels (rebuild the bundle)"; exit 3; }
# --ignore-requires-python: slurm-gpu's wheel says >=3.11 (the packages'
# Pythons); this check also runs on 3.10 (Ubuntu 22.04's python3).
if ! PIP_CONFIG_FILE=/dev/null PYTHONDONTWRITEBYTECODE=1 "$OUT/venv/bin/python" "$pip/pip" install -q \
        --no-index --no-cache-dir --disable-pip-version-check --ignore-requires-python \
        --find-links "$HERE/wheels" slurm-gpu pytest >"$OUT/pip.log" 2>&1; then
    say "the bundle's wheels do not install on $("$PY" -V 2>&1) $(uname -m): $(grep -E 'ERROR' "$OUT/pip.log" | head -1) ($OUT/pip.log)"
    exit 3
fi
env PYTHONDONTWRITEBYTECODE=1 "$OUT/venv/bin/python" "$HERE/gpu_check.py" --bundle "$HERE" --out "$OUT"
rc=$?
exit $rc
