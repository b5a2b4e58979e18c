# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""FedProx as a `tff.learning.templates.LearningProcess`.

FedProx: T. Li, A. K. Sahu, M. Zaheer, M. Sanjabi, A. Talwalkar, V. Smith,
"Federated Optimization in Heterogeneous Networks", MLSys 2020,
https://arxiv.org/abs/1812.06127 (thesis chapter 3, Algorithm 2). Each
selected client approximately minimises F_k(w) + (mu/2)||w - w_t||^2 by
mini-batch SGD from w_t; the server averages the results.

FedAvg (`tff_algos.fed_avg`) is FedProx with mu = 0.

It is composed like TFF's own `fed_prox.py`: broadcast distributor, local
training client work (`tff_algos.client_work`), a weighted mean aggregator,
and a server-optimizer finalizer. With the default server optimizer (SGD, lr
1.0) the new model is the weighted mean of the clients' models.

Systems heterogeneity (stragglers, thesis section 3.4.2) is simulated by the
training loop, not the process: see `tff_algos.stragglers`. FedProx keeps a
straggler's partial work; FedAvg drops stragglers.
"""

from collections.abc import Callable
import dataclasses
from typing import Optional

from absl import logging
import numpy as np
import tensorflow_federated as tff

from tff_algos import client_work as client_work_lib
from tff_algos import composition
from tff_algos import definition as definition_lib
from tff_algos import options as options_lib

ModelFn = Callable[[], tff.learning.models.VariableModel]


def build_fed_prox(
    model_fn: ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
    proximal_strength: float,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.NUM_EXAMPLES
    ),
    model_distributor: Optional[
        tff.learning.templates.DistributionProcess
    ] = None,
    model_aggregator: Optional[tff.aggregators.WeightedAggregationFactory] = (
        None
    ),
    metrics_aggregator: Optional[Callable[..., tff.Computation]] = None,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
    update_attack: Optional[
        Callable[
            [tff.learning.templates.ClientWorkProcess],
            tff.learning.templates.ClientWorkProcess,
        ]
    ] = None,
) -> tff.learning.templates.LearningProcess:
  """Builds FedProx (Li et al., MLSys 2020, Algorithm 2).

  Args:
    model_fn: No-arg callable returning a new `VariableModel`.
    client_optimizer_fn: The local solver's optimizer (thesis: SGD).
    server_optimizer_fn: Applies the averaged delta (default SGD, lr 1.0,
      which is FedProx's plain average of the local models).
    proximal_strength: mu >= 0; 0 is FedAvg.
    client_weighting: `NUM_EXAMPLES` (the experiments' n_k-weighted average)
      or `UNIFORM` (the algorithm box's simple average).
    model_distributor: Default: broadcast.
    model_aggregator: Weighted aggregation factory (default weighted mean).
    metrics_aggregator: Training-metrics aggregator.
    loop_implementation: How local datasets are iterated.
    update_attack: Optional simulated attack on marked clients' updates
      (`tff_algos.attacks.UpdateAttack`); see `tff_algos.attacks`.

  Returns:
    A `tff.learning.templates.LearningProcess`.

  Raises:
    TypeError: If an argument has the wrong type.
    ValueError: If `proximal_strength` is negative or not finite.
  """
  if isinstance(proximal_strength, bool) or not isinstance(
      proximal_strength, (int, float)
  ):
    raise TypeError(
        'proximal_strength must be a float, got '
        f'{type(proximal_strength).__name__}'
    )
  proximal_strength = float(proximal_strength)
  if not np.isfinite(proximal_strength) or proximal_strength < 0.0:
    raise ValueError(
        'proximal_strength must be a finite float >= 0, got '
        f'{proximal_strength}'
    )
  if not isinstance(client_weighting, tff.learning.ClientWeighting):
    raise TypeError(
        'client_weighting must be a tff.learning.ClientWeighting, got '
        f'{client_weighting!r}'
    )
  if not callable(model_fn):
    raise TypeError('model_fn must be a no-arg callable returning a model')
  if proximal_strength == 0.0:
    logging.info('FedProx with proximal_strength=0.0 is FedAvg.')
  definition = engine_definition(
      client_weighting=client_weighting,
      proximal_strength=proximal_strength,
      name='fedprox' if proximal_strength else 'fedavg',
  )
  return composition.build_from_definition(
      model_fn,
      definition,
      client_optimizer_fn,
      server_optimizer_fn,
      model_distributor=model_distributor,
      model_aggregator=model_aggregator,
      update_attack=update_attack,
      metrics_aggregator=metrics_aggregator,
      loop_implementation=loop_implementation,
  )


def engine_definition(
    *,
    client_weighting: tff.learning.ClientWeighting,
    proximal_strength: float = 0.0,
    name: str = 'fedprox',
) -> definition_lib.AlgorithmDefinition:
  """FedProx's round (FedAvg's with mu = 0): `build_fed_prox` and the engines.

  Local training with the proximal term mu/2 ||w - w_t||^2, then the
  weighted mean of the deltas (`client_work.client_weight`, as
  `build_weighted_fed_prox`'s `MeanFactory`) through the server optimizer.

  Args:
    client_weighting: Weight by examples or uniformly.
    proximal_strength: mu >= 0.
    name: 'fedprox' or 'fedavg'.

  Returns:
    The `definition.AlgorithmDefinition` `build_fed_prox`'s client work and
    both engines run.
  """

  return definition_lib.AlgorithmDefinition(
      name=name,
      client_result=client_work_lib.weighted_delta_result(client_weighting),
      proximal_strength=proximal_strength,
  )


@dataclasses.dataclass(frozen=True)
class FedProxOptions(options_lib.Options):
  """FedProx's options."""

  proximal_strength: float = options_lib.option(
      0.0, 'FedProx mu >= 0: the proximal term mu/2 ||w - w_t||^2.', low=0.0
  )

  def describe(self, settings: options_lib.RunSettings) -> str:
    del settings
    return f', mu={self.proximal_strength:g}'


def _definition(options: FedProxOptions, context: options_lib.Context):
  return engine_definition(
      client_weighting=context.client_weighting,
      proximal_strength=options.proximal_strength,
  )


def _build(options: FedProxOptions, model_fn, context: options_lib.Context):
  return build_fed_prox(
      model_fn,
      context.client_optimizer,
      context.server_optimizer,
      proximal_strength=options.proximal_strength,
      client_weighting=context.client_weighting,
      loop_implementation=context.loop_implementation,
      **context.aggregation(context.clients_per_round),
  )


ALGORITHM = options_lib.Algorithm(
    name='fedprox',
    label='FedProx',
    options=FedProxOptions,
    definition=_definition,
    builder=_build,
    tuned=options_lib.TunedOption(
        'proximal_strength',
        grid=(0.01, 0.03, 0.1, 0.3, 1.0),
        low=1e-6,
        high=1e3,
    ),
    aggregators=True,
    dp=True,
)
