"""Bad input and faults: one clear line, nothing lost, nothing left running.

The sweep runs each binary's `main` in this process (`binary.call_main`),
against the folder of an earlier run made once per module, and checks the
exit status, a single `<binary>: error:` line without a traceback, and that
every file of the earlier run keeps its bytes. Damaged checkpoints, locks
and the programs' divergence run in-process too; what needs a process of its
own (signals, interpreter exit, two runs at once) runs as subprocesses.
"""

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from run import program
from run import report
from run import run_dir
from run import simulation
from run import stateful_program
from run import train
from tests import binary

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
_SYNTHETIC_FLAGS = ('--num_clients', '--synthetic_size_law')
MAINS = {
    'train': train.main,
    'program': program.main,
    'stateful': stateful_program.main,
}
PROG = {
    'train': 'train',
    'program': 'program',
    'stateful': 'stateful_program',
}
# The stateful binary runs Ditto; the others FedAvg.
BASE = {
    'train': [],
    'program': [],
    'stateful': ['--algorithm=ditto', '--ditto_lambda=1'],
}
NOT_UTF8 = os.fsdecode(b'run\xff')


def tree_hashes(path) -> dict[str, str]:
  """`{relative path: sha256}` of every file under `path`."""
  hashes = {}
  for folder, _, files in os.walk(path):
    for name in files:
      full = os.path.join(folder, name)
      with open(full, 'rb') as f:
        hashes[os.path.relpath(full, path)] = hashlib.sha256(
            f.read()
        ).hexdigest()
  return hashes


def _immutable(path) -> bool:
  """Makes folder `path` unwritable, even for root where chattr works."""
  if (
      subprocess.run(
          ['chattr', '+i', str(path)], capture_output=True, check=False
      ).returncode
      == 0
  ):
    return True
  os.chmod(path, 0o555)
  return False


@pytest.fixture(scope='module')
def earlier(tmp_path_factory):
  """An earlier finished run.train run (2 rounds) and paths for the cases."""
  root = tmp_path_factory.mktemp('runs')
  code, stderr = binary.call_main(
      train.main,
      'train',
      SMALL
      + [
          f'--root_output_dir={root}',
          '--experiment_name=earlier',
          '--total_rounds=2',
          '--rounds_per_checkpoint=1',
      ],
  )
  assert code == 0, stderr
  scratch = tmp_path_factory.mktemp('scratch')
  (scratch / 'file').write_text('not a folder')
  locked_dir = scratch / 'locked'
  (locked_dir / 'exp').mkdir(parents=True)
  chattr = _immutable(locked_dir / 'exp')
  readonly_parent = scratch / 'readonly'
  readonly_parent.mkdir()
  _immutable(readonly_parent)
  if not chattr and os.geteuid() == 0:  # Root without chattr: /proc.
    locked_dir, readonly_parent = '/proc', '/proc/self'
  paths = {
      'root': str(root),
      'run': str(root / 'earlier'),
      'scratch': str(scratch),
      'file': str(scratch / 'file'),
      'locked': str(locked_dir),
      'readonly': str(readonly_parent),
  }
  yield paths
  for path in (scratch / 'locked' / 'exp', readonly_parent):
    subprocess.run(
        ['chattr', '-i', str(path)], capture_output=True, check=False
    )
    with contextlib.suppress(OSError):
      os.chmod(path, 0o755)


