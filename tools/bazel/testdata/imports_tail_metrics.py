# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Imports a first-party module: passes only if the target's deps carry it."""

from tasks import tail_metrics


def test_median_of_three():
  assert tail_metrics.weighted_quantile([3.0, 1.0, 2.0], 0.5) == 2.0
