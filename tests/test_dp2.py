"""DP^2: the server optimizer and centralized Algorithm 11 against oracles."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from privacy import adadps
from privacy import dp2
from privacy import dp_aggregation
from tasks import synthetic
from tests import oracles
from tff_algos import composition
from tff_algos import fed_avg


def dp2_oracle(w, grads, *, lr, lr_rms, s1, s2, beta, eps):
  """Algorithm 11's update on given (already private) gradients, NumPy."""
  w = [np.array(x, np.float64) for x in w]
  acc = [np.zeros_like(x) for x in w]
  v = [np.zeros_like(x) for x in w]
  for t, g in enumerate(grads):
    phase = t % (s1 + s2)
    for j, w_j in enumerate(w):
      if phase == 0:
        acc[j] = np.zeros_like(w_j)
      if phase == s1 and s2 > 0:
        v[j] = beta * v[j] + (1 - beta) * (acc[j] / s1) ** 2
        acc[j] = np.zeros_like(w_j)
      if phase < s1:
        step = g[j]
        w[j] = w_j - lr * step
      else:
        step = g[j] / (np.sqrt(v[j]) + eps)
        w[j] = w_j - lr_rms * step
      acc[j] = acc[j] + step
  return w


@pytest.mark.parametrize('s1,s2', [(2, 3), (1, 1), (3, 0)])
def test_optimizer_matches_oracle(s1, s2):
  rng = np.random.default_rng(0)
  w0 = [
      rng.normal(size=(4, 3)).astype(np.float32),
      rng.normal(size=3).astype(np.float32),
  ]
  grads = [
      [
          rng.normal(size=(4, 3)).astype(np.float32),
          rng.normal(size=3).astype(np.float32),
      ]
      for _ in range(11)
  ]
  opt = dp2.build_dp2(
      0.5, 0.05, sgd_steps=s1, rmsprop_steps=s2, beta=0.8, epsilon=1e-2
  )
  state = opt.initialize([tf.TensorSpec(x.shape, tf.float32) for x in w0])
  w = [tf.constant(x) for x in w0]
  for g in grads:
    state, w = opt.next(state, w, [tf.constant(x) for x in g])
  want = dp2_oracle(
      w0, grads, lr=0.5, lr_rms=0.05, s1=s1, s2=s2, beta=0.8, eps=1e-2
  )
  for got, exp in zip(w, want):
    np.testing.assert_allclose(got.numpy(), exp, rtol=2e-5, atol=2e-5)
  assert int(state['step']) == 11


def test_no_rmsprop_steps_is_sgd():
  w0 = [np.ones(5, np.float32)]
  g = [np.arange(5, dtype=np.float32)]
  opt = dp2.build_dp2(0.3, 7.0, sgd_steps=2, rmsprop_steps=0)
  sgd = tff.learning.optimizers.build_sgdm(learning_rate=0.3)
  specs = [tf.TensorSpec([5], tf.float32)]
  s_a, s_b = opt.initialize(specs), sgd.initialize(specs)
  wa = wb = [tf.constant(w0[0])]
  for _ in range(5):
    s_a, wa = opt.next(s_a, wa, [tf.constant(g[0])])
    s_b, wb = sgd.next(s_b, wb, [tf.constant(g[0])])
  np.testing.assert_allclose(wa[0].numpy(), wb[0].numpy(), rtol=1e-6)
  np.testing.assert_allclose(wa[0].numpy(), 1 - 1.5 * np.arange(5), rtol=1e-6)


def test_builder_validation():
  with pytest.raises(ValueError, match='sgd_steps'):
    dp2.build_dp2(1.0, 0.1, sgd_steps=0, rmsprop_steps=1)
  with pytest.raises(ValueError, match='beta'):
    dp2.build_dp2(1.0, 0.1, sgd_steps=1, rmsprop_steps=1, beta=1.0)
  with pytest.raises(ValueError, match='learning_rate'):
    dp2.build_dp2(0.0, 0.1, sgd_steps=1, rmsprop_steps=1)
  with pytest.raises(TypeError):
    dp2.build_dp2(1.0, '0.1', sgd_steps=1, rmsprop_steps=1)


