# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Iterative processes whose clients keep a state across rounds.

Ditto (Li et al., ICML 2021, arXiv:2012.04221) and Fed+ (Kundu et al.,
arXiv:2009.06303) keep a personal model on every client. TFF's
`compose_learning_process` cannot carry per-client state (client data must be
sequences, `tff_notes.md` section 1.2), so these algorithms are
`StatefulClientsProcess`es: a `tff.templates.IterativeProcess` whose `next`
is the `tff.Computation`

  (state@SERVER, {data*}@CLIENTS, client_state@CLIENTS)
      -> <state@SERVER, client_state@CLIENTS, metrics@SERVER>,

the pattern of TFF's `examples/stateful_clients`. The caller keeps the states
(`tff_algos.client_states`), passes in those of the selected clients and
writes back the returned ones. `next` returns a `StatefulOutput`.

Each client state is an `OrderedDict(personal=(m_1, ..., m_G))` of G >= 1
personal models (trainable weights only; the non-trainable ones are the global
model's). Ditto with a lambda grid keeps one model per lambda; Fed+ keeps one.
`evaluate_personal` evaluates all G models of each client on its data.
"""

import collections
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import evaluation

ModelFn = Callable[[], tff.learning.models.VariableModel]


class StatefulOutput(NamedTuple):
  """The result of one round: server state, the clients' states, metrics."""

  state: Any
  client_states: Any
  metrics: Any


def zero_non_finite_to(new, old):
  """`new` if every entry is finite, else `old` (a state never turns NaN)."""
  flat = tf.nest.flatten(new)
  finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in flat])
  return tf.cond(finite, lambda: new, lambda: old), tf.logical_not(finite)


def build_personal_evaluation(
    model_fn: ModelFn, weights_type, client_state_type, data_type
) -> tff.Computation:
  """`(global_weights@SERVER, client_state@CLIENTS, {data*}@CLIENTS)` ->
  each client's metrics of each of its G personal models (vectors of G)."""

  @tff.tensorflow.computation(weights_type, client_state_type, data_type)
  def client_eval(weights, client_state, dataset):
    model = model_fn()

    @tf.function
    def run(weights, client_state, dataset):
      per_model = []
      for personal in client_state['personal']:
        model.reset_metrics()
        personal_weights = tff.learning.models.ModelWeights(
            trainable=personal, non_trainable=weights.non_trainable
        )
        per_model.append(
            evaluation.evaluate_local(model, personal_weights, dataset)
        )
      return collections.OrderedDict(
          (name, tf.stack([m[name] for m in per_model]))
          for name in per_model[0]
      )

    return run(weights, client_state, dataset)

  @tff.federated_computation(
      tff.FederatedType(weights_type, tff.SERVER),
      tff.FederatedType(client_state_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS),
  )
  def personal_eval(weights, client_states, data):
    return tff.federated_map(
        client_eval, (tff.federated_broadcast(weights), client_states, data)
    )

  return personal_eval


class StatefulClientsProcess(tff.templates.IterativeProcess):
  """An `IterativeProcess` with per-client states (see module docstring).

  Attributes:
    initialize: `() -> state@SERVER`.
    next: The round computation; `process.next(state, data, client_states)`
      returns a `StatefulOutput`.
    personal_evaluation: `(global_weights@SERVER, client_state@CLIENTS,
      {data*}@CLIENTS) -> metrics@CLIENTS`, each metric a vector over the
      client's G personal models.
    personal_model_names: The G personal models' names (e.g. `lambda=0.1`).
    personal_model_values: Their hyperparameter values (Ditto: lambdas).
  """

  def __init__(
      self,
      initialize_fn: tff.Computation,
      next_fn: tff.Computation,
      *,
      personal_evaluation: tff.Computation,
      initial_client_state_fn: Callable[[], Any],
      personal_model_names: Sequence[str],
      personal_model_values: Sequence[float],
  ):
    super().__init__(initialize_fn, next_fn, next_is_multi_arg=True)
    self._next_computation = next_fn
    self.personal_evaluation = personal_evaluation
    self._initial_client_state_fn = initial_client_state_fn
    self.personal_model_names = tuple(personal_model_names)
    self.personal_model_values = tuple(float(v) for v in personal_model_values)

  @property
  def next(self):
    """The round: (state, client data, client states) -> process output."""
    computation = self._next_computation

    def next_fn(state, client_data, client_states):
      if len(client_data) != len(client_states):
        raise ValueError(
            f'{len(client_data)} client datasets but '
            f'{len(client_states)} client states'
        )
      result = computation(state, client_data, client_states)
      return StatefulOutput(result[0], list(result[1]), result[2])

    next_fn.type_signature = computation.type_signature
    return next_fn

  def get_model_weights(self, state) -> tff.learning.models.ModelWeights:
    """The global model of a server state."""
    weights = state['global_model_weights']
    if isinstance(weights, tff.learning.models.ModelWeights):
      return weights
    return tff.learning.models.ModelWeights(
        trainable=weights['trainable']
        if isinstance(weights, dict)
        else weights[0],
        non_trainable=weights['non_trainable']
        if isinstance(weights, dict)
        else weights[1],
    )

  def initial_client_state(self):
    """The state of a client never selected (NumPy arrays)."""
    return tf.nest.map_structure(np.asarray, self._initial_client_state_fn())

  def evaluate_personal(self, state, client_states, datasets) -> list[dict]:
    """Each client's metrics (dicts of vectors over its G personal models)."""
    if not datasets:
      return []
    rows = self.personal_evaluation(
        self.get_model_weights(state), list(client_states), list(datasets)
    )
    return [{k: np.asarray(v) for k, v in row.items()} for row in rows]


