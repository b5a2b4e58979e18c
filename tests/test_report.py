"""The report command: figures and summary table from run folders."""

import csv
import json
import os
import re

from matplotlib import image as mpl_image
import numpy as np
import pytest
import tensorflow_federated as tff

from run import report
from run import simulation
from tasks import synthetic
from tff_algos import fed_avg


def fabricate_run(
    path,
    *,
    rounds=4,
    eval_every=2,
    seed=0,
    finished=True,
    algorithm='fedavg',
    program=False,
):
  """A run folder in run.train's format (or run.program's) with known data."""
  rng = np.random.default_rng(seed)
  os.makedirs(path / 'clients')
  rows = []
  for r in range(1, rounds + 1):
    row = {'round_num': r}
    if program:
      row.update(
          {'model_metrics/loss': 2.0 / r, 'model_metrics/accuracy': 0.1 * r}
      )
    else:
      row.update(
          {'train/loss': 2.0 / r, 'train/accuracy': 0.1 * r, 'clients': 3}
      )
      if r % eval_every == 0 or r == rounds:
        row.update(
            {
                'eval/test/accuracy/mean': 0.05 * r,
                'eval/test/accuracy/worst10': 0.01 * r,
                'eval/test/loss/mean': 3.0 / r,
                'eval/test/loss/worst10': 6.0 / r,
            }
        )
    rows.append(row)
  fields = sorted(
      {k for row in rows for k in row}, key=lambda k: (k != 'round_num', k)
  )
  with open(path / 'metrics.csv', 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
  if program:
    with open(path / 'evaluation.csv', 'w', newline='') as f:
      f.write(
          'round_num,model_metrics/accuracy,model_metrics/loss\n'
          f'{rounds},0.7,0.9\n2,0.5,1.5\n'
      )
  sizes = {'test': rng.integers(5, 50, 10), 'train': rng.integers(20, 200, 10)}
  accuracy = rng.uniform(0, 1, 10)
  with open(path / 'clients' / f'round_{rounds:05d}.csv', 'w') as f:
    f.write('split,client_id,accuracy,loss,num_examples\n')
    for split in ('test', 'train'):
      for i in range(10):
        f.write(
            f'{split},{i:02d},{accuracy[i]!r},{1 - accuracy[i]!r},'
            f'{sizes[split][i]}\n'
        )
  (path / 'config.json').write_text(
      json.dumps(
          {'algorithm': algorithm, 'theta': 0.5, 'experiment_name': path.name}
      )
  )
  if finished:
    summaries = {
        'test/accuracy': {
            'mean': float(accuracy.mean()),
            'weighted_mean': 0.625,
            'worst10': float(accuracy.min()),
            'p10': 0.125,
            'variance': 1234.5,
        },
        'test/error': {'p90': 0.875},
        'test/loss': {'mean': 1.5},
        'train/loss': {'p90': 2.25},
    }
    (path / 'summary.json').write_text(
        json.dumps(
            {'round_num': rounds, 'task': 'fabricated', 'summaries': summaries}
        )
    )
  return accuracy


def check_png(path, min_size=(300, 500)):
  assert os.path.getsize(path) > 10_000
  with open(path, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  height, width = mpl_image.imread(path).shape[:2]
  assert height >= min_size[0] and width >= min_size[1]


def test_report_of_two_runs(tmp_path):
  acc_a = fabricate_run(tmp_path / 'a', seed=1)
  fabricate_run(tmp_path / 'b', seed=2, algorithm='deltafl')
  paths = report.write_report(
      [str(tmp_path / 'a'), str(tmp_path / 'b')],
      str(tmp_path / 'out'),
      labels=['A', 'B'],
  )
  for name in report.FIGURES:
    check_png(paths[name])
  table = (tmp_path / 'out' / 'summary.md').read_text()
  row_a = [l for l in table.splitlines() if l.startswith('| A |')]
  assert row_a == [
      f'| A | fedavg | 4 | 10 | {acc_a.mean():.4f} | 0.6250 | '
      f'{acc_a.min():.4f} | 0.1250 | 1234.5 | 0.8750 | 1.5000 |'
      ' 2.2500 |'
  ]
  assert '| B | deltafl (theta=0.5) | 4 |' in table
  for name in report.FIGURES:
    assert f']({name})' in table


def test_load_run_reads_curves_and_clients(tmp_path):
  accuracy = fabricate_run(tmp_path / 'a', rounds=5, eval_every=2)
  run = report.load_run(str(tmp_path / 'a'))
  assert run.label == 'a' and run.round_num == 5
  assert run.test_curve_kind == 'mean over clients'
  np.testing.assert_array_equal(run.metrics['round_num'], [1, 2, 3, 4, 5])
  np.testing.assert_allclose(run.metrics['train/loss'], 2.0 / np.arange(1, 6))
  np.testing.assert_array_equal(run.test_curve['round_num'], [2, 4, 5])
  np.testing.assert_allclose(run.test_curve['accuracy_mean'], [0.1, 0.2, 0.25])
  np.testing.assert_allclose(run.test_curve['loss_worst10'], [3, 1.5, 1.2])
  np.testing.assert_allclose(run.clients['test']['accuracy'], accuracy)
  assert set(run.clients) == {'test', 'train'}


def test_program_folder(tmp_path):
  fabricate_run(tmp_path / 'p', rounds=3, program=True)
  run = report.load_run(str(tmp_path / 'p'))
  np.testing.assert_allclose(run.metrics['train/accuracy'], [0.1, 0.2, 0.3])
  np.testing.assert_array_equal(run.test_curve['round_num'], [2, 3])
  np.testing.assert_allclose(run.test_curve['accuracy_mean'], [0.5, 0.7])
  assert np.all(np.isnan(run.test_curve['accuracy_worst10']))
  assert run.test_curve_kind == 'pooled over examples'
  paths = report.write_report([str(tmp_path / 'p')], str(tmp_path / 'out'))
  check_png(paths['accuracy.png'])


@pytest.mark.parametrize(
    'breakage, message',
    [
        ('missing', 'no such folder'),
        ('no_metrics', 'not a run folder (no metrics.csv)'),
        ('unfinished', 'the run has not finished (no summary.json)'),
        ('no_clients', 'clients/round_00004.csv is missing'),
    ],
)
def test_bad_folders_are_one_line_errors(tmp_path, capsys, breakage, message):
  path = tmp_path / 'run'
  if breakage != 'missing':
    fabricate_run(path, finished=breakage != 'unfinished')
  if breakage == 'no_metrics':
    os.remove(path / 'metrics.csv')
  if breakage == 'no_clients':
    os.remove(path / 'clients' / 'round_00004.csv')
  with pytest.raises(report.ReportError, match=re.escape(message)):
    report.load_run(str(path))
  code = report.main(
      ['report', f'--runs={path}', f'--output_dir={tmp_path / "out"}']
  )
  assert code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('report: error: ')
  assert message in err[0]


def test_bad_arguments(tmp_path, capsys):
  fabricate_run(tmp_path / 'a')
  assert (
      report.main(
          [
              'report',
              f'--runs={tmp_path / "a"}',
              '--labels=x,y',
              f'--output_dir={tmp_path / "out"}',
          ]
      )
      == 2
  )
  assert capsys.readouterr().err.strip() == (
      'report: error: 2 labels for 1 runs'
  )
  with pytest.raises(SystemExit) as exit_info:
    report.main(['report', f'--output_dir={tmp_path}'])
  assert exit_info.value.code == 2
  assert capsys.readouterr().err.strip() == (
      'report: error: the following arguments are required: --runs'
  )


def test_an_unusable_output_folder_is_one_line_saying_why(tmp_path, capsys):
  fabricate_run(tmp_path / 'a')
  file = tmp_path / 'file'
  file.write_text('x')
  for output_dir, message in (
      (file, f'--output_dir: {file} is a file, not a folder'),
      (
          file / 'sub',
          f'--output_dir: {file}/sub: a folder on its path is a file',
      ),
  ):
    code = report.main(
        ['report', f'--runs={tmp_path / "a"}', f'--output_dir={output_dir}']
    )
    assert code == 2
    assert capsys.readouterr().err == f'report: error: {message}\n'


def test_report_of_a_real_run(tmp_path):
  task = synthetic.create_task(
      num_clients=6, seed=1, batch_size=5, size_law='constant', constant_size=30
  )
  process = fed_avg.build_fed_avg(
      task.model_fn,
      tff.learning.optimizers.build_sgdm(learning_rate=0.05),
      tff.learning.optimizers.build_sgdm(learning_rate=1.0),
  )
  result = simulation.run_simulation(
      process,
      task,
      simulation.SimulationConfig(
          total_rounds=2, clients_per_round=3, rounds_per_eval=1
      ),
      output_dir=str(tmp_path / 'run'),
      progress=False,
  )
  paths = report.write_report([str(tmp_path / 'run')], str(tmp_path / 'out'))
  for name in report.FIGURES:
    check_png(paths[name])
  run = report.load_run(str(tmp_path / 'run'))
  np.testing.assert_array_equal(run.test_curve['round_num'], [1, 2])
  final = result['final_summaries']
  assert run.test_curve['accuracy_mean'][-1] == pytest.approx(
      final['test/accuracy']['mean']
  )
  np.testing.assert_allclose(
      run.clients['test']['accuracy'],
      result['per_client']['test']['accuracy'],
      atol=1e-6,
  )
  table = (tmp_path / 'out' / 'summary.md').read_text()
  assert f"| {final['test/accuracy']['mean']:.4f} |" in table


def test_the_symbols_name_the_registry_entries_tuned_options():
  from tff_algos import registry  # pylint: disable=g-import-not-at-top

  for name, (option, _) in report.SYMBOLS.items():
    assert registry.get(name).tuned.name == option, name
