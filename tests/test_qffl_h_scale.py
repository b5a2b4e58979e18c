"""run.experiments.qffl_h_scale: F_k, ||dw_k||^2 and h_k of one q-FedAvg
round against local SGD and h = q F^(q-1) ||dw||^2 + L F^q written in NumPy,
on a softmax model and a few synthetic clients."""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from run.experiments import qffl_h_scale
from tests import binary

DIM, CLASSES, BATCH, LR = 4, 3, 5, 0.3


def _model_fn():
  spec = (
      tf.TensorSpec([None, DIM], tf.float32),
      tf.TensorSpec([None], tf.int32),
  )
  keras_model = tf.keras.Sequential(
      [
          tf.keras.Input([DIM]),
          tf.keras.layers.Dense(
              CLASSES,
              kernel_initializer=tf.keras.initializers.GlorotUniform(seed=3),
              bias_initializer=tf.keras.initializers.RandomUniform(
                  -0.5, 0.5, seed=4
              ),
          ),
      ]
  )
  return tff.learning.models.from_keras_model(
      keras_model,
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=spec,
  )


def _clients():
  rng = np.random.default_rng(0)
  out = {}
  for k, n in enumerate((7, 12, 20)):
    x = rng.normal(size=(n, DIM)).astype(np.float32) * (1 + k)
    y = rng.integers(0, CLASSES, size=n).astype(np.int32)
    out[f'c{k}'] = (x, y)
  return out


def _numpy_round(w, b, x, y):
  """F at (w, b), then one epoch of mini-batch SGD in stored order."""

  def probs(w, b, x):
    z = x @ w + b
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)

  p = probs(w, b, x)
  loss = -np.mean(np.log(p[np.arange(len(y)), y]))
  w1, b1 = w.copy(), b.copy()
  for s in range(0, len(y), BATCH):
    xb, yb = x[s : s + BATCH], y[s : s + BATCH]
    g = probs(w1, b1, xb)
    g[np.arange(len(yb)), yb] -= 1.0
    w1 -= LR * xb.T @ g / len(yb)
    b1 -= LR * g.mean(axis=0)
  dw = np.concatenate([(w - w1).ravel(), (b - b1).ravel()]) / LR
  return loss, float(dw @ dw)


def test_h_matches_numpy_local_sgd_and_formula():
  clients = _clients()
  keras = _model_fn()
  w0, b0 = (v.numpy().astype(np.float64) for v in keras.trainable_variables)
  datasets = {
      cid: tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
      for cid, (x, y) in clients.items()
  }
  qs = [0.0, 0.001, 0.5, 2.0]
  rounds = qffl_h_scale.measure(_model_fn, datasets, learning_rate=LR, qs=qs)
  lipschitz = 1.0 / LR
  assert [r.client_id for r in rounds] == list(clients)
  for r, (x, y) in zip(rounds, clients.values()):
    loss, sq = _numpy_round(w0, b0, x.astype(np.float64), y)
    assert r.num_examples == len(y)
    np.testing.assert_allclose(r.loss, loss, rtol=1e-5)
    np.testing.assert_allclose(r.sq_norm, sq, rtol=1e-4)
    for q in qs:
      expected = (q * loss ** (q - 1.0) * sq if q else 0.0) + lipschitz * (
          loss**q
      )
      np.testing.assert_allclose(r.h[q], expected, rtol=1e-4)
      first, second = qffl_h_scale.h_terms(
          r.loss, r.sq_norm, q=q, lipschitz=lipschitz
      )
      np.testing.assert_allclose(first + second, expected, rtol=1e-4)


def test_step_weights():
  loss = np.array([2.0, 3.0, 5.0])
  # q = 0: FedAvg's simple average, 1/m each.
  h = np.full(3, 4.0)
  np.testing.assert_allclose(
      qffl_h_scale.step_weights(loss, h, q=0.0, lipschitz=4.0), [1 / 3] * 3
  )
  h = np.array([1.0, 2.0, 3.0])
  np.testing.assert_allclose(
      qffl_h_scale.step_weights(loss, h, q=0.5, lipschitz=2.0),
      2.0 * np.sqrt(loss) / 6.0,
  )


def test_role_subset_ranks_by_size():
  counts = {'a': 5, 'b': 1, 'c': 3, 'd': 3, 'e': 9}
  assert qffl_h_scale.role_subset(counts, every=1, offset=0) == [
      'b',
      'c',
      'd',
      'a',
      'e',
  ]
  assert qffl_h_scale.role_subset(counts, every=2, offset=1) == ['c', 'a']


def test_bad_flag_is_one_error_line():
  code, _, err = binary.run_module(
      'run.experiments.qffl_h_scale', ['--scales=bogus'], timeout=200
  )
  assert code == 2
  assert err.strip().splitlines()[-1] == (
      "qffl_h_scale: error: unknown scale 'bogus'; choose from thesis, scaled"
  )
