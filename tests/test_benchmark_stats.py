# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests of the tail benchmark's statistics (`run.tail_benchmark.stats`).

Every statistic is checked against an independent computation written here:
sorted lists and exact fractions for the per-client tails, plain loops and
the standard library for means and spreads, SciPy for Student's t.
"""

import math
import statistics
from fractions import Fraction

import numpy as np
import pytest
import scipy.stats

from run.tail_benchmark import stats as bs

# ------------------------------------------------------------ by hand


def _p10_by_hand(values):
  """numpy's default (linear) percentile at 10, from the order statistics."""
  s = sorted(values)
  h = Fraction(len(s) - 1, 10)  # The 0-based fractional rank.
  lo = math.floor(h)
  hi = min(lo + 1, len(s) - 1)
  return s[lo] + float(h - lo) * (s[hi] - s[lo])


def _tail_mean_by_hand(worst_first, percent=10):
  """Mean of the first `percent`% of clients, the boundary one fractionally.

  E.g. 25 clients at 10%: 2.5 clients, the 2 first fully plus half of the
  3rd. Exact (fractions) but for the final conversion.
  """
  k = Fraction(len(worst_first) * percent, 100)
  full = math.floor(k)
  total = sum(Fraction(x) for x in worst_first[:full])
  if k > full:
    total += (k - full) * Fraction(worst_first[full])
  return float(total / k)


def _stats_by_hand(acc, loss, num):
  m = len(acc)
  mean = sum(acc) / m
  return {
      'num_clients': m,
      'mean': mean,
      'weighted_mean': sum(a * n for a, n in zip(acc, num)) / sum(num),
      'p10': _p10_by_hand(acc),
      'worst10': _tail_mean_by_hand(sorted(acc)),
      'loss_sq10': _tail_mean_by_hand(sorted(loss, reverse=True)),
      'variance': 1e4 * sum((a - mean) ** 2 for a in acc) / m,
      'worst20': _tail_mean_by_hand(sorted(acc), 20),
      'worst30': _tail_mean_by_hand(sorted(acc), 30),
      'worst50': _tail_mean_by_hand(sorted(acc), 50),
  }


def _lattice_clients(rng, m):
  """Accuracies on each client's lattice k / n (ties), losses with ties."""
  num = [int(x) for x in rng.integers(1, 12, m)]
  acc = [int(rng.integers(0, n + 1)) / n for n in num]
  loss = [float(x) for x in rng.choice([0.25, 0.5, 1.0, 1.5, 2.0, 3.0], m)]
  return acc, loss, num


# -------------------------------------------------------- client_stats


def test_client_stats_on_a_25_client_case_written_out():
  # Sorted accuracies start 0.1, 0.2, 0.4: 2.5 clients are the worst 10%.
  acc = [0.1, 0.2, 0.4] + [0.5] * 10 + [0.9] * 12
  loss = [4.0, 3.0, 2.0] + [1.0] * 22
  num = [10] * 3 + [20] * 10 + [30] * 12
  got = bs.client_stats(acc, loss, num)
  assert got['num_clients'] == 25
  assert got['worst10'] == pytest.approx((0.1 + 0.2 + 0.5 * 0.4) / 2.5)
  assert got['worst10'] == pytest.approx(0.2)  # Neither 0.7 / 3 nor 0.15.
  assert got['loss_sq10'] == pytest.approx((4.0 + 3.0 + 0.5 * 2.0) / 2.5)
  # p10: rank 0.1 * 24 = 2.4, between 0.4 and 0.5.
  assert got['p10'] == pytest.approx(0.4 + 0.4 * (0.5 - 0.4))
  mean = (0.7 + 5.0 + 10.8) / 25
  assert got['mean'] == pytest.approx(mean)
  assert got['weighted_mean'] == pytest.approx(
      (10 * 0.7 + 20 * 5.0 + 30 * 10.8) / (30 + 200 + 360)
  )
  squares = sum((a - mean) ** 2 for a in acc) / 25
  assert got['variance'] == pytest.approx(1e4 * squares)


