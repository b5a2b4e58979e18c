# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""Ditto at EMNIST scale: memory and store cost of 3,400 personal CNNs.

Example (what docs/performance.md records, "Ditto at 3,400 clients"):

  python -m run.experiments.bench_ditto_scale --num_clients=3400 \
      --clients_per_round=10 \
      --rounds=20 --touch_clients=1000 --output_json=/tmp/ditto_scale.json

Ditto (T. Li, S. Hu, A. Beirami, V. Smith, "Ditto: Fair and Robust Federated
Learning Through Personalization", ICML 2021, arXiv:2012.04221) keeps one
personal model per client. Here the clients are EMNIST-sized (28x28 pixels,
62 classes, `--examples_per_client` random images each, generated from the
client id when the client is read, so the data cost no memory) and the model
is one of `tasks.emnist`'s (`--model`, default `cnn`: the CNN of McMahan et
al., 1.69M parameters, 6.8 MB per personal model). The personal models live
in a `tff_algos.client_states.DiskClientStateStore`, used as
`run.simulation` uses it: each round `get_many` (load), `process.next`
(train), `put_many` (save), and `snapshot` every `--rounds_per_checkpoint`.

Phases, each timed per round (wall and CPU of this process and its TFF
worker):

1. `--rounds` Ditto rounds of `--clients_per_round` clients;
2. a store-only pass writing the states of `--touch_clients` further
   distinct clients (a trained state, perturbed per client), in chunks of
   `--clients_per_round` (one round number per chunk), then reading them all
   back with an empty cache (and, with `--cold_reads`, with the files
   dropped from the page cache), so the store holds hundreds to thousands
   of states;
3. `--rounds_after` more Ditto rounds with that full store (is anything
   O(stored states) per round?).

`--max_concurrent_computation_calls` bounds how many client computations the
TFF worker runs at once (as `run.train`'s flag), which bounds its working
memory. Reported: the resident memory (RSS, and the peak VmHWM) of this
process and of its TFF worker after every round, the bytes per state file
and in the store, and a projection to `--num_clients` stored states. The
store folder is a temporary one (removed at the end) unless `--state_dir` is
given.
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
import collections
import contextlib
import shutil
import statistics
import tempfile
import time

from absl import flags
import numpy as np
import psutil
import tensorflow as tf  # Before app.run (see run/benchmarks/bench.py).
import tensorflow_federated as tff

from run import algorithms
from run import atomic
from run.benchmarks import bench
from run import console
from run import contexts
from run import run_dir
from run import simulation
from tasks import base as task_base
from tasks import emnist
from tff_algos import client_states
from tff_algos import runtime
from tff_algos import stragglers

# pylint: enable=g-import-not-at-top,wrong-import-position

# Flags are defined at start-up only: absl flags are global, and the test
# suite and the API-docs build import several binaries into one process.
_NUM_CLIENTS = None
_CLIENTS = None
_ROUNDS = None
_ROUNDS_AFTER = None
_TOUCH = None
_EXAMPLES = None
_BATCH = None
_MODEL = None
_LAMBDA = None
_LR = None
_CHECKPOINT = None
_COLD = None
_CONCURRENT = None
_STATE_DIR = None
_OUTPUT = None


def define_flags() -> None:
  """Defines the command-line flags."""
  global _NUM_CLIENTS, _CLIENTS, _ROUNDS, _ROUNDS_AFTER, _TOUCH, _EXAMPLES
  global _BATCH, _MODEL, _LAMBDA, _LR, _CHECKPOINT, _COLD, _CONCURRENT
  global _STATE_DIR, _OUTPUT
  _NUM_CLIENTS = flags.DEFINE_integer('num_clients', 3400, 'Population.')
  _CLIENTS = flags.DEFINE_integer('clients_per_round', 10, 'Clients per round.')
  _ROUNDS = flags.DEFINE_integer('rounds', 20, 'Ditto rounds before the pass.')
  _ROUNDS_AFTER = flags.DEFINE_integer(
      'rounds_after', 5, 'Ditto rounds after the store-only pass.'
  )
  _TOUCH = flags.DEFINE_integer(
      'touch_clients', 1000, 'Distinct clients the store-only pass writes.'
  )
  _EXAMPLES = flags.DEFINE_integer(
      'examples_per_client', 20, 'Training images per client.'
  )
  _BATCH = flags.DEFINE_integer('batch_size', 10, 'Client batch size.')
  _MODEL = flags.DEFINE_enum(
      'model',
      'cnn',
      list(emnist.MODELS),
      'tasks.emnist model of the personal models.',
  )
  _LAMBDA = flags.DEFINE_float('ditto_lambda', 0.1, "Ditto's lambda.")
  _LR = flags.DEFINE_float('client_learning_rate', 0.01, 'Client SGD step.')
  _CHECKPOINT = flags.DEFINE_integer(
      'rounds_per_checkpoint', 5, 'Store snapshot every this many rounds.'
  )
  _COLD = flags.DEFINE_bool(
      'cold_reads',
      True,
      'Before reading the pass back, drop the state files '
      "from the page cache (posix_fadvise DONTNEED on the store's own files), "
      'so the reads come from the disk.',
  )
  _CONCURRENT = flags.DEFINE_integer(
      'max_concurrent_computation_calls',
      -1,
      'Client computations the TFF worker runs at once (-1: no limit), as in '
      "run.train; bounds the worker's working memory.",
  )
  _STATE_DIR = flags.DEFINE_string(
      'state_dir', None, 'Store folder (default: a temporary folder, removed).'
  )
  _OUTPUT = flags.DEFINE_string('output_json', None, 'Write every number here.')


MB = 2**20


def synthetic_emnist(
    num_clients: int, examples: int
) -> tff.simulation.datasets.ClientData:
  """EMNIST-sized clients generated from their id when read (no memory)."""
  ids = [f'w{k:05d}' for k in range(num_clients)]

  def dataset_fn(client_id):
    seed = tf.stack(
        [
            tf.strings.to_hash_bucket_fast(client_id, 2**31 - 1),
            tf.constant(0, tf.int64),
        ]
    )
    pixels = tf.random.stateless_uniform([examples, 28, 28], seed=seed)
    labels = tf.random.stateless_uniform(
        [examples],
        seed=seed + tf.constant([0, 1], tf.int64),
        minval=0,
        maxval=62,
        dtype=tf.int32,
    )
    return tf.data.Dataset.from_tensor_slices(
        collections.OrderedDict(label=labels, pixels=pixels)
    )

  return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
      ids, dataset_fn
  )


