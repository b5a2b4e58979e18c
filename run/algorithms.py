# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""An algorithm run: its name, its options and the run-wide settings.

The algorithms, their options (defaults, ranges, help), the engines that
run them and their tuned knobs are declared in their own modules and listed
in `tff_algos.registry`; `AlgorithmSpec` holds the name, the options object
and what every algorithm shares: optimizers, client weighting, robust
aggregation, attacks and DP. Errors from `tff_algos` name options;
`AlgorithmSpec.validate` words them as this package's flags (`--name`).

Robust aggregation (`aggregator`, for the algorithms whose registry entry
has `aggregators`): the entries of `tff_algos.aggregators.AGGREGATORS`
(`mean`, the default, `geometric_median`, `coordinate_median`,
`trimmed_mean`, `krum`, `clip`), each with its declared options
(`gm_passes`, ...), given by name. Update attacks
(`attack` = gaussian or model_replacement, `attack_scale`) apply to the same
algorithms; label poisoning is data-level and applies to all
(`tff_algos.attacks`). User-level DP (`privacy.dp_aggregation`):
its options are declared in `privacy.options` (`DpOptions`: `clip` > 0 turns
on DP aggregation for the algorithms whose entry has `dp`; `Dp2Options`:
`server_optimizer='dp2'` is DP^2, `privacy.dp2`), held as `spec.privacy` and
`spec.dp2` and given by field name.
"""

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any, Optional

import tensorflow_federated as tff

from privacy import dp_aggregation
from privacy import options as privacy_options
from tff_algos import aggregators
from tff_algos import attacks
from tff_algos import optimizers
from tff_algos import options as options_lib
from tff_algos import registry

# The built-in algorithms (`tff_algos.registry.names()` adds registered ones).
ALGORITHM_NAMES = registry.names()
# The run's declared parts beside the algorithm and its aggregator: the spec
# field that holds each and its options class (a flag per field, given to the
# spec by name).
PARTS = {
    'optimization': optimizers.OptimizerOptions,
    'privacy': privacy_options.DpOptions,
    'dp2': privacy_options.Dp2Options,
    'adversary': attacks.AttackOptions,
}
# Options whose flag has another name (declared with `option(flag=...)`).
FLAG_NAMES = {
    name: options_lib.flag_of(field)
    for part in PARTS.values()
    for name, field in options_lib.fields_of(part).items()
    if options_lib.flag_of(field) != name
}


def aggregator_algorithms() -> tuple[str, ...]:
  """Algorithms whose (global) model aggregator can be a robust one and whose
  (global) updates the A2/A3 attacks can corrupt."""
  return tuple(e.name for e in registry.ALGORITHMS.values() if e.aggregators)


def robust_algorithms() -> tuple[str, ...]:
  """Algorithms whose model deltas go through a weighted `model_aggregator`
  (the aggregator ones without client states)."""
  return tuple(
      e.name
      for e in registry.ALGORITHMS.values()
      if e.aggregators and not e.stateful
  )


def weighted_algorithms() -> tuple[str, ...]:
  """The algorithms whose mean follows `--client_weighting`."""
  return tuple(n for n in registry.names() if not registry.get(n).own_weighting)


def dp_algorithms() -> tuple[str, ...]:
  """Algorithms whose aggregate is a (uniform) mean of model deltas."""
  return tuple(e.name for e in registry.ALGORITHMS.values() if e.dp)


def drops_stragglers(algorithm: str) -> bool:
  """FedAvg drops stragglers; the others aggregate their partial work."""
  entry = registry.ALGORITHMS.get(algorithm)
  return entry is not None and entry.drops_stragglers


def word_as_flags(
    error: options_lib.OptionError, flags: Mapping[str, str]
) -> str:
  """The message of `error` with the options it names as `--flags`.

  Args:
    error: The error; its `options` are the option names its message uses.
    flags: The flag of each option name (absent: the name itself).
  """
  text = str(error)
  for name in error.options:
    text = re.sub(
        rf'(?<![-\w]){re.escape(name)}\b', f'--{flags.get(name, name)}', text
    )
  return text


def flag_wording(error: options_lib.OptionError) -> ValueError:
  """The `ValueError` of `error` with the options it names as `--flags`."""
  return ValueError(word_as_flags(error, FLAG_NAMES))


@dataclasses.dataclass(frozen=True, init=False)
class AlgorithmSpec:
  """An algorithm, its options and the run-wide settings.

  `AlgorithmSpec(name, options)` takes the algorithm's options object (its
  `tff_algos.registry` entry's `options` class; None: the defaults);
  `AlgorithmSpec(name, proximal_strength=1.0, ...)` takes option values by
  name instead, checked by `validate` (an option of another algorithm is
  refused there, as the command line refuses it).
  """

  name: str
  options: Any = None
  # Optimizers and client weighting (`tff_algos.optimizers`), given by name.
  optimization: optimizers.OptimizerOptions = optimizers.OptimizerOptions()
  aggregator: str = 'mean'
  # Corrupted clients (`tff_algos.attacks.AttackOptions`), given by name.
  adversary: attacks.AttackOptions = attacks.AttackOptions()
  # DP and DP^2 (`privacy.options`); their fields may be given by name.
  privacy: privacy_options.DpOptions = privacy_options.DpOptions()
  dp2: privacy_options.Dp2Options = privacy_options.Dp2Options()
  # Option values given by name that do not make this algorithm's options
  # (refused by `validate`).
  option_values: tuple[tuple[str, Any], ...] = ()
  # The aggregators' options given (other than their defaults), by name
  # (`tff_algos.aggregators`; another aggregator's are refused by `validate`).
  aggregator_values: tuple[tuple[str, Any], ...] = ()

  def __init__(self, name: str, options: Any = None, **settings: Any):
    for key, part in PARTS.items():
      own = options_lib.fields_of(part)
      named = {k: settings.pop(k) for k in list(settings) if k in own}
      if named:
        settings[key] = dataclasses.replace(
            settings.get(key) or part(), **named
        )
    run_wide = {f.name for f in dataclasses.fields(AlgorithmSpec)}
    defaults = aggregators.option_defaults()
    given = dict(settings.pop('aggregator_values', ()))
    given.update({k: settings.pop(k) for k in list(settings) if k in defaults})
    settings['aggregator_values'] = tuple(
        sorted((k, v) for k, v in given.items() if v != defaults[k])
    )
    values = dict(settings.pop('option_values', ()))
    values.update(
        {k: settings.pop(k) for k in list(settings) if k not in run_wide}
    )
    unknown = sorted(set(values) - set(registry.all_options()))
    if unknown:
      raise TypeError(f'AlgorithmSpec got unknown options: {unknown}')
    for field in dataclasses.fields(AlgorithmSpec):
      value = settings.get(field.name, field.default)
      object.__setattr__(self, field.name, value)
    options, values = _make_options(name, options, values)
    object.__setattr__(self, 'name', name)
    object.__setattr__(self, 'options', options)
    object.__setattr__(self, 'option_values', tuple(sorted(values.items())))

  @property
  def entry(self) -> options_lib.Algorithm:
    """The algorithm's registry entry (raises `ValueError` if unknown)."""
    try:
      return registry.get(self.name)
    except options_lib.OptionError as e:
      raise flag_wording(e) from None

  @property
  def is_stateful(self) -> bool:
    """Whether clients keep a state across rounds (Ditto, Fed+)."""
    entry = registry.ALGORITHMS.get(self.name)
    return entry is not None and entry.stateful

  def aggregator_options(self) -> options_lib.AggregatorOptions:
    """The options of the spec's aggregator (raises `KeyError` if unknown)."""
    entry = aggregators.AGGREGATORS[self.aggregator]
    own = options_lib.fields_of(entry.options)
    return entry.options(
        **{k: v for k, v in self.aggregator_values if k in own}
    )

  @property
  def uses_dp(self) -> bool:
    """DP aggregation is on (`--clip` > 0)."""
    return self.privacy.on

  def dp_options(self) -> dp_aggregation.DpOptions:
    return self.privacy.aggregation()

  @property
  def uses_secure_intrinsics(self) -> bool:
    return self.options is not None and self.options.secure_intrinsics

  def run_settings(self) -> options_lib.RunSettings:
    """The run-wide settings options are checked against."""
    return options_lib.RunSettings(
        optimization=self.optimization,
        aggregator=self.aggregator,
        uses_dp=self.uses_dp,
        quantile_noise_stddev=self.privacy.quantile_noise_stddev,
    )

  def validate(self) -> None:
    """Raises `ValueError` with one clear message for a bad option."""
    entry = self.entry
    optimization = self.optimization
    try:
      optimization.validate()
    except options_lib.OptionError as e:
      raise flag_wording(e) from None
    if entry.own_server_step and not optimization.server_at_defaults:
      raise ValueError(
          f'--algorithm={self.name} has no server optimizer (its server step:'
          f' {entry.own_server_step}); leave --server_optimizer, '
          '--server_learning_rate and --server_sgd_momentum at their defaults'
      )
    try:
      if self.options is None:
        registry.options_from_values(self.name, dict(self.option_values))
      registry.check_options(self.name, self.options)
      self.options.check_run(self.run_settings())
    except options_lib.OptionError as e:
      raise flag_wording(e) from None
    self._validate_robustness(entry)
    self._validate_dp(entry)
    if entry.own_weighting and optimization.client_weighting != 'num_examples':
      raise ValueError(
          f'--client_weighting applies to {", ".join(weighted_algorithms())}'
          f', not {self.name} (it weighs its clients by its own rule)'
      )

  def _validate_robustness(self, entry: options_lib.Algorithm) -> None:
    """Aggregator and attack options (one message per problem)."""
    if self.aggregator not in aggregators.AGGREGATORS:
      raise ValueError(
          f'unknown --aggregator={self.aggregator!r}; choose one'
          f' of: {", ".join(aggregators.AGGREGATORS)}'
      )
    if self.aggregator != 'mean' and not entry.aggregators:
      raise ValueError(
          f'--aggregator={self.aggregator} applies to '
          f'{", ".join(aggregator_algorithms())}, not {self.name}'
      )
    owners = aggregators.option_owners()
    for field, _ in self.aggregator_values:
      if owners[field] != self.aggregator:
        raise ValueError(
            f'--{field} applies to --aggregator={owners[field]}, not '
            f'{self.aggregator}'
        )
    options = self.aggregator_options()
    try:
      options.check_ranges()
    except options_lib.OptionError as e:
      raise flag_wording(e) from None
    try:
      options.check()
    except options_lib.OptionError as e:
      raise ValueError(
          f'--aggregator={self.aggregator} {flag_wording(e)}'
      ) from None
    adversary = self.adversary
    try:
      adversary.check_ranges()
      if adversary.on_updates and not entry.aggregators:
        raise ValueError(
            f'--attack={adversary.attack} applies to '
            f'{", ".join(aggregator_algorithms())}, not {self.name}'
        )
      adversary.check()
    except options_lib.OptionError as e:
      raise flag_wording(e) from None
    # Build the factory once so its own checks run before anything else.
    model_aggregator(self)

  def _validate_dp(self, entry: options_lib.Algorithm) -> None:
    """The DP and DP^2 options: their declared ranges and rules
    (`privacy.options`), then what they need of the run."""
    for part in (self.privacy, self.dp2):
      try:
        part.validate()
      except options_lib.OptionError as e:
        raise flag_wording(e) from None
    if self.uses_dp and self.aggregator != 'mean':
      raise ValueError(
          'DP aggregation (--clip) and --aggregator cannot be combined'
      )
    if self.uses_dp:
      if not entry.dp:
        raise ValueError(
            f'DP aggregation (--clip) applies to algorithms that aggregate a '
            f'mean ({", ".join(dp_algorithms())}), not {self.name}'
        )
      if (
          not entry.own_weighting
          and self.optimization.client_weighting != 'uniform'
      ):
        raise ValueError(
            'DP aggregation needs uniform client weighting: pass '
            '--client_weighting=uniform'
        )
      self.dp_options().validate()
    server_optimizer = self.optimization.server_optimizer
    if server_optimizer == 'dp2':
      self.dp2.build(self.optimization.server_learning_rate)
    else:
      given = options_lib.given(self.dp2)
      if given:
        raise ValueError(
            f'--{given[0]} applies to --server_optimizer=dp2, not '
            f'{server_optimizer}'
        )

  def describe(self) -> str:
    """A one-line description: the algorithm's name and its options."""
    extra = ''
    entry = registry.ALGORITHMS.get(self.name)
    if entry is not None:
      options = self.options or entry.options()
      extra = options.describe(self.run_settings())
    extra += self.privacy.describe()
    optimization = self.optimization
    return (
        f'{self.name} (client {optimization.client_optimizer} '
        f'lr={optimization.client_learning_rate:g}, server '
        f'{optimization.server_optimizer} '
        f'lr={optimization.server_learning_rate:g}{extra}'
        f'{self._describe_robustness()})'
    )

  def _describe_robustness(self) -> str:
    parts = []
    if self.aggregator != 'mean':
      given = dict(self.aggregator_values)
      options = ', '.join(
          f'{field}={given[field]}'
          for field in options_lib.fields_of(
              aggregators.AGGREGATORS[self.aggregator].options
          )
          if field in given
      )
      parts.append(
          f'aggregator {self.aggregator}' + (f' ({options})' if options else '')
      )
    if self.adversary.on:
      parts.append(f'attack {self.adversary.attack}')
    return ''.join(f', {p}' for p in parts)