@pytest.mark.parametrize('m', [10, 25, 50, 7])
def test_client_stats_match_an_independent_computation(m):
  rng = np.random.default_rng(m)
  for trial in range(30):
    if trial % 2:
      acc, loss, num = _lattice_clients(rng, m)
    else:  # Continuous values: no ties.
      acc = [float(x) for x in rng.uniform(0, 1, m)]
      loss = [float(x) for x in rng.exponential(1.0, m)]
      num = [int(x) for x in rng.integers(1, 200, m)]
    got = bs.client_stats(acc, loss, num)
    want = _stats_by_hand(acc, loss, num)
    assert set(got) == set(want)
    for key, value in want.items():
      assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key


def test_client_stats_count_a_tie_at_the_boundary_once():
  # 25 clients, the 3rd and 4th worst tie: half of one of them counts.
  acc = [0.0, 0.25, 0.5, 0.5] + [1.0] * 21
  got = bs.client_stats(acc, [1.0] * 25, [4] * 25)
  assert got['worst10'] == pytest.approx((0.0 + 0.25 + 0.5 * 0.5) / 2.5)
  assert got['loss_sq10'] == pytest.approx(1.0)
  # 7 clients: 0.7 of the worst client, which is all of the tail.
  got = bs.client_stats(
      [0.3, 0.9, 0.3, 0.8, 0.7, 0.6, 0.5], [1, 2, 3, 4, 5, 6, 7.5], [1] * 7
  )
  assert got['worst10'] == pytest.approx(0.3)
  assert got['loss_sq10'] == pytest.approx(7.5)
  # p10 of 7: rank 0.6 between the tied 0.3 and 0.3.
  assert got['p10'] == pytest.approx(0.3)


def test_loss_moves_where_the_worst_clients_all_tie_at_zero():
  acc = [0.0] * 5 + [0.5 + 0.02 * i for i in range(20)]
  loss = [3.0, 2.5, 2.0, 1.8, 1.7] + [0.5] * 20
  num = [10] * 25
  base = bs.client_stats(acc, loss, num)
  assert base['worst10'] == 0.0
  assert base['p10'] == 0.0
  assert base['loss_sq10'] == pytest.approx((3.0 + 2.5 + 0.5 * 2.0) / 2.5)
  # The worst client gets worse: worst10 cannot see it, loss_sq10 does.
  worse = bs.client_stats(acc, [3.5] + loss[1:], num)
  assert worse['worst10'] == 0.0
  assert worse['loss_sq10'] == pytest.approx(7.0 / 2.5)
  # So does the fractional boundary client (half of its move).
  boundary = bs.client_stats(acc, loss[:2] + [2.2] + loss[3:], num)
  assert boundary['loss_sq10'] == pytest.approx((3.0 + 2.5 + 1.1) / 2.5)
  # And the criterion ranks the lower tail loss first.
  ranked = sorted([worse, boundary, base], key=lambda s: bs.criterion([s]))
  assert ranked == [base, boundary, worse]


def test_client_stats_refuse_bad_input():
  with pytest.raises(ValueError):
    bs.client_stats([], [], [])
  with pytest.raises(ValueError):
    bs.client_stats([0.5, 0.5, 0.5], [1.0, 1.0], [3, 3, 3])
  with pytest.raises(ValueError):
    bs.client_stats([0.5, 0.5], [1.0, 1.0], [3, 3, 3])
  with pytest.raises(ValueError):
    bs.client_stats([0.5, 0.5], [1.0, 1.0], [3])


# ----------------------------------------------------------- criterion


def _stats(worst10, loss_sq10, worst20=0.5, worst30=0.5, worst50=0.5, mean=0.5):
  return {
      'worst10': worst10,
      'worst20': worst20,
      'worst30': worst30,
      'worst50': worst50,
      'mean': mean,
      'loss_sq10': loss_sq10,
  }


