# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""TERM (tilted empirical risk minimization) for federated learning.

T. Li, A. Beirami, M. Sanjabi, V. Smith, "Tilted Empirical Risk
Minimization", ICLR 2021, https://arxiv.org/abs/2007.01162 (thesis chapter 7;
federated use in section 7.7.2.2, spec `thesis_algorithms.md` section 9.5).

Group-level TERM with the clients as groups: the objective
(1/t) log sum_k n_k exp(t F_k(w)) tilts the weight of each client by
exp(t F_k). Each round, every selected client evaluates its loss F_k at the
broadcast model, trains locally as in FedAvg, and its model delta is averaged
with weight

  omega_k = n_k exp(t F_k) / sum_{j selected} n_j exp(t F_j).

t > 0 up-weights clients with high loss (fairness); t < 0 down-weights them
(robustness to outlier or corrupted clients); t = 0 is FedAvg.

The thesis gives no algorithm box for the federated scheme ("re-weight the
accumulated local model updates from each selected device based on the
weights estimated via Algorithm 16"). This is Algorithm 16 with tau = 0 and
mixing lambda = 1: the tilted loss of a client is its loss at the current
model, so the server keeps no per-client state. The exponent is stabilised
by subtracting the round's largest t * F_k (a `tff.federated_max`),
which leaves omega unchanged.
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


def tilted_weight(loss, num_examples, *, tilt: float, max_tilted_loss):
  """n_k exp(t F_k - max_j t F_j), the unnormalised TERM client weight."""
  return tf.cast(num_examples, tf.float32) * tf.exp(
      tilt * tf.cast(loss, tf.float32) - max_tilted_loss
  )


def build_term_client_work(
    model_fn: ModelFn,
    optimizer: tff.learning.optimizers.Optimizer,
    *,
    tilt: float,
    proximal_strength: float = 0.0,
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
) -> tff.learning.templates.ClientWorkProcess:
  """Client work: loss at the broadcast model, local training, tilted weight.

  The definition's client work (`client_work.build_local_training_client_work`):
  its reductions, the largest tilted loss and the largest loss, are placed
  with `tff.federated_max`.

  Returns:
    A `ClientWorkProcess` whose results are model deltas weighted by
    n_k exp(t F_k - max t F), with measurements `train` (training metrics),
    `loss_at_broadcast` (mean over clients), `max_tilted_loss` and
    `max_loss_at_broadcast`.
  """
  return client_work_lib.build_local_training_client_work(
      model_fn,
      optimizer,
      engine_definition(tilt=tilt, proximal_strength=proximal_strength),
      metrics_aggregator=metrics_aggregator,
      loop_implementation=loop_implementation,
  )


def build_term(
    model_fn: ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    tilt: float,
    proximal_strength: float = 0.0,
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
    update_attack: Optional[composition.UpdateAttack] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds federated TERM (Li et al., ICLR 2021; thesis section 7.7.2.2).

  Args:
    model_fn: No-arg callable returning a new `VariableModel`.
    client_optimizer_fn: Local solver.
    server_optimizer_fn: Applies the tilted average delta (default SGD 1.0).
    tilt: t; > 0 for fairness, < 0 for robustness, 0 is FedAvg.
    proximal_strength: Optional FedProx term in the local solver.
    model_distributor: Default: broadcast.
    metrics_aggregator: Training-metrics aggregator.
    loop_implementation: How local datasets are iterated.
    model_aggregator: Weighted aggregator of the tilted deltas (default
      weighted mean; a robust factory from `tff_algos.aggregators` composes).
    update_attack: Optional simulated attack on marked clients' updates
      (`tff_algos.attacks.UpdateAttack`); see `tff_algos.attacks`.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    TypeError: For a wrong argument type.
    ValueError: For a non-finite tilt or a negative proximal strength.
  """
  if isinstance(tilt, bool) or not isinstance(tilt, (int, float)):
    raise TypeError(f'tilt must be a float, got {type(tilt).__name__}')
  if not np.isfinite(tilt):
    raise ValueError(f'tilt must be finite, got {tilt}')
  if not np.isfinite(proximal_strength) or proximal_strength < 0:
    raise ValueError(f'proximal_strength must be >= 0, got {proximal_strength}')
  if not callable(model_fn):
    raise TypeError('model_fn must be a no-arg callable returning a model')
  if not isinstance(client_optimizer_fn, tff.learning.optimizers.Optimizer):
    raise TypeError(
        'client_optimizer_fn must be a tff.learning.optimizers.Optimizer, got '
        f'{type(client_optimizer_fn).__name__}'
    )
  return composition.build_from_definition(
      model_fn,
      engine_definition(
          tilt=float(tilt), proximal_strength=float(proximal_strength)
      ),
      client_optimizer_fn,
      server_optimizer_fn,
      model_distributor=model_distributor,
      model_aggregator=model_aggregator,
      update_attack=update_attack,
      metrics_aggregator=metrics_aggregator,
      loop_implementation=loop_implementation,
  )


def engine_definition(
    *, tilt: float, proximal_strength: float = 0.0
) -> definition_lib.AlgorithmDefinition:
  """TERM's round (Li et al., ICLR 2021) for the simulation engines.

  A loss pass at the broadcast model, local training on a fresh copy of
  each client's stream, and the deltas averaged with `tilted_weight`
  (n_k exp(t F_k - max_j t F_j)), as `build_term`.

  Args:
    tilt: t (> 0 emphasises the worst clients, < 0 the best).
    proximal_strength: mu >= 0 of the local proximal term.

  Returns:
    The `definition.AlgorithmDefinition` both engines run.
  """

  def client_result(context, loss, count, delta, num_examples, non_finite):
    del num_examples
    weight = tilted_weight(
        loss, count, tilt=tilt, max_tilted_loss=context['max_tilted_loss']
    )
    return delta, tf.where(non_finite, 0.0, weight)

  def metrics(context, losses, scalar_sum, num_clients):
    del context, scalar_sum
    return collections.OrderedDict(
        loss_at_broadcast=definition_lib.mean_loss(losses, num_clients),
        max_loss_at_broadcast=tf.reduce_max(losses),
    )

  return definition_lib.AlgorithmDefinition(
      name='term',
      client_result=client_result,
      loss_pass='fresh',
      reductions=(
          (
              'max_tilted_loss',
              definition_lib.Reduction('max', lambda loss, _: tilt * loss),
          ),
          (
              'max_loss_at_broadcast',
              definition_lib.Reduction('max', lambda loss, _: loss),
          ),
      ),
      metrics=metrics,
      proximal_strength=proximal_strength,
  )


@dataclasses.dataclass(frozen=True)
class TermOptions(options_lib.Options):
  """TERM's options."""

  tilt: float = options_lib.option(
      0.0, 'TERM tilt t (> 0 fairness, < 0 robustness).'
  )
  proximal_strength: float = options_lib.option(
      0.0, 'FedProx mu >= 0: the proximal term mu/2 ||w - w_t||^2.', low=0.0
  )

  def describe(self, settings: options_lib.RunSettings) -> str:
    del settings
    return f', t={self.tilt:g}'


def _definition(options: TermOptions, context: options_lib.Context):
  del context
  return engine_definition(
      tilt=options.tilt, proximal_strength=options.proximal_strength
  )


def _build(options: TermOptions, model_fn, context: options_lib.Context):
  return build_term(
      model_fn,
      context.client_optimizer,
      context.server_optimizer,
      tilt=options.tilt,
      proximal_strength=options.proximal_strength,
      loop_implementation=context.loop_implementation,
      **context.aggregation(context.clients_per_round),
  )


ALGORITHM = options_lib.Algorithm(
    name='term',
    label='TERM',
    options=TermOptions,
    definition=_definition,
    builder=_build,
    # The fairness direction (t > 0); t < 0 (robustness) is another study.
    tuned=options_lib.TunedOption(
        'tilt', grid=(0.3, 1.0, 3.0, 10.0, 30.0), low=1e-4, high=100.0
    ),
    aggregators=True,
    own_weighting=True,  # n_k exp(t F_k): the tilt weighs the examples.
    example=dict(tilt=1.0),
)
