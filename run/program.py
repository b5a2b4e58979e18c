# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""Runs any of our `LearningProcess`es as a production-style TFF program.

The training binary (`run.train`) drives a process with its own loop. This
module runs the same processes the way a production TFF deployment does:
through `tff.learning.programs.train_model`, TFF's asynchronous program
logic, inside a `tff.program.NativeFederatedContext` over the asynchronous
local C++ execution context, with

* a `tff.program.FederatedDataSource` over a task's clients
  (`ClientDataSource`): its iterator is `tff.Serializable` and is saved with
  the program state, so a resumed program selects the same clients and
  shuffles as an uninterrupted one (client selection is the training
  binary's: a pure function of `(seed, round)`, see `run.simulation`);
* a `tff.program.FileProgramStateManager` (`program_state/`): running the
  same program again resumes from the last saved round;
* release managers: training metrics to `metrics.csv`
  (`tff.program.CSVFileReleaseManager`) and `tensorboard/`
  (`tff.program.TensorBoardReleaseManager`), the training state every 10
  rounds and at the end to `models/`
  (`tff.program.SavedModelFileReleaseManager`);
* evaluation through `tff.learning.programs.EvaluationManager` and
  `tff.learning.algorithms.build_fed_eval` on the task's test clients, in
  parallel with training, every `rounds_per_eval` rounds and after the last
  one (`evaluation.csv`, `tensorboard/evaluation/`).

At the end the final model is also evaluated on every test and training
client and written as `clients/round_NNNNN.csv` and `summary.json`, the
training binary's format, so `run.report` reads a program's folder too.

Example:

  python -m run.program --task=synthetic --algorithm=qffl --q=1 \
      --total_rounds=20 --clients_per_round=10 --client_learning_rate=0.1 \
      --experiment_name=qffl_program

The flags are the training binary's (`--help` lists them) plus
`--eval_clients`. Not supported here: `--straggler_fraction` (the program
logic has no straggler schedule) and `--rounds_per_checkpoint` (the program
logic saves its state every round).

Stateful clients (Ditto, Fed+) keep per-client state that a plain
`LearningProcess` cannot carry: they run as a program through
`run.stateful_program`, under the same `train_model`, with a data source,
round process and program-state manager that keep their states in a store
(see docs/programs.md). Both binaries are this module's one program loop
(`run_program`, `binary_main`); `run.stateful_program` gives it its
`ClientStates` part (a `ClientStatesPart`), which trains the rounds under
`train_model` with those pieces and adds the personal models to the
per-client tables.
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
import asyncio
import dataclasses
import datetime
import functools
import json
import re
import shutil
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Optional, Protocol

from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from run import algorithms
from run import atomic
from run import console
from run import engines
from run import run_dir
from run import simulation
from run import train  # The training binary's flags, reused by main().
from tasks import base as task_base
from tasks import evaluation
from tasks import registry
from tff_algos import registry as algorithm_registry
from tff_algos import runtime
from tff_algos import stateful
from tff_algos import stragglers as stragglers_lib

# pylint: enable=g-import-not-at-top,wrong-import-position

PROGRAM_CONFIG = 'program_config.json'
# Settings that may change when a program is resumed.
RESUMABLE_KEYS = frozenset({'total_rounds', 'rounds_per_eval'})

_TASKS: dict[str, task_base.FederatedTask] = {}

_EVAL_CLIENTS = flags.DEFINE_integer(
    'eval_clients',
    0,
    'Program evaluations: test clients per evaluation (0: all of them).',
)


def _task_for(
    task_name: str, task_kwargs: Mapping[str, Any]
) -> task_base.FederatedTask:
  """The task built from its registry name and arguments (cached)."""
  key = json.dumps([task_name, dict(task_kwargs)], sort_keys=True)
  if key not in _TASKS:
    _TASKS[key] = registry.create_task(task_name, **task_kwargs)
  return _TASKS[key]


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """What a `ClientDataSource` selects: JSON-able, so it can be serialized.

  Attributes:
    task: A `tasks.registry` task name.
    task_kwargs: Arguments of `tasks.registry.create_task` (JSON-able).
    split: `train` (local-training streams) or `test` (evaluation streams of
      the task's test clients).
    seed: Seed of client selection and shuffles.
    epochs: Local epochs of a training stream.
    sampling: `uniform` or `examples` (see `run.simulation.sample_clients`).
    client_index: Pair each training stream with its client's index (AFL).
  """

  task: str
  task_kwargs: Mapping[str, Any]
  split: str = 'train'
  seed: int = 0
  epochs: int = 1
  sampling: str = 'uniform'
  client_index: bool = False

  def validate(self) -> None:
    if self.split not in ('train', 'test'):
      raise ValueError(f"split must be 'train' or 'test', got {self.split!r}")
    if self.epochs < 1:
      raise ValueError(f'epochs must be >= 1, got {self.epochs}')
    if self.sampling not in simulation.SAMPLING_SCHEMES:
      raise ValueError(
          f'unknown sampling {self.sampling!r}; choose one of: '
          f'{", ".join(simulation.SAMPLING_SCHEMES)}'
      )
    if self.client_index and self.split != 'train':
      raise ValueError('client_index applies to the train split only')

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> 'DataSpec':
    return cls(**json.loads(text))

  @property
  def task_object(self) -> task_base.FederatedTask:
    return _task_for(self.task, self.task_kwargs)

  def client_ids(self) -> list[str]:
    data = (
        self.task_object.train_data
        if self.split == 'train'
        else self.task_object.test_data
    )
    return list(data.client_ids)


_TYPES: dict[str, tff.FederatedType] = {}


def _federated_type(spec: DataSpec) -> tff.FederatedType:
  """The federated type of the streams `spec` selects (cached)."""
  key = spec.to_json()
  if key not in _TYPES:
    _TYPES[key] = _compute_federated_type(spec)
  return _TYPES[key]


def _compute_federated_type(spec: DataSpec) -> tff.FederatedType:
  task = spec.task_object
  cid = spec.client_ids()[0]
  if spec.split == 'train':
    element = task.train_dataset(cid, 1, None).element_spec
  else:
    element = task.eval_dataset(cid, 'test').element_spec
  member = tff.SequenceType(tff.types.tensorflow_to_type(element))
  if spec.client_index:
    member = tff.StructType(
        [('data', member), ('client_index', tff.SequenceType(np.int32))]
    )
  return tff.FederatedType(member, tff.CLIENTS)


class ClientDataSourceIterator(tff.program.FederatedDataSourceIterator):
  """Selects the clients of one round after another, reproducibly.

  The k clients of the r-th `select(k)` are `run.simulation.sample_clients`
  of round r, with the training binary's per-round shuffles: a program run
  selects exactly what `run.train` selects with the same seed. Test-split
  selections of every test client keep their stored order. The iterator is
  serialized as its `DataSpec` and round counter.
  """

  def __init__(self, spec: DataSpec, round_num: int = 0):
    spec.validate()
    self._spec = spec
    self._round_num = round_num
    self._federated_type = _federated_type(spec)

  @classmethod
  def from_bytes(cls, buffer: bytes) -> 'ClientDataSourceIterator':
    """Deserializes the iterator from `to_bytes`'s output."""
    saved = json.loads(bytes(buffer).decode('utf-8'))
    return cls(DataSpec.from_json(saved['spec']), int(saved['round_num']))

  def to_bytes(self) -> bytes:
    """Serializes the iterator: its `DataSpec` and round counter."""
    return json.dumps(
        {'spec': self._spec.to_json(), 'round_num': self._round_num}
    ).encode('utf-8')

  @property
  def federated_type(self) -> tff.FederatedType:
    """The type of `select`'s result."""
    return self._federated_type

  @property
  def round_num(self) -> int:
    """The number of selections made so far."""
    return self._round_num

  def select(self, k: Optional[int] = None) -> list[Any]:
    """The datasets of the next round's `k` clients.

    Args:
      k: Number of clients, in [1, number of clients of the split].

    Returns:
      A list of `tf.data.Dataset`s (with the client's index for AFL).

    Raises:
      ValueError: If `k` is out of range.
    """
    for check in _divergence_checks:  # Stops train_model after a NaN round.
      check.check()
    ids = self._spec.client_ids()
    if k is None or not 1 <= k <= len(ids):
      raise ValueError(
          f'k must be in [1, {len(ids)}] (clients of the {self._spec.split} '
          f'split), got {k}'
      )
    self._round_num += 1
    spec, task, round_num = self._spec, self._spec.task_object, self._round_num
    if spec.split == 'test':
      chosen = (
          ids
          if k == len(ids)
          else simulation.sample_clients(
              ids, round_num, clients_per_round=k, seed=spec.seed
          )
      )
      return [task.eval_dataset(cid, 'test') for cid in chosen]
    num_examples = None
    if spec.sampling == 'examples':
      num_examples = [
          task_base.count_examples(
              task.train_data.create_tf_dataset_for_client(cid)
          )
          for cid in ids
      ]
    chosen = simulation.sample_clients(
        ids,
        round_num,
        clients_per_round=k,
        seed=spec.seed,
        scheme=spec.sampling,
        num_examples=num_examples,
    )
    schedule = stragglers_lib.StragglerSchedule(
        fraction=0.0, epochs=spec.epochs, drop_stragglers=False, seed=spec.seed
    )
    plans = schedule.participants(round_num, chosen)
    config = simulation.SimulationConfig(
        total_rounds=round_num,
        clients_per_round=k,
        client_epochs_per_round=spec.epochs,
        seed=spec.seed,
    )
    datasets = simulation.client_datasets(task, plans, round_num, config)
    if spec.client_index:
      datasets = simulation.with_client_index(
          datasets, plans, {cid: i for i, cid in enumerate(ids)}
      )
    return datasets

  def __deepcopy__(self, memo) -> 'ClientDataSourceIterator':
    # `train_model` deep-copies the iterator each round; the spec and the
    # type are immutable, only the round counter is the iterator's state.
    del memo
    return ClientDataSourceIterator(self._spec, self._round_num)

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, ClientDataSourceIterator):
      return NotImplemented
    return (
        self._spec == other._spec  # pylint: disable=protected-access
        and self._round_num == other._round_num
    )  # pylint: disable=protected-access