# (binaries, extra flags, exit status, text of the error line). The flags
# run against the earlier run's folder unless they name another; `{x}`
# is a path of the `earlier` fixture.
ALL = ('train', 'program', 'stateful')
SHARED_CASES = [
    (['--task=nope'], 2, "unknown --task='nope'"),
    (['--clients_per_round=50'], 2, 'exceeds the 12 training clients'),
    (['--clients_per_round=0'], 2, 'clients_per_round'),
    (['--clients_per_round=abc'], 2, 'clients_per_round'),
    (['--client_learning_rate=-1'], 2, '--client_learning_rate must be > 0'),
    (['--client_learning_rate=nan'], 2, '--client_learning_rate'),
    (['--client_learning_rate=inf'], 2, '--client_learning_rate'),
    (['--client_learning_rate=fast'], 2, 'client_learning_rate'),
    (['--total_rounds=0'], 2, '--total_rounds must be in [1, 1,000,000], got'),
    (['--total_rounds=-5'], 2, '--total_rounds must be in [1, 1,000,000], got'),
    (['--total_rounds=abc'], 2, '--total_rounds=abc'),
    (
        ['--total_rounds=1000000000000'],
        2,
        '--total_rounds must be in [1, 1,000,000], got',
    ),
    (['--total_rounds=99999999999999999999999'], 2, 'total_rounds'),
    (['--client_epochs_per_round=0'], 2, 'client_epochs_per_round'),
    (
        ['--client_epochs_per_round=1000000000'],
        2,
        '--client_epochs_per_round must be in [1, 100,000], got 1000000000',
    ),
    (['--client_batch_size=0'], 2, '--client_batch_size must be >= 1'),
    (['--rounds_per_eval=-1'], 2, 'rounds_per_eval must be >= 0'),
    (['--client_optimizer=lbfgs'], 2, "unknown --client_optimizer='lbfgs'"),
    (['--server_optimizer=lbfgs'], 2, 'server_optimizer'),
    (['--client_weighting=bogus'], 2, "unknown --client_weighting='bogus'"),
    (['--client_sampling=bogus'], 2, 'client_sampling'),
    (['--num_clients=0'], 2, '--num_clients must be >= 1'),
    (['--num_clients=-3'], 2, '--num_clients must be >= 1'),
    (['--test_clients_fraction=1.5'], 2, '--test_clients_fraction must be'),
    (['--test_clients_fraction=-0.1'], 2, '--test_clients_fraction must be'),
    (['--synthetic_test_fraction=2'], 2, '--synthetic_test_fraction must be'),
    (['--synthetic_test_fraction=nan'], 2, '--synthetic_test_fraction'),
    (['--synthetic_alpha=-1'], 2, '--synthetic_alpha must be >= 0, got -1'),
    (['--synthetic_beta=inf'], 2, '--synthetic_beta must be'),
    (['--synthetic_size_law=bogus'], 2, '--synthetic_size_law'),
    (
        ['--synthetic_validation_fraction=0.9'],
        2,
        '--task=synthetic takes --synthetic_validation_fraction in [0, 0.8) '
        '(below 1 - --synthetic_test_fraction), got 0.9',
    ),
    (['--task=emnist_character'], 2, 'pass --data_dir'),
    (
        ['--task=emnist_character', '--data_dir={scratch}'],
        2,
        'emnist_all.sqlite',
    ),
    (
        [
            '--task=emnist_character',
            '--use_synthetic_data',
            '--min_examples=-1',
        ],
        2,
        '--min_examples must be >= 0',
    ),
    (
        ['--task=emnist_character', '--use_synthetic_data', '--max_clients=0'],
        2,
        '--max_clients must be >= 1',
    ),
    (
        [
            '--task=emnist_character',
            '--use_synthetic_data',
            '--synthetic_alpha=2',
        ],
        2,
        '--synthetic_alpha applies to --task=synthetic, synthetic_iid, not '
        '--task=emnist_character',
    ),
    (['--attack=bogus'], 2, "unknown --attack='bogus'"),
    (['--aggregator=bogus'], 2, "unknown --aggregator='bogus'"),
    (['--clip=-1'], 2, '--clip must be >= 0'),
    (['--noise_multiplier=-1'], 2, '--noise_multiplier must be >= 0'),
    (['--simulation_engine=bogus'], 2, "unknown --simulation_engine='bogus'"),
    (['--workers=nohost'], 2, "--workers: 'nohost' is not host:port"),
    (['--loop_implementation=bogus'], 2, '--loop_implementation'),
    (['--client_state_store=bogus'], 2, 'unknown --client_state_store'),
    (
        ['--max_concurrent_computation_calls=0'],
        2,
        '--max_concurrent_computation_calls must be',
    ),
    (['--seed=x'], 2, 'seed'),
    (['--seed=-1'], 2, '--seed must be >= 0, got -1'),
    (
        ['--download'],
        2,
        "--download applies to the tasks read from TFF's files "
        '(emnist_character, shakespeare_character, stackoverflow_word, '
        'stackoverflow_tag), not --task=synthetic',
    ),
    (
        ['--data_dir={scratch}'],
        2,
        '--data_dir applies to --task=emnist_character, '
        'shakespeare_character, stackoverflow_word, stackoverflow_tag, '
        'shakespeare_leaf, not --task=synthetic',
    ),
    (
        ['--shakespeare_preset=qffl'],
        2,
        '--shakespeare_preset applies to --task=shakespeare_leaf, not '
        '--task=synthetic',
    ),
    (['--nosuchflag=1'], 2, "Unknown command line flag 'nosuchflag'"),
    (['--flagfile={scratch}/missing.flags'], 2, 'Unable to open flagfile'),
    (['stray'], 2, 'unexpected arguments: stray'),
    # Output locations (kind 1).
    (
        ['--root_output_dir={file}'],
        2,
        '--root_output_dir: {file} is a file, not a folder',
    ),
    (['--root_output_dir={file}/below'], 2, '{file} is a file, not a folder'),
    (
        ['--root_output_dir={scratch}', '--experiment_name=file'],
        2,
        '--experiment_name: {file} is a file, not a folder',
    ),
    (
        ['--root_output_dir={readonly}/new'],
        2,
        '--root_output_dir: cannot write in {readonly}',
    ),
    (
        ['--root_output_dir={locked}', '--experiment_name=exp'],
        2,
        'cannot write in {locked}',
    ),
    (['--root_output_dir='], 2, '--root_output_dir must name a folder'),
    (['--experiment_name=a/b'], 2, 'must be a plain folder name'),
    (['--experiment_name=..'], 2, 'must be a plain folder name'),
    ([f'--experiment_name={NOT_UTF8}'], 2, 'run\\xff is not valid UTF-8'),
]
TRAIN_PROGRAM_CASES = [
    (['--algorithm=fedsomething'], 2, "unknown algorithm 'fedsomething'"),
    (['--proximal_strength=0.5'], 2, 'applies to fedprox and term'),
    (['--q=1'], 2, 'applies to qffl and qfedsgd'),
    (['--algorithm=term', '--tilt=nan'], 2, 'tilt must be finite'),
    (['--thetas=0.5,0.1'], 2, '--thetas applies to deltafl only'),
    (['--algorithm=deltafl', '--thetas=0.5,x'], 2, '--thetas must be a comma'),
    (
        ['--algorithm=deltafl', '--thetas=0.5,1.5'],
        2,
        '--thetas must be in (0, 1], got 1.5',
    ),
    (
        ['--algorithm=deltafl', '--thetas=0.5,0.5'],
        2,
        '--thetas must be distinct',
    ),
    (['--algorithm=deltafl', '--theta=0.5', '--thetas=0.1'], 2, 'not both'),
    (['--algorithm=deltafl', '--theta=0'], 2, 'theta'),
    (
        ['--algorithm=deltafl', '--secure_quantile=bogus'],
        2,
        "unknown --secure_quantile='bogus'",
    ),
    (
        ['--attack=gaussian', '--attack_fraction=2'],
        2,
        '--attack_fraction must be in [0, 1), got 2.0',
    ),
]
CASES = (
    [(b, args, code, text) for b in ALL for args, code, text in SHARED_CASES]
    + [
        (b, args, code, text)
        for b in ('train', 'program')
        for args, code, text in TRAIN_PROGRAM_CASES
    ]
    + [
        (
            'train',
            ['--straggler_fraction=1.5'],
            2,
            'straggler_fraction must be in [0, 1]',
        ),
        (
            'program',
            ['--straggler_fraction=0.5'],
            2,
            '--straggler_fraction is not supported',
        ),
        (
            'program',
            ['--algorithm=ditto', '--ditto_lambda=1'],
            2,
            'run it with python -m run.stateful_program',
        ),
        (
            'stateful',
            ['--algorithm=fedavg'],
            2,
            'run it with python -m run.program',
        ),
        ('program', ['--algorithm=afl'], 2, 'carry the client index (AFL)'),
        # The earlier run's folder (kind 3): other settings, other writer.
        (
            'train',
            ['--client_learning_rate=0.5'],
            1,
            'holds a run with other settings',
        ),
        ('program', [], 1, 'was written by run.train'),
        ('stateful', [], 1, 'was written by run.train'),
    ]
)


