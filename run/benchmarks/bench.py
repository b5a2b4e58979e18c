# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""Times our FedAvg against TFF's stock FedAvg and a plain TensorFlow loop.

Example:

  tff-hetero-bench --rounds=20 --warmup_rounds=3 --repeats=3 \
      --output_json=bench.json

In one process, on the same data, model and client order, three systems (and
a diagnostic variant of the third) run FedAvg rounds (client SGD, server
average weighted by examples):

* `ours`: `tff_algos.fed_avg.build_fed_avg`, driven round by round;
* `stock`: `tff.learning.algorithms.build_weighted_fed_avg`;
* `plain`: a `tf.function` SGD loop on the same architecture (a Keras dense
  layer's variables) over the same batches, client after client, one call
  per round on the round's client datasets chained into one stream; no TFF. It
  is the reference: what the same work, data pipeline included, costs without
  the TFF runtime.
* `preloaded` (diagnostic): the same loop on the round's batches read into
  tensors before its timer starts: the arithmetic alone, without tf.data.

Protocol (see docs/performance.md):

* Every round samples its clients once with `run.simulation.sample_clients`
  and gives the same clients, the same shuffle seeds and the same batches to
  every system. Each system keeps its own model, and the models must stay
  equal to float tolerance (the final L-inf differences are reported).
* The systems are interleaved round by round, and the order in which they run
  rotates every round, so slow drifts of the machine (frequency, other load)
  hit all alike. The table also gives the median over rounds of the
  stock/ours time ratio within a round, which is robust to load that
  changes from round to round.
* A round's time runs from building its client datasets (the same
  `run.simulation.client_datasets` code for every system) to the returned
  state, as the training loop sees it (`preloaded`: from its tensors).
* `--warmup_rounds` rounds (tracing, compilation, worker start) are run first
  and not timed; then `--repeats` blocks of `--rounds` timed rounds. Each
  block gives examples/s (its examples over its seconds) and seconds/round;
  the table shows the median over blocks.

Bad flags give one line `bench: error: ...` on stderr and exit code 2, before
any TFF computation (and so any TFF worker) starts.
"""

import os
import sys

if not (3, 9) <= sys.version_info[:2] <= (3, 11):
  sys.exit(
      'error: tff-hetero needs Python 3.9, 3.10 or 3.11 (TensorFlow Federated'
      f' 0.87 supports no other); this is Python {sys.version.split()[0]}.'
  )
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
import contextlib
import dataclasses
import math
import platform
import statistics
import time
from typing import Any, Optional

from absl import flags
from absl import logging
import numpy as np

# TensorFlow must be imported here, before `app.run`: imported inside absl's
# main, TF 2.14 traces tf.functions with executing_eagerly_outside_functions()
# False, so `tensor != tensor` becomes a Python identity test (autograph then
# takes every `if` branch) and Keras models fail to build.
import tensorflow as tf
import tensorflow_federated as tff

from run import atomic
from run import console
from run import run_dir
from run import simulation
from tasks import base as task_base
from tasks import registry
from tasks import synthetic
from tff_algos import composition
from tff_algos import fed_avg
from tff_algos import optimizers
from tff_algos import runtime
from tff_algos import stragglers

# pylint: enable=g-import-not-at-top,wrong-import-position

SYSTEMS = ('ours', 'stock', 'plain', 'preloaded')
LABELS = {
    'ours': 'ours (tff_algos.fed_avg)',
    'stock': 'stock (build_weighted_fed_avg)',
    'plain': 'plain tf.function loop',
    'preloaded': '  same, batches preloaded',
}
BENCH_TASKS = ('synthetic', 'synthetic_iid')

# (name, default, help) of each flag; `define_flags` defines them. They are
# not defined at import, so this module can be imported next to `run.train`,
# whose flags share these names.
_FLAG_SPECS = (
    (
        'task',
        'synthetic',
        f'Task: one of {", ".join(BENCH_TASKS)} (softmax regression 60x10).',
    ),
    ('num_clients', 100, 'Number of clients.'),
    (
        'examples_per_client',
        150,
        'Training examples of every client (constant size law).',
    ),
    ('clients_per_round', 10, 'Clients selected per round.'),
    ('client_batch_size', 10, 'Local batch size.'),
    ('client_epochs_per_round', 1, 'Local epochs per round.'),
    ('client_learning_rate', 0.01, 'Client SGD learning rate.'),
    ('rounds', 20, 'Timed rounds per repeat (each system).'),
    ('warmup_rounds', 3, 'Untimed rounds before timing (>= 0).'),
    ('repeats', 1, 'Blocks of timed rounds; the table shows their median.'),
    ('seed', 0, 'Seed of data, sampling and shuffles.'),
    ('output_json', None, 'Optional path: write every number there as JSON.'),
)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the benchmark's flags in `flag_values` (`run_main` does this)."""
  for name, default, help_text in _FLAG_SPECS:
    if name in flag_values:
      continue
    if isinstance(default, float):
      flags.DEFINE_float(name, default, help_text, flag_values=flag_values)
    elif isinstance(default, int):
      flags.DEFINE_integer(name, default, help_text, flag_values=flag_values)
    else:
      flags.DEFINE_string(name, default, help_text, flag_values=flag_values)


