# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""How an algorithm declares its options and its entry in the registry.

An algorithm module declares:

* its options: a frozen dataclass deriving from `Options`, each field made
  with `option(default, help, low=..., high=..., choices=...)`: the default,
  the valid range and a one-line help, which `check_ranges` enforces and a
  command line can show;
* its `Algorithm` entry: the options class, the factory of its round math
  (`tff_algos.definition.AlgorithmDefinition`, run by the batched and
  stacked engines), the factory of its TFF `LearningProcess`, the engines
  that run it, whether clients keep state, and its tuned knob
  (`TunedOption`, the option a benchmark tunes and its default grid).

`tff_algos.registry` lists the entries. Errors name options by their field
names (`OptionError.options`); a command line adds its own flag wording.
"""

from collections.abc import Callable, Mapping
import dataclasses
import math
import typing
from typing import Any, Optional

import tensorflow_federated as tff

ENGINES = ('tff', 'batched', 'stacked')


class OptionError(ValueError):
  """A bad option value; `options` are the option names the message uses."""

  def __init__(self, message: str, *options: str):
    super().__init__(message)
    self.options = options


def option(
    default: Any,
    help: str,  # pylint: disable=redefined-builtin
    *,
    low: Optional[float] = None,
    high: Optional[float] = None,
    low_open: bool = False,
    high_open: bool = False,
    choices: tuple[str, ...] = (),
    flag: Optional[str] = None,
) -> Any:
  """A dataclass field with its default, valid range and one-line help.

  Args:
    default: The default value (None: not given).
    help: One line saying what the option does.
    low: The smallest valid value (None: no bound); numbers must be finite.
    high: The largest valid value (None: no bound).
    low_open: `low` itself is invalid.
    high_open: `high` itself is invalid.
    choices: The valid values of a string option.
    flag: The command-line flag that sets it, where it is not the option's
      name (tasks: `synthetic_alpha` sets `alpha`).

  Returns:
    A `dataclasses.field` whose metadata holds the above.
  """
  return dataclasses.field(  # pylint: disable=invalid-field-call
      default=default,
      metadata=dict(
          help=help,
          low=low,
          high=high,
          low_open=low_open,
          high_open=high_open,
          choices=choices,
          flag=flag,
      ),
  )


def flag_of(field: dataclasses.Field) -> str:
  """The command-line flag of a declared option."""
  return field.metadata.get('flag') or field.name


def _bound_text(value: float) -> str:
  """A bound as written: `1e-05`, `0.5`, `100`, `100,000`."""
  if float(value).is_integer() and abs(value) >= 1e4:
    return f'{int(value):,}'
  return f'{value:g}'


def range_text(meta: Mapping[str, Any]) -> str:
  """The valid range of a numeric option, e.g. '>= 0' or 'in (0, 1]'."""
  low, high = meta['low'], meta['high']
  if low is not None and high is not None:
    return (
        f'in {"(" if meta["low_open"] else "["}{_bound_text(low)}, '
        f'{_bound_text(high)}{")" if meta["high_open"] else "]"}'
    )
  if low is not None:
    return f'{">" if meta["low_open"] else ">="} {_bound_text(low)}'
  if high is not None:
    return f'{"<" if meta["high_open"] else "<="} {_bound_text(high)}'
  return 'finite'


def _in_range(value: float, meta: Mapping[str, Any]) -> bool:
  low, high = meta['low'], meta['high']
  if not math.isfinite(value):
    return False
  if low is not None and (value <= low if meta['low_open'] else value < low):
    return False
  return high is None or (value < high if meta['high_open'] else value <= high)


def check_value(name: str, value: Any, meta: Mapping[str, Any]) -> None:
  """Raises `OptionError` if `value` is outside the declared range."""
  if value is None or isinstance(value, bool):
    return
  if meta['choices']:
    if value not in meta['choices']:
      raise OptionError(
          f'unknown {name}={value!r}; choose one of: '
          f'{", ".join(meta["choices"])}',
          name,
      )
    return
  if isinstance(value, str) or (
      isinstance(value, tuple) and all(isinstance(v, str) for v in value)
  ):  # Free strings: their user checks them.
    return
  values = value if isinstance(value, tuple) else (value,)
  for v in values:
    if not isinstance(v, (int, float)):
      raise OptionError(f'{name} must be a number, got {v!r}', name)
    if not _in_range(float(v), meta):
      raise OptionError(f'{name} must be {range_text(meta)}, got {v}', name)


class Options:
  """Base of the options dataclasses: range checks and optional hooks."""

  def validate(self) -> None:
    """Raises `OptionError` for a value out of range or a bad combination."""
    self.check_ranges()
    self.check()

  def check_ranges(self) -> None:
    """Raises `OptionError` for a value outside its declared range."""
    for field in dataclasses.fields(self):  # pytype: disable=wrong-arg-types
      check_value(field.name, getattr(self, field.name), field.metadata)

  def check(self) -> None:
    """Checks combinations of options (raises `OptionError`)."""

  def check_run(self, settings: 'RunSettings') -> None:
    """Checks the options against the run-wide settings."""
    del settings

  def check_engine(self, engine: str) -> None:
    """Raises `OptionError` if `engine` cannot run these options."""
    del engine

  def describe(self, settings: 'RunSettings') -> str:
    """The options in a run's one-line description (', name=value...')."""
    del settings
    return ''

  @property
  def secure_intrinsics(self) -> bool:
    """Whether the process uses TFF's secure sums."""
    return False

  def validation_data_reason(self) -> Optional[str]:
    """Why the options need each client's validation data (None: they do
    not); the message names the options."""
    return None