def test_federated_dp2_matches_oracle_two_cycles():
  """DP-FedAvg (zero noise, no clipping in effect) with the DP^2 server."""
  rng = np.random.default_rng(3)
  clients = []
  for n in (7, 9, 5):
    clients.append(
        (
            rng.normal(size=(n, 60)).astype(np.float32),
            rng.integers(0, 10, n).astype(np.int32),
        )
    )
  model_fn = synthetic.create_softmax_regression_model_fn()
  opts = dp_aggregation.DpOptions(noise_multiplier=0.0, clip=1e6)
  process = fed_avg.build_fed_avg(
      model_fn,
      tff.learning.optimizers.build_sgdm(learning_rate=0.1),
      dp2.build_dp2(
          1.0, 0.02, sgd_steps=1, rmsprop_steps=1, beta=0.5, epsilon=1e-3
      ),
      client_weighting=tff.learning.ClientWeighting.UNIFORM,
      model_aggregator=dp_aggregation.build_dp_aggregator(
          opts, clients_per_round=3
      ),
  )
  state = process.initialize()
  data = [tf.data.Dataset.from_tensor_slices(c).batch(4) for c in clients]
  for _ in range(4):
    state = process.next(state, data).state
  got = composition.model_weights_as_numpy(process, state)
  # Oracle: the mean delta (w_t - w_k) plays the gradient of Algorithm 11.
  w, b = np.zeros((60, 10)), np.zeros(10)
  acc = [np.zeros_like(w), np.zeros_like(b)]
  v = [np.zeros_like(w), np.zeros_like(b)]
  for t in range(4):
    models = [
        oracles.proximal_local_sgd(
            w, b, x, y, lr=0.1, mu=0.0, batch_size=4, epochs=1
        )
        for x, y in clients
    ]
    delta = [
        w - np.mean([m[0] for m in models], axis=0),
        b - np.mean([m[1] for m in models], axis=0),
    ]
    if t % 2 == 0:
      acc = [np.zeros_like(w), np.zeros_like(b)]
      step, lr = delta, 1.0
    else:
      v = [0.5 * vj + 0.5 * aj**2 for vj, aj in zip(v, acc)]
      acc = [np.zeros_like(w), np.zeros_like(b)]
      step, lr = [d / (np.sqrt(vj) + 1e-3) for d, vj in zip(delta, v)], 0.02
    acc = [a + s for a, s in zip(acc, step)]
    w, b = w - lr * step[0], b - lr * step[1]
  np.testing.assert_allclose(got[0], w, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(got[1], b, rtol=1e-4, atol=1e-5)


def quadratic_grads(centers):
  """Per-example gradients of 0.5 ||w - c_i||^2."""
  return lambda w, idx: w[None, :] - centers[idx]


def test_centralized_matches_hand_oracle_without_noise():
  centers = np.array([[1.0, -2.0, 0.5], [3.0, 0.0, -0.5]])
  out = dp2.run_centralized(
      quadratic_grads(centers),
      2,
      np.zeros(3),
      steps=5,
      batch_size=2,
      learning_rate=0.5,
      rmsprop_learning_rate=0.1,
      clip=1e6,
      noise_multiplier=0.0,
      sgd_steps=2,
      rmsprop_steps=1,
      beta=0.5,
      epsilon=1e-2,
      sampling='fixed',
  )
  c = centers.mean(axis=0)
  w, acc, v = np.zeros(3), np.zeros(3), np.zeros(3)
  for t in range(5):
    phase = t % 3
    if phase == 0:
      acc = np.zeros(3)
    if phase == 2:
      v = 0.5 * v + 0.5 * (acc / 2) ** 2
      acc = np.zeros(3)
    g = (w - c) if phase < 2 else (w - c) / (np.sqrt(v) + 1e-2)
    acc += g
    w = w - (0.5 if phase < 2 else 0.1) * g
  np.testing.assert_allclose(out, w, rtol=1e-12)


def test_centralized_without_rmsprop_steps_is_dp_sgd_with_the_same_noise():
  rng = np.random.default_rng(1)
  centers = rng.normal(size=(50, 4))
  kwargs = dict(
      steps=6,
      batch_size=10,
      learning_rate=0.3,
      clip=0.7,
      noise_multiplier=1.2,
      seed=11,
  )
  a = dp2.run_centralized(
      quadratic_grads(centers),
      50,
      np.zeros(4),
      rmsprop_learning_rate=9.0,
      sgd_steps=3,
      rmsprop_steps=0,
      **kwargs,
  )
  b = adadps.run_centralized(
      quadratic_grads(centers), 50, np.zeros(4), **kwargs
  )
  np.testing.assert_allclose(a, b, rtol=1e-12)


def dp2_noisy_oracle(
    centers,
    *,
    steps,
    b,
    lr,
    lr_rms,
    clip,
    rms_clip,
    sigma,
    s1,
    s2,
    beta,
    eps,
    seed,
):
  """Algorithm 11 with Poisson sampling, clipping and noise, plain NumPy.

  The draws are those documented for `run_centralized`: per step, one
  uniform per example (kept if < b / n), then the d noise normals.
  """
  n, d = centers.shape
  rng = np.random.default_rng(seed)
  w, acc, v = np.zeros(d), np.zeros(d), np.zeros(d)
  for t in range(steps):
    phase = t % (s1 + s2)
    if phase == 0:
      acc = np.zeros(d)
    if phase == s1:
      v = beta * v + (1 - beta) * (acc / s1) ** 2
      acc = np.zeros(d)
    sgd = phase < s1
    c = clip if sgd else rms_clip
    total = np.zeros(d)
    for i in np.flatnonzero(rng.random(n) < b / n):
      g = w - centers[i]
      if not sgd:
        g = g / (np.sqrt(v) + eps)
      norm = np.sqrt(np.sum(g**2))
      total += g * min(1.0, c / norm)
    g_tilde = (total + rng.normal(0.0, sigma * c, size=d)) / b
    acc = acc + g_tilde
    w = w - (lr if sgd else lr_rms) * g_tilde
  return w


def test_centralized_with_noise_and_both_clips_matches_numpy_oracle():
  rng = np.random.default_rng(5)
  centers = rng.normal(size=(40, 4)) * 3.0
  kwargs = dict(
      steps=9,
      b=8,
      lr=0.4,
      lr_rms=0.05,
      clip=0.6,
      rms_clip=2.5,
      sigma=0.9,
      s1=2,
      s2=2,
      beta=0.6,
      eps=1e-2,
      seed=13,
  )

  def ours(**overrides):
    k = dict(kwargs, **overrides)
    return dp2.run_centralized(
        quadratic_grads(centers),
        40,
        np.zeros(4),
        steps=k['steps'],
        batch_size=k['b'],
        learning_rate=k['lr'],
        rmsprop_learning_rate=k['lr_rms'],
        clip=k['clip'],
        rmsprop_clip=k['rms_clip'],
        noise_multiplier=k['sigma'],
        sgd_steps=k['s1'],
        rmsprop_steps=k['s2'],
        beta=k['beta'],
        epsilon=k['eps'],
        seed=k['seed'],
    )

  got = ours()
  np.testing.assert_allclose(
      got, dp2_noisy_oracle(centers, **kwargs), rtol=1e-10, atol=1e-12
  )
  # Each part is in effect: without it the oracle lands elsewhere.
  for change in (
      dict(sigma=0.0),
      dict(rms_clip=0.6),
      dict(clip=1e6),
      dict(rms_clip=1e6),
      dict(eps=1.0),
  ):
    other = dp2_noisy_oracle(centers, **dict(kwargs, **change))
    assert np.abs(other - got).max() > 1e-3, change
    np.testing.assert_allclose(ours(**change), other, rtol=1e-10, atol=1e-12)
