# Sourced by scripts/test.sh and scripts/bazel_test.sh (from the repository
# root): which TFF worker_binary processes of this checkout a run started.
# `workers_snapshot` before the run; `new_workers` after it prints the PIDs of
# workers that were not running at the snapshot (a benchmark's or a training
# run's workers beside the tests are not the tests' and are left alone).
worker_pattern="$(pwd)/.venv/lib/.*/worker_binary"

workers_snapshot() {
  workers_before=" $(pgrep -f "$worker_pattern" | tr '\n' ' ') "
}

new_workers() {
  local pid
  for pid in $(pgrep -f "$worker_pattern"); do
    case "$workers_before" in *" $pid "*) ;; *) echo "$pid" ;; esac
  done
}
