"""Weighted quantile estimators: exact, MM (secure), bisection (secure), TFF's.

The secure estimators run under TFF's test context (the only one in TFF 0.87
that executes `federated_secure_sum_bitwidth`, replacing it by an insecure
sum); the module fixture sets it and restores the default local context.
"""

import math

import numpy as np
import pytest
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.compiler import intrinsic_defs
from tensorflow_federated.python.core.impl.compiler import tree_analysis

from tests import quantile_oracles as oracles
from tests.secure_checks import SECURE_URIS
from tests.secure_checks import client_to_server_intrinsics
from tff_algos import quantiles

F32 = tff.FederatedType(np.float32, tff.CLIENTS)


@pytest.fixture(scope='module', autouse=True)
def test_context():
  tff.backends.test.set_sync_test_cpp_execution_context()
  yield
  tff.backends.native.set_sync_local_cpp_execution_context()


def problem(seed, *, m_range=(10, 41), integer_weights=True):
  """Lognormal 'losses' and example-count weights."""
  rng = np.random.default_rng(seed)
  m = int(rng.integers(*m_range))
  x = rng.lognormal(0, 1, m).astype(np.float32)
  if integer_weights:
    a = rng.integers(1, 500, m).astype(np.float32)
  else:
    a = rng.uniform(0.05, 1.0, m).astype(np.float32)
  return x, a


def f32(x):
  return float(np.float32(x))


# ---------------------------------------------------------------------------
# Construction and validation (no execution).


def test_factory_builds_each_estimator_with_stated_costs():
  exact = quantiles.build_estimator('exact', level=0.5)
  mm = quantiles.build_estimator(
      'mm', level=0.9, num_iterations=30, lower=0.0, upper=20.0
  )
  bis = quantiles.build_estimator(
      'bisection', level=0.9, lower=0.0, upper=10.0, tolerance=1e-5
  )
  hist = quantiles.build_estimator(
      'bisection',
      level=0.9,
      lower=0.0,
      upper=10.0,
      tolerance=1e-5,
      num_buckets=32,
  )
  priv = quantiles.build_estimator('private', level=0.9, initial_estimate=1.0)
  assert isinstance(exact, quantiles.ExactQuantile) and not exact.secure
  assert isinstance(mm, quantiles.MMQuantile) and mm.secure
  assert isinstance(bis, quantiles.BisectionQuantile) and bis.secure
  assert isinstance(priv, quantiles.PrivateQuantileEstimator) and priv.secure
  assert mm.num_sum_calls == 31
  assert mm.smoothing == pytest.approx(2e-5)
  # ceil(log2(10 / 1e-5)) = 20; ceil(log32(1e6)) = 4.
  assert bis.num_sum_calls == 20 == math.ceil(math.log2(10 / 1e-5))
  assert hist.num_sum_calls == 4
  assert priv.num_sum_calls == priv.num_steps == 50
  for est in (exact, mm, bis, hist, priv):
    assert type(est).__name__ in est.describe()
  assert 'UNWEIGHTED' in priv.describe()


@pytest.mark.parametrize(
    'name,options,error',
    [
        ('median', {}, ValueError),
        ('exact', {'tolerance': 1.0}, TypeError),
        (
            'mm',
            {'lower': 0.0, 'upper': 1.0},
            TypeError,
        ),  # num_iterations missing
        ('mm', {'num_iterations': 0, 'lower': 0.0, 'upper': 1.0}, ValueError),
        ('mm', {'num_iterations': 2.0, 'lower': 0.0, 'upper': 1.0}, TypeError),
        ('mm', {'num_iterations': 5, 'lower': 1.0, 'upper': 1.0}, ValueError),
        (
            'mm',
            {'num_iterations': 5, 'lower': 0.0, 'upper': 1.0, 'smoothing': 0.0},
            ValueError,
        ),
        (
            'mm',
            {'num_iterations': 5, 'lower': 0.0, 'upper': 1.0, 'bits': 63},
            ValueError,
        ),
        (
            'bisection',
            {'lower': 0.0, 'upper': 1.0, 'tolerance': -1.0},
            ValueError,
        ),
        (
            'bisection',
            {'lower': 0.0, 'upper': 1.0, 'tolerance': 1e-300},
            ValueError,
        ),
        (
            'bisection',
            {'lower': 0.0, 'upper': float('inf'), 'tolerance': 1.0},
            ValueError,
        ),
        (
            'bisection',
            {'lower': 0.0, 'upper': 1.0, 'tolerance': 0.1, 'num_buckets': 1},
            ValueError,
        ),
        (
            'bisection',
            {'lower': '0', 'upper': 1.0, 'tolerance': 0.1},
            TypeError,
        ),
        (
            'bisection',
            {'lower': 0.0, 'upper': 1.0, 'tolerance': 0.1, 'max_weight': 0.0},
            ValueError,
        ),
        ('private', {}, TypeError),  # initial_estimate missing
        ('private', {'initial_estimate': -1.0}, ValueError),
        ('private', {'initial_estimate': 1.0, 'secure': 1}, TypeError),
        ('private', {'initial_estimate': 1.0, 'noise_stddev': 1.0}, ValueError),
        (
            'private',
            {'initial_estimate': 1.0, 'expected_num_clients': 10.0},
            ValueError,
        ),
    ],
)
def test_factory_validates_eagerly(name, options, error):
  with pytest.raises(error):
    quantiles.build_estimator(name, level=0.5, **options)


