# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Weighted quantiles of client values inside TFF, with and without secure sums.

Delta-FL needs the (1 - theta) quantile of the client losses F_k(w_t),
weighted by alpha_k (the client's example count): Property 7 of Laguel,
Pillutla, Malick, Harchaoui, "Device Heterogeneity in Federated Learning: A
Superquantile Approach", https://arxiv.org/abs/2002.11223 (spec
`fedplus_deltafl.md` B.3, B.6, B.7). Appendix B.1 of that paper (Algorithm 3)
computes it without showing any single loss to the server, by majorization-
minimization (MM) over secure weighted means. This module offers that and
three alternatives behind one interface:

  name         class                      server sees         sum rounds
  'exact'      `ExactQuantile`            every (v_k, a_k)    1 (insecure)
  'mm'         `MMQuantile`               secure sums only    T + 1
  'bisection'  `BisectionQuantile`        secure sums only    ceil(log_B(R/tol))
  'private'    `PrivateQuantileEstimator` secure sums (+DP)   1 per step

Every estimator has `estimate(values_at_clients, weights_at_clients)`, to be
called inside a `tff.federated_computation`: it takes float32 values and
float32 weights a_k >= 0 placed at CLIENTS and returns the estimate as a
float32 at SERVER (NaN when the total weight is 0). `build_computation()`
wraps it as a standalone computation, `secure` says whether only secure sums
move client data to the server, `num_sum_calls` counts the sequential
aggregation rounds, and `describe()` summarises the settings.

Convention (Property 7; `tasks.tail_metrics.weighted_quantile`): the level-p
quantile is the smallest value v with sum_{v_k <= v} a_k >= p sum_k a_k
(relative slack 1e-10, ties merged, zero weights ignored, no interpolation).
The secure estimators clip values to a known range [lower, upper] and so
estimate clip(q, lower, upper); NaN and +inf values count as `upper`, -inf as
`lower`. Negative or non-finite weights count as 0; weights above
`max_weight` are clipped to it.