class ClientDataSource(tff.program.FederatedDataSource):
  """A `tff.program.FederatedDataSource` over a task's clients."""

  def __init__(self, spec: DataSpec):
    spec.validate()
    self._spec = spec
    self._federated_type = _federated_type(spec)

  @property
  def federated_type(self) -> tff.FederatedType:
    """The type of the data its iterators select."""
    return self._federated_type

  @property
  def num_clients(self) -> int:
    """Clients of the split."""
    return len(self._spec.client_ids())

  def iterator(self) -> ClientDataSourceIterator:
    """A fresh iterator, starting at round 1."""
    return ClientDataSourceIterator(self._spec)


@dataclasses.dataclass(frozen=True)
class ProgramConfig:
  """How a program trains and evaluates.

  Attributes:
    total_rounds: Rounds to train (>= 1).
    clients_per_round: Clients per training round.
    rounds_per_eval: Start an evaluation every this many rounds (0: only
      after the last round).
    eval_clients: Test clients per evaluation (0: every test client).
    evaluate_per_client: After training, evaluate the final model on every
      test and training client and write `clients/` and `summary.json`.
  """

  total_rounds: int
  clients_per_round: int
  rounds_per_eval: int = 0
  eval_clients: int = 0
  evaluate_per_client: bool = True

  def validate(self, num_train: int, num_test: int) -> None:
    """Raises ValueError naming the first flag with an impossible value."""
    checks = [
        (
            self.total_rounds >= 1,
            f'total_rounds must be >= 1, got {self.total_rounds}',
        ),
        (
            self.total_rounds <= simulation.MAX_ROUNDS,
            f'total_rounds must be <= {simulation.MAX_ROUNDS:,}, got '
            f'{self.total_rounds:,}',
        ),
        (
            1 <= self.clients_per_round <= num_train,
            f'clients_per_round must be in [1, {num_train}] (training clients),'
            f' got {self.clients_per_round}',
        ),
        (
            self.rounds_per_eval >= 0,
            f'rounds_per_eval must be >= 0, got {self.rounds_per_eval}',
        ),
        (
            0 <= self.eval_clients <= num_test,
            f'eval_clients must be in [0, {num_test}] (test clients), got '
            f'{self.eval_clients}',
        ),
    ]
    for ok, message in checks:
      if not ok:
        raise ValueError(message)


