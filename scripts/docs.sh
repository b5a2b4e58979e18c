#!/usr/bin/env bash
# Builds the HTML API reference from the docstrings with pdoc (pinned in requirements.txt).
# Usage: scripts/docs.sh [OUTPUT_DIR]     (default: build/api; open OUTPUT_DIR/index.html)
# Documents the packages tff_algos, tasks and run (and privacy once it exists). Fails, with
# pdoc's messages, if a module cannot be imported or pdoc warns about anything.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-build/api}"
python="${PYTHON:-.venv/bin/python}"
packages=(tff_algos tasks run)
for extra in privacy; do
  [ -f "$extra/__init__.py" ] && packages+=("$extra")
done
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
rm -rf "$out"
# The checkout first on the path, so its modules (not an installed copy) are documented. The
# binaries (run.train, run.experiments.reproduce, run.benchmarks.bench, ...) each define absl flags, some with the same
# names, so one process cannot import them all: each module is imported once, in order, and its
# flags are dropped before the next one is imported (the docs only read docstrings).
PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}" TF_CPP_MIN_LOG_LEVEL=3 \
  timeout --kill-after=30 600 "$python" - "$out" "${packages[@]}" >"$log" 2>&1 <<'PYTHON'
import importlib
import pathlib
import pkgutil
import sys
import warnings

from absl import flags
import pdoc
import pdoc.render

from tff_algos import runtime

runtime.install_worker_cleanup()
out, packages = sys.argv[1], sys.argv[2:]


def import_dropping_flags(name):
  before = set(flags.FLAGS)
  module = importlib.import_module(name)
  for flag in set(flags.FLAGS) - before:
    delattr(flags.FLAGS, flag)
  return module


for package in packages:
  root = import_dropping_flags(package)
  for info in pkgutil.walk_packages(root.__path__, prefix=package + '.'):
    import_dropping_flags(info.name)
pdoc.render.configure(docformat='google', show_source=False,
                      footer_text='tff-hetero API reference')
with warnings.catch_warnings(record=True) as caught:
  warnings.simplefilter('always')
  pdoc.pdoc(*packages, output_directory=pathlib.Path(out))
problems = [w for w in caught if 'pdoc' in (w.filename or '')]
for w in problems:
  print(f'pdoc Warning: {w.filename}:{w.lineno}: {w.message}', file=sys.stderr)
runtime.kill_workers()
runtime.disarm_service_managers()  # No teardown noise from TFF at exit.
sys.exit(1 if problems else 0)
PYTHON
rc=$?
problems="$(grep -E 'Error importing|Traceback|pdoc.*Warning' "$log")"
if [ "$rc" -ne 0 ] || [ -n "$problems" ]; then
  cat "$log" >&2
  echo "docs.sh: error: pdoc failed (exit $rc) or warned; see above" >&2
  exit 1
fi
for package in "${packages[@]}"; do
  if [ ! -f "$out/$package.html" ]; then
    echo "docs.sh: error: $out/$package.html was not written" >&2
    exit 1
  fi
done
echo "docs.sh: API reference of ${packages[*]} in $out/index.html"
