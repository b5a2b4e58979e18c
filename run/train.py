# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""Trains a federated algorithm on a task and reports per-client tail metrics.

Example (built-in data, no files needed):

  tff-hetero-train --task=synthetic --algorithm=fedprox \
      --proximal_strength=1.0 --total_rounds=100 --clients_per_round=10 \
      --client_learning_rate=0.01 --experiment_name=prox

Flags follow google-research/federated. Outputs go to
`<root_output_dir>/<experiment_name>/` (see `run.simulation`); running the
same command again resumes from the last checkpoint there.
"""

import errno
import os
import sys
import typing
from typing import Any, Optional

if not (3, 9) <= sys.version_info[:2] <= (3, 11):
  sys.exit(
      'error: tff-hetero needs Python 3.9, 3.10 or 3.11 (TensorFlow Federated'
      f' 0.87 supports no other); this is Python {sys.version.split()[0]}.'
  )
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
from absl import logging

from run import algorithms
from run import console
from run import privacy_setup
from run import contexts
from run import engines
from run import run_dir
from run import simulation
from tasks import base as task_base
from tasks import download
from tasks import holdout
from tasks import options as task_options_lib
from tasks import registry
from tff_algos import aggregators
from tff_algos import attacks
from tff_algos import options as options_lib
from tff_algos import registry as algorithm_registry
from tff_algos import runtime

# pylint: enable=g-import-not-at-top,wrong-import-position

_TASK = flags.DEFINE_string(
    'task', 'synthetic', f'Task: one of {", ".join(registry.TASK_NAMES)}.'
)
_ALGORITHM = flags.DEFINE_string(
    'algorithm',
    'fedavg',
    f'Algorithm: one of {", ".join(algorithm_registry.names())}.',
)
_TOTAL_ROUNDS = flags.DEFINE_integer('total_rounds', 100, 'Training rounds.')
_CLIENTS_PER_ROUND = flags.DEFINE_integer(
    'clients_per_round', 10, 'Clients selected per round.'
)
_EPOCHS = flags.DEFINE_integer(
    'client_epochs_per_round', 1, 'Local epochs E per round.'
)
_BATCH_SIZE = flags.DEFINE_integer('client_batch_size', 10, 'Local batch.')
_CLIENT_OPT = flags.DEFINE_string(
    'client_optimizer',
    'sgd',
    f'Client optimizer: {", ".join(algorithms.OPTIMIZERS)}.',
)
_CLIENT_LR = flags.DEFINE_float('client_learning_rate', 0.01, 'Client lr.')
_SERVER_OPT = flags.DEFINE_string(
    'server_optimizer',
    'sgd',
    f'Server optimizer: {", ".join(algorithms.SERVER_OPTIMIZERS)} (dp2: '
    'DP^2-RMSProp on the aggregated update, --server_learning_rate in its '
    'SGD phase).',
)
_SERVER_LR = flags.DEFINE_float(
    'server_learning_rate',
    1.0,
    'Server lr (1.0 with sgd: the new model is the average of local models).',
)
_SERVER_MOMENTUM = flags.DEFINE_float(
    'server_sgd_momentum', 0.0, 'Server SGD momentum.'
)
_WEIGHTING = flags.DEFINE_string(
    'client_weighting',
    'num_examples',
    f'Aggregation weights of {", ".join(algorithms.weighted_algorithms())}:'
    ' num_examples or uniform (the others weigh clients by their own rule '
    'and refuse it).',
)
_SAMPLING = flags.DEFINE_string(
    'client_sampling',
    'uniform',
    'Client sampling: uniform (fixed number without replacement), examples '
    '(probability proportional to size) or poisson (each client with '
    'probability clients_per_round / N).',
)
_ROUNDS_PER_EVAL = flags.DEFINE_integer(
    'rounds_per_eval', 10, 'Per-client evaluation period (0: only at end).'
)
_ROUNDS_PER_CHECKPOINT = flags.DEFINE_integer(
    'rounds_per_checkpoint', 10, 'Checkpoint period (0: only at the end).'
)
_ROOT = flags.DEFINE_string(
    'root_output_dir', 'output', 'Root folder of all experiments.'
)
_EXPERIMENT = flags.DEFINE_string(
    'experiment_name',
    None,
    'Output sub-folder (default: <task>_<algorithm>_seed<seed>).',
)
_SEED = flags.DEFINE_integer(
    'seed',
    0,
    'Seed of sampling, shuffles and model initialisation; also of the data '
    'unless --data_seed is given.',
)
_DATA_SEED = flags.DEFINE_integer(
    'data_seed',
    None,
    'Seed of the data: generated data, the chosen clients and their splits '
    '(unseen clients, per-client parts). Default: --seed. Runs that share '
    'it share their clients whatever their --seed (the tail benchmark).',
)


_DEFINE = {
    float: flags.DEFINE_float,
    int: flags.DEFINE_integer,
    bool: flags.DEFINE_boolean,
    str: flags.DEFINE_string,
    tuple: flags.DEFINE_list,
}
# One flag per algorithm option (`tff_algos.registry`), by option name.
_OPTION_FLAGS: dict[str, flags.FlagHolder] = {}


def define_algorithm_flags() -> None:
  """Defines a flag per option of the registered algorithms (new ones only).

  Its default, help and the algorithms it applies to come from the option's
  declaration; values are checked by the algorithm's options
  (`AlgorithmSpec.validate`).
  """
  for name, field in algorithm_registry.all_options().items():
    if name in _OPTION_FLAGS:
      continue
    kind = algorithm_registry.option_type(name)
    default = list(field.default) if kind is tuple else field.default
    owners = ', '.join(algorithm_registry.owners(name))
    _OPTION_FLAGS[name] = _DEFINE[kind](
        name, default, f'{field.metadata["help"]} [{owners}]'
    )


# The algorithms' options, each a flag (before the run-wide flags below).
define_algorithm_flags()

_STATE_STORE = flags.DEFINE_string(
    'client_state_store',
    'memory',
    'Ditto / Fed+ personal models: memory '
    '(snapshotted to <experiment>/client_states) or disk (one file per '
    'client, for many clients or large models).',
)
_STATE_DIR = flags.DEFINE_string(
    'client_state_dir',
    None,
    'Folder of the client-state store (default <experiment>/client_states).',
)
# One flag per option of the run's declared parts (`algorithms.PARTS`).
_PART_FLAGS: dict[type, dict[str, flags.FlagHolder]] = {}


def define_part_flags(part: type) -> None:
  """Defines a flag per option of `part` (an options class), its default
  and help the declaration's; values are checked by `AlgorithmSpec`."""
  holders = _PART_FLAGS.setdefault(part, {})
  for name, field in options_lib.fields_of(part).items():
    kind = options_lib.field_type(part, name)
    holders[name] = _DEFINE[kind](name, field.default, field.metadata['help'])