@pytest.mark.parametrize(
    'level,error',
    [
        (1.5, ValueError),
        (-0.1, ValueError),
        (True, TypeError),
        ('0.5', TypeError),
        (float('nan'), ValueError),
    ],
)
def test_level_is_validated(level, error):
  with pytest.raises(error):
    quantiles.ExactQuantile(level)
  with pytest.raises(error):
    quantiles.BisectionQuantile(level, lower=0.0, upper=1.0, tolerance=0.1)


def test_fixed_point_scale_is_largest_power_of_two():
  for span, bits in [
      (1.0, 32),
      (2.0, 32),
      (65536.0, 32),
      (1e4, 32),
      (20.0 * 65536, 32),
      (3.0, 8),
      (1e-3, 20),
  ]:
    s = quantiles.fixed_point_scale(span, bits)
    assert s == oracles.fixed_point_scale(span, bits)
    assert math.log2(s) == int(math.log2(s))
    assert span * s <= 2**bits - 1 < span * 2 * s


def test_estimate_rejects_non_client_values():
  est = quantiles.ExactQuantile(0.5)
  with pytest.raises(TypeError, match='CLIENTS'):

    @tff.federated_computation(tff.FederatedType(np.float32, tff.SERVER), F32)
    def _(values, weights):
      return est.estimate(values, weights)


# ---------------------------------------------------------------------------
# NumPy oracles (fast, many seeds).


def test_bisection_oracle_within_tolerance_of_exact_many_seeds():
  for seed in range(300):
    x, a = problem(seed, integer_weights=seed % 2 == 0)
    rng = np.random.default_rng(1000 + seed)
    level = float(rng.uniform())
    b = int(rng.choice([2, 3, 8]))
    q = oracles.weighted_quantile(x, level, a)
    est, rounds = oracles.bisection_quantile_oracle(
        x, a, level, 0.0, 10.0, 1e-4, num_buckets=b, max_weight=1000.0
    )
    assert rounds == quantiles.bisection_num_rounds(0.0, 10.0, 1e-4, b)
    assert 0.0 <= est - min(q, 10.0) <= 1e-4, (seed, level, b)


def test_mm_fixed_point_is_within_smoothing_of_quantile_interval():
  # The smoothed MM map's fixed point solves U(mu) + 2p - 1 = 0, U decreasing.
  for seed in range(100):
    x, a = problem(seed, integer_weights=seed % 2 == 0)
    level = float(np.random.default_rng(seed).choice([0.1, 0.5, 0.8, 0.9]))
    nu = 1e-3
    w = a.astype(np.float64) / a.sum()

    def g(mu, x=x, w=w, nu=nu, level=level):
      r = x - mu
      return np.sum(w * r / np.maximum(nu, np.abs(r))) + 2 * level - 1

    lo, hi = 0.0, 20.0
    for _ in range(100):
      mid = (lo + hi) / 2
      lo, hi = (mid, hi) if g(mid) > 0 else (lo, mid)
    q = oracles.weighted_quantile(x, level, a)
    qh = oracles.upper_weighted_quantile(x, level, a)
    assert q - nu - 1e-9 <= lo and hi <= qh + nu + 1e-9
    # And it is a fixed point of the MM step.
    step, _, _ = oracles.mm_step(
        hi, x.astype(np.float64), w, level, nu, 0.0, 20.0
    )
    assert abs(step - hi) < 1e-6