class ProgramError(RuntimeError):
  """The program cannot resume the state found in its output folder."""


def _is_finalize_callback(context: Mapping[str, Any]) -> bool:
  """Whether an event-loop error report comes from a TFF task's callback."""
  callback = getattr(context.get('handle'), '_callback', None)
  return getattr(callback, '__name__', None) == '_finalize_task'


class BackgroundErrors:
  """The errors of TFF's background tasks, kept for the program to raise.

  `train_model`'s `TaskManager` and the `EvaluationManager` re-raise a
  failed task's error (a program-state save on a full disk, an evaluation
  that found the training diverged) in the task's done-callback, where the
  event loop can only log it as an `Exception in callback ..._finalize_task`
  traceback, and `train_model` goes on. Installed as the event loop's
  exception handler, this keeps such errors instead and drops the reports of
  cancelled tasks; `check()` raises the first kept error.
  """

  def __init__(self):
    self.errors: list[BaseException] = []

  def __call__(
      self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]
  ) -> None:
    error = context.get('exception')
    if isinstance(error, asyncio.CancelledError):
      return
    if error is not None and _is_finalize_callback(context):
      self.errors.append(error)
      return
    loop.default_exception_handler(context)

  def check(self) -> None:
    if self.errors:
      raise self.errors[0]


async def end_background_tasks(timeout: float = 60.0) -> None:
  """Lets the other tasks of this event loop end; cancels the rest quietly.

  When the program logic stops with an error (e.g. training diverged),
  `tff.learning.programs.train_model` leaves its background tasks (program
  state saves, metric releases, evaluations) running; `asyncio.run` would
  cancel them, and each cancelled task's done-callback in TFF's task manager
  prints a `CancelledError` traceback. They are given `timeout` seconds to
  finish (a started save completes); those still running are cancelled (run
  it under `BackgroundErrors`, which silences their reports).
  """
  current = asyncio.current_task()
  others = [t for t in asyncio.all_tasks() if t is not current]
  if not others:
    return
  _, pending = await asyncio.wait(others, timeout=timeout)
  for task in pending:
    task.cancel()
  if pending:
    await asyncio.wait(pending, timeout=5.0)


def check_config(output_dir: str, settings: Mapping[str, Any]) -> None:
  """Raises `ProgramError` if `output_dir` holds a program with other
  settings (besides `RESUMABLE_KEYS`) or unreadable ones; writes nothing."""
  path = os.path.join(output_dir, PROGRAM_CONFIG)
  if not os.path.exists(path):
    return
  try:
    with open(path, encoding='utf-8') as f:
      saved = json.load(f)
  except (OSError, ValueError) as e:
    raise ProgramError(
        f'{path} cannot be read ({e}); remove that folder to start over'
    ) from None
  if not isinstance(saved, dict):
    raise ProgramError(f"{path} is not a program's settings")
  changed = sorted(
      k
      for k in set(saved) | set(settings)
      if k not in RESUMABLE_KEYS and saved.get(k) != settings.get(k)
  )
  if changed:
    details = ', '.join(
        f'{k}: {saved.get(k)!r} -> {settings.get(k)!r}' for k in changed[:4]
    )
    raise ProgramError(
        f'{output_dir} holds a program with other settings ({details}); '
        'use another output folder or remove that one to start over'
    )


def save_config(output_dir: str, settings: Mapping[str, Any]) -> None:
  """Writes `program_config.json` (whole or not at all)."""
  atomic.write_text(
      os.path.join(output_dir, PROGRAM_CONFIG),
      json.dumps(dict(settings), indent=2, sort_keys=True, default=str),
  )


def create_context(
    *, secure: bool = False
) -> tff.program.NativeFederatedContext:
  """A `NativeFederatedContext` over TFF's async local C++ context.

  Args:
    secure: Use TFF's async test context instead, the only TFF 0.87 context
      that executes secure sums (it replaces them by plain sums): needed by
      Delta-FL's secure quantile estimators.
  """
  if secure:
    context = tff.backends.test.create_async_test_cpp_execution_context()
  else:
    context = tff.backends.native.create_async_local_cpp_execution_context()
  return tff.program.NativeFederatedContext(context)


