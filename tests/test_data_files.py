# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests of `tasks.data_files`: finding TFF's cached files, client selection."""

import collections
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base
from tasks import data_files
from tests import sqlite_fixtures


def _client_data(sizes, offset=0):
  return tff.simulation.datasets.TestClientData(
      {
          cid: collections.OrderedDict(
              x=np.arange(offset, offset + n, dtype=np.int32)
          )
          for cid, n in sizes.items()
      }
  )


def _values(client_data, cid):
  return [int(e['x']) for e in client_data.create_tf_dataset_for_client(cid)]


@pytest.mark.parametrize(
    'data_file',
    [
        data_files.EMNIST,
        data_files.SHAKESPEARE,
        data_files.STACKOVERFLOW,
        data_files.STACKOVERFLOW_WORD_COUNT,
        data_files.STACKOVERFLOW_TAG_COUNT,
    ],
)
def test_missing_file_message(tmp_path, data_file):
  with pytest.raises(base.TaskError) as raised:
    data_files.find(data_file, str(tmp_path))
  message = str(raised.value)
  assert '\n' not in message
  assert repr(data_file.name) in message and str(tmp_path) in message
  assert data_file.url in message
  assert data_file.url.startswith(
      'https://storage.googleapis.com/tff-datasets-public/' + data_file.name
  )


def test_find_sqlite_and_counts_layouts(tmp_path):
  directory = str(tmp_path)
  sqlite_fixtures.write_shakespeare(directory, {'A': ['x']}, {'A': ['y']})
  assert data_files.find(data_files.SHAKESPEARE, directory) == os.path.join(
      directory, 'shakespeare.sqlite'
  )
  # SQLite files are only looked up where TFF's download puts them.
  os.makedirs(os.path.join(directory, 'datasets'))
  sqlite_fixtures.write_shakespeare(
      os.path.join(directory, 'datasets'), {'A': ['x']}, {'A': ['y']}
  )
  with pytest.raises(base.TaskError):
    data_files.find(data_files.EMNIST, directory)
  counts = os.path.join(directory, 'datasets')
  path = sqlite_fixtures.write_word_counts(counts, {'a': 2})
  assert data_files.find(data_files.STACKOVERFLOW_WORD_COUNT, directory) == path
  sqlite_fixtures.write_tag_counts(counts, {'t': 1}, archive=True)
  extracted = data_files.find(data_files.STACKOVERFLOW_TAG_COUNT, directory)
  assert extracted == os.path.join(counts, 'stackoverflow.tag_count')
  assert data_files.read_tag_counts(extracted) == {'t': 1}


