# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Delta-FL (superquantile federated learning) as a `LearningProcess`.

K. Pillutla, Y. Laguel, J. Malick, Z. Harchaoui, "Federated Learning with
Superquantile Aggregation for Heterogeneous Data" (Machine Learning, 2023;
arXiv:2112.09429; seed documents 000-001), and its workshop version "A
Superquantile Approach to Federated Learning with Heterogeneous Devices"
(CISS 2021; seed 002). Spec: `shared/spec/fedplus_deltafl.md` part B.

The objective is the (1 - theta)-superquantile of the client losses: the
worst-case mixture of clients with conformity at least theta. Each round
(Algorithm 2 of the paper):

  1. every selected client computes F_k(w_t) on its local training data;
  2. the (1 - theta) quantile eta_t of those losses, weighted by alpha_k
     (example counts; `uniform_weights=True` for the workshop variant), is
     estimated: exactly, or through secure sums only (Algorithm 3);
  3. eta_t is broadcast and each client keeps itself if F_k >= eta_t (the
     paper's Algorithm 2; `strict_filter=True` gives Algorithm 3's F_k > eta);
  4. kept clients train locally (SGD; the workshop variant adds weight decay
     lambda) and the server takes the alpha-weighted mean of their models.
     Filtered clients do no work and send weight 0. A round in which no
     client is kept leaves the model unchanged.

Since the filter runs on the clients from a broadcast threshold, the server
sees individual losses only if the quantile estimator reveals them: the
`exact` estimator does (Algorithm 2, where the server sorts the losses);
the secure estimators of `tff_algos.quantiles` move client information only
through secure sums (Algorithm 3). theta = 1 is FedAvg.

