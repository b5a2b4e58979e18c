"""Multi-Krum: NumPy Krum oracle inside FedAvg; m = n is FedAvg."""

import numpy as np
import pytest

from tasks import synthetic
from tests import robust_fixtures as fx
from tests import robust_oracles
from tff_algos import fed_avg
from tff_algos.aggregators import krum


@pytest.fixture(scope='module')
def clients():
  return fx.make_clients(sizes=(13, 17, 9, 23, 19, 11, 15))


def build(factory):
  return fed_avg.build_fed_avg(
      synthetic.create_softmax_regression_model_fn(),
      fx.sgd(),
      model_aggregator=factory,
  )


@pytest.mark.parametrize('f, m', [(1, None), (2, 1), (1, 3)])
def test_matches_numpy_krum_two_rounds(clients, f, m):
  rounds = [clients, clients[1:]]
  chosen = []

  def aggregate(deltas, weights):
    value, selected = robust_oracles.multi_krum(deltas, weights, f=f, m=m)
    chosen.append((selected, len(deltas)))
    return value

  (w, b), metrics = fx.run(
      build(krum.build_krum(num_byzantine=f, num_selected=m)), rounds
  )
  w_ref, b_ref = robust_oracles.fedavg_with(
      *fx.zeros(), rounds, aggregate, lr=fx.LR, batch_size=fx.BATCH
  )
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)
  assert metrics['aggregator']['num_selected'] == len(chosen[-1][0])
  # The outlier (the last client, large features) is never selected.
  assert all(n - 1 not in selected for selected, n in chosen)


def test_selecting_everyone_is_fedavg(clients):
  rounds = [clients[:4], clients[3:]]
  (w, b), _ = fx.run(build(krum.build_krum(num_byzantine=0)), rounds)
  (w_ref, b_ref), _ = fx.run(build(None), rounds)
  np.testing.assert_allclose(w, w_ref, atol=1e-6)
  np.testing.assert_allclose(b, b_ref, atol=1e-6)


@pytest.mark.parametrize(
    'kwargs, error',
    [
        (dict(num_byzantine=-1), ValueError),
        (dict(num_byzantine=1, num_selected=0), ValueError),
        (dict(num_byzantine=1.0), TypeError),
        (dict(num_byzantine=1, num_selected='2'), TypeError),
    ],
)
def test_validation(kwargs, error):
  with pytest.raises(error):
    krum.build_krum(**kwargs)
