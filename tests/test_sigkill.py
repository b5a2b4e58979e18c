# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""SIGKILL of the binaries: resumed metrics rows, no orphaned TFF worker."""

import contextlib
import csv
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from run import program
from run import stateful_program
from run import train
from tests import binary
from tff_algos import runtime

SMALL = [
    '--task=synthetic',
    '--num_clients=12',
    '--synthetic_size_law=constant',
    '--clients_per_round=4',
    '--client_batch_size=5',
    '--client_learning_rate=0.05',
    '--seed=3',
    '--progress=false',
]
BINARIES = {
    # module: (main, the binary's own flags)
    'run.train': (
        train.main,
        ['--rounds_per_eval=0', '--rounds_per_checkpoint=1'],
    ),
    'run.program': (program.main, ['--rounds_per_eval=0']),
    'run.stateful_program': (
        stateful_program.main,
        ['--algorithm=ditto', '--ditto_lambda=1'],
    ),
}
ROUNDS = 4

# Runs a binary that SIGKILLs itself at one point of round AT: `late_row`
# (its metrics row is written 2 s late, then the kill comes before it: a
# program state saved meanwhile has no row), `after_row` (the row is written,
# the round's program state is not), `after_save` (both are).
_KILL_AT = r"""
import asyncio, os, signal, sys, time
from tensorflow_federated.python.program import file_program_state_manager
from tensorflow_federated.python.program import file_release_manager

module, point, at = sys.argv[1], sys.argv[2], int(sys.argv[3])


def kill(here):
  if here == point:
    os.kill(os.getpid(), signal.SIGKILL)


release = file_release_manager.CSVFileReleaseManager.release


async def killing_release(self, value, key):
  ours = os.path.basename(self._file_path) == 'metrics.csv' and key == at
  if ours and point == 'late_row':
    await asyncio.sleep(2.0)
    kill('late_row')
  await release(self, value, key)
  if ours:
    kill('after_row')


save = file_program_state_manager.FileProgramStateManager.save


async def killing_save(self, state, version):
  await save(self, state, version)
  if version == at and os.path.basename(self._root_dir) in (
      'program_state', 'checkpoints'
  ):
    kill('after_save')


# run.train's simulation writes metrics.csv itself (`simulation._MetricsCsv`).
from run import simulation

csv_release = simulation._MetricsCsv.release


def killing_csv_release(self, metrics, round_num):
  if round_num == at and point == 'late_row':
    time.sleep(2.0)
    kill('late_row')
  csv_release(self, metrics, round_num)
  if round_num == at:
    kill('after_row')


file_release_manager.CSVFileReleaseManager.release = killing_release
file_program_state_manager.FileProgramStateManager.save = killing_save
simulation._MetricsCsv.release = killing_csv_release
sys.argv = [module] + sys.argv[4:]
import importlib
importlib.import_module(module).run_main()
"""


def _args(module, out_dir, name):
  return (
      SMALL
      + BINARIES[module][1]
      + [
          f'--total_rounds={ROUNDS}',
          f'--root_output_dir={out_dir}',
          f'--experiment_name={name}',
      ]
  )


def _kill_at(module, point, round_num, args, log):
  """Runs `module` with `args` until it kills itself at `point`.

  Its stderr goes to the file `log`, not a pipe: a TFF worker left behind
  would hold a pipe open (that is `test_no_worker_outlives_its_binary`'s).
  """
  with (
      open(log, 'w+') as err,
      subprocess.Popen(
          [sys.executable, '-c', _KILL_AT, module, point, str(round_num)]
          + args,
          cwd=binary.ROOT,
          stdout=subprocess.DEVNULL,
          stderr=err,
          start_new_session=True,
      ) as proc,
  ):
    try:
      proc.wait(timeout=600)
    finally:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    err.seek(0)
    assert proc.returncode == -signal.SIGKILL, err.read()[-3000:]


def _rows(path):
  """metrics.csv's rows, without the timing columns."""
  with open(path, newline='', encoding='utf-8') as f:
    return [
        {k: v for k, v in row.items() if 'seconds' not in k}
        for row in csv.DictReader(f)
    ]