Boundary rule: with ">=" the client at the quantile is always kept. When the
cumulative weights hit 1 - theta exactly (e.g. three equal weights and
theta = 2/3) ">=" keeps one client more than the superquantile's mass; ">"
then gives the exact top set. Both are exposed (`strict_filter`).
"""

import collections
import collections.abc
from collections.abc import Callable, Sequence
import dataclasses
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import client_work as client_work_lib
from tff_algos import composition
from tff_algos import definition as definition_lib
from tff_algos import options as options_lib
from tff_algos import quantiles

ModelFn = Callable[[], tff.learning.models.VariableModel]


def keep_client(loss, threshold, *, strict: bool, slack: float = 0.0):
  """The Delta-FL filter: keep a client whose loss is in the tail."""
  return loss > threshold if strict else loss >= threshold - slack


def filter_slack(estimator) -> float:
  """How far above the true quantile an estimate may lie.

  The bisection estimator returns the top of a bracket of width `tolerance`
  holding the quantile, and the MM fixed point lies within `smoothing` of it.
  With the ">=" rule the clients compare against `eta - slack`, so every
  client at or above the true quantile is kept (with exact ties, e.g. at a
  zero-initialised model, none would be otherwise).
  """
  for name in ('tolerance', 'smoothing'):
    value = getattr(estimator, name, None)
    if value:
      return float(value)
  return 0.0


def build_delta_fl_client_work(
    model_fn: ModelFn,
    optimizer: tff.learning.optimizers.Optimizer,
    *,
    theta: float,
    quantile_estimator: Any,
    strict_filter: bool = False,
    uniform_weights: bool = False,
    weight_decay: float = 0.0,
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
) -> tff.learning.templates.ClientWorkProcess:
  """Client work: loss at w_t, quantile, self-filtering, local training.

  Returns:
    A `ClientWorkProcess`; its measurements hold the training metrics, the
    threshold `eta`, the fraction of clients kept and (only when the
    estimator is not secure) the mean loss at the broadcast model.
  """
  definition = engine_definition(
      theta=theta,
      strict_filter=strict_filter,
      uniform_weights=uniform_weights,
      weight_decay=weight_decay,
      slack=filter_slack(quantile_estimator),
  )
  weights_type, data_type, metrics_aggregation_fn = (
      client_work_lib.model_types_and_metrics(model_fn, metrics_aggregator)
  )

  @tff.tensorflow.computation(weights_type, data_type)
  def client_loss(weights, dataset):
    model = model_fn()

    @tf.function
    def run(weights, dataset):
      loss, n = client_work_lib.local_loss(model, weights, dataset)
      alpha = tf.constant(1.0) if uniform_weights else tf.cast(n, tf.float32)
      return loss, alpha, n

    return run(weights, dataset)

  @tff.tensorflow.computation(
      weights_type, data_type, np.float32, np.int64, np.float32
  )
  def client_train(weights, dataset, loss, count, threshold):
    model = model_fn()

    @tf.function
    def run(weights, dataset, loss, count, threshold):
      # The round context that `definition.prepare` computes from every
      # client's loss is here the estimator's eta, through TFF.
      context = {'eta': threshold}
      kept = definition.trains(context, loss)

      def train():
        delta, num_examples, non_finite = client_work_lib.local_training(
            model,
            optimizer,
            weights,
            dataset,
            weight_decay=definition.weight_decay,
            loop_implementation=loop_implementation,
        )
        return client_work_lib.structured_client_result(
            definition, context, loss, count, delta, num_examples, non_finite
        )

      def skip():
        return (
            tf.nest.map_structure(tf.zeros_like, weights.trainable),
            tf.constant(0.0),
        )

      delta, weight = tf.cond(kept, train, skip)
      return (
          tff.learning.templates.ClientResult(
              update=delta, update_weight=weight
          ),
          model.report_local_unfinalized_metrics(),
          tf.cast(kept, tf.float32),
      )

    return run(weights, dataset, loss, count, threshold)

  init_fn = client_work_lib.empty_server_state()

  @tff.federated_computation(
      init_fn.type_signature.result,
      tff.FederatedType(weights_type, tff.CLIENTS),
      tff.FederatedType(data_type, tff.CLIENTS),
  )
  def next_fn(state, weights, client_data):
    losses, alphas, counts = tff.federated_map(
        client_loss, (weights, client_data)
    )
    threshold = quantile_estimator.estimate(losses, alphas)
    result, model_outputs, kept = tff.federated_map(
        client_train,
        (
            weights,
            client_data,
            losses,
            counts,
            tff.federated_broadcast(threshold),
        ),
    )
    measured = collections.OrderedDict(
        train=metrics_aggregation_fn(model_outputs),
        eta=threshold,
        fraction_kept=_mean(kept, quantile_estimator.secure),
    )
    if not quantile_estimator.secure:
      measured['loss_at_broadcast'] = tff.federated_mean(losses)
    return tff.templates.MeasuredProcessOutput(
        state, result, tff.federated_zip(measured)
    )

  return tff.learning.templates.ClientWorkProcess(init_fn, next_fn)


def _mean(values, secure: bool):
  """Mean of a 0/1 client value; through a secure sum when `secure`."""
  if not secure:
    return tff.federated_mean(values)
  as_int = tff.federated_map(
      tff.tensorflow.computation(lambda v: tf.cast(v, tf.int32), np.float32),
      values,
  )
  ones = tff.federated_map(
      tff.tensorflow.computation(
          lambda v: tf.constant(1, tf.int32), np.float32
      ),
      values,
  )
  total = tff.federated_secure_sum_bitwidth(as_int, 20)
  count = tff.federated_secure_sum_bitwidth(ones, 20)
  return tff.federated_map(
      tff.tensorflow.computation(
          lambda t, c: tf.cast(t, tf.float32)
          / tf.cast(tf.maximum(c, 1), tf.float32),
          np.int32,
          np.int32,
      ),
      (total, count),
  )


def build_delta_fl(
    model_fn: ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    theta: float,
    quantile_estimator: Optional[Any] = None,
    strict_filter: bool = False,
    uniform_weights: bool = False,
    weight_decay: float = 0.0,
    model_distributor: Optional[
        tff.learning.templates.DistributionProcess
    ] = None,
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = (
        None
    ),
    update_attack: Optional[
        Callable[
            [tff.learning.templates.ClientWorkProcess],
            tff.learning.templates.ClientWorkProcess,
        ]
    ] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds Delta-FL (Pillutla et al., Algorithms 2 and 3).

  Args:
    model_fn: No-arg callable returning a new `VariableModel`.
    client_optimizer_fn: Local solver (the paper: SGD, one epoch).
    server_optimizer_fn: Applies the mean delta of the kept clients
      (default SGD with lr 1.0: the kept clients' weighted mean model).
    theta: Conformity level in (0, 1]; clients whose loss is at or above the
      (1 - theta) quantile train. 1 is FedAvg.
    quantile_estimator: A `tff_algos.quantiles` estimator of level
      1 - theta (default: exact, Algorithm 2). Secure estimators give
      Algorithm 3 (run under TFF's test execution context).
    strict_filter: Keep F_k > eta (Algorithm 3) instead of F_k >= eta.
    uniform_weights: Weight clients uniformly in the quantile and the
      average (the workshop variant) instead of by examples.
    weight_decay: lambda of the workshop variant's local step.
    model_distributor: Default: broadcast.
    metrics_aggregator: Training-metrics aggregator (default: sum then
      finalize; `secure_sum_then_finalize` with a secure estimator).
    loop_implementation: How local datasets are iterated.
    model_aggregator: Weighted aggregator of the kept clients' deltas
      (default weighted mean; pass e.g. `tff.learning.secure_aggregator()`
      to aggregate models with secure sums too, as the paper's Algorithm 3).
    update_attack: Optional simulated attack on marked clients' updates
      (`tff_algos.attacks.UpdateAttack`); see `tff_algos.attacks`.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    TypeError / ValueError: For invalid arguments.
  """
  if isinstance(theta, bool) or not isinstance(theta, (int, float)):
    raise TypeError(f'theta must be a float, got {type(theta).__name__}')
  if not 0.0 < theta <= 1.0:
    raise ValueError(f'theta must be in (0, 1], got {theta}')
  if not np.isfinite(weight_decay) or weight_decay < 0:
    raise ValueError(f'weight_decay must be >= 0, got {weight_decay}')
  for name, flag in (
      ('strict_filter', strict_filter),
      ('uniform_weights', uniform_weights),
  ):
    if not isinstance(flag, bool):
      raise TypeError(f'{name} must be a bool, got {flag!r}')
  if not callable(model_fn):
    raise TypeError('model_fn must be a no-arg callable returning a model')
  if not isinstance(client_optimizer_fn, tff.learning.optimizers.Optimizer):
    raise TypeError(
        'client_optimizer_fn must be a tff.learning.optimizers.Optimizer, got '
        f'{type(client_optimizer_fn).__name__}'
    )
  if quantile_estimator is None:
    quantile_estimator = quantiles.build_estimator('exact', level=1.0 - theta)
  level = getattr(quantile_estimator, 'level', None)
  if level is not None and abs(level - (1.0 - theta)) > 1e-9:
    raise ValueError(
        f'the quantile estimator has level {level}, but theta={theta} needs '
        f'level 1 - theta = {1.0 - theta}'
    )
  if metrics_aggregator is None and quantile_estimator.secure:
    # Training metrics include losses: aggregate them securely as well.
    metrics_aggregator = tff.learning.metrics.secure_sum_then_finalize
  work = build_delta_fl_client_work(
      model_fn,
      client_optimizer_fn,
      theta=float(theta),
      quantile_estimator=quantile_estimator,
      strict_filter=strict_filter,
      uniform_weights=uniform_weights,
      weight_decay=float(weight_decay),
      metrics_aggregator=metrics_aggregator,
      loop_implementation=loop_implementation,
  )
  return composition.compose_model_delta_process(
      model_fn,
      work,
      server_optimizer_fn=server_optimizer_fn,
      model_distributor=model_distributor,
      model_aggregator=(
          model_aggregator or tff.aggregators.MeanFactory(no_nan_division=True)
      ),
      update_attack=update_attack,
  )


