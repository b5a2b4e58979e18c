# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests of `tasks.leaf` on small LEAF-format folders written here."""

import collections
import contextlib
import copy
import csv
import glob
import json
import math
import os
import re
import signal
import shutil
import subprocess
import sys
import zlib

import numpy as np
import pytest
import tensorflow as tf

from tasks import base
from tasks import leaf
from tasks import leaf_cache
from tasks import registry
from tests import binary

# LEAF's vocabulary (models/utils/language_utils.py), spelled out again here.
LETTERS = (
    '\n !"&\'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]'
    'abcdefghijklmnopqrstuvwxyz}'
)
WORDS = ['Good', 'bad', 'day', 'sad', 'happy', 'lol', '!', "don't", 'the']


def leaf_file(users):
  """A LEAF file's content from `{user: (x, y)}`."""
  return {
      'users': list(users),
      'num_samples': [len(y) for _, y in users.values()],
      'user_data': {u: {'x': x, 'y': y} for u, (x, y) in users.items()},
      'hierarchies': [],
  }


def write_leaf(root, train_files, test_files):
  """Writes `{name: content}` (a dict as JSON, a str as is) per split."""
  for split, files in (('train', train_files), ('test', test_files)):
    os.makedirs(os.path.join(root, split), exist_ok=True)
    for name, content in files.items():
      with open(os.path.join(root, split, name), 'w') as f:
        f.write(content if isinstance(content, str) else json.dumps(content))
  return str(root)


def femnist_users(sizes, seed):
  rng = np.random.default_rng(seed)
  return {
      u: (
          rng.random((n, 784)).round(4).tolist(),
          rng.integers(0, 62, n).tolist(),
      )
      for u, n in sizes.items()
  }


def shakespeare_users(sizes, seed, length=80):
  rng = np.random.default_rng(seed)
  alphabet = list(LETTERS) + ['é', '~']  # Two characters LEAF lacks.
  users = {}
  for u, n in sizes.items():
    text = ''.join(rng.choice(alphabet, length + n))
    users[u] = (
        [text[i : i + length] for i in range(n)],
        [text[i + length] for i in range(n)],
    )
  return users


def sent140_users(sizes, seed):
  """Random Sent140 tweets for `{user: count}`: `{user: (rows, labels)}`."""
  rng = np.random.default_rng(seed)
  users = {}
  for u, n in sizes.items():
    x = [
        [
            str(i),
            'Mon Apr 06 22:19:45 PDT 2009',
            'NO_QUERY',
            u,
            ' '.join(rng.choice(WORDS, rng.integers(1, 30))),
        ]
        for i in range(n)
    ]
    users[u] = (x, rng.integers(0, 2, n).tolist())
  return users


TRAIN = {'f0': 5, 'f1': 3, 'f2': 7, 'f3': 2}
TEST = {'f0': 2, 'f1': 1, 'f2': 3, 'f3': 1}
IDS = sorted(TRAIN)


@pytest.fixture(scope='module')
def dirs(tmp_path_factory):
  """Valid FEMNIST (two train files), Shakespeare and Sent140 folders."""
  out = {}
  for name, make in (
      ('femnist', femnist_users),
      ('shakespeare', shakespeare_users),
      ('sent140', sent140_users),
  ):
    train, test = make(TRAIN, 0), make(TEST, 1)
    if name == 'femnist':
      train_files = {
          'all_data_0.json': leaf_file({u: train[u] for u in IDS[:2]}),
          'all_data_1.json': leaf_file({u: train[u] for u in IDS[2:]}),
      }
    else:
      train_files = {'all_data_0.json': leaf_file(train)}
    root = tmp_path_factory.mktemp(name)
    write_leaf(root, train_files, {'all_data_0.json': leaf_file(test)})
    out[name] = (str(root), train, test)
  return out


def _task(leaf_dir, **kwargs):
  kwargs.setdefault('batch_size', 3)
  return registry.create_task('leaf', leaf_dir=leaf_dir, **kwargs)


def _raw(client_data, cid):
  examples = list(client_data.create_tf_dataset_for_client(cid))
  return (
      np.stack([e['x'].numpy() for e in examples]),
      np.array([int(e['y']) for e in examples]),
  )


def _char_oracle(text):
  return [LETTERS.find(c) if c in LETTERS else 80 for c in text]


def test_femnist_examples_equal_the_json(dirs):
  leaf_dir, train, test = dirs['femnist']
  task = _task(leaf_dir)
  assert task.name == 'leaf' and 'LEAF femnist' in task.description
  assert task.train_data.client_ids == IDS == task.test_data.client_ids
  assert task.element_spec == collections.OrderedDict(
      x=tf.TensorSpec([784], tf.float32), y=tf.TensorSpec([], tf.int32)
  )
  for split, data in ((task.train_data, train), (task.test_data, test)):
    for cid in IDS:
      x, y = _raw(split, cid)
      np.testing.assert_array_equal(x, np.float32(data[cid][0]))
      assert y.tolist() == data[cid][1]
  x, y = next(iter(task.eval_dataset('f2')))
  assert x.shape == (3, 28, 28, 1) and x.dtype == tf.float32
  # Row-major: pixel (r, c) is x[28 r + c].
  assert x[0, 3, 5, 0] == np.float32(test['f2'][0][0][3 * 28 + 5])
  assert y.numpy().tolist() == test['f2'][1]


