# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The algorithms by name: one table of `tff_algos.options.Algorithm` entries.

Each entry is declared in its algorithm's module, next to its options,
definition and builder; this table lists them. Adding an algorithm is one
module and one line here (or `register(entry)` from outside the package).
What runs an algorithm (a command line, the engines, a benchmark) reads its
options, engines, statefulness and tuned knob from here.

The entries are the only list: the tables of their options (docs/usage.md)
and engines (docs/performance.md) are generated from them
by `tools.option_table`, and a test checks each.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

from tff_algos import afl
from tff_algos import delta_fl
from tff_algos import ditto
from tff_algos import fed_avg
from tff_algos import fed_plus
from tff_algos import fed_prox
from tff_algos import options as options_lib
from tff_algos import q_ffl
from tff_algos import term

OptionError = options_lib.OptionError

ALGORITHMS: dict[str, options_lib.Algorithm] = {
    entry.name: entry
    for entry in (
        fed_avg.ALGORITHM,
        fed_prox.ALGORITHM,
        q_ffl.QFFL,
        q_ffl.QFEDSGD,
        term.ALGORITHM,
        afl.ALGORITHM,
        delta_fl.ALGORITHM,
        ditto.ALGORITHM,
        *fed_plus.ALGORITHMS,
    )
}


def register(entry: options_lib.Algorithm) -> None:
  """Adds an algorithm to the table (raises `ValueError` if taken)."""
  if entry.name in ALGORITHMS:
    raise ValueError(f'algorithm {entry.name!r} is already registered')
  for name, field in options_lib.fields_of(entry.options).items():
    others = owners(name)
    if others and field.default != default_of(name):
      raise ValueError(
          f'{entry.name}: option {name} has another default in '
          f'{", ".join(others)}'
      )
  ALGORITHMS[entry.name] = entry


def unregister(name: str) -> None:
  """Removes an algorithm registered with `register`."""
  ALGORITHMS.pop(name)


def names() -> tuple[str, ...]:
  return tuple(ALGORITHMS)


def get(name: str) -> options_lib.Algorithm:
  """The entry of `name`; raises `OptionError` for an unknown name."""
  if name not in ALGORITHMS:
    raise OptionError(
        f'unknown algorithm {name!r}; choose one of: {", ".join(ALGORITHMS)}'
    )
  return ALGORITHMS[name]


def all_options() -> dict[str, dataclasses.Field]:
  """Every algorithm's options by name (a shared name, once)."""
  out = {}
  for entry in ALGORITHMS.values():
    for name, field in options_lib.fields_of(entry.options).items():
      out.setdefault(name, field)
  return out


def owners(option: str) -> tuple[str, ...]:
  """The algorithms that take `option`."""
  return tuple(
      entry.name
      for entry in ALGORITHMS.values()
      if option in options_lib.fields_of(entry.options)
  )


def option_type(option: str) -> Any:
  """The declared type of `option` (`Optional[X]` gives X; `tuple[X, ...]`
  gives tuple)."""
  return options_lib.field_type(get(owners(option)[0]).options, option)


def default_of(option: str) -> Any:
  return all_options()[option].default


def _listing(names_: tuple[str, ...]) -> str:
  if len(names_) == 1:
    return f'{names_[0]} only'
  return f'{", ".join(names_[:-1])} and {names_[-1]}'


def options_from_values(name: str, values: Mapping[str, Any]) -> Any:
  """The options object of algorithm `name` from option values by name.

  Values of other algorithms' options are refused unless they are those
  options' defaults (not given). Raises `OptionError` (unknown algorithm,
  an option given to the wrong algorithm, a value out of range) or
  `TypeError` (an option no algorithm has).
  """
  entry = get(name)
  own = options_lib.fields_of(entry.options)
  known = all_options()
  for key, value in values.items():
    if key not in known:
      raise TypeError(f'no algorithm has an option {key!r}')
    if key not in own and value != known[key].default:
      raise OptionError(
          f'{key} applies to {_listing(owners(key))}, not {name}', key
      )
  options = entry.options(**{k: v for k, v in values.items() if k in own})
  options.validate()
  return options


def check_options(name: str, options: Any) -> None:
  """Raises `OptionError` if `options` are not a valid options object of
  algorithm `name`."""
  entry = get(name)
  if not isinstance(options, entry.options):
    raise OptionError(
        f'{name} takes {entry.options.__name__}, got {type(options).__name__}'
    )
  options.validate()


def engine_names(engine: str) -> tuple[str, ...]:
  """The algorithms `engine` runs."""
  return tuple(e.name for e in ALGORITHMS.values() if engine in e.engines)
