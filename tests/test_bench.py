# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests of the benchmark binary `run.benchmarks.bench` (tiny
configurations)."""

import json
import os
import re
import signal
import subprocess
import sys

from absl import flags
import pytest

from run.benchmarks import bench
from run import console

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def tiny_result():
  """`bench.benchmark` of every system on 12 clients for 2 timed rounds."""
  config = bench.BenchConfig(
      num_clients=12,
      examples_per_client=20,
      clients_per_round=3,
      client_batch_size=5,
      rounds=2,
      warmup_rounds=1,
      repeats=2,
      seed=1,
      client_learning_rate=0.1,
  )
  return bench.benchmark(config, log=lambda s: None)


def test_all_systems_have_positive_throughput(tiny_result):
  for name in bench.SYSTEMS:
    system = tiny_result['systems'][name]
    assert system['examples_per_s'] > 0, name
    assert system['seconds_per_round'] > 0, name
    assert system['cpu_seconds_per_round'] >= 0, name
    assert len(system['round_seconds']) == 4, name  # 2 rounds x 2 repeats.
    assert len(system['repeats']) == 2, name
  assert tiny_result['examples_per_round'] == 3 * 20
  assert tiny_result['systems']['stock']['ratio_to_stock'] == pytest.approx(1)
  assert tiny_result['systems']['plain']['ratio_to_plain'] == pytest.approx(1)
  assert tiny_result['paired_round_ratio_ours_to_stock'] > 0
  assert tiny_result['systems']['ours']['cpu_seconds_per_round'] > 0


def test_ours_matches_stock_and_plain(tiny_result):
  assert tiny_result['max_abs_diff_ours_stock'] < 1e-5
  assert tiny_result['max_abs_diff_ours_plain'] < 1e-5


def test_table_lists_every_system(tiny_result):
  table = bench.format_table(tiny_result)
  for word in ('ours', 'stock', 'plain', 'examples/s', 'L-inf'):
    assert word in table


def _run_bench(*args):
  """Runs the binary in its own process group; returns (rc, stdout, stderr)."""
  with subprocess.Popen(
      [sys.executable, '-m', 'run.benchmarks.bench', *args],
      cwd=REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,
  ) as proc:
    try:
      out, err = proc.communicate(timeout=90)
    finally:
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
  return proc.returncode, out, err


def test_bad_flags_exit_2_with_one_line():
  returncode, out, err = _run_bench(
      '--clients_per_round=20', '--num_clients=10'
  )
  assert returncode == 2, err
  assert err.strip().splitlines() == [err.strip()], err
  assert err.startswith('bench: error: ')
  assert 'exceeds' in err
  assert out == ''


def test_output_json_under_a_file_or_in_no_folder_says_which(tmp_path):
  (tmp_path / 'file').write_text('x')
  for path, words in (
      (
          tmp_path / 'file' / 'x.json',
          f'{tmp_path}/file is a file, not a folder',
      ),
      (tmp_path / 'none' / 'x.json', f'folder {tmp_path}/none does not exist'),
  ):
    returncode, out, err = _run_bench('--rounds=1', f'--output_json={path}')
    assert returncode == 2 and out == '', err
    assert err == f'bench: error: --output_json: {words}\n'


def test_malformed_flag_is_a_usage_error(monkeypatch, capsys):
  flag_values = flags.FlagValues()
  bench.define_flags(flag_values)
  monkeypatch.setattr(flags, 'FLAGS', flag_values)
  with pytest.raises(SystemExit) as raised:
    console.flags_parser('bench')(['bench', '--rounds=abc'])
  assert raised.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith('bench: error: flag --rounds=abc')
  assert len(err.strip().splitlines()) == 1


def _parse(*args) -> flags.FlagValues:
  flag_values = flags.FlagValues()
  bench.define_flags(flag_values)
  flag_values(['bench', *args])
  return flag_values


@pytest.mark.parametrize(
    'args, message',
    [
        (['--rounds=0'], '--rounds must be a positive integer'),
        (['--examples_per_client=-3'], '--examples_per_client'),
        (['--warmup_rounds=-1'], '--warmup_rounds'),
        (['--repeats=0'], '--repeats'),
        (['--task=nope'], 'unknown --task'),
        (['--client_learning_rate=-1'], '--client_learning_rate'),
        (
            ['--num_clients=5', '--clients_per_round=6'],
            'exceeds --num_clients=5',
        ),
    ],
)
def test_bad_flag_values_are_refused(args, message):
  with pytest.raises(bench.UsageError, match=re.escape(message)):
    bench.config_from_flags(_parse(*args))


def test_flags_map_to_config():
  assert bench.config_from_flags(_parse()) == bench.BenchConfig()
  config = bench.config_from_flags(
      _parse('--rounds=7', '--client_learning_rate=0.5', '--task=synthetic_iid')
  )
  assert (config.rounds, config.client_learning_rate, config.task) == (
      7,
      0.5,
      'synthetic_iid',
  )


def test_config_validation_in_process():
  with pytest.raises(bench.UsageError, match='clients_per_round'):
    bench.BenchConfig(num_clients=2, clients_per_round=3).validate()
  with pytest.raises(bench.UsageError, match='client_learning_rate'):
    bench.BenchConfig(client_learning_rate=0.0).validate()
  bench.BenchConfig().validate()


def test_command_line_run_writes_json(tmp_path):
  # Through absl's app.run, as users run it: TF must behave the same there
  # (imported inside app.run's main, TF 2.14 traced the plain loop wrongly).
  path = tmp_path / 'bench.json'
  returncode, out, err = _run_bench(
      '--num_clients=4',
      '--clients_per_round=2',
      '--examples_per_client=10',
      '--client_batch_size=5',
      '--rounds=1',
      '--warmup_rounds=0',
      f'--output_json={path}',
  )
  assert returncode == 0, err
  assert 'examples/s' in out
  result = json.loads(path.read_text())
  assert result['max_abs_diff_ours_stock'] < 1e-5
  assert result['max_abs_diff_ours_plain'] < 1e-5
  assert result['examples_per_round'] == 20
