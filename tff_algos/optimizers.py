# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""A run's optimizers and client weighting, declared as options.

`OptimizerOptions` is the part of a run every algorithm shares: the client
optimizer and its learning rate, the server optimizer (TFF's, or `dp2`, the
DP^2-RMSProp server optimizer of `privacy.dp2`, built by its own part), its
learning rate and SGD momentum, and the weighting of the mean of client
updates. Each field has its default, range and help (`tff_algos.options`);
an algorithm checks them against its own rules (`Options.check_run`).
"""

import dataclasses
from typing import Optional

import tensorflow_federated as tff

from tff_algos import options as options_lib

CLIENT_OPTIMIZERS = ('sgd', 'adam', 'adagrad', 'yogi')
SERVER_OPTIMIZERS = CLIENT_OPTIMIZERS + ('dp2',)
WEIGHTINGS = {
    'num_examples': tff.learning.ClientWeighting.NUM_EXAMPLES,
    'uniform': tff.learning.ClientWeighting.UNIFORM,
}


def build_optimizer(
    name: str, learning_rate: float, momentum: float = 0.0
) -> tff.learning.optimizers.Optimizer:
  """A `tff.learning.optimizers` optimizer by name (one of
  `CLIENT_OPTIMIZERS`)."""
  if name == 'sgd':
    return tff.learning.optimizers.build_sgdm(
        learning_rate=learning_rate, momentum=momentum or None
    )
  if name == 'adam':
    return tff.learning.optimizers.build_adam(learning_rate=learning_rate)
  if name == 'adagrad':
    return tff.learning.optimizers.build_adagrad(learning_rate=learning_rate)
  if name == 'yogi':
    return tff.learning.optimizers.build_yogi(learning_rate=learning_rate)
  raise ValueError(
      f'unknown optimizer {name!r}; choose one of: '
      f'{", ".join(CLIENT_OPTIMIZERS)}'
  )


@dataclasses.dataclass(frozen=True)
class OptimizerOptions(options_lib.Options):
  """The client and server optimizers and the client weighting of a run."""

  client_optimizer: str = options_lib.option(
      'sgd',
      f'Client optimizer: {", ".join(CLIENT_OPTIMIZERS)}.',
      choices=CLIENT_OPTIMIZERS,
  )
  client_learning_rate: float = options_lib.option(
      0.01, 'Client lr.', low=0.0, low_open=True
  )
  server_optimizer: str = options_lib.option(
      'sgd',
      f'Server optimizer: {", ".join(SERVER_OPTIMIZERS)} (dp2: DP^2-RMSProp'
      ' on the aggregated update, server_learning_rate in its SGD phase).',
      choices=SERVER_OPTIMIZERS,
  )
  server_learning_rate: float = options_lib.option(
      1.0,
      'Server lr (1.0 with sgd: the new model is the average of local '
      'models).',
      low=0.0,
      low_open=True,
  )
  server_momentum: float = options_lib.option(
      0.0,
      'Server SGD momentum.',
      low=0.0,
      high=1.0,
      high_open=True,
      flag='server_sgd_momentum',
  )
  client_weighting: str = options_lib.option(
      'num_examples',
      'Aggregation weights of the algorithms whose mean follows it: '
      'num_examples or uniform (the others weigh clients by their own rule '
      'and refuse it).',
      choices=tuple(WEIGHTINGS),
  )

  def check(self) -> None:
    if self.server_optimizer == 'dp2' and self.server_momentum:
      raise options_lib.OptionError(
          'server_momentum does not apply to dp2', 'server_momentum'
      )

  @property
  def server_at_defaults(self) -> bool:
    """The server step is plain SGD at learning rate 1 (no momentum)."""
    return (
        self.server_optimizer == 'sgd'
        and self.server_learning_rate == 1.0
        and not self.server_momentum
    )

  def client(
      self, learning_rate: Optional[float] = None
  ) -> tff.learning.optimizers.Optimizer:
    """The client optimizer (at `learning_rate`, default its own)."""
    if learning_rate is None:
      learning_rate = self.client_learning_rate
    return build_optimizer(self.client_optimizer, learning_rate)

  def server(self) -> tff.learning.optimizers.Optimizer:
    """The server optimizer (not `dp2`: its own part builds it)."""
    if self.server_optimizer == 'dp2':
      raise ValueError('the dp2 server optimizer is built by its own options')
    return build_optimizer(
        self.server_optimizer, self.server_learning_rate, self.server_momentum
    )

  @property
  def weighting(self) -> tff.learning.ClientWeighting:
    """The weighting of the mean of client updates."""
    return WEIGHTINGS[self.client_weighting]