class UsageError(ValueError):
  """A flag has an impossible value."""


@dataclasses.dataclass(frozen=True)
class BenchConfig:
  """What to benchmark; the fields mirror the flags."""

  task: str = 'synthetic'
  num_clients: int = 100
  examples_per_client: int = 150
  clients_per_round: int = 10
  client_batch_size: int = 10
  client_epochs_per_round: int = 1
  client_learning_rate: float = 0.01
  rounds: int = 20
  warmup_rounds: int = 3
  repeats: int = 1
  seed: int = 0

  def validate(self) -> None:
    """Raises `UsageError` with one clear message for an impossible value."""
    if self.task not in BENCH_TASKS:
      raise UsageError(
          f'unknown --task={self.task!r}; the benchmark supports: '
          f'{", ".join(BENCH_TASKS)}'
      )
    for name in (
        'num_clients',
        'examples_per_client',
        'clients_per_round',
        'client_batch_size',
        'client_epochs_per_round',
        'rounds',
        'repeats',
    ):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f'--{name} must be a positive integer, got {value!r}')
    if (
        isinstance(self.warmup_rounds, bool)
        or not isinstance(self.warmup_rounds, int)
        or self.warmup_rounds < 0
    ):
      raise UsageError(
          f'--warmup_rounds must be an integer >= 0, got {self.warmup_rounds!r}'
      )
    if self.clients_per_round > self.num_clients:
      raise UsageError(
          f'--clients_per_round={self.clients_per_round} exceeds '
          f'--num_clients={self.num_clients}'
      )
    lr = self.client_learning_rate
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
      raise UsageError(
          f'--client_learning_rate must be a positive number, got {lr!r}'
      )

  @property
  def total_rounds(self) -> int:
    return self.warmup_rounds + self.rounds * self.repeats


def config_from_flags(
    flag_values: flags.FlagValues = flags.FLAGS,
) -> BenchConfig:
  """The validated `BenchConfig` of parsed flags (raises `UsageError`)."""
  names = [f.name for f in dataclasses.fields(BenchConfig)]
  config = BenchConfig(**{name: flag_values[name].value for name in names})
  config.validate()
  return config


def machine_info() -> dict[str, Any]:
  """Cores, CPU model and versions, for the record."""
  cpu = platform.processor() or platform.machine()
  with contextlib.suppress(OSError):  # No /proc/cpuinfo: keep the default.
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          cpu = line.split(':', 1)[1].strip()
          break
  info = {
      'nproc': len(os.sched_getaffinity(0))
      if hasattr(os, 'sched_getaffinity')
      else os.cpu_count(),
      'cpu_count': os.cpu_count(),
      'cpu_model': cpu,
      'python': platform.python_version(),
  }
  info.update(tensorflow=tf.__version__, tensorflow_federated=tff.__version__)
  return info


def build_task(config: BenchConfig):
  """The task, every client holding exactly `examples_per_client` to train on.

  Each client gets `examples_per_client + 1` examples and the per-client test
  split keeps the minimum of one, so the training split has exactly
  `examples_per_client` (the benchmark never evaluates).
  """
  return registry.create_task(
      config.task,
      num_clients=config.num_clients,
      seed=config.seed,
      batch_size=config.client_batch_size,
      size_law='constant',
      constant_size=config.examples_per_client + 1,
      test_fraction=1e-9,
  )