def part_values() -> dict[str, Any]:
  """The part flags' values by option name."""
  return {
      name: holder.value
      for holders in _PART_FLAGS.values()
      for name, holder in holders.items()
  }


for _part in algorithms.PARTS.values():
  define_part_flags(_part)

_STRAGGLERS = flags.DEFINE_float(
    'straggler_fraction',
    0.0,
    'Fraction of selected clients that straggle (FedAvg drops them, FedProx '
    'keeps their partial work).',
)
# Robust aggregation and attacks (tff_algos.aggregators, tff_algos.attacks).
_AGGREGATOR = flags.DEFINE_string(
    'aggregator',
    'mean',
    f'Model aggregator: {", ".join(aggregators.AGGREGATORS)} (not mean: '
    f'{", ".join(algorithms.robust_algorithms())}).',
)
# One flag per aggregator option (`tff_algos.aggregators`), by option name.
_AGGREGATOR_FLAGS: dict[str, flags.FlagHolder] = {}


def define_aggregator_flags() -> None:
  """Defines a flag per option of the registered aggregators (new ones
  only), its help naming its aggregator."""
  for entry in aggregators.AGGREGATORS.values():
    for name, field in options_lib.fields_of(entry.options).items():
      if name not in _AGGREGATOR_FLAGS:
        kind = options_lib.field_type(entry.options, name)
        _AGGREGATOR_FLAGS[name] = _DEFINE[kind](
            name, field.default, f'{entry.name}: {field.metadata["help"]}'
        )


