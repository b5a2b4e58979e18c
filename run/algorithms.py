# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Algorithms by name, with their options validated before anything runs.

| name      | builder                          | own options |
|-----------|----------------------------------|-------------|
| `fedavg`  | `tff_algos.fed_avg.build_fed_avg`   | (stragglers are dropped) |
| `fedprox` | `tff_algos.fed_prox.build_fed_prox` | `proximal_strength` (stragglers' partial work is kept) |
| `qffl` | `tff_algos.q_ffl.build_q_fedavg` | `q`, `q_lipschitz` (default 1 / client lr) |
| `qfedsgd` | `tff_algos.q_ffl.build_q_fedsgd` | `q`, `q_lipschitz` (default 1 / client lr) |
| `term` | `tff_algos.term.build_term` | `tilt` |
| `deltafl` | `tff_algos.delta_fl.build_delta_fl` | `theta`, `secure_quantile` (none, mm, bisection, private), `strict_filter`, `uniform_weights`, `weight_decay` |
| `afl` | `tff_algos.afl.build_afl` | `afl_lambda_lr` (gamma_lambda); gamma_w is the client learning rate |
"""

import dataclasses
import math
from collections.abc import Callable

import tensorflow_federated as tff

from tff_algos import afl
from tff_algos import delta_fl
from tff_algos import fed_avg
from tff_algos import fed_prox
from tff_algos import q_ffl
from tff_algos import quantiles
from tff_algos import term

ALGORITHM_NAMES = ('fedavg', 'fedprox', 'qffl', 'qfedsgd', 'term', 'afl', 'deltafl')
SECURE_QUANTILES = ('none', 'mm', 'bisection', 'private')
OPTIMIZERS = ('sgd', 'adam', 'adagrad', 'yogi')
WEIGHTINGS = {
    'num_examples': tff.learning.ClientWeighting.NUM_EXAMPLES,
    'uniform': tff.learning.ClientWeighting.UNIFORM,
}


def build_optimizer(
    name: str, learning_rate: float, momentum: float = 0.0
) -> tff.learning.optimizers.Optimizer:
  """A `tff.learning.optimizers` optimizer by name."""
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
      f'unknown optimizer {name!r}; choose one of: {", ".join(OPTIMIZERS)}'
  )


def drops_stragglers(algorithm: str) -> bool:
  """FedAvg drops stragglers; the others aggregate their partial work."""
  return algorithm == 'fedavg'


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """An algorithm and its hyperparameters, as given on the command line."""

  name: str
  client_optimizer: str = 'sgd'
  client_learning_rate: float = 0.01
  server_optimizer: str = 'sgd'
  server_learning_rate: float = 1.0
  server_momentum: float = 0.0
  client_weighting: str = 'num_examples'
  proximal_strength: float = 0.0
  q: float = 0.0
  q_lipschitz: float = 0.0
  tilt: float = 0.0
  afl_lambda_lr: float = 0.0
  theta: float = 1.0
  secure_quantile: str = 'none'
  strict_filter: bool = False
  uniform_weights: bool = False
  weight_decay: float = 0.0
  quantile_upper_bound: float = 20.0
  quantile_tolerance: float = 1e-4
  quantile_iterations: int = 50

  @property
  def uses_secure_intrinsics(self) -> bool:
    return self.name == 'deltafl' and self.secure_quantile != 'none'

  @property
  def lipschitz_constant(self) -> float:
    """q-FFL's L: given, or 1 / client learning rate as in the papers."""
    return self.q_lipschitz or 1.0 / self.client_learning_rate

  def validate(self) -> None:
    """Raises `ValueError` with one clear message for a bad option."""
    if self.name not in ALGORITHM_NAMES:
      raise ValueError(
          f'unknown algorithm {self.name!r}; choose one of: '
          f'{", ".join(ALGORITHM_NAMES)}'
      )
    for flag, value in (('client_optimizer', self.client_optimizer),
                        ('server_optimizer', self.server_optimizer)):
      if value not in OPTIMIZERS:
        raise ValueError(
            f'unknown --{flag}={value!r}; choose one of: {", ".join(OPTIMIZERS)}'
        )
    for flag, value in (('client_learning_rate', self.client_learning_rate),
                        ('server_learning_rate', self.server_learning_rate)):
      if not (math.isfinite(value) and value > 0):
        raise ValueError(f'--{flag} must be a positive number, got {value}')
    if not 0.0 <= self.server_momentum < 1.0:
      raise ValueError(
          f'--server_sgd_momentum must be in [0, 1), got {self.server_momentum}'
      )
    if self.client_weighting not in WEIGHTINGS:
      raise ValueError(
          f'unknown --client_weighting={self.client_weighting!r}; choose one'
          f' of: {", ".join(WEIGHTINGS)}'
      )
    if not (math.isfinite(self.proximal_strength)
            and self.proximal_strength >= 0):
      raise ValueError(
          f'--proximal_strength must be >= 0, got {self.proximal_strength}'
      )
    if self.proximal_strength and self.name not in ('fedprox', 'term'):
      raise ValueError(
          f'--proximal_strength applies to fedprox and term, not {self.name}'
      )
    if not (math.isfinite(self.q) and self.q >= 0):
      raise ValueError(f'--q must be >= 0, got {self.q}')
    if self.q and self.name not in ('qffl', 'qfedsgd'):
      raise ValueError(f'--q applies to qffl and qfedsgd, not {self.name}')
    if not (math.isfinite(self.q_lipschitz) and self.q_lipschitz >= 0):
      raise ValueError(
          f'--q_lipschitz must be > 0 (0: 1 / client lr), got {self.q_lipschitz}')
    if not math.isfinite(self.tilt):
      raise ValueError(f'--tilt must be finite, got {self.tilt}')
    if not (math.isfinite(self.afl_lambda_lr) and self.afl_lambda_lr >= 0):
      raise ValueError(
          f'--afl_lambda_lr must be >= 0, got {self.afl_lambda_lr}')
    if self.afl_lambda_lr and self.name != 'afl':
      raise ValueError(f'--afl_lambda_lr applies to afl only, not {self.name}')
    if not 0.0 < self.theta <= 1.0:
      raise ValueError(f'--theta must be in (0, 1], got {self.theta}')
    if self.theta != 1.0 and self.name != 'deltafl':
      raise ValueError(f'--theta applies to deltafl only, not {self.name}')
    if self.secure_quantile not in SECURE_QUANTILES:
      raise ValueError(
          f'unknown --secure_quantile={self.secure_quantile!r}; choose one '
          f'of: {", ".join(SECURE_QUANTILES)}')
    if self.secure_quantile != 'none' and self.name != 'deltafl':
      raise ValueError(
          f'--secure_quantile applies to deltafl only, not {self.name}')
    if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
      raise ValueError(f'--weight_decay must be >= 0, got {self.weight_decay}')
    if not (math.isfinite(self.quantile_upper_bound)
            and self.quantile_upper_bound > 0):
      raise ValueError('--quantile_upper_bound must be > 0, got '
                       f'{self.quantile_upper_bound}')
    if not 0 < self.quantile_tolerance < self.quantile_upper_bound:
      raise ValueError('--quantile_tolerance must be in (0, upper bound), got '
                       f'{self.quantile_tolerance}')
    if self.quantile_iterations < 1:
      raise ValueError('--quantile_iterations must be >= 1, got '
                       f'{self.quantile_iterations}')
    if self.tilt and self.name != 'term':
      raise ValueError(f'--tilt applies to term only, not {self.name}')

  def describe(self) -> str:
    extra = {
        'fedprox': f', mu={self.proximal_strength:g}',
        'qffl': f', q={self.q:g}, L={self.lipschitz_constant:g}',
        'qfedsgd': f', q={self.q:g}, L={self.lipschitz_constant:g}',
        'term': f', t={self.tilt:g}',
        'deltafl': f', theta={self.theta:g}, quantile={self.secure_quantile}'
                   f'{", strict >" if self.strict_filter else ", >="}',
        'afl': f', gamma_w={self.client_learning_rate:g}, '
               f'gamma_lambda={self.afl_lambda_lr:g}',
    }.get(self.name, '')
    return (f'{self.name} (client {self.client_optimizer} '
            f'lr={self.client_learning_rate:g}, server {self.server_optimizer}'
            f' lr={self.server_learning_rate:g}{extra})')


def quantile_estimator(spec: AlgorithmSpec):
  """The Delta-FL quantile estimator of level 1 - theta named by the spec."""
  level = 1.0 - spec.theta
  if spec.secure_quantile == 'none':
    return quantiles.build_estimator('exact', level=level)
  if spec.secure_quantile == 'mm':
    return quantiles.build_estimator(
        'mm', level=level, num_iterations=spec.quantile_iterations, lower=0.0,
        upper=spec.quantile_upper_bound)
  if spec.secure_quantile == 'bisection':
    return quantiles.build_estimator(
        'bisection', level=level, lower=0.0, upper=spec.quantile_upper_bound,
        tolerance=spec.quantile_tolerance)
  return quantiles.build_estimator(
      'private', level=level, initial_estimate=1.0,
      num_steps=spec.quantile_iterations)


def build_process(
    spec: AlgorithmSpec,
    model_fn: Callable[[], tff.learning.models.VariableModel],
    *,
    num_clients: int = 0,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE),
) -> tff.learning.templates.LearningProcess:
  """The `LearningProcess` of `spec` for `model_fn` (AFL: `num_clients`).

  `loop_implementation` goes to every builder that iterates local data with
  TFF's loop builder (all but AFL and q-FedSGD).
  """
  spec.validate()
  loop = {'loop_implementation': loop_implementation}
  if spec.name == 'deltafl':
    return delta_fl.build_delta_fl(
        model_fn, build_optimizer(spec.client_optimizer,
                                  spec.client_learning_rate),
        build_optimizer(spec.server_optimizer, spec.server_learning_rate,
                        spec.server_momentum),
        theta=spec.theta, quantile_estimator=quantile_estimator(spec),
        strict_filter=spec.strict_filter,
        uniform_weights=spec.uniform_weights, weight_decay=spec.weight_decay,
        **loop)
  if spec.name == 'afl':
    return afl.build_afl(
        model_fn, num_clients=num_clients,
        model_learning_rate=spec.client_learning_rate,
        mixture_learning_rate=spec.afl_lambda_lr)
  client_opt = build_optimizer(spec.client_optimizer, spec.client_learning_rate)
  server_opt = build_optimizer(
      spec.server_optimizer, spec.server_learning_rate, spec.server_momentum
  )
  weighting = WEIGHTINGS[spec.client_weighting]
  if spec.name == 'fedavg':
    return fed_avg.build_fed_avg(
        model_fn, client_opt, server_opt, client_weighting=weighting, **loop
    )
  if spec.name == 'fedprox':
    return fed_prox.build_fed_prox(
        model_fn, client_opt, server_opt,
        proximal_strength=spec.proximal_strength, client_weighting=weighting,
        **loop)
  if spec.name == 'qffl':
    return q_ffl.build_q_fedavg(
        model_fn, client_opt, q=spec.q,
        lipschitz_constant=spec.lipschitz_constant, **loop)
  if spec.name == 'qfedsgd':
    return q_ffl.build_q_fedsgd(
        model_fn, q=spec.q, lipschitz_constant=spec.lipschitz_constant)
  return term.build_term(
      model_fn, client_opt, server_opt, tilt=spec.tilt,
      proximal_strength=spec.proximal_strength, **loop)
