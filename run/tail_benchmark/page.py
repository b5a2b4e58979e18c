# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The tail benchmark's page, pictures and results file, from its records.

Everything here reads the per-client arrays of the runs' records
(`run.tail_benchmark.records.Runs`), so the page is the same whether
the runs ran now or were read back (`--from_records`).
"""

import dataclasses
import math
import os
import shlex
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from run import atomic
from run.tail_benchmark import stats

PAIRED_COLUMNS = ('mean', 'p10', 'worst10', 'loss_sq10', 'variance')
# (split key, title, which methods have it).
SPLITS = (
    ('test', "(a) Training clients' held-out data"),
    ('unseen', '(b) Unseen clients, global models'),
    ('unseen_half', '(c) Unseen clients, second half of their examples'),
)


@dataclasses.dataclass
class Report:
  """What the page shows; see `run.tail_benchmark.benchmark.main`."""

  setting: Any
  budget: Any
  task_flags: Sequence[str]
  methods: Sequence[Any]
  seeds: Sequence[int]
  sel_seeds: Sequence[int]
  grids: dict[str, tuple[float, ...]]
  choices: dict[str, Any]
  ft_choices: dict[str, Any]
  results: dict[str, list[dict[str, Any]]]
  commands: Sequence[str]
  wall: dict[str, float]
  data_seed: int
  keep: float
  argv: Sequence[str]
  overrides: Sequence[str]
  # bench_suite's fedavg/bound for the model and cohort (`read_bound`).
  bound: Optional[dict[str, Any]] = None
  # `(origin, records)` of every record used (`origin.summary`).
  origins: Sequence[tuple[str, int]] = ()
  # The trivial score's mean accuracy by phase ('select', 'final').
  trivial: dict[str, Optional[float]] = dataclasses.field(default_factory=dict)
  # Machine folders and the placeholders the page prints instead.
  placeholders: Sequence[tuple[str, str]] = ()

  def rows(self, split: str):
    """`(method, label, per-seed stats)` of the methods that have `split`.

    The per-seed stats follow the reported seeds; a seed whose run diverged
    is None (`finished`).
    """
    out = []
    for method in self.methods:
      runs = self.results.get(method.name, [])
      done = [r for r in runs if not r.get('diverged')]
      if not done or any(split not in r['splits'] for r in done):
        continue
      label = method.label
      if split == 'test' and method.personal and not method.baseline:
        label += ' (personal)'
      if split == 'unseen_half' and method.name == 'fedavg':
        label += ' (global)'
      diverged = len(runs) - len(done)
      if diverged:
        label += f' (diverged on {diverged} of {len(runs)} seeds)'
      per_seed = [
          None if r.get('diverged') else _stats(r['splits'][split])
          for r in runs
      ]
      out.append((method, label, per_seed))
    return out


def finished(per_seed: Sequence[Optional[dict[str, float]]]) -> list[dict]:
  """The stats of the seeds whose runs finished (`Report.rows`)."""
  return [s for s in per_seed if s is not None]


def _stats(cols) -> dict[str, float]:
  return stats.client_stats(
      cols['accuracy'], cols['loss'], cols['num_examples']
  )


def _scale(column: str) -> float:
  return 1.0 if column in ('variance', 'loss_sq10') else 100.0


def _digits(column: str) -> int:
  return {'variance': 0, 'loss_sq10': 3}.get(column, 1)


def _cell(mean: float, std: float, column: str) -> str:
  s, d = _scale(column), _digits(column)
  spread = 'n/a' if math.isnan(std) else f'{s * std:.{d}f}'
  return f'{s * mean:.{d}f} ({spread})'


def results_table(report: Report, split: str) -> str:
  """Mean (std over seeds, ddof 1) of each statistic, one row per method."""
  head = (
      '| algorithm | '
      + ' | '.join(stats.COLUMNS)
      + ' | examples/run | wall s/run |'
  )
  lines = [head, '|---|' + '---:|' * (len(stats.COLUMNS) + 2)]
  for method, label, per_seed in report.rows(split):
    cells = [
        _cell(*stats.mean_std([s[c] for s in finished(per_seed)]), c)
        for c in stats.COLUMNS
    ]
    runs = [r for r in report.results[method.name] if not r.get('diverged')]
    examples = np.mean([r['examples'] for r in runs])
    wall = np.mean([r['wall_s'] for r in runs])
    lines.append(
        f'| {label} | '
        + ' | '.join(cells)
        + f' | {examples:,.0f} | {wall:.0f} |'
    )
  return '\n'.join(lines)


def paired_rows(report: Report, split: str) -> list[tuple[Any, ...]]:
  """`(method, column, mean, std, wins, n, half_width)` against FedAvg.

  Seed by seed: the i-th reported seed of a method minus FedAvg's i-th,
  over the seeds where both runs finished (a method without one is left out).
  """
  rows = report.rows(split)
  base = next((r for r in rows if r[0].name == 'fedavg'), None)
  if base is None:
    return []
  out = []
  for method, _, per_seed in rows:
    pairs = [
        (s, b)
        for s, b in zip(per_seed, base[2])
        if s is not None and b is not None
    ]
    if method.name == 'fedavg' or not pairs:
      continue
    for column in PAIRED_COLUMNS:
      values = [s[column] for s, _ in pairs]
      reference = [b[column] for _, b in pairs]
      out.append(
          (
              method,
              column,
              *stats.paired(values, reference, stats.HIGHER_IS_BETTER[column]),
          )
      )
  return out


def paired_table(rows: Sequence[tuple[Any, ...]]) -> str:
  """The paired differences as a Markdown table, one row per method."""
  lines = [
      '| algorithm minus FedAvg | ' + ' | '.join(PAIRED_COLUMNS) + ' |',
      '|---|' + '---:|' * len(PAIRED_COLUMNS),
  ]
  by_method = {}
  for method, column, mean, std, wins, n, half in rows:
    s, d = _scale(column), _digits(column)
    spread = 'n/a' if math.isnan(std) else f'{s * std:.{d}f}'
    width = 'n/a' if math.isnan(half) else f'{s * half:.{d}f}'
    by_method.setdefault(method.label, []).append(
        f'{s * mean:+.{d}f} ({spread}), {wins}/{n}; +-{width}'
    )
  for label, cells in by_method.items():
    lines.append(f'| {label} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def _client_sizes(report: Report, split: str) -> list[int]:
  """`split`'s examples per client, as FedAvg's first seed evaluated them."""
  return report.results['fedavg'][0]['splits'][split]['num_examples']


def resolution_line(report: Report, split: str) -> str:
  sizes = _client_sizes(report, split)
  r = stats.resolution(sizes)
  return (
      f'Resolution ({len(sizes)} clients, seed '
      f"{report.seeds[0]}): one example moves a client's accuracy by "
      f'{r["example_median"]:.2g} points (median client) and up to '
      f'{r["example_max"]:.2g} (smallest client), so it moves the mean by '
      f'{r["mean_example_median"]:.2g} to {r["mean_example_max"]:.2g} points '
      f'and worst10 by {r["worst10_example_median"]:.2g} to '
      f'{r["worst10_example_max"]:.2g}; a client whose '
      f'accuracy moves by D points moves the mean by {r["client_mean"]:.2g} D '
      f'and worst10 by up to {r["client_worst10"]:.2g} D. worst10 and p10 '
      'interpolate between clients. Compare the paired half-widths with the '
      'one-example steps: the findings do not call a difference below the '
      "median client's step resolved."
  )


def example_steps(report: Report, split: str = 'test') -> dict[str, float]:
  """One example's move of the mean and worst10 (median client, fraction)."""
  r = stats.resolution(_client_sizes(report, split))
  return {
      'mean': r['mean_example_median'] / 100,
      'worst10': r['worst10_example_median'] / 100,
  }