define_aggregator_flags()

_HOLDOUT = flags.DEFINE_enum(
    'holdout',
    'none',
    ['none', 'test', 'validation'],
    "Split the training clients' data (tasks/holdout.py): 'test' evaluates "
    'on their held-out split and the unseen clients, if any; '
    "'validation' evaluates on a validation split only (tuning: held-out "
    "and unseen data are built, then dropped before training); 'none': the "
    "task's own splits.",
)
_HOLDOUT_VAL = flags.DEFINE_float(
    'holdout_validation_fraction',
    0.2,
    "With --holdout: the share of each training client's examples used for "
    'validation.',
)
_HOLDOUT_TEST = flags.DEFINE_float(
    'holdout_test_fraction',
    0.2,
    'With --holdout, on tasks with unseen test clients: the share of each '
    "training client's examples held out for testing.",
)
_EVAL_TRAIN = flags.DEFINE_boolean(
    'eval_train_clients',
    True,
    'Also evaluate every training client on its training data.',
)
_PROGRESS = flags.DEFINE_boolean('progress', True, 'Show a progress bar.')
# Execution (results do not depend on these).
_ENGINE = flags.DEFINE_string(
    'simulation_engine',
    'tff',
    "tff: rounds through TFF's runtime (process.next); batched: each round "
    'in one TensorFlow call '
    f'({", ".join(algorithm_registry.engine_names("batched"))}; same '
    "result, simulation only); stacked: as batched with the round's clients "
    'trained together '
    f'({", ".join(algorithm_registry.engine_names("stacked"))}; SGD/Adagrad '
    'client optimizer; (x, y) tasks such as synthetic and emnist; same '
    'result, simulation only; see docs/performance.md).',
)
_SIZE_GROUPS = flags.DEFINE_boolean(
    'stacked_size_groups',
    False,
    "stacked: run a round's clients in size-ordered groups where that saves "
    'a fifth of the padded batch slots (clients of very unequal sizes, e.g. '
    'full Shakespeare roles: run.experiments.bench_padding); the same result '
    'to float rounding, which long runs can amplify.',
)
_WORKERS = flags.DEFINE_list(
    'workers',
    [],
    "host:port,... of running TFF worker_binary processes: each round's "
    'clients are split across them (see docs/deployment.md).',
)
_MAX_CALLS = flags.DEFINE_integer(
    'max_concurrent_computation_calls',
    -1,
    "Limit on concurrent TensorFlow computations in TFF's runtime (e.g. to "
    'bound GPU memory); -1: no limit.',
)
_LOOP = flags.DEFINE_string(
    'loop_implementation',
    'dataset_reduce',
    'How clients iterate their data in TFF: dataset_reduce or '
    "dataset_iterator (TFF's advice for GPUs).",
)
_DOWNLOAD = flags.DEFINE_boolean(
    'download',
    False,
    "File tasks: fetch TFF's dataset files missing from --data_dir (with a "
    'progress bar, verified, resumable; see tasks/download.py). Off: a '
    'missing file stops the run and nothing touches the network.',
)
# One flag per task option (`tasks.registry`), by flag name.
_TASK_FLAGS: dict[str, flags.FlagHolder] = {}


def define_task_flags() -> None:
  """Defines a flag per option of the registered tasks (new ones only).

  Its default, help and the tasks it applies to come from the option's
  declaration; values are checked by the task's options (`task_options`).
  """
  for name, flag in registry.option_flags().items():
    if name not in _TASK_FLAGS:
      _TASK_FLAGS[name] = _DEFINE[flag.kind](name, flag.default, flag.help)


define_task_flags()


class UsageError(ValueError):
  """A flag has an impossible value."""


def num_classes_for_attack(attack: str) -> int:
  """Label classes for --attack=label_poison (0 when not poisoning)."""
  if attack != 'label_poison':
    return 0
  entry = task_entry()
  if entry.label_classes is None:
    classifiers = [
        t.name for t in registry.TASKS.values() if t.label_classes is not None
    ]
    raise UsageError(
        '--attack=label_poison applies to the classification tasks '
        f'({", ".join(classifiers)}), not {entry.name}'
    )
  return entry.label_classes(task_options())


