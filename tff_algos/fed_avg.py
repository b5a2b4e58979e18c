# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""FedAvg as a `tff.learning.templates.LearningProcess`.

H. B. McMahan, E. Moore, D. Ramage, S. Hampson, B. Aguera y Arcas,
"Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017, https://arxiv.org/abs/1602.05629 (thesis section 3.2.1,
Algorithm 1). Clients run E epochs of mini-batch SGD from the broadcast model;
the server averages the local models, weighted by examples (the experiments'
scheme) or uniformly. FedAvg is FedProx with mu = 0 and is built that way, so
both share one tested local-training function.
"""

from collections.abc import Callable
import dataclasses
from typing import Optional

import tensorflow_federated as tff

from tff_algos import fed_prox
from tff_algos import options as options_lib

ModelFn = Callable[[], tff.learning.models.VariableModel]


def build_fed_avg(
    model_fn: ModelFn,
    client_optimizer_fn: tff.learning.optimizers.Optimizer,
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
    *,
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
  """Builds FedAvg (McMahan et al., AISTATS 2017).

  Same arguments as `build_fed_prox` without `proximal_strength`; the result
  matches TFF's `tff.learning.algorithms.build_weighted_fed_avg` on the same
  data, weights and client order.
  """
  return fed_prox.build_fed_prox(
      model_fn,
      client_optimizer_fn,
      server_optimizer_fn,
      proximal_strength=0.0,
      client_weighting=client_weighting,
      model_distributor=model_distributor,
      model_aggregator=model_aggregator,
      metrics_aggregator=metrics_aggregator,
      loop_implementation=loop_implementation,
      update_attack=update_attack,
  )


@dataclasses.dataclass(frozen=True)
class FedAvgOptions(options_lib.Options):
  """FedAvg has no options of its own."""


def _definition(options: FedAvgOptions, context: options_lib.Context):
  del options
  return fed_prox.engine_definition(
      client_weighting=context.client_weighting, name='fedavg'
  )


def _build(options: FedAvgOptions, model_fn, context: options_lib.Context):
  del options
  return build_fed_avg(
      model_fn,
      context.client_optimizer,
      context.server_optimizer,
      client_weighting=context.client_weighting,
      loop_implementation=context.loop_implementation,
      **context.aggregation(context.clients_per_round),
  )


ALGORITHM = options_lib.Algorithm(
    name='fedavg',
    label='FedAvg',
    options=FedAvgOptions,
    definition=_definition,
    builder=_build,
    aggregators=True,
    dp=True,
    drops_stragglers=True,
)
