#!/usr/bin/env bash
# Sets up the pinned environment if needed (scripts/bootstrap.sh) and runs the test suite.
# Usage: scripts/test.sh [pytest args]     e.g. scripts/test.sh tests/test_fed_prox.py -x
# Env:   TEST_WORKERS=N (processes, default one per core up to 4), TEST_ROTATION
#        (tests/rotation.py), TEST_TIMEOUT (seconds, default 4000).
# Afterwards it checks that no TFF worker_binary of this checkout started by the
# suite outlived it (workers already running beside it, e.g. a benchmark's, are left alone).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh || exit $?
source scripts/workers.sh
workers_snapshot
export TF_CPP_MIN_LOG_LEVEL=3
# The suite runs in TEST_WORKERS processes (pytest-xdist; default: one per
# core, at most 4): each test is single-threaded for most of its time, so one
# process leaves the other cores idle. TEST_WORKERS=1 runs it in this process.
cores="$(nproc 2>/dev/null || echo 1)"
workers="${TEST_WORKERS:-$(( cores < 4 ? cores : 4 ))}"
if ! [[ "$workers" =~ ^[1-9][0-9]*$ ]]; then
  echo "test.sh: error: TEST_WORKERS=$workers: must be a whole number >= 1" >&2
  exit 2
fi
parallel=()
[ "$workers" -gt 1 ] && parallel=(-n "$workers" --dist worksteal)
timeout --kill-after=30 "${TEST_TIMEOUT:-4000}" .venv/bin/python -m pytest -q "${parallel[@]}" "$@"
rc=$?
sleep 1
leaked="$(new_workers | tr '\n' ' ')"
if [ -n "$leaked" ]; then
  echo "test.sh: error: TFF worker processes outlived the test suite: $leaked" >&2
  kill -9 $leaked 2>/dev/null
  [ "$rc" -eq 0 ] && rc=1
elif [ "$rc" -ne 4 ]; then  # 4: pytest refused its input (one line), ran nothing.
  echo "test.sh: no TFF worker process outlived the suite" >&2
fi
exit $rc