def _fill(value: str, paths) -> str:
  return value.format(**paths) if '{' in value else value


@pytest.mark.parametrize(
    'which, args, code, text',
    CASES,
    ids=[
        f'{c[0]}:{" ".join(c[1])}'.encode('ascii', 'backslashreplace').decode()
        for c in CASES
    ],
)
def test_bad_input_is_one_line_and_touches_nothing(
    earlier, which, args, code, text
):
  before = tree_hashes(earlier['run'])
  small = SMALL
  if '--task=emnist_character' in args:  # Without the synthetic task's flags.
    small = [
        a for a in SMALL if a.split('=', maxsplit=1)[0] not in _SYNTHETIC_FLAGS
    ]
  argv = (
      small
      + BASE[which]
      + [
          f'--root_output_dir={earlier["root"]}',
          '--experiment_name=earlier',
          '--total_rounds=2',
          '--rounds_per_checkpoint=1',
      ]
      + [_fill(a, earlier) for a in args]
  )
  status, stderr = binary.call_main(MAINS[which], PROG[which], argv)
  lines = binary.error_lines(stderr)
  assert status == code, stderr
  assert 'Traceback' not in stderr
  assert len(lines) == 1, stderr
  assert lines[0].startswith(f'{PROG[which]}: error: '), stderr
  assert _fill(text, earlier) in lines[0], stderr
  assert tree_hashes(earlier['run']) == before
  assert not os.path.exists(os.path.join(earlier['root'], NOT_UTF8))


REPORT_CASES = [
    ('summary.json', b'{"round_num": 2, "summ', 'summary.json: damaged'),
    ('summary.json', b'', 'summary.json: damaged'),
    ('summary.json', b'[1, 2]', 'summary.json: damaged'),
    (
        'summary.json',
        b'{"round_num": "two", "summaries": {}}',
        'summary.json: damaged',
    ),
    ('summary.json', b'{"summaries": {}}', 'summary.json: damaged'),
    (
        'summary.json',
        b'{"round_num": 2, "summaries": {}}',
        'summary.json: damaged',
    ),
    (
        'summary.json',
        b'{"round_num": 2, "summaries": {"test/accuracy": {"mean": NaN,'
        b' "p10": NaN}, "test/loss": {"mean": Infinity}}}',
        'no finite statistic',
    ),
    ('summary.json', b'\xff\xfe{}', 'summary.json: damaged'),
    (
        'clients/round_00002.csv',
        b'split,client_id,accuracy\ntest,0,high\n',
        'round_00002.csv: damaged',
    ),
    (
        'clients/round_00002.csv',
        b'split,client_id,num_examples,accuracy\n' b'test,0,5\n',
        'round_00002.csv: damaged',
    ),
    ('clients/round_00002.csv', b'garbage\n\x00\x01', 'round_00002.csv'),
    ('clients/round_00002.csv', b'', 'no test clients'),
    ('config.json', b'{"algorithm": ', 'config.json: damaged'),
]