def fields_of(options_class: type) -> dict[str, dataclasses.Field]:
  """The declared options of an options class, by name."""
  return {f.name: f for f in dataclasses.fields(options_class)}


def field_type(options_class: type, name: str) -> Any:
  """The declared type of an option (`Optional[X]` gives X; `tuple[X, ...]`
  gives tuple)."""
  hint = typing.get_type_hints(options_class)[name]
  args = [a for a in typing.get_args(hint) if a is not type(None)]  # pylint: disable=unidiomatic-typecheck
  if typing.get_origin(hint) is typing.Union and len(args) == 1:
    hint = args[0]
  return typing.get_origin(hint) or hint


def given(options: Options) -> list[str]:
  """The options whose value differs from their default."""
  return [
      f.name
      for f in dataclasses.fields(options)  # pytype: disable=wrong-arg-types
      if getattr(options, f.name) != f.default
  ]


@dataclasses.dataclass(frozen=True)
class TunedOption:
  """An option a benchmark tunes, with its default grid.

  Attributes:
    name: The option's name (a field of the algorithm's options).
    grid: The default values to try, increasing, inside [low, high].
    low: The smallest value the grid may reach when extended.
    high: The largest value the grid may reach when extended.
    log: The grid is log-spaced (extend by the grid's ratio).
    extend_low: The grid may be extended below its first value (when the
      best value is there), down to `low`.
    extend_high: The grid may be extended above its last value, up to
      `high`.
    line: Tuned along one line through the best configuration of the joint
      grid (the algorithm's first tuned option with the learning rate), as
      the server learning rate is: its other values at that configuration.
      A joint option has at least 5 values, a line at least 2.
    per_learning_rate: The grid holds `learning_rate * value`: the benchmark
      divides it by the centre of its learning-rate grid (Fed+'s sigma, whose
      paper advises kappa = 1 / (1 + learning_rate * sigma) in a range).
  """

  name: str
  grid: tuple[float, ...]
  low: float
  high: float
  log: bool = True
  extend_low: bool = True
  extend_high: bool = True
  line: bool = False
  per_learning_rate: bool = False

  def __post_init__(self):
    least = 2 if self.line else 5
    if len(self.grid) < least or list(self.grid) != sorted(set(self.grid)):
      raise ValueError(
          f'{self.name}: a tuned grid has at least {least} increasing '
          f'values, got {self.grid}'
      )
    if not self.low <= self.grid[0] or not self.grid[-1] <= self.high:
      raise ValueError(
          f'{self.name}: grid {self.grid} outside [{self.low}, {self.high}]'
      )
    if self.log and self.grid[0] <= 0:
      raise ValueError(f'{self.name}: a log grid is positive')

  def values(self, centre_learning_rate: float) -> tuple[float, ...]:
    """The grid for a benchmark whose learning rates centre on the given
    one (2 significant digits where scaled)."""
    if not self.per_learning_rate:
      return tuple(self.grid)
    return tuple(float(f'{v / centre_learning_rate:.2g}') for v in self.grid)


