"""Fed+: NumPy oracle of the local update and each Psi, degenerate cases."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import synthetic
from tests import personal_oracles
from tff_algos import composition
from tff_algos import fed_avg
from tff_algos import fed_plus
from tff_algos import fed_prox

LR = 0.1
BATCH = 5


@pytest.fixture(scope='module')
def clients():
  rng = np.random.default_rng(3)
  out = {}
  for cid, n in zip('abcd', (13, 7, 21, 10)):  # E_k differs: 3, 2, 5, 2.
    x = rng.normal(size=(n, 60)).astype(np.float32)
    y = rng.integers(0, 10, n).astype(np.int32)
    out[cid] = (x, y)
  return out


def rounds_of(clients):
  return [[(c, *clients[c]) for c in 'abc'], [(c, *clients[c]) for c in 'bcd']]


def datasets(round_clients):
  return [
      tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
      for _, x, y in round_clients
  ]


def run_rounds(process, rounds):
  """Runs `rounds`; returns (state, {client: state}, last round's metrics)."""
  state = process.initialize()
  states, metrics = {}, None
  for round_clients in rounds:
    ids = [c for c, _, _ in round_clients]
    out = process.next(
        state,
        datasets(round_clients),
        [states.get(c, process.initial_client_state()) for c in ids],
    )
    state, metrics = out.state, out.metrics
    states.update(zip(ids, out.client_states))
  return state, states, metrics


@pytest.mark.parametrize(
    'psi, sigma, delta, lam, local_steps',
    [
        ('avg', 1.0, 0.1, 0.0, 0),
        ('geomed', 1.0, 0.05, 0.0, 0),
        ('comed', 2.0, 0.01, 0.3, 0),
        ('zero', 1.0, 0.1, 0.5, 4),
    ],
)
def test_fed_plus_matches_numpy_oracle_two_rounds(
    clients, psi, sigma, delta, lam, local_steps
):
  iterations = 6
  process = fed_plus.build_fed_plus(
      synthetic.create_softmax_regression_model_fn(),
      psi=psi,
      learning_rate=LR,
      sigma=sigma,
      delta=delta,
      lam=lam,
      local_steps=local_steps,
      aggregation_iterations=iterations,
  )
  state, states, metrics = run_rounds(process, rounds_of(clients))
  g_ref, local_ref = personal_oracles.fedplus_rounds(
      rounds_of(clients),
      psi=psi,
      lr=LR,
      sigma=sigma,
      delta=delta,
      lam=lam,
      batch_size=BATCH,
      local_steps=local_steps or None,
      iterations=iterations,
  )
  w, b = composition.model_weights_as_numpy(process, state)
  np.testing.assert_allclose(w, g_ref[0], rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, g_ref[1], rtol=1e-4, atol=2e-6)
  for cid in 'abcd':
    vw, vb = states[cid]['personal'][0]
    np.testing.assert_allclose(vw, local_ref[cid][0], rtol=1e-4, atol=2e-6)
    np.testing.assert_allclose(vb, local_ref[cid][1], rtol=1e-4, atol=2e-6)
  if psi in ('geomed', 'comed'):
    # The robust aggregate is not the mean of the local models.
    mean = np.mean([local_ref[c][0] for c in 'bcd'], axis=0)
    assert np.abs(mean - g_ref[0]).max() > 1e-4
    assert metrics['aggregator']['last_step_norm'] > 0


def test_theta_zero_lambda_one_sigma_zero_equals_uniform_fedavg(clients):
  """Table 1's FedAvg row: Psi forcing theta = 0, lambda = 1, sigma = 0."""
  model_fn = synthetic.create_softmax_regression_model_fn()
  rounds = rounds_of(clients)
  plus = fed_plus.build_fed_plus(
      model_fn, psi='zero', learning_rate=LR, sigma=0.0, lam=1.0
  )
  state, _, _ = run_rounds(plus, rounds)
  ours = composition.model_weights_as_numpy(plus, state)
  sgd = tff.learning.optimizers.build_sgdm(learning_rate=LR)
  for other in (
      fed_avg.build_fed_avg(
          model_fn, sgd, client_weighting=tff.learning.ClientWeighting.UNIFORM
      ),
      tff.learning.algorithms.build_unweighted_fed_avg(model_fn, sgd),
  ):
    other_state = other.initialize()
    for round_clients in rounds:
      other_state = other.next(other_state, datasets(round_clients)).state
    for a, b in zip(
        ours, composition.model_weights_as_numpy(other, other_state)
    ):
      np.testing.assert_allclose(a, b, atol=1e-6)


def test_theta_zero_lambda_one_is_fedprox_with_step_eta_kappa(clients):
  """Table 1's FedProx row (Proposition 1: the step is eta * kappa)."""
  model_fn = synthetic.create_softmax_regression_model_fn()
  sigma = 3.0
  plus = fed_plus.build_fed_plus(
      model_fn, psi='zero', learning_rate=LR, sigma=sigma, lam=1.0
  )
  state, _, _ = run_rounds(plus, rounds_of(clients))
  prox = fed_prox.build_fed_prox(
      model_fn,
      tff.learning.optimizers.build_sgdm(learning_rate=LR / (1 + LR * sigma)),
      proximal_strength=sigma,
      client_weighting=tff.learning.ClientWeighting.UNIFORM,
  )
  prox_state = prox.initialize()
  for round_clients in rounds_of(clients):
    prox_state = prox.next(prox_state, datasets(round_clients)).state
  for a, b in zip(
      composition.model_weights_as_numpy(plus, state),
      composition.model_weights_as_numpy(prox, prox_state),
  ):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_prox_operators():
  v = [tf.constant([[-0.5, 0.02], [0.3, -0.01]]), tf.constant([0.0, -2.0])]
  comed = fed_plus.prox('comed', v, 0.1)
  np.testing.assert_allclose(comed[0], [[-0.4, 0.0], [0.2, 0.0]], atol=1e-7)
  np.testing.assert_allclose(comed[1], [0.0, -1.9], atol=1e-7)
  norm = np.sqrt(0.25 + 0.0004 + 0.09 + 0.0001 + 4.0)
  geomed = fed_plus.prox('geomed', v, 0.5)
  np.testing.assert_allclose(
      geomed[1], np.array([0.0, -2.0]) * (1 - 0.5 / norm), rtol=1e-6
  )
  zero = fed_plus.prox('geomed', [tf.zeros([3])], 0.1)
  np.testing.assert_array_equal(zero[0], np.zeros(3))
  small = fed_plus.prox('geomed', [tf.constant([0.03, 0.04])], 0.1)
  np.testing.assert_array_equal(small[0], np.zeros(2))
  np.testing.assert_allclose(fed_plus.prox('avg', v, 1.0)[1], [0.0, -1.0])
  # The anchor w~ + theta moves the party's model min(||r||, delta) toward
  # w~ (spec A.3): ||r - theta|| = min(||r||, delta).
  r = [tf.constant([3.0, 4.0])]
  for delta in (0.5, 10.0):
    theta = fed_plus.prox('geomed', r, delta)
    np.testing.assert_allclose(
        np.linalg.norm(r[0] - theta[0]), min(5.0, delta), rtol=1e-6
    )


def test_geomed_aggregate_resists_an_outlier():
  """Local models kept as they are (sigma = 0, tiny eta): the aggregate of
  four models near 0 and one at 1 stays near 0 for geomed, not the mean."""
  rng = np.random.default_rng(0)
  models = [
      [
          rng.normal(size=(60, 10)).astype(np.float32) * 0.01,
          rng.normal(size=10).astype(np.float32) * 0.01,
      ]
      for _ in range(4)
  ]
  models.append([np.ones((60, 10), np.float32), np.ones(10, np.float32)])
  x = np.zeros((1, 60), np.float32)
  data = [
      tf.data.Dataset.from_tensor_slices((x, np.zeros(1, np.int32))).batch(1)
  ] * 5
  results = {}
  for psi in ('geomed', 'avg'):
    process = fed_plus.build_fed_plus(
        synthetic.create_softmax_regression_model_fn(),
        psi=psi,
        learning_rate=1e-9,
        sigma=0.0,
        delta=0.5,
        aggregation_iterations=40,
    )
    out = process.next(
        process.initialize(), data, [{'personal': (m,)} for m in models]
    )
    results[psi] = composition.model_weights_as_numpy(process, out.state)
    ref = personal_oracles.fedplus_aggregate(psi, models, 0.5, 40)
    np.testing.assert_allclose(results[psi][0], ref[0], atol=1e-5)
  assert np.abs(results['avg'][0]).mean() > 0.19
  assert np.abs(results['geomed'][0]).mean() < 0.05


@pytest.mark.parametrize(
    'kwargs, error',
    [
        (dict(psi='median'), ValueError),
        (dict(psi='avg', learning_rate=0.0), ValueError),
        (dict(psi='avg', sigma=-1.0), ValueError),
        (dict(psi='avg', lam=1.5), ValueError),
        (dict(psi='avg', delta=float('nan')), ValueError),
        (dict(psi='avg', local_steps=-1), ValueError),
        (dict(psi='geomed', aggregation_iterations=0), ValueError),
        (dict(psi='avg', sigma='1'), TypeError),
    ],
)
def test_validation(kwargs, error):
  kwargs = {'learning_rate': LR, 'sigma': 1.0, **kwargs}
  with pytest.raises(error):
    fed_plus.build_fed_plus(
        synthetic.create_softmax_regression_model_fn(), **kwargs
    )
