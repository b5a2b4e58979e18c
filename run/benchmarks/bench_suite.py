# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""Speed of the simulation engines on three models and four algorithms.

Example (what docs/performance.md records):

  python -m run.benchmarks.bench_suite --rounds=8 --warmup_rounds=2 \
      --output_json=/tmp/suite.json

For each model (`--models`):

* `softmax`: Synthetic(1, 1) softmax regression 60x10 (the papers' model);
* `emnist_cnn`: the Delta-FL EMNIST ConvNet (conv 32 5x5, pool, conv 64 5x5,
  pool, dense 62; 1.1M parameters) on random 28x28 pixels and 62 labels:
  EMNIST's sizes without its file;
* `shakespeare`: TFF's character LSTM (embedding 8, 2 x LSTM 256) on random
  snippets of Shakespeare's vocabulary;
* `shakespeare_gru`: the Delta-FL preset's model (one-hot 53, GRU 128,
  dense 53; `tasks.shakespeare_leaf`) on random 20-character windows, one
  label each;
* `shakespeare_lstm_leaf`: the FedProx preset's model (embedding 8,
  2 x LSTM 100, dense 80) on random 80-character windows, one label each;

and each algorithm (`--algorithms`, of every algorithm `run.train` offers),
the systems run the same rounds (same sampled clients, shuffle seeds and
batches), interleaved round by round in a rotating order:

* `tff`: our `LearningProcess` through TFF's runtime (`process.next`);
* `batched`: `tff_algos.batched.BatchedEngine` (one TF call per round);
* `stacked` and `stacked_seq`: `tff_algos.stacked.StackedEngine`, the
  round's clients trained together (vectorized; recurrent presets as the
  batched matmuls of `tff_algos.stacked_rnn`) or one after another through
  the same functional step, and `stacked_vmap`, vectorized with
  `vectorized_map` over Keras' layers (`--stacked_modes`); models the engine
  does not run (the LSTM's per-token labels) are left out with a note;
* `stock` (fedavg only): TFF's `build_weighted_fed_avg`;
* `plain` (fedavg only): a plain graph-mode SGD loop on the same Keras
  model over the round's batches read into tensors before its timer starts
  (the arithmetic alone: no tf.data, no metrics, no TFF);
* `bound` (fedavg only): the machine's bound, one model trained in the plain
  loop's form on the round's clients' batches concatenated (step j: every
  client's j-th batch, K x B examples per step; no per-client weights, no
  averaging), the fastest a vectorized engine of K clients could go;
* `evaluate` (fedavg only): the engines' per-client evaluation
  (`tff_algos.engine_eval`) of the global model on every client's data
  (`--num_clients` clients a round, as the simulation evaluates a split),
  its examples/s beside training's (`evaluation_to_training`: over
  `fedavg/stacked`, else `fedavg/tff`).

Ditto and the Fed+ family keep a personal model per client: on `tff`,
`batched` and `stacked` each timed round is what `run.simulation` does (the
selected clients' states read from an in-memory `ClientStateStore`, the
round, the new states written back; each system its own store), with
`--ditto_lambda`.
AFL's clients carry their indices. The stacked engine runs the algorithms
whose client work it has in stacked form (`stacked.check_definition`); the
others are left out with a note.
Ditto's store on disk at EMNIST scale is
`run/experiments/bench_ditto_scale.py`'s subject.

Per system: examples/s and seconds/round (wall), CPU seconds/round (this
process and its TFF worker), and the ratios to stock FedAvg, to the plain
loop and to the bound on the same model. `tff`, `batched` and `stacked` must
end with equal weights (the L-inf differences to `tff` are reported). Peak
memory (VmHWM) of this process and of its TFF worker is reported per model,
and per system
the peak resident memory (this process and its TFF worker, sampled every
10 ms) while that system's rounds ran: all systems share one process, so that
figure includes what the others hold (a shared floor); the differences
between systems are what each adds.
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
import collections
import abc
import contextlib
import statistics
import threading
import time
from typing import Any, Optional

from absl import flags
import numpy as np
import tensorflow as tf  # Before app.run (see run/benchmarks/bench.py).
import tensorflow_federated as tff

