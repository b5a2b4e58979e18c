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
"""

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
