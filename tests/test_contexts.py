"""Remote TFF workers (two worker_binary processes on 127.0.0.1) and options."""

import os
import signal
import subprocess
import time

import numpy as np
import portpicker
import pytest
import tensorflow_federated as tff

from run import contexts
from run import simulation
from tasks import synthetic
from tff_algos import composition
from tff_algos import q_ffl


def start_workers(n):
  """`n` worker_binary processes, each in its own process group."""
  ports = [portpicker.pick_unused_port() for _ in range(n)]
  # The workers outlive this function: the caller ends them (stop_workers).
  procs = [
      subprocess.Popen(  # pylint: disable=consider-using-with
          [contexts.worker_binary_path(), f'--port={port}'],
          stdout=subprocess.DEVNULL,
          stderr=subprocess.DEVNULL,
          start_new_session=True,
      )
      for port in ports
  ]
  return ports, procs


def cpu_seconds(pid):
  """User + system CPU time of process `pid` (Linux /proc)."""
  with open(f'/proc/{pid}/stat') as f:
    fields = f.read().rsplit(')', 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def stop_workers(procs):
  for proc in procs:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGTERM)
  deadline = time.monotonic() + 10
  for proc in procs:
    try:
      proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()


def train(task, config):
  process = q_ffl.build_q_fedavg(
      task.model_fn,
      tff.learning.optimizers.build_sgdm(learning_rate=0.1),
      q=1.0,
      lipschitz_constant=10.0,
  )
  result = simulation.run_simulation(process, task, config, progress=False)
  return (
      composition.model_weights_as_numpy(process, result['state']),
      result['final_summaries'],
  )


def test_two_remote_workers_equal_local_run():
  task = synthetic.create_task(
      num_clients=12, seed=1, batch_size=5, size_law='table_4_4'
  )
  config = simulation.SimulationConfig(
      total_rounds=2,
      clients_per_round=5,
      rounds_per_eval=0,
      seed=3,
      eval_train_clients=False,
  )
  local_w, local_summary = train(task, config)
  # A third worker is started and left out of the context: it is the control,
  # the CPU time an idle worker spends over the same run.
  ports, procs = start_workers(3)
  try:
    contexts.set_context(workers=[f'127.0.0.1:{p}' for p in ports[:2]])
    # Waits until the control answers, so its start-up is not counted.
    contexts.create_remote_context([f'127.0.0.1:{ports[2]}'])
    idle = [cpu_seconds(p.pid) for p in procs]
    remote_w, remote_summary = train(task, config)
    busy = [cpu_seconds(p.pid) for p in procs]
    spent = [b - a for a, b in zip(idle, busy)]
    # Both workers really ran: each spent CPU time on the run (0.28-0.9 s
    # seen, whichever way the clients were split) far above the control's
    # (0.01-0.03 s), and is still alive.
    print('worker CPU seconds during the run (last is the control):', spent)
    floor = max(0.1, 4 * spent[2])
    assert all(s >= floor for s in spent[:2]), (spent, floor)
    assert all(p.poll() is None for p in procs)
  finally:
    tff.backends.native.set_sync_local_cpp_execution_context()
    stop_workers(procs)
  assert all(p.poll() is not None for p in procs)
  assert np.abs(local_w[0]).max() > 1e-3
  for a, b in zip(local_w, remote_w):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(
      remote_summary['test/loss']['mean'],
      local_summary['test/loss']['mean'],
      rtol=1e-5,
  )


def test_unreachable_worker_is_one_clear_error():
  port = portpicker.pick_unused_port()
  with pytest.raises(ConnectionError, match=f'127.0.0.1:{port}'):
    contexts.create_remote_context([f'127.0.0.1:{port}'], timeout=0.5)


@pytest.mark.parametrize(
    'workers,message',
    [
        (['localhost'], 'not host:port'),
        (['a:1', 'a:1'], 'twice'),
        (['h:70000'], 'not host:port'),
    ],
)
def test_bad_worker_addresses(workers, message):
  with pytest.raises(ValueError, match=message):
    contexts.check(workers=workers, max_concurrent_computation_calls=-1)


def test_option_checks():
  assert contexts.check(workers=[], max_concurrent_computation_calls=-1) == (
      'default'
  )
  assert contexts.check(workers=[], max_concurrent_computation_calls=2) == (
      'local'
  )
  assert (
      contexts.check(
          workers=['10.0.0.5:8000', '[::1]:9000'],
          max_concurrent_computation_calls=-1,
      )
      == 'remote'
  )
  with pytest.raises(ValueError, match='-1'):
    contexts.check(workers=[], max_concurrent_computation_calls=0)
  with pytest.raises(ValueError, match='secure'):
    contexts.check(
        workers=['h:1'], max_concurrent_computation_calls=-1, secure=True
    )
  assert os.access(contexts.worker_binary_path(), os.X_OK)


def test_local_context_with_call_limit_and_iterator_loop():
  """The GPU options run (and give the same result) on CPU."""
  task = synthetic.create_task(
      num_clients=6, seed=2, batch_size=5, size_law='constant', constant_size=12
  )
  config = simulation.SimulationConfig(
      total_rounds=1,
      clients_per_round=3,
      rounds_per_eval=0,
      seed=1,
      eval_train_clients=False,
  )
  base_w, _ = train(task, config)
  try:
    contexts.set_context(max_concurrent_computation_calls=1)
    limited_w, _ = train(task, config)
  finally:
    tff.backends.native.set_sync_local_cpp_execution_context()
  for a, b in zip(base_w, limited_w):
    np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-8)
