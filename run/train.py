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

import os
import sys
import typing
from typing import Any

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
from run import contexts
from run import declared_flags
from run import engines
from run import privacy_setup
from run import run_dir
from run import run_options
from run import simulation
from run import task_flags
from tasks import base as task_base
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
_AGGREGATOR = flags.DEFINE_string(
    'aggregator',
    'mean',
    f'Model aggregator: {", ".join(aggregators.AGGREGATORS)} (not mean: '
    f'{", ".join(algorithms.robust_algorithms())}).',
)

# A flag per declared option (algorithms, the run's parts, aggregators,
# tasks), key flags of this module.
DECLARED = declared_flags.DeclaredFlags(__name__)
DECLARED.define()
_OPTION_FLAGS = DECLARED.algorithm
_TASK_FLAGS = DECLARED.task
UsageError = run_options.UsageError


def define_task_flags() -> None:
  """Makes the flags of entries registered since (tasks and the others)."""
  DECLARED.define()


_Part = typing.TypeVar('_Part', bound=options_lib.Options)


def part_options(part: type[_Part]) -> _Part:
  """The options of a run part (`run_options.RUN_PARTS`) from its flags,
  checked (`UsageError` naming the flags)."""
  options = part(**DECLARED.part_values(part))
  try:
    options.validate()
  except options_lib.OptionError as e:
    raise UsageError(algorithms.word_as_flags(e, {})) from None
  return options


def task_options() -> Any:
  """The options of `--task` from its flags, checked."""
  return task_flags.options(_TASK.value, downloads=flags.FLAGS.download)


def check_task_flags() -> None:
  """Checks the task flags, naming them as the user typed them."""
  task_options()


def task_kwargs() -> dict:
  """Arguments of `tasks.registry.create_task` from the flags."""
  schedule = part_options(run_options.ScheduleOptions)
  return task_flags.kwargs(_TASK.value, task_options(), schedule)


def algorithm_spec() -> algorithms.AlgorithmSpec:
  """The algorithm and its shared parts from the flags (checked later by
  `AlgorithmSpec.validate`)."""
  return algorithms.AlgorithmSpec(
      name=_ALGORITHM.value,
      aggregator=_AGGREGATOR.value,
      aggregator_values=DECLARED.aggregator_values(),
      **DECLARED.part_values(),
      **DECLARED.algorithm_values(),
  )


def run_config() -> run_options.RunConfig:
  """The run's configuration tree from the flags; each run part checked."""
  parts = {
      key: part_options(part) for key, part in run_options.RUN_PARTS.items()
  }
  return run_options.RunConfig(
      task=_TASK.value,
      task_options=task_options(),
      algorithm=algorithm_spec(),
      **parts,
  )


def hparams() -> dict:
  """Every flag of this binary, for config.json."""
  names = [
      f.name
      for f in flags.FLAGS.get_key_flags_for_module(sys.modules[__name__])
  ]
  return {name: flags.FLAGS[name].value for name in sorted(names)}


def experiment_dir(config: run_options.RunConfig) -> str:
  """The run's folder; raises `UsageError` if it cannot hold a run.

  Checked before anything is created (`run.run_dir.check_output_dir`).
  """
  output = config.output
  root = output.root_output_dir
  run_dir.check_output_dir(root, flag='--root_output_dir')
  path = os.path.join(
      root,
      output.folder_name(
          config.task, config.algorithm.name, config.schedule.seed
      ),
  )
  run_dir.check_output_dir(path, flag='--experiment_name')
  return path


def build_task():
  """The task the flags name, with its holdout parts (downloaded first
  where `--download` asks)."""
  return task_flags.build(run_config())


class Prepared(typing.NamedTuple):
  """What `prepare` builds from the flags."""

  task: Any
  process: Any
  config: simulation.SimulationConfig
  out_dir: str
  tracker: Any
  engine: Any
  spec: algorithms.AlgorithmSpec


def _check_algorithm(
    config: run_options.RunConfig,
) -> tuple[algorithms.AlgorithmSpec, simulation.SimulationConfig]:
  """Checks the algorithm against the run; the simulation's config."""
  spec, schedule = config.algorithm, config.schedule
  spec.validate()
  try:
    spec.aggregator_options().check_clients(schedule.clients_per_round)
  except options_lib.OptionError as e:
    raise UsageError(algorithms.flag_wording(e)) from None
  attack = spec.adversary.config(
      seed=schedule.seed,
      num_classes=task_flags.num_classes_for_attack(
          spec.adversary.attack, config.task, config.task_options
      ),
  )
  attack.validate()
  config.execution.check_algorithm(spec)
  simulation_config = schedule.simulation_config(
      drop_stragglers=algorithms.drops_stragglers(spec.name), attack=attack
  )
  simulation_config.validate(num_clients=schedule.clients_per_round)
  return spec, simulation_config