def task_entry() -> task_options_lib.Task:
  """The registry entry of `--task`."""
  if _TASK.value not in registry.TASKS:
    raise UsageError(
        f'unknown --task={_TASK.value!r}; choose one of: '
        f'{", ".join(registry.TASK_NAMES)}'
    )
  return registry.TASKS[_TASK.value]


def task_options() -> task_options_lib.TaskOptions:
  """The options of `--task` from its flags, checked.

  An option takes its flag's value when the flag is given and its own
  default otherwise (a flag shared by tasks has one default). A task flag
  given for a task that does not take it is refused, naming the tasks it
  applies to.
  """
  entry = task_entry()
  own = entry.flags()
  for name, flag in registry.option_flags().items():
    if flags.FLAGS[name].present and name not in own.values():
      raise UsageError(
          f'--{name} applies to --task={", ".join(flag.owners)}, not '
          f'--task={entry.name}'
      )
  if _DOWNLOAD.value and not download.files_for_task(entry.name):
    readers = [t for t in registry.TASK_NAMES if download.files_for_task(t)]
    raise UsageError(
        "--download applies to the tasks read from TFF's files "
        f'({", ".join(readers)}), not --task={entry.name}'
    )
  fields = options_lib.fields_of(entry.options)
  options = entry.options(
      **{
          name: _TASK_FLAGS[flag].value
          if flags.FLAGS[flag].present
          else fields[name].default
          for name, flag in own.items()
      }
  )
  try:
    for name, field in fields.items():
      options_lib.check_value(name, getattr(options, name), field.metadata)
  except options_lib.OptionError as e:
    raise UsageError(algorithms.word_as_flags(e, own)) from None
  try:
    options.check()
  except options_lib.OptionError as e:
    raise UsageError(
        f'--task={entry.name} {algorithms.word_as_flags(e, own)}'
    ) from None
  return options


def check_task_flags() -> None:
  """Checks the task flags, naming them as the user typed them."""
  task_options()


def task_kwargs() -> dict:
  """Arguments of `tasks.registry.create_task` from the flags."""
  options = task_options()
  if _BATCH_SIZE.value < 1:
    raise UsageError(
        f'--client_batch_size must be >= 1, got {_BATCH_SIZE.value}'
    )
  data_seed = _SEED.value if _DATA_SEED.value is None else _DATA_SEED.value
  if data_seed < 0:
    raise UsageError(f'--data_seed must be >= 0, got {data_seed}')
  kwargs = {
      'seed': data_seed,
      'batch_size': _BATCH_SIZE.value,
      **options.task_kwargs(),
  }
  if task_entry().model_seed and _DATA_SEED.value is not None:
    kwargs['model_seed'] = _SEED.value
  return kwargs


def hparams() -> dict:
  """Every flag of this binary, for config.json."""
  names = [
      f.name
      for f in flags.FLAGS.get_key_flags_for_module(sys.modules[__name__])
  ]
  return {name: flags.FLAGS[name].value for name in sorted(names)}


def experiment_dir() -> str:
  """The run's folder; raises `UsageError` if it cannot hold a run.

  Checked before anything is created (`run.run_dir.check_output_dir`).
  """
  name = _EXPERIMENT.value or (
      f'{_TASK.value}_{_ALGORITHM.value}_seed{_SEED.value}'
  )
  if not name or '/' in name or name in ('.', '..'):
    raise UsageError(
        f'--experiment_name must be a plain folder name, got {name!r}'
    )
  if not _ROOT.value:
    raise UsageError('--root_output_dir must name a folder, got an empty one')
  run_dir.check_output_dir(_ROOT.value, flag='--root_output_dir')
  path = os.path.join(_ROOT.value, name)
  run_dir.check_output_dir(path, flag='--experiment_name')
  return path


def _parse_floats(flag: str, values: list[str]) -> tuple[float, ...]:
  try:
    return tuple(float(v) for v in values)
  except ValueError:
    raise UsageError(
        f'--{flag} must be a comma-separated list of numbers, got '
        f'{",".join(values)!r}'
    ) from None


def algorithm_option_values() -> dict[str, Any]:
  """The algorithm option flags' values by option name (lists parsed)."""
  values = {}
  for name, holder in _OPTION_FLAGS.items():
    value = holder.value
    if isinstance(value, list):
      value = _parse_floats(name, value)
    values[name] = value
  return values


