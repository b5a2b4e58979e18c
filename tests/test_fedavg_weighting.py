# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""run.experiments.fedavg_weighting: its pieces and its bad input."""

from run.experiments import fedavg_weighting
from tests import binary


def _record(accuracy):
  n = len(accuracy)
  return {
      'splits': {
          'test': {
              'accuracy': accuracy,
              'loss': [1.0] * n,
              'num_examples': [10] * n,
          }
      }
  }


def test_uniform_args_change_only_the_weighting_and_the_folder():
  args = [
      '--task=synthetic',
      '--root_output_dir=/a',
      '--seed=3',
      '--experiment_name=final_fedavg_lr0.1_seed3',
  ]
  assert fedavg_weighting.uniform_args(args, '/b', 'x') == [
      '--task=synthetic',
      '--seed=3',
      '--client_weighting=uniform',
      '--root_output_dir=/b',
      '--experiment_name=x',
  ]


def test_reported_finds_the_final_records_by_seed(tmp_path):
  for name in (
      'final_fedavg_lr0.011_seed0.json',
      'final_fedavg_lr0.011_seed1.json',
      'final_fedavg_lr0.011_seed0.weights.npz',
      'select_fedavg_lr0.011_seed100.json',
      'final_qffl_q0.01_lr0.011_seed1.json',
  ):
    (tmp_path / name).write_text('{}')
  found = fedavg_weighting.reported(
      str(tmp_path), fedavg_weighting.FEDAVG_RECORD
  )
  assert sorted(found) == [0, 1]
  assert found[1].endswith('final_fedavg_lr0.011_seed1.json')
  qffl = fedavg_weighting.reported(str(tmp_path), fedavg_weighting.QFFL_RECORD)
  assert list(qffl) == [1]


def test_the_table_pairs_seed_by_seed():
  # Ten clients; worst10 is the lowest client's accuracy, mean the mean.
  examples = [_record([0.0] + [0.5] * 9), _record([0.1] + [0.5] * 9)]
  uniform = [_record([0.4] + [0.8] * 9), _record([0.4] + [0.8] * 9)]
  qffl = [_record([0.5] + [0.8] * 9), _record([0.3] + [0.8] * 9)]
  rows = {
      'E': [fedavg_weighting.held_out(r) for r in examples],
      'U': [fedavg_weighting.held_out(r) for r in uniform],
      'Q': [fedavg_weighting.held_out(r) for r in qffl],
  }
  lines = fedavg_weighting.table(rows)
  assert lines[0] == 'worst10 E: 5.0 (7.1); per seed 0.0 10.0'
  # U minus E per seed: 40 and 30 points; mean 35, std 7.07, t(1) = 12.71.
  assert lines[3] == (
      'worst10 U minus E: +35.0 +- 63.5 (std 7.1), higher on 2 of 2 seeds'
  )
  # Q minus U: +10 and -10.
  assert lines[4] == (
      'worst10 Q minus U: +0.0 +- 127.1 (std 14.1), higher on 1 of 2 seeds'
  )


def test_bad_folders_are_named():
  problem = fedavg_weighting.problem
  assert problem(None, '/o', '/r') == '--records_dir is required'
  assert problem('/r', '', '/o') == '--out_records_dir is required'
  assert problem('/nowhere', '/o', '/r') == (
      '--records_dir=/nowhere is not a folder'
  )


def test_records_of_other_seeds_are_refused(tmp_path):
  (tmp_path / 'final_fedavg_lr0.011_seed0.json').write_text('{}')
  (tmp_path / 'final_qffl_q0.01_lr0.011_seed1.json').write_text('{}')
  assert fedavg_weighting.problem(str(tmp_path), '/o', '/r') == (
      f'{tmp_path} holds no final FedAvg and q-FedAvg records of the same '
      'seeds'
  )
  (tmp_path / 'final_qffl_q0.01_lr0.011_seed0.json').write_text('{}')
  (tmp_path / 'final_qffl_q0.01_lr0.011_seed1.json').unlink()
  assert fedavg_weighting.problem(str(tmp_path), '/o', '/r') is None


def test_the_binary_says_it_in_one_line(tmp_path):
  code, _, stderr = binary.run_module(
      'run.experiments.fedavg_weighting',
      [
          f'--records_dir={tmp_path}',
          '--out_records_dir=o',
          '--output_dir=r',
          '--jobs=0',
      ],
      timeout=300,
  )
  assert code == 2
  assert binary.error_lines(stderr) == [
      f'fedavg_weighting: error: {tmp_path} holds no final FedAvg and '
      'q-FedAvg records of the same seeds'
  ], stderr
  assert not (tmp_path / 'o').exists()