from run import algorithms
from run import atomic
from run.benchmarks import bench
from run import console
from run import engines
from run import run_dir
from run import simulation
from tasks import base as task_base
from tasks import emnist
from tasks import shakespeare
from tasks import shakespeare_leaf
from tasks import synthetic
from tff_algos import client_states
from tff_algos import engine_eval
from tff_algos import optimizers
from tff_algos import registry as algorithm_registry
from tff_algos import runtime
from tff_algos import stacked
from tff_algos import stateful
from tff_algos import stragglers

# pylint: enable=g-import-not-at-top,wrong-import-position

MODELS = (
    'softmax',
    'emnist_cnn',
    'shakespeare',
    'shakespeare_gru',
    'shakespeare_lstm_leaf',
)
# The window models: their `tasks.shakespeare_leaf` preset.
_PRESETS = {'shakespeare_gru': 'deltafl', 'shakespeare_lstm_leaf': 'fedprox'}
# --rnn_units: the presets' recurrent width instead of their own (None).
_UNITS = {}
ALGORITHMS = algorithm_registry.names()
# --stacked_modes -> the system's suffix: vectorized (with the recurrent
# kernels of tff_algos.stacked_rnn where the model has them), sequential,
# and vectorized_map (vectorized, recurrent layers through vectorized_map).
_STACKED_SUFFIX = {
    'vectorized': '',
    'sequential': '_seq',
    'vectorized_map': '_vmap',
}

# Flags are defined at start-up only: absl flags are global, and the test
# suite and the API-docs build import several binaries into one process.
_MODELS = None
_ALGORITHMS = None
_ROUNDS = None
_WARMUP = None
_CLIENTS = None
_NUM_CLIENTS = None
_OUTPUT = None
_STACKED_MODES = None
_STACKED_ONLY = None
_DITTO_LAMBDA = None
_EXAMPLES = None
_RNN_UNITS = None


def define_flags() -> None:
  """Defines the command-line flags."""
  global _MODELS, _ALGORITHMS, _ROUNDS, _WARMUP, _CLIENTS, _NUM_CLIENTS
  global _OUTPUT, _STACKED_MODES, _STACKED_ONLY, _DITTO_LAMBDA, _EXAMPLES
  global _RNN_UNITS
  _MODELS = flags.DEFINE_list('models', list(MODELS), 'Models to time.')
  _ALGORITHMS = flags.DEFINE_list(
      'algorithms',
      ['fedavg', 'qffl', 'deltafl', 'ditto'],
      f'Algorithms to time, of {ALGORITHMS}.',
  )
  _DITTO_LAMBDA = flags.DEFINE_float(
      'ditto_lambda', 0.1, "Ditto's lambda (>= 0)."
  )
  _ROUNDS = flags.DEFINE_integer('rounds', 6, 'Timed rounds per system.')
  _WARMUP = flags.DEFINE_integer('warmup_rounds', 2, 'Untimed rounds first.')
  _CLIENTS = flags.DEFINE_integer('clients_per_round', 10, 'Clients per round.')
  _EXAMPLES = flags.DEFINE_integer(
      'examples_per_client',
      None,
      "Examples of each generated client (default: the model's own, e.g. "
      '64 windows for shakespeare_gru).',
  )
  _NUM_CLIENTS = flags.DEFINE_integer('num_clients', 100, 'Population.')
  _RNN_UNITS = flags.DEFINE_integer(
      'rnn_units',
      None,
      'Recurrent width of shakespeare_gru and shakespeare_lstm_leaf instead '
      "of their preset's (as run.train's --rnn_units), e.g. 64 for the "
      "tail benchmark's Shakespeare setting.",
  )
  _OUTPUT = flags.DEFINE_string('output_json', None, 'Write every number here.')
  _STACKED_MODES = flags.DEFINE_list(
      'stacked_modes',
      ['vectorized', 'sequential'],
      'Stacked-engine systems to time: vectorized (`stacked`), sequential '
      '(`stacked_seq`), vectorized_map (`stacked_vmap`: recurrent layers '
      'through vectorized_map, not tff_algos.stacked_rnn); empty for none.',
  )
  _STACKED_ONLY = flags.DEFINE_boolean(
      'stacked_only',
      False,
      'Time only stock and plain FedAvg and the stacked engine (not our TFF '
      'path nor the batched engine).',
  )

  # (examples per client, batch size, client learning rate) per model.