@pytest.mark.parametrize('name, content, text', REPORT_CASES)
def test_report_names_the_damaged_file(earlier, tmp_path, name, content, text):
  run = tmp_path / 'run'
  shutil.copytree(earlier['run'], run)
  (run / name).write_bytes(content)
  with contextlib.redirect_stdout(None):
    status, stderr = _report(
        ['--runs', str(run), '--output_dir', str(tmp_path / 'report')]
    )
  lines = binary.error_lines(stderr)
  assert status == 2 and len(lines) == 1, stderr
  assert lines[0].startswith('report: error: ') and text in lines[0], stderr
  assert 'Traceback' not in stderr


def _report(args):
  import io  # pylint: disable=g-import-not-at-top

  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    try:
      status = report.main(['report'] + args)
    except SystemExit as e:
      status = e.code
  return status, err.getvalue()


def test_report_of_the_earlier_run_works(earlier, tmp_path):
  status, stderr = _report(
      ['--runs', earlier['run'], '--output_dir', str(tmp_path)]
  )
  assert status == 0, stderr
  assert (tmp_path / 'summary.md').exists()


def test_a_held_lock_refuses_a_second_run_naming_the_holder(earlier):
  before = tree_hashes(earlier['run'])
  argv = SMALL + [
      f'--root_output_dir={earlier["root"]}',
      '--experiment_name=earlier',
      '--total_rounds=2',
      '--rounds_per_checkpoint=1',
  ]
  with run_dir.locked(earlier['run'], 'train', binary='the-holder'):
    held = tree_hashes(earlier['run'])
    for which in ('train', 'program'):
      status, stderr = binary.call_main(MAINS[which], PROG[which], argv)
      lines = binary.error_lines(stderr)
      assert status == 1 and len(lines) == 1, stderr
      assert 'is in use by the-holder (pid' in lines[0], stderr
      assert f'pid {os.getpid()} ' in lines[0]
      assert tree_hashes(earlier['run']) == held
  # Released: the lock file keeps the last holder, the rest is unchanged.
  after = tree_hashes(earlier['run'])
  del before['.lock'], after['.lock']
  assert after == before


def test_a_lock_left_by_a_dead_process_is_stale(tmp_path):
  (tmp_path / 'run').mkdir()
  (tmp_path / 'run' / '.lock').write_text(
      json.dumps(
          {'writer': 'train', 'pid': 999999999, 'host': 'gone', 'binary': 'x'}
      )
  )
  run_dir.check_available(str(tmp_path / 'run'), 'train')
  with run_dir.locked(str(tmp_path / 'run'), 'train'):
    record = json.loads((tmp_path / 'run' / '.lock').read_text())
  assert record['pid'] == os.getpid() and record['writer'] == 'train'
  with pytest.raises(run_dir.RunDirError, match='was written by run.train'):
    with run_dir.locked(str(tmp_path / 'run'), 'program'):
      pass


def _damage(checkpoint, how):
  if how == 'truncated_variables':
    data = [
        n
        for n in os.listdir(checkpoint / 'variables')
        if n.startswith('variables.data')
    ]
    with open(checkpoint / 'variables' / data[0], 'r+b') as f:
      f.truncate(7)
  elif how == 'emptied':
    shutil.rmtree(checkpoint)
    checkpoint.mkdir()
  elif how == 'garbage_saved_model':
    (checkpoint / 'saved_model.pb').write_bytes(b'\x00garbage' * 10)


@pytest.mark.parametrize(
    'how', ['truncated_variables', 'emptied', 'garbage_saved_model']
)
def test_damaged_last_checkpoint_falls_back_and_is_kept(earlier, tmp_path, how):
  root = tmp_path / 'root'
  shutil.copytree(earlier['run'], root / 'earlier')
  run = root / 'earlier'
  os.remove(run / 'summary.json')
  _damage(run / 'checkpoints' / 'program_state_2', how)
  damaged = tree_hashes(run / 'checkpoints' / 'program_state_2')
  status, stderr = binary.call_main(
      train.main,
      'train',
      SMALL
      + [
          f'--root_output_dir={root}',
          '--experiment_name=earlier',
          '--total_rounds=2',
          '--rounds_per_checkpoint=1',
      ],
  )
  assert status == 0, stderr
  warnings = [l for l in stderr.splitlines() if l.startswith('warning:')]
  assert len(warnings) == 1, stderr
  assert 'skipped the damaged checkpoint program_state_2' in warnings[0]
  assert 'resuming from the checkpoint of round 1' in stderr
  kept = run / 'checkpoints' / 'damaged_program_state_2'
  assert tree_hashes(kept) == damaged
  # Round 2 again, from round 1: the uninterrupted run's result.
  with open(os.path.join(earlier['run'], 'summary.json')) as f:
    expected = json.load(f)
  assert json.loads((run / 'summary.json').read_text()) == expected
  rounds = [
      l.split(',')[0]
      for l in (run / 'metrics.csv').read_text().splitlines()[1:]
  ]
  assert rounds == ['1', '2']


def test_no_intact_checkpoint_is_one_line(earlier, tmp_path):
  root = tmp_path / 'root'
  shutil.copytree(earlier['run'], root / 'earlier')
  for version in (1, 2):
    _damage(
        root / 'earlier' / 'checkpoints' / f'program_state_{version}', 'emptied'
    )
  status, stderr = binary.call_main(
      train.main,
      'train',
      SMALL
      + [
          f'--root_output_dir={root}',
          '--experiment_name=earlier',
          '--total_rounds=3',
      ],
  )
  errors = [l for l in stderr.splitlines() if l.startswith('train: error:')]
  assert status == 1 and len(errors) == 1, stderr
  assert 'no intact checkpoint' in errors[0]
  assert 'Traceback' not in stderr
  names = sorted(os.listdir(root / 'earlier' / 'checkpoints'))
  assert names == ['damaged_program_state_1', 'damaged_program_state_2']


