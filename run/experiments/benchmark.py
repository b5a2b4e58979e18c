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
   grid (`--grid=knob:v1,v2,...`), and further knobs along a line through
   the best configuration (Fed+'s lambda; the server learning rate), by
   successive halving: with a first rung (`--first_rung`, the Shakespeare
   setting's 75 of 300 rounds) every configuration trains that many rounds
   on the first selection seed and the best third, and each learning
   rate's best, continue to the full rounds (in the same folder, from its
   checkpoint); then over the selection seeds, every configuration still
   in runs on the first seed, the best third continues on the next, and so
   on. A configuration that diverged or fell back to the trivial score
   (`benchmark_stats.fell_back`) ranks below every stable one; where the
   best two are within their spread, more selection seeds decide
   (`--max_extra_seeds`). The criterion is the validation
   worst-10% accuracy as a superquantile (continuous); where it ties, the
   worst 20%, 30%, 50%, then the mean accuracy, and the superquantile of
   the loss last (`benchmark_stats.criterion`; personal models
   for Ditto and Fed+). A choice at an edge of its grid extends the grid
   past it (`--max_extensions`, within the knob's valid range); a choice
   still at an edge is marked. The baselines' fine-tuning learning rate and
   epochs are chosen the same way on FedAvg's selection runs, each apart:
   FedAvg + fine-tuning from the final model saved with each record, local
   training from the initial model for up to `--local_epochs_max` epochs.
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
accuracy, loss and examples for every split, examples processed, wall time,
and its origin, `benchmark_origin`): a run whose record exists with its
arguments and origin (or any origin, `--accept_foreign_records`) is not run
again, so the same
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
from run.experiments import benchmark_origin as origin_lib
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
class Line:
  """A knob tuned along one line through a method's best configuration.

  Attributes:
    name: Its flag.
    grid: Its values (the first: the knob's default, left out of names).
    bound_low: Where its valid range ends below: a choice there is not at
      an edge (it cannot go further) ...
    bound_high: ... and above.
  """

  name: str
  grid: tuple[float, ...]
  bound_low: float
  bound_high: float

  @property
  def default(self) -> float:
    return self.grid[0]


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
    per_learning_rate: `grid` holds learning rate times the knob (divided
      by the centre learning rate: `TunedOption.per_learning_rate`).
    lines: Knobs tuned along a line through the best joint configuration.
  """

  name: str
  label: str
  knob: Optional[str] = None
  grid: tuple[float, ...] = ()
  low: Optional[float] = 0.0
  high: Optional[float] = None
  flags: tuple[str, ...] = ()
  per_learning_rate: bool = False
  lines: tuple[Line, ...] = ()

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

  def knob_grid(self, centre_learning_rate: float) -> tuple[float, ...]:
    """The knob's grid in a budget centred on that learning rate."""
    if not self.per_learning_rate:
      return self.grid
    return tuple(float(f'{v / centre_learning_rate:.2g}') for v in self.grid)

  def line(self, name: str) -> Line:
    return next(line for line in self.lines if line.name == name)

  def knob_flags(self, config: 'Config') -> list[str]:
    out = [f'--algorithm={self.name}', *self.flags]
    if self.knob is not None:
      out.append(f'--{self.knob}={config.value:g}')
    out += [f'--{name}={value:g}' for name, value in config.extra]
    return out


@dataclasses.dataclass(frozen=True)
class Budget:
  """What every algorithm gets: the same for all (its own learning rate)."""

  rounds: int
  clients_per_round: int
  local_epochs: int
  batch_size: int
  learning_rate: float  # The centre of the learning-rate grid.
  fine_tune_epochs: int = 5  # FedAvg + fine-tuning's epochs: 0..this.
  # Local training's epochs, 0..this (selected): to its plateau, at least
  # 100 (a choice at this cap is marked).
  local_epochs_max: int = 128
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
    entry = registry.get(name)
    tuned = entry.tuned
    lines = tuple(
        Line(line.name, tuple(line.grid), line.low, line.high)
        for line in entry.lines
    )
    if tuned is None:
      out.append(Method(name, label, lines=lines))
      continue
    out.append(
        Method(
            name,
            label,
            tuned.name,
            tuple(tuned.grid),
            low=tuned.low if tuned.extend_low else tuned.grid[0],
            high=tuned.high if tuned.extend_high else tuned.grid[-1],
            per_learning_rate=tuned.per_learning_rate,
            lines=lines,
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
        # FedAvg at lr 0.1 (--holdout=validation, seeds 100 and 101, eval
        # every 50 rounds) gained 1.2 and 4.7 points of validation mean over
        # the last quarter of 100 rounds; over rounds 600 to 800 it moved
        # -0.4 and -0.7 (55.5 and 54.3%): rounds=800, a first rung of 200.
        Budget(
            rounds=800,
            clients_per_round=10,
            local_epochs=1,
            batch_size=10,
            learning_rate=0.1,
            first_rung=200,
            eval_every=100,
            tune_server_lr=True,
        ),
        'Synthetic(1,1) with 100 devices (the thesis: 30 to 100), 50 training '
        'and 50 unseen; 800 rounds of 10 devices (where FedAvg plateaus), one '
        'epoch, batch 10, learning rates around 0.1 (the thesis: 0.01 to 0.1, '
        'thousands of rounds)',
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
      'local_epochs_max',
      None,
      "Override the setting's most epochs of the local-training baseline "
      '(0 to this, selected on validation; default 128).',
  )
  flags.DEFINE_integer(
      'max_extra_seeds',
      2,
      "Selection seeds added where a method's best two configurations "
      'differ by less than their spread over the seeds (each seed after '
      '--selection_seeds, clear of --seeds).',
  )
  flags.DEFINE_boolean(
      'accept_foreign_records',
      False,
      'Reuse records made by other code, data or library versions than '
      "this machine's (the page lists every origin); by default such a "
      'record is run again.',
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
  # Line knobs away from their defaults: `((name, value), ...)`, sorted.
  extra: tuple[tuple[str, float], ...] = ()

  def describe(self, method: Method) -> str:
    knob = '' if method.knob is None else f'{method.knob}={self.value:g}, '
    server = '' if self.slr == 1.0 else f', server lr={self.slr:g}'
    lines = ''.join(f', {n}={v:g}' for n, v in self.extra)
    return f'{knob}lr={self.lr:g}{server}{lines}'

  def get(self, axis: str, method: Method) -> float:
    """The value on `axis` ('value', 'lr', 'slr' or a line's name)."""
    if axis in ('value', 'lr', 'slr'):
      return getattr(self, axis)
    return dict(self.extra).get(axis, method.line(axis).default)

  def with_value(self, axis: str, value: float, method: Method) -> 'Config':
    """This configuration with `axis` at `value`."""
    if axis in ('value', 'lr', 'slr'):
      return dataclasses.replace(self, **{axis: value})
    extra = dict(self.extra)
    extra.pop(axis, None)
    if value != method.line(axis).default:
      extra[axis] = value
    return dataclasses.replace(self, extra=tuple(sorted(extra.items())))


def run_name(phase: str, method: Method, config: Config, seed: int) -> str:
  knob = '' if method.knob is None else f'_{method.knob}{config.value:g}'
  server = '' if config.slr == 1.0 else f'_slr{config.slr:g}'
  lines = ''.join(f'_{n}{v:g}' for n, v in config.extra)
  return (
      f'{phase}_{method.name}{knob}_lr{config.lr:g}{server}{lines}'
      f'_seed{seed}'
  )


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
      + method.knob_flags(config)
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


def _has_clients(run_path: str, personal: bool) -> bool:
  """Whether a run folder holds the per-client files a record is made of."""
  folder = os.path.join(run_path, 'clients')
  try:
    names = os.listdir(folder)
  except OSError:
    return False
  prefixes = ('round_',) + (('personal_round_',) if personal else ())
  return all(any(n.startswith(p) for n in names) for p in prefixes)


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


# metrics.csv's columns of examples read by the clients' work: training,
# and any further pass an algorithm's client step makes (Ditto's personal
# passes).
EXAMPLE_COLUMNS = ('train/num_examples', 'client_work/personal_examples')


def _examples(run_path: str, rounds: int) -> int:
  """Examples the run's clients read up to `rounds`: metrics.csv's sums of
  `EXAMPLE_COLUMNS`."""
  total = 0.0
  with open(os.path.join(run_path, 'metrics.csv'), newline='') as f:
    for row in csv.DictReader(f):
      if int(row['round_num']) > rounds:
        continue
      for column in EXAMPLE_COLUMNS:
        if row.get(column):
          total += float(row[column])
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


def _number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _client_columns(cols: Any, where: str) -> Optional[str]:
  """What is wrong with one split's per-client arrays (None: nothing)."""
  if not isinstance(cols, dict):
    return f'{where} is not a table of per-client arrays'
  lengths = set()
  for key in ('accuracy', 'loss', 'num_examples'):
    values = cols.get(key)
    if not isinstance(values, list) or not values:
      return f'{where} has no per-client {key}'
    if not all(_number(v) for v in values):
      return f'{where}: {key} holds a value that is not a number'
    if not all(math.isfinite(v) for v in values):
      return f'{where}: {key} holds NaN or infinity'
    lengths.add(len(values))
  if len(lengths) > 1:
    return f'{where}: accuracy, loss and num_examples differ in length'
  return None


def record_problem(record: Any, splits: Sequence[str] = ()) -> Optional[str]:
  """What is wrong with a training run's record (None: nothing).

  Args:
    record: The record as read.
    splits: Splits it must hold (a diverged run's record holds none).
  """
  if not isinstance(record, dict):
    return 'not a JSON object'
  if not isinstance(record.get('args'), list):
    return 'no list of arguments'
  if not _number(record.get('wall_s')) or not math.isfinite(record['wall_s']):
    return 'no wall_s'
  if not isinstance(record.get('splits'), dict):
    return 'no table of splits'
  if record.get('diverged'):
    return None
  if not _number(record.get('examples')):
    return 'no examples count'
  if not record['splits']:
    return 'no split'
  for split in splits:
    if split not in record['splits']:
      return f'no split {split}'
  for split, cols in record['splits'].items():
    problem = _client_columns(cols, f'split {split}')
    if problem:
      return problem
  curve = record.get('curve', {})
  if not isinstance(curve, dict) or not all(
      isinstance(points, list)
      and all(
          isinstance(p, list) and len(p) == 3 and all(map(_number, p))
          for p in points
      )
      for points in curve.values()
  ):
    return 'a curve that is not [round, mean, worst10] points'
  seconds = record.get('seconds', {})
  if not isinstance(seconds, dict) or not all(map(_number, seconds.values())):
    return 'seconds that are not numbers'
  for key in ('timed_wall_s', 'timed_examples'):
    if key in record and not _number(record[key]):
      return f'{key} is not a number'
  return None


def fine_tuning_problem(record: Any, start: str) -> Optional[str]:
  """What is wrong with a fine-tuning's record (None: nothing)."""
  if not isinstance(record, dict):
    return 'not a JSON object'
  if not isinstance(record.get('args'), list):
    return 'no list of arguments'
  if not _number(record.get('wall_s')):
    return 'no wall_s'
  if not isinstance(record.get('train_examples'), dict):
    return 'no train_examples'
  splits = record.get('splits')
  if not isinstance(splits, dict) or not isinstance(splits.get(start), dict):
    return f'no fine-tuning from the {start} model'
  if not splits[start]:
    return 'no split'
  for split, rates in splits[start].items():
    if not isinstance(rates, dict) or not rates:
      return f'split {split} has no learning rate'
    for rate, epochs in rates.items():
      if not isinstance(epochs, list) or not epochs:
        return f'split {split}, rate {rate}: no epochs'
      for k, cols in enumerate(epochs):
        problem = _client_columns(
            cols, f'split {split}, rate {rate}, epoch {k}'
        )
        if problem:
          return problem
  return None


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
      self,
      records_dir: str,
      log_dir: str,
      jobs: int,
      from_records: bool,
      origin: Optional[dict] = None,
      accept_foreign: bool = False,
  ):
    self.records_dir = records_dir
    self.log_dir = log_dir
    self.jobs = jobs
    self.from_records = from_records
    # This machine's origin (`benchmark_origin.current`): new records carry
    # it; a record of another is redone unless `accept_foreign`.
    self.origin = origin
    self.accept_foreign = accept_foreign
    self.used: dict[str, dict] = {}  # Record name -> record, for the page.
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

  def model_path(self, name: str) -> str:
    """Where the final model of record `name` is kept (FedAvg's runs, which
    the baselines fine-tune)."""
    return os.path.join(self.records_dir, f'{name}.weights.npz')

  def _damaged(self, path: str, problem: str) -> None:
    """Says a record is damaged: under `--from_records` (which never runs)
    an error; else a warning, and the run is done again."""
    if self.from_records:
      raise MissingRecord(
          f'{path} is damaged ({problem}); --from_records never runs: '
          'restore it (or rerun without --from_records)'
      )
    warn(f'{path}: damaged ({problem}); doing it again')

  def _read_record(self, path: str) -> Optional[Any]:
    try:
      with open(path) as f:
        return json.load(f)
    except FileNotFoundError:
      return None
    except (OSError, ValueError) as e:
      self._damaged(path, f'unreadable: {type(e).__name__}')
      return None

  def _load_record(
      self,
      name: str,
      args: list[str],
      needs_model: bool = False,
      check=None,
  ) -> Optional[dict]:
    """The record `name` if it may be reused for a run of `args`.

    `check(record)` says what is wrong with it (default: a training run's
    `record_problem`); a damaged record is redone (`_damaged`).
    """
    path = self._record_path(name)
    record = self._read_record(path)
    if record is None:
      return None
    problem = (check or record_problem)(record)
    if problem:
      self._damaged(path, problem)
      return None
    if _portable(record.get('args')) != _portable(args):
      raise RuntimeError(
          f'{path} records the run with other arguments; use another '
          '--records_dir (or remove that record)'
      )
    if self.from_records or self.origin is None:
      return record
    theirs = record.get('origin')
    if origin_lib.key(theirs) != origin_lib.key(self.origin):
      if not self.accept_foreign:
        warn(
            f'{path}: made by another origin ({origin_lib.describe(theirs)}'
            '); doing it again (--accept_foreign_records reuses it)'
        )
        return None
    if needs_model and not os.path.isfile(self.model_path(name)):
      warn(
          f'{path}: its final model was not saved with it (the baselines '
          'fine-tune that model); doing it again'
      )
      return None
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
    full = name is None  # A first rung's record is named apart.
    name = name or _flag(args, 'experiment_name')
    phase = name.split('_', 1)[0]
    # FedAvg's full runs keep their final model: the baselines fine-tune it.
    keep_model = full and _flag(args, 'algorithm') == 'fedavg'
    with self._lock:
      self.commands.append('python -m run.train ' + shlex.join(args))
    split = 'personal/test' if personal else 'test'
    record = self._load_record(
        name,
        args,
        needs_model=keep_model,
        check=lambda r: record_problem(r, [split]),
    )
    if record is None and self.from_records:
      raise MissingRecord(f'no record {self._record_path(name)}')
    if record is None:
      record = self._run(args, rounds, personal)
      if self.origin is not None:
        record['origin'] = self.origin
      if keep_model and not record.get('diverged'):
        self._worker().export_model(args, self.model_path(name))
      atomic.write_text(self._record_path(name), json.dumps(record))
    with self._lock:
      self.wall[phase] += record['wall_s']
      self.used[name] = record
    return record

  def trivial(self, args: list[str], phase: str) -> dict:
    """The commonest training class's per-client accuracy on the splits of
    runs like `args` (`run.fine_tune.trivial_scores`), kept as the record
    `trivial_<phase>`."""
    name = f'trivial_{phase}'
    path = self._record_path(name)
    record = self._read_record(path)
    key = _portable(args)
    if record is not None and not (
        isinstance(record, dict) and 'label' in record
    ):
      self._damaged(path, 'no trivial label')
      record = None
    if isinstance(record, dict) and _portable(record.get('args')) == key:
      with self._lock:
        self.used[name] = record
      return record
    if self.from_records:
      raise MissingRecord(f'no record {path}')
    tmp = os.path.join(self.log_dir, f'{name}.json')
    try:
      self._worker().trivial(args, os.path.abspath(tmp))
    finally:
      self.release()
    with open(tmp) as f:
      record = {'args': list(args), **json.load(f)}
    if self.origin is not None:
      record['origin'] = self.origin
    atomic.write_text(path, json.dumps(_rounded(record)))
    with self._lock:
      self.used[name] = record
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
    if wall is not None and not _has_clients(path, personal):
      aside = f'{path}.damaged-{int(time.time())}'
      os.replace(path, aside)
      warn(
          f'{path}: a finished run without its per-client files (clients/); '
          f'moved to {aside}, running it again'
      )
      wall = None
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
      start: str = 'final',
  ) -> dict:
    """A baseline's fine-tuning of a finished FedAvg run (its record).

    `start` is `final` (FedAvg + fine-tuning: from the final model saved
    with the run's record, `model_path`, never from a retraining) or
    `initial` (local training: from the run's initial model, which its
    flags fix). `tag` names a further fine-tuning of the same run (a grid
    extension).

    Returns:
      `{'splits': {start: {split: {lr: [per-client arrays per epoch]}}},
      'train_examples', 'wall_s'}`.
    """
    run = _flag(args, 'experiment_name')
    name = f'{run}_ft{start}{tag}'
    options = dict(
        learning_rates=[float(r) for r in learning_rates],
        max_epochs=max_epochs,
        batch_size=batch_size,
        starts=[start],
    )
    key = list(args) + [json.dumps(options, sort_keys=True)]
    phase = name.split('_', 1)[0]
    record = self._load_record(
        name, key, check=lambda r: fine_tuning_problem(r, start)
    )
    if record is None and self.from_records:
      raise MissingRecord(f'no record {self._record_path(name)}')
    if record is None:
      if start == 'final':
        model = self.model_path(run)
        if not os.path.isfile(model):
          raise RuntimeError(
              f"{model} is missing: FedAvg's run {run} has no saved final "
              'model to fine-tune (remove its record and the benchmark '
              'trains it again)'
          )
        options['model_path'] = os.path.abspath(model)
      path = os.path.join(_flag(args, 'root_output_dir'), run)
      start_s = time.time()
      self._worker().fine_tune(args, **options)
      with open(os.path.join(path, 'fine_tuning.json')) as f:
        result = json.load(f)
      record = {
          'args': key,
          'splits': _rounded({start: result[start]}),
          'train_examples': result['train_examples'],
          'wall_s': round(time.time() - start_s, 1),
      }
      if self.origin is not None:
        record['origin'] = self.origin
      atomic.write_text(self._record_path(name), json.dumps(record))
    with self._lock:
      self.wall[phase] += record['wall_s']
      self.used[name] = record
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
  # The seeds where a configuration diverged or fell back to the trivial
  # score after leaving it (`benchmark_stats.fell_back`), full runs ...
  unstable: dict[Config, set[int]] = dataclasses.field(default_factory=dict)
  # ... and first-rung runs.
  early_unstable: set[Config] = dataclasses.field(default_factory=set)
  # Selection seeds added where the best two were within their spread.
  extra_seeds: list[int] = dataclasses.field(default_factory=list)

  def ranked(self, seeds: Sequence[int]) -> list[Config]:
    """The configurations run on all `seeds`, best first: every stable one
    (on all `seeds`) before any that diverged or fell back; then by the
    criterion; ties in grid order (the order tried)."""
    full = [c for c, by in self.tried.items() if all(s in by for s in seeds)]
    return sorted(
        full,
        key=lambda c: (
            bool(self.unstable.get(c, set()) & set(seeds)),
            stats.criterion([self.tried[c][s] for s in seeds]),
        ),
    )


def _values(choice: Choice, axis: str) -> list[float]:
  return sorted(
      {c.get(axis, choice.method) for c in (*choice.tried, *choice.early)}
  )


def _axes(choice: Choice) -> tuple[str, ...]:
  """The axes tuned: the knob, the client learning rate, and the server
  learning rate and line knobs where more than one value was tried."""
  axes = (('value',) if choice.method.knob else ()) + ('lr',)
  for axis in ('slr', *(line.name for line in choice.method.lines)):
    if len(_values(choice, axis)) > 1:
      axes += (axis,)
  return axes


_AXIS_NAMES = {'lr': 'learning_rate', 'slr': 'server_learning_rate'}


def _edge_moves(choice: Choice, lr_low: float) -> list[tuple[str, Config]]:
  """New configurations one step past the chosen values at grid edges."""
  method, best, moves = choice.method, choice.best, []
  for axis in _axes(choice):
    if axis not in ('value', 'lr', 'slr'):
      continue  # A line's values are declared; its edge is marked.
    values = _values(choice, axis)
    current = best.get(axis, method)
    for edge, at in (('low', values[0]), ('high', values[-1])):
      if current != at:
        continue
      low, high = (
          (method.low, method.high) if axis == 'value' else (lr_low, None)
      )
      new = stats.next_value(values, edge, low=low, high=high)
      if new is not None:
        moves.append((axis, best.with_value(axis, new, method)))
  return moves


def _edges(choice: Choice) -> tuple[str, ...]:
  """The knobs whose chosen value is at an edge of the values tried (a
  line knob at the end of its valid range is not: it cannot go further)."""
  out = []
  method = choice.method
  for axis in _axes(choice):
    values = _values(choice, axis)
    value = choice.best.get(axis, method)
    if len(values) < 2 or value not in (values[0], values[-1]):
      continue
    if axis not in ('value', 'lr', 'slr'):
      line = method.line(axis)
      if value in (line.bound_low, line.bound_high):
        continue
    out.append(_AXIS_NAMES.get(axis, method.knob if axis == 'value' else axis))
  return tuple(out)


def _ft_moves(
    best: Config, max_epochs: dict[float, int], double: bool = True
) -> set:
  """`(lr, epochs)` fine-tunings one step past the chosen edges (`double`:
  a choice at the most epochs tried doubles them)."""
  lrs = sorted(max_epochs)
  moves = set()
  for edge, at in (('low', lrs[0]), ('high', lrs[-1])):
    if best.lr == at and best.value > 0:
      new = stats.next_value(lrs, edge, low=0.0, high=None)
      if new is not None:
        moves.add((new, max_epochs[best.lr]))
  if double and best.value == max_epochs[best.lr]:
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
      max_extra_seeds: int = 2,
      reported_seeds: Sequence[int] = (),
  ):
    self.max_extensions = max_extensions
    self.max_extra_seeds = max_extra_seeds
    # Added selection seeds stay clear of these.
    self.reported_seeds = tuple(reported_seeds)
    self._trivial: dict[str, dict] = {}
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

  def trivial(self, phase: str) -> dict:
    """The trivial score's record for `phase`'s runs (`Runs.trivial`):
    `{'label', split: [accuracy per client]}`; `{}` where the runs object
    has none (tests)."""
    if phase not in self._trivial:
      method = self.methods[0]
      args = self._args(
          method, Config(None, self.budget.learning_rate), 0, phase
      )
      args = [
          a
          if not a.startswith('--experiment_name=')
          else f'--experiment_name=trivial_{phase}'
          for a in args
      ]
      get = getattr(self.runs, 'trivial', None)
      self._trivial[phase] = get(args, phase) if get else {}
    return self._trivial[phase]

  def trivial_mean(self, phase: str, split: str) -> Optional[float]:
    """The mean over clients of the trivial score on `split` (None:
    unknown, e.g. labels are sequences)."""
    scores = self.trivial(phase).get(split)
    if not scores:
      return None
    return float(sum(scores) / len(scores))

  def unstable(self, record: dict, phase: str) -> bool:
    """Whether a run diverged or its curve fell back to the trivial score
    after leaving it (`benchmark_stats.fell_back`)."""
    if record.get('diverged'):
      return True
    curves = record.get('curve') or {}
    split = next((s for s in ('personal/test', 'test') if s in curves), None)
    if split is None:
      return False
    trivial = self.trivial_mean(
        phase, 'validation' if phase == 'select' else 'test'
    )
    return stats.fell_back([p[1] for p in curves[split]], trivial)

  def _fine_tune(
      self,
      method,
      config,
      seeds,
      phase,
      progress,
      lrs,
      max_epochs,
      tag='',
      start='final',
  ) -> dict:
    """A baseline's fine-tuning of FedAvg's runs: seed -> record."""

    def one(seed):
      record = self.runs.fine_tune(
          self._args(method, config, seed, phase),
          lrs,
          max_epochs,
          self.budget.batch_size,
          tag=tag,
          start=start,
      )
      what = 'fine-tuning' if start == 'final' else 'local training'
      progress(
          f'{phase} {what} of FedAvg {config.describe(method)} seed '
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
    """Successive halving over the seeds, the edge extensions, then added
    seeds where the best two are within their spread."""
    choices, candidates = {}, {}
    for method in self.methods:
      if method.baseline:
        continue
      values = (
          self.grids.get(method.knob)
          or method.knob_grid(self.budget.learning_rate)
          if method.knob
          else (None,)
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
        new, more = self._line_step(choices, ranked, seed, None)
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
    self._add_seeds(choices, sel_seeds, progress)
    for choice in choices.values():
      choice.edges = _edges(choice)
    return choices

  def extra_seed_values(self, sel_seeds) -> list[int]:
    """The seeds `_add_seeds` may add: after the selection seeds, clear of
    the reported ones."""
    out, seed = [], max(sel_seeds)
    taken = set(sel_seeds) | set(self.reported_seeds)
    while len(out) < self.max_extra_seeds:
      seed += 1
      if seed not in taken:
        out.append(seed)
    return out

  def _add_seeds(self, choices, sel_seeds, progress) -> None:
    """Where a method's best two configurations (both stable) differ in
    mean worst10 by less than the larger std over the seeds
    (`benchmark_stats.within_spread`), both run on one more selection seed,
    up to `max_extra_seeds`; the best over all their seeds is chosen."""
    extra = self.extra_seed_values(sel_seeds)
    for seed in extra:
      pairs = {}
      for name, choice in choices.items():
        seeds = list(sel_seeds) + choice.extra_seeds
        if len(choice.extra_seeds) != extra.index(seed):
          continue
        ranked = choice.ranked(seeds)
        if len(ranked) < 2 or any(
            choice.unstable.get(c, set()) & set(seeds) for c in ranked[:2]
        ):
          continue
        first, second = (
            [choice.tried[c][s] for s in seeds] for c in ranked[:2]
        )
        if stats.within_spread(first, second):
          pairs[name] = ranked[:2]
      if not pairs:
        return
      groups = []
      for name, configs in pairs.items():
        groups += self._jobs(choices[name].method, configs, [seed], 'select')
      self._collect(choices, self._execute(groups, progress))
      for name in pairs:
        choice = choices[name]
        choice.extra_seeds.append(seed)
        choice.best = choice.ranked(list(sel_seeds) + choice.extra_seeds)[0]

  def _first_rung(self, choices, candidates, sel_seeds, progress) -> dict:
    """Every configuration for `budget.first_rung` rounds on the first
    selection seed; the best `KEEP` go on (their runs continue to the full
    rounds in the same folders), and so does each client learning rate's
    best configuration, so that a rate that starts slowly is still
    compared at full length. Returns the configurations that go on."""
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
    new, groups = self._line_step(choices, ranked, seed, rounds)
    self._collect_early(choices, self._execute(groups, progress))
    out = {}
    for name, configs in candidates.items():
      configs = configs + new.get(name, [])
      choices[name].rungs[-1] = len(configs)
      ranked = self._early_ranked(choices[name], configs)
      keep = stats.top_fraction(ranked, KEEP)
      for lr in sorted({c.lr for c in ranked}):
        best = next(c for c in ranked if c.lr == lr)
        if best not in keep:
          keep.append(best)
      out[name] = keep
    return out

  @staticmethod
  def _early_ranked(choice: Choice, configs) -> list[Config]:
    return sorted(
        configs,
        key=lambda c: (
            c in choice.early_unstable,
            stats.criterion([choice.early[c]]),
        ),
    )

  def _collect_early(self, choices, records) -> None:
    for (name, config, _), record in records.items():
      split = 'personal/test' if name in PERSONAL else 'test'
      choices[name].early[config] = run_stats(record, split)
      if self.unstable(record, 'select'):
        choices[name].early_unstable.add(config)

  def _lines(self, method: Method) -> list[tuple[str, tuple[float, ...]]]:
    """The knobs `method` tunes along lines: `(axis, values)`."""
    out = []
    if self.budget.tune_server_lr and method.server_lr:
      out.append(('slr', tuple(self.grids['server_learning_rate'])))
    for line in method.lines:
      out.append((line.name, tuple(self.grids.get(line.name, line.grid))))
    return out

  def _line_step(self, choices, ranked, seed, rounds):
    """The lines: each method's best configuration of `ranked` at the other
    values of each line knob (the server learning rate where the budget
    tunes it, the algorithm's declared lines), on `seed` for `rounds` (None:
    the full rounds). Returns the new configurations by method and their run
    groups."""
    new, groups = {}, []
    for name, configs in ranked.items():
      method = choices[name].method
      if not configs:
        continue
      best = configs[0]
      for axis, values in self._lines(method):
        current = best.get(axis, method)
        new.setdefault(name, []).extend(
            best.with_value(axis, v, method) for v in values if v != current
        )
      if new.get(name):
        groups += self._jobs(method, new[name], [seed], 'select', rounds)
    return new, groups

  def _collect(self, choices, records):
    for (name, config, seed), record in records.items():
      method = choices[name].method
      split = 'personal/test' if method.name in PERSONAL else 'test'
      choices[name].tried.setdefault(config, {})[seed] = run_stats(
          record, split
      )
      if self.unstable(record, 'select'):
        choices[name].unstable.setdefault(config, set()).add(seed)
      curve = record.get('curve', {}).get(split)
      if curve:
        choices[name].curves.setdefault(config, {})[seed] = curve

  def select_fine_tuning(self, fedavg: Choice, sel_seeds, progress):
    """The baselines' (learning rate, epochs) on FedAvg's selection runs.

    FedAvg + fine-tuning starts from the final model saved with each
    selection record, local training from the runs' initial model; each is
    selected apart. Epochs 0 (none) to `budget.fine_tune_epochs` (local
    training: to `budget.local_epochs_max`, at least 100, so that it trains
    to its plateau) at each rate of the grid; a choice at the grid's edge
    (the smallest or largest rate; for fine-tuning, the most epochs)
    fine-tunes again one step past it (a rate one grid step further, or
    twice the epochs), up to `max_extensions` times; one still at an edge
    is marked. A fine-tuning whose model at 0 epochs evaluates otherwise
    than FedAvg's record is refused (`check_start`).
    """
    out = {}
    for name, start in BASELINES.items():
      if not any(m.name == name for m in self.methods):
        continue
      out[name] = self._select_baseline(
          name, start, fedavg, sel_seeds, progress
      )
    return out

  def _baseline_epochs(self, start: str) -> int:
    if start == 'initial':
      return self.budget.local_epochs_max
    return self.budget.fine_tune_epochs

  def _select_baseline(self, name, start, fedavg, sel_seeds, progress):
    tried, max_epochs = {}, {}  # lr -> the most epochs tried at it

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
          start=start,
      )
      if start == 'final':
        for seed, record in records.items():
          self.check_start(
              fedavg.method, fedavg.best, seed, 'select', record, 'validation'
          )
      for lr in lrs:
        max_epochs[lr] = max(max_epochs.get(lr, 0), epochs)
        for e in range(epochs + 1):
          tried[Config(e, lr)] = {
              seed: fine_tuned_stats(r, start, 'validation', lr, e)
              for seed, r in records.items()
          }

    fine_tune(
        list(self.grids['fine_tune_learning_rate']),
        self._baseline_epochs(start),
        '',
    )
    method = Method(name, '', 'fine_tune_epochs', low=0.0)
    choice = Choice(method, tried, rungs=[len(tried)])
    choice.best = choice.ranked(sel_seeds)[0]
    double = start == 'final'
    for _ in range(self.max_extensions):
      moves = _ft_moves(choice.best, max_epochs, double=double)
      if not moves:
        break
      for lr, epochs in sorted(moves):
        fine_tune([lr], epochs, f'_lr{lr:g}_e{epochs}')
      choice.extensions += 1
      choice.best = choice.ranked(sel_seeds)[0]
    choice.edges = _ft_edges(choice.best, max_epochs)
    choice.rungs = [len(choice.tried)]
    return choice

  def check_start(self, method, config, seed, phase, ft_record, split):
    """Refuses a fine-tuning whose starting model (0 epochs) evaluates
    otherwise than the FedAvg record it was saved with (`RuntimeError`)."""
    name = run_name(phase, method, config, seed)
    record = self.runs.used.get(name) if hasattr(self.runs, 'used') else None
    if not record or record.get('diverged'):
      return
    lr = next(iter(ft_record['splits']['final'][split]))
    moved = start_offset(
        record['splits']['test'],
        ft_record['splits']['final'][split][lr][0],
    )
    if moved[0]:
      raise RuntimeError(
          f'the model saved with {name} evaluates otherwise than its record '
          f'({moved[0]} clients differ, by up to {moved[1]:.2f} points); '
          'refusing to fine-tune it (remove the record and its model to run '
          'it again)'
      )

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
                'unstable': self.unstable(record, 'final'),
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
    for name, choice in ft_choices.items():
      start, best = BASELINES[name], choice.best
      fine_tunings = self._fine_tune(
          fedavg.method,
          fedavg.best,
          seeds,
          'final',
          progress,
          [best.lr],
          int(best.value),
          start=start,
      )
      for seed_index, seed in enumerate(seeds):
        ft = fine_tunings[seed]
        base = results['fedavg'][seed_index]
        lr = best.lr
        if start == 'final':
          self.check_start(
              fedavg.method, fedavg.best, seed, 'final', ft, 'test'
          )
          base['ft_start'] = start_offset(
              base['splits']['test'], fine_tuned(ft, start, 'test', lr, 0)
          )
          if 'unseen' in ft['splits'][start]:
            base['splits']['unseen_half'] = fine_tuned(
                ft, start, 'unseen', lr, 0
            )
        splits = {'test': fine_tuned(ft, start, 'test', lr, best.value)}
        if 'unseen' in ft['splits'][start]:
          splits['unseen_half'] = fine_tuned(
              ft, start, 'unseen', lr, best.value
          )
        tuned = int(best.value * ft['train_examples']['test'])
        results.setdefault(name, []).append(
            {
                'splits': splits,
                'examples': tuned
                + (base['examples'] if start == 'final' else 0),
                'wall_s': (base['wall_s'] if start == 'final' else 0.0)
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
      local_epochs_max=pick('local_epochs_max', b.local_epochs_max),
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
      'local_epochs_max',
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
  """The grids: declared, then `--grid` overrides (checked: each knob once,
  and only a knob of a method that runs)."""
  grids = {
      'learning_rate': log_grid(budget.learning_rate, LR_STEPS),
      'fine_tune_learning_rate': log_grid(budget.learning_rate, FT_LR_STEPS),
      'server_learning_rate': log_grid(1.0, SERVER_LR_STEPS),
  }
  # knob -> (low, high, low included), and the methods that tune it.
  ranges = {
      'learning_rate': (0.0, None, False),
      'fine_tune_learning_rate': (0.0, None, False),
      'server_learning_rate': (0.0, None, False),
  }
  owners: dict[str, set[str]] = {'fine_tune_learning_rate': set(BASELINES)}
  for m in methods():
    if m.knob:
      grids.setdefault(m.knob, m.knob_grid(budget.learning_rate))
      ranges[m.knob] = (m.low, m.high, False)
      owners.setdefault(m.knob, set()).add(m.name)
    for line in m.lines:
      grids.setdefault(line.name, line.grid)
      ranges[line.name] = (line.bound_low, line.bound_high, True)
      owners.setdefault(line.name, set()).add(m.name)
  running = {m.name for m in methods_run}
  seen = set()
  for item in FLAGS.grid:
    knob, _, text = item.partition(':')
    if knob not in ranges:
      raise UsageError(
          f'--grid={item}: unknown knob {knob!r}; choose among '
          f'{", ".join(sorted(ranges))}'
      )
    if knob in seen:
      raise UsageError(f'--grid={item}: {knob} is given twice; give it once')
    seen.add(knob)
    if knob in owners and not owners[knob] & running:
      raise UsageError(
          f'--grid={item}: {knob} is tuned by '
          f'{", ".join(sorted(owners[knob]))}, none of which runs'
      )
    try:
      values = tuple(float(v) for v in text.split(','))
    except ValueError:
      raise UsageError(
          f'--grid={item}: values must be numbers, as knob:v1,v2,...'
      ) from None
    low, high, included = ranges[knob]
    bad = [
        v
        for v in values
        if not math.isfinite(v)
        or (low is not None and (v < low if included else v <= low))
        or (high is not None and v > high)
    ]
    if bad or len(set(values)) != len(values):
      where = f'{">=" if included else ">"} {low:g}' + (
          f' and <= {high:g}' if high is not None else ''
      )
      raise UsageError(
          f'--grid={item}: values must be distinct, finite and {where}'
      )
    grids[knob] = tuple(sorted(values))
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
    if FLAGS.max_extra_seeds < 0:
      raise UsageError(
          f'--max_extra_seeds must be >= 0, got {FLAGS.max_extra_seeds}'
      )
    output_dir = FLAGS.output_dir or os.path.join(
        'output', 'benchmark', setting.name
    )
    output_md = FLAGS.output_md or os.path.join(output_dir, 'benchmark.md')
    records_dir = FLAGS.records_dir or os.path.join(output_dir, 'records')
    run_dir.check_output_dir(output_dir, flag='--output_dir')
    if FLAGS.from_records:  # Only read: a read-only folder is fine.
      if not os.path.isdir(records_dir):
        raise UsageError(
            f'--records_dir={records_dir}: no such folder (--from_records '
            'reads the records, it makes none)'
        )
      if not os.access(records_dir, os.R_OK | os.X_OK):
        raise UsageError(f'--records_dir={records_dir}: cannot be read')
    else:
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
  if not FLAGS.from_records:
    os.makedirs(records_dir, exist_ok=True)
  os.makedirs(output_dir, exist_ok=True)
  root = os.path.join(output_dir, 'runs')
  origin = None if FLAGS.from_records else origin_lib.current(task_flags)
  runs = Runs(
      records_dir,
      output_dir,
      FLAGS.jobs,
      FLAGS.from_records,
      origin=origin,
      accept_foreign=FLAGS.accept_foreign_records,
  )
  bench = Benchmark(
      runs,
      task_flags,
      budget,
      methods_run,
      grids,
      FLAGS.data_seed,
      root,
      FLAGS.max_extensions,
      max_extra_seeds=FLAGS.max_extra_seeds,
      reported_seeds=seeds,
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
      origins=origin_lib.summary(runs.used.values()),
      trivial={
          phase: bench.trivial_mean(
              phase, 'validation' if phase == 'select' else 'test'
          )
          for phase in ('select', 'final')
      },
      placeholders=_placeholders(output_dir, task_flags),
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


def _placeholders(output_dir: str, task_flags) -> list[tuple[str, str]]:
  """Absolute machine folders the page prints as placeholders (the longest
  first: the data folder may lie in the output folder)."""
  out = []
  for arg in task_flags:
    if arg.startswith('--data_dir=') or arg.startswith('--leaf_dir='):
      flag, folder = arg[2:].split('=', 1)
      out.append((os.path.abspath(folder), f'<{flag}>'))
  out.append((os.path.abspath(output_dir), '<output_dir>'))
  return sorted(out, key=lambda p: -len(p[0]))


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
