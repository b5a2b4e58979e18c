"""Attacks A1-A3: oracles of the corrupted updates, only chosen clients hit."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from run import simulation
from tasks import synthetic
from tests import robust_fixtures as fx
from tests import robust_oracles
from tff_algos import aggregators
from tff_algos import attacks
from tff_algos import composition
from tff_algos import fed_avg
from tff_algos import term

IDS = ['a', 'b', 'c', 'd', 'e']


@pytest.fixture(scope='module')
def clients():
  return fx.make_clients(outlier=False)


def build(attack, **kwargs):
  return fed_avg.build_fed_avg(
      synthetic.create_softmax_regression_model_fn(),
      fx.sgd(),
      update_attack=attack,
      **kwargs,
  )


def marked(round_clients, ids, corrupted, round_num, seed=0):
  return attacks.with_attack_markers(
      fx.datasets(round_clients),
      ids,
      corrupted,
      seed=seed,
      round_num=round_num,
      index_of={cid: i for i, cid in enumerate(IDS)},
  )


def run_marked(process, rounds):
  state = process.initialize()
  for round_num, (round_clients, ids, corrupted) in enumerate(rounds, 1):
    state = process.next(
        state, marked(round_clients, ids, corrupted, round_num)
    ).state
  return composition.model_weights_as_numpy(process, state)


def test_corrupted_set_is_fixed_seeded_and_sized():
  ids = [f'c{i}' for i in range(50)]
  first = attacks.corrupted_clients(ids, 0.2, seed=3)
  assert len(first) == 10 and first <= set(ids)
  assert attacks.corrupted_clients(ids, 0.2, seed=3) == first
  assert attacks.corrupted_clients(ids, 0.2, seed=4) != first
  assert not attacks.corrupted_clients(ids, 0.0, seed=3)


def test_model_replacement_scales_only_the_marked_clients(clients):
  rounds = [(clients[:3], IDS[:3], {'b'}), (clients[1:], IDS[1:], {'b', 'e'})]
  w, b = run_marked(
      build(attacks.UpdateAttack('model_replacement', -4.0)), rounds
  )
  corrupted_slots = iter([[1], [0, 3]])

  def aggregate(deltas, weights):
    deltas = deltas.copy()
    for slot in next(corrupted_slots):
      deltas[slot] *= -4.0
    return weights @ deltas / weights.sum()

  w_ref, b_ref = robust_oracles.fedavg_with(
      *fx.zeros(),
      [r[0] for r in rounds],
      aggregate,
      lr=fx.LR,
      batch_size=fx.BATCH,
  )
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)


def test_gaussian_replaces_the_marked_update_by_seeded_noise(clients):
  sigma = 0.5
  rounds = [(clients[:3], IDS[:3], {'c'})]
  w, b = run_marked(build(attacks.UpdateAttack('gaussian', sigma)), rounds)
  seed = attacks.noise_seed(0, 1, IDS.index('c'))
  noise = [
      sigma * tf.random.stateless_normal(shape, seed=[seed, i]).numpy()
      for i, shape in enumerate([(60, 10), (10,)])
  ]
  flat_noise = robust_oracles.flat(*noise)
  assert abs(flat_noise.std() - sigma) < 0.05 and abs(flat_noise.mean()) < 0.05

  def aggregate(deltas, weights):
    deltas = deltas.copy()
    deltas[2] = flat_noise
    return weights @ deltas / weights.sum()

  w_ref, b_ref = robust_oracles.fedavg_with(
      *fx.zeros(), [rounds[0][0]], aggregate, lr=fx.LR, batch_size=fx.BATCH
  )
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)


def test_no_marked_client_is_plain_fedavg(clients):
  rounds = [(clients, IDS, set()), (clients[:2], IDS[:2], set())]
  attacked = run_marked(build(attacks.UpdateAttack('gaussian', 1.0)), rounds)
  plain = fx.run(build(None), [r[0] for r in rounds])[0]
  for a, c in zip(attacked, plain):
    np.testing.assert_allclose(a, c, atol=1e-6)


def test_robust_aggregator_resists_replacement_inside_term(clients):
  """TERM with an attacked client: the median moves far less than the mean."""
  rounds = [(clients, IDS, {'a'})]
  moved = {}
  for name, factory in (
      ('mean', None),
      ('median', aggregators.build_coordinate_median()),
  ):
    process = term.build_term(
        synthetic.create_softmax_regression_model_fn(),
        fx.sgd(),
        tilt=0.0,
        model_aggregator=factory,
        update_attack=attacks.UpdateAttack('model_replacement', -50.0),
    )
    assert attacks.needs_attack_marker(process)
    moved[name] = np.abs(run_marked(process, rounds)[0]).max()
  clean = np.abs(fx.run(build(None), [clients])[0][0]).max()
  assert moved['mean'] > 3 * clean
  assert moved['median'] < 1.5 * clean


def test_label_poisoning_changes_only_corrupted_labels():
  rng = np.random.default_rng(0)
  raw = {
      cid: collections.OrderedDict(
          x=rng.normal(size=(200, 3)).astype(np.float32),
          y=rng.integers(0, 10, 200).astype(np.int32),
      )
      for cid in 'pqr'
  }
  data = tff.simulation.datasets.TestClientData(raw)
  poisoned = attacks.poison_client_data(data, {'q'}, num_classes=10, seed=1)
  assert poisoned.client_ids == data.client_ids

  def arrays(cid):
    ds = poisoned.create_tf_dataset_for_client(cid)
    ex = list(ds.batch(1000).as_numpy_iterator())[0]
    return ex['x'], ex['y']

  for cid in 'pr':
    x, y = arrays(cid)
    np.testing.assert_array_equal(y, raw[cid]['y'])
    np.testing.assert_array_equal(x, raw[cid]['x'])
  x, y = arrays('q')
  np.testing.assert_array_equal(x, raw['q']['x'])
  assert y.dtype == np.int32 and y.min() >= 0 and y.max() < 10
  assert 0.8 < np.mean(y != raw['q']['y']) < 0.97  # uniform: ~90% change
  np.testing.assert_array_equal(arrays('q')[1], y)  # fixed across passes
  with pytest.raises(ValueError, match='label'):
    attacks.poison_client_data(
        tff.simulation.datasets.TestClientData(
            {'p': collections.OrderedDict(z=np.zeros(3, np.float32))}
        ),
        {'p'},
        num_classes=10,
        seed=0,
    )


def test_simulation_reports_benign_clients(tmp_path):
  task = synthetic.create_task(num_clients=10, seed=2)
  process = build(attacks.UpdateAttack('model_replacement', -10.0))
  attack = attacks.AttackConfig(kind='model_replacement', fraction=0.2, seed=5)
  config = simulation.SimulationConfig(
      total_rounds=2,
      clients_per_round=4,
      rounds_per_eval=0,
      eval_train_clients=False,
      attack=attack,
  )
  result = simulation.run_simulation(
      process, task, config, output_dir=str(tmp_path / 'run'), progress=False
  )
  corrupted = attacks.corrupted_clients(
      list(task.train_data.client_ids), 0.2, seed=5
  )
  assert len(corrupted) == 2
  test = result['per_client']['test']
  benign = np.array([c not in corrupted for c in test['client_id']])
  summaries = result['final_summaries']
  assert summaries['test/accuracy']['mean'] == pytest.approx(
      np.mean(test['accuracy'][benign])
  )
  assert summaries['all_test/accuracy']['mean'] == pytest.approx(
      np.mean(test['accuracy'])
  )
  saved = (tmp_path / 'run' / 'attack.json').read_text()
  assert all(c in saved for c in corrupted)
  with pytest.raises(ValueError, match='update_attack'):
    simulation.run_simulation(build(None), task, config, progress=False)


@pytest.mark.parametrize(
    'kwargs, error',
    [
        (dict(kind='noise', scale=1.0), ValueError),
        (dict(kind='gaussian', scale=-1.0), ValueError),
        (dict(kind='model_replacement', scale=0.0), ValueError),
        (dict(kind='gaussian', scale='1'), TypeError),
    ],
)
def test_update_attack_validation(kwargs, error):
  with pytest.raises(error):
    attacks.UpdateAttack(**kwargs)


@pytest.mark.parametrize(
    'kwargs',
    [
        dict(kind='gaussian', fraction=0.0),
        dict(kind='none', fraction=0.2),
        dict(kind='gaussian', fraction=1.0),
        dict(kind='label_poison', fraction=0.2),
        dict(kind='flip', fraction=0.2),
    ],
)
def test_attack_config_validation(kwargs):
  with pytest.raises(ValueError):
    attacks.AttackConfig(**kwargs).validate()


def test_default_scales():
  assert attacks.default_scale('gaussian', clients_per_round=10) == 1.0
  assert (
      attacks.default_scale(
          'model_replacement', clients_per_round=10, server_learning_rate=0.5
      )
      == -20.0
  )