_SIZES = {
    'softmax': (150, 10, 0.01),
    'emnist_cnn': (100, 20, 0.01),
    'shakespeare': (40, 4, 0.5),
    'shakespeare_gru': (64, 16, 0.1),
    'shakespeare_lstm_leaf': (40, 10, 0.8),
}


def _client_data(model: str, num_clients: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  n = _SIZES[model][0]
  if model == 'emnist_cnn':
    return tff.simulation.datasets.TestClientData(
        {
            f'w{k:05d}': collections.OrderedDict(
                label=rng.integers(0, 62, n).astype(np.int32),
                pixels=rng.random((n, 28, 28), np.float32),
            )
            for k in range(num_clients)
        }
    )
  if model in _PRESETS:
    preset = shakespeare_leaf.PRESETS[_PRESETS[model]]
    return tff.simulation.datasets.TestClientData(
        {
            f'r{k:05d}': collections.OrderedDict(
                x=rng.integers(
                    0, preset.num_classes, (n, preset.window)
                ).astype(np.uint8),
                y=rng.integers(0, preset.num_classes, n).astype(np.uint8),
            )
            for k in range(num_clients)
        }
    )
  vocab = np.array(list(shakespeare.CHAR_VOCAB))
  return tff.simulation.datasets.TestClientData(
      {
          f'r{k:05d}': collections.OrderedDict(
              snippets=np.array(
                  [''.join(rng.choice(vocab, 60)) for _ in range(n)]
              )
          )
          for k in range(num_clients)
      }
  )


def build_task(model: str, num_clients: int) -> task_base.FederatedTask:
  """A task of the model's real sizes on generated data."""
  _, batch, _ = _SIZES[model]
  if model == 'softmax':
    return bench.build_task(
        bench.BenchConfig(
            num_clients=num_clients,
            examples_per_client=_SIZES[model][0],
            client_batch_size=batch,
        )
    )
  data = _client_data(model, num_clients)
  if model == 'emnist_cnn':
    train, evaluate = emnist.make_preprocess_fns(batch)
    model_fn = emnist.create_model_fn('convnet')
  elif model in _PRESETS:
    train, evaluate = shakespeare_leaf.make_preprocess_fns(batch)
    model_fn = shakespeare_leaf.create_model_fn(
        shakespeare_leaf.PRESETS[_PRESETS[model]], units=_UNITS.get(model)
    )
  else:
    train, evaluate = shakespeare.make_preprocess_fns(batch)
    model_fn = shakespeare.create_model_fn()
  return task_base.FederatedTask(
      name=model,
      train_data=data,
      test_data=data,
      model_fn=model_fn,
      preprocess_train=train,
      preprocess_eval=evaluate,
      description=f'{model} on generated data'
      + (f', {_UNITS[model]} recurrent units' if model in _UNITS else ''),
  )


def keras_model(model: str) -> tuple[tf.keras.Model, Any]:
  """The Keras model of the task and its loss (for the plain loop)."""
  if model == 'softmax':
    net = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(synthetic.NUM_FEATURES,)),
            tf.keras.layers.Dense(
                synthetic.NUM_CLASSES,
                kernel_initializer='zeros',
                bias_initializer='zeros',
            ),
        ]
    )
  elif model == 'emnist_cnn':
    net = emnist.create_keras_model('convnet')
  elif model in _PRESETS:
    net = shakespeare_leaf.create_keras_model(
        shakespeare_leaf.PRESETS[_PRESETS[model]], units=_UNITS.get(model)
    )
  else:
    net = shakespeare.create_keras_model()
  return net, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _graph_model(model: str):
  """The Keras model, its loss and input placeholders, in the current graph."""
  net, loss_fn = keras_model(model)
  spec = net.input_shape
  x_dtype = {'shakespeare': tf.int64}.get(
      model, tf.int32 if model in _PRESETS else tf.float32
  )
  x = tf.compat.v1.placeholder(x_dtype, spec)
  y_shape = [None, spec[1]] if model == 'shakespeare' else [None]
  y = tf.compat.v1.placeholder(
      tf.int64 if model == 'shakespeare' else tf.int32, y_shape
  )
  return net, loss_fn, x, y


