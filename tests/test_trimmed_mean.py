"""Trimmed mean: scipy.stats.trim_mean / NumPy oracle inside FedAvg."""

import numpy as np
import pytest
import scipy.stats
import tensorflow_federated as tff

from tasks import synthetic
from tests import robust_fixtures as fx
from tests import robust_oracles
from tff_algos import fed_avg
from tff_algos.aggregators import trimmed_mean


@pytest.fixture(scope='module')
def clients():
  return fx.make_clients(sizes=(13, 17, 9, 23, 11, 15))


def build(factory, weighting=tff.learning.ClientWeighting.NUM_EXAMPLES):
  return fed_avg.build_fed_avg(
      synthetic.create_softmax_regression_model_fn(),
      fx.sgd(),
      model_aggregator=factory,
      client_weighting=weighting,
  )


def test_uniform_weights_match_scipy_trim_mean(clients):
  rounds = [clients, clients[1:]]
  (w, b), metrics = fx.run(
      build(
          trimmed_mean.build_trimmed_mean(trim_fraction=0.2),
          tff.learning.ClientWeighting.UNIFORM,
      ),
      rounds,
  )
  w_ref, b_ref = robust_oracles.fedavg_with(
      *fx.zeros(),
      rounds,
      lambda d, _: scipy.stats.trim_mean(d, 0.2, axis=0),
      lr=fx.LR,
      batch_size=fx.BATCH,
      weighting='uniform',
  )
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)
  assert metrics['aggregator']['trimmed_per_side'] == 1  # floor(0.2 * 5)


@pytest.mark.parametrize('fraction', [0.2, 0.4])
def test_example_weights_match_numpy_oracle(clients, fraction):
  rounds = [clients, clients[:4]]
  (w, b), _ = fx.run(
      build(trimmed_mean.build_trimmed_mean(trim_fraction=fraction)), rounds
  )
  w_ref, b_ref = robust_oracles.fedavg_with(
      *fx.zeros(),
      rounds,
      lambda d, a: robust_oracles.trimmed_mean(d, a, fraction),
      lr=fx.LR,
      batch_size=fx.BATCH,
  )
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)
  (w_mean, _), _ = fx.run(build(None), rounds)
  assert np.abs(w - w_mean).max() > 1e-3


def test_no_trimming_is_fedavg(clients):
  rounds = [clients, clients[2:]]
  (w, b), _ = fx.run(
      build(trimmed_mean.build_trimmed_mean(trim_fraction=0.0)), rounds
  )
  (w_ref, b_ref), _ = fx.run(build(None), rounds)
  np.testing.assert_allclose(w, w_ref, atol=1e-6)
  np.testing.assert_allclose(b, b_ref, atol=1e-6)


@pytest.mark.parametrize(
    'value, error',
    [
        (0.5, ValueError),
        (-0.1, ValueError),
        (float('nan'), ValueError),
        ('0.1', TypeError),
        (True, TypeError),
    ],
)
def test_validation(value, error):
  with pytest.raises(error):
    trimmed_mean.build_trimmed_mean(trim_fraction=value)