def test_shakespeare_characters_map_to_leaf_letters(dirs):
  leaf_dir, train, test = dirs['shakespeare']
  task = _task(leaf_dir, leaf_dataset='shakespeare', lstm_units=4)
  assert task.element_spec == collections.OrderedDict(
      x=tf.TensorSpec([80], tf.int32), y=tf.TensorSpec([], tf.int32)
  )
  for split, data in ((task.train_data, train), (task.test_data, test)):
    for cid in IDS:
      x, y = _raw(split, cid)
      assert x.tolist() == [_char_oracle(s) for s in data[cid][0]]
      assert y.tolist() == _char_oracle(''.join(data[cid][1]))
  ids = np.concatenate([_raw(task.train_data, c)[0].ravel() for c in IDS])
  assert 80 in ids and 0 in ids  # Out-of-vocabulary and '\n' both occur.
  assert leaf.ALL_LETTERS == LETTERS and len(LETTERS) == 80


def test_shakespeare_reads_other_window_lengths(tmp_path):
  leaf_dir = write_leaf(
      tmp_path,
      {'a.json': leaf_file(shakespeare_users({'r': 4}, 0, 12))},
      {'a.json': leaf_file(shakespeare_users({'r': 2}, 1, 12))},
  )
  task = _task(leaf_dir, lstm_units=4)
  assert task.element_spec['x'].shape == [12]
  assert 'windows of 12' in task.description
  x, _ = next(iter(task.train_dataset('r', 1)))
  assert x.shape == (3, 12)
  logits = task.model_fn()._keras_model(x)  # pylint: disable=protected-access
  assert logits.shape == (3, 81)


def _tokens(text):
  return re.findall(r"[\w']+|[.,!?;]", text.lower())[:25]


def test_sent140_vocabulary_from_training_tweets(dirs):
  leaf_dir, train, test = dirs['sent140']
  counts = collections.Counter(
      t for cid in IDS for r in train[cid][0] for t in _tokens(r[4])
  )
  ranked = sorted(counts, key=lambda w: (-counts[w], w))
  vocab = {w: i + 2 for i, w in enumerate(ranked[:5])}
  task = _task(leaf_dir, vocab_size=5, lstm_units=4)
  assert task.element_spec['x'] == tf.TensorSpec([25], tf.int32)
  assert 'vocabulary of 5 training tokens' in task.description
  for split, data in ((task.train_data, train), (task.test_data, test)):
    for cid in IDS:
      x, y = _raw(split, cid)
      expected = [
          [vocab.get(t, 1) for t in _tokens(r[4])] for r in data[cid][0]
      ]
      expected = [e + [0] * (25 - len(e)) for e in expected]
      assert x.tolist() == expected
      assert y.tolist() == data[cid][1]
  # Bag of words: counts of the 5 vocabulary words among the 25 tokens.
  bag = _task(leaf_dir, vocab_size=5, model='bag_log_reg')
  x, _ = next(iter(bag.eval_dataset('f0', split='train')))
  expected = [
      [_tokens(r[4]).count(w) for w in ranked[:5]] for r in train['f0'][0]
  ]
  np.testing.assert_array_equal(x.numpy(), np.float32(expected))


def test_vocabulary_ties_are_alphabetical_and_encoding_pads():
  vocab = leaf.build_vocabulary([['b', 'a', 'c', 'a', 'd'], ['c', 'b']], 2)
  assert vocab == {'a': 2, 'b': 3}  # a, b, c twice each; d once.
  ids = leaf.encode_tokens([['b', 'z'], []], vocab)
  assert ids.shape == (2, 25)
  assert ids[0, :3].tolist() == [3, 1, 0] and not ids[1].any()


def test_batches_stay_within_epochs_and_shuffle_is_seeded(dirs):
  task = _task(dirs['femnist'][0], model='linear')
  sizes = [len(y) for _, y in task.train_dataset('f0', epochs=2)]  # 5 each.
  assert sizes == [3, 2, 3, 2]

  def labels(seed):
    return [int(v) for _, y in task.train_dataset('f2', 2, seed) for v in y]

  first, again, other = labels(7), labels(7), labels(8)
  assert first == again and first != other
  stored = dirs['femnist'][1]['f2'][1]
  assert sorted(first[:7]) == sorted(stored) == sorted(first[7:])
  assert first[:7] != first[7:]  # Reshuffled each epoch.


def test_selection_filter_subset_and_unseen_test_users(dirs):
  leaf_dir, train, test = dirs['femnist']
  task = _task(leaf_dir, min_examples=3, model='linear')
  assert task.train_data.client_ids == ['f0', 'f1', 'f2']
  assert task.test_data.client_ids == ['f0', 'f1', 'f2']
  subset = _task(leaf_dir, max_clients=2, seed=4, model='linear')
  assert len(subset.train_data.client_ids) == 2
  assert subset.test_data.client_ids == subset.train_data.client_ids
  unseen = _task(leaf_dir, test_clients_fraction=0.5, seed=1, model='linear')
  train_ids = unseen.train_data.client_ids
  test_ids = unseen.test_data.client_ids
  assert len(train_ids) == len(test_ids) == 2
  assert sorted(train_ids + test_ids) == IDS
  for data in (unseen.train_data, unseen.test_data):
    for cid in data.client_ids:  # Each holds all its examples.
      _, y = _raw(data, cid)
      assert y.tolist() == train[cid][1] + test[cid][1]