def test_program_falls_back_from_a_damaged_state_and_stops_on_nan(
    tmp_path, caplog
):
  args = SMALL + [
      f'--root_output_dir={tmp_path}',
      '--experiment_name=p',
      '--rounds_per_eval=0',
  ]
  status, stderr = binary.call_main(
      program.main, 'program', args + ['--total_rounds=2']
  )
  assert status == 0, stderr
  states = tmp_path / 'p' / 'program_state'
  _damage(states / 'program_state_2', 'truncated_variables')
  status, stderr = binary.call_main(
      program.main, 'program', args + ['--total_rounds=3']
  )
  assert status == 0, stderr
  assert 'skipped the damaged checkpoint program_state_2' in stderr
  assert (states / 'damaged_program_state_2').is_dir()
  rounds = [
      l.split(',')[0]
      for l in (tmp_path / 'p' / 'metrics.csv').read_text().splitlines()[1:]
  ]
  assert sorted(rounds, key=int) == ['1', '2', '3']

  # A learning rate that overflows: stopped, not finished with NaN metrics,
  # and TFF's background tasks ended first: none is cancelled with a
  # traceback logged by the event loop.
  caplog.clear()
  status, stderr = binary.call_main(
      program.main,
      'program',
      SMALL
      + [
          f'--root_output_dir={tmp_path}',
          '--experiment_name=nan',
          '--rounds_per_eval=0',
          '--total_rounds=4',
          '--client_learning_rate=1e38',
      ],
  )
  errors = binary.error_lines(stderr)
  assert status == 1, stderr
  assert errors[-1].startswith('program: error: training diverged at round')
  assert 'Traceback' not in stderr
  logged = [r.getMessage() for r in caplog.records if r.levelno >= 40]
  assert not logged, logged
  assert not (tmp_path / 'nan' / 'summary.json').exists()
  metrics = tmp_path / 'nan' / 'metrics.csv'
  assert not metrics.exists() or 'nan' not in metrics.read_text().lower()


# Subprocesses: what only a process of its own shows.


@pytest.mark.parametrize(
    'module, args, code',
    [
        ('run.train', ['--help'], 0),
        ('run.program', ['--helpfull'], 0),
        ('run.stateful_program', ['--total_rounds=abc'], 2),
        ('run.train', ['--flagfile=/nonexistent/flags'], 2),
    ],
)
def test_exit_paths_print_no_traceback(module, args, code):
  status, _, stderr = binary.run_module(module, args, timeout=120)
  assert status == code, stderr
  assert 'Traceback' not in stderr and 'Exception ignored' not in stderr
  if code == 2:  # One line, naming the binary.
    assert len(binary.error_lines(stderr)) == 1, stderr
    assert stderr.startswith(f'{module.split(".")[-1]}: error: '), stderr


def _descendant_workers(pid: int) -> list[int]:
  found = []
  for proc in psutil.process_iter(['pid', 'name', 'ppid']):
    with contextlib.suppress(psutil.Error):
      if proc.info['name'].startswith('worker_binary') and (
          proc.status() != psutil.STATUS_ZOMBIE
      ):
        found.append(proc)
  ours = []
  for proc in found:
    with contextlib.suppress(psutil.Error):
      if proc.pid == pid or pid in [p.pid for p in proc.parents()]:
        ours.append(proc.pid)
      elif os.getpgid(proc.pid) == pid:  # Orphaned, adopted by init.
        ours.append(proc.pid)
  return ours


def _start(args, out_dir):
  return subprocess.Popen(
      [sys.executable, '-m', 'run.train', f'--root_output_dir={out_dir}']
      + SMALL
      + args,
      cwd=binary.ROOT,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,
  )


def _wait_for_round(proc, run, round_num, timeout=180):
  deadline = time.monotonic() + timeout
  csv_path = run / 'metrics.csv'
  while time.monotonic() < deadline and proc.poll() is None:
    if csv_path.exists() and len(csv_path.read_text().splitlines()) > round_num:
      return True
    time.sleep(0.1)
  return False


# Repeats of the racy cases; more with TFF_HETERO_STRESS_REPEATS=N.
REPEATS = int(os.environ.get('TFF_HETERO_STRESS_REPEATS', '0'))
SIGNAL_REPEATS = REPEATS or 3