@dataclasses.dataclass(frozen=True)
class RunSettings:
  """The run-wide settings that options may be checked against.

  Attributes:
    optimization: The run's optimizers and client weighting
      (`tff_algos.optimizers.OptimizerOptions`).
    aggregator: The model aggregator's name (`tff_algos.aggregators`).
    uses_dp: DP aggregation is on.
    quantile_noise_stddev: Noise on a private quantile's counts.
  """

  optimization: Any
  aggregator: str = 'mean'
  uses_dp: bool = False
  quantile_noise_stddev: float = 0.0


def _no_aggregator(expected_clients: float) -> None:
  """No aggregator of the algorithm's own (the run-wide one applies)."""
  del expected_clients


@dataclasses.dataclass(frozen=True)
class Context:
  """What a run gives an algorithm's factories besides its options.

  Attributes:
    client_optimizer: The client optimizer.
    client_learning_rate: Its learning rate (the step of algorithms with
      plain local steps, and q-FFL's default L = 1 / lr).
    optimizer_fn: The client optimizer's kind at another learning rate.
    server_optimizer: The server optimizer (None: SGD with lr 1.0).
    client_weighting: The weighting of the mean of client updates.
    num_clients: The population (AFL's mixture size).
    clients_per_round: Clients per round (the default quantile noise
      scale).
    loop_implementation: How TFF's client loops iterate local data.
    aggregator_fn: The model aggregator (None: the mean) for the given
      expected number of aggregated clients (a DP mean's denominator).
    update_attack: A `tff_algos.attacks.UpdateAttack`, or None.
    quantile_noise_stddev: Noise on a private quantile's counts.
  """

  client_optimizer: tff.learning.optimizers.Optimizer
  client_learning_rate: float
  optimizer_fn: Callable[[float], tff.learning.optimizers.Optimizer]
  server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None
  client_weighting: tff.learning.ClientWeighting = (
      tff.learning.ClientWeighting.NUM_EXAMPLES
  )
  num_clients: int = 0
  clients_per_round: int = 10
  loop_implementation: tff.learning.LoopImplementation = (
      tff.learning.LoopImplementation.DATASET_REDUCE
  )
  aggregator_fn: Callable[[float], Any] = _no_aggregator
  update_attack: Any = None
  quantile_noise_stddev: float = 0.0

  def aggregation(self, expected_clients: float) -> dict[str, Any]:
    """The `model_aggregator` and `update_attack` builder arguments."""
    return dict(
        model_aggregator=self.aggregator_fn(expected_clients),
        update_attack=self.update_attack,
    )


