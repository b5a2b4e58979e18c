"""The stacked engine equals the federated path (same seeds and batches)."""

import collections
import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from run import algorithms
from run import engines
from run import simulation
from tasks import synthetic
from tff_algos import afl
from tff_algos import batched
from tff_algos import composition
from tff_algos import definition
from tff_algos import delta_fl
from tff_algos import fed_prox
from tff_algos import q_ffl
from tff_algos import stacked
from tff_algos import term
from tests import engine_runs

LR = 0.1
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def task():
  # Unequal client sizes (a partial last batch, clients padded to the
  # longest one's step count) and batch 5.
  return synthetic.create_task(
      num_clients=12, seed=1, batch_size=5, size_law='table_4_4'
  )


def stacked_engine(task, algorithm, *, vectorize=True):
  return stacked.StackedEngine(
      task.model_fn,
      task.preprocess_train,
      task.train_data,
      algorithm,
      vectorize=vectorize,
  )


def sgd(lr=LR, momentum=None):
  return tff.learning.optimizers.build_sgdm(learning_rate=lr, momentum=momentum)


def run_both(
    task,
    process,
    algorithm,
    *,
    rounds=2,
    epochs=2,
    straggler_fraction=0.0,
    vectorize=True,
):
  """Trains `rounds` rounds both ways; returns both states and metrics."""
  return engine_runs.run_both(
      task,
      process,
      stacked_engine(task, algorithm, vectorize=vectorize),
      rounds=rounds,
      epochs=epochs,
      straggler_fraction=straggler_fraction,
  )


def assert_same(process, tff_s, fast_s, tm, fm, keys, *, weights_atol=1e-6):
  """Asserts TFF's and the fast engine's states and `keys` metrics agree."""
  tff_w = composition.model_weights_as_numpy(process, tff_s)
  fast_w = composition.model_weights_as_numpy(process, fast_s)
  assert np.abs(tff_w[0]).max() > 1e-2  # The model moved.
  for a, b in zip(tff_w, fast_w):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=weights_atol)
  for a, b in zip(
      tf.nest.flatten(tff_s.finalizer), tf.nest.flatten(fast_s.finalizer)
  ):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=weights_atol)
  for t, f in zip(tm, fm):
    for key in keys:
      np.testing.assert_allclose(f[key], t[key], rtol=1e-5, err_msg=key)


TRAIN_KEYS = [
    'train/loss',
    'train/accuracy',
    'train/num_examples',
    'train/num_batches',
]


def rounding_sensitivity(task, mu, momentum):
  """How far a 3-ulp change of the client learning rate moves the weights.

  Client momentum 0.9 over two epochs (an effective step of 1.0) amplifies
  rounding: one ulp of the learning rate moves the weights by 2.9e-5 after two
  rounds (measured; with one epoch, 6e-7). The vectorized engine's batched
  matmuls reduce in another order than the TFF path's, so its distance to the
  TFF path is bounded by this sensitivity, not by a fixed 1e-6; the
  sequential engine is held to the fixed bound (it measures 0 here).
  """
  lr = np.float32(LR)
  bumped = lr
  for _ in range(3):
    bumped = np.nextafter(bumped, np.float32(1))
  weights = []
  for rate in (lr, bumped):
    client = sgd(float(rate), momentum=momentum)
    server = sgd(1.0, momentum=0.5)
    process = fed_prox.build_fed_prox(
        task.model_fn, client, server, proximal_strength=mu
    )
    algorithm = batched.BatchedAlgorithm.from_registry(
        'fedprox',
        client_optimizer=client,
        client_learning_rate=float(rate),
        server_optimizer=server,
        proximal_strength=mu,
    )
    state = engine_runs.run_engine(
        task,
        process,
        stacked_engine(task, algorithm, vectorize=False),
        straggler_fraction=0.5,
    )
    weights.append(composition.model_weights_as_numpy(process, state))
  return max(np.abs(a - b).max() for a, b in zip(*weights))


