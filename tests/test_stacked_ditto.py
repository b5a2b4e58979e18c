"""Ditto on the stacked engine equals Ditto on the batched engine.

The batched engine runs Ditto's own client work (`ditto.local_work`, tested
equal to the federated path in tests/test_batched.py); the stacked engine
computes the same passes on stacked weights. Both keep their own client
states; the global model, every personal model and the round metrics agree.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import shakespeare_leaf
from tasks import synthetic
from tff_algos import batched
from tff_algos import ditto
from tff_algos import stacked
from tests import sqlite_fixtures
from tests import stateful_engine_runs

plans = stateful_engine_runs.plans
run_engine = stateful_engine_runs.run_engine
flat_metrics = stateful_engine_runs.flat_metrics
LR = 0.1
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def task():
  # Unequal client sizes (partial last batches, clients padded to the
  # longest one's steps) and batch 5.
  return synthetic.create_task(
      num_clients=12, seed=1, batch_size=5, size_law='table_4_4'
  )


def sgd(lr=LR, momentum=None):
  return tff.learning.optimizers.build_sgdm(learning_rate=lr, momentum=momentum)


def algorithm(**options):
  return batched.BatchedAlgorithm.from_registry(
      'ditto', client_learning_rate=LR, **options
  )


def batched_engine(task, alg):
  return batched.BatchedEngine(
      task.model_fn,
      task.preprocess_train,
      batched.ClientArrays(task.train_data),
      alg,
  )


def stacked_engine(task, alg, **kwargs):
  return stacked.StackedEngine(
      task.model_fn, task.preprocess_train, task.train_data, alg, **kwargs
  )


def assert_same_runs(reference, run, *, atol=1e-6):
  """Global weights, every client's personal models and metrics agree."""
  (ref_state, ref_held, ref_metrics), (state, held, metrics) = reference, run
  ref_w = ref_state['global_model_weights'].trainable
  for a, b in zip(ref_w, state['global_model_weights'].trainable):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=atol)
  assert max(np.abs(np.asarray(a)).max() for a in ref_w) > 1e-2
  assert set(held) == set(ref_held)
  for cid, ref_client in ref_held.items():
    for a, b in zip(
        tf.nest.flatten(ref_client['personal']),
        tf.nest.flatten(held[cid]['personal']),
    ):
      np.testing.assert_allclose(b, a, rtol=1e-5, atol=atol, err_msg=cid)
  assert len(metrics) == len(ref_metrics)
  for ref_m, m in zip(ref_metrics, metrics):
    ref_flat, flat = flat_metrics(ref_m), flat_metrics(m)
    assert set(flat) == set(ref_flat)
    for key, value in ref_flat.items():
      np.testing.assert_allclose(flat[key], value, rtol=1e-5, err_msg=key)
  assert 'client_work/personal_non_finite' in ref_flat


@pytest.fixture(scope='module')
def grid_process(task):
  return ditto.build_ditto(task.model_fn, sgd(), lam=[0.1, 1.0])


@pytest.fixture(scope='module')
def grid_reference(task, grid_process):
  alg = algorithm(ditto_lambda_grid=(0.1, 1.0))
  return run_engine(task, batched_engine(task, alg), grid_process, 3)


# Sequential, the stacked engine runs the batched engine's arithmetic (equal
# to ~1e-8 here). Vectorized, its batched matmuls reduce in another order:
# 1.5e-7 apart after one round, and the personal models, which are never
# averaged, carry that rounding through their passes (8e-6 after 3 rounds,
# measured); a wrong anchor or shuffle order is 1e-3 apart or more.
@pytest.mark.parametrize(
    'vectorize,group_by_size,atol', [(True, True, 3e-5), (False, False, 1e-6)]
)
def test_lambda_grid_equals_batched_engine(
    task, grid_process, grid_reference, vectorize, group_by_size, atol
):
  # Two personal models per client: the passes read the stream again, in
  # order (global, lambda 0.1, lambda 1.0), each a new shuffle order.
  alg = algorithm(ditto_lambda_grid=(0.1, 1.0))
  engine = stacked_engine(
      task, alg, vectorize=vectorize, group_by_size=group_by_size
  )
  run = run_engine(task, engine, grid_process, 3)
  if group_by_size:  # Size groups ran: fewer padded slots than one group.
    plan = list(plans(task, 3))[-1]
    sizes = [len(engine.examples.get(c)[1]) for c in plan.client_ids]
    _, steps = stacked.stream_layout(
        sizes, plan.epochs, plan.max_batches, 5, shuffle=True
    )
    assert engine.last_padding[1] < len(sizes) * steps.max() * 5
  assert_same_runs(grid_reference, run, atol=atol)
  # The two personal models moved away from each other.
  _, held, _ = run
  personal = next(iter(held.values()))['personal']
  assert np.abs(personal[0][0] - personal[1][0]).max() > 1e-3