def test_users_split_by_user_are_unseen_test_clients(tmp_path):
  leaf_dir = write_leaf(
      tmp_path,
      {'a.json': leaf_file(femnist_users({'a': 3, 'b': 4}, 0))},
      {'a.json': leaf_file(femnist_users({'c': 2}, 1))},
  )
  task = _task(leaf_dir, model='linear')
  assert task.train_data.client_ids == ['a', 'b']
  assert task.test_data.client_ids == ['c']
  assert '1 unseen test users (split by user)' in task.description
  with pytest.raises(base.TaskError, match='split by user'):
    _task(leaf_dir, test_clients_fraction=0.5)


@pytest.mark.parametrize(
    'dataset, model, units, params',
    [
        # Conv 5x5x1x32 + 32, 5x5x32x64 + 64, dense 3136x2048 + 2048,
        # 2048x62 + 62.
        ('femnist', 'cnn', None, 832 + 51264 + 6424576 + 127038),
        ('femnist', 'linear', None, 784 * 62),
        # Embedding 81x8, LSTM 4(256(8 + 256) + 256), 4(256(512) + 256),
        # 256x81+81.
        ('shakespeare', 'stacked_lstm', None, 648 + 271360 + 525312 + 20817),
        # Embedding (5 + 2)x100, two LSTM 4(100(200) + 100), 100x128+128,
        # 128x2+2.
        ('sent140', 'stacked_lstm', None, 700 + 2 * 80400 + 12928 + 258),
        ('sent140', 'stacked_lstm', 4, 28 + 2 * 144 + 4 * 128 + 128 + 258),
        ('sent140', 'bag_log_reg', None, 5 * 2 + 2),
    ],
)
def test_models_are_leafs_and_seeded(dirs, dataset, model, units, params):
  kwargs = {'vocab_size': 5} if dataset == 'sent140' else {}
  task = _task(dirs[dataset][0], model=model, lstm_units=units, **kwargs)
  variables = task.model_fn().trainable_variables
  assert sum(v.shape.num_elements() for v in variables) == params
  x, y = next(iter(task.train_dataset('f0', 1)))
  keras_model = task.model_fn()._keras_model  # pylint: disable=protected-access
  classes = {'femnist': 62, 'shakespeare': 81, 'sent140': 2}[dataset]
  assert keras_model(x).shape == (len(y), classes)
  again = _task(dirs[dataset][0], model=model, lstm_units=units, **kwargs)
  other = _task(
      dirs[dataset][0], model=model, lstm_units=units, seed=1, **kwargs
  )
  same = [v.numpy() for v in again.model_fn().trainable_variables]
  for v, w in zip(variables, same):
    np.testing.assert_array_equal(v.numpy(), w)
  if model not in ('bag_log_reg', 'linear'):  # Those start at zero.
    first = other.model_fn().trainable_variables[0].numpy()
    assert not np.array_equal(first, variables[0].numpy())


def _good():
  return leaf_file(femnist_users({'a': 3, 'b': 2}, 0))


def _good_test():
  return leaf_file(femnist_users({'a': 1, 'b': 1}, 1))


def _with(change):
  content = copy.deepcopy(_good())
  change(content)
  return content


def _set_x(user, x):
  return lambda c: c['user_data'][user].__setitem__('x', x)


def _set_y(user, y):
  return lambda c: c['user_data'][user].__setitem__('y', y)


SHORT_X = [[0.5] * 784, [0.5] * 783]
# (train file content, message); the test split is `_good_test()`.
BAD_TRAIN = [
    ('{"users": [', 'malformed JSON'),
    ('[1, 2]', 'holds a JSON object, got list'),
    (_with(lambda c: c.pop('num_samples')), "missing key 'num_samples'"),
    (_with(lambda c: c.pop('user_data')), "missing key 'user_data'"),
    (_with(lambda c: c.pop('users')), "missing key 'users'"),
    (
        _with(lambda c: c['num_samples'].__setitem__(0, 4)),
        "user 'a' has num_samples 4 but 3 examples",
    ),
    (_with(lambda c: c['num_samples'].pop()), '2 "users" but 1 "num_samples"'),
    (
        _with(lambda c: c['user_data']['a']['y'].pop()),
        "user 'a' has 3 x but 2 y",
    ),
    (
        _with(lambda c: c['user_data'].pop('b')),
        'user \'b\' has no "user_data" entry',
    ),
    (_with(lambda c: c['user_data']['b'].pop('y')), 'must hold "x" and "y"'),
    (
        _with(lambda c: c['user_data'].__setitem__('z', {'x': [], 'y': []})),
        'user \'z\', who is not in "users"',
    ),
    (_with(lambda c: c.update(users=['a', 'a'])), 'listed twice'),
    ('{"users": ' + '[' * 100_000 + ']' * 100_000 + '}', 'nested too deeply'),
    (
        _with(_set_x('b', [['0.5'] * 784] * 2)),
        "user 'b': femnist x must be numbers, got a str",
    ),
    (
        _with(_set_x('b', [[0.5] * 783 + [True]] * 2)),
        "user 'b': femnist x must be numbers, got a bool",
    ),
    (
        _with(_set_x('b', [[False] * 784] * 2)),
        "user 'b': femnist x must be numbers, got a bool",
    ),
    (_with(_set_x('b', SHORT_X)), 'femnist x must be lists of 784 numbers'),
    (_with(_set_x('b', [[0.5] * 784, [float('nan')] * 784])), 'non-finite'),
    (_with(_set_y('b', [1, 62])), 'y must be in [0, 62), got 1..62'),
    (_with(_set_y('b', [1, 1.5])), 'y must be integer class ids'),
    (
        _with(_set_x('a', [['1', 'd', 'q', 'u', 'hi']] * 3)),
        'holds sent140 examples, but leaf_dataset is femnist',
    ),
    (
        _with(lambda c: c['user_data']['a'].update(x=[[1.0] * 60] * 3)),
        'unknown LEAF layout',
    ),
    (
        _with(
            lambda c: c.update(
                users=['a', 'b', 'e'],
                num_samples=[3, 2, 0],
                user_data=dict(c['user_data'], e={'x': [], 'y': []}),
            )
        ),
        "user 'e' has no examples",
    ),
]