def build_task(
    num_clients: int, examples: int, batch: int, model: str
) -> task_base.FederatedTask:
  data = synthetic_emnist(num_clients, examples)
  train, evaluate = emnist.make_preprocess_fns(batch)
  return task_base.FederatedTask(
      name='emnist_sized',
      train_data=data,
      test_data=data,
      model_fn=emnist.create_model_fn(model),
      preprocess_train=train,
      preprocess_eval=evaluate,
      description=f'{num_clients} EMNIST-sized clients, model {model}',
  )


def _hwm_mb(pid: int) -> float:
  with contextlib.suppress(OSError):  # The process has ended.
    with open(f'/proc/{pid}/status') as f:
      for line in f:
        if line.startswith('VmHWM:'):
          return int(line.split()[1]) / 1024.0
  return float('nan')


def memory() -> dict[str, float]:
  """RSS now and peak (VmHWM) of this process and its TFF workers, in MB."""
  workers = runtime.worker_pids(os.getpid())
  rss = 0.0
  for pid in workers:
    with contextlib.suppress(psutil.Error):  # The worker has ended.
      rss += psutil.Process(pid).memory_info().rss / MB
  return {
      'driver_rss_mb': psutil.Process().memory_info().rss / MB,
      'driver_peak_mb': _hwm_mb(os.getpid()),
      'worker_rss_mb': rss,
      'worker_peak_mb': sum(_hwm_mb(p) for p in workers),
  }


def drop_from_page_cache(directory: str) -> int:
  """Asks the kernel to drop the store's files from its page cache."""
  count = 0
  for root, _, files in os.walk(directory):
    for name in files:
      fd = os.open(os.path.join(root, name), os.O_RDONLY)
      try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        count += 1
      finally:
        os.close(fd)
  return count


