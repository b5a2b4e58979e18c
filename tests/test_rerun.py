# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests of `run.tail_benchmark.rerun`: a record's run again, compared.

The comparison and the arguments are tested without training; the
binary's `--rerun` runs a tiny benchmark's training run and both baselines'
fine-tunings again (`test_the_binary_reruns_a_run_and_both_baselines`).
"""

# It runs the binaries end to end (tests/binary.py).
# bazel-size: large

import json
import os
import shutil

import pytest

from run.tail_benchmark import origin as origin_lib
from run.tail_benchmark import records as bench_records
from run.tail_benchmark import rerun
from tests import binary


def _record(**changes):
  record = {
      'args': [
          '--task=synthetic',
          '--total_rounds=4',
          '--root_output_dir=/elsewhere/runs',
          '--experiment_name=select_fedavg_lr0.1_seed100',
          '--data_dir=/elsewhere/data',
          '--seed=100',
      ],
      'splits': {
          'test': {
              'client_id': ['a', 'b'],
              'num_examples': [3, 4],
              'accuracy': [0.5, 0.25],
              'loss': [1.0, 2.0],
          }
      },
      'curve': {'test': [[2, 0.3, 0.1], [4, 0.4, 0.2]]},
      'examples': 70,
      'wall_s': 1.0,
  }
  record.update(changes)
  return record


def _fine_tuning(name='run', start='final', rate=0.5):
  """A fine-tuning record of the run `name` from its `start` model."""
  epoch = {
      'client_id': ['a', 'b'],
      'accuracy': [0.5, rate],
      'loss': [1.0, 2.0],
      'num_examples': [3, 4],
  }
  options = {
      'batch_size': 5,
      'learning_rates': [0.1],
      'max_epochs': 1,
      'starts': [start],
  }
  return {
      'args': [
          '--task=synthetic',
          f'--experiment_name={name}',
          json.dumps(options, sort_keys=True),
      ],
      'splits': {start: {'test': {'0.1': [epoch, epoch]}}},
      'train_examples': {'test': 40},
      'wall_s': 1.0,
  }


def test_rerun_args_replace_only_this_machines_folders():
  args = rerun.rerun_args(_record()['args'], 'name_r2', '/here', '/data')
  assert args == [
      '--task=synthetic',
      '--total_rounds=4',
      '--root_output_dir=/here',
      '--experiment_name=name_r2',
      '--data_dir=/data',
      '--seed=100',
  ]
  kept = rerun.rerun_args(_record()['args'], 'n', '/here', None)
  assert '--data_dir=/elsewhere/data' in kept


def test_identical_records_have_no_differences():
  assert not rerun.differences(_record(), _record())
  # Within the 6th decimal the records keep: the same.
  close = _record()
  close['splits']['test']['accuracy'] = [0.500001, 0.25]
  assert not rerun.differences(_record(), close)


@pytest.mark.parametrize(
    'where, change, words',
    [
        (
            'splits',
            lambda r: r['splits']['test']['accuracy'].__setitem__(1, 0.3),
            'splits/test/accuracy: differs at 1 (0.25 recorded, 0.3 rerun)',
        ),
        (
            'splits',
            lambda r: r['splits']['test']['client_id'].__setitem__(0, 'z'),
            'splits/test/client_id: differs at 0',
        ),
        (
            'curve',
            lambda r: r['curve']['test'][1].__setitem__(1, 0.41),
            'curve/test: differs at 4 (0.4 recorded, 0.41 rerun)',
        ),
        (
            'examples',
            lambda r: r.__setitem__('examples', 71),
            'examples: differs at 0 (70 recorded, 71 rerun)',
        ),
        (
            'splits',
            lambda r: r['splits']['test'].pop('loss'),
            'splits/test/loss: only in the record',
        ),
        (
            'splits',
            lambda r: r['splits']['test']['loss'].append(3.0),
            'splits/test/loss: 2 values recorded, 3 rerun',
        ),
    ],
)
def test_each_kind_of_difference_is_named(where, change, words):
  del where
  other = _record()
  change(other)
  found = rerun.differences(_record(), other)
  assert len(found) == 1 and found[0].startswith(words), found


def test_the_largest_gap_is_named():
  other = _record()
  other['curve']['test'][0][2] = 0.1 + 1e-3
  other['curve']['test'][1][2] = 0.2 + 1e-2
  found = rerun.differences(_record(), other)
  assert len(found) == 1, found
  assert found[0].startswith('curve/test: differs at 5 (0.2 recorded'), found


@pytest.mark.parametrize(
    'content, words',
    [
        (None, 'no record'),
        ('{', 'unreadable .JSONDecodeError.'),
        (
            json.dumps({'fine_tune': {}, 'args': ['--total_rounds=3']}),
            "neither a training run's record nor a fine-tuning's",
        ),
        (json.dumps({'mean': 0.1}), "neither a training run's record"),
        (
            json.dumps(_fine_tuning(name='other')),
            'r is not the fine-tuning of other its arguments name',
        ),
        (json.dumps(_record(diverged='loss is nan')), 'a diverged run'),
    ],
)
def test_records_that_cannot_be_rerun_are_one_error(tmp_path, content, words):
  if content is not None:
    (tmp_path / 'r.json').write_text(content)
  with pytest.raises(rerun.RerunError, match=words):
    rerun.load(str(tmp_path), 'r')


def test_a_fine_tunings_epochs_are_compared_value_by_value():
  assert not rerun.differences(_fine_tuning(), _fine_tuning())
  found = rerun.differences(_fine_tuning(), _fine_tuning(rate=0.75))
  assert found == [
      'splits/final/test/0.1/0/accuracy: differs at 1 (0.5 recorded, 0.75 '
      'rerun)',
      'splits/final/test/0.1/1/accuracy: differs at 1 (0.5 recorded, 0.75 '
      'rerun)',
  ]
  more = _fine_tuning()
  more['train_examples']['test'] = 41
  assert rerun.differences(_fine_tuning(), more) == [
      'train_examples/test: differs at 0 (40 recorded, 41 rerun)'
  ]


def test_a_fine_tuning_loads_only_beside_the_model_it_started_from(tmp_path):
  record = _fine_tuning(name='run')
  (tmp_path / 'run_ftfinal.json').write_text(json.dumps(record))
  with pytest.raises(rerun.RerunError, match='no .*run.weights.npz'):
    rerun.load(str(tmp_path), 'run_ftfinal')
  (tmp_path / 'run.weights.npz').write_bytes(b'model')
  assert rerun.load(str(tmp_path), 'run_ftfinal') == record
  # Local training starts from the initial model its flags fix.
  local = _fine_tuning(name='x', start='initial')
  (tmp_path / 'x_ftinitial.json').write_text(json.dumps(local))
  assert rerun.load(str(tmp_path), 'x_ftinitial') == local
  assert rerun.fine_tuning(_record()) is None
  damaged = {**local, 'train_examples': 3}
  (tmp_path / 'x_ftinitial.json').write_text(json.dumps(damaged))
  with pytest.raises(rerun.RerunError, match='x_ftinitial: no train_exam'):
    rerun.load(str(tmp_path), 'x_ftinitial')


def _tiny_fedavg(root):
  return [
      '--task=synthetic',
      '--num_clients=12',
      '--test_clients_fraction=0.5',
      '--total_rounds=2',
      '--rounds_per_eval=2',
      '--clients_per_round=3',
      '--client_batch_size=5',
      '--client_learning_rate=0.1',
      '--algorithm=fedavg',
      '--simulation_engine=stacked',
      '--holdout=test',
      '--eval_train_clients=false',
      '--seed=0',
      '--data_seed=0',
      f'--root_output_dir={root}',
      '--experiment_name=final_fedavg',
  ]


def test_the_binary_reruns_a_run_and_both_baselines(tmp_path):
  # Records made as the benchmark makes them, in another folder; the
  # binary runs them again: the run, FedAvg + fine-tuning from the final
  # model saved with the run's record, and local training.
  made = tmp_path / 'made'
  here = origin_lib.current([])
  runs = bench_records.Runs(str(made), str(tmp_path), 1, False, origin=here)
  try:
    args = _tiny_fedavg(tmp_path / 'runs')
    runs.run(args, 2, False)
    for start in ('final', 'initial'):
      runs.fine_tune(args, [0.1], 2, 5, start=start)
  finally:
    runs.close()
  records = tmp_path / 'records'
  shutil.copytree(made, records)
  shutil.rmtree(tmp_path / 'runs')
  # A fine-tuning that is not what its record says is found: a copy of the
  # record (another tag of the same run) whose model was swapped for
  # FedAvg's initial one.
  initial = json.loads((records / 'final_fedavg_ftinitial.json').read_text())
  tuned = json.loads((records / 'final_fedavg_ftfinal.json').read_text())
  tuned['splits'] = {'final': initial['splits']['initial']}
  (records / 'final_fedavg_ftfinal2.json').write_text(json.dumps(tuned))
  names = [
      'final_fedavg',
      'final_fedavg_ftfinal',
      'final_fedavg_ftinitial',
      'final_fedavg_ftfinal2',
  ]
  code, stdout, stderr = binary.run_module(
      'run.tail_benchmark.benchmark',
      [
          '--setting=synthetic',
          f'--records_dir={records}',
          f'--output_dir={tmp_path / "out"}',
          '--rerun=' + ','.join(names),
      ],
  )
  assert code == 1, stderr[-3000:]
  for words in (
      'rerun final_fedavg (same origin): identical: 2 split(s) of 6 clients',
      'rerun final_fedavg_ftfinal (same origin): identical: fine-tuning from '
      'the final model: 2 split(s), 1 learning rate(s), 2 epoch(s)',
      'rerun final_fedavg_ftinitial (same origin): identical: fine-tuning '
      'from the initial model',
      'rerun final_fedavg_ftfinal2 (same origin): DIFFERS in',
      'benchmark: 3 of 4 records rerun identically',
  ):
    assert words in stdout, stdout
  assert not os.path.exists(records / 'rerun')


def test_a_training_record_loads(tmp_path):
  (tmp_path / 'r.json').write_text(json.dumps(_record()))
  assert rerun.load(str(tmp_path), 'r') == _record()


@pytest.mark.parametrize(
    'value, kernels',
    [(None, 'off'), ('1', 'on'), ('0', 'off'), ('true', 'on')],
)
def test_the_binaries_compute_without_onednn_unless_asked(value, kernels):
  # TensorFlow turns oneDNN on by default only on some CPUs, and it rounds
  # otherwise: `import run` keeps it off, so every machine makes the same
  # numbers, and a record's origin says which kernels made it.
  env = {k: v for k, v in os.environ.items() if k != 'TF_ENABLE_ONEDNN_OPTS'}
  if value is not None:
    env['TF_ENABLE_ONEDNN_OPTS'] = value
  code = (
      'import run\n'
      'from tensorflow.python.util import _pywrap_util_port as port\n'
      'from run.tail_benchmark import origin\n'
      'print(port.IsMklEnabled(), origin.current([])["numerics"])'
  )
  returncode, out, stderr = binary.run_code(code, [], env=env)
  assert returncode == 0, stderr[-3000:]
  assert out.split() == [
      str(kernels == 'on'),
      "{'onednn':",
      f"'{kernels}'}}",
  ]


def test_onednn_reads_the_variable_as_tensorflow_does():
  assert origin_lib.onednn({}) == 'cpu default'
  assert origin_lib.onednn({'TF_ENABLE_ONEDNN_OPTS': ' False '}) == 'off'
  assert origin_lib.onednn({'TF_ENABLE_ONEDNN_OPTS': 'TRUE'}) == 'on'
  assert origin_lib.onednn({'TF_ENABLE_ONEDNN_OPTS': 'yes'}) == 'cpu default'
  described = origin_lib.describe(
      {**origin_lib.current([]), 'numerics': {'onednn': 'on'}}
  )
  assert described.endswith("; TensorFlow's oneDNN kernels on")
  assert 'oneDNN' not in origin_lib.describe(
      {'code': {'sources': 'x'}, 'versions': {}}
  )
