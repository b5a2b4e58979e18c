# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tail, fairness and uniformity summaries of per-client metrics (pure NumPy).

Sources: thesis section 1.2 of spec `thesis_algorithms.md` (Def 1 fairness as
the spread of per-device accuracy; Defs 8-10 uniformity: variance, angle to
the all-ones vector, KL to uniform; worst / best 10% of devices) and spec
`fedplus_deltafl.md` B.2 (quantile and superquantile), B.3 Property 7
(weighted quantile) and B.11 "Evaluation" (weighted percentiles of train loss,
unweighted percentiles of test error).

Conventions (decisions where the sources are silent):

* Quantile (`weighted_quantile`): the smallest value v whose cumulative weight
  fraction W(X <= v) reaches the level; no interpolation; ties merged; values
  of zero weight are ignored. This is Delta-FL Property 7 and the reference
  code's `sorted_replicated[ceil(n * level) - 1]` for integer weights. Level 0
  gives the smallest value of positive weight, level 1 the largest. Cumulative
  fractions within 1e-10 (relative to the total weight) below the level count
  as reaching it, so that the rounding of `level * total` (e.g.
  `0.07 * 100 == 7.000000000000001`) does not move the result by one value.
* Superquantile (`superquantile`): "higher is worse" orientation, S(theta) =
  min_eta eta + (1/theta) sum_k w_k (v_k - eta)_+, i.e. the mean of the
  highest theta fraction of mass, the boundary atom split fractionally;
  computed exactly for discrete distributions.
* Worst / best 10%: the mean over the ceil(0.1 m) lowest / highest of the m
  values, unweighted over clients (thesis 1.2 leaves this unspecified).
* Angle (Def 9): degrees between the vector and the all-ones vector, computed
  as atan2(std, mean), identical to arccos(mean / sqrt(mean of squares)) but
  exact (0) for a constant vector. Undefined (ValueError) for all-zero input.
* KL to uniform (Def 10): KL(a || u) = log m - H(a), a = values / sum, with
  0 log 0 = 0. Values must be nonnegative with a positive sum.
* Every input must be a finite 1-D numeric vector; NaN or inf is a ValueError.

Keys of `summarize_clients` (they become CSV columns):

  =================  =========================================================
  key                meaning
  =================  =========================================================
  num_clients        number of clients m
  mean               unweighted mean over clients
  weighted_mean      mean weighted by `num_examples`
  p10 ... p95        percentiles (default 10, 20, 50, 60, 80, 90, 95); weighted
                     by examples for kind 'train_loss', unweighted otherwise
                     (B.11), unless `weighted_percentiles` overrides it
  worst10, best10    mean of the ceil(0.1 m) worst / best clients (worst =
                     lowest for 'accuracy', highest for 'error', 'loss',
                     'train_loss'); unweighted
  variance           population variance over clients (ddof 0); for
                     'accuracy' and 'error' in percent^2 (values * 100 first,
                     as thesis ch. 4 tables); otherwise in squared units
  std                population standard deviation in the metric's own units
                     (a fraction for 'accuracy' / 'error', as thesis ch. 5)
  sq50, sq10         superquantiles at theta = 0.5, 0.1 (`superquantile_levels`)
                     on the "worse is higher" orientation, reported in the
                     metric's own units: for losses / errors the mean of the
                     worst theta mass of values; for 'accuracy' 1 - S(1 - acc),
                     the mean accuracy of the worst theta mass. Same weighting
                     as the percentiles
  angle_deg          ('accuracy' only) Def 9 angle in degrees; NaN if all zero
  kl_uniform         ('accuracy' only) Def 10 KL(a || u); NaN if all zero
  =================  =========================================================