def _sgd_step(net, loss_fn, variables, learning_rate, x, y):
  with tf.GradientTape() as tape:
    loss = loss_fn(y, net(x, training=True))
  grads = tape.gradient(loss, variables)
  for v, g in zip(variables, grads):
    # An embedding's gradient is IndexedSlices; applied densely.
    v.assign_sub(learning_rate * tf.convert_to_tensor(g))


class _GraphLoop(abc.ABC):
  """A graph-mode loop over preloaded batches: a session, the model's
  placeholders and weights; subclasses build the loop (`_build`) and say how
  a round's batches are laid out (`preload`)."""

  def __init__(self, model: str, learning_rate: float):
    self._graph = tf.Graph()
    with self._graph.as_default():  # pytype: disable=attribute-error
      net, loss_fn, x, y = _graph_model(model)
      self._variables = net.trainable_variables
      self._out, extra = self._build(net, loss_fn, learning_rate, x, y)
      self._inputs = (x, y, *extra)
      init = tf.compat.v1.global_variables_initializer()
    self._session = tf.compat.v1.Session(graph=self._graph)
    self._session.run(init)

  @abc.abstractmethod
  def _build(self, net, loss_fn, learning_rate, x, y):
    """Returns the round's output tensor and the placeholders after x, y."""

  def weights(self) -> list[np.ndarray]:
    """The model's trainable weights now."""
    return self._session.run(self._variables)

  def next(self, batches) -> int:
    """Runs a round on `preload`'s output; returns its number of examples."""
    return int(self._session.run(self._out, dict(zip(self._inputs, batches))))


class PlainLoop(_GraphLoop):
  """FedAvg rounds as a plain graph-mode SGD loop over preloaded batches."""

  def _build(self, net, loss_fn, learning_rate, x, y):
    variables = self._variables
    offsets = tf.compat.v1.placeholder(tf.int64, [None])
    ends = tf.compat.v1.placeholder(tf.int64, [None])

    @tf.function
    def run(x_all, y_all, offsets, client_ends):
      initial = [tf.identity(v) for v in variables]
      acc = [tf.zeros_like(v) for v in variables]
      total = tf.constant(0.0)
      n = tf.constant(0.0)
      current = tf.constant(0, tf.int64)
      for step in tf.range(tf.size(offsets, out_type=tf.int64) - 1):
        k = tf.searchsorted(
            client_ends, [step], side='right', out_type=tf.int64
        )[0]
        if tf.not_equal(k, current):
          acc = [a + n * (w0 - v) for a, w0, v in zip(acc, initial, variables)]
          total += n
          n = tf.constant(0.0)
          current = k
          for v, w0 in zip(variables, initial):
            v.assign(w0)
        x = x_all[offsets[step] : offsets[step + 1]]
        y = y_all[offsets[step] : offsets[step + 1]]
        _sgd_step(net, loss_fn, variables, learning_rate, x, y)
        n += tf.cast(tf.shape(x)[0], tf.float32)
      acc = [a + n * (w0 - v) for a, w0, v in zip(acc, initial, variables)]
      total += n
      for v, w0, a in zip(variables, initial, acc):
        v.assign(w0 - a / total)
      return total

    return run(x, y, offsets, ends), (offsets, ends)

  @staticmethod
  def preload(datasets):
    xs, ys, sizes, ends = [], [], [0], []
    for ds in datasets:
      for x, y in ds:
        xs.append(x.numpy())
        ys.append(y.numpy())
        sizes.append(len(y))
      ends.append(len(xs))
    return (
        np.concatenate(xs),
        np.concatenate(ys),
        np.cumsum(sizes).astype(np.int64),
        np.asarray(ends, np.int64),
    )