def test_where_worst10_ties_the_next_tail_decides_before_the_loss():
  # A model that loses its worst 10% at every setting: worst10 is 0 for
  # all; the worst 20% separate them, whatever the loss says.
  timid = [_stats(0.0, 2.0, worst20=0.10)]
  bold = [_stats(0.0, 9.0, worst20=0.25)]
  assert bs.criterion(bold) < bs.criterion(timid)
  # Each rung of the ladder decides only where those before it tie.
  ladder = ('worst20', 'worst30', 'worst50', 'mean')
  for i, key in enumerate(ladder):
    tied = {k: 0.3 for k in ladder[:i]}
    better = [_stats(0.0, 9.0, **tied, **{key: 0.4})]
    worse = [_stats(0.0, 0.1, **tied, **{key: 0.35})]
    assert bs.criterion(better) < bs.criterion(worse), key
    # But never over a better rung before it.
    if i:
      earlier = ladder[i - 1]
      above = [_stats(0.0, 9.0, **{**tied, earlier: 0.31, key: 0.0})]
      assert bs.criterion(above) < bs.criterion(better), key
  # And worst10, where it moves, decides over the whole ladder.
  assert bs.criterion([_stats(0.01, 9.0, 0.0, 0.0, 0.0, 0.0)]) < (
      bs.criterion([_stats(0.0, 0.1, 1.0, 1.0, 1.0, 1.0)])
  )


def test_the_ladder_is_computed_from_the_clients():
  # 10 clients: worst 20% = the 2 worst, 30% = 3, 50% = 5.
  acc = [0.0, 0.0, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
  got = bs.client_stats(acc, [1.0] * 10, [5] * 10)
  assert got['worst10'] == 0.0
  assert got['worst20'] == pytest.approx(0.0)
  assert got['worst30'] == pytest.approx(0.2 / 3)
  assert got['worst50'] == pytest.approx(1.0 / 5)


def test_criterion_ranks_worst10_then_loss_over_the_seeds():
  high_worst = [_stats(0.30, 9.0), _stats(0.30, 9.0)]
  low_worst = [_stats(0.29, 0.1), _stats(0.29, 0.1)]
  assert bs.criterion(high_worst) < bs.criterion(low_worst)  # Higher wins.
  low_loss = [_stats(0.30, 1.0), _stats(0.30, 2.0)]
  assert bs.criterion(low_loss) < bs.criterion(high_worst)  # Tie: lower loss.
  # The mean over the seeds, not the median, the best or the first seed.
  steady = [_stats(0.45, 1.0)] * 3
  spread = [_stats(0.6, 1.0), _stats(0.1, 1.0), _stats(0.5, 1.0)]
  assert bs.criterion(steady) < bs.criterion(spread)
  assert bs.criterion(spread[:1]) < bs.criterion(steady[:1])
  steady_loss = [_stats(0.4, 0.45)] * 3
  spread_loss = [_stats(0.4, 0.0), _stats(0.4, 1.0), _stats(0.4, 0.4)]
  assert bs.criterion(steady_loss) < bs.criterion(spread_loss)


def test_criterion_ties_what_differs_by_float_rounding_only():
  # np.mean([0.1, 0.2]) == 0.15000000000000002 but np.mean([0.3, 0.0]) == 0.15.
  a = [_stats(0.1, 0.7), _stats(0.2, 0.1)]
  b = [_stats(0.3, 0.3), _stats(0.0, 0.5)]
  assert np.mean([0.1, 0.2]) != np.mean([0.3, 0.0])
  assert bs.criterion(a) == bs.criterion(b)
  for x in (0.3, 0.7, 1.0 / 3.0, 0.123456):
    assert bs.criterion([_stats(x, x)]) == bs.criterion(
        [_stats(x + 1e-12, x - 1e-12)]
    )
    assert bs.criterion([_stats(x + 1e-6, x)]) < bs.criterion([_stats(x, x)])
    assert bs.criterion([_stats(x, x)]) < bs.criterion([_stats(x, x + 1e-6)])


def test_criterion_orders_as_an_exact_ranking_by_hand():
  rng = np.random.default_rng(3)

  def by_hand(seeds):
    worst = sum(Fraction(s['worst10']) for s in seeds) / len(seeds)
    loss = sum(Fraction(s['loss_sq10']) for s in seeds) / len(seeds)
    return (-worst, loss)

  worst_ties = 0
  for _ in range(20):
    # Dyadic lattice values: exact sums, many ties in worst10 and in loss.
    configs = [
        [
            _stats(int(rng.integers(0, 4)) / 8, int(rng.integers(0, 4)) / 4)
            for _ in range(3)
        ]
        for _ in range(6)
    ]
    got = [bs.criterion(c) for c in configs]
    want = [by_hand(c) for c in configs]
    for i in range(len(configs)):
      for j in range(len(configs)):
        assert (got[i] < got[j], got[i] == got[j]) == (
            want[i] < want[j],
            want[i] == want[j],
        )
        worst_ties += want[i][0] == want[j][0] and want[i][1] != want[j][1]
  assert worst_ties > 0  # The loss has broken ties.


# -------------------------------------------------------------- paired


def test_paired_differences_match_an_independent_computation():
  rng = np.random.default_rng(1)
  for n in (2, 3, 5, 8):
    a, b = rng.normal(size=n), rng.normal(size=n)
    mean, std, wins, count, half = bs.paired(a, b)
    d = [x - y for x, y in zip(a, b)]
    m = sum(d) / n
    s = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1))
    assert count == n and mean == pytest.approx(m) and std == pytest.approx(s)
    assert wins == sum(x > 0 for x in d)
    want = scipy.stats.t.ppf(0.975, n - 1) * s / math.sqrt(n)
    assert half == pytest.approx(want, rel=1e-3)
    # Outside the half-width exactly when a paired t-test rejects at 5%.
    p = scipy.stats.ttest_rel(a, b).pvalue
    assert (abs(m) > half) == (p < 0.05) or abs(p - 0.05) < 1e-3
    _, _, lower_wins, _, _ = bs.paired(a, b, higher_is_better=False)
    assert lower_wins == sum(x < 0 for x in d)
  # Ties are wins for neither side.
  assert bs.paired([0.5, 0.6, 0.7], [0.5, 0.5, 0.8])[2] == 1
  assert bs.paired([0.5, 0.6, 0.7], [0.5, 0.5, 0.8], False)[2] == 1


