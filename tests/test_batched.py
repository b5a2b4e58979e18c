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
from tff_algos import batched
from tff_algos import composition
from tff_algos import delta_fl
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
  algorithm = batched.BatchedAlgorithm(
      'fedprox', sgd(), server, proximal_strength=mu
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
  algorithm = batched.BatchedAlgorithm(
      'qffl', sgd(), q=1.0, lipschitz_constant=1.0 / LR
  )
  tff_w, fast_w, *_, tm, fm = run_both(task, process, algorithm)
  assert_same(tff_w, fast_w)
  assert_same_metrics(
      tm, fm, ['train/loss', 'client_work/loss_at_broadcast', 'finalizer/h_sum']
  )


def test_delta_fl_equals_federated_path(task):
  process = delta_fl.build_delta_fl(task.model_fn, sgd(), theta=0.5)
  algorithm = batched.BatchedAlgorithm('deltafl', sgd(), theta=0.5)
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
  algorithm = batched.BatchedAlgorithm(
      'term', sgd(), server, tilt=tilt, proximal_strength=0.1
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


def test_run_simulation_with_engine_equals_without(task):
  spec = algorithms.AlgorithmSpec(name='qffl', q=2.0, client_learning_rate=LR)
  config = simulation.SimulationConfig(
      total_rounds=2,
      clients_per_round=4,
      rounds_per_eval=0,
      seed=5,
      eval_train_clients=False,
  )
  results = []
  for engine in (None, engines.build_batched_engine(spec, task)):
    process = algorithms.build_process(spec, task.model_fn)
    result = simulation.run_simulation(
        process, task, config, progress=False, engine=engine
    )
    results.append(result)
  w0, w1 = (
      composition.model_weights_as_numpy(process, r['state']) for r in results
  )
  for a, b in zip(w0, w1):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
      results[1]['final_summaries']['test/loss']['mean'],
      results[0]['final_summaries']['test/loss']['mean'],
      rtol=1e-5,
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
  with pytest.raises(ValueError, match='supports'):
    batched.BatchedAlgorithm('afl', sgd()).validate()
  with pytest.raises(TypeError, match='client_optimizer'):
    batched.BatchedAlgorithm('fedavg', tf.keras.optimizers.SGD()).validate()
  with pytest.raises(ValueError, match='theta'):
    batched.BatchedAlgorithm('deltafl', sgd(), theta=0.0).validate()
  with pytest.raises(ValueError, match='simulation_engine'):
    engines.check_engine('fast', algorithms.AlgorithmSpec(name='fedavg'))
  with pytest.raises(ValueError, match='supports'):
    engines.check_engine('batched', algorithms.AlgorithmSpec(name='afl'))
  with pytest.raises(ValueError, match='tilt'):
    batched.BatchedAlgorithm('term', sgd(), tilt=float('inf')).validate()
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
        batched.BatchedAlgorithm('fedavg', sgd()),
    )


@pytest.mark.parametrize(
    'args',
    [['--algorithm=afl'], ['--algorithm=fedavg', '--workers=127.0.0.1:1']],
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
