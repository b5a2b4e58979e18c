# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""setup.py's packages and console commands, and README's pip commands.

Fast checks of the sources only; tests/test_wheel.py builds and installs the
wheel. The README's "Install with pip" commands must carry the same pins as
requirements.txt (less its test and documentation tools) and
requirements-nodeps.txt.
"""

# bazel-data: setup.py README.md requirements.txt requirements-nodeps.txt

import ast
import os

import setuptools

from tests import package_sources

ROOT = package_sources.ROOT


def binaries_in_checkout() -> dict[str, ast.Module]:
  """Modules of the packages with an `if __name__ == '__main__':` block."""
  found = {}
  for package in package_sources.load_setup().PACKAGES:
    for folder, _, files in os.walk(os.path.join(ROOT, package)):
      for name in files:
        if not name.endswith('.py'):
          continue
        path = os.path.join(folder, name)
        with open(path) as f:
          source = f.read()
        if "if __name__ == '__main__':" in source:
          module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.')
          found[module] = ast.parse(source)
  return found


def test_every_binary_is_a_console_command():
  setup = package_sources.load_setup()
  binaries = binaries_in_checkout()
  assert sorted(setup.BINARIES) == sorted(binaries)
  names = [setup.command_name(m) for m in setup.BINARIES]
  assert len(set(names)) == len(names)
  assert (
      setup.command_name('run.benchmarks.bench_suite')
      == 'tff-hetero-bench-suite'
  )
  for module, tree in binaries.items():
    functions = {
        node.name for node in tree.body if isinstance(node, ast.FunctionDef)
    }
    assert 'run_main' in functions, module
    main_block = tree.body[-1]
    assert isinstance(main_block, ast.If), module
    assert ast.unparse(main_block.body[0]) == 'run_main()', module


def test_packages_hold_every_subpackage():
  setup = package_sources.load_setup()
  found = setuptools.find_packages(
      where=ROOT,
      include=[p for name in setup.PACKAGES for p in (name, name + '.*')],
  )
  on_disk = {
      os.path.relpath(folder, ROOT).replace(os.sep, '.')
      for package in setup.PACKAGES
      for folder, _, files in os.walk(os.path.join(ROOT, package))
      if '__init__.py' in files
  }
  assert set(found) == on_disk
  assert {
      'tff_algos',
      'tff_algos.aggregators',
      'tasks',
      'privacy',
      'run',
  } <= on_disk


def test_readme_pip_commands_carry_the_pins():
  stack, nodeps, package = package_sources.readme_pip_commands()
  assert '--no-deps' not in stack
  assert nodeps[:3] == ['pip', 'install', '--no-deps']
  assert package[:3] == ['pip', 'install', '--no-deps']
  assert package[3].startswith('tff-hetero@') and len(package) == 4
  required = {
      name: spec
      for name, spec in package_sources.requirement_file(
          'requirements.txt'
      ).items()
      if name not in package_sources.DEV_ONLY
  }
  assert package_sources.pins(stack[2:]) == required
  nodeps_pins = package_sources.pins(nodeps[3:])
  assert nodeps_pins == package_sources.requirement_file(
      'requirements-nodeps.txt'
  )
  assert 'jaxlib' in nodeps_pins