def test_paired_with_one_seed_has_no_spread():
  mean, std, wins, n, half = bs.paired([0.75], [0.5])
  assert (mean, wins, n) == (0.25, 1, 1)
  assert math.isnan(std) and math.isnan(half)


def test_paired_pairs_seed_by_seed():
  values, baseline = [0.9, 0.1, 0.5], [0.2, 0.6, 0.4]
  d = [0.7, -0.5, 0.1]  # Seed by seed.
  m = sum(d) / 3
  s = math.sqrt(sum((x - m) ** 2 for x in d) / 2)
  mean, std, wins, n, _ = bs.paired(values, baseline)
  assert (wins, n) == (2, 3)
  assert mean == pytest.approx(m) and std == pytest.approx(s)
  # Sorting either list (or both) first changes the wins or the spread.
  for v, b in (
      (sorted(values), baseline),
      (values, sorted(baseline)),
      (sorted(values), sorted(baseline)),
  ):
    other = [x - y for x, y in zip(v, b)]
    assert sum(x > 0 for x in other) != wins or not math.isclose(
        statistics.stdev(other), s
    )


def test_t975_matches_scipy():
  for dof in range(1, 41):
    assert bs.t975(dof) == pytest.approx(
        scipy.stats.t.ppf(0.975, dof), rel=1e-3
    )
  assert math.isnan(bs.t975(0))


# ------------------------------------------------------------ mean_std