def operating_point(report: Report, split: str, split_name: str) -> str:
  """FedAvg's level on `split`, which every difference starts from."""
  base = next((r for r in report.rows(split) if r[0].name == 'fedavg'), None)
  if base is None:
    return ''
  cells = []
  for column, name in (('mean', 'mean'), ('worst10', 'worst-10%')):
    mean, std = stats.mean_std([s[column] for s in finished(base[2])])
    spread = '' if math.isnan(std) else f' ({100 * std:.1f})'
    cells.append(f'{name} accuracy {100 * mean:.1f}%{spread}')
  return (
      f"Operating point: FedAvg's {split_name}, "
      + ' and '.join(cells)
      + f' (mean (std) over the reported seeds {list(report.seeds)}); the '
      'differences below start from there.'
  )


def ft_start_line(report: Report) -> str:
  """Whether FedAvg + fine-tuning started from FedAvg's reported models."""
  runs = report.results.get('fedavg', [])
  offsets = [
      (s, r['ft_start']) for s, r in zip(report.seeds, runs) if 'ft_start' in r
  ]
  if not offsets:
    return ''
  off = [(s, o) for s, o in offsets if o[0]]
  if not off:
    return (
        "FedAvg + fine-tuning starts from FedAvg's reported models: at 0 "
        "epochs its held-out evaluation equals FedAvg's record, client by "
        'client, on every reported seed.'
    )
  return (
      "FedAvg + fine-tuning at 0 epochs differs from FedAvg's record on "
      + ', '.join(
          f'seed {s} ({o[0]:g} clients, up to {o[1]:.2f} points)'
          for s, o in off
      )
      + ': its starting models are not the ones those records evaluated, so '
      'its differences against FedAvg carry that offset (records made before '
      'the models were saved with them).'
  )


def findings(
    rows: Sequence[tuple[Any, ...]],
    split_name: str,
    steps: Optional[dict[str, float]] = None,
) -> list[str]:
  """One sentence per method on worst10 and the mean, with its verdict.

  Args:
    rows: `paired_rows` of one split.
    split_name: The split's name in the sentences.
    steps: Each column's one-example step (a fraction, as the rows): a
      difference below it is not called resolved.
  """
  steps = steps or {}
  by = {}
  for method, column, *numbers in rows:
    by.setdefault(method.label, {})[column] = numbers
  out = []
  for label, cols in by.items():
    parts = []
    for column, name in (('worst10', 'worst-10% accuracy'), ('mean', 'mean')):
      mean, std, wins, n, half = cols[column]
      parts.append(
          f'{name} {100 * mean:+.1f} points (better on {wins} of {n} seeds; '
          f'{stats.verdict(mean, std, half, steps.get(column, 0.0))})'
      )
    out.append(f'* {label} vs FedAvg, {split_name}: ' + '; '.join(parts) + '.')
  return out