class PlainLoop:
  """FedAvg rounds in one `tf.function` call per round, no TFF.

  The model is the tasks' softmax regression (the variables of a Keras
  60 -> 10 dense layer, zero-initialised; its forward pass written out), the
  loss the one `from_keras_model` uses
  (mean sparse cross-entropy on logits), the local step plain SGD. Every
  client starts from the global model and runs over its batches; the new
  global model is the global model minus the mean of the clients' deltas
  weighted by examples (FedAvg with server SGD, lr 1.0, as the TFF systems).

  `next(datasets)` takes the round's client datasets (built with the same
  code as for the TFF systems), chains them into one stream and runs the
  whole round in one call: the `plain` system. `next_preloaded(batches)`
  runs the same steps on batches already held as tensors (see `preload`):
  the arithmetic alone, without tf.data.
  """

  def __init__(self, learning_rate: float):
    # The Keras layer gives the variables and their initial values. Its
    # forward pass is written out (the same ops as Dense.call and Keras's
    # from-logits loss): once TFF has built Keras models inside
    # tf.compat.v1 graphs, calling a Keras model made outside them fails
    # ("Your Layer or Model is in an invalid state").
    self.model = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(
                synthetic.NUM_CLASSES,
                kernel_initializer='zeros',
                bias_initializer='zeros',
            ),
        ]
    )
    self.model.build((None, synthetic.NUM_FEATURES))
    kernel, bias = self.model.layers[0].kernel, self.model.layers[0].bias
    variables = (kernel, bias)
    self.weights = [v.numpy() for v in variables]
    lr = tf.constant(learning_rate, tf.float32)

    def sgd_step(x, y):
      with tf.GradientTape() as tape:
        logits = tf.nn.bias_add(tf.matmul(x, kernel), bias)
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=tf.cast(y, tf.int64), logits=logits
            )
        )
      grads = tape.gradient(loss, variables)
      for v, g in zip(variables, grads):
        v.assign_sub(lr * g)
      return tf.cast(tf.shape(x)[0], tf.float32)

    def fold(acc, total, n, initial):
      """Adds the finished client's weighted delta `n * (w0 - w)`."""
      acc = tuple(a + n * (w0 - v) for a, w0, v in zip(acc, initial, variables))
      return acc, total + n

    def start_client(initial):
      for v, w0 in zip(variables, initial):
        v.assign(w0)

    def finish(acc, total, n, initial):
      acc, total = fold(acc, total, n, initial)
      safe = tf.maximum(total, 1.0)
      new = [
          tf.where(total > 0, w0 - a / safe, w0) for w0, a in zip(initial, acc)
      ]
      return new, total

    def owner(step, client_ends):
      # Index of the client whose batches include `step`.
      return tf.searchsorted(
          client_ends, [step], side='right', out_type=tf.int64
      )[0]

    @tf.function
    def round_from_dataset(initial, dataset, client_ends):
      acc = tuple(tf.zeros_like(w) for w in initial)
      total = tf.constant(0.0)
      n = tf.constant(0.0)
      current = tf.constant(-1, tf.int64)
      step = tf.constant(0, tf.int64)
      for x, y in dataset:
        k = owner(step, client_ends)
        if tf.not_equal(k, current):
          acc, total = fold(acc, total, n, initial)
          start_client(initial)
          n = tf.constant(0.0)
          current = k
        n += sgd_step(x, y)
        step += 1
      return finish(acc, total, n, initial)

    @tf.function
    def round_from_tensors(initial, x_all, y_all, offsets, client_ends):
      acc = tuple(tf.zeros_like(w) for w in initial)
      total = tf.constant(0.0)
      n = tf.constant(0.0)
      current = tf.constant(-1, tf.int64)
      for step in tf.range(tf.size(offsets, out_type=tf.int64) - 1):
        k = owner(step, client_ends)
        if tf.not_equal(k, current):
          acc, total = fold(acc, total, n, initial)
          start_client(initial)
          n = tf.constant(0.0)
          current = k
        x = x_all[offsets[step] : offsets[step + 1]]
        y = y_all[offsets[step] : offsets[step + 1]]
        n += sgd_step(x, y)
      return finish(acc, total, n, initial)

    self._round_from_dataset = round_from_dataset
    self._round_from_tensors = round_from_tensors

  def _client_ends(self, datasets):
    """Cumulative batch counts of the clients (from the static cardinality)."""
    counts = [task_base.count_examples(ds) for ds in datasets]
    return tf.constant(np.cumsum(counts, dtype=np.int64))

  def _apply(self, new, total) -> int:
    self.weights = [w.numpy() for w in new]
    return int(total.numpy())

  def next(self, datasets) -> int:
    """Runs one round on the client datasets; returns the examples seen."""
    stream = datasets[0]
    for ds in datasets[1:]:
      stream = stream.concatenate(ds)
    initial = [tf.constant(w) for w in self.weights]
    return self._apply(
        *self._round_from_dataset(initial, stream, self._client_ends(datasets))
    )

  def preload(self, datasets):
    """The round's batches as tensors (flat examples, batch offsets)."""
    xs, ys, sizes = [], [], [0]
    for ds in datasets:
      for x, y in ds:
        xs.append(x.numpy())
        ys.append(y.numpy())
        sizes.append(len(y))
    return (
        tf.constant(np.concatenate(xs)),
        tf.constant(np.concatenate(ys)),
        tf.constant(np.cumsum(sizes, dtype=np.int64)),
        self._client_ends(datasets),
    )

  def next_preloaded(self, batches) -> int:
    """Runs one round on `preload`'s tensors; returns the examples seen."""
    initial = [tf.constant(w) for w in self.weights]
    return self._apply(*self._round_from_tensors(initial, *batches))


