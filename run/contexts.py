# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""TFF execution contexts: local runtime options and remote workers.

* Local (default): TFF's C++ runtime in a `worker_binary` child process.
  `max_concurrent_computation_calls` bounds how many client computations run
  at once (TFF's advice to bound GPU memory; on a machine with GPUs the
  runtime places sessions round-robin over them by itself).
* Remote workers: `worker_binary --port=N` processes already running, on this
  or other machines. Each round's clients are split across them by TFF's
  mergeable-comp execution context: the round compiles to a "mergeable" form
  (a server-side `before_merge` part, the client work with an aggregation
  that every worker runs on its share of clients, and a `merge` + `after_merge`
  part at the driver). TFF 0.87 ships no ready-made remote context (the
  `set_remote_*` helpers went with the Python runtime), so it is assembled
  here from the same pieces as TFF's own local context
  (`create_async_local_cpp_execution_context`): a `RemoteExecutor` on a gRPC
  stub per worker, in an `AsyncExecutionContext`.

A worker is the binary of the installed TFF package (`worker_binary_path()`);
see docs/deployment.md for several machines and Kubernetes.
"""

from collections.abc import Sequence
import os
import re
import time

import grpc
import tensorflow_federated as tff

# pylint: disable=g-direct-tensorflow-import
from tensorflow_federated.python.core.backends.native import compiler
from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation
from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context
from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks
from tensorflow_federated.python.core.impl.executors import remote_executor
from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub

# pylint: enable=g-direct-tensorflow-import

from tff_algos import runtime

runtime.end_workers_at_exit()  # Quiet at exit: TFF's service manager.

_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
_CHANNEL_OPTIONS = [
    ('grpc.max_message_length', _MAX_MESSAGE_BYTES),
    ('grpc.max_receive_message_length', _MAX_MESSAGE_BYTES),
    ('grpc.max_send_message_length', _MAX_MESSAGE_BYTES),
]
_ADDRESS = re.compile(r'^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$')


def worker_binary_path() -> str:
  """The `worker_binary` shipped in the installed TFF package."""
  return os.path.join(os.path.dirname(tff.__file__), 'data', 'worker_binary')


def parse_workers(workers: Sequence[str]) -> list[str]:
  """Validated `host:port` addresses (raises `ValueError`)."""
  out = []
  for address in workers:
    address = address.strip()
    match = _ADDRESS.match(address)
    if not match or not 0 < int(match.group(2)) < 65536:
      raise ValueError(
          f'--workers: {address!r} is not host:port (e.g. 10.0.0.5:8000)'
      )
    out.append(address)
  if len(set(out)) != len(out):
    raise ValueError(f'--workers lists an address twice: {",".join(out)}')
  return out


def check(
    *,
    workers: Sequence[str],
    max_concurrent_computation_calls: int,
    secure: bool = False,
) -> str:
  """Validates the execution options; returns `default`, `local`, `remote`."""
  if (
      isinstance(max_concurrent_computation_calls, bool)
      or not isinstance(max_concurrent_computation_calls, int)
      or (
          max_concurrent_computation_calls < 1
          and max_concurrent_computation_calls != -1
      )
  ):
    raise ValueError(
        '--max_concurrent_computation_calls must be -1 (no limit) or >= 1, '
        f'got {max_concurrent_computation_calls!r}'
    )
  workers = parse_workers(workers)
  if workers and secure:
    raise ValueError(
        '--workers cannot run secure-sum modes: TFF 0.87 executes them only '
        'in its local test context (use --secure_quantile=none)'
    )
  if workers and max_concurrent_computation_calls != -1:
    raise ValueError(
        '--max_concurrent_computation_calls is a worker option with '
        '--workers: pass it to each worker_binary instead'
    )
  if workers:
    return 'remote'
  if max_concurrent_computation_calls != -1:
    return 'local'
  return 'default'


def _remote_context(address: str, timeout: float):
  channel = grpc.insecure_channel(address, _CHANNEL_OPTIONS)
  stub = remote_executor_grpc_stub.RemoteExecutorGrpcStub(channel)
  deadline = time.monotonic() + timeout
  while not stub.is_ready:
    if time.monotonic() > deadline:
      raise ConnectionError(
          f'no TFF worker answers at {address} (start one with '
          f'{worker_binary_path()} --port=PORT)'
      )
    time.sleep(0.2)

  def stack_fn(cardinalities):
    if cardinalities.get(tff.CLIENTS) is None:
      cardinalities[tff.CLIENTS] = 0
    executor = remote_executor.RemoteExecutor(stub)
    executor.set_cardinalities(cardinalities)
    return executor

  factory = python_executor_stacks.ResourceManagingExecutorFactory(
      executor_stack_fn=stack_fn
  )
  return async_execution_context.AsyncExecutionContext(
      executor_fn=factory,
      compiler_fn=compiler.desugar_and_transform_to_native,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result,
  )


def create_remote_context(workers: Sequence[str], *, timeout: float = 30.0):
  """A mergeable-comp context splitting each round over `workers`.

  Args:
    workers: `host:port` of running `worker_binary` processes.
    timeout: Seconds to wait for each worker to answer.

  Returns:
    A `MergeableCompExecutionContext`.

  Raises:
    ValueError: For a malformed address.
    ConnectionError: If a worker does not answer in time.
  """
  addresses = parse_workers(workers)
  if not addresses:
    raise ValueError('--workers is empty')
  contexts = [_remote_context(a, timeout) for a in addresses]
  return tff.backends.native.create_mergeable_comp_execution_context(contexts)


def set_context(
    *,
    workers: Sequence[str] = (),
    max_concurrent_computation_calls: int = -1,
    timeout: float = 30.0,
) -> None:
  """Installs the default TFF context for these options.

  With `workers`, the remote mergeable-comp context; otherwise TFF's local
  C++ context with the given concurrency limit.
  """
  kind = check(
      workers=workers,
      max_concurrent_computation_calls=max_concurrent_computation_calls,
  )
  if kind == 'remote':
    tff.framework.get_context_stack().set_default_context(
        create_remote_context(workers, timeout=timeout)
    )
  else:
    tff.backends.native.set_sync_local_cpp_execution_context(
        max_concurrent_computation_calls=max_concurrent_computation_calls
    )
