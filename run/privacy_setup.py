# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""DP set-up of a training run: noise calibration and the epsilon tracker.

`prepare_dp(spec, config, num_clients)` returns the spec (with the noise
multiplier calibrated when its `privacy.target_epsilon` is given) and an
`accounting.EpsilonTracker` whose metrics go into every round of metrics.csv
(`dp/epsilon`, RDP) and into the final summary (also `dp/epsilon_pld` when
client sampling is Poisson).
"""

import dataclasses
from typing import Optional

from privacy import accounting
from run import algorithms
from run import simulation


def mechanism(
    spec: algorithms.AlgorithmSpec,
    config: simulation.SimulationConfig,
    num_clients: int,
    noise_multiplier: Optional[float] = None,
) -> accounting.DpMechanism:
  """The accounted mechanism of a run (`noise_multiplier` overrides)."""
  if config.client_sampling == 'examples':
    raise ValueError(
        'DP accounting needs --client_sampling=uniform or poisson; sampling '
        'proportional to examples has no privacy amplification analysis here'
    )
  dp = spec.privacy
  steps = 0
  if dp.quantile_noise_stddev:  # Delta-FL's private quantile's steps.
    steps = getattr(spec.options, 'quantile_iterations', 0)
  return accounting.DpMechanism(
      noise_multiplier=(
          dp.noise_multiplier if noise_multiplier is None else noise_multiplier
      ),
      clients_per_round=config.clients_per_round,
      num_clients=num_clients,
      sampling=config.client_sampling,
      adaptive_clip=dp.adaptive_clip,
      quantile_noise_stddev=dp.quantile_noise_stddev,
      quantile_steps=steps,
  )


def prepare_dp(
    spec: algorithms.AlgorithmSpec,
    config: simulation.SimulationConfig,
    num_clients: int,
):
  """`(spec, tracker)`; tracker None when DP is off.

  Args:
    spec: The algorithm (DP on when `spec.privacy.clip > 0`; validated). A
      `privacy.target_epsilon` > 0 calibrates the noise multiplier so that
      epsilon after `config.total_rounds` rounds is at most it (RDP); the
      returned spec then holds that multiplier. `privacy.dp_delta` is the
      delta (0: 1 / N, the thesis's convention).
    config: The simulation (rounds, clients per round, sampling).
    num_clients: N, the training clients.

  Raises:
    ValueError: An impossible budget, or noise-free DP.
  """
  dp = spec.privacy
  if not dp.on:
    return spec, None
  delta = dp.dp_delta or 1.0 / num_clients
  if dp.target_epsilon:
    try:
      z = accounting.calibrate_noise_multiplier(
          dp.target_epsilon,
          delta,
          config.total_rounds,
          lambda z: mechanism(spec, config, num_clients, z),
      )
    except Exception as e:  # dp_accounting's bracket/optimum errors.
      raise ValueError(
          f'cannot reach epsilon={dp.target_epsilon:g} at delta={delta:g} in '
          f'{config.total_rounds} rounds: {e}'
      ) from e
    spec = dataclasses.replace(  # pytype: disable=wrong-keyword-args
        spec,
        privacy=dataclasses.replace(dp, noise_multiplier=z, target_epsilon=0.0),
    )
    spec.validate()
  if spec.privacy.noise_multiplier == 0:
    raise ValueError(
        '--clip without noise is not private: pass '
        '--noise_multiplier > 0 or --target_epsilon'
    )
  tracker = accounting.EpsilonTracker(
      mechanism(spec, config, num_clients), delta, pld=True
  )
  return spec, tracker