def test_an_archive_is_extracted_whole_or_not_at_all(tmp_path, monkeypatch):
  directory = str(tmp_path)
  final = os.path.join(directory, 'stackoverflow.tag_count')
  archive = sqlite_fixtures.write_tag_counts(
      directory, {f'tag{i}': i for i in range(20_000)}, archive=True
  )
  with open(archive, 'rb') as f:
    whole = f.read()
  # A truncated archive: one error line naming it, and no file.
  with open(archive, 'wb') as f:
    f.write(whole[: len(whole) // 2])
  with pytest.raises(base.TaskError, match='cannot extract.*damaged'):
    data_files.find(data_files.STACKOVERFLOW_TAG_COUNT, directory)
  assert os.listdir(directory) == ['stackoverflow.tag_count.tar.bz2']
  # A disk that fills half way: no partial file taken as the data next time.
  with open(archive, 'wb') as f:
    f.write(whole)
  real_copy = data_files.shutil.copyfileobj

  def half_then_full(src, dst, length):
    del length
    dst.write(src.read(1000))
    raise OSError(28, 'No space left on device')

  monkeypatch.setattr(data_files.shutil, 'copyfileobj', half_then_full)
  with pytest.raises(base.TaskError, match='No space left'):
    data_files.find(data_files.STACKOVERFLOW_TAG_COUNT, directory)
  assert os.listdir(directory) == ['stackoverflow.tag_count.tar.bz2']
  monkeypatch.setattr(data_files.shutil, 'copyfileobj', real_copy)
  assert data_files.find(data_files.STACKOVERFLOW_TAG_COUNT, directory) == final
  assert len(data_files.read_tag_counts(final)) == 20_000


def test_default_data_dir_is_tff_cache():
  assert data_files.resolve_data_dir(None) == os.path.join(
      os.path.expanduser('~'), '.tff'
  )
  with pytest.raises(base.TaskError, match='data_dir'):
    data_files.resolve_data_dir('')


def test_read_counts_as_tff(tmp_path):
  path = sqlite_fixtures.write_word_counts(
      str(tmp_path), {'the': 9, 'a': 7, 'of': 7, 'zebra': 1}
  )
  assert list(data_files.read_word_counts(path)) == ['the', 'a', 'of', 'zebra']
  assert data_files.read_word_counts(path, vocab_size=2) == {'the': 9, 'a': 7}
  path = sqlite_fixtures.write_tag_counts(
      str(tmp_path), {'b': 1, 'a': 5, 'c': 5}
  )
  assert list(data_files.read_tag_counts(path).items()) == [
      ('a', 5),
      ('c', 5),
      ('b', 1),
  ]


def test_sql_example_counts_read_metadata(tmp_path):
  rows = {'train': {'u1': [b'1', b'2'], 'u2': [b'3']}, 'test': {'u1': [b'4']}}
  path = sqlite_fixtures.write_sqlite(str(tmp_path / 'x.sqlite'), rows)
  assert data_files.sql_example_counts(path, ['train']) == {'u1': 2, 'u2': 1}
  assert data_files.sql_example_counts(path, ['train', 'test']) == {
      'u1': 3,
      'u2': 1,
  }
  bogus = tmp_path / 'bogus.sqlite'
  bogus.write_bytes(b'not a database at all, just bytes' * 10)
  with pytest.raises(base.TaskError, match='not a TFF SQLite dataset'):
    data_files.sql_example_counts(str(bogus), ['train'])
  # Both tables, no client in a split: TFF's ClientData would raise
  # StopIteration; refused when opened, naming the file and the split.
  with pytest.raises(base.TaskError, match="no clients in its 'val' split"):
    data_files.sql_example_counts(path, ['train', 'val'])
  empty = sqlite_fixtures.write_sqlite(str(tmp_path / 'empty.sqlite'), {})
  with pytest.raises(base.TaskError, match=f'{empty} has no clients in its'):
    data_files.sql_example_counts(empty, ['train'])


def test_merge_splits_concatenates_train_then_test(tmp_path):
  rows = {'train': {'a': [b'0', b'1'], 'b': [b'2']}, 'test': {'a': [b'3']}}
  path = sqlite_fixtures.write_sqlite(str(tmp_path / 'm.sqlite'), rows)
  train = tff.simulation.datasets.SqlClientData(path, 'train')
  test = tff.simulation.datasets.SqlClientData(path, 'test')
  merged = data_files.merge_splits(train, test)
  assert merged.client_ids == ['a', 'b']
  assert [e.numpy() for e in merged.create_tf_dataset_for_client('a')] == [
      b'0',
      b'1',
      b'3',
  ]
  assert [e.numpy() for e in merged.create_tf_dataset_for_client('b')] == [b'2']


def test_select_clients_per_client_test_split():
  train = _client_data({'a': 5, 'b': 2, 'c': 7, 'd': 4})
  test = _client_data({'a': 1, 'c': 2, 'd': 1}, offset=100)
  tr, te = data_files.select_clients(
      train_data=train, test_data=test, seed=0, min_examples=3
  )
  assert tr.client_ids == ['a', 'c', 'd'] and te.client_ids == ['a', 'c', 'd']
  assert _values(te, 'c') == [100, 101]
  # Metadata counts replace iteration (and are trusted).
  tr, _ = data_files.select_clients(
      train_data=train,
      test_data=test,
      seed=0,
      min_examples=3,
      train_counts={'a': 5, 'b': 9, 'c': 7, 'd': 4},
  )
  assert tr.client_ids == ['a', 'b', 'c', 'd']
  subsets = [
      data_files.select_clients(
          train_data=train, test_data=test, seed=s, max_clients=2
      )[0].client_ids
      for s in (0, 0, 1, 2, 3)
  ]
  assert subsets[0] == subsets[1] and all(len(s) == 2 for s in subsets)
  assert len({tuple(s) for s in subsets}) > 1
  with pytest.raises(base.TaskError, match='no client has at least 8'):
    data_files.select_clients(
        train_data=train, test_data=test, seed=0, min_examples=8
    )
  with pytest.raises(base.TaskError, match='test split'):
    data_files.select_clients(
        train_data=_client_data({'b': 2}), test_data=test, seed=0
    )


def test_select_clients_unseen_test_clients():
  sizes = {f'c{i}': i + 1 for i in range(10)}
  train = _client_data(sizes)
  test = _client_data({cid: 2 for cid in sizes}, offset=100)
  tr, te = data_files.select_clients(
      train_data=train,
      test_data=test,
      seed=3,
      min_examples=4,
      test_clients_fraction=0.25,
  )
  # Merged counts are i + 3: clients c1..c9 are kept, 2 of 9 become test.
  assert len(tr.client_ids) == 7 and len(te.client_ids) == 2
  assert not set(tr.client_ids) & set(te.client_ids)
  assert sorted(tr.client_ids + te.client_ids) == [
      f'c{i}' for i in range(1, 10)
  ]
  cid = te.client_ids[0]
  assert _values(te, cid) == list(range(sizes[cid])) + [100, 101]
  again = data_files.select_clients(
      train_data=train,
      test_data=test,
      seed=3,
      min_examples=4,
      test_clients_fraction=0.25,
  )
  assert again[1].client_ids == te.client_ids
  # Synthetic data (train and test the same examples): never merged.
  tr, te = data_files.select_clients(
      train_data=train,
      test_data=train,
      seed=0,
      test_clients_fraction=0.5,
      max_clients=4,
      same_data=True,
  )
  assert len(tr.client_ids) == 2 and len(te.client_ids) == 2
  cid = te.client_ids[0]
  assert _values(te, cid) == list(range(sizes[cid]))


@pytest.mark.parametrize(
    'kwargs, match',
    [
        (dict(min_examples=-1), 'min_examples'),
        (dict(test_clients_fraction=1.0), 'test_clients_fraction'),
        (dict(test_clients_fraction=-0.1), 'test_clients_fraction'),
        (dict(max_clients=0), 'max_clients'),
        (dict(batch_size=0), 'batch size'),
    ],
)
def test_validate_selection_args(kwargs, match):
  args = dict(
      min_examples=0, test_clients_fraction=0.0, max_clients=None, batch_size=2
  )
  args.update(kwargs)
  with pytest.raises(base.TaskError, match=match):
    data_files.validate_selection_args(**args)


def test_tff_sqlite_client_data_reads_fixture(tmp_path):
  """The fixture is in the schema TFF's `SqlClientData` checks and reads."""
  example = sqlite_fixtures.emnist_example(np.zeros((28, 28)), 7)
  path = sqlite_fixtures.write_sqlite(
      str(tmp_path / 'e.sqlite'), {'all_train': {'w': [example] * 3}}
  )
  client_data = tff.simulation.datasets.SqlClientData(path, 'all_train')
  assert client_data.client_ids == ['w']
  (serialized,) = set(
      e.numpy() for e in client_data.create_tf_dataset_for_client('w')
  )
  parsed = tf.io.parse_single_example(
      serialized,
      {
          'label': tf.io.FixedLenFeature([], tf.int64),
          'pixels': tf.io.FixedLenFeature([28, 28], tf.float32),
      },
  )
  assert int(parsed['label']) == 7
