# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Training runs in long-lived worker processes, with their builds reused.

A run of the training binary (`run.train`) on a small task spends most of
its time before its first round: importing TensorFlow and TFF (about 7 s
here), building the task, tracing the TFF process and the engine's round
graph. The tail benchmark runs hundreds of such runs that differ only in a
seed, a knob or a learning rate. A `RunWorker` is one child process that
imports the binary once and runs `run.train.main` for each run it is given,
in the process, with four builds kept between runs (`_Builds`):

* the task (`tasks.registry.create_task`, then `tasks.holdout.with_holdout`),
  keyed by their arguments: the same data seed gives the same task;
* the TFF process (`run.algorithms.build_process`) and the engine
  (`run.engines.build_*_engine`), keyed by the algorithm's options and the
  task: every seed of one configuration reuses them (the round graph takes
  the weights, the state and each round's client seeds as inputs);
* the per-client evaluation computation, keyed by the task's model.

A run gives the same summary in a worker as in its own process
(`tests/test_run_pool.py` checks it, across seeds and configurations). Each
run still writes its own folder, resumes from its own checkpoints and ends its
TFF workers, exactly as `python -m run.train` would. The benchmark's record
of a run is made in the worker from that folder (`RunWorker.record`,
`records.make_record`) and only the record travels back to the driver, which
keeps it, as do a fine-tuning's result, the trivial scores and FedAvg's final
model (sent back, and sent to the worker that fine-tunes it): the driver
reads no run folder but its `--plan` calibration run's round times. A worker
is a process group of its own (`start_new_session`): the driver's
`processes.end_children` ends it, and the TFF workers under it, on a signal;
a driver that dies without one (SIGKILL, the OOM killer) is noticed by the
worker itself, which then ends its group within a second (`_end_with_driver`):
the run stops, its folder keeps its last checkpoint.

The protocol is one JSON line each way per request, on the worker's stdin
and on a copy of its original stdout (the binary's own printing goes to
stderr, which the driver sends to a log file).

A driver keeps its workers in a `Workers` (one per thread of its pool,
local processes or `ray_pool.RayRunWorker` actors) and runs its items in
`parallel`: the tail benchmark (`records.Runs` is its `Workers`) and
`run.experiments.reproduce`, whose runs send back their summaries
(`RunWorker.summary`).
"""

import base64
import collections
import concurrent.futures
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Optional

from run.tail_benchmark import processes

# Builds kept per kind (least recently used out): one configuration's runs
# are sent to the worker one after another, so a few suffice.
_CACHE_SIZE = 4


# The worker process's program (not a binary of its own: nothing to run by
# hand).
_WORKER_MAIN = (
    'from run.tail_benchmark import pool, records;'
    ' pool.worker_main(records.make_record)'
)


class RunFailed(RuntimeError):
  """A run ended with a non-zero exit; the message is its error line."""

  def __init__(self, message: str, code: int):
    super().__init__(message)
    self.code = code


class RunWorker:
  """A child process that runs `run.train` runs; used from one thread."""

  def __init__(self, log_path: Optional[str] = None):
    self._log_path = log_path
    self._proc: Optional[subprocess.Popen] = None

  def _start(self) -> subprocess.Popen:
    if self._proc is not None and self._proc.poll() is None:
      return self._proc
    log = open(  # pylint: disable=consider-using-with
        self._log_path or os.devnull, 'a'
    )
    try:
      self._proc = processes.start(
          [sys.executable, '-c', _WORKER_MAIN],
          stdin=subprocess.PIPE,
          stdout=subprocess.PIPE,
          stderr=log,
          text=True,
      )
    finally:
      log.close()
    return self._proc

  def request(self, request: dict) -> dict:
    """Sends one request to the worker; its reply (raises `RunFailed` if
    the worker ended, `processes.NotStarted` if the driver is ending)."""
    proc = self._start()
    try:
      proc.stdin.write(json.dumps(request) + '\n')
      proc.stdin.flush()
      line = proc.stdout.readline()
    except (BrokenPipeError, OSError):
      line = ''
    if not line:
      code = proc.wait()
      self._forget(proc)
      if processes.stopping():
        raise processes.NotStarted()
      raise RunFailed(
          f'the run worker ended (exit {code}); its log: '
          f'{self._log_path or "not kept"}',
          code or 1,
      )
    return json.loads(line)

  def _forget(self, proc: subprocess.Popen) -> None:
    processes.forget(proc)
    if self._proc is proc:
      self._proc = None

  def interrupt(self) -> int:
    """Ends the request in flight from another thread once the driver is
    ending (`processes.end_children` has run): a local worker got the
    signal from it, so nothing is left to do here (0). `RayRunWorker`'s
    actor is out of its reach: that one ends it (1)."""
    return 0

  def run(self, args: Sequence[str]) -> None:
    """Runs `python -m run.train --progress=false ARGS` in the worker.

    Raises:
      RunFailed: The run's exit code was not 0 (its last error line).
      processes.NotStarted: The driver is ending.
    """
    self._succeeded({'run': list(args)})

  def _succeeded(self, request: dict) -> dict:
    """The worker's reply to `request`; `RunFailed` if its run failed."""
    reply = self.request(request)
    if reply['code'] != 0:
      raise RunFailed(reply['error'], reply['code'])
    return reply

  def summary(self, args: Sequence[str]) -> dict[str, Any]:
    """Runs `python -m run.train --progress=false ARGS` in the worker (it
    resumes from its folder's checkpoints, as the binary does); the run's
    `summary.json`, sent back (its folder is on the worker's machine).

    Raises:
      RunFailed: The run's exit code was not 0 (its last error line).
      processes.NotStarted: The driver is ending.
    """
    return self._succeeded({'summary': list(args)})['summary']

  def record(
      self, args: Sequence[str], rounds: int, personal: bool
  ) -> dict[str, Any]:
    """The record of the run `args` of `rounds` rounds, made in the worker
    (`records.make_record`: it runs unless its folder holds it finished);
    the worker's warnings are repeated here.

    Raises:
      RunFailed: The run's exit code was not 0 (its last error line).
      RuntimeError: Its folder holds another run (one line).
      processes.NotStarted: The driver is ending.
    """
    reply = self.request(
        {'record': list(args), 'rounds': rounds, 'personal': personal}
    )
    for line in reply.get('warnings', ()):
      print(f'benchmark: warning: {line}', file=sys.stderr, flush=True)
    if reply.get('refused'):
      raise RuntimeError(reply['error'])
    if reply['code'] != 0:
      raise RunFailed(reply['error'], reply['code'])
    return reply['record']

  def fine_tune(
      self, args: Sequence[str], model: Optional[bytes] = None, **options
  ) -> dict[str, Any]:
    """`run.fine_tune.fine_tune_run(**options)` of the finished run `args`:
    its result, sent back (`model`: the saved model's bytes, sent along).

    Raises:
      RunFailed: It failed (its error line).
    """
    request = {'fine_tune': list(args), 'options': options}
    if model is not None:
      request['model'] = base64.b64encode(model).decode('ascii')
    reply = self.request(request)
    if reply['code'] != 0:
      raise RunFailed(reply['error'], reply['code'])
    return reply['result']

  def export_model(self, args: Sequence[str]) -> bytes:
    """`run.fine_tune.model_bytes()` of the finished run `args`, sent back.

    Raises:
      RunFailed: It failed (its error line).
    """
    reply = self.request({'export_model': list(args)})
    if reply['code'] != 0:
      raise RunFailed(reply['error'], reply['code'])
    return base64.b64decode(reply['model'])

  def trivial(self, args: Sequence[str]) -> dict[str, Any]:
    """`run.fine_tune.trivial_scores()` of the task of `args`, sent back.

    Raises:
      RunFailed: It failed (its error line).
    """
    reply = self.request({'trivial': list(args)})
    if reply['code'] != 0:
      raise RunFailed(reply['error'], reply['code'])
    return reply['result']

  def check(self, args: Sequence[str]) -> Optional[str]:
    """The binary's error line for `args` without running it, or None.

    Parses the flags and checks the task's (`run.train.task_kwargs`), so an
    unknown or misspelt task flag is reported before any run starts.
    """
    reply = self.request({'check': list(args)})
    return reply['error'] or None

  def close(self) -> None:
    proc = self._proc
    if proc is None:
      return
    with contextlib.suppress(OSError, ValueError):
      proc.stdin.close()
    try:
      proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
    self._forget(proc)


class Workers:
  """A driver's run workers: one per thread of its pool (`parallel`).

  A thread takes a worker (`worker`: an idle one, or a new one) and keeps
  it until `release`, so the runs it is given in a row share the worker's
  builds; `close` ends them all. `worker_type`: local processes
  (`RunWorker`) or Ray actors (`ray_pool.RayRunWorker`, from
  `ray_pool.worker_type`); worker i logs to `log_dir/worker_i.log`.
  """

  def __init__(self, log_dir: str, jobs: int, worker_type: type = RunWorker):
    self.log_dir = log_dir
    self.jobs = jobs
    self.worker_type = worker_type
    self._local = threading.local()
    self._workers: list[RunWorker] = []
    self._idle: list[RunWorker] = []
    self._lock = threading.Lock()

  def worker(self) -> RunWorker:
    """This thread's worker: taken from the idle ones (or a new one) for
    the thread's current item; `release` gives it back."""
    worker = getattr(self._local, 'worker', None)
    if worker is None:
      with self._lock:
        if self._idle:
          worker = self._idle.pop()
        else:
          log = os.path.join(self.log_dir, f'worker_{len(self._workers)}.log')
          worker = self.worker_type(os.path.abspath(log))
          self._workers.append(worker)
      self._local.worker = worker
    return worker

  def release(self) -> None:
    """Gives this thread's worker back (its builds stay warm for others)."""
    worker = getattr(self._local, 'worker', None)
    if worker is not None:
      self._local.worker = None
      with self._lock:
        self._idle.append(worker)

  def interrupt(self) -> int:
    """`RunWorker.interrupt` of every worker (the driver is ending): the
    number of workers it ended."""
    with self._lock:
      workers = list(self._workers)
    return sum(worker.interrupt() for worker in workers)

  def close(self) -> None:
    for worker in self._workers:
      worker.close()


def parallel(fn: Callable[[Any], Any], items: Sequence[Any], workers) -> list:
  """`[fn(item) ...]` in `workers.jobs` threads, each item with the
  thread's worker (`workers.release()` after each).

  On a signal (`processes.Stopped`, raised in the calling thread) the
  running workers are ended (`processes.end_children`, then
  `workers.interrupt()` for those out of its reach) before the threads are
  waited for; the exception's `ended` counts them. Any other exception ends
  them too. `workers`: a `Workers` (or anything with its `jobs`, `release`
  and `interrupt`).
  """

  def one(item):
    try:
      return fn(item)
    finally:
      workers.release()

  pool = concurrent.futures.ThreadPoolExecutor(workers.jobs)
  try:
    futures = [pool.submit(one, item) for item in items]
    return [f.result() for f in futures]
  except processes.Stopped as e:
    e.ended = processes.end_children(e.signum) + workers.interrupt()
    raise
  except BaseException:
    processes.end_children(signal.SIGTERM)
    workers.interrupt()
    raise
  finally:
    pool.shutdown(wait=True, cancel_futures=True)


# ------------------------------------------------------------ worker side


class _Builds:
  """Memoized builders, patched into the modules `run.train` calls."""

  def __init__(self):
    self._caches: dict[str, collections.OrderedDict] = {}

  def memoize(
      self,
      module: Any,
      name: str,
      key_fn: Callable[..., Optional[Hashable]],
  ) -> None:
    """Replaces `module.name` by a cached call (uncached if key is None)."""
    original = getattr(module, name)
    cache = self._caches.setdefault(
        f'{module.__name__}.{name}', collections.OrderedDict()
    )

    def cached(*args, **kwargs):
      key = key_fn(*args, **kwargs)
      if key is None:
        return original(*args, **kwargs)
      if key in cache:
        cache.move_to_end(key)
        return cache[key]
      value = original(*args, **kwargs)
      cache[key] = value
      while len(cache) > _CACHE_SIZE:
        old = cache.popitem(last=False)[1]
        close = getattr(old, 'close', None)
        if callable(close):
          close()
      return value

    setattr(module, name, cached)


class _Same:
  """A cache-key part that is its object (by identity), kept alive by it."""

  __slots__ = ('obj',)

  def __init__(self, obj: Any):
    self.obj = obj

  def __hash__(self) -> int:
    return id(self.obj)

  def __eq__(self, other: Any) -> bool:
    return isinstance(other, _Same) and other.obj is self.obj


def _frozen(value: Any) -> Optional[Hashable]:
  """A hashable image of call arguments, or None if they have none."""
  if isinstance(value, dict):
    value = sorted(value.items())
  if isinstance(value, (list, tuple)):
    items = tuple(_frozen(v) for v in value)
    if any(f is None and v is not None for f, v in zip(items, value)):
      return None
    return items
  try:
    hash(value)
  except TypeError:
    return None
  return value


def _install_builds() -> None:
  """Patches the builders `run.train.prepare` and the simulation call."""
  # pylint: disable=g-import-not-at-top
  from run import algorithms
  from run import engines
  from tasks import evaluation
  from tasks import holdout
  from tasks import registry
  # pylint: enable=g-import-not-at-top

  builds = _Builds()

  def task_key(name, **kwargs):
    key = _frozen(kwargs)
    return None if key is None else (name, key)

  builds.memoize(registry, 'create_task', task_key)
  builds.memoize(
      holdout,
      'with_holdout',
      lambda task, **kwargs: (_Same(task), _frozen(kwargs)),
  )
  builds.memoize(
      algorithms,
      'build_process',
      lambda spec, model_fn, **kwargs: (
          spec,
          _Same(model_fn),
          _frozen({k: repr(v) for k, v in kwargs.items()}),
      ),
  )
  for name in ('build_stacked_engine', 'build_batched_engine'):
    builds.memoize(
        engines,
        name,
        lambda spec, task, **kwargs: (spec, _Same(task), _frozen(kwargs)),
    )
  builds.memoize(
      evaluation,
      'build_per_client_evaluation',
      lambda model_fn, *a, **k: (_Same(model_fn), _frozen(a), _frozen(k)),
  )


class _Tail(io.TextIOBase):
  """A text stream that passes writes on and keeps the last lines."""

  def __init__(self, stream):
    super().__init__()
    self._stream = stream
    self._lines = collections.deque(maxlen=20)
    self._partial = ''

  def write(self, text: str) -> int:
    self._stream.write(text)
    lines = (self._partial + text).split('\n')
    self._partial = lines.pop()
    self._lines.extend(lines)
    return len(text)

  def flush(self) -> None:
    self._stream.flush()

  def fileno(self) -> int:  # TFF hands sys.stderr to its worker's Popen.
    return self._stream.fileno()

  def isatty(self) -> bool:
    return False

  def error_line(self) -> str:
    lines = [l for l in list(self._lines) + [self._partial] if l.strip()]
    errors = [l for l in lines if ': error: ' in l]
    return (errors or lines or ['(no output)'])[-1].strip()


def _end_with_driver(driver: int, period: float = 0.5) -> None:
  """Kills this worker's process group (its TFF workers too) once `driver`,
  its parent, is gone: an orphaned worker would run its run to the end."""

  def watch() -> None:
    while os.getppid() == driver:
      time.sleep(period)
    os.killpg(os.getpgrp(), signal.SIGKILL)

  threading.Thread(target=watch, name='end-with-driver', daemon=True).start()


def serve(make_record: Callable[..., dict]) -> int:
  """The worker: one request per stdin line, one reply per line
  (`make_record`: `records.make_record`, for `record` requests)."""
  _end_with_driver(os.getppid())
  proto = os.fdopen(os.dup(1), 'w')
  os.dup2(2, 1)  # The binary's printing goes to the log, not the protocol.
  sys.stdout = os.fdopen(1, 'w', buffering=1)
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  # pylint: disable=g-import-not-at-top
  from run import fine_tune
  from run import train
  from tff_algos import runtime
  # pylint: enable=g-import-not-at-top

  _install_builds()
  # The TFF worker a run starts serves the next run too (a run ends its
  # workers; here the worker's exit does, `runtime.exit_now`, with the real
  # `kill_workers` put back).
  kill_workers = runtime.kill_workers
  runtime.kill_workers = lambda *args, **kwargs: 0
  try:
    return _serve_requests(proto, train, fine_tune, make_record)
  finally:
    runtime.kill_workers = kill_workers


# run.train's exit codes after SIGINT, SIGTERM, SIGHUP.
_INTERRUPTED = (130, 128 + signal.SIGTERM, 128 + signal.SIGHUP)


def _serve_requests(proto, train, fine_tune, make_record) -> int:
  """`serve`'s loop: runs each request; 1 after a bug in the binary."""
  # pylint: disable=g-import-not-at-top
  from absl import flags
  # pylint: enable=g-import-not-at-top

  flags_ = flags.FLAGS
  real_stderr = sys.stderr
  for line in sys.stdin:
    request = json.loads(line)
    kind = next(
        k
        for k in (
            'run',
            'summary',
            'record',
            'check',
            'fine_tune',
            'export_model',
            'trivial',
        )
        if k in request
    )
    args = request[kind]
    tail = _Tail(real_stderr)
    sys.stderr = tail
    code = 0
    extra = {}
    try:
      flags_.unparse_flags()
      try:
        flags_(['train', '--progress=false', *args])
      except flags.Error as e:
        print(f'train: error: {e}', file=sys.stderr)
        code = 2
      if code == 0 and kind == 'check':
        try:
          train.check_task_flags()
          train.task_kwargs()
        except (ValueError, TypeError, OSError) as e:
          print(f'train: error: {e}', file=sys.stderr)
          code = 2
      elif code == 0 and kind == 'fine_tune':
        try:
          model = request.get('model')
          extra['result'] = fine_tune.fine_tune_run(
              **request['options'],
              model=None if model is None else base64.b64decode(model),
          )
        except (ValueError, TypeError, OSError) as e:
          print(f'fine_tune: error: {e}', file=sys.stderr)
          code = 1
      elif code == 0 and kind in ('export_model', 'trivial'):
        try:
          if kind == 'export_model':
            model = fine_tune.model_bytes()
            extra['model'] = base64.b64encode(model).decode('ascii')
          else:
            extra['result'] = fine_tune.trivial_scores()
        except (ValueError, TypeError, OSError) as e:
          print(f'{kind}: error: {e}', file=sys.stderr)
          code = 1
      elif code == 0 and kind == 'record':
        code, extra = _record(request, train, make_record, tail)
      elif code == 0:
        code = train.main(['train'])
        if code == 0 and kind == 'summary':
          code, extra = _summary(train)
      if code in _INTERRUPTED:
        # The driver forwarded a signal to end its runs: this worker ends
        # too (it would otherwise wait for a next run until the driver's
        # grace period ran out and killed it).
        proto.write(json.dumps({'code': code, 'error': 'interrupted'}) + '\n')
        proto.flush()
        return code
    except Exception as e:  # pylint: disable=broad-except
      # A bug in the binary: report it, then end this worker (a fresh one
      # takes the next run) rather than run on in an unknown state.
      traceback.print_exc()
      line = f'{type(e).__name__}: {e}'.splitlines()[0]
      proto.write(json.dumps({'code': 1, 'error': line}) + '\n')
      proto.flush()
      return 1
    finally:
      sys.stderr = real_stderr
    reply = {'code': code, 'error': tail.error_line() if code else ''}
    reply.update(extra)
    proto.write(json.dumps(reply) + '\n')
    proto.flush()
  return 0


def _summary(train) -> tuple[int, dict]:
  """A finished `summary` request's run: its `summary.json` (the parsed
  flags' run folder), or exit 1 with an error line."""
  try:
    path = os.path.join(
        train.experiment_dir(train.run_config()), 'summary.json'
    )
    with open(path) as f:
      return 0, {'summary': json.load(f)}
  except (OSError, ValueError) as e:
    print(f'train: error: cannot read summary.json: {e}', file=sys.stderr)
    return 1, {}


def _record(request, train, make_record, tail) -> tuple[int, dict]:
  """A `record` request: `make_record` (`records.make_record`) with the
  parsed flags' run.

  Returns:
    `(exit code, reply fields)`: the record and the warnings, or `refused`
    and the error for a folder that holds another run.
  """
  warnings = []

  def train_once(args):
    del args  # Parsed already.
    code = train.main(['train'])
    if code:
      raise RunFailed(tail.error_line(), code)

  try:
    record = make_record(
        request['record'],
        request['rounds'],
        request['personal'],
        train_once,
        warnings.append,
    )
  except RunFailed as e:
    return e.code, {'warnings': warnings}
  except RuntimeError as e:
    return 1, {'warnings': warnings, 'refused': True, 'error': str(e)}
  return 0, {'warnings': warnings, 'record': record}


def worker_main(make_record: Callable[..., dict]) -> None:
  """A worker process: `serve`, then end with its TFF workers."""
  code = 1
  try:
    code = serve(make_record)
  finally:
    # pylint: disable=g-import-not-at-top
    from tff_algos import runtime
    # pylint: enable=g-import-not-at-top

    runtime.exit_now(code)
