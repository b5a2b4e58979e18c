# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The tail benchmark's statistics: per-client tails, selection, pairing.

Everything here is NumPy on per-client arrays (accuracy, loss, examples per
client), so the page can be recomputed from the runs' records alone.

Per-client tail statistics (`client_stats`), chosen because they move with
the model, not by lattice steps of one client's one example:

* `mean`, `weighted_mean`: accuracy averaged over clients, or over examples;
* `p10`: the 10th percentile of accuracy across clients, interpolated
  linearly between order statistics (`numpy.percentile`);
* `worst10`: the mean accuracy of the worst 10% of clients as a
  superquantile: 1 - S(0.1) of the per-client error, the boundary client
  counted fractionally (`tasks.tail_metrics.superquantile`), so it moves
  continuously with every client near the tail;
* `loss_sq10`: S(0.1) of the per-client loss (lower is better): continuous
  even where accuracies tie;
* `variance`: of accuracy across clients, in %^2 (lower is better).

Selection (`criterion`) ranks on the validation accuracy of the worst
clients, each statistic averaged over the seeds a configuration has run:
`worst10` first; where the worst 10% are all at 0 (or 1) for every
configuration, so that `worst10` cannot separate them, the mean of the
worst 20%, 30%, 50% (`TAIL_LADDER`), then of all clients decides, and
`loss_sq10` last. So a method whose worst clients are lost at every setting
is still chosen on accuracy at the smallest tail that moves, not on a loss
that favours timid steps.
"""

import math
from collections.abc import Sequence
from typing import Optional

import numpy as np

from tasks import tail_metrics

TAIL = 0.1
# The selection's tie-breaking tails (`criterion`), after TAIL, then the mean.
TAIL_LADDER = (0.2, 0.3, 0.5)
COLUMNS = ('mean', 'weighted_mean', 'p10', 'worst10', 'loss_sq10', 'variance')
HIGHER_IS_BETTER = {
    'mean': True,
    'weighted_mean': True,
    'p10': True,
    'worst10': True,
    'loss_sq10': False,
    'variance': False,
}


def client_stats(accuracy, loss, num_examples) -> dict[str, float]:
  """The tail statistics of one evaluation (see the module docstring)."""
  acc = np.asarray(accuracy, dtype=float)
  loss = np.asarray(loss, dtype=float)
  num = np.asarray(num_examples, dtype=float)
  if acc.size == 0 or not acc.shape == loss.shape == num.shape:
    raise ValueError(
        f'per-client arrays must be non-empty and alike, got {acc.shape}, '
        f'{loss.shape}, {num.shape}'
    )
  return {
      'num_clients': float(acc.size),
      'mean': float(acc.mean()),
      'weighted_mean': float((acc * num).sum() / max(num.sum(), 1.0)),
      'p10': float(np.percentile(acc, 100 * TAIL)),
      'worst10': 1.0 - tail_metrics.superquantile(1.0 - acc, TAIL),
      'loss_sq10': tail_metrics.superquantile(loss, TAIL),
      # Exactly 0 where every client scores the same (NumPy's mean leaves
      # a 1e-28 residue there, which would decide a paired comparison).
      'variance': 0.0 if np.ptp(acc) == 0 else float(1e4 * acc.var()),
      **{
          _ladder_key(level): 1.0 - tail_metrics.superquantile(1.0 - acc, level)
          for level in TAIL_LADDER
      },
  }


def _ladder_key(level: float) -> str:
  return f'worst{round(100 * level)}'


def criterion(stats: Sequence[dict[str, float]]) -> tuple[float, ...]:
  """A configuration's selection key over its seeds' stats (lower wins)."""
  keys = ['worst10', *map(_ladder_key, TAIL_LADDER), 'mean']
  accuracy = [-float(np.mean([s[k] for s in stats])) for k in keys]
  loss = float(np.mean([s['loss_sq10'] for s in stats]))
  # Rounded to 9 decimals: means that differ only by float rounding tie
  # (but for the rare pair that straddles a rounding boundary).
  return tuple(round(v, 9) for v in accuracy + [loss])


def resolution(num_examples: Sequence[float]) -> dict[str, float]:
  """How far one example or one client can move each statistic (points).

  Returns:
    `example_median`, `example_max`: one example's move of one client's
    accuracy, 100 / n, for the median and the smallest client;
    `mean_example_median`, `mean_example_max`: the mean's move for that
    example, 100 / (n m); `worst10_example_median`, `worst10_example_max`:
    the worst-10% mean's move for one example of the median and the smallest
    client when it is in the tail, 100 / (n 0.1 m); `client_mean`,
    `client_worst10`: the mean's and the worst-10% mean's move per point
    that one client's accuracy moves, 1 / m and at most 1 / (0.1 m) (1 when
    0.1 m < 1).
  """
  n = np.asarray(num_examples, dtype=float)
  m = max(n.size, 1)
  tail = max(TAIL * m, 1.0)
  median = max(float(np.median(n)), 1.0) if n.size else 1.0
  smallest = max(float(n.min()), 1.0) if n.size else 1.0
  return {
      'example_median': 100.0 / median,
      'example_max': 100.0 / smallest,
      'mean_example_median': 100.0 / (median * m),
      'mean_example_max': 100.0 / (smallest * m),
      'worst10_example_median': 100.0 / (median * tail),
      'worst10_example_max': 100.0 / (smallest * tail),
      'client_mean': 1.0 / m,
      'client_worst10': 1.0 / tail,
  }


# Two-sided 97.5% quantiles of Student's t, by degrees of freedom.
_T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
}


def t975(dof: int) -> float:
  """Student's t 97.5% quantile (NaN for no degree of freedom)."""
  if dof < 1:
    return math.nan
  if dof in _T975:
    return _T975[dof]
  z = 1.959964  # Cornish-Fisher expansion: within 0.001 beyond 10.
  return (
      z
      + (z**3 + z) / (4 * dof)
      + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)
      + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * dof**3)
  )


