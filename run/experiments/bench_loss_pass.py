# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""Cost of the tail-aware algorithms' loss pass against a FedAvg round.

Example (what docs/performance.md records, "Tail-aware round cost"):

  python -m run.experiments.bench_loss_pass --algorithms=qffl,deltafl,term \
      --rounds=8

q-FFL, TERM, Delta-FL and AFL evaluate each selected client's loss at the
broadcast model (`tff_algos.client_work.local_loss`) before training. On
Synthetic(1, 1) softmax regression (100 clients x 150 examples, 10 per
round, batch 10, as `run.benchmarks.bench_suite`), every algorithm runs through
TFF (`process.next`) twice: with the loss pass iterated as now (a
`tf.while_loop` over the dataset's iterator, `<name>`) and as before
(`Dataset.reduce`, `<name>/reduce_loss`), next to FedAvg. Rounds are
interleaved in a rotating order on the same clients and batches. Reported:
mean wall and CPU seconds per round (this process and its TFF worker), the
ratio to FedAvg, and the L-inf difference between the two loss-pass
variants' final weights (they must be equal).
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
import statistics
import time

from absl import flags
import numpy as np
import tensorflow as tf  # pylint: disable=unused-import  (before app.run)
import tensorflow_federated as tff

from run import algorithms
from run.benchmarks import bench
from run import console
from run import simulation
from tff_algos import client_work
from tff_algos import composition
from tff_algos import runtime
from tff_algos import stragglers

# pylint: enable=g-import-not-at-top,wrong-import-position

TAIL_ALGORITHMS = ('qffl', 'deltafl', 'term')
# Flags are defined at start-up only: absl flags are global, and the test
# suite and the API-docs build import several binaries into one process.
_ALGORITHMS = None
_ROUNDS = None
_WARMUP = None
_CLIENTS = None


def define_flags() -> None:
  """Defines the command-line flags."""
  global _ALGORITHMS, _ROUNDS, _WARMUP, _CLIENTS
  _ALGORITHMS = flags.DEFINE_list(
      'algorithms', list(TAIL_ALGORITHMS), 'Tail-aware algorithms to time.'
  )
  _ROUNDS = flags.DEFINE_integer('rounds', 8, 'Timed rounds.')
  _WARMUP = flags.DEFINE_integer('warmup_rounds', 2, 'Untimed rounds first.')
  _CLIENTS = flags.DEFINE_integer('clients_per_round', 10, 'Clients per round.')


_PARAMS = {
    'qffl': {'q': 1.0},
    'deltafl': {'theta': 0.5},
    'term': {'tilt': 1.0},
    'fedavg': {},
}


def build(name: str, reduce_loss: bool, model_fn):
  """The process of `name`; its loss pass by `Dataset.reduce` if asked."""
  spec = algorithms.AlgorithmSpec(
      name=name, client_learning_rate=0.01, **_PARAMS[name]
  )
  original = client_work.local_loss
  if reduce_loss:

    def local_loss(*args, **kwargs):
      kwargs.setdefault(
          'loop_implementation', tff.learning.LoopImplementation.DATASET_REDUCE
      )
      return original(*args, **kwargs)

    client_work.local_loss = local_loss
  try:  # The computations are traced here, so the patch ends with it.
    return algorithms.build_process(spec, model_fn)
  finally:
    client_work.local_loss = original


def main(argv) -> int:
  bad = [a for a in _ALGORITHMS.value if a not in TAIL_ALGORITHMS]
  if len(argv) > 1 or bad or _ROUNDS.value < 1 or _WARMUP.value < 0:
    print(
        f'bench_loss_pass: error: --algorithms in {TAIL_ALGORITHMS}, '
        '--rounds >= 1, no positional arguments',
        file=sys.stderr,
    )
    return 2
  runtime.install_worker_cleanup()
  task = bench.build_task(
      bench.BenchConfig(num_clients=100, examples_per_client=150)
  )
  systems = {'fedavg': build('fedavg', False, task.model_fn)}
  for name in _ALGORITHMS.value:
    systems[name] = build(name, False, task.model_fn)
    systems[f'{name}/reduce_loss'] = build(name, True, task.model_fn)
  states = {k: p.initialize() for k, p in systems.items()}
  names = list(systems)
  rounds, warmup, k = _ROUNDS.value, _WARMUP.value, _CLIENTS.value
  config = simulation.SimulationConfig(
      total_rounds=rounds + warmup, clients_per_round=k
  )
  ids = list(task.train_data.client_ids)
  wall = {n: [] for n in names}
  cpu = {n: [] for n in names}
  load_start = os.getloadavg()
  for r in range(1, rounds + warmup + 1):
    plans = [
        stragglers.ClientPlan(c, False, 1)
        for c in simulation.sample_clients(ids, r, clients_per_round=k, seed=0)
    ]
    shift = r % len(names)
    for name in names[shift:] + names[:shift]:
      t0, c0 = time.perf_counter(), bench._cpu_seconds()  # pylint: disable=protected-access
      states[name] = (
          systems[name]
          .next(
              states[name], simulation.client_datasets(task, plans, r, config)
          )
          .state
      )
      if r > warmup:
        wall[name].append(time.perf_counter() - t0)
        cpu[name].append(bench._cpu_seconds() - c0)  # pylint: disable=protected-access
  base_wall, base_cpu = statistics.mean(wall['fedavg']), statistics.mean(
      cpu['fedavg']
  )
  print('| system | s/round | cpu s/round | x fedavg (wall) | x fedavg (CPU) |')
  print('|---|---:|---:|---:|---:|')
  for name in names:
    w, c = statistics.mean(wall[name]), statistics.mean(cpu[name])
    print(
        f'| {name} | {w:.3f} | {c:.3f} | {w / base_wall:.2f} | '
        f'{c / base_cpu:.2f} |'
    )
  for name in _ALGORITHMS.value:
    a = composition.model_weights_as_numpy(systems[name], states[name])
    b = composition.model_weights_as_numpy(
        systems[name], states[f'{name}/reduce_loss']
    )
    diff = max(float(np.abs(x - y).max()) for x, y in zip(a, b))
    print(
        f'{name}: final weights, loss pass by iterator vs reduce, L-inf '
        f'{diff:.3g}'
    )
  print(
      f'{rounds} timed rounds after {warmup}; load average {load_start} '
      f'-> {os.getloadavg()}'
  )
  return 0


def run_main() -> None:
  """Console-script entry point."""
  define_flags()
  console.run(__name__, lambda argv: runtime.exit_now(main(argv)))


if __name__ == '__main__':
  run_main()
