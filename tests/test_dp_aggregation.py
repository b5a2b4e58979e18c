"""DP aggregation: clipping and noise checked empirically on a fixed input."""

import numpy as np
import pytest
import tensorflow_federated as tff

from privacy import dp_aggregation

DIM = 20000


def run_once(opts, values, clients_per_round):
  factory = dp_aggregation.build_dp_aggregator(
      opts, clients_per_round=clients_per_round
  )
  process = factory.create(
      tff.TensorType(np.float32, [DIM]), tff.TensorType(np.float32)
  )
  # Arbitrary weights: the DP mean ignores them.
  weights = [float(5 + 3 * i) for i in range(len(values))]
  return np.asarray(process.next(process.initialize(), values, weights).result)


def test_clipping_and_noise_std_on_a_fixed_input():
  rng = np.random.default_rng(0)
  values = [rng.normal(size=DIM).astype(np.float32) * s for s in (0.001, 1.0)]
  norms = [np.linalg.norm(v) for v in values]
  clip = 2.0
  assert norms[0] < clip < norms[1]
  clipped = values[0] + values[1] * (clip / norms[1])
  m = 4.0
  # Without noise: the sum of clipped updates over m, exactly.
  exact = run_once(dp_aggregation.DpOptions(0.0, clip), values, m)
  np.testing.assert_allclose(exact, clipped / m, rtol=1e-5, atol=1e-7)
  # With noise: the residual has mean 0 and std z C / m (20000 draws).
  z = 1.5
  noisy = run_once(dp_aggregation.DpOptions(z, clip), values, m)
  residual = noisy - clipped / m
  want = z * clip / m
  assert np.std(residual) == pytest.approx(want, rel=0.03)
  assert abs(np.mean(residual)) < 4 * want / np.sqrt(DIM)


def test_refuses_non_uniform_weighting_and_bad_options():
  opts = dp_aggregation.DpOptions(1.0, 1.0)
  with pytest.raises(ValueError, match='uniform client weighting'):
    dp_aggregation.build_dp_aggregator(
        opts,
        clients_per_round=10,
        client_weighting=tff.learning.ClientWeighting.NUM_EXAMPLES,
    )
  with pytest.raises(ValueError, match='clip must be > 0'):
    dp_aggregation.build_dp_aggregator(
        dp_aggregation.DpOptions(1.0, 0.0), clients_per_round=10
    )
  with pytest.raises(ValueError, match='target_unclipped_quantile'):
    dp_aggregation.DpOptions(
        1.0, 1.0, adaptive_clip=True, target_unclipped_quantile=1.0
    ).validate()
  with pytest.raises(ValueError, match='too large for adaptive'):
    dp_aggregation.build_dp_aggregator(
        dp_aggregation.DpOptions(2.0, 1.0, adaptive_clip=True),
        clients_per_round=10,
    )
  with pytest.raises(TypeError, match='noise_multiplier'):
    dp_aggregation.DpOptions('1', 1.0).validate()
