"""run.bench_suite: one run times every system; the engines match TFF."""

import json

import numpy as np

from run import bench_suite
from tests import binary


def test_peak_rss_sees_memory_held_while_entered():
  with bench_suite.PeakRss(interval=0.005) as idle:
    pass
  with bench_suite.PeakRss(interval=0.005) as busy:
    block = np.ones(64 * 2**20 // 8)  # 64 MB, touched.
    block += 1.0
    del block
  assert idle.peak_mb > 0
  assert busy.peak_mb - idle.peak_mb > 50


def test_one_run_times_fedavg_qffl_ditto_and_the_references(tmp_path):
  out = tmp_path / 'suite.json'
  code, stdout, stderr = binary.run_module('run.bench_suite', [
      '--models=softmax', '--algorithms=fedavg,qffl,ditto', '--rounds=1',
      '--warmup_rounds=1', '--clients_per_round=3', '--num_clients=6',
      '--stacked_modes=vectorized', f'--output_json={out}'], timeout=600)
  assert code == 0, stderr[-3000:]
  result = json.loads(out.read_text())['models']['softmax']
  systems = result['systems']
  assert set(systems) == {
      'fedavg/tff', 'fedavg/batched', 'fedavg/stacked', 'fedavg/stock',
      'fedavg/plain', 'qffl/tff', 'qffl/batched', 'qffl/stacked', 'ditto/tff'}
  for key, s in systems.items():
    assert s['examples_per_s'] > 0 and s['seconds_per_round'] > 0, key
    assert s['peak_rss_mb'] > 100, key  # TF alone holds more.
    assert s['ratio_to_stock'] > 0 and s['ratio_to_plain'] > 0, key
  assert systems['fedavg/stock']['ratio_to_stock'] == 1.0
  # The engines end where our TFF path ends (same clients and batches).
  assert set(result['tff_vs_engines_linf']) == {
      'fedavg/batched', 'fedavg/stacked', 'qffl/batched', 'qffl/stacked'}
  assert max(result['tff_vs_engines_linf'].values()) < 1e-5
  assert '| softmax | ditto/tff |' in stdout


def test_bad_flags_exit_2_with_one_line():
  code, _, stderr = binary.run_module(
      'run.bench_suite', ['--ditto_lambda=-1'], timeout=300)
  assert code == 2
  lines = binary.error_lines(stderr)
  assert len(lines) == 1 and lines[0].startswith('bench_suite: error:')
