# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""Reproduces the seeds' synthetic-data experiments through the training
binary.

Each experiment is a list of variants (flag sets) run over several seeds, each
run `python -m run.train` with its flags, writing its usual outputs in its
folder. The runs go to the tail benchmark's pool (`run.tail_benchmark.pool`):
`--jobs` long-lived local worker processes or, with `--ray_address`, as many
Ray actors anywhere in a Ray cluster (`run.tail_benchmark.ray_pool`); each
run's summaries come back to the driver, which keeps its record
(`--records_dir`). The final per-client summaries are collected into a
Markdown table of mean and standard deviation over seeds, with the exact
commands.

  python -m run.experiments.reproduce --experiment=qffl_synthetic \
      --seeds=0,1,2 \
      --output_md=docs/results/qffl_synthetic.md

Experiments:
  qffl_synthetic      q-FFL q = 0 vs q = 1 on Synthetic(1,1), thesis Tab 4.5.
  term_synthetic      TERM t = 0 vs t = 1 on the same setting.
  term_synthetic_sweep
                      TERM t in {0, 0.1, 0.5, 1} with uniform client sampling
                      (TERM reweights uniformly sampled updates, spec 9.5).
  deltafl_synthetic   FedAvg vs Delta-FL theta in {0.8, 0.5, 0.1} on unseen
                      test clients, the Delta-FL paper's Tables 2-3 metrics.
  deltafl_synthetic_heldout
                      The same on the training clients' own held-out data.
  deltafl_family_synthetic
                      The same four models trained as one family per seed
                      (--thetas), with a per-client test-error histogram.
  deltafl_shakespeare FedAvg vs Delta-FL theta in {0.8, 0.5, 0.1} on the
                      Delta-FL Shakespeare preset (unseen test roles), CPU
                      scale-down; needs --extra_flags=--data_dir=DIR.
  deltafl_shakespeare_trained
                      The same at the tail benchmark's trained operating
                      point (its shakespeare setting, lr 1); needs
                      --extra_flags=--data_dir=DIR.
  qffl_shakespeare    q = 0 vs q = 0.001 on the q-FFL Shakespeare preset,
                      CPU scale-down; needs --extra_flags=--data_dir=DIR.
  fedprox_stragglers  FedAvg (drops stragglers) vs FedProx mu = 0 / mu = 1
                      with 90% stragglers, E = 20, thesis section 3.4.
  fedprox_shakespeare The same comparison (mu = 0.001, the thesis's
                      Shakespeare mu) on the FedProx Shakespeare preset, CPU
                      scale-down; needs --extra_flags=--data_dir=DIR.
  fedprox_shakespeare_no_stragglers
                      Its control: no stragglers, FedAvg vs mu = 0.001.
  robust_clean, robust_label_poison, robust_gaussian, robust_model_replacement
                      FedAvg vs robust aggregators on Synthetic(1,1) with
                      20% of clients corrupted (A1-A3), benign-client metrics.
  fedplus_synthetic   Fed+ (FedAvg+, FedGeoMed+, FedCoMed+; personal models)
                      vs FedAvg, FedProx, RFA and coordinate median on
                      Synthetic(1000, 10), N = 30 (document 004 section 5.2).
  fedplus_synthetic_n3, fedplus_synthetic_n15
                      The three Fed+ variants with N = 3 and N = 15 parties.