def store_usage(directory: str) -> dict[str, float]:
  """State files and bytes in the store folder."""
  sizes = []
  for root, _, files in os.walk(directory):
    sizes.extend(
        os.path.getsize(os.path.join(root, f))
        for f in files
        if f.endswith('.npz')
    )
  return {
      'state_files': len(sizes),
      'store_bytes': float(sum(sizes)),
      'bytes_per_file': float(statistics.median(sizes)) if sizes else 0.0,
  }


class Timer:
  """Wall and CPU seconds (this process and its workers) of named phases."""

  def __init__(self):
    self.row = {}

  def __call__(self, name, fn, *args, **kwargs):
    t0, c0 = time.perf_counter(), bench._cpu_seconds()  # pylint: disable=protected-access
    out = fn(*args, **kwargs)
    self.row[f'{name}_s'] = time.perf_counter() - t0
    self.row[f'{name}_cpu_s'] = bench._cpu_seconds() - c0  # pylint: disable=protected-access
    return out


def ditto_rounds(first, last, process, task, store, server_state, log):
  """Ditto rounds `first..last` through the store; their rows."""
  ids = list(task.train_data.client_ids)
  config = simulation.SimulationConfig(
      total_rounds=last, clients_per_round=_CLIENTS.value
  )
  rows = []
  for r in range(first, last + 1):
    timer = Timer()
    selected = simulation.sample_clients(
        ids, r, clients_per_round=_CLIENTS.value, seed=0
    )
    plans = [stragglers.ClientPlan(c, False, 1) for c in selected]
    datasets = timer('data', simulation.client_datasets, task, plans, r, config)
    states = timer('load', store.get_many, selected)
    out = timer('train', process.next, server_state, datasets, states)
    server_state = out.state
    timer('save', store.put_many, selected, out.client_states, round_num=r)
    del states, out
    if _CHECKPOINT.value and r % _CHECKPOINT.value == 0:
      timer('snapshot', store.snapshot, r)
    row = {
        'round': r,
        **timer.row,
        **memory(),
        'cache_states': store.cache_info()[0],
    }
    rows.append(row)
    log(
        f'round {r}: '
        + ', '.join(f'{k} {v:.3f}' for k, v in row.items() if k.endswith('_s'))
        + f'; driver rss {row["driver_rss_mb"]:.0f} MB, worker rss '
        f'{row["worker_rss_mb"]:.0f} MB'
    )
  return server_state, rows


def touch_pass(store, template, first_round, directory, log):
  """Writes then reads `--touch_clients` never-selected clients' states."""
  written = set(store.client_ids())
  fresh = [
      c
      for c in (f'w{k:05d}' for k in range(_NUM_CLIENTS.value))
      if c not in written
  ][: _TOUCH.value]
  chunk = _CLIENTS.value
  rng = np.random.default_rng(0)
  rows = []
  round_num = first_round
  for start in range(0, len(fresh), chunk):
    ids = fresh[start : start + chunk]
    states = [
        tf.nest.map_structure(
            lambda a: a + rng.standard_normal(1).astype(a.dtype), template
        )
        for _ in ids
    ]
    timer = Timer()
    timer('save', store.put_many, ids, states, round_num=round_num)
    del states
    rows.append(
        {
            'phase': 'write',
            'round': round_num,
            'clients': len(ids),
            **timer.row,
            **memory(),
        }
    )
    round_num += 1
  store.snapshot(round_num - 1)
  log(f'touch pass wrote {len(fresh)} clients; reading them back')
  store.restore(round_num - 1)  # Empties the cache: every read is a load.
  if _COLD.value:
    log(
        f'dropped {drop_from_page_cache(directory)} files from the page '
        'cache'
    )
  for start in range(0, len(fresh), chunk):
    ids = fresh[start : start + chunk]
    timer = Timer()
    states = timer('load', store.get_many, ids)
    del states
    rows.append({'phase': 'read', 'clients': len(ids), **timer.row, **memory()})
  return round_num, rows


def _summary(rows, keys):
  out = {}
  for key in keys:
    values = [r[key] for r in rows if key in r]
    if values:
      out[key] = {
          'median': statistics.median(values),
          'max': max(values),
          'mean': statistics.mean(values),
          'n': len(values),
      }
  return out


