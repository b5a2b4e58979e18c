# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Krum and multi-Krum.

P. Blanchard, E. M. El Mhamdi, R. Guerraoui, J. Stainer, "Machine Learning
with Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017,
https://arxiv.org/abs/1703.02757 (Krum and multi-Krum; thesis section 5.3.4
baselines). With n clients of positive weight and f assumed Byzantine, each
update x_i is scored by the sum of squared distances to its n - f - 2 nearest
other updates; multi-Krum keeps the m lowest-scored updates (ties: the
earlier client) and averages them with the clients' weights (the paper
averages uniformly; with uniform client weighting it is the same). m = 1 is
Krum; the default m = n - f. Krum's guarantee needs n > 2f + 2; with fewer
clients the neighbour count is clamped to [1, n - 1] (documented, not an
error, as a round's participant count is only known at run time). m = n is
the weighted mean (FedAvg). Gathers every update at the server
(`tff_algos.aggregators.stacked`): not secure-aggregation compatible.
"""

import collections
import dataclasses
from typing import Optional

import tensorflow as tf

from tff_algos import options as options_lib
from tff_algos.aggregators import stacked


class KrumFactory(stacked.StackedAggregationFactory):
  """Multi-Krum: the weighted mean of the m updates with the lowest scores."""

  def __init__(self, *, num_byzantine: int, num_selected: Optional[int] = None):
    """Initializes the factory.

    Args:
      num_byzantine: f >= 0, the number of corrupted clients expected among a
        round's participants.
      num_selected: m >= 1 updates averaged (1: Krum); None: n - f.

    Raises:
      TypeError: If an argument is not an int.
      ValueError: If `num_byzantine` < 0 or `num_selected` < 1.
    """
    super().__init__()
    for name, value in (
        ('num_byzantine', num_byzantine),
        ('num_selected', num_selected),
    ):
      if value is None and name == 'num_selected':
        continue
      if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f'{name} must be an int, got {type(value).__name__}')
    if num_byzantine < 0:
      raise ValueError(f'num_byzantine must be >= 0, got {num_byzantine}')
    if num_selected is not None and num_selected < 1:
      raise ValueError(f'num_selected must be >= 1, got {num_selected}')
    self._num_byzantine = num_byzantine
    self._num_selected = num_selected

  def aggregate(self, updates, weights):
    n = tf.shape(updates)[0]
    f = self._num_byzantine
    neighbours = tf.clip_by_value(n - f - 2, tf.minimum(1, n - 1), n - 1)
    diffs = updates[:, tf.newaxis, :] - updates[tf.newaxis, :, :]
    sq_dist = tf.reduce_sum(tf.square(diffs), axis=2)  # [n, n]
    # Column 0 of each sorted row is the distance to itself (0).
    nearest = tf.sort(sq_dist, axis=1)[:, 1 : 1 + neighbours]
    scores = tf.reduce_sum(nearest, axis=1)
    m = n - f if self._num_selected is None else self._num_selected
    m = tf.clip_by_value(m, 1, n)
    _, selected = tf.math.top_k(-scores, k=m)
    mean = stacked.weighted_mean(
        tf.gather(updates, selected), tf.gather(weights, selected)
    )
    return mean, collections.OrderedDict(num_selected=m)

  def empty_measurements(self):
    return collections.OrderedDict(num_selected=tf.constant(0, tf.int32))


def build_krum(
    *, num_byzantine: int, num_selected: Optional[int] = None
) -> KrumFactory:
  """A `KrumFactory` (see its arguments)."""
  return KrumFactory(num_byzantine=num_byzantine, num_selected=num_selected)


@dataclasses.dataclass(frozen=True)
class KrumOptions(options_lib.AggregatorOptions):
  """Options of `aggregator=krum`."""

  krum_num_byzantine: Optional[int] = options_lib.option(
      None, 'f, corrupted clients expected per round.', low=0
  )
  krum_num_selected: Optional[int] = options_lib.option(
      None, 'Updates averaged (1: Krum; default n - f, multi-Krum).', low=1
  )

  def check(self) -> None:
    if self.krum_num_byzantine is None:
      raise options_lib.OptionError(
          'needs krum_num_byzantine', 'krum_num_byzantine'
      )

  def check_clients(self, clients_per_round: int) -> None:
    f, k = self.krum_num_byzantine, clients_per_round
    if k <= 2 * f + 2:
      raise options_lib.OptionError(
          f'krum_num_byzantine={f} needs clients_per_round > 2f + 2 = '
          f"{2 * f + 2} (Krum's condition), got {k}",
          'krum_num_byzantine',
          'clients_per_round',
      )
    if (self.krum_num_selected or 0) > k:
      raise options_lib.OptionError(
          f'krum_num_selected={self.krum_num_selected} exceeds '
          f'clients_per_round={k}',
          'krum_num_selected',
          'clients_per_round',
      )


def _build(options: KrumOptions):
  return build_krum(
      num_byzantine=options.krum_num_byzantine,
      num_selected=options.krum_num_selected,
  )


AGGREGATOR = options_lib.Aggregator(
    name='krum', options=KrumOptions, build=_build, summary='(multi-)Krum'
)
