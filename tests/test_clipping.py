"""Norm clipping: NumPy oracle inside FedAvg, adaptive norm, validation."""

import numpy as np
import pytest
import tensorflow_federated as tff

from tasks import synthetic
from tests import oracles
from tests import robust_fixtures as fx
from tests import robust_oracles
from tff_algos import fed_avg
from tff_algos.aggregators import clipping
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


def test_fixed_norm_matches_numpy_two_rounds(clients):
  rounds = [clients, clients[1:]]
  (w, b), metrics = fx.run(
      build(clipping.build_clipping(clip_norm=0.5)), rounds
  )

  def aggregate(deltas, weights):
    return weights @ robust_oracles.clip(deltas, 0.5) / weights.sum()

  w_ref, b_ref = robust_oracles.fedavg_with(
      *fx.zeros(), rounds, aggregate, lr=fx.LR, batch_size=fx.BATCH
  )
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)
  assert metrics['aggregator']['clipped_count'] > 0


def test_huge_norm_is_fedavg_and_inner_factory_composes(clients):
  rounds = [clients, clients[2:]]
  (w, b), _ = fx.run(build(clipping.build_clipping(clip_norm=1e9)), rounds)
  (w_ref, b_ref), _ = fx.run(build(None), rounds)
  np.testing.assert_allclose(w, w_ref, atol=1e-6)
  np.testing.assert_allclose(b, b_ref, atol=1e-6)
  (w, _), _ = fx.run(
      build(
          clipping.build_clipping(
              clip_norm=1e9,
              inner_factory=geometric_median.build_geometric_median(
                  num_passes=2
              ),
          )
      ),
      rounds,
  )
  (w_gm, _), _ = fx.run(
      build(geometric_median.build_geometric_median(num_passes=2)), rounds
  )
  np.testing.assert_allclose(w, w_gm, atol=1e-6)


def test_adaptive_norm_follows_the_geometric_quantile_update(clients):
  """C <- C exp(-lr (fraction of norms <= C - target)), Andrew et al."""
  factory = clipping.build_clipping(
      adaptive=True,
      initial_clip_norm=0.3,
      target_quantile=0.5,
      learning_rate=0.2,
  )
  process = build(factory)
  state = process.initialize()
  out = process.next(state, fx.datasets(clients))
  assert out.metrics['aggregator']['clipping_norm'] == pytest.approx(0.3)
  deltas = []
  w0, b0 = fx.zeros()
  for x, y in clients:
    wk, bk, _ = oracles.proximal_local_sgd(
        w0, b0, x, y, lr=fx.LR, mu=0.0, batch_size=fx.BATCH, epochs=1
    )
    deltas.append(robust_oracles.flat(w0 - wk, b0 - bk))
  below = np.mean(np.linalg.norm(deltas, axis=1) <= 0.3)
  expected = 0.3 * np.exp(-0.2 * (below - 0.5))
  out2 = process.next(out.state, fx.datasets(clients[:2]))
  assert out2.metrics['aggregator']['clipping_norm'] == pytest.approx(
      expected, rel=1e-5
  )


@pytest.mark.parametrize(
    'kwargs, error',
    [
        (dict(), ValueError),
        (dict(clip_norm=1.0, adaptive=True), ValueError),
        (dict(clip_norm=0.0), ValueError),
        (dict(clip_norm='1'), TypeError),
        (dict(adaptive=True, target_quantile=1.0), ValueError),
        (dict(adaptive=True, learning_rate=-1.0), ValueError),
        (dict(adaptive=1), TypeError),
        (
            dict(clip_norm=1.0, inner_factory=tff.aggregators.SumFactory()),
            TypeError,
        ),
    ],
)
def test_validation(kwargs, error):
  with pytest.raises(error):
    clipping.build_clipping(**kwargs)
