# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests for tools/build_deps.py: BUILD files generated from the imports."""

# bazel-size: medium

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tools import build_deps

REPO_ROOT = Path(__file__).resolve().parent.parent

FAKE_TREE = {
    'pkg/__init__.py': '',
    'pkg/a.py': '''
        import os

        import numpy as np

        from pkg import b as bee
        from other.c import SomeClass
        ''',
    'pkg/b.py': '''
        import collections


        def lazy():
          from other import d  # pylint: disable=g-import-not-at-top
          import tensorflow as tf  # pylint: disable=g-import-not-at-top
          return d, tf
        ''',
    'pkg/names.py': '''
        from pkg import CONSTANT
        from . import a
        ''',
    'other/__init__.py': 'CONSTANT = 1\n',
    'other/c.py': '''
        import other.d


        class SomeClass:
          pass
        ''',
    'other/d.py': 'from absl import flags\n',
    'tests/__init__.py': '',
    'tests/conftest.py': 'from other import d\n',
    'tests/helpers.py': 'import numpy\n',
    'tests/test_a.py': '''
        import pytest

        from pkg import a
        from tests import helpers
        ''',
    'tests/test_cli.py': '''
        import subprocess
        ''',
    'scripts/not_a_package.py': 'import pkg.a\n',
    'requirements.txt': 'numpy\n',
}


def make_tree(root, files=None):
  for rel, text in (FAKE_TREE if files is None else files).items():
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip('\n'))
  return root


def run_main(capsys, *args):
  rc = build_deps.main(list(args))
  out, _ = capsys.readouterr()
  return rc, out.splitlines()


@pytest.fixture
def tree(tmp_path):
  return make_tree(tmp_path)


def test_generated_pkg_build(tree):
  files, graph = build_deps.expected_files(tree)
  assert graph.problems == []
  assert sorted(map(str, files)) == [
      'BUILD', 'other/BUILD', 'pkg/BUILD', 'tests/BUILD']
  assert files[Path('pkg/BUILD')] == build_deps.GENERATED_HEADER + '''
package(default_visibility = ["//visibility:public"])

licenses(["notice"])

# third-party: numpy
py_library(
    name = "a",
    srcs = ["a.py"],
    deps = [
        ":b",
        "//other:c",
    ],
)

# third-party: tensorflow
py_library(
    name = "b",
    srcs = ["b.py"],
    deps = [
        "//other:d",
    ],
)

py_library(
    name = "names",
    srcs = ["names.py"],
    deps = [
        ":a",
        ":pkg",
    ],
)

py_library(
    name = "pkg",
    srcs = ["__init__.py"],
)
'''


def test_generated_other_and_root_build(tree):
  files, _ = build_deps.expected_files(tree)
  other = files[Path('other/BUILD')]
  assert '''
py_library(
    name = "c",
    srcs = ["c.py"],
    deps = [
        ":d",
    ],
)
''' in other
  assert '''
# third-party: absl
py_library(
    name = "d",
    srcs = ["d.py"],
)
''' in other
  assert 'exports_files([\n    "requirements.txt",\n])' in files[Path('BUILD')]
  assert 'scripts' not in ''.join(map(str, files))


def test_generated_tests_build(tree):
  files, _ = build_deps.expected_files(tree)
  text = files[Path('tests/BUILD')]
  assert 'pytest-style' in text and "issue #8's job" in text
  assert '''
# third-party: pytest
py_test(
    name = "test_a",
    size = "medium",
    srcs = ["test_a.py"],
    deps = [
        ":conftest",
        ":helpers",
        "//pkg:a",
    ],
)
''' in text
  assert '''
py_test(
    name = "test_cli",
    size = "large",
    srcs = ["test_cli.py"],
    deps = [
        ":conftest",
    ],
)
''' in text
  assert '''
py_library(
    name = "conftest",
    testonly = True,
    srcs = ["conftest.py"],
    deps = [
        "//other:d",
    ],
)
''' in text
  assert 'name = "tests",\n    testonly = True,\n    srcs = ["__init__.py"],' in text


def test_output_is_deterministic(tree):
  first, _ = build_deps.expected_files(tree)
  second, _ = build_deps.expected_files(tree)
  assert first == second
  pkg = first[Path('pkg/BUILD')]
  names = [line.split('"')[1] for line in pkg.splitlines()
           if line.startswith('    name = ')]
  assert names == sorted(names)


