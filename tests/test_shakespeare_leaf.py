"""The seeds' Shakespeare presets: windows, selection, training, engines."""

import os
import string

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base
from tasks import registry
from tasks import shakespeare_leaf
from tff_algos import batched
from tff_algos import composition
from tff_algos import delta_fl
from tff_algos import fed_prox
from tff_algos import q_ffl
from tff_algos import stacked
from tests import binary
from tests import engine_runs
from tests import sqlite_fixtures

LEAF_80 = (
    '\n !"&\'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]'
    'abcdefghijklmnopqrstuvwxyz}'
)


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  """Roles of 0.3k-1k characters (12 of them) plus 3 tiny ones."""
  rng = np.random.default_rng(5)
  train, test = {}, {}
  for k in range(12):
    snippets = sqlite_fixtures.role_snippets(rng, int(rng.integers(4, 9)), 20)
    cut = max(1, len(snippets) * 4 // 5)
    train[f'PLAY_ROLE{k:02d}'] = snippets[:cut]
    test[f'PLAY_ROLE{k:02d}'] = snippets[cut:]
  for k in range(3):
    train[f'TINY_ROLE{k}'] = ['Ay.']
  directory = str(tmp_path_factory.mktemp('shakespeare'))
  sqlite_fixtures.write_shakespeare(directory, train, test)
  return directory, train, test


# ----------------------------------------------------------- Oracles.


def oracle_text(snippets):
  text = ' '.join(s.replace('\n', ' ') for s in snippets)
  while '  ' in text:
    text = text.replace('  ', ' ')
  return text


def oracle_class_53(c):
  if 'a' <= c <= 'z':
    return ord(c) - ord('a')
  if 'A' <= c <= 'Z':
    return 26 + ord(c) - ord('A')
  return 52


def oracle_class_80(c):
  return LEAF_80.find(c) if c in LEAF_80 else LEAF_80.find(' ')


def oracle_windows(text, h, classes):
  xs = [[classes(c) for c in text[i : i + h]] for i in range(len(text) - h)]
  ys = [classes(text[i + h]) for i in range(len(text) - h)]
  return xs, ys


# ------------------------------------------------------ Windows, classes.


def test_vocabularies():
  assert len(shakespeare_leaf.LEAF_VOCAB) == 80
  assert shakespeare_leaf.LEAF_VOCAB == LEAF_80
  text = string.ascii_letters + string.digits + ' \n.;é}~'
  np.testing.assert_array_equal(
      shakespeare_leaf.encode(text, 'deltafl53'),
      [oracle_class_53(c) for c in text],
  )
  np.testing.assert_array_equal(
      shakespeare_leaf.encode(text, 'leaf80'),
      [oracle_class_80(c) for c in text],
  )
  assert shakespeare_leaf.PRESETS['deltafl'].num_classes == 53
  assert shakespeare_leaf.PRESETS['qffl'].num_classes == 80


@pytest.mark.parametrize('preset', ['deltafl', 'fedprox'])
def test_windows_match_an_independent_computation(data_dir, preset):
  directory, train, test = data_dir
  spec = shakespeare_leaf.PRESETS[preset]
  classes = oracle_class_53 if preset == 'deltafl' else oracle_class_80
  task = shakespeare_leaf.create_task(
      preset=preset, data_dir=directory, batch_size=4, rnn_units=4
  )
  seen = 0
  for data in (task.train_data, task.test_data, task.validation_data):
    if data is None:
      continue
    for cid in data.client_ids:
      text = oracle_text(train[cid] + test.get(cid, []))
      xs, ys = oracle_windows(text, spec.window, classes)
      got = list(data.create_tf_dataset_for_client(cid).as_numpy_iterator())
      pairs = {(tuple(x), y) for x, y in zip(xs, ys)}
      for e in got:  # Every example is a window of the role with its label.
        assert e['x'].shape == (spec.window,) and e['y'].shape == ()
        assert (tuple(int(v) for v in e['x']), int(e['y'])) in pairs
      seen += len(got)
      if spec.split is None:  # A device holds all its windows, in order.
        np.testing.assert_array_equal([e['x'] for e in got], xs)
        np.testing.assert_array_equal([e['y'] for e in got], ys)
  assert seen > 100
  # Preprocessed: int32 (x [B, H], y [B]), one label per example.
  x, y = next(iter(task.train_dataset(task.train_data.client_ids[0], 1, 0)))
  assert x.shape == (4, spec.window) and y.shape == (4,)
  assert x.dtype == tf.int32 and y.dtype == tf.int32


def test_per_device_splits_partition_the_windows(data_dir):
  directory, train, test = data_dir
  for preset, parts in (('qffl', (0.8, 0.1, 0.1)), ('fedprox', (0.8, 0.2))):
    task = shakespeare_leaf.create_task(
        preset=preset, data_dir=directory, batch_size=4, rnn_units=4
    )
    splits = [task.train_data, task.test_data]
    if len(parts) == 3:
      splits.append(task.validation_data)
    else:
      assert task.validation_data is None
    for cid in task.train_data.client_ids:
      n = len(oracle_text(train[cid] + test.get(cid, []))) - 80
      sizes = [len(list(s.create_tf_dataset_for_client(cid))) for s in splits]
      assert sum(sizes) == n
      assert sizes[0] == max(1, int(0.8 * n))
      if len(parts) == 3:
        assert sizes[2] == int(0.1 * n)  # Validation.


def test_example_split_is_random_and_disjoint():
  rng = np.random.default_rng(0)
  tr, va, te = shakespeare_leaf.split_examples(1000, (0.8, 0.1), rng)
  assert (len(tr), len(va), len(te)) == (800, 100, 100)
  assert len(set(tr) | set(va) | set(te)) == 1000
  assert tr[-1] > 900 and te[0] < 100  # Not a contiguous cut.


# ------------------------------------------------------------ Selection.


def test_selection_rules():
  counts = {f'R{k:03d}': k for k in range(400)}
  spec = shakespeare_leaf.PRESETS
  eligible = shakespeare_leaf.select_roles(counts, spec['deltafl'], seed=0)
  assert eligible == sorted(c for c, n in counts.items() if n >= 100)
  train, test = shakespeare_leaf.split_devices(eligible, seed=0)
  assert len(train) == 150 and len(test) == 150
  assert not set(train) & set(test) and set(train) | set(test) == set(eligible)
  assert shakespeare_leaf.split_devices(eligible, seed=0) == (train, test)
  assert shakespeare_leaf.split_devices(eligible, seed=1) != (train, test)
  for preset, n, floor in (('qffl', 31, 64), ('fedprox', 143, 2)):
    a = shakespeare_leaf.select_roles(counts, spec[preset], seed=4)
    assert len(a) == n and all(counts[c] >= floor for c in a)
    assert a == shakespeare_leaf.select_roles(counts, spec[preset], seed=4)
    assert a != shakespeare_leaf.select_roles(counts, spec[preset], seed=5)
    small = shakespeare_leaf.select_roles(
        counts, spec[preset], seed=4, max_clients=7
    )
    assert len(small) == 7


def test_fixture_selection_and_unseen_test_devices(data_dir):
  directory, train, test = data_dir
  task = shakespeare_leaf.create_task(
      preset='deltafl', data_dir=directory, batch_size=4, rnn_units=4
  )
  kept = sorted(task.train_data.client_ids + task.test_data.client_ids)
  expected = sorted(
      c
      for c in train
      if len(oracle_text(train[c] + test.get(c, []))) - 20 >= 100
  )
  assert kept == expected and len(kept) == 12  # The tiny roles are dropped.
  assert not set(task.train_data.client_ids) & set(task.test_data.client_ids)
  assert len(task.train_data.client_ids) == 6


def test_scale_down_and_errors(data_dir, tmp_path):
  directory, _, _ = data_dir
  task = shakespeare_leaf.create_task(
      preset='fedprox',
      data_dir=directory,
      batch_size=4,
      rnn_units=4,
      max_clients=3,
      max_examples_per_client=50,
  )
  assert len(task.train_data.client_ids) == 3
  for cid in task.train_data.client_ids:
    assert (
        sum(
            len(list(d.create_tf_dataset_for_client(cid)))
            for d in (task.train_data, task.test_data)
        )
        == 50
    )
  with pytest.raises(base.TaskError, match='missing data file'):
    shakespeare_leaf.create_task(
        preset='qffl', data_dir=str(tmp_path), batch_size=4
    )
  with pytest.raises(base.TaskError, match='unknown Shakespeare preset'):
    shakespeare_leaf.create_task(
        preset='leaf', data_dir=directory, batch_size=4
    )
  with pytest.raises(base.TaskError, match='rnn_units'):
    shakespeare_leaf.create_task(
        preset='qffl', data_dir=directory, batch_size=4, rnn_units=0
    )


def test_models_follow_the_presets():
  shapes = lambda p, **k: [
      tuple(w.shape)
      for w in shakespeare_leaf.create_keras_model(
          shakespeare_leaf.PRESETS[p], **k
      ).trainable_weights
  ]
  # Delta-FL: one-hot 53 -> GRU(128) -> dense 53 (no embedding).
  assert shapes('deltafl') == [
      (53, 384),
      (128, 384),
      (2, 384),
      (128, 53),
      (53,),
  ]
  # q-FFL: embedding 8, 2 x LSTM(256), dense 80; FedProx: LSTM(100).
  assert shapes('qffl')[:3] == [(80, 8), (8, 1024), (256, 1024)]
  assert shapes('qffl')[-2:] == [(256, 80), (80,)]
  assert shapes('fedprox')[1:3] == [(8, 400), (100, 400)]
  assert shapes('fedprox', units=4)[1] == (8, 16)
  assert 'shakespeare_leaf' in registry.TASK_NAMES


# ---------------------------------------------------- Engines = TFF path.


def sgd(lr):
  return tff.learning.optimizers.build_sgdm(learning_rate=lr)


@pytest.fixture(scope='module')
def small_tasks(data_dir):
  directory, _, _ = data_dir
  make = lambda p, b: shakespeare_leaf.create_task(
      preset=p,
      data_dir=directory,
      batch_size=b,
      rnn_units=6,
      max_examples_per_client=40 if p == 'deltafl' else 23,
  )
  return {'deltafl': make('deltafl', 4), 'qffl': make('qffl', 5)}


def assert_same(process, tff_s, fast_s, tm, fm, keys):
  a = composition.model_weights_as_numpy(process, tff_s)
  b = composition.model_weights_as_numpy(process, fast_s)
  start = composition.model_weights_as_numpy(process, process.initialize())
  assert max(np.abs(x - y).max() for x, y in zip(a, start)) > 1e-2
  for x, y in zip(a, b):
    np.testing.assert_allclose(y, x, rtol=1e-5, atol=2e-6)
  for t, f in zip(tm, fm):
    for key in keys:
      np.testing.assert_allclose(f[key], t[key], rtol=1e-5, err_msg=key)


TRAIN_KEYS = [
    'train/loss',
    'train/accuracy',
    'train/num_examples',
    'train/num_batches',
]


def engine(kind, task, algorithm, vectorize=True):
  if kind == 'batched':
    return batched.BatchedEngine(
        task.model_fn,
        task.preprocess_train,
        batched.ClientArrays(task.train_data),
        algorithm,
    )
  return stacked.StackedEngine(
      task.model_fn,
      task.preprocess_train,
      task.train_data,
      algorithm,
      vectorize=vectorize,
  )


@pytest.mark.parametrize(
    'kind,vectorize', [('batched', True), ('stacked', True), ('stacked', False)]
)
def test_gru_fedavg_engines_equal_federated_path(small_tasks, kind, vectorize):
  task = small_tasks['deltafl']
  process = fed_prox.build_fed_prox(
      task.model_fn, sgd(0.5), sgd(1.0), proximal_strength=0.0
  )
  algorithm = batched.BatchedAlgorithm.from_registry(
      'fedprox', client_learning_rate=0.5, server_optimizer=sgd(1.0)
  )
  fast = engine(kind, task, algorithm, vectorize)
  if kind == 'stacked':  # Vectorized: the batched-matmul GRU.
    assert (fast.rnn_forward is not None) == vectorize
  out = engine_runs.run_both(task, process, fast)
  assert_same(process, *out, TRAIN_KEYS)


@pytest.mark.parametrize('kind', ['batched', 'stacked'])
def test_gru_delta_fl_engines_equal_federated_path(small_tasks, kind):
  task = small_tasks['deltafl']
  process = delta_fl.build_delta_fl(task.model_fn, sgd(0.5), theta=0.5)
  algorithm = batched.BatchedAlgorithm.from_registry(
      'deltafl', client_learning_rate=0.5, theta=0.5
  )
  out = engine_runs.run_both(
      task, process, engine(kind, task, algorithm), epochs=1
  )
  assert_same(
      process,
      *out,
      TRAIN_KEYS + ['client_work/eta', 'client_work/fraction_kept'],
  )
  assert any(m['client_work/fraction_kept'] < 1.0 for m in out[3])


def test_lstm_q_ffl_stacked_equals_federated_path(small_tasks):
  task = small_tasks['qffl']
  process = q_ffl.build_q_fedavg(
      task.model_fn, sgd(0.8), q=0.001, lipschitz_constant=1.0 / 0.8
  )
  algorithm = batched.BatchedAlgorithm.from_registry(
      'qffl', client_learning_rate=0.8, q=0.001, q_lipschitz=1.0 / 0.8
  )
  fast = engine('stacked', task, algorithm)
  assert fast.rnn_forward is not None  # The batched-matmul LSTM.
  out = engine_runs.run_both(task, process, fast, epochs=1)
  assert_same(process, *out, TRAIN_KEYS + ['client_work/loss_at_broadcast'])


# -------------------------------------------------------- The binary.


@pytest.mark.parametrize(
    'preset,extra',
    [
        (
            'deltafl',
            [
                '--algorithm=deltafl',
                '--theta=0.5',
                '--simulation_engine=stacked',
            ],
        ),
        (
            'qffl',
            [
                '--algorithm=qffl',
                '--q=0.001',
                '--client_learning_rate=0.8',
                '--simulation_engine=stacked',
            ],
        ),
        (
            'fedprox',
            [
                '--algorithm=fedprox',
                '--proximal_strength=0.001',
                '--client_learning_rate=0.8',
            ],
        ),
    ],
)
def test_two_rounds_of_each_preset_through_the_binary(
    data_dir, tmp_path, preset, extra
):
  directory, _, _ = data_dir
  code, stdout, stderr = binary.run_train(
      [
          '--task=shakespeare_leaf',
          f'--shakespeare_preset={preset}',
          f'--data_dir={directory}',
          '--rnn_units=4',
          '--max_examples_per_client=60',
          '--total_rounds=2',
          '--clients_per_round=3',
          '--client_batch_size=10',
          '--rounds_per_eval=1',
          '--progress=false',
          '--experiment_name=run',
      ]
      + extra,
      str(tmp_path),
  )
  assert code == 0, stderr[-2000:]
  assert f'{preset} preset' in stderr
  assert os.path.exists(tmp_path / 'run' / 'metrics.csv')
  assert 'Per-client metrics after round 2' in stdout


@pytest.mark.parametrize(
    'args,message',
    [
        (
            ['--task=shakespeare_leaf', '--shakespeare_preset=leaf'],
            "unknown --shakespeare_preset='leaf'; choose one of: deltafl, "
            'qffl, fedprox',
        ),
        (
            ['--task=shakespeare_leaf', '--min_examples=5'],
            '--min_examples applies to --task=emnist_character, '
            'shakespeare_character, stackoverflow_word, stackoverflow_tag, '
            'leaf, not --task=shakespeare_leaf',
        ),
        (
            ['--task=synthetic', '--rnn_units=4'],
            '--rnn_units applies to --task=shakespeare_leaf, not '
            '--task=synthetic',
        ),
    ],
)
def test_binary_refuses_bad_flags(data_dir, tmp_path, args, message):
  if '--task=shakespeare_leaf' in args:  # Only its data flags, not others'.
    args = args + [f'--data_dir={data_dir[0]}']
  code, _, stderr = binary.run_train(args, str(tmp_path))
  assert code == 2
  lines = binary.error_lines(stderr)
  assert len(lines) == 1 and lines[0].startswith('train: error:')
  assert message in lines[0]