def build_task():
  """The task the flags name, with its holdout parts (downloaded first
  where `--download` asks)."""
  kwargs = task_kwargs()
  if _DOWNLOAD.value and not kwargs['use_synthetic_data']:
    download.ensure(
        download.files_for_task(_TASK.value),
        kwargs['data_dir'],
        progress=_PROGRESS.value,
    )
  task = registry.create_task(_TASK.value, **kwargs)
  if _HOLDOUT.value != 'none':
    task = holdout.with_holdout(
        task,
        validation_fraction=_HOLDOUT_VAL.value,
        test_fraction=_HOLDOUT_TEST.value,
        evaluate_on=_HOLDOUT.value,
    )
  return task


class Prepared(typing.NamedTuple):
  """What `prepare` builds from the flags."""

  task: Any
  process: Any
  config: simulation.SimulationConfig
  out_dir: str
  tracker: Any
  engine: Any
  spec: algorithms.AlgorithmSpec


def prepare(writer: str = 'train') -> Prepared:
  """Validates the flags and builds `(task, process, config, out_dir)`.

  Args:
    writer: What will write the output folder (a `run.run_dir.WRITERS`
      key): a folder in use or another writer's is refused before anything
      is built (`run.run_dir.RunDirError`).
  """
  if _SEED.value < 0:
    raise UsageError(f'--seed must be >= 0, got {_SEED.value}')
  spec = algorithms.AlgorithmSpec(
      name=_ALGORITHM.value,
      client_optimizer=_CLIENT_OPT.value,
      client_learning_rate=_CLIENT_LR.value,
      server_optimizer=_SERVER_OPT.value,
      server_learning_rate=_SERVER_LR.value,
      server_momentum=_SERVER_MOMENTUM.value,
      client_weighting=_WEIGHTING.value,
      aggregator=_AGGREGATOR.value,
      aggregator_values=tuple(
          (name, holder.value) for name, holder in _AGGREGATOR_FLAGS.items()
      ),
      **part_values(),
      **algorithm_option_values(),
  )
  spec.validate()
  try:
    spec.aggregator_options().check_clients(_CLIENTS_PER_ROUND.value)
  except options_lib.OptionError as e:
    raise UsageError(algorithms.flag_wording(e)) from None
  attack = spec.adversary.config(
      seed=_SEED.value,
      num_classes=num_classes_for_attack(spec.adversary.attack),
  )
  attack.validate()
  if _STATE_STORE.value not in ('memory', 'disk'):
    raise UsageError(
        f'unknown --client_state_store={_STATE_STORE.value!r}; '
        'choose memory or disk'
    )
  if not spec.is_stateful and (
      _STATE_STORE.value != 'memory' or _STATE_DIR.value
  ):
    raise UsageError(
        '--client_state_store and --client_state_dir apply to '
        'ditto and the Fed+ family only'
    )
  engines.check_engine(_ENGINE.value, spec)
  if _ENGINE.value in ('batched', 'stacked') and _WORKERS.value:
    raise UsageError(
        f'--simulation_engine={_ENGINE.value} runs in this '
        'process; it '
        'cannot use --workers'
    )
  if _SIZE_GROUPS.value and _ENGINE.value != 'stacked':
    raise UsageError(
        '--stacked_size_groups applies to --simulation_engine=stacked only, '
        f'got --simulation_engine={_ENGINE.value}'
    )
  loop_implementation = engines.loop_implementation(_LOOP.value)
  context_kind = contexts.check(
      workers=_WORKERS.value,
      max_concurrent_computation_calls=_MAX_CALLS.value,
      secure=spec.uses_secure_intrinsics,
  )
  if _ENGINE.value in ('batched', 'stacked') and (
      spec.aggregator != 'mean'
      or spec.uses_dp
      or spec.adversary.on
      or spec.server_optimizer == 'dp2'
  ):
    raise UsageError(
        f'--simulation_engine={_ENGINE.value} runs plain mean aggregation of '
        'one model; drop --aggregator, --clip, --attack and dp2, or use '
        '--simulation_engine=tff'
    )
  config = simulation.SimulationConfig(
      total_rounds=_TOTAL_ROUNDS.value,
      clients_per_round=_CLIENTS_PER_ROUND.value,
      client_epochs_per_round=_EPOCHS.value,
      rounds_per_eval=_ROUNDS_PER_EVAL.value,
      rounds_per_checkpoint=_ROUNDS_PER_CHECKPOINT.value,
      seed=_SEED.value,
      client_sampling=_SAMPLING.value,
      straggler_fraction=_STRAGGLERS.value,
      drop_stragglers=algorithms.drops_stragglers(_ALGORITHM.value),
      eval_train_clients=_EVAL_TRAIN.value,
      attack=attack,
  )
  config.validate(num_clients=max(_CLIENTS_PER_ROUND.value, 1))
  out_dir = experiment_dir()
  if _STATE_DIR.value:
    run_dir.check_output_dir(_STATE_DIR.value, flag='--client_state_dir')
  task = build_task()
  config.validate(num_clients=len(task.train_data.client_ids))
  spec, tracker = privacy_setup.prepare_dp(
      spec, config, len(task.train_data.client_ids)
  )
  if spec.uses_secure_intrinsics:
    # TFF 0.87 executes secure sums only in its test context, which replaces
    # them by plain sums: the algorithm is the secure one, the runtime is not.
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    tff.backends.test.set_sync_test_cpp_execution_context()
    print(
        "secure quantile: running under TFF's test execution context",
        file=sys.stderr,
    )
  elif context_kind != 'default':
    contexts.set_context(
        workers=_WORKERS.value,
        max_concurrent_computation_calls=_MAX_CALLS.value,
    )
  reason = spec.options.validation_data_reason()
  if reason and task.validation_data is None:
    reason = algorithms.flag_wording(
        options_lib.OptionError(reason, *_OPTION_FLAGS)
    )
    raise UsageError(
        f'{reason}, and this task has none; pass '
        '--synthetic_validation_fraction'
    )
  process = algorithms.build_process(
      spec,
      task.model_fn,
      num_clients=len(task.train_data.client_ids),
      clients_per_round=config.clients_per_round,
      loop_implementation=loop_implementation,
  )
  engine = None
  if _ENGINE.value == 'batched':
    engine = engines.build_batched_engine(spec, task, shuffle=config.shuffle)
  elif _ENGINE.value == 'stacked':
    engine = engines.build_stacked_engine(
        spec,
        task,
        shuffle=config.shuffle,
        group_by_size=_SIZE_GROUPS.value,
    )
  # Last: bad input is reported before a busy or foreign folder.
  run_dir.check_available(out_dir, writer)
  run_dir.check_run_files(out_dir, writer)
  if writer == 'train':  # Checked again (locked) when the run starts.
    simulation.check_settings(
        out_dir, hparams(), ignore=frozenset({'dp_noise_multiplier_used'})
    )
  print(f'task: {task.description}', file=sys.stderr)
  print(f'algorithm: {spec.describe()}; output: {out_dir}', file=sys.stderr)
  if attack.kind != 'none':
    update = algorithms.update_attack(
        spec, clients_per_round=_CLIENTS_PER_ROUND.value
    )
    print(
        f'attack: {attacks.describe(attack, update and update.scale)}; '
        'metrics on benign clients (all clients: all_*)',
        file=sys.stderr,
    )
  if tracker is not None:
    m = tracker.mechanism
    print(
        f'privacy: noise multiplier {spec.privacy.noise_multiplier:.4g}, '
        f'{m.sampling} sampling of {m.clients_per_round} of '
        f'{m.num_clients} clients, epsilon after {config.total_rounds} '
        f'rounds {tracker.epsilon_rdp(config.total_rounds):.4g} at delta '
        f'{tracker.delta:g} (RDP)',
        file=sys.stderr,
    )
  return Prepared(task, process, config, out_dir, tracker, engine, spec)