def _cpu_seconds() -> float:
  """CPU time of this process and its TFF workers so far (user + system).

  Unlike wall time, it hardly changes when other jobs share the cores.
  """
  total = time.process_time()
  ticks = os.sysconf('SC_CLK_TCK') if hasattr(os, 'sysconf') else 100
  for pid in runtime.worker_pids(os.getpid()):
    try:
      with open(f'/proc/{pid}/stat', 'rb') as f:
        stat = f.read().decode('utf-8', 'replace')
    except OSError:
      continue
    fields = stat[stat.rfind(')') + 2 :].split()
    total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime.
  return total


def _load_average() -> Optional[list[float]]:
  try:
    return [round(x, 2) for x in os.getloadavg()]
  except OSError:
    return None


def _max_abs_diff(a, b) -> float:
  return float(
      max(
          np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))
          for x, y in zip(a, b)
      )
  )


def benchmark(
    config: BenchConfig,
    log=lambda s: print(s, file=sys.stderr),
) -> dict[str, Any]:
  """Runs the benchmark; returns every number (see the module docstring).

  Args:
    config: What to run (validated here).
    log: Where progress lines go.

  Returns:
    A JSON-able dict: `config`, `machine`, `examples_per_round`,
    `systems[name]` (`examples_per_s`, `seconds_per_round`: medians over
    repeats; `repeats`: per-block values; `round_seconds`: every timed round;
    `build_seconds`), `ratios` and the final L-inf weight differences.
  """
  config.validate()
  runtime.install_worker_cleanup()

  load_start = _load_average()
  task = build_task(config)
  log(f'task: {task.description}')
  client_ids = list(task.train_data.client_ids)
  sim_config = simulation.SimulationConfig(
      total_rounds=config.total_rounds,
      clients_per_round=config.clients_per_round,
      client_epochs_per_round=config.client_epochs_per_round,
      seed=config.seed,
  )
  sim_config.validate(len(client_ids))

  build_seconds = {}
  t0 = time.perf_counter()
  ours = fed_avg.build_fed_avg(
      task.model_fn,
      optimizers.build_optimizer('sgd', config.client_learning_rate),
  )
  build_seconds['ours'] = time.perf_counter() - t0
  t0 = time.perf_counter()
  stock = tff.learning.algorithms.build_weighted_fed_avg(
      task.model_fn,
      optimizers.build_optimizer('sgd', config.client_learning_rate),
  )
  build_seconds['stock'] = time.perf_counter() - t0
  plain_loops = {}
  for name in ('plain', 'preloaded'):
    t0 = time.perf_counter()
    plain_loops[name] = PlainLoop(config.client_learning_rate)
    build_seconds[name] = time.perf_counter() - t0

  states = {'ours': ours.initialize(), 'stock': stock.initialize()}
  processes = {'ours': ours, 'stock': stock}
  initial = {
      name: composition.model_weights_as_numpy(process, states[name])
      for name, process in processes.items()
  }
  shapes = {
      name: [w.shape for w in weights] for name, weights in initial.items()
  }
  for name, loop in plain_loops.items():
    initial[name] = loop.weights
    shapes[name] = [w.shape for w in loop.weights]
  if len({str(s) for s in shapes.values()}) != 1:
    raise RuntimeError(f'the models of the systems differ in shape: {shapes}')
  initial_diff = max(
      _max_abs_diff(initial['ours'], initial[name]) for name in SYSTEMS
  )
  if initial_diff:
    raise RuntimeError(f'the initial models differ (L-inf {initial_diff})')

  def run_round(name, round_num, plans) -> tuple[float, float, int]:
    if name == 'preloaded':  # Untimed: building and reading the datasets.
      batches = plain_loops[name].preload(
          simulation.client_datasets(task, plans, round_num, sim_config)
      )
      start, cpu = time.perf_counter(), _cpu_seconds()
      examples = plain_loops[name].next_preloaded(batches)
      return (time.perf_counter() - start, _cpu_seconds() - cpu, examples)
    start, cpu = time.perf_counter(), _cpu_seconds()
    datasets = simulation.client_datasets(task, plans, round_num, sim_config)
    if name == 'plain':
      examples = plain_loops[name].next(datasets)
    else:
      output = processes[name].next(states[name], datasets)
      states[name] = output.state
      examples = int(
          simulation.flatten_metrics(output.metrics).get(
              'train/num_examples', -1
          )
      )
    return time.perf_counter() - start, _cpu_seconds() - cpu, examples

  round_seconds = {name: [] for name in SYSTEMS}
  round_cpu_seconds = {name: [] for name in SYSTEMS}
  examples_per_round = []
  for round_num in range(1, config.total_rounds + 1):
    selected = simulation.sample_clients(
        client_ids,
        round_num,
        clients_per_round=config.clients_per_round,
        seed=config.seed,
    )
    plans = [
        stragglers.ClientPlan(cid, False, config.client_epochs_per_round)
        for cid in selected
    ]
    shift = round_num % len(SYSTEMS)
    order = SYSTEMS[shift:] + SYSTEMS[:shift]
    seconds, cpu_seconds, examples = {}, {}, {}
    for name in order:
      seconds[name], cpu_seconds[name], examples[name] = run_round(
          name, round_num, plans
      )
    counts = {n for n in examples.values() if n >= 0}
    if len(counts) != 1:
      raise RuntimeError(
          f'round {round_num}: the systems processed different numbers of '
          f'examples: {examples}'
      )
    timed = round_num > config.warmup_rounds
    if timed:
      examples_per_round.append(counts.pop())
      for name in SYSTEMS:
        round_seconds[name].append(seconds[name])
        round_cpu_seconds[name].append(cpu_seconds[name])
    log(
        f'round {round_num:3d}{"" if timed else " (warm-up)"}: '
        + ', '.join(f'{name} {seconds[name]:.3f}s' for name in SYSTEMS)
    )

  final = {
      name: composition.model_weights_as_numpy(process, states[name])
      for name, process in processes.items()
  }
  for name, loop in plain_loops.items():
    final[name] = loop.weights

  systems = {}
  for name in SYSTEMS:
    blocks = []
    for r in range(config.repeats):
      window = slice(r * config.rounds, (r + 1) * config.rounds)
      secs = sum(round_seconds[name][window])
      cpu = sum(round_cpu_seconds[name][window])
      n = sum(examples_per_round[window])
      blocks.append(
          {
              'examples_per_s': n / secs,
              'seconds_per_round': secs / config.rounds,
              'cpu_seconds_per_round': cpu / config.rounds,
              'examples': n,
              'seconds': secs,
              'cpu_seconds': cpu,
          }
      )
    systems[name] = {
        'examples_per_s': statistics.median(
            b['examples_per_s'] for b in blocks
        ),
        'seconds_per_round': statistics.median(
            b['seconds_per_round'] for b in blocks
        ),
        'cpu_seconds_per_round': statistics.median(
            b['cpu_seconds_per_round'] for b in blocks
        ),
        'median_round_seconds': statistics.median(round_seconds[name]),
        'build_seconds': build_seconds[name],
        'repeats': blocks,
        'round_seconds': round_seconds[name],
        'round_cpu_seconds': round_cpu_seconds[name],
    }
  for name in SYSTEMS:
    systems[name]['ratio_to_stock'] = (
        systems[name]['examples_per_s'] / systems['stock']['examples_per_s']
    )
    systems[name]['ratio_to_plain'] = (
        systems[name]['examples_per_s'] / systems['plain']['examples_per_s']
    )
  # Rounds of the systems run back to back, so the ratio of their times in
  # the same round is little affected by load that changes between rounds.
  paired = statistics.median(
      s / o for s, o in zip(round_seconds['stock'], round_seconds['ours'])
  )
  return {
      'config': dataclasses.asdict(config),
      'task': task.description,
      'machine': machine_info(),
      'load_average_start': load_start,
      'load_average_end': _load_average(),
      'protocol': (
          'interleaved round by round, order rotated every round; the same '
          'clients, shuffle seeds and batches for all systems; round time '
          'includes building the client datasets, except for `preloaded`, '
          'whose batches are read into tensors before its timer starts'
      ),
      'examples_per_round': statistics.median(examples_per_round),
      'systems': systems,
      'ratio_ours_to_stock': systems['ours']['ratio_to_stock'],
      'paired_round_ratio_ours_to_stock': paired,
      # Pooled over all timed rounds: CPU time varies little with load.
      'cpu_ratio_ours_to_stock': (
          sum(round_cpu_seconds['stock']) / sum(round_cpu_seconds['ours'])
      ),
      'max_abs_diff_ours_stock': _max_abs_diff(final['ours'], final['stock']),
      'max_abs_diff_ours_plain': max(
          _max_abs_diff(final['ours'], final[name])
          for name in ('plain', 'preloaded')
      ),
  }


