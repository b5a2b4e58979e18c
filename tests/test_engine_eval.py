# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The engines' per-client evaluation equals TFF's (`tff_algos.engine_eval`)."""

import collections
import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow_federated as tff

from run import algorithms
from run import engines
from run import simulation
from tasks import evaluation
from tasks import leaf
from tasks import shakespeare_leaf
from tasks import synthetic
from tff_algos import batched
from tff_algos import ditto
from tff_algos import engine_eval
from tff_algos import fed_prox
from tff_algos import stacked
from tests import binary
from tests import engine_runs
from tests import sqlite_fixtures

LETTERS = 'abcdefghijklmnopqrstuvwxyz ,.;:!?ABCDEFGHIJ'
WORDS = ['Thou', 'art', 'a', 'villain;', 'Good', 'my', 'lord,', 'speak:']


def role_snippets(rng, n_snippets, words_per_snippet):
  """Random speeches of a role, of `words_per_snippet` words each."""
  return [
      ' '.join(rng.choice(WORDS, words_per_snippet)) for _ in range(n_snippets)
  ]


def write_shakespeare_leaf(root, sizes, seed, length=80):
  """A LEAF Shakespeare folder: `sizes[u]` windows of user u per split."""
  rng = np.random.default_rng(seed)
  for split in ('train', 'test'):
    users = {}
    for u, n in sizes.items():
      text = ''.join(rng.choice(list(LETTERS), length + n))
      users[u] = {
          'x': [text[i : i + length] for i in range(n)],
          'y': [text[i + length] for i in range(n)],
      }
    os.makedirs(os.path.join(root, split))
    with open(os.path.join(root, split, 'a.json'), 'w') as f:
      json.dump(
          {
              'users': list(users),
              'num_samples': list(sizes.values()),
              'user_data': users,
              'hierarchies': [],
          },
          f,
      )
  return str(root)


def sgd(lr):
  return tff.learning.optimizers.build_sgdm(learning_rate=lr)


def trained_weights(task, lr):
  """The global model after two FedAvg rounds (stacked engine, 4 clients)."""
  process = fed_prox.build_fed_prox(
      task.model_fn, sgd(lr), sgd(1.0), proximal_strength=0.0
  )
  algorithm = batched.BatchedAlgorithm.from_registry(
      'fedprox', client_learning_rate=lr, server_optimizer=sgd(1.0)
  )
  engine = stacked.StackedEngine(
      task.model_fn, task.preprocess_train, task.train_data, algorithm
  )
  start = process.get_model_weights(process.initialize())
  weights = process.get_model_weights(
      engine_runs.run_engine(task, process, engine)
  )
  moved = max(
      np.abs(a - b).max() for a, b in zip(weights.trainable, start.trainable)
  )
  assert moved > 1e-2
  return weights


def perturbed_weights(task, seed):
  """The initial model moved randomly (training the recurrent presets on
  the stacked engine first would take a minute of tracing)."""
  rng = np.random.default_rng(seed)
  model = task.model_fn()
  return tff.learning.models.ModelWeights(
      trainable=[
          v.numpy() + rng.normal(0.0, 0.5, v.shape).astype(np.float32)
          for v in model.trainable_variables
      ],
      non_trainable=[v.numpy() for v in model.non_trainable_variables],
  )


def tff_values(task, weights, split, computation=None):
  """`evaluation.evaluate_clients` on every client of `split`."""
  data = {'test': task.test_data, 'train': task.train_data}[split]
  return evaluation.evaluate_clients(
      computation or evaluation.build_per_client_evaluation(task.model_fn),
      weights,
      [task.eval_dataset(cid, split) for cid in data.client_ids],
  )


def assert_same_values(got, expected):
  assert list(got) == list(expected) == ['accuracy', 'loss', 'num_examples']
  for name, values in expected.items():
    assert got[name].dtype == values.dtype, name
    assert got[name].shape == values.shape, name
  np.testing.assert_array_equal(got['num_examples'], expected['num_examples'])
  for name in ('accuracy', 'loss'):
    np.testing.assert_allclose(
        got[name], expected[name], rtol=1e-5, atol=1e-7, err_msg=name
    )