class BoundLoop(_GraphLoop):
  """The machine's bound for a round: one model, one SGD step per batch index
  on the round's clients' batches concatenated (K x B examples per step), in
  the plain loop's graph-mode form. No per-client weights and no averaging:
  what a vectorized engine of K clients could at best reach on this CPU."""

  def _build(self, net, loss_fn, learning_rate, x, y):
    variables = self._variables
    offsets = tf.compat.v1.placeholder(tf.int64, [None])

    @tf.function
    def run(x_all, y_all, offsets):
      n = tf.constant(0.0)
      for step in tf.range(tf.size(offsets, out_type=tf.int64) - 1):
        x = x_all[offsets[step] : offsets[step + 1]]
        y = y_all[offsets[step] : offsets[step + 1]]
        _sgd_step(net, loss_fn, variables, learning_rate, x, y)
        n += tf.cast(tf.shape(x)[0], tf.float32)
      return n

    return run(x, y, offsets), (offsets,)

  @staticmethod
  def preload(datasets):
    """Step j's batch: every client's j-th batch, concatenated."""
    per_client = [[(x.numpy(), y.numpy()) for x, y in ds] for ds in datasets]
    xs, ys, sizes = [], [], [0]
    for j in range(max(len(c) for c in per_client)):
      step = [c[j] for c in per_client if j < len(c)]
      xs.append(np.concatenate([x for x, _ in step]))
      ys.append(np.concatenate([y for _, y in step]))
      sizes.append(len(ys[-1]))
    return (
        np.concatenate(xs),
        np.concatenate(ys),
        np.cumsum(sizes).astype(np.int64),
    )


def _vm_hwm_mb(pid: int) -> float:
  """Peak resident memory of `pid` in MB (NaN once the process is gone)."""
  with contextlib.suppress(OSError):
    with open(f'/proc/{pid}/status') as f:
      for line in f:
        if line.startswith('VmHWM:'):
          return int(line.split()[1]) / 1024.0
  return float('nan')


def _vm_rss_mb(pids) -> float:
  """Resident memory of the live `pids` in MB."""
  total = 0.0
  for pid in pids:
    with contextlib.suppress(OSError):
      with open(f'/proc/{pid}/status') as f:
        for line in f:
          if line.startswith('VmRSS:'):
            total += int(line.split()[1]) / 1024.0
            break
  return total


class PeakRss:
  """The peak resident memory of processes, sampled while it is entered."""

  def __init__(self, interval: float = 0.01):
    self._interval = interval
    self.peak_mb = 0.0
    self._pids: list[int] = []
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  def __enter__(self):
    self._pids = [os.getpid(), *runtime.worker_pids(os.getpid())]
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._sample, daemon=True)
    self._thread.start()
    return self

  def _sample(self):
    while True:
      self.peak_mb = max(self.peak_mb, _vm_rss_mb(self._pids))
      if self._stop.wait(self._interval):
        return

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()
    self.peak_mb = max(self.peak_mb, _vm_rss_mb(self._pids))


def memory_mb() -> dict[str, float]:
  """Peak resident memory (MB) of this process and its TFF workers."""
  workers = runtime.worker_pids(os.getpid())
  return {
      'driver_peak_mb': _vm_hwm_mb(os.getpid()),
      'worker_peak_mb': sum(_vm_hwm_mb(p) for p in workers),
  }