@pytest.mark.parametrize('content, message', BAD_TRAIN)
def test_malformed_train_file_is_one_line_naming_it(tmp_path, content, message):
  leaf_dir = write_leaf(
      tmp_path, {'bad.json': content}, {'t.json': _good_test()}
  )
  with pytest.raises(base.TaskError) as e:
    _task(leaf_dir, leaf_dataset='femnist')
  text = str(e.value)
  assert message in text and '\n' not in text
  assert os.path.join(leaf_dir, 'train', 'bad.json') in text
  assert sorted(os.listdir(leaf_dir)) == ['test', 'train']  # No empty cache.


def _layout_dir(tmp_path, train_files, test_files):
  return write_leaf(tmp_path, train_files, test_files)


@pytest.mark.parametrize(
    'case, message',
    [
        ('no_train', 'has no train/ folder'),
        ('no_test', 'has no test/ folder'),
        ('no_json', 'no .json files in'),
        ('empty', 'no users in'),
        ('two_files_one_user', "user 'a' is also in"),
        ('mixed_layouts', 'holds shakespeare examples, but'),
        ('test_only_user', "user 'c' of test/"),
        ('train_only_user', "user 'b' of train/"),
        ('window_lengths', 'must all have one length'),
        ('window_lengths_in_user', 'one non-zero length'),
        ('two_chars', 'y single characters'),
        (
            'lone_surrogate',
            "a.json: user 'a': shakespeare text holds a lone surrogate",
        ),
        ('sent140_label', 'y must be in [0, 2)'),
        ('femnist_lstm_units', 'lstm_units applies to the stacked_lstm'),
        ('model', "model 'cnn' does not apply to LEAF shakespeare"),
        ('min_examples', 'no client has at least 50 examples'),
    ],
)
def test_bad_folders(tmp_path, case, message):
  good = {'a.json': _good()}
  kwargs = {}
  shake = lambda sizes, seed, n=80: leaf_file(shakespeare_users(sizes, seed, n))
  if case == 'no_train':
    os.makedirs(tmp_path / 'test')
  elif case == 'no_test':
    write_leaf(tmp_path, good, {})
    os.rmdir(tmp_path / 'test')
  elif case == 'no_json':
    write_leaf(tmp_path, {'a.txt': 'x'}, good)
  elif case == 'empty':
    write_leaf(tmp_path, {'a.json': leaf_file({})}, good)
  elif case == 'two_files_one_user':
    write_leaf(tmp_path, {'a.json': _good(), 'b.json': _good()}, good)
  elif case == 'mixed_layouts':
    write_leaf(tmp_path, good, {'a.json': shake({'a': 1, 'b': 1}, 0)})
  elif case == 'test_only_user':
    write_leaf(
        tmp_path,
        good,
        {'a.json': leaf_file(femnist_users({'a': 1, 'b': 1, 'c': 1}, 1))},
    )
  elif case == 'train_only_user':
    write_leaf(
        tmp_path, good, {'a.json': leaf_file(femnist_users({'a': 1}, 1))}
    )
  elif case == 'window_lengths':
    write_leaf(
        tmp_path,
        {'a.json': shake({'a': 2}, 0)},
        {'a.json': shake({'a': 1}, 0, 79)},
    )
  elif case == 'window_lengths_in_user':
    content = shake({'a': 2}, 0)
    content['user_data']['a']['x'][1] = 'short'
    write_leaf(tmp_path, {'a.json': content}, {'a.json': shake({'a': 1}, 0)})
  elif case == 'two_chars':
    content = shake({'a': 2}, 0)
    content['user_data']['a']['y'][1] = 'ab'
    write_leaf(tmp_path, {'a.json': content}, {'a.json': shake({'a': 1}, 0)})
  elif case == 'lone_surrogate':
    content = shake({'a': 2}, 0)
    content['user_data']['a']['x'][1] = '\ud800' + 'x' * 79
    write_leaf(tmp_path, {'a.json': content}, {'a.json': shake({'a': 1}, 0)})
  elif case == 'sent140_label':
    content = leaf_file(sent140_users({'a': 2}, 0))
    content['user_data']['a']['y'][0] = 4  # Sentiment140's raw positive.
    write_leaf(
        tmp_path,
        {'a.json': content},
        {'a.json': leaf_file(sent140_users({'a': 1}, 1))},
    )
  elif case == 'femnist_lstm_units':
    write_leaf(tmp_path, good, {'a.json': _good_test()})
    kwargs = {'lstm_units': 8}
  elif case == 'model':
    write_leaf(
        tmp_path, {'a.json': shake({'a': 2}, 0)}, {'a.json': shake({'a': 1}, 0)}
    )
    kwargs = {'model': 'cnn'}
  elif case == 'min_examples':
    write_leaf(tmp_path, good, {'a.json': _good_test()})
    kwargs = {'min_examples': 50}
  with pytest.raises(base.TaskError) as e:
    _task(str(tmp_path), **kwargs)
  assert message in str(e.value) and '\n' not in str(e.value)


