# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The import isolation that makes a missing BUILD dep fail `bazel test`.

tools/bazel/sitecustomize.py runs at start-up in every Python of a Bazel test.
These tests build a runfiles-like tree by hand and show, with the project's
own virtual environment, that (1) its editable install puts a checkout of the
repository on sys.path, so without isolation a package missing from the
runfiles would still import; (2) with the isolation it does not; (3) modules
that are in the runfiles still import, from the runfiles. Under pytest and
under Bazel alike. scripts/bazel_test.sh checks the same end to end with
Bazel (tools/bazel/testdata).
"""

# bazel-size: small
# bazel-data: tools/bazel/sitecustomize.py

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITECUSTOMIZE = os.path.join(ROOT, 'tools', 'bazel', 'sitecustomize.py')
BAZEL_VARS = (
    'PYTHONPATH',
    'RUNFILES_DIR',
    'TEST_SRCDIR',
    'RUNFILES_MANIFEST_FILE',
    'PYTHONSAFEPATH',
)


def load_sitecustomize():
  """Loads the sitecustomize as a module, asserting it changes nothing here."""
  spec = importlib.util.spec_from_file_location(
      'isolation_under_test', SITECUSTOMIZE
  )
  module = importlib.util.module_from_spec(spec)
  environ = dict(os.environ)
  for name in BAZEL_VARS:
    environ.pop(name, None)
  # Loading runs `isolate()` on this process: with no Bazel variables set it
  # must change nothing.
  path_before = list(sys.path)
  os.environ.clear()
  try:
    os.environ.update(environ)
    spec.loader.exec_module(module)
  finally:
    os.environ.clear()
    os.environ.update(environ)
  assert module.DROPPED == [] and sys.path == path_before
  return module


@pytest.fixture
def runfiles(tmp_path):
  """A runfiles tree holding the isolation and tff_algos/runtime.py only."""
  workspace = tmp_path / 'runfiles' / 'ws'
  (workspace / 'tools' / 'bazel').mkdir(parents=True)
  shutil.copy(SITECUSTOMIZE, workspace / 'tools' / 'bazel')
  (workspace / 'tff_algos').mkdir()
  (workspace / 'tff_algos' / '__init__.py').write_text('')
  shutil.copy(
      os.path.join(ROOT, 'tff_algos', 'runtime.py'), workspace / 'tff_algos'
  )
  return workspace


def run_python(code, workspace, bazel):
  env = {k: v for k, v in os.environ.items() if k not in BAZEL_VARS}
  env['PYTHONPATH'] = os.pathsep.join(
      [str(workspace / 'tools' / 'bazel'), str(workspace)]
  )
  if bazel:
    env['RUNFILES_DIR'] = str(workspace.parent)
  return subprocess.run(
      [sys.executable, '-c', code],
      cwd=workspace,
      env=env,
      capture_output=True,
      text=True,
      timeout=60,
      check=False,
  )


def test_editable_install_puts_a_checkout_on_sys_path(tmp_path):
  env = {k: v for k, v in os.environ.items() if k not in BAZEL_VARS}
  proc = subprocess.run(
      [sys.executable, '-c', 'import sys; print("\\n".join(sys.path[1:]))'],
      cwd=tmp_path,
      env=env,
      capture_output=True,
      text=True,
      timeout=60,
      check=True,
  )
  checkouts = [
      p
      for p in proc.stdout.splitlines()
      if os.path.isfile(os.path.join(p, 'tff_algos', 'term.py'))
  ]
  assert checkouts, proc.stdout


def test_package_missing_from_runfiles_imports_without_isolation(runfiles):
  """The hazard: the checkout behind the editable install fills the gap."""
  proc = run_python(
      'import tasks.tail_metrics as m; print(m.__file__)', runfiles, bazel=False
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip().endswith(os.path.join('tasks', 'tail_metrics.py'))
  assert not proc.stdout.startswith(str(runfiles))


def test_package_missing_from_runfiles_fails_under_isolation(runfiles):
  proc = run_python('import tasks.tail_metrics', runfiles, bazel=True)
  assert proc.returncode == 1
  assert "ModuleNotFoundError: No module named 'tasks'" in proc.stderr


@pytest.mark.parametrize('bazel', [False, True])
def test_module_missing_from_a_package_in_runfiles_fails(runfiles, bazel):
  """A regular package found in the runfiles hides the checkout's copy."""
  proc = run_python('import tff_algos.term', runfiles, bazel=bazel)
  assert proc.returncode == 1
  assert "ModuleNotFoundError: No module named 'tff_algos.term'" in proc.stderr


def test_module_in_runfiles_imports_from_runfiles(runfiles):
  proc = run_python(
      'import sys, tff_algos.runtime as m; print(m.__file__);'
      ' print(all(p.startswith(sys.prefix) or p.startswith(sys.base_prefix)'
      f' or p.startswith({str(runfiles.parent)!r}) for p in sys.path[1:]))',
      runfiles,
      bazel=True,
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines() == [
      str(runfiles / 'tff_algos' / 'runtime.py'),
      'True',
  ]


def test_isolate_keeps_runfiles_and_interpreter_paths(tmp_path, monkeypatch):
  isolation = load_sitecustomize()
  runfiles = tmp_path / 'runfiles'
  (runfiles / 'ws').mkdir(parents=True)
  source = tmp_path / 'checkout'
  source.mkdir()
  stdlib = os.path.dirname(os.__file__)

  class EditableFinder:
    pass

  EditableFinder.__module__ = '__editable___tff_hetero_0_1_0_finder'
  finder = EditableFinder()
  monkeypatch.setattr(
      sys, 'path', [str(runfiles / 'ws'), str(source), stdlib, str(runfiles)]
  )
  monkeypatch.setattr(sys, 'meta_path', list(sys.meta_path) + [finder])
  dropped = isolation.isolate({'RUNFILES_DIR': str(runfiles)})
  assert dropped == [str(source)]
  assert sys.path == [str(runfiles / 'ws'), stdlib, str(runfiles)]
  assert finder not in sys.meta_path
  assert isolation.isolate({}) == []