def _make_options(
    name: str, options: Any, values: dict[str, Any]
) -> tuple[Any, dict[str, Any]]:
  """`(options object, values left)` of algorithm `name`.

  `options` (None: the defaults) updated with option `values`; values that
  it cannot take (another algorithm's option, not at its default; an
  unknown algorithm) are left for `AlgorithmSpec.validate` to refuse.
  """
  entry = registry.ALGORITHMS.get(name)
  if entry is None:
    return options, values
  if not values:
    return (entry.options() if options is None else options), {}
  if options is not None:
    values = {**dataclasses.asdict(options), **values}
  own = options_lib.fields_of(entry.options)
  if any(
      k not in own and v != registry.default_of(k) for k, v in values.items()
  ):
    return None, values
  return entry.options(**{k: v for k, v in values.items() if k in own}), {}


def model_aggregator(
    spec: AlgorithmSpec,
) -> Optional[tff.aggregators.WeightedAggregationFactory]:
  """The `tff_algos.aggregators` factory named by the spec (None: mean)."""
  entry = aggregators.AGGREGATORS[spec.aggregator]
  return entry.build(spec.aggregator_options())


def update_attack(
    spec: AlgorithmSpec, *, clients_per_round: int
) -> Optional[attacks.UpdateAttack]:
  """The update-level attack of the spec (None for none / label_poison)."""
  return spec.adversary.update_attack(
      clients_per_round=clients_per_round,
      server_learning_rate=spec.optimization.server_learning_rate,
  )


