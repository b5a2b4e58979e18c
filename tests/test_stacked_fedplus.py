"""The Fed+ family on the stacked engine equals it on the batched engine.

The batched engine runs Fed+'s own client work (`fed_plus.local_work`,
tested equal to the federated path in tests/test_batched.py); the stacked
engine computes the same kappa-mixed steps from each client's own model on
stacked weights and the same server aggregate. Both keep their own client
states; the global model, every client's local model, its evaluation and
the round metrics agree, for FedAvg+, FedGeoMed+ and FedCoMed+.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tasks import shakespeare_leaf
from tasks import synthetic
from tff_algos import batched
from tff_algos import fed_plus
from tff_algos import stacked
from tests import sqlite_fixtures
from tests import stateful_engine_runs

plans = stateful_engine_runs.plans
run_engine = stateful_engine_runs.run_engine
flat_metrics = stateful_engine_runs.flat_metrics
LR = 0.1
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# sigma 1 (kappa = 1/1.1), a small delta (so the prox terms are not zero)
# and lambda 0.3 (the start mixes the client's model and the broadcast one).
OPTIONS = dict(fedplus_sigma=1.0, fedplus_delta=0.01, fedplus_lambda=0.3)
PSI = {
    'fedavg_plus': 'avg',
    'fedgeomed_plus': 'geomed',
    'fedcomed_plus': 'comed',
}


@pytest.fixture(scope='module')
def task():
  # Unequal client sizes (partial last batches, clients padded to the
  # longest one's steps) and batch 5.
  return synthetic.create_task(
      num_clients=12, seed=1, batch_size=5, size_law='table_4_4'
  )


def build_process(task, name, lr=LR, **options):
  options = dict(OPTIONS, **options)
  return fed_plus.build_fed_plus(
      task.model_fn,
      psi=PSI[name],
      learning_rate=lr,
      sigma=options['fedplus_sigma'],
      delta=options['fedplus_delta'],
      lam=options['fedplus_lambda'],
  )


def algorithm(name, lr=LR, **options):
  return batched.BatchedAlgorithm.from_registry(
      name, client_learning_rate=lr, **dict(OPTIONS, **options)
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


def evaluations(task, process, run):
  """Each held client's evaluation of its own model on its test data.

  (On its training data where the test clients are others, as the
  Shakespeare preset's.)
  """
  state, held, _ = run
  ids = sorted(held)
  test_ids = set(task.test_data.client_ids)
  rows = process.evaluate_personal(
      state,
      [held[c] for c in ids],
      [task.eval_dataset(c, 'test' if c in test_ids else 'train') for c in ids],
  )
  return dict(zip(ids, rows))


def assert_same_runs(task, process, reference, run, *, atol=1e-6):
  """Global weights, every client's model, evaluation and metrics agree."""
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
  ref_eval = evaluations(task, process, reference)
  got_eval = evaluations(task, process, run)
  assert set(got_eval) == set(ref_eval)
  for cid, row in ref_eval.items():
    assert set(got_eval[cid]) == set(row) and 'accuracy' in row
    for key, value in row.items():
      np.testing.assert_allclose(
          got_eval[cid][key], value, rtol=1e-4, atol=1e-5, err_msg=cid
      )
  assert len(metrics) == len(ref_metrics)
  for ref_m, m in zip(ref_metrics, metrics):
    ref_flat, flat = flat_metrics(ref_m), flat_metrics(m)
    assert set(flat) == set(ref_flat)
    for key, value in ref_flat.items():
      np.testing.assert_allclose(
          flat[key], value, rtol=1e-5, atol=atol, err_msg=key
      )
  assert 'aggregator/non_finite_clients' in ref_flat
  assert 'aggregator/last_step_norm' in ref_flat


# Vectorized, the stacked engine's batched matmuls reduce in another order
# than the batched engine's one client at a time; the local models, never
# averaged, carry that rounding through their steps. A wrong anchor, start,
# per-client norm or shuffle order is 1e-3 apart or more.
@pytest.mark.parametrize(
    'name,vectorize,group_by_size,atol',
    [
        ('fedavg_plus', True, True, 3e-5),
        ('fedgeomed_plus', True, False, 3e-5),
        ('fedcomed_plus', True, True, 3e-5),
        ('fedgeomed_plus', False, False, 1e-6),
    ],
)
def test_equals_batched_engine(task, name, vectorize, group_by_size, atol):
  process = build_process(task, name)
  alg = algorithm(name)
  reference = run_engine(task, batched_engine(task, alg), process, 3)
  engine = stacked_engine(
      task, alg, vectorize=vectorize, group_by_size=group_by_size
  )
  run = run_engine(task, engine, process, 3)
  assert_same_runs(task, process, reference, run, atol=atol)
  state, held, metrics = run
  # The clients that came back trained from their own models: theirs differ
  # from the global one (theta_k != 0 where delta allows).
  global_w = state['global_model_weights'].trainable[0]
  own = held[sorted(task.train_data.client_ids)[3]]['personal'][0][0]
  assert np.abs(own - global_w).max() > 1e-2
  if name != 'fedavg_plus':  # The fixed-point iterations ran.
    assert flat_metrics(metrics[-1])['aggregator/last_step_norm'] > 0


def test_non_finite_local_models_are_kept_and_counted(task):
  # A step size that diverges (sigma 0: kappa 1, no pull back): every
  # client's new model is non-finite, keeps its previous one (the initial
  # model) and is counted; the aggregate is their median, the initial model.
  process = build_process(task, 'fedcomed_plus', lr=1e38, fedplus_sigma=0.0)
  alg = algorithm('fedcomed_plus', lr=1e38, fedplus_sigma=0.0)
  reference = run_engine(task, batched_engine(task, alg), process, 1)
  run = run_engine(task, stacked_engine(task, alg), process, 1)
  counts = [
      flat_metrics(r[2][0])['aggregator/non_finite_clients']
      for r in (reference, run)
  ]
  assert counts == [5, 5]
  initial = tf.nest.flatten(process.initial_client_state()['personal'])
  for client in run[1].values():
    for a, b in zip(initial, tf.nest.flatten(client['personal'])):
      np.testing.assert_array_equal(b, a)
  for a, b in zip(initial, run[0]['global_model_weights'].trainable):
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
  # The recurrent preset through the stacked engine's batched-matmul GRU;
  # FedGeoMed+'s prox norm over the client's whole (multi-tensor) model.
  lr = 0.5
  process = build_process(gru_task, 'fedgeomed_plus', lr=lr)
  alg = algorithm('fedgeomed_plus', lr=lr)
  engine = stacked_engine(gru_task, alg)
  assert engine.rnn_forward is not None and engine.vectorize
  reference = run_engine(gru_task, batched_engine(gru_task, alg), process, 3)
  run = run_engine(gru_task, engine, process, 3)
  assert_same_runs(gru_task, process, reference, run, atol=3e-5)


@pytest.mark.parametrize('name', sorted(PSI))
def test_local_steps_are_refused(task, name):
  alg = algorithm(name, fedplus_local_steps=3)
  with pytest.raises(
      stacked.StackedEngineError,
      match=f'fed_plus_{PSI[name]} with local_steps=3 runs on the batched '
      'engine',
  ):
    stacked_engine(task, alg)


def test_binary_refuses_local_steps_in_one_line(tmp_path):
  proc = subprocess.run(
      [
          sys.executable,
          '-m',
          'run.train',
          '--algorithm=fedavg_plus',
          '--fedplus_sigma=1',
          '--fedplus_local_steps=2',
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
      'train: error: --simulation_engine=stacked runs Fed+ local steps over '
      'one read of the stream; fed_plus_avg with local_steps=2 runs on '
      '--simulation_engine=batched'
  )
  assert not list(tmp_path.iterdir())