def test_mean_std_is_the_sample_std():
  mean, std = bs.mean_std([1.0, 2.0, 3.0, 4.0])
  assert mean == 2.5
  assert std == pytest.approx(math.sqrt(5.0 / 3.0))  # ddof 0: sqrt(1.25).
  rng = np.random.default_rng(4)
  for n in (2, 3, 7):
    x = [float(v) for v in rng.normal(size=n)]
    mean, std = bs.mean_std(x)
    assert mean == pytest.approx(statistics.fmean(x))
    assert std == pytest.approx(statistics.stdev(x))
  mean, std = bs.mean_std([0.4])
  assert mean == 0.4 and math.isnan(std)


# ------------------------------------------------------------- verdict


def test_verdict_resolves_only_outside_the_half_width_with_spread():
  assert bs.verdict(0.5, 0.1, 0.3).startswith('resolved')
  assert bs.verdict(-0.5, 0.1, 0.3).startswith('resolved')
  assert bs.verdict(0.3, 0.1, 0.3).startswith('not resolved')  # On the edge.
  assert bs.verdict(-0.2, 0.1, 0.3).startswith('not resolved')
  # No spread is never resolved, even outside a zero half-width.
  for mean in (0.125, -0.125, 0.0):
    assert 'resolved' in bs.verdict(mean, 0.0, 0.0)
    assert not bs.verdict(mean, 0.0, 0.0).startswith('resolved')
  assert 'one seed' in bs.verdict(0.5, math.nan, math.nan)


def test_verdict_does_not_resolve_a_difference_below_one_examples_step():
  # Outside the half-width, but less than one example's worth.
  assert bs.verdict(0.002, 0.0005, 0.001, step=0.0025).startswith('outside')
  assert 'not called resolved' in bs.verdict(-0.002, 0.0005, 0.001, 0.0025)
  assert bs.verdict(0.003, 0.0005, 0.001, step=0.0025).startswith('resolved')
  assert bs.verdict(0.002, 0.0005, 0.001).startswith('resolved')  # No step.
  # Inside the half-width stays "not resolved" whatever the step.
  assert bs.verdict(0.002, 0.01, 0.02, 0.0025).startswith('not resolved')


def test_verdict_of_a_lattice_difference_equal_on_every_seed():
  # k/8 accuracies subtract exactly: std 0, not resolved.
  mean, std, _, _, half = bs.paired(
      [5 / 8, 6 / 8, 7 / 8], [4 / 8, 5 / 8, 6 / 8]
  )
  assert (mean, std, half) == (0.125, 0.0, 0.0)
  assert not bs.verdict(mean, std, half).startswith('resolved')
  mean, std, _, _, half = bs.paired([0.5, 0.5], [0.5, 0.5])
  assert not bs.verdict(mean, std, half).startswith('resolved')
  mean, std, _, _, half = bs.paired([0.75], [0.5])
  assert 'one seed' in bs.verdict(mean, std, half)


def test_verdict_of_a_non_dyadic_lattice_step_on_every_seed():
  # Each client-accuracy is correct / 20; every seed gains one example.
  mean, std, _, _, half = bs.paired(
      [11 / 20, 12 / 20, 14 / 20], [10 / 20, 11 / 20, 13 / 20]
  )
  assert not bs.verdict(mean, std, half).startswith('resolved')


# ---------------------------------------------------------- next_value


def _two_digits(x):
  return round(x, 1 - math.floor(math.log10(x)))


def test_next_value_takes_one_more_log_step():
  grid = (0.01, 0.03, 0.1)
  assert bs.next_value(grid, 'high', low=None, high=None) == 0.33
  assert bs.next_value(grid, 'low', low=None, high=None) == 0.0033
  assert bs.next_value((0.1, 0.01, 0.03), 'high', low=None, high=None) == 0.33
  assert bs.next_value((0.1, 1.0, 10.0), 'high', low=0.0, high=1e3) == 100.0
  rng = np.random.default_rng(5)
  for _ in range(50):
    start, ratio = rng.uniform(0.01, 1.0), rng.uniform(1.5, 5.0)
    grid = [start * ratio**i for i in range(3)]
    assert bs.next_value(grid, 'high', low=None, high=None) == pytest.approx(
        _two_digits(grid[2] * grid[2] / grid[1]), rel=1e-12
    )
    assert bs.next_value(grid, 'low', low=None, high=None) == pytest.approx(
        _two_digits(grid[0] / (grid[1] / grid[0])), rel=1e-12
    )


