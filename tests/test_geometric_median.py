"""Geometric median (smoothed Weiszfeld): NumPy oracle inside FedAvg."""

import numpy as np
import pytest
import scipy.optimize
import tensorflow_federated as tff

from tasks import synthetic
from tests import oracles
from tests import robust_fixtures as fx
from tests import robust_oracles
from tff_algos import fed_avg
from tff_algos.aggregators import geometric_median


@pytest.fixture(scope='module')
def clients():
  return fx.make_clients()


def build(factory):
  return fed_avg.build_fed_avg(
      synthetic.create_softmax_regression_model_fn(),
      fx.sgd(),
      model_aggregator=factory,
  )


@pytest.mark.parametrize('passes', [1, 4])
def test_matches_numpy_weiszfeld_two_rounds(clients, passes):
  rounds = [clients, clients[1:]]
  factory = geometric_median.build_geometric_median(
      num_passes=passes, smoothing=1e-6
  )
  (w, b), metrics = fx.run(build(factory), rounds)
  last = {}

  def aggregate(deltas, weights):
    z = robust_oracles.weiszfeld(deltas, weights, passes=passes, smoothing=1e-6)
    last.update(points=deltas, weights=weights, z=z)
    return z

  w_ref, b_ref = robust_oracles.fedavg_with(
      *fx.zeros(), rounds, aggregate, lr=fx.LR, batch_size=fx.BATCH
  )
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)
  measured = metrics['aggregator']
  assert measured['num_passes'] == passes
  mean = last['weights'] @ last['points'] / last['weights'].sum()
  assert measured['mean_objective'] == pytest.approx(
      robust_oracles.gm_objective(last['points'], last['weights'], mean, 1e-6),
      rel=1e-4,
  )
  assert measured['objective'] == pytest.approx(
      robust_oracles.gm_objective(
          last['points'], last['weights'], last['z'], 1e-6
      ),
      rel=1e-4,
  )
  assert measured['objective'] < measured['mean_objective']
  # The outlier client pulls the mean much further than the median.
  (w_mean, _), _ = fx.run(build(None), rounds)
  assert np.abs(w - w_mean).max() > 1e-3


def test_many_passes_reach_the_geometric_median(clients):
  """An independent check: the minimiser of sum_k a_k ||z - x_k||."""
  factory = geometric_median.build_geometric_median(num_passes=60)
  (w, b), _ = fx.run(build(factory), [clients])
  deltas, weights = [], []
  w0, b0 = fx.zeros()
  for x, y in clients:
    wk, bk, n = oracles.proximal_local_sgd(
        w0, b0, x, y, lr=fx.LR, mu=0.0, batch_size=fx.BATCH, epochs=1
    )
    deltas.append(robust_oracles.flat(w0 - wk, b0 - bk))
    weights.append(n)
  deltas, weights = np.asarray(deltas), np.asarray(weights, float)

  def objective(z):
    return np.dot(weights, np.linalg.norm(deltas - z, axis=1))

  start = weights @ deltas / weights.sum()
  best = scipy.optimize.minimize(
      objective,
      start,
      method='L-BFGS-B',
      options={'maxiter': 5000, 'gtol': 1e-10},
  ).x
  ours = -robust_oracles.flat(w, b)
  assert objective(ours) <= objective(best) * (1 + 1e-4)
  np.testing.assert_allclose(ours, best, atol=5e-3)


def test_zero_passes_is_fedavg_and_works_in_stock_tff(clients):
  rounds = [clients[:3], clients[2:]]
  model_fn = synthetic.create_softmax_regression_model_fn()
  (w0, b0), _ = fx.run(
      build(geometric_median.build_geometric_median(num_passes=0)), rounds
  )
  (w1, b1), _ = fx.run(build(None), rounds)
  np.testing.assert_allclose(w0, w1, atol=1e-6)
  np.testing.assert_allclose(b0, b1, atol=1e-6)
  factory = geometric_median.build_geometric_median(num_passes=2)
  stock = tff.learning.algorithms.build_weighted_fed_avg(
      model_fn, fx.sgd(), model_aggregator=factory
  )
  ours = build(factory)
  for a, c in zip(fx.run(stock, rounds)[0], fx.run(ours, rounds)[0]):
    np.testing.assert_allclose(a, c, atol=1e-6)


@pytest.mark.parametrize(
    'kwargs, error',
    [
        (dict(num_passes=-1), ValueError),
        (dict(num_passes=1.5), TypeError),
        (dict(smoothing=0.0), ValueError),
        (dict(smoothing='1'), TypeError),
        (dict(num_passes=True), TypeError),
    ],
)
def test_validation(kwargs, error):
  with pytest.raises(error):
    geometric_median.build_geometric_median(**kwargs)


def test_rejects_integer_values():
  factory = geometric_median.build_geometric_median()
  with pytest.raises(TypeError):
    factory.create(tff.TensorType(np.int32, [3]), tff.TensorType(np.float32))
