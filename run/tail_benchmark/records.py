# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The tail benchmark's runs and their records.

`Runs` runs a training run, a fine-tuning or the trivial score in a
long-lived worker (`run_pool`), or reads it back from its record in
`--records_dir`; a record holds its arguments, per-client arrays, curve,
examples, wall time and origin (`origin`). The worker makes a training run's
record from the run's folder (`make_record`) and sends it back, as it sends
a fine-tuning's result and the trivial scores. `record_problem` and
`fine_tuning_problem` say what is wrong with a damaged record.
"""

import contextlib
import csv
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

from run import atomic
from run.tail_benchmark import origin as origin_lib
from run.tail_benchmark import pool as run_pool


class MissingRecord(RuntimeError):
  """`--from_records` and a run has no record."""


def warn(text: str) -> None:
  print(f'benchmark: warning: {text}', file=sys.stderr, flush=True)


RECORD = 'benchmark_run.json'  # In a run folder: its command and wall time.


WALL = 'benchmark_wall.json'  # Wall time of a run's unfinished invocations.


def flag_value(args: Sequence[str], name: str) -> str:
  return next(a.split('=', 1)[1] for a in args if a.startswith(f'--{name}='))


def with_flags(
    args: Sequence[str], values: Mapping[str, Any], add_missing: bool = True
) -> list[str]:
  """`args` with `--NAME=value` for each `values` item in place of the
  flag's own, in order; a flag `args` lacks is appended (or, with
  `add_missing=False`, not added)."""
  out, seen = [], set()
  for arg in args:
    name = arg[2:].split('=', 1)[0] if arg.startswith('--') else None
    if name in values:
      arg = f'--{name}={values[name]}'
      seen.add(name)
    out.append(arg)
  if add_missing:
    out += [f'--{n}={v}' for n, v in values.items() if n not in seen]
  return out


def load_json(path: str) -> tuple[Optional[Any], Optional[str]]:
  """`(content, None)`; `(None, None)` for a missing file; `(None, error
  name)` for an unreadable one."""
  try:
    with open(path) as f:
      return json.load(f), None
  except FileNotFoundError:
    return None, None
  except (OSError, ValueError) as e:
    return None, type(e).__name__


def read_json(path: str, what: str) -> Optional[Any]:
  """A JSON file's content; None (with a warning if damaged) otherwise."""
  content, error = load_json(path)
  if error:
    warn(f'{path}: unreadable {what} ({error}); doing it again')
  return content


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


def has_clients(run_path: str, personal: bool) -> bool:
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


def round_seconds(run_path: str) -> list[float]:
  """The `round_seconds` column of a run's `metrics.csv`, in order."""
  out = []
  with open(os.path.join(run_path, 'metrics.csv'), newline='') as f:
    for row in csv.DictReader(f):
      with contextlib.suppress(KeyError, TypeError, ValueError):
        out.append(float(row['round_seconds']))
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
  timing = read_json(os.path.join(path, 'timing.json'), 'timing')
  mark = read_json(os.path.join(path, RECORD), RECORD)
  if not isinstance(timing, dict) or not isinstance(mark, dict):
    return {}
  out = {'seconds': {k: v for k, v in timing.items() if k != 'first_round'}}
  if 'first_round' in timing and 'last_wall_s' in mark:
    out['timed_wall_s'] = mark['last_wall_s']
    out['timed_examples'] = _examples(path, rounds) - _examples(
        path, int(timing['first_round']) - 1
    )
  return out


def rounded(tree):
  """Per-client values to 6 decimals: records stay a few KB."""
  if isinstance(tree, dict):
    return {k: rounded(v) for k, v in tree.items()}
  if isinstance(tree, list):
    return [rounded(v) for v in tree]
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


def portable(args: Any) -> Any:
  if not isinstance(args, list):
    return args
  return [
      a
      for a in args
      if not (isinstance(a, str) and a.startswith(_MACHINE_FLAGS))
  ]


