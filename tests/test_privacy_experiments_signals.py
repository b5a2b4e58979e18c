# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""run.experiments.privacy_experiments: a signal ends the runs it started.

`dpfedavg_synthetic` runs `run.train` children (each in a session of its own,
with its TFF workers), through run.experiments.reproduce's functions: a
SIGTERM or SIGINT to the driver alone ends the running run and its workers,
starts no other, and says so in one line.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import binary


def _rows(path) -> int:
  return len(path.read_text().splitlines()) - 1 if path.exists() else 0


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_the_running_run_and_its_workers(tmp_path, signum):
  cmd = [
      sys.executable,
      '-m',
      'run.experiments.privacy_experiments',
      '--experiment=dpfedavg_synthetic',
      '--total_rounds=1000',  # Never reached: the signal comes first.
      '--epsilons=20',  # A second run, which must not start.
      f'--root_output_dir={tmp_path}',
  ]
  first = tmp_path / 'dpfedavg_epsinf_seed0'
  proc = subprocess.Popen(  # pylint: disable=consider-using-with
      cmd,
      cwd=binary.ROOT,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,
  )
  groups = set()
  try:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
      if _rows(first / 'metrics.csv') >= 2:  # Training: its workers run.
        break
      time.sleep(0.05)
    groups = binary.run_groups(tmp_path)
    workers = [p for p in binary.alive_in(groups) if p not in groups]
    if len(groups) != 1 or not workers:
      proc.kill()
      raise AssertionError((groups, workers, proc.communicate()[1]))
    os.kill(proc.pid, signum)  # The driver only, as a terminal would.
    start = time.monotonic()
    _, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - start < 15, stderr
    time.sleep(1.0)  # A replacement worker would have started by now.
    assert not binary.alive_in(groups), stderr
  finally:
    for pid in binary.alive_in(binary.run_groups(tmp_path) | groups):
      with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
      os.killpg(proc.pid, signal.SIGKILL)
  assert 'Traceback' not in stderr, stderr
  assert binary.error_lines(stderr)[-1] == (
      f'privacy_experiments: interrupted ({signal.Signals(signum).name}):'
      ' ended 1 running training run and its TFF workers; rerun the same'
      ' command to resume from the last checkpoint'
  ), stderr
  assert proc.returncode == (130 if signum == signal.SIGINT else -signum)
  assert not (first / 'summary.json').exists()  # Ended mid-run.
  assert not (tmp_path / 'dpfedavg_eps20_seed0').exists()  # Not started.
