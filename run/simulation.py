# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The simulation loop: sample clients, train, evaluate per client, checkpoint.

`run_simulation(process, task, config, output_dir=...)` drives any
`tff.learning.templates.LearningProcess` on a `tasks.base.FederatedTask`:

* Client sampling is a pure function of `(seed, round)`, and so are the local
  shuffles and the straggler schedule: a run killed and resumed from its
  checkpoint ends with the same model as an uninterrupted one.
* Every `rounds_per_eval` rounds and at the end, the global model is evaluated
  on every test client (and, optionally, every training client) through the
  federated per-client evaluation, or, when the rounds run on a fast engine,
  through the engines' (`tff_algos.engine_eval`, the same metrics a chunk of
  clients per TensorFlow call); the per-client values are written to
  `clients/round_NNNNN.csv` and summarised (means, percentiles, worst/best
  10%, variance, superquantiles, angle, KL) into the metrics.
* Outputs under `output_dir`: `config.json` (the run's hyperparameters),
  `metrics.csv` (one row per round, as TFF's `CSVFileReleaseManager`
  writes it), `tensorboard/` (as its `TensorBoardReleaseManager`),
  `checkpoints/` (TFF's `FileProgramStateManager`), `clients/`, and
  `summary.json` / `summary.txt` with the final table.
"""

import asyncio
import collections
import csv
import dataclasses
import io
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from run import atomic
from run import run_dir
from tasks import base as task_base
from tasks import evaluation
from tasks import tail_metrics
from tff_algos import attacks
from tff_algos import client_states as client_states_lib
from tff_algos import batched
from tff_algos import engine_eval
from tff_algos import runtime
from tff_algos import stacked
from tff_algos import stateful
from tff_algos import stragglers as stragglers_lib

SAMPLING_SCHEMES = ('uniform', 'examples', 'poisson')
# Hyperparameters that may change when a run is resumed.
# The parts of the round loop timed in `timing.json` (this invocation's
# seconds): the rounds' training, the per-client evaluations, writing the
# round metrics (CSV, TensorBoard) and the checkpoints. The rest of a run's
# wall time is its start-up (data, building and tracing) and its end. Apart
# from summary.json, which stays the same for the same run. Beside them,
# `first_round`: the invocation's first round (> 1 when it resumed).
SECONDS = ('training', 'evaluation', 'metrics', 'checkpoints')
TIMING = 'timing.json'

RESUMABLE_KEYS = frozenset(
    {
        'total_rounds',
        'rounds_per_eval',
        'rounds_per_checkpoint',
        'progress',
        'root_output_dir',
        'data_dir',
        # How rounds execute, not what they compute.
        'simulation_engine',
        'workers',
        'max_concurrent_computation_calls',
        'loop_implementation',
    }
)
# Beyond these a run is a typo, not an experiment (the papers' longest runs
# are 10^4 rounds of at most a few hundred local epochs).
MAX_ROUNDS = 1_000_000
MAX_EPOCHS = 100_000
SUMMARY_COLUMNS = (
    'mean',
    'weighted_mean',
    'p10',
    'p50',
    'p90',
    'worst10',
    'best10',
    'variance',
)


_LOOP = None
_LOOP_LOCK = threading.Lock()


def _background_loop() -> asyncio.AbstractEventLoop:
  """One event loop, running forever on one daemon thread (made once)."""
  global _LOOP
  with _LOOP_LOCK:
    if _LOOP is None:
      loop = asyncio.new_event_loop()
      threading.Thread(
          target=loop.run_forever, name='tff-hetero-async', daemon=True
      ).start()
      _LOOP = loop
  return _LOOP


def run_async(coroutine):
  """`asyncio.run(coroutine)`, also where a loop already runs (Jupyter).

  Jupyter and Colab kernels run an event loop, in which `asyncio.run` fails;
  there the coroutine runs on one long-lived background loop and thread. (One
  thread for the whole session, not one per call: ipykernel 6.29 maps each
  thread to the thread that started it, and recycled thread ids can make that
  map cyclic, which hangs the next print from a thread.)
  """
  try:
    asyncio.get_running_loop()
    in_a_loop = True
  except RuntimeError:
    in_a_loop = False
  # Outside the `except` block: an error of the coroutine must not be chained
  # to the `RuntimeError` above ("During handling of the above exception").
  if not in_a_loop:
    return asyncio.run(coroutine)
  return asyncio.run_coroutine_threadsafe(
      coroutine, _background_loop()
  ).result()


class SimulationError(RuntimeError):
  """The simulation cannot start or continue (bad config, stale checkpoint)."""


@dataclasses.dataclass(frozen=True)
class SimulationConfig:
  """How a simulation samples clients, trains, evaluates and saves.

  Attributes:
    total_rounds: Rounds to train (>= 1).
    clients_per_round: Clients selected each round (<= number of clients).
    client_epochs_per_round: Local epochs E of a non-straggler.
    rounds_per_eval: Per-client evaluation every this many rounds (0: only
      at the end).
    rounds_per_checkpoint: Save a checkpoint every this many rounds (0: only
      at the end).
    seed: Seed of sampling, shuffling and the straggler schedule.
    client_sampling: `uniform` (the papers' experiments) or `examples`
      (probability proportional to local examples, without replacement), or
      `poisson` (each client independently with probability
      clients_per_round / N, the sampling of DP-FedAvg's accounting).
    straggler_fraction: Fraction of selected clients that straggle.
    drop_stragglers: Leave stragglers out (FedAvg) instead of aggregating
      their partial work (FedProx).
    eval_train_clients: Also evaluate every training client on its training
      data (the Delta-FL paper's training-loss percentiles).
    shuffle: Shuffle each client's data every epoch.
    attack: Corrupted clients (`tff_algos.attacks.AttackConfig`); metrics are
      then summarised over the benign clients, and over all under `all_`.
  """

  total_rounds: int
  clients_per_round: int
  client_epochs_per_round: int = 1
  rounds_per_eval: int = 10
  rounds_per_checkpoint: int = 10
  seed: int = 0
  client_sampling: str = 'uniform'
  straggler_fraction: float = 0.0
  drop_stragglers: bool = False
  eval_train_clients: bool = True
  shuffle: bool = True
  attack: Optional[attacks.AttackConfig] = None

  def validate(self, num_clients: int) -> None:
    """Raises `ValueError` with one clear message for an impossible config."""
    checks = [
        (
            self.total_rounds >= 1,
            f'total_rounds must be >= 1, got {self.total_rounds}',
        ),
        (
            self.total_rounds <= MAX_ROUNDS,
            f'total_rounds must be <= {MAX_ROUNDS:,}, '
            f'got {self.total_rounds:,}',
        ),
        (
            self.clients_per_round >= 1,
            f'clients_per_round must be >= 1, got {self.clients_per_round}',
        ),
        (
            self.clients_per_round <= num_clients,
            f'clients_per_round={self.clients_per_round} exceeds the '
            f'{num_clients} training clients of the task',
        ),
        (
            self.client_epochs_per_round >= 1,
            f'client_epochs_per_round must be >= 1, got '
            f'{self.client_epochs_per_round}',
        ),
        (
            self.client_epochs_per_round <= MAX_EPOCHS,
            f'client_epochs_per_round must be <= {MAX_EPOCHS:,}, got '
            f'{self.client_epochs_per_round:,}',
        ),
        (
            self.rounds_per_eval >= 0,
            f'rounds_per_eval must be >= 0, got {self.rounds_per_eval}',
        ),
        (
            self.rounds_per_checkpoint >= 0,
            'rounds_per_checkpoint must be >= 0, got '
            f'{self.rounds_per_checkpoint}',
        ),
        (
            self.client_sampling in SAMPLING_SCHEMES,
            f'client_sampling must be one of {SAMPLING_SCHEMES}, got '
            f'{self.client_sampling!r}',
        ),
        (
            0.0 <= self.straggler_fraction <= 1.0,
            'straggler_fraction must be in [0, 1], got '
            f'{self.straggler_fraction}',
        ),
    ]
    for ok, message in checks:
      if not ok:
        raise ValueError(message)
    if self.attack is not None:
      self.attack.validate()


def sample_clients(
    client_ids: Sequence[str],
    round_num: int,
    *,
    clients_per_round: int,
    seed: int,
    scheme: str = 'uniform',
    num_examples: Optional[Sequence[int]] = None,
) -> list[str]:
  """The clients selected in `round_num`; deterministic in (seed, round)."""
  rng = np.random.default_rng([seed, 104729, round_num])
  if scheme == 'poisson':
    keep = rng.random(len(client_ids)) < clients_per_round / len(client_ids)
    return [client_ids[i] for i in np.flatnonzero(keep)]
  if scheme == 'uniform':
    p = None
  elif scheme == 'examples':
    if num_examples is None:
      raise ValueError("scheme='examples' needs num_examples")
    counts = np.asarray(num_examples, dtype=np.float64)
    p = counts / counts.sum()
  else:
    raise ValueError(f'unknown sampling scheme {scheme!r}')
  chosen = rng.choice(
      len(client_ids), size=clients_per_round, replace=False, p=p
  )
  return [client_ids[i] for i in chosen]


def _flatten(prefix: str, value, out: dict[str, Any]) -> None:
  if isinstance(value, Mapping):
    for k, v in value.items():
      _flatten(f'{prefix}/{k}' if prefix else str(k), v, out)
  elif isinstance(value, (tuple, list)) and not isinstance(value, str):
    for i, v in enumerate(value):
      _flatten(f'{prefix}/{i}', v, out)
  else:
    array = np.asarray(value)
    if array.size == 1:
      out[prefix] = array.item()


def flatten_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
  """`{'client_work': {'train': {'loss': x}}}` -> `{'train/loss': x}`."""
  flat = {}
  _flatten('', metrics, flat)
  renamed = {}
  for key, value in flat.items():
    head, sep, tail = key.partition('client_work/train/')
    if sep and (not head or head.count('/') == 1):  # Also `member/...`.
      key = f'{head}train/{tail}'
    renamed[key] = value
  return renamed


class _MetricsCsv:
  """`metrics.csv`, one row per round, as TFF's `CSVFileReleaseManager`
  (WRITE mode) writes it, with the rows kept in memory.

  TFF's manager reads the whole file back before each row and rewrites it,
  which made writing metrics half of a Synthetic run's time (800 rounds).
  Here each round rewrites the file whole (`atomic`: a temporary file, then
  a rename) from memory: the same bytes, the same columns (the round first,
  then each round's new metric names, sorted), and the same
  resume rule: a round's row replaces it and every later row.
  """

  KEY = 'round_num'

  def __init__(self, path: str):
    self.path = path
    self._lines: Optional[list[str]] = None  # The rows, formatted.
    if os.path.exists(path):
      with open(path, newline='') as f:
        reader = csv.DictReader(f)
        self.fieldnames = list(reader.fieldnames or [])
        self.rows: list[dict[str, Any]] = list(reader)
    else:
      self.fieldnames, self.rows = [self.KEY], []
      self._write()

  def release(self, metrics: Mapping[str, Any], round_num: int) -> None:
    """Writes round `round_num`'s row (after dropping it and later rows)."""
    if self.rows and int(self.rows[-1][self.KEY]) >= round_num:
      self.rows = [r for r in self.rows if int(r[self.KEY]) < round_num]
      if not self.rows:
        self.fieldnames = [self.KEY]
      self._lines = None
      self._write()  # As TFF's manager: the later rows go first, whole.
    row = {self.KEY: round_num}
    # TFF flattens a release with its keys sorted.
    row.update((k, np.array(v).tolist()) for k, v in sorted(metrics.items()))
    new = [k for k in row if k not in self.fieldnames]
    if new:
      self.fieldnames.extend(new)
      self._lines = None  # Every row again, with the new columns.
    self.rows.append(row)
    if self._lines is not None:
      self._lines.append(self._line(row))
    self._write()

  def _line(self, row: Mapping[str, Any]) -> str:
    buffer = io.StringIO()
    csv.DictWriter(buffer, fieldnames=self.fieldnames).writerow(row)
    return buffer.getvalue()

  def _write(self) -> None:
    # Each row is formatted once (as csv.DictWriter writes it): rewriting
    # the file costs a join, not a new formatting of every row.
    if self._lines is None:
      self._lines = [self._line(r) for r in self.rows]
    header = io.StringIO()
    csv.DictWriter(header, fieldnames=self.fieldnames).writeheader()
    with atomic.open_for_replace(self.path, newline='') as f:
      f.write(header.getvalue() + ''.join(self._lines))


def _not_our_retracing(record: logging.LogRecord) -> bool:
  """TF warns when a `tf.function` is traced often; each run's writer traces
  its own (a worker runs many runs): not a problem, so not printed."""
  return '_TensorBoardScalars' not in record.getMessage()


tf.get_logger().addFilter(_not_our_retracing)


class _TensorBoardScalars:
  """`tensorboard/`: every round's metrics as scalars at step = the round,
  as TFF's `TensorBoardReleaseManager` writes them (one
  `tf.summary.scalar` per metric), in one traced function per set of metric
  names instead of one eager op each (about 75 ms a round for 60 metrics)."""

  def __init__(self, folder: str):
    self._writer = tf.summary.create_file_writer(folder)
    self._functions: dict[tuple[str, ...], Callable[..., Any]] = {}

  def release(self, metrics: Mapping[str, Any], round_num: int) -> None:
    """Writes round `round_num`'s numbers as scalars at that step."""
    # As float64: TensorFlow cannot make a float32 of a Python float
    # beyond 3.4e38 (the variance of losses near 1e30) and raises.
    values = {
        k: np.float64(v) if isinstance(v, float) else np.int64(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float))
    }
    names = tuple(values)
    write = self._functions.get(names)
    if write is None:
      writer = self._writer

      @tf.function
      def write(values, step):
        with writer.as_default():
          for name in names:
            tf.summary.scalar(name, values[name], step=step)

      self._functions[names] = write
    write(values, tf.constant(round_num, tf.int64))


class _Outputs:
  """Paths and writers of one run's output folder."""

  def __init__(self, output_dir: str, log: Callable[[str], None]):
    self.dir = output_dir
    self.clients_dir = os.path.join(output_dir, 'clients')
    os.makedirs(self.clients_dir, exist_ok=True)
    self.config_path = os.path.join(output_dir, 'config.json')
    self.state_manager = run_dir.CheckpointManager(
        os.path.join(output_dir, 'checkpoints'),
        log=log,
        keep_total=3,
        keep_first=False,
    )
    self.csv = _MetricsCsv(os.path.join(output_dir, 'metrics.csv'))
    self.tensorboard = _TensorBoardScalars(
        os.path.join(output_dir, 'tensorboard')
    )

  def release(self, metrics: Mapping[str, Any], round_num: int) -> None:
    """Writes one round of metrics to the CSV and to TensorBoard."""
    self.csv.release(metrics, round_num)
    self.tensorboard.release(metrics, round_num)


def check_settings(
    output_dir: str,
    hparams: Mapping[str, Any],
    *,
    ignore: frozenset[str] = frozenset(),
) -> None:
  """Refuses to resume a folder written with other hyperparameters.

  Args:
    output_dir: A run's folder (nothing to check if it has no config.json).
    hparams: The new run's hyperparameters.
    ignore: Keys not compared besides `RESUMABLE_KEYS` (e.g. ones the run
      adds later).

  Raises:
    SimulationError: Naming up to four changed settings, or an unreadable
      config.json.
  """
  config_path = os.path.join(output_dir, 'config.json')
  if not os.path.exists(config_path):
    return
  try:
    with open(config_path, encoding='utf-8') as f:
      saved = json.load(f)
  except (OSError, ValueError) as e:
    raise SimulationError(
        f'{config_path} cannot be read ({e}); remove that folder to start '
        'over'
    ) from None
  if not isinstance(saved, dict):
    raise SimulationError(f"{config_path} is not a run's settings")
  changed = sorted(
      k
      for k in set(saved) | set(hparams)
      if k not in RESUMABLE_KEYS
      and k not in ignore
      and saved.get(k) != hparams.get(k)
  )
  if changed:
    details = ', '.join(
        f'{k}: {saved.get(k)!r} -> {hparams.get(k)!r}' for k in changed[:4]
    )
    raise SimulationError(
        f'{output_dir} holds a run with other settings ({details}); use a new'
        ' --experiment_name or remove that folder to start over'
    )


class _ClientCounts:
  """Lazily counted examples and batches per client."""

  def __init__(self, task: task_base.FederatedTask):
    self._task = task
    self._examples = {}
    self._batches = {}

  def examples(self, cid: str) -> int:
    if cid not in self._examples:
      self._examples[cid] = task_base.count_examples(
          self._task.train_data.create_tf_dataset_for_client(cid)
      )
    return self._examples[cid]

  def batches(self, cid: str) -> int:
    if cid not in self._batches:
      self._batches[cid] = task_base.count_examples(
          self._task.train_dataset(cid, 1, None)
      )
    return self._batches[cid]


def client_shuffle_seed(
    config: SimulationConfig, round_num: int, i: int
) -> Optional[int]:
  """The local shuffle seed of a round's `i`-th participant (None: none)."""
  if not config.shuffle:
    return None
  return int(np.random.default_rng([config.seed, round_num, i]).integers(2**31))


def batched_round_plan(
    task: task_base.FederatedTask,
    plans: Sequence[stragglers_lib.ClientPlan],
    round_num: int,
    config: SimulationConfig,
    counts: Optional[_ClientCounts] = None,
    index_of: Optional[Mapping[str, int]] = None,
) -> batched.RoundPlan:
  """`client_datasets`'s settings as a `tff_algos.batched.RoundPlan`.

  `index_of` (client id -> index in the population, as `with_client_index`)
  gives the plan's `client_indices`, which AFL's definition needs.
  """
  max_batches = []
  for plan in plans:
    if plan.epoch_fraction < 1.0:
      counts = counts or _ClientCounts(task)
      max_batches.append(plan.num_batches(counts.batches(plan.client_id)))
    else:
      max_batches.append(-1)
  return batched.RoundPlan(
      client_ids=[p.client_id for p in plans],
      epochs=[p.epochs for p in plans],
      shuffle_seeds=(
          [client_shuffle_seed(config, round_num, i) for i in range(len(plans))]
          if config.shuffle
          else None
      ),
      max_batches=max_batches,
      client_indices=(
          [index_of[p.client_id] for p in plans]
          if index_of is not None
          else None
      ),
  )


def client_datasets(
    task: task_base.FederatedTask,
    plans: Sequence[stragglers_lib.ClientPlan],
    round_num: int,
    config: SimulationConfig,
    counts: Optional[_ClientCounts] = None,
) -> list[tf.data.Dataset]:
  """The preprocessed training datasets of a round's participants."""
  datasets = []
  for i, plan in enumerate(plans):
    ds = task.train_dataset(
        plan.client_id, plan.epochs, client_shuffle_seed(config, round_num, i)
    )
    if plan.epoch_fraction < 1.0:
      counts = counts or _ClientCounts(task)
      ds = ds.take(plan.num_batches(counts.batches(plan.client_id)))
    datasets.append(ds)
  return datasets


def needs_client_index(process: tff.learning.templates.LearningProcess) -> bool:
  """Whether the process's client data carry the client's index (AFL)."""
  member = process.next.type_signature.parameter[1].member
  if not isinstance(member, tff.StructType):
    return False
  names = [name for name, _ in tff.structure.iter_elements(member)]
  if attacks.MARKER_KEY in names:  # An attacked process: look inside.
    member = member['data']
    if not isinstance(member, tff.StructType):
      return False
    names = [name for name, _ in tff.structure.iter_elements(member)]
  return 'client_index' in names


def with_client_index(datasets, plans, index_of: Mapping[str, int]):
  """Pairs each dataset with its client's index, as AFL expects."""
  return [
      collections.OrderedDict(
          data=ds,
          client_index=tf.data.Dataset.from_tensors(
              np.int32(index_of[p.client_id])
          ),
      )
      for ds, p in zip(datasets, plans)
  ]


def per_client_evaluation(
    task: task_base.FederatedTask,
    engine=None,
    *,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
):
  """The per-client evaluation `evaluate_per_client` runs.

  With a fast engine (`engine` not None) the engines' evaluation
  (`tff_algos.engine_eval.EngineEvaluation`) where it runs the task's model
  and preprocessing (else a line to `log` says why not); otherwise, and on
  the TFF path, TFF's (`tasks.evaluation.build_per_client_evaluation`).
  """
  if engine is not None:
    try:
      return engine_eval.EngineEvaluation(
          task.model_fn, task.preprocess_eval, task.train_data
      )
    except stacked.StackedEngineError as e:
      log(f'per-client evaluation through TFF: {e}')
  return evaluation.build_per_client_evaluation(task.model_fn)


def evaluate_per_client(
    task: task_base.FederatedTask,
    eval_computation,
    model_weights,
    *,
    include_train: bool,
    chunk_size: int = 100,
) -> dict[str, dict[str, np.ndarray]]:
  """Per-client metrics: `{'test': {...}, 'train': {...}}` with client ids.

  With `task.unseen_data` (unseen clients beside the training clients'
  held-out `test_data`), also `'unseen'`. `eval_computation` is TFF's
  (`tasks.evaluation.build_per_client_evaluation`) or an
  `engine_eval.EngineEvaluation` (see `per_client_evaluation`).
  """
  splits = [('test', task.test_data)]
  if task.unseen_data is not None:
    splits.append(('unseen', task.unseen_data))
  if include_train:
    splits.append(('train', task.train_data))
  results = {}
  for split, data in splits:
    ids = list(data.client_ids)
    if isinstance(eval_computation, engine_eval.EngineEvaluation):
      values = dict(eval_computation.evaluate(model_weights, data, ids))
      values['client_id'] = np.asarray(ids)
      results[split] = values
      continue
    # Datasets made a chunk at a time: a lazily loaded task (LEAF's cache)
    # then holds one chunk's examples in memory, not the whole split's.
    parts = [
        evaluation.evaluate_clients(
            eval_computation,
            model_weights,
            [task.eval_dataset(cid, split) for cid in ids[i : i + chunk_size]],
            chunk_size=chunk_size,
        )
        for i in range(0, len(ids), chunk_size)
    ]
    values = {
        name: np.concatenate([p[name] for p in parts]) for name in parts[0]
    }
    values['client_id'] = np.asarray(ids)
    results[split] = values
  return results


def summarize(
    per_client: Mapping[str, Mapping[str, np.ndarray]],
) -> dict[str, dict[str, float]]:
  """Tail summaries of every per-client metric, keyed `split/metric`."""
  summaries = {}
  for split, values in per_client.items():
    n = values['num_examples']
    for metric, column in values.items():
      if metric in ('client_id', 'num_examples'):
        continue
      if metric == 'accuracy':
        kind = 'accuracy'
      elif metric == 'loss':
        kind = 'train_loss' if split.split('/')[-1] == 'train' else 'loss'
      else:
        kind = 'loss'
      summaries[f'{split}/{metric}'] = tail_metrics.summarize_clients(
          column, n, kind=kind
      )
      if metric == 'accuracy':
        # The Delta-FL paper reports misclassification-error percentiles.
        summaries[f'{split}/error'] = tail_metrics.summarize_clients(
            1.0 - np.asarray(column, np.float64), n, kind='error'
        )
  return summaries


def write_client_csv(path: str, per_client) -> None:
  """Writes `per_client` (split -> column -> values) as one CSV, whole.

  One row per split and client; the columns are the union over the splits
  (a personal split's `lambda`), empty where a split has none.
  """
  names = list(
      dict.fromkeys(
          k
          for values in per_client.values()
          for k in values
          if k != 'client_id'
      )
  )
  with atomic.open_for_replace(path, newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['split', 'client_id'] + names)
    for split, values in per_client.items():
      for i, cid in enumerate(values['client_id']):
        writer.writerow(
            [split, cid]
            + [_fmt(values[n][i]) if n in values else '' for n in names]
        )


def _fmt(x) -> str:
  x = np.asarray(x).item()
  return repr(round(x, 7)) if isinstance(x, float) else str(x)


def run_simulation(
    process: tff.learning.templates.LearningProcess,
    task: task_base.FederatedTask,
    config: SimulationConfig,
    *,
    output_dir: Optional[str] = None,
    hparams: Optional[Mapping[str, Any]] = None,
    progress: bool = True,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
    client_state_store: Optional[client_states_lib.ClientStateStore] = None,
    round_metrics_fn: Optional[Callable[[int], Mapping[str, Any]]] = None,
    summary_fn: Optional[Callable[[int], Mapping[str, Any]]] = None,
    engine: Optional[batched.BatchedEngine] = None,
) -> dict[str, Any]:
  """Trains `process` on `task` and evaluates it per client.

  Args:
    process: Any `LearningProcess` whose `next` takes client datasets.
    task: The federated task.
    config: Sampling, training and evaluation settings.
    output_dir: Where outputs and checkpoints go; a run found there is
      resumed (None: nothing is written and nothing resumed).
    hparams: JSON-able hyperparameters saved to `config.json`; resuming a
      folder written with other values (outside `RESUMABLE_KEYS`) is refused.
    progress: Show a progress bar with rounds/s.
    log: Where messages go.
    client_state_store: For a `stateful.StatefulClientsProcess` (Ditto,
      Fed+): where the clients' states live (default: in memory, snapshotted
      to `<output_dir>/client_states`). It is snapshotted with every server
      checkpoint and restored on resume; personal models are evaluated per
      client into `personal/<split>/<metric>` summaries.
    engine: Run the training rounds with this `tff_algos.batched`
      engine (the same clients, batches and result as `process.next`, in
      one TensorFlow call per round) instead of `process.next`; `process`
      still initializes, evaluates and checkpoints.

  Returns:
    `{'state', 'round_num', 'final_summaries', 'per_client', 'history'}`
    (and `'client_state_store'` for a stateful process).
    round_metrics_fn: `round_num -> {name: value}` added to every round's
      metrics (e.g. the privacy accountant's epsilon).
    summary_fn: `final_round -> {name: value}` written to summary.json
      (under `extra`) and summary.txt, and returned under `extra`.

  Returns:
    `{'state', 'round_num', 'final_summaries', 'per_client', 'history',
    'extra'}` (`extra`: what `summary_fn` returned, else empty).

  Raises:
    ValueError: For an impossible config.
    SimulationError: For an incompatible checkpoint.
    run_dir.RunDirError: If another process is using `output_dir`, another
      writer (`run.program`) made it, or no checkpoint there is intact.
  """
  runtime.install_worker_cleanup()
  kwargs = dict(
      output_dir=output_dir,
      hparams=hparams,
      progress=progress,
      log=log,
      client_state_store=client_state_store,
      round_metrics_fn=round_metrics_fn,
      summary_fn=summary_fn,
      engine=engine,
  )
  if not output_dir:
    return _run_simulation(process, task, config, **kwargs)
  with run_dir.locked(output_dir, 'train'):
    return _run_simulation(process, task, config, **kwargs)


def _run_simulation(
    process: tff.learning.templates.LearningProcess,
    task: task_base.FederatedTask,
    config: SimulationConfig,
    *,
    output_dir: Optional[str] = None,
    hparams: Optional[Mapping[str, Any]] = None,
    progress: bool = True,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
    client_state_store: Optional[client_states_lib.ClientStateStore] = None,
    round_metrics_fn: Optional[Callable[[int], Mapping[str, Any]]] = None,
    summary_fn: Optional[Callable[[int], Mapping[str, Any]]] = None,
    engine: Optional[batched.BatchedEngine] = None,
) -> dict[str, Any]:
  """`run_simulation`, its output folder locked."""
  runtime.install_worker_cleanup()
  client_ids = list(task.train_data.client_ids)
  config.validate(len(client_ids))
  hparams = dict(hparams or {})
  if output_dir:  # Before anything is written there.
    check_settings(output_dir, hparams)
    # Of a run killed while TFF wrote a checkpoint or metrics.csv.
    run_dir.remove_temp_files(output_dir)
  outputs = _Outputs(output_dir, log) if output_dir else None

  state = process.initialize()
  start_round = 1
  store = _client_state_store(process, task, outputs, client_state_store)
  if outputs:
    loaded, _ = run_async(outputs.state_manager.load_latest((state, 0)))
    if loaded is not None:
      state, start_round = loaded[0], int(loaded[1]) + 1
      log(
          f'resuming from the checkpoint of round {start_round - 1} in '
          f'{outputs.dir}'
      )
      if start_round > config.total_rounds:
        log(
            f'the checkpoint is already at round {start_round - 1} >= '
            f'total_rounds={config.total_rounds}; evaluating it only'
        )
    atomic.write_json(outputs.config_path, hparams, indent=2, sort_keys=True)
  if store is not None:
    store.restore(start_round - 1)

  schedule = stragglers_lib.StragglerSchedule(
      fraction=config.straggler_fraction,
      epochs=config.client_epochs_per_round,
      drop_stragglers=config.drop_stragglers,
      seed=config.seed,
  )
  counts = _ClientCounts(task)
  num_examples = None
  if config.client_sampling == 'examples':
    num_examples = [counts.examples(cid) for cid in client_ids]
  index_of = (
      {cid: i for i, cid in enumerate(client_ids)}
      if needs_client_index(process)
      else None
  )
  task, corrupted, attack_seed = _set_up_attack(process, task, config, outputs)
  eval_computation = per_client_evaluation(task, engine, log=log)
  progress_bar = _progress_bar(progress, start_round, config.total_rounds)
  history = []
  per_client, summaries = None, None
  # This invocation's seconds in the round loop, by part (summary.json).
  seconds = dict.fromkeys(SECONDS, 0.0)

  for round_num in range(start_round, config.total_rounds + 1):
    t0 = time.perf_counter()
    selected = sample_clients(
        client_ids,
        round_num,
        clients_per_round=config.clients_per_round,
        seed=config.seed,
        scheme=config.client_sampling,
        num_examples=num_examples,
    )
    plans = schedule.participants(round_num, selected)
    metrics = {
        'round_num': round_num,
        'clients': len(plans),
        'stragglers': sum(p.straggler for p in plans),
    }
    if plans and engine is not None:
      plan = batched_round_plan(
          task, plans, round_num, config, counts, index_of=index_of
      )
      if store is not None:
        ids = [p.client_id for p in plans]
        output = engine.next(state, plan, store.get_many(ids))
        store.put_many(ids, output.client_states, round_num=round_num)
        state, round_metrics = output.state, output.metrics
      else:
        state, round_metrics = engine.next(state, plan)
      metrics.update(flatten_metrics(round_metrics))
    elif plans:
      datasets = client_datasets(task, plans, round_num, config, counts)
      if index_of is not None:
        datasets = with_client_index(datasets, plans, index_of)
      if attack_seed is not None:
        datasets = attacks.with_attack_markers(
            datasets,
            [p.client_id for p in plans],
            corrupted,
            seed=attack_seed,
            round_num=round_num,
            index_of={cid: i for i, cid in enumerate(client_ids)},
        )
      if store is not None:
        ids = [p.client_id for p in plans]
        output = process.next(state, datasets, store.get_many(ids))
        store.put_many(ids, output.client_states, round_num=round_num)
      else:
        output = process.next(state, datasets)
      state = output.state
      metrics.update(flatten_metrics(output.metrics))
    else:
      metrics['skipped'] = 1
    metrics['round_seconds'] = time.perf_counter() - t0
    seconds['training'] += metrics['round_seconds']
    if round_metrics_fn is not None:
      metrics.update(round_metrics_fn(round_num))
    is_last = round_num == config.total_rounds
    if is_last or (
        config.rounds_per_eval and round_num % config.rounds_per_eval == 0
    ):
      t0 = time.perf_counter()
      per_client, summaries = _evaluate(
          process,
          state,
          task,
          eval_computation,
          config,
          outputs,
          round_num,
          corrupted,
          store,
      )
      for name, summary in summaries.items():
        for key, value in summary.items():
          metrics[f'eval/{name}/{key}'] = value
      seconds['evaluation'] += time.perf_counter() - t0
    _check_finite(metrics, round_num)
    history.append(metrics)
    if outputs:
      t0 = time.perf_counter()
      outputs.release(metrics, round_num)
      seconds['metrics'] += time.perf_counter() - t0
      if is_last or (
          config.rounds_per_checkpoint
          and round_num % config.rounds_per_checkpoint == 0
      ):
        t0 = time.perf_counter()
        if store is not None:  # Before the server state: see client_states.
          store.snapshot(round_num)
        run_async(outputs.state_manager.save((state, round_num), round_num))
        seconds['checkpoints'] += time.perf_counter() - t0
    if progress_bar is not None:
      progress_bar.set_postfix_str(_postfix(metrics), refresh=False)
      progress_bar.update(1)
  if progress_bar is not None:
    progress_bar.close()

  if summaries is None:  # Resumed at or past the end: evaluate the model.
    t0 = time.perf_counter()
    per_client, summaries = _evaluate(
        process,
        state,
        task,
        eval_computation,
        config,
        outputs,
        config.total_rounds,
        corrupted,
        store,
    )
    seconds['evaluation'] += time.perf_counter() - t0
  final_round = max(config.total_rounds, start_round - 1)
  extra = dict(summary_fn(final_round)) if summary_fn is not None else {}
  if outputs:
    _write_summary(outputs, summaries, final_round, task, extra)
    atomic.write_json(
        os.path.join(outputs.dir, TIMING),
        {k: round(v, 3) for k, v in seconds.items()}
        | {'first_round': start_round},
        indent=2,
    )
  result = {
      'extra': extra,
      'state': state,
      'round_num': final_round,
      'final_summaries': summaries,
      'per_client': per_client,
      'history': history,
      'seconds': seconds,
  }
  if store is not None:
    result['client_state_store'] = store
  return result


def _set_up_attack(process, task, config, outputs):
  """`(task, corrupted ids, marker seed or None)` of the run's attack."""
  attack = config.attack or attacks.AttackConfig()
  with_markers = attacks.needs_attack_marker(process)
  if attack.is_update_attack and not with_markers:
    raise ValueError(
        f'attack {attack.kind} needs a process built with update_attack'
    )
  if with_markers and attack.kind not in ('none',) + attacks.UPDATE_ATTACKS:
    raise ValueError(
        f'the process attacks updates; attack {attack.kind} does not'
    )
  corrupted = frozenset()
  if attack.kind != 'none':
    corrupted = attacks.corrupted_clients(
        list(task.train_data.client_ids), attack.fraction, attack.seed
    )
    if outputs:
      atomic.write_json(
          os.path.join(outputs.dir, 'attack.json'),
          {
              'kind': attack.kind,
              'fraction': attack.fraction,
              'seed': attack.seed,
              'corrupted': sorted(corrupted),
          },
          indent=2,
      )
  if attack.kind == 'label_poison':
    task = dataclasses.replace(
        task,
        train_data=attacks.poison_client_data(
            task.train_data,
            corrupted,
            num_classes=attack.num_classes,
            seed=attack.seed,
        ),
    )
  return task, corrupted, (attack.seed if with_markers else None)


def _evaluate(
    process,
    state,
    task,
    eval_computation,
    config,
    outputs,
    round_num,
    corrupted=frozenset(),
    store=None,
):
  weights = process.get_model_weights(state)
  if isinstance(weights, Mapping):  # A family: one model per member.
    per_client = {}
    for member, member_weights in weights.items():
      for split, values in evaluate_per_client(
          task,
          eval_computation,
          member_weights,
          include_train=config.eval_train_clients,
      ).items():
        per_client[f'{member}/{split}'] = values
  else:
    per_client = evaluate_per_client(
        task,
        eval_computation,
        weights,
        include_train=config.eval_train_clients,
    )
  _check_evaluation_finite(per_client, round_num)
  if outputs:
    write_client_csv(
        os.path.join(outputs.clients_dir, f'round_{round_num:05d}.csv'),
        per_client,
    )
  if store is not None:
    personal = evaluate_personal_per_client(
        process,
        state,
        task,
        store,
        include_train=config.eval_train_clients,
        eval_computation=eval_computation,
    )
    # Personal models can overflow while the global one trains on.
    _check_evaluation_finite(personal, round_num)
    if outputs:
      write_client_csv(
          os.path.join(
              outputs.clients_dir, f'personal_round_{round_num:05d}.csv'
          ),
          personal,
      )
    per_client.update(personal)
  if not corrupted:
    return per_client, summarize(per_client)
  # Under attack: benign clients first, all clients under `all_`.
  summaries = summarize(attacks.benign_only(per_client, corrupted))
  for name, summary in summarize(per_client).items():
    summaries[f'all_{name}'] = summary
  return per_client, summaries


def _client_state_store(process, task, outputs, store):
  """The client-state store of a stateful process (None otherwise)."""
  if not stateful.is_stateful(process):
    if store is not None:
      raise ValueError(
          'client_state_store is only for stateful processes (Ditto, Fed+)'
      )
    return None
  if len(process.personal_model_names) > 1 and task.validation_data is None:
    raise SimulationError(
        f'{len(process.personal_model_names)} personal models per client '
        '(a lambda grid) are selected on validation data, and this task has'
        ' none; give it a validation split (--synthetic_validation_fraction)'
        ' or a single lambda'
    )
  if store is None:
    store = client_states_lib.InMemoryClientStateStore(
        lambda _: process.initial_client_state(),
        snapshot_dir=(
            os.path.join(outputs.dir, 'client_states') if outputs else None
        ),
    )
  return store


def select_personal_models(validation_losses) -> list[int]:
  """Each client's personal model: the index of its lowest validation loss.

  Thesis section 5.3 ("each device selects lambda locally"): with a Ditto
  lambda grid, client k uses the model g = argmin_g loss_k[g]; ties go to
  the first (smallest index) model.

  Args:
    validation_losses: One vector of G losses per client.

  Returns:
    The selected index per client.
  """
  return [int(np.argmin(losses)) for losses in validation_losses]


def evaluate_personal_per_client(
    process: stateful.StatefulClientsProcess,
    state,
    task: task_base.FederatedTask,
    store: client_states_lib.ClientStateStore,
    *,
    include_train: bool,
    chunk_size: int = 100,
    eval_computation=None,
) -> dict[str, dict[str, np.ndarray]]:
  """Each client's personal model on its data: `{'personal/test': ...}`.

  With G > 1 personal models per client (a Ditto lambda grid) each client is
  evaluated with the one of lowest loss on its validation data, and the
  chosen value is reported as the `lambda` metric (thesis section 5.3: each
  device selects lambda locally). Clients never selected have the initial
  personal model. At most `chunk_size` client states are in memory at once.
  With an `engine_eval.EngineEvaluation` as `eval_computation` the models
  are evaluated on the engine (the same metrics), else by the process.
  """
  num_models = len(process.personal_model_names)
  splits = [('test', task.test_data)]
  if include_train:
    splits.append(('train', task.train_data))
  results = {}

  def evaluate(chunk, client_states, split):
    if isinstance(eval_computation, engine_eval.EngineEvaluation):
      data = {
          'test': task.test_data,
          'train': task.train_data,
          'validation': task.validation_data,
      }[split]
      return eval_computation.evaluate_personal(
          process.get_model_weights(state), client_states, data, chunk
      )
    return process.evaluate_personal(
        state, client_states, [task.eval_dataset(cid, split) for cid in chunk]
    )

  for split, data in splits:
    ids = list(data.client_ids)
    rows, chosen = [], []
    for start in range(0, len(ids), chunk_size):
      chunk = ids[start : start + chunk_size]
      client_states = store.get_many(chunk)
      if num_models > 1:
        val_rows = evaluate(chunk, client_states, 'validation')
        best = select_personal_models([r['loss'] for r in val_rows])
      else:
        best = [0] * len(chunk)
      test_rows = evaluate(chunk, client_states, split)
      rows.extend(
          {k: v[g] for k, v in r.items()} for r, g in zip(test_rows, best)
      )
      chosen.extend(best)
    values = {name: np.asarray([r[name] for r in rows]) for name in rows[0]}
    if num_models > 1:
      values['lambda'] = np.asarray(
          [process.personal_model_values[g] for g in chosen]
      )
    values['client_id'] = np.asarray(ids)
    results[f'personal/{split}'] = values
  return results


def _check_finite(metrics: Mapping[str, Any], round_num: int) -> None:
  losses = [
      v
      for k, v in metrics.items()
      if k == 'train/loss' or k.endswith('/train/loss')
  ]
  loss = next((v for v in losses if not math.isfinite(v)), None)
  if loss is not None:
    raise SimulationError(
        f'training diverged at round {round_num} (train loss {loss}); lower'
        ' the learning rates. Checkpoints of earlier rounds are kept.'
    )


def _check_evaluation_finite(
    per_client: Mapping[str, Mapping[str, np.ndarray]], round_num: int
) -> None:
  """Divergence seen by the evaluation: a model whose metrics overflow.

  A last round can overflow the model while its training loss (computed
  before the round's update) is still finite.
  """
  for split, values in per_client.items():
    for name, array in values.items():
      array = np.asarray(array)
      if (
          name != 'client_id'
          and np.issubdtype(array.dtype, np.number)
          and not np.all(np.isfinite(array))
      ):
        raise SimulationError(
            f'training diverged at round {round_num} (the per-client '
            f'evaluation of its model on {split} has non-finite {name}; its '
            'training loss still was finite); lower the learning rates. '
            'Checkpoints of earlier rounds are kept.'
        )


def _postfix(metrics: Mapping[str, Any]) -> str:
  parts = []
  for key, label in (
      ('train/loss', 'loss'),
      ('train/accuracy', 'acc'),
      ('eval/test/accuracy/mean', 'test_acc'),
  ):
    if key in metrics:
      parts.append(f'{label}={metrics[key]:.4f}')
  return ' '.join(parts)


def _progress_bar(enabled: bool, start_round: int, total_rounds: int):
  if not enabled or start_round > total_rounds:
    return None
  import tqdm  # pylint: disable=g-import-not-at-top

  return tqdm.tqdm(
      total=total_rounds,
      initial=start_round - 1,
      unit='round',
      file=sys.stderr,
      mininterval=1.0,
      dynamic_ncols=True,
  )


def summary_table(summaries: Mapping[str, Mapping[str, float]]) -> str:
  """The final per-client table printed at the end of a run."""
  return tail_metrics.format_summary_table(summaries, keys=SUMMARY_COLUMNS)


def _write_summary(
    outputs: _Outputs,
    summaries,
    round_num: int,
    task: task_base.FederatedTask,
    extra: Optional[Mapping[str, Any]] = None,
) -> None:
  record = {
      'round_num': round_num,
      'task': task.description,
      'summaries': summaries,
  }
  if extra:
    record['extra'] = dict(extra)
  atomic.write_json(
      os.path.join(outputs.dir, 'summary.json'), record, indent=2, default=float
  )
  with atomic.open_for_replace(os.path.join(outputs.dir, 'summary.txt')) as f:
    f.write(f'{task.description}; after round {round_num}\n')
    f.write(summary_table(summaries) + '\n')
    for key, value in (extra or {}).items():
      f.write(f'{key}: {value}\n')
