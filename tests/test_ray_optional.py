# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Ray is an optional extra: without it the local pool runs everything, and
`--ray_address` is one error line naming the extra (`ray_pool`).

The binaries run with a `ray` package on their path that cannot be imported,
as on a machine without Ray: the driver, its run workers and their TFF
workers all see it.
"""

# It runs the binaries end to end (tests/binary.py).
# bazel-size: large

import json
import os
import sys

import pytest

from run.tail_benchmark import pool
from run.tail_benchmark import ray_pool
from tests import binary

_NEEDS_RAY = (
    "--ray_address needs Ray: pip install 'tff-hetero[ray]' (ray==2.52.1)"
)


def test_without_ray_the_workers_are_local_and_an_address_is_one_error(
    monkeypatch,
):
  monkeypatch.setitem(sys.modules, 'ray', None)  # `import ray` fails.
  assert ray_pool.worker_type(None) is pool.RunWorker
  assert ray_pool.worker_type('') is pool.RunWorker
  for address in ('auto', '127.0.0.1:6379'):
    with pytest.raises(ray_pool.RayUnavailable) as e:
      ray_pool.worker_type(address)
    assert str(e.value) == _NEEDS_RAY
  ray_pool.disconnect()  # Nothing to end.


def _without_ray(tmp_path, module, args):
  """Runs `python -m module args` where `import ray` fails everywhere."""
  blocker = tmp_path / 'no_ray' / 'ray'
  blocker.mkdir(parents=True, exist_ok=True)
  (blocker / '__init__.py').write_text(
      "raise ImportError('No module named ray (blocked by the test)')\n"
  )
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(
      [str(blocker.parent), binary.ROOT]
      + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else [])
  )
  return binary.run_module(module, args, timeout=600, env=env)


def test_the_benchmark_runs_on_the_local_pool_without_ray(tmp_path):
  out = tmp_path / 'bench'
  args = [
      '--setting=custom',
      '--algorithms=fedavg',
      '--grid=learning_rate:0.05',
      '--max_extensions=0',
      '--rounds=2',
      '--clients_per_round=3',
      '--batch_size=10',
      '--seeds=0',
      '--selection_seeds=100',
      '--jobs=1',
      f'--output_dir={out}',
      '--',
      '--task=synthetic',
      '--num_clients=12',
  ]
  code, _, stderr = _without_ray(
      tmp_path, 'run.tail_benchmark.benchmark', ['--ray_address=auto'] + args
  )
  assert code == 2, stderr[-3000:]
  assert binary.error_lines(stderr) == [f'benchmark: error: {_NEEDS_RAY}']
  assert not (out / 'records').exists()

  code, _, stderr = _without_ray(tmp_path, 'run.tail_benchmark.benchmark', args)
  assert code == 0, stderr[-3000:]
  assert 'Ray' not in stderr
  records = sorted(p.name for p in (out / 'records').glob('*.json'))
  assert 'final_fedavg_lr0.05_seed0.json' in records, records
  record = json.loads((out / 'records' / records[0]).read_text())
  assert record['origin']['code']['sources']


def test_a_reproduction_names_the_extra_without_ray(tmp_path):
  code, _, stderr = _without_ray(
      tmp_path,
      'run.experiments.reproduce',
      [
          '--experiment=qffl_synthetic',
          '--seeds=0',
          '--rounds=1',
          '--ray_address=auto',
          f'--root_output_dir={tmp_path}/runs',
          f'--records_dir={tmp_path}/records',
      ],
  )
  assert code == 2, stderr[-3000:]
  assert binary.error_lines(stderr) == [f'reproduce: error: {_NEEDS_RAY}']
  assert not (tmp_path / 'records').exists()
