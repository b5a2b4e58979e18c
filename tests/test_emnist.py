# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests of `tasks.emnist` on a small SQLite file in TFF's cache format."""

import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base
from tasks import emnist
from tests import sqlite_fixtures

TRAIN_SIZES = {'f0000_14': 5, 'f0001_41': 3, 'f0002_07': 8, 'f0003_22': 2}
TEST_SIZES = {'f0000_14': 2, 'f0001_41': 1, 'f0002_07': 2, 'f0003_22': 1}
IDS = sorted(TRAIN_SIZES)


@pytest.fixture(scope='module')
def data(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp('emnist'))
  train = sqlite_fixtures.emnist_client_arrays(TRAIN_SIZES, seed=0)
  test = sqlite_fixtures.emnist_client_arrays(TEST_SIZES, seed=1)
  sqlite_fixtures.write_emnist(data_dir, train, test)
  return data_dir, train, test


def _task(data_dir, **kwargs):
  kwargs.setdefault('batch_size', 2)
  kwargs.setdefault('model', 'linear')
  return emnist.create_task(data_dir=data_dir, **kwargs)


def _labels(dataset):
  return [int(y) for _, ys in dataset for y in ys.numpy()]


def test_reads_clients_examples_and_pixels_through_tff_loader(data):
  data_dir, train, _ = data
  task = _task(data_dir)
  assert task.name == 'emnist_character'
  assert task.train_data.client_ids == IDS
  assert task.test_data.client_ids == IDS
  for cid in IDS:
    raw = task.train_data.create_tf_dataset_for_client(cid)
    assert base.count_examples(raw) == TRAIN_SIZES[cid]
    assert (
        base.count_examples(task.test_data.create_tf_dataset_for_client(cid))
        == TEST_SIZES[cid]
    )
  spec = task.train_data.element_type_structure
  assert spec['pixels'] == tf.TensorSpec([28, 28], tf.float32)
  assert spec['label'] == tf.TensorSpec([], tf.int32)
  first = list(task.train_data.create_tf_dataset_for_client(IDS[0]))
  np.testing.assert_array_equal(first[0]['pixels'].numpy(), train[IDS[0]][0][0])
  assert [int(e['label']) for e in first] == train[IDS[0]][1].tolist()


def test_batches_within_epochs_and_shapes(data):
  task = _task(data[0])
  batches = list(task.train_dataset(IDS[0], epochs=2))  # 5 examples
  assert [int(y.shape[0]) for _, y in batches] == [2, 2, 1, 2, 2, 1]
  x, y = batches[0]
  assert x.shape[1:] == (28, 28, 1) and x.dtype == tf.float32
  assert y.dtype == tf.int32
  stored = data[1][IDS[0]][1].tolist()
  assert _labels(task.train_dataset(IDS[0], epochs=1)) == stored
  evaluation = list(task.eval_dataset(IDS[0], 'test'))
  assert len(evaluation) == 1 and evaluation[0][0].shape == (2, 28, 28, 1)


def test_shuffle_is_seeded_and_reshuffles_each_epoch(data):
  task = _task(data[0])
  cid = 'f0002_07'  # 8 examples with distinct labels.
  stored = data[1][cid][1].tolist()
  runs = [
      _labels(task.train_dataset(cid, epochs=3, shuffle_seed=5))
      for _ in range(2)
  ]
  assert runs[0] == runs[1]
  epochs = [runs[0][i * 8 : (i + 1) * 8] for i in range(3)]
  assert all(sorted(e) == sorted(stored) for e in epochs)
  assert len({tuple(e) for e in epochs + [stored]}) > 1
  other = _labels(task.train_dataset(cid, epochs=3, shuffle_seed=6))
  assert other != runs[0]


