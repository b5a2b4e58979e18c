# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""Figures and a summary table from finished runs' output folders.

  python -m run.report --runs=output/fedavg,output/deltafl \
      --output_dir=output/report [--labels=FedAvg,Delta-FL]

Reads the folders written by `run.train` (or `run.program`): `metrics.csv`,
`summary.json`, `config.json` and the final `clients/round_NNNNN.csv`, and
writes to `--output_dir`, every figure overlaying all the runs:

* `accuracy.png`, `loss.png`: training metrics of the round's participants
  and the per-client test metrics (mean over clients, and the worst 10% of
  clients dashed) over rounds;
* `error_histogram.png`: histogram of the final per-client test error (the
  Delta-FL paper's Figure 4);
* `client_size.png`: per-client training loss and test error against the
  client's number of examples (the Delta-FL paper's Figure 5);
* `summary.md`: a Markdown table of the final per-client statistics, with
  the figures.

A folder that is not a run, or a run that has not finished (no
`summary.json`), stops the command with one `report: error: ...` line.
"""

import argparse
import csv
import dataclasses
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import matplotlib
from matplotlib import figure as mpl_figure
from matplotlib import pyplot as plt
import numpy as np

from run import atomic

FIGURES = ('accuracy.png', 'loss.png', 'error_histogram.png', 'client_size.png')
# Rows of the summary table: (summary key, statistic, column title).
TABLE_COLUMNS = (
    ('test/accuracy', 'mean', 'test acc. mean'),
    ('test/accuracy', 'weighted_mean', 'test acc. pooled'),
    ('test/accuracy', 'worst10', 'test acc. worst 10%'),
    ('test/accuracy', 'p10', 'test acc. p10'),
    ('test/accuracy', 'variance', 'test acc. variance'),
    ('test/error', 'p90', 'test error p90'),
    ('test/loss', 'mean', 'test loss mean'),
    ('train/loss', 'p90', 'train loss p90'),
)
# run.program writes TFF's program-logic names; map them to run.train's.
_PROGRAM_KEYS = {
    'model_metrics/loss': 'train/loss',
    'model_metrics/accuracy': 'train/accuracy',
}


class ReportError(ValueError):
  """A folder is not a finished run."""


@dataclasses.dataclass
class Run:
  """One finished run, as read from its output folder.

  Attributes:
    path: The folder.
    label: Its name in legends and the table.
    config: `config.json` (or `program_config.json`), possibly empty.
    metrics: Columns of `metrics.csv` (`round_num`, `train/loss`, ...), NaN
      where a round has no value.
    test_curve: Columns of the per-client test metrics over evaluation
      rounds: `round_num`, `accuracy_mean`, `accuracy_worst10`, `loss_mean`,
      `loss_worst10` (NaN where the folder lacks them).
    round_num: The final round.
    test_curve_kind: What `test_curve`'s `*_mean` is: the mean over clients
      (`run.train`) or pooled over examples (`run.program`'s evaluations).
    summaries: `summary.json`'s per-client statistics, keyed `split/metric`.
    clients: Final per-client values by split: `{'test': {'num_examples',
      'loss', 'accuracy'}, 'train': {...}}` as arrays.
  """

  path: str
  label: str
  config: dict[str, Any]
  metrics: dict[str, np.ndarray]
  test_curve: dict[str, np.ndarray]
  round_num: int
  summaries: dict[str, dict[str, float]]
  clients: dict[str, dict[str, np.ndarray]]
  test_curve_kind: str = 'mean over clients'


def _damaged(path: str, error: Exception) -> ReportError:
  reason = ' '.join(str(error).split()) or type(error).__name__
  return ReportError(
      f"{path}: damaged or not a run's file ({reason}); "
      'rerun the run to rewrite it'
  )


def _read_csv(path: str) -> dict[str, np.ndarray]:
  try:
    with open(path, newline='', encoding='utf-8') as f:
      rows = list(csv.DictReader(f))
  except (UnicodeDecodeError, csv.Error) as e:
    raise _damaged(path, e) from None
  if not rows:
    return {}
  columns = {}
  for key in rows[0]:
    values = []
    for row in rows:
      try:
        values.append(float(row.get(key) or 'nan'))
      except ValueError:
        values.append(math.nan)
    columns[key] = np.asarray(values)
  return columns


def _read_clients(path: str) -> dict[str, dict[str, np.ndarray]]:
  """Per-client values by split; `ReportError` naming `path` if damaged."""
  try:
    with open(path, newline='', encoding='utf-8') as f:
      rows = list(csv.DictReader(f))
    clients: dict[str, dict[str, list]] = {}
    for row in rows:
      if None in row or None in row.values():
        raise ValueError(
            f'line {rows.index(row) + 2} has '
            f'{"more" if None in row else "fewer"} cells than '
            'the header'
        )
      split = clients.setdefault(row['split'], {})
      for key, value in row.items():
        if key in ('split', 'client_id'):
          split.setdefault(key, []).append(value)
        else:
          split.setdefault(key, []).append(float(value) if value else math.nan)
    for split, values in clients.items():
      for name in ('num_examples', 'accuracy'):
        if name not in values:
          raise KeyError(f'no {name} column')
  except (UnicodeDecodeError, csv.Error, ValueError, KeyError) as e:
    raise _damaged(path, e) from None
  return {
      split: {k: np.asarray(v) for k, v in values.items()}
      for split, values in clients.items()
  }


def _test_curve(path: str, metrics: Mapping[str, np.ndarray]):
  nan = lambda n: np.full(n, math.nan)
  if 'eval/test/accuracy/mean' in metrics:
    keep = ~np.isnan(metrics['eval/test/accuracy/mean'])
    curve = {'round_num': metrics['round_num'][keep]}
    for metric in ('accuracy', 'loss'):
      for stat in ('mean', 'worst10'):
        column = metrics.get(f'eval/test/{metric}/{stat}')
        curve[f'{metric}_{stat}'] = (
            column[keep] if column is not None else nan(int(keep.sum()))
        )
    return curve
  eval_path = os.path.join(path, 'evaluation.csv')
  if os.path.exists(eval_path):  # run.program: pooled over test clients.
    evaluation = _read_csv(eval_path)
    if evaluation:
      n = len(evaluation['round_num'])
      order = np.argsort(evaluation['round_num'])
      return {
          'round_num': evaluation['round_num'][order],
          'accuracy_mean': evaluation['model_metrics/accuracy'][order],
          'loss_mean': evaluation['model_metrics/loss'][order],
          'accuracy_worst10': nan(n),
          'loss_worst10': nan(n),
      }
  return {
      k: np.zeros(0)
      for k in (
          'round_num',
          'accuracy_mean',
          'loss_mean',
          'accuracy_worst10',
          'loss_worst10',
      )
  }


def _read_json(path: str) -> dict[str, Any]:
  try:
    with open(path, encoding='utf-8') as f:
      value = json.load(f)
  except (UnicodeDecodeError, ValueError) as e:
    raise _damaged(path, e) from None
  if not isinstance(value, dict):
    raise _damaged(path, TypeError(f'a {type(value).__name__}, not a table'))
  return value


def load_run(path: str, label: Optional[str] = None) -> Run:
  """Reads a finished run's output folder.

  Args:
    path: A folder written by `run.train` or `run.program`.
    label: Its name in the figures (default: the folder's name).

  Returns:
    The run.

  Raises:
    ReportError: If `path` is not a run folder or the run has not finished.
  """
  if not os.path.isdir(path):
    raise ReportError(f'{path}: no such folder')
  metrics_path = os.path.join(path, 'metrics.csv')
  if not os.path.exists(metrics_path):
    raise ReportError(
        f'{path}: not a run folder (no metrics.csv); pass the folders that '
        'run.train wrote, <root_output_dir>/<experiment_name>'
    )
  summary_path = os.path.join(path, 'summary.json')
  if not os.path.exists(summary_path):
    raise ReportError(
        f'{path}: the run has not finished (no summary.json); rerun its '
        'command to resume and finish it'
    )
  summary = _read_json(summary_path)
  try:
    round_num = int(summary['round_num'])
    if not isinstance(summary['summaries'], dict):
      raise TypeError('summaries is not a table')
  except (KeyError, TypeError, ValueError) as e:
    raise _damaged(summary_path, e) from None
  if not any(
      isinstance(summary['summaries'].get(key), dict)
      and _format(summary['summaries'][key].get(stat)) != 'n/a'
      for key, stat, _ in TABLE_COLUMNS
  ):  # A table of 'n/a' only would pass for a report.
    raise _damaged(
        summary_path,
        ValueError('no finite statistic of the report table in summaries'),
    )
  clients_path = os.path.join(path, 'clients', f'round_{round_num:05d}.csv')
  if not os.path.exists(clients_path):
    raise ReportError(
        f'{path}: summary.json is for round {round_num} but '
        f'{os.path.relpath(clients_path, path)} is missing'
    )
  config = {}
  for name in ('config.json', 'program_config.json'):
    config_path = os.path.join(path, name)
    if os.path.exists(config_path):
      config = _read_json(config_path)
      break
  metrics = _read_csv(metrics_path)
  if 'round_num' not in metrics:
    raise ReportError(f'{path}: metrics.csv has no round_num column')
  for program_key, key in _PROGRAM_KEYS.items():
    if program_key in metrics and key not in metrics:
      metrics[key] = metrics[program_key]
  order = np.argsort(metrics['round_num'], kind='stable')
  metrics = {k: v[order] for k, v in metrics.items()}
  clients = _read_clients(clients_path)
  if 'test' not in clients:
    raise ReportError(f'{clients_path}: no test clients')
  per_client_curve = 'eval/test/accuracy/mean' in metrics
  return Run(
      path=path,
      label=label or os.path.basename(os.path.normpath(path)),
      config=config,
      metrics=metrics,
      test_curve=_test_curve(path, metrics),
      round_num=round_num,
      summaries=summary['summaries'],
      clients=clients,
      test_curve_kind=(
          'mean over clients' if per_client_curve else 'pooled over examples'
      ),
  )


def _colors(n: int):
  cycle = plt.rcParams['axes.prop_cycle'].by_key()['color']
  return [cycle[i % len(cycle)] for i in range(n)]


def _finish(fig: mpl_figure.Figure, path: Optional[str]) -> mpl_figure.Figure:
  fig.tight_layout()
  if path is not None:
    atomic.save_figure(fig, path, dpi=100)
    plt.close(fig)
  return fig


def plot_curves(
    runs: Sequence[Run], metric: str, path: Optional[str] = None
) -> mpl_figure.Figure:
  """Training and per-client test `metric` (accuracy or loss) over rounds.

  Args:
    runs: The runs, overlaid.
    metric: `accuracy` or `loss`.
    path: Where to save the PNG (and close the figure); None: only return it
      (in a notebook, it is shown).

  Returns:
    The figure.
  """
  fig, (train_ax, test_ax) = plt.subplots(1, 2, figsize=(11, 4))
  for run, color in zip(runs, _colors(len(runs))):
    values = run.metrics.get(f'train/{metric}')
    if values is not None:
      keep = ~np.isnan(values)
      train_ax.plot(
          run.metrics['round_num'][keep],
          values[keep],
          color=color,
          label=run.label,
      )
    curve = run.test_curve
    if len(curve['round_num']):
      test_ax.plot(
          curve['round_num'],
          curve[f'{metric}_mean'],
          'o-',
          color=color,
          label=f'{run.label}: {run.test_curve_kind}',
      )
      worst = curve[f'{metric}_worst10']
      if not np.all(np.isnan(worst)):
        test_ax.plot(
            curve['round_num'],
            worst,
            's--',
            color=color,
            label=f'{run.label}: worst 10% of clients',
        )
  name = metric.capitalize()
  train_ax.set(
      title=f'Training {metric} (round participants)',
      xlabel='round',
      ylabel=name,
  )
  test_ax.set(title=f'Per-client test {metric}', xlabel='round', ylabel=name)
  for ax in (train_ax, test_ax):
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=8)
  return _finish(fig, path)


def plot_error_histogram(
    runs: Sequence[Run], path: Optional[str] = None
) -> mpl_figure.Figure:
  """Histogram of the final per-client test error, runs overlaid.

  Saved to `path` (and closed) when given; returns the figure.
  """
  fig, ax = plt.subplots(figsize=(7, 4.5))
  bins = np.linspace(0.0, 1.0, 21)
  for run, color in zip(runs, _colors(len(runs))):
    error = 1.0 - run.clients['test']['accuracy']
    ax.hist(
        error,
        bins=bins,
        histtype='step',
        linewidth=2,
        color=color,
        label=f'{run.label} (mean {error.mean():.3f}, '
        f'p90 {np.percentile(error, 90):.3f})',
    )
    ax.axvline(error.mean(), color=color, linestyle=':', linewidth=1)
  ax.set(
      title='Per-client test error (final model)',
      xlabel='misclassification error on the client',
      ylabel='number of clients',
      xlim=(0, 1),
  )
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  return _finish(fig, path)


def plot_client_size(
    runs: Sequence[Run], path: Optional[str] = None
) -> mpl_figure.Figure:
  """Per-client training loss and test error against client size.

  Saved to `path` (and closed) when given; returns the figure.
  """
  fig, (train_ax, test_ax) = plt.subplots(1, 2, figsize=(11, 4.5))
  markers = 'ox^sv<>dp*'
  for i, (run, color) in enumerate(zip(runs, _colors(len(runs)))):
    style = dict(
        marker=markers[i % len(markers)],
        color=color,
        alpha=0.6,
        s=18,
        label=run.label,
    )
    if 'train' in run.clients:
      train = run.clients['train']
      train_ax.scatter(train['num_examples'], train['loss'], **style)
    test = run.clients['test']
    test_ax.scatter(test['num_examples'], 1.0 - test['accuracy'], **style)
  train_ax.set(title='Training clients: loss vs. size', ylabel='loss')
  test_ax.set(
      title='Test clients: error vs. size',
      ylabel='misclassification error',
      ylim=(-0.03, 1.03),
  )
  for ax in (train_ax, test_ax):
    ax.set_xscale('log')
    ax.set_xlabel('examples on the client')
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=8)
  if 'train' not in runs[0].clients:
    train_ax.text(
        0.5,
        0.5,
        'no training-client evaluation\n(--eval_train_clients=false)',
        ha='center',
        transform=train_ax.transAxes,
    )
  return _finish(fig, path)


def _format(value: Optional[float]) -> str:
  if (
      not isinstance(value, (int, float))
      or isinstance(value, bool)
      or not math.isfinite(value)
  ):
    return 'n/a'
  if abs(value) >= 100:
    return f'{value:.1f}'
  return f'{value:.4f}'


# The option the summary table shows beside an algorithm's name, and its
# symbol, by algorithm: the registry entries' tuned options
# (tests/test_report.py checks them against `tff_algos.registry`, which this
# command does not import: it would load TensorFlow to draw figures).
SYMBOLS = {
    'fedprox': ('proximal_strength', 'mu'),
    'qffl': ('q', 'q'),
    'qfedsgd': ('q', 'q'),
    'term': ('tilt', 't'),
    'deltafl': ('theta', 'theta'),
    'afl': ('afl_lambda_lr', 'lr_l'),
}


def _algorithm(run: Run) -> str:
  config = run.config
  name = config.get('algorithm', '?')
  if name in SYMBOLS and SYMBOLS[name][0] in config:
    key, symbol = SYMBOLS[name]
    return f'{name} ({symbol}={config[key]:g})'
  return name


def summary_markdown(
    runs: Sequence[Run], figures: Sequence[str] = FIGURES
) -> str:
  """The Markdown summary: a table of final per-client statistics."""
  header = ['run', 'algorithm', 'rounds', 'test clients'] + [
      title for _, _, title in TABLE_COLUMNS
  ]
  lines = [
      '# Run report',
      '',
      'Final model, statistics over clients (accuracy variance in '
      'percent^2, as the q-FFL tables; "pooled" weighs clients by '
      'examples).',
      '',
      '| ' + ' | '.join(header) + ' |',
      '|' + '|'.join('---' for _ in header) + '|',
  ]
  for run in runs:
    cells = [
        run.label,
        _algorithm(run),
        str(run.round_num),
        str(len(run.clients['test']['accuracy'])),
    ]
    for key, stat, _ in TABLE_COLUMNS:
      summary = run.summaries.get(key)
      cells.append(
          _format(summary.get(stat) if isinstance(summary, dict) else None)
      )
    lines.append('| ' + ' | '.join(cells) + ' |')
  lines += ['', 'Folders: ' + ', '.join(f'`{r.path}`' for r in runs), '']
  for figure in figures:
    lines += [f'![{figure[:-4]}]({figure})', '']
  return '\n'.join(lines)


def write_report(
    run_dirs: Sequence[str],
    output_dir: str,
    labels: Optional[Sequence[str]] = None,
) -> dict[str, str]:
  """Writes the figures and `summary.md` for `run_dirs` to `output_dir`.

  Args:
    run_dirs: Finished runs' output folders.
    output_dir: Where the report goes (created).
    labels: Names of the runs in the figures (default: folder names).

  Returns:
    `{file name: path}` of what was written.

  Raises:
    ReportError: For a missing or unfinished run, or mismatched labels.
  """
  if not run_dirs:
    raise ReportError('no run folders given')
  if labels is not None and len(labels) != len(run_dirs):
    raise ReportError(f'{len(labels)} labels for {len(run_dirs)} runs')
  runs = [
      load_run(d, labels[i] if labels else None) for i, d in enumerate(run_dirs)
  ]
  _make_output_dir(output_dir)
  paths = {
      name: os.path.join(output_dir, name) for name in FIGURES + ('summary.md',)
  }
  plot_curves(runs, 'accuracy', paths['accuracy.png'])
  plot_curves(runs, 'loss', paths['loss.png'])
  plot_error_histogram(runs, paths['error_histogram.png'])
  plot_client_size(runs, paths['client_size.png'])
  atomic.write_text(paths['summary.md'], summary_markdown(runs))
  return paths


class _Parser(argparse.ArgumentParser):
  """An argument parser whose errors are one `report: error:` line."""

  def error(self, message):
    print(f'report: error: {message}', file=sys.stderr)
    sys.exit(2)


def _make_output_dir(path: str) -> None:
  """Creates the report's folder (`ReportError` saying why it cannot)."""
  if os.path.lexists(path) and not os.path.isdir(path):
    raise ReportError(f'--output_dir: {path} is a file, not a folder')
  try:
    os.makedirs(path, exist_ok=True)
  except NotADirectoryError:
    raise ReportError(
        f'--output_dir: {path}: a folder on its path is a file'
    ) from None
  except OSError as e:
    raise ReportError(
        f'--output_dir: cannot create {path} ({e.strerror or e})'
    ) from None


def main(argv: Sequence[str]) -> int:
  """`python -m run.report`; returns the exit status (2: bad input)."""
  parser = _Parser(
      prog='report', description=__doc__.split('\n\n', maxsplit=1)[0]
  )
  parser.add_argument(
      '--runs', required=True, help='Comma-separated run output folders.'
  )
  parser.add_argument(
      '--output_dir', required=True, help='Where the PNGs and summary.md go.'
  )
  parser.add_argument(
      '--labels',
      default=None,
      help='Comma-separated names of the runs (default: the ' 'folder names).',
  )
  args = parser.parse_args(argv[1:])
  matplotlib.use('Agg')  # Files only, no display.
  run_dirs = [d for d in args.runs.split(',') if d]
  labels = args.labels.split(',') if args.labels else None
  try:
    paths = write_report(run_dirs, args.output_dir, labels)
  except (ReportError, OSError) as e:
    print(f'report: error: {e}', file=sys.stderr)
    return 2
  print(
      f'Report of {len(run_dirs)} run(s): '
      + ', '.join(paths[name] for name in sorted(paths))
  )
  return 0


def run_main() -> None:
  """Console-script entry point."""
  sys.exit(main(sys.argv))


if __name__ == '__main__':
  run_main()
