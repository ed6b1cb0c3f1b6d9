#!/bin/bash
# Run the whole suite (mypy and ruff, unit, integration on real Slurm
# sandboxes, GPU tests that skip without a GPU) with the project's venv.
#   scripts/test.sh [pytest args]      e.g. scripts/test.sh -k sandbox
# As root, integration tests must run: a missing Slurm/munge fails them
# instead of skipping them (SLURM_GPU_REQUIRE_INTEGRATION=1).
# pytest exits 5 when it collected nothing: that is a failure here, since a
# suite that runs no test proves nothing.
set -uo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
VENV=${SLURM_GPU_VENV:-/opt/slurm-gpu/venv}
cd "$HERE"
if [ ! -x "$VENV/bin/python" ]; then
  echo "slurm-gpu: no venv at $VENV (run: make install)" >&2; exit 1
fi
if [ "$(id -u)" = 0 ]; then export SLURM_GPU_REQUIRE_INTEGRATION=${SLURM_GPU_REQUIRE_INTEGRATION:-1}; fi
start=$(date +%s)
# The Slurm 24.11 and 26.05 tests need Debian roots (debootstrap, minutes the
# first time): build both while the unit tests run; a test that needs one
# waits on the script's lock, and a build that cannot happen (no network)
# makes those tests say why.  Only for the whole suite (no arguments), which
# always reaches those tests, so nothing is left running when it ends.
if [ $# = 0 ] && [ "$(id -u)" = 0 ] && command -v debootstrap >/dev/null; then
  for suite in trixie sid; do
    bash scripts/debian-root.sh "$suite" >/dev/null 2>&1 &
  done
  # The VM tier's images (tests/integration/test_vm.py; each after its
  # suite's root, which it starts from): built while the unit tests run.
  if command -v qemu-system-x86_64 >/dev/null; then
    "$VENV/bin/python" -m slurm_gpu_devkit.sandbox.vm >/dev/null 2>&1 &
  fi
fi
# Static checks first, for the whole suite (setup.cfg [mypy], pyproject.toml
# [tool.ruff]; both pinned in the test extras): seconds, and a type or lint
# error fails the run like a test.
rc=0
if [ $# = 0 ]; then
  "$VENV/bin/python" -m mypy || { echo "slurm-gpu: mypy found errors" >&2; rc=1; }
  "$VENV/bin/python" -m ruff check --no-cache slurm_gpu devkit tests bench scripts || { echo "slurm-gpu: ruff found errors" >&2; rc=1; }
fi
pytest=("$VENV/bin/python" -m pytest -q -p no:cacheprovider -rfEs --durations=25)
if [ $# = 0 ]; then
  # The unit tests (about 290 s wall, 2 min of CPU: mostly waiting on child
  # processes and timeouts) run beside the integration tests, which mostly
  # wait on Slurm's daemons: about 5 min off the 30-minute budget.  Each
  # tree's own tmp dirs; the unit output is printed once it ends.
  # What either run adds under /run is removed once both end (each pytest
  # session would otherwise clean up under the other's feet).
  # After the unit tests, the same side runs the VM tier (test_vm.py, about
  # 10 min: three guests, each waiting on its own Slurm most of the time;
  # test_vm_admin.py, about 7 min: the admin's lifecycle in one guest).
  ulog=$(mktemp /tmp/slurm-gpu-unit.XXXXXX)
  "$VENV/bin/python" -m slurm_gpu_devkit.sandbox.hostrun save "$ulog.run"
  export SLURM_GPU_HOST_RUN_SAVED=1
  (
    "${pytest[@]}" --basetemp="$ulog.d" tests/unit >"$ulog" 2>&1; u=$?
    "${pytest[@]}" --basetemp="$ulog.vm.d" tests/integration/test_vm.py \
      tests/integration/test_vm_admin.py >"$ulog.vm" 2>&1; v=$?
    # the worse of the two; 5 (collected nothing) counts as a failure
    if [ $u != 0 ] && { [ $v = 0 ] || [ $u = 5 ]; }; then exit $u; fi
    exit $v
  ) &
  upid=$!
  "${pytest[@]}" --ignore=tests/integration/test_vm.py --ignore=tests/integration/test_vm_admin.py \
    tests/integration tests/gpu || rc=$?
  wait "$upid"; urc=$?
  "$VENV/bin/python" -m slurm_gpu_devkit.sandbox.hostrun restore "$ulog.run"
  echo "== unit tests (run beside the integration tests) =="
  cat "$ulog"
  echo "== VM tier: tests/integration/test_vm*.py (run after the unit tests, beside the integration tests) =="
  cat "$ulog.vm"
  rm -rf "$ulog" "$ulog.d" "$ulog.vm" "$ulog.vm.d" "$ulog.run"
  if [ $urc != 0 ] && { [ $rc = 0 ] || [ $urc = 5 ]; }; then rc=$urc; fi
else
  "${pytest[@]}" "$@" tests || rc=$?
fi
# tests/integration/test_slurm_versions.py runs on 22.05, 24.11 and 26.05 in
# every run.  SLURM_GPU_TEST_VERSIONS="24.11 26.05" also runs these modules,
# unchanged, on each of those (about 65 s per version here, and about 50 s
# more for the two accounting modules: that version's slurmdbd):
for v in ${SLURM_GPU_TEST_VERSIONS:-}; do
  SLURM_GPU_TEST_SLURM=$v "$VENV/bin/python" -m pytest -q -p no:cacheprovider -rfEs \
    tests/integration/test_sandbox_hooks.py tests/integration/test_mps_sandbox.py \
    tests/integration/test_gres_sandbox.py tests/integration/test_topology_sandbox.py \
    tests/integration/test_accounting_sandbox.py tests/integration/test_accounting_jobs.py || rc=1
done
echo "slurm-gpu: test suite took $(( $(date +%s) - start )) s (rc $rc)" >&2
if [ $rc = 5 ]; then echo "slurm-gpu: pytest collected no tests" >&2; exit 1; fi
exit $rc
