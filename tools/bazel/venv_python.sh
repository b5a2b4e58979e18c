#!/bin/sh
# The Python of `bazel test` (the toolchain in tools/bazel/BUILD): the
# repository's pinned virtual environment, .venv at the repository root, found
# from this file's real location (the runfiles hold a symlink to it).
root=$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)
if [ ! -x "$root/.venv/bin/python" ]; then
  echo "venv_python.sh: error: no $root/.venv/bin/python; run scripts/bootstrap.sh first" >&2
  exit 2
fi
exec "$root/.venv/bin/python" "$@"
