"""run.benchmarks.bench_suite: one run times every system; the engines match
TFF."""

import json
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from run.benchmarks import bench_suite
from run import simulation
from tff_algos import optimizers
from tff_algos import stragglers
from tests import binary


def _round_datasets(task, clients):
  config = simulation.SimulationConfig(
      total_rounds=1, clients_per_round=clients, seed=0
  )
  selected = simulation.sample_clients(
      list(task.train_data.client_ids), 1, clients_per_round=clients, seed=0
  )
  plans = [stragglers.ClientPlan(c, False, 1) for c in selected]
  return simulation.client_datasets(task, plans, 1, config)


def test_plain_loop_is_a_fedavg_round():
  # The reference the ratios divide by does the same arithmetic as stock
  # FedAvg with SGD: same batches, same example-weighted mean of the deltas.
  task = bench_suite.build_task('softmax', 6)
  datasets = _round_datasets(task, 4)
  stock = tff.learning.algorithms.build_weighted_fed_avg(
      task.model_fn, optimizers.build_optimizer('sgd', 0.01)
  )
  out = stock.next(stock.initialize(), datasets)
  expected = stock.get_model_weights(out.state).trainable
  plain = bench_suite.PlainLoop('softmax', 0.01)
  batches = bench_suite.PlainLoop.preload(datasets)
  assert plain.next(batches) == 4 * 150
  for got, want in zip(plain.weights(), expected):
    np.testing.assert_allclose(got, want, atol=1e-6)
  assert max(np.abs(w).max() for w in expected) > 1e-3