PairedStats = tuple[float, float, int, int, float]


def paired(
    values: Sequence[float],
    baseline: Sequence[float],
    higher_is_better: bool = True,
) -> PairedStats:
  """Paired per-seed differences `values - baseline`, seed by seed.

  Returns:
    `(mean, std, wins, n, half_width)`: the mean and sample std (ddof 1) of
    the differences, the seeds where `values` is better, the number of
    seeds, and the 95% half-width t(n-1) std / sqrt(n) (NaN for one seed).
  """
  values = np.asarray(values, dtype=float)
  baseline = np.asarray(baseline, dtype=float)
  if values.ndim != 1 or values.shape != baseline.shape or not values.size:
    raise ValueError(
        'paired needs two equally long, non-empty per-seed lists, got '
        f'{values.shape} and {baseline.shape}'
    )
  d = values - baseline
  n = len(d)
  std = float(d.std(ddof=1)) if n > 1 else math.nan
  wins = int(np.sum(d > 0) if higher_is_better else np.sum(d < 0))
  return float(d.mean()), std, wins, n, t975(n - 1) * std / math.sqrt(n)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
  """Mean and sample std (ddof 1; NaN for one value) over seeds."""
  v = np.asarray(values, dtype=float)
  return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else math.nan


def verdict(
    mean: float, std: float, half_width: float, step: float = 0.0
) -> str:
  """Whether a paired difference is resolved by the seeds, in words.

  Args:
    mean: The mean over seeds of the paired differences.
    std: Their sample std.
    half_width: Their 95% half-width.
    step: The statistic's one-example step, in the units of `mean`: a
      difference outside the half-width but smaller than it is not called
      resolved (it is less than one example's worth).
  """
  if math.isnan(half_width):
    return 'one seed: no spread to judge by'
  # A difference of lattice values (k / n accuracies) equal on every seed
  # has a std of float rounding, not of the seeds.
  if std <= 1e-9 * max(1.0, abs(mean)):
    return (
        'identical on every seed: no spread, not resolved'
        if mean == 0.0
        else 'the same difference on every seed (a lattice step?), not '
        'called resolved'
    )
  if abs(mean) > half_width:
    if abs(mean) < step:
      return (
          "outside the 95% half-width but below one example's step, not "
          'called resolved'
      )
    return 'resolved (outside the 95% half-width)'
  return 'not resolved (inside the 95% half-width)'