"""

import json
import os
import shlex
import subprocess
import sys
import time
from typing import Optional

if not (3, 9) <= sys.version_info[:2] <= (3, 11):
  sys.exit('error: needs Python 3.9, 3.10 or 3.11 (TFF 0.87)')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
import numpy as np

from run import atomic
from run import console
from run import run_dir
from run.tail_benchmark import origin as origins
from run.tail_benchmark import pool as run_pool
from run.tail_benchmark import processes
from run.tail_benchmark import ray_pool
from run.tail_benchmark import settings as bench_settings

# pylint: enable=g-import-not-at-top,wrong-import-position

_QFFL_BASE = [
    '--task=synthetic',
    '--num_clients=100',
    '--synthetic_alpha=1',
    '--synthetic_beta=1',
    '--clients_per_round=10',
    '--client_batch_size=10',
    '--client_learning_rate=0.1',
    '--client_epochs_per_round=1',
    '--client_sampling=examples',
    '--eval_train_clients=false',
]
_DELTAFL_TRAINING = [
    '--synthetic_size_law=table_4_4',
    '--clients_per_round=20',
    '--client_batch_size=10',
    '--client_learning_rate=0.1',
    '--client_epochs_per_round=1',
]
_DELTAFL_UNSEEN = [
    '--task=synthetic',
    '--num_clients=200',
    '--test_clients_fraction=0.5',
] + _DELTAFL_TRAINING
_DELTAFL_VARIANTS = {
    'FedAvg': ['--algorithm=fedavg'],
    'Delta-FL theta=0.8': ['--algorithm=deltafl', '--theta=0.8'],
    'Delta-FL theta=0.5': ['--algorithm=deltafl', '--theta=0.5'],
    'Delta-FL theta=0.1': ['--algorithm=deltafl', '--theta=0.1'],
}
_DELTAFL_REPORT = {
    'metric': 'test/error',
    'columns': ('mean', 'p50', 'p80', 'p90', 'p95'),
    'extra_metrics': (('train/loss', 'weighted_mean'), ('train/loss', 'p90')),
    'histogram': 'test/error',
}
# Accuracy across clients, as the fairness comparisons report it.
_FAIRNESS_COLUMNS = (
    'weighted_mean',
    'mean',
    'worst10',
    'best10',
    'variance',
    'angle_deg',
    'kl_uniform',
)
EXPERIMENTS = {
    'qffl_synthetic': {
        'base': _QFFL_BASE,
        'variants': {
            'q=0 (FedAvg)': ['--algorithm=qffl', '--q=0'],
            'q=1': ['--algorithm=qffl', '--q=1'],
        },
        'rounds': 1000,
        'metric': 'test/accuracy',
        'columns': _FAIRNESS_COLUMNS,
    },
    'term_synthetic': {
        'base': _QFFL_BASE,
        'variants': {
            't=0 (FedAvg)': ['--algorithm=term', '--tilt=0'],
            't=1': ['--algorithm=term', '--tilt=1'],
        },
        'rounds': 1000,
        'metric': 'test/accuracy',
        'columns': _FAIRNESS_COLUMNS,
    },
    'term_synthetic_sweep': {
        'base': _QFFL_BASE + ['--client_sampling=uniform'],
        'variants': {
            't=0 (FedAvg)': ['--algorithm=term', '--tilt=0'],
            't=0.1': ['--algorithm=term', '--tilt=0.1'],
            't=0.5': ['--algorithm=term', '--tilt=0.5'],
            't=1': ['--algorithm=term', '--tilt=1'],
        },
        'rounds': 5000,
        'metric': 'test/accuracy',
        'columns': _FAIRNESS_COLUMNS,
    },
    'deltafl_synthetic': {
        'base': _DELTAFL_UNSEEN,
        'variants': dict(_DELTAFL_VARIANTS),
        'rounds': 500,
        **_DELTAFL_REPORT,
    },
    'deltafl_synthetic_heldout': {
        # Synthetic(alpha, beta) draws a new labelling model per client, so
        # unseen test clients are at chance for any global model; this
        # variant evaluates each training client on its own held-out 20%.
        'base': ['--task=synthetic', '--num_clients=100'] + _DELTAFL_TRAINING,
        'variants': dict(_DELTAFL_VARIANTS),
        'rounds': 300,
        **_DELTAFL_REPORT,
    },
    'deltafl_family_synthetic': {
        # The same comparison as deltafl_synthetic, with the four models
        # trained side by side in one run per seed on identical client draws.
        'base': _DELTAFL_UNSEEN,
        'variants': {
            'family': ['--algorithm=deltafl', '--thetas=1,0.8,0.5,0.1'],
        },
        'members': {
            'FedAvg (theta=1)': 'theta_1',
            'Delta-FL theta=0.8': 'theta_0.8',
            'Delta-FL theta=0.5': 'theta_0.5',
            'Delta-FL theta=0.1': 'theta_0.1',
        },
        'rounds': 300,
        **_DELTAFL_REPORT,
    },
    'fedprox_stragglers': {
        'base': [
            '--task=synthetic',
            '--num_clients=30',
            '--clients_per_round=10',
            '--client_batch_size=10',
            '--client_learning_rate=0.01',
            '--client_epochs_per_round=20',
            '--straggler_fraction=0.9',
        ],
        'variants': {
            'FedAvg (drops stragglers)': ['--algorithm=fedavg'],
            'FedProx mu=0': ['--algorithm=fedprox', '--proximal_strength=0'],
            'FedProx mu=1': ['--algorithm=fedprox', '--proximal_strength=1'],
        },
        'rounds': 200,
        'metric': 'test/accuracy',
        'extra_metrics': (('train/loss', 'weighted_mean'),),
        'columns': ('weighted_mean', 'mean', 'worst10', 'variance'),
    },
}
# Robustness (thesis section 1.3 attacks, chapter 5 protocol): 20% of the
# clients corrupted, metrics on the benign clients (docs/results/robustness.md).
_ROBUST_BASE = [
    '--task=synthetic',
    '--num_clients=100',
    '--synthetic_alpha=1',
    '--synthetic_beta=1',
    '--clients_per_round=10',
    '--client_batch_size=10',
    '--client_learning_rate=0.01',
    '--client_epochs_per_round=1',
    '--eval_train_clients=false',
    '--attack_fraction=0.2',
]
_ROBUST_VARIANTS = {
    'FedAvg (mean)': ['--algorithm=fedavg'],
    'geometric median (3 passes)': [
        '--algorithm=fedavg',
        '--aggregator=geometric_median',
    ],
    'coordinate median': [
        '--algorithm=fedavg',
        '--aggregator=coordinate_median',
    ],
    'trimmed mean 20%': [
        '--algorithm=fedavg',
        '--aggregator=trimmed_mean',
        '--trim_fraction=0.2',
    ],
    'multi-Krum f=2': [
        '--algorithm=fedavg',
        '--aggregator=krum',
        '--krum_num_byzantine=2',
    ],
}
for _attack in ('label_poison', 'gaussian', 'model_replacement'):
  EXPERIMENTS[f'robust_{_attack}'] = {
      'base': _ROBUST_BASE + [f'--attack={_attack}'],
      'variants': dict(_ROBUST_VARIANTS),
      'rounds': 100,
      'metric': 'test/accuracy',
      'columns': ('mean', 'worst10', 'weighted_mean'),
      'extra_metrics': (('all_test/accuracy', 'mean'),),
  }
# Shakespeare presets (tasks/shakespeare_leaf.py, docs/tasks.md), scaled
# down so that one run takes minutes on one CPU core (docs/tasks.md gives
# the full settings): fewer roles, each role's first windows only, narrower
# recurrent layers, fewer rounds. The engines do not train a --thetas
# family, so the Delta-FL levels are separate runs on the stacked engine.
_SHAKESPEARE_CPU = [
    '--task=shakespeare_leaf',
    '--simulation_engine=stacked',
    '--client_epochs_per_round=1',
    '--eval_train_clients=false',
]
EXPERIMENTS['deltafl_shakespeare'] = {
    'base': _SHAKESPEARE_CPU
    + [
        '--shakespeare_preset=deltafl',
        '--max_clients=100',
        '--max_examples_per_client=200',
        '--rnn_units=32',
        '--clients_per_round=10',
        '--client_batch_size=16',
        '--client_learning_rate=0.1',
    ],
    'variants': dict(_DELTAFL_VARIANTS),
    'rounds': 100,
    # Tables 2-3 are test-device errors; the training roles are not
    # evaluated (--eval_train_clients=false), so no train/loss columns.
    **{**_DELTAFL_REPORT, 'extra_metrics': ()},
}
# The same comparison at the tail benchmark's trained operating point (its
# `shakespeare` setting: 200 roles of up to 1,000 windows, GRU 64, 300
# rounds of 10, batch 16, where FedAvg's validation mean plateaus near 46%)
# at the setting's centre learning rate, 1 (FedAvg's plateau run), for every
# variant as the paper compares them; the roles' own unseen test devices.
_TRAINED = bench_settings.SETTINGS['shakespeare']
EXPERIMENTS['deltafl_shakespeare_trained'] = {
    'base': [
        *_TRAINED.task_flags,
        '--simulation_engine=stacked',
        '--eval_train_clients=false',
        f'--clients_per_round={_TRAINED.budget.clients_per_round}',
        f'--client_epochs_per_round={_TRAINED.budget.local_epochs}',
        f'--client_batch_size={_TRAINED.budget.batch_size}',
        f'--client_learning_rate={_TRAINED.budget.learning_rate:g}',
    ],
    'variants': dict(_DELTAFL_VARIANTS),
    'rounds': _TRAINED.budget.rounds,
    **{**_DELTAFL_REPORT, 'extra_metrics': ()},
}
EXPERIMENTS['qffl_shakespeare'] = {
    'base': _SHAKESPEARE_CPU
    + [
        '--shakespeare_preset=qffl',
        '--max_examples_per_client=150',
        '--rnn_units=32',
        '--clients_per_round=10',
        '--client_batch_size=10',
        '--client_learning_rate=0.8',
        '--client_sampling=examples',
    ],
    'variants': {
        'q=0 (FedAvg)': ['--algorithm=qffl', '--q=0'],
        'q=0.001': ['--algorithm=qffl', '--q=0.001'],
    },
    'rounds': 100,
    'metric': 'test/accuracy',
    'columns': _FAIRNESS_COLUMNS,
}
# Thesis section 3.4 on Shakespeare (Fig 3.1): lr 0.8, batch 10, 10 roles per
# round, E = 20, 90% stragglers, mu = 0.001 (the thesis's best Shakespeare
# mu). The training roles are evaluated: the thesis plots the training loss.
_FEDPROX_SHAKESPEARE = [
    '--task=shakespeare_leaf',
    '--simulation_engine=stacked',
    '--shakespeare_preset=fedprox',
    '--max_examples_per_client=60',
    '--rnn_units=32',
    '--clients_per_round=10',
    '--client_batch_size=10',
    '--client_learning_rate=0.8',
    '--client_epochs_per_round=20',
]
_FEDPROX_MU = ['--algorithm=fedprox', '--proximal_strength=0.001']
_FEDPROX_SHAKESPEARE_REPORT = {
    'rounds': 40,
    'metric': 'test/accuracy',
    'extra_metrics': (('train/loss', 'weighted_mean'),),
    'columns': ('weighted_mean', 'mean', 'worst10', 'variance'),
}
EXPERIMENTS['fedprox_shakespeare'] = {
    'base': _FEDPROX_SHAKESPEARE + ['--straggler_fraction=0.9'],
    'variants': {
        'FedAvg (drops stragglers)': ['--algorithm=fedavg'],
        'FedProx mu=0': ['--algorithm=fedprox', '--proximal_strength=0'],
        'FedProx mu=0.001': _FEDPROX_MU,
    },
    **_FEDPROX_SHAKESPEARE_REPORT,
}
# Its control: with no stragglers FedAvg and FedProx mu = 0 are one run.
EXPERIMENTS['fedprox_shakespeare_no_stragglers'] = {
    'base': _FEDPROX_SHAKESPEARE,
    'variants': {
        'FedAvg = FedProx mu=0': ['--algorithm=fedavg'],
        'FedProx mu=0.001': _FEDPROX_MU,
    },
    **_FEDPROX_SHAKESPEARE_REPORT,
}
EXPERIMENTS['robust_clean'] = {
    'base': [f for f in _ROBUST_BASE if f != '--attack_fraction=0.2'],
    'variants': dict(_ROBUST_VARIANTS),
    'rounds': 100,
    'metric': 'test/accuracy',
    'columns': ('mean', 'worst10', 'weighted_mean'),
}

# Fed+ on the synthetic classification data of document 004 section 5.2
# (docs/results/fedplus_synthetic.md): zeta (alpha) = 1000, beta = 10,
# power-law sizes, 80/20 split, 10 parties per round, batch 10, lr 0.01,
# E = 20 local epochs (the seed defers to FedProx's hyperparameters), sigma =
# 0.01, delta = 0.001 / 0.1 / 0.1. Fed+ rows report each party's own local
# model on its own test split ('variant_metrics'); the others the global model.
_FEDPLUS_SYNTHETIC_BASE = [
    '--task=synthetic',
    '--synthetic_alpha=1000',
    '--synthetic_beta=10',
    '--client_batch_size=10',
    '--client_learning_rate=0.01',
    '--client_epochs_per_round=20',
]
_FEDPLUS_VARIANTS = {
    'FedAvg+ delta=0.001 (personal)': [
        '--algorithm=fedavg_plus',
        '--fedplus_sigma=0.01',
        '--fedplus_delta=0.001',
    ],
    'FedGeoMed+ delta=0.1 (personal)': [
        '--algorithm=fedgeomed_plus',
        '--fedplus_sigma=0.01',
        '--fedplus_delta=0.1',
    ],
    'FedCoMed+ delta=0.1 (personal)': [
        '--algorithm=fedcomed_plus',
        '--fedplus_sigma=0.01',
        '--fedplus_delta=0.1',
    ],
}
_FEDPLUS_METRICS = {v: 'personal/test/accuracy' for v in _FEDPLUS_VARIANTS}
EXPERIMENTS['fedplus_synthetic'] = {
    'base': _FEDPLUS_SYNTHETIC_BASE
    + ['--num_clients=30', '--clients_per_round=10'],
    'variants': {
        'FedAvg': ['--algorithm=fedavg', '--simulation_engine=stacked'],
        'FedProx mu=1': [
            '--algorithm=fedprox',
            '--proximal_strength=1',
            '--simulation_engine=stacked',
        ],
        'RFA (geometric median)': [
            '--algorithm=fedavg',
            '--aggregator=geometric_median',
        ],
        'coordinate median': [
            '--algorithm=fedavg',
            '--aggregator=coordinate_median',
        ],
        **_FEDPLUS_VARIANTS,
    },
    'variant_metrics': dict(_FEDPLUS_METRICS),
    'rounds': 20,
    'metric': 'test/accuracy',
    'columns': ('mean', 'weighted_mean'),
    # For Fed+ rows: the aggregate w~ on every party (not a model they use).
    'extra_metrics': (('test/accuracy', 'mean'),),
}
for _n in (3, 15):
  EXPERIMENTS[f'fedplus_synthetic_n{_n}'] = {
      'base': _FEDPLUS_SYNTHETIC_BASE
      + [f'--num_clients={_n}', f'--clients_per_round={min(_n, 10)}'],
      'variants': dict(_FEDPLUS_VARIANTS),
      'variant_metrics': dict(_FEDPLUS_METRICS),
      'rounds': 20,
      'metric': 'test/accuracy',
      'columns': ('mean', 'weighted_mean'),
      'extra_metrics': (('test/accuracy', 'mean'),),
  }

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the command-line flags (at start-up only: absl flags are global,
  and the test suite imports several binaries into one process)."""
  flags.DEFINE_string('experiment', None, f'One of: {", ".join(EXPERIMENTS)}.')
  flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds to run.')
  flags.DEFINE_integer(
      'rounds', None, "Override the experiment's number of rounds."
  )
  flags.DEFINE_string(
      'root_output_dir',
      'output/reproduce',
      'Where the runs write their outputs.',
  )
  flags.DEFINE_string('output_md', None, 'Write the Markdown table here.')
  flags.DEFINE_integer(
      'jobs',
      1,
      'Runs to execute at the same time: as many long-lived worker processes '
      '(or Ray actors, with --ray_address), each keeping its builds between '
      'runs.',
  )
  flags.DEFINE_string(
      'ray_address',
      None,
      'Run the runs on the Ray cluster at this address (auto: the cluster '
      'this machine belongs to; HOST:PORT: its head) as --jobs actors, not '
      'in local processes; their summaries come back here. Needs pip install '
      "'tff-hetero[ray]'; --root_output_dir and the runs' data must be usable "
      'on every node. The histogram, which reads run folders, is skipped.',
  )
  flags.DEFINE_list(
      'extra_flags',
      [],
      'More flags for every run, e.g. '
      '--extra_flags=--synthetic_size_law=table_4_4',
  )
  flags.DEFINE_string(
      'records_dir',
      None,
      "Keep each finished run's record here (its arguments, summaries and "
      'origin: code, data and library versions; one JSON file a run, to '
      'commit): a run whose record has the same arguments and origin is not '
      'run again, so the experiment spans sittings and machines.',
  )
  flags.DEFINE_boolean(
      'from_records',
      False,
      'Make the table from --records_dir alone; run nothing (a missing '
      'record is an error).',
  )
  flags.DEFINE_boolean(
      'accept_foreign_records',
      False,
      'Reuse records made by other code, data or library versions instead of '
      'redoing them (the table lists every origin with its records).',
  )


