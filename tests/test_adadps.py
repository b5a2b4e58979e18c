"""AdaDPS (Algorithms 8, 10) vs NumPy oracles; A = 1 is DP-SGD/DP-FedAvg."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from privacy import adadps
from privacy import dp_aggregation
from tasks import synthetic
from tests import oracles
from tff_algos import composition
from tff_algos import fed_avg

LR = 0.1
BATCH = 4


@pytest.fixture(scope='module')
def clients():
  rng = np.random.default_rng(7)
  return [
      (
          rng.normal(size=(n, 60)).astype(np.float32),
          rng.integers(0, 10, n).astype(np.int32),
      )
      for n in (9, 6, 11)
  ]


def datasets(cs):
  return [tf.data.Dataset.from_tensor_slices(c).batch(BATCH) for c in cs]


def clip(v, c):
  n = np.sqrt(sum(np.sum(x**2) for x in v))
  return [x * min(1.0, c / n) for x in v]


def adadps_fed_oracle(rounds, a_w, a_b, *, clip_norm, m):
  """Algorithm 10 without noise: preconditioned local SGD, clip, sum / m."""
  w, b = np.zeros((60, 10)), np.zeros(10)
  for cs in rounds:
    deltas = []
    for x, y in cs:
      wk, bk = w.copy(), b.copy()
      for xb, yb in oracles.batches(x, y, BATCH, 1):
        gw, gb = oracles.softmax_regression_grads(wk, bk, xb, yb)
        wk, bk = wk - LR * gw / a_w, bk - LR * gb / a_b
      deltas.append(clip([wk - w, bk - b], clip_norm))
    w = w + sum(d[0] for d in deltas) / m
    b = b + sum(d[1] for d in deltas) / m
  return w, b


def test_federated_matches_oracle_with_clipping(clients):
  rng = np.random.default_rng(1)
  a_w = rng.uniform(0.2, 2.0, size=(60, 10))
  a_b = rng.uniform(0.2, 2.0, size=10)
  rounds = [clients, clients[:2]]
  opts = dp_aggregation.DpOptions(noise_multiplier=0.0, clip=0.05)
  process = adadps.build_adadps_fed(
      synthetic.create_softmax_regression_model_fn(),
      [a_w, a_b],
      client_learning_rate=LR,
      clients_per_round=3,
      dp_options=opts,
  )
  state = process.initialize()
  for cs in rounds:
    state = process.next(state, datasets(cs)).state
  got = composition.model_weights_as_numpy(process, state)
  want = adadps_fed_oracle(rounds, a_w, a_b, clip_norm=0.05, m=3)
  # Clipping is in effect: the unclipped FedAvg would be far away.
  unclipped = adadps_fed_oracle(rounds, a_w, a_b, clip_norm=1e9, m=3)
  assert np.abs(unclipped[0] - want[0]).max() > 1e-3
  np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-6)


def test_side_information_of_ones_is_dp_fedavg(clients):
  model_fn = synthetic.create_softmax_regression_model_fn()
  opts = dp_aggregation.DpOptions(noise_multiplier=0.0, clip=0.05)
  ada = adadps.build_adadps_fed(
      model_fn,
      [np.ones((60, 10)), np.ones(10)],
      client_learning_rate=LR,
      clients_per_round=3,
      dp_options=opts,
  )
  dp_fedavg = fed_avg.build_fed_avg(
      model_fn,
      tff.learning.optimizers.build_sgdm(learning_rate=LR),
      client_weighting=tff.learning.ClientWeighting.UNIFORM,
      model_aggregator=dp_aggregation.build_dp_aggregator(
          opts, clients_per_round=3
      ),
  )
  sa, sb = ada.initialize(), dp_fedavg.initialize()
  for _ in range(2):
    sa = ada.next(sa, datasets(clients)).state
    sb = dp_fedavg.next(sb, datasets(clients)).state
  for x, y in zip(
      composition.model_weights_as_numpy(ada, sa),
      composition.model_weights_as_numpy(dp_fedavg, sb),
  ):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-8)


def test_side_information_validation():
  with pytest.raises(ValueError, match='> 0'):
    adadps.build_preconditioned_sgd(0.1, [np.array([1.0, 0.0])])
  opt = adadps.build_preconditioned_sgd(0.1, [np.ones(3)])
  with pytest.raises(ValueError, match='does not match'):
    opt.initialize([tf.TensorSpec([4], tf.float32)])
  with pytest.raises(ValueError, match='learning_rate'):
    adadps.build_preconditioned_sgd(-1.0, [np.ones(3)])


def linreg_grads(x, y):
  return lambda w, idx: (x[idx] @ w - y[idx])[:, None] * x[idx]


def test_centralized_matches_oracle_with_seeded_noise():
  rng = np.random.default_rng(2)
  n, d = 30, 5
  x = rng.normal(size=(n, d))
  y = rng.normal(size=n)
  a = rng.uniform(0.1, 1.0, size=d)
  c, sigma, b, lr = 0.5, 0.8, 6, 0.2
  got = adadps.run_centralized(
      linreg_grads(x, y),
      n,
      np.zeros(d),
      steps=4,
      batch_size=b,
      learning_rate=lr,
      clip=c,
      noise_multiplier=sigma,
      preconditioner=adadps.FixedPreconditioner(a),
      seed=9,
  )
  # Oracle: the same draws in the same order (Poisson batch, then noise).
  draws = np.random.default_rng(9)
  w = np.zeros(d)
  for _ in range(4):
    idx = np.flatnonzero(draws.random(n) < b / n)
    total = np.zeros(d)
    for i in idx:
      g = (x[i] @ w - y[i]) * x[i] / a
      total += g * min(1.0, c / np.linalg.norm(g))
    total += draws.normal(0.0, sigma * c, size=d)
    w = w - lr * total / b
  np.testing.assert_allclose(got, w, rtol=1e-12)


def test_centralized_public_rmsprop_preconditioner_and_non_private_mode():
  rng = np.random.default_rng(4)
  x = rng.normal(size=(20, 3))
  y = rng.normal(size=20)
  pub = lambda w: (x[:5] @ w - y[:5]) @ x[:5] / 5
  pre = adadps.PublicRmsPropPreconditioner(pub, beta=0.5, epsilon=0.1)
  got = adadps.run_centralized(
      linreg_grads(x, y),
      20,
      np.zeros(3),
      steps=3,
      batch_size=20,
      learning_rate=0.1,
      clip=1.0,
      noise_multiplier=0.0,
      preconditioner=pre,
      sampling='fixed',
      private=False,
  )
  w, v = np.zeros(3), np.zeros(3)
  for _ in range(3):
    v = 0.5 * v + 0.5 * pub(w) ** 2
    w = w - 0.1 * ((x @ w - y) @ x / 20) / (np.sqrt(v) + 0.1)
  np.testing.assert_allclose(got, w, rtol=1e-12)


def test_federated_noise_is_added_once_to_the_clipped_sum(clients):
  """Noise on: w1 - (clipped mean) ~ N(0, (z C / m)^2), isotropic.

  Central noise on the SUM (std z C / m on the mean), not per device
  (z C / sqrt(m)), and not in the A-scaled geometry: the residual has the
  same spread where A is small and where it is large.
  """
  rng = np.random.default_rng(3)
  a_w = rng.uniform(0.2, 2.0, size=(60, 10))
  a_b = rng.uniform(0.2, 2.0, size=10)
  z, c, m = 2.0, 0.05, 3
  process = adadps.build_adadps_fed(
      synthetic.create_softmax_regression_model_fn(),
      [a_w, a_b],
      client_learning_rate=LR,
      clients_per_round=m,
      dp_options=dp_aggregation.DpOptions(noise_multiplier=z, clip=c),
  )
  state = process.initialize()
  want_w, want_b = adadps_fed_oracle([clients], a_w, a_b, clip_norm=c, m=m)
  res_w, res_b = [], []
  for _ in range(6):  # Fresh noise each call, from the same state.
    got_w, got_b = composition.model_weights_as_numpy(
        process, process.next(state, datasets(clients)).state
    )
    res_w.append(got_w - want_w)
    res_b.append(got_b - want_b)
  res_w, res_b = np.stack(res_w), np.stack(res_b)
  residual = np.concatenate([res_w.ravel(), res_b.ravel()])
  std = z * c / m
  # 3660 draws: the std is within 5% (4 sigma), the mean within 4 sigma.
  assert np.std(residual) == pytest.approx(std, rel=0.05)
  assert abs(np.mean(residual)) < 4 * std / np.sqrt(residual.size)
  small, large = res_w[:, a_w < 0.7], res_w[:, a_w > 1.5]
  assert np.std(small) == pytest.approx(std, rel=0.1)
  assert np.std(large) == pytest.approx(std, rel=0.1)