def format_report(results: dict) -> str:
  """The numbers docs/performance.md quotes, as Markdown."""
  lines = [
      f'state {results["state_mb"]:.2f} MB '
      f'({results["state_parameters"]:,} parameters); memory at start '
      f'{results["memory_at_start"]["driver_rss_mb"]:.0f} MB, after '
      f'building {results["memory_after_build"]["driver_rss_mb"]:.0f} MB',
      '',
      '| rounds | data s | load s | train s | save s | snapshot s | '
      'load+save CPU s | train CPU s | driver RSS MB (max) | '
      'worker RSS MB (max) |',
      '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
  ]
  for name, summary in results['rounds'].items():
    if not summary:
      continue
    med = lambda k, s=summary: s[k]['median'] if k in s else float('nan')
    lines.append(
        f'| {name} (n={summary["train_s"]["n"]}) | {med("data_s"):.3f} | '
        f'{med("load_s"):.3f} | {med("train_s"):.2f} | {med("save_s"):.3f} |'
        f' {med("snapshot_s"):.3f} | '
        f'{med("load_cpu_s") + med("save_cpu_s"):.3f} | '
        f'{med("train_cpu_s"):.2f} | '
        f'{summary["driver_rss_mb"]["max"]:.0f} | '
        f'{summary["worker_rss_mb"]["max"]:.0f} |'
    )
  touch = results['touch']
  if touch['write']:
    lines.append(
        f'\ntouch pass: {touch["write"]["save_s"]["n"]} chunks written, '
        f'median {touch["write"]["save_s"]["median"]:.3f} s '
        f'({touch["write"]["save_cpu_s"]["median"]:.3f} s CPU) per chunk; '
        f'read back median {touch["read"]["load_s"]["median"]:.3f} s '
        f'({touch["read"]["load_cpu_s"]["median"]:.3f} s CPU) per chunk; '
        f'driver RSS max {touch["write"]["driver_rss_mb"]["max"]:.0f} MB '
        f'(write), {touch["read"]["driver_rss_mb"]["max"]:.0f} MB (read)'
    )
  for key in ('usage_after_rounds', 'usage_after_touch', 'usage_at_end'):
    u = results[key]
    lines.append(
        f'{key}: {u["state_files"]} files, '
        f'{u["store_bytes"] / 1e9:.3f} GB, '
        f'{u["bytes_per_file"] / 1e6:.3f} MB per file'
    )
  end = results['memory_at_end']
  lines.append(
      f'projected store for {results["flags"]["num_clients"]} clients '
      f'(one version each): {results["projected_store_gb"]:.1f} GB; peak '
      f'memory: driver {end["driver_peak_mb"]:.0f} MB, worker '
      f'{end["worker_peak_mb"]:.0f} MB; load {results["load_start"]} -> '
      f'{results["load_end"]}'
  )
  return '\n'.join(lines)