@pytest.mark.parametrize(
    'mu,momentum,vectorize',
    [
        (0.0, 0.9, True),
        (0.0, 0.9, False),
        (0.5, None, True),
        (0.5, None, False),
    ],
)
def test_fedavg_fedprox_equal_federated_path(task, mu, momentum, vectorize):
  # Server momentum (a server-optimizer state to carry), client momentum
  # (a client-optimizer state that padded steps must leave unchanged), two
  # local epochs with a reshuffle each, and stragglers with partial epochs.
  server = sgd(1.0, momentum=0.5)
  process = fed_prox.build_fed_prox(
      task.model_fn, sgd(momentum=momentum), server, proximal_strength=mu
  )
  algorithm = batched.BatchedAlgorithm.from_registry(
      'fedprox',
      client_optimizer=sgd(momentum=momentum),
      client_learning_rate=LR,
      server_optimizer=server,
      proximal_strength=mu,
  )
  out = run_both(
      task, process, algorithm, straggler_fraction=0.5, vectorize=vectorize
  )
  atol = 1e-6
  if momentum and vectorize:
    atol = max(atol, rounding_sensitivity(task, mu, momentum))
    assert atol < 1e-3  # Still far below what a wrong update moves.
  assert_same(process, *out, TRAIN_KEYS, weights_atol=atol)


@pytest.mark.parametrize('epochs', [1, 2])
def test_q_ffl_equals_federated_path(task, epochs):
  # q-FFL trains on the second pass over its dataset (the next shuffles),
  # with stragglers cutting both passes.
  process = q_ffl.build_q_fedavg(
      task.model_fn, sgd(), q=1.0, lipschitz_constant=1.0 / LR
  )
  algorithm = batched.BatchedAlgorithm.from_registry(
      'qffl', client_learning_rate=LR, q=1.0, q_lipschitz=1.0 / LR
  )
  out = run_both(
      task, process, algorithm, epochs=epochs, straggler_fraction=0.5
  )
  assert_same(
      process,
      *out,
      TRAIN_KEYS + ['client_work/loss_at_broadcast', 'finalizer/h_sum'],
  )


@pytest.mark.parametrize('vectorize', [True, False])
def test_q_fedsgd_equals_federated_path(task, vectorize):
  # The full gradient at the broadcast model, stragglers cutting the stream.
  process = q_ffl.build_q_fedsgd(task.model_fn, q=1.0, lipschitz_constant=10.0)
  algorithm = batched.BatchedAlgorithm.from_registry(
      'qfedsgd', client_learning_rate=LR, q=1.0, q_lipschitz=10.0
  )
  out = run_both(
      task,
      process,
      algorithm,
      rounds=3,
      epochs=1,
      straggler_fraction=0.5,
      vectorize=vectorize,
  )
  assert_same(
      process,
      *out,
      TRAIN_KEYS + ['client_work/loss_at_broadcast', 'finalizer/h_sum'],
  )


@pytest.mark.parametrize('vectorize', [True, False])
def test_afl_equals_federated_path(task, vectorize):
  options = dict(
      num_clients=len(task.train_data.client_ids),
      model_learning_rate=0.5,
      mixture_learning_rate=0.01,
  )
  process = afl.build_afl(task.model_fn, **options)
  algorithm = batched.BatchedAlgorithm.from_registry(
      'afl',
      client_optimizer=sgd(),
      client_learning_rate=0.5,
      num_clients=len(task.train_data.client_ids),
      afl_lambda_lr=0.01,
  )
  tff_s, fast_s, tm, fm = run_both(
      task, process, algorithm, rounds=3, epochs=1, vectorize=vectorize
  )
  assert_same(
      process,
      tff_s,
      fast_s,
      tm,
      fm,
      TRAIN_KEYS
      + ['client_work/mixture/lambda_max', 'client_work/mixture/lambda_min'],
  )
  mixture = np.asarray(fast_s.client_work)
  np.testing.assert_allclose(
      mixture, np.asarray(tff_s.client_work), rtol=1e-5, atol=1e-7
  )
  assert mixture.max() - mixture.min() > 1e-3  # The mixture moved.


def test_delta_fl_equals_federated_path(task):
  process = delta_fl.build_delta_fl(
      task.model_fn, sgd(), theta=0.5, weight_decay=0.01
  )
  algorithm = batched.BatchedAlgorithm.from_registry(
      'deltafl', client_learning_rate=LR, theta=0.5, weight_decay=0.01
  )
  out = run_both(task, process, algorithm, epochs=2)
  assert_same(
      process,
      *out,
      TRAIN_KEYS
      + [
          'client_work/eta',
          'client_work/fraction_kept',
          'client_work/loss_at_broadcast',
      ],
  )
  # The filter really filtered.
  assert any(m['client_work/fraction_kept'] < 1.0 for m in out[3][1:])


