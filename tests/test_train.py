"""The training binary end to end: outputs, bad input, kill/resume, workers."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = [
    '--task=synthetic',
    '--num_clients=12',
    '--synthetic_size_law=constant',
    '--clients_per_round=4',
    '--client_batch_size=5',
    '--client_learning_rate=0.05',
    '--rounds_per_eval=4',
    '--seed=3',
    '--progress=false',
]
# Without the synthetic task's flags, which the other tasks refuse.
FILE_TASK_SMALL = [
    a
    for a in SMALL
    if a.split('=', maxsplit=1)[0]
    not in ('--num_clients', '--synthetic_size_law')
]


def group_members(pgid: int) -> list[int]:
  """Live processes in process group `pgid` (a run started in its own)."""
  members = []
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/stat') as f:
        stat = f.read()
    except OSError:
      continue
    fields = stat[stat.rfind(')') + 2 :].split()
    if fields[0] != 'Z' and int(fields[2]) == pgid:
      members.append(int(entry))
  return members


def assert_no_leftover(pgid: int) -> None:
  """Nothing of a finished run, its TFF worker included, is still alive."""
  deadline = time.monotonic() + 10
  while group_members(pgid) and time.monotonic() < deadline:
    time.sleep(0.1)
  left = group_members(pgid)
  assert not left, f'processes outlived the run: {left}'


def start(args, out_dir):
  return subprocess.Popen(
      [sys.executable, '-m', 'run.train', f'--root_output_dir={out_dir}']
      + args,
      cwd=ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,
  )


def run_train(args, out_dir, timeout=300):
  """Runs the binary in its own process group; checks nothing outlives it."""
  proc = start(args, out_dir)
  try:
    stdout, stderr = proc.communicate(timeout=timeout)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  assert_no_leftover(proc.pid)
  return proc.returncode, stdout, stderr


def error_lines(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if line.strip()]


@pytest.mark.parametrize(
    'args, message',
    [
        (['--task=nope'], "unknown --task='nope'"),
        (['--algorithm=fedsomething'], "unknown algorithm 'fedsomething'"),
        (['--clients_per_round=50'], 'exceeds the 12 training clients'),
        (
            ['--client_learning_rate=-1'],
            '--client_learning_rate must be > 0',
        ),
        (['--total_rounds=0'], '--total_rounds must be in [1, 1,000,000], got'),
        (['--proximal_strength=0.5'], 'applies to fedprox and term'),
        (['--q=1'], 'applies to qffl and qfedsgd'),
        (['--algorithm=term', '--tilt=nan'], 'tilt must be finite'),
        (['--client_optimizer=lbfgs'], "unknown --client_optimizer='lbfgs'"),
        (['--task=emnist_character'], 'pass --data_dir'),
        (['--thetas=0.5,0.1'], '--thetas applies to deltafl only'),
        (['--algorithm=deltafl', '--thetas=0.5,x'], '--thetas must be a comma'),
        (
            ['--algorithm=deltafl', '--thetas=0.5,0.5'],
            '--thetas must be distinct',
        ),
        (['--algorithm=deltafl', '--theta=0.5', '--thetas=0.1'], 'not both'),
        (
            ['--stacked_size_groups'],
            '--stacked_size_groups applies to --simulation_engine=stacked '
            'only, got --simulation_engine=tff',
        ),
        (
            ['--simulation_engine=batched', '--stacked_size_groups'],
            '--stacked_size_groups applies to --simulation_engine=stacked '
            'only, got --simulation_engine=batched',
        ),
    ],
)
def test_bad_input_gives_one_line_and_exit_2(args, message, tmp_path):
  small = FILE_TASK_SMALL if '--task=emnist_character' in args else SMALL
  code, _, stderr = run_train(small + ['--total_rounds=2'] + args, tmp_path)
  lines = error_lines(stderr)
  assert code == 2, stderr
  assert len(lines) == 1, stderr
  assert lines[0].startswith('train: error: ') and message in lines[0], stderr
  assert 'Traceback' not in stderr


def test_missing_data_file_is_named(tmp_path):
  code, _, stderr = run_train(
      FILE_TASK_SMALL + ['--task=emnist_character', f'--data_dir={tmp_path}'],
      tmp_path,
  )
  lines = error_lines(stderr)
  assert code == 2, stderr
  assert len(lines) == 1 and 'emnist_all.sqlite' in lines[0], stderr


def test_killed_run_resumes_to_the_same_result(tmp_path):
  # Enough rounds after the awaited checkpoint that the kill lands mid-run
  # even on a loaded machine.
  args = SMALL + [
      '--total_rounds=30',
      '--rounds_per_checkpoint=2',
      '--algorithm=fedprox',
      '--proximal_strength=0.1',
      '--straggler_fraction=0.5',
      '--client_epochs_per_round=2',
  ]
  code, stdout, stderr = run_train(args + ['--experiment_name=whole'], tmp_path)
  assert code == 0, stderr
  assert 'test/accuracy' in stdout and 'p90' in stdout

  # Kill the whole process group (driver and its TFF worker) mid-run.
  proc = start(args + ['--experiment_name=killed'], tmp_path)
  ckpt_dir = tmp_path / 'killed' / 'checkpoints'
  deadline = time.monotonic() + 240
  while time.monotonic() < deadline:
    if ckpt_dir.exists() and 'program_state_4' in os.listdir(ckpt_dir):
      break
    if proc.poll() is not None:
      break
    time.sleep(0.2)
  assert proc.poll() is None, 'the run ended before it could be killed'
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  assert_no_leftover(proc.pid)
  metrics = (tmp_path / 'killed' / 'metrics.csv').read_text().splitlines()
  assert 1 < len(metrics) < 31

  code, _, stderr = run_train(args + ['--experiment_name=killed'], tmp_path)
  assert code == 0, stderr
  assert 'resuming from the checkpoint of round' in stderr
  whole = json.loads((tmp_path / 'whole' / 'summary.json').read_text())
  resumed = json.loads((tmp_path / 'killed' / 'summary.json').read_text())
  assert whole == resumed
  rounds = [
      line.split(',')[0]
      for line in (tmp_path / 'killed' / 'metrics.csv')
      .read_text()
      .splitlines()[1:]
  ]
  assert rounds == [str(r) for r in range(1, 31)]


def test_resume_with_changed_flags_is_refused(tmp_path):
  args = SMALL + ['--total_rounds=1', '--experiment_name=x']
  assert run_train(args, tmp_path)[0] == 0
  code, _, stderr = run_train(args + ['--client_learning_rate=0.5'], tmp_path)
  assert code == 1
  assert 'client_learning_rate' in error_lines(stderr)[-1]


LEAKY_SCRIPT = """
import numpy as np
import tensorflow_federated as tff
{cleanup}
@tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
def total(x):
  return tff.federated_sum(x)