def member_name(theta: float) -> str:
  """The key of the level-`theta` model in a family: `theta_0.5`."""
  return f'theta_{theta:g}'


def build_delta_fl_family(
    model_fn: ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    thetas: Sequence[float],
    quantile_estimator_fn: Optional[Callable[[float], Any]] = None,
    **options: Any,
) -> tff.learning.templates.LearningProcess:
  """Builds one Delta-FL model per conformity level, trained in one run.

  The paper keeps one model per level theta (Pillutla et al., section 5). This
  process trains them side by side on the same sampled clients each round:
  member `theta_<t>` is exactly `build_delta_fl(..., theta=t)` run on those
  clients (each level computes its own losses, quantile and filter), so a
  family equals its members run separately on the same client schedule, and
  levels are compared on identical client draws.

  Args:
    model_fn: No-arg callable returning a new `VariableModel`.
    client_optimizer_fn: Local solver, shared by the members.
    server_optimizer_fn: Server optimizer, shared by the members.
    thetas: Distinct conformity levels in (0, 1]; 1 adds a FedAvg member.
    quantile_estimator_fn: `theta -> estimator` of level 1 - theta (default:
      exact).
    **options: Other keyword options of `build_delta_fl` (`strict_filter`,
      `uniform_weights`, `weight_decay`, `model_aggregator`, ...).

  Returns:
    A `LearningProcess` whose state, metrics and `get_model_weights` are
    ordered mappings from `member_name(theta)` to each member's.

  Raises:
    TypeError / ValueError: For invalid arguments.
  """
  if isinstance(thetas, (str, bytes)) or not isinstance(
      thetas, collections.abc.Sequence
  ):
    raise TypeError(f'thetas must be a sequence of floats, got {thetas!r}')
  if not thetas:
    raise ValueError('thetas must name at least one level')
  for theta in thetas:
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
      raise TypeError(f'thetas must be floats, got {theta!r}')
  names = [member_name(float(t)) for t in thetas]
  if len(set(names)) != len(names):
    raise ValueError(f'thetas must be distinct, got {list(thetas)}')
  members = collections.OrderedDict()
  for theta, name in zip(thetas, names):
    estimator = quantile_estimator_fn(theta) if quantile_estimator_fn else None
    members[name] = build_delta_fl(
        model_fn,
        client_optimizer_fn,
        server_optimizer_fn,
        theta=theta,
        quantile_estimator=estimator,
        **options,
    )
  first = next(iter(members.values()))
  data_type = first.next.type_signature.parameter[1]
  state_type = tff.StructWithPythonType(
      [
          (n, p.initialize.type_signature.result.member)
          for n, p in members.items()
      ],
      collections.OrderedDict,
  )
  weights_type = tff.StructWithPythonType(
      [
          (n, p.get_model_weights.type_signature.result)
          for n, p in members.items()
      ],
      collections.OrderedDict,
  )

  @tff.federated_computation
  def init_fn():
    return tff.federated_zip(
        collections.OrderedDict((n, p.initialize()) for n, p in members.items())
    )

  @tff.federated_computation(
      tff.FederatedType(state_type, tff.SERVER), data_type
  )
  def next_fn(state, client_data):
    states, metrics = collections.OrderedDict(), collections.OrderedDict()
    for n, p in members.items():
      output = p.next(state[n], client_data)
      states[n], metrics[n] = output.state, output.metrics
    return tff.learning.templates.LearningProcessOutput(
        tff.federated_zip(states), tff.federated_zip(metrics)
    )

  @tff.federated_computation(state_type)
  def get_model_weights(state):
    return collections.OrderedDict(
        (n, p.get_model_weights(state[n])) for n, p in members.items()
    )

  @tff.federated_computation(state_type, weights_type)
  def set_model_weights(state, weights):
    return collections.OrderedDict(
        (n, p.set_model_weights(state[n], weights[n]))
        for n, p in members.items()
    )

  return tff.learning.templates.LearningProcess(
      init_fn, next_fn, get_model_weights, set_model_weights
  )


