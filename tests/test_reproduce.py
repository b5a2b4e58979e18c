"""run.experiments.reproduce: family runs expand to one row per member;
histograms; bad input; a signal ends the runs it started; runs through the
pool's workers give what runs alone give."""

import contextlib
import csv
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import psutil

from run.experiments import reproduce
from run.tail_benchmark import origin
from tests import binary


def fake_run(tmp_path, name, errors):
  """Writes a finished run's client table; returns its experiment entry."""
  run_dir = tmp_path / name
  (run_dir / 'clients').mkdir(parents=True)
  with open(run_dir / 'clients' / 'round_00002.csv', 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['split', 'client_id', 'num_examples', 'loss', 'accuracy'])
    for member, values in errors.items():
      for i, e in enumerate(values):
        writer.writerow([f'{member}/test', str(i), '10', '1.0', str(1 - e)])
  summaries = {
      f'{m}/test/error': {'mean': float(np.mean(v))} for m, v in errors.items()
  }
  return {'summaries': summaries, 'run_dir': str(run_dir)}


def test_family_rows_and_histogram(tmp_path):
  experiment = {
      'members': {'FedAvg': 'theta_1', 'Delta-FL 0.5': 'theta_0.5'},
      'metric': 'test/error',
      'columns': ('mean',),
      'histogram': 'test/error',
  }
  runs = [
      fake_run(
          tmp_path,
          f'seed{s}',
          {'theta_1': [0.1, 0.5, 0.9], 'theta_0.5': [0.2, 0.4, 0.6 + s]},
      )
      for s in (0, 1)
  ]
  expanded = reproduce.expand_members(experiment, {'family': runs})
  assert list(expanded) == ['FedAvg', 'Delta-FL 0.5']
  assert expanded['FedAvg'][0]['summaries'] == {'test/error': {'mean': 0.5}}
  np.testing.assert_allclose(
      reproduce.per_client_values(
          runs[1]['run_dir'], 'theta_0.5/test', 'error'
      ),
      [0.2, 0.4, 1.6],
  )
  table = reproduce.table(experiment, expanded)
  assert '| FedAvg | 50 (0) |' in table
  assert '| Delta-FL 0.5 | 56.67 (17) |' in table  # Seeds: 40%, 73.3%.
  png = tmp_path / 'hist.png'
  reproduce.write_histogram(experiment, expanded, str(png))
  assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_paired_table_subtracts_the_baseline_seed_by_seed():
  experiment = {'metric': 'test/error', 'columns': ('mean', 'p90')}

  def run(mean, p90):
    return {'summaries': {'test/error': {'mean': mean, 'p90': p90}}}

  results = {
      'FedAvg': [run(0.50, 0.70), run(0.40, 0.60), run(0.45, 0.65)],
      'theta=0.5': [run(0.52, 0.66), run(0.41, 0.57), run(0.44, 0.65)],
  }
  lines = reproduce.paired_table(experiment, results).splitlines()
  assert lines[0] == (
      '| variant minus FedAvg | test/error mean | test/error p90 |'
  )
  assert len(lines) == 3
  mean_cell, p90_cell = lines[2].split(' | ')[1:3]
  # Percent: (52 - 50, 41 - 40, 44 - 45) = (+2, +1, -1); mean 0.667, std 1.25.
  assert mean_cell == '+2 / +1 / -1; +0.667 (1.2)'
  # (66 - 70, 57 - 60, 65 - 65) = (-4, -3, 0); mean -2.33, std 1.7.
  assert p90_cell.rstrip(' |') == '-4 / -3 / +0; -2.33 (1.7)'


def test_every_experiment_reports_metrics_its_runs_produce():
  for name, experiment in reproduce.EXPERIMENTS.items():
    metrics = [experiment['metric']] + [
        m for m, _ in experiment.get('extra_metrics', ())
    ]
    if '--eval_train_clients=false' in experiment['base']:
      assert not [m for m in metrics if m.startswith('train/')], name


def _assert_declares(name, flags):
  """Every flag is in the experiment's base flags."""
  base = reproduce.EXPERIMENTS[name]['base']
  for flag in flags:
    assert flag in base, (name, flag)


