# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The benchmark's runs, counted before any runs, and their projected cost.

`stages` counts the training runs of each method in each stage of the
selection and of the report, as `selection.Benchmark` runs them, and the
baselines' runs (`fedavg_ft`, `local`: fine-tunings of FedAvg's runs on the
selection seeds, their grid extensions, one on each reported seed). Stages
whose size depends on results (the configurations that go on after a rung,
the edge extensions, the added seeds) are given as a range: fewest and most.

A method's cost is seconds per round; a baseline's, seconds per epoch (one
epoch over every training client's training part at one learning rate: a
baseline run of r rates and e epochs costs r x e of them, its evaluations
included). They come from, in this order: `--plan_costs` (stated); the
records of earlier runs (`seconds_per_round`: each method's `wall_s` over
its rounds; `seconds_per_epoch`: each baseline's `wall_s` over its rates x
epochs); for a method, FedAvg's cost times its ratio to FedAvg over other
records (`by_ratios`) or a calibration run (`Calibration`); for a baseline,
FedAvg's seconds per round times the rounds one epoch of every training
client takes (`baseline_cost`). On the Shakespeare setting that gives local
training's selection run (3 rates x 128 epochs) 384 x 1.33 x 100 / 10 s,
about 5,100 s, against 4,649 and 4,718 s measured; on Synthetic 384 x 0.197
x 50 / 10 s, about 380 s, against 394 and 397 s (the committed records).
`table` projects CPU hours and the wall time on `jobs` workers: the CPU
hours over the workers, but never less than the runs that wait for each
other take (`chain_hours`).
"""

import collections
from collections.abc import Iterable, Iterator, Sequence
import dataclasses
import json
import math
import os
import statistics
from typing import Optional

from run.tail_benchmark import records as bench_records
from run.tail_benchmark import settings as bench_settings
from run.tail_benchmark import stats


@dataclasses.dataclass(frozen=True)
class Stage:
  """Runs of one method in one stage: between `fewest` and `most`, each of
  `rounds` rounds (`unit` 'round') or, for a baseline, of `rounds` epochs
  over every training client at one learning rate (`unit` 'epoch': its
  rates times its epochs, at the most the stage allows)."""

  phase: str
  name: str
  method: str
  fewest: int
  most: int
  rounds: int
  unit: str = 'round'
  # Waves of runs, each waiting for the one before (edge extensions, added
  # seeds): at most this many, for `chain_hours`.
  steps: int = 1

  @property
  def length(self) -> str:
    return f'{self.rounds} {"r" if self.unit == "round" else "ep"}'


def _line_values(
    method: bench_settings.Method,
    budget: bench_settings.Budget,
    grids: dict[str, Sequence[float]],
) -> int:
  """Configurations the lines add: every other value of each line knob."""
  count = 0
  if budget.tune_server_lr and method.server_lr:
    count += len(grids['server_learning_rate']) - 1
  if budget.tune_client_weighting and method.tunes_weighting:
    count += len(bench_settings.WEIGHTINGS) - 1
  for line in method.lines:
    count += len(grids.get(line.name, line.grid)) - 1
  return count


def _kept(count: int) -> int:
  return len(stats.top_fraction(range(count), bench_settings.KEEP))


def stages(
    methods: Iterable[bench_settings.Method],
    budget: bench_settings.Budget,
    grids: dict[str, Sequence[float]],
    sel_seeds: Sequence[int],
    seeds: Sequence[int],
    *,
    max_extensions: int,
    max_extra_seeds: int,
) -> list[Stage]:
  """The training runs of the selection and the report, per method."""
  out = []
  rounds = budget.rounds
  baselines = []
  for method in methods:
    if method.baseline:
      baselines.append(method)
      continue
    values = (
        grids.get(method.knob) or method.knob_grid(budget.learning_rate)
        if method.knob
        else (None,)
    )
    lrs = len(grids['learning_rate'])
    joint = len(values) * lrs
    lines = _line_values(method, budget, grids)
    name = method.name
    if budget.first_rung:
      tried = joint + lines
      out.append(
          Stage('select', 'first rung', name, tried, tried, budget.first_rung)
      )
      # The best third goes on, and so does each learning rate's best.
      going = (_kept(tried), min(tried, _kept(tried) + lrs))
      out.append(
          Stage(
              'select',
              'full length (continued)',
              name,
              *going,
              rounds - budget.first_rung,
          )
      )
      later = going
    else:
      out.append(Stage('select', 'full length', name, joint, joint, rounds))
      out.append(Stage('select', 'lines', name, lines, lines, rounds))
      later = (joint + lines, joint + lines)
    for _ in sel_seeds[1:]:
      later = (_kept(later[0]), _kept(later[1]))
      out.append(Stage('select', 'next seed', name, *later, rounds))
    # Each extension: at most one step per tuned axis (knob, client and
    # server learning rate), on every selection seed.
    server = bool(budget.tune_server_lr and method.server_lr)
    axes = (1 if method.knob else 0) + 1 + (1 if server else 0)
    out.append(
        Stage(
            'select',
            'edge extensions',
            name,
            0,
            max_extensions * axes * len(sel_seeds),
            rounds,
            steps=max_extensions,
        )
    )
    out.append(
        Stage(
            'select',
            'added seeds',
            name,
            0,
            2 * max_extra_seeds,
            rounds,
            steps=max_extra_seeds,
        )
    )
    out.append(Stage('final', 'report', name, len(seeds), len(seeds), rounds))
  for method in baselines:
    out += baseline_stages(
        method.name, budget, grids, sel_seeds, seeds, max_extensions
    )
  return [s for s in out if s.most > 0]


def baseline_stages(
    name: str,
    budget: bench_settings.Budget,
    grids: dict[str, Sequence[float]],
    sel_seeds: Sequence[int],
    seeds: Sequence[int],
    max_extensions: int,
) -> list[Stage]:
  """A baseline's runs (`selection.Benchmark.select_fine_tuning`, `report`).

  On each selection seed one run fine-tunes FedAvg's model (or trains from
  its initial one) at every rate of `fine_tune_learning_rate` for up to
  the budget's epochs; each extension adds, on each selection seed, a run
  one rate past an edge and, for fine-tuning, one at twice the epochs; each
  reported seed has one run at the chosen rate and epochs. A stage's
  epochs are the most it can reach (fine-tuning's doubling included).
  """
  start = bench_settings.BASELINES[name]
  final = start == 'final'
  epochs = budget.fine_tune_epochs if final else budget.local_epochs_max
  most_epochs = epochs * 2**max_extensions if final else epochs
  rates = len(grids['fine_tune_learning_rate'])
  per_extension = 2 if final else 1
  sel = len(sel_seeds)
  what = 'fine-tuning' if final else 'local training'
  return [
      Stage('select', f'{what} grid', name, sel, sel, rates * epochs, 'epoch'),
      Stage(
          'select',
          f'{what} extensions',
          name,
          0,
          max_extensions * per_extension * sel,
          most_epochs,
          'epoch',
          steps=max_extensions,
      ),
      Stage(
          'final',
          f'{what} report',
          name,
          len(seeds),
          len(seeds),
          most_epochs,
          'epoch',
      ),
  ]


def _records(records_dir: str) -> Iterator[tuple[str, dict]]:
  """`(name, record)` of each readable record in `records_dir` with
  arguments and a wall time, in name order (none if no such folder)."""
  if not os.path.isdir(records_dir):
    return
  for entry in sorted(os.listdir(records_dir)):
    if not entry.endswith('.json'):
      continue
    record, _ = bench_records.load_json(os.path.join(records_dir, entry))
    if not isinstance(record, dict) or record.get('diverged'):
      continue
    if isinstance(record.get('args'), list) and isinstance(
        record.get('wall_s'), (int, float)
    ):
      yield entry[: -len('.json')], record


def _fine_tuning_options(args: list) -> Optional[dict]:
  """A fine-tuning record's options (its arguments end with them, as JSON);
  None for a training run's record."""
  last = args[-1] if args else None
  if not isinstance(last, str) or not last.startswith('{'):
    return None
  try:
    options = json.loads(last)
  except ValueError:
    return None
  return options if isinstance(options, dict) else None


def seconds_per_round(records_dir: str) -> dict[str, float]:
  """Each method's median seconds per round over the records in
  `records_dir` (training runs only; `{}` if there are none)."""
  found: dict[str, list[float]] = {}
  for _, record in _records(records_dir):
    args, wall = record['args'], record['wall_s']
    if _fine_tuning_options(args) is not None:
      continue  # A baseline's (`seconds_per_epoch`).
    try:
      rounds = int(bench_records.flag_value(args, 'total_rounds'))
      method = bench_records.flag_value(args, 'algorithm')
    except (StopIteration, ValueError):
      continue  # Not a training run's record.
    if rounds > 0 and wall > 0:
      found.setdefault(method, []).append(wall / rounds)
  return {m: statistics.median(v) for m, v in found.items()}


def seconds_per_epoch(records_dir: str) -> dict[str, float]:
  """Each baseline's median seconds per epoch (over every training client
  at one rate) over its fine-tuning records in `records_dir`: each
  record's wall time over its rates times its most epochs."""
  starts = {start: name for name, start in bench_settings.BASELINES.items()}
  found: dict[str, list[float]] = {}
  for _, record in _records(records_dir):
    options = _fine_tuning_options(record['args'])
    if options is None:
      continue
    try:
      (start,) = options['starts']
      epochs = int(options['max_epochs']) * len(options['learning_rates'])
    except (KeyError, TypeError, ValueError):
      continue
    if start in starts and epochs > 0 and record['wall_s'] > 0:
      found.setdefault(starts[start], []).append(record['wall_s'] / epochs)
  return {m: statistics.median(v) for m, v in found.items()}


def training_clients(records_dir: str) -> int:
  """The training clients of the runs recorded in `records_dir`: those a
  selection run evaluated (its validation parts); 0 if none says."""
  for name, record in _records(records_dir):
    splits = record.get('splits')
    if not name.startswith('select_') or not isinstance(splits, dict):
      continue
    for split in ('test', 'personal/test'):
      columns = splits.get(split)
      if isinstance(columns, dict) and columns.get('accuracy'):
        return len(columns['accuracy'])
  return 0


def baseline_cost(
    fedavg_round_s: float,
    budget: bench_settings.Budget,
    clients: int,
) -> float:
  """A baseline's seconds per epoch from FedAvg's seconds per round: one
  epoch of every one of `clients` training clients takes as many rounds of
  the budget's clients and local epochs (evaluations included)."""
  return (
      fedavg_round_s
      * clients
      / (budget.clients_per_round * budget.local_epochs)
  )


def by_ratios(
    fedavg_cost: float,
    reference: dict[str, float],
    methods: Iterable[str],
) -> dict[str, float]:
  """`methods`' costs as FedAvg's (`fedavg_cost`) times each one's ratio to
  FedAvg in `reference` (seconds per round, e.g. another setting's
  `seconds_per_round`); a method `reference` lacks is left out."""
  base = reference.get('fedavg')
  if not base:
    return {}
  return {
      m: fedavg_cost * reference[m] / base for m in methods if m in reference
  }


def parse_costs(items: Sequence[str], names: Sequence[str]) -> dict[str, float]:
  """`--plan_costs` (`METHOD:SECONDS` items) as a dict.

  Raises:
    ValueError: A malformed item, an unknown method, a method given twice
      or a cost that is not a positive number (one line).
  """
  out: dict[str, float] = {}
  for item in items:
    name, sep, text = item.partition(':')
    if not sep or name not in names:
      raise ValueError(
          f'--plan_costs={item}: give METHOD:SECONDS with METHOD among '
          f'{", ".join(names)}'
      )
    if name in out:
      raise ValueError(f'--plan_costs: {name} is given twice')
    try:
      value = float(text)
    except ValueError:
      value = math.nan
    if not (math.isfinite(value) and value > 0):
      raise ValueError(f'--plan_costs={item}: the seconds must be a number > 0')
    out[name] = value
  return out


@dataclasses.dataclass(frozen=True)
class Calibration:
  """A method's cost measured by one short run on this machine.

  Attributes:
    rounds: The run's rounds.
    startup_s: Its wall time outside the timed parts (data, building,
      tracing): paid once per run.
    round_s: Seconds per round of training, metrics and checkpoints.
    evaluation_s: Seconds per evaluation of the held-out parts.
  """

  rounds: int
  startup_s: float
  round_s: float
  evaluation_s: float

  def seconds_per_round(self, rounds: int, eval_every: int) -> float:
    """A run of `rounds` rounds evaluated every `eval_every` (0: at the
    end only) and at its last round, per round, start-up spread over its rounds.
    """
    # Every `eval_every` rounds and at the last.
    evaluations = math.ceil(rounds / eval_every) if eval_every else 1
    total = (
        self.startup_s + rounds * self.round_s + evaluations * self.evaluation_s
    )
    return total / rounds


def calibration(
    record: dict, rounds: int, round_seconds: Sequence[float] = ()
) -> Calibration:
  """A `Calibration` from the record of a run of `rounds` rounds.

  A round's training is the median of `round_seconds` (the run's
  `metrics.csv` column) past the first round, which also traces; metrics
  and checkpoints are spread over the rounds; an evaluation is the timed
  evaluation over the curve's points (at least one); the start-up is the
  wall time the rest leaves (the first round's tracing in it).

  Raises:
    ValueError: If the record has no timed parts.
  """
  parts = record.get('seconds')
  if not isinstance(parts, dict) or 'training' not in parts or rounds < 1:
    raise ValueError('the calibration run recorded no timed parts')
  wall = float(record.get('timed_wall_s', record['wall_s']))
  steady = list(round_seconds[1:])
  training = statistics.median(steady) if steady else parts['training'] / rounds
  other = sum(
      v for k, v in parts.items() if k not in ('training', 'evaluation')
  )
  round_s = training + other / rounds
  curves = record.get('curve') or {}
  evaluations = max((len(c) for c in curves.values()), default=0) or 1
  evaluation = float(parts.get('evaluation', 0.0))
  return Calibration(
      rounds=rounds,
      startup_s=max(0.0, wall - evaluation - rounds * round_s),
      round_s=round_s,
      evaluation_s=evaluation / evaluations,
  )


def _hours(runs: int, rounds: int, cost: Optional[float]) -> Optional[float]:
  return None if cost is None else runs * rounds * cost / 3600


def chain_hours(
    planned: Sequence[Stage], costs: dict[str, float]
) -> tuple[float, float]:
  """The hours no number of workers removes: the runs that wait for each
  other, fewest and most.

  The benchmark runs a stage of every method at once and waits for all of
  them before the next (the first rung, each selection seed, each wave of
  edge extensions and added seeds, each baseline's grid and extensions,
  the report): each stage lasts at least its longest run, and the stages
  add up. A stage whose runs may not happen counts 0 in the fewest; a
  method without a cost counts 0.
  """
  levels: dict[str, list[float]] = {}
  for s in planned:
    cost = costs.get(s.method)
    if cost is None:
      continue
    run = s.rounds * cost / 3600
    low, high = levels.setdefault(s.name, [0.0, 0.0])
    levels[s.name] = [
        max(low, run if s.fewest else 0.0),
        max(high, run * s.steps if s.most else 0.0),
    ]
  # A stage met twice by one method (the next seeds) is that many waits.
  repeats = collections.Counter((s.name, s.method) for s in planned)
  times = collections.Counter()
  for (name, _), n in repeats.items():
    times[name] = max(times[name], n)
  return (
      sum(low * times[name] for name, (low, _) in levels.items()),
      sum(high * times[name] for name, (_, high) in levels.items()),
  )


# Where a cost came from (`table`'s `sources`), as its footnote says it.
RECORDS = (
    "cost: each method's median seconds per round over its records in "
    '--records_dir (their wall_s over their rounds, evaluations included; a '
    "baseline's per epoch over its fine-tuning records)"
)
CALIBRATED = (
    'cost measured by a calibration run on this machine (--calibrate_rounds: '
    'its start-up paid once per run, its seconds per round of training and '
    'per evaluation)'
)
STATED = (
    "cost stated with --plan_costs (seconds per round; a baseline's per epoch)"
)
RATIOS = (
    "cost: FedAvg's seconds per round times the method's ratio to FedAvg's "
    'over the records in --cost_ratios_from'
)


def derived(budget: bench_settings.Budget, clients: int) -> str:
  """The footnote of `baseline_cost`'s costs."""
  return (
      "cost: a baseline's seconds per epoch from FedAvg's seconds per round: "
      f'an epoch of {clients} training clients as {clients} / '
      f'({budget.clients_per_round} clients x {budget.local_epochs} local '
      f'epochs) = {baseline_cost(1.0, budget, clients):g} rounds'
  )


def _row(s: Stage, cost: Optional[float], label: str) -> str:
  low, high = (_hours(n, s.rounds, cost) for n in (s.fewest, s.most))
  runs = f'{s.fewest}' if s.fewest == s.most else f'{s.fewest}-{s.most}'
  hours = (
      '?'
      if low is None
      else f'{low:.2f}'
      if s.fewest == s.most
      else f'{low:.2f}-{high:.2f}'
  )
  return (
      f'{s.phase:7} {s.name:28} {label:20} {runs:>9} {s.length:>8} '
      f'{hours:>13}'
  )


def table(
    planned: Sequence[Stage],
    costs: dict[str, float],
    jobs: int,
    labels: Optional[dict[str, str]] = None,
    calibrated: Sequence[str] = (),
    sources: Optional[dict[str, str]] = None,
) -> str:
  """The plan as text: one line per stage, then the totals.

  `calibrated` names the methods whose cost a calibration run measured
  (`Calibration`); `sources` gives the others' origin (`STATED`, `RATIOS`,
  `derived`); the rest come from records (`RECORDS`).
  """
  names: dict[str, str] = dict(labels or {})
  origin = {m: CALIBRATED for m in calibrated}
  origin.update(sources or {})
  lines = [
      f'{"phase":7} {"stage":28} {"method":20} {"runs":>9} {"length":>8} '
      f'{"CPU h":>13}'
  ]
  fewest = most = 0.0
  runs = {'round': [0, 0], 'epoch': [0, 0]}
  unknown = [
      m for m in dict.fromkeys(s.method for s in planned) if m not in costs
  ]
  for s in planned:
    cost = costs.get(s.method)
    lines.append(_row(s, cost, names.get(s.method, s.method)))
    runs[s.unit][0] += s.fewest
    runs[s.unit][1] += s.most
    if cost is not None:
      fewest += _hours(s.fewest, s.rounds, cost)
      most += _hours(s.most, s.rounds, cost)
  counted = f'{runs["round"][0]} to {runs["round"][1]} training runs'
  if any(runs['epoch']):
    counted += (
        f' and {runs["epoch"][0]} to {runs["epoch"][1]} baseline runs '
        "(fine-tunings and local trainings of FedAvg's runs)"
    )
  chain = chain_hours(planned, costs)
  wall = [max(f / jobs, c) for f, c in zip((fewest, most), chain)]
  lines.append(
      f'total: {counted}; '
      f'{fewest:.1f} to {most:.1f} CPU hours, {wall[0]:.1f} to '
      f'{wall[1]:.1f} hours of wall time on {jobs} worker'
      f'{"" if jobs == 1 else "s"} (CPU hours over workers, and at least '
      f'the {chain[0]:.1f} to {chain[1]:.1f} hours of the runs that wait '
      'for each other: each stage waits for its slowest run)'
  )
  if unknown:
    lines.append(
        'no cost for '
        + ', '.join(names.get(m, m) for m in unknown)
        + ': no record of theirs in --records_dir (not in the hours above); '
        '--calibrate_rounds=N measures it with one short run each, '
        "--plan_costs states it (a baseline's follows FedAvg's)"
    )
  if any(runs['epoch']):
    lines.append(
        "baselines: a run's length is its epochs over every training "
        "client's training part at one learning rate (its rates x its "
        'epochs), at the most its stage allows (fine-tuning doubles its '
        'epochs at an edge): upper estimates'
    )
  groups: dict[str, list[str]] = {}
  for m in dict.fromkeys(s.method for s in planned):
    if m in costs:
      groups.setdefault(origin.get(m, RECORDS), []).append(names.get(m, m))
  for text in (RECORDS, CALIBRATED, STATED, RATIOS):
    if text in groups:
      lines.append(f'{text}: ' + ', '.join(groups.pop(text)))
  for text, members in groups.items():
    lines.append(f'{text}: ' + ', '.join(members))
  return '\n'.join(lines)