def assert_engine_equals_tff(task, weights, *, batch_size, chunk_size):
  """The engine evaluation equals TFF's on the test and train splits."""
  evaluator = engine_eval.EngineEvaluation(
      task.model_fn,
      task.preprocess_eval,
      task.train_data,
      batch_size=batch_size,
      chunk_size=chunk_size,
  )
  computation = evaluation.build_per_client_evaluation(task.model_fn)
  for split in ('test', 'train'):
    data = {'test': task.test_data, 'train': task.train_data}[split]
    expected = tff_values(task, weights, split, computation)
    assert len(set(expected['loss'].tolist())) > 1  # Clients differ.
    assert_same_values(evaluator.evaluate(weights, data), expected)
  evaluator.close()


# ------------------------------------------------------------- Layout.


def test_slots_lay_clients_end_to_end_and_pad_to_no_client():
  task = synthetic.create_task(num_clients=4, seed=0)
  evaluator = engine_eval.EngineEvaluation(
      task.model_fn, task.preprocess_eval, task.train_data, batch_size=3
  )
  # Clients of 1, 0 and 3 examples: 4 rows in 2 passes of 3, then the dummy
  # row 4 of the padding client 3.
  slots, segments = evaluator.slots([1, 0, 3])
  np.testing.assert_array_equal(slots, [[0, 1, 2], [3, 4, 4]])
  np.testing.assert_array_equal(segments, [[0, 2, 2], [2, 3, 3]])
  slots, segments = evaluator.slots([0])
  np.testing.assert_array_equal(slots, [[0, 0, 0]])
  np.testing.assert_array_equal(segments, [[1, 1, 1]])
  evaluator.close()


# ------------------------------------------------ Equal to TFF's evaluation.


def test_synthetic_equals_tff_evaluation():
  # Unequal clients; 7 examples per pass, 5 clients per call: clients
  # straddle passes and calls, and each call's last pass is padded.
  task = synthetic.create_task(
      num_clients=12, seed=1, batch_size=5, size_law='table_4_4'
  )
  weights = trained_weights(task, 0.1)
  assert_engine_equals_tff(task, weights, batch_size=7, chunk_size=5)


@pytest.fixture(scope='module')
def shakespeare_dir(tmp_path_factory):
  rng = np.random.default_rng(3)
  train, test = {}, {}
  for k in range(12):
    snippets = role_snippets(rng, int(rng.integers(2, 4)), 12)
    train[f'PLAY_ROLE{k}'] = snippets[:-1]
    test[f'PLAY_ROLE{k}'] = snippets[-1:]
  directory = str(tmp_path_factory.mktemp('shakespeare'))
  sqlite_fixtures.write_shakespeare(directory, train, test)
  return directory


@pytest.mark.parametrize('preset', ['deltafl', 'qffl'])
def test_shakespeare_presets_equal_tff_evaluation(shakespeare_dir, preset):
  # The GRU (deltafl) and LSTM (qffl) presets, scaled down.
  task = shakespeare_leaf.create_task(
      preset=preset,
      data_dir=shakespeare_dir,
      batch_size=4,
      rnn_units=6,
      max_examples_per_client=20,
      eval_batch_size=8,
  )
  weights = perturbed_weights(task, seed=7)
  assert_engine_equals_tff(task, weights, batch_size=16, chunk_size=4)


def test_leaf_folder_equals_tff_evaluation(tmp_path):
  sizes = {'u0': 9, 'u1': 1, 'u2': 14, 'u3': 4, 'u4': 6}
  leaf_dir = write_shakespeare_leaf(tmp_path, sizes, seed=0)
  task = leaf.create_task(
      leaf_dir=leaf_dir, batch_size=3, lstm_units=5, eval_batch_size=4
  )
  weights = perturbed_weights(task, seed=7)
  assert_engine_equals_tff(task, weights, batch_size=5, chunk_size=3)


