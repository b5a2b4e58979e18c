# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""Per-round cost against the population size (nothing is O(population)).

Example (what docs/performance.md records):

  python -m run.bench_scale --populations=100,10000 --clients_per_round=100 \
      --rounds=3 --warmup_rounds=1

For each population, Synthetic(1, 1) clients of 150 training examples each
(softmax regression, batch 10) are sampled `--clients_per_round` per round
with `run.simulation.sample_clients`, and FedAvg rounds run through TFF
(`process.next`) and through the batched engine, interleaved. Each timed
round's wall and CPU seconds (this process and its TFF worker) are reported,
with the time to set the population up (data generation, and for the
batched engine reading the clients' raw arrays, `ClientArrays.preload`),
which is paid once and is O(population).
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
import json
import statistics
import time

from absl import app
from absl import flags
import tensorflow as tf  # pylint: disable=unused-import  (before app.run)

from run import algorithms
from run import bench
from run import engines
from run import simulation
from tff_algos import runtime
from tff_algos import stragglers
# pylint: enable=g-import-not-at-top,wrong-import-position

_POPULATIONS = flags.DEFINE_list('populations', ['100', '10000'],
                                 'Population sizes.')
_CLIENTS = flags.DEFINE_integer('clients_per_round', 100, 'Clients per round.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Timed rounds.')
_WARMUP = flags.DEFINE_integer('warmup_rounds', 1, 'Untimed rounds first.')
_OUTPUT = flags.DEFINE_string('output_json', None, 'Write the numbers here.')


def measure(population: int, clients_per_round: int, rounds: int,
            warmup: int, log) -> dict:
  """Per-round seconds of both paths for one population."""
  t0 = time.perf_counter()
  task = bench.build_task(bench.BenchConfig(
      num_clients=population, clients_per_round=clients_per_round,
      examples_per_client=150))
  setup = {'task_seconds': time.perf_counter() - t0}
  spec = algorithms.AlgorithmSpec(name='fedavg', client_learning_rate=0.01)
  process = algorithms.build_process(spec, task.model_fn)
  engine = engines.build_batched_engine(spec, task)
  t0 = time.perf_counter()
  engine.client_arrays.preload(task.train_data.client_ids)
  setup['preload_seconds'] = time.perf_counter() - t0
  config = simulation.SimulationConfig(
      total_rounds=rounds + warmup, clients_per_round=clients_per_round)
  ids = list(task.train_data.client_ids)
  states = {'tff': process.initialize(), 'batched': process.initialize()}
  wall = {k: [] for k in states}
  cpu = {k: [] for k in states}
  for r in range(1, rounds + warmup + 1):
    for name in (('tff', 'batched') if r % 2 else ('batched', 'tff')):
      t0, c0 = time.perf_counter(), bench._cpu_seconds()  # pylint: disable=protected-access
      selected = simulation.sample_clients(
          ids, r, clients_per_round=clients_per_round, seed=0)
      plans = [stragglers.ClientPlan(c, False, 1) for c in selected]
      if name == 'tff':
        states[name] = process.next(states[name], simulation.client_datasets(
            task, plans, r, config)).state
      else:
        states[name], _ = engine.next(states[name],
                                      simulation.batched_round_plan(
                                          task, plans, r, config))
      if r > warmup:
        wall[name].append(time.perf_counter() - t0)
        cpu[name].append(bench._cpu_seconds() - c0)  # pylint: disable=protected-access
    log(f'population {population} round {r} done')
  engine.close()
  return {
      'setup': setup,
      **{name: {'median_round_seconds': statistics.median(wall[name]),
                'median_round_cpu_seconds': statistics.median(cpu[name]),
                'round_seconds': wall[name], 'round_cpu_seconds': cpu[name]}
         for name in states},
  }


def main(argv) -> int:
  del argv
  runtime.install_worker_cleanup()
  log = lambda s: print(s, file=sys.stderr, flush=True)
  results = {'load_start': os.getloadavg()}
  for population in (int(p) for p in _POPULATIONS.value):
    results[population] = measure(population, _CLIENTS.value, _ROUNDS.value,
                                  _WARMUP.value, log)
  results['load_end'] = os.getloadavg()
  print('| population | path | median s/round | median cpu s/round |')
  print('|---:|---|---:|---:|')
  for population in (int(p) for p in _POPULATIONS.value):
    for name in ('tff', 'batched'):
      r = results[population][name]
      print(f'| {population:,} | {name} | {r["median_round_seconds"]:.2f} | '
            f'{r["median_round_cpu_seconds"]:.2f} |')
    print(f'setup {population}: {results[population]["setup"]}')
  print(f'load {results["load_start"]} -> {results["load_end"]}')
  if _OUTPUT.value:
    with open(_OUTPUT.value, 'w') as f:
      json.dump(results, f, indent=2, default=float)
  return 0


if __name__ == '__main__':
  app.run(lambda argv: runtime.exit_now(main(argv)))
