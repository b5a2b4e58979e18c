# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The benchmark's runs, counted before any runs, and their projected cost.

`stages` counts the training runs of each method in each stage of the
selection and of the report, as `selection.Benchmark` runs them. Stages
whose size depends on results (the configurations that go on after a rung,
the edge extensions, the added seeds) are given as a range: fewest and most.
`seconds_per_round` measures each method's cost from the records of earlier
runs (this machine's or any committed ones: their `wall_s` over their
rounds), and `table` projects CPU hours and the wall time on `jobs` workers.
The baselines' runs are not counted. A fine-tuning starts from FedAvg's
finished run and costs a few percent of a training run; local training runs
until its validation accuracy stops improving (at least 100 epochs: about
4,700 s a run on the Shakespeare setting), so its hours come on top.
"""

from collections.abc import Iterable, Sequence
import dataclasses
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
  `rounds` rounds."""

  phase: str
  name: str
  method: str
  fewest: int
  most: int
  rounds: int


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
  for method in methods:
    if method.baseline:
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
        )
    )
    out.append(
        Stage('select', 'added seeds', name, 0, 2 * max_extra_seeds, rounds)
    )
    out.append(Stage('final', 'report', name, len(seeds), len(seeds), rounds))
  return [s for s in out if s.most > 0]


def seconds_per_round(records_dir: str) -> dict[str, float]:
  """Each method's median seconds per round over the records in
  `records_dir` (training runs only; `{}` if there are none)."""
  found: dict[str, list[float]] = {}
  if not os.path.isdir(records_dir):
    return {}
  for entry in sorted(os.listdir(records_dir)):
    if not entry.endswith('.json'):
      continue
    record, _ = bench_records.load_json(os.path.join(records_dir, entry))
    if not isinstance(record, dict) or record.get('diverged'):
      continue
    args = record.get('args')
    wall = record.get('wall_s')
    if not isinstance(args, list) or not isinstance(wall, (int, float)):
      continue
    try:
      rounds = int(bench_records.flag_value(args, 'total_rounds'))
      method = bench_records.flag_value(args, 'algorithm')
    except (StopIteration, ValueError):
      continue  # Not a training run's record.
    if rounds > 0 and wall > 0:
      found.setdefault(method, []).append(wall / rounds)
  return {m: statistics.median(v) for m, v in found.items()}


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


def table(
    planned: Sequence[Stage],
    costs: dict[str, float],
    jobs: int,
    labels: Optional[dict[str, str]] = None,
    calibrated: Sequence[str] = (),
) -> str:
  """The plan as text: one line per stage, then the totals.

  `calibrated` names the methods whose cost a calibration run measured
  (`Calibration`); the others' come from records.
  """
  names: dict[str, str] = dict(labels or {})
  lines = [
      f'{"phase":7} {"stage":24} {"method":14} {"runs":>9} {"rounds":>6} '
      f'{"CPU h":>13}'
  ]
  fewest = most = 0.0
  runs_fewest = runs_most = 0
  unknown = sorted({s.method for s in planned if s.method not in costs})
  for s in planned:
    cost = costs.get(s.method)
    low, high = (_hours(n, s.rounds, cost) for n in (s.fewest, s.most))
    runs = f'{s.fewest}' if s.fewest == s.most else f'{s.fewest}-{s.most}'
    hours = (
        '?'
        if low is None
        else f'{low:.2f}'
        if s.fewest == s.most
        else f'{low:.2f}-{high:.2f}'
    )
    label = names.get(s.method, s.method)
    lines.append(
        f'{s.phase:7} {s.name:24} {label:14} {runs:>9} {s.rounds:>6} '
        f'{hours:>13}'
    )
    runs_fewest += s.fewest
    runs_most += s.most
    if low is not None:
      fewest += low
      most += high
  lines.append(
      f'total: {runs_fewest} to {runs_most} training runs; '
      f'{fewest:.1f} to {most:.1f} CPU hours, {fewest / jobs:.1f} to '
      f'{most / jobs:.1f} hours of wall time on {jobs} worker'
      f'{"" if jobs == 1 else "s"} (CPU hours over workers: each stage '
      'also waits for its slowest run)'
  )
  if unknown:
    lines.append(
        'no cost for '
        + ', '.join(names.get(m, m) for m in unknown)
        + ': no record of theirs in --records_dir (not in the hours above); '
        '--calibrate_rounds=N measures it with one short run each'
    )
  recorded = [
      m
      for m in dict.fromkeys(s.method for s in planned)
      if m in costs and m not in calibrated
  ]
  if recorded:
    lines.append(
        "cost: each method's median seconds per round over its records in "
        '--records_dir (their wall_s over their rounds, evaluations included)'
        + (': ' + ', '.join(names.get(m, m) for m in recorded))
    )
  if calibrated:
    lines.append(
        'cost measured by a calibration run on this machine '
        '(--calibrate_rounds: its start-up paid once per run, its seconds '
        'per round of training and per evaluation): '
        + ', '.join(names.get(m, m) for m in calibrated)
    )
  return '\n'.join(lines)
