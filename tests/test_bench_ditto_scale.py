"""run.experiments.bench_ditto_scale: EMNIST-sized Ditto through the disk
store."""

import json
import os

import numpy as np

from run.experiments import bench_ditto_scale
from tests import binary


def _run(args, timeout=400):
  return binary.run_module('run.experiments.bench_ditto_scale', args, timeout)


def test_synthetic_clients_are_emnist_sized_and_deterministic():
  data = bench_ditto_scale.synthetic_emnist(5, 7)
  assert data.client_ids == [f'w{k:05d}' for k in range(5)]
  first = list(data.create_tf_dataset_for_client('w00001'))
  again = list(data.create_tf_dataset_for_client('w00001'))
  other = list(data.create_tf_dataset_for_client('w00002'))
  assert len(first) == 7
  assert first[0]['pixels'].shape == (28, 28)
  labels = np.array([e['label'] for e in first + other])
  assert labels.min() >= 0 and labels.max() < 62
  np.testing.assert_array_equal(first[3]['pixels'], again[3]['pixels'])
  assert not np.array_equal(first[0]['pixels'], other[0]['pixels'])


def test_command_line_run_measures_the_store(tmp_path):
  out = tmp_path / 'r.json'
  store = tmp_path / 'store'
  code, stdout, stderr = _run(
      [
          '--num_clients=12',
          '--clients_per_round=3',
          '--rounds=2',
          '--rounds_after=1',
          '--touch_clients=4',
          '--model=linear',
          '--examples_per_client=4',
          '--batch_size=2',
          '--rounds_per_checkpoint=1',
          f'--state_dir={store}',
          f'--output_json={out}',
      ]
  )
  assert code == 0, stderr[-2000:]
  result = json.loads(out.read_text())
  assert result['state_parameters'] == 784 * 62  # The linear model.
  state_bytes = 784 * 62 * 4
  per_file = result['usage_at_end']['bytes_per_file']
  assert state_bytes <= per_file <= state_bytes + 2000
  # The store-only pass adds one file per new client.
  assert (
      result['usage_after_touch']['state_files']
      - result['usage_after_rounds']['state_files']
  ) == 4
  assert len(result['raw']['rounds_before']) == 2
  assert len(result['raw']['rounds_after']) == 1
  for row in result['raw']['rounds_before']:
    assert row['load_s'] >= 0 and row['save_s'] > 0 and row['train_s'] > 0
    assert row['driver_rss_mb'] > 0 and row['worker_rss_mb'] > 0
  assert result['projected_store_gb'] == per_file * 12 / 1e9
  assert 'touch pass: 2 chunks written' in stdout
  assert os.path.isdir(store / 'clients')  # Kept: --state_dir was given.


def test_bad_flags_exit_2_with_one_line():
  code, _, stderr = _run(['--rounds=0'])
  assert code == 2
  lines = [line for line in stderr.splitlines() if line.strip()]
  assert lines == ['bench_ditto_scale: error: --rounds must be >= 1']
