# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Ditto: global model by FedAvg, personal models pulled toward it.

T. Li, S. Hu, A. Beirami, V. Smith, "Ditto: Fair and Robust Federated
Learning Through Personalization", ICML 2021, https://arxiv.org/abs/2012.04221
(thesis chapter 5, Algorithm 7; spec `thesis_algorithms.md` section 6).

Each round t, every selected client k receives w^t and

1. trains the global model as FedAvg does (E epochs of mini-batch steps from
   w^t with the client optimizer) and sends Delta_k = w^t - w_k^t;
2. updates its personal model v_k, kept across rounds, by mini-batch steps on
   h_k(v; w^t) = F_k(v) + lambda/2 ||v - w^t||^2, i.e.
   v <- v - eta_l (grad F_k(v) + lambda (v - w^t)), anchored at the received
   w^t (not at the freshly trained w_k^t).

The server aggregates the deltas with any weighted `tff.aggregators` factory
(`model_aggregator`, default the weighted mean: Ditto's global model is then
exactly FedAvg's) and applies them with the server optimizer (SGD 1.0: w^{t+1}
= w^t - mean Delta_k). A robust factory (clipping, median, ...) gives "Ditto +
robust aggregator" (thesis section 5.3.4).

lambda is fixed, or selected per client on its validation data (thesis section
5.3 "Setup", spec 6.6): with a grid (lambda_1..lambda_G) every client keeps G
personal models, one per lambda, trained side by side, and is evaluated with
the one of lowest validation loss (the simulation loop does the selection).

