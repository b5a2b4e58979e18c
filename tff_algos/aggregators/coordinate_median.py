# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Coordinate-wise median of client updates.

D. Yin, Y. Chen, K. Ramchandran, P. Bartlett, "Byzantine-Robust Distributed
Learning: Towards Optimal Statistical Rates", ICML 2018,
https://arxiv.org/abs/1803.01498 (the "median" baseline of the thesis,
section 5.3.4). Each coordinate of the aggregate is the median of that
coordinate over the round's clients with positive weight; the median is
unweighted, as in the paper, and an even count averages the two middle values
(`numpy.median`). Gathers every update at the server
(`tff_algos.aggregators.stacked`): not secure-aggregation compatible.
"""

import collections
import dataclasses

import tensorflow as tf

from tff_algos import options as options_lib
from tff_algos.aggregators import stacked


class CoordinateMedianFactory(stacked.StackedAggregationFactory):
  """Coordinate-wise median (unweighted) of the clients' updates."""

  def aggregate(self, updates, weights):
    del weights  # The median is over clients, unweighted.
    n = tf.shape(updates)[0]
    ordered = tf.sort(updates, axis=0)
    median = 0.5 * (
        tf.gather(ordered, (n - 1) // 2) + tf.gather(ordered, n // 2)
    )
    return median, self.empty_measurements()

  def empty_measurements(self):
    return collections.OrderedDict()


def build_coordinate_median() -> CoordinateMedianFactory:
  """A `CoordinateMedianFactory`."""
  return CoordinateMedianFactory()


@dataclasses.dataclass(frozen=True)
class CoordinateMedianOptions(options_lib.AggregatorOptions):
  """Takes no options."""


def _build(options: CoordinateMedianOptions):
  return build_coordinate_median()


AGGREGATOR = options_lib.Aggregator(
    name='coordinate_median',
    options=CoordinateMedianOptions,
    build=_build,
    summary='the coordinate-wise median',
)