@pytest.mark.parametrize('tilt', [2.0, -1.0])
def test_term_equals_federated_path(task, tilt):
  server = sgd(1.0, momentum=0.5)
  process = term.build_term(
      task.model_fn, sgd(), server, tilt=tilt, proximal_strength=0.1
  )
  algorithm = batched.BatchedAlgorithm.from_registry(
      'term',
      client_learning_rate=LR,
      server_optimizer=server,
      tilt=tilt,
      proximal_strength=0.1,
  )
  out = run_both(task, process, algorithm, straggler_fraction=0.5)
  assert_same(
      process,
      *out,
      TRAIN_KEYS
      + [
          'client_work/loss_at_broadcast',
          'client_work/max_loss_at_broadcast',
          'finalizer/update_non_finite',
      ],
  )


def test_run_simulation_through_binary_flags_equals_tff(task):
  # The binary's path: spec -> engines.build_stacked_engine ->
  # run_simulation, against the same run through TFF.
  spec = algorithms.AlgorithmSpec(
      name='fedprox', proximal_strength=0.1, client_learning_rate=LR
  )
  config = simulation.SimulationConfig(
      total_rounds=2,
      clients_per_round=4,
      rounds_per_eval=0,
      seed=5,
      eval_train_clients=False,
      client_epochs_per_round=2,
  )
  results = []
  for engine in (None, engines.build_stacked_engine(spec, task)):
    process = algorithms.build_process(spec, task.model_fn)
    results.append(
        simulation.run_simulation(
            process, task, config, progress=False, engine=engine
        )
    )
  w0, w1 = (
      composition.model_weights_as_numpy(process, r['state']) for r in results
  )
  for a, b in zip(w0, w1):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
      results[1]['final_summaries']['test/loss']['mean'],
      results[0]['final_summaries']['test/loss']['mean'],
      rtol=1e-5,
  )


def test_stream_layout_pads_and_cuts():
  # Clients of 7 and 3 examples, batch 5, 2 epochs, the second cut to 3
  # batches: 4 and 2 steps; padding is -1.
  pos, steps = stacked.stream_layout([7, 3], [2, 2], [-1, 3], 5, shuffle=True)
  np.testing.assert_array_equal(steps, [4, 2])
  assert pos.shape == (4, 2, 5)
  np.testing.assert_array_equal(pos[:, 0, 0], [0, 5, 7, 12])
  np.testing.assert_array_equal(pos[1, 0], [5, 6, -1, -1, -1])
  np.testing.assert_array_equal(pos[:, 1, 0], [14, 17, -1, -1])
  np.testing.assert_array_equal(pos[1, 1], [17, 18, 19, -1, -1])
  local, _ = stacked.stream_layout([7], [2], [-1], 5, shuffle=False)
  np.testing.assert_array_equal(local[2, 0], [0, 1, 2, 3, 4])


def test_refuses_unsupported_configurations(task):
  with pytest.raises(ValueError, match='per-weight state'):
    stacked.StackedEngine(
        task.model_fn,
        task.preprocess_train,
        task.train_data,
        batched.BatchedAlgorithm.from_registry(
            'fedavg',
            client_optimizer=tff.learning.optimizers.build_adam(0.1),
            client_learning_rate=0.1,
        ),
    )
  with pytest.raises(
      ValueError, match='stacked.*local_steps=2 runs on --simulation_engine='
  ):
    engines.check_engine(
        'stacked',
        algorithms.AlgorithmSpec(
            name='fedavg_plus', fedplus_sigma=1.0, fedplus_local_steps=2
        ),
    )
  with pytest.raises(ValueError, match='custom has its own client work'):
    stacked.check_definition(
        definition.AlgorithmDefinition(
            name='custom',
            client_result=lambda *args: args[3:5],
            local_work=lambda *args: None,
        )
    )
  with pytest.raises(TypeError, match='ClientData'):
    stacked.StackedEngine(
        task.model_fn,
        task.preprocess_train,
        object(),
        batched.BatchedAlgorithm.from_registry(
            'fedavg', client_learning_rate=LR
        ),
    )

  def shuffled_twice(dataset, epochs, seed=None):
    # Not the layout the engine reproduces (batches of 2, then shuffled).
    ds = task.preprocess_train(dataset, epochs, seed).unbatch().batch(2)
    return ds.shuffle(100, seed=seed or 0)

  with pytest.raises(ValueError, match='preprocess_train'):
    stacked.StackedEngine(
        task.model_fn,
        shuffled_twice,
        task.train_data,
        batched.BatchedAlgorithm.from_registry(
            'fedavg', client_learning_rate=LR
        ),
    )