@pytest.mark.parametrize(
    'signum', [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]
)
def test_no_worker_survives_a_signal(signum, tmp_path):
  """The signal goes to the driver only (not its group), mid-round."""
  for attempt in range(SIGNAL_REPEATS):
    proc = _start(
        [
            '--total_rounds=400',
            '--rounds_per_checkpoint=0',
            f'--experiment_name=s{attempt}',
        ],
        tmp_path,
    )
    try:
      assert _wait_for_round(proc, tmp_path / f's{attempt}', 1 + attempt)
      assert _descendant_workers(proc.pid), 'no TFF worker to leave behind'
      time.sleep(0.15 * (attempt % 4))  # Inside a round or an evaluation.
      os.kill(proc.pid, signum)
      _, stderr = proc.communicate(timeout=60)
      time.sleep(1.0)  # A replacement would have been started by now.
      assert not _descendant_workers(proc.pid), (attempt, stderr)
      assert 'Traceback' not in stderr, stderr
      if signum == signal.SIGINT:
        assert proc.returncode == 130, stderr
        assert binary.error_lines(stderr)[-1].startswith(
            'train: interrupted'
        ), stderr
      else:
        assert proc.returncode == -signum, stderr
    finally:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


CONCURRENT_REPEATS = REPEATS or 2


def test_two_runs_of_one_folder_at_once(tmp_path):
  """The second is refused naming the first; metrics keep one row a round.

  Odd attempts start both at once (either may win), even ones start the
  second once the first has written a round. The winner is then ended with
  SIGTERM (its rounds would take long on purpose).
  """
  for attempt in range(CONCURRENT_REPEATS):
    name = f'c{attempt}'
    args = [
        '--total_rounds=2000',
        '--rounds_per_checkpoint=3',
        '--rounds_per_eval=0',
        f'--experiment_name={name}',
    ]
    procs = [_start(args, tmp_path)]
    try:
      if attempt % 2 == 0:
        assert _wait_for_round(procs[0], tmp_path / name, 1)
      procs.append(_start(args, tmp_path))
      deadline = time.monotonic() + 240
      while (
          all(p.poll() is None for p in procs) and time.monotonic() < deadline
      ):
        time.sleep(0.1)
      done = [p for p in procs if p.poll() is not None]
      assert len(done) == 1, 'neither run was refused'
      loser = done[0]
      winner = procs[1 - procs.index(loser)]
      loser_err = loser.communicate()[1]
      assert _wait_for_round(winner, tmp_path / name, 2)
      winner.send_signal(signal.SIGTERM)
      winner.communicate(timeout=60)
    finally:
      for proc in procs:
        with contextlib.suppress(ProcessLookupError):
          os.killpg(proc.pid, signal.SIGKILL)
    assert loser.returncode == 1, loser_err
    lines = binary.error_lines(loser_err)
    assert len(lines) == 1 and lines[0].startswith('train: error: '), lines
    assert 'is in use by python -m run.train (pid' in lines[0], lines
    assert f'pid {winner.pid} ' in lines[0], lines
    rows = [
        l.split(',')[0]
        for l in (tmp_path / name / 'metrics.csv').read_text().splitlines()[1:]
    ]
    assert rows == [str(r) for r in range(1, len(rows) + 1)]
    events = os.listdir(tmp_path / name / 'tensorboard')
    assert len(events) == 1, events


KILL_REPEATS = REPEATS or 2


def test_killed_runs_resume_to_the_same_result(earlier, tmp_path):
  """SIGKILL of the whole group at another round each time, then resume."""
  args = ['--total_rounds=8', '--rounds_per_checkpoint=1']
  status, stderr = binary.call_main(
      train.main,
      'train',
      SMALL
      + args
      + [f'--root_output_dir={tmp_path}', '--experiment_name=whole'],
  )
  assert status == 0, stderr
  expected = json.loads((tmp_path / 'whole' / 'summary.json').read_text())
  for attempt in range(KILL_REPEATS):
    name = f'k{attempt}'
    proc = _start(args + [f'--experiment_name={name}'], tmp_path)
    try:
      assert _wait_for_round(proc, tmp_path / name, 2 + 2 * attempt)
    finally:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.communicate()
    status, stderr = binary.call_main(
        train.main,
        'train',
        SMALL
        + args
        + [f'--root_output_dir={tmp_path}', f'--experiment_name={name}'],
    )
    assert status == 0, stderr
    assert json.loads((tmp_path / name / 'summary.json').read_text()) == (
        expected
    )
    rows = [
        l.split(',')[0]
        for l in (tmp_path / name / 'metrics.csv').read_text().splitlines()[1:]
    ]
    assert rows == [str(r) for r in range(1, 9)]


_STUCK_MAIN_THREAD = """
import signal, sys, threading, time
from tff_algos import runtime
runtime.install_exit_watchdog('stuck: interrupted', grace_s=1.0)
runtime.install_worker_cleanup()
if sys.argv[1] == 'masked':
  # The kernel hands the signal to another thread; the main thread waits on
  # a lock nothing releases, so Python's handler never runs.
  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
  print('ready', flush=True)
  threading.Event().wait()
else:
  # The handler runs but its KeyboardInterrupt is swallowed.
  def swallow(signum, frame):
    pass
  signal.signal(signal.SIGINT, swallow)
  signal.signal(signal.SIGTERM, swallow)
  print('ready', flush=True)
  while True:
    time.sleep(0.05)
"""


def _wait_until_blocked(pid: int, timeout: float = 20.0) -> None:
  """Until `pid`'s main thread sleeps in a futex (its lock wait).

  Before that, the handler still runs in the main thread at its next
  bytecode (it ran in 2 of 12 tries under load) and ends the run normally.
  """
  deadline = time.monotonic() + timeout
  futex = '202 '  # x86-64's futex syscall number.
  while time.monotonic() < deadline:
    with contextlib.suppress(OSError):
      with open(f'/proc/{pid}/task/{pid}/syscall') as f:
        if f.read().startswith(futex):
          return
    time.sleep(0.02)
  raise AssertionError(f'the main thread of {pid} never blocked')