def client_state_store(process, out_dir):
  """The Ditto / Fed+ client-state store named by the flags (or None)."""
  from tff_algos import client_states  # pylint: disable=g-import-not-at-top
  from tff_algos import stateful  # pylint: disable=g-import-not-at-top

  if not stateful.is_stateful(process):
    return None
  return client_states.build_store(
      _STATE_STORE.value,
      lambda _: process.initial_client_state(),
      directory=_STATE_DIR.value or os.path.join(out_dir, 'client_states'),
  )


def train(task, process, config, out_dir, tracker=None, engine=None) -> dict:
  """Runs the training job and prints the final per-client table."""
  dp_hooks, hp = {}, hparams()
  if tracker is not None:
    # With --target_epsilon, z depends on --total_rounds (resumable): record
    # it so that resuming with another z is refused.
    hp['dp_noise_multiplier_used'] = tracker.mechanism.noise_multiplier
    dp_hooks = dict(
        round_metrics_fn=lambda r: tracker.metrics(r, with_pld=False),
        summary_fn=lambda r: dict(
            tracker.metrics(r),
            **{
                'dp/noise_multiplier': tracker.mechanism.noise_multiplier,
                'dp/sampling': tracker.mechanism.sampling,
            },
        ),
    )
  result = simulation.run_simulation(
      process,
      task,
      config,
      output_dir=out_dir,
      hparams=hp,
      progress=_PROGRESS.value,
      engine=engine,
      client_state_store=client_state_store(process, out_dir),
      **dp_hooks,
  )
  print(
      f'\nPer-client metrics after round {result["round_num"]} '
      f'({task.description}):'
  )
  print(simulation.summary_table(result['final_summaries']))
  for key, value in result.get('extra', {}).items():
    print(f'{key}: {value}')
  print(
      f'\nOutputs: {out_dir}/ (metrics.csv, clients/, summary.txt, '
      'tensorboard/, checkpoints/)'
  )
  return result