def _set_context(config: run_options.RunConfig, context_kind: str) -> None:
  """Installs the TFF runtime the run's algorithm and workers need."""
  execution = config.execution
  if config.algorithm.uses_secure_intrinsics:
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
        workers=execution.workers,
        max_concurrent_computation_calls=(
            execution.max_concurrent_computation_calls
        ),
    )


def _build_engine(spec, task, config, simulation_config):
  """The batched or stacked engine the run asks for (None: TFF's)."""
  execution = config.execution
  if execution.simulation_engine == 'batched':
    return engines.build_batched_engine(
        spec, task, shuffle=simulation_config.shuffle
    )
  if execution.simulation_engine == 'stacked':
    return engines.build_stacked_engine(
        spec,
        task,
        shuffle=simulation_config.shuffle,
        group_by_size=execution.stacked_size_groups,
    )
  return None


def _announce(task, spec, out_dir, simulation_config, tracker) -> None:
  """Prints the task, the algorithm, the attack and the privacy of a run."""
  print(f'task: {task.description}', file=sys.stderr)
  print(f'algorithm: {spec.describe()}; output: {out_dir}', file=sys.stderr)
  attack = simulation_config.attack
  if attack.kind != 'none':
    update = algorithms.update_attack(
        spec, clients_per_round=simulation_config.clients_per_round
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
        f'{m.num_clients} clients, epsilon after '
        f'{simulation_config.total_rounds} rounds '
        f'{tracker.epsilon_rdp(simulation_config.total_rounds):.4g} at delta '
        f'{tracker.delta:g} (RDP)',
        file=sys.stderr,
    )


def prepare(writer: str = 'train') -> Prepared:
  """Validates the flags and builds the run's task, process and engine.

  Args:
    writer: What will write the output folder (a `run.run_dir.WRITERS`
      key): a folder in use or another writer's is refused before anything
      is built (`run.run_dir.RunDirError`).
  """
  config = run_config()
  spec, simulation_config = _check_algorithm(config)
  execution = config.execution
  loop_implementation = engines.loop_implementation(
      execution.loop_implementation
  )
  context_kind = execution.context_kind(secure=spec.uses_secure_intrinsics)
  out_dir = experiment_dir(config)
  if execution.client_state_dir:
    run_dir.check_output_dir(
        execution.client_state_dir, flag='--client_state_dir'
    )
  task = task_flags.build(config)
  num_clients = len(task.train_data.client_ids)
  simulation_config.validate(num_clients=num_clients)
  spec, tracker = privacy_setup.prepare_dp(spec, simulation_config, num_clients)
  _set_context(config, context_kind)
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
      num_clients=num_clients,
      clients_per_round=simulation_config.clients_per_round,
      loop_implementation=loop_implementation,
  )
  engine = _build_engine(spec, task, config, simulation_config)
  # Last: bad input is reported before a busy or foreign folder.
  run_dir.check_available(out_dir, writer)
  run_dir.check_run_files(out_dir, writer)
  if writer == 'train':  # Checked again (locked) when the run starts.
    simulation.check_settings(
        out_dir, hparams(), ignore=frozenset({'dp_noise_multiplier_used'})
    )
  _announce(task, spec, out_dir, simulation_config, tracker)
  return Prepared(
      task, process, simulation_config, out_dir, tracker, engine, spec
  )


def client_state_store(process, out_dir):
  """The Ditto / Fed+ client-state store named by the flags (or None)."""
  from tff_algos import client_states  # pylint: disable=g-import-not-at-top
  from tff_algos import stateful  # pylint: disable=g-import-not-at-top

  if not stateful.is_stateful(process):
    return None
  return client_states.build_store(
      flags.FLAGS.client_state_store,
      lambda _: process.initial_client_state(),
      directory=flags.FLAGS.client_state_dir
      or os.path.join(out_dir, 'client_states'),
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
      progress=flags.FLAGS.progress,
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
      message = run_dir.disk_full_message(e, job.out_dir)
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
