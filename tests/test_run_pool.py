# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests of `run.tail_benchmark.pool`: runs in a worker equal runs alone.

A worker keeps the task, the TFF process, the engine and the evaluation
computation between runs; a run must not see that: its summary equals the
summary of the same flags run in a fresh `python -m run.train`, whether the
builds it reuses came from another seed or another configuration.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from run.tail_benchmark import pool as run_pool
from tests import binary
from tff_algos import runtime

_BASE = [
    '--task=synthetic',
    '--num_clients=12',
    '--test_clients_fraction=0.25',
    '--total_rounds=3',
    '--rounds_per_eval=3',
    '--rounds_per_checkpoint=3',
    '--clients_per_round=3',
    '--client_batch_size=10',
    '--holdout=validation',
    '--eval_train_clients=false',
    '--data_seed=4',
]


def _summary(root, name):
  with open(os.path.join(root, name, 'summary.json')) as f:
    return json.load(f)['summaries']


def test_runs_in_a_worker_equal_runs_alone(tmp_path):
  pooled, alone = str(tmp_path / 'pooled'), str(tmp_path / 'alone')
  # Seed 1 builds what seed 2 reuses; the prox run reuses the task only.
  runs = [
      ('fedavg_s1', ['--algorithm=fedavg', '--seed=1']),
      ('fedavg_s2', ['--algorithm=fedavg', '--seed=2']),
      (
          'prox_s2',
          ['--algorithm=fedprox', '--proximal_strength=0.1', '--seed=2'],
      ),
  ]
  worker = run_pool.RunWorker(str(tmp_path / 'worker.log'))
  try:
    for name, extra in runs:
      worker.run(
          _BASE
          + extra
          + [
              '--simulation_engine=stacked',
              '--client_learning_rate=0.1',
              f'--root_output_dir={pooled}',
              f'--experiment_name={name}',
          ]
      )
  finally:
    worker.close()
  for name, extra in runs[1:3]:
    code, _, stderr = binary.run_train(
        _BASE
        + extra
        + [
            '--simulation_engine=stacked',
            '--client_learning_rate=0.1',
            f'--experiment_name={name}',
        ],
        alone,
    )
    assert code == 0, stderr
    assert _summary(pooled, name) == _summary(alone, name), name
  # Different seeds do differ (the test would pass vacuously otherwise).
  assert _summary(pooled, 'fedavg_s1') != _summary(pooled, 'fedavg_s2')


def test_errors_are_one_line_and_the_worker_goes_on(tmp_path):
  worker = run_pool.RunWorker(str(tmp_path / 'worker.log'))
  try:
    assert worker.check(_BASE + ['--bogus=1']) == (
        "train: error: Unknown command line flag 'bogus'"
    )
    assert 'must be' in worker.check(_BASE + ['--synthetic_alpha=-1'])
    assert worker.check(_BASE + ['--algorithm=fedavg']) is None
    with pytest.raises(run_pool.RunFailed) as failed:
      worker.run(_BASE + ['--algorithm=nope', f'--root_output_dir={tmp_path}'])
    assert failed.value.code == 2
    assert str(failed.value).startswith('train: error: ')
    assert 'nope' in str(failed.value)
    worker.run(
        _BASE
        + [
            '--algorithm=fedavg',
            f'--root_output_dir={tmp_path}',
            '--experiment_name=after',
        ]
    )
    assert _summary(str(tmp_path), 'after')['test/accuracy']['num_clients'] == 9
    # The TFF worker the runs started serves on until the run worker ends.
    tff_workers = runtime.worker_pids(worker._proc.pid)  # pylint: disable=protected-access
    assert tff_workers
  finally:
    worker.close()
  # ... and ends with it (it outlived every benchmark before).
  deadline = time.monotonic() + 10
  while time.monotonic() < deadline and set(tff_workers) & set(
      runtime.worker_pids()
  ):
    time.sleep(0.2)
  assert not set(tff_workers) & set(runtime.worker_pids())


_DRIVER = """
import json, sys
from run.tail_benchmark import pool as run_pool
worker = run_pool.RunWorker(sys.argv[2])
worker._start()
print(worker._proc.pid, flush=True)
worker.run(json.loads(sys.argv[1]))
"""


def test_a_worker_ends_its_group_when_its_driver_is_killed(tmp_path):
  # SIGKILL gives the driver no chance to end its workers (`end_children`
  # runs on a catchable signal): the worker must notice on its own, or it
  # trains its run to the end (seen: a benchmark's workers outliving it).
  long_run = _BASE[:3] + [
      '--total_rounds=100000',
      '--rounds_per_eval=0',
      '--rounds_per_checkpoint=50',
      '--clients_per_round=3',
      '--client_batch_size=10',
      '--algorithm=fedavg',
      f'--root_output_dir={tmp_path}',
      '--experiment_name=long',
  ]
  with subprocess.Popen(
      [
          sys.executable,
          '-c',
          _DRIVER,
          json.dumps(long_run),
          str(tmp_path / 'log'),
      ],
      cwd=binary.ROOT,
      stdout=subprocess.PIPE,
      text=True,
      start_new_session=True,
  ) as driver:
    try:
      worker = int(driver.stdout.readline())
      deadline = time.monotonic() + 120
      while not runtime.worker_pids(worker):  # The run has started TFF.
        assert time.monotonic() < deadline and driver.poll() is None
        time.sleep(0.2)
      time.sleep(2)  # Into its rounds.
      os.kill(driver.pid, signal.SIGKILL)
      driver.wait()
      deadline = time.monotonic() + 10
      while binary.alive_in({worker}) and time.monotonic() < deadline:
        time.sleep(0.2)
      left = binary.alive_in({worker})
    finally:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(worker, signal.SIGKILL)
  assert not left, f'processes of the orphaned worker group: {left}'
