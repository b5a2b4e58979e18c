#!/usr/bin/env bash
# Creates (or reuses) the project's virtual environment in .venv with the pinned stack.
# Usage: scripts/bootstrap.sh            (idempotent: re-installs only when the pins change)
# Env:   PYTHON=/path/to/python3.x       (default: the first of python3.11, python3.10, python3.9)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}

die() { echo "bootstrap: error: $*" >&2; exit 2; }

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) ;;
  *) die "TFF 0.87 ships wheels for Linux x86-64 only; this is $(uname -s)-$(uname -m)." ;;
esac

if [ -z "${PYTHON:-}" ]; then
  for cand in python3.11 python3.10 python3.9; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import venv' >/dev/null 2>&1; then
      PYTHON=$cand; break
    fi
  done
fi
[ -n "${PYTHON:-}" ] || die "needs Python 3.9, 3.10 or 3.11 (TFF 0.87 supports no other); none found on PATH. Set PYTHON=/path/to/python3.11."
pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || die "cannot run $PYTHON (set PYTHON=/path/to/python3.11)"
case "$pyver" in
  3.9|3.10|3.11) ;;
  *) die "$PYTHON is Python $pyver; TFF 0.87 needs Python 3.9, 3.10 or 3.11." ;;
esac

stamp="$VENV/.pins-$(cat requirements.txt requirements-nodeps.txt setup.py pyproject.toml | sha1sum | cut -c1-12)-py$pyver"
if [ -f "$stamp" ]; then
  exit 0
fi
echo "bootstrap: creating $VENV with Python $pyver and the pinned TFF 0.87 stack (a few minutes, once)" >&2
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install 'pip==24.0' 'setuptools>=68,<76' wheel
"${pip[@]}" install -r requirements.txt
"${pip[@]}" install --no-deps -r requirements-nodeps.txt
# Editable, through setuptools' PEP 660 hook (pyproject.toml): the console commands are plain
# wrappers. compat mode puts the checkout itself on sys.path (a .pth line), as the legacy
# `setup.py develop` did (tests/test_bazel_isolation.py relies on it).
"${pip[@]}" install --no-deps --no-build-isolation -e . --config-settings editable_mode=compat
TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" -c 'import tensorflow_federated as tff; print("bootstrap: tensorflow-federated", tff.__version__, "ready")' >&2
touch "$stamp"