def _client_data(sizes, seed):
  rng = np.random.default_rng(seed)
  return tff.simulation.datasets.TestClientData(
      {
          f'c{k}': collections.OrderedDict(
              x=rng.normal(size=(n, synthetic.NUM_FEATURES)).astype(np.float32),
              y=rng.integers(0, synthetic.NUM_CLASSES, n).astype(np.int32),
          )
          for k, n in enumerate(sizes)
      }
  )


def test_clients_of_very_different_sizes_in_one_chunk():
  # One call: clients of 1 and 300 examples side by side, one with none, a
  # client of 2 last (beside the padding of the last pass).
  task = synthetic.create_task(num_clients=4, seed=2)
  data = _client_data([1, 300, 0, 1, 57, 2], seed=4)
  task = dataclasses.replace(task, test_data=data)
  rng = np.random.default_rng(5)
  model = task.model_fn()
  weights = tff.learning.models.ModelWeights(
      trainable=[
          rng.normal(size=v.shape).astype(np.float32)
          for v in model.trainable_variables
      ],
      non_trainable=[],
  )
  expected = tff_values(task, weights, 'test')
  np.testing.assert_array_equal(expected['num_examples'], [1, 300, 0, 1, 57, 2])
  assert expected['loss'][2] == 0.0 and expected['accuracy'][2] == 0.0
  evaluator = engine_eval.EngineEvaluation(
      task.model_fn, task.preprocess_eval, task.train_data, batch_size=16
  )
  got = evaluator.evaluate(weights, data)
  assert_same_values(got, expected)
  evaluator.close()


class _CountingClientData(tff.simulation.datasets.ClientData):
  """A ClientData that counts the clients' datasets made."""

  def __init__(self, data):
    self._data = data
    self.reads = 0

  @property
  def client_ids(self):
    return self._data.client_ids

  @property
  def element_type_structure(self):
    return self._data.element_type_structure

  @property
  def serializable_dataset_fn(self):
    return self._data.serializable_dataset_fn

  @property
  def dataset_computation(self):
    return self._data.dataset_computation

  def create_tf_dataset_for_client(self, client_id):
    self.reads += 1
    return self._data.create_tf_dataset_for_client(client_id)


def test_splits_are_read_once_while_they_fit_the_budget():
  task = synthetic.create_task(num_clients=4, seed=2)
  small = _CountingClientData(_client_data([3, 5, 0, 2], seed=6))
  large = _CountingClientData(_client_data([40, 50], seed=7))
  weights = trained_weights(task, 0.1)
  expected = tff_values(
      dataclasses.replace(task, test_data=small), weights, 'test'
  )
  small.reads = 0  # The TFF evaluation above read each client once.
  # 10 examples of 60 float32 features and an int32 label: 2,480 bytes; the
  # large split's 90: 22,320.
  evaluator = engine_eval.EngineEvaluation(
      task.model_fn,
      task.preprocess_eval,
      task.train_data,
      batch_size=4,
      chunk_size=3,
      cache_bytes=10_000,
  )
  for _ in range(3):
    assert_same_values(evaluator.evaluate(weights, small), expected)
    evaluator.evaluate(weights, large)
  assert small.reads == 4  # Once per client: kept.
  assert large.reads == 3 * 2  # Over the budget: read at each call.
  assert evaluator.kept_bytes == 10 * (60 + 1) * 4
  unkept = engine_eval.EngineEvaluation(
      task.model_fn, task.preprocess_eval, task.train_data, cache_bytes=0
  )
  small.reads = 0
  for _ in range(2):
    assert_same_values(unkept.evaluate(weights, small), expected)
  assert small.reads == 2 * 4 and unkept.kept_bytes == 0
  evaluator.close()
  unkept.close()


# ------------------------------------------------ The simulation's choice.


