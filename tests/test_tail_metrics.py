# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests of `tasks.tail_metrics` against independent NumPy computations."""

import fractions
import math

import numpy as np
import pytest

from tasks import tail_metrics as tm


def _replicated_quantile(values, int_weights, level):
  """Oracle: repeat each value by its weight, sort, take ceil(n*level) - 1."""
  rep = np.sort(np.repeat(np.asarray(values, float), int_weights))
  n = rep.size
  k = math.ceil(fractions.Fraction(level) * n) if level else 1
  return rep[max(k, 1) - 1]


def _objective(values, weights, theta, eta):
  w = np.asarray(weights, float) / np.sum(weights)
  return eta + np.sum(w * np.maximum(np.asarray(values) - eta, 0.0)) / theta


# ----------------------------------------------------------------- quantile


@pytest.mark.parametrize('seed', range(40))
def test_weighted_quantile_matches_replication_oracle(seed):
  rng = np.random.default_rng(seed)
  m = int(rng.integers(1, 30))
  # Few distinct values so that ties are common.
  values = rng.integers(0, 8, m).astype(float) * 0.5 + rng.normal() * 0.01
  weights = rng.integers(0, 6, m)
  weights[rng.integers(m)] += 1  # positive total
  for level in np.concatenate([rng.uniform(size=20), [0.0, 1.0]]):
    assert tm.weighted_quantile(values, level, weights) == (
        _replicated_quantile(values, weights, float(level))
    )


@pytest.mark.parametrize('seed', range(10))
def test_weighted_quantile_exact_boundaries(seed):
  # level = k / n exactly on a cumulative-weight boundary picks the k-th
  # replicated value (not the (k+1)-th), whatever the rounding of k / n * n.
  rng = np.random.default_rng(100 + seed)
  m = int(rng.integers(2, 25))
  values = rng.normal(size=m)
  weights = rng.integers(1, 5, m)
  n = int(weights.sum())
  for k in range(1, n + 1):
    level = fractions.Fraction(k, n)
    assert tm.weighted_quantile(values, k / n, weights) == (
        _replicated_quantile(values, weights, level)
    )


def test_weighted_quantile_hand_cases():
  v = [3.0, 1.0, 2.0, 2.0, 5.0]
  # Sorted 1, 2, 2, 3, 5; cumulative fractions .2 .4 .6 .8 1.
  assert tm.weighted_quantile(v, 0.0) == 1.0
  assert tm.weighted_quantile(v, 0.2) == 1.0  # exactly on the boundary
  assert tm.weighted_quantile(v, 0.21) == 2.0
  assert tm.weighted_quantile(v, 0.6) == 2.0  # tie block ends at .6
  assert tm.weighted_quantile(v, 0.61) == 3.0
  assert tm.weighted_quantile(v, 1.0) == 5.0
  # Weighted: values 10, 20, 30 with weights 1, 2, 1 -> cum .25 .75 1.
  w = [1, 2, 1]
  assert tm.weighted_quantile([30, 10, 20], 0.25, [1, 1, 2]) == 10
  assert tm.weighted_quantile([10, 20, 30], 0.25, w) == 10
  assert tm.weighted_quantile([10, 20, 30], 0.26, w) == 20
  assert tm.weighted_quantile([10, 20, 30], 0.75, w) == 20
  assert tm.weighted_quantile([10, 20, 30], 0.76, w) == 30
  # Zero-weight values are not in the support, even at level 0 and 1.
  assert tm.weighted_quantile([0, 10, 20, 99], 0.0, [0, 1, 1, 0]) == 10
  assert tm.weighted_quantile([0, 10, 20, 99], 1.0, [0, 1, 1, 0]) == 20
  # Weights need not be integers or normalised.
  assert tm.weighted_quantile([1, 2, 3], 0.5, [0.1, 0.4, 0.5]) == 2
  assert tm.weighted_quantile([1, 2, 3], 0.51, [0.1, 0.4, 0.5]) == 3
  # 0.07 * 100 rounds to 7.000000000000001; the 7th of 100 values is 7.
  assert tm.weighted_quantile(np.arange(1, 101), 0.07) == 7