@pytest.mark.parametrize('how', ['masked', 'swallowed'])
@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_watchdog_ends_a_run_whose_main_thread_does_not(how, signum):
  """The last resort behind the handlers: CI once saw a run outlive a SIGINT."""
  proc = subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, '-c', _STUCK_MAIN_THREAD, how],
      cwd=binary.ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,
  )
  try:
    assert proc.stdout.readline().strip() == 'ready'
    if how == 'masked':
      _wait_until_blocked(proc.pid)
    start = time.monotonic()
    os.kill(proc.pid, signum)
    _, stderr = proc.communicate(timeout=30)
    took = time.monotonic() - start
    assert 1.0 <= took < 15, took  # After the grace, not before.
    if signum == signal.SIGINT:
      assert proc.returncode == 130, stderr
      assert stderr.strip().splitlines()[-1] == 'stuck: interrupted', stderr
    else:
      assert proc.returncode == -signum, stderr
  finally:
    with contextlib.suppress(ProcessLookupError):
      os.killpg(proc.pid, signal.SIGKILL)


def test_a_last_round_that_overflows_is_divergence(tmp_path):
  """The training loss of the last round is finite, its model is not."""
  for which in ('train', 'program'):
    status, stderr = binary.call_main(
        MAINS[which],
        PROG[which],
        SMALL
        + [
            f'--root_output_dir={tmp_path}',
            f'--experiment_name={which}',
            '--total_rounds=1',
            '--rounds_per_eval=0',
            '--client_learning_rate=1e35',
        ],
    )
    errors = binary.error_lines(stderr)
    assert status == 1, stderr
    assert 'Traceback' not in stderr, stderr
    assert errors[-1].startswith(
        f'{PROG[which]}: error: training diverged'
    ), stderr
    assert 'round 1' in errors[-1], stderr
    assert not (tmp_path / which / 'summary.json').exists()


def test_a_refused_program_leaves_the_lock_record_of_the_last_run(tmp_path):
  """'Other settings' is refused before the refused run records itself."""
  for which in ('program', 'stateful'):
    args = (
        SMALL
        + BASE[which]
        + [
            f'--root_output_dir={tmp_path}',
            f'--experiment_name={which}',
            '--rounds_per_eval=0',
            '--total_rounds=1',
        ]
    )
    status, stderr = binary.call_main(MAINS[which], PROG[which], args)
    assert status == 0, stderr
    lock = tmp_path / which / '.lock'
    record = json.loads(lock.read_text())
    record['pid'] = 999999999  # As if written by another, finished process.
    lock.write_text(json.dumps(record) + '\n')
    before = tree_hashes(tmp_path / which)
    status, stderr = binary.call_main(
        MAINS[which], PROG[which], args + ['--client_learning_rate=0.5']
    )
    lines = binary.error_lines(stderr)
    assert status == 1, stderr
    assert 'holds a program with other settings' in lines[-1], stderr
    assert tree_hashes(tmp_path / which) == before


def _disk_full_after(monkeypatch, target, name, calls, error):
  """Makes `target.name` raise `error` from its `calls`-th call on."""
  original = getattr(target, name)
  count = [0]

  def failing(*args, **kwargs):
    count[0] += 1
    if count[0] >= calls:
      raise error
    return original(*args, **kwargs)

  monkeypatch.setattr(target, name, failing)


def test_a_full_disk_is_one_line_and_the_rerun_resumes(
    earlier, tmp_path, monkeypatch
):
  """A checkpoint, program state or metrics write failing with ENOSPC, in
  fresh and resumed runs of both binaries: one line naming the folder;
  the checkpoints before stay; with space again the same command finishes."""
  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  import tensorflow as tf
  import tensorflow_federated as tff
  from tensorflow_federated.python.program import file_utils

  # pylint: enable=g-import-not-at-top,g-direct-tensorflow-import

  tf_full = tf.errors.ResourceExhaustedError(
      None, None, 'program_state_2/variables; No space left on device'
  )
  os_full = OSError(errno.ENOSPC, 'No space left on device')
  with open(os.path.join(earlier['run'], 'summary.json')) as f:
    expected = json.load(f)
  cases = [  # (binary, resumed, what fails, from which call, error)
      ('train', False, (file_utils, 'write_saved_model'), 2, tf_full),
      (
          'train',
          True,
          # run.train writes metrics.csv itself (whole, through atomic).
          (simulation._MetricsCsv, 'release'),  # pylint: disable=protected-access
          1,
          os_full,
      ),
      ('program', False, (file_utils, 'write_saved_model'), 2, tf_full),
      (
          'program',
          True,
          (tff.program.CSVFileReleaseManager, 'release'),
          1,
          os_full,
      ),
  ]
  for i, (which, resumed, (target, name), calls, error) in enumerate(cases):
    root = tmp_path / str(i)
    run = root / 'run'
    args = SMALL + [
        f'--root_output_dir={root}',
        '--experiment_name=run',
        '--total_rounds=2',
    ]
    if which == 'train':
      args.append('--rounds_per_checkpoint=1')
    if resumed:
      status, stderr = binary.call_main(
          MAINS[which], PROG[which], args[:-1] + ['--total_rounds=1']
      )
      assert status == 0, stderr
    summary = run / 'summary.json'
    before = summary.read_bytes() if summary.exists() else None
    with monkeypatch.context() as patch:
      _disk_full_after(patch, target, name, calls, error)
      status, stderr = binary.call_main(MAINS[which], PROG[which], args)
    lines = binary.error_lines(stderr)
    assert status == 1, (i, stderr)
    assert 'Traceback' not in stderr, (i, stderr)
    assert lines[-1] == (
        f'{PROG[which]}: error: disk full while writing in {run}; the '
        'checkpoints written before are kept: free some space and rerun the '
        'same command to resume'
    ), (i, stderr)
    assert (summary.read_bytes() if summary.exists() else None) == before, i
    status, stderr = binary.call_main(MAINS[which], PROG[which], args)
    assert status == 0, (i, stderr)
    if which == 'train':
      assert json.loads((run / 'summary.json').read_text()) == expected, i


