# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests of `tasks.stackoverflow` on small files in TFF's cache format."""

import os

import numpy as np
import pytest
import tensorflow as tf

from tasks import base
from tasks import stackoverflow
from tests import sqlite_fixtures

WORDS = {
    'the': 90,
    'a': 80,
    'to': 70,
    'is': 60,
    'i': 50,
    'it': 40,
    'in': 30,
    'you': 20,
    'and': 10,
    'of': 5,
}
TAGS = {'java': 3, 'python': 9, 'c++': 5, 'sql': 1, 'css': 4, 'git': 2}
TRAIN = {
    '00000010': [
        ('the a to is i it in you', 'python|java'),
        ('you and of zebra', 'css'),
        ('it is', 'python'),
        ('a', 'git|sql'),
        ('the the', 'c++'),
    ],
    '00000020': [('i i', 'java'), ('of', 'python')],
    '00000030': [('to it', 'css|git'), ('and', 'java'), ('in in', 'sql')],
}
HELDOUT = {'00000040': [('the', 'java')]}
TEST = {'00000010': [('a to', 'python')], '00000030': [('is', 'css')]}
IDS = sorted(TRAIN)
WORD_KWARGS = dict(
    task_type='word',
    word_vocab_size=8,
    sequence_length=6,
    embedding_size=4,
    lstm_size=8,
)


def _write_sqlite(directory):
  sqlite_fixtures.write_stackoverflow(
      directory, {'train': TRAIN, 'heldout': HELDOUT, 'test': TEST}
  )


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  """Counts in `datasets/`, where TFF's Keras download extracts them."""
  directory = str(tmp_path_factory.mktemp('stackoverflow'))
  _write_sqlite(directory)
  sqlite_fixtures.write_word_counts(os.path.join(directory, 'datasets'), WORDS)
  sqlite_fixtures.write_tag_counts(os.path.join(directory, 'datasets'), TAGS)
  return directory


def _task(data_dir, **kwargs):
  kwargs.setdefault('batch_size', 2)
  for key, value in WORD_KWARGS.items():
    kwargs.setdefault(key, value)
  return stackoverflow.create_task(data_dir=data_dir, **kwargs)


def test_reads_splits_through_tff_loader(data_dir):
  task = _task(data_dir)
  assert task.name == 'stackoverflow_word'
  assert task.train_data.client_ids == IDS
  # Per-user test split: only the users that have one.
  assert task.test_data.client_ids == ['00000010', '00000030']
  assert task.validation_data.client_ids == ['00000040']
  for cid in IDS:
    assert base.count_examples(
        task.train_data.create_tf_dataset_for_client(cid)
    ) == len(TRAIN[cid])
  spec = task.train_data.element_type_structure
  assert sorted(spec) == [
      'creation_date',
      'score',
      'tags',
      'title',
      'tokens',
      'type',
  ]
  assert spec['score'] == tf.TensorSpec([], tf.int64)
  first = next(iter(task.train_data.create_tf_dataset_for_client(IDS[0])))
  assert first['tokens'].numpy().decode() == TRAIN[IDS[0]][0][0]


def test_word_sequences_batches_and_epochs(data_dir):
  task = _task(data_dir)
  batches = list(task.train_dataset(IDS[0], epochs=2))  # 5 examples
  assert [int(x.shape[0]) for x, _ in batches] == [2, 2, 1, 2, 2, 1]
  x, y = (t.numpy() for t in batches[0])
  assert x.shape == (2, 6) and y.shape == (2, 6) and x.dtype == np.int64
  vocab = {w: i + 1 for i, w in enumerate(list(WORDS)[:8])}
  bos, eos = 8 + 1 + 1, 8 + 1 + 2  # Vocabulary, one out-of-vocab bucket.
  first = [bos] + [vocab[w] for w in 'the a to is i it'.split()]  # Truncated.
  assert x[0].tolist() == first[:-1] and y[0].tolist() == first[1:]
  second = [bos, vocab['you'], 9, 9, 9, eos, 0]  # 'and', 'of', 'zebra' OOV.
  assert x[1].tolist() == second[:-1] and y[1].tolist() == second[1:]


def test_shuffle_is_seeded(data_dir):
  task = _task(data_dir)

  def firsts(seed):
    return [
        tuple(r)
        for x, _ in task.train_dataset(IDS[0], 3, seed)
        for r in x.numpy()[:, :3].tolist()
    ]

  assert firsts(4) == firsts(4)
  stored = firsts(None)
  epochs = [firsts(4)[i * 5 : (i + 1) * 5] for i in range(3)]
  assert all(sorted(e) == sorted(stored[:5]) for e in epochs)
  assert len({tuple(e) for e in epochs + [stored[:5]]}) > 1


