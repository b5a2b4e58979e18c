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
  return [
      tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat(epochs)
      for x, y in round_clients
  ]


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
      synthetic.create_softmax_regression_model_fn(),
      sgd(),
      q=q,
      lipschitz_constant=1.0 / LR,
  )
  w, b = run(process, rounds, epochs=2)
  w_ref, b_ref = oracles.q_ffl_rounds(
      *zeros(),
      rounds,
      q=q,
      lipschitz=1.0 / LR,
      lr=LR,
      batch_size=BATCH,
      epochs=2,
  )
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)
  assert np.abs(w).max() > 1e-3


@pytest.mark.parametrize('q', [0.0, 1.0, 2.0])
def test_q_fedsgd_matches_numpy_oracle_two_rounds(clients, q):
  rounds = [clients, clients[::-1][:2]]
  process = q_ffl.build_q_fedsgd(
      synthetic.create_softmax_regression_model_fn(),
      q=q,
      lipschitz_constant=4.0,
  )
  w, b = run(process, rounds)
  w_ref, b_ref = oracles.q_ffl_rounds(*zeros(), rounds, q=q, lipschitz=4.0)
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)


def test_q_zero_is_fedavg_with_simple_average(clients):
  model_fn = synthetic.create_softmax_regression_model_fn()
  rounds = [clients[:3], clients[1:], clients]
  q0 = run(
      q_ffl.build_q_fedavg(model_fn, sgd(), q=0.0, lipschitz_constant=1.0 / LR),
      rounds,
      2,
  )
  avg = run(
      fed_avg.build_fed_avg(
          model_fn, sgd(), client_weighting=tff.learning.ClientWeighting.UNIFORM
      ),
      rounds,
      2,
  )
  stock = run(
      tff.learning.algorithms.build_unweighted_fed_avg(model_fn, sgd()),
      rounds,
      2,
  )
  for a, b, c in zip(q0, avg, stock):
    np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(a, c, atol=1e-6)


def test_q_zero_fedsgd_is_gradient_descent(clients):
  process = q_ffl.build_q_fedsgd(
      synthetic.create_softmax_regression_model_fn(),
      q=0.0,
      lipschitz_constant=2.0,
  )
  w, _ = run(process, [clients])
  grads = [oracles.softmax_regression_grads(*zeros(), x, y) for x, y in clients]
  np.testing.assert_allclose(
      w, -0.5 * np.mean([g[0] for g in grads], axis=0), atol=1e-6
  )


def test_larger_q_moves_towards_the_worse_client():
  """Two clients with conflicting labels: larger q favours the worse one."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(40, 60)).astype(np.float32)
  good = (x, np.zeros(40, np.int32))
  bad = (x[:10], np.ones(10, np.int32))
  model_fn = synthetic.create_softmax_regression_model_fn()
  gaps = {}
  for q in (0.0, 2.0):
    process = q_ffl.build_q_fedavg(
        model_fn, sgd(), q=q, lipschitz_constant=10.0
    )
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
      synthetic.create_softmax_regression_model_fn(),
      sgd(),
      q=0.5,
      lipschitz_constant=10.0,
  )
  # An empty client has loss 0: its message must be finite and zero.
  empty = tf.data.Dataset.from_tensor_slices((x[:0], y[:0])).batch(BATCH)
  full = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
  out = process.next(process.initialize(), [empty, full])
  w, b = composition.model_weights_as_numpy(process, out.state)
  assert np.all(np.isfinite(w)) and np.all(np.isfinite(b))
  ref = process.next(process.initialize(), [full])
  for a, c in zip(
      (w, b), composition.model_weights_as_numpy(process, ref.state)
  ):
    np.testing.assert_allclose(a, c, atol=1e-6)


def message_oracle(loss, dw, q, lipschitz, floor=1e-8):
  """(Delta_k, h_k) of the module docstring, F^(q-1) at max(F, floor)."""
  f_q = 1.0 if q == 0 else loss**q
  sq_norm = sum(np.sum(np.square(g, dtype=np.float64)) for g in dw)
  curvature = 0.0 if q == 0 else q * max(loss, floor) ** (q - 1) * sq_norm
  return [f_q * g for g in dw], curvature + lipschitz * f_q


@pytest.mark.parametrize(
    'loss, q',
    [
        (0.0, 0.5),
        (1e-12, 0.5),
        (1e-11, 0.25),
        (0.3, 0.5),
        (1e-12, 2.0),
        (2.0, 0.0),
        (1.7, 3.0),
        (1.3, 1.0),
    ],
)
def test_client_message_and_its_loss_floor(loss, q):
  rng = np.random.default_rng(4)
  dw = [
      rng.normal(size=(3, 2)).astype(np.float32),
      rng.normal(size=2).astype(np.float32),
  ]
  delta, h = q_ffl.q_ffl_client_message(
      tf.constant(loss, tf.float32),
      [tf.constant(g) for g in dw],
      q=q,
      lipschitz=10.0,
  )
  want_delta, want_h = message_oracle(np.float64(np.float32(loss)), dw, q, 10.0)
  assert float(h) == pytest.approx(want_h, rel=1e-5)
  for got, want in zip(delta, want_delta):
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-30)
  # Below the floor, F^(q-1) would be far larger (or inf at F = 0).
  if q and loss < 1e-8:
    with np.errstate(divide='ignore'):
      assert (np.float64(loss) ** (q - 1) > 10 * 1e-8 ** (q - 1)) == (q < 1)


def test_zero_loss_zero_update_message_is_zero_not_nan():
  """0 < q < 1, F = 0, dw = 0: without the floor h = q 0^(q-1) 0 = NaN."""
  delta, h = q_ffl.q_ffl_client_message(
      tf.constant(0.0), [tf.zeros([4])], q=0.5, lipschitz=10.0
  )
  assert float(h) == 0.0
  np.testing.assert_array_equal(delta[0].numpy(), np.zeros(4))


def test_server_update_divides_by_the_sum_of_h():
  w = [tf.constant([1.0, -2.0]), tf.constant(3.0)]
  d = [tf.constant([0.5, 0.25]), tf.constant(-1.0)]
  new = q_ffl.q_ffl_server_update(w, d, tf.constant(4.0))
  np.testing.assert_allclose(new[0].numpy(), [0.875, -2.0625])
  assert float(new[1]) == pytest.approx(3.25)
  small = q_ffl.q_ffl_server_update(w, d, tf.constant(0.5))  # 0 < h < 1.
  np.testing.assert_allclose(small[0].numpy(), [0.0, -2.5])
  same = q_ffl.q_ffl_server_update(w, d, tf.constant(0.0))
  np.testing.assert_array_equal(same[0].numpy(), [1.0, -2.0])
  assert float(same[1]) == 3.0


@pytest.mark.parametrize(
    'kwargs, error',
    [
        (dict(q=-1.0, lipschitz_constant=1.0), ValueError),
        (dict(q=1.0, lipschitz_constant=0.0), ValueError),
        (dict(q='1', lipschitz_constant=1.0), TypeError),
        (dict(q=float('inf'), lipschitz_constant=1.0), ValueError),
    ],
)
def test_validation(kwargs, error):
  with pytest.raises(error):
    q_ffl.build_q_fedavg(
        synthetic.create_softmax_regression_model_fn(), sgd(), **kwargs
    )