def test_bad_arguments():
  for kwargs, message in (
      ({'leaf_dir': '/nonexistent/leaf'}, 'does not exist'),
      ({'leaf_dir': ''}, 'non-empty path'),
      ({'leaf_dir': '/', 'leaf_dataset': 'celeba'}, 'unknown LEAF dataset'),
      ({'leaf_dir': '/', 'model': 'resnet'}, "unknown LEAF model 'resnet'"),
      ({'leaf_dir': '/', 'lstm_units': 0}, 'lstm_units must be >= 1'),
      ({'leaf_dir': '/', 'max_clients': 0}, 'max_clients must be >= 1'),
  ):
    with pytest.raises(base.TaskError, match=re.escape(message)):
      registry.create_task('leaf', batch_size=2, **kwargs)


def _metrics(out_dir, name):
  with open(os.path.join(out_dir, name, 'metrics.csv')) as f:
    rows = list(csv.DictReader(f))
  return rows


SMALL = [
    '--clients_per_round=2',
    '--client_batch_size=3',
    '--total_rounds=2',
    '--rounds_per_eval=1',
    '--progress=false',
    '--seed=1',
]


@pytest.mark.parametrize(
    'dataset, extra',
    [
        ('femnist', ['--leaf_dataset=femnist']),
        ('shakespeare', ['--leaf_lstm_units=8', '--simulation_engine=stacked']),
        ('sent140', ['--leaf_lstm_units=8', '--leaf_vocab_size=6']),
    ],
)
def test_two_rounds_through_the_binary(dirs, tmp_path, dataset, extra):
  code, _, stderr = binary.run_train(
      SMALL
      + [
          '--task=leaf',
          f'--leaf_dir={dirs[dataset][0]}',
          f'--experiment_name={dataset}',
      ]
      + extra,
      tmp_path,
  )
  assert code == 0, stderr
  rows = _metrics(tmp_path, dataset)
  assert [int(r['round_num']) for r in rows] == [1, 2]
  losses = [
      float(rows[-1][k])
      for k in rows[-1]
      if k.endswith('train/loss') or k == 'eval/test/loss/mean'
  ]
  assert losses and all(math.isfinite(v) and v > 0 for v in losses), rows[-1]
  assert f'task: LEAF {dataset}' in stderr


_LOOP = """
import contextlib, io, json, sys
from absl import flags
from run import train
out = []
for args in json.loads(sys.argv[1]):
  flags.FLAGS.unparse_flags()
  flags.FLAGS(['train'] + args)
  err = io.StringIO()
  try:
    with contextlib.redirect_stderr(err):
      code = train.main(['train'])
  except Exception as e:  # A case that got past validation.
    code = repr(e)
  out.append([code, err.getvalue()])
print(json.dumps(out))
"""


def test_bad_input_through_the_binary_one_line_exit_2(dirs, tmp_path):
  bad = write_leaf(
      tmp_path / 'bad',
      {'all_data_0.json': '{"users": ['},
      {'all_data_0.json': _good_test()},
  )
  deep = write_leaf(
      tmp_path / 'deep',
      {'all_data_0.json': '[' * 100_000 + ']' * 100_000},
      {'all_data_0.json': _good_test()},
  )
  femnist = dirs['femnist'][0]
  cases = [
      (
          ['--task=leaf', f'--leaf_dir={deep}'],
          f'{deep}/train/all_data_0.json: malformed JSON (nested too deeply',
      ),
      (['--task=leaf'], 'pass --leaf_dir'),
      (['--task=leaf', '--leaf_dir=/nonexistent/leaf'], 'does not exist'),
      (
          ['--task=leaf', f'--leaf_dir={bad}'],
          f'{bad}/train/all_data_0.json: malformed JSON',
      ),
      (
          ['--task=leaf', f'--leaf_dir={femnist}', '--leaf_dataset=reddit'],
          "unknown --leaf_dataset='reddit'; choose one of: femnist, sent140",
      ),
      (
          ['--task=leaf', f'--leaf_dir={femnist}', '--leaf_vocab_size=9'],
          'vocab_size applies to sent140, not femnist',
      ),
      (
          ['--task=leaf', f'--leaf_dir={femnist}', '--data_dir=/tmp'],
          '--data_dir applies to --task=emnist_character, '
          'shakespeare_character, stackoverflow_word, stackoverflow_tag, '
          'shakespeare_leaf, not --task=leaf',
      ),
      (
          ['--task=synthetic', f'--leaf_dir={femnist}'],
          '--leaf_dir applies to --task=leaf, not --task=synthetic',
      ),
  ]
  with subprocess.Popen(
      [
          sys.executable,
          '-c',
          _LOOP,
          json.dumps(
              [SMALL + [f'--root_output_dir={tmp_path}'] + a for a, _ in cases]
          ),
      ],
      cwd=binary.ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,
  ) as proc:
    try:
      stdout, stderr = proc.communicate(timeout=300)
    finally:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
  assert proc.returncode == 0, stderr
  results = json.loads(stdout.splitlines()[-1])
  for (args, message), (code, err) in zip(cases, results):
    lines = binary.error_lines(err)
    assert code == 2, (args, err)
    assert len(lines) == 1 and lines[0].startswith('train: error: '), err
    assert message in lines[0], (args, err)


