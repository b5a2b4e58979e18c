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
  tff-hetero-benchmark --setting=emnist --data_dir=$HOME/.tff --download \
      --jobs=8 --plan --calibrate_rounds=20

Settings (`settings.SETTINGS`): `synthetic`, `shakespeare` (a scale-down of
the Delta-FL Shakespeare experiment), `shakespeare_paper` (its full scale),
`emnist` (the Delta-FL EMNIST ConvNet experiment on TFF's
`emnist_all.sqlite`), `stackoverflow` (TFF's next-word baseline on its
`stackoverflow.sqlite`) and `custom`. `emnist` and `stackoverflow` read
TFF's files from `--data_dir` and fetch them only with `--download`; a
missing or damaged file is one error line before any run.

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
   on. A configuration that diverged, fell back to the trivial score or
   collapsed below it (`stats.fell_back`) ranks below every stable one;
   where the best two are within their spread, more selection seeds decide
   (`--max_extra_seeds`). The criterion is the validation
   worst-10% accuracy as a superquantile (continuous); where it ties, the
   worst 20%, 30%, 50%, then the mean accuracy, and the superquantile of
   the loss last (`stats.criterion`; personal models
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
   `stats.client_stats`, mean (std) over seeds; paired per-seed
   differences against FedAvg with their 95% half-width; each statistic's
   resolution (one example, one client); examples processed and wall time
   per run; the selection's compute beside the report's.

Every run leaves a compact record (`--records_dir`: its arguments, per-client
accuracy, loss and examples for every split, examples processed, wall time,
and its origin, `origin`): a run whose record exists with its
arguments and origin (or any origin, `--accept_foreign_records`) is not run
again, so the same
command continues a stopped benchmark on any machine that has the records,
and `--from_records` rebuilds the page from them alone. Runs execute in
`--jobs` long-lived worker processes (`pool`), or as `--jobs` actors of
the Ray cluster at `--ray_address` (`ray_pool`, docs/deployment.md). A signal
ends the running runs and their TFF workers (`processes`).
"""

import dataclasses
import json
import math
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Optional

if not (3, 9) <= sys.version_info[:2] <= (3, 11):
  sys.exit('error: needs Python 3.9, 3.10 or 3.11 (TFF 0.87)')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags

from run import atomic
from run import console
from run import run_dir
from run.tail_benchmark import origin as origin_lib
from run.tail_benchmark import page as benchmark_page
from run.tail_benchmark import plan
from run.tail_benchmark import processes
from run.tail_benchmark import ray_pool
from run.tail_benchmark import records as bench_records
from run.tail_benchmark import rerun
from run.tail_benchmark import selection as bench_selection
from run.tail_benchmark import settings as bench_settings

# pylint: enable=g-import-not-at-top,wrong-import-position


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


FLAGS = flags.FLAGS


def define_flags(flag_values: Optional[flags.FlagValues] = None) -> None:
  """The binary's flags, in `flag_values` (default absl's global ones, at
  start-up only: absl flags are global)."""
  values = flags.FLAGS if flag_values is None else flag_values

  def define(kind: str, *args, **kwargs) -> None:
    getattr(flags, f'DEFINE_{kind}')(*args, flag_values=values, **kwargs)

  define(
      'enum',
      'setting',
      'shakespeare',
      list(bench_settings.SETTINGS),
      "Task and budget; task flags after -- replace the setting's task.",
  )
  define(
      'list',
      'algorithms',
      [],
      'Algorithms to run (default all; FedAvg is always run: the '
      'baseline of the paired differences and of fedavg_ft and local).',
  )
  define('list', 'seeds', ['0', '1', '2', '3', '4'], 'Reported seeds.')
  define(
      'list',
      'selection_seeds',
      ['100', '101'],
      'Seeds of the selection runs (disjoint from --seeds), one rung of the '
      'successive halving each.',
  )
  define(
      'integer',
      'data_seed',
      0,
      'Seed of the data (clients, unseen clients, per-client parts): the '
      'same for every run.',
  )
  define(
      'multi_string',
      'grid',
      [],
      "A knob's grid, e.g. --grid=tilt:0.1,1,10 (repeatable); the knobs "
      'learning_rate (all algorithms) and fine_tune_learning_rate (the '
      'baselines) too.',
  )
  define(
      'integer',
      'max_extensions',
      2,
      'How many times a choice at an edge of its grid extends it.',
  )
  define('integer', 'rounds', None, "Override the setting's rounds.")
  define(
      'integer',
      'clients_per_round',
      None,
      "Override the setting's clients per round.",
  )
  define(
      'integer', 'local_epochs', None, "Override the setting's local epochs."
  )
  define('integer', 'batch_size', None, "Override the setting's batch.")
  define(
      'float',
      'learning_rate',
      None,
      "Override the setting's learning rate (the centre of the grid).",
  )
  define(
      'integer',
      'fine_tune_epochs',
      None,
      "Override the setting's most fine-tuning epochs of the baselines.",
  )
  define(
      'integer',
      'local_epochs_max',
      None,
      "Override the setting's most epochs of the local-training baseline "
      '(0 to this, selected on validation; default 128).',
  )
  define(
      'integer',
      'max_extra_seeds',
      2,
      "Selection seeds added where a method's best two configurations "
      'differ by less than their spread over the seeds (each seed after '
      '--selection_seeds, clear of --seeds).',
  )
  define(
      'boolean',
      'accept_foreign_records',
      False,
      'Reuse records made by other code, data or library versions than '
      "this machine's (the page lists every origin); by default such a "
      'record is run again.',
  )
  define(
      'integer',
      'first_rung',
      None,
      "Override the setting's first rung: every configuration trains this "
      'many rounds on the first selection seed before the best third goes '
      'on to --rounds (0: no such rung).',
  )
  define(
      'bool',
      'tune_server_lr',
      None,
      "Override the setting's choice: tune the server learning rate of the "
      'algorithms with a server optimizer (their best configuration of the '
      'first rung at the other rates of its grid, --grid='
      'server_learning_rate:...), or keep it at 1.',
  )
  define(
      'bool',
      'tune_client_weighting',
      None,
      "Override the setting's choice: tune the client weighting (by examples "
      'or uniform) of the algorithms whose mean follows --client_weighting '
      "or that have their own switch (Delta-FL's --uniform_weights): their "
      'best configuration of the first rung again with uniform weights; or '
      'keep it by examples.',
  )
  define(
      'integer',
      'eval_every',
      None,
      "Override the setting's evaluation period in rounds (each record's "
      'curve; 0: at the end only).',
  )
  define(
      'string',
      'output_dir',
      None,
      'Where the runs and results go (default output/benchmark/<setting>).',
  )
  define(
      'string',
      'records_dir',
      None,
      "Where each run's compact record goes (default <output_dir>/records); "
      'the published pages keep theirs in docs/results/runs/<setting>.',
  )
  define(
      'boolean',
      'from_records',
      False,
      'Build the page from --records_dir alone; run nothing (an error names '
      'the first missing record).',
  )
  define(
      'string',
      'output_md',
      None,
      'The results page (default <output_dir>/benchmark.md); the pictures '
      'are written beside it.',
  )
  define(
      'string',
      'bound_json',
      None,
      "A `run.benchmarks.bench_suite --output_json` of the setting's model "
      "and cohort (one model, with fedavg/bound): the page's time table "
      "gives each algorithm's training examples/s as a fraction of that "
      'bound.',
  )
  define(
      'string',
      'data_dir',
      None,
      'shakespeare settings: the folder of shakespeare.sqlite (built from '
      'the installed plays if missing; default <output_dir>/data); emnist '
      "and stackoverflow: the folder of TFF's files (emnist_all.sqlite; "
      'stackoverflow.sqlite and stackoverflow.word_count), fetched only '
      "with --download (default TFF's cache, ~/.tff).",
  )
  define(
      'boolean',
      'download',
      False,
      "emnist and stackoverflow settings: fetch the setting's missing TFF "
      "files into --data_dir from TFF's bucket before any run "
      '(tasks/download.py: verified, resumable); without it a missing file '
      'is an error.',
  )
  define('integer', 'jobs', 1, 'Runs at the same time (processes).')
  define(
      'string',
      'ray_address',
      None,
      'Run the runs on the Ray cluster at this address (auto: the cluster '
      'this machine belongs to; HOST:PORT: its head) as --jobs actors, not '
      'in local processes; records come back here. Needs pip install '
      "'tff-hetero[ray]'; --output_dir and --data_dir must be usable on "
      'every node.',
  )
  define(
      'boolean',
      'plan',
      False,
      'Print the runs each stage of the selection and the report will '
      'make (a range where results decide) and their projected CPU hours '
      'from the records in --records_dir; run nothing (but the calibration '
      'runs of --calibrate_rounds).',
  )
  define(
      'integer',
      'calibrate_rounds',
      0,
      'With --plan: each method with no record in --records_dir is costed '
      'on this machine by the second of two runs of this many rounds in one '
      'worker (its start-up, seconds per round and per evaluation), in '
      '<output_dir>/calibration; 0: records only; 20 or more is steadier.',
  )
  define(
      'list',
      'plan_costs',
      [],
      'With --plan: stated costs, METHOD:SECONDS,... (e.g. fedavg:2.5,'
      'local:40): seconds per round of a method, per epoch (every training '
      "client at one rate) of a baseline; before the records' and any "
      'calibration.',
  )
  define(
      'string',
      'cost_ratios_from',
      None,
      'With --plan: a method without a stated or recorded cost costs '
      "FedAvg's seconds per round times its ratio to FedAvg's over the "
      "records in this folder (e.g. another setting's); before any "
      'calibration, which then measures FedAvg alone.',
  )
  define(
      'list',
      'rerun',
      [],
      'Instead of the benchmark: run these records of --records_dir again '
      '(names without .json, e.g. select_fedavg_lr0.1_seed100, or a '
      "baseline's fine-tuning final_fedavg_lr0.1_seed0_ftfinal) from their "
      'own arguments, in a new folder <output_dir>/rerun/<time>, and compare '
      'every per-client value, curve point and example count with the '
      'record (exit 1 if any differs).',
  )


class UsageError(ValueError):
  """Bad flags: one line, exit 2."""


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


# The budget's fields a flag of the same name overrides.
BUDGET_FLAGS = (
    'rounds',
    'clients_per_round',
    'local_epochs',
    'batch_size',
    'learning_rate',
    'fine_tune_epochs',
    'first_rung',
    'eval_every',
    'tune_server_lr',
    'local_epochs_max',
    'tune_client_weighting',
)


def _budget(setting: bench_settings.Setting) -> bench_settings.Budget:
  b = setting.budget

  # The setting's budget, with the fields its flags override (a field
  # without a flag keeps the setting's value).
  budget = dataclasses.replace(
      b,
      **{
          name: getattr(FLAGS, name)
          for name in BUDGET_FLAGS
          if getattr(FLAGS, name) is not None
      },
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


def _grids(
    budget: bench_settings.Budget, methods_run: Sequence[bench_settings.Method]
) -> dict:
  """The grids: declared, then `--grid` overrides (checked: each knob once,
  and only a knob of a method that runs)."""
  grids = {
      'learning_rate': bench_settings.log_grid(
          budget.learning_rate, bench_settings.LR_STEPS
      ),
      'fine_tune_learning_rate': bench_settings.log_grid(
          budget.learning_rate, bench_settings.FT_LR_STEPS
      ),
      'server_learning_rate': bench_settings.log_grid(
          1.0, bench_settings.SERVER_LR_STEPS
      ),
  }
  # knob -> (low, high, low included), and the methods that tune it.
  ranges = {
      'learning_rate': (0.0, None, False),
      'fine_tune_learning_rate': (0.0, None, False),
      'server_learning_rate': (0.0, None, False),
  }
  owners: dict[str, set[str]] = {
      'fine_tune_learning_rate': set(bench_settings.BASELINES)
  }
  for m in bench_settings.methods():
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


def _task_flags(setting: bench_settings.Setting, extra: list[str]) -> list[str]:
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


def _methods() -> list[bench_settings.Method]:
  every = bench_settings.methods()
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


# The splits of TFF's SQLite files that the settings read (checked before
# any run: a damaged or incomplete file is one line).
_SQLITE_SPLITS = {
    'emnist_all.sqlite': ['all_train', 'all_test'],
    'stackoverflow.sqlite': ['train', 'test'],
}


def _tff_data_dir(task_flags: Sequence[str]) -> str:
  """The folder of TFF's files: the task flags' `--data_dir`, the
  benchmark's, or TFF's cache (`~/.tff`); one of them only."""
  from tasks import data_files  # pylint: disable=g-import-not-at-top

  given = [
      f.split('=', 1)[1] for f in task_flags if f.startswith('--data_dir=')
  ]
  if given and FLAGS.data_dir and given[-1] != FLAGS.data_dir:
    raise UsageError(
        f"--data_dir={FLAGS.data_dir} and the task flags' "
        f'--data_dir={given[-1]} differ: give the folder once'
    )
  folder = given[-1] if given else FLAGS.data_dir
  return os.path.abspath(data_files.resolve_data_dir(folder))


def _with_tff_data(
    setting: bench_settings.Setting, task_flags: list[str], read: bool
) -> list[str]:
  """The task flags with the folder of the setting's TFF files: fetched
  where missing with `--download`, then checked where `read` (from records
  or for a plan only the folder's name is needed: the commands name it)."""
  from tasks import base  # pylint: disable=g-import-not-at-top
  from tasks import data_files  # pylint: disable=g-import-not-at-top
  from tasks import download  # pylint: disable=g-import-not-at-top

  folder = _tff_data_dir(task_flags)
  if not any(f.startswith('--data_dir=') for f in task_flags):
    task_flags = task_flags + [f'--data_dir={folder}']
  known = {f.name: f for files in download.DATASETS.values() for f in files}
  files = [known[name] for name in setting.tff_files]
  if FLAGS.download:
    try:
      download.ensure(files, folder)
    except base.TaskError as e:
      raise UsageError(str(e)) from None
  if not read:
    return task_flags
  for data_file in files:
    path = os.path.join(folder, data_file.name)
    if not os.path.isfile(path):
      raise UsageError(
          f'--setting={setting.name} reads {data_file.name} from '
          f'--data_dir={folder}, where it is missing: rerun with --download '
          f"to fetch TFF's files ({data_file.url}), or "
          f'`{data_file.instructions(folder)}`'
      )
    if data_file.name in _SQLITE_SPLITS:  # Damaged: one line, now.
      try:
        data_files.sql_example_counts(path, _SQLITE_SPLITS[data_file.name])
      except base.TaskError as e:
        raise UsageError(str(e)) from None
  return task_flags


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
    setting = bench_settings.SETTINGS[FLAGS.setting]
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
    if FLAGS.ray_address and not (FLAGS.plan or FLAGS.from_records):
      ray_pool.check_address(FLAGS.ray_address)
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
    if FLAGS.rerun and FLAGS.from_records:
      raise UsageError('--rerun runs records again: not with --from_records')
    if FLAGS.plan and (FLAGS.rerun or FLAGS.from_records):
      raise UsageError(
          '--plan runs nothing: not with --rerun or --from_records'
      )
    if FLAGS.calibrate_rounds and not FLAGS.plan:
      raise UsageError('--calibrate_rounds costs a plan: give --plan too')
    for name in ('plan_costs', 'cost_ratios_from'):
      if getattr(FLAGS, name) and not FLAGS.plan:
        raise UsageError(f'--{name} costs a plan: give --plan too')
    try:
      stated = plan.parse_costs(FLAGS.plan_costs, [m.name for m in methods_run])
    except ValueError as e:
      raise UsageError(str(e)) from None
    ratios = _cost_ratios(FLAGS.cost_ratios_from)
    if FLAGS.calibrate_rounds < 0:
      raise UsageError(
          f'--calibrate_rounds must be >= 0, got {FLAGS.calibrate_rounds}'
      )
    rerun_records = {
        name: rerun.load(records_dir, name) for name in FLAGS.rerun
    }
    if not FLAGS.rerun:
      processes.check_output_md(output_md)
    bound = read_bound(FLAGS.bound_json) if FLAGS.bound_json else None
    if setting.shakespeare_data and not argv[1:]:
      # From records nothing is built, but the commands printed still run.
      folder = _shakespeare_data(
          output_dir,
          FLAGS.data_dir,
          build=not (
              FLAGS.from_records or (FLAGS.plan and not FLAGS.calibrate_rounds)
          ),
      )
      task_flags = task_flags + [f'--data_dir={folder}']
    if FLAGS.download and not setting.tff_files:
      raise UsageError(
          f"--download fetches TFF's files of the emnist and stackoverflow "
          f'settings; --setting={setting.name} reads none'
      )
    if setting.tff_files:
      if FLAGS.download and FLAGS.from_records:
        raise UsageError('--from_records reads records: not with --download')
      task_flags = _with_tff_data(
          setting,
          task_flags,
          read=not (
              FLAGS.from_records or (FLAGS.plan and not FLAGS.calibrate_rounds)
          ),
      )
  except (
      UsageError,
      run_dir.OutputDirError,
      rerun.RerunError,
      ray_pool.RayUnavailable,
  ) as e:
    print(f'benchmark: error: {e}', file=sys.stderr)
    return 2
  if rerun_records:
    return _rerun(rerun_records, records_dir, output_dir, task_flags)
  if FLAGS.plan:
    return _plan(
        setting,
        budget,
        methods_run,
        grids,
        (sel_seeds, seeds),
        task_flags,
        (output_dir, records_dir),
        stated,
        ratios,
    )
  if not FLAGS.from_records:
    os.makedirs(records_dir, exist_ok=True)
  os.makedirs(output_dir, exist_ok=True)
  root = os.path.join(output_dir, 'runs')
  origin = None if FLAGS.from_records else origin_lib.current(task_flags)
  try:
    worker_type = ray_pool.worker_type(
        None if FLAGS.from_records else FLAGS.ray_address
    )
  except ray_pool.RayUnavailable as e:
    print(f'benchmark: error: {e}', file=sys.stderr)
    return 2
  if worker_type is ray_pool.RayRunWorker:
    print(
        f'benchmark: {ray_pool.describe(FLAGS.ray_address, FLAGS.jobs)}',
        file=sys.stderr,
        flush=True,
    )
  runs = bench_records.Runs(
      records_dir,
      output_dir,
      FLAGS.jobs,
      FLAGS.from_records,
      origin=origin,
      accept_foreign=FLAGS.accept_foreign_records,
      worker_type=worker_type,
  )
  bench = bench_selection.Benchmark(
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
  try:
    with processes.signals_stop():
      try:
        if not FLAGS.from_records:  # Task flags checked before any run.
          probe = bench._args(  # pylint: disable=protected-access
              methods_run[0],
              bench_selection.Config(None, budget.learning_rate),
              0,
              'select',
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
      except processes.Stopped as e:
        # Raised in the pool (which ended the running workers) or in this
        # thread, e.g. while a worker computed the trivial score: end them.
        runs.close()  # Before the process dies of the signal.
        return processes.exit_stopped(
            'benchmark',
            e,
            '; rerun the same command to resume (finished runs are kept)',
        )
      except (RuntimeError, bench_records.MissingRecord) as e:
        print(f'benchmark: error: {str(e).splitlines()[-1]}', file=sys.stderr)
        return 1
  finally:
    runs.close()
    ray_pool.disconnect()
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
      keep=bench_settings.KEEP,
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
      placeholders=_placeholders(output_dir, task_flags, runs.used.values()),
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


def _cost_ratios(folder: Optional[str]) -> dict[str, float]:
  """`--cost_ratios_from`: the seconds per round of its records' methods
  (`UsageError` if it has no FedAvg record)."""
  if not folder:
    return {}
  if not os.path.isdir(folder):
    raise UsageError(f'--cost_ratios_from={folder}: no such folder')
  costs = plan.seconds_per_round(folder)
  if 'fedavg' not in costs:
    raise UsageError(
        f'--cost_ratios_from={folder}: no FedAvg training record there '
        "(the ratios are to FedAvg's seconds per round)"
    )
  return costs


def _plan(
    setting: bench_settings.Setting,
    budget: bench_settings.Budget,
    methods_run: Sequence[bench_settings.Method],
    grids: dict,
    seed_lists: tuple[Sequence[int], Sequence[int]],
    task_flags: list[str],
    folders: tuple[str, str],
    stated: dict[str, float],
    ratios: dict[str, float],
) -> int:
  """`--plan`: the runs of each stage and their projected cost, printed
  (`plan`'s docstring says where each cost comes from); 0, or 1 if a
  calibration run fails."""
  sel_seeds, seeds = seed_lists
  output_dir, records_dir = folders
  planned = plan.stages(
      methods_run,
      budget,
      grids,
      sel_seeds,
      seeds,
      max_extensions=FLAGS.max_extensions,
      max_extra_seeds=FLAGS.max_extra_seeds,
  )
  costs = plan.seconds_per_round(records_dir)
  costs.update(plan.seconds_per_epoch(records_dir))
  costs.update(stated)
  sources = {m: plan.STATED for m in stated}
  trained = [m for m in methods_run if not m.baseline]

  def from_ratios() -> None:
    if not ratios or 'fedavg' not in costs:
      return
    by = plan.by_ratios(costs['fedavg'], ratios, [m.name for m in trained])
    for name, cost in by.items():
      if name not in costs:
        costs[name] = cost
        sources[name] = plan.RATIOS

  from_ratios()
  calibrated = []
  if FLAGS.calibrate_rounds:
    # FedAvg first: the ratios then cost the others.
    order = sorted(trained, key=lambda m: m.name != 'fedavg')
    try:
      with processes.signals_stop():
        try:
          for method in order:
            if method.name in costs:
              continue
            costs[method.name] = _calibrate(
                method, budget, task_flags, output_dir, FLAGS.data_seed
            )
            calibrated.append(method.name)
            from_ratios()
        except processes.Stopped as e:
          return processes.exit_stopped('benchmark', e, '; nothing was planned')
    except (RuntimeError, ValueError, OSError) as e:
      print(
          f'benchmark: error: calibration: {str(e).splitlines()[-1]}',
          file=sys.stderr,
      )
      return 1
  _baseline_costs(setting, budget, methods_run, folders, costs, sources)
  print(
      plan.table(
          planned,
          costs,
          FLAGS.jobs,
          {m.name: m.label for m in methods_run},
          calibrated,
          sources,
      )
  )
  return 0


def _baseline_costs(
    setting: bench_settings.Setting,
    budget: bench_settings.Budget,
    methods_run: Sequence[bench_settings.Method],
    folders: tuple[str, str],
    costs: dict[str, float],
    sources: dict[str, str],
) -> None:
  """Costs each baseline without a cost in `costs` (and says so in
  `sources`): FedAvg's seconds per round times the rounds an epoch of
  every training client takes (`plan.baseline_cost`; the training clients
  from the records, a calibration or the setting)."""
  output_dir, records_dir = folders
  missing = [m.name for m in methods_run if m.baseline and m.name not in costs]
  if not missing or 'fedavg' not in costs:
    return
  clients = (
      plan.training_clients(records_dir)
      or plan.training_clients(
          os.path.join(output_dir, 'calibration', 'fedavg')
      )
      or setting.training_clients
  )
  if not clients:
    return
  for name in missing:
    costs[name] = plan.baseline_cost(costs['fedavg'], budget, clients)
    sources[name] = plan.derived(budget, clients)


def _rerun(
    records: dict[str, dict], records_dir: str, output_dir: str, task_flags
) -> int:
  """`--rerun`: each record run again and compared; 1 if any differs."""
  folder = os.path.join(
      output_dir, 'rerun', time.strftime('%Y%m%dT%H%M%S', time.gmtime())
  )
  os.makedirs(folder)
  data_dir = next(
      (f.split('=', 1)[1] for f in task_flags if f.startswith('--data_dir=')),
      None,
  )
  runs = bench_records.Runs(
      folder,
      folder,
      1,
      False,
      origin=origin_lib.current(task_flags),
  )
  try:
    with processes.signals_stop():
      try:
        differing = rerun.rerun_records(
            records,
            runs,
            data_dir,
            lambda line: print(line, flush=True),
            records_dir,
        )
      except processes.Stopped as e:
        runs.close()  # Before the process dies of the signal.
        return processes.exit_stopped(
            'benchmark', e, f'; the reruns are in {folder}'
        )
      except RuntimeError as e:
        print(f'benchmark: error: {str(e).splitlines()[-1]}', file=sys.stderr)
        return 1
  finally:
    runs.close()
  print(
      f'benchmark: {len(records) - differing} of {len(records)} records '
      f'rerun identically (runs in {folder})'
  )
  return 1 if differing else 0


def _placeholders(
    output_dir: str, task_flags, records: Iterable[dict] = ()
) -> list[tuple[str, str]]:
  """Absolute machine folders the page prints as placeholders (the longest
  first: the data folder may lie in the output folder): this run's and
  those the records' own runs read (a page made from records on another
  machine, or with another --output_dir, names their data folder too)."""
  out = {}
  args = [a for r in records for a in r.get('args', ())] + list(task_flags)
  for arg in args:
    if arg.startswith('--data_dir=') or arg.startswith('--leaf_dir='):
      flag, folder = arg[2:].split('=', 1)
      out[os.path.abspath(folder)] = f'<{flag}>'
  out[os.path.abspath(output_dir)] = '<output_dir>'
  return sorted(out.items(), key=lambda p: -len(p[0]))


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
      for name in BUDGET_FLAGS
      if getattr(FLAGS, name) is not None
  ]


def _calibrate(method, budget, task_flags, output_dir, data_seed) -> float:
  """`method`'s seconds per round in a run of the budget (`plan.Calibration`),
  measured in a folder of its own by the second of two `--calibrate_rounds`
  runs in one worker: the benchmark's workers keep their builds between
  runs, so the first run's process start and imports are not a run's."""
  rounds = FLAGS.calibrate_rounds
  folder = os.path.join(output_dir, 'calibration', method.name)
  names = [f'select_calibrate_{method.name}_r{rounds}_seed{s}' for s in (0, 1)]
  if not all(os.path.exists(os.path.join(folder, f'{n}.json')) for n in names):
    # Only a whole earlier calibration is reused: a half-done one would
    # resume a run, or run the second in a cold worker.
    shutil.rmtree(folder, ignore_errors=True)
  os.makedirs(folder, exist_ok=True)
  grid = method.knob_grid(budget.learning_rate) if method.knob else ()
  config = bench_selection.Config(  # The centre of its grids.
      grid[len(grid) // 2] if grid else None, budget.learning_rate
  )
  runs = bench_records.Runs(folder, folder, 1, False)
  try:
    for seed in (0, 1):  # The first warms the worker.
      args = bench_selection.run_args(
          task_flags,
          budget,
          method,
          config,
          seed,
          phase='select',
          root=os.path.join(folder, 'runs'),
          data_seed=data_seed,
          rounds=rounds,
      )
      name = names[seed]
      args = bench_records.with_flags(
          args, {'experiment_name': name, 'rounds_per_eval': rounds}
      )
      # Named apart from its folder: no final model is kept.
      record = runs.run(args, rounds, method.personal, name=name)
      if record.get('diverged'):
        raise RuntimeError(
            f'the calibration run of {method.label} diverged: '
            f'{record["diverged"]}'
        )
  finally:
    runs.close()
  measured = plan.calibration(
      record,
      rounds,
      bench_records.round_seconds(os.path.join(folder, 'runs', name)),
  )
  per_round = measured.seconds_per_round(budget.rounds, budget.eval_every)
  print(
      f'calibrated {method.label} ({rounds} rounds, the second run in its '
      f'worker): start-up {measured.startup_s:.1f} s, '
      f'{measured.round_s:.3f} s per round, {measured.evaluation_s:.1f} s per '
      f'evaluation: {per_round:.3f} s per round at {budget.rounds} rounds',
      flush=True,
  )
  return per_round


def run_main() -> None:
  """The binary `python -m run.tail_benchmark.benchmark`.

  Installed as the console command `tff-hetero-benchmark`.
  """
  define_flags()
  console.run(__name__, lambda argv: sys.exit(main(argv)))


if __name__ == '__main__':
  run_main()
