# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""setup.py's packages and console commands, and README's pip commands.

Fast checks of the sources only; tests/test_wheel.py builds and installs the
wheel. The README's "Install with pip" commands must carry the same pins as
requirements.txt (less its test and documentation tools) and
requirements-nodeps.txt.
"""

# bazel-data: setup.py README.md requirements.txt requirements-nodeps.txt
# The binaries' sources, which test_every_binary_is_a_console_command finds by
# walking the package folders: Bazel's sandbox holds only declared files, so
# every binary is declared here (one per line; test_binaries_are_declared
# checks the list against the checkout under pytest).
# bazel-data: run/benchmarks/bench.py
# bazel-data: run/benchmarks/bench_suite.py
# bazel-data: run/download.py
# bazel-data: run/experiments/bench_ditto_scale.py
# bazel-data: run/experiments/bench_loss_pass.py
# bazel-data: run/experiments/bench_padding.py
# bazel-data: run/experiments/bench_scale.py
# bazel-data: run/experiments/ditto_lambda_sweep.py
# bazel-data: run/experiments/ditto_theorem7.py
# bazel-data: run/experiments/fedavg_weighting.py
# bazel-data: run/experiments/fedplus_regression.py
# bazel-data: run/experiments/fedprox_sim.py
# bazel-data: run/experiments/numpy_sim.py
# bazel-data: run/experiments/privacy_experiments.py
# bazel-data: run/experiments/qffl_h_scale.py
# bazel-data: run/experiments/reproduce.py
# bazel-data: run/program.py
# bazel-data: run/report.py
# bazel-data: run/shakespeare_text.py
# bazel-data: run/stateful_program.py
# bazel-data: run/tail_benchmark/benchmark.py
# bazel-data: run/train.py

import ast
import os
import re

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


def declared_binaries() -> list[str]:
  """The modules whose sources this file's `# bazel-data:` lines declare."""
  with open(__file__) as f:
    source = f.read()
  paths = [
      path
      for line in re.findall(r'^#\s*bazel-data:(.*)$', source, re.MULTILINE)
      for path in line.split()
  ]
  return [
      p[:-3].replace('/', '.')
      for p in paths
      if p.endswith('.py') and '/' in p  # Not setup.py: package modules.
  ]


def test_binaries_are_declared():
  """Every binary's source is Bazel data of this test, and nothing else is.

  Under pytest the walk sees the whole checkout, so a binary added without a
  `# bazel-data:` line fails here (under Bazel it would be out of the
  sandbox, and the check below would miss it or fail without saying why).
  """
  declared = declared_binaries()
  found = sorted(binaries_in_checkout())
  missing = [m for m in found if m not in declared]
  assert not missing, (
      'binaries not declared as Bazel data of tests/test_packaging.py (add a'
      ' `# bazel-data: <path>.py` line for each, then run python -m'
      f' tools.build_deps --write): {missing}'
  )
  assert declared == found, ('declared, not binaries (or unsorted)', declared)


def _installed(setup, module: str) -> bool:
  return not any(
      module == pattern or module.startswith(pattern.rstrip('*'))
      for pattern in setup.NOT_INSTALLED
  )


def test_every_installed_binary_is_a_console_command():
  """Every binary of the wheel is a command; the experiments are neither."""
  setup = package_sources.load_setup()
  binaries = binaries_in_checkout()
  installed = sorted(m for m in binaries if _installed(setup, m))
  assert sorted(setup.BINARIES) == installed
  experiments = sorted(set(binaries) - set(installed))
  assert experiments and all(
      m.startswith('run.experiments.') for m in experiments
  ), experiments
  assert 'run.tail_benchmark.benchmark' in setup.BINARIES
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
      exclude=setup.NOT_INSTALLED,
  )
  on_disk = {
      os.path.relpath(folder, ROOT).replace(os.sep, '.')
      for package in setup.PACKAGES
      for folder, _, files in os.walk(os.path.join(ROOT, package))
      if '__init__.py' in files
  }
  assert set(found) == {p for p in on_disk if _installed(setup, p)}
  assert 'run.experiments' in on_disk and 'run.experiments' not in found
  assert 'run.tail_benchmark' in found
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


def test_the_ray_extra_is_the_pinned_ray():
  # `pip install 'tff-hetero[ray]'` installs the Ray the tests run with.
  with open(os.path.join(ROOT, 'setup.py')) as f:
    source = f.read()
  extra = re.search(r"extras_require=\{'ray': \['([^']+)'\]\}", source)
  assert extra, 'setup.py: no ray extra'
  pinned = package_sources.requirement_file('requirements.txt')['ray']
  assert extra.group(1) == f'ray{pinned}'
  from run.tail_benchmark import ray_pool  # pylint: disable=g-import-not-at-top

  assert ray_pool.RAY_REQUIREMENT == extra.group(1)
