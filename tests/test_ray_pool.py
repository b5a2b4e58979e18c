# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The benchmark on a real Ray cluster: a head and two worker nodes, each a
Ray node of its own on this machine (`ray.cluster_utils.Cluster`).

A small Synthetic benchmark sent to the cluster (`--ray_address`) writes
the records the local pool writes (every value but the wall times and the
origin's code, which the driver stamps from this checkout), also
when a worker node is killed while runs are in flight; after the driver
ends, no actor of its job, no run worker and no TFF worker is left on the
cluster's nodes. (A bad or unreachable `--ray_address` is one error line:
tests/test_benchmark.py's and tests/test_reproduce.py's bad-input tables.)

A tiny reproduction (`run.experiments.reproduce --ray_address`), which runs
through the same pool, writes the records the local pool writes (summaries
to every digit) and the same table, and skips its histogram with one line
(the run folders are on the nodes); a signal to its driver ends its actors,
their runs and TFF workers at once, not when the runs end.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
from ray import cluster_utils

from tests import binary

# bazel-tags: manual

_MIB = 1024 * 1024
# Wall times differ from run to run; everything else of a record must not.
_TIMING = ('wall_s', 'seconds', 'timed_wall_s')

_BENCHMARK = [
    '--setting=custom',
    '--algorithms=fedprox',
    '--grid=proximal_strength:0.01,0.1',
    '--grid=learning_rate:0.05',
    '--max_extensions=0',
    '--rounds=3',
    '--clients_per_round=3',
    '--batch_size=10',
    '--learning_rate=0.05',
    '--seeds=0',
    '--selection_seeds=100',
    '--jobs=2',
]
_TASK = ['--', '--task=synthetic', '--num_clients=16']


def _args(out, extra=()):
  return _BENCHMARK + list(extra) + [f'--output_dir={out}'] + _TASK


def _records(out):
  """Each record of a benchmark folder without its wall times and its
  origin's code (the sources hash and commit of a checkout that others may
  edit or commit to between two sittings; the driver makes the origin, a
  worker nothing of it), its output folder as `<out>` (a run's arguments
  name it)."""
  folder = out / 'records'
  records = {}
  for name in sorted(os.listdir(folder)):
    if name.endswith('.json'):
      with open(folder / name) as f:
        record = json.loads(f.read().replace(str(out), '<out>'))
      assert record['origin'].pop('code')['sources'], name
      records[name] = {k: v for k, v in record.items() if k not in _TIMING}
  return records


def _job_processes(cluster):
  """The cluster's processes that belong to a driver's job: its actors
  (`ray::Relay`), their run workers and those workers' TFF workers."""
  raylets = [
      p
      for p in psutil.process_iter(['cmdline'])
      if p.info['cmdline']
      and 'raylet' in os.path.basename(p.info['cmdline'][0])
      and cluster.gcs_address.split(':')[-1] in ' '.join(p.info['cmdline'])
  ]
  found = []
  for raylet in raylets:
    try:
      children = raylet.children(recursive=True)
    except psutil.NoSuchProcess:
      continue
    for child in children:
      try:
        text = ' '.join(child.cmdline()) + ' ' + child.name()
      except psutil.NoSuchProcess:
        continue
      if any(
          mark in text
          for mark in ('ray::Relay', 'pool.worker_main', 'worker_binary')
      ):
        found.append(text[:120])
  return found


def _assert_the_jobs_processes_end(cluster):
  """The driver's actors end with it (within 30 s), and their workers with
  them."""
  deadline = time.time() + 30
  while _job_processes(cluster) and time.time() < deadline:
    time.sleep(1)
  assert not _job_processes(cluster)


@pytest.fixture(scope='module')
def local_records(tmp_path_factory):
  out = tmp_path_factory.mktemp('local')
  code, _, stderr = binary.run_module(
      'run.tail_benchmark.benchmark', _args(out), timeout=900
  )
  assert code == 0, stderr[-3000:]
  return _records(out)


def _add_worker_node(cluster):
  cluster.add_node(num_cpus=1, object_store_memory=100 * _MIB)