def engine_definition(
    *,
    theta: float,
    strict_filter: bool = False,
    uniform_weights: bool = False,
    weight_decay: float = 0.0,
    slack: Optional[float] = None,
) -> definition_lib.AlgorithmDefinition:
  """Delta-FL's round (exact quantile): the engines and the TFF clients.

  A loss pass at the broadcast model; eta, the (1 - theta)-quantile of the
  losses weighted by alpha_k (n_k, or 1 with `uniform_weights`); the clients
  with F_k >= eta (`> eta` with `strict_filter`: `keep_client`) train on a
  fresh copy of their stream and the others do no work; the kept deltas are
  averaged with weights alpha_k (Pillutla et al., Algorithm 2/3).

  Args:
    theta: The conformity level in (0, 1].
    strict_filter: Algorithm 3's `F_k > eta`.
    uniform_weights: The workshop version's alpha_k = 1.
    weight_decay: Local weight decay.
    slack: The filter's `filter_slack` (None: the exact quantile's, 0).
      `build_delta_fl_client_work` passes its estimator's; its clients
      compute eta with that estimator through TFF instead of `prepare`.

  Returns:
    The `definition.AlgorithmDefinition` both engines run, whose `trains`
    and `client_result` `build_delta_fl`'s clients also run.
  """
  estimator = quantiles.build_estimator('exact', level=1.0 - theta)
  if slack is None:
    slack = filter_slack(estimator)

  def alphas(counts):
    counts = tf.cast(counts, tf.float32)
    return tf.ones_like(counts) if uniform_weights else counts

  def prepare(losses, counts):
    return {
        'eta': quantiles.tf_weighted_quantile(
            losses, alphas(counts), estimator.level
        )
    }

  def trains(context, loss):
    return keep_client(loss, context['eta'], strict=strict_filter, slack=slack)

  def client_result(context, loss, count, delta, num_examples, non_finite):
    del num_examples
    kept = trains(context, loss)
    weight = tf.where(
        tf.logical_and(kept, tf.logical_not(non_finite)), alphas(count), 0.0
    )
    return delta, weight

  def server(w0, vector_sum, scalar_sum):
    del w0  # No kept client (every weight 0): a zero update.
    return tuple(tf.math.divide_no_nan(v, scalar_sum) for v in vector_sum)

  def metrics(context, losses, scalar_sum, num_clients):
    del scalar_sum
    count = tf.cast(num_clients, tf.float32)
    kept = tf.cast(trains(context, losses), tf.float32)
    return collections.OrderedDict(
        eta=context['eta'],
        fraction_kept=tf.reduce_sum(kept) / count,
        loss_at_broadcast=definition_lib.mean_loss(losses, num_clients),
    )

  return definition_lib.AlgorithmDefinition(
      name='deltafl',
      client_result=client_result,
      server=server,
      loss_pass='fresh',
      prepare=prepare,
      trains=trains,
      metrics=metrics,
      weight_decay=weight_decay,
  )


