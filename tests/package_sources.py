# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""What test_packaging and test_wheel read: setup.py, README's pip commands."""

import importlib.util
import os
import re
import shlex

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# requirements.txt entries a user of the package does not need.
DEV_ONLY = {
    'pytest',
    'pytest-xdist',
    'execnet',
    'nbformat',
    'nbclient',
    'ipykernel',
    'ipython',
    'jupyter-client',
    'jupyter-core',
    'traitlets',
    'pyzmq',
    'tornado',
    'comm',
    'debugpy',
    'pdoc',
    'ray',  # The extra tff-hetero[ray] (setup.py's extras_require).
}


def load_setup():
  """setup.py as a module (its `setup()` call only runs as `__main__`)."""
  spec = importlib.util.spec_from_file_location(
      'tff_hetero_setup', os.path.join(ROOT, 'setup.py')
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def readme_pip_commands() -> list[list[str]]:
  """The `pip install` commands of README's "Install with pip", split."""
  with open(os.path.join(ROOT, 'README.md')) as f:
    readme = f.read()
  section = readme.split('## Install with pip (Colab, Jupyter)', 1)[1]
  block = section.split('```bash\n', 1)[1].split('```', 1)[0]
  commands = [
      shlex.split(c)
      for c in block.replace('\\\n', ' ').splitlines()
      if c.strip()
  ]
  assert all(c[:2] == ['pip', 'install'] for c in commands), commands
  return commands


def pins(lines) -> dict[str, str]:
  """`{name: specifier}` of requirement strings such as `numpy==1.25.2`."""
  out = {}
  for line in lines:
    line = line.split('#', 1)[0].strip()
    if not line or line.startswith('-'):
      continue
    match = re.fullmatch(r'([A-Za-z0-9_.\-]+)\s*((?:==|~=).+)', line)
    assert match, line
    out[match.group(1).lower()] = match.group(2)
  return out


def requirement_file(name):
  with open(os.path.join(ROOT, name)) as f:
    return pins(f)