def test_min_examples_max_clients_and_unseen_test_clients(data):
  data_dir = data[0]
  task = _task(data_dir, min_examples=4)
  assert task.train_data.client_ids == ['f0000_14', 'f0002_07']
  assert task.test_data.client_ids == ['f0000_14', 'f0002_07']
  subset = _task(data_dir, max_clients=3, seed=1).train_data.client_ids
  assert len(subset) == 3 and set(subset) <= set(IDS)
  assert _task(data_dir, max_clients=3, seed=1).train_data.client_ids == subset
  # Delta-FL: splits merged (counts 7, 4, 10, 3), filtered, then half unseen.
  task = _task(data_dir, test_clients_fraction=0.5, min_examples=4)
  train_ids, test_ids = task.train_data.client_ids, task.test_data.client_ids
  assert not set(train_ids) & set(test_ids)
  assert sorted(train_ids + test_ids) == ['f0000_14', 'f0001_41', 'f0002_07']
  assert len(test_ids) == 2
  for cid in test_ids:
    full = TRAIN_SIZES[cid] + TEST_SIZES[cid]
    assert (
        base.count_examples(task.test_data.create_tf_dataset_for_client(cid))
        == full
    )
  with pytest.raises(base.TaskError, match='at least 100 examples'):
    _task(data_dir, min_examples=100)


def test_only_digits_reads_digit_splits(data):
  task = _task(data[0], only_digits=True)
  for cid in task.train_data.client_ids:
    labels = _labels(task.train_dataset(cid, epochs=1))
    assert labels and max(labels) < 10


@pytest.mark.parametrize('model', emnist.MODELS)
def test_models_forward_pass(data, model):
  task = _task(data[0], model=model, seed=3)
  batch = next(iter(task.train_dataset(IDS[0], epochs=1)))
  keras_model = task.model_fn()
  output = keras_model.forward_pass(batch, training=False)
  assert np.isfinite(float(output.loss))
  assert output.predictions.shape == (2, 62)
  assert 'accuracy' in keras_model.report_local_unfinalized_metrics()
  weights = [v.numpy() for v in keras_model.trainable_variables]
  again = [v.numpy() for v in task.model_fn().trainable_variables]
  for a, b in zip(weights, again):
    np.testing.assert_array_equal(a, b)  # Seeded initialisers.
  if model == 'linear':
    assert [w.shape for w in weights] == [(784, 62)]
    assert not np.any(weights[0])
  if model == 'convnet':
    assert [w.shape for w in weights] == [
        (5, 5, 1, 32),
        (32,),
        (5, 5, 32, 64),
        (64,),
        (1024, 62),
        (62,),
    ]


def test_missing_file_names_it_and_does_not_download(tmp_path):
  empty = str(tmp_path)
  with pytest.raises(base.TaskError) as raised:
    emnist.create_task(data_dir=empty, batch_size=2)
  message = str(raised.value)
  assert 'emnist_all.sqlite' in message and empty in message
  assert 'emnist_all.sqlite.lzma' in message and '\n' not in message
  assert os.listdir(empty) == []


def test_invalid_arguments():
  with pytest.raises(base.TaskError, match='unknown EMNIST model'):
    emnist.create_task(
        data_dir=None, use_synthetic_data=True, batch_size=2, model='resnet'
    )
  with pytest.raises(base.TaskError, match='test_clients_fraction'):
    emnist.create_task(
        data_dir=None,
        use_synthetic_data=True,
        batch_size=2,
        test_clients_fraction=1.0,
    )


def test_synthetic_data_forward_pass():
  task = emnist.create_task(
      data_dir=None, use_synthetic_data=True, batch_size=4, model='convnet'
  )
  assert len(task.train_data.client_ids) == 2
  batch = next(iter(task.train_dataset(task.train_data.client_ids[0], 1, 0)))
  assert batch[0].shape == (4, 28, 28, 1)
  model = task.model_fn()  # forward_pass holds its model weakly.
  output = model.forward_pass(batch, training=False)
  assert np.isfinite(float(output.loss))
  split = emnist.create_task(
      data_dir=None,
      use_synthetic_data=True,
      batch_size=4,
      test_clients_fraction=0.5,
  )
  assert len(split.test_data.client_ids) == 1


def test_one_fedavg_round_on_sqlite_clients(data):
  task = _task(data[0], model='convnet')
  process = tff.learning.algorithms.build_weighted_fed_avg(
      task.model_fn, tff.learning.optimizers.build_sgdm(0.01)
  )
  state = process.initialize()
  clients = IDS[:2]
  result = process.next(
      state, [task.train_dataset(c, epochs=1, shuffle_seed=0) for c in clients]
  )
  train_metrics = result.metrics['client_work']['train']
  assert (
      train_metrics['num_examples'] == TRAIN_SIZES[IDS[0]] + TRAIN_SIZES[IDS[1]]
  )
  assert np.isfinite(train_metrics['loss'])
  assert 0.0 <= train_metrics['accuracy'] <= 1.0
