# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""User-level DP model aggregation for algorithms that average model updates.

DP-FedAvg (H. B. McMahan, D. Ramage, K. Talwar, L. Zhang, "Learning
Differentially Private Recurrent Language Models", ICLR 2018,
arXiv:1710.06963): the server clips each client's update to L2 norm C, sums,
adds N(0, z^2 C^2 I) and divides by the expected number of clients m (a fixed
denominator, so one client's influence is bounded). Adaptive clipping (Andrew
et al., NeurIPS 2021, arXiv:1905.03871) tracks the `target_unclipped_quantile`
of the update norms with a noised count that shares the budget z.

This wraps TFF's `tff.aggregators.DifferentiallyPrivateFactory`
(`gaussian_fixed` / `gaussian_adaptive`), an unweighted factory, with
`tff.aggregators.as_weighted_aggregator` because TFF's composers require a
weighted aggregator: the client weights are IGNORED. That is only the
algorithm's average when clients are weighted uniformly, so
`build_dp_aggregator` refuses any other weighting. It fits the algorithms
that aggregate a (uniform) mean of model deltas: FedAvg, FedProx, Delta-FL's
kept clients (weights 0/1; pass the expected number of kept clients as m),
AdaDPS-FL; not q-FFL, AFL or TERM, whose aggregates are not means.
"""

import dataclasses
import math
from typing import Optional

import tensorflow_federated as tff

from privacy import accounting
from tff_algos import runtime

runtime.end_workers_at_exit()  # Quiet at exit: TFF's service manager.


@dataclasses.dataclass(frozen=True)
class DpOptions:
  """User-level DP options (the binary's flags).

  Attributes:
    noise_multiplier: z >= 0 (noise stddev z C on the clipped sum; with
      adaptive clipping the total, shared with the clipped-count noise).
    clip: C > 0, the fixed clip, or the initial clip when adaptive.
    adaptive_clip: Adapt C to the `target_unclipped_quantile` of norms.
    target_unclipped_quantile: In (0, 1) (adaptive clipping only).
    clip_learning_rate: Geometric rate of the adaptive clip.
    clipped_count_stddev: Adaptive clipping's count noise (default 0.05 m).
  """

  noise_multiplier: float
  clip: float
  adaptive_clip: bool = False
  target_unclipped_quantile: float = 0.5
  clip_learning_rate: float = 0.2
  clipped_count_stddev: Optional[float] = None

  def validate(self) -> None:
    """Raises `ValueError`/`TypeError` for an invalid option."""
    for name in (
        'noise_multiplier',
        'clip',
        'target_unclipped_quantile',
        'clip_learning_rate',
    ):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f'{name} must be a float, got {value!r}')
      if not math.isfinite(value):
        raise ValueError(f'{name} must be finite, got {value}')
    if self.noise_multiplier < 0:
      raise ValueError(
          f'noise_multiplier must be >= 0, got {self.noise_multiplier}'
      )
    if self.clip <= 0:
      raise ValueError(f'clip must be > 0, got {self.clip}')
    if not isinstance(self.adaptive_clip, bool):
      raise TypeError(
          f'adaptive_clip must be a bool, got {self.adaptive_clip!r}'
      )
    if not 0 < self.target_unclipped_quantile < 1:
      raise ValueError(
          'target_unclipped_quantile must be in (0, 1), got '
          f'{self.target_unclipped_quantile}'
      )
    if self.clip_learning_rate < 0:
      raise ValueError(
          'clip_learning_rate must be >= 0, got ' f'{self.clip_learning_rate}'
      )


def build_dp_aggregator(
    options: DpOptions,
    *,
    clients_per_round: float,
    client_weighting: tff.learning.ClientWeighting = (
        tff.learning.ClientWeighting.UNIFORM
    ),
) -> tff.aggregators.WeightedAggregationFactory:
  """A weighted-interface DP mean aggregator (weights ignored).

  Args:
    options: Noise and clipping.
    clients_per_round: m, the expected number of contributing clients (the
      fixed denominator of the mean).
    client_weighting: The algorithm's weighting; must be `UNIFORM`.

  Returns:
    A `tff.aggregators.WeightedAggregationFactory`.

  Raises:
    ValueError: Non-uniform weighting, or invalid options.
  """
  options.validate()
  if client_weighting != tff.learning.ClientWeighting.UNIFORM:
    raise ValueError(
        'DP aggregation needs uniform client weighting (the DP mean gives '
        f'every client the same weight), got {client_weighting!r}'
    )
  if (
      isinstance(clients_per_round, bool)
      or not isinstance(clients_per_round, (int, float))
      or not clients_per_round > 0
  ):
    raise ValueError(f'clients_per_round must be > 0, got {clients_per_round}')
  m = float(clients_per_round)
  if options.adaptive_clip:
    if options.noise_multiplier:
      # Same split and validation as TFF, with a one-line error.
      accounting.adaptive_clip_noise_split(
          options.noise_multiplier, m, options.clipped_count_stddev
      )
    factory = tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive(
        noise_multiplier=float(options.noise_multiplier),
        clients_per_round=m,
        initial_l2_norm_clip=float(options.clip),
        target_unclipped_quantile=float(options.target_unclipped_quantile),
        learning_rate=float(options.clip_learning_rate),
        clipped_count_stddev=options.clipped_count_stddev,
    )
  else:
    factory = tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
        noise_multiplier=float(options.noise_multiplier),
        clients_per_round=m,
        clip=float(options.clip),
    )
  return tff.aggregators.as_weighted_aggregator(factory)
