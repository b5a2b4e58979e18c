"""Installable package: TFF algorithms for heterogeneous clients.

The pinned stack cannot be installed by pip's resolver alone (TFF 0.87 pins a
jaxlib that has no wheel for Linux x86-64). From a clone,
`scripts/bootstrap.sh` installs requirements.txt, then requirements-nodeps.txt
with --no-deps, then this package. Without a clone (Colab, Jupyter), README.md
"Install with pip" gives the same three steps as pip commands;
tests/test_wheel.py runs them against the wheel built from this file.
"""

import sys

import setuptools

if not (3, 9) <= sys.version_info[:2] <= (3, 11):
  sys.exit(
      'tff-hetero needs Python 3.9, 3.10 or 3.11 (TensorFlow Federated 0.87 '
      f'supports no other); this is Python {sys.version.split()[0]}.'
  )

PACKAGES = ('tff_algos', 'tasks', 'privacy', 'run')

# Every binary (a module ending in `if __name__ == '__main__': run_main()`) is
# the console command `tff-hetero-<last name part, _ as ->`, e.g.
# run.benchmarks.bench_suite
# is tff-hetero-bench-suite (tests/test_packaging.py checks the list).
BINARIES = (
    'run.train',
    'run.program',
    'run.stateful_program',
    'run.report',
    'run.tail_benchmark.benchmark',
    'run.benchmarks.bench',
    'run.benchmarks.bench_suite',
    'run.download',
    'run.shakespeare_text',
)

# The paper reproductions and the one-off experiments and benchmarks
# (`run/experiments`) run from a clone (`python -m run.experiments.<name>`):
# they are not installed.
NOT_INSTALLED = ('run.experiments', 'run.experiments.*')

# Files other than Python modules that the packages read at run time; none
# today. tests/test_wheel.py fails if a package folder holds a file that is
# neither a module, a BUILD file nor matched here, so a new data file cannot
# be left out of the wheel by accident.
PACKAGE_DATA = ('*.json', '*.csv', '*.txt', '*.md', '*.tmpl', '*.html')


def command_name(module: str) -> str:
  """The console command of the binary `module`."""
  return 'tff-hetero-' + module.rsplit('.', 1)[-1].replace('_', '-')


if __name__ == '__main__':
  setuptools.setup(
      name='tff-hetero',
      version='0.1.0',
      description=(
          'TensorFlow Federated algorithms for heterogeneous clients: '
          'tail-aware objectives, personalization, robustness and privacy.'
      ),
      long_description=open('README.md', encoding='utf-8').read(),
      long_description_content_type='text/markdown',
      license='Apache-2.0',
      python_requires='>=3.9,<3.12',
      packages=setuptools.find_packages(
          include=[p for name in PACKAGES for p in (name, name + '.*')],
          exclude=NOT_INSTALLED,
      ),
      package_data={name: list(PACKAGE_DATA) for name in PACKAGES},
      # The tail benchmark on a Ray cluster (`--ray_address`): the newest Ray
      # that shares TFF 0.87's pins (docs/deployment.md).
      extras_require={'ray': ['ray==2.52.1']},
      install_requires=[
          'tensorflow==2.14.*',
          'tensorflow-federated==0.87.0',
          'tensorflow-privacy==0.9.0',
          'numpy~=1.25',
          'absl-py==1.*',
      ],
      entry_points={
          'console_scripts': [
              f'{command_name(m)}={m}:run_main' for m in BINARIES
          ],
      },
  )
