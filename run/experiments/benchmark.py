# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""The tail benchmark: every algorithm on the same clients under one budget.

What each algorithm does for the worst clients: FedAvg, FedProx (Li et al.,
MLSys 2020), q-FedAvg (Li et al., ICLR 2020), TERM (Li et al., ICLR 2021),
AFL (Mohri et al., ICML 2019), Delta-FL (Pillutla et al., 2022), Ditto (Li
et al., ICML 2021), FedAvg+, FedGeoMed+, FedCoMed+ (Kundu et al., Fed+), and
the two baselines every personalization benchmark has (TFF's Motley; Ditto's
section 5): local training and FedAvg + fine-tuning (`tasks.personalization`).
Each federated run goes through the training binary (`run.train`) with the
same rounds, clients per round, local epochs and batch size, on the fastest
engine that gives the TFF path's weights.

  tff-hetero-benchmark --setting=synthetic --jobs=2 \
      --records_dir=docs/results/runs/synthetic \
      --output_md=docs/results/benchmark_synthetic.md
  tff-hetero-benchmark --setting=custom --rounds=50 -- \
      --task=leaf --leaf_dir=/data/femnist --leaf_model=cnn

Populations. One data seed (`--data_seed`), the same in every run, fixes the
clients, which of them are training and which unseen, and every client's
training / validation / held-out parts; the run seeds vary only client
sampling, shuffles and initialisation. So no unseen client is ever a
training client of a selection run.

