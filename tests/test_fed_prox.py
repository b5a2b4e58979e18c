"""FedProx and FedAvg: NumPy oracle, stock-TFF equivalence, degenerate cases."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import synthetic
from tests import oracles
from tff_algos import composition
from tff_algos import fed_avg
from tff_algos import fed_prox

LR = 0.1
BATCH = 5


@pytest.fixture(scope='module')
def clients():
  """Four clients of 13, 17, 9 and 23 examples (partial last batches)."""
  rng = np.random.default_rng(3)
  out = []
  for n in (13, 17, 9, 23):
    x = rng.normal(size=(n, synthetic.NUM_FEATURES)).astype(np.float32)
    y = rng.integers(0, synthetic.NUM_CLASSES, n).astype(np.int32)
    out.append((x, y))
  return out


def as_dataset(x, y, epochs, batch=BATCH):
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat(epochs)


def weights_of(process, state):
  return composition.model_weights_as_numpy(process, state)


def run_rounds(process, rounds, epochs):
  state = process.initialize()
  for round_clients in rounds:
    state = process.next(
        state, [as_dataset(x, y, epochs) for x, y in round_clients]
    ).state
  return weights_of(process, state)


def sgd(lr=LR):
  return tff.learning.optimizers.build_sgdm(learning_rate=lr)


@pytest.mark.parametrize('mu', [0.0, 0.5, 2.0])
def test_fed_prox_matches_numpy_oracle_two_rounds(clients, mu):
  model_fn = synthetic.create_softmax_regression_model_fn()
  rounds = [clients[:3], [clients[3], clients[0]]]
  process = fed_prox.build_fed_prox(model_fn, sgd(), proximal_strength=mu)
  w, b = run_rounds(process, rounds, epochs=2)
  w0 = np.zeros((synthetic.NUM_FEATURES, synthetic.NUM_CLASSES))
  b0 = np.zeros(synthetic.NUM_CLASSES)
  w_ref, b_ref = oracles.fedprox_rounds(
      w0, b0, rounds, lr=LR, mu=mu, batch_size=BATCH, epochs=2
  )
  np.testing.assert_allclose(w, w_ref, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, atol=2e-6)
  assert np.abs(w).max() > 1e-2  # The model really moved.


def test_proximal_term_pulls_towards_broadcast_model(clients):
  model_fn = synthetic.create_softmax_regression_model_fn()
  rounds = [clients]
  moved = {}
  for mu in (0.0, 1.0, 10.0):
    process = fed_prox.build_fed_prox(model_fn, sgd(), proximal_strength=mu)
    w, b = run_rounds(process, rounds, epochs=3)
    moved[mu] = np.linalg.norm(w) + np.linalg.norm(b)
  assert moved[0.0] > moved[1.0] > moved[10.0] > 0


@pytest.mark.parametrize('weighting', ['num_examples', 'uniform'])
def test_fed_avg_equals_stock_tff(clients, weighting):
  model_fn = synthetic.create_softmax_regression_model_fn()
  rounds = [clients[:3], clients[1:], [clients[2], clients[0], clients[3]]]
  if weighting == 'num_examples':
    ours = fed_avg.build_fed_avg(model_fn, sgd())
    stock = tff.learning.algorithms.build_weighted_fed_avg(model_fn, sgd())
  else:
    ours = fed_avg.build_fed_avg(
        model_fn, sgd(), client_weighting=tff.learning.ClientWeighting.UNIFORM
    )
    stock = tff.learning.algorithms.build_unweighted_fed_avg(model_fn, sgd())
  ours_w = run_rounds(ours, rounds, epochs=2)
  stock_w = run_rounds(stock, rounds, epochs=2)
  for a, b in zip(ours_w, stock_w):
    np.testing.assert_allclose(a, b, atol=1e-6)
  w0 = np.zeros((synthetic.NUM_FEATURES, synthetic.NUM_CLASSES))
  w_ref, _ = oracles.fedprox_rounds(
      w0,
      np.zeros(synthetic.NUM_CLASSES),
      rounds,
      lr=LR,
      mu=0.0,
      batch_size=BATCH,
      epochs=2,
      weighting=weighting,
  )
  np.testing.assert_allclose(ours_w[0], w_ref, atol=2e-6)


def test_fed_prox_mu_zero_equals_stock_fed_avg(clients):
  model_fn = synthetic.create_softmax_regression_model_fn()
  rounds = [clients, clients[::-1]]
  prox = fed_prox.build_fed_prox(model_fn, sgd(), proximal_strength=0.0)
  stock = tff.learning.algorithms.build_weighted_fed_avg(model_fn, sgd())
  for a, b in zip(run_rounds(prox, rounds, 1), run_rounds(stock, rounds, 1)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_non_finite_update_is_zeroed_and_dropped(clients):
  model_fn = synthetic.create_softmax_regression_model_fn()
  process = fed_avg.build_fed_avg(model_fn, sgd())
  x, y = clients[0]
  bad_x = x.copy()
  bad_x[0, 0] = np.nan
  state = process.initialize()
  out = process.next(state, [as_dataset(bad_x, y, 1), as_dataset(x, y, 1)])
  w = weights_of(process, out.state)
  assert all(np.all(np.isfinite(a)) for a in w)
  ref = weights_of(process, process.next(state, [as_dataset(x, y, 1)]).state)
  for a, b in zip(w, ref):
    np.testing.assert_allclose(a, b, atol=1e-7)


def test_metrics_report_training_loss(clients):
  process = fed_avg.build_fed_avg(
      synthetic.create_softmax_regression_model_fn(), sgd()
  )
  out = process.next(
      process.initialize(), [as_dataset(x, y, 1) for x, y in clients]
  )
  train = out.metrics['client_work']['train']
  assert train['num_examples'] == sum(len(y) for _, y in clients)
  # The mean over all examples of each batch's loss at the weights before
  # its step (the first batch of each client at the zero model: log(10)).
  total, count = 0.0, 0
  for x, y in clients:
    w, b = np.zeros((60, 10)), np.zeros(10)
    for xb, yb in oracles.batches(x, y, BATCH, 1):
      total += oracles.softmax_regression_loss(w, b, xb, yb) * len(yb)
      count += len(yb)
      gw, gb = oracles.softmax_regression_grads(w, b, xb, yb)
      w, b = w - LR * gw, b - LR * gb
  assert train['loss'] == pytest.approx(total / count, rel=1e-5)
  assert abs(train['loss'] - np.log(10)) > 1e-3  # Not all at the zero model.


@pytest.mark.parametrize(
    'kwargs, error',
    [
        (dict(proximal_strength=-1.0), ValueError),
        (dict(proximal_strength=float('nan')), ValueError),
        (dict(proximal_strength='0.1'), TypeError),
        (dict(proximal_strength=0.1, client_weighting='uniform'), TypeError),
    ],
)
def test_fed_prox_validates_eagerly(kwargs, error):
  with pytest.raises(error):
    fed_prox.build_fed_prox(
        synthetic.create_softmax_regression_model_fn(), sgd(), **kwargs
    )


def test_rejects_keras_optimizer():
  with pytest.raises(TypeError, match='tff.learning.optimizers.Optimizer'):
    fed_avg.build_fed_avg(
        synthetic.create_softmax_regression_model_fn(),
        tf.keras.optimizers.SGD(0.1),
    )


def test_process_is_a_learning_process():
  process = fed_prox.build_fed_prox(
      synthetic.create_softmax_regression_model_fn(),
      sgd(),
      proximal_strength=0.1,
  )
  assert isinstance(process, tff.learning.templates.LearningProcess)
  assert process.next.type_signature.parameter[1].placement == tff.CLIENTS
  hparams = process.get_hparams(process.initialize())
  assert isinstance(hparams, collections.abc.Mapping)