def test_next_value_stays_in_its_range():
  # High bound inclusive: clamp onto it once, then stop.
  theta = (0.2, 0.4, 0.8)
  assert bs.next_value(theta, 'high', low=0.0, high=1.0) == 1.0
  assert bs.next_value((0.4, 0.8, 1.0), 'high', low=0.0, high=1.0) is None
  assert bs.next_value((0.25, 0.5), 'high', low=0.0, high=1.0) == 1.0
  assert bs.next_value((0.4, 0.8), 'high', low=0.0, high=1.6) == 1.6
  # Low bound exclusive: landing on it is leaving.
  assert bs.next_value((0.1, 1.0, 10.0), 'low', low=0.01, high=None) is None
  assert bs.next_value((0.1, 1.0, 10.0), 'low', low=0.005, high=None) == 0.01
  assert bs.next_value((0.2, 0.4, 0.8), 'low', low=0.0, high=1.0) == 0.1
  assert bs.next_value((0.2, 0.4, 0.8), 'low', low=0.15, high=1.0) is None
  # One value: no step.
  for edge in ('low', 'high'):
    assert bs.next_value((0.1,), edge, low=None, high=None) is None


# ------------------------------------------- top_fraction and resolution


def test_top_fraction_keeps_the_ceiling_in_order():
  ranked = ['f', 'c', 'a', 'e', 'b', 'd', 'h', 'g', 'i', 'j', 'k', 'l']
  for n in range(1, len(ranked) + 1):
    assert bs.top_fraction(ranked[:n], 1 / 3) == ranked[: -(-n // 3)]
    assert bs.top_fraction(tuple(ranked[:n]), 0.5) == ranked[: -(-n // 2)]
    assert bs.top_fraction(ranked[:n], 0.01) == ranked[:1]
    assert bs.top_fraction(ranked[:n], 0.0) == ranked[:1]  # At least one.
  assert bs.top_fraction(ranked[:7], 0.3) == ranked[:3]  # 2.1 -> 3.
  assert not bs.top_fraction([], 0.5)


def test_resolution_in_points():
  num = [10, 40, 25, 100, 5]
  got = bs.resolution(num)
  assert got['example_median'] == pytest.approx(100 / 25)
  assert got['example_max'] == pytest.approx(100 / 5)  # The smallest client.
  assert got['mean_example_median'] == pytest.approx(100 / 25 / 5)
  assert got['mean_example_max'] == pytest.approx(100 / 5 / 5)
  assert got['worst10_example_max'] == pytest.approx(100 / 5)  # 0.5 < 1.
  assert got['client_mean'] == pytest.approx(1 / 5)
  assert got['client_worst10'] == pytest.approx(1.0)
  num = [int(x) for x in np.random.default_rng(6).integers(2, 500, 30)]
  s = sorted(num)
  got = bs.resolution(num)
  median = (s[14] + s[15]) / 2
  assert got['example_median'] == pytest.approx(100 / median)
  assert got['example_max'] == pytest.approx(100 / s[0])
  assert got['mean_example_median'] == pytest.approx(100 / median / 30)
  assert got['mean_example_max'] == pytest.approx(100 / s[0] / 30)
  assert got['worst10_example_max'] == pytest.approx(100 / s[0] / 3)
  assert got['worst10_example_median'] == pytest.approx(100 / median / 3)
  assert got['client_mean'] == pytest.approx(1 / 30)
  assert got['client_worst10'] == pytest.approx(1 / 3)


def test_resolution_steps_are_the_statistics_moves():
  # Independent check: move one example of a client and recompute.
  rng = np.random.default_rng(3)
  num = rng.integers(20, 300, 40).astype(float)
  correct = np.floor(num * rng.uniform(0.2, 0.6, 40))
  got = bs.resolution(num)
  small = int(np.argmin(num))
  correct[small] = 0  # The smallest client is the worst, in the tail.
  acc = correct / num
  moved = correct.copy()
  moved[small] += 1
  acc2 = moved / num
  assert 100 * (acc2.mean() - acc.mean()) == pytest.approx(
      got['mean_example_max']
  )
  worst = np.sort(acc)[:4].mean()  # 0.1 * 40 = 4 whole clients.
  worst2 = np.sort(acc2)[:4].mean()
  assert 100 * (worst2 - worst) == pytest.approx(got['worst10_example_max'])
  before = bs.client_stats(acc, np.ones(40), num)['worst10']
  after = bs.client_stats(acc2, np.ones(40), num)['worst10']
  assert 100 * (after - before) == pytest.approx(got['worst10_example_max'])


def test_fell_back_is_a_return_to_the_trivial_score_or_a_collapse_below_it():
  trivial = 0.2
  # Never left (a slow starter at the trivial score): not a fall-back, nor
  # a wobble above and below its fall-back line that never rose 3 points.
  assert not bs.fell_back([0.2, 0.205, 0.209], trivial)
  assert not bs.fell_back([0.2, 0.225, 0.205, 0.228, 0.2], trivial)
  # Left, then back to within the margin (1 point) of it.
  assert bs.fell_back([0.25, 0.4, 0.21], trivial)
  assert bs.fell_back([0.25, 0.1, 0.45], trivial)  # Below, recovered.
  # Left and stayed above, however it wobbles.
  assert not bs.fell_back([0.25, 0.22, 0.45], trivial)
  # At the trivial score, then 3 points below it: collapsed (AFL at lr 3 on
  # Shakespeare's reported seed 3: 0.232, 0.093, 0.237, ...), recovered or
  # not; a wobble less than 3 points below is not.
  assert bs.fell_back([0.2, 0.1, 0.4], trivial)
  assert bs.fell_back([0.05, 0.195, 0.16], trivial)
  assert not bs.fell_back([0.2, 0.175, 0.4], trivial)
  # A slow starter rising from below never reached it: not a collapse.
  assert not bs.fell_back([0.02, 0.1, 0.15, 0.3], trivial)
  assert not bs.fell_back([0.02, 0.185, 0.05], trivial)
  # Non-finite: diverged, whatever the trivial score.
  assert bs.fell_back([0.3, float('nan')], None)
  assert not bs.fell_back([0.3, 0.1], None)  # Unknown: only divergence.
  # An independent reading: some point above the upper line precedes one at
  # or below the fall-back line, or one at the trivial score (within the
  # margin below it) precedes one below the collapse line.
  rng = np.random.default_rng(0)
  for _ in range(400):
    curve = list(rng.uniform(0.1, 0.3, size=5))
    pairs = [(i, j) for i in range(5) for j in range(i + 1, 5)]
    expected = any(
        curve[i] > trivial + bs.LEAVE_MARGIN
        and curve[j] <= trivial + bs.FALLBACK_MARGIN
        for i, j in pairs
    ) or any(
        curve[i] >= trivial - bs.FALLBACK_MARGIN
        and curve[j] < trivial - bs.LEAVE_MARGIN
        for i, j in pairs
    )
    assert bs.fell_back(curve, trivial) == expected


def test_within_spread_compares_the_mean_gap_with_the_larger_std():
  def runs(values):
    return [{'worst10': v} for v in values]

  # Means 0.5 and 0.52, stds 0.141 and 0: within.
  assert bs.within_spread(runs([0.4, 0.6]), runs([0.52, 0.52]))
  # Means 0.5 and 0.7, stds 0.1: apart.
  assert not bs.within_spread(runs([0.45, 0.55]), runs([0.65, 0.75]))
  assert not bs.within_spread(runs([0.5]), runs([0.5]))  # One seed.
  assert not bs.within_spread(runs([-np.inf, 0.5]), runs([0.5, 0.5]))