def test_mm_oracle_convergence_statistics():
  """Iterations to 1e-3 relative error (module docstring numbers)."""
  its = []
  for seed in range(200):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(5, 101))
    x = rng.lognormal(0, 1, m).astype(np.float32)
    a = rng.integers(1, 500, m).astype(np.float32)
    level = float(rng.choice([0.1, 0.2, 0.5, 0.8, 0.9]))
    q = oracles.weighted_quantile(x, level, a)
    qh = oracles.upper_weighted_quantile(x, level, a)
    traj = oracles.mm_quantile_oracle(x, a, level, 400, 0.0, 20.0)
    its.append(oracles.iterations_to_tolerance(traj, q, qh, 1e-3))
  its = np.array(its)
  assert np.median(its) <= 30
  assert np.percentile(its, 90) <= 110
  assert np.mean(its <= 50) >= 0.75
  assert np.mean(its > 400) <= 0.02


# ---------------------------------------------------------------------------
# Execution in TFF.


@pytest.mark.parametrize('level', [0.0, 0.3, 0.9, 1.0])
def test_exact_equals_weighted_quantile(level):
  comp = quantiles.ExactQuantile(level).build_computation()
  for seed in range(4):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 30))
    if seed % 2:  # Ties and zero weights.
      x = rng.integers(0, 5, m).astype(np.float32)
      a = rng.integers(0, 4, m).astype(np.float32)
      a[0] = 1.0
    else:
      x = rng.normal(size=m).astype(np.float32)
      a = rng.uniform(0, 3, m).astype(np.float32)
    got = comp(list(x), list(a))
    assert got == oracles.weighted_quantile(x, level, a), (seed, level)


def test_exact_zero_total_weight_is_nan():
  comp = quantiles.ExactQuantile(0.5).build_computation()
  assert np.isnan(comp([1.0, 2.0], [0.0, 0.0]))


def test_bisection_within_tolerance_and_equals_oracle():
  est = quantiles.BisectionQuantile(0.8, lower=0.0, upper=10.0, tolerance=1e-5)
  assert est.num_sum_calls == 20
  comp = est.build_computation()
  for seed in range(6):
    x, a = problem(seed)
    if seed == 5:  # Values outside the range are clipped.
      x[:] = x * 4 + 3
    q = min(max(oracles.weighted_quantile(x, 0.8, a), 0.0), 10.0)
    expected, rounds = oracles.bisection_quantile_oracle(
        x, a, 0.8, 0.0, 10.0, 1e-5
    )
    assert rounds == 20
    got = comp(list(x), list(a))
    assert got == f32(expected)
    # Guarantee, up to float32 rounding of the result.
    assert 0.0 <= got - q <= 1e-5 + 1e-6 * abs(q), seed
  assert np.isnan(comp([1.0], [0.0]))


def test_histogram_search_float_weights():
  est = quantiles.BisectionQuantile(
      0.3, lower=-5.0, upper=5.0, tolerance=1e-4, num_buckets=16, max_weight=1.0
  )
  assert est.num_sum_calls == 5  # 10 / 16^4 = 1.5e-4 > 1e-4 >= 10 / 16^5.
  comp = est.build_computation()
  for seed in range(4):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=25).astype(np.float32) * 2
    a = rng.uniform(0.01, 1.0, 25).astype(np.float32)
    q = oracles.weighted_quantile(x, 0.3, a)
    got = comp(list(x), list(a))
    assert 0.0 <= got - q <= 1e-4 + 1e-6, seed


def test_mm_matches_oracle_step_by_step_and_converges():
  level, lower, upper, iters = 0.9, 0.0, 20.0, 50
  est = quantiles.MMQuantile(
      level, num_iterations=iters, lower=lower, upper=upper
  )
  nu = est.smoothing

  @tff.federated_computation(F32, F32)
  def trajectory(values, weights):
    return est.iterates(values, weights)

  for seed in range(3):  # The first three draws, not selected.
    x, a = problem(seed)
    got = np.asarray(trajectory(list(x), list(a)))
    assert got.shape == (iters + 1,)
    xc = oracles.clean_values(x, lower, upper)
    w = a.astype(np.float64) / a.astype(np.float64).sum()
    exact = oracles.mm_quantile_oracle(x, a, level, iters, lower, upper)
    # mu_0: fixed-point a x (resolution 1/2^11 for span 20 * 65536).
    assert abs(got[0] - exact[0]) <= x.size / 2**12 / a.sum() + 1e-12
    for t in range(iters):
      step, _, _ = oracles.mm_step(got[t], xc, w, level, nu, lower, upper)
      tol = oracles.mm_step_tolerance(got[t], xc, w, level, nu, lower, upper)
      assert abs(got[t + 1] - step) <= tol, (seed, t)
    q = oracles.weighted_quantile(x, level, a)
    qh = oracles.upper_weighted_quantile(x, level, a)
    assert q * (1 - 1e-3) <= got[-1] <= qh * (1 + 1e-3), seed
    assert abs(got[-1] - exact[-1]) <= 1e-4 * q, seed