Secure sums. Client quantities are clipped to known bounds and encoded in
fixed point, x -> round((x - low) s) with s the largest power of two such that
(high - low) s <= 2^bits - 1 (resolution 1/s), and each round sends one int64
vector (plus a constant 1 to undo the offsets) through one
`tff.federated_secure_sum_bitwidth(value, bits)`. A power-of-two s keeps
integer weights (example counts) exact. The int64 sum must not overflow:
num_clients * 2^bits < 2^63; the SecAgg bitwidth of the sum is
bits + log2(num_clients). TFF 0.87 executes secure intrinsics only under
`tff.backends.test.set_sync_test_cpp_execution_context()`, which replaces them
by insecure sums (checked here: under the default local C++ context the
worker rejects the computation, gRPC INVALID_ARGUMENT "Cannot embed a
federated value"); a deployment needs a runtime with real secure aggregation.
In that test context the first call of a computation pays for the rewrite and
compilation (about 10 s for MM with T = 50, 5 s for 20 bisection rounds, on 2
cores); later calls take 0.65 s and 0.25 s with 10-40 clients.

The estimators:

* `ExactQuantile(level)`: a `tff.federated_aggregate` concatenates every
  (v_k, a_k) at the server, which sorts them (Property 7 in TensorFlow,
  float64). Equal to `weighted_quantile` on float32 inputs. For simulation and
  as an oracle; not private.
* `MMQuantile(level, num_iterations=..., lower=..., upper=...)`: appendix B.1,
  eq. (17) with alpha normalised and the guard beta_k = a_k / max(nu, |x_k -
  mu|) (spec B.7 errata 3). Round 0 securely sums (a_k, a_k x_k) for the total
  weight A and the start mu_0 = weighted mean. Each of the T iterations
  broadcasts (mu_t, A) and securely sums, with a_k normalised by A,
    u_k = (a_k/A) clip((x_k - mu_t)/nu, -1, 1)   in [-1, 1],
    d_k = (a_k/A) nu / max(nu, |x_k - mu_t|)     in [0, 1],
  then mu_{t+1} = clip(mu_t + nu (U + 2p - 1) / D, lower, upper), which is
  (sum beta x + (2p - 1)) / sum beta, eq. (17). With nu -> 0 this is the
  paper's MM; with nu > 0 it is MM on the Huber-smoothed quantile loss, whose
  minimiser lies within nu of the set of minimisers [q, q_upper] of the
  quantile loss (q_upper: the largest p-quantile; q_upper = q unless the
  cumulative weight hits p exactly). Default nu = 1e-6 (upper - lower).
  Convergence is linear with rate |1 - 2f|, f = (p - W(<q)) / a(q) the
  position of p inside the weight jump at q, so it is slow when p sits near an
  edge of that jump. Measured (NumPy oracle = this iteration without
  quantisation, 200 random problems: 5-100 clients, lognormal(0, 1) values,
  integer weights 1-499, p in {0.1, 0.2, 0.5, 0.8, 0.9}, range [0, 20]):
  iterations to stay within 1e-3 relative error of [q, q_upper]: median 29,
  75th percentile 50, 90th percentile 105, and 1.5% not there after 400; with
  continuous weights U(0.5, 1.5): median 31, 90th percentile 80, 1% not there
  after 400. So 1e-3 costs about 30 (typical) to 100+ secure sums, against 20
  for bisection over a range of 10 to absolute 1e-5. Quantisation (bits=32)
  moves each step by at most about nu (|dU| D + |U + 2p - 1| |dD|) / D^2
  with |dU| <= num_clients 2^-31 and |dD| <= num_clients 2^-32 (resolutions
  2^-30 on [-1, 1] and 2^-31 on [0, 1]; errors in D only rescale the step; the
  fixed point moves by a level error of order num_clients 2^-31). Secure sums:
  T + 1 rounds of 3 integers each.
* `BisectionQuantile(level, lower=..., upper=..., tolerance=...,
  num_buckets=2)`: the server keeps a bracket (lo, hi] holding clip(q) and
  broadcasts the num_buckets - 1 inner grid points c_j; clients securely sum
  a_k 1[x_k <= c_j] and a_k; the server keeps the first grid cell where the
  cumulative weight reaches p. After n = ceil(log_B((upper - lower) /
  tolerance)) rounds it returns hi, with the guarantee
    0 <= estimate - clip(q, lower, upper) <= tolerance
  (up to float32 rounding of the result; exact Property-7 decisions for
  integer weights <= max_weight, and weights quantised to 1/s otherwise). 2
  buckets: 20 rounds for range 10 and tolerance 1e-5 (10 / 2^20 = 9.5e-6); 32
  buckets: 4 rounds (B + 1 integers per client and round).
* `PrivateQuantileEstimator(level, initial_estimate=..., ...)`: TFF's
  `tff.aggregators.PrivateQuantileEstimationProcess` (Andrew, Thakkar et al.,
  "Differentially Private Learning with Adaptive Clipping", NeurIPS 2021,
  https://arxiv.org/abs/1905.03871): a stateful geometric update
  C <- C exp(-lr (fraction below C - p)) per round, with optional Gaussian
  noise on the fraction (`tfp.QuantileEstimatorQuery`) and `SecureSumFactory`
  aggregation. UNWEIGHTED (each client counts once; `weights` is ignored), it
  needs positive values and it moves by at most a factor exp(lr) per round:
  it tracks the quantile across rounds rather than computing it in one
  round (measured: from 0.5 to 1.881, 3.8% below a quantile of 1.954, in 40
  rounds at lr 0.2, 40 clients; tests/test_quantiles.py). Each round is one
  secure aggregation made of 4 `federated_secure_sum_bitwidth` intrinsics
  (SecureSumFactory: value, summand count and two clipping counters).
"""

import abc
import inspect
import math
import numbers
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

ESTIMATOR_NAMES = ('exact', 'mm', 'bisection', 'private')
# Relative slack on cumulative weight fractions, as in tasks/tail_metrics.py.
SLACK = 1e-10
DEFAULT_BITS = 32
DEFAULT_MAX_WEIGHT = 65536.0
# Largest bitwidth the test context's secure-sum reduction accepts.
MAX_BITS = 62
_MAX_ROUNDS = 200

_VALUE_TYPE = tff.FederatedType(np.float32, tff.CLIENTS)


# ---------------------------------------------------------------------------
# Argument validation.


def _check_real(x, name: str) -> float:
  if isinstance(x, bool) or not isinstance(x, numbers.Real):
    raise TypeError(f'{name} must be a real number, got {x!r}')
  x = float(x)
  if not math.isfinite(x):
    raise ValueError(f'{name} must be finite, got {x}')
  return x


def _check_positive(x, name: str) -> float:
  x = _check_real(x, name)
  if x <= 0:
    raise ValueError(f'{name} must be > 0, got {x}')
  return x


def _check_int(x, name: str, low: int, high: Optional[int] = None) -> int:
  if isinstance(x, bool) or not isinstance(x, numbers.Integral):
    raise TypeError(f'{name} must be an int, got {x!r}')
  x = int(x)
  if x < low or (high is not None and x > high):
    bound = f'in [{low}, {high}]' if high is not None else f'>= {low}'
    raise ValueError(f'{name} must be {bound}, got {x}')
  return x


def _check_level(level) -> float:
  level = _check_real(level, 'level')
  if not 0.0 <= level <= 1.0:
    raise ValueError(f'level must be in [0, 1], got {level}')
  return level


def _check_range(lower, upper) -> tuple[float, float]:
  lower = _check_real(lower, 'lower')
  upper = _check_real(upper, 'upper')
  if lower >= upper:
    raise ValueError(f'need lower < upper, got [{lower}, {upper}]')
  return lower, upper


def _check_clients_float32(value, name: str) -> None:
  t = getattr(value, 'type_signature', None)
  if not (
      isinstance(t, tff.FederatedType)
      and t.placement is tff.CLIENTS
      and isinstance(t.member, tff.TensorType)
      and t.member.dtype == np.float32
      and not t.member.shape
  ):
    raise TypeError(
        f'{name} must be a float32 scalar placed at CLIENTS (call estimate '
        f'inside a tff.federated_computation), got {t}'
    )


# ---------------------------------------------------------------------------
# Fixed-point secure sums.


def fixed_point_scale(span: float, bits: int) -> float:
  """Largest power of two s with span * s <= 2**bits - 1 (resolution 1/s)."""
  span = _check_positive(span, 'span')
  bits = _check_int(bits, 'bits', 1, MAX_BITS)
  limit = float(2**bits - 1)
  k = math.floor(math.log2(limit / span))
  while span * 2.0**k > limit:
    k -= 1
  while span * 2.0 ** (k + 1) <= limit:
    k += 1
  return 2.0**k


class _FixedPointCodec:
  """Encodes K float64 components, each in its [low, high], as int64 in
  [0, 2**bits - 1], plus a trailing 1 that counts the summands."""

  def __init__(self, lows, highs, bits: int):
    self.lows = np.asarray(lows, np.float64)
    self.highs = np.asarray(highs, np.float64)
    self.bits = bits
    self.scales = np.array(
        [fixed_point_scale(h - l, bits) for l, h in zip(self.lows, self.highs)]
    )

  @property
  def resolutions(self) -> np.ndarray:
    return 1.0 / self.scales

  def encode(self, x):
    """float64 [K] -> int64 [K + 1] (TensorFlow, at a client)."""
    x = tf.where(tf.math.is_nan(x), self.lows, x)
    x = tf.clip_by_value(x, self.lows, self.highs)
    q = tf.round((x - self.lows) * self.scales)
    q = tf.clip_by_value(q, 0.0, float(2**self.bits - 1))
    return tf.concat([tf.cast(q, tf.int64), tf.ones([1], tf.int64)], axis=0)

  def decode(self, total):
    """int64 [K + 1] sum -> float64 [K] sum of the quantised components."""
    count = tf.cast(total[-1], tf.float64)
    return tf.cast(total[:-1], tf.float64) / self.scales + count * self.lows

  def secure_sum(self, encoded_at_clients):
    return tff.federated_secure_sum_bitwidth(encoded_at_clients, self.bits)


def _clean_values(x, lower: float, upper: float):
  """float32 values -> float64 in [lower, upper]; NaN counts as `upper`."""
  x = tf.cast(x, tf.float64)
  x = tf.where(tf.math.is_nan(x), tf.constant(upper, tf.float64), x)
  return tf.clip_by_value(x, lower, upper)


def _clean_weight(a, max_weight: float):
  """float32 weight -> float64 in [0, max_weight]; NaN/negative count as 0."""
  a = tf.cast(a, tf.float64)
  a = tf.where(tf.math.is_finite(a) & (a > 0), a, tf.zeros_like(a))
  return tf.clip_by_value(a, 0.0, max_weight)


# ---------------------------------------------------------------------------
# The interface.


class QuantileEstimator(abc.ABC):
  """Estimates a weighted quantile of CLIENTS-placed values inside TFF.

  Attributes:
    level: The quantile level p in [0, 1].
    secure: True if only secure-sum intrinsics move client data to SERVER.
    num_sum_calls: Sequential client-to-server aggregation rounds per
      `estimate` (for 'exact' the one insecure aggregate).
  """

  name: str = ''
  secure: bool = False
  level: float
  num_sum_calls: int

  @abc.abstractmethod
  def estimate(self, values_at_clients, weights_at_clients):
    """The weighted level-p quantile at SERVER (float32).

    Call inside a `tff.federated_computation`.

    Args:
      values_at_clients: float32 values placed at CLIENTS.
      weights_at_clients: float32 weights >= 0 placed at CLIENTS.

    Returns:
      A float32 placed at SERVER; NaN if the total weight is 0.
    """

  @abc.abstractmethod
  def describe(self) -> str:
    """A one-line summary of the estimator and its settings."""

  def build_computation(self) -> tff.Computation:
    """`(float32@CLIENTS values, float32@CLIENTS weights) -> float32@SERVER`."""

    @tff.federated_computation(_VALUE_TYPE, _VALUE_TYPE)
    def quantile(values, weights):
      return self.estimate(values, weights)

    return quantile

  def __repr__(self) -> str:
    return f'<{self.describe()}>'


# ---------------------------------------------------------------------------
# (d) Exact.


def tf_weighted_quantile(values, weights, level: float):
  """Property-7 weighted quantile in TensorFlow (as `weighted_quantile`).

  Args:
    values: float [n].
    weights: float [n], >= 0.
    level: Python float in [0, 1].

  Returns:
    float32 scalar; NaN when no weight is positive.
  """
  v = tf.cast(values, tf.float64)
  w = tf.cast(weights, tf.float64)
  keep = w > 0
  v = tf.boolean_mask(v, keep)
  w = tf.boolean_mask(w, keep)
  order = tf.argsort(v, stable=True)
  v = tf.gather(v, order)
  w = tf.gather(w, order)
  n = tf.size(v)

  def pick():
    cum = tf.cumsum(w)
    total = cum[-1]
    target = tf.constant(level, tf.float64) * total - SLACK * total
    idx = tf.searchsorted(cum, tf.reshape(target, [1]), side='left')[0]
    idx = tf.minimum(idx, n - 1)
    return tf.cast(tf.gather(v, idx), tf.float32)

  return tf.cond(n > 0, pick, lambda: tf.constant(np.nan, tf.float32))


class ExactQuantile(QuantileEstimator):
  """Collects every (value, weight) at the server and sorts (not private)."""

  name = 'exact'
  secure = False
  num_sum_calls = 1

  def __init__(self, level: float):
    self.level = _check_level(level)

  def describe(self) -> str:
    return (
        f'ExactQuantile(level={self.level}): federated_aggregate of all '
        '(value, weight) pairs, Property-7 quantile at the server; '
        'NOT private'
    )

  def estimate(self, values_at_clients, weights_at_clients):
    _check_clients_float32(values_at_clients, 'values_at_clients')
    _check_clients_float32(weights_at_clients, 'weights_at_clients')
    level = self.level

    @tff.tensorflow.computation
    def zero():
      return (tf.zeros([0], tf.float32), tf.zeros([0], tf.float32))

    acc_type = (
        tff.TensorType(np.float32, [None]),
        tff.TensorType(np.float32, [None]),
    )

    @tff.tensorflow.computation(acc_type, (np.float32, np.float32))
    def accumulate(acc, pair):
      return (
          tf.concat([acc[0], tf.reshape(pair[0], [1])], 0),
          tf.concat([acc[1], tf.reshape(pair[1], [1])], 0),
      )

    @tff.tensorflow.computation(acc_type, acc_type)
    def merge(a, b):
      return (tf.concat([a[0], b[0]], 0), tf.concat([a[1], b[1]], 0))

    @tff.tensorflow.computation(acc_type)
    def report(acc):
      return tf_weighted_quantile(acc[0], acc[1], level)

    pairs = tff.federated_zip((values_at_clients, weights_at_clients))
    return tff.federated_aggregate(pairs, zero(), accumulate, merge, report)


# ---------------------------------------------------------------------------
# (a) Majorization-minimization over secure weighted means.


class MMQuantile(QuantileEstimator):
  """Appendix B.1 MM iteration, one secure weighted mean per step.

  Each estimate uses `num_iterations + 1` secure-sum rounds: (a_k, a_k x_k)
  for the total weight and the weighted-mean start, then (u_k, d_k) per
  iteration (module docstring). Values are clipped to [lower, upper].
  """

  name = 'mm'
  secure = True

  def __init__(
      self,
      level: float,
      *,
      num_iterations: int,
      lower: float,
      upper: float,
      smoothing: Optional[float] = None,
      max_weight: float = DEFAULT_MAX_WEIGHT,
      bits: int = DEFAULT_BITS,
  ):
    """Configures the estimator.

    Args:
      level: Quantile level p in [0, 1].
      num_iterations: MM iterations T >= 1 (each one secure-sum round).
      lower: Smallest value; smaller values are clipped to it.
      upper: Largest value; larger values are clipped to it.
      smoothing: nu > 0, the guard max(nu, |x - mu|) and the Huber width; the
        fixed point is within nu of the quantile. Default 1e-6 (upper - lower).
      max_weight: Upper bound on a_k for the fixed-point encoding of round 0.
      bits: Fixed-point bits per summand, in [1, 62].

    Raises:
      TypeError: Wrong argument types.
      ValueError: Out-of-range arguments.
    """
    self.level = _check_level(level)
    self.num_iterations = _check_int(
        num_iterations, 'num_iterations', 1, 10 * _MAX_ROUNDS
    )
    self.lower, self.upper = _check_range(lower, upper)
    span = self.upper - self.lower
    self.smoothing = (
        1e-6 * span
        if smoothing is None
        else _check_positive(smoothing, 'smoothing')
    )
    self.max_weight = _check_positive(max_weight, 'max_weight')
    self.bits = _check_int(bits, 'bits', 1, MAX_BITS)
    self.num_sum_calls = self.num_iterations + 1
    self._init_codec = _FixedPointCodec(
        [0.0, self.max_weight * min(self.lower, 0.0)],
        [self.max_weight, self.max_weight * max(self.upper, 0.0)],
        self.bits,
    )
    self._step_codec = _FixedPointCodec([-1.0, 0.0], [1.0, 1.0], self.bits)
    self._comps = None

  def describe(self) -> str:
    return (
        f'MMQuantile(level={self.level}, num_iterations='
        f'{self.num_iterations}, range=[{self.lower}, {self.upper}], '
        f'smoothing={self.smoothing:g}, max_weight={self.max_weight:g}, '
        f'bits={self.bits}): {self.num_sum_calls} secure-sum rounds'
    )

  def _computations(self):
    if self._comps is not None:
      return self._comps
    lower, upper, nu, level = self.lower, self.upper, self.smoothing, self.level
    max_weight = self.max_weight
    init_codec, step_codec = self._init_codec, self._step_codec
    state_type = tff.TensorType(np.float64, [2])  # (mu, total weight A)

    @tff.tensorflow.computation(np.float32, np.float32)
    def init_client(x, a):
      x = _clean_values(x, lower, upper)
      a = _clean_weight(a, max_weight)
      return init_codec.encode(tf.stack([a, a * x]))

    @tff.tensorflow.computation(tff.TensorType(np.int64, [3]))
    def init_server(total):
      a_sum, ax_sum = tf.unstack(init_codec.decode(total))
      mu = tf.clip_by_value(tf.math.divide_no_nan(ax_sum, a_sum), lower, upper)
      return tf.stack([mu, a_sum])

    @tff.tensorflow.computation(np.float32, np.float32, state_type)
    def step_client(x, a, state):
      x = _clean_values(x, lower, upper)
      a = _clean_weight(a, max_weight)
      mu, a_sum = state[0], state[1]
      a = tf.math.divide_no_nan(a, a_sum)
      r = x - mu
      m = tf.maximum(tf.constant(nu, tf.float64), tf.abs(r))
      return step_codec.encode(tf.stack([a * r / m, a * nu / m]))

    @tff.tensorflow.computation(state_type, tff.TensorType(np.int64, [3]))
    def step_server(state, total):
      u, d = tf.unstack(step_codec.decode(total))
      d = tf.maximum(d, step_codec.resolutions[1])
      mu = state[0] + nu * (u + 2.0 * level - 1.0) / d
      return tf.stack([tf.clip_by_value(mu, lower, upper), state[1]])

    @tff.tensorflow.computation(state_type)
    def mu_of(state):
      return tf.where(state[1] > 0, state[0], tf.constant(np.nan, tf.float64))

    self._comps = (init_client, init_server, step_client, step_server, mu_of)
    return self._comps

  def iterates(self, values_at_clients, weights_at_clients):
    """mu_0, ..., mu_T as a float64 [T + 1] at SERVER (NaN if no weight)."""
    _check_clients_float32(values_at_clients, 'values_at_clients')
    _check_clients_float32(weights_at_clients, 'weights_at_clients')
    init_client, init_server, step_client, step_server, mu_of = (
        self._computations()
    )
    encoded = tff.federated_map(
        init_client, (values_at_clients, weights_at_clients)
    )
    state = tff.federated_map(init_server, self._init_codec.secure_sum(encoded))
    mus = [tff.federated_map(mu_of, state)]
    for _ in range(self.num_iterations):
      encoded = tff.federated_map(
          step_client,
          (
              values_at_clients,
              weights_at_clients,
              tff.federated_broadcast(state),
          ),
      )
      state = tff.federated_map(
          step_server, (state, self._step_codec.secure_sum(encoded))
      )
      mus.append(tff.federated_map(mu_of, state))

    @tff.tensorflow.computation(
        tff.StructWithPythonType([np.float64] * len(mus), tuple)
    )
    def stack(mu_list):
      return tf.stack(list(mu_list))

    return tff.federated_map(stack, tff.federated_zip(tuple(mus)))

  def estimate(self, values_at_clients, weights_at_clients):
    trajectory = self.iterates(values_at_clients, weights_at_clients)

    @tff.tensorflow.computation(tff.TensorType(np.float64, [None]))
    def last(mus):
      return tf.cast(mus[-1], tf.float32)

    return tff.federated_map(last, trajectory)


# ---------------------------------------------------------------------------
# (b) Bisection / histogram search over secure weighted counts.


def bisection_num_rounds(
    lower: float, upper: float, tolerance: float, num_buckets: int = 2
) -> int:
  """Smallest n with (upper - lower) / num_buckets**n <= tolerance."""
  lower, upper = _check_range(lower, upper)
  tolerance = _check_positive(tolerance, 'tolerance')
  num_buckets = _check_int(num_buckets, 'num_buckets', 2, 1024)
  n, width = 0, upper - lower
  while width > tolerance:
    width /= num_buckets
    n += 1
    if n > _MAX_ROUNDS:
      raise ValueError(
          f'tolerance {tolerance} needs more than {_MAX_ROUNDS} rounds over '
          f'[{lower}, {upper}]'
      )
  return n


class BisectionQuantile(QuantileEstimator):
  """Bisection (or B-ary histogram search) with secure weighted counts.

  Guarantee: 0 <= estimate - clip(q, lower, upper) <= tolerance, where q is
  the Property-7 quantile (module docstring), after
  `num_sum_calls = ceil(log_B((upper - lower) / tolerance))` rounds.
  """

  name = 'bisection'
  secure = True

  def __init__(
      self,
      level: float,
      *,
      lower: float,
      upper: float,
      tolerance: float,
      num_buckets: int = 2,
      max_weight: float = DEFAULT_MAX_WEIGHT,
      bits: int = DEFAULT_BITS,
  ):
    """Configures the estimator.

    Args:
      level: Quantile level p in [0, 1].
      lower: Smallest value; smaller values are clipped to it.
      upper: Largest value; larger values are clipped to it.
      tolerance: Final bracket width (> 0).
      num_buckets: B >= 2 cells per round (2: bisection); each round securely
        sums B integers.
      max_weight: Upper bound on a_k for the fixed-point encoding; weights are
        quantised to multiples of 1/s, s = fixed_point_scale(max_weight, bits)
        (integers up to max_weight stay exact when s >= 1).
      bits: Fixed-point bits per summand, in [1, 62].

    Raises:
      TypeError: Wrong argument types.
      ValueError: Out-of-range arguments.
    """
    self.level = _check_level(level)
    self.lower, self.upper = _check_range(lower, upper)
    self.tolerance = _check_positive(tolerance, 'tolerance')
    self.num_buckets = _check_int(num_buckets, 'num_buckets', 2, 1024)
    self.max_weight = _check_positive(max_weight, 'max_weight')
    self.bits = _check_int(bits, 'bits', 1, MAX_BITS)
    self.num_sum_calls = bisection_num_rounds(
        self.lower, self.upper, self.tolerance, self.num_buckets
    )
    k = self.num_buckets - 1
    self._codec = _FixedPointCodec(
        [0.0] * (k + 1), [self.max_weight] * (k + 1), self.bits
    )
    self._comps = None

  def describe(self) -> str:
    return (
        f'BisectionQuantile(level={self.level}, range=[{self.lower}, '
        f'{self.upper}], tolerance={self.tolerance:g}, num_buckets='
        f'{self.num_buckets}, max_weight={self.max_weight:g}, '
        f'bits={self.bits}): {self.num_sum_calls} secure-sum rounds'
    )

  def _computations(self):
    if self._comps is not None:
      return self._comps
    lower, upper, level = self.lower, self.upper, self.level
    max_weight, codec, b = self.max_weight, self._codec, self.num_buckets
    # State: (lo, hi, total weight of the last round).
    state_type = tff.TensorType(np.float64, [3])
    fractions = np.arange(1, b, dtype=np.float64) / b

    @tff.tensorflow.computation
    def init_state():
      return tf.constant([lower, upper, 0.0], tf.float64)

    @tff.tensorflow.computation(state_type)
    def grid_of(state):
      return state[0] + (state[1] - state[0]) * fractions

    @tff.tensorflow.computation(
        np.float32, np.float32, tff.TensorType(np.float64, [b - 1])
    )
    def client(x, a, grid):
      x = _clean_values(x, lower, upper)
      a = _clean_weight(a, max_weight)
      below = tf.where(x <= grid, a, tf.zeros_like(grid))
      return codec.encode(tf.concat([below, tf.reshape(a, [1])], 0))

    @tff.tensorflow.computation(state_type, tff.TensorType(np.int64, [b + 1]))
    def server(state, total):
      sums = codec.decode(total)
      below, weight = sums[:-1], sums[-1]
      lo, hi = state[0], state[1]
      grid = lo + (hi - lo) * fractions
      reached = below >= level * weight - SLACK * weight
      any_reached = tf.reduce_any(reached)
      j = tf.argmax(tf.cast(reached, tf.int32), output_type=tf.int32)
      ext = tf.concat([tf.reshape(lo, [1]), grid, tf.reshape(hi, [1])], 0)
      new_lo = tf.where(any_reached, tf.gather(ext, j), grid[-1])
      new_hi = tf.where(any_reached, tf.gather(ext, j + 1), hi)
      return tf.stack([new_lo, new_hi, weight])

    @tff.tensorflow.computation(state_type)
    def result(state):
      return tf.cast(
          tf.where(state[2] > 0, state[1], tf.constant(np.nan, tf.float64)),
          tf.float32,
      )

    self._comps = (init_state, grid_of, client, server, result)
    return self._comps

  def estimate(self, values_at_clients, weights_at_clients):
    _check_clients_float32(values_at_clients, 'values_at_clients')
    _check_clients_float32(weights_at_clients, 'weights_at_clients')
    init_state, grid_of, client, server, result = self._computations()
    state = tff.federated_eval(init_state, tff.SERVER)
    for _ in range(self.num_sum_calls):
      grid = tff.federated_broadcast(tff.federated_map(grid_of, state))
      encoded = tff.federated_map(
          client, (values_at_clients, weights_at_clients, grid)
      )
      state = tff.federated_map(
          server, (state, self._codec.secure_sum(encoded))
      )
    return tff.federated_map(result, state)


# ---------------------------------------------------------------------------
# (c) TFF's PrivateQuantileEstimationProcess.


class PrivateQuantileEstimator(QuantileEstimator):
  """Geometric-update quantile tracking across rounds (unweighted).

  Stateful: `initialize()`, `next(state, values_at_clients)` and
  `report(state)` are those of the wrapped `process`
  (`tff.aggregators.PrivateQuantileEstimationProcess`); call them directly to
  run a round, or inside a `tff.federated_computation` to compose. `estimate`
  runs `num_steps` updates from the initial state on the same values in one
  computation and ignores the weights (TFF's process is unweighted).
  """

  name = 'private'

  def __init__(
      self,
      level: float,
      *,
      initial_estimate: float,
      learning_rate: float = 0.2,
      num_steps: int = 50,
      noise_stddev: Optional[float] = None,
      expected_num_clients: Optional[float] = None,
      secure: bool = True,
  ):
    """Configures the estimator.

    Args:
      level: Target quantile p in [0, 1] (fraction of clients below).
      initial_estimate: Initial estimate C_0 > 0 (values must be positive).
      learning_rate: Geometric rate; C moves by a factor <= exp(rate) a round.
      num_steps: Updates that `estimate` runs (each one secure-sum round).
      noise_stddev: If set, Gaussian noise of this stddev on the count below
        the estimate (`tfp.QuantileEstimatorQuery`, for differential privacy;
        Andrew et al. suggest expected_num_clients / 20); requires
        `expected_num_clients`, the normaliser of the noised count.
      expected_num_clients: Expected clients per round (with noise only).
      secure: Aggregate with `tff.aggregators.SecureSumFactory` (True) or
        `SumFactory` (False).

    Raises:
      TypeError: Wrong argument types.
      ValueError: Out-of-range arguments.
    """
    self.level = _check_level(level)
    self.initial_estimate = _check_positive(
        initial_estimate, 'initial_estimate'
    )
    self.learning_rate = _check_positive(learning_rate, 'learning_rate')
    self.num_steps = _check_int(num_steps, 'num_steps', 1, 10 * _MAX_ROUNDS)
    if not isinstance(secure, bool):
      raise TypeError(f'secure must be a bool, got {secure!r}')
    self.secure = secure
    if noise_stddev is None:
      if expected_num_clients is not None:
        raise ValueError('expected_num_clients is used only with noise_stddev')
      self.noise_stddev = None
      self.expected_num_clients = None
    else:
      self.noise_stddev = _check_real(noise_stddev, 'noise_stddev')
      if self.noise_stddev < 0:
        raise ValueError(f'noise_stddev must be >= 0, got {noise_stddev}')
      if expected_num_clients is None:
        raise ValueError('noise_stddev needs expected_num_clients')
      self.expected_num_clients = _check_positive(
          expected_num_clients, 'expected_num_clients'
      )
    self.num_sum_calls = self.num_steps
    self._process = None

  @property
  def process(self) -> tff.aggregators.PrivateQuantileEstimationProcess:
    """The TFF quantile-estimation process, built on first use."""
    if self._process is None:
      if self.noise_stddev is None:
        self._process = (
            tff.aggregators.PrivateQuantileEstimationProcess.no_noise(
                initial_estimate=self.initial_estimate,
                target_quantile=self.level,
                learning_rate=self.learning_rate,
                secure_estimation=self.secure,
            )
        )
      else:
        query = tfp.QuantileEstimatorQuery(
            initial_estimate=self.initial_estimate,
            target_quantile=self.level,
            learning_rate=self.learning_rate,
            below_estimate_stddev=self.noise_stddev,
            expected_num_records=self.expected_num_clients,
            geometric_update=True,
        )
        factory = (
            tff.aggregators.SecureSumFactory(1.0)
            if self.secure
            else tff.aggregators.SumFactory()
        )
        self._process = tff.aggregators.PrivateQuantileEstimationProcess(
            query, factory
        )
    return self._process

  def initialize(self):
    """The process's initial state (SERVER)."""
    return self.process.initialize()

  def next(self, state, values_at_clients):
    """One round: the updated state (SERVER)."""
    return self.process.next(state, values_at_clients)

  def report(self, state):
    """The current estimate (float32 at SERVER)."""
    return self.process.report(state)

  def describe(self) -> str:
    noise = (
        'no noise'
        if self.noise_stddev is None
        else f'noise_stddev={self.noise_stddev:g}, expected_num_clients='
        f'{self.expected_num_clients:g}'
    )
    return (
        f'PrivateQuantileEstimator(level={self.level}, initial_estimate='
        f'{self.initial_estimate:g}, learning_rate={self.learning_rate:g},'
        f' num_steps={self.num_steps}, {noise}, secure={self.secure}): '
        'UNWEIGHTED geometric tracking'
    )

  def estimate(self, values_at_clients, weights_at_clients=None):
    """`num_steps` updates from the initial state; weights are ignored."""
    _check_clients_float32(values_at_clients, 'values_at_clients')
    del weights_at_clients  # TFF's quantile estimation process is unweighted.
    state = self.process.initialize()
    for _ in range(self.num_steps):
      state = self.process.next(state, values_at_clients)
    return self.process.report(state)


# ---------------------------------------------------------------------------
# Factory.

_CLASSES = {
    'exact': ExactQuantile,
    'mm': MMQuantile,
    'bisection': BisectionQuantile,
    'private': PrivateQuantileEstimator,
}


def build_estimator(
    name: str, *, level: float, **options: Any
) -> QuantileEstimator:
  """Builds the estimator `name` in ESTIMATOR_NAMES with its options.

  Args:
    name: 'exact', 'mm', 'bisection' or 'private'.
    level: Quantile level p in [0, 1].
    **options: Keyword options of the class (e.g. `lower`, `upper`,
      `tolerance` for 'bisection'; `num_iterations`, `lower`, `upper` for
      'mm'; `initial_estimate` for 'private').

  Returns:
    A `QuantileEstimator`.

  Raises:
    ValueError: Unknown name, or invalid option values.
    TypeError: Unknown or missing options, or wrong types.
  """
  if not isinstance(name, str):
    raise TypeError(f'name must be a str, got {name!r}')
  if name not in _CLASSES:
    raise ValueError(
        f'unknown estimator {name!r}; choose from {ESTIMATOR_NAMES}'
    )
  cls = _CLASSES[name]
  params = inspect.signature(cls.__init__).parameters
  allowed = [p for p in params if p not in ('self', 'level')]
  unknown = sorted(set(options) - set(allowed))
  if unknown:
    raise TypeError(
        f'unknown options {unknown} for {name!r}; allowed: {allowed}'
    )
  missing = [
      p
      for p in allowed
      if params[p].default is inspect.Parameter.empty and p not in options
  ]
  if missing:
    raise TypeError(f'{name!r} needs options {missing}')
  return cls(level, **options)
