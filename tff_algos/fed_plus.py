# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Fed+: personalised local models with a regularised (robust) aggregate.

P. Kundu, H. Yu, L. Wynter, S. Lim, "Robustness and Personalization in
Federated Learning: A Unified Approach via Regularization", IBM Research
Singapore, arXiv:2009.06303 (seed document 004; spec `fedplus_deltafl.md`
part A). Algorithm 1, for each selected party k with persistent local model
w_k and the broadcast aggregate w~^t:

  theta_k = prox_{Psi/sigma}(w_k - w~^t)                     (line 14, eq. 9)
  w <- (1 - lambda) w_k + lambda w~^t                        (line 15)
  E_k times: w <- kappa (w - eta grad f_k(w))
                  + (1 - kappa)(w~^t + theta_k),  kappa = 1/(1 + eta sigma)
  w_k <- w, sent to the aggregator                           (line 17)

and the aggregator iterates w~ <- w_mean - Mean_k prox_{Psi/sigma}(w_k - w~)
from w~ = w_mean (eq. 13). Psi selects the variant (Table 1):

| psi      | Psi(theta)            | prox(v)                          | aggregate |
|----------|-----------------------|----------------------------------|-----------|
| `avg`    | sigma delta/2 ||.||^2 | v / (1 + delta)                  | mean (FedAvg+) |
| `geomed` | sigma delta ||.||_2   | max(0, 1 - delta/||v||_2) v      | delta-geometric median (FedGeoMed+) |
| `comed`  | sigma delta ||.||_1   | sign(v) max(|v| - delta, 0)      | delta-coordinate-wise median (FedCoMed+) |
| `zero`   | 0 at 0, inf elsewhere | 0                                | mean (FedProx / FedAvg rows) |

