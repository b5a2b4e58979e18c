# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Runs one pytest module as a Bazel py_test (the `main` of defs.bzl's py_test).

  pytest_main.py tests/test_x.py [pytest args]

The path is relative to the runfiles root of this workspace, which Bazel makes
the working directory. pytest runs with the repository's pytest.ini, its
temporary directories under TEST_TMPDIR and a JUnit report at XML_OUTPUT_FILE,
as Bazel expects; `bazel test --test_filter=EXPR` becomes `pytest -k EXPR`.
The exit status is pytest's (0 when every test passed).
"""

import os
import sys

import sitecustomize


def main(argv: list[str]) -> int:
  if len(argv) < 2:
    print(
        'pytest_main: error: usage: pytest_main.py TEST_MODULE [ARGS]',
        file=sys.stderr,
    )
    return 2
  # Python put this file's real directory (in the source tree) first.
  sitecustomize.isolate()
  import pytest  # pylint: disable=g-import-not-at-top

  args = [
      '-c',
      'pytest.ini',
      '--rootdir',
      os.getcwd(),
      '-p',
      'no:cacheprovider',
  ]
  tmp = os.environ.get('TEST_TMPDIR')
  if tmp:
    args.append('--basetemp=' + os.path.join(tmp, 'pytest'))
  xml = os.environ.get('XML_OUTPUT_FILE')
  if xml:
    args.append('--junitxml=' + xml)
  only = os.environ.get('TESTBRIDGE_TEST_ONLY')  # bazel test --test_filter=
  if only:
    args += ['-k', only]
  return int(pytest.main(args + [argv[1]] + argv[2:]))


if __name__ == '__main__':
  sys.exit(main(sys.argv))