# The markers around a page's summary, which the README repeats verbatim
# (tests/test_benchmark.py checks it; `summary_block` reads it back).
SUMMARY_BEGIN = '<!-- summary: {setting} -->'
SUMMARY_END = '<!-- /summary -->'


def summary_table(report: Report) -> list[str]:
  """The page's headline, for the README: each method's held-out
  worst-10% accuracy minus FedAvg's, its 95% half-width, the seeds where it
  is better and whether the seeds resolve it, at FedAvg's operating point.
  No link inside: the README and the page hold it verbatim.
  """
  name = report.setting.name
  labels = {m.name: label for m, label, _ in report.rows('test')}
  base = next((r for r in report.rows('test') if r[0].name == 'fedavg'), None)
  lines = [SUMMARY_BEGIN.format(setting=name)]
  if base is not None:
    cells = []
    for column, what in (('worst10', 'worst-10%'), ('mean', 'mean')):
      mean, _ = stats.mean_std([s[column] for s in finished(base[2])])
      cells.append(f'{what} {100 * mean:.1f}%')
    lines += [
        f'**{report.setting.title or name}**, held-out data; FedAvg at '
        + ' and '.join(cells)
        + f' (mean over seeds {list(report.seeds)}):',
        '',
    ]
  lines += [
      '| method | worst-10% minus FedAvg (points, +- 95% half-width) | '
      'seeds better | verdict |',
      '|---|---:|---:|---|',
  ]
  steps = example_steps(report)
  for method, column, mean, std, wins, n, half in paired_rows(report, 'test'):
    if column != 'worst10':
      continue
    words = stats.verdict(mean, std, half, steps['worst10'])
    width = 'n/a' if math.isnan(half) else f'{100 * half:.1f}'
    lines.append(
        f'| {labels[method.name]} | {100 * mean:+.1f} +- {width} | '
        f'{wins} of {n} | '
        f'{"resolved" if words.startswith("resolved") else "not resolved"} |'
    )
  lines.append(SUMMARY_END)
  return lines


def summary_block(text: str, setting: str) -> Optional[str]:
  """The summary of `setting` in a page's or the README's text (markers
  included), or None."""
  begin = SUMMARY_BEGIN.format(setting=setting)
  start = text.find(begin)
  if start < 0:
    return None
  end = text.find(SUMMARY_END, start)
  if end < 0:
    return None
  return text[start : end + len(SUMMARY_END)]


def unstable_lines(report: Report) -> list[str]:
  """One sentence per method whose chosen configuration diverged on a
  reported seed (its statistics are over the seeds it finished) and one per
  method whose held-out curve fell back to the trivial score there."""
  out = []
  for method in report.methods:
    runs = report.results.get(method.name, [])
    seeds = [s for s, r in zip(report.seeds, runs) if r.get('diverged')]
    if seeds:
      if len(seeds) == len(runs):
        out.append(
            f'* {method.label} diverged on every reported seed '
            f'{list(report.seeds)} at its chosen configuration: it has no '
            'row in the tables, the differences or the summary.'
        )
        continue
      out.append(
          f'* {method.label} diverged on reported seed'
          f'{"s" if len(seeds) > 1 else ""} {", ".join(map(str, seeds))} of '
          f'{list(report.seeds)} at its chosen configuration: its statistics '
          'and differences are over the seeds where it finished, so they '
          'describe it only where it trains.'
      )
    fell = [
        s
        for s, r in zip(report.seeds, runs)
        if r.get('unstable') and not r.get('diverged')
    ]
    if fell:
      out.append(
          f"* {method.label}'s held-out curve fell back to the trivial score "
          'after leaving it, or collapsed below it after reaching it, on '
          f'reported seed{"s" if len(fell) > 1 else ""} '
          f'{", ".join(map(str, fell))} of {list(report.seeds)}; those seeds '
          'are in its statistics.'
      )
  return out


def trivial_line(report: Report) -> list[str]:
  """One sentence placing every row's held-out mean accuracy against the
  trivial score: the rows within `stats.LEAVE_MARGIN` of it never left the
  commonest class's score; the baselines (no curve) above it left it."""
  trivial = report.trivial.get('final')
  if trivial is None:
    return []
  at, left = [], []
  for method, label, per_seed in report.rows('test'):
    mean = float(np.mean([s['mean'] for s in finished(per_seed)]))
    if mean <= trivial + stats.LEAVE_MARGIN:
      at.append(f'{label} {100 * mean:.1f}%')
    elif method.baseline:
      left.append(f'{label} {100 * mean:.1f}%')
  margin = round(100 * stats.LEAVE_MARGIN)
  text = (
      '* Against the trivial score (every held-out example given the '
      f"training clients' commonest class: {100 * trivial:.1f}% mean "
      'accuracy): '
  )
  if at:
    text += (
        f'{", ".join(at)} within {margin} points of it (never left it); every '
        'other row'
    )
  else:
    text += 'every row'
  text += f' is more than {margin} points above it'
  if left:
    text += f', the baselines {", ".join(left)} among them'
  text += '.'
  return [text]


