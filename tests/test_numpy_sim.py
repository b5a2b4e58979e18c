"""run.numpy_sim: its padded, batched local SGD and server steps against the
independent oracles of tests/oracles.py."""

import numpy as np
import pytest

from run import numpy_sim
from tests import oracles


def random_clients(sizes, seed=0):
  rng = np.random.default_rng(seed)
  return [(rng.normal(size=(n, 6)), rng.integers(0, 4, n)) for n in sizes]


@pytest.mark.parametrize('q', [0.0, 0.5, 2.0])
def test_q_fedavg_matches_oracle_two_rounds(q):
  setting = numpy_sim.Setting(
      algorithm='qffl', q=q, learning_rate=0.1, batch_size=3
  )
  rounds = [random_clients((7, 3, 11)), random_clients((5, 9), seed=1)]
  rng = np.random.default_rng(2)
  w0, b0 = 0.1 * rng.normal(size=(6, 4)), 0.1 * rng.normal(size=4)
  w, b = w0, b0
  for clients in rounds:
    losses = np.array([numpy_sim.client_loss(w, b, x, y) for x, y in clients])
    ww, bb = numpy_sim.local_sgd(w, b, clients, learning_rate=0.1, batch_size=3)
    w, b = numpy_sim.aggregate(
        setting, w, b, losses, np.array([len(y) for _, y in clients]), ww, bb
    )
  w_ref, b_ref = oracles.q_ffl_rounds(
      w0, b0, rounds, q=q, lipschitz=10.0, lr=0.1, batch_size=3
  )
  np.testing.assert_allclose(w, w_ref, rtol=1e-9, atol=1e-12)
  np.testing.assert_allclose(b, b_ref, rtol=1e-9, atol=1e-12)


def test_term_matches_tilted_weights_of_local_models():
  setting = numpy_sim.Setting(algorithm='term', tilt=1.5, batch_size=4)
  clients = random_clients((9, 4, 13))
  w, b = np.zeros((6, 4)), np.zeros(4) + 0.2
  losses = np.array([numpy_sim.client_loss(w, b, x, y) for x, y in clients])
  sizes = np.array([len(y) for _, y in clients], np.float64)
  ww, bb = numpy_sim.local_sgd(w, b, clients, learning_rate=0.05, batch_size=4)
  w_new, b_new = numpy_sim.aggregate(setting, w, b, losses, sizes, ww, bb)
  weights = oracles.tilted_weights(losses, sizes, 1.5)
  models = [
      oracles.proximal_local_sgd(
          w, b, x, y, lr=0.05, mu=0.0, batch_size=4, epochs=1
      )
      for x, y in clients
  ]
  np.testing.assert_allclose(
      w_new, sum(a * m[0] for a, m in zip(weights, models)), atol=1e-12
  )
  np.testing.assert_allclose(
      b_new, sum(a * m[1] for a, m in zip(weights, models)), atol=1e-12
  )


def test_bad_setting_is_refused():
  with pytest.raises(ValueError, match='unknown algorithm'):
    numpy_sim.Setting(algorithm='fedsgd').validate()
  with pytest.raises(ValueError, match='clients_per_round'):
    numpy_sim.Setting(num_clients=5, clients_per_round=6).validate()
