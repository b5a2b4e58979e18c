"""run.experiments.numpy_sim: its padded, batched local SGD and server steps
against the independent oracles of tests/oracles.py."""

import types

import numpy as np
import pytest

from run.experiments import numpy_sim
from tasks import synthetic
from tests import oracles


def random_clients(sizes, seed=0):
  rng = np.random.default_rng(seed)
  return [(rng.normal(size=(n, 6)), rng.integers(0, 4, n)) for n in sizes]


@pytest.mark.parametrize('q', [0.0, 0.5, 2.0])
def test_q_fedavg_matches_oracle_two_rounds(q):
  setting = numpy_sim.Setting(
      algorithm='qffl', q=q, learning_rate=0.1, batch_size=3
  )
  rounds = [random_clients((7, 3, 11)), random_clients((5, 9), seed=1)]
  rng = np.random.default_rng(2)
  w0, b0 = 0.1 * rng.normal(size=(6, 4)), 0.1 * rng.normal(size=4)
  w, b = w0, b0
  for clients in rounds:
    losses = np.array([numpy_sim.client_loss(w, b, x, y) for x, y in clients])
    ww, bb = numpy_sim.local_sgd(w, b, clients, learning_rate=0.1, batch_size=3)
    w, b = numpy_sim.aggregate(
        setting, w, b, losses, np.array([len(y) for _, y in clients]), ww, bb
    )
  w_ref, b_ref = oracles.q_ffl_rounds(
      w0, b0, rounds, q=q, lipschitz=10.0, lr=0.1, batch_size=3
  )
  np.testing.assert_allclose(w, w_ref, rtol=1e-9, atol=1e-12)
  np.testing.assert_allclose(b, b_ref, rtol=1e-9, atol=1e-12)


def test_term_matches_tilted_weights_of_local_models():
  setting = numpy_sim.Setting(algorithm='term', tilt=1.5, batch_size=4)
  clients = random_clients((9, 4, 13))
  w, b = np.zeros((6, 4)), np.zeros(4) + 0.2
  losses = np.array([numpy_sim.client_loss(w, b, x, y) for x, y in clients])
  sizes = np.array([len(y) for _, y in clients], np.float64)
  ww, bb = numpy_sim.local_sgd(w, b, clients, learning_rate=0.05, batch_size=4)
  w_new, b_new = numpy_sim.aggregate(setting, w, b, losses, sizes, ww, bb)
  weights = oracles.tilted_weights(losses, sizes, 1.5)
  models = [
      oracles.proximal_local_sgd(
          w, b, x, y, lr=0.05, mu=0.0, batch_size=4, epochs=1
      )
      for x, y in clients
  ]
  np.testing.assert_allclose(
      w_new, sum(a * m[0] for a, m in zip(weights, models)), atol=1e-12
  )
  np.testing.assert_allclose(
      b_new, sum(a * m[1] for a, m in zip(weights, models)), atol=1e-12
  )


def test_bad_setting_is_refused():
  with pytest.raises(ValueError, match='unknown algorithm'):
    numpy_sim.Setting(algorithm='fedsgd').validate()
  with pytest.raises(ValueError, match='clients_per_round'):
    numpy_sim.Setting(num_clients=5, clients_per_round=6).validate()


@pytest.mark.parametrize(
    'data_flags',
    [
        dict(iid=True, alpha=1.0, beta=1.0, num_clients=100),
        dict(iid=False, alpha=2.0, beta=2.0, num_clients=100),
        dict(iid=False, alpha=1.0, beta=1.0, num_clients=50),
    ],
)
def test_data_flags_reach_the_generator(data_flags):
  """--iid, --alpha, --beta and --num_clients (thesis Table 4.10) change the
  data exactly as the generator's own arguments do."""
  flag_values = types.SimpleNamespace(
      algorithm='qffl',
      rounds=5,
      size_law='table_4_4',
      client_sampling='examples',
      learning_rate=0.1,
      **data_flags,
  )
  setting = numpy_sim.setting_from_flags(flag_values, 1.0, seed=3)
  # alpha only shifts every entry of W_k and b_k by the same u_k, which leaves
  # argmax(W_k x + b_k) unchanged: the labels, hence the data, ignore it. So
  # the setting itself is checked too.
  assert {k: getattr(setting, k) for k in data_flags} == data_flags
  train, test = numpy_sim.client_data(setting)
  clients = synthetic.generate(seed=3, size_law='table_4_4', **data_flags)
  want_train, want_test, _ = synthetic.split_arrays(
      clients, seed=3, test_fraction=0.1
  )
  assert len(train) == data_flags['num_clients']
  for got, want in ((train, want_train), (test, want_test)):
    assert sorted(got) == sorted(want)
    for cid, want_arrays in want.items():
      np.testing.assert_array_equal(got[cid][0], want_arrays[0])
      np.testing.assert_array_equal(got[cid][1], want_arrays[1])
  # And the default setting (Synthetic(1,1), 100 clients) is other data.
  default_train, _ = numpy_sim.client_data(numpy_sim.Setting(seed=3))
  assert any(
      len(default_train.get(c, ((), ()))[1]) != len(arrays[1])
      or not np.array_equal(default_train[c][0], arrays[0])
      for c, arrays in train.items()
  )


def test_train_split_scores_the_training_examples(monkeypatch):
  """--evaluate=train (thesis Table 4.6) scores the final model on each
  client's training split, --evaluate=test on its test split."""
  seen = []
  real = numpy_sim._accuracy_summary  # pylint: disable=protected-access

  def spy(w, b, data):
    seen.append({c: len(y) for c, (_, y) in data.items()})
    return real(w, b, data)

  monkeypatch.setattr(numpy_sim, '_accuracy_summary', spy)
  setting = numpy_sim.Setting(rounds=1, num_clients=12, clients_per_round=3)
  out = numpy_sim.simulate_splits(setting, ('test', 'train'))
  train, test = numpy_sim.client_data(setting)
  assert seen == [
      {c: len(y) for c, (_, y) in test.items()},
      {c: len(y) for c, (_, y) in train.items()},
  ]
  assert set(out) == {'test', 'train'}
  with pytest.raises(ValueError, match='splits'):
    numpy_sim.simulate_splits(setting, ('validation',))


def test_bad_data_setting_is_refused():
  with pytest.raises(ValueError, match='alpha and beta'):
    numpy_sim.Setting(alpha=-1.0).validate()