def run_model(
    model: str,
    algorithm_names,
    *,
    rounds: int,
    warmup: int,
    clients_per_round: int,
    num_clients: int,
    log,
    stacked_modes=(),
    stacked_only: bool = False,
    ditto_lambda: float = 0.1,
) -> dict:
  """Times every system on one model; returns its numbers."""
  task = build_task(model, num_clients)
  n, batch, lr = _SIZES[model]
  del n, batch
  config = simulation.SimulationConfig(
      total_rounds=warmup + rounds, clients_per_round=clients_per_round, seed=0
  )
  systems: dict[str, list[Any]] = {}  # name -> [kind, object, state]
  processes = {}
  for name in algorithm_names:
    # Each algorithm's representative options (its registry `example`).
    example = dict(algorithm_registry.get(name).example)
    if 'ditto_lambda' in example:
      example['ditto_lambda'] = ditto_lambda
    spec = algorithms.AlgorithmSpec(name, client_learning_rate=lr, **example)
    process = algorithms.build_process(
        spec, task.model_fn, num_clients=num_clients
    )
    processes[name] = process
    run_as = _RunAs(process, task)
    if not stacked_only:
      systems[f'{name}/tff'] = [
          'process',
          process,
          process.initialize(),
          run_as,
      ]
      systems[f'{name}/batched'] = [
          'engine',
          engines.build_batched_engine(spec, task),
          process.initialize(),
          _RunAs(process, task),  # Its own client states.
      ]
    for mode in stacked_modes:
      key = f'{name}/stacked' + _STACKED_SUFFIX[mode]
      try:
        engine = engines.build_stacked_engine(
            spec,
            task,
            vectorize=(mode != 'sequential'),  # Each mode explicitly.
            rnn_kernels=(mode == 'vectorized'),
        )
      except stacked.StackedEngineError as e:
        log(f'{model}: no {key}: {e}')
        continue
      c0 = time.process_time()
      engine.examples.preload(task.train_data.client_ids)
      log(
          f'{model}: {key} preloaded {num_clients} clients in '
          f'{time.process_time() - c0:.2f} CPU s (setup, untimed)'
      )
      # Its own client states (Fed+'s global model is made from them).
      systems[key] = [
          'engine',
          engine,
          process.initialize(),
          _RunAs(process, task),
      ]
    if name == 'fedavg':
      stock = tff.learning.algorithms.build_weighted_fed_avg(
          task.model_fn, optimizers.build_optimizer('sgd', lr)
      )
      systems['fedavg/stock'] = [
          'process',
          stock,
          stock.initialize(),
          _RunAs(stock, task),
      ]
      systems['fedavg/plain'] = ['plain', PlainLoop(model, lr), None, None]
      systems['fedavg/bound'] = ['bound', BoundLoop(model, lr), None, None]
      _add_evaluation(systems, process, task, log, model)
  names = list(systems)
  ids = list(task.train_data.client_ids)
  times = {k: [] for k in names}
  cpus = {k: [] for k in names}
  peaks = {k: PeakRss() for k in names}
  by_round = []  # Untimed: L-inf of each engine to the TFF path, per round.
  examples = []
  population = sum(
      len(task.train_data.create_tf_dataset_for_client(c)) for c in ids
  )
  for r in range(1, warmup + rounds + 1):
    selected = simulation.sample_clients(
        ids, r, clients_per_round=clients_per_round, seed=0
    )
    plans = [stragglers.ClientPlan(cid, False, 1) for cid in selected]
    shift = r % len(names)
    for key in names[shift:] + names[:shift]:
      kind, obj, state, run_as = systems[key]
      batches = None
      if kind in ('plain', 'bound'):  # Untimed: the batches as tensors.
        loop = PlainLoop if kind == 'plain' else BoundLoop
        batches = loop.preload(
            simulation.client_datasets(task, plans, r, config)
        )
      with peaks[key] if r > warmup else contextlib.nullcontext():
        t0, c0 = time.perf_counter(), bench._cpu_seconds()  # pylint: disable=protected-access
        if kind == 'evaluate':  # The global model on every client's data.
          obj.evaluate(state, task.train_data)
        else:
          _round(
              kind, obj, state, systems[key], run_as, plans, r, config, batches
          )
        dt = time.perf_counter() - t0
        dc = bench._cpu_seconds() - c0  # pylint: disable=protected-access
      if r > warmup:
        times[key].append(dt)
        cpus[key].append(dc)
    if r > warmup:
      examples.append(
          sum(
              len(task.train_data.create_tf_dataset_for_client(c))
              for c in selected
          )
      )
    log(
        f'{model} round {r}: '
        + ', '.join(f'{k} {times[k][-1]:.3f}s' for k in names if r > warmup)
    )
    by_round.append(_engine_diffs(algorithm_names, processes, systems))
  out = {'task': task.description, 'systems': {}, 'memory': memory_mb()}
  total_examples = sum(examples)
  for key in names:
    secs = sum(times[key])
    done = population * rounds if systems[key][0] == 'evaluate' else None
    out['systems'][key] = {
        'examples_per_s': (done or total_examples) / secs,
        'seconds_per_round': secs / rounds,
        'median_round_seconds': statistics.median(times[key]),
        'cpu_seconds_per_round': sum(cpus[key]) / rounds,
        'peak_rss_mb': peaks[key].peak_mb,
    }
  ref = out['systems']
  for key in names:
    s = ref[key]
    if 'fedavg/stock' in ref:
      s['ratio_to_stock'] = (
          s['examples_per_s'] / ref['fedavg/stock']['examples_per_s']
      )
      s['cpu_ratio_to_stock'] = (
          ref['fedavg/stock']['cpu_seconds_per_round']
          / s['cpu_seconds_per_round']
      )
    if 'fedavg/plain' in ref:
      s['ratio_to_plain'] = (
          s['examples_per_s'] / ref['fedavg/plain']['examples_per_s']
      )
    if 'fedavg/bound' in ref:
      s['ratio_to_bound'] = (
          s['examples_per_s'] / ref['fedavg/bound']['examples_per_s']
      )
  if 'fedavg/evaluate' in ref:
    trained = (
        ref.get('fedavg/stacked')
        or ref['fedavg/tff' if 'fedavg/tff' in ref else 'fedavg/stock']
    )
    out['evaluation_to_training'] = (
        ref['fedavg/evaluate']['examples_per_s'] / trained['examples_per_s']
    )
  out['tff_vs_engines_linf'] = _engine_diffs(
      algorithm_names, processes, systems
  )
  out['tff_vs_engines_linf_by_round'] = by_round
  for key in names:
    if systems[key][0] in ('engine', 'evaluate'):
      systems[key][1].close()
  return out