print(total([1.0, 2.0]))
"""


@pytest.mark.parametrize(
    'cleanup, leaks',
    [
        ('', True),
        (
            'from tff_algos import runtime; runtime.install_worker_cleanup()',
            False,
        ),
    ],
)
def test_stock_tff_leaks_its_worker_and_the_cleanup_ends_it(cleanup, leaks):
  """Shows the hazard the binaries guard against, and that the check sees it."""
  with subprocess.Popen(
      [sys.executable, '-c', LEAKY_SCRIPT.format(cleanup=cleanup)],
      cwd=ROOT,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
      start_new_session=True,
  ) as proc:
    try:
      assert proc.wait(timeout=120) == 0
      time.sleep(1)
      assert bool(group_members(proc.pid)) == leaks
    finally:
      if group_members(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)


def test_delta_fl_family_run_evaluates_every_level(tmp_path):
  """--thetas trains and evaluates one model per level in one run."""
  code, _, stderr = run_train(
      SMALL
      + [
          '--algorithm=deltafl',
          '--thetas=1,0.3',
          '--total_rounds=2',
          '--test_clients_fraction=0.25',
          '--experiment_name=family',
      ],
      tmp_path,
  )
  assert code == 0, stderr
  with open(tmp_path / 'family' / 'summary.json') as f:
    summaries = json.load(f)['summaries']
  for member in ('theta_1', 'theta_0.3'):
    for split in ('test', 'train'):
      assert 0.0 <= summaries[f'{member}/{split}/error']['mean'] <= 1.0
  # Round 1 ties at the zero model (all kept); round 2 filters.
  assert (
      summaries['theta_1/test/loss']['mean']
      != summaries['theta_0.3/test/loss']['mean']
  )
  header = (tmp_path / 'family' / 'metrics.csv').read_text().splitlines()[0]
  assert 'theta_0.3/train/loss' in header
  assert 'theta_0.3/client_work/fraction_kept' in header
