# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""Per-round cost against the population size (nothing is O(population)).

Example (what docs/performance.md records):

  python -m run.experiments.bench_scale --populations=100,10000 \
      --clients_per_round=100 \
      --rounds=4 --warmup_rounds=1

For each population, Synthetic(1, 1) clients of 150 training examples each
(softmax regression, batch 10) are sampled `--clients_per_round` per round
with `run.simulation.sample_clients`, and FedAvg rounds run through TFF
(`process.next`) and through the batched engine. All populations are set up
first; then every (population, path) runs round r, in an order that rotates
every round, before any runs round r + 1. Each timed round's wall and CPU
seconds (this process and its TFF worker), the part spent building the
round's client datasets (or batched plan) and the load average are
reported, with the time to set the population up (data generation, and for
the batched engine reading the raw arrays of the clients the run samples,
`ClientArrays.preload`; `--preload=all` reads the whole population, which is
O(population) and paid once).
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
import statistics
import time

from absl import flags
import tensorflow as tf  # pylint: disable=unused-import  (before app.run)

from run import algorithms
from run import atomic
from run.benchmarks import bench
from run import console
from run import engines
from run import run_dir
from run import simulation
from tff_algos import runtime
from tff_algos import stragglers

# pylint: enable=g-import-not-at-top,wrong-import-position

# Flags are defined at start-up only: absl flags are global, and the test
# suite and the API-docs build import several binaries into one process.
_POPULATIONS = None
_CLIENTS = None
_ROUNDS = None
_WARMUP = None
_PATHS = None
_PRELOAD = None
_OUTPUT = None


def define_flags() -> None:
  """Defines the command-line flags."""
  global _POPULATIONS, _CLIENTS, _ROUNDS, _WARMUP, _PATHS, _PRELOAD, _OUTPUT
  _POPULATIONS = flags.DEFINE_list(
      'populations', ['100', '10000'], 'Population sizes.'
  )
  _CLIENTS = flags.DEFINE_integer(
      'clients_per_round', 100, 'Clients per round.'
  )
  _ROUNDS = flags.DEFINE_integer('rounds', 3, 'Timed rounds.')
  _WARMUP = flags.DEFINE_integer('warmup_rounds', 1, 'Untimed rounds first.')
  _PATHS = flags.DEFINE_list(
      'paths', ['tff', 'batched'], 'Paths to time: tff (process.next), batched.'
  )
  _PRELOAD = flags.DEFINE_enum(
      'preload',
      'sampled',
      ['sampled', 'all'],
      'Clients whose raw arrays the batched engine reads before timing: the '
      "run's sampled clients, or the whole population (O(population), slow).",
  )
  _OUTPUT = flags.DEFINE_string('output_json', None, 'Write the numbers here.')


def _sampled(ids, rounds: int, clients_per_round: int) -> list[str]:
  """Every client any of `rounds` rounds samples (sorted)."""
  return sorted(
      {
          c
          for r in range(1, rounds + 1)
          for c in simulation.sample_clients(
              ids, r, clients_per_round=clients_per_round, seed=0
          )
      }
  )


def set_up(
    population: int,
    clients_per_round: int,
    total_rounds: int,
    paths,
    preload: str,
) -> dict:
  """The task, process, engine and states of one population."""
  t0 = time.perf_counter()
  task = bench.build_task(
      bench.BenchConfig(
          num_clients=population,
          clients_per_round=clients_per_round,
          examples_per_client=150,
      )
  )
  setup = {'task_seconds': time.perf_counter() - t0}
  spec = algorithms.AlgorithmSpec(name='fedavg', client_learning_rate=0.01)
  process = algorithms.build_process(spec, task.model_fn)
  ids = list(task.train_data.client_ids)
  engine = None
  if 'batched' in paths:
    engine = engines.build_batched_engine(spec, task)
    t0 = time.perf_counter()
    engine.client_arrays.preload(
        ids
        if preload == 'all'
        else _sampled(ids, total_rounds, clients_per_round)
    )
    setup['preload_seconds'] = time.perf_counter() - t0
    setup['preloaded_clients'] = len(engine.client_arrays)
  return {
      'task': task,
      'process': process,
      'engine': engine,
      'ids': ids,
      'setup': setup,
      'states': {path: process.initialize() for path in paths},
  }


