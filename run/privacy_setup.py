# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""DP set-up of a training run: noise calibration and the epsilon tracker.

`prepare_dp(spec, config, num_clients, target_epsilon=..., delta=...)`
returns the spec (with the noise multiplier calibrated when a target epsilon
is given) and an `accounting.EpsilonTracker` whose metrics go into every
round of metrics.csv (`dp/epsilon`, RDP) and into the final summary (also
`dp/epsilon_pld` when client sampling is Poisson).
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
  steps = 0
  if spec.quantile_noise_stddev:  # Delta-FL's private quantile's steps.
    steps = getattr(spec.options, 'quantile_iterations', 0)
  return accounting.DpMechanism(
      noise_multiplier=(
          spec.noise_multiplier
          if noise_multiplier is None
          else noise_multiplier
      ),
      clients_per_round=config.clients_per_round,
      num_clients=num_clients,
      sampling=config.client_sampling,
      adaptive_clip=spec.adaptive_clip,
      quantile_noise_stddev=spec.quantile_noise_stddev,
      quantile_steps=steps,
  )


def prepare_dp(
    spec: algorithms.AlgorithmSpec,
    config: simulation.SimulationConfig,
    num_clients: int,
    *,
    target_epsilon: float = 0.0,
    delta: float = 0.0,
):
  """`(spec, tracker)`; tracker None when DP is off.

  Args:
    spec: The algorithm (DP on when `spec.clip > 0`).
    config: The simulation (rounds, clients per round, sampling).
    num_clients: N, the training clients.
    target_epsilon: > 0: calibrate the noise multiplier so that epsilon
      after `config.total_rounds` rounds is at most this (RDP).
    delta: The delta (0: 1 / N, the thesis's convention).

  Raises:
    ValueError: DP flags without DP, or an impossible budget.
  """
  if not spec.uses_dp:
    if target_epsilon or delta:
      raise ValueError(
          '--target_epsilon and --dp_delta need DP aggregation:'
          ' pass --clip > 0'
      )
    return spec, None
  if target_epsilon < 0 or not 0 <= delta < 1:
    raise ValueError('need --target_epsilon >= 0 and --dp_delta in [0, 1)')
  delta = delta or 1.0 / num_clients
  if target_epsilon:
    if spec.noise_multiplier:
      raise ValueError(
          'pass either --noise_multiplier or --target_epsilon, not both'
      )
    try:
      z = accounting.calibrate_noise_multiplier(
          target_epsilon,
          delta,
          config.total_rounds,
          lambda z: mechanism(spec, config, num_clients, z),
      )
    except Exception as e:  # dp_accounting's bracket/optimum errors.
      raise ValueError(
          f'cannot reach epsilon={target_epsilon:g} at delta={delta:g} in '
          f'{config.total_rounds} rounds: {e}'
      ) from e
    spec = dataclasses.replace(  # pytype: disable=wrong-keyword-args
        spec, noise_multiplier=z
    )
    spec.validate()
  if spec.noise_multiplier == 0:
    raise ValueError(
        '--clip without noise is not private: pass '
        '--noise_multiplier > 0 or --target_epsilon'
    )
  tracker = accounting.EpsilonTracker(
      mechanism(spec, config, num_clients), delta, pld=True
  )
  return spec, tracker
