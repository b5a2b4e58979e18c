# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The benchmark's run workers as Ray actors, anywhere in a Ray cluster.

`--ray_address=auto|HOST:PORT` makes the benchmark (and every driver that
uses `records.Runs`, and `run.experiments.reproduce`) send its runs to a
Ray cluster instead of local child processes (`worker_type`). A
`RayRunWorker` has `pool.RunWorker`'s interface; its requests go to a Ray
actor (`Relay`, one CPU) that Ray places on any node. The actor keeps a
`pool.RunWorker` child process on its node, so a worker keeps its builds
between runs as the local pool's does, and relays each request's reply.
Records, fine-tuning results, models and summaries travel back to the
driver in the replies, and the driver writes them: no shared filesystem is
needed. A run's folder (`--output_dir`; reproduce's `--root_output_dir`)
and the task's data (`--data_dir`) are paths on the node that runs it.

A lost node loses only its running requests: its actors restart on another
node (`max_restarts=-1`) and each request runs again there
(`max_task_retries=-1`); a run is deterministic in its arguments, so its
record equals an undisturbed run's. The driver's own node (the Ray node it
is attached to: run it on the head) must outlive the benchmark: its actors
belong to it. The driver's `close` ends its actors
(and so their workers and the workers' TFF children, which end with their
parent: `pool._end_with_driver`), as does a signal to the driver at once
(`pool.parallel` calls `RayRunWorker.interrupt`: the signal that
`processes.end_children` forwards reaches local children only); a driver
that dies takes its actors with it (they are not detached). Rerunning the
command resumes from the records.

