# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The training binaries' flags, made from the declarations.

One flag per declared option: each registered algorithm's options
(`tff_algos.registry`), the run's parts (`run.algorithms.PARTS`,
`run.run_options.RUN_PARTS`), each aggregator's options
(`tff_algos.aggregators`) and each task option (`tasks.registry`), its
default and help the declaration's. `DeclaredFlags.define` makes the flags
not made yet (an entry registered later gets its flags on the next call) as
key flags of the binary's module, so that its `config.json` holds them
(`run.train.hparams`); the other methods read the values back by option
name.
"""

import sys
from typing import Any

from absl import flags

from run import algorithms
from run import run_options
from tasks import registry as task_registry
from tff_algos import aggregators
from tff_algos import options as options_lib
from tff_algos import registry

_DEFINE = {
    float: flags.DEFINE_float,
    int: flags.DEFINE_integer,
    bool: flags.DEFINE_boolean,
    str: flags.DEFINE_string,
    tuple: flags.DEFINE_list,
}
# The run's declared parts, in the order of their flags.
PARTS = (*algorithms.PARTS.values(), *run_options.RUN_PARTS.values())


class DeclaredFlags:
  """The flags of the declared options, made for one binary's module.

  Attributes:
    algorithm: The algorithm options' flags, by option name.
    parts: Each part's flags (`PARTS`), by part and option name.
    aggregator: The aggregator options' flags, by option name.
    task: The task options' flags, by flag name.
  """

  def __init__(self, module_name: str):
    # absl files the flags of `python -m module` under sys.argv[0], not
    # '__main__' (`FlagValues.get_key_flags_for_module`): register them
    # there, or --help and the binary's settings would leave them out.
    self._module_name = (
        sys.argv[0] if module_name == '__main__' else module_name
    )
    self.algorithm: dict[str, flags.FlagHolder] = {}
    self.parts: dict[type, dict[str, flags.FlagHolder]] = {}
    self.aggregator: dict[str, flags.FlagHolder] = {}
    self.task: dict[str, flags.FlagHolder] = {}

  def _flag(self, kind: type, name: str, default, help_text: str):
    if kind is tuple and default is not None:
      default = list(default)
    return _DEFINE[kind](
        name, default, help_text, module_name=self._module_name
    )

  def define(self) -> None:
    """Makes a flag for each declared option that has none yet."""
    for name, field in registry.all_options().items():
      if name not in self.algorithm:
        owners = ', '.join(registry.owners(name))
        self.algorithm[name] = self._flag(
            registry.option_type(name),
            name,
            field.default,
            f'{field.metadata["help"]} [{owners}]',
        )
    for part in PARTS:
      if part not in self.parts:
        self.parts[part] = {
            name: self._flag(
                options_lib.field_type(part, name),
                options_lib.flag_of(field),
                field.default,
                field.metadata['help'],
            )
            for name, field in options_lib.fields_of(part).items()
        }
    for entry in aggregators.AGGREGATORS.values():
      for name, field in options_lib.fields_of(entry.options).items():
        if name not in self.aggregator:
          self.aggregator[name] = self._flag(
              options_lib.field_type(entry.options, name),
              name,
              field.default,
              f'{entry.name}: {field.metadata["help"]}',
          )
    for name, flag in task_registry.option_flags().items():
      if name not in self.task:
        self.task[name] = self._flag(flag.kind, name, flag.default, flag.help)

  def algorithm_values(self) -> dict[str, Any]:
    """The algorithm options' values by name (lists parsed as numbers).

    Raises:
      run_options.UsageError: A list flag holds something else.
    """
    values = {}
    for name, holder in self.algorithm.items():
      value = holder.value
      if isinstance(value, list):
        try:
          value = tuple(float(v) for v in value)
        except ValueError:
          raise run_options.UsageError(
              f'--{name} must be a comma-separated list of numbers, got '
              f'{",".join(value)!r}'
          ) from None
      values[name] = value
    return values

  def part_values(self, *parts: type) -> dict[str, Any]:
    """The options of `parts` (default: the algorithm's parts,
    `algorithms.PARTS`) by option name; lists as tuples."""
    values = {}
    for part in parts or algorithms.PARTS.values():
      for name, holder in self.parts[part].items():
        value = holder.value
        values[name] = tuple(value) if isinstance(value, list) else value
    return values

  def aggregator_values(self) -> tuple[tuple[str, Any], ...]:
    """The aggregator options' values as (name, value) pairs."""
    return tuple((name, h.value) for name, h in self.aggregator.items())