def test_weighted_quantile_slack_at_rounding_boundaries():
  # Eight weights of 0.1 sum to 0.7999999999999999 < 0.8: the level-0.8
  # quantile of 1..10 is still 8 (not 9).
  assert sum([0.1] * 8) < 0.8
  assert tm.weighted_quantile(range(1, 11), 0.8, [0.1] * 10) == 8.0
  # The slack is relative to the total weight: tiny weights change nothing.
  for level, want in ((0.05, 1.0), (0.5, 5.0), (0.51, 6.0), (1.0, 10.0)):
    assert tm.weighted_quantile(range(1, 11), level, [1e-8] * 10) == want


def test_superquantile_of_many_values_is_the_tail_mean():
  v = np.arange(100.0)
  assert tm.superquantile(v, 0.1) == pytest.approx(94.5)  # mean of 90..99
  assert tm.superquantile(v, 0.25) == pytest.approx(87.0)  # mean of 75..99
  assert tm.superquantile(v[::-1], 0.5) == pytest.approx(74.5)


def test_weighted_percentiles():
  values = np.arange(1, 21, dtype=float)[::-1]  # 20 .. 1
  out = tm.weighted_percentiles(values)
  assert list(out) == [10, 20, 50, 60, 80, 90, 95]
  assert out == {
      10: 2.0,
      20: 4.0,
      50: 10.0,
      60: 12.0,
      80: 16.0,
      90: 18.0,
      95: 19.0,
  }
  weights = np.zeros(20)
  weights[values == 5] = 9  # 90% of the mass on 5
  weights[values == 17] = 1
  out = tm.weighted_percentiles(values, (0, 50, 90, 91, 100), weights)
  assert out == {0: 5.0, 50: 5.0, 90: 5.0, 91: 17.0, 100: 17.0}
  rng = np.random.default_rng(7)
  v, w = rng.normal(size=50), rng.integers(1, 9, 50)
  for p, q in tm.weighted_percentiles(v, (5, 33, 77), w).items():
    assert q == _replicated_quantile(v, w, p / 100)


# ------------------------------------------------------------ superquantile