# ---------------------------------------------------------------------------
# The cache (tasks/leaf_cache.py): same data, invalidated, never trusted
# damaged, read per requested client.

SIZES = {'u0': 5, 'u1': 3, 'u2': 7, 'u3': 2, 'u4': 4, 'u5': 6}
TEST_SIZES = {u: 1 + n % 3 for u, n in SIZES.items()}
MAKERS = {
    'femnist': femnist_users,
    'shakespeare': shakespeare_users,
    'sent140': sent140_users,
}
PROTOCOLS = [
    {},
    {'max_clients': 4, 'seed': 3},
    {'test_clients_fraction': 0.5, 'seed': 1, 'min_examples': 3},
]


def _cache_write(root, dataset):
  train, test = MAKERS[dataset](SIZES, 0), MAKERS[dataset](TEST_SIZES, 1)
  ids = sorted(SIZES)
  return write_leaf(
      root,
      {  # Two train files: users of both are read in order.
          f'all_data_{i}.json': leaf_file({u: train[u] for u in part})
          for i, part in enumerate((ids[:3], ids[3:]))
      },
      {'all_data_0.json': leaf_file(test)},
  )


def _cache_task(leaf_dir, dataset, **kwargs):
  """`leaf.create_task` with small LSTMs and vocabulary."""
  if dataset != 'femnist':
    kwargs['lstm_units'] = 4
  if dataset == 'sent140':
    kwargs['vocab_size'] = 6
  return leaf.create_task(leaf_dir=leaf_dir, batch_size=3, **kwargs)


def _cache_contents(task):
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


def _cache_oracle(leaf_dir, dataset, task):
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


def _assert_same_arrays(first, second):
  assert list(first) == list(second)
  for key in first:
    for a, b in zip(first[key], second[key]):
      assert a.dtype == b.dtype and a.shape == b.shape, key
      np.testing.assert_array_equal(a, b, err_msg=str(key))


def _cache_entries(leaf_dir, split='train'):
  return sorted(
      glob.glob(os.path.join(leaf_dir, leaf_cache.CACHE_FOLDER, f'{split}-*'))
  )


@pytest.mark.parametrize('dataset', sorted(MAKERS))
def test_cold_warm_and_in_memory_equal_the_json(tmp_path, dataset, monkeypatch):
  leaf_dir = _cache_write(tmp_path / 'data', dataset)
  for kwargs in PROTOCOLS:
    shutil.rmtree(
        os.path.join(leaf_dir, leaf_cache.CACHE_FOLDER), ignore_errors=True
    )
    cold = _cache_task(leaf_dir, dataset, **kwargs)
    assert len(_cache_entries(leaf_dir)) == 1
    assert len(_cache_entries(leaf_dir, 'test')) == 1
    warm = _cache_task(leaf_dir, dataset, **kwargs)
    expected = _cache_oracle(leaf_dir, dataset, cold)
    _assert_same_arrays(_cache_contents(cold), expected)
    _assert_same_arrays(_cache_contents(warm), expected)
    assert cold.description == warm.description
    assert cold.element_spec == warm.element_spec
  monkeypatch.setattr(leaf_cache, '_writable_root', lambda _: (None, False))
  shutil.rmtree(os.path.join(leaf_dir, leaf_cache.CACHE_FOLDER))
  memory = _cache_task(leaf_dir, dataset, **PROTOCOLS[2])
  assert not os.path.exists(os.path.join(leaf_dir, leaf_cache.CACHE_FOLDER))
  expected = _cache_oracle(leaf_dir, dataset, memory)
  _assert_same_arrays(_cache_contents(memory), expected)


