# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Federated per-client evaluation.

`build_per_client_evaluation(model_fn)` is a `tff.Computation`
`(model_weights@SERVER, {data*}@CLIENTS) -> metrics@CLIENTS`: the model is
broadcast, each client evaluates it on its own data, and each client's
finalized metrics (the model's Keras metrics, e.g. `loss` and `accuracy`, plus
`num_examples`) come back as one entry per client. In TFF simulation a
CLIENTS-placed result is a Python list in the order of the input clients, so
the distribution over clients can be summarised exactly as the papers report
it (`tasks.tail_metrics`).

Only the evaluation result leaves the clients; for deployments where even
per-client metrics must stay private, aggregate them instead.
"""

import collections
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import runtime

runtime.end_workers_at_exit()  # Quiet at exit: TFF's service manager.

ModelFn = Callable[[], tff.learning.models.VariableModel]


def _model_types(model_fn: ModelFn):
  with tf.Graph().as_default():  # pytype: disable=attribute-error
    model = model_fn()
    weights_type = tff.learning.models.weights_type_from_model(model)
    element_type = tff.types.tensorflow_to_type(model.input_spec)
  return weights_type, tff.SequenceType(element_type)


def forward_all(
    model: tff.learning.models.VariableModel, dataset: tf.data.Dataset
) -> tf.Tensor:
  """Runs the model over `dataset` (its metrics accumulate); the examples."""

  def step(num_examples, batch):
    output = model.forward_pass(batch, training=False)
    if output.num_examples is None:
      n = tf.shape(output.predictions, out_type=tf.int64)[0]
    else:
      n = tf.cast(output.num_examples, tf.int64)
    return num_examples + n

  return dataset.reduce(tf.constant(0, tf.int64), step)


def evaluate_local(
    model: tff.learning.models.VariableModel, weights, dataset: tf.data.Dataset
) -> collections.OrderedDict:
  """Evaluates `weights` on `dataset` with `model`; call in a `tf.function`.

  Returns:
    The model's finalized metrics on the dataset, plus `num_examples`.
  """
  model_weights = tff.learning.models.ModelWeights.from_model(model)
  tf.nest.map_structure(lambda v, t: v.assign(t), model_weights, weights)
  num_examples = forward_all(model, dataset)
  unfinalized = model.report_local_unfinalized_metrics()
  result = collections.OrderedDict()
  for name, finalizer in model.metric_finalizers().items():
    if name in ('num_examples', 'num_batches'):
      continue
    result[name] = tf.cast(finalizer(unfinalized[name]), tf.float32)
  result['num_examples'] = num_examples
  return result


def build_per_client_evaluation(model_fn: ModelFn) -> tff.Computation:
  """Federated evaluation returning each client's metrics.

  Args:
    model_fn: No-arg callable returning a new `VariableModel`.

  Returns:
    A `tff.Computation` `(weights@SERVER, {data*}@CLIENTS) -> metrics@CLIENTS`.
  """
  if not callable(model_fn):
    raise TypeError('model_fn must be a no-arg callable returning a model')
  weights_type, data_type = _model_types(model_fn)

  @tff.tensorflow.computation(weights_type, data_type)
  def client_eval(weights, dataset):
    model = model_fn()

    @tf.function
    def run(weights, dataset):
      return evaluate_local(model, weights, dataset)

    return run(weights, dataset)

  @tff.federated_computation(
      tff.FederatedType(weights_type, tff.SERVER),
      tff.FederatedType(data_type, tff.CLIENTS),
  )
  def per_client_eval(weights, data):
    return tff.federated_map(
        client_eval, (tff.federated_broadcast(weights), data)
    )

  return per_client_eval


def evaluate_clients(
    evaluation: tff.Computation,
    model_weights,
    datasets: Sequence[tf.data.Dataset],
    *,
    chunk_size: int = 100,
) -> dict[str, np.ndarray]:
  """Runs `evaluation` over many clients, `chunk_size` per call.

  Returns:
    A dict of metric name -> array with one value per client, in the order
    of `datasets`.
  """
  if chunk_size < 1:
    raise ValueError(f'chunk_size must be >= 1, got {chunk_size}')
  rows = []
  for start in range(0, len(datasets), chunk_size):
    rows.extend(
        evaluation(model_weights, list(datasets[start : start + chunk_size]))
    )
  if not rows:
    return {}
  return {
      name: np.asarray([row[name] for row in rows]) for name in rows[0].keys()
  }