class KeyedEnds:
  """One future per key (a round, a version), done when that key's work ends.

  `run` does the work and ends the key's future with it (its error, if it
  failed; cancelled, if cancelled); `wait` returns once it has ended,
  whichever of the two comes first, and forgets the key. `train_model` runs
  a round's release and its program-state save as background tasks; the
  program waits for them by key.
  """

  def __init__(self):
    self._futures: dict[int, asyncio.Future] = {}

  def _future(self, key: int) -> asyncio.Future:
    if key not in self._futures:
      future = asyncio.get_running_loop().create_future()
      # Its error is the work's own (raised there); `wait` raises it again.
      future.add_done_callback(lambda f: f.cancelled() or f.exception())
      self._futures[key] = future
    return self._futures[key]

  async def run(self, key: int, work: Awaitable[Any]) -> None:
    """Awaits `work`, then ends `key` as it ended."""
    ended = self._future(key)
    try:
      await work
    except asyncio.CancelledError:
      ended.cancel()
      raise
    except BaseException as e:
      if not ended.done():
        ended.set_exception(e)
      raise
    if not ended.done():
      ended.set_result(None)

  async def wait(self, key: int) -> None:
    """Returns once `key`'s work has ended.

    Raises:
      The work's error, if it failed.
    """
    try:
      await asyncio.shield(self._future(key))
    finally:
      self._futures.pop(key, None)


class DivergenceCheck(tff.program.ReleaseManager):
  """Releases a round's metrics unless a loss is not finite.

  A non-finite `loss` is recorded in `diverged` as `(round, loss)` and not
  released; `check()` then raises `ProgramError`. (`train_model` releases
  metrics in background tasks, whose exceptions it does not propagate, so
  the program checks at the next selection of clients and at the end.)
  """

  def __init__(self, inner: tff.program.ReleaseManager, what: str = 'train'):
    self._inner = inner
    self._what = what
    self.diverged: Optional[tuple[int, float]] = None
    self._ended = KeyedEnds()  # Each round's release.

  async def written(self, key: int) -> None:
    """Returns once round `key`'s metrics are released (or withheld).

    Raises:
      The release's error, if it failed.
    """
    await self._ended.wait(key)

  async def release(self, value, key) -> None:
    """Appends one round of metrics to the CSV file."""
    await self._ended.run(int(key), self._release(value, key))

  async def _release(self, value, key) -> None:
    value = await tff.program.materialize_value(value)
    flat = {}
    simulation._flatten('', value, flat)  # pylint: disable=protected-access
    for name, loss in flat.items():
      if (
          name.split('/')[-1] == 'loss'
          and isinstance(loss, (int, float))
          and not np.isfinite(loss)
      ):
        if self.diverged is None:
          self.diverged = (int(key), float(loss))
        return
    await self._inner.release(value, key=key)

  def check(self) -> None:
    if self.diverged is not None:
      round_num, loss = self.diverged
      raise ProgramError(
          f'training diverged at round {round_num} ({self._what} loss '
          f'{loss}); lower the learning rates. The program states of '
          'earlier rounds are kept.'
      )


# What a training round's `select` checks first (`DivergenceCheck`s and the
# program's `BackgroundErrors`): `train_model` stops at the next round.
_divergence_checks: list[Any] = []


def _release_managers(output_dir: str, name: str, csv_file: str):
  return tff.program.GroupingReleaseManager(
      [
          tff.program.CSVFileReleaseManager(
              os.path.join(output_dir, csv_file), key_fieldname='round_num'
          ),
          tff.program.TensorBoardReleaseManager(
              os.path.join(output_dir, 'tensorboard', name)
          ),
      ]
  )


# TFF's names (`evaluation_program_logic`) for the manager's own state and
# each evaluation's state under `evaluation/`.
_EVAL_MANAGER_STATE = 'eval_manager'
_EVAL_STATE = re.compile(r'evaluation_of_train_round_(\d+)')


class EvaluationAfterState(tff.learning.programs.EvaluationManager):
  """TFF's `EvaluationManager` that resumes only the evaluations of saved
  training rounds.

  `train_model` starts round N's evaluation (and saves its state) before
  round N's training state is saved, and `StateAfterMetrics` holds that
  save until round N's metrics row is written. A program stopped in
  between resumes after round N - 1, trains round N again and would start
  its evaluation on a state TFF already saved (`ProgramStateExistsError`).
  Here the evaluations of rounds after `saved_round`, the last saved
  training state's, are forgotten on resume: started again with the round.
  """

  def __init__(self, *args, root_dir: str, saved_round: int, **kwargs):
    super().__init__(*args, **kwargs)
    self._root_dir = root_dir
    self._saved_round = saved_round

  async def resume_from_previous_state(self) -> None:
    """Drops the evaluations of unsaved rounds, then resumes the rest."""
    manager = self.create_state_manager_fn(_EVAL_MANAGER_STATE)
    empty = np.zeros([0], np.int32)
    loaded, version = await manager.load_latest((empty, empty))
    if loaded is not None:
      rounds, starts = (np.asarray(v) for v in loaded)
      keep = rounds <= self._saved_round
      if not keep.all():
        await manager.save((rounds[keep], starts[keep]), version=version + 1)
    await asyncio.to_thread(self._remove_unsaved_rounds)
    await super().resume_from_previous_state()

  def _remove_unsaved_rounds(self) -> None:
    """Removes the state folders of evaluations of unsaved rounds."""
    if not os.path.isdir(self._root_dir):
      return
    for name in os.listdir(self._root_dir):
      match = _EVAL_STATE.fullmatch(name)
      if match and int(match.group(1)) > self._saved_round:
        shutil.rmtree(os.path.join(self._root_dir, name))