def format_table(result: dict[str, Any]) -> str:
  """The summary table printed at the end."""
  header = (
      f'{"system":<32}{"examples/s":>12}{"s/round":>10}'
      f'{"vs stock":>10}{"vs plain":>10}{"cpu s/round":>13}'
  )
  lines = [header, '-' * len(header)]
  for name in SYSTEMS:
    s = result['systems'][name]
    lines.append(
        f'{LABELS[name]:<32}{s["examples_per_s"]:>12,.0f}'
        f'{s["seconds_per_round"]:>10.4f}{s["ratio_to_stock"]:>10.3f}'
        f'{s["ratio_to_plain"]:>10.3f}{s["cpu_seconds_per_round"]:>13.4f}'
    )
  c = result['config']
  lines.append('')
  lines.append(
      f'{c["rounds"]} timed rounds x {c["repeats"]} repeat(s) (median), '
      f'{c["warmup_rounds"]} warm-up; {result["examples_per_round"]:g} '
      'examples/round'
  )
  lines.append(
      'ours vs stock: median over rounds of the per-round speed ratio '
      f'{result["paired_round_ratio_ours_to_stock"]:.3f}, CPU-time ratio '
      '(all rounds) '
      f'{result["cpu_ratio_ours_to_stock"]:.3f}; load average '
      f'{result["load_average_start"]} at start, '
      f'{result["load_average_end"]} at end'
  )
  lines.append(
      'final model L-inf difference: ours vs stock '
      f'{result["max_abs_diff_ours_stock"]:.3g}, ours vs plain '
      f'{result["max_abs_diff_ours_plain"]:.3g}'
  )
  lines.append(
      "preloaded: the plain loop on the round's batches already held as "
      'tensors (no tf.data in its time): the arithmetic alone'
  )
  return '\n'.join(lines)


