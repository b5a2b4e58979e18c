# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests of the benchmark binary `run.bench` (tiny configurations)."""

import os
import signal
import subprocess
import sys

import pytest

from run import bench

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def tiny_result():
  config = bench.BenchConfig(
      num_clients=12, examples_per_client=20, clients_per_round=3,
      client_batch_size=5, rounds=2, warmup_rounds=1, repeats=2, seed=1,
      client_learning_rate=0.1,
  )
  return bench.benchmark(config, log=lambda s: None)


def test_all_systems_have_positive_throughput(tiny_result):
  for name in bench.SYSTEMS:
    system = tiny_result['systems'][name]
    assert system['examples_per_s'] > 0, name
    assert system['seconds_per_round'] > 0, name
    assert len(system['round_seconds']) == 4, name  # 2 rounds x 2 repeats.
    assert len(system['repeats']) == 2, name
  assert tiny_result['examples_per_round'] == 3 * 20
  assert tiny_result['systems']['stock']['ratio_to_stock'] == pytest.approx(1)
  assert tiny_result['systems']['plain']['ratio_to_plain'] == pytest.approx(1)


def test_ours_matches_stock_and_plain(tiny_result):
  assert tiny_result['max_abs_diff_ours_stock'] < 1e-5
  assert tiny_result['max_abs_diff_ours_plain'] < 1e-5


def test_table_lists_every_system(tiny_result):
  table = bench.format_table(tiny_result)
  for word in ('ours', 'stock', 'plain', 'examples/s', 'L-inf'):
    assert word in table


@pytest.mark.parametrize('args, message', [
    (['--clients_per_round=20', '--num_clients=10'], 'exceeds'),
    (['--rounds=0'], '--rounds must be a positive integer'),
    (['--examples_per_client=-3'], '--examples_per_client'),
    (['--warmup_rounds=-1'], '--warmup_rounds'),
    (['--task=nope'], 'unknown --task'),
    (['extra_argument'], 'unexpected arguments'),
])
def test_bad_flags_exit_2_with_one_line(args, message):
  proc = subprocess.Popen(
      [sys.executable, '-m', 'run.bench', *args], cwd=REPO,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True,
  )
  try:
    out, err = proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
  assert proc.returncode == 2, err
  lines = err.strip().splitlines()
  assert len(lines) == 1, err
  assert lines[0].startswith('bench: error: ')
  assert message in lines[0]
  assert out == ''


def test_config_validation_in_process():
  with pytest.raises(bench.UsageError, match='clients_per_round'):
    bench.BenchConfig(num_clients=2, clients_per_round=3).validate()
  with pytest.raises(bench.UsageError, match='client_learning_rate'):
    bench.BenchConfig(client_learning_rate=0.0).validate()
  bench.BenchConfig().validate()
