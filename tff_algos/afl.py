# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""AFL (agnostic federated learning) as a `LearningProcess`.

M. Mohri, G. Sivek, A. T. Suresh, "Agnostic Federated Learning", ICML 2019,
https://arxiv.org/abs/1902.00146; the baseline of the q-FFL paper (thesis
section 4.3.3, Table 4.2). AFL solves min_w max_{lambda in simplex}
sum_k lambda_k F_k(w) by alternating

  w      <- w - gamma_w * sum_k lambda_k grad F_k(w)
  lambda <- Proj_simplex(lambda + gamma_lambda * (F_1(w), ..., F_m(w)))

with full local gradients at the broadcast model (the thesis runs it
"non-stochastic": every device in every round).

AFL needs to know which client sent which loss. Each client's data is
therefore a pair `OrderedDict(data=<batches>, client_index=<one int32>)`,
the index of the client in `range(num_clients)`; the simulation loop builds
these pairs. The mixture lambda lives in the client work's server state and
is reported in the metrics. When only some clients take part in a round,
only their coordinates get the ascent step before the projection, and the
descent step averages the participants' gradients with weights lambda_k.
"""

import collections
from collections.abc import Callable
import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import client_work as client_work_lib
from tff_algos import composition
from tff_algos import definition as definition_lib
from tff_algos import options as options_lib

ModelFn = Callable[[], tff.learning.models.VariableModel]
CLIENT_INDEX_KEY = 'client_index'


def project_to_simplex(v: tf.Tensor) -> tf.Tensor:
  """Euclidean projection onto the probability simplex (sort-based)."""
  v = tf.cast(v, tf.float32)
  n = tf.shape(v)[0]
  u = tf.sort(v, direction='DESCENDING')
  css = tf.cumsum(u)
  k = tf.cast(tf.range(1, n + 1), tf.float32)
  cond = u - (css - 1.0) / k > 0
  rho = tf.reduce_max(tf.where(cond, tf.range(n), 0))
  theta = (tf.gather(css, rho) - 1.0) / tf.cast(rho + 1, tf.float32)
  return tf.maximum(v - theta, 0.0)


def mixture_weight(mixture, client_index, non_finite) -> tf.Tensor:
  """lambda_k, the weight of client k's gradient (0 if non-finite)."""
  return tf.where(non_finite, 0.0, tf.gather(mixture, client_index))


def ascend_mixture(mixture, loss_vector, participation, learning_rate):
  """Proj_simplex(lambda + gamma_lambda * F), on the participants only."""
  stepped = mixture + learning_rate * loss_vector * tf.minimum(
      participation, 1.0
  )
  return project_to_simplex(stepped)


def summarize_mixture(mixture):
  """The round's mixture metrics."""
  return collections.OrderedDict(
      lambda_max=tf.reduce_max(mixture), lambda_min=tf.reduce_min(mixture)
  )


def engine_definition(
    *,
    num_clients: int,
    model_learning_rate: float,
    mixture_learning_rate: float,
) -> definition_lib.AlgorithmDefinition:
  """AFL's round math for the simulation engines (and `build_afl`'s parts).

  The client work is `client_work.full_gradient_work` (the loss and full
  gradient at the broadcast model), weighted by `mixture_weight`; the server
  takes the weighted mean (0 when every weight is 0, as
  `MeanFactory(no_nan_division=True)`) and applies SGD with gamma_w; the
  mixture, the server state under `client_work`, ascends on the
  participants' losses. Arguments as `build_afl`'s.

  Returns:
    A `definition.AlgorithmDefinition` with a server state.

  Raises:
    TypeError, ValueError: For invalid arguments.
  """
  _check_options(num_clients, model_learning_rate, mixture_learning_rate)
  gamma_lambda = float(mixture_learning_rate)

  def client_result(context, loss, count, grad, num_examples, non_finite):
    del loss, count, num_examples
    return grad, mixture_weight(
        context['server_state'], context['client_index'], non_finite
    )

  def server(w0, vector_sum, scalar_sum):
    del w0
    return tuple(tf.math.divide_no_nan(v, scalar_sum) for v in vector_sum)

  def update(mixture, losses, client_indices):
    one_hot = tf.one_hot(client_indices, num_clients, dtype=tf.float32)
    new = ascend_mixture(
        mixture,
        tf.reduce_sum(one_hot * losses[:, None], axis=0),
        tf.reduce_sum(one_hot, axis=0),
        gamma_lambda,
    )
    metrics = collections.OrderedDict(
        (f'mixture/{k}', v) for k, v in summarize_mixture(new).items()
    )
    return new, metrics

  return definition_lib.AlgorithmDefinition(
      name='afl',
      client_result=client_result,
      server=server,
      loss_pass='work',
      local_work=client_work_lib.full_gradient_work,
      server_state=definition_lib.ServerState(
          key='client_work',
          spec=tf.TensorSpec([num_clients], tf.float32),
          update=update,
      ),
      fixed_server_optimizer=tff.learning.optimizers.build_sgdm(
          learning_rate=float(model_learning_rate)
      ),
  )