_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXTS = ('No space left on device', 'Disk quota exceeded')


def disk_full_message(error: BaseException, out_dir: str) -> Optional[str]:
  """The one-line message for a write that failed on a full disk, else None.

  Python's writes raise `OSError` (ENOSPC, EDQUOT); TensorFlow's (the
  checkpoints, TensorBoard, TFF's CSV files) `ResourceExhaustedError`, whose
  text names the cause (a TensorFlow out-of-memory error does not).
  """
  if isinstance(error, OSError):
    full = error.errno in _DISK_FULL_ERRNOS
  else:
    full = type(error).__name__ == 'ResourceExhaustedError' and any(
        t in str(error) for t in _DISK_FULL_TEXTS
    )
  if not full:
    return None
  return (
      f'disk full while writing in {out_dir}; the checkpoints written before '
      'are kept: free some space and rerun the same command to resume'
  )


def main(argv) -> int:
  """Runs the binary; returns the exit code (2: bad input, 1: failed run)."""
  if len(argv) > 1:
    print(
        f'train: error: unexpected arguments: {" ".join(argv[1:])}',
        file=sys.stderr,
    )
    return 2
  logging.set_verbosity(logging.WARNING)
  runtime.install_worker_cleanup()
  try:
    try:
      job = prepare()
    except (ValueError, TypeError, OSError) as e:
      # Bad flags or missing data files: one line, no traceback.
      print(f'train: error: {e}', file=sys.stderr)
      return 2
    except (run_dir.RunDirError, simulation.SimulationError) as e:
      # The folder is busy, another binary's or another run's.
      print(f'train: error: {e}', file=sys.stderr)
      return 1
    try:
      train(
          job.task,
          job.process,
          job.config,
          job.out_dir,
          job.tracker,
          job.engine,
      )
    except (
        simulation.SimulationError,
        task_base.TaskError,
        run_dir.RunDirError,
    ) as e:
      print(f'train: error: {e}', file=sys.stderr)
      return 1
    except Exception as e:  # pylint: disable=broad-except
      message = disk_full_message(e, job.out_dir)
      if message is None:
        raise
      print(f'train: error: {message}', file=sys.stderr)
      return 1
    except KeyboardInterrupt:
      print(console.interrupted_message('train'), file=sys.stderr)
      return 130
  finally:
    runtime.kill_workers()
  return 0


def run_main() -> None:
  """Console-script entry point."""
  console.run(__name__, lambda argv: runtime.exit_now(main(argv)), prog='train')


if __name__ == '__main__':
  run_main()