def run_one(args: list[str], log) -> dict:
  """Runs the training binary in a process of its own; returns its
  summary.json (resumes if done). `privacy_experiments` runs its runs so;
  this driver's own go to the pool's workers (`_run_pending`).

  The run is started in its own session (a terminal's Ctrl-C reaches only
  the driver, which ends its runs itself: `processes.end_children`).

  Raises:
    RuntimeError: If the run fails.
    processes.NotStarted: If the driver is ending.
  """
  cmd = [sys.executable, '-m', 'run.train', '--progress=false'] + args
  start = time.time()
  proc = processes.start(
      cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  log('$ ' + ' '.join(shlex.quote(a) for a in cmd[1:]))
  try:
    _, stderr = proc.communicate()
  finally:
    processes.forget(proc)
  if proc.returncode != 0:
    raise RuntimeError(
        f'run failed (exit {proc.returncode}): {stderr.strip()[-2000:]}'
    )
  seconds = time.time() - start
  log(f'  done in {seconds:.0f} s')
  out_dir = next(
      a.split('=', 1)[1] for a in args if a.startswith('--root_output_dir=')
  )
  name = next(
      a.split('=', 1)[1] for a in args if a.startswith('--experiment_name=')
  )
  with open(os.path.join(out_dir, name, 'summary.json')) as f:
    summary = json.load(f)
  summary['run_dir'] = os.path.join(out_dir, name)
  summary['seconds'] = seconds
  return summary


def _in_percent(metric: str, column: str) -> bool:
  """Accuracy and error summaries are printed in percent."""
  return metric.endswith(('accuracy', 'error')) and column not in (
      'variance',
      'angle_deg',
      'kl_uniform',
  )


def variant_metric(experiment: dict, variant: str) -> str:
  """The main metric of one variant: `variant_metrics` overrides `metric`
  (e.g. a personalised method's `personal/test/accuracy`)."""
  return experiment.get('variant_metrics', {}).get(
      variant, experiment['metric']
  )


def table(experiment: dict, results: dict[str, list[dict]]) -> str:
  """Markdown table: mean (std) over seeds for each variant and column."""
  metrics = [(experiment['metric'], c) for c in experiment['columns']]
  num_main = len(metrics)
  metrics += list(experiment.get('extra_metrics', ()))
  header = '| variant | ' + ' | '.join(f'{m} {c}' for m, c in metrics) + ' |'
  lines = [header, '|' + '---|' * (len(metrics) + 1)]
  for variant, runs in results.items():
    cells = []
    for i, (metric, column) in enumerate(metrics):
      if i < num_main:
        metric = variant_metric(experiment, variant)
      values = np.array(
          [r['summaries'][metric][column] for r in runs], dtype=float
      )
      scale = 100.0 if _in_percent(metric, column) else 1.0
      cells.append(f'{scale * values.mean():.4g} ({scale * values.std():.2g})')
    lines.append(f'| {variant} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def paired_table(experiment: dict, results: dict[str, list[dict]]) -> str:
  """Markdown table of each variant minus the first one, seed by seed.

  The runs of one seed share their data and client sampling, so the paired
  differences separate a variant's effect from seed-to-seed spread. Cells are
  the per-seed differences, then their mean (std).
  """
  baseline_name, *others = list(results)
  baseline = results[baseline_name]
  base_metric = variant_metric(experiment, baseline_name)
  metrics = [(experiment['metric'], c) for c in experiment['columns']]
  header = (
      f'| variant minus {baseline_name} | '
      + ' | '.join(f'{m} {c}' for m, c in metrics)
      + ' |'
  )
  lines = [header, '|' + '---|' * (len(metrics) + 1)]
  for variant in others:
    cells = []
    metric = variant_metric(experiment, variant)
    for _, column in metrics:
      diffs = np.array(
          [
              r['summaries'][metric][column]
              - b['summaries'][base_metric][column]
              for r, b in zip(results[variant], baseline)
          ],
          dtype=float,
      )
      scale = 100.0 if _in_percent(metric, column) else 1.0
      per_seed = ' / '.join(f'{scale * d:+.3g}' for d in diffs)
      cells.append(
          f'{per_seed}; {scale * diffs.mean():+.3g} ({scale * diffs.std():.2g})'
      )
    lines.append(f'| {variant} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def expand_members(
    experiment: dict, results: dict[str, list[dict]]
) -> dict[str, list[dict]]:
  """A family run's summaries as one result row per member."""
  members = experiment.get('members')
  if not members:
    return results
  expanded = {}
  for runs in results.values():
    for label, prefix in members.items():
      expanded[label] = [
          {
              'summaries': {
                  k[len(prefix) + 1 :]: v
                  for k, v in r['summaries'].items()
                  if k.startswith(prefix + '/')
              },
              'run_dir': r.get('run_dir'),
          }
          for r in runs
      ]
  return expanded


def per_client_values(run_dir: str, split: str, metric: str) -> np.ndarray:
  """One metric of every client of `split` at the run's last evaluation."""
  clients_dir = os.path.join(run_dir, 'clients')
  last = sorted(f for f in os.listdir(clients_dir) if f.endswith('.csv'))[-1]
  import csv  # pylint: disable=g-import-not-at-top

  with open(os.path.join(clients_dir, last)) as f:
    rows = [r for r in csv.DictReader(f) if r['split'] == split]
  if metric == 'error':
    return np.array([1.0 - float(r['accuracy']) for r in rows])
  return np.array([float(r[metric]) for r in rows])


def write_histogram(
    experiment: dict, results: dict[str, list[dict]], path: str
) -> None:
  """Histogram of per-client values (pooled over seeds) for each variant."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  split, metric = experiment['histogram'].split('/')
  members = experiment.get('members', {})
  fig, axes = plt.subplots(
      1,
      len(results),
      figsize=(4 * len(results), 3.2),
      sharex=True,
      sharey=True,
      squeeze=False,
  )
  bins = np.linspace(0.0, 1.0, 21)
  for ax, (label, runs) in zip(axes[0], results.items()):
    prefix = members.get(label)
    name = f'{prefix}/{split}' if prefix else split
    values = np.concatenate(
        [per_client_values(r['run_dir'], name, metric) for r in runs]
    )
    ax.hist(values, bins=bins, color='tab:blue', alpha=0.8)
    ax.axvline(np.mean(values), color='k', lw=1, label='mean')
    ax.axvline(
        np.quantile(values, 0.9),
        color='tab:red',
        lw=1,
        ls='--',
        label='90th pct',
    )
    ax.set_title(label, fontsize=10)
    ax.set_xlabel(f'per-client {split} {metric}')
  axes[0][0].set_ylabel('clients (pooled over seeds)')
  axes[0][0].legend(fontsize=8)
  fig.tight_layout()
  atomic.save_figure(fig, path, dpi=110, format='png')
  plt.close(fig)


def _error(message: str) -> int:
  print(f'reproduce: error: {message}', file=sys.stderr)
  return 2


# Machine folders in a run's arguments, and what records and tables print.
_PLACEHOLDERS = {
    'root_output_dir': 'OUTPUT_DIR',
    'data_dir': 'DATA_DIR',
    'leaf_dir': 'LEAF_DIR',
}


def portable(args: list[str]) -> list[str]:
  """`args` with this machine's folders replaced by placeholders."""
  out = []
  for arg in args:
    name = arg[2:].split('=', 1)[0] if arg.startswith('--') else ''
    if name in _PLACEHOLDERS and '=' in arg:
      arg = f'--{name}={_PLACEHOLDERS[name]}'
    out.append(arg)
  return out


class RecordError(Exception):
  """A record is missing, damaged or of another origin."""


def flag_value(args: list[str], flag: str) -> str:
  """The value of `--FLAG=value` in `args`."""
  return next(a.split('=', 1)[1] for a in args if a.startswith(f'--{flag}='))


def record_path(records_dir: str, args: list[str]) -> str:
  return os.path.join(
      records_dir, flag_value(args, 'experiment_name') + '.json'
  )


def read_record(
    path: str, args: list[str], origin: dict, accept_foreign: bool
) -> Optional[dict]:
  """The record at `path` if it is this run's, else None (to redo).

  Raises:
    RecordError: If the record is damaged, or made by another origin and
      `accept_foreign` is False.
  """
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      record = json.load(f)
    summaries, theirs = record['summaries'], record['args']
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise RecordError(
        f'{path}: damaged record ({e}); delete it to redo the ' 'run'
    ) from e
  if not isinstance(summaries, dict) or theirs != portable(args):
    return None
  if origins.key(record.get('origin')) != origins.key(origin):
    if not accept_foreign:
      raise RecordError(
          f'{path} was made by another origin '
          f"({origins.describe(record.get('origin'))}; this run: "
          f'{origins.describe(origin)}); delete it to redo the run, or pass '
          '--accept_foreign_records to use it'
      )
  return record


def origins_text(records: list[dict]) -> str:
  """The table's origin lines: each origin with its number of runs."""
  lines = [
      'Made by (each origin: code sources hash, data, versions; runs):',
      '',
  ]
  for text, count in origins.summary(records):
    lines.append(f'* {text}: {count}')
  return '\n'.join(lines) + '\n'


def _run_pending(
    jobs: list[tuple[str, int, list[str]]],
    workers: run_pool.Workers,
    name: str,
    origin: dict,
    on_ray: bool,
    log,
):
  """Runs `jobs` (`(variant, seed, args)`) in `workers` (`run_pool.parallel`)
  after checking their flags in one; writes each finished run's record.

  Returns:
    Each job's result, in order (its record with its run's local folder,
    `run_dir`, or None on Ray), or the driver's exit status: 2 for
    bad flags, 1 for a failed run; after a signal the process dies of it
    (130 for SIGINT), its runs and their TFF workers ended.
  """

  def run_and_record(job: tuple[str, int, list[str]]) -> dict:
    variant, seed, args = job
    log('$ python -m run.train --progress=false ' + shlex.join(args))
    start = time.time()
    try:
      summary = workers.worker().summary(args)
    except run_pool.RunFailed as e:
      raise RuntimeError(
          f'run {flag_value(args, "experiment_name")} failed (exit {e.code})'
          f': {e}'
      ) from None
    seconds = time.time() - start
    log(f'  done in {seconds:.0f} s')
    record = {
        'experiment': name,
        'variant': variant,
        'seed': seed,
        'args': portable(args),
        'summaries': summary['summaries'],
        'seconds': seconds,
        'origin': origin,
    }
    if FLAGS.records_dir:
      atomic.write_json(
          record_path(FLAGS.records_dir, args),
          record,
          indent=1,
          sort_keys=True,
      )
    folder = os.path.join(
        flag_value(args, 'root_output_dir'), flag_value(args, 'experiment_name')
    )
    return {**record, 'run_dir': None if on_ray else folder}

  # A signal ends the runs and their workers (local workers are in sessions
  # of their own, out of reach of a terminal's Ctrl-C or a group kill of the
  # driver; Ray actors are ended by the driver).
  with processes.signals_stop():
    try:
      try:  # The flags, checked before any run (a misspelt extra flag).
        error = workers.worker().check(jobs[0][2])
      finally:
        workers.release()
      if error:
        return _error(error.split('error: ', 1)[-1])
      ran = run_pool.parallel(run_and_record, jobs, workers)
    except processes.Stopped as e:
      ended = getattr(e, 'ended', None)
      if ended is None:  # Raised in this thread, not in the pool's.
        ended = processes.end_children(e.signum) + workers.interrupt()
      workers.close()  # Before the process dies of the signal.
      ray_pool.disconnect()
      return processes.exit_stopped(
          'reproduce',
          e,
          '; rerun the same command to resume from the last checkpoints',
          ended,
      )
    except RuntimeError as e:  # A failed run, or a worker that ended.
      print(f'reproduce: error: {e}', file=sys.stderr)
      return 1
  return ran


def main(argv) -> int:
  """Runs the experiment; returns the exit status (2: bad input)."""
  processes.reset()
  if len(argv) > 1:
    return _error(f'unexpected arguments: {" ".join(argv[1:])}')
  name = FLAGS.experiment
  if name not in EXPERIMENTS:
    return _error(
        f'unknown --experiment={name!r}; choose one of: '
        f'{", ".join(EXPERIMENTS)}'
    )
  experiment = EXPERIMENTS[name]
  rounds = experiment['rounds'] if FLAGS.rounds is None else FLAGS.rounds
  if rounds < 1:
    return _error(f'--rounds must be >= 1, got {rounds}')
  try:
    seeds = [int(s) for s in FLAGS.seeds]
  except ValueError:
    return _error(f'--seeds must be integers, got {",".join(FLAGS.seeds)}')
  if not seeds:
    return _error('--seeds is empty')
  if FLAGS.jobs < 1:
    return _error(f'--jobs must be >= 1, got {FLAGS.jobs}')
  if FLAGS.ray_address and not FLAGS.from_records:
    try:
      ray_pool.check_address(FLAGS.ray_address)
    except ray_pool.RayUnavailable as e:
      return _error(str(e))
  try:
    if FLAGS.output_md:
      processes.check_output_md(FLAGS.output_md)
    run_dir.check_output_dir(FLAGS.root_output_dir, flag='--root_output_dir')
  except run_dir.OutputDirError as e:
    return _error(str(e))
  if FLAGS.from_records and not FLAGS.records_dir:
    return _error('--from_records needs --records_dir')
  if FLAGS.records_dir:
    try:
      run_dir.check_output_dir(FLAGS.records_dir, flag='--records_dir')
    except run_dir.OutputDirError as e:
      return _error(str(e))
  origin = origins.current(experiment['base'] + list(FLAGS.extra_flags))
  log = lambda s: print(s, file=sys.stderr, flush=True)
  root = os.path.join(FLAGS.root_output_dir, name)
  results, commands, jobs = {}, [], []
  for variant, variant_flags in experiment['variants'].items():
    results[variant] = []
    for seed in seeds:
      tag = ''.join(ch if ch.isalnum() else '_' for ch in variant)
      args = (
          experiment['base']
          + variant_flags
          + list(FLAGS.extra_flags)
          + [
              f'--total_rounds={rounds}',
              f'--rounds_per_eval={rounds}',
              f'--rounds_per_checkpoint={max(1, rounds // 5)}',
              f'--seed={seed}',
              f'--root_output_dir={root}',
              f'--experiment_name={tag}_seed{seed}',
          ]
      )
      commands.append('python -m run.train ' + ' '.join(portable(args)))
      jobs.append((variant, seed, args))
  done = {}
  if FLAGS.records_dir:
    for variant, seed, args in jobs:
      path = record_path(FLAGS.records_dir, args)
      try:
        record = read_record(path, args, origin, FLAGS.accept_foreign_records)
      except RecordError as e:
        return _error(str(e))
      if record is not None:
        done[path] = record
      elif FLAGS.from_records:
        return _error(
            f'no record of this run at {path}: run without '
            '--from_records to make it'
        )

  pending = []
  for job in jobs:
    path = record_path(FLAGS.records_dir or '', job[2])
    if path in done:
      log(f'  record: {path}')
    else:
      pending.append(job)
  ran, on_ray = [], False
  if pending:
    try:
      worker_type = ray_pool.worker_type(FLAGS.ray_address)
    except ray_pool.RayUnavailable as e:
      return _error(str(e))
    on_ray = worker_type is not run_pool.RunWorker
    if on_ray:
      log(ray_pool.describe(FLAGS.ray_address, FLAGS.jobs))
    else:  # The workers' logs (on Ray: on the actors' nodes).
      os.makedirs(root, exist_ok=True)
    workers = run_pool.Workers(root, FLAGS.jobs, worker_type)
    try:
      ran = _run_pending(pending, workers, name, origin, on_ray, log)
    finally:
      workers.close()
      ray_pool.disconnect()
    if isinstance(ran, int):
      return ran  # A failure's exit status.
  ran = iter(ran)
  for variant, _, args in jobs:
    path = record_path(FLAGS.records_dir or '', args)
    results[variant].append(done[path] if path in done else next(ran))
  made_by = origins_text([r for runs in results.values() for r in runs])
  seconds = sum(
      r.get('seconds', 0.0) for runs in results.values() for r in runs
  )
  results = expand_members(experiment, results)
  text = (
      f'{name}: {rounds} rounds, seeds {seeds}; mean (std) over seeds; '
      'accuracies in percent, variance in percent^2\n\n'
      + table(experiment, results)
      + '\n'
  )
  if len(results) > 1 and len(seeds) > 1:
    text += (
        '\nPaired per-seed differences (seeds in the order above; then mean'
        ' (std)):\n\n' + paired_table(experiment, results) + '\n'
    )
  text += (
      f'\n{made_by}\nTraining runs: {len(jobs)}, {seconds / 60:.0f} min of '
      'wall time summed over runs (the sitting that finished each).\n'
  )
  print(text)
  if FLAGS.output_md:
    atomic.write_text(
        FLAGS.output_md,
        text + '\nCommands:\n\n```\n' + '\n'.join(commands) + '\n```\n',
    )
    if 'histogram' in experiment and not all(
        r.get('run_dir') for runs in results.values() for r in runs
    ):
      where = 'runs on a Ray cluster' if on_ray else 'made from records'
      print(f'histogram: skipped ({where}; it reads run folders)')
    elif 'histogram' in experiment:
      png = os.path.splitext(FLAGS.output_md)[0] + '_histogram.png'
      write_histogram(experiment, results, png)
      print(f'histogram: {png}')
  return 0


def run_main() -> None:
  define_flags()
  console.run(__name__, lambda argv: sys.exit(main(argv)))


if __name__ == '__main__':
  run_main()