def _check_options(num_clients, model_learning_rate, mixture_learning_rate):
  if isinstance(num_clients, bool) or not isinstance(num_clients, int):
    raise TypeError(f'num_clients must be an int, got {num_clients!r}')
  if num_clients < 1:
    raise ValueError(f'num_clients must be >= 1, got {num_clients}')
  for name, value, low in (
      ('model_learning_rate', model_learning_rate, 0.0),
      ('mixture_learning_rate', mixture_learning_rate, None),
  ):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise TypeError(f'{name} must be a float, got {type(value).__name__}')
    if (
        not np.isfinite(value)
        or value < 0
        or (low is not None and value <= low)
    ):
      raise ValueError(
          f'{name} must be a finite float '
          f'{"> 0" if low is not None else ">= 0"}, got {value}'
      )


def build_afl_client_work(
    model_fn: ModelFn,
    definition: definition_lib.AlgorithmDefinition,
    *,
    num_clients: int,
    mixture_learning_rate: float,
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
) -> tff.learning.templates.ClientWorkProcess:
  """Client work: full local gradient, weight lambda_k, ascent on lambda.

  Args:
    model_fn: No-arg callable returning a new `VariableModel`.
    definition: `engine_definition`'s result: its `local_work` and
      `client_result` are each client's work and message; the mixture's
      ascent is its server-state update placed with TFF (sums of the
      clients' one-hot losses, then `ascend_mixture`).
    num_clients: m, the mixture's size.
    mixture_learning_rate: gamma_lambda >= 0.
    metrics_aggregator: Metrics aggregator.

  Returns:
    A `ClientWorkProcess` with server state lambda (float32[num_clients],
    initially uniform) whose results are each client's mean gradient with
    weight lambda_k.
  """
  weights_type, seq_type, metrics_aggregation_fn = (
      client_work_lib.model_types_and_metrics(model_fn, metrics_aggregator)
  )
  data_type = tff.StructWithPythonType(
      [
          ('data', seq_type),
          (CLIENT_INDEX_KEY, tff.SequenceType(tff.TensorType(np.int32))),
      ],
      collections.OrderedDict,
  )
  lambda_type = tff.TensorType(np.float32, [num_clients])

  @tff.tensorflow.computation(weights_type, data_type, lambda_type)
  def client_update(weights, client_data, mixture):
    model = model_fn()

    @tf.function
    def run(weights, dataset, index_ds, mixture):
      index = index_ds.reduce(tf.constant(0, tf.int32), lambda _, i: i)
      work = definition.local_work(model, weights, dataset)
      grad, weight = definition.client_result(
          {'server_state': mixture, 'client_index': index},
          work.loss,
          None,
          work.vector,
          work.num_examples,
          work.non_finite,
      )
      one_hot = tf.one_hot(index, num_clients, dtype=tf.float32)
      return (
          tff.learning.templates.ClientResult(
              update=list(grad), update_weight=weight
          ),
          model.report_local_unfinalized_metrics(),
          one_hot * work.loss,
          one_hot,
      )

    return run(
        weights, client_data['data'], client_data[CLIENT_INDEX_KEY], mixture
    )

  @tff.tensorflow.computation(lambda_type, lambda_type, lambda_type)
  def ascend(mixture, loss_vector, participation):
    return ascend_mixture(
        mixture, loss_vector, participation, mixture_learning_rate
    )

  @tff.tensorflow.computation(lambda_type)
  def summarize(mixture):
    return summarize_mixture(mixture)

  @tff.federated_computation
  def init_fn():
    return tff.federated_value(
        np.full([num_clients], 1.0 / num_clients, np.float32), tff.SERVER
    )

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(weights_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS),
  )
  def next_fn(mixture, weights, client_data):
    result, model_outputs, losses, participation = tff.federated_map(
        client_update, (weights, client_data, tff.federated_broadcast(mixture))
    )
    new_mixture = tff.federated_map(
        ascend,
        (mixture, tff.federated_sum(losses), tff.federated_sum(participation)),
    )
    measurements = tff.federated_zip(
        collections.OrderedDict(
            train=metrics_aggregation_fn(model_outputs),
            mixture=tff.federated_map(summarize, new_mixture),
        )
    )
    return tff.templates.MeasuredProcessOutput(
        new_mixture, result, measurements
    )

  return tff.learning.templates.ClientWorkProcess(init_fn, next_fn)


