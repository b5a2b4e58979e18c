# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""NumPy float64 oracles for the estimators of `tff_algos/quantiles.py`.

Written from the spec (Delta-FL appendix B.1, eq. (17), spec B.7) and the
Property-7 convention (spec B.3), independently of the project's code (no
import of `tasks` or `tff_algos`): the tests compare the two step by step.
"""

from typing import Optional

import numpy as np

SLACK = 1e-10


def _support(values, weights):
  x = np.asarray(values, np.float64).ravel()
  a = (
      np.ones_like(x)
      if weights is None
      else np.asarray(weights, np.float64).ravel()
  )
  return x[a > 0], a[a > 0]


def weighted_quantile(values, level: float, weights=None) -> float:
  """The smallest p-quantile: smallest v with weight of {x <= v} >= p.

  Property 7 (spec B.3) by brute force over the candidate values: no
  sorting, cumulative sums or interpolation.
  """
  x, a = _support(values, weights)
  need = (level - SLACK) * a.sum()
  return float(min(v for v in x if a[x <= v].sum() >= need))


def upper_weighted_quantile(values, level: float, weights=None) -> float:
  """The largest p-quantile: largest v with weight of {x >= v} >= 1 - p.

  The minimisers of the quantile loss H_p (appendix B.1) form the interval
  [weighted_quantile(p), upper_weighted_quantile(p)].
  """
  x, a = _support(values, weights)
  need = (1.0 - level - SLACK) * a.sum()
  return float(max(v for v in x if a[x >= v].sum() >= need))


def clean_values(values, lower: float, upper: float) -> np.ndarray:
  """Clip to [lower, upper]; NaN counts as `upper`."""
  x = np.asarray(values, np.float64)
  x = np.where(np.isnan(x), upper, x)
  return np.clip(x, lower, upper)


def clean_weights(weights, max_weight: float = np.inf) -> np.ndarray:
  a = np.asarray(weights, np.float64)
  a = np.where(np.isfinite(a) & (a > 0), a, 0.0)
  return np.minimum(a, max_weight)


def mm_step(
    mu: float,
    x: np.ndarray,
    normalized_weights: np.ndarray,
    level: float,
    smoothing: float,
    lower: float,
    upper: float,
):
  """One MM step, eq. (17) with beta_k = a_k / max(nu, |x_k - mu|).

  Returns:
    (mu_next, U, D): mu_next = clip((sum beta x + (2p - 1)) / sum beta),
    computed as mu + nu (U + 2p - 1) / D with U = sum a r / max(nu, |r|) and
    D = sum a nu / max(nu, |r|) (r = x - mu), the client sums.
  """
  r = x - mu
  m = np.maximum(smoothing, np.abs(r))
  u = float(np.sum(normalized_weights * r / m))
  d = float(np.sum(normalized_weights * smoothing / m))
  if d <= 0:
    return mu, u, d
  beta = normalized_weights / m
  # Eq. (17) literally; equal to mu + nu (u + 2p - 1) / d up to rounding.
  mu_next = (np.sum(beta * x) + (2 * level - 1)) / np.sum(beta)
  return float(np.clip(mu_next, lower, upper)), u, d


def mm_quantile_oracle(
    values,
    weights,
    level: float,
    num_iterations: int,
    lower: float,
    upper: float,
    smoothing: Optional[float] = None,
) -> np.ndarray:
  """mu_0..mu_T of the MM iteration in float64, without quantisation.

  mu_0 is the weighted mean of the clipped values; weights are normalised to
  sum to 1 (spec B.7 errata 3).
  """
  if smoothing is None:
    smoothing = 1e-6 * (upper - lower)
  x = clean_values(values, lower, upper)
  a = clean_weights(weights)
  total = a.sum()
  mu = float(np.clip(np.sum(a * x) / total, lower, upper))
  a = a / total
  out = [mu]
  for _ in range(num_iterations):
    mu, _, _ = mm_step(mu, x, a, level, smoothing, lower, upper)
    out.append(mu)
  return np.array(out)


def mm_step_tolerance(
    mu: float,
    x: np.ndarray,
    normalized_weights,
    level: float,
    smoothing: float,
    lower: float,
    upper: float,
    bits: int = 32,
) -> float:
  """Bound on |quantised step - exact step| from mu (fixed point, `bits`).

  Each client's u_k in [-1, 1] and d_k in [0, 1] is rounded to the nearest
  multiple of 1/s, s_u = 2^(bits-2) and s_d = 2^(bits-1) (the largest powers
  of two with span * s <= 2^bits - 1), so |dU| <= m / (2 s_u),
  |dD| <= m / (2 s_d), and the step
  nu (U + 2p - 1) / D moves by at most
  nu (|dU| D + |U + 2p - 1| |dD|) / (D (D - |dD|)).
  """
  m = x.size
  du = m / (2.0 * fixed_point_scale(2.0, bits))
  dd = m / (2.0 * fixed_point_scale(1.0, bits))
  _, u, d = mm_step(mu, x, normalized_weights, level, smoothing, lower, upper)
  if d - dd <= 0:
    return upper - lower
  bound = smoothing * (du * d + abs(u + 2 * level - 1) * dd) / (d * (d - dd))
  return 2.0 * bound + 1e-12 * (upper - lower)


def iterations_to_tolerance(
    trajectory: np.ndarray, low: float, high: float, rel_tol: float
) -> int:
  """First t after which mu_t stays within rel_tol |low| of [low, high]."""
  scale = max(abs(low), 1e-12)
  err = np.maximum(np.maximum(low - trajectory, trajectory - high), 0) / scale
  bad = np.nonzero(err > rel_tol)[0]
  return int(bad[-1]) + 1 if bad.size else 0


def fixed_point_scale(span: float, bits: int) -> float:
  """Largest power of two s with span * s <= 2**bits - 1."""
  k = 0
  limit = 2.0**bits - 1
  while span * 2.0 ** (k + 1) <= limit:
    k += 1
  while span * 2.0**k > limit:
    k -= 1
  return 2.0**k


def bisection_quantile_oracle(
    values,
    weights,
    level: float,
    lower: float,
    upper: float,
    tolerance: float,
    num_buckets: int = 2,
    max_weight: float = 65536.0,
    bits: int = 32,
):
  """B-ary bracket search on quantised weights.

  Returns:
    (estimate, num_rounds): the upper end of the final bracket (lo, hi] and
    the number of weighted-count rounds it took.
  """
  x = clean_values(values, lower, upper)
  s = fixed_point_scale(max_weight, bits)
  a = np.round(clean_weights(weights, max_weight) * s) / s
  total = a.sum()
  lo, hi, rounds = lower, upper, 0
  fractions = np.arange(1, num_buckets, dtype=np.float64) / num_buckets
  while hi - lo > tolerance:
    grid = lo + (hi - lo) * fractions
    below = np.array([a[x <= c].sum() for c in grid])
    reached = below >= level * total - SLACK * total
    if reached.any():
      j = int(np.argmax(reached))
      lo, hi = (lo if j == 0 else float(grid[j - 1])), float(grid[j])
    else:
      lo = float(grid[-1])
    rounds += 1
  return hi, rounds
