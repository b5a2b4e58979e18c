# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The tail benchmark's selection and report phases.

`Config` is one configuration of a method; `Choice` what a method tried and
chose, ranked stable-first by `stats.criterion`; `Benchmark` runs
the successive halving, the lines, the edge extensions, the added seeds, the
baselines' selection and the report through a `records.Runs`.
"""

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Optional

from run.tail_benchmark import pool as run_pool
from run.tail_benchmark import records as bench_records
from run.tail_benchmark import settings as bench_settings
from run.tail_benchmark import stats


@dataclasses.dataclass(frozen=True)
class Config:
  """One configuration of a method: its knob value, client learning rate,
  server learning rate (1: TFF's default) and client weighting (by
  examples: the default); defaults are absent from names and flags."""

  value: Optional[float]
  lr: float
  slr: float = 1.0
  # Line knobs away from their defaults: `((name, value), ...)`, sorted.
  extra: tuple[tuple[str, float], ...] = ()
  weighting: str = bench_settings.WEIGHTINGS[0]

  def describe(self, method: bench_settings.Method) -> str:
    knob = '' if method.knob is None else f'{method.knob}={self.value:g}, '
    server = '' if self.slr == 1.0 else f', server lr={self.slr:g}'
    lines = ''.join(f', {n}={v:g}' for n, v in self.extra)
    weights = ''
    if self.weighting != bench_settings.WEIGHTINGS[0]:
      weights = f', {self.weighting} client weights'
    return f'{knob}lr={self.lr:g}{server}{lines}{weights}'

  def get(self, axis: str, method: bench_settings.Method) -> Any:
    """The value on `axis` ('value', 'lr', 'slr', 'weighting' or a line's
    name)."""
    if axis in _FIELDS:
      return getattr(self, axis)
    return dict(self.extra).get(axis, method.line(axis).default)

  def with_value(
      self, axis: str, value: Any, method: bench_settings.Method
  ) -> 'Config':
    """This configuration with `axis` at `value`."""
    if axis in _FIELDS:
      return dataclasses.replace(self, **{axis: value})
    extra = dict(self.extra)
    extra.pop(axis, None)
    if value != method.line(axis).default:
      extra[axis] = value
    return dataclasses.replace(self, extra=tuple(sorted(extra.items())))


# The axes that are fields of `Config` (the others: line knobs in `extra`).
_FIELDS = ('value', 'lr', 'slr', 'weighting')


def run_name(
    phase: str, method: bench_settings.Method, config: Config, seed: int
) -> str:
  knob = '' if method.knob is None else f'_{method.knob}{config.value:g}'
  server = '' if config.slr == 1.0 else f'_slr{config.slr:g}'
  lines = ''.join(f'_{n}{v:g}' for n, v in config.extra)
  weights = ''
  if config.weighting != bench_settings.WEIGHTINGS[0]:
    weights = f'_{config.weighting}'
  return (
      f'{phase}_{method.name}{knob}_lr{config.lr:g}{server}{lines}{weights}'
      f'_seed{seed}'
  )


def run_args(
    setting_flags: Sequence[str],
    budget: bench_settings.Budget,
    method: bench_settings.Method,
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
        f
        for f in setting_flags
        if not f.startswith(bench_settings.STACKED_ONLY_FLAGS)
    ]
  return (
      list(setting_flags)
      + budget.flags(config.lr, rounds)
      + (
          []
          if config.slr == 1.0
          else [f'--server_learning_rate={config.slr:g}']
      )
      + method.weighting_flags(config.weighting)
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


@dataclasses.dataclass
class Choice:
  """A method's selection: what it tried, on which seeds, what won."""

  method: bench_settings.Method
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
  # The seeds where a configuration diverged, fell back to the trivial
  # score or collapsed below it (`stats.fell_back`), full runs ...
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


def _values(choice: Choice, axis: str) -> list[Any]:
  return sorted(
      {c.get(axis, choice.method) for c in (*choice.tried, *choice.early)}
  )


def _axes(choice: Choice) -> tuple[str, ...]:
  """The axes tuned: the knob, the client learning rate, and the server
  learning rate and line knobs where more than one value was tried."""
  axes = (('value',) if choice.method.knob else ()) + ('lr',)
  lines = (line.name for line in choice.method.lines)
  for axis in ('slr', 'weighting', *lines):
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
    if axis == 'weighting':
      continue  # Both weightings were tried: nothing lies beyond.
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
    """`[fn(item) ...]` in the pool's threads, each with a worker
    (`run_pool.parallel`)."""
    return run_pool.parallel(fn, items, self.runs)

  def trivial(self, phase: str) -> dict:
    """The trivial score's record for `phase`'s runs (`Runs.trivial`):
    `{'label', split: [accuracy per client]}`; `{}` where the runs object
    has none (tests)."""
    if phase not in self._trivial:
      method = self.methods[0]
      args = self._args(
          method, Config(None, self.budget.learning_rate), 0, phase
      )
      args = bench_records.with_flags(
          args, {'experiment_name': f'trivial_{phase}'}
      )
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
    or collapsed below it (`stats.fell_back`)."""
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
    split = (
        'personal/test' if method.name in bench_settings.PERSONAL else 'test'
    )
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
                method.name in bench_settings.PERSONAL,
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
        candidates[name] = stats.top_fraction(ranked, bench_settings.KEEP)
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
    (`stats.within_spread`), both run on one more selection seed,
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
      keep = stats.top_fraction(ranked, bench_settings.KEEP)
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
      split = 'personal/test' if name in bench_settings.PERSONAL else 'test'
      choices[name].early[config] = run_stats(record, split)
      if self.unstable(record, 'select'):
        choices[name].early_unstable.add(config)

  def _lines(
      self, method: bench_settings.Method
  ) -> list[tuple[str, tuple[Any, ...]]]:
    """The knobs `method` tunes along lines: `(axis, values)` (numbers, or
    the weightings' names)."""
    out = []
    if self.budget.tune_server_lr and method.server_lr:
      out.append(('slr', tuple(self.grids['server_learning_rate'])))
    if self.budget.tune_client_weighting and method.tunes_weighting:
      out.append(('weighting', bench_settings.WEIGHTINGS))
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
      split = (
          'personal/test' if method.name in bench_settings.PERSONAL else 'test'
      )
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
    for name, start in bench_settings.BASELINES.items():
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
    method = bench_settings.Method(name, '', 'fine_tune_epochs', low=0.0)
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
          'refusing to fine-tune it (remove that record, its model and its '
          'fine-tuning records to run them again)'
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
        if record.get('diverged'):
          if method.name == 'fedavg':
            raise RuntimeError(
                f'FedAvg diverged on reported seed {seed} at its chosen '
                f'configuration ({record["diverged"]}): every row is paired '
                "with FedAvg's and the baselines fine-tune its models, so "
                'no page is made'
            )
          runs.append(
              {
                  'splits': {},
                  'diverged': record['diverged'],
                  'unstable': True,
                  'examples': record['examples'],
                  'wall_s': record['wall_s'],
                  'args': record['args'],
              }
          )
          continue
        splits = dict(record['splits'])
        if method.name in bench_settings.PERSONAL:
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
      start, best = bench_settings.BASELINES[name], choice.best
      fine_tunings = self._fine_tune(
          fedavg.method,
          fedavg.best,
          seeds,
          'final',
          progress,
          [best.lr],
          # A choice of 0 epochs (no fine-tuning) reads the run's epoch 0;
          # a fine-tuning has at least one epoch.
          max(1, int(best.value)),
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