@pytest.mark.parametrize(
    'args',
    [
        [
            '--algorithm=fedavg_plus',
            '--fedplus_sigma=1',
            '--fedplus_local_steps=2',
        ],
        ['--algorithm=fedavg', '--client_optimizer=adam'],
    ],
)
def test_binary_refuses_unsupported_combinations(tmp_path, args):
  proc = subprocess.run(
      [
          sys.executable,
          '-m',
          'run.train',
          '--simulation_engine=stacked',
          f'--root_output_dir={tmp_path}',
          '--progress=false',
      ]
      + args,
      cwd=ROOT,
      check=False,
      capture_output=True,
      text=True,
      timeout=300,
      start_new_session=True,
  )
  assert proc.returncode == 2
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('train: error: ') and (
      'stacked' in last or 'per-weight' in last
  ), last


def test_binary_stacked_run_equals_tff_run(tmp_path):
  """`python -m run.train --simulation_engine=stacked` end to end: the
  per-client evaluation it writes equals the TFF engine's run."""
  from tests import binary  # pylint: disable=g-import-not-at-top

  args = [
      '--task=synthetic',
      '--num_clients=8',
      '--clients_per_round=4',
      '--client_batch_size=5',
      '--client_learning_rate=0.1',
      '--synthetic_size_law=table_4_4',
      '--algorithm=term',
      '--tilt=1',
      '--total_rounds=3',
      '--rounds_per_eval=3',
      '--progress=false',
      '--eval_train_clients=false',
  ]
  tables = {}
  runs = {
      'tff': ['--simulation_engine=tff'],
      'stacked': ['--simulation_engine=stacked'],
      'groups': ['--simulation_engine=stacked', '--stacked_size_groups'],
  }
  for name, flags in runs.items():
    code, _, stderr = binary.run_train(
        args + flags + [f'--experiment_name={name}'], tmp_path
    )
    assert code == 0, stderr[-2000:]
    path = tmp_path / name / 'clients' / 'round_00003.csv'
    rows = [line.split(',') for line in path.read_text().splitlines()[1:]]
    tables[name] = np.array([[float(v) for v in row[2:]] for row in rows])
  assert tables['tff'].shape == (8, 3)
  for name in ('stacked', 'groups'):
    np.testing.assert_allclose(
        tables[name], tables['tff'], rtol=1e-5, atol=1e-6, err_msg=name
    )


def _brute_force_groups_cost(steps, overhead):
  """Least `sum_g S_g (m_g + overhead)` over every contiguous cut of the
  sorted steps (all 2^(K-1) of them)."""
  s = sorted(steps)
  k = len(s)
  best = float('inf')
  for mask in range(2 ** (k - 1)):
    cuts = [0] + [i + 1 for i in range(k - 1) if mask >> i & 1] + [k]
    cost = sum(
        s[b - 1] * ((b - a) + overhead) for a, b in zip(cuts[:-1], cuts[1:])
    )
    best = min(best, cost)
  return best


