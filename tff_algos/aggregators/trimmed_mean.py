# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Coordinate-wise trimmed mean of client updates.

D. Yin, Y. Chen, K. Ramchandran, P. Bartlett, "Byzantine-Robust Distributed
Learning: Towards Optimal Statistical Rates", ICML 2018,
https://arxiv.org/abs/1803.01498 (beta-trimmed mean). For each coordinate,
the values of the n clients with positive weight are sorted, the
k = floor(trim_fraction * n) smallest and k largest are dropped (k is capped
at (n - 1) // 2 so at least one value stays), and the rest are averaged with
the clients' weights. The paper averages uniformly: with uniform client
weighting this is exactly `scipy.stats.trim_mean`; with example weights it is
the weighted version, and `trim_fraction=0` is the weighted mean (FedAvg).
Gathers every update at the server (`tff_algos.aggregators.stacked`): not
secure-aggregation compatible.
"""

import collections
import dataclasses
import math
from typing import Optional

import tensorflow as tf

from tff_algos import options as options_lib
from tff_algos.aggregators import stacked


class TrimmedMeanFactory(stacked.StackedAggregationFactory):
  """Coordinate-wise weighted trimmed mean."""

  def __init__(self, *, trim_fraction: float):
    """Initializes the factory.

    Args:
      trim_fraction: beta in [0, 0.5): the fraction of clients dropped at each
        end, per coordinate.

    Raises:
      TypeError: If `trim_fraction` is not a float.
      ValueError: If it is outside [0, 0.5).
    """
    super().__init__()
    if isinstance(trim_fraction, bool) or not isinstance(
        trim_fraction, (int, float)
    ):
      raise TypeError(
          f'trim_fraction must be a float, got {type(trim_fraction).__name__}'
      )
    if not (math.isfinite(trim_fraction) and 0.0 <= trim_fraction < 0.5):
      raise ValueError(
          f'trim_fraction must be in [0, 0.5), got {trim_fraction}'
      )
    self._trim_fraction = float(trim_fraction)

  def aggregate(self, updates, weights):
    n = tf.shape(updates)[0]
    k = tf.cast(
        tf.floor(self._trim_fraction * tf.cast(n, tf.float64)), tf.int32
    )
    k = tf.minimum(k, (n - 1) // 2)
    by_coordinate = tf.transpose(updates)  # [d, n]
    order = tf.argsort(by_coordinate, axis=1, stable=True)
    values = tf.gather(by_coordinate, order, batch_dims=1)[:, k : n - k]
    w = tf.gather(weights, order)[:, k : n - k]
    mean = tf.reduce_sum(values * w, 1) / tf.reduce_sum(w, 1)
    return mean, collections.OrderedDict(trimmed_per_side=k)

  def empty_measurements(self):
    return collections.OrderedDict(trimmed_per_side=tf.constant(0, tf.int32))


def build_trimmed_mean(*, trim_fraction: float) -> TrimmedMeanFactory:
  """A `TrimmedMeanFactory` (see its arguments)."""
  return TrimmedMeanFactory(trim_fraction=trim_fraction)


@dataclasses.dataclass(frozen=True)
class TrimmedMeanOptions(options_lib.AggregatorOptions):
  """Options of `aggregator=trimmed_mean`."""

  trim_fraction: Optional[float] = options_lib.option(
      None,
      'Fraction dropped at each end (default 0.1).',
      low=0,
      high=0.5,
      high_open=True,
  )


def _build(options: TrimmedMeanOptions):
  return build_trimmed_mean(
      trim_fraction=0.1
      if options.trim_fraction is None
      else options.trim_fraction
  )


AGGREGATOR = options_lib.Aggregator(
    name='trimmed_mean',
    options=TrimmedMeanOptions,
    build=_build,
    summary='the coordinate-wise (weighted) trimmed mean',
)
