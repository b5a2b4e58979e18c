# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests of `run.tail_benchmark.rerun`: a record's run again, compared.

The comparison and the arguments are tested here without training; the
binary's `--rerun` runs a real record in tests/test_benchmark.py.
"""

import json

import pytest

from run.tail_benchmark import rerun


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
            "not a training run's record",
        ),
        (json.dumps({'mean': 0.1}), "not a training run's record"),
        (json.dumps(_record(diverged='loss is nan')), 'a diverged run'),
    ],
)
def test_records_that_cannot_be_rerun_are_one_error(tmp_path, content, words):
  if content is not None:
    (tmp_path / 'r.json').write_text(content)
  with pytest.raises(rerun.RerunError, match=words):
    rerun.load(str(tmp_path), 'r')


def test_a_training_record_loads(tmp_path):
  (tmp_path / 'r.json').write_text(json.dumps(_record()))
  assert rerun.load(str(tmp_path), 'r') == _record()
