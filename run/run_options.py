# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The training binaries' run-wide settings, declared as options.

Each class is one part of a run's configuration (`RunConfig`), declared as
the algorithms' options are (`tff_algos.options.option`: default, range,
help): the schedule of rounds, evaluation and checkpoints; the data split;
where outputs go; how the run executes. `run.train` makes one flag per
field, checks its range and the part's own rules (`check`), and reads the
values from the tree; the algorithm's part is `run.algorithms.AlgorithmSpec`
(its options, optimizers, aggregator, DP and attacks).
"""

import dataclasses
from typing import Any, Optional

from run import contexts
from run import engines
from run import simulation
from tff_algos import options as options_lib
from tff_algos import registry as algorithm_registry

option = options_lib.option


class UsageError(ValueError):
  """A flag has an impossible value."""


@dataclasses.dataclass(frozen=True)
class ScheduleOptions(options_lib.Options):
  """Rounds, clients, local work, evaluation, checkpoints and seeds."""

  total_rounds: int = option(
      100, 'Training rounds.', low=1, high=simulation.MAX_ROUNDS
  )
  clients_per_round: int = option(10, 'Clients selected per round.', low=1)
  client_epochs_per_round: int = option(
      1, 'Local epochs E per round.', low=1, high=simulation.MAX_EPOCHS
  )
  client_batch_size: int = option(10, 'Local batch.', low=1)
  client_sampling: str = option(
      'uniform',
      'Client sampling: uniform (fixed number without replacement), examples '
      '(probability proportional to size) or poisson (each client with '
      'probability clients_per_round / N).',
      choices=simulation.SAMPLING_SCHEMES,
  )
  straggler_fraction: float = option(
      0.0,
      'Fraction of selected clients that straggle (FedAvg drops them, '
      'FedProx keeps their partial work).',
      low=0.0,
      high=1.0,
  )
  rounds_per_eval: int = option(
      10, 'Per-client evaluation period (0: only at end).', low=0
  )
  rounds_per_checkpoint: int = option(
      10, 'Checkpoint period (0: only at the end).', low=0
  )
  eval_train_clients: bool = option(
      True, 'Also evaluate every training client on its training data.'
  )
  seed: int = option(
      0,
      'Seed of sampling, shuffles and model initialisation; also of the data '
      'unless --data_seed is given.',
      low=0,
  )
  data_seed: Optional[int] = option(
      None,
      'Seed of the data: generated data, the chosen clients and their splits '
      '(unseen clients, per-client parts). Default: --seed. Runs that share '
      'it share their clients whatever their --seed (the tail benchmark).',
      low=0,
  )

  @property
  def task_seed(self) -> int:
    """The seed of the task's data."""
    return self.seed if self.data_seed is None else self.data_seed

  def simulation_config(self, **settings: Any) -> simulation.SimulationConfig:
    """The simulation's config: these fields and `settings` (the others)."""
    own = {f.name for f in dataclasses.fields(simulation.SimulationConfig)}
    fields = {k: v for k, v in dataclasses.asdict(self).items() if k in own}
    return simulation.SimulationConfig(**fields, **settings)


@dataclasses.dataclass(frozen=True)
class DataOptions(options_lib.Options):
  """How the training clients' data is split, and whether files download."""

  holdout: str = option(
      'none',
      "Split the training clients' data (tasks/holdout.py): 'test' evaluates "
      'on their held-out split and the unseen clients, if any; '
      "'validation' evaluates on a validation split only (tuning: held-out "
      "and unseen data are built, then dropped before training); 'none': the"
      " task's own splits.",
      choices=('none', 'test', 'validation'),
  )
  holdout_validation_fraction: float = option(
      0.2,
      "With --holdout: the share of each training client's examples used for"
      ' validation.',
      low=0.0,
      high=1.0,
      low_open=True,
      high_open=True,
  )
  holdout_test_fraction: float = option(
      0.2,
      'With --holdout, on tasks with unseen test clients: the share of each '
      "training client's examples held out for testing.",
      low=0.0,
      high=1.0,
      low_open=True,
      high_open=True,
  )
  download: bool = option(
      False,
      "File tasks: fetch TFF's dataset files missing from --data_dir (with a "
      'progress bar, verified, resumable; see tasks/download.py). Off: a '
      'missing file stops the run and nothing touches the network.',
  )

  def check(self) -> None:
    if (
        self.holdout != 'none'
        and self.holdout_validation_fraction + self.holdout_test_fraction >= 1.0
    ):
      raise options_lib.OptionError(
          'holdout_validation_fraction + holdout_test_fraction must be < 1, '
          f'got {self.holdout_validation_fraction} + '
          f'{self.holdout_test_fraction}',
          'holdout_validation_fraction',
          'holdout_test_fraction',
      )


@dataclasses.dataclass(frozen=True)
class OutputOptions(options_lib.Options):
  """Where a run writes and what it shows."""

  root_output_dir: str = option('output', 'Root folder of all experiments.')
  experiment_name: Optional[str] = option(
      None, 'Output sub-folder (default: <task>_<algorithm>_seed<seed>).'
  )
  progress: bool = option(True, 'Show a progress bar.')

  def check(self) -> None:
    if not self.root_output_dir:
      raise options_lib.OptionError(
          'root_output_dir must name a folder, got an empty one',
          'root_output_dir',
      )
    name = self.experiment_name
    if name is not None and (not name or '/' in name or name in ('.', '..')):
      raise options_lib.OptionError(
          f'experiment_name must be a plain folder name, got {name!r}',
          'experiment_name',
      )

  def folder_name(self, task: str, algorithm: str, seed: int) -> str:
    """The run's sub-folder of `root_output_dir`."""
    return self.experiment_name or f'{task}_{algorithm}_seed{seed}'