def build_evaluation_manager(
    model_fn: task_base.ModelFn,
    data_source: tff.program.FederatedDataSource,
    *,
    output_dir: str,
    cohort_size: int,
    divergence_checks: Optional[list[DivergenceCheck]] = None,
    saved_round: int,
) -> EvaluationAfterState:
  """TFF's `EvaluationManager` running `build_fed_eval` on `data_source`.

  Each evaluation runs one round of `cohort_size` clients; its state lives
  under `output_dir/evaluation/` so interrupted evaluations resume (those of
  rounds after `saved_round`, the last saved training round, start again
  with their round: `EvaluationAfterState`), and its metrics go to
  `evaluation.csv` and `tensorboard/evaluation`. With `divergence_checks`,
  a `DivergenceCheck` of the evaluation metrics is appended to it (an
  evaluation loss that is not finite is not released).
  """
  metrics_manager = _release_managers(
      output_dir, 'evaluation', 'evaluation.csv'
  )
  if divergence_checks is not None:
    metrics_manager = DivergenceCheck(metrics_manager, 'evaluation')
    divergence_checks.append(metrics_manager)

  root_dir = os.path.join(output_dir, 'evaluation')

  def create_state_manager(name: str) -> tff.program.FileProgramStateManager:
    return tff.program.FileProgramStateManager(os.path.join(root_dir, name))

  def create_process(name: str):
    del name
    return tff.learning.algorithms.build_fed_eval(model_fn), None

  return EvaluationAfterState(
      data_source=data_source,
      aggregated_metrics_manager=metrics_manager,
      create_state_manager_fn=create_state_manager,
      create_process_fn=create_process,
      cohort_size=cohort_size,
      duration=datetime.timedelta(seconds=0),
      root_dir=root_dir,
      saved_round=saved_round,
  )


class StateAfterMetrics(run_dir.CheckpointManager):
  """Saves a round's program state once its metrics row is written.

  `train_model` saves round N's state and releases its metrics in two
  background tasks; a program killed after the save and before the row is
  written resumed after round N with no row N in `metrics.csv`. Here the
  save of version N > 0 waits for `metrics.written(N)` (and fails with the
  release's error), so a saved version always has its row; a row written
  without its version is written again by the resumed round (TFF's CSV
  release manager first drops the rows of later or equal rounds).
  """

  def __init__(self, root_dir: str, metrics: DivergenceCheck, **kwargs):
    super().__init__(root_dir, **kwargs)
    self._metrics = metrics
    self._saving = asyncio.Lock()

  async def save(self, program_state, version: int) -> None:
    """Saves `program_state` as `version` after that round's metrics.

    One save at a time, in the order asked: `train_model` starts each
    round's save in the background, and two saves at once both removed the
    same old version (TFF's `FileProgramStateManager` keeps the last few),
    the second failing with `NotFoundError` mid-program.
    """
    async with self._saving:
      if version > 0:
        await self._metrics.written(int(version))
      await super().save(program_state, version)


@dataclasses.dataclass(frozen=True)
class ProgramManagers:
  """Where a program saves its state and releases its metrics and models.

  Attributes:
    state: The program state, `output_dir/program_state/` (the first and the
      last two versions are kept); a round's version is saved after its
      metrics are released (`StateAfterMetrics`).
    metrics: The training metrics (`metrics.csv`, `tensorboard/train`),
      withheld and raised by `check()` when a loss is not finite.
    models: The training state every 10 rounds and at the end (`models/`).
  """

  state: StateAfterMetrics
  metrics: DivergenceCheck
  models: tff.program.SavedModelFileReleaseManager


def program_managers(output_dir: str) -> ProgramManagers:
  """The program's state and release managers under `output_dir`."""
  metrics = DivergenceCheck(
      _release_managers(output_dir, 'train', 'metrics.csv')
  )
  return ProgramManagers(
      state=StateAfterMetrics(
          os.path.join(output_dir, 'program_state'),
          metrics,
          keep_total=3,
          keep_first=True,
      ),
      metrics=metrics,
      models=tff.program.SavedModelFileReleaseManager(
          os.path.join(output_dir, 'models'), prefix=''
      ),
  )


class ClientStatesPart(Protocol):
  """The optional stateful part of a program (`run.stateful_program`'s).

  `run_program` without one trains under `train_model` itself. With one
  (Ditto, Fed+), the part trains the rounds (also under `train_model`, with
  its own data source, round process and program-state manager) and keeps
  the clients' states, and their personal models are evaluated with the
  global one.
  """

  outputs: str  # The folders and files the binary names when it ends.

  def settings(self) -> dict[str, Any]:
    """Its settings, saved with the program's (`program_config.json`)."""

  def check(self, process, task: task_base.FederatedTask) -> None:
    """Raises `TypeError` / `ValueError` if it cannot run `process`."""

  async def train(
      self,
      process,
      spec: DataSpec,
      config: ProgramConfig,
      output_dir: str,
      managers: ProgramManagers,
  ) -> tuple[Any, int]:
    """Trains up to `config.total_rounds`; the final state and its round."""

  def personal_per_client(
      self, process, state, task: task_base.FederatedTask
  ) -> Mapping[str, Any]:
    """The per-client tables of the personal models (`personal/...`)."""

  def result(self) -> dict[str, Any]:
    """What `run_program` returns besides the state and tables."""

  def error_message(self, error: Exception, output_dir: str) -> Optional[str]:
    """The binary's one-line message for an error of the part, else None."""