SECURE_QUANTILES = ('none', 'mm', 'bisection', 'private')


@dataclasses.dataclass(frozen=True)
class DeltaFlOptions(options_lib.Options):
  """Delta-FL's options."""

  theta: float = options_lib.option(
      1.0,
      'Delta-FL conformity level in (0, 1] (1 is FedAvg).',
      low=0.0,
      high=1.0,
      low_open=True,
  )
  thetas: tuple[float, ...] = options_lib.option(
      (),
      'Delta-FL family: one model per conformity level in one run on the '
      'same sampled clients, e.g. 1,0.8,0.5,0.1 (replaces theta; metrics '
      'are prefixed theta_<t>/).',
      low=0.0,
      high=1.0,
      low_open=True,
  )
  secure_quantile: str = options_lib.option(
      'none',
      'Delta-FL quantile through secure sums only: none (exact; the server '
      'sees the losses), mm, bisection or private. Secure modes run under '
      "TFF's test execution context, the only one that executes secure sums.",
      choices=SECURE_QUANTILES,
  )
  strict_filter: bool = options_lib.option(
      False,
      'Delta-FL: keep loss > eta (Algorithm 3) instead of >= (Algorithm 2).',
  )
  uniform_weights: bool = options_lib.option(
      False, 'Delta-FL: weigh clients uniformly (the workshop variant).'
  )
  weight_decay: float = options_lib.option(
      0.0, 'Delta-FL local weight decay lambda (workshop).', low=0.0
  )
  quantile_upper_bound: float = options_lib.option(
      20.0,
      'Secure quantiles: losses are clipped to [0, this].',
      low=0.0,
      low_open=True,
  )
  quantile_tolerance: float = options_lib.option(
      1e-4,
      'Bisection quantile: final bracket width.',
      low=0.0,
      low_open=True,
  )
  quantile_iterations: int = options_lib.option(
      50, 'MM / private quantile: iterations per round.', low=1
  )

  def check(self) -> None:
    if self.thetas:
      if self.theta != 1.0:
        raise options_lib.OptionError(
            'give either theta (one model) or thetas (a family), not both',
            'theta',
            'thetas',
        )
      if len(set(self.thetas)) != len(self.thetas):
        raise options_lib.OptionError(
            f'thetas must be distinct, got {list(self.thetas)}', 'thetas'
        )
    if not self.quantile_tolerance < self.quantile_upper_bound:
      raise options_lib.OptionError(
          'quantile_tolerance must be in (0, quantile_upper_bound), got '
          f'{self.quantile_tolerance}',
          'quantile_tolerance',
          'quantile_upper_bound',
      )

  def check_run(self, settings: options_lib.RunSettings) -> None:
    if not settings.uses_dp:
      return
    if self.thetas:
      raise options_lib.OptionError(
          'DP aggregation (clip) applies to one Delta-FL model (theta), not '
          'a family (thetas)',
          'clip',
          'theta',
          'thetas',
      )
    if not self.uniform_weights:
      raise options_lib.OptionError(
          'DP needs uniform client weighting: pass uniform_weights with '
          'deltafl',
          'uniform_weights',
      )
    if self.secure_quantile != 'private' or not settings.quantile_noise_stddev:
      raise options_lib.OptionError(
          'DP with deltafl needs a private quantile: pass '
          'secure_quantile=private and quantile_noise_stddev > 0',
          'secure_quantile',
          'quantile_noise_stddev',
      )

  def check_engine(self, engine: str) -> None:
    if engine == 'tff':
      return
    if self.secure_quantile != 'none':
      raise options_lib.OptionError(
          f'the {engine} engine runs Delta-FL with the exact quantile only '
          '(secure_quantile=none)',
          'secure_quantile',
      )
    if self.thetas:
      raise options_lib.OptionError(
          f'the {engine} engine runs one model: drop thetas', 'thetas'
      )

  @property
  def secure_intrinsics(self) -> bool:
    return self.secure_quantile != 'none'

  def describe(self, settings: options_lib.RunSettings) -> str:
    del settings
    levels = (
        f', thetas={",".join(f"{t:g}" for t in self.thetas)}'
        if self.thetas
        else f', theta={self.theta:g}'
    )
    return (
        f'{levels}, quantile={self.secure_quantile}'
        f'{", strict >" if self.strict_filter else ", >="}'
    )

  def quantile_estimator(
      self, clients_per_round: int = 0, noise_stddev: float = 0.0
  ):
    """The quantile estimator of level 1 - theta these options name."""
    level = 1.0 - self.theta
    if self.secure_quantile == 'none':
      return quantiles.build_estimator('exact', level=level)
    if self.secure_quantile == 'mm':
      return quantiles.build_estimator(
          'mm',
          level=level,
          num_iterations=self.quantile_iterations,
          lower=0.0,
          upper=self.quantile_upper_bound,
      )
    if self.secure_quantile == 'bisection':
      return quantiles.build_estimator(
          'bisection',
          level=level,
          lower=0.0,
          upper=self.quantile_upper_bound,
          tolerance=self.quantile_tolerance,
      )
    noise = {}
    if noise_stddev:
      noise = dict(
          noise_stddev=noise_stddev,
          expected_num_clients=float(max(clients_per_round, 1)),
      )
    return quantiles.build_estimator(
        'private',
        level=level,
        initial_estimate=1.0,
        num_steps=self.quantile_iterations,
        **noise,
    )


