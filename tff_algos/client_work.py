# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Local training on a client, shared by FedAvg, FedProx and later algorithms.

The math lives in `local_training`, a plain TensorFlow function over a
`VariableModel`: mini-batch steps of a `tff.learning.optimizers.Optimizer` on

  F_k(w) + (mu / 2) ||w - w_t||^2,

where w_t is the broadcast model (FedProx, Li et al., MLSys 2020,
arXiv:1812.06127, Algorithm 2; mu = 0 is FedAvg's local SGD, McMahan et al.,
AISTATS 2017). The client returns the model delta `w_t - w_final` (TFF's sign
convention: the server optimizer subtracts it) and a weight. A delta with a
non-finite entry is zeroed and gets weight 0, so one diverged client cannot
poison the average.

`build_local_training_client_work` places that function with TFF, as a
`tff.learning.templates.ClientWorkProcess`.
"""

import collections
from collections.abc import Callable
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

from tensorflow_federated.python.learning import loop_builder
from tff_algos import definition as definition_lib

ModelFn = Callable[[], tff.learning.models.VariableModel]


def local_training(
    model: tff.learning.models.VariableModel,
    optimizer: tff.learning.optimizers.Optimizer,
    initial_weights: tff.learning.models.ModelWeights,
    data: tf.data.Dataset,
    *,
    proximal_strength: float = 0.0,
    weight_decay: float = 0.0,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
):
  """Runs local (proximal) mini-batch training; call inside a `tf.function`.

  Args:
    model: The client's model; its variables are overwritten.
    optimizer: The client optimizer.
    initial_weights: The broadcast model w_t (also the proximal anchor).
    data: Batched local data (epochs already repeated).
    proximal_strength: mu >= 0 of the proximal term.
    weight_decay: lambda >= 0: adds lambda * w to each gradient, i.e. the
      step w <- (1 - lr lambda) w - lr grad (the Delta-FL workshop variant).
    loop_implementation: How the dataset is iterated.

  Returns:
    `(delta, num_examples, has_non_finite)`: `delta = w_t - w_final` over the
    trainable weights (zeroed if any entry is non-finite), the number of
    examples processed (int64), and whether the delta was non-finite.
  """
  weights = tff.learning.models.ModelWeights.from_model(model)
  tf.nest.map_structure(lambda v, t: v.assign(t), weights, initial_weights)
  reduce_loop = loop_builder.build_training_loop(loop_implementation)

  def train_step(state, batch):
    num_examples, opt_state = state
    with tf.GradientTape() as tape:
      output = model.forward_pass(batch, training=True)
    grads = tape.gradient(output.loss, weights.trainable)
    if proximal_strength:
      grads = tf.nest.map_structure(
          lambda g, w, w0: g + proximal_strength * (w - w0),
          grads,
          weights.trainable,
          initial_weights.trainable,
      )
    if weight_decay:
      grads = tf.nest.map_structure(
          lambda g, w: g + weight_decay * w, grads, weights.trainable
      )
    opt_state, new_weights = optimizer.next(
        opt_state,
        tuple(tf.nest.flatten(weights.trainable)),
        tuple(tf.nest.flatten(grads)),
    )
    tf.nest.map_structure(
        lambda v, t: v.assign(t),
        tuple(tf.nest.flatten(weights.trainable)),
        new_weights,
    )
    if output.num_examples is None:
      batch_examples = tf.shape(output.predictions, out_type=tf.int64)[0]
    else:
      batch_examples = tf.cast(output.num_examples, tf.int64)
    return num_examples + batch_examples, opt_state

  def initial_state():
    specs = tuple(
        tf.TensorSpec(v.shape, v.dtype)
        for v in tf.nest.flatten(weights.trainable)
    )
    return tf.constant(0, tf.int64), optimizer.initialize(specs)

  num_examples, _ = reduce_loop(train_step, data, initial_state)
  delta = tf.nest.map_structure(
      tf.subtract, initial_weights.trainable, weights.trainable
  )
  delta, has_non_finite = zero_all_if_any_non_finite(delta)
  return delta, num_examples, has_non_finite


def local_loss(
    model: tff.learning.models.VariableModel,
    weights: tff.learning.models.ModelWeights,
    data: tf.data.Dataset,
    *,
    with_gradient: bool = False,
    reset_metrics: bool = True,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_ITERATOR
    ),
):
  """The client's loss F_k(w) over all of `data` at `weights`, before training.

  The shared first step of the tail-aware algorithms (q-FFL, TERM, AFL,
  Delta-FL): each selected client evaluates the broadcast model on its full
  local training data. A stream repeated over E epochs gives the same mean.
  The pass leaves the model's metrics reset, so training metrics reported
  afterwards cover training only. Call inside a `tf.function`.

  Args:
    model: The client's model; its variables are overwritten with `weights`.
    weights: The model to evaluate (the broadcast w_t).
    data: Batched local data.
    with_gradient: Also return the mean gradient of the loss (q-FedSGD).
    reset_metrics: Reset the model's metrics after the pass (keep them when
      the pass is the client's only work, as in q-FedSGD).
    loop_implementation: How `data` is iterated (the values do not depend
      on it). The default iterates with a `tf.while_loop`: a
      `Dataset.reduce` instantiates its reduce function on every call, which
      made this pass cost about 19 ms of CPU per client on the 60x10 softmax
      model against about 7 ms (docs/performance_log.md, "Tail-aware round
      cost: the loss pass"). The batches are read in the same order either
      way, and a stream read again afterwards (the training pass) gets the
      same reshuffle.

  Returns:
    `(mean_loss, num_examples)` as float32 and int64 scalars, plus the mean
    gradient over trainable weights when `with_gradient`. An empty dataset
    gives loss 0 and a zero gradient.
  """
  model_weights = tff.learning.models.ModelWeights.from_model(model)
  tf.nest.map_structure(lambda v, t: v.assign(t), model_weights, weights)
  # Tuples, not lists: tf.data would stack a list of tensors into one.
  zeros = tuple(
      tf.zeros_like(v) for v in tf.nest.flatten(model_weights.trainable)
  )

  def step(state, batch):
    loss_sum, n, grad_sum = state
    with tf.GradientTape() as tape:
      output = model.forward_pass(batch, training=False)
    if output.num_examples is None:
      batch_n = tf.shape(output.predictions, out_type=tf.int64)[0]
    else:
      batch_n = tf.cast(output.num_examples, tf.int64)
    batch_w = tf.cast(batch_n, tf.float32)
    if with_gradient:
      grads = tape.gradient(
          output.loss, tf.nest.flatten(model_weights.trainable)
      )
      grad_sum = tuple(a + batch_w * g for a, g in zip(grad_sum, grads))
    return (
        loss_sum + batch_w * tf.cast(output.loss, tf.float32),
        n + batch_n,
        grad_sum,
    )

  loop = loop_builder.build_training_loop(loop_implementation)
  loss_sum, n, grad_sum = loop(
      step, data, lambda: (tf.constant(0.0), tf.constant(0, tf.int64), zeros)
  )
  if reset_metrics:
    model.reset_metrics()
  denom = tf.maximum(tf.cast(n, tf.float32), 1.0)
  mean_loss = loss_sum / denom
  if with_gradient:
    return (
        mean_loss,
        n,
        tf.nest.pack_sequence_as(
            model_weights.trainable, [g / denom for g in grad_sum]
        ),
    )
  return mean_loss, n


def full_gradient_work(
    model: tff.learning.models.VariableModel,
    weights: tff.learning.models.ModelWeights,
    dataset: tf.data.Dataset,
    personal=(),
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_ITERATOR
    ),
) -> definition_lib.LocalWork:
  """A client's loss and full mean gradient at `weights` (AFL, q-FedSGD).

  Call inside a `tf.function`. The gradient is zeroed, and `non_finite`
  set, if any entry is NaN/inf; the training metrics are this pass's.
  """
  del personal
  loss, num_examples, grad = local_loss(  # pytype: disable=bad-unpacking
      model,
      weights,
      dataset,
      with_gradient=True,
      reset_metrics=False,
      loop_implementation=loop_implementation,
  )
  grad, non_finite = zero_all_if_any_non_finite(grad)
  return definition_lib.LocalWork(
      vector=tuple(tf.nest.flatten(grad)),
      num_examples=num_examples,
      non_finite=non_finite,
      loss=loss,
  )


def zero_all_if_any_non_finite(structure):
  """`(structure or zeros, any_non_finite)`: zeros if any entry is NaN/inf."""
  flat = tf.nest.flatten(structure)
  all_finite = tf.reduce_all(
      [tf.reduce_all(tf.math.is_finite(t)) for t in flat]
  )
  zeroed = tf.nest.map_structure(tf.zeros_like, structure)
  result = tf.cond(all_finite, lambda: structure, lambda: zeroed)
  return result, tf.logical_not(all_finite)


def client_weight(
    weighting: tff.learning.ClientWeighting,
    num_examples: tf.Tensor,
    has_non_finite: tf.Tensor,
) -> tf.Tensor:
  """The aggregation weight of a client's update (0 if it was non-finite)."""
  if weighting == tff.learning.ClientWeighting.NUM_EXAMPLES:
    weight = tf.cast(num_examples, tf.float32)
  elif weighting == tff.learning.ClientWeighting.UNIFORM:
    weight = tf.constant(1.0, tf.float32)
  else:
    raise ValueError(f'unknown client weighting {weighting!r}')
  return tf.where(has_non_finite, tf.constant(0.0), weight)


def weighted_delta_result(weighting: tff.learning.ClientWeighting):
  """A definition's `client_result` sending the delta with `client_weight`.

  FedAvg's, FedProx's and Ditto's global update (the weighted mean of the
  deltas, as `tff.aggregators.MeanFactory`).
  """

  def client_result(context, loss, count, delta, num_examples, non_finite):
    del context, loss, count
    return delta, client_weight(weighting, num_examples, non_finite)

  return client_result


def model_types(model_fn: ModelFn):
  """`(model_weights_type, data_type, metric_finalizers, unfinalized_type)`."""
  with tf.Graph().as_default():  # pytype: disable=attribute-error
    model = model_fn()
    if not isinstance(model, tff.learning.models.VariableModel):
      raise TypeError(
          'model_fn must return a tff.learning.models.VariableModel, got '
          f'{type(model).__name__}'
      )
    finalizers = model.metric_finalizers()
    element_type = tff.types.tensorflow_to_type(model.input_spec)
    weights_type = tff.learning.models.weights_type_from_model(model)
    unfinalized_type = tff.types.tensorflow_to_type(
        tf.nest.map_structure(
            lambda t: tf.TensorSpec(t.shape, t.dtype),
            model.report_local_unfinalized_metrics(),
        )
    )
  return (
      weights_type,
      tff.SequenceType(element_type),
      finalizers,
      unfinalized_type,
  )


def model_types_and_metrics(
    model_fn: ModelFn,
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
):
  """`(weights_type, data_type, metrics_aggregation_fn)` of a client work.

  `metrics_aggregator` defaults to `tff.learning.metrics.sum_then_finalize`.
  """
  if metrics_aggregator is None:
    metrics_aggregator = tff.learning.metrics.sum_then_finalize
  weights_type, data_type, finalizers, unfinalized_type = model_types(model_fn)
  return (
      weights_type,
      data_type,
      metrics_aggregator(finalizers, unfinalized_type),
  )


def empty_server_state() -> tff.Computation:
  """The `initialize` of a client work without server state."""

  @tff.federated_computation
  def init_fn():
    return tff.federated_value((), tff.SERVER)

  return init_fn


def structured_client_result(
    definition: definition_lib.AlgorithmDefinition,
    context,
    loss,
    count,
    delta,
    num_examples,
    non_finite,
):
  """`definition.client_result` on a nested delta, for a TFF client.

  The engines call `client_result` with the flat tuple of the trainable
  weights' deltas; a TFF client computation calls it through this function,
  which flattens `delta` and nests the vector back as `delta` is, so both
  paths send what the one definition computes.
  """
  vector, scalar = definition.client_result(
      context,
      loss,
      count,
      tuple(tf.nest.flatten(delta)),
      num_examples,
      non_finite,
  )
  return tf.nest.pack_sequence_as(delta, list(vector)), scalar


def build_local_training_client_work(
    model_fn: ModelFn,
    optimizer: tff.learning.optimizers.Optimizer,
    definition: definition_lib.AlgorithmDefinition,
    *,
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
) -> tff.learning.templates.ClientWorkProcess:
  """The TFF client work of a definition whose clients train locally.

  Each selected client trains with the definition's proximal strength and
  weight decay, or runs the definition's own stateless `local_work`, and
  sends its `client_result` (FedAvg's and FedProx's: `weighted_delta_result`,
  the delta with `client_weight`). With a fresh loss pass declared through
  `reductions` (TERM's), each client first evaluates the broadcast model;
  the server reduces the clients' values with `tff.federated_sum`, `max` or
  `min`, broadcasts that round context, and the clients the definition's
  `trains` keeps (all, without it) train on a fresh pass over their data,
  the others sending a zero delta with weight 0. The engines compute the
  same context with `definition.prepare`.

  Args:
    model_fn: No-arg callable returning a new `VariableModel`.
    optimizer: Client optimizer (`tff.learning.optimizers.Optimizer`).
    definition: The algorithm's `definition.AlgorithmDefinition`, one without
      personal models or server state, whose loss pass is none or fresh with
      its context declared as `reductions`, e.g. `fed_prox.engine_definition`
      or `term.engine_definition`.
    metrics_aggregator: Aggregator of training metrics (default
      `tff.learning.metrics.sum_then_finalize`).
    loop_implementation: How local datasets are iterated.

  Returns:
    A `ClientWorkProcess` whose result is the definition's vector and
    weight, and whose measurements are the aggregated training metrics under
    `train`; with a loss pass also `loss_at_broadcast` (the clients' mean),
    each reduction by its name and, with `trains`, `fraction_kept`.

  Raises:
    TypeError: For a wrong argument type.
    ValueError: For a definition this client work cannot run.
  """
  if not isinstance(definition, definition_lib.AlgorithmDefinition):
    raise TypeError(
        'definition must be a definition.AlgorithmDefinition, got '
        f'{type(definition).__name__}'
    )
  loss_pass = definition.loss_pass == 'fresh'
  if (
      definition.loss_pass not in ('none', 'fresh')
      or (loss_pass and not definition.reductions)
      or definition.personal_models
      or definition.server_state is not None
  ):
    raise ValueError(
        f'{definition.name}: this client work runs local training or a '
        'stateless local_work, after no loss pass or a fresh one whose round '
        'context is declared as reductions'
    )
  if not isinstance(optimizer, tff.learning.optimizers.Optimizer):
    raise TypeError(
        'optimizer must be a tff.learning.optimizers.Optimizer, got '
        f'{type(optimizer).__name__}'
    )
  weights_type, data_type, metrics_aggregation_fn = model_types_and_metrics(
      model_fn, metrics_aggregator
  )

  def train(model, weights, dataset, context, loss, count):
    if definition.local_work is None:
      delta, num_examples, non_finite = local_training(
          model,
          optimizer,
          weights,
          dataset,
          proximal_strength=definition.proximal_strength,
          weight_decay=definition.weight_decay,
          loop_implementation=loop_implementation,
      )
    else:
      work = definition.local_work(
          model, weights, dataset, (), loop_implementation
      )
      delta = tf.nest.pack_sequence_as(weights.trainable, list(work.vector))
      num_examples, non_finite = work.num_examples, work.non_finite
    return structured_client_result(
        definition, context, loss, count, delta, num_examples, non_finite
    )

  def client_train_fn(model, weights, dataset, context, loss, count):
    kept = tf.constant(True)
    if definition.trains is None:
      vector, weight = train(model, weights, dataset, context, loss, count)
    else:
      kept = definition.trains(context, loss)
      vector, weight = tf.cond(
          kept,
          lambda: train(model, weights, dataset, context, loss, count),
          lambda: (
              tf.nest.map_structure(tf.zeros_like, weights.trainable),
              tf.constant(0.0),
          ),
      )
    return (
        tff.learning.templates.ClientResult(
            update=vector, update_weight=weight
        ),
        model.report_local_unfinalized_metrics(),
        tf.cast(kept, tf.float32),
    )

  init_fn = empty_server_state()
  types = (weights_type, data_type, init_fn.type_signature.result)
  build = _loss_pass_client_work if loss_pass else _plain_client_work
  return build(
      model_fn,
      definition,
      client_train_fn,
      types,
      init_fn,
      metrics_aggregation_fn,
  )


def _plain_client_work(
    model_fn,
    definition,
    client_train_fn,
    types,
    init_fn,
    metrics_aggregation_fn,
):
  """`build_local_training_client_work`'s process without a loss pass."""
  del definition  # In `client_train_fn`.
  weights_type, data_type, state_type = types

  @tff.tensorflow.computation(weights_type, data_type)
  def client_update(weights, dataset):
    model = model_fn()
    run = tf.function(
        lambda w, d: client_train_fn(model, w, d, {}, None, None)[:2]
    )
    return run(weights, dataset)

  @tff.federated_computation(
      state_type,
      tff.FederatedType(weights_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS),
  )
  def next_fn(state, weights, client_data):
    client_result, model_outputs = tff.federated_map(
        client_update, (weights, client_data)
    )
    measurements = tff.federated_zip(
        collections.OrderedDict(train=metrics_aggregation_fn(model_outputs))
    )
    return tff.templates.MeasuredProcessOutput(
        state, client_result, measurements
    )

  return tff.learning.templates.ClientWorkProcess(init_fn, next_fn)


_FEDERATED_REDUCE = {
    'sum': tff.federated_sum,
    'max': tff.federated_max,
    'min': tff.federated_min,
}


def _loss_pass_client_work(
    model_fn,
    definition,
    client_train_fn,
    types,
    init_fn,
    metrics_aggregation_fn,
):
  """`build_local_training_client_work`'s process after a fresh loss pass:
  the loss, then the reductions placed with TFF's operators, then
  `client_train_fn` with that context."""
  weights_type, data_type, state_type = types
  names = tuple(name for name, _ in definition.reductions)
  kinds = tuple(r.kind for _, r in definition.reductions)

  @tff.tensorflow.computation(weights_type, data_type)
  def client_loss(weights, dataset):
    model = model_fn()

    @tf.function
    def run(weights, dataset):
      loss, count = local_loss(  # pytype: disable=bad-unpacking
          model, weights, dataset
      )
      values = tuple(r.value(loss, count) for _, r in definition.reductions)
      return loss, count, values

    return run(weights, dataset)

  loss_type, count_type, values_type = client_loss.type_signature.result

  @tff.tensorflow.computation(
      weights_type, data_type, loss_type, count_type, values_type
  )
  def client_train(weights, dataset, loss, count, values):
    model = model_fn()

    @tf.function
    def run(weights, dataset, loss, count, values):
      context = dict(zip(names, values))
      return client_train_fn(model, weights, dataset, context, loss, count)

    return run(weights, dataset, loss, count, tuple(values))

  @tff.federated_computation(
      state_type,
      tff.FederatedType(weights_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS),
  )
  def next_fn(state, weights, client_data):
    losses, counts, values = tff.federated_map(
        client_loss, (weights, client_data)
    )
    reduced = [
        _FEDERATED_REDUCE[kind](values[i]) for i, kind in enumerate(kinds)
    ]
    context = tff.federated_broadcast(tff.federated_zip(tuple(reduced)))
    result, model_outputs, kept = tff.federated_map(
        client_train, (weights, client_data, losses, counts, context)
    )
    measured = collections.OrderedDict(
        train=metrics_aggregation_fn(model_outputs),
        loss_at_broadcast=tff.federated_mean(losses),
    )
    measured.update(zip(names, reduced))
    if definition.trains is not None:
      measured['fraction_kept'] = tff.federated_mean(kept)
    return tff.templates.MeasuredProcessOutput(
        state, result, tff.federated_zip(measured)
    )

  return tff.learning.templates.ClientWorkProcess(init_fn, next_fn)