@dataclasses.dataclass(frozen=True)
class Algorithm:
  """An algorithm's entry in the registry.

  Attributes:
    name: Its name (`tff_algos.registry.ALGORITHMS` key).
    options: Its options class (a frozen dataclass deriving from `Options`).
    definition: `(options, Context) -> AlgorithmDefinition`, its round math
      for the batched and stacked engines.
    builder: `(options, model_fn, Context) -> LearningProcess`.
    engines: The engines that run it (of `ENGINES`).
    stateful: Clients keep a state across rounds (personal models).
    tuned: The option a benchmark tunes jointly with the learning rate
      (None: nothing to tune).
    lines: Further options a benchmark tunes, each along a line through the
      best joint configuration (`TunedOption.line`).
    aggregators: Takes a robust model aggregator and update attacks.
    dp: Takes a DP mean aggregator.
    own_weighting: Weighs clients by its own rule (the run-wide client
      weighting does not apply, and a binary refuses it rather than ignore
      it).
    uniform_option: With `own_weighting`, the boolean option that makes its
      rule weigh clients uniformly instead of by examples (a benchmark tunes
      it as it tunes the run-wide weighting); empty: none.
    drops_stragglers: Stragglers' partial work is dropped.
    own_server_step: Empty when the run's server optimizer applies the
      aggregate; else the algorithm's own server step, described (the
      server optimizer settings are then refused, never ignored).
    example: Options of a representative run (timing benchmarks).
    label: Its name in tables (default: `name`).
    in_benchmark: The tail benchmark runs it (with its tuned options).
    client_index: Its clients' data carry the client's index (AFL's mixture
      weights), which a TFF 0.87 program cannot pass per client.
    engine_notes: What its row of the engines table (docs/performance.md,
      `tools.option_table`) adds to "yes": by engine (of `ENGINES`), what
      that engine runs of it; under `tff_only`, its options that only the
      TFF path runs.
  """

  name: str
  options: type
  definition: Callable[[Any, Context], Any]
  builder: Callable[[Any, Any, Context], Any]
  engines: tuple[str, ...] = ENGINES
  stateful: bool = False
  tuned: Optional[TunedOption] = None
  lines: tuple[TunedOption, ...] = ()
  aggregators: bool = False
  dp: bool = False
  own_weighting: bool = False
  uniform_option: str = ''
  drops_stragglers: bool = False
  own_server_step: str = ''
  example: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  label: str = ''
  in_benchmark: bool = True
  client_index: bool = False
  engine_notes: Mapping[str, str] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    unknown = set(self.engines) - set(ENGINES)
    if unknown or 'tff' not in self.engines:
      raise ValueError(
          f'{self.name}: engines are tff and any of batched, stacked; got '
          f'{self.engines}'
      )
    names = fields_of(self.options)
    if self.tuned is not None and self.tuned.name not in names:
      raise ValueError(f'{self.name}: tuned option {self.tuned.name} unknown')
    if self.tuned is not None and self.tuned.line:
      raise ValueError(f'{self.name}: {self.tuned.name} is a line, not joint')
    for line in self.lines:
      if line.name not in names or not line.line:
        raise ValueError(
            f'{self.name}: line option {line.name} unknown or not a line'
        )
    if self.uniform_option and (
        not self.own_weighting
        or self.uniform_option not in names
        or names[self.uniform_option].default is not False
    ):
      raise ValueError(
          f'{self.name}: uniform option {self.uniform_option} is not a '
          'boolean option off by default of an own_weighting algorithm'
      )
    for key in self.example:
      if key not in names:
        raise ValueError(f'{self.name}: example option {key} unknown')
    unknown = set(self.engine_notes) - {*self.engines, 'tff_only'}
    if unknown:
      raise ValueError(
          f'{self.name}: engine notes for {sorted(unknown)}: notes are by '
          "engine it runs on, or 'tff_only'"
      )


class AggregatorOptions(Options):
  """Base of an aggregator's options."""

  def check_clients(self, clients_per_round: int) -> None:
    """Raises `OptionError` if the options cannot aggregate this many
    clients a round (the message names the options and
    `clients_per_round`)."""
    del clients_per_round


@dataclasses.dataclass(frozen=True)
class Aggregator:
  """A model aggregator's entry (`tff_algos.aggregators.AGGREGATORS`).

  Attributes:
    name: Its name (`aggregator` of a run).
    options: Its options class (a frozen dataclass deriving from
      `AggregatorOptions`; `check` states what it needs, e.g. Krum its number
      of corrupted clients, `check_clients` what it needs of the clients per
      round). Option names are unique across aggregators.
    build: `build(options)` gives its
      `tff.aggregators.WeightedAggregationFactory` (None: the weighted mean
      of the algorithm's builder).
    summary: What it aggregates to, in a few words.
  """

  name: str
  options: type
  build: Callable[[Any], Any]
  summary: str

  def __post_init__(self):
    if not (
        isinstance(self.options, type)
        and issubclass(self.options, AggregatorOptions)
        and dataclasses.is_dataclass(self.options)
    ):
      raise TypeError(
          f'aggregator {self.name!r}: options must be an AggregatorOptions '
          f'dataclass, got {self.options!r}'
      )
