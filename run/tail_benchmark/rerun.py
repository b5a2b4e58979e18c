# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Recorded cells run again, and compared with their records.

`--rerun=NAME,...` runs each named record's training run again from the
record's own arguments (only the output folder and, for real data, the data
folder replaced by this machine's) and compares what the new run gives with
what the record holds: every per-client value of every split, the
validation curve and the examples counted. A record proves which code and
data made it (`origin`); a rerun shows that the code and data here make
the same numbers (a refactoring's check: "recorded cells rerun
identically").
"""

from collections.abc import Callable, Sequence
import math
import os
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


def load(records_dir: str, name: str) -> dict:
  """The training run's record `name`; `RerunError` if it is not one."""
  path = os.path.join(records_dir, f'{name}.json')
  if not os.path.exists(path):
    raise RerunError(f'--rerun: no record {path}')
  record, problem = bench_records.load_json(path)
  if problem is not None:
    raise RerunError(f'--rerun: {path}: unreadable ({problem})')
  args = record.get('args') if isinstance(record, dict) else None
  if (
      not isinstance(args, list)
      or not any(str(a).startswith('--total_rounds=') for a in args)
      or 'fine_tune' in record
  ):
    raise RerunError(
        f"--rerun: {path} is not a training run's record (fine-tunings and "
        'trivial scores are not rerun)'
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


def _flatten(record: dict) -> dict[str, list]:
  """`where -> values` for everything the comparison covers."""
  out = {'examples': [record.get('examples')]}
  for split, cols in sorted((record.get('splits') or {}).items()):
    for column, values in sorted(cols.items()):
      out[f'splits/{split}/{column}'] = _leaves(values)
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


def rerun_records(
    records: dict[str, dict],
    runs: bench_records.Runs,
    data_dir: Optional[str],
    log: Callable[[str], None],
) -> int:
  """Reruns each record (name -> record, `load`) in `runs`; returns how many
  differ.

  `runs` must write to a fresh `records_dir`: each run goes to a folder of
  that name in it (a finished folder would be read back, not run), and its
  new record beside it.
  """
  here = origin_lib.key(runs.origin) if runs.origin else None
  differing = 0
  for name, record in records.items():
    args = rerun_args(record['args'], name, runs.records_dir, data_dir)
    rounds = int(bench_records.flag_value(args, 'total_rounds'))
    personal = 'personal/test' in record['splits']
    new = runs.run(args, rounds, personal, name=name)
    found = differences(record, new)
    made = record.get('origin')
    same_origin = made is not None and origin_lib.key(made) == here
    where = (
        'same origin' if same_origin else f'made by {origin_lib.describe(made)}'
    )
    clients = len(next(iter(record['splits'].values()))['client_id'])
    if found:
      differing += 1
      log(
          f'rerun {name} ({where}): DIFFERS in {len(found)} places; first: '
          f'{found[0]}'
      )
    else:
      log(
          f'rerun {name} ({where}): identical: {len(record["splits"])} '
          f'split(s) of {clients} clients, {len(record.get("curve") or {})} '
          f'curve(s), {record.get("examples")} examples'
      )
  return differing