def _add_evaluation(systems, process, task, log, model: str) -> None:
  """Adds `fedavg/evaluate`: the engines' per-client evaluation of FedAvg's
  global model (`tff_algos.engine_eval`), timed over every client's data
  each round, as the simulation evaluates a split."""
  try:
    evaluation = engine_eval.EngineEvaluation(
        task.model_fn, task.preprocess_eval, task.train_data
    )
  except stacked.StackedEngineError as e:
    log(f'{model}: no fedavg/evaluate: {e}')
    return
  weights = process.get_model_weights(process.initialize())
  systems['fedavg/evaluate'] = ['evaluate', evaluation, weights, None]


def _trainable(process, state) -> list[np.ndarray]:
  if stateful.is_stateful(process):
    weights = process.get_model_weights(state)
  else:
    weights = state.global_model_weights
  return [np.asarray(w) for w in tf.nest.flatten(weights.trainable)]


def _engine_diffs(algorithm_names, processes, systems) -> dict[str, float]:
  """L-inf between each engine's weights and the TFF path's, per system."""
  diffs = {}
  for name in algorithm_names:
    engines_of = [
        key
        for key in systems
        if key.startswith(f'{name}/') and systems[key][0] == 'engine'
    ]
    if f'{name}/tff' not in systems or not engines_of:
      continue
    proc = processes[name]
    a = _trainable(proc, systems[f'{name}/tff'][2])
    for key in engines_of:
      b = _trainable(proc, systems[key][2])
      diffs[key] = float(max(np.abs(x - y).max() for x, y in zip(a, b)))
  return diffs


class _RunAs:
  """How `run.simulation` feeds a process its round: the clients' datasets
  (with AFL's indices), the engine's plan, a stateful process's client
  states (an in-memory store per system)."""

  def __init__(self, process, task):
    self.task = task
    self.index_of = None
    if simulation.needs_client_index(process):
      self.index_of = {c: i for i, c in enumerate(task.train_data.client_ids)}
    self.store = None
    if stateful.is_stateful(process):
      self.store = client_states.InMemoryClientStateStore(
          lambda _: process.initial_client_state()
      )

  def datasets(self, plans, round_num, config):
    datasets = simulation.client_datasets(self.task, plans, round_num, config)
    if self.index_of is not None:
      datasets = simulation.with_client_index(datasets, plans, self.index_of)
    return datasets

  def plan(self, plans, round_num, config):
    return simulation.batched_round_plan(
        self.task, plans, round_num, config, index_of=self.index_of
    )


def _round(
    kind, obj, state, system, run_as, plans, round_num, config, batches
) -> dict:
  """Runs one round of a system in place (its state updated); its metrics."""
  if kind in ('plain', 'bound'):
    return {'train/num_examples': obj.next(batches)}
  if kind == 'process':
    data = run_as.datasets(plans, round_num, config)
    step = lambda *states: obj.next(state, data, *states)
  else:
    plan = run_as.plan(plans, round_num, config)
    step = lambda *states: obj.next(state, plan, *states)
  if run_as.store is None:
    out = step()
    system[2], metrics = out[0], out[1]
    return simulation.flatten_metrics(metrics)
  # A stateful process: states read and written as in simulation.
  ids = [p.client_id for p in plans]
  out = step(run_as.store.get_many(ids))
  run_as.store.put_many(ids, out.client_states, round_num=round_num)
  system[2] = out.state
  return simulation.flatten_metrics(out.metrics)


