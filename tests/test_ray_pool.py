# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The benchmark on a real Ray cluster: a head and two worker nodes, each a
Ray node of its own on this machine (`ray.cluster_utils.Cluster`).

A small Synthetic benchmark sent to the cluster (`--ray_address`) writes
the records the local pool writes (every value but the wall times), also
when a worker node is killed while runs are in flight; after the driver
ends, no actor of its job, no run worker and no TFF worker is left on the
cluster's nodes. (A bad or unreachable `--ray_address` is one error line:
tests/test_benchmark.py's bad-input table.)
"""

import json
import os
import signal
import subprocess
import sys
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
  """Each record of a benchmark folder without its wall times, its output
  folder as `<out>` (a run's arguments name it)."""
  folder = out / 'records'
  records = {}
  for name in sorted(os.listdir(folder)):
    if name.endswith('.json'):
      with open(folder / name) as f:
        record = json.loads(f.read().replace(str(out), '<out>'))
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


@pytest.fixture(scope='module')
def local_records(tmp_path_factory):
  out = tmp_path_factory.mktemp('local')
  code, _, stderr = binary.run_module(
      'run.tail_benchmark.benchmark', _args(out), timeout=900
  )
  assert code == 0, stderr[-3000:]
  return _records(out)


@pytest.fixture
def cluster():
  """A head (no CPU: the driver's) and two worker nodes of one CPU each."""
  nodes = cluster_utils.Cluster(
      initialize_head=True,
      head_node_args={'num_cpus': 0, 'object_store_memory': 100 * _MIB},
  )
  for _ in range(2):
    nodes.add_node(num_cpus=1, object_store_memory=100 * _MIB)
  yield nodes
  nodes.shutdown()


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
  assert len(local_records) >= 5
  assert _records(out) == local_records
  # The driver's actors ended with it, and their workers with them.
  deadline = time.time() + 30
  while _job_processes(cluster) and time.time() < deadline:
    time.sleep(1)
  assert not _job_processes(cluster)


def test_a_node_lost_mid_benchmark_changes_no_record(
    cluster, local_records, tmp_path
):
  out = tmp_path / 'ray_lost'
  with subprocess.Popen(
      [sys.executable, '-m', 'run.tail_benchmark.benchmark']
      + _args(out, [f'--ray_address={cluster.address}']),
      cwd=binary.ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,
  ) as proc:
    try:
      # Kill a worker node once a first record is written: runs are in
      # flight on both nodes (two jobs, one CPU each).
      records = out / 'records'
      deadline = time.time() + 600
      while time.time() < deadline and proc.poll() is None:
        if records.is_dir() and any(
            n.endswith('.json') for n in os.listdir(records)
        ):
          break
        time.sleep(0.5)
      assert proc.poll() is None, 'the benchmark ended before the kill'
      cluster.remove_node(
          next(iter(cluster.worker_nodes)), allow_graceful=False
      )
      cluster.add_node(num_cpus=1, object_store_memory=100 * _MIB)
      _, stderr = proc.communicate(timeout=900)
    finally:
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
  assert proc.returncode == 0, stderr[-3000:]
  assert _records(out) == local_records
