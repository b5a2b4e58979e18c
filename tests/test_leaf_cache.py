# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests of the LEAF cache (`tasks.leaf_cache`) through `tasks.leaf`."""

import collections
import glob
import json
import os
import shutil

import numpy as np
import pytest

from tasks import base
from tasks import leaf
from tasks import leaf_cache
from tests import test_leaf

SIZES = {'u0': 5, 'u1': 3, 'u2': 7, 'u3': 2, 'u4': 4, 'u5': 6}
TEST_SIZES = {u: 1 + n % 3 for u, n in SIZES.items()}
MAKERS = {
    'femnist': test_leaf.femnist_users,
    'shakespeare': test_leaf.shakespeare_users,
    'sent140': test_leaf.sent140_users,
}
PROTOCOLS = [
    {},
    {'max_clients': 4, 'seed': 3},
    {'test_clients_fraction': 0.5, 'seed': 1, 'min_examples': 3},
]


def _write(root, dataset):
  train, test = MAKERS[dataset](SIZES, 0), MAKERS[dataset](TEST_SIZES, 1)
  ids = sorted(SIZES)
  return test_leaf.write_leaf(
      root,
      {  # Two train files: users of both are read in order.
          f'all_data_{i}.json': test_leaf.leaf_file(
              {u: train[u] for u in part}
          )
          for i, part in enumerate((ids[:3], ids[3:]))
      },
      {'all_data_0.json': test_leaf.leaf_file(test)},
  )


def _task(leaf_dir, dataset, **kwargs):
  if dataset != 'femnist':
    kwargs['lstm_units'] = 4
  if dataset == 'sent140':
    kwargs['vocab_size'] = 6
  return leaf.create_task(leaf_dir=leaf_dir, batch_size=3, **kwargs)


def _contents(task):
  """Every client's raw arrays, per split, in client order."""
  out = {}
  for name, data in (('train', task.train_data), ('test', task.test_data)):
    for cid in data.client_ids:
      examples = list(data.create_tf_dataset_for_client(cid))
      out[name, cid] = (
          np.stack([e['x'].numpy() for e in examples]),
          np.array([e['y'].numpy() for e in examples]),
      )
  return out


def _oracle(leaf_dir, dataset, task):
  """The arrays the JSON gives without any cache (the pre-cache algorithm)."""
  raw = {}
  for split in ('train', 'test'):
    for path in sorted(glob.glob(os.path.join(leaf_dir, split, '*.json'))):
      with open(path) as f:
        content = json.load(f)
      for user in content['users']:
        entry = content['user_data'][user]
        convert = leaf._CONVERTERS[dataset]  # pylint: disable=protected-access
        raw[split, user] = convert(entry['x'], entry['y'], path, user)
  merged = set(task.train_data.client_ids) & set(task.test_data.client_ids)
  merged = not merged  # Unseen test clients: each holds both splits.

  def client(split, cid):
    splits = ('train', 'test') if merged else (split,)
    parts = [raw[s, cid] for s in splits]
    x = [r for p in parts for r in p.x] if dataset == 'sent140' else None
    if x is None:
      x = np.concatenate([p.x for p in parts])
    if dataset == 'shakespeare':  # Ids as `char_ids` gives them, int32.
      x = x.astype(leaf.char_ids('').dtype)
    return x, np.concatenate([p.y for p in parts])

  out = {
      (split, cid): client(split, cid)
      for split, data in (('train', task.train_data), ('test', task.test_data))
      for cid in data.client_ids
  }
  if dataset == 'sent140':
    vocabulary = leaf.build_vocabulary(
        [t for (s, _), (x, _) in out.items() if s == 'train' for t in x], 6
    )
    out = {
        k: (leaf.encode_tokens(x, vocabulary), y) for k, (x, y) in out.items()
    }
  return out


def _assert_same(first, second):
  assert list(first) == list(second)
  for key in first:
    for a, b in zip(first[key], second[key]):
      assert a.dtype == b.dtype and a.shape == b.shape, key
      np.testing.assert_array_equal(a, b, err_msg=str(key))


def _entries(leaf_dir, split='train'):
  return sorted(
      glob.glob(os.path.join(leaf_dir, leaf_cache.CACHE_FOLDER, f'{split}-*'))
  )


@pytest.mark.parametrize('dataset', sorted(MAKERS))
def test_cold_warm_and_in_memory_equal_the_json(tmp_path, dataset, monkeypatch):
  leaf_dir = _write(tmp_path / 'data', dataset)
  for kwargs in PROTOCOLS:
    shutil.rmtree(
        os.path.join(leaf_dir, leaf_cache.CACHE_FOLDER), ignore_errors=True
    )
    cold = _task(leaf_dir, dataset, **kwargs)
    assert len(_entries(leaf_dir)) == len(_entries(leaf_dir, 'test')) == 1
    warm = _task(leaf_dir, dataset, **kwargs)
    expected = _oracle(leaf_dir, dataset, cold)
    _assert_same(_contents(cold), expected)
    _assert_same(_contents(warm), expected)
    assert cold.description == warm.description
    assert cold.element_spec == warm.element_spec
  monkeypatch.setattr(leaf_cache, '_writable_root', lambda _: None)
  shutil.rmtree(os.path.join(leaf_dir, leaf_cache.CACHE_FOLDER))
  memory = _task(leaf_dir, dataset, **PROTOCOLS[2])
  assert not os.path.exists(os.path.join(leaf_dir, leaf_cache.CACHE_FOLDER))
  _assert_same(_contents(memory), _oracle(leaf_dir, dataset, memory))