@pytest.mark.parametrize('module', list(BINARIES))
def test_a_killed_run_resumes_with_every_metrics_row(module, tmp_path):
  main, prog = BINARIES[module][0], module.split('.')[-1]
  status, stderr = binary.call_main(main, prog, _args(module, tmp_path, 'u'))
  assert status == 0, stderr
  expected = _rows(tmp_path / 'u' / 'metrics.csv')
  assert [int(r['round_num']) for r in expected] == list(range(1, ROUNDS + 1))
  for point, round_num in (
      ('late_row', 2),
      ('after_row', 3),
      ('after_save', 2),
  ):
    name = f'{point}_{round_num}'
    args = _args(module, tmp_path, name)
    _kill_at(module, point, round_num, args, tmp_path / f'{name}.log')
    status, stderr = binary.call_main(main, prog, args)
    assert status == 0, (point, stderr)
    assert _rows(tmp_path / name / 'metrics.csv') == expected, point


@pytest.mark.parametrize('module', list(BINARIES))
def test_no_worker_outlives_its_binary_after_sigkill(module, tmp_path):
  """The binary's TFF worker dies with it, not only with its group."""
  args = _args(module, tmp_path, 'k')
  args[args.index(f'--total_rounds={ROUNDS}')] = '--total_rounds=100000'
  with (
      open(tmp_path / 'k.log', 'w+') as err,
      subprocess.Popen(
          [sys.executable, '-m', module] + args,
          cwd=binary.ROOT,
          stdout=subprocess.DEVNULL,
          stderr=err,
          start_new_session=True,  # Its group: what a leftover worker is in.
      ) as proc,
  ):
    try:
      deadline = time.monotonic() + 300
      while not runtime.worker_pids(proc.pid) and proc.poll() is None:
        assert time.monotonic() < deadline, 'no worker started'
        time.sleep(0.1)
      assert proc.poll() is None, 'the binary ended'
      os.kill(proc.pid, signal.SIGKILL)  # The binary only, not its group.
      proc.wait(timeout=60)
      time.sleep(1.0)
      assert not binary.alive_in({proc.pid})
    finally:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


# Starts one child the way TFF's workers are started (`runtime._TiedPopen`,
# from runtime.py loaded alone: no TensorFlow), prints its pid and waits.
_TIED = r"""
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location('tied_runtime', sys.argv[1])
rt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rt)
child = rt._TiedPopen(['sleep', '120'])
print(child.pid, flush=True)
time.sleep(120)
"""


def _state(pid: int) -> str:
  """The process's state letter (`Z` a zombie), or '' if it is gone."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0]
  except OSError:
    return ''


@pytest.mark.skipif(
    not sys.platform.startswith('linux') or shutil.which('setpriv') is None,
    reason="PDEATHSIG is Linux only, set through util-linux's setpriv",
)
def test_a_tied_child_becomes_its_command_and_dies_with_its_parent():
  # The child becomes the command itself (exec, no Python run in it after
  # the fork: a preexec_fn forks where gRPC's fork handlers can abort the
  # child), its parent is the starter, and a SIGKILL of the starter alone
  # ends it at once.
  with subprocess.Popen(
      [sys.executable, '-c', _TIED, runtime.__file__],
      stdout=subprocess.PIPE,
      text=True,
      start_new_session=True,
  ) as starter:
    try:
      child = int(starter.stdout.readline())
      deadline = time.monotonic() + 10
      while True:
        with open(f'/proc/{child}/comm') as f:
          comm = f.read().strip()
        if comm == 'sleep' or time.monotonic() > deadline:
          break
        time.sleep(0.05)
      assert comm == 'sleep'
      with open(f'/proc/{child}/stat') as f:
        assert int(f.read().rsplit(')', 1)[1].split()[1]) == starter.pid
      starter.kill()
      starter.wait(timeout=10)
      deadline = time.monotonic() + 5
      while _state(child) not in ('', 'Z') and time.monotonic() < deadline:
        time.sleep(0.05)
      assert _state(child) in ('', 'Z'), 'the child outlived its parent'
    finally:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(starter.pid, signal.SIGKILL)