def test_min_examples_and_unseen_test_clients(data_dir):
  assert _task(data_dir, min_examples=3).train_data.client_ids == [
      '00000010',
      '00000030',
  ]
  task = _task(data_dir, test_clients_fraction=0.34, seed=0)
  train_ids, test_ids = task.train_data.client_ids, task.test_data.client_ids
  assert len(train_ids) == 2 and len(test_ids) == 1
  assert sorted(train_ids + test_ids) == IDS
  (cid,) = test_ids
  assert base.count_examples(
      task.test_data.create_tf_dataset_for_client(cid)
  ) == len(TRAIN[cid]) + len(TEST.get(cid, []))


def test_word_model_forward_pass(data_dir):
  task = _task(data_dir, seed=2)
  batch = next(iter(task.train_dataset(IDS[0], 1, shuffle_seed=0)))
  model = task.model_fn()
  output = model.forward_pass(batch, training=False)
  assert np.isfinite(float(output.loss))
  assert output.predictions.shape == (2, 6, 8 + 4)
  metrics = model.report_local_unfinalized_metrics()
  assert {'accuracy', 'accuracy_without_out_of_vocab', 'num_tokens'} <= set(
      metrics
  )
  again = task.model_fn()
  for a, b in zip(model.trainable_variables, again.trainable_variables):
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_tag_task_bags_and_forward_pass(data_dir):
  task = _task(data_dir, task_type='tag', tag_vocab_size=5)
  assert task.name == 'stackoverflow_tag'
  x, y = next(iter(task.train_dataset(IDS[0], 1)))
  assert x.shape == (2, 8) and y.shape == (2, 5)
  np.testing.assert_allclose(x.numpy().sum(axis=1), 1.0, rtol=1e-6)
  # Tags by decreasing count: python, c++, css, java, git (sql dropped).
  assert y.numpy().tolist() == [[1, 0, 0, 1, 0], [0, 0, 1, 0, 0]]
  model = task.model_fn()
  output = model.forward_pass((x, y), training=False)
  assert np.isfinite(float(output.loss))
  assert {'accuracy', 'precision', 'recall_at_5'} <= set(
      model.report_local_unfinalized_metrics()
  )
  with pytest.raises(base.TaskError, match='tag_vocab_size'):
    _task(data_dir, task_type='tag', tag_vocab_size=3)


def test_missing_files_are_named(tmp_path):
  directory = str(tmp_path)
  with pytest.raises(base.TaskError, match='stackoverflow.sqlite'):
    _task(directory)
  _write_sqlite(directory)
  with pytest.raises(base.TaskError) as raised:
    _task(directory)
  message = str(raised.value)
  assert "'stackoverflow.word_count'" in message and directory in message
  assert 'stackoverflow.word_count.tar.bz2' in message and '\n' not in message
  sqlite_fixtures.write_word_counts(directory, WORDS)  # Top level works too.
  assert _task(directory).train_data.client_ids == IDS
  with pytest.raises(base.TaskError, match="'stackoverflow.tag_count'"):
    _task(directory, task_type='tag')
  sqlite_fixtures.write_tag_counts(directory, TAGS, archive=True)
  task = _task(directory, task_type='tag', tag_vocab_size=5)  # Extracts it.
  assert os.path.isfile(os.path.join(directory, 'stackoverflow.tag_count'))
  assert task.name == 'stackoverflow_tag'


def test_invalid_task_type():
  with pytest.raises(base.TaskError, match='task_type'):
    stackoverflow.create_task(
        data_dir=None, use_synthetic_data=True, batch_size=2, task_type='title'
    )


@pytest.mark.parametrize('task_type', stackoverflow.TASK_TYPES)
def test_synthetic_data_forward_pass(task_type):
  task = stackoverflow.create_task(
      data_dir=None,
      use_synthetic_data=True,
      batch_size=2,
      task_type=task_type,
      lstm_size=8,
      embedding_size=4,
  )
  assert len(task.train_data.client_ids) == 3
  batch = next(iter(task.train_dataset(task.train_data.client_ids[0], 1, 0)))
  model = task.model_fn()
  assert np.isfinite(float(model.forward_pass(batch, training=False).loss))