@pytest.fixture
def head():
  """A head alone (no CPU: the driver's); a test adds its worker nodes."""
  nodes = cluster_utils.Cluster(
      initialize_head=True,
      head_node_args={'num_cpus': 0, 'object_store_memory': 100 * _MIB},
  )
  yield nodes
  nodes.shutdown()


@pytest.fixture
def cluster(head):
  """The head and two worker nodes of one CPU each."""
  for _ in range(2):
    _add_worker_node(head)
  return head


def test_records_on_the_cluster_equal_the_local_pools(
    cluster, local_records, tmp_path
):
  out = tmp_path / 'ray'
  code, _, stderr = binary.run_module(
      'run.tail_benchmark.benchmark',
      _args(out, [f'--ray_address={cluster.address}']),
      timeout=900,
  )
  assert code == 0, stderr[-3000:]
  assert (
      f'benchmark: runs go to the Ray cluster at {cluster.address}: 2 CPUs '
      'now, 2 actors of 1 CPU'
  ) in stderr.splitlines()
  assert len(local_records) >= 5
  assert _records(out) == local_records
  _assert_the_jobs_processes_end(cluster)


def test_a_node_lost_mid_benchmark_changes_no_record(
    head, local_records, tmp_path
):
  """A worker node killed while runs are in flight on it: its actor restarts
  on a node that joins, its run runs again there, and every record equals
  the local pool's.

  The driver connects while the head is the cluster's only node, so it is
  attached to the head's raylet, as a driver on a real cluster's head is
  (here every node has this machine's address, and a driver that connects
  later is attached to any one of them: losing that node would be losing
  the driver's own); the worker nodes join after.
  """
  out = tmp_path / 'ray_lost'
  stderr_lines = []
  with subprocess.Popen(
      [sys.executable, '-m', 'run.tail_benchmark.benchmark']
      + _args(out, [f'--ray_address={head.address}']),
      cwd=binary.ROOT,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,
  ) as proc:
    reader = threading.Thread(
        target=lambda: stderr_lines.extend(proc.stderr), daemon=True
    )
    reader.start()
    try:
      deadline = time.time() + 600
      while time.time() < deadline and proc.poll() is None:
        if any('runs go to the Ray cluster' in l for l in stderr_lines):
          break
        time.sleep(0.2)
      assert proc.poll() is None, 'the benchmark ended before it connected'
      assert (
          f'benchmark: runs go to the Ray cluster at {head.address}: 0 CPUs '
          'now, 2 actors of 1 CPU (the rest wait for nodes to join)\n'
      ) in stderr_lines
      for _ in range(2):
        _add_worker_node(head)
      # Kill a worker node once a first record is written: runs are in
      # flight on both nodes (two jobs, one CPU each).
      records = out / 'records'
      while time.time() < deadline and proc.poll() is None:
        if records.is_dir() and any(
            n.endswith('.json') for n in os.listdir(records)
        ):
          break
        time.sleep(0.5)
      assert proc.poll() is None, 'the benchmark ended before the kill'
      head.remove_node(next(iter(head.worker_nodes)), allow_graceful=False)
      _add_worker_node(head)
      proc.wait(timeout=900)
      reader.join(timeout=60)
    finally:
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
  stderr = ''.join(stderr_lines)
  assert proc.returncode == 0, stderr[-3000:]
  assert _records(out) == local_records
  _assert_the_jobs_processes_end(head)


_TINY = (
    '--extra_flags=--num_clients=12,--synthetic_size_law=constant,'
    '--clients_per_round=4,--client_batch_size=5'
)
# A family of four Delta-FL models per seed: the experiment with a histogram.
_REPRODUCE = [
    '--experiment=deltafl_family_synthetic',
    '--seeds=0,1',
    '--rounds=2',
    '--jobs=2',
    _TINY,
]


def _reproduce_args(out, extra=()):
  return (
      _REPRODUCE
      + list(extra)
      + [
          f'--root_output_dir={out}/runs',
          f'--records_dir={out}/records',
          f'--output_md={out}/table.md',
      ]
  )


