# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The child processes of a driver that runs many training runs.

A driver (the tail benchmark, `run.experiments.reproduce`) starts its runs,
or the long-lived workers that run them, each in a session of its own (a
terminal's Ctrl-C reaches only the driver) through `start`, which lists
them. On a signal the driver's handler (`raise_stopped`, installed by
`signals_stop`) raises `Stopped`; the driver then calls `end_children`,
which forwards the signal to every listed child, kills what is left after
a grace period with its whole process group (its TFF workers are in it),
and refuses to start any more (`NotStarted`).
"""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, Optional

from run import run_dir


class Stopped(Exception):
  """A signal asked the driver to end; its runs are being ended."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


class NotStarted(Exception):
  """A run not started because the driver is ending."""


# The children now running (each in its own process group, with its TFF
# workers), guarded by `_lock`; `_stopping` once a signal has arrived.
_lock = threading.Lock()
_children: set[subprocess.Popen] = set()
_stopping = False


def reset() -> None:
  """Lets a new driver start children (a driver's `main` calls it first)."""
  global _stopping
  with _lock:
    _stopping = False


def stopping() -> bool:
  """Whether `end_children` has been called since the last `reset`."""
  return _stopping


def start(cmd: list[str], **popen_kwargs: Any) -> subprocess.Popen:
  """Starts `cmd` in a session of its own and lists it for `end_children`.

  Raises:
    NotStarted: If the driver is ending.
  """
  with _lock:
    if _stopping:
      raise NotStarted()
    proc = subprocess.Popen(  # pylint: disable=consider-using-with
        cmd, start_new_session=True, **popen_kwargs
    )
    _children.add(proc)
  return proc


def forget(proc: subprocess.Popen) -> None:
  """Takes an ended child off the list."""
  with _lock:
    _children.discard(proc)


def end_children(signum: int, grace_s: float = 10.0) -> int:
  """Ends the running children and their TFF workers; starts no more.

  Each child gets `signum` (SIGINT stays SIGINT, any other signal becomes
  SIGTERM): its handler ends its own workers and leaves its checkpoints for
  a rerun. A child still alive after `grace_s` seconds is killed with its
  whole process group (its workers are in it).

  Returns:
    The number of children that were running.
  """
  global _stopping
  with _lock:
    _stopping = True
    procs = list(_children)
  forward = signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM
  for proc in procs:
    with contextlib.suppress(OSError):
      proc.send_signal(forward)
  deadline = time.monotonic() + grace_s
  for proc in procs:
    with contextlib.suppress(subprocess.TimeoutExpired):
      proc.wait(timeout=max(0.0, deadline - time.monotonic()))
  for proc in procs:  # Stragglers, and any worker left in the group.
    with contextlib.suppress(OSError):
      os.killpg(proc.pid, signal.SIGKILL)
  return len(procs)


def exit_stopped(
    prog: str, stopped: Stopped, then: str, ended: Optional[int] = None
) -> int:
  """Says a driver was interrupted, what it ended and `then` (how to
  resume); then dies of the signal.

  `ended`: the runs ended; by default the pool's count on `stopped` (set
  when the pool ended them) or else `end_children`'s. Returns 130 for
  SIGINT; for another signal the process ends by that signal (its default
  action), as a shell expects.
  """
  if ended is None:
    ended = getattr(stopped, 'ended', None)
  if ended is None:
    ended = end_children(stopped.signum)
  print(
      f'{prog}: interrupted ({stopped}): ended {ended} running training '
      f'run{"" if ended == 1 else "s"} and '
      f'{"its" if ended == 1 else "their"} TFF workers{then}',
      file=sys.stderr,
      flush=True,
  )
  if stopped.signum == signal.SIGINT:
    return 130
  sys.stdout.flush()
  signal.signal(stopped.signum, signal.SIG_DFL)  # Die of it, as its default.
  os.kill(os.getpid(), stopped.signum)
  return 128 + stopped.signum


@contextlib.contextmanager
def signals_stop() -> Iterator[None]:
  """SIGINT, SIGTERM and SIGHUP raise `Stopped` in the main thread while
  inside; the handlers before are restored after."""
  previous = {
      s: signal.signal(s, raise_stopped)
      for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
  }
  try:
    yield
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)


def raise_stopped(signum, frame):
  """A signal handler: raises `Stopped` (once; a second signal is ignored)."""
  del frame
  if not _stopping:  # A second signal while the runs are ended: ignored.
    raise Stopped(signum)


def check_output_md(path: str) -> None:
  """Raises `run_dir.OutputDirError` if `path` cannot take a Markdown file.

  Checked before any run starts: a finished driver must not fail at its
  last step.
  """
  if os.path.isdir(path):
    raise run_dir.OutputDirError(f'--output_md: {path} is a folder, not a file')
  run_dir.check_output_dir(
      os.path.dirname(os.path.abspath(path)), flag='--output_md'
  )