def test_deltafl_trained_runs_at_the_benchmarks_operating_point():
  """The Delta-FL Shakespeare comparison at the tail benchmark's setting:
  its task flags, budget and rounds (a change there moves both)."""
  from run.tail_benchmark import settings  # pylint: disable=g-import-not-at-top

  setting = settings.SETTINGS['shakespeare']
  budget = setting.budget
  experiment = reproduce.EXPERIMENTS['deltafl_shakespeare_trained']
  _assert_declares(
      'deltafl_shakespeare_trained',
      (
          *setting.task_flags,
          '--simulation_engine=stacked',
          f'--clients_per_round={budget.clients_per_round}',
          f'--client_batch_size={budget.batch_size}',
          f'--client_learning_rate={budget.learning_rate:g}',
      ),
  )
  assert '--rnn_units=64' in experiment['base']
  assert experiment['rounds'] == budget.rounds == 300
  assert (
      experiment['variants']
      == reproduce.EXPERIMENTS['deltafl_shakespeare']['variants']
  )


def test_fedplus_synthetic_declares_the_papers_setting():
  """Document 004 section 5.2 (spec A.7 / A.8.2) as declared flags."""
  for name, n in (
      ('fedplus_synthetic', 30),
      ('fedplus_synthetic_n15', 15),
      ('fedplus_synthetic_n3', 3),
  ):
    experiment = reproduce.EXPERIMENTS[name]
    _assert_declares(
        name,
        (
            '--task=synthetic',
            '--synthetic_alpha=1000',
            '--synthetic_beta=10',
            '--client_batch_size=10',
            '--client_learning_rate=0.01',
            '--client_epochs_per_round=20',
            f'--num_clients={n}',
            f'--clients_per_round={min(n, 10)}',
        ),
    )
    plus = {v: f for v, f in experiment['variants'].items() if '+' in v}
    deltas = {f[0].split('=')[1]: f[2].split('=')[1] for f in plus.values()}
    assert deltas == {
        'fedavg_plus': '0.001',
        'fedgeomed_plus': '0.1',
        'fedcomed_plus': '0.1',
    }, name
    for variant, variant_flags in plus.items():
      assert '--fedplus_sigma=0.01' in variant_flags
      # Fed+ is scored on each party's own local model.
      assert experiment['variant_metrics'][variant] == 'personal/test/accuracy'
  variants = reproduce.EXPERIMENTS['fedplus_synthetic']['variants']
  assert list(variants)[0] == 'FedAvg'  # The paired baseline.
  assert '--proximal_strength=1' in variants['FedProx mu=1']
  assert '--aggregator=geometric_median' in variants['RFA (geometric median)']
  assert '--aggregator=coordinate_median' in variants['coordinate median']


def test_variant_metrics_pick_each_rows_metric():
  experiment = {
      'metric': 'test/accuracy',
      'columns': ('mean',),
      'variant_metrics': {'Fed+': 'personal/test/accuracy'},
  }

  def run(acc, personal):
    return {
        'summaries': {
            'test/accuracy': {'mean': acc},
            'personal/test/accuracy': {'mean': personal},
        }
    }

  results = {
      'FedAvg': [run(0.5, 0.0), run(0.6, 0.0)],
      'Fed+': [run(0.1, 0.9), run(0.2, 0.8)],
  }
  assert '| Fed+ | 85 (5) |' in reproduce.table(experiment, results)
  paired = reproduce.paired_table(experiment, results).splitlines()[2]
  assert paired == '| Fed+ | +40 / +20; +30 (10) |'


def test_fedprox_shakespeare_declares_the_thesis_setting():
  """Thesis section 3.4 / 3.7.2 on Shakespeare, and its no-straggler twin."""
  for name, stragglers in (
      ('fedprox_shakespeare', 0.9),
      ('fedprox_shakespeare_no_stragglers', None),
  ):
    experiment = reproduce.EXPERIMENTS[name]
    base = experiment['base']
    _assert_declares(
        name,
        (
            '--shakespeare_preset=fedprox',
            '--clients_per_round=10',
            '--client_batch_size=10',
            '--client_learning_rate=0.8',
            '--client_epochs_per_round=20',
        ),
    )
    straggling = [f for f in base if f.startswith('--straggler_fraction')]
    if stragglers is None:
      assert not straggling, name
    else:
      assert straggling == [f'--straggler_fraction={stragglers}'], name
    variants = experiment['variants']
    assert ['--algorithm=fedavg'] in variants.values(), name
    assert [
        '--algorithm=fedprox',
        '--proximal_strength=0.001',
    ] in variants.values(), name