class PersonalStates(NamedTuple):
  """The clients' initial state and its TFF type.

  Attributes:
    initial: `OrderedDict(personal=(m_1, ..., m_G))`, each m_g the initial
      global model's trainable weights (NumPy arrays), so that v_k^0 = w^0.
    type: Its `tff.Type`.
  """

  initial: Any
  type: Any


def personal_states(
    initial_weights: tff.learning.models.ModelWeights, count: int
) -> PersonalStates:
  """G = `count` personal models, each starting at `initial_weights`."""
  initial = collections.OrderedDict(
      personal=tuple(list(initial_weights.trainable) for _ in range(count))
  )
  state_type = tff.types.tensorflow_to_type(
      tf.nest.map_structure(
          lambda a: tf.TensorSpec(a.shape, tf.as_dtype(a.dtype)), initial
      )
  )
  return PersonalStates(initial, state_type)


def build_initialize(initial_weights_fn: tff.Computation, **parts):
  """`() -> OrderedDict(global_model_weights, **parts' states)@SERVER`.

  Args:
    initial_weights_fn: The no-arg computation of the initial global model.
    **parts: Named server processes (an aggregator, a finalizer), whose
      `initialize()` states follow the model in this order.
  """

  @tff.federated_computation()
  def init_fn():
    return tff.federated_zip(
        collections.OrderedDict(
            global_model_weights=tff.federated_eval(
                initial_weights_fn, tff.SERVER
            ),
            **{name: part.initialize() for name, part in parts.items()},
        )
    )

  return init_fn


def build_process(
    model_fn: ModelFn,
    init_fn: tff.Computation,
    next_fn: tff.Computation,
    *,
    weights_type,
    data_type,
    states: PersonalStates,
    personal_model_names: Sequence[str],
    personal_model_values: Sequence[float],
) -> StatefulClientsProcess:
  """The `StatefulClientsProcess` of a round, with its personal evaluation."""
  evaluate = build_personal_evaluation(
      model_fn, weights_type, states.type, data_type
  )
  initial = states.initial
  return StatefulClientsProcess(
      init_fn,
      next_fn,
      personal_evaluation=evaluate,
      initial_client_state_fn=lambda: initial,
      personal_model_names=personal_model_names,
      personal_model_values=personal_model_values,
  )


def is_stateful(process) -> bool:
  """Whether `process` takes and returns per-client states."""
  return isinstance(process, StatefulClientsProcess)


def build_server_parts(
    model_fn: ModelFn, server_optimizer_fn, model_aggregator
):
  """`(initial_weights_fn, initial_weights, weights_type, aggregator,
  finalizer)`; `initial_weights` are NumPy arrays."""
  if server_optimizer_fn is None:
    server_optimizer_fn = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
  if not isinstance(server_optimizer_fn, tff.learning.optimizers.Optimizer):
    raise TypeError(
        'server_optimizer_fn must be a tff.learning.optimizers.Optimizer, got '
        f'{type(server_optimizer_fn).__name__}'
    )
  if model_aggregator is None:
    model_aggregator = tff.aggregators.MeanFactory()
  if not isinstance(
      model_aggregator, tff.aggregators.WeightedAggregationFactory
  ):
    raise TypeError(
        'model_aggregator must be a tff.aggregators.WeightedAggregationFactory'
        ' (wrap unweighted ones with tff.aggregators.as_weighted_aggregator),'
        f' got {type(model_aggregator).__name__}'
    )

  initial = initial_numpy_weights(model_fn)

  @tff.tensorflow.computation()
  def initial_weights_fn():
    # Constants, so that the clients' initial personal models (built from the
    # same arrays) equal the initial global model even for random inits.
    return tf.nest.map_structure(tf.constant, initial)

  weights_type = initial_weights_fn.type_signature.result
  aggregator = model_aggregator.create(
      weights_type.trainable, tff.TensorType(np.float32)
  )
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer_fn, weights_type
  )
  return initial_weights_fn, initial, weights_type, aggregator, finalizer


def initial_numpy_weights(
    model_fn: ModelFn,
) -> tff.learning.models.ModelWeights:
  """The model's initial weights as NumPy arrays (eagerly, no TFF call)."""
  with tf.Graph().as_default() as graph:  # pytype: disable=attribute-error
    model = model_fn()
    weights = tff.learning.models.ModelWeights.from_model(model)
    init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=graph) as sess:
      sess.run(init)
      values = sess.run(weights)
  return tff.learning.models.ModelWeights(
      trainable=[np.asarray(v) for v in values.trainable],
      non_trainable=[np.asarray(v) for v in values.non_trainable],
  )