Decisions where the thesis is silent (docs/algorithms.md): v_k^0 = w^0; the
personal steps use the same local stream as the global ones (E epochs of the
round's batches), or exactly `personal_steps` mini-batch steps; eta_l = the
personal optimizer's learning rate (default: the client optimizer); a
personal update with a NaN/inf keeps the previous v_k, counted in the round's
metric `client_work/personal_non_finite` (personal models kept, summed over
clients and lambdas; Fed+ reports its `non_finite_clients` likewise).
"""

import collections
from collections.abc import Callable, Sequence
import dataclasses
from typing import Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tensorflow_federated.python.learning import loop_builder
from tff_algos import attacks
from tff_algos import client_work as client_work_lib
from tff_algos import definition as definition_lib
from tff_algos import options as options_lib
from tff_algos import stacked_work
from tff_algos import stateful

ModelFn = Callable[[], tff.learning.models.VariableModel]


def personal_training(
    model: tff.learning.models.VariableModel,
    optimizer: tff.learning.optimizers.Optimizer,
    personal_weights,
    anchor_weights: tff.learning.models.ModelWeights,
    data: tf.data.Dataset,
    *,
    lam: float,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
):
  """Ditto's personal update; call inside a `tf.function`.

  Mini-batch steps of `optimizer` on F_k(v) + lam/2 ||v - w^t||^2 starting
  from v = `personal_weights` (trainable weights), with the anchor w^t =
  `anchor_weights.trainable` fixed.

  Returns:
    `(v, num_examples)`: the new trainable weights and examples processed.
  """
  weights = tff.learning.models.ModelWeights.from_model(model)
  tf.nest.map_structure(
      lambda v, t: v.assign(t), weights.trainable, list(personal_weights)
  )
  tf.nest.map_structure(
      lambda v, t: v.assign(t),
      weights.non_trainable,
      anchor_weights.non_trainable,
  )
  reduce_loop = loop_builder.build_training_loop(loop_implementation)

  def train_step(state, batch):
    num_examples, opt_state = state
    with tf.GradientTape() as tape:
      output = model.forward_pass(batch, training=True)
    grads = tape.gradient(output.loss, weights.trainable)
    grads = tf.nest.map_structure(
        lambda g, w, w0: g + lam * (w - w0),
        grads,
        weights.trainable,
        list(anchor_weights.trainable),
    )
    opt_state, new_weights = optimizer.next(
        opt_state, tuple(weights.trainable), tuple(grads)
    )
    tf.nest.map_structure(
        lambda v, t: v.assign(t), tuple(weights.trainable), new_weights
    )
    if output.num_examples is None:
      n = tf.shape(output.predictions, out_type=tf.int64)[0]
    else:
      n = tf.cast(output.num_examples, tf.int64)
    return num_examples + n, opt_state

  def initial_state():
    specs = tuple(tf.TensorSpec(v.shape, v.dtype) for v in weights.trainable)
    return tf.constant(0, tf.int64), optimizer.initialize(specs)

  num_examples, _ = reduce_loop(train_step, data, initial_state)
  return [tf.identity(v) for v in weights.trainable], num_examples


def local_work(
    model: tff.learning.models.VariableModel,
    weights: tff.learning.models.ModelWeights,
    dataset: tf.data.Dataset,
    personal,
    *,
    client_optimizer: tff.learning.optimizers.Optimizer,
    personal_optimizer: tff.learning.optimizers.Optimizer,
    lambdas: Sequence[float],
    personal_steps: int,
    loop_implementation: tff.learning.LoopImplementation,
) -> definition_lib.LocalWork:
  """A Ditto client's round (Algorithm 7); call inside a `tf.function`.

  The global update (FedAvg's local training from w^t), then one personal
  update per lambda from the client's personal models `personal`, anchored
  at w^t, reading `dataset` again (or `personal_steps` batches of it,
  cycled). A non-finite personal update keeps the previous model, counted in
  `client_counts['personal_non_finite']`.
  """
  delta, num_examples, non_finite = client_work_lib.local_training(
      model,
      client_optimizer,
      weights,
      dataset,
      loop_implementation=loop_implementation,
  )
  train_metrics = model.report_local_unfinalized_metrics()
  personal_data = dataset
  if personal_steps:
    personal_data = dataset.repeat().take(personal_steps)
  new_personal, dropped = [], tf.constant(0, tf.int32)
  seen = tf.constant(0, tf.int32)  # Examples the personal passes read.
  # Metrics were read above; the personal passes must not count. Each pass
  # reads the stream again (a seeded reshuffle gives it the next order), so
  # the passes are ordered: global training, then lambda_1, lambda_2, ...
  after = tf.nest.flatten(train_metrics)
  for lam_g, v in zip(lambdas, personal):
    with tf.control_dependencies(after):
      v_new, n_personal = personal_training(
          model,
          personal_optimizer,
          v,
          weights,
          personal_data,
          lam=lam_g,
          loop_implementation=loop_implementation,
      )
    v_new, v_non_finite = stateful.zero_non_finite_to(v_new, list(v))
    after = list(v_new)
    new_personal.append(tuple(v_new))
    dropped += tf.cast(v_non_finite, tf.int32)
    seen += tf.cast(n_personal, tf.int32)
  return definition_lib.LocalWork(
      vector=tuple(tf.nest.flatten(delta)),
      num_examples=num_examples,
      non_finite=non_finite,
      model_metrics=train_metrics,
      personal=tuple(new_personal),
      client_counts=collections.OrderedDict(
          personal_non_finite=dropped, personal_examples=seen
      ),
  )


# Ditto's client counts, in its definition's order.
CLIENT_COUNTS = ('personal_non_finite', 'personal_examples')


@dataclasses.dataclass(frozen=True, eq=False)
class PersonalWork(stacked_work.StackedLocalWork):
  """Ditto's client work (`local_work` with these settings), as a callable.

  Called as a definition's `local_work` `(model, weights, dataset, personal,
  loop_implementation)`; `stacked_kernel` computes the same passes with the
  clients stacked (the stacked engine).

  Attributes:
    client_optimizer: The global pass's optimizer (FedAvg's local training).
    personal_optimizer: The personal passes' optimizer.
    lambdas: One personal model and pass per lambda, in this order.
    personal_steps: 0: each personal pass reads the client's stream once
      more; s > 0: exactly s batches of it, cycled.
  """

  client_optimizer: tff.learning.optimizers.Optimizer
  personal_optimizer: tff.learning.optimizers.Optimizer
  lambdas: tuple[float, ...]
  personal_steps: int

  def __call__(self, model, weights, dataset, personal, loop_implementation):
    return local_work(
        model,
        weights,
        dataset,
        personal,
        client_optimizer=self.client_optimizer,
        personal_optimizer=self.personal_optimizer,
        lambdas=self.lambdas,
        personal_steps=self.personal_steps,
        loop_implementation=loop_implementation,
    )

  @property
  def extra_passes(self) -> int:
    return len(self.lambdas)  # One read of the stream per personal pass.

  def training_optimizer(self, run_optimizer):
    del run_optimizer
    return self.client_optimizer

  def check_stacked(self, definition) -> None:
    if self.personal_steps:
      raise stacked_work.StackedEngineError(
          'the stacked engine runs personal passes of one read of the '
          f'stream each; {definition.name} with personal_steps='
          f'{self.personal_steps} runs on the batched engine'
      )
    if tuple(definition.client_counts) != CLIENT_COUNTS:
      raise stacked_work.StackedEngineError(
          f'the stacked engine counts {", ".join(CLIENT_COUNTS)} per round; '
          f'{definition.name} has client counts {definition.client_counts}'
      )

  def stacked_kernel(self, kit):
    """`local_work` on stacked clients: the engine's local training, then
    per lambda a pass of the personal models [K, ...] from their own start,
    pulled toward the broadcast model, each reading the client's stream once
    more; a non-finite personal model is kept at the previous one and
    counted."""
    solver = kit.solver(self.personal_optimizer)
    lambdas = self.lambdas

    def personal_pass(w0, start, x_all, y_all, idx, valid, lam, decay):
      # grad F_k(v) + lam (v - w0) from the personal models `start`.
      return kit.descend(
          start, w0, solver, x_all, y_all, idx, valid, lam, decay
      )

    def round_work(inputs):
      result = kit.train(inputs)  # The global pass, first (`local_work`).
      new_personal = []
      dropped = tf.constant(0, tf.int32)
      for g, lam in enumerate(lambdas):
        pos = inputs.extra_pos[g]
        valid = tf.logical_and(pos >= 0, inputs.kept[None, :, None])
        models, _ = kit.run_clients(
            personal_pass,
            inputs.w0,
            inputs.personal[g],
            inputs.x_all,
            inputs.y_all,
            kit.indices(pos, inputs.x_all),
            valid,
            inputs.steps,
            lam,
            0.0,
        )
        models, bad = stacked_work.keep_finite(kit, models, inputs.personal[g])
        new_personal.append(models)
        dropped += tf.reduce_sum(tf.cast(bad, tf.int32))
      # Each personal pass reads the stream once, as the global one.
      seen = tf.cast(tf.reduce_sum(result.sums[2]), tf.int32) * len(lambdas)
      return result._replace(
          personal=tuple(new_personal), client_counts=(dropped, seen)
      )

    return round_work


def engine_definition(
    *,
    client_optimizer: tff.learning.optimizers.Optimizer,
    lam: Union[float, Sequence[float]],
    personal_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
    personal_steps: int = 0,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.NUM_EXAMPLES
    ),
) -> definition_lib.AlgorithmDefinition:
  """Ditto's round math, which `build_ditto` and the engines run.

  The client work is `local_work`; the deltas are averaged with
  `client_work.client_weight` (the default `MeanFactory`) and applied by the
  server optimizer. Arguments as `build_ditto`'s.

  Returns:
    A `definition.AlgorithmDefinition` with one personal model per lambda.

  Raises:
    TypeError, ValueError: For invalid arguments.
  """
  lambdas = check_lambdas(lam)
  _check_optimizer('client_optimizer_fn', client_optimizer)
  if personal_optimizer is None:
    personal_optimizer = client_optimizer
  _check_optimizer('personal_optimizer_fn', personal_optimizer)
  if isinstance(personal_steps, bool) or not isinstance(personal_steps, int):
    raise TypeError('personal_steps must be an int')
  if personal_steps < 0:
    raise ValueError(f'personal_steps must be >= 0, got {personal_steps}')
  if client_weighting not in (
      tff.learning.ClientWeighting.NUM_EXAMPLES,
      tff.learning.ClientWeighting.UNIFORM,
  ):
    raise ValueError(f'unknown client weighting {client_weighting!r}')

  return definition_lib.AlgorithmDefinition(
      name='ditto',
      client_result=client_work_lib.weighted_delta_result(client_weighting),
      local_work=PersonalWork(
          client_optimizer=client_optimizer,
          personal_optimizer=personal_optimizer,
          lambdas=lambdas,
          personal_steps=personal_steps,
      ),
      personal_models=len(lambdas),
      client_counts=CLIENT_COUNTS,
  )


def _check_optimizer(name, optimizer):
  if not isinstance(optimizer, tff.learning.optimizers.Optimizer):
    raise TypeError(
        f'{name} must be a tff.learning.optimizers.Optimizer, got '
        f'{type(optimizer).__name__}'
    )


def check_lambdas(lam) -> tuple[float, ...]:
  """The lambda grid of `lam` (a float or a non-empty sequence of floats)."""
  values = [lam] if not isinstance(lam, (list, tuple)) else list(lam)
  if not values:
    raise ValueError('lam must be a float or a non-empty sequence of floats')
  for v in values:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
      raise TypeError(f'lambda must be a float, got {type(v).__name__}')
    if not (np.isfinite(v) and v >= 0):
      raise ValueError(f'lambda must be finite and >= 0, got {v}')
  if len(set(values)) != len(values):
    raise ValueError(f'the lambda grid has duplicates: {values}')
  return tuple(float(v) for v in values)


def build_ditto(
    model_fn: ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    lam: Union[float, Sequence[float]],
    personal_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    personal_steps: int = 0,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.NUM_EXAMPLES
    ),
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = (
        None
    ),
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
    update_attack: Optional[attacks.UpdateAttack] = None,
) -> stateful.StatefulClientsProcess:
  """Builds Ditto (Li et al., ICML 2021; thesis Algorithm 7).

  Args:
    model_fn: No-arg callable returning a new `VariableModel`.
    client_optimizer_fn: Local solver of the global model (FedAvg's).
    server_optimizer_fn: Applies the aggregated delta (default SGD 1.0).
    lam: lambda >= 0, or a grid of them (one personal model per value,
      selected per client on validation data at evaluation).
    personal_optimizer_fn: Solver of the personal models (default: the
      client optimizer, eta_l = eta_g as in the thesis experiments).
    personal_steps: s > 0: exactly s personal mini-batch steps per round
      (cycling the local stream); 0: one pass over the round's local stream
      (E epochs, as the global update).
    client_weighting: Weights of the deltas (`NUM_EXAMPLES` or `UNIFORM`;
      Algorithm 7 averages uniformly, the experiments' FedAvg by examples).
    model_aggregator: Weighted `tff.aggregators` factory of the deltas
      (default `MeanFactory`; a robust one gives Ditto + robust aggregation).
    metrics_aggregator: Aggregator of the global training metrics.
    loop_implementation: How local datasets are iterated.
    update_attack: Optional simulated A2/A3 attack on the global-model deltas
      of marked clients (`tff_algos.attacks`); client data are then
      `OrderedDict(data=..., attack=marker)`. Personal models are untouched:
      the attack is on what a corrupted client sends.

  Returns:
    A `stateful.StatefulClientsProcess`; client states are
    `OrderedDict(personal=(v_lambda_1, ..., v_lambda_G))`.

  Raises:
    TypeError: For a wrong argument type.
    ValueError: For a negative or non-finite lambda, or negative steps.
  """
  if not callable(model_fn):
    raise TypeError('model_fn must be a no-arg callable returning a model')
  lambdas = check_lambdas(lam)
  definition = engine_definition(
      client_optimizer=client_optimizer_fn,
      lam=lambdas,
      personal_optimizer=personal_optimizer_fn,
      personal_steps=personal_steps,
      client_weighting=client_weighting,
  )
  initial_weights_fn, initial_weights, weights_type, aggregator, finalizer = (
      stateful.build_server_parts(
          model_fn, server_optimizer_fn, model_aggregator
      )
  )
  _, data_type, metrics_aggregation_fn = (
      client_work_lib.model_types_and_metrics(model_fn, metrics_aggregator)
  )
  states = stateful.personal_states(initial_weights, len(lambdas))
  client_update = _build_client_update(
      model_fn,
      definition,
      (weights_type, data_type, states.type),
      loop_implementation,
  )
  init_fn = stateful.build_initialize(
      initial_weights_fn, aggregator=aggregator, finalizer=finalizer
  )
  attack_delta = None
  next_data_type = data_type
  if update_attack is not None:
    attack_delta = attacks.build_update_attack(
        update_attack, client_update.type_signature.result[0]
    )
    next_data_type = attacks.marked_data_type(data_type)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(next_data_type, tff.CLIENTS),
      tff.FederatedType(states.type, tff.CLIENTS),
  )
  def next_fn(state, client_data, client_states):
    global_weights = state.global_model_weights
    data = client_data.data if attack_delta is not None else client_data
    delta, weight, new_states, model_outputs, dropped, seen = tff.federated_map(
        client_update,
        (tff.federated_broadcast(global_weights), data, client_states),
    )
    if attack_delta is not None:
      delta = tff.federated_map(
          attack_delta, (delta, client_data[attacks.MARKER_KEY])
      )
    aggregated = aggregator.next(state.aggregator, delta, weight)
    finalized = finalizer.next(
        state.finalizer, global_weights, aggregated.result
    )
    new_state = tff.federated_zip(
        collections.OrderedDict(
            global_model_weights=finalized.result,
            aggregator=aggregated.state,
            finalizer=finalized.state,
        )
    )
    metrics = tff.federated_zip(
        collections.OrderedDict(
            client_work=collections.OrderedDict(
                train=metrics_aggregation_fn(model_outputs),
                personal_non_finite=tff.federated_sum(dropped),
                personal_examples=tff.federated_sum(seen),
            ),
            aggregator=aggregated.measurements,
            finalizer=finalized.measurements,
        )
    )
    return new_state, new_states, metrics

  return stateful.build_process(
      model_fn,
      init_fn,
      next_fn,
      weights_type=weights_type,
      data_type=data_type,
      states=states,
      personal_model_names=[f'lambda={v:g}' for v in lambdas],
      personal_model_values=lambdas,
  )


def _build_client_update(
    model_fn: ModelFn, definition, parameter_types, loop_implementation
) -> tff.Computation:
  """`(w^t, data, state) -> (delta, weight, state, metrics, dropped, seen)`:
  the global model's local training and the personal passes of one client."""

  @tff.tensorflow.computation(*parameter_types)
  def client_update(weights, dataset, client_state):
    model = model_fn()

    @tf.function
    def run(weights, dataset, client_state):
      work = definition.local_work(
          model, weights, dataset, client_state['personal'], loop_implementation
      )
      delta, weight = definition.client_result(
          None, None, None, work.vector, work.num_examples, work.non_finite
      )
      return (
          list(delta),
          weight,
          collections.OrderedDict(
              personal=tuple(list(v) for v in work.personal)
          ),
          work.model_metrics,
          work.client_counts['personal_non_finite'],
          work.client_counts['personal_examples'],
      )

    return run(weights, dataset, client_state)

  return client_update


@dataclasses.dataclass(frozen=True)
class DittoOptions(options_lib.Options):
  """Ditto's options."""

  ditto_lambda: Optional[float] = options_lib.option(
      None,
      "Ditto: fixed lambda >= 0 of the personal models' pull toward the "
      'global model (0: local models).',
      low=0.0,
  )
  ditto_lambda_grid: tuple[float, ...] = options_lib.option(
      (),
      'Ditto: lambdas selected per client on its validation data (one '
      'personal model each), e.g. 0.1,1,2; needs a validation split.',
      low=0.0,
  )
  ditto_personal_steps: int = options_lib.option(
      0,
      'Ditto: personal mini-batch steps s per round (0: one pass over the '
      "round's local stream, as the global update).",
      low=0,
  )
  ditto_personal_lr: float = options_lib.option(
      0.0,
      'Ditto: personal learning rate (0: the client learning rate).',
      low=0.0,
  )
  ditto_clip_norm: float = options_lib.option(
      0.0,
      'Ditto + robust aggregation: clip each global update to this l2 norm '
      'before the mean (0: plain mean).',
      low=0.0,
  )

  @property
  def lambdas(self) -> tuple[float, ...]:
    """The lambda grid (one value: fixed)."""
    return self.ditto_lambda_grid or (
        (self.ditto_lambda,) if self.ditto_lambda is not None else ()
    )

  def check(self) -> None:
    if self.ditto_lambda is not None and self.ditto_lambda_grid:
      raise options_lib.OptionError(
          'give ditto_lambda or ditto_lambda_grid, not both',
          'ditto_lambda',
          'ditto_lambda_grid',
      )
    if not self.lambdas:
      raise options_lib.OptionError(
          'ditto needs ditto_lambda (fixed) or ditto_lambda_grid (selected '
          'per client on validation data)',
          'ditto_lambda',
          'ditto_lambda_grid',
      )
    try:
      check_lambdas(list(self.lambdas))
    except (TypeError, ValueError) as e:
      raise options_lib.OptionError(
          f'ditto_lambda_grid: {e}', 'ditto_lambda_grid'
      ) from None

  def check_run(self, settings: options_lib.RunSettings) -> None:
    if self.ditto_clip_norm and settings.uses_dp:
      raise options_lib.OptionError(
          'give ditto_clip_norm or DP (clip), not both',
          'ditto_clip_norm',
          'clip',
      )
    if self.ditto_clip_norm and settings.aggregator != 'mean':
      raise options_lib.OptionError(
          'give ditto_clip_norm or aggregator, not both',
          'ditto_clip_norm',
          'aggregator',
      )

  def check_engine(self, engine: str) -> None:
    if engine != 'tff' and self.ditto_clip_norm:
      raise options_lib.OptionError(
          f'the {engine} engine runs plain mean aggregation: drop '
          'ditto_clip_norm',
          'ditto_clip_norm',
      )

  def validation_data_reason(self) -> Optional[str]:
    if len(self.lambdas) <= 1:
      return None
    return (
        "ditto_lambda_grid selects lambda on each client's validation data "
        '(or give a fixed ditto_lambda)'
    )

  def describe(self, settings: options_lib.RunSettings) -> str:
    del settings
    return f', lambda={",".join(f"{v:g}" for v in self.lambdas)}' + (
        f', clip={self.ditto_clip_norm:g}' if self.ditto_clip_norm else ''
    )

  def personal_optimizer(self, context: options_lib.Context):
    """The personal models' optimizer (None: the client optimizer)."""
    if not self.ditto_personal_lr:
      return None
    return context.optimizer_fn(self.ditto_personal_lr)


def _definition(options: DittoOptions, context: options_lib.Context):
  return engine_definition(
      client_optimizer=context.client_optimizer,
      client_weighting=context.client_weighting,
      lam=list(options.lambdas),
      personal_optimizer=options.personal_optimizer(context),
      personal_steps=options.ditto_personal_steps,
  )


def _build(options: DittoOptions, model_fn, context: options_lib.Context):
  aggregation = context.aggregation(context.clients_per_round)
  if options.ditto_clip_norm:
    aggregation['model_aggregator'] = tff.aggregators.clipping_factory(
        options.ditto_clip_norm, tff.aggregators.MeanFactory()
    )
  return build_ditto(
      model_fn,
      context.client_optimizer,
      context.server_optimizer,
      lam=list(options.lambdas),
      personal_optimizer_fn=options.personal_optimizer(context),
      personal_steps=options.ditto_personal_steps,
      client_weighting=context.client_weighting,
      **aggregation,
  )


ALGORITHM = options_lib.Algorithm(
    name='ditto',
    label='Ditto',
    options=DittoOptions,
    definition=_definition,
    builder=_build,
    engines=('tff', 'batched', 'stacked'),
    stateful=True,
    tuned=options_lib.TunedOption(
        'ditto_lambda', grid=(0.01, 0.03, 0.1, 0.3, 1.0), low=1e-3, high=100.0
    ),
    aggregators=True,
    dp=True,
    example=dict(ditto_lambda=0.1),
    engine_notes={
        'stacked': (
            'with `ditto_personal_steps=0` (its kernel refuses more; the '
            'batched engine runs them)'
        ),
        'tff_only': '`ditto_clip_norm`',
    },
)