# The selection's keys in order (`stats.criterion`), loss aside.
LADDER = (
    'worst10',
    *(f'worst{round(100 * t)}' for t in stats.TAIL_LADDER),
    'mean',
)


def selection_table(report: Report) -> str:
  """Each method's grids tried, its rungs and its choice (edges marked)."""
  lines = [
      '| algorithm | knob grid tried | learning rates tried | configurations '
      'per rung | chosen | validation worst10 / 20 / 30 / 50% / mean, '
      'loss sq10 | diverged or fell back: selection / reported seeds |',
      '|---|---|---|---|---|---:|---:|',
  ]
  for method in report.methods:
    choice = report.choices.get(method.name) or report.ft_choices.get(
        method.name
    )
    if choice is None:
      continue
    best = choice.best
    seeds = list(choice.tried[best])
    ladder = ' / '.join(
        f'{100 * np.mean([choice.tried[best][s][k] for s in seeds]):.1f}'
        for k in LADDER
    )
    loss = np.mean([choice.tried[best][s]['loss_sq10'] for s in seeds])
    knob = choice.method.knob
    every = (*choice.tried, *choice.early)  # With the first rung's.
    values = sorted({c.value for c in every}) if knob else []
    lrs = ', '.join(f'{v:g}' for v in sorted({c.lr for c in every}))
    server = sorted({c.slr for c in every})
    if len(server) > 1:
      lrs += '; server ' + ', '.join(f'{v:g}' for v in server)
    weightings = sorted({getattr(c, 'weighting', '') for c in every})
    if len(weightings) > 1:
      lrs += '; client weights by ' + ', '.join(weightings)
    chosen = best.describe(choice.method)
    if choice.edges:
      chosen += ' **(at an edge: ' + ', '.join(choice.edges) + ')**'
    grid = _values_text(values) if knob else '-'
    if knob and choice.extensions:
      grid += f' ({choice.extensions} extension(s))'
    if knob and getattr(choice.method, 'lines', ()):
      grid += ' (joint)'
    for line in getattr(choice.method, 'lines', ()):
      tried = sorted({c.get(line.name, choice.method) for c in every})
      grid += f'; {line.name}: ' + ', '.join(f'{v:g}' for v in tried)
      grid += ' (line)'
    extra = getattr(choice, 'extra_seeds', [])
    if extra:
      chosen += f' (seeds added: {", ".join(map(str, extra))})'
    lines.append(
        f'| {method.label} | {(knob + ": ") if knob else ""}{grid} | '
        f'{lrs} | {" / ".join(map(str, choice.rungs))} | {chosen} | '
        f'{ladder}%, {loss:.3f} | {_stability(report, method, choice)} |'
    )
  return '\n'.join(lines)


def _values_text(values: Sequence[float]) -> str:
  """Values tried, a run of 6 or more consecutive integers as `a-b`."""
  ints = all(float(v).is_integer() for v in values)
  if (
      ints
      and len(values) >= 6
      and values == list(range(int(values[0]), int(values[-1]) + 1))
  ):
    return f'{values[0]:g}-{values[-1]:g}'
  return ', '.join(f'{v:g}' for v in values)


def _stability(report: Report, method: Any, choice: Any) -> str:
  """Seeds where the chosen configuration diverged, fell back to the
  trivial score or collapsed below it (`stats.fell_back`): selection (its
  full runs, and its first rung as `+ 1 early`), then reported; `-` for the
  baselines, which train no curve."""
  if method.baseline:
    return '-'
  unstable = getattr(choice, 'unstable', {})
  sel = str(len(unstable.get(choice.best, ())))
  if choice.best in getattr(choice, 'early_unstable', ()):
    sel += ' + 1 early'
  runs = report.results.get(method.name, [])
  if not runs:
    return f'{sel} / -'
  rep = sum(bool(r.get('unstable')) for r in runs)
  return f'{sel} / {rep} of {len(runs)}'


def rules_paragraph(report: Report) -> list[str]:
  """The selection's fairness rules, stated (empty for a report made
  without them: no trivial score known and no lines)."""
  b = report.budget
  trivial = report.trivial.get('select')
  trivial_text = (
      f'{100 * trivial:.1f}% mean validation accuracy here'
      if trivial is not None
      else 'unknown here (labels are sequences): only divergence counts'
  )
  local_max = getattr(b, 'local_epochs_max', None)
  return [
      '**Rules** (each a test in tests/test_benchmark.py). '
      + (
          'No slow starter is cut early: besides the best third of the first '
          "rung, each client learning rate's best configuration goes on to "
          'the full rounds. '
          if b.first_rung
          else ''
      )
      + 'A configuration that diverged, or whose validation curve fell back '
      'to within 1 point of the trivial score (every example given the '
      "training clients' commonest class: "
      f'{trivial_text}) after rising 3 points above it, or collapsed 3 '
      'points below it after reaching it (a model worse than always '
      'predicting the commonest class; a slow starter rising from below does '
      'not count), on any selection seed, '
      'ranks below every stable one. Where the best two configurations '
      'differ in mean validation worst10 by less than the larger of their '
      'stds over the seeds, both run on one more selection seed (at most '
      'the cap given by --max_extra_seeds; seeds added are listed). Knobs '
      "marked (joint) are tuned with the learning rate; a (line) knob's "
      'other values run at the best joint configuration of the first rung '
      "(as the server learning rate); the table's last column counts the "
      'seeds where the chosen configuration diverged or fell back. FedAvg + '
      'fine-tuning starts from the final model saved with each FedAvg '
      'record (a model that evaluates otherwise than its record is '
      'refused)'
      + (
          f"; local training trains 0 to {local_max} epochs from the runs' "
          'initial model, chosen on validation (a choice at that cap is '
          'marked).'
          if local_max
          else '.'
      ),
      '',
  ]


