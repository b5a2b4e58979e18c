# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Composition of learning processes from TFF template parts.

Every model-delta algorithm here (FedAvg, FedProx, ...) is a broadcast
distributor, a client work producing `ClientResult(update=delta,
update_weight)`, a weighted aggregator and a server-optimizer finalizer, put
together by `tff.learning.templates.compose_learning_process` exactly as TFF's
own `fed_prox.py` does. Swap any part through the builders' arguments.
"""

from collections.abc import Callable
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import client_work as client_work_lib
from tff_algos import definition as definition_lib

ModelFn = Callable[[], tff.learning.models.VariableModel]
# A client-work wrapper simulating corrupted clients (`tff_algos.attacks`).
UpdateAttack = Callable[
    [tff.learning.templates.ClientWorkProcess],
    tff.learning.templates.ClientWorkProcess,
]


def compose_model_delta_process(
    model_fn: ModelFn,
    client_work: tff.learning.templates.ClientWorkProcess,
    *,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    model_distributor: Optional[
        tff.learning.templates.DistributionProcess
    ] = None,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = (
        None
    ),
    update_attack: Optional[UpdateAttack] = None,
) -> tff.learning.templates.LearningProcess:
  """Composes a learning process around a model-delta client work.

  Args:
    model_fn: No-arg callable returning a new `VariableModel`.
    client_work: Produces `ClientResult(update=delta, update_weight)`.
    server_optimizer_fn: Applies the aggregated delta (default SGD, lr 1.0).
    model_distributor: Default: broadcast.
    model_aggregator: Weighted factory (default `tff.aggregators.MeanFactory`).
    update_attack: Optional client-work wrapper simulating corrupted clients
      (`tff_algos.attacks.UpdateAttack`); the client data then carry an
      attack marker.

  Returns:
    The `LearningProcess`.
  """
  if server_optimizer_fn is None:
    server_optimizer_fn = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
  if not isinstance(server_optimizer_fn, tff.learning.optimizers.Optimizer):
    raise TypeError(
        'server_optimizer_fn must be a tff.learning.optimizers.Optimizer, got '
        f'{type(server_optimizer_fn).__name__}'
    )

  @tff.tensorflow.computation()
  def initial_model_weights_fn():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  weights_type = initial_model_weights_fn.type_signature.result
  if model_distributor is None:
    model_distributor = tff.learning.templates.build_broadcast_process(
        weights_type
    )
  if model_aggregator is None:
    model_aggregator = tff.aggregators.MeanFactory()
  if not isinstance(
      model_aggregator, tff.aggregators.WeightedAggregationFactory
  ):
    raise TypeError(
        'model_aggregator must be a tff.aggregators.WeightedAggregationFactory'
        f' (wrap unweighted ones with tff.aggregators.as_weighted_aggregator),'
        f' got {type(model_aggregator).__name__}'
    )
  aggregator = model_aggregator.create(
      weights_type.trainable, tff.TensorType(np.float32)
  )
  if update_attack is not None:
    client_work = update_attack(client_work)
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer_fn, weights_type
  )
  return tff.learning.templates.compose_learning_process(
      initial_model_weights_fn,
      model_distributor,
      client_work,
      aggregator,
      finalizer,
  )


def build_from_definition(
    model_fn: ModelFn,
    definition: definition_lib.AlgorithmDefinition,
    client_optimizer: tff.learning.optimizers.Optimizer,
    server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    model_distributor: Optional[
        tff.learning.templates.DistributionProcess
    ] = None,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = (
        None
    ),
    update_attack: Optional[UpdateAttack] = None,
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
) -> tff.learning.templates.LearningProcess:
  """The TFF learning process of a definition, derived from it alone.

  For a definition whose server takes the weighted mean of the clients'
  vectors (`definition.mean_update`) and applies it with a server optimizer:
  its client work is `client_work.build_local_training_client_work` (local
  training, or a stateless `local_work`, after no loss pass or a fresh one
  whose context is declared as `reductions`), the mean is `model_aggregator`
  (so robust and DP aggregators compose) and the server optimizer the
  definition's `fixed_server_optimizer` or `server_optimizer`. The engines
  run the same definition.

  Args:
    model_fn: No-arg callable returning a new `VariableModel`.
    definition: The algorithm's `definition.AlgorithmDefinition`.
    client_optimizer: The local solver.
    server_optimizer: Applies the mean (default SGD, lr 1.0).
    model_distributor: Default: broadcast.
    model_aggregator: Weighted factory (default `tff.aggregators.MeanFactory`).
    update_attack: Optional client-work wrapper (`tff_algos.attacks`).
    metrics_aggregator: Training-metrics aggregator.
    loop_implementation: How local datasets are iterated.

  Returns:
    The `LearningProcess`.

  Raises:
    ValueError: For a definition whose round this cannot place (its own
      server rule, server state or personal models: write its builder).
  """
  if (
      definition.server is not definition_lib.mean_update
      or not definition.weighted
      or not definition.server_optimizer
      or definition.server_sees_clients
  ):
    raise ValueError(
        f'{definition.name}: a builder derives from a definition whose '
        "server applies the weighted mean of the clients' vectors with a "
        'server optimizer; write this one by hand'
    )
  work = client_work_lib.build_local_training_client_work(
      model_fn,
      client_optimizer,
      definition,
      metrics_aggregator=metrics_aggregator,
      loop_implementation=loop_implementation,
  )
  return compose_model_delta_process(
      model_fn,
      work,
      server_optimizer_fn=definition.fixed_server_optimizer or server_optimizer,
      model_distributor=model_distributor,
      model_aggregator=model_aggregator,
      update_attack=update_attack,
  )


def definition_builder(
    definition_fn: Callable[[Any, Any], definition_lib.AlgorithmDefinition],
) -> Callable[[Any, ModelFn, Any], tff.learning.templates.LearningProcess]:
  """An `options.Algorithm.builder` that is `build_from_definition` of the
  entry's `definition_fn(options, context)`, with the context's optimizers,
  loop and aggregation (a robust or DP mean, an attack)."""

  def build(options, model_fn, context):
    return build_from_definition(
        model_fn,
        definition_fn(options, context),
        context.client_optimizer,
        context.server_optimizer,
        loop_implementation=context.loop_implementation,
        **context.aggregation(context.clients_per_round),
    )

  return build


def model_weights_as_numpy(
    process: tff.learning.templates.LearningProcess, state
) -> list[np.ndarray]:
  """The trainable weights of `state` as a flat list of arrays."""
  weights = process.get_model_weights(state)
  return [np.asarray(w) for w in tf.nest.flatten(weights.trainable)]
