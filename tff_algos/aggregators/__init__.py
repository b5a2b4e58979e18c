# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Robust aggregators as `tff.aggregators.WeightedAggregationFactory`s.

Each works as `model_aggregator=` of our builders and of TFF's
`tff.learning.algorithms.build_weighted_fed_avg`:

| builder | aggregate | secure-aggregation compatible |
|---|---|---|
| `build_geometric_median` | smoothed Weiszfeld (RFA) | yes: federated means |
| `build_coordinate_median` | coordinate-wise median | no: gathers the updates |
| `build_trimmed_mean` | coordinate-wise (weighted) trimmed mean | no |
| `build_krum` | (multi-)Krum | no |
| `build_clipping` | L2 clipping, then a mean | yes (`clipping_factory`) |

Each module also declares its options (`tff_algos.options.option`, one flag
each in the binaries) and its `tff_algos.options.Aggregator` entry;
`AGGREGATORS` lists them by name, after `mean` (the algorithm's own weighted
mean), and `register` adds one from outside the package.
"""

import dataclasses

from tff_algos.aggregators.clipping import build_clipping
from tff_algos.aggregators.coordinate_median import build_coordinate_median
from tff_algos.aggregators.coordinate_median import CoordinateMedianFactory
from tff_algos.aggregators.geometric_median import build_geometric_median
from tff_algos.aggregators.geometric_median import GeometricMedianFactory
from tff_algos.aggregators.krum import build_krum
from tff_algos.aggregators.krum import KrumFactory
from tff_algos.aggregators.stacked import StackedAggregationFactory
from tff_algos.aggregators.trimmed_mean import build_trimmed_mean
from tff_algos.aggregators.trimmed_mean import TrimmedMeanFactory
from tff_algos import options as _options
from tff_algos.aggregators import clipping as _clipping
from tff_algos.aggregators import coordinate_median as _coordinate_median
from tff_algos.aggregators import geometric_median as _geometric_median
from tff_algos.aggregators import krum as _krum
from tff_algos.aggregators import trimmed_mean as _trimmed_mean


@dataclasses.dataclass(frozen=True)
class MeanOptions(_options.AggregatorOptions):
  """The weighted mean takes no options."""


MEAN = _options.Aggregator(
    name='mean',
    options=MeanOptions,
    build=lambda options: None,
    summary="the algorithm's own weighted mean",
)
AGGREGATORS: dict[str, _options.Aggregator] = {
    entry.name: entry
    for entry in (
        MEAN,
        _geometric_median.AGGREGATOR,
        _coordinate_median.AGGREGATOR,
        _trimmed_mean.AGGREGATOR,
        _krum.AGGREGATOR,
        _clipping.AGGREGATOR,
    )
}


def option_owners() -> dict[str, str]:
  """The aggregator of each aggregator option, by option name."""
  return {
      name: entry.name
      for entry in AGGREGATORS.values()
      for name in _options.fields_of(entry.options)
  }


def option_defaults() -> dict[str, object]:
  """The default of each aggregator option, by option name."""
  return {
      name: field.default
      for entry in AGGREGATORS.values()
      for name, field in _options.fields_of(entry.options).items()
  }


def register(entry: _options.Aggregator) -> None:
  """Adds an aggregator (raises `ValueError` if its name or an option's is
  taken)."""
  if entry.name in AGGREGATORS:
    raise ValueError(f'aggregator {entry.name!r} is already registered')
  taken = set(option_owners()) & set(_options.fields_of(entry.options))
  if taken:
    raise ValueError(
        f'aggregator {entry.name!r}: option(s) {", ".join(sorted(taken))} '
        'already declared'
    )
  AGGREGATORS[entry.name] = entry


def unregister(name: str) -> None:
  """Removes a registered aggregator (tests)."""
  del AGGREGATORS[name]
