#!/usr/bin/env bash
# Code checks, as CI runs them: the formatter in check mode (pyink, Google's
# black with 2-space indents), the linter (pylint) and the type checker
# (pytype) over tff_algos/, tasks/, privacy/, run/, tools/ and tests/, all
# configured in pyproject.toml.
# Usage: scripts/lint.sh            check (fails on any finding)
#        scripts/lint.sh --fix      reformat in place with pyink, then check
# The tools live in .venv-lint (requirements-dev.txt), apart from the pinned
# TFF stack whose attrs/typing-extensions pins they cannot share; pytype's
# per-module results are cached in build/pytype (only changed modules and
# their dependents are re-checked).
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${LINT_VENV:-.venv-lint}
PYTHON=${PYTHON:-python3.11}
die() { echo "lint: error: $*" >&2; exit 2; }

stamp="$VENV/.pins-$(sha1sum requirements-dev.txt | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  command -v "$PYTHON" >/dev/null 2>&1 \
    || die "needs $PYTHON for the tools' venv (pytype supports Python <= 3.12); set PYTHON=/path/to/python3.11"
  echo "lint: creating $VENV with the pinned tools (requirements-dev.txt; once)" >&2
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV" || die "cannot create $VENV"
  "$VENV/bin/python" -m pip --disable-pip-version-check -q install -r requirements-dev.txt \
    || die "cannot install requirements-dev.txt into $VENV"
  touch "$stamp"
fi

targets=(tff_algos tasks privacy run tools tests)
if [ "${1:-}" = "--fix" ]; then
  "$VENV/bin/pyink" -q "${targets[@]}" || exit 1
fi
rc=0
mkdir -p build
start=$(date +%s)
echo "== pyink --check ==" >&2
"$VENV/bin/pyink" --check -q "${targets[@]}" || { echo "lint: pyink: files above need formatting: scripts/lint.sh --fix" >&2; rc=1; }
echo "== pylint ==" >&2
"$VENV/bin/pylint" --jobs=2 "${targets[@]}" || rc=1
echo "== pytype ==" >&2
"$VENV/bin/pytype" --keep-going --jobs=2 --output=build/pytype "${targets[@]}" >build/pytype.log 2>&1 \
  || { grep -E ": error: |FAILED" build/pytype.log >&2; rc=1; }
echo "lint: exit $rc in $(( $(date +%s) - start )) s" >&2
exit $rc