def origins_section(report: Report) -> list[str]:
  """Every origin of the records used, with its number of records."""
  if not report.origins:
    return []
  return [
      '**Records and their origin** (code: a hash of the sources that '
      'train and evaluate a run, and the commits they were at; data: a '
      'hash of each data file read; library versions):',
      '',
      '| origin | records |',
      '|---|---:|',
      *(f'| {text} | {n} |' for text, n in report.origins),
      '',
  ]


def portable(report: Report, text: str) -> str:
  """`text` with this machine's folders replaced by their placeholders."""
  for folder, placeholder in report.placeholders:
    if folder:
      text = text.replace(folder, placeholder)
  return text


def server_lr_sentence(report: Report) -> str:
  """How the server learning rate was chosen (or that it was not)."""
  tuned = [m.label for m in report.methods if m.server_lr]
  if not getattr(report.budget, 'tune_server_lr', False) or not tuned:
    return (
        "The server learning rate is 1 (SGD, TFF's default) for every "
        'algorithm with a server optimizer. '
    )
  grid = ', '.join(f'{v:g}' for v in report.grids['server_learning_rate'])
  where = (
      'of the first rung' if report.budget.first_rung else 'on the first seed'
  )
  return (
      f'The server learning rate of {", ".join(tuned)} (the algorithms '
      "that apply their aggregate with TFF's server SGD; the others have "
      'their own server step) is tuned along one line, not over the whole '
      f"grid: each one's best configuration {where} runs again at the other "
      f'server rates of {{{grid}}} on the same seed and rounds, and these '
      'join the ranking (a choice at an edge extends as the others). '
  )


def weighting_sentence(report: Report) -> str:
  """How the client weighting was chosen (empty where it was not tuned)."""
  if not getattr(report.budget, 'tune_client_weighting', False):
    return ''
  run = [m.label for m in report.methods if m.run_weighting]
  own = [m for m in report.methods if m.uniform_option]
  if not run and not own:
    return ''
  tuned = ', '.join([*run, *(m.label for m in own)])
  parts = []
  if run:
    parts.append(
        f"{', '.join(run)} follow the run's --client_weighting, by examples "
        "(FedAvg's experiments) or uniform (its algorithm box)"
    )
  for m in own:
    parts.append(
        f'{m.label} weighs by examples or, with --{m.uniform_option}, '
        'uniformly (its own switch)'
    )
  return (
      f'The client weighting of {tuned} is tuned along the same kind of '
      f"line: {'; '.join(parts)}. The other methods weigh their clients by "
      'their own rule. '
  )


def plateau_start(curve: Sequence[Sequence[float]]) -> Optional[float]:
  """The round the plateau is judged from: the last evaluation at or before
  4/5 of the final round (None: no such evaluation before the final one)."""
  if len(curve) < 2:
    return None
  before = [row[0] for row in curve[:-1] if row[0] <= 0.8 * curve[-1][0]]
  return before[-1] if before else None


def plateau_gain(
    curve: Sequence[Sequence[float]], column: int = 1
) -> Optional[float]:
  """Accuracy gained from `plateau_start` to the final round (points).

  `curve`: `[round, mean, sq10]` rows; `column` 1 is the mean, 2 the worst
  10% (None: no start to judge from).
  """
  start = plateau_start(curve)
  if start is None:
    return None
  row = next(r for r in curve if r[0] == start)
  return 100 * (curve[-1][column] - row[column])


def _plateau_verdict(curves: dict[int, list]) -> str:
  seeds = sorted(curves)
  judged = [s for s in seeds if plateau_start(curves[s]) is not None]
  if not judged:
    return ''
  windows = {(plateau_start(curves[s]), curves[s][-1][0]) for s in judged}
  if len(windows) == 1:
    ((start, end),) = windows
    window = f'from round {start:g} to {end:g}'
    if start != 0.8 * end:
      window += (
          ' (the last evaluation at or before 4/5 of the rounds; the last '
          f'fifth starts at {0.8 * end:g})'
      )
    else:
      window += ' (the last fifth of the rounds)'
  else:
    window = (
        'from the last evaluation at or before 4/5 of the rounds to the end'
    )
  gains = [plateau_gain(curves[s]) for s in judged]
  flat = max(abs(g) for g in gains) < 1.0
  return (
      f'Mean accuracy gained {window}: '
      + ', '.join(
          f'{g:+.1f} on seed {s} (worst10 {plateau_gain(curves[s], 2):+.1f})'
          for s, g in zip(judged, gains)
      )
      + ' points ('
      + (
          'the mean under 1 point on every seed: plateaued'
          if flat
          else '**1 point or more: not plateaued**'
      )
      + ').'
      + (
          ''
          if len(judged) == len(seeds)
          else ' Too short a curve to judge: seed(s) '
          + ', '.join(str(s) for s in seeds if s not in judged)
          + '.'
      )
  )


