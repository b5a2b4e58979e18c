#!/usr/bin/env bash
# Code checks, as CI runs them: the formatter in check mode (pyink, Google's
# black with 2-space indents), the linter (pylint) and the type checker
# (pytype, with a canary type error it must report) over tff_algos/, tasks/,
# privacy/, run/ and tools/ (pyink and pylint: tests/ too), all configured in
# pyproject.toml.
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
# pytype checks the library and its tools; tests are checked by running them
# (and pytype's inference over pytest fixtures and parametrized helpers adds
# minutes to CI for little gain).
typed=(tff_algos tasks privacy run tools)
if [ "${1:-}" = "--fix" ]; then
  "$VENV/bin/pyink" -q "${targets[@]}" || exit 1
fi
rc=0
mkdir -p build
start=$(date +%s)
echo "== pyink --check ==" >&2
"$VENV/bin/pyink" --check "${targets[@]}" >build/pyink.log 2>&1
pyink_rc=$?
grep "^would reformat" build/pyink.log >&2
if [ "$pyink_rc" -ne 0 ]; then
  echo "lint: pyink: files above need formatting: scripts/lint.sh --fix" >&2
  rc=1
fi
echo "== pylint ==" >&2
"$VENV/bin/pylint" --jobs=2 "${targets[@]}" || rc=1
echo "== pytype ==" >&2
"$VENV/bin/pytype" --keep-going --jobs=2 --output=build/pytype "${typed[@]}" >build/pytype.log 2>&1 \
  || { grep -E ": error: |FAILED" build/pytype.log >&2; rc=1; }
# The canary: a builder called with a wrong argument type must be reported,
# against the project's own inferred stubs (build/pytype/pyi).
echo "== pytype canary (scripts/lint_canary.py must fail) ==" >&2
if "$VENV/bin/pytype-single" --python_version=3.11 --disable=import-error \
    --pythonpath=build/pytype/pyi scripts/lint_canary.py >build/pytype_canary.log 2>&1; then
  echo "lint: error: pytype did not report the deliberate type error in scripts/lint_canary.py" >&2
  rc=1
elif ! grep -q "wrong-arg-types" build/pytype_canary.log; then
  echo "lint: error: pytype failed on scripts/lint_canary.py without the expected wrong-arg-types:" >&2
  cat build/pytype_canary.log >&2
  rc=1
else
  grep -m1 "wrong-arg-types" build/pytype_canary.log >&2
fi
# The formatter and linter canaries: each must reject a known-bad snippet, so
# a broken configuration (e.g. an exclude that matches everything) fails too.
if printf 'x = [1,2]\n' | "$VENV/bin/pyink" --check -q - 2>/dev/null; then
  echo "lint: error: pyink accepted unformatted code (canary)" >&2; rc=1
fi
if printf '"""Canary."""\nimport os\n' \
    | "$VENV/bin/pylint" --from-stdin lint_canary_stdin.py >/dev/null 2>&1; then
  echo "lint: error: pylint accepted an unused import (canary)" >&2; rc=1
fi
echo "lint: exit $rc in $(( $(date +%s) - start )) s" >&2
exit $rc