async def _train(
    process, model_fn, train_source, eval_source, config, output_dir, managers
):
  evaluation_manager = None
  if eval_source is not None:
    # The round `train_model` resumes after (a damaged newest version is
    # set aside here, as `train_model`'s own load would).
    _, saved_round = await managers.state.load_latest(
        await _state_structure(process, train_source)
    )
    evaluation_manager = build_evaluation_manager(
        model_fn,
        eval_source,
        output_dir=output_dir,
        cohort_size=config.eval_clients or eval_source.num_clients,
        divergence_checks=_divergence_checks,
        saved_round=saved_round,
    )
  await tff.learning.programs.train_model(
      train_process=process,
      train_data_source=train_source,
      train_per_round_clients=config.clients_per_round,
      train_total_rounds=config.total_rounds,
      program_state_manager=managers.state,
      model_output_manager=managers.models,
      train_metrics_manager=managers.metrics,
      evaluation_manager=evaluation_manager,
      evaluation_periodicity=config.rounds_per_eval or config.total_rounds,
  )
  # The state the program ended with, as a resumed program would load it.
  saved, version = await managers.state.load_latest(
      await _state_structure(process, train_source)
  )
  return saved.state, version


async def _state_structure(process, train_source):
  """The structure `train_model` saves its program state in."""
  initial = await tff.program.materialize_value(process.initialize())
  return tff.learning.programs.ProgramState(
      initial, 0, 0, train_source.iterator()
  )


def _run_rounds(context, output_dir: str, train) -> tuple[Any, int]:
  """Runs `train(managers)` in `context` on an event loop of its own.

  TFF's background tasks' errors are raised by the program
  (`BackgroundErrors`), a training round stops after a round whose loss is
  not finite, the tasks still running after an error are ended, and the
  temporary files of interrupted writes are removed.
  """

  async def train_in_context():
    errors = BackgroundErrors()
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(errors)
    managers = program_managers(output_dir)
    _divergence_checks[:] = [errors, managers.metrics]
    # The context stack is per thread: install it where the program runs.
    with tff.framework.get_context_stack().install(context):
      try:
        state, round_num = await train(managers)
        for check in _divergence_checks:
          check.check()
        return state, round_num
      except Exception:
        await end_background_tasks()
        raise
      finally:
        _divergence_checks.clear()
        loop.set_exception_handler(previous)

  try:
    return simulation.run_async(train_in_context())
  finally:
    run_dir.remove_temp_files(output_dir)  # Of writes a failure interrupted.


_CLIENT_INDEX_REFUSAL = (
    'cannot run as a TFF 0.87 program: NativeFederatedContext materializes a '
    'CLIENTS-placed struct as one struct, not one per client (the client '
    'data carry the client index (AFL)); use run.train'
)


def check_process(process) -> None:
  """Raises `TypeError` / `ValueError` if `process` cannot run as a program."""
  if stateful.is_stateful(process):
    raise TypeError(
        'stateful-client processes (Ditto, Fed+) keep per-client state that '
        'only run.stateful_program carries; run them with '
        'run.stateful_program.run_stateful_program'
    )
  if not isinstance(process, tff.learning.templates.LearningProcess):
    raise TypeError(
        f'process must be a tff.learning.templates.LearningProcess, got '
        f'{type(process).__name__}'
    )
  if simulation.needs_client_index(process):
    raise ValueError(f'this process {_CLIENT_INDEX_REFUSAL}')