@dataclasses.dataclass(frozen=True)
class ExecutionOptions(options_lib.Options):
  """How a run executes (results do not depend on these)."""

  simulation_engine: str = option(
      'tff',
      "tff: rounds through TFF's runtime (process.next); batched: each round"
      ' in one TensorFlow call '
      f'({", ".join(algorithm_registry.engine_names("batched"))}; same '
      "result, simulation only); stacked: as batched with the round's "
      'clients trained together '
      f'({", ".join(algorithm_registry.engine_names("stacked"))}; SGD/Adagrad'
      ' client optimizer; (x, y) tasks such as synthetic and emnist; same '
      'result, simulation only; see docs/performance.md).',
      choices=engines.ENGINE_NAMES,
  )
  stacked_size_groups: bool = option(
      False,
      "stacked: run a round's clients in size-ordered groups where that saves"
      ' a fifth of the padded batch slots (clients of very unequal sizes, '
      'e.g. full Shakespeare roles: run.experiments.bench_padding); the same '
      'result to float rounding, which long runs can amplify.',
  )
  workers: tuple[str, ...] = option(
      (),
      "host:port,... of running TFF worker_binary processes: each round's "
      'clients are split across them (see docs/deployment.md).',
  )
  max_concurrent_computation_calls: int = option(
      -1,
      "Limit on concurrent TensorFlow computations in TFF's runtime (e.g. to "
      'bound GPU memory); -1: no limit.',
      low=-1,
  )
  loop_implementation: str = option(
      'dataset_reduce',
      'How clients iterate their data in TFF: dataset_reduce or '
      "dataset_iterator (TFF's advice for GPUs).",
      choices=tuple(engines.LOOP_IMPLEMENTATIONS),
  )
  client_state_store: str = option(
      'memory',
      'Ditto / Fed+ personal models: memory (snapshotted to '
      '<experiment>/client_states) or disk (one file per client, for many '
      'clients or large models).',
      choices=('memory', 'disk'),
  )
  client_state_dir: Optional[str] = option(
      None,
      'Folder of the client-state store (default '
      '<experiment>/client_states).',
  )

  def check(self) -> None:
    engine = self.simulation_engine
    if engine in ('batched', 'stacked') and self.workers:
      raise options_lib.OptionError(
          f'simulation_engine={engine} runs in this process; it cannot use '
          'workers',
          'simulation_engine',
          'workers',
      )
    if self.stacked_size_groups and engine != 'stacked':
      raise options_lib.OptionError(
          'stacked_size_groups applies to simulation_engine=stacked only, '
          f'got simulation_engine={engine}',
          'stacked_size_groups',
          'simulation_engine',
      )

  @property
  def fast_engine(self) -> bool:
    """The run uses one of the one-process engines (batched, stacked)."""
    return self.simulation_engine in ('batched', 'stacked')

  def check_algorithm(self, spec: Any) -> None:
    """Checks what this execution needs of the algorithm (`AlgorithmSpec`);
    raises `ValueError`."""
    if not spec.is_stateful and (
        self.client_state_store != 'memory' or self.client_state_dir
    ):
      raise ValueError(
          '--client_state_store and --client_state_dir apply to '
          'ditto and the Fed+ family only'
      )
    engines.check_engine(self.simulation_engine, spec)
    if self.fast_engine and (
        spec.aggregator != 'mean'
        or spec.uses_dp
        or spec.adversary.on
        or spec.optimization.server_optimizer == 'dp2'
    ):
      raise ValueError(
          f'--simulation_engine={self.simulation_engine} runs plain mean '
          'aggregation of one model; drop --aggregator, --clip, --attack and '
          'dp2, or use --simulation_engine=tff'
      )

  def context_kind(self, *, secure: bool) -> str:
    """Checks the TFF runtime options; `default`, `local` or `remote`."""
    return contexts.check(
        workers=self.workers,
        max_concurrent_computation_calls=self.max_concurrent_computation_calls,
        secure=secure,
    )


# The run's parts beside the task and the algorithm: the `RunConfig` field
# that holds each, and its options class (a flag per field).
RUN_PARTS = {
    'schedule': ScheduleOptions,
    'data': DataOptions,
    'output': OutputOptions,
    'execution': ExecutionOptions,
}


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """One run's whole configuration.

  Attributes:
    task: The task's name (`tasks.registry`).
    task_options: Its options (`tasks.options.TaskOptions`), checked.
    algorithm: The algorithm and its shared parts
      (`run.algorithms.AlgorithmSpec`).
    schedule: Rounds, clients, evaluation, checkpoints and seeds.
    data: The data split and downloads.
    output: Where outputs go.
    execution: How the run executes.
  """

  task: str
  task_options: Any
  algorithm: Any
  schedule: ScheduleOptions
  data: DataOptions
  output: OutputOptions
  execution: ExecutionOptions
