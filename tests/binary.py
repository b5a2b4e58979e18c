"""Runs the training binary from a test: own process group, ended after."""

import contextlib
import json
import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_module(module, args, timeout=400, env=None):
  """`(returncode, stdout, stderr)` of `python -m module` with `args` (and
  the environment `env`, if given, else this process's).

  The binary runs in its own process group, which is killed afterwards so no
  TFF worker of a timed-out or crashed run outlives the test.
  """
  return _run(['-m', module], args, timeout, env)


def run_code(code, args, timeout=400, env=None):
  """`run_module`'s result for `python -c code` with `args` (e.g. a test's
  registration of a toy algorithm, then the binary's main)."""
  return _run(['-c', code], args, timeout, env)


def _run(how, args, timeout, env=None):
  with subprocess.Popen(
      [sys.executable, *how] + list(args),
      cwd=ROOT,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,
  ) as proc:
    try:
      stdout, stderr = proc.communicate(timeout=timeout)
    finally:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
  return proc.returncode, stdout, stderr


def run_train(args, out_dir, timeout=400):
  """`run_module('run.train', ...)` writing under `out_dir`."""
  return run_module(
      'run.train', [f'--root_output_dir={out_dir}'] + args, timeout
  )


def error_lines(stderr: str) -> list[str]:
  """The non-blank lines of `stderr`."""
  return [line for line in stderr.splitlines() if line.strip()]


def call_main(main, prog, args):
  """`(exit status, stderr)` of a binary's `main` run in this process.

  As `run.console.run` runs it (flags parsed first, reset to their
  defaults before), without a new Python process: for the many bad-input
  checks that fail before any training.
  """
  import tempfile  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from run import console  # pylint: disable=g-import-not-at-top

  flags.FLAGS.unparse_flags()
  # Real files: TFF hands sys.stdout / sys.stderr to the worker it starts.
  with tempfile.TemporaryFile('w+') as err, tempfile.TemporaryFile('w+') as out:
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
      try:
        code = main(console.flags_parser(prog)([prog] + list(args)))
      except SystemExit as e:
        code = e.code
    flags.FLAGS.unparse_flags()
    err.seek(0)
    return code, err.read()


def run_groups(root) -> set[int]:
  """Process groups of the training runs writing under `root`: each run
  leads its own (a session of its own) and its TFF workers are in it."""
  import psutil  # pylint: disable=g-import-not-at-top

  groups = set()
  for proc in psutil.process_iter(['cmdline']):
    with contextlib.suppress(psutil.Error, OSError):
      cmdline = proc.info['cmdline'] or ()
      if 'run.train' in cmdline and any(
          a.startswith(f'--root_output_dir={root}') for a in cmdline
      ):
        groups.add(os.getpgid(proc.pid))
  return groups


def alive_in(groups: set[int]) -> list[int]:
  """Live processes of `groups` (orphaned workers included)."""
  import psutil  # pylint: disable=g-import-not-at-top

  found = []
  for proc in psutil.process_iter():
    with contextlib.suppress(psutil.Error, OSError):
      if (
          os.getpgid(proc.pid) in groups
          and proc.status() != psutil.STATUS_ZOMBIE
      ):
        found.append(proc.pid)
  return found


_CALL_MAINS = """
import json, sys
from {module} import define_flags, main
from tests import binary
define_flags()
results = []
for a in json.loads(sys.argv[1]):
  print('case:', json.dumps(a), file=sys.stderr, flush=True)
  results.append(binary.call_main(main, {prog!r}, a))
print(json.dumps(results))
"""


def call_main_in_subprocess(module, prog, arg_lists, timeout=300):
  """`[(exit status, stderr)]` of `module.main` on each of `arg_lists`.

  All in one fresh process (`call_main` each): for a binary whose flags
  would clash with another binary's already defined in the test process.
  The process runs in its own group, killed afterwards (no TFF worker
  outlives it); past `timeout` the failure names the case that was running.
  """
  with subprocess.Popen(
      [
          sys.executable,
          '-c',
          _CALL_MAINS.format(module=module, prog=prog),
          json.dumps([list(a) for a in arg_lists]),
      ],
      cwd=ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,
  ) as proc:
    try:
      stdout, stderr = proc.communicate(timeout=timeout)
      timed_out = False
    except subprocess.TimeoutExpired:
      timed_out = True
    finally:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    if timed_out:
      stdout, stderr = proc.communicate()
  cases = [l for l in stderr.splitlines() if l.startswith('case: ')]
  assert (
      not timed_out
  ), f'timed out after {timeout} s in {cases[-1] if cases else "start-up"}'
  assert proc.returncode == 0, stderr
  return [tuple(r) for r in json.loads(stdout.strip().splitlines()[-1])]
