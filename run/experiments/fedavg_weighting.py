# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""FedAvg's reported runs again with uniform client weights, paired.

The tail benchmark's FedAvg weighs each client's update by its examples
(TFF's default), while q-FedAvg as the benchmark runs it samples clients
uniformly and weighs them by F^q, nearly a simple average at a small q.
This experiment runs each of a page's reported FedAvg runs again from its
record's own arguments with `--client_weighting=uniform` (nothing else
changed: the learning rate is FedAvg's choice, not tuned again), keeps the
new records, and prints the held-out statistics of FedAvg (by examples),
FedAvg (uniform) and q-FedAvg with the paired per-seed differences
(mean, std, 95% half-width, seeds higher).

  python -m run.experiments.fedavg_weighting \
      --records_dir=docs/results/runs/synthetic \
      --out_records_dir=docs/results/runs/synthetic_weighting \
      --output_dir=/tmp/weighting --jobs=2
"""

from collections.abc import Sequence
from concurrent import futures
import json
import os
import re
import sys
from typing import Optional

from absl import flags

from run import console
from run.tail_benchmark import origin as origin_lib
from run.tail_benchmark import records as bench_records
from run.tail_benchmark import stats
from tff_algos import runtime

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the flags (at start-up only: absl flags are global, and the
  benchmark's have the same names)."""
  flags.DEFINE_string(
      'records_dir', None, "The page's records (its final FedAvg runs)."
  )
  flags.DEFINE_string(
      'out_records_dir',
      None,
      "Where the uniform runs' records go (a record there is reused).",
  )
  flags.DEFINE_string('output_dir', None, "The runs' folders.")
  flags.DEFINE_integer('jobs', 1, 'Runs at a time.')


FEDAVG_RECORD = re.compile(
    r'final_fedavg_lr(?P<lr>[0-9.e-]+)_seed(?P<seed>\d+)\.json'
)
QFFL_RECORD = re.compile(
    r'final_qffl_q[0-9.e-]+_lr[0-9.e-]+_seed(?P<seed>\d+)\.json'
)
COLUMNS = ('worst10', 'mean', 'weighted_mean')


def reported(records_dir: str, pattern: re.Pattern) -> dict[int, str]:
  """`{seed: record file}` of the records whose names match `pattern`."""
  return {
      int(m['seed']): os.path.join(records_dir, name)
      for name in sorted(os.listdir(records_dir))
      if (m := pattern.fullmatch(name))
  }


def uniform_args(args: Sequence[str], root: str, name: str) -> list[str]:
  """A FedAvg record's run flags with uniform client weights, run in
  `root/name`."""
  kept = [
      a
      for a in args
      if not a.startswith(('--root_output_dir=', '--experiment_name='))
  ]
  return kept + [
      '--client_weighting=uniform',
      f'--root_output_dir={root}',
      f'--experiment_name={name}',
  ]


def held_out(record: dict) -> dict[str, float]:
  """The held-out split's statistics of a record (`stats.client_stats`)."""
  test = record['splits']['test']
  return stats.client_stats(
      test['accuracy'], test['loss'], test['num_examples']
  )


def table(rows: dict[str, list[dict[str, float]]]) -> list[str]:
  """Lines: each method's mean (std) per column, then the paired rows
  (uniform minus examples, q-FedAvg minus uniform)."""
  out = []
  for column in COLUMNS:
    for label, per_seed in rows.items():
      values = [s[column] for s in per_seed]
      mean, std = stats.mean_std(values)
      out.append(
          f'{column} {label}: {100 * mean:.1f} ({100 * std:.1f}); per seed '
          + ' '.join(f'{100 * v:.1f}' for v in values)
      )
    names = list(rows)
    for a, b in ((names[1], names[0]), (names[2], names[1])):
      mean, std, wins, n, half = stats.paired(
          [s[column] for s in rows[a]], [s[column] for s in rows[b]]
      )
      out.append(
          f'{column} {a} minus {b}: {100 * mean:+.1f} +- {100 * half:.1f} '
          f'(std {100 * std:.1f}), higher on {wins} of {n} seeds'
      )
  return out


def problem(
    records_dir: Optional[str],
    out_records_dir: Optional[str],
    output_dir: Optional[str],
) -> Optional[str]:
  """What is wrong with the flags' folders (one line), or None."""
  for name, value in (
      ('records_dir', records_dir),
      ('out_records_dir', out_records_dir),
      ('output_dir', output_dir),
  ):
    if not value:
      return f'--{name} is required'
  if not os.path.isdir(records_dir):
    return f'--records_dir={records_dir} is not a folder'
  fedavg = reported(records_dir, FEDAVG_RECORD)
  if not fedavg or sorted(reported(records_dir, QFFL_RECORD)) != sorted(fedavg):
    return (
        f'{records_dir} holds no final FedAvg and q-FedAvg records of the '
        'same seeds'
    )
  return None


def main(argv: Sequence[str]) -> int:
  unexpected = console.unexpected_arguments('fedavg_weighting', argv)
  if unexpected is not None:
    return unexpected
  records_dir, out_dir = FLAGS.records_dir, FLAGS.out_records_dir
  error = problem(records_dir, out_dir, FLAGS.output_dir)
  if not error and FLAGS.jobs < 1:
    error = f'--jobs must be >= 1, got {FLAGS.jobs}'
  if error:
    print(f'fedavg_weighting: error: {error}', file=sys.stderr)
    return 2
  fedavg = reported(records_dir, FEDAVG_RECORD)
  qffl = reported(records_dir, QFFL_RECORD)
  seeds = sorted(fedavg)
  loaded = {}
  for seed in seeds:
    with open(fedavg[seed]) as f:
      loaded[seed] = json.load(f)
  task_flags = [a for a in loaded[seeds[0]]['args'] if a.startswith('--task')]
  os.makedirs(out_dir, exist_ok=True)
  runs = bench_records.Runs(
      out_dir,
      FLAGS.output_dir,
      FLAGS.jobs,
      False,
      origin=origin_lib.current(task_flags),
      accept_foreign=True,
  )
  root = os.path.join(FLAGS.output_dir, 'runs')

  def one(seed: int) -> dict:
    name = os.path.basename(fedavg[seed])[: -len('.json')].replace(
        'final_fedavg_', 'final_fedavg_uniform_', 1
    )
    args = uniform_args(loaded[seed]['args'], root, name)
    rounds = int(bench_records.flag_value(args, 'total_rounds'))
    try:
      return runs.run(args, rounds, False)
    finally:
      runs.release()

  try:
    with futures.ThreadPoolExecutor(max(1, FLAGS.jobs)) as pool:
      uniform = list(pool.map(one, seeds))
  except (RuntimeError, OSError) as e:
    print(f'fedavg_weighting: error: {e}', file=sys.stderr)
    return 1
  finally:
    runs.close()
  qffl_records = []
  for seed in seeds:
    with open(qffl[seed]) as f:
      qffl_records.append(json.load(f))
  rows = {
      'FedAvg (examples)': [held_out(loaded[s]) for s in seeds],
      'FedAvg (uniform)': [held_out(r) for r in uniform],
      'q-FedAvg': [held_out(r) for r in qffl_records],
  }
  print(f'held-out data, reported seeds {seeds}; accuracy in %')
  print('\n'.join(table(rows)))
  return 0


def run_main() -> None:
  define_flags()
  console.run(__name__, lambda argv: runtime.exit_now(main(argv)))


if __name__ == '__main__':
  run_main()
