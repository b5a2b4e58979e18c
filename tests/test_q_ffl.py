"""q-FFL (q-FedAvg, q-FedSGD): NumPy oracle, q = 0 equals FedAvg, safeguards."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import synthetic
from tests import oracles
from tff_algos import composition
from tff_algos import fed_avg
from tff_algos import q_ffl

LR = 0.1
BATCH = 5


@pytest.fixture(scope='module')
def clients():
  rng = np.random.default_rng(11)
  out = []
  for n in (13, 17, 9, 23):
    x = rng.normal(size=(n, 60)).astype(np.float32)
    y = rng.integers(0, 10, n).astype(np.int32)
    out.append((x, y))
  return out


def datasets(round_clients, epochs):
  return [tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat(epochs)
          for x, y in round_clients]


def run(process, rounds, epochs=1):
  state = process.initialize()
  for round_clients in rounds:
    state = process.next(state, datasets(round_clients, epochs)).state
  return composition.model_weights_as_numpy(process, state)


def zeros():
  return np.zeros((60, 10)), np.zeros(10)


def sgd():
  return tff.learning.optimizers.build_sgdm(learning_rate=LR)


@pytest.mark.parametrize('q', [0.0, 0.5, 1.0, 5.0])
def test_q_fedavg_matches_numpy_oracle_two_rounds(clients, q):
  rounds = [clients[:3], clients[1:]]
  process = q_ffl.build_q_fedavg(
      synthetic.create_softmax_regression_model_fn(), sgd(), q=q,
      lipschitz_constant=1.0 / LR)
  w, b = run(process, rounds, epochs=2)
  w_ref, b_ref = oracles.q_ffl_rounds(
      *zeros(), rounds, q=q, lipschitz=1.0 / LR, lr=LR, batch_size=BATCH,
      epochs=2)
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)
  assert np.abs(w).max() > 1e-3


@pytest.mark.parametrize('q', [0.0, 1.0, 2.0])
def test_q_fedsgd_matches_numpy_oracle_two_rounds(clients, q):
  rounds = [clients, clients[::-1][:2]]
  process = q_ffl.build_q_fedsgd(
      synthetic.create_softmax_regression_model_fn(), q=q,
      lipschitz_constant=4.0)
  w, b = run(process, rounds)
  w_ref, b_ref = oracles.q_ffl_rounds(*zeros(), rounds, q=q, lipschitz=4.0)
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)


def test_q_zero_is_fedavg_with_simple_average(clients):
  model_fn = synthetic.create_softmax_regression_model_fn()
  rounds = [clients[:3], clients[1:], clients]
  q0 = run(q_ffl.build_q_fedavg(model_fn, sgd(), q=0.0,
                                lipschitz_constant=1.0 / LR), rounds, 2)
  avg = run(fed_avg.build_fed_avg(
      model_fn, sgd(), client_weighting=tff.learning.ClientWeighting.UNIFORM),
            rounds, 2)
  stock = run(tff.learning.algorithms.build_unweighted_fed_avg(model_fn, sgd()),
              rounds, 2)
  for a, b, c in zip(q0, avg, stock):
    np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(a, c, atol=1e-6)


def test_q_zero_fedsgd_is_gradient_descent(clients):
  process = q_ffl.build_q_fedsgd(
      synthetic.create_softmax_regression_model_fn(), q=0.0,
      lipschitz_constant=2.0)
  w, b = run(process, [clients])
  grads = [oracles.softmax_regression_grads(*zeros(), x, y) for x, y in clients]
  np.testing.assert_allclose(w, -0.5 * np.mean([g[0] for g in grads], axis=0),
                             atol=1e-6)


def test_larger_q_moves_towards_the_worse_client():
  """Two clients with conflicting labels: larger q favours the worse one."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(40, 60)).astype(np.float32)
  good = (x, np.zeros(40, np.int32))
  bad = (x[:10], np.ones(10, np.int32))
  model_fn = synthetic.create_softmax_regression_model_fn()
  gaps = {}
  for q in (0.0, 2.0):
    process = q_ffl.build_q_fedavg(model_fn, sgd(), q=q, lipschitz_constant=10.)
    state = process.initialize()
    for _ in range(30):
      state = process.next(state, datasets([good, bad], 1)).state
    w, b = composition.model_weights_as_numpy(process, state)
    losses = [oracles.softmax_regression_loss(w, b, *c) for c in (good, bad)]
    gaps[q] = max(losses) - min(losses)
  assert gaps[2.0] < gaps[0.0]


def test_zero_loss_client_with_small_q_is_finite(clients):
  x, y = clients[0]
  process = q_ffl.build_q_fedavg(
      synthetic.create_softmax_regression_model_fn(), sgd(), q=0.5,
      lipschitz_constant=10.0)
  # An empty client has loss 0: its message must be finite and zero.
  empty = tf.data.Dataset.from_tensor_slices((x[:0], y[:0])).batch(BATCH)
  full = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
  out = process.next(process.initialize(), [empty, full])
  w, b = composition.model_weights_as_numpy(process, out.state)
  assert np.all(np.isfinite(w)) and np.all(np.isfinite(b))
  ref = process.next(process.initialize(), [full])
  for a, c in zip((w, b), composition.model_weights_as_numpy(process, ref.state)):
    np.testing.assert_allclose(a, c, atol=1e-6)


@pytest.mark.parametrize('kwargs, error', [
    (dict(q=-1.0, lipschitz_constant=1.0), ValueError),
    (dict(q=1.0, lipschitz_constant=0.0), ValueError),
    (dict(q='1', lipschitz_constant=1.0), TypeError),
    (dict(q=float('inf'), lipschitz_constant=1.0), ValueError),
])
def test_validation(kwargs, error):
  with pytest.raises(error):
    q_ffl.build_q_fedavg(synthetic.create_softmax_regression_model_fn(), sgd(),
                         **kwargs)
