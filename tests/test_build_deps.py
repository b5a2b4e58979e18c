# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests for tools/build_deps.py: BUILD files generated from the imports."""

# bazel-size: medium
# bazel-tags: external
# (Under Bazel the last test checks the real checkout, which the test's
# runfiles do not hold: `external` keeps Bazel from caching its result.)

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tools import build_deps

REPO_ROOT = Path(__file__).resolve().parent.parent

FAKE_TREE = {
    'pkg/__init__.py': '',
    'pkg/a.py': """
        import os

        import numpy as np

        from pkg import b as bee
        from other.c import SomeClass
        """,
    'pkg/b.py': """
        import collections


        def lazy():
          from other import d  # pylint: disable=g-import-not-at-top
          import tensorflow as tf  # pylint: disable=g-import-not-at-top
          return d, tf
        """,
    'pkg/names.py': """
        from pkg import CONSTANT
        from . import a
        """,
    'other/__init__.py': 'CONSTANT = 1\n',
    'other/c.py': """
        import other.d


        class SomeClass:
          pass
        """,
    'other/d.py': 'from absl import flags\n',
    'tests/__init__.py': '',
    'tests/conftest.py': 'from other import d\n',
    'tests/helpers.py': 'import numpy\n',
    'tests/test_a.py': """
        import pytest

        from pkg import a
        from tests import helpers
        """,
    'tests/test_cli.py': """
        import subprocess
        """,
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
  assert not graph.problems
  assert sorted(map(str, files)) == [
      'BUILD',
      'other/BUILD',
      'pkg/BUILD',
      'tests/BUILD',
  ]
  assert files[Path('pkg/BUILD')] == build_deps.GENERATED_HEADER + """
load("//tools/bazel:defs.bzl", "py_library")

package(default_visibility = ["//visibility:public"])

licenses(["notice"])

# third-party: numpy
py_library(
    name = "a",
    srcs = ["a.py"],
    deps = [
        ":b",
        ":pkg",
        "//other:c",
    ],
)

# third-party: tensorflow
py_library(
    name = "b",
    srcs = ["b.py"],
    deps = [
        ":pkg",
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
"""


def test_generated_other_and_root_build(tree):
  files, _ = build_deps.expected_files(tree)
  other = files[Path('other/BUILD')]
  assert """
py_library(
    name = "c",
    srcs = ["c.py"],
    deps = [
        ":d",
        ":other",
    ],
)
""" in other
  assert """
# third-party: absl
py_library(
    name = "d",
    srcs = ["d.py"],
    deps = [
        ":other",
    ],
)
""" in other
  assert 'exports_files([\n    "requirements.txt",\n])' in files[Path('BUILD')]
  assert 'scripts' not in ''.join(map(str, files))


def test_generated_tests_build(tree):
  files, _ = build_deps.expected_files(tree)
  text = files[Path('tests/BUILD')]
  assert 'runs its pytest module with pytest' in text
  assert 'load("//tools/bazel:defs.bzl", "py_library", "py_test")' in text
  assert """
# third-party: pytest
py_test(
    name = "test_a",
    size = "medium",
    srcs = ["test_a.py"],
    deps = [
        ":conftest",
        ":helpers",
        ":tests",
        "//pkg:a",
    ],
)
""" in text
  assert """
py_test(
    name = "test_cli",
    size = "large",
    srcs = ["test_cli.py"],
    deps = [
        ":conftest",
        ":tests",
    ],
)
""" in text
  assert """
py_library(
    name = "conftest",
    testonly = True,
    srcs = ["conftest.py"],
    deps = [
        ":tests",
        "//other:d",
    ],
)
""" in text
  assert (
      'name = "tests",\n    testonly = True,\n    srcs = ["__init__.py"],'
      in text
  )


def test_output_is_deterministic(tree):
  first, _ = build_deps.expected_files(tree)
  second, _ = build_deps.expected_files(tree)
  assert first == second
  pkg = first[Path('pkg/BUILD')]
  names = [
      line.split('"')[1]
      for line in pkg.splitlines()
      if line.startswith('    name = ')
  ]
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
  assert out == [
      'pkg/BUILD: :names (pkg/names.py) lacks dep //other:d'
      ' (imported by the module)'
  ]


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
  assert out == [
      'pkg/BUILD: differs from the generated text (header,'
      ' comments, order or formatting)'
  ]


def test_unresolved_import_and_cycle_are_reported(tree, capsys):
  (tree / 'other' / 'd.py').write_text(
      'import pkg.missing\nfrom pkg import a\n'
  )
  rc, out = run_main(capsys, '--write', '--root', str(tree))
  assert rc == 1
  rc, out = run_main(capsys, '--check', '--root', str(tree))
  assert rc == 1
  assert (
      'other/d.py:1: import of pkg.missing names no module of this'
      ' repository'
  ) in out
  assert (
      'dependency cycle (Bazel rejects it): //other:c -> //other:d'
      ' -> //pkg:a -> //other:c'
  ) in out


def test_library_importing_test_helper_is_reported(tree):
  (tree / 'pkg' / 'b.py').write_text('from tests import helpers\n')
  _, graph = build_deps.expected_files(tree)
  assert graph.problems == [
      'pkg/b.py: imports tests/helpers.py, but //pkg:b is not testonly and'
      ' //tests:helpers is'
  ]


def test_size_override(tree):
  (tree / 'tests' / 'test_cli.py').write_text(
      'import subprocess\n# bazel-size: enormous\n'
  )
  files, _ = build_deps.expected_files(tree)
  assert (
      'name = "test_cli",\n    size = "enormous",' in files[Path('tests/BUILD')]
  )


def test_package_init_dep_is_left_out_where_it_would_close_a_cycle(tmp_path):
  make_tree(
      tmp_path,
      {
          'top/__init__.py': '',
          'top/sub/__init__.py': 'from top.sub.impl import run\n',
          'top/sub/impl.py': 'def run():\n  return 1\n',
          'top/sub/other.py': 'import top.sub.impl\n',
      },
  )
  _, graph = build_deps.expected_files(tmp_path)
  assert not graph.problems
  targets = {t.name: t for t in graph.targets['top.sub']}
  # `impl` is imported by its package's __init__: no dep back on it.
  assert {n: t.deps for n, t in targets.items()} == {
      'impl': [],
      'other': [':impl', ':sub'],
      'sub': [':impl', '//top'],
  }
  assert targets['other'].dep_reasons == {
      ':impl': 'imported',
      ':sub': 'package',
  }
  assert targets['sub'].dep_reasons == {':impl': 'imported', '//top': 'package'}


CLI_TEST = """
import subprocess
# bazel-data: docs/notes.md requirements.txt
# bazel-tags: external
COMMANDS = [['python', '-m', 'pkg.names'], ['bash', 'scripts/run.sh']]
TABLE = 'pkg/table.csv'
IGNORED = ['tests/BUILD', 'pkg/a.py', 'requirements.txt', 'no/such.txt']
"""

CLI_TARGET = """
py_test(
    name = "test_cli",
    size = "large",
    srcs = ["test_cli.py"],
    data = [
        "//:docs/notes.md",
        "//:requirements.txt",
        "//:scripts/run.sh",
        "//pkg:table.csv",
    ],
    tags = [
        "external",
    ],
    deps = [
        ":conftest",
        ":tests",
        "//pkg:names",
    ],
)
"""


def test_named_module_and_data_files(tree, capsys):
  (tree / 'scripts' / 'run.sh').write_text('echo hi\n')
  (tree / 'docs').mkdir()
  (tree / 'docs' / 'notes.md').write_text('notes\n')
  (tree / 'pkg' / 'table.csv').write_text('1\n')
  (tree / 'tests' / 'test_cli.py').write_text(CLI_TEST)
  files, graph = build_deps.expected_files(tree)
  assert not graph.problems
  assert CLI_TARGET in files[Path('tests/BUILD')]
  assert files[Path('BUILD')].endswith(
      '\nexports_files([\n    "docs/notes.md",\n    "requirements.txt",\n'
      '    "scripts/run.sh",\n])\n'
  )
  assert '\nexports_files([\n    "table.csv",\n])\n' in files[Path('pkg/BUILD')]
  test_cli = next(t for t in graph.targets['tests'] if t.name == 'test_cli')
  assert test_cli.dep_reasons['//pkg:names'] == 'named'
  assert build_deps.main(['--write', '--root', str(tree)]) == 0
  build = tree / 'tests' / 'BUILD'
  build.write_text(
      build.read_text().replace('        "//:scripts/run.sh",\n', '')
  )
  capsys.readouterr()
  rc, out = run_main(capsys, '--check', '--root', str(tree))
  assert rc == 1
  assert out == [
      "tests/BUILD: :test_cli (tests/test_cli.py) has data ['//:docs/notes.md',"
      " '//:requirements.txt', '//pkg:table.csv'], expected"
      " ['//:docs/notes.md', '//:requirements.txt', '//:scripts/run.sh',"
      " '//pkg:table.csv']"
  ]


def test_bad_data_directive_is_reported(tree):
  (tree / 'tests' / 'test_cli.py').write_text(
      '# bazel-data: docs/missing.md ../outside.txt\n'
  )
  _, graph = build_deps.expected_files(tree)
  assert graph.problems == [
      "tests/test_cli.py: bazel-data 'docs/missing.md' names no file of this"
      ' repository (a path from its root)',
      "tests/test_cli.py: bazel-data '../outside.txt' names no file of this"
      ' repository (a path from its root)',
  ]


def notebook(*cells):
  return json.dumps(
      {
          'cells': [
              {'cell_type': kind, 'source': source, 'metadata': {}}
              for kind, source in cells
          ],
          'metadata': {},
          'nbformat': 4,
          'nbformat_minor': 5,
      }
  )


def test_notebook_in_data_adds_its_imports(tree):
  (tree / 'examples').mkdir()
  (tree / 'examples' / 'demo.ipynb').write_text(
      notebook(
          ('markdown', 'import nothing.here'),
          (
              'code',
              [
                  '%matplotlib inline\n',
                  'from pkg import names\n',
                  '!pip install x\n',
                  'import numpy as np\n',
              ],
          ),
          ('code', 'def f():\n  from pkg import a\n  return a\n'),
      )
  )
  (tree / 'tests' / 'test_nb.py').write_text(
      '# bazel-data: examples/demo.ipynb\nimport pytest\n'
  )
  _, graph = build_deps.expected_files(tree)
  assert not graph.problems
  target = next(t for t in graph.targets['tests'] if t.name == 'test_nb')
  assert target.data == ['//:examples/demo.ipynb']
  assert {
      dep: why for dep, why in target.dep_reasons.items() if why == 'notebook'
  } == {'//pkg:a': 'notebook', '//pkg:names': 'notebook'}
  assert target.third_party == ['numpy', 'pytest']


def test_broken_notebook_is_reported(tree):
  (tree / 'examples').mkdir()
  (tree / 'examples' / 'bad.ipynb').write_text(
      notebook(('code', 'from pkg import names\ndef (\n'))
  )
  (tree / 'examples' / 'worse.ipynb').write_text('{not json')
  (tree / 'tests' / 'test_nb.py').write_text(
      '# bazel-data: examples/bad.ipynb examples/worse.ipynb\n'
  )
  _, graph = build_deps.expected_files(tree)
  assert len(graph.problems) == 2
  assert graph.problems[0].startswith(
      'examples/bad.ipynb: not a notebook whose code cells parse:'
  )
  assert graph.problems[1].startswith(
      'examples/worse.ipynb: not a notebook whose code cells parse:'
  )


def test_check_on_the_real_repository():
  """Last: the checked-in BUILD files match the current source tree."""
  proc = subprocess.run(
      [sys.executable, '-m', 'tools.build_deps', '--check'],
      cwd=REPO_ROOT,
      capture_output=True,
      text=True,
      timeout=120,
      check=False,
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert proc.stdout == 'BUILD files are up to date\n'