def _fedavg_curves(report: Report) -> dict[int, list]:
  """FedAvg's validation curves at its choice, by seed ({}: none to draw)."""
  choice = report.choices.get('fedavg')
  curves = choice.curves.get(choice.best, {}) if choice else {}
  if not curves or max(len(c) for c in curves.values()) < 2:
    return {}
  return curves


def curve_section(report: Report, png: Optional[str] = None) -> list[str]:
  """FedAvg's validation curve at its chosen configuration (its plateau)."""
  curves = _fedavg_curves(report)
  if not curves:
    return []
  choice = report.choices['fedavg']
  seeds = sorted(curves)
  rounds = sorted({row[0] for c in curves.values() for row in c})
  by = {s: {row[0]: row for row in curves[s]} for s in seeds}
  lines = [
      '| round | '
      + ' | '.join(f'seed {s}: mean / worst10 %' for s in seeds)
      + ' |',
      '|---:|' + '---:|' * len(seeds),
  ]
  for r in rounds:
    cells = [
        f'{100 * by[s][r][1]:.1f} / {100 * by[s][r][2]:.1f}'
        if r in by[s]
        else '-'
        for s in seeds
    ]
    lines.append(f'| {r} | ' + ' | '.join(cells) + ' |')
  verdict = _plateau_verdict(curves)
  return [
      f"**FedAvg's validation curve** at its chosen configuration "
      f'({choice.best.describe(choice.method)}), selection seeds: '
      'validation accuracy mean / worst 10% (superquantile), in %. ' + verdict,
      '',
      *lines,
      '',
  ] + (
      [f"![FedAvg's validation curve]({os.path.basename(png)})", '']
      if png
      else []
  )


