# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests of `tasks.shakespeare` on a small SQLite file in TFF's format."""

import numpy as np
import pytest
import tensorflow as tf

from tasks import base
from tasks import shakespeare
from tests import sqlite_fixtures

SEQ = 10
TRAIN = {
    'ALLS_WELL_THAT_ENDS_WELL_BERTRAM': ['Hi', 'Go.', 'No!', 'Yes', 'Ay'],
    'HAMLET_OPHELIA': ['What, my lord?', 'Adieu.', 'Oh'],
    'KING_LEAR_FOOL': ['Nuncle'],
    'MACBETH_MACBETH': [
        'If it were done',
        'Is this a dagger',
        'Out',
        'Hark',
        'Who',
        'Ho',
    ],
}
TEST = {cid: ['Why?'] * (i + 1) for i, cid in enumerate(sorted(TRAIN))}
IDS = sorted(TRAIN)
SHORT = IDS[0]  # 5 snippets of at most SEQ - 1 characters: one window each.


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp('shakespeare'))
  sqlite_fixtures.write_shakespeare(directory, TRAIN, TEST)
  return directory


def _task(data_dir, **kwargs):
  kwargs.setdefault('batch_size', 2)
  kwargs.setdefault('sequence_length', SEQ)
  return shakespeare.create_task(data_dir=data_dir, **kwargs)


def _ids(text):
  vocab = {c: i + 1 for i, c in enumerate(shakespeare.CHAR_VOCAB)}
  return [shakespeare.BOS] + [vocab[c] for c in text] + [shakespeare.EOS]


def _first_inputs(dataset):
  """Decoded first characters of every window (identifies the snippet)."""
  return [tuple(row[:3]) for x, _ in dataset for row in x.numpy().tolist()]


def test_reads_clients_and_snippets_through_tff_loader(data_dir):
  task = _task(data_dir)
  assert task.name == 'shakespeare_character'
  assert task.train_data.client_ids == IDS
  assert task.test_data.client_ids == IDS
  for cid in IDS:
    assert base.count_examples(
        task.train_data.create_tf_dataset_for_client(cid)
    ) == len(TRAIN[cid])
    assert base.count_examples(
        task.test_data.create_tf_dataset_for_client(cid)
    ) == len(TEST[cid])
  raw = list(task.train_data.create_tf_dataset_for_client(SHORT))
  assert [e['snippets'].numpy().decode() for e in raw] == TRAIN[SHORT]


def test_windows_targets_batches_and_epochs(data_dir):
  task = _task(data_dir)
  batches = list(task.train_dataset(SHORT, epochs=2))
  assert [int(x.shape[0]) for x, _ in batches] == [2, 2, 1, 2, 2, 1]
  x, y = batches[0]
  assert x.shape == (2, SEQ) and y.shape == (2, SEQ)
  assert x.dtype == tf.int64 and y.dtype == tf.int64
  window = _ids('Hi') + [shakespeare.PAD] * (SEQ + 1 - 4)
  assert x.numpy()[0].tolist() == window[:-1]
  assert y.numpy()[0].tolist() == window[1:]
  # Two snippets of 15 and 16 characters (17, 18 ids) make two windows each.
  windows = [x for x, _ in task.train_dataset('MACBETH_MACBETH', 1)]
  assert sum(int(w.shape[0]) for w in windows) == 8
  evaluation = list(task.eval_dataset(SHORT, 'test'))
  assert len(evaluation) == 1 and evaluation[0][0].shape == (1, SEQ)


def test_shuffle_is_seeded_and_reshuffles_each_epoch(data_dir):
  task = _task(data_dir)
  cid = 'MACBETH_MACBETH'
  stored = _first_inputs(task.train_dataset(cid, 1))
  runs = [
      _first_inputs(task.train_dataset(cid, 3, shuffle_seed=2))
      for _ in range(2)
  ]
  assert runs[0] == runs[1]
  n = len(stored)
  epochs = [runs[0][i * n : (i + 1) * n] for i in range(3)]
  assert all(sorted(e) == sorted(stored) for e in epochs)
  assert len({tuple(e) for e in epochs + [stored]}) > 1


def test_min_examples_and_unseen_test_clients(data_dir):
  task = _task(data_dir, min_examples=3)
  assert task.train_data.client_ids == [
      'ALLS_WELL_THAT_ENDS_WELL_BERTRAM',
      'HAMLET_OPHELIA',
      'MACBETH_MACBETH',
  ]
  task = _task(data_dir, test_clients_fraction=0.25, max_clients=4, seed=4)
  train_ids, test_ids = task.train_data.client_ids, task.test_data.client_ids
  assert len(train_ids) == 3 and len(test_ids) == 1
  assert sorted(train_ids + test_ids) == IDS
  (cid,) = test_ids
  assert base.count_examples(
      task.test_data.create_tf_dataset_for_client(cid)
  ) == len(TRAIN[cid]) + len(TEST[cid])


def test_model_forward_pass_and_padding(data_dir):
  task = _task(data_dir, seed=1)
  batch = next(iter(task.train_dataset(SHORT, epochs=1)))
  model = task.model_fn()
  output = model.forward_pass(batch, training=False)
  assert np.isfinite(float(output.loss))
  assert output.predictions.shape == (2, SEQ, shakespeare.VOCAB_SIZE)
  metrics = model.report_local_unfinalized_metrics()
  assert 'accuracy' in metrics
  assert int(metrics['num_tokens'][0]) == 7  # 'i', 'Go.' and two ends.
  x, y = (t.numpy() for t in batch)
  losses = tf.keras.losses.sparse_categorical_crossentropy(
      y, output.predictions, from_logits=True
  ).numpy()
  # TFF's forward pass averages over every position, padding included.
  np.testing.assert_allclose(float(output.loss), losses.mean(), rtol=1e-5)
  assert (x == shakespeare.PAD).any()
  again = task.model_fn()
  for a, b in zip(model.trainable_variables, again.trainable_variables):
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_missing_file_names_it(tmp_path):
  with pytest.raises(base.TaskError) as raised:
    shakespeare.create_task(data_dir=str(tmp_path), batch_size=2)
  message = str(raised.value)
  assert 'shakespeare.sqlite' in message and str(tmp_path) in message
  assert 'shakespeare.sqlite.lzma' in message and '\n' not in message


def test_invalid_sequence_length():
  with pytest.raises(base.TaskError, match='sequence_length'):
    shakespeare.create_task(
        data_dir=None, use_synthetic_data=True, batch_size=2, sequence_length=0
    )


def test_synthetic_data_forward_pass():
  task = shakespeare.create_task(
      data_dir=None, use_synthetic_data=True, batch_size=2, sequence_length=SEQ
  )
  assert len(task.train_data.client_ids) == 3
  cid = task.train_data.client_ids[0]
  batch = next(iter(task.train_dataset(cid, 1, shuffle_seed=0)))
  assert batch[0].shape[1:] == (SEQ,)
  model = task.model_fn()
  assert np.isfinite(float(model.forward_pass(batch, training=False).loss))