# Bad input, in one process of its own: reproduce's flags (--root_output_dir,
# --rounds) would clash with the training binary's in the test process.
def test_bad_input_is_refused_before_any_run(tmp_path):
  """One error line and status 2, before a run starts (each would train)."""
  (tmp_path / 'file').write_text('not a folder')
  (tmp_path / 'folder.md').mkdir()
  base = [
      '--experiment=qffl_synthetic',
      f'--root_output_dir={tmp_path}/runs',
      '--seeds=0',
      # A run started by mistake fails at once (status 1), not trains.
      '--extra_flags=--task=nope',
  ]
  cases = [
      (['stray'], 'unexpected arguments: stray'),
      (['--rounds=0'], '--rounds must be >= 1, got 0'),
      (['--rounds=-3'], '--rounds must be >= 1, got -3'),
      (
          [f'--output_md={tmp_path}/file/x.md'],
          f'--output_md: {tmp_path}/file is a file, not a folder',
      ),
      (
          [f'--output_md={tmp_path}/folder.md'],
          f'--output_md: {tmp_path}/folder.md is a folder, not a file',
      ),
      (['--seeds=a'], '--seeds must be integers, got a'),
      (['--jobs=0'], '--jobs must be >= 1, got 0'),
      (['--experiment=nope'], "unknown --experiment='nope'"),
      (['--ray_address=nohost'], 'not auto nor HOST:PORT of a Ray head'),
      (
          ['--ray_address=127.0.0.1:1'],
          '--ray_address=127.0.0.1:1: no Ray cluster there (cannot connect',
      ),
      # The flags of the runs, checked in a worker before any run.
      ([], "unknown --task='nope'"),
  ]
  results = binary.call_main_in_subprocess(
      'run.experiments.reproduce',
      'reproduce',
      [base + args for args, _ in cases],
  )
  for (args, text), (status, stderr) in zip(cases, results):
    lines = binary.error_lines(stderr)
    assert status == 2, (args, stderr)
    assert len(lines) == 1 and lines[0].startswith('reproduce: error: '), (
        args,
        stderr,
    )
    assert text in lines[0], (args, stderr)
  # No run was started (the flags' check leaves its worker's log only).
  assert not list((tmp_path / 'runs').glob('*/*/'))


_TINY = (
    '--extra_flags=--num_clients=12,--synthetic_size_law=constant,'
    '--clients_per_round=4,--client_batch_size=5'
)


def _rows(path) -> list[str]:
  if not path.exists():
    return []
  return [l.split(',')[0] for l in path.read_text().splitlines()[1:]]


def _worker_groups(driver: int) -> set[int]:
  """Process groups of the driver's run workers (`run.tail_benchmark.pool`):
  each leads its own (a session of its own); its run's TFF workers are in
  it."""
  groups = set()
  with contextlib.suppress(psutil.Error):
    for child in psutil.Process(driver).children():
      with contextlib.suppress(psutil.Error, OSError):
        if 'pool.worker_main' in ' '.join(child.cmdline()):
          groups.add(os.getpgid(child.pid))
  return groups