def write_curve(report: Report, png: str) -> bool:
  """FedAvg's validation curves (mean and worst 10%) as a PNG, if any."""
  curves = _fedavg_curves(report)
  if not curves:
    return False
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(6.5, 4))
  for seed, curve in sorted(curves.items()):
    rounds = [row[0] for row in curve]
    for column, style, name in ((1, '-', 'mean'), (2, '--', 'worst 10%')):
      ax.plot(
          rounds,
          [100 * row[column] for row in curve],
          style,
          marker='o',
          markersize=3,
          label=f'seed {seed}, {name}',
      )
  ax.set_xlabel('round')
  ax.set_ylabel('validation accuracy (%)')
  ax.set_title("FedAvg's validation curve at its choice", fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  atomic.save_figure(fig, png, dpi=100, format='png')
  plt.close(fig)
  return True


def time_rows(report: Report) -> list[tuple[str, dict[str, float]]]:
  """Per method, medians over its reported runs of where the time went.

  A run's `wall_s` against its record's timed parts (`seconds`: training,
  evaluation, metrics, checkpoints; the rest is start-up: data, building,
  tracing); training examples/s is its examples over its training seconds.
  Runs without timed parts (records made before them) are left out.
  """
  out = []
  for method in report.methods:
    runs = [
        r
        for r in report.results.get(method.name, [])
        if r.get('seconds') and r.get('wall_s') and 'training' in r['seconds']
    ]
    if not runs:
      continue
    shares = {}
    for r in runs:
      parts = r['seconds']
      timed = sum(parts.values())
      wall = r.get('timed_wall_s', r['wall_s'])  # The last invocation's.
      row = {k: parts[k] / wall for k in parts}
      row['start-up'] = max(0.0, wall - timed) / wall
      row['wall_s'] = r['wall_s']
      row['examples/s'] = r.get('timed_examples', r['examples']) / max(
          parts['training'], 1e-9
      )
      if report.bound:
        row['of bound'] = row['examples/s'] / report.bound['examples_per_s']
      for k, v in row.items():
        shares.setdefault(k, []).append(v)
    out.append(
        (method.label, {k: float(np.median(v)) for k, v in shares.items()})
    )
  return out


def time_table(report: Report) -> list[str]:
  """The page's table of `time_rows` ([] if no record has timed parts)."""
  rows = time_rows(report)
  if not rows:
    return []
  parts = ('start-up', 'training', 'evaluation', 'metrics', 'checkpoints')
  bound = report.bound
  lines = [
      '| algorithm | wall s | '
      + ' | '.join(f'{p} %' for p in parts)
      + ' | training examples/s |'
      + (' of the bound |' if bound else ''),
      '|---|' + '---:|' * (len(parts) + 2 + bool(bound)),
  ]
  for label, row in rows:
    lines.append(
        f'| {label} | {row["wall_s"]:.0f} | '
        + ' | '.join(f'{100 * row.get(p, 0.0):.0f}' for p in parts)
        + f' | {row["examples/s"]:,.0f} |'
        + (f' {row["of bound"]:.2f} |' if bound else '')
    )
  text = [
      "**Where a reported run's time goes** (medians over the reported "
      'seeds; start-up is the wall time outside the round loop: data, '
      "building and tracing; a fine-tuning baseline reuses FedAvg's runs)"
      + (
          f". The bound is bench_suite's `fedavg/bound` in `{bound['file']}` "
          f"({bound['task']}): {bound['examples_per_s']:,.0f} examples/s, "
          "one model trained on the round's clients' batches concatenated "
          '(the fastest a vectorized engine could go), measured alone; the '
          "runs' examples/s are measured in their own processes, beside the "
          "benchmark's other jobs"
          if bound
          else ''
      )
      + ':',
      '',
      *lines,
      '',
  ]
  return text


def page(report: Report, pngs: Sequence[str]) -> str:
  """The results page (Markdown)."""
  b = report.budget
  fedavg0 = report.results['fedavg'][0]
  task_line = fedavg0.get('task', '')
  scale = report.setting.scale
  if report.overrides:
    scale += (
        " (the setting's defaults; this run overrides "
        + ' '.join(report.overrides)
        + ')'
    )
  text = [
      f'# Tail benchmark: {report.setting.name}',
      '',
      '```',
      'python -m run.tail_benchmark.benchmark ' + shlex.join(report.argv[1:]),
      '```',
      '',
  ]
  if task_line:
    text += [f'**Task.** {task_line}.', '']
  text += [
      f'**Populations.** Data seed {report.data_seed} in every run: the same '
      'training clients, unseen clients and per-client training / '
      'validation / held-out parts in selection and report; the run seeds '
      'vary client sampling, shuffles and initialisation only.',
      '',
      f'**Budget, the same for every algorithm.** {b.rounds} rounds, '
      f'{b.clients_per_round} clients per round, {b.local_epochs} local '
      f'epoch(s), batch {b.batch_size}; each algorithm at its own client '
      f'learning rate (below); task flags `{" ".join(report.task_flags)}`. '
      f'Scale: {scale}. Examples processed per run are in the tables: '
      "algorithms whose clients do more than local training (AFL's "
      "gradient at the broadcast model, Ditto's personal passes, Fed+'s "
      "local steps) process what their paper's client step needs; "
      "fine-tuning counts its epochs over the clients' training parts. "
      "Delta-FL's count holds only the clients it trains (those above its "
      'loss quantile): its loss pass over every sampled client at the '
      'broadcast model (forward only) is not counted, but its time is in '
      'the training seconds, so its training examples/s understates its '
      'speed.',
      '',
      f"**Selection** on the training clients' validation part only "
      f'(`--holdout=validation`: the held-out part and the unseen clients are '
      f'built, then dropped before training), selection seeds '
      f"{list(report.sel_seeds)}. Each algorithm's knob and client learning "
      'rate are tuned jointly by successive halving'
      + (
          f': every configuration first trains {b.first_rung} of the '
          f'{b.rounds} rounds on the first seed and the best '
          f'{"third" if abs(report.keep - 1 / 3) < 1e-9 else report.keep} '
          'continues to the full rounds; then over the seeds'
          if b.first_rung
          else ' over the seeds'
      )
      + f': every configuration{" still in" if b.first_rung else ""} runs '
      'on the first seed, the best '
      f'{"third" if abs(report.keep - 1 / 3) < 1e-9 else report.keep} goes on '
      'to the next (configurations per rung below). '
      + server_lr_sentence(report)
      + weighting_sentence(report)
      + 'Criterion: the '
      'validation worst-10% accuracy as a superquantile (continuous); where '
      'it ties (the worst 10% all at 0), the worst 20%, 30%, 50%, then the '
      'mean accuracy, and the superquantile of the loss last; each a mean '
      'over the seeds a configuration ran (personal models for Ditto, Fed+ '
      'and the baselines). A choice at '
      'an edge of its grid extends it one step (up to the allowed '
      "extensions, within the knob's range), run on every selection seed; "
      "a choice still at an edge is **marked**. The baselines' learning "
      "rate and epochs are chosen the same way on FedAvg's chosen selection "
      'runs, each apart: FedAvg + fine-tuning from its final model, 0 to '
      f'{b.fine_tune_epochs} epochs at first (a choice at the most epochs '
      'tried doubles them), local training from its initial model, 0 to '
      f"{getattr(b, 'local_epochs_max', b.fine_tune_epochs)} epochs (never "
      'doubled: a choice there is marked); a choice at an edge rate tries the '
      'next rate.',
      '',
      *rules_paragraph(report),
      selection_table(report),
      '',
      *curve_section(report, pngs[2] if len(pngs) > 2 else None),
      f'**Compute.** Selection: {report.wall["select"] / 60:.1f} min of runs '
      f'(wall time summed over runs); report: '
      f'{report.wall["final"] / 60:.1f} min.',
      '',
      *origins_section(report),
      *time_table(report),
  ]
  for split, title in SPLITS:
    rows = report.rows(split)
    if len(rows) < 2:
      continue
    note = {
        'test': 'Ditto, Fed+ and the baselines with their personal models',
        'unseen': 'global models for all',
        'unseen_half': (
            'each unseen client fine-tunes on the first half of its examples, '
            "in stored order, and is evaluated on the rest; FedAvg's global "
            'model on the same halves'
        ),
    }[split]
    text += [
        f'**{title}** ({note}), reported seeds {list(report.seeds)}: accuracy '
        'statistics in %, loss sq10 in nats, variance in %^2 across clients; '
        'mean (std over seeds, ddof 1).',
        '',
        results_table(report, split),
        '',
        f'Paired differences against FedAvg, {title[4:].lower()} (per-seed '
        'difference, mean (std) in points, loss sq10 in nats, variance in '
        '%^2; the seeds where the algorithm is better: higher accuracy, '
        'lower loss, or, for variance, lower, which a uniformly worse model '
        'also achieves; +- the 95% half-width '
        't(n-1) std / sqrt(n), per comparison, not corrected for the number '
        'of comparisons):',
        '',
        paired_table(paired_rows(report, split)),
        '',
        resolution_line(report, split),
        '',
    ]
  start = ft_start_line(report)
  text += [
      '**Findings (generated from the numbers above).**',
      '',
      operating_point(report, 'test', 'held-out data'),
      '',
      *([start, ''] if start else []),
      *findings(
          paired_rows(report, 'test'), 'held-out data', example_steps(report)
      ),
      *unstable_lines(report),
      *trivial_line(report),
      '',
      '**Summary** (the README repeats it):',
      '',
      *summary_table(report),
      '',
      f'![per-client accuracy CDFs]({os.path.basename(pngs[0])})',
      '',
      f'![paired differences]({os.path.basename(pngs[1])})',
      '',
      "<details><summary>Every run's command</summary>",
      '',
      '```',
      *sorted(set(report.commands)),
      '```',
      '',
      '</details>',
      '',
  ]
  return portable(report, '\n'.join(text))


def results_json(report: Report) -> dict[str, Any]:
  """The choices and every reported statistic, for scripts."""

  def choice_json(choice):
    return {
        'chosen': dataclasses.asdict(choice.best),
        'edges': list(choice.edges),
        'tried': [
            {'config': dataclasses.asdict(c), 'seeds': by}
            for c, by in choice.tried.items()
        ],
    }

  return {
      'choices': {n: choice_json(c) for n, c in report.choices.items()},
      'fine_tuning': {n: choice_json(c) for n, c in report.ft_choices.items()},
      'reported': {
          m.name: [
              {split: _stats(cols) for split, cols in r['splits'].items()}
              | {'examples': r['examples'], 'wall_s': r['wall_s']}
              | ({'diverged': r['diverged']} if r.get('diverged') else {})
              for r in report.results.get(m.name, [])
          ]
          for m in report.methods
      },
  }


def write_pictures(report: Report, png_cdf: str, png_diff: str) -> None:
  """Per-client accuracy CDFs and the paired differences, as PNG files."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  # The splits that compare methods; FedAvg's alone if it ran alone.
  splits = [(s, t) for s, t in SPLITS if len(report.rows(s)) >= 2] or [
      (s, t) for s, t in SPLITS if report.rows(s)
  ]
  fig, axes = plt.subplots(1, len(splits), figsize=(6.5 * len(splits), 4.8))
  axes = np.atleast_1d(axes)
  for ax, (split, title) in zip(axes, splits):
    for method, label, _ in report.rows(split):
      acc = np.concatenate(
          [
              r['splits'][split]['accuracy']
              for r in report.results[method.name]
              if not r.get('diverged')
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
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc='upper left')
  fig.tight_layout()
  atomic.save_figure(fig, png_cdf, dpi=100, format='png')
  plt.close(fig)

  rows = paired_rows(report, 'test')
  labels = list(dict.fromkeys(r[0].label for r in rows))
  fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(labels) + 1.5))
  fedavg = next(p for m, _, p in report.rows('test') if m.name == 'fedavg')
  for ax, column in zip(axes, ('mean', 'worst10')):
    ys = []
    paired = {r[0].name for r in rows}  # Methods with a seed both finished.
    others = [r for r in report.rows('test') if r[0].name in paired]
    for y, (_, _, per_seed) in enumerate(others):
      d = 100 * np.array(
          [
              s[column] - b[column]
              for s, b in zip(per_seed, fedavg)
              if s is not None and b is not None
          ]
      )
      ax.plot(d, np.full(len(d), y), 'o', alpha=0.5, markersize=4)
      ax.errorbar(
          d.mean(),
          y,
          xerr=d.std(ddof=1) if len(d) > 1 else 0,
          fmt='ks',
          markersize=5,
          capsize=3,
      )
      ys.append(y)
    ax.axvline(0, color='grey', linewidth=1)
    ax.set_yticks(ys)
    ax.set_yticklabels(labels)
    ax.set_xlabel(f'{column} accuracy minus FedAvg (points), held-out data')
    ax.grid(alpha=0.3, axis='x')
  axes[0].set_title('per seed (dots), mean +- std (squares)')
  fig.tight_layout()
  atomic.save_figure(fig, png_diff, dpi=100, format='png')
  plt.close(fig)
