# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Systems heterogeneity: stragglers that finish only part of their work.

FedProx (Li et al., MLSys 2020, arXiv:1812.06127), thesis section 3.4.2: in
each round a fixed fraction of the selected clients are stragglers. A
straggler runs x local epochs, x uniform in {1, ..., E}; the others run E.
FedAvg drops the stragglers (they miss the round's deadline); FedProx
aggregates their partial solutions like full updates.

The thesis leaves E = 1 open ("stragglers imposed in a similar way"). Here a
straggler then runs a uniform random fraction u in (0, 1] of its one epoch,
rounded up to whole mini-batches (at least one batch).

The schedule is a pure function of `(seed, round_num, selected clients)`, so
a resumed run and compared algorithms see the same stragglers.
"""

import dataclasses
import math
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class ClientPlan:
  """One selected client's work in a round.

  Attributes:
    client_id: The client.
    straggler: Whether it is a straggler this round.
    epochs: Whole local epochs to run (E for non-stragglers).
    epoch_fraction: For E = 1 stragglers, the fraction of the epoch's batches
      to run; 1.0 otherwise.
  """

  client_id: str
  straggler: bool
  epochs: int
  epoch_fraction: float = 1.0

  def num_batches(self, batches_per_epoch: int) -> int:
    """Mini-batches this client runs, given its batches per full epoch."""
    if self.epoch_fraction >= 1.0:
      return self.epochs * batches_per_epoch
    return max(1, math.ceil(self.epoch_fraction * batches_per_epoch))


class StragglerSchedule:
  """Chooses each round's stragglers and their amount of work."""

  def __init__(
      self, *, fraction: float, epochs: int, drop_stragglers: bool, seed: int
  ):
    """Initializes the schedule.

    Args:
      fraction: Fraction of each round's selected clients that straggle, in
        [0, 1]; the number is `floor(fraction * clients)`.
      epochs: E, the local epochs of a non-straggler (>= 1).
      drop_stragglers: True for FedAvg (stragglers are left out of the
        round), False for FedProx (their partial work is aggregated).
      seed: Seed of the schedule.

    Raises:
      ValueError: If `fraction` or `epochs` is out of range.
    """
    if not 0.0 <= fraction <= 1.0:
      raise ValueError(f'straggler fraction must be in [0, 1], got {fraction}')
    if epochs < 1:
      raise ValueError(f'local epochs must be >= 1, got {epochs}')
    self.fraction = float(fraction)
    self.epochs = int(epochs)
    self.drop_stragglers = bool(drop_stragglers)
    self.seed = int(seed)

  def plan(self, round_num: int, client_ids: Sequence[str]) -> list[ClientPlan]:
    """The plans of all selected clients (stragglers included)."""
    rng = np.random.default_rng([self.seed, 7919, round_num])
    num_stragglers = int(math.floor(self.fraction * len(client_ids) + 1e-9))
    stragglers = set(
        rng.choice(len(client_ids), size=num_stragglers, replace=False).tolist()
    )
    plans = []
    for i, cid in enumerate(client_ids):
      if i not in stragglers:
        plans.append(ClientPlan(cid, False, self.epochs))
      elif self.epochs > 1:
        plans.append(
            ClientPlan(cid, True, int(rng.integers(1, self.epochs + 1)))
        )
      else:
        plans.append(ClientPlan(cid, True, 1, float(1.0 - rng.random())))
    return plans

  def participants(
      self, round_num: int, client_ids: Sequence[str]
  ) -> list[ClientPlan]:
    """The plans of the clients whose updates reach the server."""
    plans = self.plan(round_num, client_ids)
    if self.drop_stragglers:
      plans = [p for p in plans if not p.straggler]
    return plans
