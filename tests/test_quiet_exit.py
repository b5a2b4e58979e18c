# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Importing the library prints nothing at interpreter exit.

TFF 0.87 makes a service manager for its local worker when it is imported;
its `__del__` fails at interpreter exit ("Exception ignored in ...
ServiceManager.__del__ ... 'NoneType' object has no attribute 'Popen'")
unless `tff_algos.runtime.end_workers_at_exit` has run.
"""

import ast
import os
import subprocess
import sys

from tests import binary

PACKAGES = ('tff_algos', 'tasks', 'privacy', 'run')
REGISTERS = 'runtime.end_workers_at_exit()'
# Plain scripts: an import of each kind of module (each package, a module
# importing TFF but no other of ours), and a computation that starts a worker.
SCRIPTS = [
    'import tff_algos.options',
    'from run import algorithms',
    'import tasks.synthetic',
    'import tasks.evaluation',
    'import privacy.dp_aggregation',
    'import run.contexts',
    'import tff_algos, tensorflow_federated as tff, numpy as np\n'
    'assert tff.tensorflow.computation(lambda: np.int32(1))() == 1',
]


def test_imports_print_nothing_at_exit():
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')  # TF's import notes.
  for i in range(0, len(SCRIPTS), 2):  # Two at a time: 2 cores.
    procs = [
        (
            script,
            subprocess.Popen(  # pylint: disable=consider-using-with
                [sys.executable, '-c', script],
                cwd=binary.ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            ),
        )
        for script in SCRIPTS[i : i + 2]
    ]
    for script, proc in procs:
      _, stderr = proc.communicate(timeout=600)
      assert proc.returncode == 0, (script, stderr)
      assert not stderr, (script, stderr)


def _module_imports() -> dict[str, tuple[set[str], str]]:
  """Each first-party module: its first-party imports and its source."""
  modules = {}
  for package in PACKAGES:
    for folder, _, files in os.walk(os.path.join(binary.ROOT, package)):
      if not os.path.exists(os.path.join(folder, '__init__.py')):
        continue
      for name in files:
        if not name.endswith('.py'):
          continue
        path = os.path.join(folder, name)
        rel = os.path.relpath(path, binary.ROOT)[: -len('.py')]
        module = rel.replace(os.sep, '.').removesuffix('.__init__')
        with open(path, encoding='utf-8') as f:
          source = f.read()
        modules[module] = (set(), source)
  for module, (deps, source) in modules.items():
    names = []
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, ast.Import):
        names += [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        names += [node.module] + [f'{node.module}.{a.name}' for a in node.names]
    for name in names:
      if name.split('.')[0] == 'tensorflow_federated':
        deps.add('tensorflow_federated')
      parts = name.split('.')
      deps.update(
          '.'.join(parts[:k])
          for k in range(1, len(parts) + 1)
          if '.'.join(parts[:k]) in modules
      )
    if '.' in module:
      deps.add(module.rsplit('.', 1)[0])  # Its package's __init__ runs first.
  return modules


def test_every_module_importing_tff_registers_the_quiet_exit():
  """Each module that imports TFF (itself or through ours) imports one that
  calls `runtime.end_workers_at_exit()` (found by reading the sources)."""
  modules = _module_imports()

  def reached(module):
    seen, todo = set(), [module]
    while todo:
      for dep in modules.get(todo.pop(), (set(), ''))[0]:
        if dep not in seen:
          seen.add(dep)
          todo.append(dep)
    return seen | {module}

  registering = {m for m, (_, source) in modules.items() if REGISTERS in source}
  assert 'tff_algos' in registering
  missing = sorted(
      m
      for m in modules
      if 'tensorflow_federated' in reached(m) and not reached(m) & registering
  )
  assert not missing, missing