The norm of `geomed` is over the whole flattened trainable model. Errata
decided (docs/algorithms.md): the aggregate is over the round's sampled
parties S^t (the variant descriptions), not all N (lines 10-12); the
soft-threshold is sign(v) max(|v| - delta, 0) (eq. 12 as printed zeroes
negative coordinates); the fixed-point loop runs `aggregation_iterations`
times (a fixed count, unrolled as federated means, each a (secure-able) mean
of the parties' prox terms) and reports the last step's norm; means are
unweighted, as everywhere in the paper.

E_k: the number of mini-batches of the party's stream this round (epochs x
batches; fewer for stragglers), or exactly `local_steps` mini-batch steps
(cycling the stream; the paper's E_k = 20 iterations).
"""

import collections
from collections.abc import Callable
import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tensorflow_federated.python.learning import loop_builder
from tff_algos import client_work as client_work_lib
from tff_algos import definition as definition_lib
from tff_algos import options as options_lib
from tff_algos import stacked_work
from tff_algos import stateful

ModelFn = Callable[[], tff.learning.models.VariableModel]
PSI_NAMES = ('avg', 'geomed', 'comed', 'zero')


def prox(psi: str, value, delta: float):
  """prox_{Psi/sigma}(value) of a structure of tensors (see module table)."""
  flat = [tf.convert_to_tensor(v) for v in tf.nest.flatten(value)]
  if psi == 'avg':
    out = [v / (1.0 + delta) for v in flat]
  elif psi == 'zero':
    out = [tf.zeros_like(v) for v in flat]
  elif psi == 'comed':
    out = [tf.sign(v) * tf.maximum(tf.abs(v) - delta, 0.0) for v in flat]
  elif psi == 'geomed':
    norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(v)) for v in flat]))
    # max(0, 1 - delta / norm), written so that norm = 0 gives 0, not 0/0.
    scale = tf.maximum(norm - delta, 0.0) / tf.maximum(norm, 1e-30)
    out = [scale * v for v in flat]
  else:
    raise ValueError(f'unknown psi {psi!r}; choose one of {PSI_NAMES}')
  return tf.nest.pack_sequence_as(value, out)


def local_update(
    model: tff.learning.models.VariableModel,
    local_weights,
    global_weights: tff.learning.models.ModelWeights,
    data: tf.data.Dataset,
    *,
    psi: str,
    sigma: float,
    delta: float,
    lam: float,
    learning_rate: float,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
):
  """Fed+ Local-Solve (Algorithm 1 lines 13-17); call in a `tf.function`.

  Args:
    model: The party's model; its variables are overwritten.
    local_weights: w_k^t (trainable weights, a list of tensors).
    global_weights: w~^t (its non-trainable weights are used as they are).
    data: The batches of this round (E_k = their number).
    psi, sigma, delta, lam, learning_rate: Psi, sigma, delta, lambda, eta.
    loop_implementation: How the dataset is iterated.

  Returns:
    `(w_k^{t+1}, num_examples)`.
  """
  kappa = 1.0 / (1.0 + learning_rate * sigma)
  w_k = list(local_weights)
  w_g = list(global_weights.trainable)
  theta = prox(psi, [a - b for a, b in zip(w_k, w_g)], delta)
  anchor = [g + t for g, t in zip(w_g, theta)]
  weights = tff.learning.models.ModelWeights.from_model(model)
  tf.nest.map_structure(
      lambda v, a, b: v.assign((1.0 - lam) * a + lam * b),
      weights.trainable,
      w_k,
      w_g,
  )
  tf.nest.map_structure(
      lambda v, t: v.assign(t),
      weights.non_trainable,
      global_weights.non_trainable,
  )
  reduce_loop = loop_builder.build_training_loop(loop_implementation)

  def step(num_examples, batch):
    with tf.GradientTape() as tape:
      output = model.forward_pass(batch, training=True)
    grads = tape.gradient(output.loss, weights.trainable)
    for v, g, z in zip(weights.trainable, grads, anchor):
      v.assign(kappa * (v - learning_rate * g) + (1.0 - kappa) * z)
    if output.num_examples is None:
      n = tf.shape(output.predictions, out_type=tf.int64)[0]
    else:
      n = tf.cast(output.num_examples, tf.int64)
    return num_examples + n

  num_examples = reduce_loop(step, data, lambda: tf.constant(0, tf.int64))
  return [tf.identity(v) for v in weights.trainable], num_examples


def local_work(
    model: tff.learning.models.VariableModel,
    weights: tff.learning.models.ModelWeights,
    dataset: tf.data.Dataset,
    personal,
    *,
    psi: str,
    sigma: float,
    delta: float,
    lam: float,
    learning_rate: float,
    local_steps: int,
    loop_implementation: tff.learning.LoopImplementation,
) -> definition_lib.LocalWork:
  """A party's round: `local_update` from its model `personal[0]`.

  Call inside a `tf.function`. The party sends its new local model w_k; a
  non-finite one keeps the previous model (counted in
  `client_counts['aggregator/non_finite_clients']`).
  """
  if local_steps:
    dataset = dataset.repeat().take(local_steps)
  old = list(personal[0])
  new, num_examples = local_update(
      model,
      old,
      weights,
      dataset,
      psi=psi,
      sigma=sigma,
      delta=delta,
      lam=lam,
      learning_rate=learning_rate,
      loop_implementation=loop_implementation,
  )
  new, non_finite = stateful.zero_non_finite_to(new, old)
  return definition_lib.LocalWork(
      vector=tuple(new),
      num_examples=num_examples,
      non_finite=non_finite,
      model_metrics=model.report_local_unfinalized_metrics(),
      personal=(tuple(new),),
      client_counts=collections.OrderedDict(
          [('aggregator/non_finite_clients', tf.cast(non_finite, tf.int32))]
      ),
  )


@dataclasses.dataclass(frozen=True, eq=False)
class FedPlusWork(stacked_work.StackedLocalWork):
  """Fed+'s client work (`local_work` with these settings), as a callable.

  Called as a definition's `local_work` `(model, weights, dataset, personal,
  loop_implementation)`; `stacked_kernel` computes the same steps with the
  clients stacked (the stacked engine).

  Attributes:
    psi, sigma, delta, lam, learning_rate: Psi, sigma, delta, lambda, eta.
    local_steps: 0: the party's stream once (E_k = its batches); E > 0:
      exactly E mini-batch steps, cycling the stream.
  """

  psi: str
  sigma: float
  delta: float
  lam: float
  learning_rate: float
  local_steps: int

  @property
  def kappa(self) -> float:
    """kappa = 1 / (1 + eta sigma), the weight of the gradient step."""
    return 1.0 / (1.0 + self.learning_rate * self.sigma)

  def __call__(self, model, weights, dataset, personal, loop_implementation):
    return local_work(
        model,
        weights,
        dataset,
        personal,
        psi=self.psi,
        sigma=self.sigma,
        delta=self.delta,
        lam=self.lam,
        learning_rate=self.learning_rate,
        local_steps=self.local_steps,
        loop_implementation=loop_implementation,
    )

  def check_stacked(self, definition) -> None:
    if self.local_steps:
      raise stacked_work.StackedEngineError(
          'the stacked engine runs Fed+ local steps over one read of the '
          f'stream; {definition.name} with local_steps={self.local_steps} '
          'runs on the batched engine'
      )
    if definition.personal_models != 1 or len(definition.client_counts) != 1:
      raise stacked_work.StackedEngineError(
          'the stacked engine runs Fed+ with one personal model and one '
          f'non-finite count; {definition.name} has '
          f'{definition.personal_models} and {definition.client_counts}'
      )

  def stacked_kernel(self, kit):
    """`local_work` on stacked clients: each client's new local model from
    its own (the client-state models [K, ...]) over one read of its stream;
    a non-finite one keeps the previous model and is counted."""
    # Plain steps of size eta (`local_update`), then mixed with kappa.
    solver = kit.solver(
        tff.learning.optimizers.build_sgdm(learning_rate=self.learning_rate)
    )

    def local_pass(w0, start, x_all, y_all, idx, valid, proximal, decay):
      # As `local_update` for each client k from its model `start[k]` and
      # the broadcast `w0`: theta_k = prox(w_k - w0) (per client: the geomed
      # norm is over the client's whole model), the start (1 - lambda) w_k +
      # lambda w0, and steps mixed with kappa toward w0 + theta_k.
      del proximal, decay
      diff = tuple(v - g[None] for v, g in zip(start, w0))
      theta = tf.vectorized_map(
          lambda d: tuple(prox(self.psi, list(d), self.delta)),
          diff,
          fallback_to_while_loop=False,
      )
      anchor = tuple(g[None] + t for g, t in zip(w0, theta))
      w_start = tuple(
          (1.0 - self.lam) * v + self.lam * g[None] for v, g in zip(start, w0)
      )
      return kit.descend(
          w_start,
          anchor,
          solver,
          x_all,
          y_all,
          idx,
          valid,
          0.0,
          0.0,
          mix=self.kappa,
      )

    def round_work(inputs):
      models, sums = kit.run_clients(
          local_pass,
          inputs.w0,
          inputs.personal[0],
          inputs.x_all,
          inputs.y_all,
          inputs.idx,
          inputs.valid,
          inputs.steps,
          0.0,
          0.0,
      )
      models, bad = stacked_work.keep_finite(kit, models, inputs.personal[0])
      count = tf.reduce_sum(tf.cast(bad, tf.int32))
      return stacked_work.LocalResult(models, sums, bad, (models,), (count,))

    return round_work


def aggregate_step(mean_model, mean_theta):
  """One fixed-point step of eq. 13: w_mean - Mean_k prox(w_k - w~)."""
  return tf.nest.map_structure(tf.subtract, mean_model, mean_theta)


def step_norm(a, b) -> tf.Tensor:
  """||a - b||_2 over the whole flattened model."""
  return tf.sqrt(
      tf.add_n(
          [
              tf.reduce_sum(tf.square(x - y))
              for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b))
          ]
      )
  )


def engine_definition(
    *,
    psi: str,
    learning_rate: float,
    sigma: float,
    delta: float = 0.1,
    lam: float = 0.0,
    local_steps: int = 0,
    aggregation_iterations: int = 20,
) -> definition_lib.AlgorithmDefinition:
  """Fed+'s round math, which `build_fed_plus` and the engines run.

  Each party runs `local_work` and sends its model with weight 1; the server
  takes the unweighted mean and, for `geomed`/`comed`, iterates
  `aggregate_step` on every party's model (so it sees the clients'
  vectors). The result is the new global model (no server optimizer).
  Arguments as `build_fed_plus`'s.

  Returns:
    A `definition.AlgorithmDefinition` with one personal model per client.

  Raises:
    TypeError, ValueError: For invalid arguments.
  """
  if psi not in PSI_NAMES:
    raise ValueError(
        f'unknown psi {psi!r}; choose one of {", ".join(PSI_NAMES)}'
    )
  learning_rate = _positive_float(
      'learning_rate', learning_rate, allow_zero=False
  )
  sigma = _positive_float('sigma', sigma)
  delta = _positive_float('delta', delta)
  lam = _positive_float('lam', lam, upper=1.0)
  for name, value, low in (
      ('local_steps', local_steps, 0),
      ('aggregation_iterations', aggregation_iterations, 1),
  ):
    if isinstance(value, bool) or not isinstance(value, int):
      raise TypeError(f'{name} must be an int')
    if value < low:
      raise ValueError(f'{name} must be >= {low}, got {value}')

  work = FedPlusWork(
      psi=psi,
      sigma=sigma,
      delta=delta,
      lam=lam,
      learning_rate=learning_rate,
      local_steps=local_steps,
  )

  def client_result(context, loss, count, model, num_examples, non_finite):
    # Weight 1 per client (elementwise: one client's scalar or a [K] vector).
    del context, loss, count, non_finite
    return model, tf.ones_like(num_examples, dtype=tf.float32)

  def server(w0, vector_sum, scalar_sum, vectors):
    del w0
    mean_model = tuple(v / scalar_sum for v in vector_sum)
    aggregate, last_step = mean_model, tf.constant(0.0)
    if psi in ('geomed', 'comed'):
      num = tf.cast(tf.shape(vectors[0])[0], tf.float32)
      for _ in range(aggregation_iterations):
        theta = tf.map_fn(
            lambda w_k, a=aggregate: tuple(
                prox(psi, [x - y for x, y in zip(w_k, a)], delta)
            ),
            vectors,
        )
        mean_theta = tuple(tf.reduce_sum(t, axis=0) / num for t in theta)
        new = tuple(aggregate_step(mean_model, mean_theta))
        last_step = step_norm(new, aggregate)
        aggregate = new
    return definition_lib.ServerOutput(
        aggregate,
        collections.OrderedDict([('aggregator/last_step_norm', last_step)]),
    )

  return definition_lib.AlgorithmDefinition(
      name=f'fed_plus_{psi}',
      client_result=client_result,
      server=server,
      weighted=False,
      server_optimizer=False,
      local_work=work,
      personal_models=1,
      server_sees_clients=True,
      client_counts=('aggregator/non_finite_clients',),
  )


def _positive_float(name, value, *, allow_zero=True, upper=None):
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise TypeError(f'{name} must be a float, got {type(value).__name__}')
  ok = np.isfinite(value) and (value >= 0 if allow_zero else value > 0)
  if upper is not None:
    ok = ok and value <= upper
  if not ok:
    bound = (
        f'in [0, {upper}]'
        if upper is not None
        else ('>= 0' if allow_zero else '> 0')
    )
    raise ValueError(f'{name} must be {bound}, got {value}')
  return float(value)


def build_fed_plus(
    model_fn: ModelFn,
    *,
    psi: str,
    learning_rate: float,
    sigma: float,
    delta: float = 0.1,
    lam: float = 0.0,
    local_steps: int = 0,
    aggregation_iterations: int = 20,
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
) -> stateful.StatefulClientsProcess:
  """Builds Fed+ (Kundu et al., arXiv:2009.06303, Algorithm 1).

  Args:
    model_fn: No-arg callable returning a new `VariableModel`.
    psi: `avg` (FedAvg+), `geomed` (FedGeoMed+), `comed` (FedCoMed+) or
      `zero` (theta = 0: FedProx, and FedAvg with sigma = 0, lam = 1).
    learning_rate: eta > 0 of the local steps.
    sigma: sigma >= 0; kappa = 1 / (1 + eta sigma) (paper: kappa in
      [0.9, 0.999]).
    delta: delta >= 0, the smoothing constant of Psi (default 0.1, the
      paper's).
    lam: lambda in [0, 1], the local initialisation w <- (1 - lambda) w_k +
      lambda w~ (paper default 0).
    local_steps: E > 0: exactly E mini-batch steps per round; 0: every batch
      of the party's stream (E_k varies with its data and straggling).
    aggregation_iterations: Fixed-point iterations of the geomed / comed
      aggregate (>= 1; unused for avg and zero).
    metrics_aggregator: Aggregator of the local training metrics.
    loop_implementation: How local datasets are iterated.

  Returns:
    A `stateful.StatefulClientsProcess`; client states are
    `OrderedDict(personal=(w_k,))`, initially the initial global model
    (Algorithm 1 line 1).

  Raises:
    TypeError: For a wrong argument type.
    ValueError: For an out-of-range value.
  """
  if not callable(model_fn):
    raise TypeError('model_fn must be a no-arg callable returning a model')
  definition = engine_definition(
      psi=psi,
      learning_rate=learning_rate,
      sigma=sigma,
      delta=delta,
      lam=lam,
      local_steps=local_steps,
      aggregation_iterations=aggregation_iterations,
  )

  initial_weights_fn, initial_weights, weights_type, _, _ = (
      stateful.build_server_parts(model_fn, None, None)
  )
  _, data_type, metrics_aggregation_fn = (
      client_work_lib.model_types_and_metrics(model_fn, metrics_aggregator)
  )
  states = stateful.personal_states(initial_weights, 1)
  client_update = _build_client_update(
      model_fn,
      definition,
      (weights_type, data_type, states.type),
      loop_implementation,
  )

  client_prox, server_step, last_step_norm, with_trainable = (
      _build_aggregation_steps(psi, delta, weights_type)
  )
  init_fn = stateful.build_initialize(initial_weights_fn)

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(data_type, tff.CLIENTS),
      tff.FederatedType(states.type, tff.CLIENTS),
  )
  def next_fn(state, client_data, client_states):
    global_weights = state.global_model_weights
    local_models, new_states, non_finite, model_outputs = tff.federated_map(
        client_update,
        (tff.federated_broadcast(global_weights), client_data, client_states),
    )
    mean_model = tff.federated_mean(local_models)
    aggregate = mean_model
    last_step = tff.federated_value(np.float32(0.0), tff.SERVER)
    if psi in ('geomed', 'comed'):
      for _ in range(aggregation_iterations):
        theta = tff.federated_map(
            client_prox, (local_models, tff.federated_broadcast(aggregate))
        )
        new_aggregate = tff.federated_map(
            server_step,
            tff.federated_zip((mean_model, tff.federated_mean(theta))),
        )
        last_step = tff.federated_map(
            last_step_norm, tff.federated_zip((new_aggregate, aggregate))
        )
        aggregate = new_aggregate
    new_weights = tff.federated_map(
        with_trainable, tff.federated_zip((global_weights, aggregate))
    )
    new_state = tff.federated_zip(
        collections.OrderedDict(global_model_weights=new_weights)
    )
    metrics = tff.federated_zip(
        collections.OrderedDict(
            client_work=collections.OrderedDict(
                train=metrics_aggregation_fn(model_outputs)
            ),
            aggregator=collections.OrderedDict(
                last_step_norm=last_step,
                non_finite_clients=tff.federated_sum(non_finite),
            ),
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
      personal_model_names=[f'fed_plus_{psi}'],
      personal_model_values=[lam],
  )


def _build_aggregation_steps(psi: str, delta: float, weights_type):
  """The computations of the geomed / comed fixed point: the clients' prox
  of Psi, the server's step, the step's norm, and the model of a new
  aggregate."""
  trainable_type = weights_type.trainable

  @tff.tensorflow.computation(trainable_type, trainable_type)
  def client_prox(local_model, global_trainable):
    return prox(
        psi,
        tf.nest.map_structure(tf.subtract, local_model, global_trainable),
        delta,
    )

  @tff.tensorflow.computation(trainable_type, trainable_type)
  def server_step(mean_model, mean_theta):
    return aggregate_step(mean_model, mean_theta)

  @tff.tensorflow.computation(trainable_type, trainable_type)
  def last_step_norm(a, b):
    return step_norm(a, b)

  @tff.tensorflow.computation(weights_type, trainable_type)
  def with_trainable(weights, trainable):
    return tff.learning.models.ModelWeights(
        trainable=trainable, non_trainable=weights.non_trainable
    )

  return client_prox, server_step, last_step_norm, with_trainable


def _build_client_update(
    model_fn: ModelFn, definition, parameter_types, loop_implementation
) -> tff.Computation:
  """`(w^t, data, state) -> (w_k, state, non_finite, metrics)`: one party's
  local steps from its mixture start; its new local model is its state."""

  @tff.tensorflow.computation(*parameter_types)
  def client_update(global_weights, dataset, client_state):
    model = model_fn()

    @tf.function
    def run(global_weights, dataset, client_state):
      work = definition.local_work(
          model,
          global_weights,
          dataset,
          client_state['personal'],
          loop_implementation,
      )
      new = list(work.vector)
      return (
          new,
          collections.OrderedDict(personal=(new,)),
          work.client_counts['aggregator/non_finite_clients'],
          work.model_metrics,
      )

    return run(global_weights, dataset, client_state)

  return client_update


def build_fed_avg_plus(model_fn: ModelFn, **kwargs):
  """FedAvg+ (Psi = sigma delta/2 ||.||^2, mean aggregate)."""
  return build_fed_plus(model_fn, psi='avg', **kwargs)


def build_fed_geo_med_plus(model_fn: ModelFn, **kwargs):
  """FedGeoMed+ (Psi = sigma delta ||.||_2, delta-geometric median)."""
  return build_fed_plus(model_fn, psi='geomed', **kwargs)


def build_fed_co_med_plus(model_fn: ModelFn, **kwargs):
  """FedCoMed+ (Psi = sigma delta ||.||_1, delta-coordinate-wise median)."""
  return build_fed_plus(model_fn, psi='comed', **kwargs)


@dataclasses.dataclass(frozen=True)
class FedPlusOptions(options_lib.Options):
  """The Fed+ family's options (eta is the client learning rate)."""

  fedplus_sigma: Optional[float] = options_lib.option(
      None,
      'Fed+: sigma >= 0; kappa = 1/(1 + lr sigma) (the paper advises kappa '
      'in [0.9, 0.999]).',
      low=0.0,
  )
  fedplus_delta: Optional[float] = options_lib.option(
      None, 'Fed+: smoothing delta >= 0 (default 0.1).', low=0.0
  )
  fedplus_lambda: Optional[float] = options_lib.option(
      None,
      'Fed+: local initialisation lambda in [0, 1] (default 0).',
      low=0.0,
      high=1.0,
  )
  fedplus_local_steps: int = options_lib.option(
      0,
      'Fed+: exactly E mini-batch steps per round (0: E_k = the batches of '
      "the client's stream, epochs x batches).",
      low=0,
  )
  fedplus_iterations: int = options_lib.option(
      20,
      'Fed+: fixed-point iterations of the geomed / comed aggregate.',
      low=1,
  )

  def check(self) -> None:
    if self.fedplus_sigma is None:
      raise options_lib.OptionError(
          'Fed+ needs fedplus_sigma (the paper advises kappa = 1/(1 + lr '
          'sigma) in [0.9, 0.999])',
          'fedplus_sigma',
      )

  def check_run(self, settings: options_lib.RunSettings) -> None:
    if settings.optimization.client_optimizer != 'sgd':
      raise options_lib.OptionError(
          'Fed+ takes plain local steps of size client_learning_rate; '
          'client_optimizer must be sgd',
          'client_learning_rate',
          'client_optimizer',
      )

  def describe(self, settings: options_lib.RunSettings) -> str:
    sigma = self.fedplus_sigma or 0.0
    kappa = 1.0 / (1.0 + settings.optimization.client_learning_rate * sigma)
    return (
        f', sigma={sigma:g} (kappa={kappa:.6g}), delta='
        f'{self.fedplus_delta if self.fedplus_delta is not None else 0.1:g}'
        f', lambda={self.fedplus_lambda or 0.0:g}'
    )

  def arguments(self, context: options_lib.Context) -> dict:
    """The keyword arguments of `engine_definition` and `build_fed_plus`."""
    return dict(
        learning_rate=context.client_learning_rate,
        sigma=self.fedplus_sigma,
        delta=0.1 if self.fedplus_delta is None else self.fedplus_delta,
        lam=self.fedplus_lambda or 0.0,
        local_steps=self.fedplus_local_steps,
        aggregation_iterations=self.fedplus_iterations,
    )


def _entry(name: str, psi: str, label: str) -> options_lib.Algorithm:
  def definition(options: FedPlusOptions, context: options_lib.Context):
    return engine_definition(psi=psi, **options.arguments(context))

  def build(options: FedPlusOptions, model_fn, context: options_lib.Context):
    return build_fed_plus(model_fn, psi=psi, **options.arguments(context))

  return options_lib.Algorithm(
      name=name,
      label=label,
      options=FedPlusOptions,
      definition=definition,
      builder=build,
      engines=('tff', 'batched', 'stacked'),
      stateful=True,
      own_weighting=True,  # Every party's model with weight 1.
      own_server_step=(
          'the new global model is the Psi-regularised mean or median of the '
          'local models'
      ),
      # Sigma by the paper's kappa = 1 / (1 + lr sigma) in [0.9, 0.999]
      # (lr sigma from 0.001 to 0.1 at the centre learning rate); lambda,
      # the local initialisation, from the paper's 0 over small mixture
      # starts (0.001 was its best on Sent140; lambda = 1 would make the
      # method FedAvg or FedProx, so the line stops at 0.1).
      tuned=options_lib.TunedOption(
          'fedplus_sigma',
          grid=(0.001, 0.003, 0.01, 0.03, 0.1),
          low=1e-5,
          high=100.0,
          per_learning_rate=True,
      ),
      lines=(
          options_lib.TunedOption(
              'fedplus_lambda',
              grid=(0.0, 0.001, 0.01, 0.1),
              low=0.0,
              high=1.0,
              log=False,
              extend_low=False,
              extend_high=False,
              line=True,
          ),
      ),
      example=dict(fedplus_sigma=1.0),
      engine_notes={
          'stacked': (
              'with `fedplus_local_steps=0` (its kernel refuses more; the '
              'batched engine runs them)'
          )
      },
  )


ALGORITHMS = (
    _entry('fedavg_plus', 'avg', 'FedAvg+'),
    _entry('fedgeomed_plus', 'geomed', 'FedGeoMed+'),
    _entry('fedcomed_plus', 'comed', 'FedCoMed+'),
)