1. Selection, on the training clients' validation part only (`run.train
   --holdout=validation`: the held-out part and the unseen clients are built,
   then dropped before training). Each algorithm's client learning rate is
   tuned jointly with its own knob (FedProx mu, q, TERM's t, AFL's mixture
   step, Delta-FL's theta, Ditto's lambda, Fed+'s sigma) over a log-spaced
   grid (`--grid=knob:v1,v2,...`), by successive halving: with a first
   rung (`--first_rung`, the Shakespeare setting's 75 of 300 rounds) every
   configuration trains that many rounds on the first selection seed and
   the best third continues to the full rounds (in the same folder, from
   its checkpoint); then over the selection seeds, every configuration
   still in runs on the first seed, the best third continues on the next,
   and so on. The criterion is the validation
   worst-10% accuracy as a superquantile (continuous); where it ties, the
   worst 20%, 30%, 50%, then the mean accuracy, and the superquantile of
   the loss last (`benchmark_stats.criterion`; personal models
   for Ditto and Fed+). A choice at an edge of its grid extends the grid
   past it (`--max_extensions`, within the knob's valid range); a choice
   still at an edge is marked. The baselines' fine-tuning learning rate and
   epochs are chosen the same way on FedAvg's selection runs.
2. Report, on `--seeds`: each algorithm at its chosen configuration,
   evaluated on (a) the training clients' held-out part (personal models for
   Ditto, Fed+ and the baselines), (b) the unseen clients (global models),
   and (c) the unseen clients fine-tuned on the first half of their examples
   and evaluated on the rest (FedAvg's global model on the same halves, the
   two baselines). Per algorithm: the tail statistics of
   `benchmark_stats.client_stats`, mean (std) over seeds; paired per-seed
   differences against FedAvg with their 95% half-width; each statistic's
   resolution (one example, one client); examples processed and wall time
   per run; the selection's compute beside the report's.

Every run leaves a compact record (`--records_dir`: its arguments, per-client
accuracy, loss and examples for every split, examples processed, wall time):
a run whose record exists with its arguments is not run again, so the same
command continues a stopped benchmark on any machine that has the records,
and `--from_records` rebuilds the page from them alone. Runs execute in
`--jobs` long-lived worker processes (`run_pool`). A signal ends the running
runs and their TFF workers (as `run.experiments.reproduce`).
"""

import concurrent.futures
import csv
import dataclasses
import json
import math
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, Optional

if not (3, 9) <= sys.version_info[:2] <= (3, 11):
  sys.exit('error: needs Python 3.9, 3.10 or 3.11 (TFF 0.87)')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags

from run import atomic
from run import console
from run import run_dir
from run.experiments import benchmark_page
from run.experiments import benchmark_stats as stats
from run.experiments import reproduce
from run.experiments import run_pool
from tff_algos import registry

# pylint: enable=g-import-not-at-top,wrong-import-position

# Algorithms the stacked engine runs (tests/test_benchmark.py checks this
# against run.engines); the others run on the batched engine. Both give the
# TFF path's weights (tests/test_stacked.py, tests/test_batched.py).
STACKED = tuple(
    n for n in registry.names() if 'stacked' in registry.get(n).engines
)
# Algorithms with a personal model per client (their clients keep state).
PERSONAL = tuple(n for n in registry.names() if registry.get(n).stateful)
# The baselines: fine-tuning of FedAvg's runs from their final or initial
# model (`run.fine_tune`).
BASELINES = {'fedavg_ft': 'final', 'local': 'initial'}
COLUMNS = stats.COLUMNS
HIGHER_IS_BETTER = stats.HIGHER_IS_BETTER
KEEP = 1 / 3  # Successive halving: the share of configurations that go on.
# Task flags of the stacked engine alone, dropped from the other engines'
# runs (the batched engine runs a round's clients one after another).
STACKED_ONLY_FLAGS = ('--stacked_size_groups', '--nostacked_size_groups')
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
    'data_seed',
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
    name: Its `--algorithm` value (a baseline: its name in `BASELINES`).
    label: Its name in tables.
    knob: The flag tuned with the learning rate (None: the rate alone).
    grid: The knob's declared values (log-spaced).
    low: The knob's valid range: values must be > low ...
    high: ... and <= high (None: unbounded); extensions stay inside.
    flags: Further fixed flags.
  """

  name: str
  label: str
  knob: Optional[str] = None
  grid: tuple[float, ...] = ()
  low: Optional[float] = 0.0
  high: Optional[float] = None
  flags: tuple[str, ...] = ()

  @property
  def personal(self) -> bool:
    return self.name in PERSONAL or self.name in BASELINES

  @property
  def baseline(self) -> bool:
    return self.name in BASELINES

  @property
  def server_lr(self) -> bool:
    """Applies its aggregate with the run's server optimizer (its server
    learning rate is tuned where the budget says so)."""
    return not self.baseline and not registry.get(self.name).own_server_step

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
  """What every algorithm gets: the same for all (its own learning rate)."""

  rounds: int
  clients_per_round: int
  local_epochs: int
  batch_size: int
  learning_rate: float  # The centre of the learning-rate grid.
  fine_tune_epochs: int = 5  # The baselines' epochs: 0..this, selected.
  # Successive halving's first rung: every configuration trains this many
  # rounds on the first selection seed, the best share continues to
  # `rounds` (0: every rung trains `rounds`).
  first_rung: int = 0
  # Validation (or held-out) evaluations every this many rounds, the curve
  # of each record (0: at the end only).
  eval_every: int = 0
  # The server learning rate is tuned (`Benchmark._server_lr_step`) for
  # the algorithms with a server optimizer; else it stays 1.
  tune_server_lr: bool = False
  # Algorithms run on the batched engine even where the stacked one runs
  # them (both give the TFF path's weights; records name their engine).
  on_batched: tuple[str, ...] = ()

  def engine(self, method: Method) -> str:
    """The engine `method` trains on in this budget's runs."""
    return 'batched' if method.name in self.on_batched else method.engine

  def flags(
      self, learning_rate: float, rounds: Optional[int] = None
  ) -> list[str]:
    """The run's budget flags; `rounds` < `self.rounds`: a first rung
    (its evaluations and checkpoints those of the full run's prefix)."""
    return [
        f'--total_rounds={rounds or self.rounds}',
        f'--rounds_per_eval={self.eval_every or self.rounds}',
        f'--rounds_per_checkpoint={max(1, self.rounds // 5)}',
        f'--clients_per_round={self.clients_per_round}',
        f'--client_epochs_per_round={self.local_epochs}',
        f'--client_batch_size={self.batch_size}',
        f'--client_learning_rate={learning_rate:g}',
    ]


def log_grid(centre: float, steps: Sequence[float]) -> tuple[float, ...]:
  """`centre * s` for each step, to 2 significant digits."""
  return tuple(float(f'{centre * s:.2g}') for s in steps)


LR_STEPS = (1 / 3, 1.0, 3.0)
# The server learning rates around TFF's default of 1 (SGD).
SERVER_LR_STEPS = (1 / 3, 1.0, 3.0)
# The baselines' fine-tuning rates: fine-tuning costs a per-client pass per
# epoch and rate (`tasks.personalization`), so three rates (and extensions).
FT_LR_STEPS = (1 / 9, 1 / 3, 1.0)


# The algorithms in the tables, in order, with their labels.
_LABELS = (
    ('fedavg', 'FedAvg'),
    ('fedprox', 'FedProx'),
    ('qffl', 'q-FedAvg'),
    ('term', 'TERM'),
    ('afl', 'AFL'),
    ('deltafl', 'Delta-FL'),
    ('ditto', 'Ditto'),
    ('fedavg_plus', 'FedAvg+'),
    ('fedgeomed_plus', 'FedGeoMed+'),
    ('fedcomed_plus', 'FedCoMed+'),
)


def methods() -> tuple[Method, ...]:
  """The algorithms with their tuned knobs, then the two baselines.

  Each knob, its grid (5 log-spaced values) and its range come from the
  algorithm's `TunedOption` in `tff_algos.registry`; a grid extends up to
  `high` only where the option allows it (else its last value is the top).
  """
  out = []
  for name, label in _LABELS:
    tuned = registry.get(name).tuned
    if tuned is None:
      out.append(Method(name, label))
      continue
    out.append(
        Method(
            name,
            label,
            tuned.name,
            tuple(tuned.grid),
            low=tuned.low if tuned.extend_low else tuned.grid[0],
            high=tuned.high if tuned.extend_high else tuned.grid[-1],
        )
    )
  out.append(Method('fedavg_ft', 'FedAvg + fine-tuning'))
  out.append(Method('local', 'Local training'))
  return tuple(out)


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
            first_rung=25,
            eval_every=25,
            tune_server_lr=True,
        ),
        'Synthetic(1,1) with 100 devices (the thesis: 30 to 100), 50 training '
        'and 50 unseen; 100 rounds of 10 devices, one epoch, batch 10, '
        'learning rates around 0.1 (the thesis: 0.01 to 0.1, thousands of '
        'rounds)',
    ),
    # The Delta-FL Shakespeare preset (roles with >= 100 windows, half
    # training, half unseen; H = 20, one-hot, GRU) at a trained operating
    # point (issue 34): 200 seeded roles (100 training, 100 unseen), each
    # role's first 1,000 windows (size groups on: roles of 100 to 1,000
    # windows pad a vectorized round), GRU 64. FedAvg at lr 1 (seed 0,
    # --holdout=validation, eval every 20 rounds) reached 45.9% validation
    # mean accuracy at round 240, 46.5% at 300 and 46.3% at 400: rounds=300,
    # with a first rung of 75 and a validation curve every 30 rounds.
    'shakespeare': Setting(
        'shakespeare',
        (
            '--task=shakespeare_leaf',
            '--shakespeare_preset=deltafl',
            '--max_clients=200',
            '--max_examples_per_client=1000',
            '--rnn_units=64',
            '--stacked_size_groups',
        ),
        Budget(
            rounds=300,
            clients_per_round=10,
            local_epochs=1,
            batch_size=16,
            learning_rate=1.0,
            first_rung=75,
            eval_every=30,
            tune_server_lr=True,
        ),
        'a seeded 200 of the 1,038 eligible roles (100 training, 100 '
        "unseen), each role's first 1,000 windows, GRU 64 (the paper: GRU "
        '128, all roles, all windows), 10 roles per round, 300 rounds (the '
        'paper: 100 per round, 600 rounds), one epoch, batch 16, learning '
        "rates around 1 (the authors' code: 0.1 halved every 200 rounds; "
        'the paper gives none)',
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
      'baseline of the paired differences and of fedavg_ft and local).',
  )
  flags.DEFINE_list('seeds', ['0', '1', '2', '3', '4'], 'Reported seeds.')
  flags.DEFINE_list(
      'selection_seeds',
      ['100', '101'],
      'Seeds of the selection runs (disjoint from --seeds), one rung of the '
      'successive halving each.',
  )
  flags.DEFINE_integer(
      'data_seed',
      0,
      'Seed of the data (clients, unseen clients, per-client parts): the '
      'same for every run.',
  )
  flags.DEFINE_multi_string(
      'grid',
      [],
      "A knob's grid, e.g. --grid=tilt:0.1,1,10 (repeatable); the knobs "
      'learning_rate (all algorithms) and fine_tune_learning_rate (the '
      'baselines) too.',
  )
  flags.DEFINE_integer(
      'max_extensions',
      2,
      'How many times a choice at an edge of its grid extends it.',
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
      'learning_rate',
      None,
      "Override the setting's learning rate (the centre of the grid).",
  )
  flags.DEFINE_integer(
      'fine_tune_epochs',
      None,
      "Override the setting's most fine-tuning epochs of the baselines.",
  )
  flags.DEFINE_integer(
      'first_rung',
      None,
      "Override the setting's first rung: every configuration trains this "
      'many rounds on the first selection seed before the best third goes '
      'on to --rounds (0: no such rung).',
  )
  flags.DEFINE_bool(
      'tune_server_lr',
      None,
      "Override the setting's choice: tune the server learning rate of the "
      'algorithms with a server optimizer (their best configuration of the '
      'first rung at the other rates of its grid, --grid='
      'server_learning_rate:...), or keep it at 1.',
  )
  flags.DEFINE_integer(
      'eval_every',
      None,
      "Override the setting's evaluation period in rounds (each record's "
      'curve; 0: at the end only).',
  )
  flags.DEFINE_string(
      'output_dir',
      None,
      'Where the runs and results go (default output/benchmark/<setting>).',
  )
  flags.DEFINE_string(
      'records_dir',
      None,
      "Where each run's compact record goes (default <output_dir>/records); "
      'the published pages keep theirs in docs/results/runs/<setting>.',
  )
  flags.DEFINE_boolean(
      'from_records',
      False,
      'Build the page from --records_dir alone; run nothing (an error names '
      'the first missing record).',
  )
  flags.DEFINE_string(
      'output_md',
      None,
      'The results page (default <output_dir>/benchmark.md); the pictures '
      'are written beside it.',
  )
  flags.DEFINE_string(
      'bound_json',
      None,
      "A `run.benchmarks.bench_suite --output_json` of the setting's model "
      "and cohort (one model, with fedavg/bound): the page's time table "
      "gives each algorithm's training examples/s as a fraction of that "
      'bound.',
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


class MissingRecord(RuntimeError):
  """`--from_records` and a run has no record."""


def warn(text: str) -> None:
  print(f'benchmark: warning: {text}', file=sys.stderr, flush=True)


# ------------------------------------------------------------------ runs


@dataclasses.dataclass(frozen=True)
class Config:
  """One configuration of a method: its knob value, client learning rate
  and server learning rate (1: TFF's default, absent from names and
  flags)."""

  value: Optional[float]
  lr: float
  slr: float = 1.0

  def describe(self, method: Method) -> str:
    knob = '' if method.knob is None else f'{method.knob}={self.value:g}, '
    server = '' if self.slr == 1.0 else f', server lr={self.slr:g}'
    return f'{knob}lr={self.lr:g}{server}'


def run_name(phase: str, method: Method, config: Config, seed: int) -> str:
  knob = '' if method.knob is None else f'_{method.knob}{config.value:g}'
  server = '' if config.slr == 1.0 else f'_slr{config.slr:g}'
  return f'{phase}_{method.name}{knob}_lr{config.lr:g}{server}_seed{seed}'


def run_args(
    setting_flags: Sequence[str],
    budget: Budget,
    method: Method,
    config: Config,
    seed: int,
    *,
    phase: str,
    root: str,
    data_seed: int,
    rounds: Optional[int] = None,
) -> list[str]:
  """The `run.train` flags of one run (`rounds`: a first rung's)."""
  engine = budget.engine(method)
  if engine != 'stacked':
    setting_flags = [
        f for f in setting_flags if not f.startswith(STACKED_ONLY_FLAGS)
    ]
  return (
      list(setting_flags)
      + budget.flags(config.lr, rounds)
      + (
          []
          if config.slr == 1.0
          else [f'--server_learning_rate={config.slr:g}']
      )
      + method.knob_flags(config.value)
      + [
          f'--simulation_engine={engine}',
          f'--holdout={"validation" if phase == "select" else "test"}',
          '--eval_train_clients=false',
          f'--seed={seed}',
          f'--data_seed={data_seed}',
          f'--root_output_dir={root}',
          f'--experiment_name={run_name(phase, method, config, seed)}',
      ]
  )


RECORD = 'benchmark_run.json'  # In a run folder: its command and wall time.
WALL = 'benchmark_wall.json'  # Wall time of a run's unfinished invocations.


def _flag(args: Sequence[str], name: str) -> str:
  return next(a.split('=', 1)[1] for a in args if a.startswith(f'--{name}='))


def _read_json(path: str, what: str) -> Optional[Any]:
  """A JSON file's content; None (with a warning if damaged) otherwise."""
  try:
    with open(path) as f:
      return json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:
    warn(f'{path}: unreadable {what} ({type(e).__name__}); doing it again')
    return None


def _client_rows(run_path: str, personal: bool) -> dict[str, dict[str, list]]:
  """Per-client accuracy, loss, examples of a run's last evaluation."""
  folder = os.path.join(run_path, 'clients')
  out = {}
  for prefix in ('round_',) + (('personal_round_',) if personal else ()):
    names = sorted(n for n in os.listdir(folder) if n.startswith(prefix))
    with open(os.path.join(folder, names[-1])) as f:
      header = f.readline().strip().split(',')
      col = {name: i for i, name in enumerate(header)}
      for line in f:
        row = line.strip().split(',')
        split = out.setdefault(
            row[col['split']],
            {'accuracy': [], 'loss': [], 'num_examples': [], 'client_id': []},
        )
        for key in ('accuracy', 'loss', 'num_examples'):
          split[key].append(float(row[col[key]]))
        split['client_id'].append(row[col['client_id']])
  return out


def _curve(run_path: str, rounds: int) -> dict[str, list[list[float]]]:
  """Each evaluated split's `[round, mean, sq10]` (accuracy) up to `rounds`.

  From `metrics.csv`'s evaluation rows, e.g. the validation curve of a
  selection run with `Budget.eval_every`.
  """
  with open(os.path.join(run_path, 'metrics.csv'), newline='') as f:
    rows = list(csv.DictReader(f))
  suffix = '/accuracy/mean'
  out = {}
  for row in rows:
    if int(row['round_num']) > rounds:
      continue
    for key, value in row.items():
      if key.startswith('eval/') and key.endswith(suffix) and value:
        split = key[len('eval/') : -len(suffix)]
        sq10 = row.get(f'eval/{split}/accuracy/sq10') or 'nan'
        out.setdefault(split, []).append(
            [int(row['round_num']), float(value), float(sq10)]
        )
  return out


def _examples(run_path: str, rounds: int) -> int:
  """Training examples the run processed up to `rounds`: metrics.csv's sum."""
  total = 0.0
  with open(os.path.join(run_path, 'metrics.csv'), newline='') as f:
    for row in csv.DictReader(f):
      cell = row.get('train/num_examples')
      if int(row['round_num']) <= rounds and cell:
        total += float(cell)
  return int(total)


def _timed(path: str, rounds: int) -> dict[str, Any]:
  """The last invocation's timed parts (`run.simulation.SECONDS`), its wall
  time and the examples it trained (a resumed run's earlier invocations
  are in `wall_s` and `examples` alone)."""
  timing = _read_json(os.path.join(path, 'timing.json'), 'timing')
  mark = _read_json(os.path.join(path, RECORD), RECORD)
  if not isinstance(timing, dict) or not isinstance(mark, dict):
    return {}
  out = {'seconds': {k: v for k, v in timing.items() if k != 'first_round'}}
  if 'first_round' in timing and 'last_wall_s' in mark:
    out['timed_wall_s'] = mark['last_wall_s']
    out['timed_examples'] = _examples(path, rounds) - _examples(
        path, int(timing['first_round']) - 1
    )
  return out


def _rounded(tree):
  """Per-client values to 6 decimals: records stay a few KB."""
  if isinstance(tree, dict):
    return {k: _rounded(v) for k, v in tree.items()}
  if isinstance(tree, list):
    return [_rounded(v) for v in tree]
  if isinstance(tree, float):
    return round(tree, 6)
  return tree


def _diverged(error: run_pool.RunFailed) -> bool:
  return 'diverged' in str(error)


# Flags that name this machine's folders: a record made with other folders
# (on another machine, or another --output_dir) is the same run.
_MACHINE_FLAGS = ('--root_output_dir=', '--data_dir=')


def _portable(args: Any) -> Any:
  if not isinstance(args, list):
    return args
  return [
      a
      for a in args
      if not (isinstance(a, str) and a.startswith(_MACHINE_FLAGS))
  ]


class Runs:
  """Runs and fine-tunings, from records when they exist, else in workers."""

  def __init__(
      self, records_dir: str, log_dir: str, jobs: int, from_records: bool
  ):
    self.records_dir = records_dir
    self.log_dir = log_dir
    self.jobs = jobs
    self.from_records = from_records
    self._local = threading.local()
    self._workers: list[run_pool.RunWorker] = []
    self._idle: list[run_pool.RunWorker] = []
    self._lock = threading.Lock()
    self.commands: list[str] = []
    self.wall = {'select': 0.0, 'final': 0.0}

  def _worker(self) -> run_pool.RunWorker:
    """This thread's worker: taken from the idle ones (or a new one) for
    the thread's current group; `release` gives it back."""
    worker = getattr(self._local, 'worker', None)
    if worker is None:
      with self._lock:
        if self._idle:
          worker = self._idle.pop()
        else:
          log = os.path.join(self.log_dir, f'worker_{len(self._workers)}.log')
          worker = run_pool.RunWorker(os.path.abspath(log))
          self._workers.append(worker)
      self._local.worker = worker
    return worker

  def release(self) -> None:
    """Gives this thread's worker back (its builds stay warm for others)."""
    worker = getattr(self._local, 'worker', None)
    if worker is not None:
      self._local.worker = None
      with self._lock:
        self._idle.append(worker)

  def close(self) -> None:
    for worker in self._workers:
      worker.close()

  def check(self, args: list[str]) -> Optional[str]:
    """The training binary's error line for these flags, or None."""
    try:
      return self._worker().check(args)
    finally:
      self.release()

  def _record_path(self, name: str) -> str:
    return os.path.join(self.records_dir, f'{name}.json')

  def _load_record(self, name: str, args: list[str]) -> Optional[dict]:
    path = self._record_path(name)
    record = _read_json(path, 'record')
    if record is None:
      return None
    if not isinstance(record, dict) or 'splits' not in record:
      warn(f'{path}: a record of the wrong shape; doing it again')
      return None
    if _portable(record.get('args')) != _portable(args):
      raise RuntimeError(
          f'{path} records the run with other arguments; use another '
          '--records_dir (or remove that record)'
      )
    return record

  def run(
      self,
      args: list[str],
      rounds: int,
      personal: bool,
      name: Optional[str] = None,
  ) -> dict:
    """One training run's record: from `--records_dir`, else run it.

    `name` names the record (default: the run's folder); a first rung's
    record is named apart from its folder, which the full run continues.
    """
    name = name or _flag(args, 'experiment_name')
    phase = name.split('_', 1)[0]
    with self._lock:
      self.commands.append('python -m run.train ' + shlex.join(args))
    record = self._load_record(name, args)
    if record is None and self.from_records:
      raise MissingRecord(f'no record {self._record_path(name)}')
    if record is None:
      record = self._run(args, rounds, personal)
      atomic.write_text(self._record_path(name), json.dumps(record))
    with self._lock:
      self.wall[phase] += record['wall_s']
    return record

  def _finished(self, path: str, rounds: int, args: list[str]):
    """A finished run folder's wall time, or None (then it is run)."""
    summary = _read_json(os.path.join(path, 'summary.json'), 'summary.json')
    mark = _read_json(os.path.join(path, RECORD), RECORD)
    if summary is None or mark is None:
      return None
    done = summary.get('round_num') if isinstance(summary, dict) else None
    if isinstance(done, int) and done > rounds:
      raise RuntimeError(
          f'{path} holds a run of {done} rounds, past the {rounds} asked '
          'for; use another --output_dir (or remove that folder)'
      )
    if isinstance(done, int) and done < rounds:
      return None  # Fewer rounds (e.g. a first rung's): it continues.
    if not (
        isinstance(summary, dict)
        and isinstance(summary.get('summaries'), dict)
        and summary.get('round_num') == rounds
        and isinstance(mark, dict)
    ):
      warn(
          f'{path}: summary.json or {RECORD} of the wrong shape; running '
          'it again'
      )
      return None
    if mark.get('args') != list(args):
      raise RuntimeError(
          f'{path} holds a finished run of other settings; use another '
          '--output_dir (or remove that folder)'
      )
    return float(mark.get('wall_s', math.nan))

  def _run(self, args: list[str], rounds: int, personal: bool) -> dict:
    path = os.path.join(
        _flag(args, 'root_output_dir'), _flag(args, 'experiment_name')
    )
    wall = self._finished(path, rounds, args)
    if wall is None:
      earlier = _read_json(os.path.join(path, WALL), WALL) or {}
      before = (
          float(earlier.get('wall_s', 0.0))
          if isinstance(earlier, dict)
          else 0.0
      )
      start = time.time()
      try:
        self._worker().run(args)
      except run_pool.RunFailed as e:
        if not _diverged(e) or _flag(args, 'holdout') != 'validation':
          raise
        # A selection run that diverged: the worst score, not an error.
        return {
            'args': list(args),
            'splits': {},
            'diverged': str(e),
            'examples': 0,
            'wall_s': round(before + time.time() - start, 1),
        }
      except BaseException:
        if os.path.isdir(path):  # Its time so far counts when it resumes.
          atomic.write_text(
              os.path.join(path, WALL),
              json.dumps({'wall_s': before + time.time() - start}),
          )
        raise
      wall = before + time.time() - start
      atomic.write_text(
          os.path.join(path, RECORD),
          json.dumps(
              {
                  'wall_s': round(wall, 1),
                  'args': list(args),
                  'last_wall_s': round(time.time() - start, 1),
              }
          ),
      )
    summary = _read_json(os.path.join(path, 'summary.json'), 'summary.json')
    return {
        'args': list(args),
        'task': (summary or {}).get('task', ''),
        'splits': _rounded(_client_rows(path, personal)),
        'curve': _rounded(_curve(path, rounds)),
        'examples': _examples(path, rounds),
        'wall_s': round(wall, 1),
        **_timed(path, rounds),
    }

  def fine_tune(
      self,
      args: list[str],
      learning_rates,
      max_epochs: int,
      batch_size: int,
      tag: str = '',
  ) -> dict:
    """The baselines' fine-tuning of a finished FedAvg run (its record).

    `tag` names a further fine-tuning of the same run (a grid extension).
    Where the run's folder is not here (its record was made on another
    machine), the run is first trained again from its arguments; that time
    is not in the fine-tuning's `wall_s`.

    Returns:
      `{'grid': {start: {split: {lr: [stats per epoch]}}}, 'splits': {start:
      {split: {lr: [per-client arrays per epoch]}}}, 'wall_s'}`.
    """
    name = _flag(args, 'experiment_name') + '_ft' + tag
    options = dict(
        learning_rates=[float(r) for r in learning_rates],
        max_epochs=max_epochs,
        batch_size=batch_size,
    )
    key = list(args) + [json.dumps(options, sort_keys=True)]
    phase = name.split('_', 1)[0]
    record = self._load_record(name, key)
    if record is None and self.from_records:
      raise MissingRecord(f'no record {self._record_path(name)}')
    if record is None:
      path = os.path.join(
          _flag(args, 'root_output_dir'), _flag(args, 'experiment_name')
      )
      rounds = int(_flag(args, 'total_rounds'))
      if self._finished(path, rounds, args) is None:
        # Its record came from another machine or folder: the model it
        # trained is not here, so the same arguments train it again.
        warn(
            f'{path}: no finished run to fine-tune (its record was made '
            'elsewhere); training it again from its arguments'
        )
        self._run(args, rounds, personal=False)
      elif not run_dir.has_checkpoint(os.path.join(path, 'checkpoints')):
        raise RuntimeError(
            f'{path} is a finished run whose checkpoints are gone, so it '
            'has no model to fine-tune; remove that folder and the '
            'benchmark trains it again'
        )
      start = time.time()
      self._worker().fine_tune(args, **options)
      with open(os.path.join(path, 'fine_tuning.json')) as f:
        result = json.load(f)
      record = {
          'args': key,
          'splits': _rounded(
              {begin: result[begin] for begin in BASELINES.values()}
          ),
          'train_examples': result['train_examples'],
          'wall_s': round(time.time() - start, 1),
      }
      atomic.write_text(self._record_path(name), json.dumps(record))
    with self._lock:
      self.wall[phase] += record['wall_s']
    return record


DIVERGED = {
    'mean': 0.0,
    'weighted_mean': 0.0,
    'p10': 0.0,
    'worst10': -math.inf,
    **{f'worst{round(100 * t)}': -math.inf for t in stats.TAIL_LADDER},
    'loss_sq10': math.inf,
    'variance': math.nan,
}


def run_stats(record: dict, split: str) -> dict[str, float]:
  if record.get('diverged'):
    return dict(DIVERGED)
  cols = record['splits'][split]
  return stats.client_stats(
      cols['accuracy'], cols['loss'], cols['num_examples']
  )


def fine_tuned(record: dict, begin: str, split: str, lr: float, epochs: int):
  """Per-client arrays after `epochs` of fine-tuning at `lr` from `begin`."""
  return record['splits'][begin][split][f'{lr:g}'][epochs]


def start_offset(record_cols: dict, epoch0_cols: dict) -> list[float]:
  """`[clients differing, the largest difference in points]` between a
  run's recorded per-client accuracy and its fine-tuning's at 0 epochs.

  The same model gives each client the same number of correct examples,
  but its two accuracies, computed by two evaluations and each rounded to
  6 decimals, may differ in the last digit (seen: 21/47 as 0.446808 and
  0.446809). So clients are compared by their correct examples where the
  record has `num_examples`, else to 2e-6.
  """
  a, b = record_cols['accuracy'], epoch0_cols['accuracy']
  if len(a) != len(b):
    return [max(len(a), len(b)), math.nan]
  sizes = record_cols.get('num_examples') or [None] * len(a)

  def differs(x: float, y: float, n: Optional[int]) -> bool:
    return round(x * n) != round(y * n) if n else abs(x - y) > 2e-6

  pairs = [(float(x), float(y), n) for x, y, n in zip(a, b, sizes)]
  moved = [abs(x - y) for x, y, n in pairs if differs(x, y, n)]
  return [len(moved), round(100 * max(moved, default=0.0), 4)]


def fine_tuned_stats(record, begin, split, lr, epochs) -> dict[str, float]:
  cols = fine_tuned(record, begin, split, lr, epochs)
  return stats.client_stats(
      cols['accuracy'], cols['loss'], cols['num_examples']
  )


# ------------------------------------------------------------- selection


@dataclasses.dataclass
class Choice:
  """A method's selection: what it tried, on which seeds, what won."""

  method: Method
  tried: dict[Config, dict[int, dict[str, float]]]
  best: Optional[Config] = None
  edges: tuple[str, ...] = ()  # Knobs whose chosen value is at an edge.
  rungs: list[int] = dataclasses.field(default_factory=list)
  extensions: int = 0
  # The first rung's statistics (fewer rounds), apart from `tried`.
  early: dict[Config, dict[str, float]] = dataclasses.field(
      default_factory=dict
  )
  # Validation curves `[[round, mean, sq10], ...]` of the full runs.
  curves: dict[Config, dict[int, list]] = dataclasses.field(
      default_factory=dict
  )

  def ranked(self, seeds: Sequence[int]) -> list[Config]:
    """The configurations run on all `seeds`, best first (grid order ties)."""
    full = [c for c, by in self.tried.items() if all(s in by for s in seeds)]
    return sorted(
        full,
        key=lambda c: stats.criterion([self.tried[c][s] for s in seeds]),
    )


def _values(choice: Choice, knob: str) -> list[float]:
  return sorted({getattr(c, knob) for c in (*choice.tried, *choice.early)})


def _axes(choice: Choice) -> tuple[str, ...]:
  """The Config fields tuned: the knob, the client learning rate and the
  server learning rate where more than one was tried."""
  axes = (('value',) if choice.method.knob else ()) + ('lr',)
  if len(_values(choice, 'slr')) > 1:
    axes += ('slr',)
  return axes


_AXIS_NAMES = {'lr': 'learning_rate', 'slr': 'server_learning_rate'}


def _edge_moves(choice: Choice, lr_low: float) -> list[tuple[str, Config]]:
  """New configurations one step past the chosen values at grid edges."""
  method, best, moves = choice.method, choice.best, []
  for axis in _axes(choice):
    values = _values(choice, axis)
    current = getattr(best, axis)
    for edge, at in (('low', values[0]), ('high', values[-1])):
      if current != at:
        continue
      low, high = (
          (method.low, method.high) if axis == 'value' else (lr_low, None)
      )
      new = stats.next_value(values, edge, low=low, high=high)
      if new is not None:
        moves.append((axis, dataclasses.replace(best, **{axis: new})))
  return moves


def _edges(choice: Choice) -> tuple[str, ...]:
  out = []
  for axis in _axes(choice):
    values = _values(choice, axis)
    if len(values) > 1 and getattr(choice.best, axis) in (
        values[0],
        values[-1],
    ):
      out.append(_AXIS_NAMES.get(axis, choice.method.knob))
  return tuple(out)


def _ft_moves(best: Config, max_epochs: dict[float, int]) -> set:
  """`(lr, epochs)` fine-tunings one step past the chosen edges."""
  lrs = sorted(max_epochs)
  moves = set()
  for edge, at in (('low', lrs[0]), ('high', lrs[-1])):
    if best.lr == at and best.value > 0:
      new = stats.next_value(lrs, edge, low=0.0, high=None)
      if new is not None:
        moves.add((new, max_epochs[best.lr]))
  if best.value == max_epochs[best.lr]:
    moves.add((best.lr, 2 * int(best.value)))
  return moves


def _ft_edges(best: Config, max_epochs: dict[float, int]) -> tuple[str, ...]:
  lrs = sorted(max_epochs)
  edges = []
  if best.value == max_epochs[best.lr]:
    edges.append('fine_tune_epochs')
  if best.value > 0 and len(lrs) > 1 and best.lr in (lrs[0], lrs[-1]):
    edges.append('fine_tune_learning_rate')
  return tuple(edges)


class Benchmark:
  """The selection and report phases of one setting."""

  def __init__(
      self,
      runs,
      task_flags,
      budget,
      methods_run,
      grids,
      data_seed,
      root,
      max_extensions: int = 2,
  ):
    self.max_extensions = max_extensions
    self.runs = runs
    self.task_flags = task_flags
    self.budget = budget
    self.methods = methods_run
    self.grids = grids
    self.data_seed = data_seed
    self.root = root

  def _args(self, method, config, seed, phase, rounds=None):
    return run_args(
        self.task_flags,
        self.budget,
        method,
        config,
        seed,
        phase=phase,
        root=self.root,
        data_seed=self.data_seed,
        rounds=rounds,
    )

  def _execute(self, groups, progress):
    """Runs groups of `(key, args, personal, describe, rounds, name)`, each
    group in turn in one worker (one configuration's seeds share its
    builds)."""

    def one(group):
      done = {}
      for key, args, personal, describe, rounds, name in group:
        done[key] = self.runs.run(args, rounds, personal, name=name)
        progress(describe(done[key]))
      return done

    out = {}
    for done in self._parallel(one, groups):
      out.update(done)
    return out

  def _parallel(self, fn, items) -> list:
    """`[fn(item) ...]` in the pool's threads, each with a worker."""

    def one(item):
      try:
        return fn(item)
      finally:
        self.runs.release()

    pool = concurrent.futures.ThreadPoolExecutor(self.runs.jobs)
    try:
      futures = [pool.submit(one, item) for item in items]
      return [f.result() for f in futures]
    except reproduce.Stopped as e:
      e.ended = reproduce.end_children(e.signum)
      raise
    except BaseException:
      reproduce.end_children(signal.SIGTERM)
      raise
    finally:
      pool.shutdown(wait=True, cancel_futures=True)

  def _fine_tune(
      self, method, config, seeds, phase, progress, lrs, max_epochs, tag=''
  ) -> dict:
    """The baselines' fine-tuning of FedAvg's runs: seed -> record."""

    def one(seed):
      record = self.runs.fine_tune(
          self._args(method, config, seed, phase),
          lrs,
          max_epochs,
          self.budget.batch_size,
          tag=tag,
      )
      progress(
          f'{phase} fine-tuning of FedAvg {config.describe(method)} seed '
          f'{seed} ({record["wall_s"]:.0f} s)'
      )
      return record

    return dict(zip(seeds, self._parallel(one, list(seeds))))

  def _jobs(self, method, configs, seeds, phase, rounds=None):
    """The runs of `configs` x `seeds` (`rounds`: a first rung's)."""
    groups = []
    split = 'personal/test' if method.name in PERSONAL else 'test'
    rung = f' ({rounds} rounds)' if rounds else ''
    for config in configs:
      group = []
      for seed in seeds:
        args = self._args(method, config, seed, phase, rounds)
        name = None
        if rounds:
          name = run_name(phase, method, config, seed) + f'_r{rounds}'

        def describe(r, m=method, c=config, sd=seed, sp=split, ph=phase):
          if r.get('diverged'):
            return f'{ph} {m.label} {c.describe(m)} seed {sd}{rung}: diverged'
          s = run_stats(r, sp)
          where = 'validation' if ph == 'select' else 'held-out'
          return (
              f'{ph} {m.label} {c.describe(m)} seed {sd}{rung}: {where} '
              f'worst10 {100 * s["worst10"]:.1f}%, mean '
              f'{100 * s["mean"]:.1f}% ({r["wall_s"]:.0f} s)'
          )

        group.append(
            (
                (method.name, config, seed),
                args,
                method.name in PERSONAL,
                describe,
                rounds or self.budget.rounds,
                name,
            )
        )
      groups.append(group)
    return groups

  def select(self, sel_seeds, progress) -> dict[str, Choice]:
    """Successive halving over the seeds, then the edge extensions."""
    choices, candidates = {}, {}
    for method in self.methods:
      if method.baseline:
        continue
      values = (
          self.grids.get(method.knob, method.grid) if method.knob else (None,)
      )
      lrs = self.grids['learning_rate']
      choices[method.name] = Choice(method, {})
      candidates[method.name] = [Config(v, lr) for v in values for lr in lrs]
    if self.budget.first_rung:
      candidates = self._first_rung(choices, candidates, sel_seeds, progress)
    for rung, seed in enumerate(sel_seeds):
      groups = []
      for name, configs in candidates.items():
        choices[name].rungs.append(len(configs))
        groups += self._jobs(choices[name].method, configs, [seed], 'select')
      self._collect(choices, self._execute(groups, progress))
      if rung == 0 and not self.budget.first_rung:
        ranked = {n: c.ranked(sel_seeds[:1]) for n, c in choices.items()}
        new, more = self._server_lr_step(choices, ranked, seed, None)
        self._collect(choices, self._execute(more, progress))
        for name, configs in new.items():
          choices[name].rungs[-1] += len(configs)
      for name, choice in choices.items():
        ranked = choice.ranked(sel_seeds[: rung + 1])
        candidates[name] = stats.top_fraction(ranked, KEEP)
        choice.best = ranked[0]
    lr_low = 0.0
    for _ in range(self.max_extensions):
      groups, moved = [], {}
      for name, choice in choices.items():
        moves = [
            c for _, c in _edge_moves(choice, lr_low) if c not in choice.tried
        ]
        if moves:
          moved[name] = moves
          groups += self._jobs(choice.method, moves, sel_seeds, 'select')
      if not groups:
        break
      self._collect(choices, self._execute(groups, progress))
      for name in moved:
        choice = choices[name]
        choice.extensions += 1
        choice.best = choice.ranked(sel_seeds)[0]
    for choice in choices.values():
      choice.edges = _edges(choice)
    return choices

  def _first_rung(self, choices, candidates, sel_seeds, progress) -> dict:
    """Every configuration for `budget.first_rung` rounds on the first
    selection seed; the best `KEEP` go on (their runs continue to the full
    rounds in the same folders). Returns the configurations that go on."""
    rounds, seed = self.budget.first_rung, sel_seeds[0]
    groups = []
    for name, configs in candidates.items():
      choices[name].rungs.append(len(configs))
      groups += self._jobs(
          choices[name].method, configs, [seed], 'select', rounds
      )
    records = self._execute(groups, progress)
    self._collect_early(choices, records)
    ranked = {
        n: self._early_ranked(choices[n], c) for n, c in candidates.items()
    }
    new, groups = self._server_lr_step(choices, ranked, seed, rounds)
    self._collect_early(choices, self._execute(groups, progress))
    out = {}
    for name, configs in candidates.items():
      configs = configs + new.get(name, [])
      choices[name].rungs[-1] = len(configs)
      ranked = self._early_ranked(choices[name], configs)
      out[name] = stats.top_fraction(ranked, KEEP)
    return out

  @staticmethod
  def _early_ranked(choice: Choice, configs) -> list[Config]:
    return sorted(configs, key=lambda c: stats.criterion([choice.early[c]]))

  @staticmethod
  def _collect_early(choices, records) -> None:
    for (name, config, _), record in records.items():
      split = 'personal/test' if name in PERSONAL else 'test'
      choices[name].early[config] = run_stats(record, split)

  def _server_lr_step(self, choices, ranked, seed, rounds):
    """The server learning rate along one line: each server-optimizer
    method's best configuration of `ranked` at the grid's other server
    rates, on `seed` for `rounds` (None: the full rounds). Returns the new
    configurations by method and their run groups (none unless the budget
    tunes the server rate)."""
    new, groups = {}, []
    if not self.budget.tune_server_lr:
      return new, groups
    for name, configs in ranked.items():
      method = choices[name].method
      if not method.server_lr or not configs:
        continue
      best = configs[0]
      new[name] = [
          dataclasses.replace(best, slr=slr)
          for slr in self.grids['server_learning_rate']
          if slr != best.slr
      ]
      groups += self._jobs(method, new[name], [seed], 'select', rounds)
    return new, groups

  def _collect(self, choices, records):
    for (name, config, seed), record in records.items():
      method = choices[name].method
      split = 'personal/test' if method.name in PERSONAL else 'test'
      choices[name].tried.setdefault(config, {})[seed] = run_stats(
          record, split
      )
      curve = record.get('curve', {}).get(split)
      if curve:
        choices[name].curves.setdefault(config, {})[seed] = curve

  def select_fine_tuning(self, fedavg: Choice, sel_seeds, progress):
    """The baselines' (learning rate, epochs) on FedAvg's selection runs.

    Epochs 0 (no fine-tuning) to `budget.fine_tune_epochs` at each rate of
    the grid; a choice at the grid's edge (the smallest or largest rate,
    the most epochs) fine-tunes again one step past it (a rate one grid
    step further, or twice the epochs at the chosen rate), up to
    `max_extensions` times; one still at an edge is marked.
    """
    tried = {name: {} for name in BASELINES}
    max_epochs = {}  # lr -> the most epochs tried at it

    def fine_tune(lrs, epochs, tag):
      records = self._fine_tune(
          fedavg.method,
          fedavg.best,
          sel_seeds,
          'select',
          progress,
          lrs,
          epochs,
          tag=tag,
      )
      for lr in lrs:
        max_epochs[lr] = max(max_epochs.get(lr, 0), epochs)
        for name, begin in BASELINES.items():
          for e in range(epochs + 1):
            tried[name][Config(e, lr)] = {
                seed: fine_tuned_stats(r, begin, 'validation', lr, e)
                for seed, r in records.items()
            }

    fine_tune(
        list(self.grids['fine_tune_learning_rate']),
        self.budget.fine_tune_epochs,
        '',
    )
    out = {}
    for name in BASELINES:
      method = Method(name, '', 'fine_tune_epochs', low=0.0)
      out[name] = Choice(method, tried[name], rungs=[len(tried[name])])
      out[name].best = out[name].ranked(sel_seeds)[0]
    for _ in range(self.max_extensions):
      moves = set()
      for choice in out.values():
        moves.update(_ft_moves(choice.best, max_epochs))
      if not moves:
        break
      for lr, epochs in sorted(moves):
        fine_tune([lr], epochs, f'_lr{lr:g}_e{epochs}')
      for choice in out.values():
        choice.tried = tried[choice.method.name]
        choice.extensions += 1
        choice.best = choice.ranked(sel_seeds)[0]
    for choice in out.values():
      choice.edges = _ft_edges(choice.best, max_epochs)
      choice.rungs = [len(choice.tried)]
    return out

  def report(self, choices, ft_choices, seeds, progress):
    """Each method at its choice on the reported seeds: name -> per seed
    `{split: per-client arrays}` plus examples and wall time."""
    groups = []
    for method in self.methods:
      if method.baseline:
        continue
      groups += self._jobs(method, [choices[method.name].best], seeds, 'final')
    records = self._execute(groups, progress)
    results = {}
    for method in self.methods:
      if method.baseline:
        continue
      best = choices[method.name].best
      runs = []
      for seed in seeds:
        record = records[(method.name, best, seed)]
        splits = dict(record['splits'])
        if method.name in PERSONAL:
          splits['test'] = splits.pop('personal/test')
        runs.append(
            {
                'splits': splits,
                'examples': record['examples'],
                'wall_s': record['wall_s'],
                'args': record['args'],
                'task': record.get('task', ''),
                # Where its time went (records made before: none).
                **{
                    k: record[k]
                    for k in ('seconds', 'timed_wall_s', 'timed_examples')
                    if k in record
                },
            }
        )
      results[method.name] = runs
    if not ft_choices:
      return results
    fedavg = choices['fedavg']
    # Only the chosen rates and epochs: the report needs nothing else.
    chosen = [ft_choices[n].best for n in ft_choices]
    lrs = sorted({c.lr for c in chosen})
    fine_tunings = self._fine_tune(
        fedavg.method,
        fedavg.best,
        seeds,
        'final',
        progress,
        lrs,
        max(c.value for c in chosen),
    )
    for seed_index, seed in enumerate(seeds):
      ft = fine_tunings[seed]
      base = results['fedavg'][seed_index]
      base['ft_start'] = start_offset(
          base['splits']['test'], fine_tuned(ft, 'final', 'test', lrs[0], 0)
      )
      if base['ft_start'][0]:
        warn(
            f"seed {seed}: FedAvg's final model as fine-tuned is not the one "
            f"its record evaluated ({base['ft_start'][0]} clients differ, by "
            f"up to {base['ft_start'][1]:.2f} points); it was trained again"
        )
      if 'unseen' in ft['splits']['final']:
        base['splits']['unseen_half'] = fine_tuned(
            ft, 'final', 'unseen', lrs[0], 0
        )
      for name in ft_choices:
        if not any(m.name == name for m in self.methods):
          continue
        best = ft_choices[name].best
        begin = BASELINES[name]
        splits = {
            'test': fine_tuned(ft, begin, 'test', best.lr, best.value),
        }
        if 'unseen' in ft['splits'][begin]:
          splits['unseen_half'] = fine_tuned(
              ft, begin, 'unseen', best.lr, best.value
          )
        tuned = int(best.value * ft['train_examples']['test'])
        results.setdefault(name, []).append(
            {
                'splits': splits,
                'examples': tuned
                + (base['examples'] if begin == 'final' else 0),
                'wall_s': (base['wall_s'] if begin == 'final' else 0.0)
                + ft['wall_s'],
            }
        )
    return results


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

  def pick(flag, default):
    value = getattr(FLAGS, flag)
    return default if value is None else value

  budget = Budget(
      rounds=pick('rounds', b.rounds),
      clients_per_round=pick('clients_per_round', b.clients_per_round),
      local_epochs=pick('local_epochs', b.local_epochs),
      batch_size=pick('batch_size', b.batch_size),
      learning_rate=pick('learning_rate', b.learning_rate),
      fine_tune_epochs=pick('fine_tune_epochs', b.fine_tune_epochs),
      first_rung=pick('first_rung', b.first_rung),
      eval_every=pick('eval_every', b.eval_every),
      tune_server_lr=pick('tune_server_lr', b.tune_server_lr),
      on_batched=b.on_batched,
  )
  for name in (
      'rounds',
      'clients_per_round',
      'local_epochs',
      'batch_size',
      'fine_tune_epochs',
  ):
    if getattr(budget, name) < 1:
      raise UsageError(f'--{name} must be >= 1, got {getattr(budget, name)}')
  if not 0 <= budget.first_rung < budget.rounds:
    raise UsageError(
        f'--first_rung must be >= 0 and < the rounds ({budget.rounds}), got '
        f'{budget.first_rung} (0: no first rung)'
    )
  if budget.eval_every < 0:
    raise UsageError(f'--eval_every must be >= 0, got {budget.eval_every}')
  if not (math.isfinite(budget.learning_rate) and budget.learning_rate > 0):
    raise UsageError(f'--learning_rate must be > 0, got {budget.learning_rate}')
  return budget


def _grids(budget: Budget, methods_run: Sequence[Method]) -> dict:
  """The grids: declared, then `--grid` overrides (checked)."""
  grids = {
      'learning_rate': log_grid(budget.learning_rate, LR_STEPS),
      'fine_tune_learning_rate': log_grid(budget.learning_rate, FT_LR_STEPS),
      'server_learning_rate': log_grid(1.0, SERVER_LR_STEPS),
  }
  ranges = {
      'learning_rate': (0.0, None),
      'fine_tune_learning_rate': (0.0, None),
      'server_learning_rate': (0.0, None),
  }
  for m in methods():
    if m.knob:
      grids.setdefault(m.knob, m.grid)
      ranges[m.knob] = (m.low, m.high)
  for item in FLAGS.grid:
    knob, _, text = item.partition(':')
    if knob not in ranges:
      raise UsageError(
          f'--grid={item}: unknown knob {knob!r}; choose among '
          f'{", ".join(sorted(ranges))}'
      )
    try:
      values = tuple(float(v) for v in text.split(','))
    except ValueError:
      raise UsageError(
          f'--grid={item}: values must be numbers, as knob:v1,v2,...'
      ) from None
    low, high = ranges[knob]
    bad = [
        v
        for v in values
        if not math.isfinite(v)
        or (low is not None and v <= low)
        or (high is not None and v > high)
    ]
    if bad or len(set(values)) != len(values):
      where = f'> {low:g}' + (f' and <= {high:g}' if high is not None else '')
      raise UsageError(
          f'--grid={item}: values must be distinct, finite and {where}'
      )
    grids[knob] = tuple(sorted(values))
  del methods_run
  return grids


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


def _methods() -> list[Method]:
  every = methods()
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


def _shakespeare_data(
    output_dir: str, data_dir: Optional[str], build: bool = True
) -> str:
  """The folder of shakespeare.sqlite, built from the plays if missing
  (`build` false, from records: only its name, for the commands printed)."""
  from tasks import base  # pylint: disable=g-import-not-at-top
  from tasks import data_files  # pylint: disable=g-import-not-at-top
  from tasks import shakespeare_text  # pylint: disable=g-import-not-at-top

  folder = data_dir or os.path.join(output_dir, 'data')
  if not build:
    return folder
  path = os.path.join(folder, shakespeare_text.SQLITE_NAME)
  if os.path.exists(path):  # A damaged file: one line, before any run.
    try:
      data_files.sql_example_counts(path, ['train', 'test'])
    except base.TaskError as e:
      raise UsageError(str(e)) from None
  else:
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
  """One line per finished run: `[k] phase method config seed: ...`."""

  def __init__(self):
    self.done = 0
    self._lock = threading.Lock()

  def __call__(self, text: str) -> None:
    with self._lock:
      self.done += 1
      print(f'[{self.done}] {text}', file=sys.stderr, flush=True)


def main(argv) -> int:
  """Runs the benchmark; returns the exit code (2: bad input)."""
  try:
    setting = SETTINGS[FLAGS.setting]
    budget = _budget(setting)
    task_flags = _task_flags(setting, list(argv[1:]))
    methods_run = _methods()
    grids = _grids(budget, methods_run)
    seeds = _ints('seeds', FLAGS.seeds)
    sel_seeds = _ints('selection_seeds', FLAGS.selection_seeds)
    if set(seeds) & set(sel_seeds):
      raise UsageError(
          '--selection_seeds must be disjoint from --seeds, both hold '
          f'{sorted(set(seeds) & set(sel_seeds))}'
      )
    if FLAGS.jobs < 1:
      raise UsageError(f'--jobs must be >= 1, got {FLAGS.jobs}')
    if FLAGS.data_seed < 0:
      raise UsageError(f'--data_seed must be >= 0, got {FLAGS.data_seed}')
    if FLAGS.max_extensions < 0:
      raise UsageError(
          f'--max_extensions must be >= 0, got {FLAGS.max_extensions}'
      )
    output_dir = FLAGS.output_dir or os.path.join(
        'output', 'benchmark', setting.name
    )
    output_md = FLAGS.output_md or os.path.join(output_dir, 'benchmark.md')
    records_dir = FLAGS.records_dir or os.path.join(output_dir, 'records')
    run_dir.check_output_dir(output_dir, flag='--output_dir')
    run_dir.check_output_dir(records_dir, flag='--records_dir')
    reproduce.check_output_md(output_md)
    bound = read_bound(FLAGS.bound_json) if FLAGS.bound_json else None
    if setting.shakespeare_data and not argv[1:]:
      # From records nothing is built, but the commands printed still run.
      folder = _shakespeare_data(
          output_dir, FLAGS.data_dir, build=not FLAGS.from_records
      )
      task_flags = task_flags + [f'--data_dir={folder}']
  except (UsageError, run_dir.OutputDirError) as e:
    print(f'benchmark: error: {e}', file=sys.stderr)
    return 2
  os.makedirs(records_dir, exist_ok=True)
  os.makedirs(output_dir, exist_ok=True)
  root = os.path.join(output_dir, 'runs')
  runs = Runs(records_dir, output_dir, FLAGS.jobs, FLAGS.from_records)
  bench = Benchmark(
      runs,
      task_flags,
      budget,
      methods_run,
      grids,
      FLAGS.data_seed,
      root,
      FLAGS.max_extensions,
  )
  progress = _Progress()
  previous = {
      s: signal.signal(s, _raise_stopped)
      for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
  }
  try:
    if not FLAGS.from_records:  # Task flags checked before any run.
      probe = bench._args(  # pylint: disable=protected-access
          methods_run[0], Config(None, budget.learning_rate), 0, 'select'
      )
      error = runs.check(probe)
      if error:
        print(
            f'benchmark: error: {error.split("error: ", 1)[-1]}',
            file=sys.stderr,
        )
        return 2
    choices = bench.select(sel_seeds, progress)
    ft_choices = {}
    if any(m.baseline for m in methods_run):
      ft_choices = bench.select_fine_tuning(
          choices['fedavg'], sel_seeds, progress
      )
    results = bench.report(choices, ft_choices, seeds, progress)
  except reproduce.Stopped as e:
    ended = getattr(e, 'ended', 0)
    print(
        f'benchmark: interrupted ({e}): ended {ended} running worker'
        f'{"" if ended == 1 else "s"} and their TFF workers; rerun the '
        'same command to resume (finished runs are kept)',
        file=sys.stderr,
        flush=True,
    )
    return 130 if e.signum == signal.SIGINT else 128 + e.signum
  except (RuntimeError, MissingRecord) as e:
    print(f'benchmark: error: {str(e).splitlines()[-1]}', file=sys.stderr)
    return 1
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
    runs.close()
  stem = os.path.splitext(output_md)[0]
  pngs = (f'{stem}_cdf.png', f'{stem}_differences.png')
  report = benchmark_page.Report(
      setting=setting,
      budget=budget,
      task_flags=task_flags,
      methods=methods_run,
      seeds=seeds,
      sel_seeds=sel_seeds,
      grids=grids,
      choices=choices,
      ft_choices=ft_choices,
      results=results,
      commands=runs.commands,
      wall=runs.wall,
      data_seed=FLAGS.data_seed,
      keep=KEEP,
      argv=sys.argv,
      overrides=_overrides(),
      bound=bound,
  )
  benchmark_page.write_pictures(report, *pngs)
  curve_png = f'{stem}_curve.png'
  if benchmark_page.write_curve(report, curve_png):
    pngs += (curve_png,)
  atomic.write_text(output_md, benchmark_page.page(report, pngs))
  atomic.write_text(
      os.path.join(output_dir, 'results.json'),
      json.dumps(benchmark_page.results_json(report), indent=1, default=float),
  )
  print(f'benchmark: wrote {output_md}, {", ".join(pngs)}')
  return 0


def read_bound(path: str) -> dict[str, Any]:
  """The `fedavg/bound` of a bench_suite JSON of one model: its examples/s
  and task line (`UsageError` naming the file otherwise)."""
  what = f'--bound_json={path}'
  try:
    with open(path, encoding='utf-8') as f:
      models = json.load(f)['models']
    (task,) = models.values()
    examples_per_s = float(task['systems']['fedavg/bound']['examples_per_s'])
  except OSError as e:
    raise UsageError(f'{what}: cannot read it ({e.strerror})') from None
  except (ValueError, KeyError, TypeError, AttributeError):
    raise UsageError(
        f'{what}: not a bench_suite --output_json of one model with '
        'fedavg/bound'
    ) from None
  if not (math.isfinite(examples_per_s) and examples_per_s > 0):
    raise UsageError(f'{what}: the bound is {examples_per_s} examples/s')
  return {
      'examples_per_s': examples_per_s,
      'task': str(task.get('task', '')),
      'file': os.path.basename(path),
  }


def _overrides() -> list[str]:
  return [
      f'--{name}={getattr(FLAGS, name)}'
      for name in (
          'rounds',
          'clients_per_round',
          'local_epochs',
          'batch_size',
          'learning_rate',
          'fine_tune_epochs',
          'first_rung',
          'eval_every',
          'tune_server_lr',
      )
      if getattr(FLAGS, name) is not None
  ]


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