def test_mm_estimate_is_last_iterate_float32():
  est = quantiles.MMQuantile(0.5, num_iterations=5, lower=0.0, upper=20.0)
  x, a = problem(7)
  got = est.build_computation()(list(x), list(a))
  assert isinstance(got, np.float32)

  @tff.federated_computation(F32, F32)
  def trajectory(values, weights):
    return est.iterates(values, weights)

  assert got == np.float32(trajectory(list(x), list(a))[-1])


def test_private_tracks_unweighted_quantile_across_rounds():
  x, a = problem(3, m_range=(40, 41))
  est = quantiles.PrivateQuantileEstimator(
      0.8, initial_estimate=0.5, learning_rate=0.2, num_steps=3
  )
  state = est.initialize()
  for _ in range(40):
    state = est.next(state, list(x))
  got = est.report(state)
  q = oracles.weighted_quantile(x, 0.8)  # Unweighted: the process ignores a_k.
  # 1.881 against q = 1.954 (the module docstring's number): within 4%.
  assert abs(got - q) <= 0.04 * q
  # `estimate` = num_steps rounds from the initial state, weights ignored.
  state = est.initialize()
  for _ in range(3):
    state = est.next(state, list(x))
  unrolled = est.build_computation()(list(x), list(a))
  assert unrolled == pytest.approx(est.report(state), rel=1e-6)


# ---------------------------------------------------------------------------
# Only secure sums move client data to the server.


@pytest.mark.parametrize(
    'name,options,expected_calls',
    [
        ('mm', dict(num_iterations=3, lower=0.0, upper=5.0), 4),
        ('bisection', dict(lower=0.0, upper=10.0, tolerance=1e-5), 20),
        (
            'bisection',
            dict(lower=0.0, upper=10.0, tolerance=1e-5, num_buckets=32),
            4,
        ),
    ],
)
def test_secure_estimators_use_only_secure_sums(name, options, expected_calls):
  est = quantiles.build_estimator(name, level=0.5, **options)
  comp = est.build_computation()
  assert comp.type_signature.parameter[0] == F32
  assert comp.type_signature.result == tff.FederatedType(np.float32, tff.SERVER)
  uris = client_to_server_intrinsics(comp)
  assert set(uris) <= SECURE_URIS, uris
  assert len(uris) == est.num_sum_calls == expected_calls
  block = comp.to_building_block()
  assert not tree_analysis.find_unsecure_aggregation_in_tree(block)
  assert len(tree_analysis.find_secure_aggregation_in_tree(block)) == (
      expected_calls
  )


def test_private_secure_uses_secure_sums_and_controls_do_not():
  priv = quantiles.PrivateQuantileEstimator(
      0.5, initial_estimate=1.0, num_steps=2
  )
  uris = client_to_server_intrinsics(priv.build_computation())
  assert uris and set(uris) <= SECURE_URIS
  # Positive controls: the check does see insecure aggregations.
  insecure = quantiles.PrivateQuantileEstimator(
      0.5, initial_estimate=1.0, num_steps=2, secure=False
  )
  assert (
      not set(client_to_server_intrinsics(insecure.build_computation()))
      <= SECURE_URIS
  )
  exact = quantiles.ExactQuantile(0.5).build_computation()
  assert client_to_server_intrinsics(exact) == [
      intrinsic_defs.FEDERATED_AGGREGATE.uri
  ]


def test_private_with_dp_noise_builds_and_runs():
  est = quantiles.PrivateQuantileEstimator(
      0.5,
      initial_estimate=1.0,
      num_steps=2,
      noise_stddev=0.5,
      expected_num_clients=10.0,
  )
  assert set(client_to_server_intrinsics(est.build_computation())) <= (
      SECURE_URIS
  )
  state = est.initialize()
  state = est.next(state, [0.5] * 10)
  assert np.isfinite(est.report(state))