def test_momentum_and_personal_learning_rate_equal_batched_engine(task):
  # One lambda, a client optimizer with momentum and a personal learning
  # rate of its own (a fresh optimizer state each pass); vectorized, one
  # group.
  client = sgd(0.05, momentum=0.5)
  process = ditto.build_ditto(
      task.model_fn, client, lam=0.5, personal_optimizer_fn=sgd(0.2)
  )
  alg = batched.BatchedAlgorithm.from_registry(
      'ditto',
      client_learning_rate=0.05,
      client_optimizer=client,
      ditto_lambda=0.5,
      ditto_personal_lr=0.2,
  )
  reference = run_engine(task, batched_engine(task, alg), process, 2)
  run = run_engine(task, stacked_engine(task, alg), process, 2)
  assert_same_runs(reference, run, atol=3e-5)


def test_non_finite_personal_models_are_kept_and_counted(task):
  # A personal learning rate that diverges: every personal pass turns
  # non-finite, keeps the previous model and is counted.
  process = ditto.build_ditto(
      task.model_fn, sgd(), lam=0.1, personal_optimizer_fn=sgd(1e30)
  )
  alg = algorithm(ditto_lambda=0.1, ditto_personal_lr=1e30)
  reference = run_engine(task, batched_engine(task, alg), process, 1)
  run = run_engine(task, stacked_engine(task, alg), process, 1)
  assert_same_runs(reference, run)
  assert flat_metrics(run[2][0])['client_work/personal_non_finite'] == 5
  initial = tf.nest.flatten(process.initial_client_state()['personal'])
  for client in run[1].values():
    for a, b in zip(initial, tf.nest.flatten(client['personal'])):
      np.testing.assert_array_equal(b, a)


@pytest.fixture(scope='module')
def gru_task(tmp_path_factory):
  """The Shakespeare deltafl preset's GRU (6 units) on 6 small roles."""
  directory = sqlite_fixtures.write_small_roles(
      str(tmp_path_factory.mktemp('shakespeare'))
  )
  return shakespeare_leaf.create_task(
      preset='deltafl',
      data_dir=directory,
      batch_size=4,
      rnn_units=6,
      max_examples_per_client=30,
  )


def test_gru_equals_batched_engine(gru_task):
  # The recurrent preset through the stacked engine's batched-matmul GRU:
  # personal passes too.
  lr = 0.5
  process = ditto.build_ditto(gru_task.model_fn, sgd(lr), lam=0.3)
  alg = batched.BatchedAlgorithm.from_registry(
      'ditto', client_learning_rate=lr, ditto_lambda=0.3
  )
  engine = stacked_engine(gru_task, alg)
  assert engine.rnn_forward is not None and engine.vectorize
  reference = run_engine(gru_task, batched_engine(gru_task, alg), process, 2)
  run = run_engine(gru_task, engine, process, 2)
  assert_same_runs(reference, run, atol=3e-5)


def test_personal_steps_are_refused(task):
  alg = algorithm(ditto_lambda=0.1, ditto_personal_steps=3)
  with pytest.raises(
      stacked.StackedEngineError,
      match='ditto with personal_steps=3 runs on the batched engine',
  ):
    stacked_engine(task, alg)


def test_binary_refuses_personal_steps_in_one_line(tmp_path):
  proc = subprocess.run(
      [
          sys.executable,
          '-m',
          'run.train',
          '--algorithm=ditto',
          '--ditto_lambda=0.1',
          '--ditto_personal_steps=2',
          '--simulation_engine=stacked',
          f'--root_output_dir={tmp_path}',
          '--progress=false',
      ],
      cwd=ROOT,
      check=False,
      capture_output=True,
      text=True,
      timeout=300,
      start_new_session=True,
  )
  assert proc.returncode == 2
  assert 'Traceback' not in proc.stderr
  last = proc.stderr.strip().splitlines()[-1]
  assert last == (
      'train: error: --simulation_engine=stacked runs personal passes of '
      'one read of the stream each; ditto with personal_steps=2 runs on '
      '--simulation_engine=batched'
  )
  assert not list(tmp_path.iterdir())
