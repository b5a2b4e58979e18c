# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Recorded cells run again, and compared with their records.

`--rerun=NAME,...` runs each named record again from the record's own
arguments (only the output folder and, for real data, the data folder
replaced by this machine's) and compares what the new run gives with what
the record holds: a training run's every per-client value of every split,
its validation curve and the examples counted; a baseline's fine-tuning
(`<run>_ftfinal`, `<run>_ftinitial`) every per-client value of every split,
learning rate and epoch, and its training examples, fine-tuning the final
model saved with FedAvg's record (`<run>.weights.npz`), as the benchmark
did. A record proves which code and data made it (`origin`); a rerun shows
that the code and data here make the same numbers (a refactoring's check:
"recorded cells rerun identically").
"""

from collections.abc import Callable, Sequence
import json
import math
import os
import shutil
from typing import Any, Optional

from run.tail_benchmark import origin as origin_lib
from run.tail_benchmark import records as bench_records

# Records keep 6 decimals (`records.rounded`): a value that rounds the other
# way on another machine moves by one unit of the 6th.
TOLERANCE = 1.5e-6


class RerunError(ValueError):
  """A record that cannot be rerun: one line."""


def rerun_args(
    args: Sequence[str], name: str, root: str, data_dir: Optional[str]
) -> list[str]:
  """The record's `run.train` flags, with this machine's folders.

  The run goes to `root/name` (a first rung's record and its full run, which
  shared a folder, are rerun apart); `--data_dir` becomes `data_dir` where
  the record has one.
  """
  out = bench_records.with_flags(
      args, {'root_output_dir': root, 'experiment_name': name}
  )
  if data_dir is not None:
    out = bench_records.with_flags(
        out, {'data_dir': data_dir}, add_missing=False
    )
  return out


def fine_tuning(record: Any) -> Optional[dict]:
  """A fine-tuning record's options (`records.Runs.fine_tune` keeps them as
  its last argument), or None for any other record."""
  args = record.get('args') if isinstance(record, dict) else None
  if not isinstance(args, list) or not args or not isinstance(args[-1], str):
    return None
  try:
    options = json.loads(args[-1])
  except ValueError:
    return None
  if not isinstance(options, dict) or not isinstance(
      options.get('starts'), list
  ):
    return None
  return options


def _fine_tuning_start(name: str, record: dict, options: dict) -> str:
  """The start a fine-tuning record `name` holds; `RerunError` if its name,
  options and content disagree."""
  run = bench_records.flag_value(record['args'][:-1], 'experiment_name')
  starts = options['starts']
  if len(starts) != 1 or not name.startswith(f'{run}_ft{starts[0]}'):
    raise RerunError(
        f'--rerun: {name} is not the fine-tuning of {run} its arguments name'
    )
  problem = bench_records.fine_tuning_problem(record, starts[0])
  if problem is not None:
    raise RerunError(f'--rerun: {name}: {problem}')
  return starts[0]


def load(records_dir: str, name: str) -> dict:
  """The record `name`: a training run's or a fine-tuning's; `RerunError`
  if it is neither (or unreadable, or damaged)."""
  path = os.path.join(records_dir, f'{name}.json')
  if not os.path.exists(path):
    raise RerunError(f'--rerun: no record {path}')
  record, problem = bench_records.load_json(path)
  if problem is not None:
    raise RerunError(f'--rerun: {path}: unreadable ({problem})')
  options = fine_tuning(record)
  if options is not None:
    start = _fine_tuning_start(name, record, options)
    run = bench_records.flag_value(record['args'][:-1], 'experiment_name')
    model = os.path.join(records_dir, f'{run}.weights.npz')
    if start == 'final' and not os.path.isfile(model):
      raise RerunError(
          f'--rerun: {name} fine-tunes the model saved with {run}: no {model}'
      )
    return record
  args = record.get('args') if isinstance(record, dict) else None
  if (
      not isinstance(args, list)
      or not any(str(a).startswith('--total_rounds=') for a in args)
      or 'fine_tune' in record
  ):
    raise RerunError(
        f"--rerun: {path} is neither a training run's record nor a "
        "fine-tuning's (trivial scores are not rerun)"
    )
  if record.get('diverged'):
    raise RerunError(f'--rerun: {path} is a diverged run (nothing to compare)')
  problem = bench_records.record_problem(record)
  if problem is not None:
    raise RerunError(f'--rerun: {path}: {problem}')
  return record


def _leaves(value: Any) -> list:
  """A nested list's values in order (a curve's rows, one after another)."""
  if isinstance(value, list):
    return [leaf for item in value for leaf in _leaves(item)]
  return [value]


def _columns(where: str, tree: Any, out: dict[str, list]) -> None:
  """`out[where/key/...] = values` for each column of a nested record part
  (a fine-tuning's epochs, a list of columns, are numbered)."""
  if isinstance(tree, dict):
    for key, value in sorted(tree.items()):
      _columns(f'{where}/{key}', value, out)
  elif isinstance(tree, list) and tree and isinstance(tree[0], dict):
    for k, value in enumerate(tree):
      _columns(f'{where}/{k}', value, out)
  else:
    out[where] = _leaves(tree)


def _flatten(record: dict) -> dict[str, list]:
  """`where -> values` for everything the comparison covers."""
  out = {'examples': [record.get('examples')]}
  _columns('splits', record.get('splits') or {}, out)
  if 'train_examples' in record:
    _columns('train_examples', record['train_examples'], out)
  for split, rows in sorted((record.get('curve') or {}).items()):
    out[f'curve/{split}'] = _leaves(rows)
  return out


def _gap(x: Any, y: Any) -> float:
  numbers = all(
      isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y)
  )
  if not numbers:
    return 0.0 if x == y else math.inf
  if x == y or (math.isnan(x) and math.isnan(y)):
    return 0.0
  return abs(x - y)


