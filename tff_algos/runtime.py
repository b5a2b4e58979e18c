# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Ending TFF's local `worker_binary` processes with their parent.

TFF 0.87's local C++ execution context starts its `worker_binary` as a child
process and never ends it when Python exits. The orphan keeps running (about
100 MB each) and holds the parent's stdout/stderr open, so a shell pipeline or
CI step that reads the script's output waits for it forever.

`install_worker_cleanup()` makes the current process end its workers when it
exits normally, on an uncaught exception, and on SIGTERM, SIGINT or SIGHUP.
A SIGKILL cannot be caught: on Linux the workers it starts are also tied to
it when util-linux's `setpriv` with `--pdeathsig` is installed
(`tie_workers_to_process`), so the kernel ends them when it dies however
it dies. Elsewhere, callers that may SIGKILL a run should start it in its own
process group and kill the group (the test suite and `.ci/run` do).

`end_workers_at_exit()`, registered by importing the library, ends the
process's workers and silences TFF's service managers at interpreter exit,
whose `__del__` would otherwise fail there ("Exception ignored in ...
ServiceManager.__del__ ... 'NoneType' object has no attribute 'Popen'").

On a signal, TFF must first be stopped from starting workers: its executor
service manager starts a replacement as soon as it finds its worker gone, so
a cleanup that only ends the workers leaves the replacement behind
(`stop_new_workers`).
"""

import atexit
from concurrent import futures
import contextlib
import ctypes
import functools
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Optional

WORKER_NAME = 'worker_binary'
_FACTORY = (
    'tensorflow_federated.python.core.impl.executor_stacks.executor_factory'
)
_installed = False
_exit_registered = False
_interrupted = False
_watchdog: Optional[threading.Thread] = None
_wakeup_sockets: tuple[socket.socket, ...] = ()  # Kept open for the process.


class _NoNewProcesses:
  """Stands in for the `subprocess` module of TFF's executor factory."""

  class Popen:  # Never an instance: the service manager's `__del__` skips.

    def __init__(self, *args, **kwargs):
      del args, kwargs
      raise RuntimeError('the process is shutting down: no new TFF worker')


def _note_signal() -> None:
  global _interrupted
  _interrupted = True


def shutting_down() -> bool:
  """Whether a signal asked this process to end (its TFF calls may fail)."""
  return _interrupted


class _AnyPopen(type):
  """`isinstance(p, _TiedPopen)` holds for every `subprocess.Popen`.

  TFF's service manager ends its worker in `__del__` only if it is an
  instance of its `subprocess.Popen`: also a worker started before the
  workers were tied.
  """

  def __instancecheck__(cls, instance) -> bool:
    return isinstance(instance, subprocess.Popen)


# One thread of this process starts the workers: the kernel sends the
# parent-death signal when the *thread* that started a child ends, and the
# thread TFF starts one in may end long before the process does.
_spawner: Optional['queue.SimpleQueue[Any]'] = None
_spawner_lock = threading.Lock()


def _in_spawner_thread(fn: Callable[[], Any]) -> Any:
  """`fn()` run on the spawner thread (a daemon, started once)."""
  global _spawner
  with _spawner_lock:
    if _spawner is None:
      requests = queue.SimpleQueue()

      def serve() -> None:
        while True:
          call, future = requests.get()
          if future.set_running_or_notify_cancel():
            try:
              future.set_result(call())
            except BaseException as e:  # pylint: disable=broad-except
              future.set_exception(e)

      threading.Thread(
          target=serve, name='tff-worker-spawner', daemon=True
      ).start()
      _spawner = requests
  future = futures.Future()
  _spawner.put((fn, future))
  return future.result()


# Started in front of a worker: sets the parent-death signal (setpriv, from
# util-linux), then checks that the parent still lives (it may have died
# before the signal was set) and becomes the worker. No Python runs in the
# child: a `preexec_fn` makes Python fork() instead of vfork(), and gRPC's
# fork handlers in a process with TFF's threads can abort or hang the child
# before its exec (seen: "Fatal Python error: Aborted", and a TFF context
# waiting forever for a worker that never started).
_TIE_SCRIPT = '[ "$PPID" = "$1" ] || exit 1; shift; exec "$@"'


def _tied_command(setpriv: str, args: Any, parent: int) -> Any:
  """`args` run behind setpriv's parent-death SIGKILL (`args` unchanged if
  not a list of arguments)."""
  if isinstance(args, (str, bytes, os.PathLike)) or not args:
    return args
  return [
      setpriv,
      '--pdeathsig',
      'KILL',
      '--',
      '/bin/sh',
      '-c',
      _TIE_SCRIPT,
      'tied-worker',
      str(parent),
      *args,
  ]


@functools.cache
def _setpriv() -> Optional[str]:
  """util-linux's `setpriv` if it can set the parent-death signal.

  Checked by running it once: a `setpriv` older than util-linux 2.33 has no
  `--pdeathsig`, and a tied worker that cannot start would leave TFF
  waiting for it forever.
  """
  path = shutil.which('setpriv')
  if path is None:
    return None
  try:
    subprocess.run(
        [path, '--pdeathsig', 'KILL', '--', 'true'],
        check=True,
        capture_output=True,
        timeout=30,
    )
  except (OSError, subprocess.SubprocessError):
    return None
  return path


class _TiedPopen(subprocess.Popen, metaclass=_AnyPopen):
  """A `subprocess.Popen` whose child the kernel kills with this process."""

  def __init__(self, args, **kwargs):  # pylint: disable=super-init-not-called
    setpriv = _setpriv()
    if setpriv and not kwargs.get('shell') and not kwargs.get('executable'):
      args = _tied_command(setpriv, args, os.getpid())
    # pytype cannot follow **kwargs into Popen's overloads.
    _in_spawner_thread(
        lambda: subprocess.Popen.__init__(  # pytype: disable=wrong-arg-types
            self, args, **kwargs
        )
    )


class _TiedSubprocess:
  """Stands in for the `subprocess` module of TFF's executor factory."""

  Popen = _TiedPopen


def tie_workers_to_process() -> bool:
  """TFF's local workers started from now on end when this process ends.

  Linux with util-linux's `setpriv` only: each `worker_binary` TFF's local
  execution context starts gets the parent-death signal SIGKILL
  (`setpriv --pdeathsig`, `prctl(PR_SET_PDEATHSIG)`), so not even a SIGKILL
  of this process leaves it running. Idempotent; does nothing after
  `stop_new_workers` or before TFF is imported.

  Returns:
    Whether workers started from now on are tied.
  """
  factory = sys.modules.get(_FACTORY)
  if factory is None or not sys.platform.startswith('linux') or not _setpriv():
    return False
  if factory.subprocess is subprocess:
    factory.subprocess = _TiedSubprocess
  return factory.subprocess is _TiedSubprocess


def stop_new_workers() -> None:
  """From now on TFF's local executor factory cannot start a worker.

  Its service manager restarts the worker whenever it finds it gone, so
  ending the workers while a computation runs would only replace them; after
  this call a restart fails instead (the computation raises). Also
  silences the service managers' `__del__`.
  """
  factory = sys.modules.get(
      'tensorflow_federated.python.core.impl.executor_stacks.executor_factory'
  )
  if factory is not None:
    factory.subprocess = _NoNewProcesses


def _read_stat(pid: int) -> Optional[tuple[str, str, int]]:
  """`(comm, state, ppid)` of `pid`, or None if there is no such process."""
  try:
    with open(f'/proc/{pid}/stat', 'rb') as f:
      stat = f.read().decode('utf-8', 'replace')
  except OSError:
    return None
  # Format: "pid (comm) state ppid ..."; comm may contain spaces.
  close = stat.rfind(')')
  comm = stat[stat.find('(') + 1 : close]
  fields = stat[close + 2 :].split()
  return comm, fields[0], int(fields[1])


def worker_pids(parent: Optional[int] = None) -> list[int]:
  """PIDs of live `worker_binary` processes (children of `parent` if given)."""
  pids = []
  if not os.path.isdir('/proc'):
    return pids
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    info = _read_stat(int(entry))
    if info is None:
      continue
    comm, state, ppid = info
    if not comm.startswith(WORKER_NAME[:15]) or state == 'Z':
      continue  # comm is cut at 15 chars; a zombie has ended.
    if parent is None or ppid == parent:
      pids.append(int(entry))
  return sorted(pids)


def kill_workers(parent: Optional[int] = None, timeout: float = 5.0) -> int:
  """Ends the worker processes of `parent` (default: this process).

  Sends SIGINT (TFF's own shutdown signal), then SIGKILL to any still alive
  after `timeout` seconds.

  Returns:
    The number of workers found.
  """
  parent = os.getpid() if parent is None else parent
  pids = worker_pids(parent)
  for pid in pids:
    with contextlib.suppress(OSError):  # Already gone.
      os.kill(pid, signal.SIGINT)
  deadline = time.monotonic() + timeout
  alive = list(pids)
  while alive and time.monotonic() < deadline:
    alive = [p for p in alive if _alive(p)]
    if alive:
      time.sleep(0.05)
  for pid in alive:
    with contextlib.suppress(OSError):
      os.kill(pid, signal.SIGKILL)
  return len(pids)


def _alive(pid: int) -> bool:
  # A zombie has ended. It is not reaped here: TFF's service manager may
  # still signal or wait for it, and a reaped pid would raise there.
  info = _read_stat(pid)
  return info is not None and info[1] != 'Z'


def end_all_workers(settle: float = 0.2) -> None:
  """Stops TFF from starting workers, then ends them until none is left.

  A worker being started when TFF is stopped (forked, not yet running the
  worker binary) appears a moment later, so the workers are looked for
  again until a search `settle` seconds after the last finds none.
  """
  stop_new_workers()
  deadline = time.monotonic() + 10.0
  kill_workers()
  while time.monotonic() < deadline:
    time.sleep(settle)
    if not kill_workers():
      break


def _signal_handler(signum, frame):
  del frame
  _note_signal()
  end_all_workers()
  signal.signal(signum, signal.SIG_DFL)
  os.kill(os.getpid(), signum)


def _is_worker_channel_error(exc_type) -> bool:
  """An error of TFF's executors or gRPC: what a call to a worker ended by
  a signal raises (TFF's `RetryableGRPCError`)."""
  module = getattr(exc_type, '__module__', None) or ''
  return module.startswith(('tensorflow_federated.', 'grpc'))


def _quiet_after_signal(previous):
  """An unraisable-exception hook: after a signal, the worker channel's
  errors (raised in a finalizer or a gRPC callback while the process ends,
  "Exception ignored ... RetryableGRPCError") are dropped; anything else,
  and anything before a signal, goes to `previous`."""

  def hook(unraisable):
    if _interrupted and _is_worker_channel_error(unraisable.exc_type):
      return
    previous(unraisable)

  return hook


def install_worker_cleanup() -> None:
  """Ends this process's TFF workers at exit and on SIGTERM/SIGINT/SIGHUP.

  Also ties the workers started from now on to this process
  (`tie_workers_to_process`): the kernel ends them if it is SIGKILLed.
  """
  global _installed
  tie_workers_to_process()
  if _installed:
    return
  _installed = True
  atexit.register(end_all_workers)
  sys.unraisablehook = _quiet_after_signal(sys.unraisablehook)
  for signum in (signal.SIGTERM, signal.SIGHUP):
    if signal.getsignal(signum) in (signal.SIG_DFL, None):
      signal.signal(signum, _signal_handler)
  previous_int = signal.getsignal(signal.SIGINT)

  def on_interrupt(signum, frame):
    # Only ends the workers: in a notebook the next computation starts a new
    # one. A binary ends through `exit_now`, which stops TFF's restarts.
    _note_signal()
    kill_workers()
    if callable(previous_int):
      previous_int(signum, frame)
    else:
      raise KeyboardInterrupt

  signal.signal(signal.SIGINT, on_interrupt)


def _end_after_grace(signum: int, grace_s: float, interrupted_line: str):
  """Ends the process unless its main thread does within `grace_s` seconds."""
  time.sleep(grace_s)
  _note_signal()
  end_all_workers()
  with contextlib.suppress(OSError, ValueError):
    if signum == signal.SIGINT:
      sys.stderr.write(interrupted_line + '\n')
    sys.stderr.flush()
  if signum == signal.SIGINT:
    os._exit(130)  # pylint: disable=protected-access
  # Die of the signal, as its default action would: `signal.signal` works in
  # the main thread only, libc's `signal` in any.
  with contextlib.suppress(OSError, AttributeError):
    ctypes.CDLL(None).signal(signum, 0)  # 0 is SIG_DFL.
    os.kill(os.getpid(), signum)
    time.sleep(1.0)
  os._exit(128 + signum)  # pylint: disable=protected-access


def install_exit_watchdog(interrupted_line: str, grace_s: float = 20.0):
  """Ends this process `grace_s` seconds after a SIGINT/SIGTERM/SIGHUP.

  For binaries. Their signal handlers end the run at once in every case
  tried, but a handler runs in the main thread only when that thread next
  runs Python code: a signal the kernel delivers to another thread while the
  main thread waits on a TFF future that never resolves, or an interrupt
  swallowed inside a library, would leave the run (and its workers) going.
  Python's C-level handler writes each signal's number to the wakeup file
  descriptor from whichever thread received it; a daemon thread reads it and,
  if the process is still alive `grace_s` seconds later, ends the workers
  and exits: status 130 with `interrupted_line` for SIGINT, the signal's
  default action for SIGTERM and SIGHUP. Call from the main thread.

  Args:
    interrupted_line: The line printed when a SIGINT ends the process.
    grace_s: Seconds the main thread has to end the process by itself.
  """
  global _watchdog, _wakeup_sockets
  if _watchdog is not None or (
      threading.current_thread() is not threading.main_thread()
  ):
    return  # Only the main thread may set the wakeup fd (and has handlers).
  reader, writer = socket.socketpair()
  writer.setblocking(False)
  signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
  watched = {int(signal.SIGINT), int(signal.SIGTERM), int(signal.SIGHUP)}

  def watch():
    while True:
      data = reader.recv(64)
      if not data:
        return
      for signum in data:
        if signum in watched:
          _end_after_grace(signum, grace_s, interrupted_line)

  _wakeup_sockets = (reader, writer)
  _watchdog = threading.Thread(target=watch, name='exit-watchdog', daemon=True)
  _watchdog.start()


def disarm_service_managers() -> None:
  """Silences TFF's executor service managers before interpreter teardown.

  Their `__del__` runs after the `subprocess` module is torn down and prints
  "Exception ignored ... 'NoneType' object has no attribute 'Popen'". Call
  after `kill_workers()` when the process is about to exit (the test suite
  does this at the end of the session).
  """
  import gc  # pylint: disable=g-import-not-at-top

  for obj in gc.get_objects():
    cls = type(obj)
    if cls.__name__ == 'ServiceManager' and 'executor_factory' in getattr(
        cls, '__module__', ''
    ):
      cls.__del__ = lambda self: None


def _end_workers_and_disarm() -> None:
  if _FACTORY in sys.modules:  # Else TFF made no service manager.
    kill_workers()
    disarm_service_managers()


def end_workers_at_exit() -> None:
  """At interpreter exit, ends this process's TFF workers, quietly.

  TFF 0.87 makes a service manager for its local worker when it is imported;
  at interpreter exit its `__del__` runs after the `subprocess` module is
  torn down and prints "Exception ignored in ... ServiceManager.__del__ ...
  'NoneType' object has no attribute 'Popen'". This ends the workers (what
  that `__del__` is for) and then disarms the managers, in an `atexit`
  handler, while the modules are whole. The library's modules that import
  TFF call it on import (once per process; cheap until then).
  """
  global _exit_registered
  if not _exit_registered:
    _exit_registered = True
    atexit.register(_end_workers_and_disarm)


def exit_now(code: int) -> None:
  """Ends the workers, flushes output and exits with `code` immediately.

  Skips interpreter teardown, where TFF 0.87's executor service manager's
  `__del__` runs after the `subprocess` module is gone and prints a spurious
  traceback ("'NoneType' object has no attribute 'Popen'"). For binaries'
  `main`; libraries and tests should not call it.
  """
  end_all_workers()
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(OSError, ValueError):  # Closed stream.
      stream.flush()
  os._exit(code)  # pylint: disable=protected-access
