# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The privacy settings of a run, declared as the algorithms' options are.

Two parts, each a frozen dataclass of `tff_algos.options.option` fields
(default, valid range, one-line help) with its cross-option rules in
`check`:

* `DpOptions`: user-level DP of the model mean (`privacy.dp_aggregation`:
  clipping, Gaussian noise, adaptive clipping after Andrew et al. 2021), its
  accounting target (`target_epsilon`, `dp_delta`, `privacy.accounting`) and
  the noise on Delta-FL's private quantile counts;
* `Dp2Options`: DP^2's server optimizer (Li et al., ICLR 2023,
  arXiv:2212.00309; `privacy.dp2`), used when the server optimizer is `dp2`.

A command line makes one flag per field (the field's name; the training
binary's parts are `run.algorithms.PARTS`) and words an `OptionError`'s
option names as its flags. Which
algorithms take DP is each algorithm's registry trait (`Algorithm.dp`).
"""

import dataclasses

from privacy import dp2
from privacy import dp_aggregation
from tff_algos import options as options_lib


@dataclasses.dataclass(frozen=True)
class DpOptions(options_lib.Options):
  """User-level DP aggregation and its accounting (off while clip is 0)."""

  clip: float = options_lib.option(
      0.0,
      'DP: L2 clip C of client updates (> 0 turns on DP aggregation; '
      'needs uniform weighting). With adaptive_clip, the initial clip.',
      low=0.0,
  )
  noise_multiplier: float = options_lib.option(
      0.0,
      'DP: Gaussian noise stddev / clip on the sum of client updates (with '
      'adaptive_clip the total, shared with the count).',
      low=0.0,
  )
  adaptive_clip: bool = options_lib.option(
      False,
      'DP: adapt the clip to a quantile of the update norms (Andrew et al. '
      '2021).',
  )
  target_unclipped_quantile: float = options_lib.option(
      0.5,
      "DP: adaptive clipping's quantile.",
      low=0.0,
      high=1.0,
      low_open=True,
      high_open=True,
  )
  target_epsilon: float = options_lib.option(
      0.0,
      'DP: calibrate noise_multiplier so that epsilon after the run is at '
      'most this (RDP accountant; 0: noise_multiplier as given).',
      low=0.0,
  )
  dp_delta: float = options_lib.option(
      0.0,
      'DP: delta of the reported epsilon (0: 1 / clients).',
      low=0.0,
      high=1.0,
      high_open=True,
  )
  quantile_noise_stddev: float = options_lib.option(
      0.0,
      'DP with deltafl: Gaussian noise stddev on each private-quantile count '
      '(secure_quantile=private).',
      low=0.0,
  )

  @property
  def on(self) -> bool:
    """DP aggregation is on (clip > 0)."""
    return self.clip > 0

  def check(self) -> None:
    if not self.on:
      for name in (
          'noise_multiplier',
          'adaptive_clip',
          'quantile_noise_stddev',
          'target_epsilon',
          'dp_delta',
      ):
        if getattr(self, name):
          raise options_lib.OptionError(
              f'{name} needs DP aggregation: pass clip > 0', name, 'clip'
          )
      return
    if self.target_epsilon and self.noise_multiplier:
      raise options_lib.OptionError(
          'pass either noise_multiplier or target_epsilon, not both',
          'noise_multiplier',
          'target_epsilon',
      )

  def aggregation(self) -> dp_aggregation.DpOptions:
    """The DP mean's options (`privacy.dp_aggregation`)."""
    return dp_aggregation.DpOptions(
        noise_multiplier=self.noise_multiplier,
        clip=self.clip,
        adaptive_clip=self.adaptive_clip,
        target_unclipped_quantile=self.target_unclipped_quantile,
    )

  def describe(self, settings=None) -> str:
    del settings
    if not self.on:
      return ''
    adaptive = ' adaptive' if self.adaptive_clip else ''
    return f', DP z={self.noise_multiplier:g} C={self.clip:g}{adaptive}'


@dataclasses.dataclass(frozen=True)
class Dp2Options(options_lib.Options):
  """DP^2-RMSProp's server optimizer (server optimizer `dp2`)."""

  dp2_sgd_steps: int = options_lib.option(
      1, 'dp2: s1, SGD rounds per cycle.', low=1
  )
  dp2_rmsprop_steps: int = options_lib.option(
      1, 'dp2: s2, preconditioned rounds per cycle.', low=0
  )
  dp2_rmsprop_learning_rate: float = options_lib.option(
      0.01, 'dp2: server lr of the RMSProp phase.', low=0.0, low_open=True
  )
  dp2_beta: float = options_lib.option(
      0.9, 'dp2: moving average of v.', low=0.0, high=1.0, high_open=True
  )
  dp2_epsilon: float = options_lib.option(
      1e-3, 'dp2: eps of the denominator sqrt(v) + eps.', low=0.0, low_open=True
  )

  def check(self) -> None:
    for name in ('dp2_sgd_steps', 'dp2_rmsprop_steps'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int):
        raise options_lib.OptionError(
            f'{name} must be an integer, got {value!r}', name
        )

  def build(self, learning_rate: float):
    """The server optimizer, its SGD phase at `learning_rate`."""
    return dp2.build_dp2(
        learning_rate,
        self.dp2_rmsprop_learning_rate,
        sgd_steps=self.dp2_sgd_steps,
        rmsprop_steps=self.dp2_rmsprop_steps,
        beta=self.dp2_beta,
        epsilon=self.dp2_epsilon,
    )
