# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The task of a training binary's flags: its options, arguments and data.

`run.train` defines one flag per declared task option (`tasks.registry`);
this module reads them for the task `--task` names: a flag given for a task
that does not take it is refused, values are checked against their
declarations and the task's own rules, and the task is built (downloaded
first where `--download` asks) with its holdout parts.
"""

from absl import flags

from run import algorithms
from run import run_options
from tasks import download
from tasks import holdout
from tasks import options as task_options_lib
from tasks import registry
from tff_algos import options as options_lib

UsageError = run_options.UsageError


def entry(name: str) -> task_options_lib.Task:
  """The registry entry of task `name`."""
  if name not in registry.TASKS:
    raise UsageError(
        f'unknown --task={name!r}; choose one of: '
        f'{", ".join(registry.TASK_NAMES)}'
    )
  return registry.TASKS[name]


def options(name: str, *, downloads: bool) -> task_options_lib.TaskOptions:
  """The options of task `name` from its flags, checked.

  An option takes its flag's value when the flag is given and its own
  default otherwise (a flag shared by tasks has one default). A task flag
  given for a task that does not take it is refused, naming the tasks it
  applies to; so is `downloads` (`--download`) for a task with no files.
  """
  task = entry(name)
  own = task.flags()
  for flag_name, flag in registry.option_flags().items():
    if flags.FLAGS[flag_name].present and flag_name not in own.values():
      raise UsageError(
          f'--{flag_name} applies to --task={", ".join(flag.owners)}, not '
          f'--task={task.name}'
      )
  if downloads and not download.files_for_task(task.name):
    readers = [t for t in registry.TASK_NAMES if download.files_for_task(t)]
    raise UsageError(
        "--download applies to the tasks read from TFF's files "
        f'({", ".join(readers)}), not --task={task.name}'
    )
  fields = options_lib.fields_of(task.options)
  values = task.options(
      **{
          option: flags.FLAGS[flag].value
          if flags.FLAGS[flag].present
          else fields[option].default
          for option, flag in own.items()
      }
  )
  try:
    values.check_ranges()
  except options_lib.OptionError as e:
    raise UsageError(algorithms.word_as_flags(e, own)) from None
  try:
    values.check()
  except options_lib.OptionError as e:
    raise UsageError(
        f'--task={task.name} {algorithms.word_as_flags(e, own)}'
    ) from None
  return values


def kwargs(
    name: str,
    task_options: task_options_lib.TaskOptions,
    schedule: run_options.ScheduleOptions,
) -> dict:
  """Arguments of `tasks.registry.create_task` for task `name`."""
  arguments = {
      'seed': schedule.task_seed,
      'batch_size': schedule.client_batch_size,
      **task_options.task_kwargs(),
  }
  if entry(name).model_seed and schedule.data_seed is not None:
    arguments['model_seed'] = schedule.seed
  return arguments


def build(config: run_options.RunConfig):
  """The task of `config`, with its holdout parts (downloaded first where
  `--download` asks)."""
  arguments = kwargs(config.task, config.task_options, config.schedule)
  data = config.data
  if data.download and not arguments['use_synthetic_data']:
    download.ensure(
        download.files_for_task(config.task),
        arguments['data_dir'],
        progress=config.output.progress,
    )
  task = registry.create_task(config.task, **arguments)
  if data.holdout != 'none':
    task = holdout.with_holdout(
        task,
        validation_fraction=data.holdout_validation_fraction,
        test_fraction=data.holdout_test_fraction,
        evaluate_on=data.holdout,
    )
  return task


def num_classes_for_attack(
    attack: str, name: str, task_options: task_options_lib.TaskOptions
) -> int:
  """Label classes for --attack=label_poison (0 when not poisoning)."""
  if attack != 'label_poison':
    return 0
  task = entry(name)
  if task.label_classes is None:
    classifiers = [
        t.name for t in registry.TASKS.values() if t.label_classes is not None
    ]
    raise UsageError(
        '--attack=label_poison applies to the classification tasks '
        f'({", ".join(classifiers)}), not {task.name}'
    )
  return task.label_classes(task_options)