def main(argv) -> int:
  if len(argv) > 1:
    print(
        f'bench_ditto_scale: error: unexpected arguments {argv[1:]}',
        file=sys.stderr,
    )
    return 2
  for name, flag, low in (
      ('num_clients', _NUM_CLIENTS, 1),
      ('clients_per_round', _CLIENTS, 1),
      ('rounds', _ROUNDS, 1),
      ('rounds_after', _ROUNDS_AFTER, 0),
      ('touch_clients', _TOUCH, 0),
      ('examples_per_client', _EXAMPLES, 1),
      ('batch_size', _BATCH, 1),
      ('rounds_per_checkpoint', _CHECKPOINT, 0),
  ):
    if flag.value < low:
      print(
          f'bench_ditto_scale: error: --{name} must be >= {low}',
          file=sys.stderr,
      )
      return 2
  if _CLIENTS.value > _NUM_CLIENTS.value:
    print(
        'bench_ditto_scale: error: --clients_per_round exceeds '
        '--num_clients',
        file=sys.stderr,
    )
    return 2
  try:
    if _STATE_DIR.value:
      run_dir.check_output_dir(_STATE_DIR.value, flag='--state_dir')
    if _OUTPUT.value:
      run_dir.check_output_file(_OUTPUT.value, flag='--output_json')
  except run_dir.OutputDirError as e:
    print(f'bench_ditto_scale: error: {e}', file=sys.stderr)
    return 2
  try:
    contexts.set_context(max_concurrent_computation_calls=_CONCURRENT.value)
  except ValueError as e:
    print(f'bench_ditto_scale: error: {e}', file=sys.stderr)
    return 2
  runtime.install_worker_cleanup()
  log = lambda s: print(s, file=sys.stderr, flush=True)
  results = {
      'machine': bench.machine_info(),
      'load_start': os.getloadavg(),
      'flags': {
          f: flags.FLAGS[f].value
          for f in (
              'num_clients',
              'clients_per_round',
              'rounds',
              'rounds_after',
              'touch_clients',
              'examples_per_client',
              'batch_size',
              'model',
              'ditto_lambda',
              'rounds_per_checkpoint',
              'max_concurrent_computation_calls',
          )
      },
      'memory_at_start': memory(),
  }
  task = build_task(
      _NUM_CLIENTS.value, _EXAMPLES.value, _BATCH.value, _MODEL.value
  )
  spec = algorithms.AlgorithmSpec(
      name='ditto', client_learning_rate=_LR.value, ditto_lambda=_LAMBDA.value
  )
  process = algorithms.build_process(spec, task.model_fn)
  template = process.initial_client_state()
  state_bytes = sum(a.nbytes for a in tf.nest.flatten(template))
  results['state_mb'] = state_bytes / MB
  results['state_parameters'] = sum(a.size for a in tf.nest.flatten(template))
  directory = _STATE_DIR.value or tempfile.mkdtemp(prefix='ditto_scale_')
  store = client_states.DiskClientStateStore(
      directory, lambda _: process.initial_client_state()
  )
  results['memory_after_build'] = memory()
  log(
      f'state {state_bytes / MB:.2f} MB ({results["state_parameters"]:,} '
      f'parameters); store {directory}'
  )
  try:
    server_state = process.initialize()
    server_state, rows1 = ditto_rounds(
        1, _ROUNDS.value, process, task, store, server_state, log
    )
    results['usage_after_rounds'] = store_usage(directory)
    trained = store.get_many([store.client_ids()[0]])[0]
    next_round, touch_rows = touch_pass(
        store, trained, _ROUNDS.value + 1, directory, log
    )
    results['usage_after_touch'] = store_usage(directory)
    _, rows2 = ditto_rounds(
        next_round,
        next_round + _ROUNDS_AFTER.value - 1,
        process,
        task,
        store,
        server_state,
        log,
    )
    results['usage_at_end'] = store_usage(directory)
  finally:
    if not _STATE_DIR.value:
      shutil.rmtree(directory, ignore_errors=True)
  results['memory_at_end'] = memory()
  results['load_end'] = os.getloadavg()
  keys = [
      'data_s',
      'load_s',
      'train_s',
      'save_s',
      'snapshot_s',
      'load_cpu_s',
      'train_cpu_s',
      'save_cpu_s',
      'snapshot_cpu_s',
      'driver_rss_mb',
      'worker_rss_mb',
      'driver_peak_mb',
      'worker_peak_mb',
  ]
  # Round 1 traces and starts the worker: left out of the summaries.
  results['rounds'] = {
      'before_pass': _summary(rows1[1:], keys),
      'after_pass': _summary(rows2, keys),
  }
  results['touch'] = {
      'write': _summary(
          [r for r in touch_rows if r['phase'] == 'write'],
          ['save_s', 'save_cpu_s', 'driver_rss_mb'],
      ),
      'read': _summary(
          [r for r in touch_rows if r['phase'] == 'read'],
          ['load_s', 'load_cpu_s', 'driver_rss_mb'],
      ),
  }
  usage = results['usage_at_end']
  results['projected_store_gb'] = (
      usage['bytes_per_file'] * _NUM_CLIENTS.value / 1e9
  )
  results['raw'] = {
      'rounds_before': rows1,
      'touch': touch_rows,
      'rounds_after': rows2,
  }
  print(format_report(results))
  if _OUTPUT.value:
    atomic.write_json(_OUTPUT.value, results, indent=1, default=float)
  return 0


def run_main() -> None:
  """Console-script entry point."""
  define_flags()
  console.run(__name__, lambda argv: runtime.exit_now(main(argv)))


if __name__ == '__main__':
  run_main()