class Runs(run_pool.Workers):
  """Runs and fine-tunings, from records when they exist, else in workers
  (`run_pool.Workers`: a thread's worker serves its current group)."""

  def __init__(
      self,
      records_dir: str,
      log_dir: str,
      jobs: int,
      from_records: bool,
      origin: Optional[dict] = None,
      accept_foreign: bool = False,
      worker_type: type = run_pool.RunWorker,
  ):
    # A run worker's class: local processes (`run_pool.RunWorker`) or Ray
    # actors (`ray_pool.RayRunWorker`), one per job.
    super().__init__(log_dir, jobs, worker_type)
    self.records_dir = records_dir
    self.from_records = from_records
    # This machine's origin (`origin.current`): new records carry
    # it; a record of another is redone unless `accept_foreign`.
    self.origin = origin
    self.accept_foreign = accept_foreign
    self.used: dict[str, dict] = {}  # Record name -> record, for the page.
    self.commands: list[str] = []
    self.wall = {'select': 0.0, 'final': 0.0}

  def check(self, args: list[str]) -> Optional[str]:
    """The training binary's error line for these flags, or None."""
    try:
      return self.worker().check(args)
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
    content, error = load_json(path)
    if error:
      self._damaged(path, f'unreadable: {error}')
    return content

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
    if portable(record.get('args')) != portable(args):
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
    if (
        needs_model
        and not record.get('diverged')
        and not os.path.isfile(self.model_path(name))
    ):
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
    name = name or flag_value(args, 'experiment_name')
    phase = name.split('_', 1)[0]
    # FedAvg's full runs keep their final model: the baselines fine-tune it.
    keep_model = full and flag_value(args, 'algorithm') == 'fedavg'
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
        atomic.write_bytes(
            self.model_path(name), self.worker().export_model(args)
        )
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
    key = portable(args)
    if record is not None and not (
        isinstance(record, dict) and 'label' in record
    ):
      self._damaged(path, 'no trivial label')
      record = None
    if isinstance(record, dict) and portable(record.get('args')) == key:
      with self._lock:
        self.used[name] = record
      return record
    if self.from_records:
      raise MissingRecord(f'no record {path}')
    try:
      record = {'args': list(args), **self.worker().trivial(args)}
    finally:
      self.release()
    if self.origin is not None:
      record['origin'] = self.origin
    atomic.write_text(path, json.dumps(rounded(record)))
    with self._lock:
      self.used[name] = record
    return record

  def _run(self, args: list[str], rounds: int, personal: bool) -> dict:
    """The run's record, made by a worker where the run ran
    (`make_record`): only the record comes back."""
    return self.worker().record(args, rounds, personal)

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
    run = flag_value(args, 'experiment_name')
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
      content = None  # The saved final model, sent to the worker.
      if start == 'final':
        model = self.model_path(run)
        if not os.path.isfile(model):
          raise RuntimeError(
              f"{model} is missing: FedAvg's run {run} has no saved final "
              'model to fine-tune (remove its record and the benchmark '
              'trains it again)'
          )
        options['model_path'] = os.path.abspath(model)
        with open(model, 'rb') as f:
          content = f.read()
      start_s = time.time()
      result = self.worker().fine_tune(args, content, **options)
      record = {
          'args': key,
          'splits': rounded({start: result[start]}),
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


def _finished(path: str, rounds: int, args: Sequence[str], say):
  """A finished run folder's wall time, or None (then it is run)."""
  summary = read_json(os.path.join(path, 'summary.json'), 'summary.json')
  mark = read_json(os.path.join(path, RECORD), RECORD)
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
    say(
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


def make_record(
    args: Sequence[str],
    rounds: int,
    personal: bool,
    train: Callable[[Sequence[str]], None],
    say: Callable[[str], None] = warn,
) -> dict:
  """One training run's record, made where the run's folder is.

  `train(args)` runs `run.train` with `args` (raising `run_pool.RunFailed`
  for a non-zero exit) unless the folder holds the finished run; a run that
  diverged is a record that says so. The record holds the arguments, the
  per-client arrays of each split, the curve, the examples counted and the
  wall time summed over the run's invocations (`run_pool` workers call this
  and send the record back to the driver, which keeps it). `say` gets its
  warnings.

  Raises:
    RuntimeError: The folder holds another run (one line).
  """
  path = os.path.join(
      flag_value(args, 'root_output_dir'), flag_value(args, 'experiment_name')
  )
  wall = _finished(path, rounds, args, say)
  if wall is not None and not has_clients(path, personal):
    aside = f'{path}.damaged-{int(time.time())}'
    os.replace(path, aside)
    say(
        f'{path}: a finished run without its per-client files (clients/); '
        f'moved to {aside}, running it again'
    )
    wall = None
  if wall is None:
    earlier = read_json(os.path.join(path, WALL), WALL) or {}
    before = (
        float(earlier.get('wall_s', 0.0)) if isinstance(earlier, dict) else 0.0
    )
    start = time.time()
    try:
      train(args)
    except run_pool.RunFailed as e:
      if not _diverged(e):
        raise
      # A run that diverged: in selection the worst score, in the report
      # a seed the page counts; not an error.
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
  summary = read_json(os.path.join(path, 'summary.json'), 'summary.json')
  return {
      'args': list(args),
      'task': (summary or {}).get('task', ''),
      'splits': rounded(_client_rows(path, personal)),
      'curve': rounded(_curve(path, rounds)),
      'examples': _examples(path, rounds),
      'wall_s': round(wall, 1),
      **_timed(path, rounds),
  }
