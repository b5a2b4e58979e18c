"""run.reproduce: family runs expand to one row per member; histograms."""

import csv

import numpy as np

from run import reproduce


def fake_run(tmp_path, name, errors):
  run_dir = tmp_path / name
  (run_dir / 'clients').mkdir(parents=True)
  with open(run_dir / 'clients' / 'round_00002.csv', 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['split', 'client_id', 'num_examples', 'loss', 'accuracy'])
    for member, values in errors.items():
      for i, e in enumerate(values):
        writer.writerow([f'{member}/test', str(i), '10', '1.0', str(1 - e)])
  summaries = {
      f'{m}/test/error': {'mean': float(np.mean(v))} for m, v in errors.items()
  }
  return {'summaries': summaries, 'run_dir': str(run_dir)}


def test_family_rows_and_histogram(tmp_path):
  experiment = {
      'members': {'FedAvg': 'theta_1', 'Delta-FL 0.5': 'theta_0.5'},
      'metric': 'test/error',
      'columns': ('mean',),
      'histogram': 'test/error',
  }
  runs = [
      fake_run(
          tmp_path,
          f'seed{s}',
          {'theta_1': [0.1, 0.5, 0.9], 'theta_0.5': [0.2, 0.4, 0.6 + s]},
      )
      for s in (0, 1)
  ]
  expanded = reproduce.expand_members(experiment, {'family': runs})
  assert list(expanded) == ['FedAvg', 'Delta-FL 0.5']
  assert expanded['FedAvg'][0]['summaries'] == {'test/error': {'mean': 0.5}}
  np.testing.assert_allclose(
      reproduce.per_client_values(
          runs[1]['run_dir'], 'theta_0.5/test', 'error'
      ),
      [0.2, 0.4, 1.6],
  )
  table = reproduce.table(experiment, expanded)
  assert '| FedAvg | 50 (0) |' in table
  assert '| Delta-FL 0.5 | 56.67 (17) |' in table  # Seeds: 40%, 73.3%.
  png = tmp_path / 'hist.png'
  reproduce.write_histogram(experiment, expanded, str(png))
  assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_paired_table_subtracts_the_baseline_seed_by_seed():
  experiment = {'metric': 'test/error', 'columns': ('mean', 'p90')}

  def run(mean, p90):
    return {'summaries': {'test/error': {'mean': mean, 'p90': p90}}}

  results = {
      'FedAvg': [run(0.50, 0.70), run(0.40, 0.60), run(0.45, 0.65)],
      'theta=0.5': [run(0.52, 0.66), run(0.41, 0.57), run(0.44, 0.65)],
  }
  lines = reproduce.paired_table(experiment, results).splitlines()
  assert lines[0] == (
      '| variant minus FedAvg | test/error mean | test/error p90 |'
  )
  assert len(lines) == 3
  mean_cell, p90_cell = lines[2].split(' | ')[1:3]
  # Percent: (52 - 50, 41 - 40, 44 - 45) = (+2, +1, -1); mean 0.667, std 1.25.
  assert mean_cell == '+2 / +1 / -1; +0.667 (1.2)'
  # (66 - 70, 57 - 60, 65 - 65) = (-4, -3, 0); mean -2.33, std 1.7.
  assert p90_cell.rstrip(' |') == '-4 / -3 / +0; -2.33 (1.7)'


def test_every_experiment_reports_metrics_its_runs_produce():
  for name, experiment in reproduce.EXPERIMENTS.items():
    metrics = [experiment['metric']] + [
        m for m, _ in experiment.get('extra_metrics', ())
    ]
    if '--eval_train_clients=false' in experiment['base']:
      assert not [m for m in metrics if m.startswith('train/')], name
