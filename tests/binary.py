"""Runs the training binary from a test: own process group, ended after."""

import contextlib
import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_module(module, args, timeout=400):
  """`(returncode, stdout, stderr)` of `python -m module` with `args`.

  The binary runs in its own process group, which is killed afterwards so no
  TFF worker of a timed-out or crashed run outlives the test.
  """
  proc = subprocess.Popen(
      [sys.executable, '-m', module] + list(args), cwd=ROOT,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True)
  try:
    stdout, stderr = proc.communicate(timeout=timeout)
  finally:
    with contextlib.suppress(ProcessLookupError):
      os.killpg(proc.pid, signal.SIGKILL)
  return proc.returncode, stdout, stderr


def run_train(args, out_dir, timeout=400):
  """`run_module('run.train', ...)` writing under `out_dir`."""
  return run_module('run.train', [f'--root_output_dir={out_dir}'] + args,
                    timeout)


def error_lines(stderr: str) -> list[str]:
  """The non-blank lines of `stderr`."""
  return [line for line in stderr.splitlines() if line.strip()]