def test_simulation_uses_the_engine_evaluation_on_fast_engines():
  task = synthetic.create_task(num_clients=4, seed=0)
  lines = []
  chosen = simulation.per_client_evaluation(task, object(), log=lines.append)
  assert isinstance(chosen, engine_eval.EngineEvaluation)
  chosen.close()
  assert isinstance(
      simulation.per_client_evaluation(task, None, log=lines.append),
      tff.Computation,
  )
  assert not lines
  # A preprocessing that is not a per-example map and a batch (it drops each
  # client's first example): TFF's evaluation, and one line saying why.
  odd = dataclasses.replace(
      task, preprocess_eval=lambda ds: task.preprocess_eval(ds.skip(1))
  )
  chosen = simulation.per_client_evaluation(odd, object(), log=lines.append)
  assert isinstance(chosen, tff.Computation)
  assert lines == [
      "per-client evaluation through TFF: the task's preprocess_eval is not"
      ' of the form the engine evaluation reproduces (a per-example map, then'
      ' a batch)'
  ]


def _csv_table(path):
  rows = [line.split(',') for line in path.read_text().splitlines()]
  return (
      rows[0],
      [r[:2] for r in rows[1:]],
      np.array([[float(v) for v in r[2:]] for r in rows[1:]]),
  )


def _summary_values(path):
  summaries = json.loads(path.read_text())['summaries']
  return {
      (split, key): value
      for split, row in summaries.items()
      for key, value in row.items()
  }


def test_binary_stacked_run_writes_what_the_tff_evaluation_writes(tmp_path):
  """`run.train --simulation_engine=stacked`: the per-client CSVs and the
  summary equal those of the same run evaluated by TFF (the tff engine)."""
  args = [
      '--task=synthetic',
      '--num_clients=10',
      '--clients_per_round=4',
      '--client_batch_size=5',
      '--client_learning_rate=0.1',
      '--synthetic_size_law=table_4_4',
      '--total_rounds=2',
      '--rounds_per_eval=1',
      '--progress=false',
  ]
  for name in ('tff', 'stacked'):
    code, _, stderr = binary.run_train(
        args + [f'--simulation_engine={name}', f'--experiment_name={name}'],
        tmp_path,
    )
    assert code == 0, stderr[-2000:]
    assert 'per-client evaluation through TFF' not in stderr
  for round_num in (1, 2):
    name = f'clients/round_{round_num:05d}.csv'
    header, ids, values = _csv_table(tmp_path / 'stacked' / name)
    tff_header, tff_ids, tff_values_ = _csv_table(tmp_path / 'tff' / name)
    assert (
        header
        == tff_header
        == [
            'split',
            'client_id',
            'accuracy',
            'loss',
            'num_examples',
        ]
    )
    assert ids == tff_ids and len(ids) == 20  # Test and train splits.
    np.testing.assert_allclose(values, tff_values_, rtol=1e-5, atol=1e-6)
  got = _summary_values(tmp_path / 'stacked' / 'summary.json')
  expected = _summary_values(tmp_path / 'tff' / 'summary.json')
  assert sorted(got) == sorted(expected)
  assert ('train/loss', 'worst10') in got
  for key, value in expected.items():
    np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------- Personal models.


def random_client_states(process, num_clients, seed):
  """Client states of G personal models, each moved randomly from the
  initial model."""
  rng = np.random.default_rng(seed)
  initial = process.initial_client_state()
  return [
      {
          'personal': tuple(
              [
                  (np.asarray(w) + rng.normal(0.0, 0.5, np.shape(w))).astype(
                      np.float32
                  )
                  for w in model
              ]
              for model in initial['personal']
          )
      }
      for _ in range(num_clients)
  ]