def _definition(options: DeltaFlOptions, context: options_lib.Context):
  del context
  return engine_definition(
      theta=options.theta,
      strict_filter=options.strict_filter,
      uniform_weights=options.uniform_weights,
      weight_decay=options.weight_decay,
  )


def _build(options: DeltaFlOptions, model_fn, context: options_lib.Context):
  common = dict(
      strict_filter=options.strict_filter,
      uniform_weights=options.uniform_weights,
      weight_decay=options.weight_decay,
      loop_implementation=context.loop_implementation,
  )
  k = context.clients_per_round
  if options.thetas:
    return build_delta_fl_family(
        model_fn,
        context.client_optimizer,
        context.server_optimizer,
        thetas=options.thetas,
        quantile_estimator_fn=lambda t: dataclasses.replace(
            options, theta=t, thetas=()
        ).quantile_estimator(k, context.quantile_noise_stddev),
        **context.aggregation(k),
        **common,
    )
  return build_delta_fl(
      model_fn,
      context.client_optimizer,
      context.server_optimizer,
      theta=options.theta,
      quantile_estimator=options.quantile_estimator(
          k, context.quantile_noise_stddev
      ),
      # The DP mean's expected number of kept clients.
      **context.aggregation(max(1.0, options.theta * k)),
      **common,
  )


ALGORITHM = options_lib.Algorithm(
    name='deltafl',
    label='Delta-FL',
    options=DeltaFlOptions,
    definition=_definition,
    builder=_build,
    tuned=options_lib.TunedOption(
        'theta',
        grid=(0.05, 0.1, 0.2, 0.4, 0.8),
        low=0.01,
        high=1.0,
    ),
    aggregators=True,
    dp=True,
    own_weighting=True,
    uniform_option='uniform_weights',
    example=dict(theta=0.5),
    engine_notes={'tff_only': '`secure_quantile` other than `none`, `thetas`'},
)