Ray is an optional extra (`pip install 'tff-hetero[ray]'`, ray 2.52.1: the
newest release that shares TFF 0.87's stack; from 2.53 on Ray needs
packaging >= 24.2, which tensorflow-privacy 0.9 excludes). Without
`--ray_address` Ray is not imported.
"""

import os
import socket
import sys
import tempfile
import threading
from typing import Any, Optional

from run.tail_benchmark import pool
from run.tail_benchmark import processes

RAY_REQUIREMENT = 'ray==2.52.1'


class RayUnavailable(RuntimeError):
  """Ray cannot be imported or reached (one line)."""


def _ray():
  try:
    import ray  # pylint: disable=g-import-not-at-top  # pytype: disable=import-error
  except ImportError:
    raise RayUnavailable(
        "--ray_address needs Ray: pip install 'tff-hetero[ray]' "
        f'({RAY_REQUIREMENT})'
    ) from None
  return ray


def connect(address: str) -> dict[str, float]:
  """Connects this driver to the Ray cluster at `address` (`auto`, or
  `HOST:PORT` of its head); returns the cluster's resources.

  Raises:
    RayUnavailable: No Ray, or no cluster there (one line).
  """
  # Ray's notice of a coming change to its GPU variables (none here).
  os.environ.setdefault('RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO', '0')
  ray = _ray()
  if ray.is_initialized():
    return ray.cluster_resources()
  check_address(address)
  try:
    ray.init(
        address=address,
        log_to_driver=False,
        logging_level='ERROR',
        configure_logging=False,
    )
  except (ConnectionError, RuntimeError, ValueError) as e:
    raise RayUnavailable(
        f'--ray_address={address}: no Ray cluster there '
        f'({str(e).splitlines()[0] if str(e) else type(e).__name__})'
    ) from None
  return ray.cluster_resources()


def check_address(address: str, timeout: float = 5.0) -> None:
  """Raises `RayUnavailable` without Ray, or unless `address` is `auto` or a
  HOST:PORT that accepts a connection (Ray's own connect retries for minutes
  before it gives up)."""
  _ray()
  if address == 'auto':
    return
  host, _, port = address.rpartition(':')
  if not host or not port.isdigit():
    raise RayUnavailable(
        f'--ray_address={address}: not auto nor HOST:PORT of a Ray head'
    )
  try:
    socket.create_connection((host, int(port)), timeout=timeout).close()
  except OSError as e:
    raise RayUnavailable(
        f'--ray_address={address}: no Ray cluster there (cannot connect: '
        f'{e.strerror or type(e).__name__})'
    ) from None


def worker_type(address: Optional[str]) -> type:
  """The class of a driver's run workers (`pool.Workers`): local processes
  (`pool.RunWorker`) without `address`, else `RayRunWorker`, once this
  driver is connected to the cluster there (`connect`; `disconnect` after).

  Raises:
    RayUnavailable: No Ray, or no cluster there (one line).
  """
  if not address:
    return pool.RunWorker
  connect(address)
  return RayRunWorker


def describe(address: str, jobs: int) -> str:
  """One line on the cluster this driver is connected to (`connect`): its
  CPUs now and the actors `jobs` asks for (each one CPU; they wait for CPUs
  that are not there yet, as nodes join)."""
  cpus = _ray().cluster_resources().get('CPU', 0)
  line = (
      f'runs go to the Ray cluster at {address}: {cpus:g} CPUs now, '
      f'{jobs} actor{"s" if jobs != 1 else ""} of 1 CPU'
  )
  if cpus < jobs:
    line += ' (the rest wait for nodes to join)'
  return line


def disconnect() -> None:
  """Ends this driver's Ray connection, if it has one (its actors end with
  it); without one (or without Ray), nothing."""
  ray = sys.modules.get('ray')
  if ray is not None and ray.is_initialized():
    ray.shutdown()


class Relay:
  """The actor: a `pool.RunWorker` child on this node, relaying requests.

  Made a Ray actor by `_relay_actor`; a `pool.RunFailed` comes back as a
  reply (`relay_failed`), so the driver raises it with its exit code.
  """

  def __init__(self, log_path: str):
    folder = os.path.dirname(log_path)
    try:
      os.makedirs(folder, exist_ok=True)
    except OSError:  # The driver's folder is not writable on this node.
      log_path = os.path.join(tempfile.gettempdir(), os.path.basename(log_path))
    self._worker = pool.RunWorker(log_path)

  def request(self, request: dict) -> dict:
    try:
      return self._worker.request(request)
    except pool.RunFailed as e:
      return {'relay_failed': str(e), 'code': e.code}


_ACTOR: Any = None


def _relay_actor():
  """`Relay` as a Ray actor class (made once, after Ray is imported)."""
  global _ACTOR
  if _ACTOR is None:
    _ACTOR = _ray().remote(num_cpus=1, max_restarts=-1, max_task_retries=-1)(
        Relay
    )
  return _ACTOR


class RayRunWorker(pool.RunWorker):
  """`pool.RunWorker`'s requests, served by a `Relay` actor in the cluster."""

  def __init__(self, log_path: Optional[str] = None):
    super().__init__(log_path)
    self._actor = None
    # Guards `_actor`: `interrupt` (another thread) ends it, and no request
    # starts a new one once the driver is ending.
    self._actor_lock = threading.Lock()

  def request(self, request: dict) -> dict:
    ray = _ray()
    with self._actor_lock:
      if processes.stopping():
        raise processes.NotStarted()
      if self._actor is None:
        self._actor = _relay_actor().remote(self._log_path or os.devnull)
      actor = self._actor
    try:
      reply = ray.get(actor.request.remote(request))
    except ray.exceptions.RayError as e:
      if processes.stopping():  # Its actor was ended with the driver.
        raise processes.NotStarted() from None
      line = str(e).strip().splitlines()
      raise pool.RunFailed(
          f'the Ray worker failed: {line[0] if line else type(e).__name__}',
          1,
      ) from None
    if 'relay_failed' in reply:
      raise pool.RunFailed(reply['relay_failed'], reply['code'])
    return reply

  def interrupt(self) -> int:
    """Ends the actor at once, from any thread (a request it is serving
    stops, its caller gets `processes.NotStarted` once the driver is
    ending; its worker child and that child's TFF workers end with it:
    `pool._end_with_driver`); 1 if there was one."""
    with self._actor_lock:
      actor, self._actor = self._actor, None
    if actor is None:
      return 0
    _ray().kill(actor, no_restart=True)
    return 1

  def close(self) -> None:
    """Ends the actor (`interrupt`)."""
    self.interrupt()
