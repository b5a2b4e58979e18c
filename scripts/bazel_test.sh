#!/usr/bin/env bash
# Runs the test suite with Bazel (docs/bazel.md), offline, with the pinned
# .venv: sets up .venv if needed (scripts/bootstrap.sh), checks that the BUILD
# files mirror the imports (tools/build_deps.py --check), runs `bazel test`,
# checks that a target lacking a dep fails (tools/bazel/testdata), and that no
# TFF worker_binary of this checkout outlived the run.
# Usage: scripts/bazel_test.sh [bazel test flags] [targets]   (default: //...)
#   e.g. scripts/bazel_test.sh --local_test_jobs=1 //tests:test_fed_prox
# Needs Debian's bazel-bootstrap and bazel-platforms (scripts/install_bazel.sh).
set -uo pipefail
cd "$(dirname "$0")/.."

die() { echo "bazel_test: error: $*" >&2; exit 2; }

command -v bazel >/dev/null 2>&1 \
  || die "no bazel command: run scripts/install_bazel.sh (apt-get install bazel-bootstrap bazel-platforms)"
[ -d /usr/share/bazel/platforms ] \
  || die "no /usr/share/bazel/platforms: run scripts/install_bazel.sh (apt-get install bazel-platforms)"
bash scripts/bootstrap.sh || exit $?
.venv/bin/python -m tools.build_deps --check \
  || die "BUILD files are stale: run .venv/bin/python -m tools.build_deps --write"

args=("$@")
has_target=0
for arg in "${args[@]+"${args[@]}"}"; do
  case "$arg" in -*) ;; *) has_target=1 ;; esac
done
[ "$has_target" -eq 1 ] || args+=(//...)

# TFF workers already running beside the tests are left alone.
source scripts/workers.sh
workers_snapshot

rc=0
start=$(date +%s)
bazel test "${args[@]}" || rc=$?
echo "bazel_test: bazel test ${args[*]}: exit $rc in $(( $(date +%s) - start )) s" >&2

# A missing dep must fail: the same module passes with its dep and fails
# without it, although the module is in the source tree and the venv's
# editable install points there (tools/bazel/sitecustomize.py).
log=bazel-testlogs/tools/bazel/testdata/without_dep/test.log
if ! bazel test --nocache_test_results //tools/bazel/testdata:with_dep; then
  echo "bazel_test: error: //tools/bazel/testdata:with_dep failed" >&2
  rc=1
elif bazel test --nocache_test_results //tools/bazel/testdata:without_dep \
    >/dev/null 2>&1; then
  echo "bazel_test: error: //tools/bazel/testdata:without_dep passed although its target lacks the dep on //tasks:tail_metrics" >&2
  rc=1
elif ! grep -q "No module named 'tasks'" "$log"; then
  echo "bazel_test: error: //tools/bazel/testdata:without_dep failed, but not with the missing import; see $log" >&2
  rc=1
else
  echo "bazel_test: a target lacking a dep fails as it should (No module named 'tasks')" >&2
fi

# Workers of the last test targets may take a few seconds to be reaped after
# their sandbox ends; only those still alive after 20 s are leaks.
for _ in $(seq 20); do
  [ -n "$(new_workers)" ] || break
  sleep 1
done
leaked="$(new_workers | tr '\n' ' ')"
if [ -n "$leaked" ]; then
  echo "bazel_test: error: TFF worker processes outlived the tests: $leaked" >&2
  kill -9 $leaked 2>/dev/null
  rc=1
else
  echo "bazel_test: no TFF worker process outlived the tests" >&2
fi
exit $rc