def run_round(
    system: dict, path: str, r: int, clients_per_round: int, config
) -> dict:
  """One round of one path; wall, CPU and data-building seconds."""
  t0, c0 = time.perf_counter(), bench._cpu_seconds()  # pylint: disable=protected-access
  selected = simulation.sample_clients(
      system['ids'], r, clients_per_round=clients_per_round, seed=0
  )
  plans = [stragglers.ClientPlan(c, False, 1) for c in selected]
  task = system['task']
  if path == 'tff':
    data = simulation.client_datasets(task, plans, r, config)
    t1 = time.perf_counter()
    system['states'][path] = (
        system['process'].next(system['states'][path], data).state
    )
  else:
    plan = simulation.batched_round_plan(task, plans, r, config)
    t1 = time.perf_counter()
    system['states'][path], _ = system['engine'].next(
        system['states'][path], plan
    )
  return {
      'wall': time.perf_counter() - t0,
      'cpu': bench._cpu_seconds() - c0,  # pylint: disable=protected-access
      'data': t1 - t0,
      'load': os.getloadavg()[0],
  }


def measure(
    populations,
    clients_per_round: int,
    rounds: int,
    warmup: int,
    paths,
    preload: str,
    log,
) -> dict:
  """Per-round seconds of every (population, path), rounds interleaved.

  Every population and path runs round r before any runs round r + 1, in an
  order that rotates every round, so a change of load hits all alike.
  """
  systems = {}
  for population in populations:
    systems[population] = set_up(
        population, clients_per_round, rounds + warmup, paths, preload
    )
    log(f'population {population} set up: {systems[population]["setup"]}')
  config = simulation.SimulationConfig(
      total_rounds=rounds + warmup, clients_per_round=clients_per_round
  )
  keys = [(p, path) for p in populations for path in paths]
  rows = {key: [] for key in keys}
  for r in range(1, rounds + warmup + 1):
    shift = r % len(keys)
    for key in keys[shift:] + keys[:shift]:
      row = run_round(systems[key[0]], key[1], r, clients_per_round, config)
      if r > warmup:
        rows[key].append(row)
    log(f'round {r} done, load {os.getloadavg()[0]:.1f}')
  out = {}
  for population in populations:
    system = systems[population]
    if system['engine'] is not None:
      system['engine'].close()
    out[population] = {'setup': system['setup']}
    for path in paths:
      got = rows[(population, path)]
      out[population][path] = {
          'median_round_seconds': statistics.median(r['wall'] for r in got),
          'median_round_cpu_seconds': statistics.median(r['cpu'] for r in got),
          'median_data_seconds': statistics.median(r['data'] for r in got),
          'mean_load': statistics.mean(r['load'] for r in got),
          'round_seconds': [r['wall'] for r in got],
          'round_cpu_seconds': [r['cpu'] for r in got],
      }
  return out


def main(argv) -> int:
  code = console.unexpected_arguments('bench_scale', argv)
  if code is not None:
    return code
  runtime.install_worker_cleanup()
  log = lambda s: print(s, file=sys.stderr, flush=True)
  populations = [int(p) for p in _POPULATIONS.value]
  paths = list(_PATHS.value)
  if (
      not populations
      or min(populations) < _CLIENTS.value
      or not paths
      or (set(paths) - {'tff', 'batched'})
      or _ROUNDS.value < 1
  ):
    print(
        'bench_scale: error: --populations >= --clients_per_round, --paths '
        'in tff,batched, --rounds >= 1',
        file=sys.stderr,
    )
    return 2
  if run_dir.refuse_output_file(
      _OUTPUT.value, flag='--output_json', prog='bench_scale'
  ):
    return 2
  results = {'load_start': os.getloadavg()}
  results.update(
      measure(
          populations,
          _CLIENTS.value,
          _ROUNDS.value,
          _WARMUP.value,
          paths,
          _PRELOAD.value,
          log,
      )
  )
  results['load_end'] = os.getloadavg()
  print(
      '| population | path | median s/round | median cpu s/round | '
      'median data s/round | mean load |'
  )
  print('|---:|---|---:|---:|---:|---:|')
  for population in populations:
    for name in paths:
      r = results[population][name]
      print(
          f'| {population:,} | {name} | {r["median_round_seconds"]:.2f} | '
          f'{r["median_round_cpu_seconds"]:.2f} | '
          f'{r["median_data_seconds"]:.3f} | {r["mean_load"]:.1f} |'
      )
    print(f'setup {population}: {results[population]["setup"]}')
  print(f'load {results["load_start"]} -> {results["load_end"]}')
  if _OUTPUT.value:
    atomic.write_json(_OUTPUT.value, results, indent=2, default=float)
  return 0


def run_main() -> None:
  """Console-script entry point."""
  define_flags()
  console.run(__name__, lambda argv: runtime.exit_now(main(argv)))


if __name__ == '__main__':
  run_main()