def quantile_estimator(spec: AlgorithmSpec, clients_per_round: int = 0):
  """Delta-FL's quantile estimator of level 1 - theta named by the spec."""
  return spec.options.quantile_estimator(
      clients_per_round, spec.privacy.quantile_noise_stddev
  )


def context(
    spec: AlgorithmSpec,
    *,
    num_clients: int = 0,
    clients_per_round: int = 10,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_REDUCE
    ),
) -> options_lib.Context:
  """What the algorithm's factories get from the run-wide settings.

  The model aggregator is the DP mean when DP is on (its denominator the
  expected number of aggregated clients the algorithm gives), else the
  robust aggregator named by the spec (None: the mean).
  """

  def aggregator_fn(expected_clients: float):
    if spec.uses_dp:
      return dp_aggregation.build_dp_aggregator(
          spec.dp_options(), clients_per_round=float(expected_clients)
      )
    return model_aggregator(spec)

  optimization = spec.optimization
  return options_lib.Context(
      client_optimizer=optimization.client(),
      client_learning_rate=optimization.client_learning_rate,
      optimizer_fn=optimization.client,
      server_optimizer=_server_optimizer(spec),
      client_weighting=optimization.weighting,
      num_clients=num_clients,
      clients_per_round=clients_per_round,
      loop_implementation=loop_implementation,
      aggregator_fn=aggregator_fn,
      update_attack=update_attack(spec, clients_per_round=clients_per_round),
      quantile_noise_stddev=spec.privacy.quantile_noise_stddev,
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
  """The `LearningProcess` of `spec` for `model_fn` (its registry builder).

  AFL needs `num_clients`; `clients_per_round` sets the default A3 scale
  (-K / server lr) and is the DP mean's denominator (the expected number of
  clients). Ditto and the Fed+ family give a
  `stateful.StatefulClientsProcess`. `loop_implementation` goes to every
  builder that iterates local data with TFF's loop builder (all but AFL,
  q-FedSGD and the stateful ones).
  """
  spec.validate()
  if spec.uses_dp and clients_per_round < 1:
    raise ValueError('DP aggregation needs clients_per_round >= 1')
  return spec.entry.builder(
      spec.options,
      model_fn,
      context(
          spec,
          num_clients=num_clients,
          clients_per_round=clients_per_round,
          loop_implementation=loop_implementation,
      ),
  )


def _server_optimizer(spec: AlgorithmSpec) -> tff.learning.optimizers.Optimizer:
  if spec.optimization.server_optimizer == 'dp2':
    return spec.dp2.build(spec.optimization.server_learning_rate)
  return spec.optimization.server()
