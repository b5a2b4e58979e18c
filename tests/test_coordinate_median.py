"""Coordinate-wise median: numpy.median oracle inside FedAvg; the stacking."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import synthetic
from tests import robust_fixtures as fx
from tests import robust_oracles
from tff_algos import fed_avg
from tff_algos.aggregators import coordinate_median


@pytest.fixture(scope='module')
def clients():
  return fx.make_clients()


def build(factory):
  return fed_avg.build_fed_avg(
      synthetic.create_softmax_regression_model_fn(),
      fx.sgd(),
      model_aggregator=factory,
  )


def median_oracle(deltas, weights):
  del weights
  return np.median(deltas, axis=0)


@pytest.mark.parametrize('num_clients', [5, 4])  # odd and even counts
def test_matches_numpy_median_two_rounds(clients, num_clients):
  rounds = [clients[:num_clients], clients[::-1][:num_clients]]
  (w, b), metrics = fx.run(
      build(coordinate_median.build_coordinate_median()), rounds
  )
  w_ref, b_ref = robust_oracles.fedavg_with(
      *fx.zeros(), rounds, median_oracle, lr=fx.LR, batch_size=fx.BATCH
  )
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)
  assert metrics['aggregator']['num_clients'] == num_clients
  (w_mean, _), _ = fx.run(build(None), rounds)
  assert np.abs(w - w_mean).max() > 1e-3


def test_one_client_is_its_update_and_stock_tff_agrees(clients):
  rounds = [clients[:1], clients[1:2]]
  factory = coordinate_median.build_coordinate_median()
  (w, b), _ = fx.run(build(factory), rounds)
  (w_mean, b_mean), _ = fx.run(build(None), rounds)
  np.testing.assert_allclose(w, w_mean, atol=1e-6)
  np.testing.assert_allclose(b, b_mean, atol=1e-6)
  stock = tff.learning.algorithms.build_weighted_fed_avg(
      synthetic.create_softmax_regression_model_fn(),
      fx.sgd(),
      model_aggregator=factory,
  )
  rounds = [clients, clients[1:]]
  for a, c in zip(fx.run(stock, rounds)[0], fx.run(build(factory), rounds)[0]):
    np.testing.assert_allclose(a, c, atol=1e-6)


def test_zero_weight_clients_are_left_out(clients):
  """A non-finite update gets weight 0 and does not enter the median."""
  bad_x = clients[0][0].copy()
  bad_x[0, 0] = np.nan
  with_bad = [(bad_x, clients[0][1])] + list(clients[1:4])
  (w, b), metrics = fx.run(
      build(coordinate_median.build_coordinate_median()), [with_bad]
  )
  (w_ref, b_ref), _ = fx.run(
      build(coordinate_median.build_coordinate_median()), [clients[1:4]]
  )
  np.testing.assert_allclose(w, w_ref, atol=1e-7)
  np.testing.assert_allclose(b, b_ref, atol=1e-7)
  assert metrics['aggregator']['num_clients'] == 3


def test_structure_and_dtypes_are_kept():
  """A nested float64/float32 value comes back with its own structure."""
  value_type = tff.types.to_type(
      [tff.TensorType(np.float32, [2, 2]), tff.TensorType(np.float64, [3])]
  )
  process = coordinate_median.build_coordinate_median().create(
      value_type, tff.TensorType(np.float32)
  )
  values = [
      [np.full((2, 2), v, np.float32), np.full(3, 10 * v)]
      for v in (1.0, 5.0, 2.0)
  ]
  out = process.next(process.initialize(), values, [1.0, 1.0, 1.0])
  np.testing.assert_allclose(out.result[0], np.full((2, 2), 2.0))
  np.testing.assert_allclose(out.result[1], np.full(3, 20.0))
  assert tf.as_dtype(np.asarray(out.result[1]).dtype) == tf.float64
