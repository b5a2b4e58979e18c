"""Installable package: TFF algorithms for heterogeneous clients.

The pinned stack cannot be installed by pip's resolver alone (TFF 0.87 pins a
jaxlib that has no wheel for Linux x86-64): use `scripts/bootstrap.sh`, which
installs requirements.txt, then requirements-nodeps.txt with --no-deps, then
this package.
"""

import sys

import setuptools

if not (3, 9) <= sys.version_info[:2] <= (3, 11):
  sys.exit(
      'tff-hetero needs Python 3.9, 3.10 or 3.11 (TensorFlow Federated 0.87 '
      f'supports no other); this is Python {sys.version.split()[0]}.'
  )

setuptools.setup(
    name='tff-hetero',
    version='0.1.0',
    description=(
        'TensorFlow Federated algorithms for heterogeneous clients: tail-aware'
        ' objectives, personalization, robustness and privacy.'
    ),
    license='Apache-2.0',
    python_requires='>=3.9,<3.12',
    packages=setuptools.find_packages(
        include=['tff_algos', 'tff_algos.*', 'tasks', 'tasks.*', 'run',
                 'run.*']
    ),
    install_requires=[
        'tensorflow==2.14.*',
        'tensorflow-federated==0.87.0',
        'tensorflow-privacy==0.9.0',
        'numpy~=1.25',
        'absl-py==1.*',
    ],
    entry_points={
        'console_scripts': [
            'tff-hetero-train=run.train:run_main',
            'tff-hetero-bench=run.bench:run_main',
        ],
    },
)