def build_afl(
    model_fn: ModelFn,
    *,
    num_clients: int,
    model_learning_rate: float,
    mixture_learning_rate: float,
    model_distributor: Optional[
        tff.learning.templates.DistributionProcess
    ] = None,
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds AFL (Mohri et al., ICML 2019) with full local gradients.

  Args:
    model_fn: No-arg callable returning a new `VariableModel`.
    num_clients: m, the size of the mixture lambda; client indices are in
      `range(num_clients)`.
    model_learning_rate: gamma_w > 0.
    mixture_learning_rate: gamma_lambda >= 0 (0 keeps lambda uniform: FedSGD
      with a simple average).
    model_distributor: Default: broadcast.
    metrics_aggregator: Metrics aggregator.

  Returns:
    A `tff.learning.templates.LearningProcess` whose client data are
    `OrderedDict(data=dataset, client_index=dataset of one int32)`.

  Raises:
    TypeError / ValueError: For invalid arguments.
  """
  _check_options(num_clients, model_learning_rate, mixture_learning_rate)
  if not callable(model_fn):
    raise TypeError('model_fn must be a no-arg callable returning a model')
  definition = engine_definition(
      num_clients=num_clients,
      model_learning_rate=model_learning_rate,
      mixture_learning_rate=mixture_learning_rate,
  )
  work = build_afl_client_work(
      model_fn,
      definition,
      num_clients=num_clients,
      mixture_learning_rate=float(mixture_learning_rate),
      metrics_aggregator=metrics_aggregator,
  )
  return composition.compose_model_delta_process(
      model_fn,
      work,
      server_optimizer_fn=definition.fixed_server_optimizer,
      model_distributor=model_distributor,
      # The definition's `server`: the weighted mean, 0 if every weight is 0.
      model_aggregator=tff.aggregators.MeanFactory(no_nan_division=True),
  )


def client_data_with_index(dataset: tf.data.Dataset, index: int):
  """The AFL client input for `dataset` of the client at `index`."""
  return collections.OrderedDict(
      data=dataset, client_index=tf.data.Dataset.from_tensors(np.int32(index))
  )


@dataclasses.dataclass(frozen=True)
class AflOptions(options_lib.Options):
  """AFL's options (gamma_w is the client learning rate)."""

  afl_lambda_lr: float = options_lib.option(
      0.0,
      'AFL mixture step gamma_lambda >= 0 (gamma_w is the client learning '
      'rate). Run AFL with every client in each round, as the paper.',
      low=0.0,
  )

  def describe(self, settings: options_lib.RunSettings) -> str:
    return (
        f', gamma_w={settings.optimization.client_learning_rate:g}, '
        f'gamma_lambda={self.afl_lambda_lr:g}'
    )


def _definition(options: AflOptions, context: options_lib.Context):
  return engine_definition(
      num_clients=context.num_clients,
      model_learning_rate=context.client_learning_rate,
      mixture_learning_rate=options.afl_lambda_lr,
  )


def _build(options: AflOptions, model_fn, context: options_lib.Context):
  return build_afl(
      model_fn,
      num_clients=context.num_clients,
      model_learning_rate=context.client_learning_rate,
      mixture_learning_rate=options.afl_lambda_lr,
  )


ALGORITHM = options_lib.Algorithm(
    name='afl',
    label='AFL',
    options=AflOptions,
    definition=_definition,
    builder=_build,
    client_index=True,
    own_weighting=True,  # The mixture lambda weighs the clients.
    own_server_step=(
        'the model takes a step of gamma_w (the client learning rate) along '
        'the mixture-weighted gradient'
    ),
    tuned=options_lib.TunedOption(
        'afl_lambda_lr',
        grid=(0.001, 0.003, 0.01, 0.03, 0.1),
        low=1e-6,
        high=100.0,
    ),
    example=dict(afl_lambda_lr=0.01),
    engine_notes={'stacked': 'full gradient on stacked weights'},
)
