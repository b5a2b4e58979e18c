"""The batched engine equals the federated path (same seeds and batches)."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from run import algorithms
from run import engines
from run import simulation
from tasks import synthetic
from tff_algos import afl
from tff_algos import batched
from tff_algos import composition
from tff_algos import delta_fl
from tff_algos import ditto
from tff_algos import fed_plus
from tff_algos import fed_prox
from tff_algos import q_ffl
from tff_algos import term
from tests import engine_runs

LR = 0.1
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def task():
  # Unequal client sizes (padding of the last batch, clients of different
  # lengths) and batch 5.
  return synthetic.create_task(
      num_clients=12, seed=1, batch_size=5, size_law='table_4_4'
  )


def sgd(lr=LR, momentum=None):
  return tff.learning.optimizers.build_sgdm(learning_rate=lr, momentum=momentum)


def run_both(
    task,
    process,
    algorithm,
    *,
    rounds=2,
    epochs=2,
    straggler_fraction=0.0,
    drop=False,
):
  """Trains `rounds` rounds both ways; returns both weights and metrics."""
  engine = batched.BatchedEngine(
      task.model_fn,
      task.preprocess_train,
      batched.ClientArrays(task.train_data),
      algorithm,
  )
  tff_state, fast_state, tff_metrics, fast_metrics = engine_runs.run_both(
      task,
      process,
      engine,
      rounds=rounds,
      epochs=epochs,
      straggler_fraction=straggler_fraction,
      drop=drop,
  )
  return (
      composition.model_weights_as_numpy(process, tff_state),
      composition.model_weights_as_numpy(process, fast_state),
      tff_state,
      fast_state,
      tff_metrics,
      fast_metrics,
  )


def assert_same(tff_w, fast_w):
  assert np.abs(tff_w[0]).max() > 1e-2  # The model moved.
  for a, b in zip(tff_w, fast_w):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def assert_same_finalizer(tff_s, fast_s):
  for a, b in zip(
      tf.nest.flatten(tff_s.finalizer), tf.nest.flatten(fast_s.finalizer)
  ):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def assert_same_metrics(tff_metrics, fast_metrics, keys):
  for t, f in zip(tff_metrics, fast_metrics):
    for key in keys:
      np.testing.assert_allclose(f[key], t[key], rtol=1e-5, err_msg=key)


@pytest.mark.parametrize('mu', [0.0, 0.5])
def test_fedavg_fedprox_equal_federated_path(task, mu):
  # Server momentum (a server-optimizer state to carry), two local epochs
  # with a reshuffle each, and stragglers with partial epochs.
  server = sgd(1.0, momentum=0.5)
  process = fed_prox.build_fed_prox(
      task.model_fn, sgd(), server, proximal_strength=mu
  )
  algorithm = batched.BatchedAlgorithm.from_registry(
      'fedprox',
      client_learning_rate=LR,
      server_optimizer=server,
      proximal_strength=mu,
  )
  tff_w, fast_w, tff_s, fast_s, tm, fm = run_both(
      task, process, algorithm, straggler_fraction=0.5
  )
  assert_same(tff_w, fast_w)
  assert_same_finalizer(tff_s, fast_s)
  assert_same_metrics(
      tm,
      fm,
      [
          'train/loss',
          'train/accuracy',
          'train/num_examples',
          'train/num_batches',
      ],
  )


def test_q_ffl_equals_federated_path(task):
  process = q_ffl.build_q_fedavg(
      task.model_fn, sgd(), q=1.0, lipschitz_constant=1.0 / LR
  )
  algorithm = batched.BatchedAlgorithm.from_registry(
      'qffl', client_learning_rate=LR, q=1.0, q_lipschitz=1.0 / LR
  )
  tff_w, fast_w, *_, tm, fm = run_both(task, process, algorithm)
  assert_same(tff_w, fast_w)
  assert_same_metrics(
      tm, fm, ['train/loss', 'client_work/loss_at_broadcast', 'finalizer/h_sum']
  )


def test_delta_fl_equals_federated_path(task):
  process = delta_fl.build_delta_fl(task.model_fn, sgd(), theta=0.5)
  algorithm = batched.BatchedAlgorithm.from_registry(
      'deltafl', client_learning_rate=LR, theta=0.5
  )
  tff_w, fast_w, *_, tm, fm = run_both(task, process, algorithm, epochs=1)
  assert_same(tff_w, fast_w)
  assert_same_metrics(
      tm,
      fm,
      [
          'train/loss',
          'client_work/eta',
          'client_work/fraction_kept',
          'client_work/loss_at_broadcast',
      ],
  )
  # The filter really filtered: half the clients (ties at w_0 aside) train.
  assert any(m['client_work/fraction_kept'] < 1.0 for m in fm[1:])


@pytest.mark.parametrize('tilt', [2.0, -1.0])
def test_term_equals_federated_path(task, tilt):
  # Tilted weights, FedProx's term, server momentum and stragglers.
  server = sgd(1.0, momentum=0.5)
  process = term.build_term(
      task.model_fn, sgd(), server, tilt=tilt, proximal_strength=0.1
  )
  algorithm = batched.BatchedAlgorithm.from_registry(
      'term',
      client_learning_rate=LR,
      server_optimizer=server,
      tilt=tilt,
      proximal_strength=0.1,
  )
  tff_w, fast_w, tff_s, fast_s, tm, fm = run_both(
      task, process, algorithm, straggler_fraction=0.5
  )
  assert_same(tff_w, fast_w)
  assert_same_finalizer(tff_s, fast_s)
  assert_same_metrics(
      tm,
      fm,
      [
          'train/loss',
          'train/accuracy',
          'train/num_examples',
          'client_work/loss_at_broadcast',
          'client_work/max_loss_at_broadcast',
          'finalizer/update_non_finite',
      ],
  )


def test_term_binary_flags_equal_federated_path(task):
  spec = algorithms.AlgorithmSpec(
      name='term', tilt=1.0, client_learning_rate=LR
  )
  config = simulation.SimulationConfig(
      total_rounds=2,
      clients_per_round=4,
      rounds_per_eval=0,
      seed=5,
      eval_train_clients=False,
  )
  states = []
  for engine in (None, engines.build_batched_engine(spec, task)):
    process = algorithms.build_process(spec, task.model_fn)
    states.append(
        simulation.run_simulation(
            process, task, config, progress=False, engine=engine
        )['state']
    )
  w0, w1 = (composition.model_weights_as_numpy(process, s) for s in states)
  for a, b in zip(w0, w1):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def _engine(task, algorithm):
  return batched.BatchedEngine(
      task.model_fn,
      task.preprocess_train,
      batched.ClientArrays(task.train_data),
      algorithm,
  )


def _trainable(process, state):
  if hasattr(process, 'get_model_weights'):
    weights = process.get_model_weights(state)
  else:
    weights = state.global_model_weights
  return [np.asarray(w) for w in weights.trainable]


def assert_same_clients(held):
  """The engine's client states equal the federated path's."""
  assert held['tff'] and set(held['tff']) == set(held['engine'])
  for cid, tff_state in held['tff'].items():
    for a, b in zip(
        tf.nest.flatten(tff_state['personal']),
        tf.nest.flatten(held['engine'][cid]['personal']),
    ):
      np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


TRAIN_METRICS = ('train/loss', 'train/accuracy', 'train/num_examples')


@pytest.mark.parametrize('personal_steps', [0, 3])
def test_ditto_equals_federated_path(task, personal_steps):
  # A lambda grid: two personal models per client, each pass reading the
  # stream again (the next shuffle order).
  process = ditto.build_ditto(
      task.model_fn, sgd(), lam=[0.1, 1.0], personal_steps=personal_steps
  )
  algorithm = batched.BatchedAlgorithm.from_registry(
      'ditto',
      client_learning_rate=LR,
      ditto_lambda_grid=(0.1, 1.0),
      ditto_personal_steps=personal_steps,
  )
  held = {}
  tff_state, fast_state, tff_m, fast_m = engine_runs.run_both(
      task,
      process,
      _engine(task, algorithm),
      rounds=3,
      straggler_fraction=0.5,
      client_states=held,
  )
  assert_same(_trainable(process, tff_state), _trainable(process, fast_state))
  assert_same_clients(held)
  assert_same_metrics(
      tff_m, fast_m, TRAIN_METRICS + ('client_work/personal_non_finite',)
  )
  # The personal models moved away from the global one, and apart.
  personal = next(iter(held['engine'].values()))['personal']
  assert np.abs(personal[0][0] - personal[1][0]).max() > 1e-3


@pytest.mark.parametrize('psi', ['avg', 'geomed', 'comed'])
def test_fed_plus_equals_federated_path(task, psi):
  options = dict(
      learning_rate=LR, sigma=1.0, delta=0.1, lam=0.0, aggregation_iterations=5
  )
  process = fed_plus.build_fed_plus(task.model_fn, psi=psi, **options)
  name = {'avg': 'fedavg_plus', 'geomed': 'fedgeomed_plus'}.get(
      psi, 'fedcomed_plus'
  )
  algorithm = batched.BatchedAlgorithm.from_registry(
      name,
      client_learning_rate=LR,
      fedplus_sigma=1.0,
      fedplus_delta=0.1,
      fedplus_lambda=0.0,
      fedplus_iterations=5,
  )
  held = {}
  tff_state, fast_state, tff_m, fast_m = engine_runs.run_both(
      task,
      process,
      _engine(task, algorithm),
      rounds=3,
      client_states=held,
  )
  assert_same(_trainable(process, tff_state), _trainable(process, fast_state))
  assert_same_clients(held)
  assert_same_metrics(tff_m, fast_m, TRAIN_METRICS)
  for a, b in zip(tff_m, fast_m):
    np.testing.assert_allclose(
        b['aggregator/last_step_norm'],
        a['aggregator/last_step_norm'],
        rtol=1e-3,
        atol=1e-7,
    )
  if psi != 'avg':  # The fixed-point iterations ran.
    assert fast_m[-1]['aggregator/last_step_norm'] > 0


def test_afl_equals_federated_path(task):
  options = dict(
      num_clients=len(task.train_data.client_ids),
      model_learning_rate=0.5,
      mixture_learning_rate=0.01,
  )
  process = afl.build_afl(task.model_fn, **options)
  algorithm = batched.BatchedAlgorithm.from_registry(
      'afl',
      client_optimizer=sgd(),
      client_learning_rate=0.5,
      num_clients=len(task.train_data.client_ids),
      afl_lambda_lr=0.01,
  )
  tff_state, fast_state, tff_m, fast_m = engine_runs.run_both(
      task, process, _engine(task, algorithm), rounds=3, epochs=1
  )
  assert_same(_trainable(process, tff_state), _trainable(process, fast_state))
  mixture = np.asarray(fast_state.client_work)
  np.testing.assert_allclose(
      mixture, np.asarray(tff_state.client_work), rtol=1e-5, atol=1e-7
  )
  # The mixture moved off uniform and stayed inside the simplex.
  assert mixture.max() - mixture.min() > 1e-3 and mixture.min() > 0
  np.testing.assert_allclose(mixture.sum(), 1.0, rtol=1e-5)
  assert_same_metrics(
      tff_m,
      fast_m,
      TRAIN_METRICS
      + ('client_work/mixture/lambda_max', 'client_work/mixture/lambda_min'),
  )


def test_q_fedsgd_equals_federated_path(task):
  process = q_ffl.build_q_fedsgd(task.model_fn, q=1.0, lipschitz_constant=10.0)
  algorithm = batched.BatchedAlgorithm.from_registry(
      'qfedsgd', client_learning_rate=LR, q=1.0, q_lipschitz=10.0
  )
  tff_state, fast_state, tff_m, fast_m = engine_runs.run_both(
      task, process, _engine(task, algorithm), rounds=3, epochs=1
  )
  assert_same(_trainable(process, tff_state), _trainable(process, fast_state))
  assert_same_metrics(
      tff_m,
      fast_m,
      TRAIN_METRICS + ('client_work/loss_at_broadcast', 'finalizer/h_sum'),
  )


@pytest.mark.parametrize(
    'spec',
    [
        algorithms.AlgorithmSpec(name='qffl', q=2.0, client_learning_rate=LR),
        algorithms.AlgorithmSpec(
            name='ditto', ditto_lambda=0.5, client_learning_rate=LR
        ),
        algorithms.AlgorithmSpec(
            name='afl', afl_lambda_lr=0.01, client_learning_rate=0.5
        ),
    ],
    ids=lambda spec: spec.name,
)
def test_run_simulation_with_engine_equals_without(task, spec):
  config = simulation.SimulationConfig(
      total_rounds=2,
      clients_per_round=4,
      rounds_per_eval=0,
      seed=5,
      eval_train_clients=False,
  )
  results = []
  num_clients = len(task.train_data.client_ids)
  for engine in (None, engines.build_batched_engine(spec, task)):
    process = algorithms.build_process(
        spec, task.model_fn, num_clients=num_clients
    )
    result = simulation.run_simulation(
        process, task, config, progress=False, engine=engine
    )
    results.append(result)
  w0, w1 = (_trainable(process, r['state']) for r in results)
  for a, b in zip(w0, w1):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  summaries = [r['final_summaries'] for r in results]
  assert set(summaries[0]) == set(summaries[1])
  for key, value in summaries[0].items():  # Personal models' too (Ditto).
    np.testing.assert_allclose(
        summaries[1][key]['mean'], value['mean'], rtol=1e-5, err_msg=key
    )
  assert [h['clients'] for h in results[1]['history']] == [4, 4]


def test_client_arrays_read_each_client_once(task):
  arrays = batched.ClientArrays(task.train_data)
  ids = list(task.train_data.client_ids)
  flat, offsets = arrays.concatenate([ids[3], ids[0], ids[3]])
  assert len(arrays) == 2
  n3 = len(arrays.get(ids[3])['y'])
  n0 = len(arrays.get(ids[0])['y'])
  np.testing.assert_array_equal(offsets, [0, n3, n3 + n0, 2 * n3 + n0])
  expected = list(task.train_data.create_tf_dataset_for_client(ids[0]))
  np.testing.assert_array_equal(
      flat['x'][n3 : n3 + n0], np.stack([e['x'].numpy() for e in expected])
  )


def test_bad_arguments():
  registered = batched.BatchedAlgorithm.from_registry
  with pytest.raises(ValueError, match="unknown algorithm 'fedsgd'"):
    registered('fedsgd', client_learning_rate=LR)
  with pytest.raises(ValueError, match='ditto needs ditto_lambda'):
    registered('ditto', client_learning_rate=LR)
  with pytest.raises(ValueError, match='fedplus_sigma must be >= 0'):
    registered('fedavg_plus', client_learning_rate=LR, fedplus_sigma=-1.0)
  with pytest.raises(ValueError, match='q applies to qffl and qfedsgd'):
    registered('fedprox', client_learning_rate=LR, q=1.0)
  with pytest.raises(TypeError, match='no algorithm has an option'):
    registered('fedprox', client_learning_rate=LR, mu=1.0)
  with pytest.raises(ValueError, match='exact quantile'):
    registered('deltafl', client_learning_rate=LR, secure_quantile='mm')
  with pytest.raises(TypeError, match='client_optimizer'):
    registered(
        'fedavg',
        client_optimizer=tf.keras.optimizers.SGD(),
        client_learning_rate=LR,
    )
  with pytest.raises(ValueError, match='theta must be in'):
    registered('deltafl', client_learning_rate=LR, theta=0.0)
  with pytest.raises(ValueError, match='simulation_engine'):
    engines.check_engine('fast', algorithms.AlgorithmSpec(name='fedavg'))
  with pytest.raises(ValueError, match='tilt must be finite'):
    registered('term', client_learning_rate=LR, tilt=float('inf'))
  with pytest.raises(TypeError, match='definition_fn'):
    batched.BatchedAlgorithm('fedavg', None, sgd()).validate()
  with pytest.raises(ValueError, match='exact quantile'):
    engines.check_engine(
        'batched',
        algorithms.AlgorithmSpec(
            name='deltafl', theta=0.5, secure_quantile='mm'
        ),
    )
  with pytest.raises(TypeError, match='ClientArrays'):
    batched.BatchedEngine(
        lambda: None,
        lambda *a: None,
        object(),
        batched.BatchedAlgorithm.from_registry(
            'fedavg', client_learning_rate=LR
        ),
    )


@pytest.mark.parametrize(
    'args',
    [
        ['--algorithm=ditto', '--ditto_lambda=0.1', '--ditto_clip_norm=1'],
        ['--algorithm=fedavg', '--workers=127.0.0.1:1'],
    ],
)
def test_binary_refuses_unsupported_combinations(tmp_path, args):
  proc = subprocess.run(
      [
          sys.executable,
          '-m',
          'run.train',
          '--simulation_engine=batched',
          f'--root_output_dir={tmp_path}',
          '--progress=false',
      ]
      + args,
      cwd=ROOT,
      check=False,
      capture_output=True,
      text=True,
      timeout=300,
      start_new_session=True,
  )
  assert proc.returncode == 2
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('train: error: ') and 'batched' in last, last
