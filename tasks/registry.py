# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tasks by name, for the binaries and for Python users.

Each task module declares its options and its `tasks.options.Task` entry;
`TASKS` lists the entries, and `table()` is the table below (a test checks
it):

| name                   | data                                 | model |
|------------------------|--------------------------------------|-------|
| `synthetic`            | Synthetic(alpha, beta), built in     | softmax regression 60x10 |
| `synthetic_iid`        | Synthetic-IID, built in              | softmax regression 60x10 |
| `emnist_character`     | `emnist_all.sqlite` in data_dir      | linear / convnet / cnn_dropout / cnn / 2nn |
| `shakespeare_character` | `shakespeare.sqlite` in data_dir     | TFF's character LSTM |
| `stackoverflow_word`   | `stackoverflow.sqlite` + word counts | TFF's next-word LSTM |
| `stackoverflow_tag`    | `stackoverflow.sqlite` + counts      | TFF's tag logistic regression |
| `shakespeare_leaf`     | `shakespeare.sqlite` in data_dir, LEAF windows | the seeds' GRU / LSTM (`preset`: deltafl, qffl, fedprox) |
| `fedplus_regression`   | Fed+ section 5.1 synthetic regression, built in | linear regression (MSE) |
| `leaf`                 | LEAF JSON (train/, test/) in leaf_dir | LEAF's CNN, stacked LSTMs, bag of words |

Every data-file task also runs offline on TFF's synthetic stand-in data
(`use_synthetic_data=True`).
"""

import dataclasses
from typing import Any

from tasks import base
from tasks import emnist
from tasks import fedplus_regression
from tasks import leaf
from tasks import options as task_options
from tasks import shakespeare
from tasks import shakespeare_leaf
from tasks import stackoverflow
from tasks import synthetic
from tff_algos import options as options_lib

TASKS: dict[str, task_options.Task] = {
    task.name: task
    for task in (
        synthetic.TASK,
        synthetic.IID_TASK,
        emnist.TASK,
        shakespeare.TASK,
        stackoverflow.WORD_TASK,
        stackoverflow.TAG_TASK,
        shakespeare_leaf.TASK,
        fedplus_regression.TASK,
        leaf.TASK,
    )
}
TASK_NAMES = tuple(TASKS)


def register(task: task_options.Task) -> None:
  """Adds a task to the table (raises `ValueError` if it cannot join it).

  Its options become flags of the binaries that read the table after this
  (`run.train.define_task_flags`).
  """
  global TASK_NAMES  # pylint: disable=global-statement
  if task.name in TASKS:
    raise ValueError(f'task {task.name!r} is already registered')
  TASKS[task.name] = task
  try:
    option_flags()
  except TypeError as e:
    del TASKS[task.name]
    raise ValueError(f'task {task.name!r}: {e}') from None
  TASK_NAMES = tuple(TASKS)


def unregister(name: str) -> None:
  """Removes a registered task (tests)."""
  global TASK_NAMES  # pylint: disable=global-statement
  del TASKS[name]
  TASK_NAMES = tuple(TASKS)


def entry(name: str) -> task_options.Task:
  """The entry of the task `name`.

  Raises:
    TaskError: For an unknown name.
  """
  if name not in TASKS:
    raise base.TaskError(
        f'unknown task {name!r}; choose one of: {", ".join(TASK_NAMES)}'
    )
  return TASKS[name]


@dataclasses.dataclass(frozen=True)
class TaskFlag:
  """The command-line flag of one or more tasks' option.

  Attributes:
    name: The flag.
    kind: Its type (`bool`, `int`, `float` or `str`).
    default: Its default (the first declaring task's).
    help: The option's help, the tasks it applies to and any task whose
      default differs.
    owners: The tasks that take it.
    field: The first declaring task's option.
    other_defaults: `(task, default)` of the tasks whose default differs.
  """

  name: str
  kind: type
  default: Any
  help: str
  owners: tuple[str, ...]
  field: dataclasses.Field
  other_defaults: tuple[tuple[str, Any], ...] = ()


def option_flags() -> dict[str, TaskFlag]:
  """The flag of every task option, by flag (in the registry's order).

  Raises:
    TypeError: If two tasks declare one flag with different types.
  """
  declared: dict[str, list[tuple[str, type, dataclasses.Field]]] = {}
  for task in TASKS.values():
    for field in dataclasses.fields(task.options):
      kind = options_lib.field_type(task.options, field.name)
      declared.setdefault(options_lib.flag_of(field), []).append(
          (task.name, kind, field)
      )
  out = {}
  for flag, declarations in declared.items():
    _, kind, first = declarations[0]
    if any(k is not kind for _, k, _ in declarations):
      raise TypeError(f'tasks declare --{flag} with different types')
    owners = tuple(name for name, _, _ in declarations)
    others = tuple(
        (name, field.default)
        for name, _, field in declarations
        if field.default != first.default
    )
    tasks = ', '.join(owners) + ''.join(
        f'; {name}: default {default}' for name, default in others
    )
    out[flag] = TaskFlag(
        name=flag,
        kind=kind,
        default=first.default,
        help=f'{first.metadata["help"]} [{tasks}]',
        owners=owners,
        field=first,
        other_defaults=others,
    )
  return out


def table() -> str:
  """The table of the tasks, as in this module's docstring."""
  rows = [
      f'| {"name":<22} | {"data":<36} | model |',
      f'|{"-" * 24}|{"-" * 38}|-------|',
  ]
  for task in TASKS.values():
    name = f'`{task.name}`'
    rows.append(f'| {name:<22} | {task.data:<36} | {task.model} |')
  return '\n'.join(rows)


def create_task(name: str, **kwargs: Any) -> base.FederatedTask:
  """Builds the task `name` with its keyword arguments.

  Args:
    name: One of `TASK_NAMES`.
    **kwargs: The task's builder arguments: its options' `task_kwargs()`,
      `seed` and `batch_size` (and `model_seed` where the entry takes it).

  Returns:
    The `FederatedTask`.

  Raises:
    TaskError: For an unknown name or bad arguments.
  """
  return entry(name).create(**kwargs)
