# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""How a task declares its options and its entry in the registry.

A task module declares, as an algorithm module does (`tff_algos.options`):

* its options: a frozen dataclass deriving from `TaskOptions`, each field
  made with `tff_algos.options.option(default, help, low=..., flag=...)`; the
  field names are its `create_task` keyword arguments, `flag` the
  command-line flag where it differs (`synthetic_alpha` sets `alpha`). The
  shared parts are mixins: `DataFiles` (TFF's dataset files) and
  `ClientChoice` (which clients, and which are held out unseen);
* its `Task` entry: the name, the options class, the builder and its traits.

`tasks.registry` lists the entries, and a command line makes one flag per
declared option (`run.train`): a flag shared by several tasks is one flag,
given to the task the run names, and refused, with the tasks it applies to,
when given for another.
"""

from collections.abc import Callable
import dataclasses
from typing import Any, Optional

from tff_algos import options as options_lib

option = options_lib.option
OptionError = options_lib.OptionError


@dataclasses.dataclass(frozen=True)
class TaskOptions(options_lib.Options):
  """Base of a task's options: range checks and its builder's arguments."""

  def task_kwargs(self) -> dict[str, Any]:
    """The builder's keyword arguments (every option, unless overridden)."""
    return {
        f.name: getattr(self, f.name)
        for f in dataclasses.fields(self)  # pytype: disable=wrong-arg-types
    }


@dataclasses.dataclass(frozen=True)
class DataFiles(TaskOptions):
  """Options of a task read from TFF's dataset files."""

  data_dir: Optional[str] = option(
      None, "Folder with TFF's cached dataset files (~/.tff)."
  )
  use_synthetic_data: bool = option(
      False, "Use TFF's small synthetic stand-in data instead of files."
  )
  max_clients: Optional[int] = option(
      None, 'Keep at most this many clients.', low=1
  )

  def check(self) -> None:
    if not self.use_synthetic_data and not self.data_dir:
      raise OptionError(
          'reads TFF dataset files: pass data_dir (the folder holding them), '
          'or use_synthetic_data',
          'data_dir',
          'use_synthetic_data',
      )


def unseen_clients_option() -> Any:
  """The `test_clients_fraction` option (the Delta-FL protocol's unseen
  clients), as every task taking it declares it."""
  return option(
      0.0,
      'Evaluate on this fraction of unseen clients, the Delta-FL protocol (0: '
      "each client's own test split).",
      low=0,
      high=1,
      high_open=True,
  )


@dataclasses.dataclass(frozen=True)
class ClientChoice(TaskOptions):
  """Options choosing a file task's clients and its unseen ones."""

  min_examples: int = option(0, 'Drop clients with fewer examples.', low=0)
  test_clients_fraction: float = unseen_clients_option()


@dataclasses.dataclass(frozen=True)
class Task:
  """A task's registry entry.

  Attributes:
    name: Its registry name (`--task`).
    data: What data it reads, in a few words.
    model: Its model(s), in a few words.
    options: Its `TaskOptions` dataclass.
    create: Its builder: `create(**options.task_kwargs(), seed=..,
      batch_size=..)` returns the `tasks.base.FederatedTask`.
    label_classes: For classification tasks, the number of label classes
      under `options` (label-poisoning attacks); None: not a classification
      task.
    model_seed: The builder takes `model_seed` (its model's initialization
      apart from the data's seed).
  """

  name: str
  data: str
  model: str
  options: type
  create: Callable[..., Any]
  label_classes: Optional[Callable[[Any], int]] = None
  model_seed: bool = False

  def __post_init__(self):
    if not (
        isinstance(self.options, type)
        and issubclass(self.options, TaskOptions)
        and dataclasses.is_dataclass(self.options)
    ):
      raise TypeError(
          f'task {self.name!r}: options must be a TaskOptions dataclass, got '
          f'{self.options!r}'
      )

  def flags(self) -> dict[str, str]:
    """The flag of each option, by option name."""
    return {
        name: options_lib.flag_of(field)
        for name, field in options_lib.fields_of(self.options).items()
    }
