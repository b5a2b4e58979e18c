"""Federated TERM: NumPy oracle, t = 0 equals FedAvg, tilting directions."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import synthetic
from tests import oracles
from tff_algos import composition
from tff_algos import fed_avg
from tff_algos import term

LR = 0.1
BATCH = 5


@pytest.fixture(scope='module')
def clients():
  rng = np.random.default_rng(5)
  out = []
  for n in (13, 17, 9, 23):
    x = rng.normal(size=(n, 60)).astype(np.float32)
    y = rng.integers(0, 10, n).astype(np.int32)
    out.append((x, y))
  return out


def datasets(round_clients, epochs=1):
  return [
      tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat(epochs)
      for x, y in round_clients
  ]


def sgd():
  return tff.learning.optimizers.build_sgdm(learning_rate=LR)


def term_oracle(rounds, tilt, epochs, mu=0.0):
  """NumPy TERM: local models averaged with tilted weights; returns (w, b)."""
  w, b = np.zeros((60, 10)), np.zeros(10)
  for round_clients in rounds:
    losses = [
        oracles.softmax_regression_loss(w, b, x, y) for x, y in round_clients
    ]
    weights = oracles.tilted_weights(
        losses, [len(y) for _, y in round_clients], tilt
    )
    models = [
        oracles.proximal_local_sgd(
            w, b, x, y, lr=LR, mu=mu, batch_size=BATCH, epochs=epochs
        )
        for x, y in round_clients
    ]
    w = sum(a * m[0] for a, m in zip(weights, models))
    b = sum(a * m[1] for a, m in zip(weights, models))
  return w, b


@pytest.mark.parametrize('tilt', [-2.0, 0.0, 1.0, 50.0])
def test_term_matches_numpy_oracle_two_rounds(clients, tilt):
  rounds = [clients[:3], clients[1:]]
  process = term.build_term(
      synthetic.create_softmax_regression_model_fn(), sgd(), tilt=tilt
  )
  state = process.initialize()
  for round_clients in rounds:
    state = process.next(state, datasets(round_clients, 2)).state
  w, b = composition.model_weights_as_numpy(process, state)
  w_ref, b_ref = term_oracle(rounds, tilt, epochs=2)
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)


@pytest.mark.parametrize('tilt', [-2.0, 1.0])
def test_term_with_proximal_term_matches_numpy_oracle(clients, tilt):
  """FedProx's local solver (mu = 0.5) under the tilted weights."""
  rounds = [clients[:3], clients[1:]]
  process = term.build_term(
      synthetic.create_softmax_regression_model_fn(),
      sgd(),
      tilt=tilt,
      proximal_strength=0.5,
  )
  state = process.initialize()
  for round_clients in rounds:
    state = process.next(state, datasets(round_clients, 3)).state
  w, b = composition.model_weights_as_numpy(process, state)
  w_ref, b_ref = term_oracle(rounds, tilt, epochs=3, mu=0.5)
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)
  w_plain, _ = term_oracle(rounds, tilt, epochs=3)
  assert np.abs(w_plain - w_ref).max() > 1e-3  # The term is in effect.


def test_tilt_zero_equals_fedavg_and_stock(clients):
  model_fn = synthetic.create_softmax_regression_model_fn()
  procs = [
      term.build_term(model_fn, sgd(), tilt=0.0),
      fed_avg.build_fed_avg(model_fn, sgd()),
      tff.learning.algorithms.build_weighted_fed_avg(model_fn, sgd()),
  ]
  results = []
  for process in procs:
    state = process.initialize()
    for round_clients in (clients, clients[1:]):
      state = process.next(state, datasets(round_clients)).state
    results.append(composition.model_weights_as_numpy(process, state))
  for other in results[1:]:
    for a, b in zip(results[0], other):
      np.testing.assert_allclose(a, b, atol=1e-6)


def test_huge_tilt_is_stable(clients):
  process = term.build_term(
      synthetic.create_softmax_regression_model_fn(), sgd(), tilt=1e4
  )
  out = process.next(process.initialize(), datasets(clients))
  w, _ = composition.model_weights_as_numpy(process, out.state)
  assert np.all(np.isfinite(w))
  assert out.metrics['client_work']['max_loss_at_broadcast'] == pytest.approx(
      np.log(10), rel=1e-5
  )


def corrupted_population(seed=0):
  """Five clients on one linear concept, one with random labels."""
  rng = np.random.default_rng(seed)
  w_true = rng.normal(size=(60, 10))
  clients = []
  for k in range(6):
    x = rng.normal(size=(40, 60)).astype(np.float32)
    y = np.argmax(x @ w_true, axis=1).astype(np.int32)
    if k == 5:
      y = rng.integers(0, 10, 40).astype(np.int32)
    clients.append((x, y))
  return clients


def test_negative_tilt_suppresses_a_corrupted_client():
  clients = corrupted_population()
  model_fn = synthetic.create_softmax_regression_model_fn()
  clean_accuracy = {}
  corrupted_weight = {}
  for tilt in (0.0, -2.0):
    process = term.build_term(model_fn, sgd(), tilt=tilt)
    state = process.initialize()
    for _ in range(15):
      state = process.next(state, datasets(clients)).state
    w, b = composition.model_weights_as_numpy(process, state)
    clean_accuracy[tilt] = np.mean(
        [np.mean(np.argmax(x @ w + b, axis=1) == y) for x, y in clients[:5]]
    )
    losses = [oracles.softmax_regression_loss(w, b, x, y) for x, y in clients]
    corrupted_weight[tilt] = oracles.tilted_weights(losses, [40] * 6, tilt)[5]
  assert corrupted_weight[-2.0] < 0.5 * corrupted_weight[0.0]
  assert clean_accuracy[-2.0] > clean_accuracy[0.0]


@pytest.mark.parametrize(
    'kwargs, error',
    [
        (dict(tilt=float('nan')), ValueError),
        (dict(tilt='1'), TypeError),
        (dict(tilt=1.0, proximal_strength=-1.0), ValueError),
    ],
)
def test_validation(kwargs, error):
  with pytest.raises(error):
    term.build_term(
        synthetic.create_softmax_regression_model_fn(), sgd(), **kwargs
    )