def run_program(
    process,
    *,
    task_name: str,
    task_kwargs: Mapping[str, Any],
    config: ProgramConfig,
    output_dir: str,
    seed: int = 0,
    client_epochs_per_round: int = 1,
    client_sampling: str = 'uniform',
    evaluate: bool = True,
    secure: bool = False,
    settings: Optional[Mapping[str, Any]] = None,
    client_states: Optional[ClientStatesPart] = None,
) -> dict[str, Any]:
  """Runs `process` as a program: under `train_model`, or with client states.

  Args:
    process: A `LearningProcess` built for the task's model (any of our
      `build_*`, or TFF's own); with `client_states`, the process that part
      runs (`run.stateful_program`: Ditto, Fed+).
    task_name: A `tasks.registry` task name.
    task_kwargs: Its `create_task` arguments (JSON-able: they are saved with
      the data iterator in the program state).
    config: Rounds, cohort and evaluation settings.
    output_dir: Program state, metrics and models; a program found there is
      resumed from its last saved round.
    seed: Seed of client selection and shuffles.
    client_epochs_per_round: Local epochs per round.
    client_sampling: `uniform` or `examples`.
    evaluate: Run `EvaluationManager` evaluations on the test clients
      (without `client_states` only).
    secure: Run under TFF's test context (secure sums executed as sums).
    settings: Extra JSON-able settings saved to `program_config.json`;
      resuming with other values (besides `RESUMABLE_KEYS`) is refused.
    client_states: The stateful part (`run.stateful_program.ClientStates`):
      it trains the rounds, keeps the clients' states, and adds its personal
      models to the per-client tables.

  Returns:
    `{'state', 'round_num', 'final_summaries', 'per_client'}` and the
    part's `result()`: the final training state as loaded from the program
    state, its round, and (with `config.evaluate_per_client`) the per-client
    tables of the final model (and personal models).

  Raises:
    TypeError: If `process` cannot run as this program.
    ValueError: For impossible settings.
    ProgramError: If `output_dir` holds a program with other settings.
  """
  runtime.install_worker_cleanup()
  task = _task_for(task_name, task_kwargs)
  if client_states is None:
    check_process(process)
  else:
    client_states.check(process, task)
  spec = DataSpec(
      task=task_name,
      task_kwargs=dict(task_kwargs),
      split='train',
      seed=seed,
      epochs=client_epochs_per_round,
      sampling=client_sampling,
      client_index=(
          client_states is None and simulation.needs_client_index(process)
      ),
  )
  spec.validate()
  config.validate(
      len(task.train_data.client_ids), len(task.test_data.client_ids)
  )
  all_settings = {
      **dict(settings or {}),
      'task': task_name,
      'task_kwargs': dict(task_kwargs),
      'seed': seed,
      'client_epochs_per_round': client_epochs_per_round,
      'client_sampling': client_sampling,
      'clients_per_round': config.clients_per_round,
      'total_rounds': config.total_rounds,
      'rounds_per_eval': config.rounds_per_eval,
      **(
          {'eval_clients': config.eval_clients, 'evaluate': evaluate}
          if client_states is None
          else client_states.settings()
      ),
  }
  with run_dir.locked(
      output_dir,
      'program' if client_states is None else STATEFUL_WRITER,
      check=lambda: check_config(output_dir, all_settings),
  ):
    save_config(output_dir, all_settings)
    run_dir.remove_temp_files(output_dir)  # Of a program killed while it wrote.
    if client_states is None:
      eval_source = (
          ClientDataSource(
              dataclasses.replace(spec, split='test', client_index=False)
          )
          if evaluate
          else None
      )
      train = functools.partial(
          _train,
          process,
          task.model_fn,
          ClientDataSource(spec),
          eval_source,
          config,
          output_dir,
      )
    else:
      train = functools.partial(
          client_states.train, process, spec, config, output_dir
      )
    state, round_num = _run_rounds(
        create_context(secure=secure), output_dir, train
    )
    result = {
        'state': state,
        'round_num': round_num,
        **(client_states.result() if client_states else {}),
        'final_summaries': None,
        'per_client': None,
    }
    if config.evaluate_per_client:
      personal = (
          client_states.personal_per_client(process, state, task)
          if client_states
          else None
      )
      result.update(
          write_per_client(
              process, state, task, output_dir, round_num, extra=personal
          )
      )
    return result


def check_finite_per_client(
    per_client: Mapping[str, Mapping[str, Any]], round_num: int
) -> None:
  """Raises `ProgramError` if a client's metric is not finite.

  The last round can overflow the model while its training loss (computed
  before the round's update) is still finite: only the final evaluation
  sees it.
  """
  for split, values in per_client.items():
    for name, column in values.items():
      if name == 'client_id':
        continue
      array = np.asarray(column, dtype=np.float64)
      bad = np.flatnonzero(~np.isfinite(array))
      if bad.size:
        client = values['client_id'][bad[0]] if 'client_id' in values else '?'
        client = client.decode() if isinstance(client, bytes) else client
        raise ProgramError(
            f'training diverged by round {round_num} ({split} {name} '
            f'{array[bad[0]]} on client {client}, {bad.size} of '
            f'{array.size} clients not finite); lower the learning rates. '
            'The program states of earlier rounds are kept.'
        )


def write_per_client(
    process,
    state,
    task: task_base.FederatedTask,
    output_dir: str,
    round_num: int,
    extra: Optional[Mapping[str, Any]] = None,
) -> dict[str, Any]:
  """Evaluates `state`'s model on every client; writes the binary's files.

  Writes `clients/round_NNNNN.csv` and `summary.json` / `summary.txt` as
  `run.simulation` does (so `run.report` reads the folder). `extra`: more
  per-client tables (e.g. `personal/test`) summarized with them.
  """
  per_client = simulation.evaluate_per_client(
      task,
      evaluation.build_per_client_evaluation(task.model_fn),
      process.get_model_weights(state),
      include_train=True,
  )
  per_client.update(extra or {})
  check_finite_per_client(per_client, round_num)
  summaries = simulation.summarize(per_client)
  clients_dir = os.path.join(output_dir, 'clients')
  os.makedirs(clients_dir, exist_ok=True)
  path = os.path.join(clients_dir, f'round_{round_num:05d}.csv')
  simulation.write_client_csv(path, per_client)
  atomic.write_json(
      os.path.join(output_dir, 'summary.json'),
      {
          'round_num': round_num,
          'task': task.description,
          'summaries': summaries,
      },
      indent=2,
      default=float,
  )
  with atomic.open_for_replace(os.path.join(output_dir, 'summary.txt')) as f:
    f.write(f'{task.description}; after round {round_num}\n')
    f.write(simulation.summary_table(summaries) + '\n')
  return {'final_summaries': summaries, 'per_client': per_client}


def model_weights_arrays(process, state) -> list[np.ndarray]:
  """The trainable weights of `state` as NumPy arrays."""
  weights = process.get_model_weights(state)
  return [np.asarray(w) for w in tf.nest.flatten(weights.trainable)]


# The run_dir writer of programs with client states (run.stateful_program).
STATEFUL_WRITER = 'stateful_program'
_OUTPUTS = (
    '(metrics.csv, evaluation.csv, clients/, summary.txt, tensorboard/, '
    'program_state/, models/)'
)