@pytest.mark.parametrize('seed', range(25))
def test_superquantile_matches_brute_force_minimisation(seed):
  rng = np.random.default_rng(200 + seed)
  m = int(rng.integers(1, 25))
  values = np.round(rng.normal(size=m), 1)  # ties
  weights = rng.uniform(size=m) * (rng.uniform(size=m) > 0.2)
  weights[0] += 0.1
  grid = np.concatenate(
      [np.linspace(values.min() - 1, values.max() + 1, 2001), values]
  )
  for theta in [1.0, 0.95, 0.8, 0.5, 0.3, 0.1, 0.01, rng.uniform()]:
    brute = min(_objective(values, weights, theta, eta) for eta in grid)
    got = tm.superquantile(values, theta, weights)
    assert got == pytest.approx(brute, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize('seed', range(10))
def test_superquantile_is_tail_mean_for_integer_mass(seed):
  rng = np.random.default_rng(300 + seed)
  values = rng.normal(size=20)
  for k in [1, 2, 5, 10, 20]:
    expected = np.sort(values)[-k:].mean()
    assert tm.superquantile(values, k / 20) == pytest.approx(expected, 1e-12)
  # Integer weights: the tail mean of the replicated list.
  weights = rng.integers(1, 5, 20)
  rep = np.sort(np.repeat(values, weights))
  n = rep.size
  for k in range(1, n + 1):
    assert tm.superquantile(values, k / n, weights) == pytest.approx(
        rep[-k:].mean(), rel=1e-12, abs=1e-12
    )


def test_superquantile_hand_cases_and_theta_one():
  # Top 30% of [1, 2, 3, 4]: all of 4 (.25) and .05 of 3.
  assert tm.superquantile([1, 2, 3, 4], 0.3) == pytest.approx(1.15 / 0.3)
  assert tm.superquantile([4, 1, 3, 2], 0.5) == pytest.approx(3.5)
  assert tm.superquantile([1, 2, 3, 4], 0.01) == pytest.approx(4.0)
  assert tm.superquantile([7.0], 0.3) == 7.0
  rng = np.random.default_rng(9)
  v, w = rng.normal(size=30), rng.uniform(size=30)
  assert tm.superquantile(v, 1.0, w) == pytest.approx(np.average(v, weights=w))
  assert tm.superquantile(v, 1.0) == pytest.approx(v.mean())
  # Monotone in theta, between the mean and the max.
  thetas = np.linspace(0.01, 1, 50)
  s = [tm.superquantile(v, t, w) for t in thetas]
  assert np.all(np.diff(s) <= 1e-12)
  assert s[0] <= v.max() + 1e-12


# ------------------------------------------------------------- tail means


def test_lowest_highest_fraction_means():
  acc = [0.9, 0.1, 0.5, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6, 1.0, 0.0]  # m = 11
  # ceil(0.1 * 11) = 2 clients.
  assert tm.lowest_fraction_mean(acc) == pytest.approx(0.05)
  assert tm.highest_fraction_mean(acc) == pytest.approx(0.95)
  assert tm.worst_fraction_mean(acc, higher_is_worse=False) == (
      pytest.approx(0.05)
  )
  assert tm.best_fraction_mean(acc, higher_is_worse=False) == (
      pytest.approx(0.95)
  )
  assert tm.worst_fraction_mean(acc, higher_is_worse=True) == (
      pytest.approx(0.95)
  )
  assert tm.best_fraction_mean(acc, higher_is_worse=True) == (
      pytest.approx(0.05)
  )
  # m = 30: ceil(0.1 * 30) = 3.
  v = np.arange(30.0)
  assert tm.lowest_fraction_mean(v) == pytest.approx(1.0)
  assert tm.highest_fraction_mean(v) == pytest.approx(28.0)
  assert tm.lowest_fraction_mean(v, 0.5) == pytest.approx(7.0)
  assert tm.lowest_fraction_mean(v, 1.0) == pytest.approx(14.5)
  assert tm.lowest_fraction_mean([3.0, 1.0], 0.01) == 1.0  # at least one
  # 0.28 * 25 == 7.000000000000001 in floating point: still 7 clients.
  assert 0.28 * 25 > 7
  assert tm.lowest_fraction_mean(np.arange(25.0), 0.28) == pytest.approx(3.0)
  with pytest.raises(TypeError):
    tm.worst_fraction_mean(acc)  # pylint: disable=missing-kwoa


# ------------------------------------------------------- angle and entropy


def test_angle_to_uniform_degrees():
  assert tm.angle_to_uniform_degrees([0.7] * 9) == 0.0
  assert tm.angle_to_uniform_degrees([1, 0]) == pytest.approx(45.0)
  assert tm.angle_to_uniform_degrees([0, 0, 3]) == pytest.approx(
      math.degrees(math.acos(1 / math.sqrt(3)))
  )
  assert tm.angle_to_uniform_degrees([-2, -2]) == pytest.approx(180.0)
  rng = np.random.default_rng(11)
  for _ in range(20):
    v = rng.uniform(size=int(rng.integers(2, 40)))
    ones = np.ones_like(v)
    cos = v @ ones / (np.linalg.norm(v) * np.linalg.norm(ones))
    assert tm.angle_to_uniform_degrees(v) == pytest.approx(
        np.degrees(np.arccos(cos)), abs=1e-9
    )


def test_kl_to_uniform():
  assert tm.kl_to_uniform([0.4] * 5) == pytest.approx(0.0, abs=1e-15)
  assert tm.kl_to_uniform([1, 0]) == pytest.approx(math.log(2))
  assert tm.kl_to_uniform([0, 0, 0, 5]) == pytest.approx(math.log(4))
  # a = (.25, .75): KL = .25 log(.5) + .75 log(1.5).
  assert tm.kl_to_uniform([1, 3]) == pytest.approx(
      0.25 * math.log(0.5) + 0.75 * math.log(1.5)
  )
  rng = np.random.default_rng(12)
  for _ in range(20):
    v = rng.uniform(size=int(rng.integers(2, 40)))
    a = v / v.sum()
    entropy = -np.sum(a * np.log(a))
    assert tm.kl_to_uniform(v) == pytest.approx(
        np.log(v.size) - entropy, abs=1e-12
    )


# --------------------------------------------------------- summarize_clients


def test_summarize_clients_accuracy():
  acc = np.array([0.9, 0.1, 0.5, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6, 1.0])
  n = np.array([10, 20, 30, 40, 50, 60, 70, 80, 90, 100])
  s = tm.summarize_clients(acc, n, kind='accuracy')
  assert list(s) == [
      'num_clients',
      'mean',
      'weighted_mean',
      'p10',
      'p20',
      'p50',
      'p60',
      'p80',
      'p90',
      'p95',
      'worst10',
      'best10',
      'variance',
      'std',
      'sq50',
      'sq10',
      'angle_deg',
      'kl_uniform',
  ]
  assert all(isinstance(x, float) for x in s.values())
  assert s['num_clients'] == 10
  assert s['mean'] == pytest.approx(0.55)
  assert s['weighted_mean'] == pytest.approx(np.sum(acc * n) / np.sum(n))
  # Unweighted percentiles for test metrics: sorted .1 .2 ... 1.0.
  assert s['p10'] == pytest.approx(0.1)
  assert s['p50'] == pytest.approx(0.5)
  assert s['p95'] == pytest.approx(1.0)
  assert s['worst10'] == pytest.approx(0.1)
  assert s['best10'] == pytest.approx(1.0)
  assert s['variance'] == pytest.approx(np.var(acc * 100))  # percent^2
  assert s['variance'] == pytest.approx(825.0)
  assert s['std'] == pytest.approx(np.std(acc))
  # Lower tail accuracy: the worst half averages .3, the worst tenth is .1.
  assert s['sq50'] == pytest.approx(0.3)
  assert s['sq10'] == pytest.approx(0.1)
  assert s['angle_deg'] == pytest.approx(tm.angle_to_uniform_degrees(acc))
  assert s['kl_uniform'] == pytest.approx(tm.kl_to_uniform(acc))


def test_summarize_clients_weighting_rule():
  loss = np.array([1.0, 2.0, 3.0, 4.0])
  n = np.array([1, 1, 1, 97])
  train = tm.summarize_clients(loss, n, kind='train_loss')
  assert train['p20'] == 4.0 and train['p10'] == 4.0  # weighted
  assert train['sq50'] == pytest.approx(4.0)  # weighted tail
  assert train['worst10'] == 4.0 and train['best10'] == 1.0
  assert train['variance'] == pytest.approx(np.var(loss))  # no rescaling
  assert 'angle_deg' not in train and 'kl_uniform' not in train
  test = tm.summarize_clients(loss, n, kind='loss')
  assert test['p20'] == 1.0 and test['p50'] == 2.0  # unweighted
  assert test['sq50'] == pytest.approx(3.5)
  forced = tm.summarize_clients(loss, n, kind='loss', weighted_percentiles=True)
  assert forced['p20'] == 4.0
  off = tm.summarize_clients(
      loss, n, kind='train_loss', weighted_percentiles=False
  )
  assert off['p20'] == 1.0
  err = tm.summarize_clients([0.1, 0.3], [5, 5], kind='error')
  assert err['variance'] == pytest.approx(100.0)  # (10 points)^2
  assert err['worst10'] == pytest.approx(0.3)
  assert err['sq50'] == pytest.approx(0.3)
  custom = tm.summarize_clients(
      loss, n, kind='error', percentiles=(25, 75), superquantile_levels=(0.25,)
  )
  assert [k for k in custom if k[:2] in ('p2', 'p7', 'sq')] == [
      'p25',
      'p75',
      'sq25',
  ]


def test_summarize_clients_all_zero_accuracy_gives_nan_uniformity():
  s = tm.summarize_clients([0.0, 0.0, 0.0], [1, 2, 3], kind='accuracy')
  assert math.isnan(s['angle_deg']) and math.isnan(s['kl_uniform'])
  assert s['mean'] == 0.0 and s['sq10'] == 0.0


# -------------------------------------------------------------- formatting


def test_format_summary_table():
  table = tm.format_summary_table(
      {
          'test/accuracy': {
              'num_clients': 10.0,
              'mean': 0.55,
              'angle_deg': 33.333333,
          },
          'train/loss': {'num_clients': 10.0, 'mean': 1.25},
      }
  )
  lines = table.split('\n')
  assert lines[0].split() == ['metric', 'num_clients', 'mean', 'angle_deg']
  assert set(lines[1]) <= {'-', ' '}
  assert lines[2].split() == ['test/accuracy', '10', '0.55', '33.33']
  assert lines[3].split() == ['train/loss', '10', '1.25', '-']
  # Fixed width: every column ends at the same offset on every line.
  assert len(lines[0]) == len(lines[1]) == len(lines[2])
  picked = tm.format_summary_table(
      {'a': {'x': 1.5, 'y': float('nan')}}, keys=['y', 'x']
  )
  assert picked.split('\n')[2].split() == ['a', 'nan', '1.5']
  with pytest.raises(TypeError, match='mappings'):
    tm.format_summary_table({'a': 1.0})


# -------------------------------------------------------------- validation


@pytest.mark.parametrize(
    'call, error, match',
    [
        (lambda: tm.weighted_quantile([], 0.5), ValueError, 'empty'),
        (lambda: tm.weighted_quantile([1, np.nan], 0.5), ValueError, 'finite'),
        (lambda: tm.weighted_quantile([1, np.inf], 0.5), ValueError, 'finite'),
        (lambda: tm.weighted_quantile([1, 2], 1.5), ValueError, 'level'),
        (lambda: tm.weighted_quantile([1, 2], -0.1), ValueError, 'level'),
        (lambda: tm.weighted_quantile([1, 2], np.nan), ValueError, 'level'),
        (lambda: tm.weighted_quantile([1, 2], '0.5'), TypeError, 'level'),
        (
            lambda: tm.weighted_quantile([1, 2], 0.5, [1, -1]),
            ValueError,
            'nonnegative',
        ),
        (
            lambda: tm.weighted_quantile([1, 2], 0.5, [0, 0]),
            ValueError,
            'positive sum',
        ),
        (lambda: tm.weighted_quantile([1, 2], 0.5, [1]), ValueError, 'length'),
        (lambda: tm.weighted_quantile([[1, 2]], 0.5), ValueError, '1-D'),
        (lambda: tm.weighted_quantile(['a'], 0.5), TypeError, 'numeric'),
        (
            lambda: tm.weighted_percentiles([1, 2], (50, 101)),
            ValueError,
            'percentiles',
        ),
        (lambda: tm.superquantile([1, 2], 0.0), ValueError, 'theta'),
        (lambda: tm.superquantile([1, 2], 1.2), ValueError, 'theta'),
        (lambda: tm.lowest_fraction_mean([1, 2], 0.0), ValueError, 'fraction'),
        (lambda: tm.highest_fraction_mean([], 0.1), ValueError, 'empty'),
        (lambda: tm.angle_to_uniform_degrees([0, 0]), ValueError, 'undefined'),
        (lambda: tm.kl_to_uniform([0, 0]), ValueError, 'all-zero'),
        (lambda: tm.kl_to_uniform([1, -1]), ValueError, 'nonnegative'),
        (
            lambda: tm.summarize_clients([1], [1], kind='acc'),
            ValueError,
            'unknown kind',
        ),
        (
            lambda: tm.summarize_clients([1, 2], [1], kind='loss'),
            ValueError,
            'length',
        ),
        (
            lambda: tm.summarize_clients(
                [1], [1], kind='loss', percentiles=(12.5,)
            ),
            TypeError,
            'integers',
        ),
    ],
)
def test_validation(call, error, match):
  with pytest.raises(error, match=match):
    call()
