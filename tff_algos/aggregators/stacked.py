# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Aggregators that need every client's update at the server.

Coordinate-wise median, trimmed mean and (multi-)Krum are functions of the
whole set of updates, which no sum can express. `StackedAggregationFactory`
gathers them with one `tff.federated_aggregate` whose accumulator stacks each
client's flattened update and weight into a `[num_clients, dimension]` matrix
(an unbounded, exact version of TFF's reservoir sampling in
`tff.aggregators.UnweightedReservoirSamplingFactory`: every participant is
kept, no sampling), then applies a TensorFlow function to the matrix at the
server and restores the value's structure.

These aggregators reveal every individual update to the server: they are
**not compatible with secure aggregation** (the geometric median is).
Clients with weight 0 (a non-finite update zeroed by the client work, a
Delta-FL client filtered out) are left out of the statistic; a round where
every weight is 0 returns zeros.
"""

import abc
import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


def _specs(value_type):
  return tff.types.structure_from_tensor_type_tree(
      lambda t: tf.TensorSpec(t.shape, t.dtype), value_type
  )


class StackedAggregationFactory(
    tff.aggregators.WeightedAggregationFactory, metaclass=abc.ABCMeta
):
  """A weighted factory applying `aggregate` to the stacked client updates."""

  @abc.abstractmethod
  def aggregate(self, updates: tf.Tensor, weights: tf.Tensor):
    """The aggregate of the kept clients, in TensorFlow.

    Args:
      updates: `[n, d]` float32, one flattened update per kept client (n >= 1).
      weights: `[n]` float32, their (positive) weights.

    Returns:
      `(aggregate, measurements)`: a `[d]` float32 vector and an
      `OrderedDict` of scalar tensors (the same keys and dtypes every call).
    """

  @abc.abstractmethod
  def empty_measurements(self) -> collections.OrderedDict:
    """The measurements of a round with no kept client (tensors)."""

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    """Builds the aggregation process for values and weights of these types."""
    if not tff.types.is_structure_of_floats(value_type):
      raise TypeError(
          f'{type(self).__name__} aggregates structures of float tensors, got '
          f'{value_type}'
      )
    if not tff.types.is_structure_of_floats(weight_type):
      raise TypeError(f'weights must be floats, got {weight_type}')
    specs = _specs(value_type)
    flat_specs = tf.nest.flatten(specs)
    sizes = [int(np.prod(s.shape)) for s in flat_specs]
    dim = sum(sizes)
    stack_type = tff.types.to_type(
        collections.OrderedDict(
            updates=tff.TensorType(np.float32, [None, dim]),
            weights=tff.TensorType(np.float32, [None]),
        )
    )
    row_type = tff.types.to_type(
        collections.OrderedDict(
            update=tff.TensorType(np.float32, [dim]),
            weight=tff.TensorType(np.float32, []),
        )
    )

    @tff.tensorflow.computation(value_type, weight_type)
    def flatten(value, weight):
      parts = [
          tf.reshape(tf.cast(t, tf.float32), [-1])
          for t in tf.nest.flatten(value)
      ]
      return collections.OrderedDict(
          update=tf.concat(parts, axis=0), weight=tf.cast(weight, tf.float32)
      )

    @tff.tensorflow.computation()
    def zero():
      return collections.OrderedDict(
          updates=tf.zeros([0, dim], tf.float32),
          weights=tf.zeros([0], tf.float32),
      )

    @tff.tensorflow.computation(stack_type, row_type)
    def accumulate(stack, row):
      return collections.OrderedDict(
          updates=tf.concat([stack['updates'], row['update'][tf.newaxis]], 0),
          weights=tf.concat([stack['weights'], row['weight'][tf.newaxis]], 0),
      )

    @tff.tensorflow.computation(stack_type, stack_type)
    def merge(a, b):
      return collections.OrderedDict(
          updates=tf.concat([a['updates'], b['updates']], 0),
          weights=tf.concat([a['weights'], b['weights']], 0),
      )

    @tff.tensorflow.computation(stack_type)
    def report(stack):
      return stack

    @tff.tensorflow.computation(stack_type)
    def server_aggregate(stack):
      keep = stack['weights'] > 0
      updates = tf.boolean_mask(stack['updates'], keep)
      weights = tf.boolean_mask(stack['weights'], keep)
      vector, measurements = tf.cond(
          tf.size(weights) > 0,
          lambda: self.aggregate(updates, weights),
          lambda: (tf.zeros([dim], tf.float32), self.empty_measurements()),
      )
      measurements = collections.OrderedDict(
          measurements, num_clients=tf.shape(weights)[0]
      )
      pieces = tf.split(vector, sizes)
      result = tf.nest.pack_sequence_as(
          specs,
          [
              tf.cast(tf.reshape(p, s.shape), s.dtype)
              for p, s in zip(pieces, flat_specs)
          ],
      )
      return result, measurements

    @tff.federated_computation()
    def init_fn():
      return tff.federated_value((), tff.SERVER)

    @tff.federated_computation(
        init_fn.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS),
    )
    def next_fn(state, value, weight):
      rows = tff.federated_map(flatten, (value, weight))
      stack = tff.federated_aggregate(rows, zero(), accumulate, merge, report)
      output = tff.federated_map(server_aggregate, stack)
      return tff.templates.MeasuredProcessOutput(state, output[0], output[1])

    return tff.templates.AggregationProcess(init_fn, next_fn)


def weighted_mean(updates: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
  """sum_k w_k x_k / sum_k w_k over the rows of `updates`."""
  return tf.reduce_sum(updates * weights[:, tf.newaxis], 0) / tf.reduce_sum(
      weights
  )