def test_a_changed_json_rebuilds_the_cache(tmp_path):
  leaf_dir = _write(tmp_path, 'femnist')
  before = _contents(_task(leaf_dir, 'femnist'))
  (old_entry,) = _entries(leaf_dir)
  path = os.path.join(leaf_dir, 'train', 'all_data_0.json')
  with open(path) as f:
    content = json.load(f)
  labels = content['user_data']['u0']['y']
  labels[0] = (labels[0] + 1) % 62  # Same size, same mtime: only the inode
  stat = os.stat(path)  # (a new file) and the content change.
  with open(path + '.new', 'w') as f:
    json.dump(content, f)
  os.replace(path + '.new', path)
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  after = _contents(_task(leaf_dir, 'femnist'))
  assert after['train', 'u0'][1].tolist() == labels
  assert before['train', 'u0'][1][0] != labels[0]
  (new_entry,) = _entries(leaf_dir)  # The stale entry is deleted.
  assert new_entry != old_entry
  with open(path, 'a') as f:  # In place: a new size.
    f.write(' ')
  _task(leaf_dir, 'femnist')
  assert _entries(leaf_dir) not in ([old_entry], [new_entry])
  os.remove(os.path.join(leaf_dir, 'train', 'all_data_1.json'))
  with pytest.raises(base.TaskError, match="user 'u3' of test/"):
    _task(leaf_dir, 'femnist')  # Its users are gone from train/.


@pytest.mark.parametrize(
    'damage', ['truncate_x', 'truncate_y', 'bad_index', 'no_index', 'tokens']
)
def test_a_damaged_entry_is_rebuilt_not_trusted(tmp_path, damage):
  leaf_dir = _write(tmp_path, 'sent140')
  expected = _contents(_task(leaf_dir, 'sent140'))
  (entry,) = _entries(leaf_dir)
  if damage in ('truncate_x', 'truncate_y'):
    name = 'x.bin' if damage == 'truncate_x' else 'y.bin'
    with open(os.path.join(entry, name), 'r+b') as f:
      f.truncate(os.path.getsize(f.name) - 4)
  elif damage == 'bad_index':
    with open(os.path.join(entry, 'index.json'), 'w') as f:
      f.write('{"format": 1, "key": ')
  elif damage == 'no_index':  # As a build killed before its index.
    os.remove(os.path.join(entry, 'index.json'))
  else:
    with open(os.path.join(entry, 'tokens.json'), 'w') as f:
      json.dump(['a'], f)
  _assert_same(_contents(_task(leaf_dir, 'sent140')), expected)
  key = os.path.basename(entry).split('-', 1)[1]
  assert leaf_cache._load_entry(entry, key)  # pylint: disable=protected-access


def test_a_killed_build_leaves_nothing_trusted(tmp_path, monkeypatch):
  leaf_dir = _write(tmp_path, 'shakespeare')
  real = leaf_cache._build_in  # pylint: disable=protected-access

  def killed(folder, key, read):
    real(folder, key, read)
    raise KeyboardInterrupt  # After writing everything, before the rename.

  monkeypatch.setattr(leaf_cache, '_build_in', killed)
  with pytest.raises(KeyboardInterrupt):
    _task(leaf_dir, 'shakespeare')
  root = os.path.join(leaf_dir, leaf_cache.CACHE_FOLDER)
  assert os.listdir(root) == []
  monkeypatch.undo()
  dead = os.path.join(root, '.tmp-train-999999999-x')  # A killed process's.
  os.makedirs(dead)
  _task(leaf_dir, 'shakespeare')
  assert not os.path.exists(dead) and len(_entries(leaf_dir)) == 1


def test_only_the_requested_users_are_read(tmp_path, monkeypatch):
  loads = collections.Counter()
  real = leaf_cache.SplitData.arrays

  def counted(self, user):
    loads[user] += 1
    return real(self, user)

  monkeypatch.setattr(leaf_cache.SplitData, 'arrays', counted)
  for dataset in ('shakespeare', 'femnist'):
    leaf_dir = _write(tmp_path / dataset, dataset)
    _task(leaf_dir, dataset)  # Cold: builds the cache.
    loads.clear()
    task = _task(leaf_dir, dataset, test_clients_fraction=0.5, seed=1)
    # TFF reads the first client of each side for the element type.
    firsts = [task.train_data.client_ids[0], task.test_data.client_ids[0]]
    assert loads == {u: 2 for u in firsts}  # Train and test parts.
    loads.clear()
    cid = task.train_data.client_ids[-1]
    task.train_dataset(cid, 1)
    assert loads == {cid: 2}
  leaf_dir = _write(tmp_path / 'sent140', 'sent140')
  _task(leaf_dir, 'sent140')
  loads.clear()
  task = _task(leaf_dir, 'sent140', max_clients=2, seed=5)
  chosen = task.train_data.client_ids
  # The vocabulary's tokens, and the first client of each side.
  assert loads == {chosen[0]: 3, chosen[1]: 1}


def test_an_unwritable_folder_caches_in_the_user_cache(tmp_path, monkeypatch):
  leaf_dir = _write(tmp_path / 'data', 'femnist')
  with open(os.path.join(leaf_dir, leaf_cache.CACHE_FOLDER), 'w') as f:
    f.write('not a folder')
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'home'))
  task = _task(leaf_dir, 'femnist')
  root = leaf_cache._user_cache_root(  # pylint: disable=protected-access
      leaf_dir
  )
  assert root.startswith(str(tmp_path / 'home'))
  assert sorted(n.split('-')[0] for n in os.listdir(root)) == ['test', 'train']
  _assert_same(_contents(task), _oracle(leaf_dir, 'femnist', task))