def _reproduce_records(out):
  """Each record of a reproduction without its wall seconds and its origin's
  code (as `_records`; its data and versions stay)."""
  records = {}
  for path in sorted((out / 'records').iterdir()):
    record = json.loads(path.read_text())
    assert record.pop('seconds') > 0
    assert record['origin'].pop('code')['sources']
    records[path.name] = record
  return records


def _table(out):
  """The reproduction's table and paired differences (its page up to the
  origins, whose commit may move, and the minutes of wall time)."""
  return (out / 'table.md').read_text().split('\nMade by ')[0]


@pytest.fixture(scope='module')
def local_reproduction(tmp_path_factory):
  out = tmp_path_factory.mktemp('reproduce_local')
  code, stdout, stderr = binary.run_module(
      'run.experiments.reproduce', _reproduce_args(out), timeout=900
  )
  assert code == 0, stderr[-3000:]
  assert f'histogram: {out}/table_histogram.png' in stdout.splitlines()
  return out


def test_a_reproduction_on_the_cluster_equals_the_local_pools(
    cluster, local_reproduction, tmp_path
):
  code, stdout, stderr = binary.run_module(
      'run.experiments.reproduce',
      _reproduce_args(tmp_path, [f'--ray_address={cluster.address}']),
      timeout=900,
  )
  assert code == 0, stderr[-3000:]
  records = _reproduce_records(tmp_path)
  assert list(records) == ['family_seed0.json', 'family_seed1.json']
  assert records == _reproduce_records(local_reproduction)
  assert _table(tmp_path) == _table(local_reproduction)
  assert (
      'histogram: skipped (runs on a Ray cluster; it reads run folders)'
      in stdout.splitlines()
  )
  assert not (tmp_path / 'table_histogram.png').exists()
  _assert_the_jobs_processes_end(cluster)


def test_a_signal_ends_a_reproductions_runs_on_the_cluster(cluster, tmp_path):
  """SIGTERM to the driver ends its two actors mid-run (a local worker gets
  the signal; an actor is ended by the driver), with their run workers and
  TFF workers, and the driver dies of it within seconds."""
  runs = tmp_path / 'runs' / 'qffl_synthetic'
  metrics = [
      runs / n / 'metrics.csv' for n in ('q_0__FedAvg__seed0', 'q_1_seed0')
  ]
  with subprocess.Popen(
      [
          sys.executable,
          '-m',
          'run.experiments.reproduce',
          '--experiment=qffl_synthetic',
          '--seeds=0',
          '--jobs=2',
          '--rounds=100000',  # Far from its end when the signal comes.
          _TINY,
          f'--root_output_dir={tmp_path}/runs',
          f'--records_dir={tmp_path}/records',
          f'--ray_address={cluster.address}',
      ],
      cwd=binary.ROOT,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,
  ) as proc:
    try:
      deadline = time.time() + 600
      while time.time() < deadline and proc.poll() is None:
        if all(
            p.exists() and len(p.read_text().splitlines()) > 3 for p in metrics
        ):
          break  # Both runs in their rounds, one on each node.
        time.sleep(0.2)
      assert proc.poll() is None, 'the reproduction ended before the signal'
      proc.send_signal(signal.SIGTERM)
      start = time.monotonic()
      _, stderr = proc.communicate(timeout=120)
      took = time.monotonic() - start
      assert took < 15, (took, stderr[-3000:])  # Not once the runs end.
    finally:
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
  assert proc.returncode == -signal.SIGTERM, stderr[-3000:]
  assert 'Traceback' not in stderr, stderr[-3000:]
  assert binary.error_lines(stderr)[-1] == (
      'reproduce: interrupted (SIGTERM): ended 2 running training runs and '
      'their TFF workers; rerun the same command to resume from the last '
      'checkpoints'
  ), stderr[-3000:]
  assert not any((p.parent / 'summary.json').exists() for p in metrics)
  assert not list((tmp_path / 'records').glob('*.json'))
  _assert_the_jobs_processes_end(cluster)