def main(argv) -> int:
  """Runs the binary on the parsed flags (see `define_flags`).

  Returns:
    The exit code: 0, 2 for bad input, 1 for a failed run.
  """
  if len(argv) > 1:
    print(
        f'bench: error: unexpected arguments: {" ".join(argv[1:])}',
        file=sys.stderr,
    )
    return 2
  logging.set_verbosity(logging.WARNING)
  runtime.install_worker_cleanup()
  try:
    try:
      config = config_from_flags()
      output_json: Optional[str] = flags.FLAGS['output_json'].value
      if output_json:
        run_dir.check_output_file(output_json, flag='--output_json')
        parent = os.path.dirname(os.path.abspath(output_json))
        if not os.path.isdir(parent):
          raise UsageError(f'--output_json: folder {parent} does not exist')
    except (ValueError, TypeError) as e:
      print(f'bench: error: {e}', file=sys.stderr)
      return 2
    try:
      result = benchmark(config)
    except (ValueError, RuntimeError) as e:
      print(f'bench: error: {e}', file=sys.stderr)
      return 1
    except KeyboardInterrupt:
      print('bench: interrupted', file=sys.stderr)
      return 130
    print(format_table(result))
    if output_json:
      atomic.write_json(output_json, result, indent=2)
      print(f'wrote {output_json}')
  finally:
    runtime.kill_workers()
  return 0


def _exit(code: int) -> None:
  """Exits at once, after flushing output and ending TFF's workers.

  A normal interpreter shutdown lets TFF 0.87's `ServiceManager.__del__`
  run after the `subprocess` module is torn down, which prints a traceback
  after the last line of output (e.g. after the one-line usage error).
  """
  runtime.kill_workers()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


def run_main() -> None:
  """Console-script entry point."""
  define_flags()
  console.run(__name__, lambda argv: _exit(main(argv)))


if __name__ == '__main__':
  run_main()
