# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Algorithms by name, with their options validated before anything runs.

| name      | builder                          | own options |
|-----------|----------------------------------|-------------|
| `fedavg`  | `tff_algos.fed_avg.build_fed_avg`   | (stragglers are dropped) |
| `fedprox` | `tff_algos.fed_prox.build_fed_prox` | `proximal_strength` (stragglers' partial work is kept) |
| `qffl` | `tff_algos.q_ffl.build_q_fedavg` | `q`, `q_lipschitz` (default 1 / client lr) |
| `qfedsgd` | `tff_algos.q_ffl.build_q_fedsgd` | `q`, `q_lipschitz` (default 1 / client lr) |
| `term` | `tff_algos.term.build_term` | `tilt` |
| `deltafl` | `tff_algos.delta_fl.build_delta_fl` (`build_delta_fl_family` with `thetas`) | `theta` or `thetas`, `secure_quantile` (none, mm, bisection, private), `strict_filter`, `uniform_weights`, `weight_decay` |
| `afl` | `tff_algos.afl.build_afl` | `afl_lambda_lr` (gamma_lambda); gamma_w is the client learning rate |

Robust aggregation (`aggregator`, for fedavg, fedprox, term, deltafl):
`mean` (default), `geometric_median` (`gm_passes`), `coordinate_median`,
`trimmed_mean` (`trim_fraction`), `krum` (`krum_num_byzantine`,
`krum_num_selected`), `clip` (`clip_norm` or `clip_target_quantile`); see
`tff_algos.aggregators`. Update attacks (`attack` = gaussian or
model_replacement, `attack_scale`) apply to the same algorithms; label
poisoning is data-level and applies to all (`tff_algos.attacks`).
| `ditto` | `tff_algos.ditto.build_ditto` | `ditto_lambda` or `ditto_lambda_grid`, `ditto_personal_steps`, `ditto_personal_lr`, `ditto_clip_norm` |
| `fedavg_plus`, `fedgeomed_plus`, `fedcomed_plus` | `tff_algos.fed_plus.build_fed_plus` | `fedplus_sigma`, `fedplus_delta`, `fedplus_lambda`, `fedplus_local_steps`, `fedplus_iterations`; eta is the client learning rate |

`ditto` and the Fed+ family are stateful-client processes
(`tff_algos.stateful.StatefulClientsProcess`).
User-level DP (`privacy.dp_aggregation`, issue 6): `clip` > 0 turns on DP
aggregation (`noise_multiplier`, `adaptive_clip`, `target_unclipped_quantile`)
for the algorithms that aggregate a uniform mean (`DP_ALGORITHMS`, with Ditto's
global model);
`server_optimizer='dp2'` is DP^2 (`privacy.dp2`) with the `dp2_*` options.
"""

import dataclasses
import math
from collections.abc import Callable
from typing import Optional

import tensorflow_federated as tff

from privacy import dp2
from privacy import dp_aggregation
from tff_algos import afl
from tff_algos import aggregators
from tff_algos import attacks
from tff_algos import delta_fl
from tff_algos import ditto
from tff_algos import fed_avg
from tff_algos import fed_plus
from tff_algos import fed_prox
from tff_algos import q_ffl
from tff_algos import quantiles
from tff_algos import term

ALGORITHM_NAMES = (
    'fedavg',
    'fedprox',
    'qffl',
    'qfedsgd',
    'term',
    'afl',
    'deltafl',
    'ditto',
    'fedavg_plus',
    'fedgeomed_plus',
    'fedcomed_plus',
)
FED_PLUS_PSI = {
    'fedavg_plus': 'avg',
    'fedgeomed_plus': 'geomed',
    'fedcomed_plus': 'comed',
}
SECURE_QUANTILES = ('none', 'mm', 'bisection', 'private')
OPTIMIZERS = ('sgd', 'adam', 'adagrad', 'yogi')
AGGREGATORS = (
    'mean',
    'geometric_median',
    'coordinate_median',
    'trimmed_mean',
    'krum',
    'clip',
)
# Algorithms whose model deltas go through a weighted `model_aggregator`.
ROBUST_ALGORITHMS = ('fedavg', 'fedprox', 'term', 'deltafl')
# Algorithms whose (global) model aggregator can be a robust one, and whose
# (global) updates the A2/A3 attacks can corrupt.
AGGREGATOR_ALGORITHMS = ROBUST_ALGORITHMS + ('ditto',)
# Aggregator options: (spec field, the aggregator it belongs to).
AGGREGATOR_OPTIONS = (
    ('gm_passes', 'geometric_median'),
    ('trim_fraction', 'trimmed_mean'),
    ('krum_num_byzantine', 'krum'),
    ('krum_num_selected', 'krum'),
    ('clip_norm', 'clip'),
    ('clip_target_quantile', 'clip'),
)
SERVER_OPTIMIZERS = OPTIMIZERS + ('dp2',)
# Algorithms whose aggregate is a (uniform) mean of model deltas.
DP_ALGORITHMS = ('fedavg', 'fedprox', 'deltafl', 'ditto')
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
  thetas: tuple[float, ...] = ()
  secure_quantile: str = 'none'
  strict_filter: bool = False
  uniform_weights: bool = False
  weight_decay: float = 0.0
  quantile_upper_bound: float = 20.0
  quantile_tolerance: float = 1e-4
  quantile_iterations: int = 50
  aggregator: str = 'mean'
  gm_passes: Optional[int] = None
  trim_fraction: Optional[float] = None
  krum_num_byzantine: Optional[int] = None
  krum_num_selected: Optional[int] = None
  clip_norm: Optional[float] = None
  clip_target_quantile: Optional[float] = None
  attack: str = 'none'
  attack_scale: Optional[float] = None
  ditto_lambda: Optional[float] = None
  ditto_lambda_grid: tuple[float, ...] = ()
  ditto_personal_steps: int = 0
  ditto_personal_lr: float = 0.0
  ditto_clip_norm: float = 0.0
  fedplus_sigma: Optional[float] = None
  fedplus_delta: Optional[float] = None
  fedplus_lambda: Optional[float] = None
  fedplus_local_steps: int = 0
  fedplus_iterations: int = 20

  @property
  def is_stateful(self) -> bool:
    """Whether clients keep a state across rounds (Ditto, Fed+)."""
    return self.name == 'ditto' or self.name in FED_PLUS_PSI

  @property
  def ditto_lambdas(self) -> tuple[float, ...]:
    return self.ditto_lambda_grid or (
        (self.ditto_lambda,) if self.ditto_lambda is not None else ()
    )

  noise_multiplier: float = 0.0
  clip: float = 0.0
  adaptive_clip: bool = False
  target_unclipped_quantile: float = 0.5
  quantile_noise_stddev: float = 0.0
  dp2_sgd_steps: int = 1
  dp2_rmsprop_steps: int = 1
  dp2_rmsprop_learning_rate: float = 0.01
  dp2_beta: float = 0.9
  dp2_epsilon: float = 1e-3

  @property
  def uses_dp(self) -> bool:
    """DP aggregation is on (`--clip` > 0)."""
    return self.clip > 0

  def dp_options(self) -> dp_aggregation.DpOptions:
    return dp_aggregation.DpOptions(
        noise_multiplier=self.noise_multiplier,
        clip=self.clip,
        adaptive_clip=self.adaptive_clip,
        target_unclipped_quantile=self.target_unclipped_quantile,
    )

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
    for flag, value, names in (
        ('client_optimizer', self.client_optimizer, OPTIMIZERS),
        ('server_optimizer', self.server_optimizer, SERVER_OPTIMIZERS),
    ):
      if value not in names:
        raise ValueError(
            f'unknown --{flag}={value!r}; choose one of: {", ".join(names)}'
        )
    for flag, value in (
        ('client_learning_rate', self.client_learning_rate),
        ('server_learning_rate', self.server_learning_rate),
    ):
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
    if not (
        math.isfinite(self.proximal_strength) and self.proximal_strength >= 0
    ):
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
          '--q_lipschitz must be > 0 (0: 1 / client lr), got '
          f'{self.q_lipschitz}'
      )
    if not math.isfinite(self.tilt):
      raise ValueError(f'--tilt must be finite, got {self.tilt}')
    if not (math.isfinite(self.afl_lambda_lr) and self.afl_lambda_lr >= 0):
      raise ValueError(
          f'--afl_lambda_lr must be >= 0, got {self.afl_lambda_lr}'
      )
    if self.afl_lambda_lr and self.name != 'afl':
      raise ValueError(f'--afl_lambda_lr applies to afl only, not {self.name}')
    if not 0.0 < self.theta <= 1.0:
      raise ValueError(f'--theta must be in (0, 1], got {self.theta}')
    if self.theta != 1.0 and self.name != 'deltafl':
      raise ValueError(f'--theta applies to deltafl only, not {self.name}')
    if self.thetas:
      if self.name != 'deltafl':
        raise ValueError(f'--thetas applies to deltafl only, not {self.name}')
      if self.theta != 1.0:
        raise ValueError(
            'give either --theta (one model) or --thetas (a '
            'family), not both'
        )
      bad = [t for t in self.thetas if not 0.0 < t <= 1.0]
      if bad:
        raise ValueError(f'--thetas must be in (0, 1], got {bad[0]}')
      if len(set(self.thetas)) != len(self.thetas):
        raise ValueError(f'--thetas must be distinct, got {list(self.thetas)}')
    if self.secure_quantile not in SECURE_QUANTILES:
      raise ValueError(
          f'unknown --secure_quantile={self.secure_quantile!r}; choose one '
          f'of: {", ".join(SECURE_QUANTILES)}'
      )
    if self.secure_quantile != 'none' and self.name != 'deltafl':
      raise ValueError(
          f'--secure_quantile applies to deltafl only, not {self.name}'
      )
    if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
      raise ValueError(f'--weight_decay must be >= 0, got {self.weight_decay}')
    if not (
        math.isfinite(self.quantile_upper_bound)
        and self.quantile_upper_bound > 0
    ):
      raise ValueError(
          '--quantile_upper_bound must be > 0, got '
          f'{self.quantile_upper_bound}'
      )
    if not 0 < self.quantile_tolerance < self.quantile_upper_bound:
      raise ValueError(
          '--quantile_tolerance must be in (0, upper bound), got '
          f'{self.quantile_tolerance}'
      )
    if self.quantile_iterations < 1:
      raise ValueError(
          '--quantile_iterations must be >= 1, got '
          f'{self.quantile_iterations}'
      )
    if self.tilt and self.name != 'term':
      raise ValueError(f'--tilt applies to term only, not {self.name}')
    self._validate_robustness()
    self._validate_personalized()
    self._validate_dp()

  def _validate_robustness(self) -> None:
    """Aggregator and attack options (one message per problem)."""
    if self.aggregator not in AGGREGATORS:
      raise ValueError(
          f'unknown --aggregator={self.aggregator!r}; choose one'
          f' of: {", ".join(AGGREGATORS)}'
      )
    if self.aggregator != 'mean' and self.name not in AGGREGATOR_ALGORITHMS:
      raise ValueError(
          f'--aggregator={self.aggregator} applies to '
          f'{", ".join(AGGREGATOR_ALGORITHMS)}, not {self.name}'
      )
    if self.ditto_clip_norm and self.clip:
      raise ValueError('give --ditto_clip_norm or DP (--clip), not both')
    if self.aggregator != 'mean' and self.ditto_clip_norm:
      raise ValueError('give --ditto_clip_norm or --aggregator, not both')
    for field, owner in AGGREGATOR_OPTIONS:
      if getattr(self, field) is not None and self.aggregator != owner:
        raise ValueError(
            f'--{field} applies to --aggregator={owner}, not '
            f'{self.aggregator}'
        )
    if self.aggregator == 'clip' and (
        (self.clip_norm is None) == (self.clip_target_quantile is None)
    ):
      raise ValueError(
          '--aggregator=clip needs exactly one of --clip_norm '
          '(fixed) and --clip_target_quantile (adaptive)'
      )
    if self.aggregator == 'krum' and self.krum_num_byzantine is None:
      raise ValueError('--aggregator=krum needs --krum_num_byzantine')
    if self.attack not in attacks.ATTACKS:
      raise ValueError(
          f'unknown --attack={self.attack!r}; choose one of: '
          f'{", ".join(attacks.ATTACKS)}'
      )
    if (
        self.attack in attacks.UPDATE_ATTACKS
        and self.name not in AGGREGATOR_ALGORITHMS
    ):
      raise ValueError(
          f'--attack={self.attack} applies to '
          f'{", ".join(AGGREGATOR_ALGORITHMS)}, not {self.name}'
      )
    if self.attack_scale is not None:
      if self.attack not in attacks.UPDATE_ATTACKS:
        raise ValueError(
            '--attack_scale applies to --attack=gaussian or '
            f'model_replacement, not {self.attack}'
        )
      attacks.UpdateAttack(self.attack, self.attack_scale)
    # Build the factory once so its own checks run before anything else.
    model_aggregator(self)

  def _validate_personalized(self) -> None:
    """Ditto and Fed+ options (one message per problem)."""
    ditto_given = [
        f
        for f in (
            'ditto_lambda',
            'ditto_lambda_grid',
            'ditto_personal_steps',
            'ditto_personal_lr',
            'ditto_clip_norm',
        )
        if getattr(self, f)
        or (f == 'ditto_lambda' and self.ditto_lambda is not None)
    ]
    if ditto_given and self.name != 'ditto':
      raise ValueError(
          f'--{ditto_given[0]} applies to ditto only, not ' f'{self.name}'
      )
    plus_given = [
        f
        for f in ('fedplus_sigma', 'fedplus_delta', 'fedplus_lambda')
        if getattr(self, f) is not None
    ]
    plus_given += [f for f in ('fedplus_local_steps',) if getattr(self, f)]
    if self.fedplus_iterations != 20:
      plus_given.append('fedplus_iterations')
    if plus_given and self.name not in FED_PLUS_PSI:
      raise ValueError(
          f'--{plus_given[0]} applies to fedavg_plus, '
          f'fedgeomed_plus and fedcomed_plus, not {self.name}'
      )
    if self.name == 'ditto':
      if self.ditto_lambda is not None and self.ditto_lambda_grid:
        raise ValueError('give --ditto_lambda or --ditto_lambda_grid, not both')
      if not self.ditto_lambdas:
        raise ValueError(
            'ditto needs --ditto_lambda (fixed) or '
            '--ditto_lambda_grid (selected per client on '
            'validation data)'
        )
      ditto.check_lambdas(list(self.ditto_lambdas))
      if self.ditto_personal_steps < 0:
        raise ValueError(
            '--ditto_personal_steps must be >= 0, got '
            f'{self.ditto_personal_steps}'
        )
      for flag in ('ditto_personal_lr', 'ditto_clip_norm'):
        value = getattr(self, flag)
        if not (math.isfinite(value) and value >= 0):
          raise ValueError(f'--{flag} must be >= 0, got {value}')
    if self.name in FED_PLUS_PSI:
      if self.fedplus_sigma is None:
        raise ValueError(
            f'{self.name} needs --fedplus_sigma (the paper '
            'advises kappa = 1/(1 + lr sigma) in [0.9, 0.999])'
        )
      checks = (
          ('fedplus_sigma', self.fedplus_sigma, 0.0, math.inf),
          ('fedplus_delta', self.fedplus_delta, 0.0, math.inf),
          ('fedplus_lambda', self.fedplus_lambda, 0.0, 1.0),
      )
      for flag, value, low, high in checks:
        if value is not None and not (
            math.isfinite(value) and low <= value <= high
        ):
          raise ValueError(
              f'--{flag} must be in [{low:g}, {high:g}], got ' f'{value}'
          )
      if self.fedplus_local_steps < 0:
        raise ValueError(
            '--fedplus_local_steps must be >= 0, got '
            f'{self.fedplus_local_steps}'
        )
      if self.fedplus_iterations < 1:
        raise ValueError(
            '--fedplus_iterations must be >= 1, got '
            f'{self.fedplus_iterations}'
        )
      if self.client_optimizer != 'sgd':
        raise ValueError(
            f'{self.name} takes plain local steps of size '
            '--client_learning_rate; --client_optimizer must be'
            ' sgd'
        )
      if (
          self.server_optimizer != 'sgd'
          or self.server_learning_rate != 1.0
          or self.server_momentum
      ):
        raise ValueError(
            f'{self.name} has no server optimizer (its '
            'aggregate is the Psi-regularised median/mean); '
            'leave the --server_* flags at their defaults'
        )

  def _validate_dp(self) -> None:
    """The DP and DP^2 options (issue 6)."""
    if not (math.isfinite(self.clip) and self.clip >= 0):
      raise ValueError(f'--clip must be >= 0 (0: no DP), got {self.clip}')
    if not (
        math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0
    ):
      raise ValueError(
          f'--noise_multiplier must be >= 0, got {self.noise_multiplier}'
      )
    if self.uses_dp and self.aggregator != 'mean':
      raise ValueError(
          'DP aggregation (--clip) and --aggregator cannot be combined'
      )
    if self.uses_dp and self.thetas:
      raise ValueError(
          'DP aggregation (--clip) applies to one Delta-FL '
          'model (--theta), not a family (--thetas)'
      )
    if not self.uses_dp:
      for flag, on in (
          ('noise_multiplier', self.noise_multiplier),
          ('adaptive_clip', self.adaptive_clip),
          ('quantile_noise_stddev', self.quantile_noise_stddev),
      ):
        if on:
          raise ValueError(f'--{flag} needs DP aggregation: pass --clip > 0')
    else:
      if self.name not in DP_ALGORITHMS:
        raise ValueError(
            f'DP aggregation (--clip) applies to algorithms that aggregate a '
            f'mean ({", ".join(DP_ALGORITHMS)}), not {self.name}'
        )
      if self.name == 'deltafl':
        if not self.uniform_weights:
          raise ValueError(
              'DP needs uniform client weighting: pass '
              '--uniform_weights with deltafl'
          )
        if self.secure_quantile != 'private' or not self.quantile_noise_stddev:
          raise ValueError(
              'DP with deltafl needs a private quantile: pass '
              '--secure_quantile=private and --quantile_noise_stddev > 0'
          )
      elif self.client_weighting != 'uniform':
        raise ValueError(
            'DP aggregation needs uniform client weighting: pass '
            '--client_weighting=uniform'
        )
      self.dp_options().validate()
    if not (
        math.isfinite(self.quantile_noise_stddev)
        and self.quantile_noise_stddev >= 0
    ):
      raise ValueError(
          '--quantile_noise_stddev must be >= 0, got '
          f'{self.quantile_noise_stddev}'
      )
    if self.server_optimizer == 'dp2':
      dp2.build_dp2(
          self.server_learning_rate,
          self.dp2_rmsprop_learning_rate,
          sgd_steps=self.dp2_sgd_steps,
          rmsprop_steps=self.dp2_rmsprop_steps,
          beta=self.dp2_beta,
          epsilon=self.dp2_epsilon,
      )
      if self.server_momentum:
        raise ValueError('--server_sgd_momentum does not apply to dp2')

  def describe(self) -> str:
    """A one-line description: the algorithm's name and its options."""
    extra = {
        'fedprox': f', mu={self.proximal_strength:g}',
        'qffl': f', q={self.q:g}, L={self.lipschitz_constant:g}',
        'qfedsgd': f', q={self.q:g}, L={self.lipschitz_constant:g}',
        'term': f', t={self.tilt:g}',
        'deltafl': (
            f', thetas={",".join(f"{t:g}" for t in self.thetas)}'
            if self.thetas
            else f', theta={self.theta:g}'
        )
        + f', quantile={self.secure_quantile}'
        f'{", strict >" if self.strict_filter else ", >="}',
        'afl': f', gamma_w={self.client_learning_rate:g}, '
        f'gamma_lambda={self.afl_lambda_lr:g}',
        'ditto': f', lambda={",".join(f"{v:g}" for v in self.ditto_lambdas)}'
        + (f', clip={self.ditto_clip_norm:g}' if self.ditto_clip_norm else ''),
    }.get(self.name, '')
    if self.name in FED_PLUS_PSI:
      sigma = self.fedplus_sigma or 0.0
      kappa = 1.0 / (1.0 + self.client_learning_rate * sigma)
      extra = (
          f', sigma={sigma:g} (kappa={kappa:.6g}), delta='
          f'{self.fedplus_delta if self.fedplus_delta is not None else 0.1:g}'
          f', lambda={self.fedplus_lambda or 0.0:g}'
      )
    if self.uses_dp:
      extra += (
          f', DP z={self.noise_multiplier:g} C={self.clip:g}'
          f'{" adaptive" if self.adaptive_clip else ""}'
      )
    return (
        f'{self.name} (client {self.client_optimizer} '
        f'lr={self.client_learning_rate:g}, server {self.server_optimizer}'
        f' lr={self.server_learning_rate:g}{extra}'
        f'{self._describe_robustness()})'
    )

  def _describe_robustness(self) -> str:
    parts = []
    if self.aggregator != 'mean':
      options = ', '.join(
          f'{field}={getattr(self, field)}'
          for field, owner in AGGREGATOR_OPTIONS
          if owner == self.aggregator and getattr(self, field) is not None
      )
      parts.append(
          f'aggregator {self.aggregator}' + (f' ({options})' if options else '')
      )
    if self.attack != 'none':
      parts.append(f'attack {self.attack}')
    return ''.join(f', {p}' for p in parts)


def model_aggregator(
    spec: AlgorithmSpec,
) -> Optional[tff.aggregators.WeightedAggregationFactory]:
  """The `tff_algos.aggregators` factory named by the spec (None: mean)."""
  if spec.aggregator == 'geometric_median':
    return aggregators.build_geometric_median(
        num_passes=3 if spec.gm_passes is None else spec.gm_passes
    )
  if spec.aggregator == 'coordinate_median':
    return aggregators.build_coordinate_median()
  if spec.aggregator == 'trimmed_mean':
    return aggregators.build_trimmed_mean(
        trim_fraction=0.1 if spec.trim_fraction is None else spec.trim_fraction
    )
  if spec.aggregator == 'krum':
    return aggregators.build_krum(
        num_byzantine=spec.krum_num_byzantine,
        num_selected=spec.krum_num_selected,
    )
  if spec.aggregator == 'clip':
    if spec.clip_norm is not None:
      return aggregators.build_clipping(clip_norm=spec.clip_norm)
    return aggregators.build_clipping(
        adaptive=True, target_quantile=spec.clip_target_quantile
    )
  return None


def update_attack(
    spec: AlgorithmSpec, *, clients_per_round: int
) -> Optional[attacks.UpdateAttack]:
  """The update-level attack of the spec (None for none / label_poison)."""
  if spec.attack not in attacks.UPDATE_ATTACKS:
    return None
  scale = spec.attack_scale
  if scale is None:
    scale = attacks.default_scale(
        spec.attack,
        clients_per_round=clients_per_round,
        server_learning_rate=spec.server_learning_rate,
    )
  return attacks.UpdateAttack(spec.attack, scale)


def quantile_estimator(spec: AlgorithmSpec, clients_per_round: int = 0):
  """The Delta-FL quantile estimator of level 1 - theta named by the spec."""
  level = 1.0 - spec.theta
  if spec.secure_quantile == 'none':
    return quantiles.build_estimator('exact', level=level)
  if spec.secure_quantile == 'mm':
    return quantiles.build_estimator(
        'mm',
        level=level,
        num_iterations=spec.quantile_iterations,
        lower=0.0,
        upper=spec.quantile_upper_bound,
    )
  if spec.secure_quantile == 'bisection':
    return quantiles.build_estimator(
        'bisection',
        level=level,
        lower=0.0,
        upper=spec.quantile_upper_bound,
        tolerance=spec.quantile_tolerance,
    )
  noise = {}
  if spec.quantile_noise_stddev:
    noise = dict(
        noise_stddev=spec.quantile_noise_stddev,
        expected_num_clients=float(max(clients_per_round, 1)),
    )
  return quantiles.build_estimator(
      'private',
      level=level,
      initial_estimate=1.0,
      num_steps=spec.quantile_iterations,
      **noise,
  )


def build_process(
    spec: AlgorithmSpec,
    model_fn: Callable[[], tff.learning.models.VariableModel],
    *,
    num_clients: int = 0,
    clients_per_round: int = 10,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
) -> tff.learning.templates.LearningProcess:
  """The `LearningProcess` of `spec` for `model_fn`.

  AFL needs `num_clients`; `clients_per_round` sets the default A3 scale
  (-K / server lr) and is the DP mean's denominator (the expected number of
  clients). Ditto and the Fed+ family give a
  `stateful.StatefulClientsProcess`. `loop_implementation` goes to every
  builder that iterates local data with TFF's loop builder (all but AFL,
  q-FedSGD and the stateful ones).
  """
  spec.validate()
  loop = {'loop_implementation': loop_implementation}
  if spec.uses_dp and clients_per_round < 1:
    raise ValueError('DP aggregation needs clients_per_round >= 1')
  if spec.is_stateful:
    return _build_stateful(spec, model_fn, clients_per_round)

  def aggregation(dp_clients_per_round: float) -> dict:
    """The model aggregator (DP, robust or mean) and the update attack."""
    return dict(
        model_aggregator=(
            _dp_aggregator(spec, dp_clients_per_round)
            if spec.uses_dp
            else model_aggregator(spec)
        ),
        update_attack=update_attack(spec, clients_per_round=clients_per_round),
    )

  if spec.name == 'deltafl' and spec.thetas:
    return delta_fl.build_delta_fl_family(
        model_fn,
        build_optimizer(spec.client_optimizer, spec.client_learning_rate),
        _server_optimizer(spec),
        thetas=spec.thetas,
        quantile_estimator_fn=lambda t: quantile_estimator(
            dataclasses.replace(spec, theta=t, thetas=()), clients_per_round
        ),
        strict_filter=spec.strict_filter,
        uniform_weights=spec.uniform_weights,
        weight_decay=spec.weight_decay,
        **aggregation(clients_per_round),
        **loop,
    )
  if spec.name == 'deltafl':
    return delta_fl.build_delta_fl(
        model_fn,
        build_optimizer(spec.client_optimizer, spec.client_learning_rate),
        _server_optimizer(spec),
        theta=spec.theta,
        quantile_estimator=quantile_estimator(spec, clients_per_round),
        strict_filter=spec.strict_filter,
        uniform_weights=spec.uniform_weights,
        weight_decay=spec.weight_decay,
        **aggregation(max(1.0, spec.theta * clients_per_round)),
        **loop,
    )
  if spec.name == 'afl':
    return afl.build_afl(
        model_fn, **definition_options(spec, num_clients=num_clients)
    )
  client_opt = build_optimizer(spec.client_optimizer, spec.client_learning_rate)
  server_opt = _server_optimizer(spec)
  weighting = WEIGHTINGS[spec.client_weighting]
  if spec.name == 'fedavg':
    return fed_avg.build_fed_avg(
        model_fn,
        client_opt,
        server_opt,
        client_weighting=weighting,
        **aggregation(clients_per_round),
        **loop,
    )
  if spec.name == 'fedprox':
    return fed_prox.build_fed_prox(
        model_fn,
        client_opt,
        server_opt,
        proximal_strength=spec.proximal_strength,
        client_weighting=weighting,
        **aggregation(clients_per_round),
        **loop,
    )
  if spec.name == 'qffl':
    return q_ffl.build_q_fedavg(
        model_fn,
        client_opt,
        q=spec.q,
        lipschitz_constant=spec.lipschitz_constant,
        **loop,
    )
  if spec.name == 'qfedsgd':
    return q_ffl.build_q_fedsgd(
        model_fn, q=spec.q, lipschitz_constant=spec.lipschitz_constant
    )
  return term.build_term(
      model_fn,
      client_opt,
      server_opt,
      tilt=spec.tilt,
      proximal_strength=spec.proximal_strength,
      **aggregation(clients_per_round),
      **loop,
  )


# The algorithms whose `engine_definition` takes options of their own (the
# keyword arguments `definition_options` gives); the others' definitions are
# made from `tff_algos.batched.BatchedAlgorithm`'s fields.
OPTION_ALGORITHMS = ('ditto', 'afl') + tuple(FED_PLUS_PSI)


def definition_options(spec: AlgorithmSpec, *, num_clients: int = 0) -> dict:
  """The options of Ditto's, Fed+'s or AFL's round math from `spec`.

  The keyword arguments of their `engine_definition` (and of their builders,
  which make the same definition), so the TFF process and the simulation
  engines run one configuration. AFL needs `num_clients`.
  """
  if spec.name == 'ditto':
    personal_opt = None
    if spec.ditto_personal_lr:
      personal_opt = build_optimizer(
          spec.client_optimizer, spec.ditto_personal_lr
      )
    return dict(
        lam=list(spec.ditto_lambdas),
        personal_optimizer=personal_opt,
        personal_steps=spec.ditto_personal_steps,
    )
  if spec.name in FED_PLUS_PSI:
    return dict(
        learning_rate=spec.client_learning_rate,
        sigma=spec.fedplus_sigma,
        delta=0.1 if spec.fedplus_delta is None else spec.fedplus_delta,
        lam=spec.fedplus_lambda or 0.0,
        local_steps=spec.fedplus_local_steps,
        aggregation_iterations=spec.fedplus_iterations,
    )
  if spec.name == 'afl':
    return dict(
        num_clients=num_clients,
        model_learning_rate=spec.client_learning_rate,
        mixture_learning_rate=spec.afl_lambda_lr,
    )
  return {}


def _build_stateful(spec: AlgorithmSpec, model_fn, clients_per_round: int):
  """Ditto and the Fed+ family (`stateful.StatefulClientsProcess`)."""
  if spec.name == 'ditto':
    options = definition_options(spec)
    aggregator = (
        _dp_aggregator(spec, clients_per_round)
        if spec.uses_dp
        else model_aggregator(spec)
    )
    if spec.ditto_clip_norm:
      aggregator = tff.aggregators.clipping_factory(
          spec.ditto_clip_norm, tff.aggregators.MeanFactory()
      )
    return ditto.build_ditto(
        model_fn,
        build_optimizer(spec.client_optimizer, spec.client_learning_rate),
        build_optimizer(
            spec.server_optimizer,
            spec.server_learning_rate,
            spec.server_momentum,
        ),
        lam=options['lam'],
        personal_optimizer_fn=options['personal_optimizer'],
        personal_steps=options['personal_steps'],
        client_weighting=WEIGHTINGS[spec.client_weighting],
        model_aggregator=aggregator,
        update_attack=update_attack(spec, clients_per_round=clients_per_round),
    )
  if spec.name in FED_PLUS_PSI:
    return fed_plus.build_fed_plus(
        model_fn, psi=FED_PLUS_PSI[spec.name], **definition_options(spec)
    )
  raise ValueError(f'{spec.name} is not a stateful-client algorithm')


def _server_optimizer(spec: AlgorithmSpec) -> tff.learning.optimizers.Optimizer:
  if spec.server_optimizer == 'dp2':
    return dp2.build_dp2(
        spec.server_learning_rate,
        spec.dp2_rmsprop_learning_rate,
        sgd_steps=spec.dp2_sgd_steps,
        rmsprop_steps=spec.dp2_rmsprop_steps,
        beta=spec.dp2_beta,
        epsilon=spec.dp2_epsilon,
    )
  return build_optimizer(
      spec.server_optimizer, spec.server_learning_rate, spec.server_momentum
  )


def _dp_aggregator(spec: AlgorithmSpec, clients_per_round: float):
  """The DP mean aggregator when DP is on, else None (the default mean)."""
  if not spec.uses_dp:
    return None
  return dp_aggregation.build_dp_aggregator(
      spec.dp_options(), clients_per_round=float(clients_per_round)
  )
