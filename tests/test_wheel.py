# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The package as a user installs it: the wheel, outside the checkout.

Builds the sdist from the checkout and the wheel from the sdist (so both are
complete), installs the wheel with README's "Install with pip" commands into a
virtual environment, and from a folder outside the checkout, with the checkout
not on `sys.path`: imports every module, runs each console command's `--help`,
a two-round synthetic training run, and the quick-start notebook.

The environment is `build/wheel-venv`: README's first command (the pinned
stack), `requirements.txt` (adds the tools that run the notebook), README's
second command (TFF, jax and jaxlib with `--no-deps`), the same order as
scripts/bootstrap.sh. It is built once (a few minutes; PyPI or pip's cache)
and reused while README's commands, the requirements and the Python version
are unchanged; only the wheel is reinstalled on each run. Slow: `pytest -m
"not wheel"` leaves it out; `pytest -m wheel` runs it alone.
"""

# bazel-tags: manual
# bazel-size: large
# bazel-data: setup.py pyproject.toml MANIFEST.in README.md
# bazel-data: requirements.txt requirements-nodeps.txt examples/quickstart.ipynb

import concurrent.futures
import contextlib
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile

import pytest

from tests import binary
from tests import package_sources

pytestmark = pytest.mark.wheel

ROOT = package_sources.ROOT
VENV = os.path.join(ROOT, 'build', 'wheel-venv')
VERSION = '0.1.0'


def _run(args, *, cwd, env=None, timeout=900):
  """`(code, stdout, stderr)` of `args` in their own process group."""
  with subprocess.Popen(
      args,
      cwd=cwd,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,
  ) as proc:
    try:
      stdout, stderr = proc.communicate(timeout=timeout)
    finally:
      try:
        os.killpg(proc.pid, 9)
      except ProcessLookupError:
        pass
  return proc.returncode, stdout, stderr


def _check(args, **kwargs):
  code, stdout, stderr = _run(args, **kwargs)
  assert code == 0, f'{args}: exit {code}\n{stdout[-3000:]}\n{stderr[-3000:]}'
  return stdout


def _pip(venv, args):
  return [
      os.path.join(venv, 'bin', 'python'),
      '-m',
      'pip',
      '--disable-pip-version-check',
      '-q',
  ] + args


def _stamp() -> str:
  digest = hashlib.sha256()
  digest.update(repr(package_sources.readme_pip_commands()[:2]).encode())
  for name in ('requirements.txt', 'requirements-nodeps.txt'):
    with open(os.path.join(ROOT, name), 'rb') as f:
      digest.update(f.read())
  digest.update(sys.version.encode())
  return os.path.join(VENV, f'.pins-{digest.hexdigest()[:12]}')


def _user_env(venv):
  """A user's environment: the venv's commands first, no checkout path."""
  env = {
      k: v
      for k, v in os.environ.items()
      if k not in ('PYTHONPATH', 'VIRTUAL_ENV', 'PYTHONHOME')
  }
  env['PATH'] = os.path.join(venv, 'bin') + os.pathsep + env.get('PATH', '')
  env['TF_CPP_MIN_LOG_LEVEL'] = '3'
  env['PYTHONNOUSERSITE'] = '1'
  return env


@contextlib.contextmanager
def _venv_lock():
  """Holds `build/wheel-venv.lock`: one process at a time changes the venv.

  pytest-xdist runs a module fixture once per worker process, and the suite's
  work stealing can hand this module's tests to two workers: without the lock
  both built the venv at once, one deleting what the other installed. The lock
  also guards the sdist build, which writes its egg-info in the checkout.
  """
  os.makedirs(os.path.dirname(VENV), exist_ok=True)
  with open(VENV + '.lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def _this_run() -> str:
  """An id shared by the worker processes of one pytest run."""
  return os.environ.get('PYTEST_XDIST_TESTRUNUID') or str(os.getpid())


@pytest.fixture(scope='module')
def venv(tmp_path_factory):
  """`build/wheel-venv` with the pinned stack (built when the pins change)."""
  with _venv_lock():
    _build_venv(tmp_path_factory)
  return VENV


def _build_venv(tmp_path_factory):
  stamp = _stamp()
  if not os.path.exists(stamp):
    shutil.rmtree(VENV, ignore_errors=True)
    cwd = str(tmp_path_factory.mktemp('venv_build'))
    _check([sys.executable, '-m', 'venv', VENV], cwd=cwd)
    _check(
        _pip(VENV, ['install', 'pip==24.0', 'setuptools>=68,<76', 'wheel']),
        cwd=cwd,
    )
    stack, nodeps, _ = package_sources.readme_pip_commands()
    _check(_pip(VENV, stack[1:]), cwd=cwd, timeout=1800)
    _check(
        _pip(VENV, ['install', '-r', os.path.join(ROOT, 'requirements.txt')]),
        cwd=cwd,
        timeout=1800,
    )
    _check(_pip(VENV, nodeps[1:]), cwd=cwd)
    with open(stamp, 'w'):
      pass


@pytest.fixture(scope='module')
def dists(tmp_path_factory):
  """`(sdist, wheel)`: the sdist of the checkout, the wheel of the sdist."""
  out = str(tmp_path_factory.mktemp('dist'))
  build = (
      'from setuptools import build_meta; import sys; '
      'print(build_meta.build_{}(sys.argv[1]))'
  )
  with _venv_lock():  # The sdist build writes its egg-info in the checkout.
    name = _check(
        [sys.executable, '-c', build.format('sdist'), out], cwd=ROOT
    ).split()[-1]
  sdist = os.path.join(out, name)
  with tarfile.open(sdist) as tar:
    tar.extractall(out)
  source = os.path.join(out, f'tff_hetero-{VERSION}')
  name = _check(
      [sys.executable, '-c', build.format('wheel'), out], cwd=source
  ).split()[-1]
  return sdist, os.path.join(out, name)


@pytest.fixture(scope='module')
def installed(venv, dists):
  """The venv with the fresh wheel installed by README's third command.

  Installed once per pytest run: a second worker of the same run finds it
  installed and leaves it in place (reinstalling would pull it from under
  the first worker's running tests).
  """
  marker = os.path.join(venv, f'.installed-{_this_run()}')
  with _venv_lock():
    if not os.path.exists(marker):
      for old in glob.glob(os.path.join(venv, '.installed-*')):
        os.remove(old)
      *package_command, _ = package_sources.readme_pip_commands()[2]
      _run(
          _pip(venv, ['uninstall', '-y', 'tff-hetero']),
          cwd=os.path.dirname(dists[1]),
      )
      _check(
          _pip(venv, package_command[1:] + [dists[1]]),
          cwd=os.path.dirname(dists[1]),
      )
      with open(marker, 'w'):
        pass
  return venv


@pytest.fixture
def outside(tmp_path):
  """A working folder outside the checkout."""
  assert not str(tmp_path).startswith(ROOT)
  return str(tmp_path)


def _not_installed(path: str) -> bool:
  """Whether `path` (relative to the checkout) is in setup's NOT_INSTALLED."""
  package = os.path.dirname(path).replace(os.sep, '.')
  return any(
      package == p or package.startswith(p.rstrip('*'))
      for p in package_sources.load_setup().NOT_INSTALLED
  )


def _modules_in_checkout():
  modules = []
  for package in package_sources.load_setup().PACKAGES:
    for path in glob.glob(
        os.path.join(ROOT, package, '**', '*.py'), recursive=True
    ):
      modules.append(os.path.relpath(path, ROOT))
  return sorted(m for m in modules if not _not_installed(m))


def _data_files_in_checkout():
  """Files of the packages other than modules, BUILD files and caches."""
  found = []
  for package in package_sources.load_setup().PACKAGES:
    for folder, dirs, files in os.walk(os.path.join(ROOT, package)):
      dirs[:] = [d for d in dirs if d != '__pycache__']
      found += [
          os.path.relpath(os.path.join(folder, f), ROOT)
          for f in files
          if not f.endswith('.py') and f != 'BUILD'
      ]
  return sorted(f for f in found if not _not_installed(f))


def test_wheel_and_sdist_hold_every_module_and_command(dists):
  sdist, wheel = dists
  with zipfile.ZipFile(wheel) as zf:
    names = set(zf.namelist())
    entry_points = zf.read(
        f'tff_hetero-{VERSION}.dist-info/entry_points.txt'
    ).decode()
  expected = _modules_in_checkout() + _data_files_in_checkout()
  assert not set(expected) - names
  for package in ('tff_algos/', 'tasks/', 'privacy/', 'run/'):
    assert any(n.startswith(package) for n in names), package
  assert not [n for n in names if n.startswith('tests/') or '/BUILD' in n]
  assert not [n for n in names if n.startswith('run/experiments/')]
  setup = package_sources.load_setup()
  commands = dict(
      re.findall(r'^(tff-hetero-\S+) = (\S+)$', entry_points, re.MULTILINE)
  )
  assert commands == {
      setup.command_name(m): f'{m}:run_main' for m in setup.BINARIES
  }
  with tarfile.open(sdist) as tar:
    in_sdist = {n.split('/', 1)[1] for n in tar.getnames() if '/' in n}
  assert set(expected) <= in_sdist
  assert {
      'setup.py',
      'pyproject.toml',
      'README.md',
      'requirements.txt',
      'requirements-nodeps.txt',
      'examples/quickstart.ipynb',
  } <= in_sdist


_IMPORT_ALL = textwrap.dedent("""\
    import importlib, json, os, pkgutil, sys
    from absl import flags
    root = sys.argv[1]
    assert root not in [os.path.abspath(p or '.') for p in sys.path]
    files = {}
    for package in ('tff_algos', 'tasks', 'privacy', 'run'):
      names = [package] + [
          info.name for info in pkgutil.walk_packages(
              importlib.import_module(package).__path__, package + '.')]
      for name in names:
        before = set(flags.FLAGS)
        files[name] = importlib.import_module(name).__file__
        for flag in set(flags.FLAGS) - before:  # Binaries share flag names.
          delattr(flags.FLAGS, flag)
    from tff_algos import runtime
    runtime.kill_workers()
    print(json.dumps(files))
    sys.stdout.flush()
    os._exit(0)
    """)


def test_every_module_imports_outside_the_checkout(installed, outside):
  python = os.path.join(installed, 'bin', 'python')
  out = _check(
      [python, '-c', _IMPORT_ALL, ROOT], cwd=outside, env=_user_env(installed)
  )
  files = json.loads(out.strip().splitlines()[-1])
  site = os.path.join(installed, 'lib')
  assert all(path.startswith(site) for path in files.values()), files
  expected = {
      m[:-3].replace('/', '.').removesuffix('.__init__')
      for m in _modules_in_checkout()
  }
  assert set(files) == expected


# The programs run on the training binary's flags (they adopt them).
ADOPTED = {'run.program': 'run.train', 'run.stateful_program': 'run.train'}


def _first_flags(module):
  """The first flag each of `module` and the module it adopts defines."""
  found = []
  for name in (module, ADOPTED.get(module)):
    if name is None:
      continue
    with open(os.path.join(ROOT, *name.split('.')) + '.py') as f:
      source = f.read()
    match = (
        re.search(r"DEFINE_\w+\(\s*'(\w+)'", source)
        or re.search(r"add_argument\(\s*'--(\w+)'", source)
        or re.search(r"_FLAG_SPECS = \(\s*\(\s*'(\w+)'", source)
        # A `define(kind, name, ...)` helper over absl's DEFINE_<kind>.
        or re.search(r"\bdefine\(\s*'\w+',\s*'(\w+)'", source)
    )
    if match:
      found.append(match.group(1))
  assert found, module
  return found


def test_every_command_has_help(installed, outside):
  setup = package_sources.load_setup()
  env = _user_env(installed)

  def help_of(module):
    return module, _run(
        [setup.command_name(module), '--help'],
        cwd=outside,
        env=env,
        timeout=300,
    )

  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    results = dict(pool.map(help_of, setup.BINARIES))
  for module, (code, stdout, stderr) in results.items():
    command = setup.command_name(module)
    # --help ends with status 0 (run.console; absl alone would give 1).
    assert code == 0, (command, code, stderr)
    assert 'Traceback' not in stderr + stdout, (command, stderr)
    for flag in _first_flags(module):
      # A line of the flag list (absl `  --flag: ...`, argparse `  --flag X`).
      assert re.search(rf'^ +--{flag}\b', stdout, re.MULTILINE), (
          command,
          flag,
          stdout[:500],
      )
    doc = ' '.join(importlib_doc(module).split())
    assert doc in ' '.join(stdout.split()), (command, doc, stdout[:500])


def importlib_doc(module):
  """The first line of `module`'s docstring, read from the checkout."""
  with open(os.path.join(ROOT, *module.split('.')) + '.py') as f:
    source = f.read()
  return re.search(r'"""(.+)', source).group(1).strip()


def test_two_round_training_run(installed, outside):
  out_dir = os.path.join(outside, 'output')
  code, stdout, stderr = _run(
      [
          'tff-hetero-train',
          '--task=synthetic',
          '--num_clients=12',
          '--synthetic_size_law=constant',
          '--clients_per_round=4',
          '--client_batch_size=5',
          '--total_rounds=2',
          '--progress=false',
          f'--root_output_dir={out_dir}',
          '--experiment_name=wheel',
      ],
      cwd=outside,
      env=_user_env(installed),
      timeout=600,
  )
  assert code == 0, stderr
  assert 'Per-client metrics after round 2' in stdout, stdout
  with open(os.path.join(out_dir, 'wheel', 'summary.json')) as f:
    summary = json.load(f)
  assert summary
  code, _, stderr = _run(
      ['tff-hetero-train', '--task=nope'], cwd=outside, env=_user_env(installed)
  )
  assert code == 2 and binary.error_lines(stderr) == [
      stderr.strip().splitlines()[-1]
  ]
  assert stderr.strip().startswith('train: error: unknown --task=')


_NOTEBOOK = textwrap.dedent("""\
    import json, os, sys
    from jupyter_client import kernelspec, manager
    import nbclient, nbformat
    path, kernels = sys.argv[1], sys.argv[2]
    os.makedirs(os.path.join(kernels, 'wheel'))
    with open(os.path.join(kernels, 'wheel', 'kernel.json'), 'w') as f:
      json.dump({'argv': [sys.executable, '-m', 'ipykernel_launcher', '-f',
                          '{connection_file}'],
                 'display_name': 'wheel', 'language': 'python',
                 'env': {'TF_CPP_MIN_LOG_LEVEL': '3'}}, f)
    specs = kernelspec.KernelSpecManager(kernel_dirs=[kernels])
    nb = nbformat.read(path, as_version=4)
    probe = nbformat.v4.new_code_cell(
        'import tff_algos, run; print(tff_algos.__file__)')
    nb.cells.insert(len(nb.cells) - 1, probe)
    km = manager.KernelManager(kernel_name='wheel', kernel_spec_manager=specs)
    nbclient.NotebookClient(
        nb, km=km, timeout=300, allow_errors=False,
        resources={'metadata': {'path': os.path.dirname(path)}}).execute()
    last = ''.join(o.get('text', '') for o in nb.cells[-1].outputs)
    print(json.dumps({'last': last, 'module': probe.outputs[0]['text']}))
    """)


def test_quickstart_notebook_runs_on_the_installed_package(installed, outside):
  notebook = os.path.join(outside, 'quickstart.ipynb')
  shutil.copy(os.path.join(ROOT, 'examples', 'quickstart.ipynb'), notebook)
  python = os.path.join(installed, 'bin', 'python')
  out = _check(
      [python, '-c', _NOTEBOOK, notebook, os.path.join(outside, 'kernels')],
      cwd=outside,
      env=_user_env(installed),
      timeout=900,
  )
  result = json.loads(out.strip().splitlines()[-1])
  assert result['last'].strip().endswith('ok'), result
  assert (
      result['module'].strip().startswith(os.path.join(installed, 'lib'))
  ), result
