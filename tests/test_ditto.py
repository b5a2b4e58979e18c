"""Ditto: NumPy oracle (global + personal), global == FedAvg, robust mean."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import synthetic
from tests import oracles
from tests import personal_oracles
from tff_algos import composition
from tff_algos import ditto
from tff_algos import fed_avg

LR = 0.1
PERSONAL_LR = 0.05
BATCH = 5


@pytest.fixture(scope='module')
def clients():
  rng = np.random.default_rng(11)
  out = {}
  for cid, n in zip('abcd', (13, 17, 9, 11)):
    x = rng.normal(size=(n, 60)).astype(np.float32)
    y = rng.integers(0, 10, n).astype(np.int32)
    out[cid] = (x, y)
  return out


def rounds_of(clients):
  return [[(c, *clients[c]) for c in 'abc'], [(c, *clients[c]) for c in 'bcd']]


def datasets(round_clients, epochs=1):
  return [
      tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat(epochs)
      for _, x, y in round_clients
  ]


def sgd(lr=LR):
  return tff.learning.optimizers.build_sgdm(learning_rate=lr)


def run_rounds(process, rounds, epochs):
  """Drives `process` keeping client states in a dict, as the loop does."""
  state = process.initialize()
  states = {}
  for round_clients in rounds:
    ids = [c for c, _, _ in round_clients]
    client_states = [states.get(c, process.initial_client_state()) for c in ids]
    out = process.next(state, datasets(round_clients, epochs), client_states)
    state = out.state
    states.update(zip(ids, out.client_states))
  return state, states


@pytest.mark.parametrize(
    'lambdas, weighting, personal_steps',
    [
        ((0.5,), tff.learning.ClientWeighting.NUM_EXAMPLES, 0),
        ((0.0, 1.0, 10.0), tff.learning.ClientWeighting.UNIFORM, 0),
        ((2.0,), tff.learning.ClientWeighting.NUM_EXAMPLES, 7),
    ],
)
def test_ditto_matches_numpy_oracle_two_rounds(
    clients, lambdas, weighting, personal_steps
):
  process = ditto.build_ditto(
      synthetic.create_softmax_regression_model_fn(),
      sgd(),
      lam=list(lambdas),
      personal_optimizer_fn=sgd(PERSONAL_LR),
      personal_steps=personal_steps,
      client_weighting=weighting,
  )
  state, states = run_rounds(process, rounds_of(clients), epochs=2)
  (w_ref, b_ref), personal_ref = personal_oracles.ditto_rounds(
      rounds_of(clients),
      lambdas=lambdas,
      lr=LR,
      personal_lr=PERSONAL_LR,
      batch_size=BATCH,
      epochs=2,
      personal_steps=personal_steps or None,
      weighting='num_examples'
      if weighting == tff.learning.ClientWeighting.NUM_EXAMPLES
      else 'uniform',
  )
  w, b = composition.model_weights_as_numpy(process, state)
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)
  assert sorted(states) == ['a', 'b', 'c', 'd']
  for cid in 'abcd':
    assert len(states[cid]['personal']) == len(lambdas)
    for (v_w, v_b), (r_w, r_b) in zip(
        states[cid]['personal'], personal_ref[cid]
    ):
      np.testing.assert_allclose(v_w, r_w, rtol=1e-4, atol=2e-6)
      np.testing.assert_allclose(v_b, r_b, rtol=1e-4, atol=2e-6)
  # The personal models differ from the global one and across lambdas.
  assert np.abs(states['b']['personal'][0][0] - w).max() > 1e-3


def test_global_model_equals_fedavg_and_stock(clients):
  model_fn = synthetic.create_softmax_regression_model_fn()
  rounds = rounds_of(clients)
  state, _ = run_rounds(
      ditto.build_ditto(model_fn, sgd(), lam=[0.1, 1.0]), rounds, epochs=2
  )
  ours = composition.model_weights_as_numpy(
      ditto.build_ditto(model_fn, sgd(), lam=0.1), state
  )
  for other in (
      fed_avg.build_fed_avg(model_fn, sgd()),
      tff.learning.algorithms.build_weighted_fed_avg(model_fn, sgd()),
  ):
    other_state = other.initialize()
    for round_clients in rounds:
      other_state = other.next(other_state, datasets(round_clients, 2)).state
    for a, b in zip(
        ours, composition.model_weights_as_numpy(other, other_state)
    ):
      np.testing.assert_allclose(a, b, atol=1e-6)


def test_ditto_with_clipping_aggregator_matches_oracle(clients):
  clip = 0.05
  aggregator = tff.aggregators.clipping_factory(
      clip, tff.aggregators.MeanFactory()
  )
  process = ditto.build_ditto(
      synthetic.create_softmax_regression_model_fn(),
      sgd(),
      lam=0.5,
      model_aggregator=aggregator,
  )
  state, states = run_rounds(process, rounds_of(clients), epochs=1)
  (w_ref, b_ref), personal_ref = personal_oracles.ditto_rounds(
      rounds_of(clients),
      lambdas=(0.5,),
      lr=LR,
      personal_lr=LR,
      batch_size=BATCH,
      epochs=1,
      clip=clip,
  )
  w, b = composition.model_weights_as_numpy(process, state)
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(
      states['d']['personal'][0][0],
      personal_ref['d'][0][0],
      rtol=1e-4,
      atol=2e-6,
  )
  # Clipping changed the result: the unclipped oracle differs.
  (w_mean, _), _ = personal_oracles.ditto_rounds(
      rounds_of(clients),
      lambdas=(0.5,),
      lr=LR,
      personal_lr=LR,
      batch_size=BATCH,
      epochs=1,
  )
  assert np.abs(w_mean - w_ref).max() > 1e-3


def test_diverged_personal_model_is_kept_and_counted(clients):
  """lambda eta_l = 1000: v - w^t grows ~1000x a step and overflows."""
  process = ditto.build_ditto(
      synthetic.create_softmax_regression_model_fn(),
      sgd(),
      lam=[0.5, 1e4],
      personal_steps=30,
  )
  one_round = rounds_of(clients)[0]
  state = process.initialize()
  initial = process.initial_client_state()
  out = process.next(state, datasets(one_round), [initial] * len(one_round))
  # Each of the 3 clients dropped its lambda = 1e4 model, none its 0.5 one.
  assert out.metrics['client_work']['personal_non_finite'] == 3
  _, personal_ref = personal_oracles.ditto_rounds(
      [one_round],
      lambdas=(0.5,),
      lr=LR,
      personal_lr=LR,
      batch_size=BATCH,
      epochs=1,
      personal_steps=30,
  )
  for (cid, _, _), client_state in zip(one_round, out.client_states):
    (v_w, v_b), (d_w, d_b) = client_state['personal']
    np.testing.assert_allclose(
        v_w, personal_ref[cid][0][0], rtol=1e-4, atol=2e-6
    )
    np.testing.assert_allclose(
        v_b, personal_ref[cid][0][1], rtol=1e-4, atol=2e-6
    )
    np.testing.assert_array_equal(d_w, initial['personal'][1][0])
    np.testing.assert_array_equal(d_b, initial['personal'][1][1])
  # A round without divergence reports 0.
  stable = ditto.build_ditto(
      synthetic.create_softmax_regression_model_fn(), sgd(), lam=[0.5, 1.0]
  )
  assert (
      stable.next(
          stable.initialize(),
          datasets(one_round),
          [stable.initial_client_state()] * 3,
      ).metrics['client_work']['personal_non_finite']
      == 0
  )


def test_personal_evaluation_reports_each_personal_model(clients):
  process = ditto.build_ditto(
      synthetic.create_softmax_regression_model_fn(), sgd(), lam=[0.0, 5.0]
  )
  state, states = run_rounds(process, rounds_of(clients), epochs=2)
  x, y = clients['b']
  rows = process.evaluate_personal(
      state,
      [states['b']],
      [tf.data.Dataset.from_tensor_slices((x, y)).batch(4)],
  )
  assert rows[0]['loss'].shape == (2,)
  for g in range(2):
    vw, vb = states['b']['personal'][g]
    assert rows[0]['loss'][g] == pytest.approx(
        oracles.softmax_regression_loss(vw, vb, x, y), rel=1e-5
    )
    assert rows[0]['accuracy'][g] == pytest.approx(
        np.mean(np.argmax(x @ vw + vb, axis=1) == y)
    )
  assert process.personal_model_values == (0.0, 5.0)


@pytest.mark.parametrize(
    'kwargs, error',
    [
        (dict(lam=-1.0), ValueError),
        (dict(lam=float('inf')), ValueError),
        (dict(lam=[]), ValueError),
        (dict(lam='1'), TypeError),
        (dict(lam=[0.1, 0.1]), ValueError),
        (dict(lam=1.0, personal_steps=-1), ValueError),
        (dict(lam=1.0, personal_optimizer_fn='sgd'), TypeError),
        (
            dict(lam=1.0, model_aggregator=tff.aggregators.SumFactory()),
            TypeError,
        ),
    ],
)
def test_validation(kwargs, error):
  with pytest.raises(error):
    ditto.build_ditto(
        synthetic.create_softmax_regression_model_fn(), sgd(), **kwargs
    )


def test_update_attack_corrupts_only_marked_global_deltas(clients):
  """A3 on Ditto: a marked client's global delta is scaled; personal models
  (what the client keeps) are those of the clean run."""
  from tff_algos import attacks  # pylint: disable=g-import-not-at-top

  model_fn = synthetic.create_softmax_regression_model_fn()
  scale = -3.0
  attacked = ditto.build_ditto(
      model_fn,
      sgd(),
      lam=0.5,
      client_weighting=tff.learning.ClientWeighting.UNIFORM,
      update_attack=attacks.UpdateAttack('model_replacement', scale),
  )
  clean = ditto.build_ditto(
      model_fn,
      sgd(),
      lam=0.5,
      client_weighting=tff.learning.ClientWeighting.UNIFORM,
  )
  assert attacks.needs_attack_marker(attacked)
  assert not attacks.needs_attack_marker(clean)
  round_clients = [(c, *clients[c]) for c in 'abc']
  data = datasets(round_clients)
  marked = [
      collections.OrderedDict(
          data=ds, attack=attacks.marker_dataset(c == 'b', 7)
      )
      for ds, (c, _, _) in zip(data, round_clients)
  ]
  initial = [clean.initial_client_state() for _ in round_clients]
  out_attacked = attacked.next(attacked.initialize(), marked, initial)
  out_clean = clean.next(clean.initialize(), data, initial)
  # Each client's honest delta, from one-client rounds of the clean process.
  deltas = []
  for i in range(3):
    one = clean.next(clean.initialize(), [data[i]], [initial[i]])
    w0 = composition.model_weights_as_numpy(clean, clean.initialize())
    w1 = composition.model_weights_as_numpy(clean, one.state)
    deltas.append([a - b for a, b in zip(w0, w1)])
  w0 = composition.model_weights_as_numpy(clean, clean.initialize())
  expected = [
      w - (d0 + scale * d1 + d2) / 3 for w, d0, d1, d2 in zip(w0, *deltas)
  ]
  got = composition.model_weights_as_numpy(attacked, out_attacked.state)
  for a, b in zip(got, expected):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  for s_attacked, s_clean in zip(
      out_attacked.client_states, out_clean.client_states
  ):
    for a, b in zip(tf.nest.flatten(s_attacked), tf.nest.flatten(s_clean)):
      np.testing.assert_allclose(a, b, atol=1e-7)