def test_size_groups_minimise_the_modelled_padded_work():
  rng = np.random.default_rng(0)
  for trial in range(60):
    k = int(rng.integers(1, 8))
    steps = rng.integers(1, 200, k) if trial % 3 else rng.integers(1, 4, k)
    overhead = float(rng.choice([0.0, 2.0, 10.0]))
    order, bounds = stacked.size_groups(steps, step_overhead=overhead)
    assert sorted(order.tolist()) == list(range(k))
    assert np.all(np.diff(steps[order]) >= 0)
    assert bounds[0] == 0 and bounds[-1] == k and np.all(np.diff(bounds) > 0)
    s = steps[order]
    cost = sum(
        s[b - 1] * ((b - a) + overhead) for a, b in zip(bounds[:-1], bounds[1:])
    )
    assert cost == pytest.approx(_brute_force_groups_cost(steps, overhead))
  # Equal clients stay one group; a 100x spread is split.
  assert stacked.size_groups([7, 7, 7, 7])[1].tolist() == [0, 4]
  order, bounds = stacked.size_groups([4, 160, 4, 24])
  assert order.tolist() == [0, 2, 3, 1] and bounds.tolist() == [0, 2, 3, 4]
  assert stacked.padded_slots([4, 160, 4, 24], order, bounds, 5) == 5 * (
      2 * 4 + 24 + 160
  )
  # The engine groups only where that saves a fifth of the slots.
  assert stacked.round_groups([4, 160, 4, 24])[1].tolist() == [0, 2, 3, 4]
  assert stacked.round_groups([4, 160, 4, 24], group_by_size=False)[
      1
  ].tolist() == [0, 4]
  near = [3, 2, 2, 3, 2, 2, 3, 2, 3, 2, 3, 2]  # Cut: 29 slots, not 36.
  assert stacked.size_groups(near)[1].tolist() == [0, 7, 12]
  order, bounds = stacked.round_groups(near)  # 19% saved: one group.
  assert order.tolist() == list(range(12)) and bounds.tolist() == [0, 12]


@pytest.fixture(scope='module')
def spread_task():
  """Four clients of 4, 400, 7 and 60 examples (a 100x spread), all four
  sampled every round, batch 5."""
  base = synthetic.create_task(num_clients=4, seed=2, batch_size=5)
  rng = np.random.default_rng(5)
  data = {}
  for cid, n in zip(base.train_data.client_ids, (4, 400, 7, 60)):
    x = rng.normal(size=(n, 60)).astype(np.float32)
    y = rng.integers(0, 10, n).astype(np.int32)
    data[cid] = collections.OrderedDict(x=x, y=y)
  return dataclasses.replace(
      base, train_data=tff.simulation.datasets.TestClientData(data)
  )


@pytest.mark.parametrize('name', ['fedprox', 'qffl', 'deltafl'])
def test_size_groups_leave_every_client_result_unchanged(spread_task, name):
  client, server = sgd(), sgd(1.0)
  if name == 'fedprox':
    process = fed_prox.build_fed_prox(
        spread_task.model_fn, client, server, proximal_strength=0.1
    )
    algorithm = batched.BatchedAlgorithm.from_registry(
        'fedprox',
        client_optimizer=client,
        client_learning_rate=LR,
        server_optimizer=server,
        proximal_strength=0.1,
    )
  elif name == 'qffl':
    process = q_ffl.build_q_fedavg(
        spread_task.model_fn, client, q=1.0, lipschitz_constant=1.0 / LR
    )
    algorithm = batched.BatchedAlgorithm.from_registry(
        'qffl',
        client_optimizer=client,
        client_learning_rate=LR,
        q=1.0,
        q_lipschitz=1.0 / LR,
    )
  else:  # Filtered-out clients: whole groups may do no step.
    process = delta_fl.build_delta_fl(spread_task.model_fn, client, theta=0.5)
    algorithm = batched.BatchedAlgorithm.from_registry(
        'deltafl', client_optimizer=client, client_learning_rate=LR, theta=0.5
    )
  runs = {}
  for grouped in (True, False):
    engine = stacked.StackedEngine(
        spread_task.model_fn,
        spread_task.preprocess_train,
        spread_task.train_data,
        algorithm,
        vectorize=True,
        group_by_size=grouped,
    )
    tff_s, fast_s, tm, fm = engine_runs.run_both(
        spread_task, process, engine, rounds=2, epochs=2
    )
    runs[grouped] = (fast_s, engine.last_padding)
    assert_same(process, tff_s, fast_s, tm, fm, TRAIN_KEYS)
  (g_state, (real, g_slots)), (u_state, (real_u, u_slots)) = (
      runs[True],
      runs[False],
  )
  assert real == real_u == 2 * (4 + 400 + 7 + 60)
  # Padded slots: grouped 5 * (2 * 4 + 2 * 24 ... ) against 4 clients x 160.
  assert u_slots == 4 * 160 * 5 and g_slots < 0.45 * u_slots
  for a, b in zip(
      composition.model_weights_as_numpy(process, g_state),
      composition.model_weights_as_numpy(process, u_state),
  ):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