def test_a_changed_json_rebuilds_the_cache(tmp_path):
  leaf_dir = _cache_write(tmp_path, 'femnist')
  before = _cache_contents(_cache_task(leaf_dir, 'femnist'))
  (old_entry,) = _cache_entries(leaf_dir)
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
  after = _cache_contents(_cache_task(leaf_dir, 'femnist'))
  assert after['train', 'u0'][1].tolist() == labels
  assert before['train', 'u0'][1][0] != labels[0]
  (new_entry,) = _cache_entries(leaf_dir)  # The stale entry is deleted.
  assert new_entry != old_entry
  with open(path, 'a') as f:  # In place: a new size.
    f.write(' ')
  _cache_task(leaf_dir, 'femnist')
  assert _cache_entries(leaf_dir) not in ([old_entry], [new_entry])
  os.remove(os.path.join(leaf_dir, 'train', 'all_data_1.json'))
  with pytest.raises(base.TaskError, match="user 'u3' of test/"):
    _cache_task(leaf_dir, 'femnist')  # Its users are gone from train/.


def _entry_files(entry):
  """Each file of the entry folder: its bytes."""
  files = {}
  for name in sorted(os.listdir(entry)):
    with open(os.path.join(entry, name), 'rb') as f:
      files[name] = f.read()
  return files


def _edit_x(entry):
  """A plausible same-size edit: one character id becomes another one."""
  x = np.fromfile(os.path.join(entry, 'x.bin'), np.uint8)
  x[0] = x[np.flatnonzero(x != x[0])[0]]
  x.tofile(os.path.join(entry, 'x.bin'))
  return 'x.bin does not match its checksum'


def _random_x(entry):
  path = os.path.join(entry, 'x.bin')
  size = os.path.getsize(path)
  np.random.default_rng(0).integers(0, 256, size, np.uint8).tofile(path)
  return 'x.bin does not match its checksum'


def _truncate(name):
  def damage(entry):
    path = os.path.join(entry, name)
    size = os.path.getsize(path)
    os.truncate(path, size - 4)
    return f'{name} has {size - 4} bytes, its index says {size}'

  return damage


def _garbage_index(entry):
  with open(os.path.join(entry, 'index.json'), 'w') as f:
    f.write('{"format": 2, "key": ')
  return 'index.json does not parse'


def _remove(name):
  def damage(entry):  # `index.json`: as a build killed before its index.
    os.remove(os.path.join(entry, name))
    return f'{name} is missing'

  return damage


def _wrong_tokens(entry):
  with open(os.path.join(entry, 'tokens.json'), 'w') as f:
    json.dump(['a'], f)
  return 'tokens.json does not match its checksum'


def _old_format(entry):
  """The index as format 1 wrote it: no checksums."""
  path = os.path.join(entry, 'index.json')
  with open(path) as f:
    index = json.load(f)
  del index['crc32']
  index['format'] = 1
  with open(path, 'w') as f:
    json.dump(index, f)
  return (
      'index.json is of format 1, without checksums (this version writes '
      'format 2)'
  )


DAMAGES = {
    'edit_x': ('shakespeare', _edit_x),
    'random_x': ('shakespeare', _random_x),
    'truncate_x': ('sent140', _truncate('x.bin')),
    'truncate_y': ('shakespeare', _truncate('y.bin')),
    'garbage_index': ('sent140', _garbage_index),
    'no_index': ('sent140', _remove('index.json')),
    'no_x': ('femnist', _remove('x.bin')),
    'no_tokens': ('sent140', _remove('tokens.json')),
    'tokens': ('sent140', _wrong_tokens),
    'old_format': ('shakespeare', _old_format),
}