def differences(recorded: dict, rerun: dict) -> list[str]:
  """What differs between two records of one run (empty: identical).

  Numbers are equal within `TOLERANCE`; client ids and lengths exactly. A
  curve's values are compared in order, row after row.
  """
  old, new = _flatten(recorded), _flatten(rerun)
  out = []
  for where in sorted(set(old) | set(new)):
    if where not in new or where not in old:
      out.append(
          f'{where}: only in the {"record" if where in old else "rerun"}'
      )
      continue
    a, b = old[where], new[where]
    if len(a) != len(b):
      out.append(f'{where}: {len(a)} values recorded, {len(b)} rerun')
      continue
    gaps = [_gap(x, y) for x, y in zip(a, b)]
    at = max(range(len(gaps)), key=gaps.__getitem__, default=None)
    if at is not None and gaps[at] > TOLERANCE:
      out.append(f'{where}: differs at {at} ({a[at]} recorded, {b[at]} rerun)')
  return out


def _run_again(
    name: str,
    record: dict,
    runs: bench_records.Runs,
    source_dir: str,
    data_dir: Optional[str],
) -> dict:
  """The record `name` made again in `runs` (a fresh records folder)."""
  options = fine_tuning(record)
  if options is None:
    args = rerun_args(record['args'], name, runs.records_dir, data_dir)
    rounds = int(bench_records.flag_value(args, 'total_rounds'))
    personal = 'personal/test' in record['splits']
    return runs.run(args, rounds, personal, name=name)
  start = _fine_tuning_start(name, record, options)
  run = bench_records.flag_value(record['args'][:-1], 'experiment_name')
  args = rerun_args(record['args'][:-1], run, runs.records_dir, data_dir)
  if start == 'final':  # The model the benchmark fine-tuned, not a new one.
    shutil.copyfile(
        os.path.join(source_dir, f'{run}.weights.npz'),
        runs.model_path(run),
    )
  return runs.fine_tune(
      args,
      options['learning_rates'],
      options['max_epochs'],
      options['batch_size'],
      tag=name[len(f'{run}_ft{start}') :],
      start=start,
  )


def _contents(record: dict) -> str:
  """What a record holds, in words (what was found identical)."""
  options = fine_tuning(record)
  if options is None:
    splits = record['splits']
    clients = len(next(iter(splits.values()))['client_id'])
    return (
        f'{len(splits)} split(s) of {clients} clients, '
        f'{len(record.get("curve") or {})} curve(s), '
        f'{record.get("examples")} examples'
    )
  ((start, splits),) = record['splits'].items()
  return (
      f'fine-tuning from the {start} model: {len(splits)} split(s), '
      f'{len(options["learning_rates"])} learning rate(s), '
      f'{options["max_epochs"]} epoch(s)'
  )


def rerun_records(
    records: dict[str, dict],
    runs: bench_records.Runs,
    data_dir: Optional[str],
    log: Callable[[str], None],
    source_dir: str,
) -> int:
  """Reruns each record (name -> record, `load`) in `runs`; returns how many
  differ.

  `runs` must write to a fresh `records_dir`: each run goes to a folder of
  that name in it (a finished folder would be read back, not run), and its
  new record beside it. `source_dir` is the records' folder, which keeps
  the final models that fine-tunings start from.
  """
  here = origin_lib.key(runs.origin) if runs.origin else None
  differing = 0
  for name, record in records.items():
    new = _run_again(name, record, runs, source_dir, data_dir)
    found = differences(record, new)
    made = record.get('origin')
    same_origin = made is not None and origin_lib.key(made) == here
    where = (
        'same origin' if same_origin else f'made by {origin_lib.describe(made)}'
    )
    if found:
      differing += 1
      log(
          f'rerun {name} ({where}): DIFFERS in {len(found)} places; first: '
          f'{found[0]}'
      )
    else:
      log(f'rerun {name} ({where}): identical: {_contents(record)}')
  return differing
