# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""q-FFL: q-FedSGD and q-FedAvg as `tff.learning.templates.LearningProcess`es.

T. Li, M. Sanjabi, A. Beirami, V. Smith, "Fair Resource Allocation in
Federated Learning", ICLR 2020, https://arxiv.org/abs/1905.10497 (thesis
chapter 4, Algorithms 3 and 4). The objective sum_k p_k F_k^{q+1}(w) / (q+1)
puts more weight on clients with high loss as q grows (q = 0 is FedAvg's).

Each selected client k evaluates its loss F_k = F_k(w_t) on its local
training data at the broadcast model, then computes a gradient proxy

  q-FedSGD:  dw_k = grad F_k(w_t)             (full local gradient)
  q-FedAvg:  dw_k = L (w_t - wbar_k)          (wbar_k: E epochs of local SGD)

and sends Delta_k = F_k^q dw_k and h_k = q F_k^(q-1) ||dw_k||^2 + L F_k^q. The
server steps w_{t+1} = w_t - sum_k Delta_k / sum_k h_k, a step 1 / L_q sized
by the local Lipschitz estimate of Lemma 1. The papers set L = 1 / eta, eta
the step size tuned for q = 0; with q = 0 q-FedAvg is FedAvg with a simple
average and q-FedSGD is FedSGD with step 1 / L.

Composition: the client work returns `update = (Delta_k, h_k)` with weight 1,
a sum aggregator adds them, and the finalizer divides.

Numerical safeguards (the thesis has none): for 0 < q < 1 the factor
F_k^(q-1) diverges as F_k -> 0, so it is evaluated at max(F_k, 1e-8), which
only matters for clients with essentially zero loss (their Delta_k is ~0);
a client whose update is not finite contributes nothing; a round whose sum
of h is 0 leaves the model unchanged.
"""

import collections
from collections.abc import Callable
import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import client_work as client_work_lib
from tff_algos import definition as definition_lib
from tff_algos import options as options_lib

ModelFn = Callable[[], tff.learning.models.VariableModel]
LOSS_FLOOR = 1e-8


def q_ffl_client_message(loss, dw, *, q: float, lipschitz: float):
  """`(Delta_k, h_k)` of a client with loss F_k and gradient proxy dw_k."""
  loss = tf.cast(loss, tf.float32)
  sq_norm = tf.add_n([tf.reduce_sum(tf.square(g)) for g in tf.nest.flatten(dw)])
  if q == 0.0:
    f_q = tf.constant(1.0)
    curvature = tf.constant(0.0)
  else:
    f_q = tf.pow(loss, q)
    curvature = q * tf.pow(tf.maximum(loss, LOSS_FLOOR), q - 1.0) * sq_norm
  delta = tf.nest.map_structure(lambda g: f_q * g, dw)
  h = curvature + lipschitz * f_q
  return delta, h


def q_ffl_server_update(trainable, delta_sum, h_sum):
  """w <- w - sum(Delta) / sum(h); unchanged when sum(h) is 0."""
  safe = tf.maximum(h_sum, 1e-12)
  return tf.nest.map_structure(
      lambda w, d: tf.where(h_sum > 0, w - d / safe, w), trainable, delta_sum
  )


def _validate(q, lipschitz):
  for name, value in (('q', q), ('lipschitz_constant', lipschitz)):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise TypeError(f'{name} must be a float, got {type(value).__name__}')
  if not np.isfinite(q) or q < 0:
    raise ValueError(f'q must be a finite float >= 0, got {q}')
  if not np.isfinite(lipschitz) or lipschitz <= 0:
    raise ValueError(
        f'lipschitz_constant must be a finite float > 0, got {lipschitz}'
    )
  return float(q), float(lipschitz)


def build_q_ffl_client_work(
    model_fn: ModelFn,
    optimizer: Optional[tff.learning.optimizers.Optimizer],
    *,
    q: float,
    lipschitz_constant: float,
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
) -> tff.learning.templates.ClientWorkProcess:
  """Client work of q-FedAvg (`optimizer` given) or q-FedSGD (`None`).

  Returns:
    A `ClientWorkProcess` whose `ClientResult.update` is `(Delta_k, h_k)`
    with weight 1, and whose measurements are the training metrics plus
    the mean pre-training loss of the selected clients (`loss_at_broadcast`).
  """
  definition = engine_definition(
      q=q,
      lipschitz_constant=lipschitz_constant,
      local_solver=optimizer is not None,
  )
  weights_type, data_type, metrics_aggregation_fn = (
      client_work_lib.model_types_and_metrics(model_fn, metrics_aggregator)
  )

  @tff.tensorflow.computation(weights_type, data_type)
  def client_update(initial_weights, dataset):
    model = model_fn()

    @tf.function
    def run(initial_weights, dataset):
      if definition.local_work is not None:
        work = definition.local_work(model, initial_weights, dataset)
        loss, non_finite = work.loss, work.non_finite
        delta = tf.nest.pack_sequence_as(
            initial_weights.trainable, list(work.vector)
        )
        num_examples = work.num_examples
      else:
        loss, _ = client_work_lib.local_loss(model, initial_weights, dataset)
        delta, num_examples, non_finite = client_work_lib.local_training(
            model,
            optimizer,
            initial_weights,
            dataset,
            loop_implementation=loop_implementation,
        )
      message, h = client_work_lib.structured_client_result(
          definition, {}, loss, None, delta, num_examples, non_finite
      )
      return (
          tff.learning.templates.ClientResult(
              update=(message, h), update_weight=tf.constant(1.0)
          ),
          model.report_local_unfinalized_metrics(),
          loss,
      )

    return run(initial_weights, dataset)

  init_fn = client_work_lib.empty_server_state()

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(weights_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS),
  )
  def next_fn(state, weights, client_data):
    result, model_outputs, losses = tff.federated_map(
        client_update, (weights, client_data)
    )
    measurements = tff.federated_zip(
        collections.OrderedDict(
            train=metrics_aggregation_fn(model_outputs),
            loss_at_broadcast=tff.federated_mean(losses),
        )
    )
    return tff.templates.MeasuredProcessOutput(state, result, measurements)

  return tff.learning.templates.ClientWorkProcess(init_fn, next_fn)


def build_q_ffl_finalizer(
    weights_type: tff.Type,
) -> tff.learning.templates.FinalizerProcess:
  """Finalizer: w <- w - sum(Delta) / sum(h) on the trainable weights."""
  update_type = (weights_type.trainable, tff.TensorType(np.float32))

  @tff.tensorflow.computation(weights_type, update_type)
  def apply_update(weights, update):
    delta_sum, h_sum = update
    trainable = q_ffl_server_update(weights.trainable, delta_sum, h_sum)
    return tff.learning.models.ModelWeights(
        trainable=trainable, non_trainable=weights.non_trainable
    )

  init_fn = client_work_lib.empty_server_state()

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(weights_type, tff.SERVER),
      tff.FederatedType(update_type, tff.SERVER),
  )
  def next_fn(state, weights, update):
    new_weights = tff.federated_map(apply_update, (weights, update))
    h_sum = tff.federated_map(
        tff.tensorflow.computation(lambda u: u[1], update_type), update
    )
    return tff.templates.MeasuredProcessOutput(
        state,
        new_weights,
        tff.federated_zip(collections.OrderedDict(h_sum=h_sum)),
    )

  return tff.learning.templates.FinalizerProcess(init_fn, next_fn)


def _build(
    model_fn,
    optimizer,
    q,
    lipschitz_constant,
    model_distributor,
    metrics_aggregator,
    loop_implementation,
):
  if not callable(model_fn):
    raise TypeError('model_fn must be a no-arg callable returning a model')
  if optimizer is not None and not isinstance(
      optimizer, tff.learning.optimizers.Optimizer
  ):
    raise TypeError(
        'client_optimizer_fn must be a tff.learning.optimizers.Optimizer, got '
        f'{type(optimizer).__name__}'
    )
  work = build_q_ffl_client_work(
      model_fn,
      optimizer,
      q=q,
      lipschitz_constant=lipschitz_constant,
      metrics_aggregator=metrics_aggregator,
      loop_implementation=loop_implementation,
  )

  @tff.tensorflow.computation()
  def initial_model_weights_fn():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  weights_type = initial_model_weights_fn.type_signature.result
  if model_distributor is None:
    model_distributor = tff.learning.templates.build_broadcast_process(
        weights_type
    )
  update_type = (weights_type.trainable, tff.TensorType(np.float32))
  aggregator = tff.aggregators.as_weighted_aggregator(
      tff.aggregators.SumFactory()
  ).create(tff.to_type(update_type), tff.TensorType(np.float32))
  return tff.learning.templates.compose_learning_process(
      initial_model_weights_fn,
      model_distributor,
      work,
      aggregator,
      build_q_ffl_finalizer(weights_type),
  )


def build_q_fedavg(
    model_fn: ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    *,
    q: float,
    lipschitz_constant: float,
    model_distributor: Optional[
        tff.learning.templates.DistributionProcess
    ] = None,
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
) -> tff.learning.templates.LearningProcess:
  """Builds q-FedAvg (Li et al., ICLR 2020, Algorithm 4).

  Args:
    model_fn: No-arg callable returning a new `VariableModel`.
    client_optimizer_fn: The local solver (the papers: SGD with step eta).
    q: Fairness parameter q >= 0 (0 is FedAvg with a simple average).
    lipschitz_constant: L; the papers use 1 / eta, eta tuned for q = 0.
    model_distributor: Default: broadcast.
    metrics_aggregator: Training-metrics aggregator.
    loop_implementation: How local datasets are iterated.

  Returns:
    A `tff.learning.templates.LearningProcess`. Sample clients with
    probability proportional to their data (the algorithm box) to optimise
    the n_k-weighted q-FFL objective.

  Raises:
    TypeError: For a wrong argument type.
    ValueError: For q < 0 or L <= 0.
  """
  if client_optimizer_fn is None:
    raise TypeError(
        'client_optimizer_fn is required (q-FedSGD has no local '
        'solver: use build_q_fedsgd)'
    )
  return _build(
      model_fn,
      client_optimizer_fn,
      q,
      lipschitz_constant,
      model_distributor,
      metrics_aggregator,
      loop_implementation,
  )


def build_q_fedsgd(
    model_fn: ModelFn,
    *,
    q: float,
    lipschitz_constant: float,
    model_distributor: Optional[
        tff.learning.templates.DistributionProcess
    ] = None,
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds q-FedSGD (Li et al., ICLR 2020, Algorithm 3).

  Each client computes its full local gradient at the broadcast model; the
  clients' data streams are read once (pass one epoch).

  Args:
    model_fn: No-arg callable returning a new `VariableModel`.
    q: Fairness parameter q >= 0 (0 is FedSGD with step 1 / L).
    lipschitz_constant: L > 0.
    model_distributor: Default: broadcast.
    metrics_aggregator: Metrics aggregator (of the loss pass).

  Returns:
    A `tff.learning.templates.LearningProcess`.
  """
  return _build(
      model_fn,
      None,
      q,
      lipschitz_constant,
      model_distributor,
      metrics_aggregator,
      tff.learning.LoopImplementation.DATASET_REDUCE,
  )


def engine_definition(
    *, q: float, lipschitz_constant: float, local_solver: bool = True
) -> definition_lib.AlgorithmDefinition:
  """q-FedAvg's round (Li et al., ICLR 2020, Algorithm 4) for the engines.

  Each client's loss F_k at the broadcast model, then local training that
  continues the same stream (as `build_q_fedavg`'s one client computation),
  the message `(Delta_k, h_k)` of `q_ffl_client_message` (zeroed with its
  weight when anything is non-finite), and the server's
  `w - sum(Delta) / sum(h)` with no server optimizer.

  With `local_solver=False` it is q-FedSGD (Algorithm 3): the client work
  is the loss and full gradient at the broadcast model
  (`client_work.full_gradient_work`, as `build_q_fedsgd`), and the
  gradient is dw_k.

  Args:
    q: q >= 0 (0: FedAvg with step 1 / L).
    lipschitz_constant: L > 0.
    local_solver: q-FedAvg's local training (False: q-FedSGD).

  Returns:
    The `definition.AlgorithmDefinition` the engines run.
  """
  q, lipschitz = _validate(q, lipschitz_constant)
  scale = lipschitz if local_solver else 1.0

  def client_result(context, loss, count, delta, num_examples, non_finite):
    del context, count, num_examples
    dw = tuple(scale * d for d in delta)
    message, h = q_ffl_client_message(loss, dw, q=q, lipschitz=lipschitz)
    (message, h), bad = client_work_lib.zero_all_if_any_non_finite(
        (tuple(message), h)
    )
    ok = tf.logical_not(tf.logical_or(non_finite, bad))
    message = tuple(tf.where(ok, m, tf.zeros_like(m)) for m in message)
    return message, tf.where(ok, h, 0.0)

  def metrics(context, losses, scalar_sum, num_clients):
    del context
    return collections.OrderedDict(
        loss_at_broadcast=definition_lib.mean_loss(losses, num_clients),
        h_sum=scalar_sum,
    )

  return definition_lib.AlgorithmDefinition(
      name='qffl' if local_solver else 'qfedsgd',
      client_result=client_result,
      server=q_ffl_server_update,
      loss_pass='continued' if local_solver else 'work',
      metrics=metrics,
      weighted=False,
      per_client_message=True,
      server_optimizer=False,
      local_work=None if local_solver else client_work_lib.full_gradient_work,
  )


@dataclasses.dataclass(frozen=True)
class QfflOptions(options_lib.Options):
  """q-FFL's options (q-FedAvg and q-FedSGD)."""

  q: float = options_lib.option(
      0.0, 'q-FFL fairness q >= 0 (0 is FedAvg/FedSGD).', low=0.0
  )
  q_lipschitz: float = options_lib.option(
      0.0,
      'q-FFL Lipschitz constant L (0: 1 / client_learning_rate, as the '
      'paper).',
      low=0.0,
  )

  def lipschitz_constant(self, client_learning_rate: float) -> float:
    """L: given, or 1 / client learning rate as in the papers."""
    return self.q_lipschitz or 1.0 / client_learning_rate

  def describe(self, settings: options_lib.RunSettings) -> str:
    lipschitz = self.lipschitz_constant(
        settings.optimization.client_learning_rate
    )
    return f', q={self.q:g}, L={lipschitz:g}'


def _definition(local_solver: bool):
  def definition(options: QfflOptions, context: options_lib.Context):
    return engine_definition(
        q=options.q,
        lipschitz_constant=options.lipschitz_constant(
            context.client_learning_rate
        ),
        local_solver=local_solver,
    )

  return definition


def _build_qffl(options: QfflOptions, model_fn, context: options_lib.Context):
  return build_q_fedavg(
      model_fn,
      context.client_optimizer,
      q=options.q,
      lipschitz_constant=options.lipschitz_constant(
          context.client_learning_rate
      ),
      loop_implementation=context.loop_implementation,
  )


def _build_qfedsgd(
    options: QfflOptions, model_fn, context: options_lib.Context
):
  return build_q_fedsgd(
      model_fn,
      q=options.q,
      lipschitz_constant=options.lipschitz_constant(
          context.client_learning_rate
      ),
  )


_OWN_STEP = (
    "the new global model is the old one minus the sum of the clients' "
    'q-weighted updates over the sum of their h (a step set by L)'
)
_TUNED_Q = options_lib.TunedOption(
    'q', grid=(0.01, 0.03, 0.1, 0.3, 1.0), low=1e-6, high=100.0
)
QFFL = options_lib.Algorithm(
    name='qffl',
    label='q-FedAvg',
    options=QfflOptions,
    definition=_definition(local_solver=True),
    builder=_build_qffl,
    tuned=_TUNED_Q,
    own_server_step=_OWN_STEP,
    own_weighting=True,  # h_k and the q-weighted updates, weight 1 each.
    example=dict(q=1.0),
)
QFEDSGD = options_lib.Algorithm(
    name='qfedsgd',
    label='q-FedSGD',
    # q-FFL's benchmark row is q-FedAvg, the thesis's recommended solver.
    in_benchmark=False,
    options=QfflOptions,
    definition=_definition(local_solver=False),
    builder=_build_qfedsgd,
    tuned=_TUNED_Q,
    own_server_step=_OWN_STEP,
    own_weighting=True,  # h_k and the q-weighted updates, weight 1 each.
    example=dict(q=1.0),
    engine_notes={'stacked': 'full gradient on stacked weights'},
)