def test_an_in_place_edit_of_the_same_size_rebuilds_the_cache(tmp_path):
  """Same file (inode), same size: only the modification time tells."""
  leaf_dir = _cache_write(tmp_path, 'femnist')
  before = _cache_contents(_cache_task(leaf_dir, 'femnist'))
  (old_entry,) = _cache_entries(leaf_dir)
  path = os.path.join(leaf_dir, 'train', 'all_data_0.json')
  stat = os.stat(path)
  with open(path, 'r+b') as f:
    content = f.read()
    labels = json.loads(content)['user_data']['u0']['y']
    at = content.index(b'"y": [', content.index(b'"u0": {"x"')) + 6
    old = str(labels[0]).encode()
    new = str(labels[0] // 10 * 10 + (labels[0] % 10 + 1) % 2).encode()
    assert content[at : at + len(old)] == old and len(new) == len(old)
    f.seek(at)
    f.write(new)
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
  after_stat = os.stat(path)
  assert (after_stat.st_ino, after_stat.st_size) == (stat.st_ino, stat.st_size)
  after = _cache_contents(_cache_task(leaf_dir, 'femnist'))
  assert before['train', 'u0'][1][0] == labels[0]
  assert after['train', 'u0'][1].tolist() == [int(new)] + labels[1:]
  assert _cache_entries(leaf_dir) != [old_entry]


@pytest.mark.parametrize('damage', sorted(DAMAGES))
def test_a_damaged_entry_is_rebuilt_with_one_warning(tmp_path, capsys, damage):
  dataset, make_damage = DAMAGES[damage]
  leaf_dir = _cache_write(tmp_path, dataset)
  expected = _cache_contents(_cache_task(leaf_dir, dataset))
  (entry,) = _cache_entries(leaf_dir)
  fresh = _entry_files(entry)
  reason = make_damage(entry)
  capsys.readouterr()
  rebuilt = _cache_task(leaf_dir, dataset)
  err = capsys.readouterr().err
  _assert_same_arrays(_cache_contents(rebuilt), expected)
  assert _cache_entries(leaf_dir) == [entry]
  assert _entry_files(entry) == fresh  # Byte for byte a fresh build.
  warnings = [l for l in err.splitlines() if 'leaf cache' in l]
  assert warnings == [f'leaf cache: rebuilding {entry}: {reason}']
  _cache_task(leaf_dir, dataset)  # The rebuilt entry is trusted, silently.
  assert 'leaf cache' not in capsys.readouterr().err


def test_a_killed_build_leaves_nothing_trusted(tmp_path, monkeypatch):
  leaf_dir = _cache_write(tmp_path, 'shakespeare')
  real = leaf_cache._build_in  # pylint: disable=protected-access

  def killed(folder, key, read):
    real(folder, key, read)
    raise KeyboardInterrupt  # After writing everything, before the rename.

  monkeypatch.setattr(leaf_cache, '_build_in', killed)
  with pytest.raises(KeyboardInterrupt):
    _cache_task(leaf_dir, 'shakespeare')
  root = os.path.join(leaf_dir, leaf_cache.CACHE_FOLDER)
  assert not os.path.exists(root)  # The folder the build made is gone too.
  monkeypatch.undo()
  dead = os.path.join(root, '.tmp-train-999999999-x')  # A killed process's.
  os.makedirs(dead)
  _cache_task(leaf_dir, 'shakespeare')
  assert not os.path.exists(dead) and len(_cache_entries(leaf_dir)) == 1


def test_only_the_requested_users_are_read(tmp_path, monkeypatch):
  loads = collections.Counter()
  real = leaf_cache.SplitData.arrays

  def counted(self, user):
    loads[user] += 1
    return real(self, user)

  monkeypatch.setattr(leaf_cache.SplitData, 'arrays', counted)
  for dataset in ('shakespeare', 'femnist'):
    leaf_dir = _cache_write(tmp_path / dataset, dataset)
    _cache_task(leaf_dir, dataset)  # Cold: builds the cache.
    loads.clear()
    task = _cache_task(leaf_dir, dataset, test_clients_fraction=0.5, seed=1)
    # TFF reads the first client of each side for the element type.
    firsts = [task.train_data.client_ids[0], task.test_data.client_ids[0]]
    assert loads == {u: 2 for u in firsts}  # Train and test parts.
    loads.clear()
    cid = task.train_data.client_ids[-1]
    task.train_dataset(cid, 1)
    assert loads == {cid: 2}
  leaf_dir = _cache_write(tmp_path / 'sent140', 'sent140')
  _cache_task(leaf_dir, 'sent140')
  loads.clear()
  task = _cache_task(leaf_dir, 'sent140', max_clients=2, seed=5)
  chosen = task.train_data.client_ids
  # The vocabulary's tokens, and the first client of each side.
  assert loads == {chosen[0]: 3, chosen[1]: 1}


def test_an_unwritable_folder_caches_in_the_user_cache(tmp_path, monkeypatch):
  leaf_dir = _cache_write(tmp_path / 'data', 'femnist')
  with open(os.path.join(leaf_dir, leaf_cache.CACHE_FOLDER), 'w') as f:
    f.write('not a folder')
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'home'))
  task = _cache_task(leaf_dir, 'femnist')
  root = leaf_cache._user_cache_root(  # pylint: disable=protected-access
      leaf_dir
  )
  assert root.startswith(str(tmp_path / 'home'))
  assert sorted(n.split('-')[0] for n in os.listdir(root)) == ['test', 'train']
  expected = _cache_oracle(leaf_dir, 'femnist', task)
  _assert_same_arrays(_cache_contents(task), expected)


def test_a_cached_layout_error_names_the_folder_as_spelled(
    tmp_path, monkeypatch
):
  leaf_dir = _cache_write(tmp_path / 'data', 'shakespeare')
  _cache_task(leaf_dir, 'shakespeare')  # Builds the cache.
  monkeypatch.chdir(tmp_path)
  with pytest.raises(base.TaskError) as e:
    leaf.create_task(leaf_dir='data', leaf_dataset='femnist', batch_size=3)
  assert str(e.value) == (
      f'{os.path.join("data", "train", "all_data_0.json")}: holds shakespeare '
      'examples, but leaf_dataset is femnist'
  )


def test_the_checksum_covers_every_chunk_of_a_big_file(tmp_path):
  """A file of 2.5 read chunks: every chunk counts, the first and the last."""
  # pylint: disable=protected-access
  chunk, check = leaf_cache._CHUNK, leaf_cache._check_file
  # pylint: enable=protected-access
  rng = np.random.default_rng(0)
  data = rng.integers(0, 256, size=chunk * 5 // 2, dtype=np.uint8).tobytes()
  path = tmp_path / 'x.bin'
  path.write_bytes(data)
  crc = leaf_cache.crc32_of(str(path))
  assert crc == zlib.crc32(data)
  check(str(tmp_path), 'x.bin', len(data), crc)
  for offset in (10, chunk + 10):
    damaged = bytearray(data)
    damaged[offset] ^= 0xFF  # Same size, one byte off in an early chunk.
    path.write_bytes(bytes(damaged))
    with pytest.raises(leaf_cache.DamagedEntry, match='does not match'):
      check(str(tmp_path), 'x.bin', len(data), crc)