def test_check_passes_after_write(tree, capsys):
  rc, out = run_main(capsys, '--check', '--root', str(tree))
  assert rc == 1
  assert 'pkg/BUILD: missing' in out
  rc, out = run_main(capsys, '--write', '--root', str(tree))
  assert rc == 0
  assert 'wrote pkg/BUILD' in out
  rc, out = run_main(capsys, '--check', '--root', str(tree))
  assert (rc, out) == (0, ['BUILD files are up to date'])
  rc, out = run_main(capsys, '--write', '--root', str(tree))
  assert (rc, out) == (0, ['BUILD files were already up to date'])


def test_new_import_fails_check(tree, capsys):
  assert run_main(capsys, '--write', '--root', str(tree))[0] == 0
  with open(tree / 'pkg' / 'names.py', 'a') as f:
    f.write('\n\ndef f():\n  import other.d\n  return other.d\n')
  rc, out = run_main(capsys, '--check', '--root', str(tree))
  assert rc == 1
  assert out == ['pkg/BUILD: :names (pkg/names.py) lacks dep //other:d'
                 ' (imported by the module)']


def test_new_module_and_stale_target_fail_check(tree, capsys):
  assert run_main(capsys, '--write', '--root', str(tree))[0] == 0
  (tree / 'pkg' / 'new.py').write_text('import pkg.a\n')
  (tree / 'other' / 'c.py').unlink()
  (tree / 'pkg' / 'a.py').write_text('import numpy\n')
  rc, out = run_main(capsys, '--check', '--root', str(tree))
  assert rc == 1
  assert sorted(out) == [
      'other/BUILD: stale target :c (no module other/c.py)',
      'pkg/BUILD: :a (pkg/a.py) has dep //other:c that the module does not'
      ' import',
      'pkg/BUILD: :a (pkg/a.py) has dep :b that the module does not import',
      'pkg/BUILD: pkg/new.py has no target (expected py_library :new)',
  ]
  assert build_deps.main(['--write', '--root', str(tree)]) == 0
  assert build_deps.main(['--check', '--root', str(tree)]) == 0


def test_hand_edit_fails_check(tree, capsys):
  assert run_main(capsys, '--write', '--root', str(tree))[0] == 0
  build = tree / 'pkg' / 'BUILD'
  build.write_text(build.read_text().replace('# third-party: numpy\n', ''))
  rc, out = run_main(capsys, '--check', '--root', str(tree))
  assert rc == 1
  assert out == ['pkg/BUILD: differs from the generated text (header,'
                 ' comments, order or formatting)']


def test_unresolved_import_and_cycle_are_reported(tree, capsys):
  (tree / 'other' / 'd.py').write_text('import pkg.missing\nfrom pkg import a\n')
  rc, out = run_main(capsys, '--write', '--root', str(tree))
  assert rc == 1
  rc, out = run_main(capsys, '--check', '--root', str(tree))
  assert rc == 1
  assert ('other/d.py:1: import of pkg.missing names no module of this'
          ' repository') in out
  assert ('dependency cycle (Bazel rejects it): //other:c -> //other:d'
          ' -> //pkg:a -> //other:c') in out


def test_library_importing_test_helper_is_reported(tree):
  (tree / 'pkg' / 'b.py').write_text('from tests import helpers\n')
  _, graph = build_deps.expected_files(tree)
  assert graph.problems == [
      'pkg/b.py: imports tests/helpers.py, but //pkg:b is not testonly and'
      ' //tests:helpers is']


def test_size_override(tree):
  (tree / 'tests' / 'test_cli.py').write_text(
      'import subprocess\n# bazel-size: enormous\n')
  files, _ = build_deps.expected_files(tree)
  assert 'name = "test_cli",\n    size = "enormous",' in files[
      Path('tests/BUILD')]


def test_check_on_the_real_repository():
  """Last: the checked-in BUILD files match the current source tree."""
  proc = subprocess.run(
      [sys.executable, '-m', 'tools.build_deps', '--check'], cwd=REPO_ROOT,
      capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert proc.stdout == 'BUILD files are up to date\n'