"""

import collections
import math
import numbers
from typing import Mapping, Optional, Sequence, Union

import numpy as np

KINDS = ('accuracy', 'error', 'loss', 'train_loss')
DEFAULT_PERCENTILES = (10, 20, 50, 60, 80, 90, 95)
DEFAULT_SUPERQUANTILE_LEVELS = (0.5, 0.1)
TAIL_FRACTION = 0.1
# Relative slack on cumulative weight fractions (see module docstring).
_SLACK = 1e-10

Number = Union[int, float]


def _as_vector(values, name: str) -> np.ndarray:
  """A finite nonempty 1-D float64 copy of `values`."""
  array = np.asarray(values)
  if array.dtype.kind not in 'biuf':
    raise TypeError(f'{name} must be numeric, got dtype {array.dtype}')
  if array.ndim != 1:
    raise ValueError(f'{name} must be 1-D, got shape {array.shape}')
  if array.size == 0:
    raise ValueError(f'{name} must not be empty')
  array = array.astype(np.float64)
  if not np.all(np.isfinite(array)):
    raise ValueError(f'{name} must be finite (no NaN or inf), got {array}')
  return array


def _as_weights(weights, size: int) -> np.ndarray:
  """Validated weights of length `size`; uniform when `weights` is None."""
  if weights is None:
    return np.ones(size)
  w = _as_vector(weights, 'weights')
  if w.size != size:
    raise ValueError(
        f'weights must have the length of values ({size}), got {w.size}'
    )
  if np.any(w < 0):
    raise ValueError(f'weights must be nonnegative, got {w}')
  if not w.sum() > 0:
    raise ValueError('weights must have a positive sum')
  return w


def _check_real(x, name: str) -> float:
  if isinstance(x, bool) or not isinstance(x, numbers.Real):
    raise TypeError(f'{name} must be a real number, got {x!r}')
  return float(x)


def _sorted_support(values, weights) -> tuple[np.ndarray, np.ndarray]:
  """Values of positive weight sorted ascending, and their weights."""
  v = _as_vector(values, 'values')
  w = _as_weights(weights, v.size)
  keep = w > 0
  v, w = v[keep], w[keep]
  order = np.argsort(v, kind='stable')
  return v[order], w[order]


def _quantile_indices(w_sorted: np.ndarray, levels: np.ndarray) -> np.ndarray:
  """Indices j* = min{j : sum_{i <= j} w_i >= level * total} (with slack)."""
  cum = np.cumsum(w_sorted)
  total = cum[-1]
  idx = np.searchsorted(cum, levels * total - _SLACK * total, side='left')
  return np.minimum(idx, w_sorted.size - 1)


def weighted_quantile(
    values: Sequence[Number],
    level: float,
    weights: Optional[Sequence[Number]] = None,
) -> float:
  """The smallest v with weighted fraction of values <= v at least `level`.

  Delta-FL Property 7 convention (spec B.3): sort ascending, merge ties, and
  return the first value at which the cumulative weight reaches
  `level * sum(weights)`; no interpolation. For integer weights this is
  element `ceil(n * level) - 1` (0-based) of the sorted list in which each
  value is repeated by its weight (n = total weight), as in the Delta-FL
  reference code. Level 0 gives the smallest value of positive weight.

  Args:
    values: Finite values, 1-D.
    level: Level in [0, 1].
    weights: Nonnegative weights with a positive sum; uniform if None.

  Returns:
    The quantile, one of `values`.

  Raises:
    ValueError: Empty or non-finite input, negative or all-zero weights,
      mismatched lengths, or `level` outside [0, 1].
    TypeError: Non-numeric input.
  """
  level = _check_real(level, 'level')
  if not 0.0 <= level <= 1.0:
    raise ValueError(f'level must be in [0, 1], got {level}')
  v, w = _sorted_support(values, weights)
  return float(v[_quantile_indices(w, np.array([level]))[0]])


def weighted_percentiles(
    values: Sequence[Number],
    percentiles: Sequence[Number] = DEFAULT_PERCENTILES,
    weights: Optional[Sequence[Number]] = None,
) -> dict[Number, float]:
  """`weighted_quantile(values, p / 100, weights)` for each p in `percentiles`.

  Args:
    values: Finite values, 1-D.
    percentiles: Percentiles in [0, 100].
    weights: Nonnegative weights with a positive sum; uniform if None.

  Returns:
    A dict from each percentile (as given) to its value, in the given order.

  Raises:
    ValueError: As `weighted_quantile`, or a percentile outside [0, 100].
    TypeError: Non-numeric input.
  """
  return _percentiles(values, percentiles, weights)


def _percentiles(values, percentiles, weights) -> dict[Number, float]:
  ps = [_check_real(p, 'percentile') for p in percentiles]
  for p in ps:
    if not 0.0 <= p <= 100.0:
      raise ValueError(f'percentiles must be in [0, 100], got {p}')
  v, w = _sorted_support(values, weights)
  idx = _quantile_indices(w, np.array(ps, dtype=np.float64) / 100.0)
  return {p: float(v[i]) for p, i in zip(percentiles, idx)}


def superquantile(
    values: Sequence[Number],
    theta: float,
    weights: Optional[Sequence[Number]] = None,
) -> float:
  """The (1 - theta)-superquantile S(theta) of the weighted values (spec B.2).

  S(theta) = min_eta { eta + (1/theta) sum_k w_k (v_k - eta)_+ } with the
  weights normalised to sum 1: the mean of the highest `theta` fraction of
  mass, the atom at the boundary counted fractionally ("higher is worse").
  The objective is convex and piecewise linear with kinks at the values, and
  the (1 - theta) weighted quantile minimises it (Property 7), so it is
  evaluated there (and, against rounding, at the neighbouring values): the
  result is exact for discrete distributions. theta = 1 gives the weighted
  mean; theta -> 0 tends to the maximum.

  Args:
    values: Finite values, 1-D.
    theta: Tail mass in (0, 1].
    weights: Nonnegative weights with a positive sum; uniform if None.

  Returns:
    S(theta).

  Raises:
    ValueError: As `weighted_quantile`, or `theta` outside (0, 1].
    TypeError: Non-numeric input.
  """
  theta = _check_real(theta, 'theta')
  if not 0.0 < theta <= 1.0:
    raise ValueError(f'theta must be in (0, 1], got {theta}')
  v, w = _sorted_support(values, weights)
  w = w / w.sum()
  j = int(_quantile_indices(w, np.array([1.0 - theta]))[0])
  candidates = v[max(j - 1, 0) : j + 2]
  objective = (
      candidates
      + (np.maximum(v[None, :] - candidates[:, None], 0.0) @ w) / theta
  )
  return float(objective.min())


def _tail_count(size: int, fraction: float) -> int:
  fraction = _check_real(fraction, 'fraction')
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f'fraction must be in (0, 1], got {fraction}')
  # The slack keeps ceil(0.28 * 25) == 7 although 0.28 * 25 > 7 in floats.
  return max(1, math.ceil(fraction * size * (1.0 - _SLACK)))


def lowest_fraction_mean(
    values: Sequence[Number], fraction: float = TAIL_FRACTION
) -> float:
  """Unweighted mean of the ceil(fraction * m) lowest of the m values.

  The ceil makes the tail nonempty and at least `fraction` of the clients
  (thesis 1.2 "worst 10%" for accuracies; the exact rule is unspecified).

  Args:
    values: Finite values, 1-D.
    fraction: Fraction of clients in (0, 1].

  Returns:
    The mean of the lowest values.

  Raises:
    ValueError: Empty or non-finite input, or `fraction` outside (0, 1].
    TypeError: Non-numeric input.
  """
  v = np.sort(_as_vector(values, 'values'))
  return float(v[: _tail_count(v.size, fraction)].mean())


def highest_fraction_mean(
    values: Sequence[Number], fraction: float = TAIL_FRACTION
) -> float:
  """Unweighted mean of the ceil(fraction * m) highest of the m values.

  See `lowest_fraction_mean` for the conventions.

  Args:
    values: Finite values, 1-D.
    fraction: Fraction of clients in (0, 1].

  Returns:
    The mean of the highest values.

  Raises:
    ValueError: Empty or non-finite input, or `fraction` outside (0, 1].
    TypeError: Non-numeric input.
  """
  v = np.sort(_as_vector(values, 'values'))
  return float(v[v.size - _tail_count(v.size, fraction) :].mean())


def worst_fraction_mean(
    values: Sequence[Number],
    fraction: float = TAIL_FRACTION,
    *,
    higher_is_worse: bool,
) -> float:
  """Mean of the worst ceil(fraction * m) values; `higher_is_worse` required.

  Args:
    values: Finite values, 1-D.
    fraction: Fraction of clients in (0, 1].
    higher_is_worse: True for errors and losses, False for accuracies.

  Returns:
    `highest_fraction_mean` if `higher_is_worse` else `lowest_fraction_mean`.
  """
  if higher_is_worse:
    return highest_fraction_mean(values, fraction)
  return lowest_fraction_mean(values, fraction)


def best_fraction_mean(
    values: Sequence[Number],
    fraction: float = TAIL_FRACTION,
    *,
    higher_is_worse: bool,
) -> float:
  """Mean of the best ceil(fraction * m) values; `higher_is_worse` required.

  Args:
    values: Finite values, 1-D.
    fraction: Fraction of clients in (0, 1].
    higher_is_worse: True for errors and losses, False for accuracies.

  Returns:
    `lowest_fraction_mean` if `higher_is_worse` else `highest_fraction_mean`.
  """
  if higher_is_worse:
    return lowest_fraction_mean(values, fraction)
  return highest_fraction_mean(values, fraction)


def angle_to_uniform_degrees(values: Sequence[Number]) -> float:
  """Angle in degrees between `values` and the all-ones vector (Def 9).

  cos(angle) = mean(v) / sqrt(mean(v^2)); computed as
  atan2(std(v), mean(v)) (population std), which is the same angle and is
  exactly 0 for a constant positive vector. 0 is most uniform.

  Args:
    values: Finite values, 1-D, not all zero.

  Returns:
    The angle in [0, 180] degrees.

  Raises:
    ValueError: Empty, non-finite or all-zero input (the angle is undefined).
    TypeError: Non-numeric input.
  """
  v = _as_vector(values, 'values')
  if not np.any(v != 0):
    raise ValueError('the angle to the all-ones vector is undefined for zeros')
  mean = v.mean()
  std = math.sqrt(np.mean((v - mean) ** 2))
  return math.degrees(math.atan2(std, mean))


def kl_to_uniform(values: Sequence[Number]) -> float:
  """KL(a || u) = log m - H(a), a = values / sum(values), u uniform (Def 10).

  Zero entries contribute 0 (0 log 0 = 0). 0 is most uniform; the maximum,
  log m, is reached when one entry holds all the mass.

  Args:
    values: Finite nonnegative values, 1-D, with a positive sum.

  Returns:
    The KL divergence in nats.

  Raises:
    ValueError: Empty, non-finite or negative input, or an all-zero vector.
    TypeError: Non-numeric input.
  """
  v = _as_vector(values, 'values')
  if np.any(v < 0):
    raise ValueError(f'values must be nonnegative, got {v}')
  if not v.sum() > 0:
    raise ValueError('KL to uniform is undefined for an all-zero vector')
  a = v / v.sum()
  a = a[a > 0]
  return float(max(np.sum(a * np.log(a * v.size)), 0.0))


def summarize_clients(
    metric_values: Sequence[Number],
    num_examples: Sequence[Number],
    *,
    kind: str,
    weighted_percentiles: Optional[bool] = None,
    percentiles: Sequence[int] = DEFAULT_PERCENTILES,
    superquantile_levels: Sequence[float] = DEFAULT_SUPERQUANTILE_LEVELS,
) -> dict[str, float]:
  """The summary of one per-client metric vector (keys: module docstring).

  Weighting rule (spec B.11): percentiles and superquantiles are weighted by
  `num_examples` for kind 'train_loss' and unweighted over clients for
  'accuracy', 'error' and 'loss' (test metrics); `weighted_percentiles`
  overrides the rule when not None. `weighted_mean` is always weighted and
  `mean`, `worst10`, `best10`, `variance`, `std`, `angle_deg` and
  `kl_uniform` are always unweighted over clients.

  Args:
    metric_values: One finite value per client.
    num_examples: Nonnegative example counts (one per client), positive sum.
    kind: 'accuracy' (higher is better; adds `angle_deg`, `kl_uniform`),
      'error' (a fraction, higher is worse), 'loss' or 'train_loss'.
    weighted_percentiles: Override of the weighting rule.
    percentiles: Percentiles reported as keys `p<percentile>`; integers in
      [0, 100].
    superquantile_levels: Thetas in (0, 1] reported as keys
      `sq<round(100 * theta)>`.

  Returns:
    A dict from key to float, in a stable order.

  Raises:
    ValueError: Unknown `kind`, invalid values or weights, mismatched lengths,
      or levels out of range.
    TypeError: Non-numeric input or non-integer percentiles.
  """
  if kind not in KINDS:
    raise ValueError(f'unknown kind {kind!r}; choose one of {", ".join(KINDS)}')
  for p in percentiles:
    if isinstance(p, bool) or not isinstance(p, numbers.Integral):
      raise TypeError(f'percentiles must be integers, got {p!r}')
  v = _as_vector(metric_values, 'metric_values')
  n = _as_weights(num_examples, v.size)
  if weighted_percentiles is None:
    weighted_percentiles = kind == 'train_loss'
  tail_weights = n if weighted_percentiles else None
  higher_is_worse = kind != 'accuracy'

  out = collections.OrderedDict()
  out['num_clients'] = float(v.size)
  out['mean'] = float(v.mean())
  out['weighted_mean'] = float(np.sum(v * n) / np.sum(n))
  for p, q in _percentiles(v, percentiles, tail_weights).items():
    out[f'p{int(p)}'] = q
  out['worst10'] = worst_fraction_mean(
      v, TAIL_FRACTION, higher_is_worse=higher_is_worse
  )
  out['best10'] = best_fraction_mean(
      v, TAIL_FRACTION, higher_is_worse=higher_is_worse
  )
  scale = 100.0 if kind in ('accuracy', 'error') else 1.0
  centred = v - v.mean()
  out['variance'] = float(np.mean((scale * centred) ** 2))
  out['std'] = float(math.sqrt(np.mean(centred**2)))
  for theta in superquantile_levels:
    key = f'sq{round(100 * _check_real(theta, "theta"))}'
    if higher_is_worse:
      out[key] = superquantile(v, theta, tail_weights)
    else:
      out[key] = 1.0 - superquantile(1.0 - v, theta, tail_weights)
  if kind == 'accuracy':
    all_zero = not np.any(v != 0)
    out['angle_deg'] = math.nan if all_zero else angle_to_uniform_degrees(v)
    out['kl_uniform'] = math.nan if all_zero else kl_to_uniform(v)
  return dict(out)


def _format_cell(value, float_format: str) -> str:
  if value is None:
    return '-'
  if isinstance(value, numbers.Integral):
    return str(int(value))
  value = float(value)
  if math.isfinite(value) and value.is_integer() and abs(value) < 1e15:
    return str(int(value))
  return format(value, float_format)


def format_summary_table(
    summaries: Mapping[str, Mapping[str, float]],
    keys: Optional[Sequence[str]] = None,
    *,
    float_format: str = '.4g',
) -> str:
  """A fixed-width plain-text table: one row per metric, one column per key.

  Args:
    summaries: Metric name (e.g. 'test/accuracy') -> `summarize_clients`
      output (or any key -> number mapping).
    keys: Columns, in order; default the keys of all summaries in order of
      first appearance. A key missing from a row shows as '-'.
    float_format: Format spec of non-integral numbers.

  Returns:
    The table, lines joined by newlines, with a header line and a rule; no
    trailing newline.

  Raises:
    TypeError: `summaries` is not a mapping of mappings.
  """
  if not isinstance(summaries, Mapping) or not all(
      isinstance(row, Mapping) for row in summaries.values()
  ):
    raise TypeError('summaries must map metric names to mappings of numbers')
  if keys is None:
    keys = list(dict.fromkeys(k for row in summaries.values() for k in row))
  else:
    keys = list(keys)
  header = ['metric'] + keys
  rows = [
      [str(name)] + [_format_cell(row.get(k), float_format) for k in keys]
      for name, row in summaries.items()
  ]
  widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]

  def line(cells):
    first = cells[0].ljust(widths[0])
    rest = [c.rjust(wd) for c, wd in zip(cells[1:], widths[1:])]
    return '  '.join([first] + rest).rstrip()

  lines = [line(header), '  '.join('-' * wd for wd in widths)]
  lines.extend(line(r) for r in rows)
  return '\n'.join(lines)
