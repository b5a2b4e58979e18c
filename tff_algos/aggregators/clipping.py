# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Norm clipping of client updates before a (weighted) mean.

A validated wrapper of TFF's `tff.aggregators.clipping_factory`: each update
is scaled to L2 norm at most C before the inner aggregation (default the
weighted mean). C is fixed, or adaptive: TFF's geometric quantile tracking
(G. Andrew, O. Thakkar, H. B. McMahan, S. Ramaswamy, "Differentially Private
Learning with Adaptive Clipping", NeurIPS 2021,
https://arxiv.org/abs/1905.03871)
moves C each round towards the `target_quantile` of the participants' update
norms, through a federated mean of indicators (secure-aggregation compatible;
no noise here).

The thesis's "clipping" baseline (section 5.3.4) clips to the exact median of
the round's update norms; `target_quantile=0.5` tracks that median across
rounds instead of computing it within the round (the exact within-round
median would reveal every norm to the server).
"""

import dataclasses
import math
from typing import Optional

import tensorflow_federated as tff

from tff_algos import options as options_lib


def _positive_float(name: str, value) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise TypeError(f'{name} must be a float, got {type(value).__name__}')
  if not (math.isfinite(value) and value > 0):
    raise ValueError(f'{name} must be a positive number, got {value}')
  return float(value)


def build_clipping(
    *,
    clip_norm: Optional[float] = None,
    adaptive: bool = False,
    initial_clip_norm: float = 1.0,
    target_quantile: float = 0.5,
    learning_rate: float = 0.2,
    inner_factory: Optional[tff.aggregators.WeightedAggregationFactory] = None,
) -> tff.aggregators.WeightedAggregationFactory:
  """Norm clipping (fixed or adaptive C) followed by `inner_factory`.

  Args:
    clip_norm: Fixed C > 0 (exactly one of `clip_norm` and `adaptive`).
    adaptive: Track the `target_quantile` of update norms instead.
    initial_clip_norm: Adaptive: C at round 1.
    target_quantile: Adaptive: the norm quantile tracked, in (0, 1).
    learning_rate: Adaptive: step of the geometric update of C.
    inner_factory: Weighted factory applied to the clipped updates (default
      `tff.aggregators.MeanFactory()`); a robust one composes.

  Returns:
    A `tff.aggregators.WeightedAggregationFactory`.

  Raises:
    TypeError: For an argument of the wrong type.
    ValueError: For an impossible value, or both/neither of `clip_norm` and
      `adaptive`.
  """
  if not isinstance(adaptive, bool):
    raise TypeError(f'adaptive must be a bool, got {type(adaptive).__name__}')
  if (clip_norm is None) == (not adaptive):
    raise ValueError('give exactly one of clip_norm (fixed) and adaptive=True')
  if inner_factory is None:
    inner_factory = tff.aggregators.MeanFactory()
  if not isinstance(inner_factory, tff.aggregators.WeightedAggregationFactory):
    raise TypeError(
        'inner_factory must be a tff.aggregators.WeightedAggregationFactory, '
        f'got {type(inner_factory).__name__}'
    )
  if not adaptive:
    return tff.aggregators.clipping_factory(
        _positive_float('clip_norm', clip_norm), inner_factory
    )
  initial = _positive_float('initial_clip_norm', initial_clip_norm)
  rate = _positive_float('learning_rate', learning_rate)
  if isinstance(target_quantile, bool) or not isinstance(
      target_quantile, (int, float)
  ):
    raise TypeError(
        'target_quantile must be a float, got '
        f'{type(target_quantile).__name__}'
    )
  if not 0.0 < target_quantile < 1.0:
    raise ValueError(
        f'target_quantile must be in (0, 1), got {target_quantile}'
    )
  estimator = tff.aggregators.PrivateQuantileEstimationProcess.no_noise(
      initial_estimate=initial,
      target_quantile=float(target_quantile),
      learning_rate=rate,
  )
  return tff.aggregators.clipping_factory(estimator, inner_factory)


@dataclasses.dataclass(frozen=True)
class ClippingOptions(options_lib.AggregatorOptions):
  """Options of `aggregator=clip`."""

  clip_norm: Optional[float] = options_lib.option(
      None, 'Fixed L2 norm C.', low=0, low_open=True
  )
  clip_target_quantile: Optional[float] = options_lib.option(
      None,
      'Adaptive C tracking this quantile of update norms (0.5: median).',
      low=0,
      high=1,
      low_open=True,
      high_open=True,
  )

  def check(self) -> None:
    if (self.clip_norm is None) == (self.clip_target_quantile is None):
      raise options_lib.OptionError(
          'needs exactly one of clip_norm (fixed) and clip_target_quantile '
          '(adaptive)',
          'clip_norm',
          'clip_target_quantile',
      )


def _build(
    options: ClippingOptions,
) -> tff.aggregators.WeightedAggregationFactory:
  if options.clip_norm is not None:
    return build_clipping(clip_norm=options.clip_norm)
  return build_clipping(
      adaptive=True, target_quantile=options.clip_target_quantile
  )


AGGREGATOR = options_lib.Aggregator(
    name='clip',
    options=ClippingOptions,
    build=_build,
    summary='L2 clipping, then the weighted mean',
)
