# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The tail benchmark's settings: its methods, budgets and named settings.

`methods()` reads each algorithm's tuned knobs (`TunedOption`, joint and
lines) from `tff_algos.registry`; `Budget` is what every method gets;
`SETTINGS` names the task flags and budget of each setting
(`run.tail_benchmark.benchmark`'s docstring describes the benchmark).
"""

import dataclasses
from collections.abc import Sequence
from typing import Any, Optional


from run.tail_benchmark import stats
from tff_algos import registry

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


# The run-wide client weightings (`--client_weighting`), the default first:
# by examples (FedAvg's experiments) or uniform (its algorithm box).
WEIGHTINGS = ('num_examples', 'uniform')


# Task flags of the stacked engine alone, dropped from the other engines'
# runs (the batched engine runs a round's clients one after another).
STACKED_ONLY_FLAGS = ('--stacked_size_groups', '--nostacked_size_groups')


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
  def run_weighting(self) -> bool:
    """Its mean follows the run's client weighting (tuned where the budget
    says so); the others weigh their clients by their own rule."""
    return not self.baseline and not registry.get(self.name).own_weighting

  @property
  def uniform_option(self) -> str:
    """The option that makes its own rule weigh clients uniformly (empty:
    none, or it follows the run's weighting)."""
    return '' if self.baseline else registry.get(self.name).uniform_option

  @property
  def tunes_weighting(self) -> bool:
    """Its client weighting has a switch: the run's or its own option."""
    return self.run_weighting or bool(self.uniform_option)

  def weighting_flags(self, weighting: str) -> list[str]:
    """The flags that weigh its clients by `weighting` (of `WEIGHTINGS`;
    the default, by examples, has none)."""
    if weighting == WEIGHTINGS[0]:
      return []
    if not self.tunes_weighting or weighting != 'uniform':
      raise ValueError(f'{self.name} has no {weighting} client weighting')
    if self.run_weighting:
      return [f'--client_weighting={weighting}']
    return [f'--{self.uniform_option}=true']

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

  def knob_flags(self, config: Any) -> list[str]:  # A selection Config.
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
  # The client weighting (`WEIGHTINGS`) is tuned along a line, as the server
  # learning rate, for the algorithms whose mean follows it
  # (`Method.run_weighting`); else it stays by examples.
  tune_client_weighting: bool = False
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


def methods() -> tuple[Method, ...]:
  """The registered algorithms the benchmark runs (`Algorithm.in_benchmark`,
  in the registry's order, with their labels), then the two baselines.

  Each knob, its grid (5 log-spaced values) and its range come from the
  algorithm's `TunedOption` in `tff_algos.registry`, its line knobs from its
  `lines`; a grid extends up to `high` only where the option allows it (else
  its last value is the top). An algorithm registered from outside the
  package (`registry.register`) enters the benchmark the same way.
  """
  out = []
  for name in registry.names():
    entry = registry.get(name)
    if not entry.in_benchmark:
      continue
    label = entry.label or name
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
  title: str = ''  # Its name in summaries (default: `name`).
  # TFF's dataset files its task reads from --data_dir (`tasks.data_files`
  # names), fetched only with --download.
  tff_files: tuple[str, ...] = ()
  # The training clients its task gives, for `--plan` where no record
  # counts them (0: unknown).
  training_clients: int = 0


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
            tune_client_weighting=True,
        ),
        'Synthetic(1,1) with 100 devices (the thesis: 30 to 100), 50 training '
        'and 50 unseen; 800 rounds of 10 devices (where FedAvg plateaus), one '
        'epoch, batch 10, learning rates around 0.1 (the thesis: 0.01 to 0.1, '
        'thousands of rounds)',
        title='Synthetic(1,1)',
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
            tune_client_weighting=True,
        ),
        'a seeded 200 of the 1,038 eligible roles (100 training, 100 '
        "unseen), each role's first 1,000 windows, GRU 64 (the paper: GRU "
        '128, all roles, all windows), 10 roles per round, 300 rounds (the '
        'paper: 100 per round, 600 rounds), one epoch, batch 16, learning '
        "rates around 1 (the authors' code: 0.1 halved every 200 rounds; "
        'the paper gives none)',
        shakespeare_data=True,
        title='Shakespeare, real roles',
    ),
    # The Delta-FL EMNIST ConvNet experiment (Laguel, Pillutla, Malick and
    # Harchaoui, "Device Heterogeneity in Federated Learning: A Superquantile
    # Approach", App. C; spec fedplus_deltafl.md B.11 and X.1): writers with
    # at least 100 images, a seeded 1,730 of them (the paper: a random half
    # of LEAF's, 1,730), half training and half unseen (865 / 865); the
    # ConvNet (conv 32 5x5, pool, conv 64 5x5, pool, dense 62; the authors'
    # code); 1,000 rounds of 100 writers, one epoch, batch 16, learning
    # rates around 0.32 (the authors' script, which halves it every 400
    # rounds: constant here, as in the other settings). No run of it yet: no
    # first rung or evaluation period was measured; a quarter of the rounds
    # and a tenth, as in the other two.
    'emnist': Setting(
        'emnist',
        (
            '--task=emnist_character',
            '--emnist_model=convnet',
            '--min_examples=100',
            '--max_clients=1730',
            '--test_clients_fraction=0.5',
            '--stacked_size_groups',
        ),
        Budget(
            rounds=1000,
            clients_per_round=100,
            local_epochs=1,
            batch_size=16,
            learning_rate=0.32,
            first_rung=250,
            eval_every=100,
            tune_server_lr=True,
            tune_client_weighting=True,
        ),
        "TFF's federated EMNIST-62 (emnist_all.sqlite) in the Delta-FL "
        "paper's EMNIST ConvNet setup (Laguel et al., App. C): writers with "
        'at least 100 images, a seeded 1,730 of them, 865 training and 865 '
        'unseen; the ConvNet (conv 32 5x5, pool, conv 64 5x5, pool, dense '
        '62); 1,000 rounds of 100 writers, one epoch, batch 16, learning '
        "rates around 0.32 (the authors' script: 0.32 halved every 400 "
        'rounds; constant here)',
        title='EMNIST, Delta-FL ConvNet',
        tff_files=('emnist_all.sqlite',),
        training_clients=865,
    ),
    # TFF's StackOverflow next-word baseline (Reddi et al., "Adaptive
    # Federated Optimization", ICLR 2021; google-research/federated
    # optimization/: 10,000 words, sequences of 20, embedding 96, LSTM 670,
    # at most 1,000 sentences a user, 50 users a round, 1,500 rounds, one
    # epoch, batch 16; FedAvg's best client rate 10^-0.5 at server rate 1).
    # Its evaluation samples 10,000 held-out sentences; a tail benchmark
    # evaluates every client, so the population is ours: a seeded 1,000 of
    # the users with at least 100 sentences, half training and half unseen.
    # The stacked engine runs no sequence labels: every method on the
    # batched one.
    'stackoverflow': Setting(
        'stackoverflow',
        (
            '--task=stackoverflow_word',
            '--min_examples=100',
            '--max_clients=1000',
            '--test_clients_fraction=0.5',
            '--max_examples_per_client=1000',
        ),
        Budget(
            rounds=1500,
            clients_per_round=50,
            local_epochs=1,
            batch_size=16,
            learning_rate=0.32,
            first_rung=375,
            eval_every=150,
            tune_server_lr=True,
            tune_client_weighting=True,
            on_batched=STACKED,
        ),
        "TFF's StackOverflow next-word prediction (stackoverflow.sqlite and "
        "its word counts) with TFF's baseline model and budget (Reddi et "
        'al., ICLR 2021; google-research/federated): 10,000 words, '
        "sequences of 20, embedding 96, LSTM 670, each user's first 1,000 "
        'sentences, 1,500 rounds of 50 users, one epoch, batch 16, learning '
        "rates around 0.32 (the baseline's FedAvg rate, 10^-0.5); a seeded "
        '1,000 of the users with at least 100 sentences, 500 training and '
        '500 unseen (the baseline trains on all 342,477 users and evaluates '
        '10,000 held-out sentences; a tail benchmark evaluates every client)',
        title='StackOverflow next word',
        tff_files=('stackoverflow.sqlite', 'stackoverflow.word_count'),
        training_clients=500,
    ),
    # The Delta-FL Shakespeare experiment at the paper's scale (App. C:
    # every role with at least 100 windows, half training, half unseen,
    # GRU 128, 600 rounds of 100 roles, one epoch, batch 16), for
    # `--plan`'s projection; the 'shakespeare' setting is its scale-down.
    # Learning rates around 1, the scale-down's measured operating point
    # (the authors' code: 0.1 halved every 200 rounds).
    'shakespeare_paper': Setting(
        'shakespeare_paper',
        (
            '--task=shakespeare_leaf',
            '--shakespeare_preset=deltafl',
            '--stacked_size_groups',
        ),
        Budget(
            rounds=600,
            clients_per_round=100,
            local_epochs=1,
            batch_size=16,
            learning_rate=1.0,
            first_rung=150,
            eval_every=60,
            tune_server_lr=True,
            tune_client_weighting=True,
        ),
        "the Delta-FL paper's Shakespeare scale (Laguel et al., App. C): "
        'all 1,038 eligible roles (519 training, 519 unseen), every window, '
        'GRU 128, 100 roles per round, 600 rounds, one epoch, batch 16, '
        "learning rates around 1 (the 'shakespeare' setting's operating "
        "point; the authors' code: 0.1 halved every 200 rounds)",
        shakespeare_data=True,
        title='Shakespeare, real roles, paper scale',
        training_clients=519,
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