def test_bound_loop_steps_on_the_clients_batches_concatenated():
  # NumPy oracle: softmax regression from zero weights, one mean-loss SGD
  # step per batch index j on every client's j-th batch concatenated.
  task = bench_suite.build_task('softmax', 6)
  datasets = _round_datasets(task, 3)
  # Read once: the datasets reshuffle on every pass.
  per_client = [[(x.numpy(), y.numpy()) for x, y in ds] for ds in datasets]
  bound = bench_suite.BoundLoop('softmax', 0.01)
  as_tensors = [
      [(tf.constant(x), tf.constant(y)) for x, y in c] for c in per_client
  ]
  assert bound.next(bench_suite.BoundLoop.preload(as_tensors)) == 3 * 150
  w = np.zeros((60, 10))
  b = np.zeros(10)
  steps = max(len(c) for c in per_client)
  assert steps == 15
  for j in range(steps):
    x = np.concatenate([c[j][0] for c in per_client if j < len(c)])
    y = np.concatenate([c[j][1] for c in per_client if j < len(c)])
    logits = x @ w + b
    p = np.exp(logits - np.max(logits, axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    w -= 0.01 * x.T @ p / len(y)
    b -= 0.01 * p.mean(axis=0)
  got_w, got_b = bound.weights()
  np.testing.assert_allclose(got_w, w, atol=1e-5)
  np.testing.assert_allclose(got_b, b, atol=1e-5)
  assert np.abs(w).max() > 1e-3


def test_plain_loop_trains_the_character_lstm():
  # Its embedding's gradient is IndexedSlices (the first full run crashed).
  task = bench_suite.build_task('shakespeare', 2)
  datasets = _round_datasets(task, 2)
  plain = bench_suite.PlainLoop('shakespeare', 0.5)
  before = plain.weights()
  assert plain.next(bench_suite.PlainLoop.preload(datasets)) == 2 * 40
  after = plain.weights()
  assert all(np.isfinite(w).all() for w in after)
  assert np.abs(after[0] - before[0]).max() > 0  # The embedding moved.


def test_peak_rss_sees_memory_held_while_entered():
  with bench_suite.PeakRss(interval=0.005) as idle:
    pass
  with bench_suite.PeakRss(interval=0.005) as busy:
    block = np.ones(64 * 2**20 // 8)  # 64 MB, touched.
    block += 1.0
    # Held until the sampler has run (on a loaded machine its thread may wait
    # longer than the allocation takes); a sampler that never sees it still
    # fails below, after the deadline.
    deadline = time.monotonic() + 10
    while busy.peak_mb - idle.peak_mb <= 50 and time.monotonic() < deadline:
      time.sleep(0.01)
    del block
  assert idle.peak_mb > 0
  assert busy.peak_mb - idle.peak_mb > 50


def test_one_run_times_every_kind_of_algorithm_and_the_references(tmp_path):
  out = tmp_path / 'suite.json'
  code, stdout, stderr = binary.run_module(
      'run.benchmarks.bench_suite',
      [
          '--models=softmax',
          '--algorithms=fedavg,qffl,ditto,fedavg_plus,afl',
          '--rounds=1',
          '--warmup_rounds=1',
          '--clients_per_round=3',
          '--num_clients=6',
          '--stacked_modes=vectorized',
          f'--output_json={out}',
      ],
      timeout=600,
  )
  assert code == 0, stderr[-3000:]
  result = json.loads(out.read_text())['models']['softmax']
  systems = result['systems']
  assert set(systems) == {
      'fedavg/tff',
      'fedavg/batched',
      'fedavg/stacked',
      'fedavg/stock',
      'fedavg/plain',
      'fedavg/bound',
      'fedavg/evaluate',
      'qffl/tff',
      'qffl/batched',
      'qffl/stacked',
      'ditto/tff',
      'ditto/batched',
      'ditto/stacked',
      'fedavg_plus/tff',
      'fedavg_plus/batched',
      'fedavg_plus/stacked',
      'afl/tff',
      'afl/batched',
      'afl/stacked',
  }
  # Every algorithm runs on the stacked engine (none left out with a note).
  assert 'softmax: no ' not in stderr
  for key, s in systems.items():
    assert s['examples_per_s'] > 0 and s['seconds_per_round'] > 0, key
    assert s['peak_rss_mb'] > 100, key  # TF alone holds more.
    assert s['ratio_to_stock'] > 0 and s['ratio_to_plain'] > 0, key
    assert s['ratio_to_bound'] > 0, key
  assert systems['fedavg/bound']['ratio_to_bound'] == 1.0
  assert systems['fedavg/stock']['ratio_to_stock'] == 1.0
  # The evaluation row: every client's data a round (6 x 150 examples), its
  # rate over the stacked engine's training rate.
  evaluate = systems['fedavg/evaluate']
  assert evaluate['examples_per_s'] == pytest.approx(
      6 * 150 / evaluate['seconds_per_round']
  )
  assert result['evaluation_to_training'] == pytest.approx(
      evaluate['examples_per_s'] / systems['fedavg/stacked']['examples_per_s']
  )
  assert 'softmax: evaluation (fedavg/evaluate) at ' in stdout
  # The engines end where our TFF path ends (same clients and batches).
  assert set(result['tff_vs_engines_linf']) == {
      'fedavg/batched',
      'fedavg/stacked',
      'qffl/batched',
      'qffl/stacked',
      'ditto/batched',
      'ditto/stacked',
      'fedavg_plus/batched',
      'fedavg_plus/stacked',
      'afl/batched',
      'afl/stacked',
  }
  assert max(result['tff_vs_engines_linf'].values()) < 1e-5
  by_round = result['tff_vs_engines_linf_by_round']
  assert len(by_round) == 2  # Warm-up round included.
  assert by_round[-1] == result['tff_vs_engines_linf']
  assert '| softmax | ditto/batched |' in stdout


def test_bad_flags_exit_2_with_one_line():
  results = binary.call_main_in_subprocess(
      'run.benchmarks.bench_suite',
      'bench_suite',
      [
          ['--ditto_lambda=-1'],
          ['--examples_per_client=0'],
          ['--rnn_units=0'],
          ['--stacked_modes=fast'],
          ['--models=nope'],
      ],
  )
  for code, stderr in results:
    assert code == 2, stderr
    lines = binary.error_lines(stderr)
    assert len(lines) == 1 and lines[0].startswith('bench_suite: error:')


def test_the_recurrent_width_is_the_one_asked(tmp_path, monkeypatch):
  out = tmp_path / 'suite.json'
  code, _, stderr = binary.run_module(
      'run.benchmarks.bench_suite',
      [
          '--models=shakespeare_gru',
          '--algorithms=fedavg',
          '--rnn_units=3',
          '--examples_per_client=20',
          '--rounds=1',
          '--warmup_rounds=0',
          '--clients_per_round=2',
          '--num_clients=3',
          '--stacked_modes=vectorized',
          '--stacked_only',
          f'--output_json={out}',
      ],
      timeout=600,
  )
  assert code == 0, stderr[-3000:]
  result = json.loads(out.read_text())['models']['shakespeare_gru']
  assert (
      result['task'] == 'shakespeare_gru on generated data, 3 recurrent units'
  )
  assert {'fedavg/stacked', 'fedavg/bound'} <= set(result['systems'])
  # The bound's and the engines' models alike.
  units = bench_suite._UNITS  # pylint: disable=protected-access
  monkeypatch.setitem(units, 'shakespeare_gru', 3)
  net, _ = bench_suite.keras_model('shakespeare_gru')
  task = bench_suite.build_task('shakespeare_gru', 3)
  for weights in (
      net.trainable_weights,
      task.model_fn().trainable_variables,
  ):
    assert [w.shape[-1] for w in weights][:2] == [9, 9]