def assert_personal_equals_tff(task, personal_batch_size):
  """Random personal models (G=2) on the engine equal the process's."""
  process = ditto.build_ditto(task.model_fn, sgd(0.1), lam=[0.1, 2.0])
  state = process.initialize()
  evaluator = engine_eval.EngineEvaluation(
      task.model_fn,
      task.preprocess_eval,
      task.train_data,
      personal_batch_size=personal_batch_size,
  )
  for data, split in ((task.test_data, 'test'), (task.train_data, 'train')):
    ids = list(data.client_ids)
    states = random_client_states(process, len(ids), seed=len(ids))
    expected = process.evaluate_personal(
        state, states, [task.eval_dataset(c, split) for c in ids]
    )
    got = evaluator.evaluate_personal(
        process.get_model_weights(state), states, data, ids
    )
    assert len(got) == len(expected) == len(ids)
    losses = np.array([row['loss'] for row in expected])
    assert losses.shape == (len(ids), 2)
    losses = losses[[row['num_examples'][0] > 0 for row in expected]]
    assert len(set(losses.ravel().tolist())) == losses.size  # All differ.
    for row, want in zip(got, expected):
      assert list(row) == list(want)
      for name, values in want.items():
        assert row[name].dtype == values.dtype, name
      np.testing.assert_array_equal(row['num_examples'], want['num_examples'])
      for name in ('accuracy', 'loss'):
        np.testing.assert_allclose(row[name], want[name], rtol=1e-5, atol=1e-7)
  evaluator.close()


def test_personal_models_equal_tff_evaluation_synthetic():
  # Clients of 2 to 60 examples in passes of 3: size groups and padding.
  task = synthetic.create_task(
      num_clients=8, seed=1, batch_size=5, size_law='table_4_4'
  )
  assert_personal_equals_tff(task, personal_batch_size=3)


def test_personal_models_of_very_different_sizes():
  # Size groups that reorder the clients (the empty one first, the client of
  # 300 last), each group padded to its longest client.
  sizes = [1, 300, 0, 1, 57, 2]
  order, bounds = stacked.round_groups(-(-np.array(sizes) // 4))
  assert len(bounds) > 2 and list(order) != sorted(order)
  task = dataclasses.replace(
      synthetic.create_task(num_clients=4, seed=2),
      test_data=_client_data(sizes, seed=4),
  )
  assert_personal_equals_tff(task, personal_batch_size=4)


def test_personal_models_equal_tff_evaluation_shakespeare(shakespeare_dir):
  # The GRU preset: the stacked recurrent kernels of tff_algos.stacked_rnn.
  task = shakespeare_leaf.create_task(
      preset='deltafl',
      data_dir=shakespeare_dir,
      batch_size=4,
      rnn_units=6,
      max_examples_per_client=20,
      eval_batch_size=8,
  )
  assert_personal_equals_tff(task, personal_batch_size=3)


def test_simulation_on_the_batched_engine_evaluates_as_tff():
  """Ditto with a lambda grid (chosen per client on validation data):
  `run_simulation` on the batched engine gives the per-client global and
  personal metrics of the TFF path."""
  task = synthetic.create_task(
      num_clients=6,
      seed=2,
      size_law='table_4_4',
      batch_size=5,
      validation_fraction=0.3,
  )
  spec = algorithms.AlgorithmSpec(
      name='ditto', ditto_lambda_grid=(0.1, 2.0), client_learning_rate=0.1
  )
  process = algorithms.build_process(spec, task.model_fn, num_clients=6)
  config = simulation.SimulationConfig(
      total_rounds=2, clients_per_round=3, seed=3, eval_train_clients=True
  )
  results = {
      name: simulation.run_simulation(
          process, task, config, progress=False, engine=engine
      )['per_client']
      for name, engine in (
          ('tff', None),
          ('batched', engines.build_batched_engine(spec, task)),
      )
  }
  got, expected = results['batched'], results['tff']
  assert (
      list(got)
      == list(expected)
      == [
          'test',
          'train',
          'personal/test',
          'personal/train',
      ]
  )
  for split, values in expected.items():
    assert list(got[split]) == list(values), split
    np.testing.assert_array_equal(got[split]['client_id'], values['client_id'])
    for name in ('num_examples', 'lambda'):
      if name in values:
        np.testing.assert_array_equal(got[split][name], values[name])
    for name in ('accuracy', 'loss'):
      np.testing.assert_allclose(
          got[split][name], values[name], rtol=1e-5, err_msg=split
      )
