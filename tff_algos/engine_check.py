# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Which engines run an algorithm with given options: one answer.

An engine runs an algorithm when its registry entry lists the engine
(`Algorithm.engines`, the algorithm's declaration), its options allow it
(`Options.check_engine`: e.g. Delta-FL's secure quantiles need TFF's
runtime) and, on the stacked engine, its round's client work is one the
engine computes on stacked weights (`stacked.check_definition`: e.g. Fed+
local steps over one read of the stream). `check` raises the first refusal
in that order's checks, `engines` lists the engines that run it; a
command line asks these, not the three checks apart.
"""

from collections.abc import Callable
from typing import Any

from tff_algos import options as options_lib
from tff_algos import registry
from tff_algos import stacked


class UndeclaredEngineError(ValueError):
  """The algorithm's entry does not list the engine.

  Attributes:
    engine: The engine asked for.
    algorithm: The algorithm's name.
    supported: The registered algorithms whose entries list the engine.
  """

  def __init__(self, engine: str, algorithm: str, supported: tuple[str, ...]):
    super().__init__(
        f'the {engine} engine runs {", ".join(supported)}, not {algorithm}'
    )
    self.engine = engine
    self.algorithm = algorithm
    self.supported = supported


def check(
    entry: options_lib.Algorithm,
    options: Any,
    definition_fn: Callable[[], Any],
    engine: str,
) -> None:
  """Raises if `engine` cannot run the algorithm with `options`.

  Args:
    entry: The algorithm's registry entry.
    options: Its options object.
    definition_fn: Builds its `AlgorithmDefinition` (asked only on the
      stacked engine, for an entry that also runs on the batched one).
    engine: One of `tff_algos.options.ENGINES`.

  Raises:
    ValueError: For an unknown engine.
    stacked.StackedEngineError: The stacked engine does not compute the
      definition's client work (the batched engine runs it).
    UndeclaredEngineError: The entry does not list the engine.
    options_lib.OptionError: The options need another engine.
  """
  if engine not in options_lib.ENGINES:
    raise ValueError(
        f'unknown engine {engine!r}; choose one of: '
        f'{", ".join(options_lib.ENGINES)}'
    )
  if engine == 'tff':
    return
  if engine == 'stacked' and 'batched' in entry.engines:
    stacked.check_definition(definition_fn())
  if engine not in entry.engines:
    raise UndeclaredEngineError(
        engine, entry.name, registry.engine_names(engine)
    )
  options.check_engine(engine)


def engines(
    entry: options_lib.Algorithm,
    options: Any,
    definition_fn: Callable[[], Any],
) -> tuple[str, ...]:
  """The engines that run the algorithm with `options` (`check` passes)."""
  running = []
  for engine in options_lib.ENGINES:
    try:
      check(entry, options, definition_fn, engine)
    except (ValueError, options_lib.OptionError):
      continue
    running.append(engine)
  return tuple(running)
