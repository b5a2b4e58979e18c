# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Geometric median of client updates by the smoothed Weiszfeld algorithm.

K. Pillutla, S. M. Kakade, Z. Harchaoui, "Robust Aggregation for Federated
Learning", IEEE Transactions on Signal Processing 70, 2022,
https://arxiv.org/abs/1912.13445 (RFA, Algorithm 2 "smoothed Weiszfeld").

The aggregate minimises the smoothed, weighted geometric-median objective

  g(z) = sum_k alpha_k max(nu, ||z - x_k||) / sum_k alpha_k

over the updates x_k with weights alpha_k. Starting from the weighted mean,
each of a fixed number of passes broadcasts the estimate z and sets

  beta_k = alpha_k / max(nu, ||z - x_k||),  z <- sum_k beta_k x_k / sum beta_k,

so every pass is one `tff.federated_mean`: the server never sees an
individual update, and the passes compose with secure aggregation (the
design of RFA's `RobustWeiszfeldFactory` in google-research/federated).
A client with weight 0 (e.g. a non-finite update zeroed by the client work)
gets beta 0 in every pass. The measurements report the passes and the
objective at the weighted mean and at the returned estimate.
"""

import collections
import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import options as options_lib


def _check_float_structure(value_type, name: str) -> None:
  if not tff.types.is_structure_of_floats(value_type):
    raise TypeError(
        f'{name} aggregates structures of float tensors, got {value_type}'
    )


def _distance(a, b):
  """Euclidean distance between two structures of tensors, as float32."""
  squares = [
      tf.reduce_sum(tf.square(tf.cast(x, tf.float32) - tf.cast(y, tf.float32)))
      for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b))
  ]
  return tf.sqrt(tf.add_n(squares))


class GeometricMedianFactory(tff.aggregators.WeightedAggregationFactory):
  """Weighted geometric median by smoothed Weiszfeld (RFA).

  Usable as `model_aggregator=` of any builder taking a weighted factory
  (ours and `tff.learning.algorithms.build_weighted_fed_avg`).
  """

  def __init__(self, *, num_passes: int = 3, smoothing: float = 1e-6):
    """Initializes the factory.

    Args:
      num_passes: Weiszfeld passes after the initial weighted mean (>= 0; 0
        returns the weighted mean). RFA uses 3 in its experiments.
      smoothing: nu > 0, the floor on distances that smooths the objective
        and keeps the reweighting finite.

    Raises:
      TypeError: If an argument has the wrong type.
      ValueError: If `num_passes` < 0 or `smoothing` is not positive.
    """
    if isinstance(num_passes, bool) or not isinstance(num_passes, int):
      raise TypeError(
          f'num_passes must be an int, got {type(num_passes).__name__}'
      )
    if num_passes < 0:
      raise ValueError(f'num_passes must be >= 0, got {num_passes}')
    if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)):
      raise TypeError(
          f'smoothing must be a float, got {type(smoothing).__name__}'
      )
    if not (np.isfinite(smoothing) and smoothing > 0):
      raise ValueError(f'smoothing must be a positive float, got {smoothing}')
    self._num_passes = num_passes
    self._smoothing = float(smoothing)

  @property
  def num_passes(self) -> int:
    return self._num_passes

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    """Builds the aggregation process for values and weights of these types."""
    _check_float_structure(value_type, 'GeometricMedianFactory')
    _check_float_structure(weight_type, 'GeometricMedianFactory weights')
    smoothing = self._smoothing
    num_passes = self._num_passes

    @tff.tensorflow.computation(value_type, weight_type, value_type)
    def reweight(value, weight, estimate):
      distance = _distance(value, estimate)
      return tf.cast(weight, tf.float32) / tf.maximum(smoothing, distance)

    @tff.tensorflow.computation(value_type, value_type)
    def smoothed_distance(value, estimate):
      return tf.maximum(smoothing, _distance(value, estimate))

    @tff.tensorflow.computation(weight_type)
    def as_float32(weight):
      return tf.cast(weight, tf.float32)

    def objective(value, weight, estimate):
      distances = tff.federated_map(
          smoothed_distance, (value, tff.federated_broadcast(estimate))
      )
      return tff.federated_mean(distances, weight)

    @tff.federated_computation()
    def init_fn():
      return tff.federated_value((), tff.SERVER)

    @tff.federated_computation(
        init_fn.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      weight = tff.federated_map(as_float32, weight)
      estimate = tff.federated_mean(value, weight)
      initial_objective = objective(value, weight, estimate)
      for _ in range(num_passes):
        beta = tff.federated_map(
            reweight, (value, weight, tff.federated_broadcast(estimate))
        )
        estimate = tff.federated_mean(value, beta)
      final_objective = objective(value, weight, estimate)
      measurements = tff.federated_zip(
          collections.OrderedDict(
              num_passes=tff.federated_value(np.int32(num_passes), tff.SERVER),
              mean_objective=initial_objective,
              objective=final_objective,
          )
      )
      return tff.templates.MeasuredProcessOutput(state, estimate, measurements)

    return tff.templates.AggregationProcess(init_fn, next_fn)


def build_geometric_median(
    *, num_passes: int = 3, smoothing: float = 1e-6
) -> GeometricMedianFactory:
  """A `GeometricMedianFactory` (see its arguments)."""
  return GeometricMedianFactory(num_passes=num_passes, smoothing=smoothing)


@dataclasses.dataclass(frozen=True)
class GeometricMedianOptions(options_lib.AggregatorOptions):
  """Options of `aggregator=geometric_median`."""

  gm_passes: Optional[int] = options_lib.option(
      None, 'Weiszfeld passes (default 3).', low=0
  )


def _build(options: GeometricMedianOptions):
  return build_geometric_median(
      num_passes=3 if options.gm_passes is None else options.gm_passes
  )


AGGREGATOR = options_lib.Aggregator(
    name='geometric_median',
    options=GeometricMedianOptions,
    build=_build,
    summary='the smoothed Weiszfeld geometric median (RFA)',
)