def test_stateful_program_falls_back_from_damaged_client_states(tmp_path):
  """A truncated client-state snapshot: the round before is resumed."""
  args = (
      SMALL
      + BASE['stateful']
      + [
          f'--root_output_dir={tmp_path}',
          '--experiment_name=s',
          '--rounds_per_eval=0',
      ]
  )
  status, stderr = binary.call_main(
      stateful_program.main, 'stateful_program', args + ['--total_rounds=2']
  )
  assert status == 0, stderr
  snapshot = tmp_path / 's' / 'client_states' / 'states_round_00000002.npz'
  with open(snapshot, 'r+b') as f:
    f.truncate(30)
  status, stderr = binary.call_main(
      stateful_program.main, 'stateful_program', args + ['--total_rounds=3']
  )
  assert status == 0, stderr
  assert 'Traceback' not in stderr, stderr
  warnings = [l for l in stderr.splitlines() if l.startswith('warning:')]
  assert len(warnings) == 1, stderr
  assert 'skipped the checkpoint program_state_2' in warnings[0], stderr
  assert 'BadZipFile' in warnings[0], stderr
  assert (snapshot.parent / 'damaged_states_round_00000002.npz').exists()
  assert (tmp_path / 's' / 'program_state' / 'damaged_program_state_2').is_dir()
  rounds = [
      l.split(',')[0]
      for l in (tmp_path / 's' / 'metrics.csv').read_text().splitlines()[1:]
  ]
  assert sorted(rounds, key=int) == ['1', '2', '3']


@pytest.mark.parametrize(
    'name, damage',
    [
        ('metrics.csv', 'not_utf8'),
        ('tensorboard', 'file'),
        ('clients', 'file'),
        ('checkpoints', 'file'),
        ('metrics.csv', 'folder'),
    ],
)
def test_a_damaged_run_folder_is_one_line_naming_the_path(
    earlier, tmp_path, name, damage
):
  root = tmp_path / 'root'
  shutil.copytree(earlier['run'], root / 'earlier')
  run = root / 'earlier'
  os.remove(run / 'summary.json')
  target = run / name
  if damage == 'not_utf8':
    target.write_bytes(target.read_bytes() + b'3,\xff\xfe\n')
  else:
    if target.is_dir():
      shutil.rmtree(target)
    else:
      target.unlink()
    if damage == 'file':
      target.write_text('not a folder')
    else:
      target.mkdir()
  before = tree_hashes(run)
  status, stderr = binary.call_main(
      train.main,
      'train',
      SMALL
      + [
          f'--root_output_dir={root}',
          '--experiment_name=earlier',
          '--total_rounds=3',
      ],
  )
  lines = binary.error_lines(stderr)
  assert status == 1, stderr
  assert 'Traceback' not in stderr, stderr
  assert len(lines) == 1 and lines[0].startswith('train: error: '), stderr
  assert str(target) in lines[0], stderr
  assert tree_hashes(run) == before


_UNRAISABLE = r"""
import gc
from tensorflow_federated.python.core.impl.executors import executors_errors
from tff_algos import runtime

class Raises:
  def __init__(self, error):
    self.error = error
  def __del__(self):
    raise self.error

channel = executors_errors.RetryableGRPCError
runtime.install_worker_cleanup()
Raises(ValueError('before: printed'))
gc.collect()
Raises(channel.__new__(channel))
gc.collect()
runtime._note_signal()  # What SIGINT/SIGTERM's handlers do first.
Raises(channel.__new__(channel))
gc.collect()
Raises(ValueError('after: printed'))
gc.collect()
"""


def test_worker_channel_errors_are_quiet_only_after_a_signal():
  # After SIGINT, about one run in ten printed "Exception ignored ...
  # RetryableGRPCError" from the worker channel's finalizer.
  proc = subprocess.run(
      [sys.executable, '-c', _UNRAISABLE],
      cwd=binary.ROOT,
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )
  assert proc.returncode == 0, proc.stderr
  err = proc.stderr
  assert err.count('Exception ignored') == 3, err
  assert 'before: printed' in err and 'after: printed' in err
  assert err.count('RetryableGRPCError') == 1, err  # The one before.