def top_fraction(ranked: Sequence, keep: float) -> list:
  """The first ceil(keep * len) of `ranked` (at least one)."""
  if not ranked:
    return []
  # The slack keeps ceil(0.28 * 25) == 7 although 0.28 * 25 > 7 in floats.
  return list(ranked[: max(1, math.ceil(keep * len(ranked) - 1e-9))])


def next_value(
    values: Sequence[float],
    edge: str,
    *,
    low: Optional[float],
    high: Optional[float],
) -> Optional[float]:
  """The next value past an edge of a log-spaced grid, or None.

  One more step of the grid's outermost ratio, rounded to 2 significant
  digits; None when it would leave `[low, high]` (or not move).
  """
  if edge not in ('low', 'high'):
    raise ValueError(f"edge must be 'low' or 'high', got {edge!r}")
  v = sorted(float(x) for x in values)
  if len(v) < 2 or v[0] <= 0:
    return None
  if edge == 'high':
    step = v[-1] / v[-2]
    new = float(f'{v[-1] * step:.2g}')
    if high is not None and new > high:
      new = high if v[-1] < high else None
  else:
    step = v[1] / v[0]
    new = float(f'{v[0] / step:.2g}')
    if low is not None and new <= low:
      return None
  if new is None or v[0] <= new <= v[-1]:
    return None
  return new


# A curve has left the trivial score (the commonest class's accuracy) once
# its mean accuracy is LEAVE_MARGIN above it, and falls back when it is
# again no more than FALLBACK_MARGIN above it: the gap between the two keeps
# a slow starter that wobbles near the trivial score from counting. A curve
# that has reached the trivial score (within FALLBACK_MARGIN below it) has
# collapsed when it later drops LEAVE_MARGIN below it: worse than always
# predicting the commonest class (a slow starter rising from below is not).
LEAVE_MARGIN = 0.03
FALLBACK_MARGIN = 0.01


def fell_back(
    means: Sequence[float],
    trivial: Optional[float],
    margin: float = FALLBACK_MARGIN,
    leave: float = LEAVE_MARGIN,
) -> bool:
  """Whether a curve of mean accuracies (in evaluation order) diverged (a
  non-finite value), fell back to `trivial` + `margin` after rising above
  `trivial` + `leave`, or collapsed below `trivial` - `leave` after reaching
  `trivial` - `margin` (None: no trivial score known; only divergence
  counts)."""
  values = [float(m) for m in means]
  if any(not math.isfinite(m) for m in values):
    return True
  if trivial is None:
    return False
  left = reached = False
  for m in values:
    if (left and m <= trivial + margin) or (reached and m < trivial - leave):
      return True
    left = left or m > trivial + leave
    reached = reached or m >= trivial - margin
  return False


def within_spread(
    first: Sequence[dict[str, float]], second: Sequence[dict[str, float]]
) -> bool:
  """Whether two configurations' mean worst10 over their seeds differ by
  less than the larger of their stds over the seeds (ddof 1): the
  selection seeds cannot tell them apart."""
  a = np.asarray([s['worst10'] for s in first], dtype=float)
  b = np.asarray([s['worst10'] for s in second], dtype=float)
  if (
      a.size < 2
      or b.size < 2
      or not (np.all(np.isfinite(a)) and np.all(np.isfinite(b)))
  ):
    return False
  spread = max(float(a.std(ddof=1)), float(b.std(ddof=1)))
  return abs(float(a.mean()) - float(b.mean())) < spread