def test_a_signal_ends_the_runs_and_a_rerun_resumes_them(tmp_path):
  """SIGTERM, then SIGINT of a rerun, end the running run (in the driver's
  run worker, in a session of its own) and its TFF workers, and start no
  other; the last rerun resumes and finishes both runs. One run at a time
  (--jobs=1): cheaper."""
  cmd = [
      sys.executable,
      '-m',
      'run.experiments.reproduce',
      '--experiment=qffl_synthetic',
      '--seeds=0',
      '--jobs=1',
      # A checkpoint every 60 rounds; the signals come after rounds 13 and
      # 25, so the run is far from its end when they arrive (with 60 rounds
      # a loaded machine once let it finish first).
      '--rounds=300',
      f'--root_output_dir={tmp_path}',
      _TINY,
  ]
  first, second = [
      tmp_path / 'qffl_synthetic' / name / 'metrics.csv'
      for name in ('q_0__FedAvg__seed0', 'q_1_seed0')
  ]
  groups = set()
  for signum, past_round in ((signal.SIGTERM, 13), (signal.SIGINT, 25)):
    proc = subprocess.Popen(  # pylint: disable=consider-using-with
        cmd,
        cwd=binary.ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
      deadline = time.monotonic() + 240
      while time.monotonic() < deadline and proc.poll() is None:
        if len(_rows(first)) > past_round:
          break
        time.sleep(0.05)
      groups = _worker_groups(proc.pid)
      # The run's worker (--jobs=1), and the run's TFF worker in its group.
      if len(groups) != 1 or len(binary.alive_in(groups)) < 2:
        proc.kill()
        raise AssertionError((signum, groups, proc.communicate()[1]))
      os.kill(proc.pid, signum)  # The driver only, as a terminal would.
      start = time.monotonic()
      _, stderr = proc.communicate(timeout=60)
      assert time.monotonic() - start < 15, stderr  # Not once the run ends.
      time.sleep(1.0)  # A replacement worker would have started by now.
      assert not binary.alive_in(groups), stderr
    finally:
      for pid in binary.alive_in(_worker_groups(proc.pid) | groups):
        with contextlib.suppress(OSError):
          os.kill(pid, signal.SIGKILL)
      with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    lines = binary.error_lines(stderr)
    assert 'Traceback' not in stderr, stderr
    assert lines[-1] == (
        f'reproduce: interrupted ({signal.Signals(signum).name}): ended 1 '
        'running training run and its TFF workers; rerun the same command to '
        'resume from the last checkpoints'
    ), stderr
    assert proc.returncode == (130 if signum == signal.SIGINT else -signum)
    assert not (first.parent / 'summary.json').exists()  # Ended mid-run.
    assert not second.parent.exists()  # Not started.
  proc = subprocess.run(
      cmd, cwd=binary.ROOT, capture_output=True, text=True, check=False
  )
  assert proc.returncode == 0, proc.stderr
  for path in (first, second):  # Resumed: every round once, none repeated.
    assert _rows(path) == [str(r) for r in range(1, 301)], path
    assert (path.parent / 'summary.json').exists()


def _reproduce(*args) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, '-m', 'run.experiments.reproduce', *args],
      cwd=binary.ROOT,
      capture_output=True,
      text=True,
      check=False,
  )


def test_records_make_the_table_again_with_their_origin(tmp_path):
  """A run's record (arguments with placeholders, summaries, origin) lets a
  later sitting skip it and `--from_records` make the same table with no run
  folder; a record of another origin is refused with one line unless
  accepted, and the table then lists both origins."""
  records = tmp_path / 'records'
  common = [
      '--experiment=qffl_synthetic',
      '--seeds=0',
      '--rounds=2',
      f'--records_dir={records}',
      _TINY,
  ]
  first_md, again_md = tmp_path / 'first.md', tmp_path / 'again.md'
  proc = _reproduce(
      *common,
      f'--root_output_dir={tmp_path}/runs',
      f'--output_md={first_md}',
  )
  assert proc.returncode == 0, proc.stderr
  names = sorted(p.name for p in records.iterdir())
  assert names == ['q_0__FedAvg__seed0.json', 'q_1_seed0.json'], names
  record = json.loads((records / 'q_1_seed0.json').read_text())
  assert '--root_output_dir=OUTPUT_DIR' in record['args']
  assert str(tmp_path) not in json.dumps(record)
  assert record['origin']['code']['sources'] == origin.source_hash()
  assert record['origin']['data'] == {}  # Generated data: no file.
  assert record['seconds'] > 0
  first = first_md.read_text()
  assert str(tmp_path) not in first
  assert 'Training runs: 2, ' in first
  assert f'code {origin.source_hash()}' in first and ': 2\n' in first

  # The runs' folders are gone: the records alone make the same table.
  shutil.rmtree(tmp_path / 'runs')
  proc = _reproduce(
      *common,
      '--from_records',
      f'--root_output_dir={tmp_path}/runs',
      f'--output_md={again_md}',
  )
  assert proc.returncode == 0, proc.stderr
  assert again_md.read_text() == first
  assert not (tmp_path / 'runs' / 'qffl_synthetic').exists()  # Nothing ran.

  # A record another code made: refused, or listed when accepted.
  record['origin']['code']['sources'] = '0123456789abcdef'
  (records / 'q_1_seed0.json').write_text(json.dumps(record))
  proc = _reproduce(
      *common, '--from_records', f'--root_output_dir={tmp_path}/runs'
  )
  lines = binary.error_lines(proc.stderr)
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr
  assert 'was made by another origin (code 0123456789abcdef' in lines[0]
  assert '--accept_foreign_records' in lines[0]
  proc = _reproduce(
      *common,
      '--from_records',
      '--accept_foreign_records',
      f'--root_output_dir={tmp_path}/runs',
      f'--output_md={again_md}',
  )
  assert proc.returncode == 0, proc.stderr
  text = again_md.read_text()
  assert f'* code {origin.source_hash()}' in text
  assert '* code 0123456789abcdef' in text

  # A damaged or missing record with --from_records: one line, status 2.
  (records / 'q_1_seed0.json').write_text('{"summ')
  for expected in ('damaged record', 'no record of this run at'):
    proc = _reproduce(
        *common, '--from_records', f'--root_output_dir={tmp_path}/runs'
    )
    lines = binary.error_lines(proc.stderr)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert expected in lines[0] and 'q_1_seed0.json' in lines[0], proc.stderr
    (records / 'q_1_seed0.json').unlink(missing_ok=True)