def _check_flags(values: flags.FlagValues, client_states: bool) -> None:
  """Raises `ValueError` for flags this program (with or without client
  states) refuses, before the output folder is looked at."""
  if values.straggler_fraction:
    raise ValueError(
        '--straggler_fraction is not supported by the program'
        ' logic (use run.train)'
    )
  stateful_algorithm = algorithms.AlgorithmSpec(values.algorithm).is_stateful
  if stateful_algorithm and not client_states:
    raise ValueError(
        f'--algorithm={values.algorithm} keeps per-client '
        'state: run it with python -m run.stateful_program'
    )
  if client_states and not stateful_algorithm:
    raise ValueError(
        f'--algorithm={values.algorithm} keeps no client '
        'state; run it with python -m run.program'
    )
  if values.simulation_engine in engines.ENGINE_NAMES and (
      values.simulation_engine != 'tff'
  ):  # An unknown engine is refused by name with the others, later.
    raise ValueError(
        f'--simulation_engine={values.simulation_engine} applies to run.train'
        " only: a program runs its rounds through TFF's runtime (use "
        '--simulation_engine=tff, the default)'
    )
  if values.stacked_size_groups:
    raise ValueError(
        '--stacked_size_groups applies to --simulation_engine=stacked of '
        'run.train only'
    )
  entry = algorithm_registry.ALGORITHMS.get(values.algorithm)
  if entry is not None and entry.client_index:
    raise ValueError(f'--algorithm={values.algorithm}: {_CLIENT_INDEX_REFUSAL}')
  if values.client_state_dir:
    raise ValueError(
        '--client_state_dir applies to run.train only (the program keeps '
        'the client states in <experiment>/client_states)'
    )


def _error_message(
    error: Exception, out_dir: str, client_states: Optional[ClientStatesPart]
) -> Optional[str]:
  """The one-line message of a failed program run, else None."""
  if isinstance(
      error,
      (ProgramError, task_base.TaskError, run_dir.RunDirError, ValueError),
  ):
    return str(error)
  if client_states is not None:
    message = client_states.error_message(error, out_dir)
    if message is not None:
      return message
  return run_dir.disk_full_message(error, out_dir)


def binary_main(
    argv: Sequence[str],
    client_states_from_flags: Optional[Callable[[], ClientStatesPart]] = None,
) -> int:
  """The program binaries' `main`: the training binary's flags.

  Args:
    argv: The arguments left after the flags.
    client_states_from_flags: Builds the stateful part from the flags
      (`run.stateful_program`); None: `run.program`.

  Returns:
    The exit status: 0, 1 (a failed run) or 2 (bad input).
  """
  stateful_binary = client_states_from_flags is not None
  prog = STATEFUL_WRITER if stateful_binary else 'program'
  if len(argv) > 1:
    print(
        f'{prog}: error: unexpected arguments: {" ".join(argv[1:])}',
        file=sys.stderr,
    )
    return 2
  logging.set_verbosity(logging.WARNING)
  runtime.install_worker_cleanup()
  values = flags.FLAGS
  try:
    _check_flags(values, stateful_binary)
    prepared = train.prepare(STATEFUL_WRITER if stateful_binary else 'program')
    task, process = prepared.task, prepared.process
    sim_config, out_dir = prepared.config, prepared.out_dir
    client_states = None
    if stateful_binary:
      client_states = client_states_from_flags()
      config = ProgramConfig(
          total_rounds=sim_config.total_rounds,
          clients_per_round=sim_config.clients_per_round,
      )
    else:
      check_process(process)
      config = ProgramConfig(
          total_rounds=sim_config.total_rounds,
          clients_per_round=sim_config.clients_per_round,
          rounds_per_eval=sim_config.rounds_per_eval,
          eval_clients=_EVAL_CLIENTS.value,
      )
    config.validate(
        len(task.train_data.client_ids), len(task.test_data.client_ids)
    )
    secure = prepared.spec.uses_secure_intrinsics
  except (ValueError, TypeError, OSError) as e:
    print(f'{prog}: error: {e}', file=sys.stderr)
    return 2
  except run_dir.RunDirError as e:  # The folder is busy or another's.
    print(f'{prog}: error: {e}', file=sys.stderr)
    return 1
  try:
    result = run_program(
        process,
        task_name=values.task,
        task_kwargs=train.task_kwargs(),
        config=config,
        output_dir=out_dir,
        seed=sim_config.seed,
        client_epochs_per_round=sim_config.client_epochs_per_round,
        client_sampling=sim_config.client_sampling,
        secure=secure,
        settings={
            k: v
            for k, v in train.hparams().items()
            if k not in ('progress', 'root_output_dir', 'data_dir')
        },
        client_states=client_states,
    )
  except Exception as e:  # pylint: disable=broad-except
    message = _error_message(e, out_dir, client_states)
    if message is None:
      raise
    print(f'{prog}: error: {message}', file=sys.stderr)
    return 1
  finally:
    runtime.kill_workers()
  print(
      f'Per-client metrics after round {result["round_num"]} '
      f'({task.description}):'
  )
  print(simulation.summary_table(result['final_summaries']))
  outputs = client_states.outputs if client_states else _OUTPUTS
  print(f'\nOutputs: {out_dir}/ {outputs}')
  return 0


def main(argv: Sequence[str]) -> int:
  """`python -m run.program`: the training binary's flags, as a program."""
  return binary_main(argv)


def run_main(binary: Callable[[Sequence[str]], int] = main) -> None:
  """Console-script entry point (of `binary`, this module's `main`)."""
  flags.adopt_module_key_flags(train)  # --help lists the training flags.
  # Error lines start with the binary's name: program, stateful_program.
  console.run(binary.__module__, lambda argv: runtime.exit_now(binary(argv)))


if __name__ == '__main__':
  run_main()