def format_table(results: dict) -> str:
  """The results as a Markdown table, one row per (model, system)."""
  lines = [
      '| model | system | examples/s | s/round | cpu s/round | '
      'peak MB | x stock | x plain | x bound |',
      '|---|---|---:|---:|---:|---:|---:|---:|---:|',
  ]
  for model, res in results.items():
    for key, s in res['systems'].items():
      lines.append(
          f'| {model} | {key} | {s["examples_per_s"]:,.0f} | '
          f'{s["seconds_per_round"]:.3f} | {s["cpu_seconds_per_round"]:.3f} |'
          f' {s["peak_rss_mb"]:,.0f} |'
          f' {s.get("ratio_to_stock", float("nan")):.2f} | '
          f'{s.get("ratio_to_plain", float("nan")):.2f} | '
          f'{s.get("ratio_to_bound", float("nan")):.2f} |'
      )
  for model, res in results.items():
    lines.append(
        f'\n{model}: peak memory {res["memory"]}; tff vs engines '
        f'L-inf {res["tff_vs_engines_linf"]}'
    )
    if 'evaluation_to_training' in res:
      lines.append(
          f'{model}: evaluation (fedavg/evaluate) at '
          f'{res["evaluation_to_training"]:.2f} x training\'s examples/s '
          '(fedavg/stacked, else tff)'
      )
  return '\n'.join(lines)


def main(argv) -> int:
  if len(argv) > 1:
    print(
        f'bench_suite: error: unexpected arguments {argv[1:]}', file=sys.stderr
    )
    return 2
  bad = (
      [m for m in _MODELS.value if m not in MODELS]
      + [a for a in _ALGORITHMS.value if a not in ALGORITHMS]
      + [m for m in _STACKED_MODES.value if m not in _STACKED_SUFFIX]
  )
  if _EXAMPLES.value is not None:
    if _EXAMPLES.value < 1:
      bad.append(f'--examples_per_client={_EXAMPLES.value}')
    else:
      for model in list(_SIZES):
        _SIZES[model] = (_EXAMPLES.value,) + _SIZES[model][1:]
  if _RNN_UNITS.value is not None:
    if _RNN_UNITS.value < 1:
      bad.append(f'--rnn_units={_RNN_UNITS.value}')
    else:
      _UNITS.update({m: _RNN_UNITS.value for m in _PRESETS})
  if (
      bad
      or _ROUNDS.value < 1
      or _WARMUP.value < 0
      or 'fedavg' not in (_ALGORITHMS.value)
      or _DITTO_LAMBDA.value < 0
  ):
    print(
        f'bench_suite: error: --models in {MODELS}, --algorithms in '
        f'{ALGORITHMS} including fedavg, --stacked_modes in '
        f'{", ".join(_STACKED_SUFFIX)}, --rounds >= 1, --ditto_lambda >= 0, '
        '--examples_per_client >= 1, --rnn_units >= 1',
        file=sys.stderr,
    )
    return 2
  if run_dir.refuse_output_file(
      _OUTPUT.value, flag='--output_json', prog='bench_suite'
  ):
    return 2
  runtime.install_worker_cleanup()
  log = lambda s: print(s, file=sys.stderr, flush=True)
  results = {'machine': bench.machine_info(), 'load_start': os.getloadavg()}
  per_model = results['models'] = {}
  for model in _MODELS.value:
    per_model[model] = run_model(
        model,
        _ALGORITHMS.value,
        rounds=_ROUNDS.value,
        warmup=_WARMUP.value,
        clients_per_round=_CLIENTS.value,
        num_clients=_NUM_CLIENTS.value,
        log=log,
        stacked_modes=_STACKED_MODES.value,
        stacked_only=_STACKED_ONLY.value,
        ditto_lambda=_DITTO_LAMBDA.value,
    )
    results['load_end'] = os.getloadavg()
    print(format_table({model: per_model[model]}), flush=True)
    if _OUTPUT.value:  # After each model: a later failure keeps these.
      atomic.write_json(_OUTPUT.value, results, indent=2, default=float)
  print(
      f'load average at start {results["load_start"]}, end '
      f'{results["load_end"]}'
  )
  return 0


def run_main() -> None:
  """Console-script entry point."""
  define_flags()
  console.run(__name__, lambda argv: runtime.exit_now(main(argv)))


if __name__ == '__main__':
  run_main()