def test_runs_in_the_pool_give_the_records_and_table_of_runs_alone(tmp_path):
  """Two tiny runs through the local pool give the records and the table
  that the same runs alone give, each its own `python -m run.train` process
  (as the driver ran them before the pool), to every digit; the records
  differ in their wall seconds only. One worker (--jobs=1): the second run
  reuses the builds of the first (its task; q=1's process is not q=0's).
  (Each run's origin is the driver's, as before: its data and versions are
  checked here; its code hash, which others' edits of this checkout may
  move while the runs run, by the records test above.)"""
  records = tmp_path / 'records'
  page = tmp_path / 'pool.md'
  proc = _reproduce(
      '--experiment=qffl_synthetic',
      '--seeds=0',
      '--rounds=2',
      '--jobs=1',
      f'--records_dir={records}',
      f'--root_output_dir={tmp_path}/pool',
      f'--output_md={page}',
      _TINY,
  )
  assert proc.returncode == 0, proc.stderr
  experiment = reproduce.EXPERIMENTS['qffl_synthetic']
  commands = page.read_text().split('```\n')[1].splitlines()
  assert len(commands) == 2, commands
  extra = _TINY.split('=', 1)[1].split(',')
  here = origin.current(experiment['base'] + extra)
  alone = {}
  for command, (variant, variant_flags) in zip(
      commands, experiment['variants'].items()
  ):
    listed = shlex.split(command)
    assert listed[:3] == ['python', '-m', 'run.train'], command
    args = [
        a.replace('OUTPUT_DIR', str(tmp_path / 'alone')) for a in listed[3:]
    ]
    assert set(variant_flags) <= set(args), (variant, args)
    code, _, stderr = binary.run_module(
        'run.train', ['--progress=false'] + args
    )
    assert code == 0, stderr[-3000:]
    run = args[-1].split('=', 1)[1]
    with open(tmp_path / 'alone' / run / 'summary.json') as f:
      alone[variant] = [{'summaries': json.load(f)['summaries']}]
    record = json.loads((records / f'{run}.json').read_text())
    assert record.pop('seconds') > 0
    assert record == {
        'experiment': 'qffl_synthetic',
        'variant': variant,
        'seed': 0,
        'args': listed[3:],
        'summaries': alone[variant][0]['summaries'],
        # Its code: test_records_make_the_table_again_with_their_origin.
        'origin': {**here, 'code': record['origin']['code']},
    }, run
  assert alone['q=1'] != alone['q=0 (FedAvg)']  # Not vacuous.
  assert reproduce.table(experiment, alone) in page.read_text()
  # The runs' folders are the driver's: a run alone and in the pool wrote
  # the same per-client table.
  for run in ('q_0__FedAvg__seed0', 'q_1_seed0'):
    ours, theirs = [
        (folder / run / 'clients').iterdir()
        for folder in (tmp_path / 'pool' / 'qffl_synthetic', tmp_path / 'alone')
    ]
    assert [p.read_text() for p in sorted(ours)] == [
        p.read_text() for p in sorted(theirs)
    ]
