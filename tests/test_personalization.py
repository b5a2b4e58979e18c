# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Fine-tuning evaluation: NumPy oracle, federated == direct, validation."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import evaluation
from tasks import personalization
from tasks import synthetic

LEARNING_RATES = (0.05, 0.3)
MAX_EPOCHS = 3
BATCH = 4
# (fine-tuning examples, evaluation examples) per client: 7 and 10 end in a
# partial batch of 4, 12 does not; the evaluation sizes are distinct, so the
# federated form's clients (in TFF's order) are matched by num_examples.
SIZES = ((7, 5), (12, 9), (10, 6))
SEED = 0


def _model_fn():
  return synthetic.create_softmax_regression_model_fn()()


# ------------------------------------------------------------------- oracle


def _logits(w, b, x):
  return x.astype(np.float64) @ w + b


def _mean_cross_entropy(w, b, x, y):
  z = _logits(w, b, x)
  z = z - z.max(axis=1, keepdims=True)
  log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
  return -log_p[np.arange(len(y)), y].mean()


def _cross_entropy_grads(w, b, x, y):
  z = _logits(w, b, x)
  p = np.exp(z - z.max(axis=1, keepdims=True))
  p /= p.sum(axis=1, keepdims=True)
  p[np.arange(len(y)), y] -= 1.0
  p /= len(y)
  return x.astype(np.float64).T @ p, p.sum(axis=0)


def _oracle_metrics(w, b, x, y):
  return {
      'accuracy': float(np.mean(np.argmax(_logits(w, b, x), axis=1) == y)),
      'loss': float(_mean_cross_entropy(w, b, x, y)),
      'num_examples': len(y),
  }


def oracle_fine_tune(
    w0, b0, train, test, *, lr, epochs, batch_size, orders=None
):
  """Metrics on `test` after 0..epochs epochs of mini-batch SGD.

  `orders[e]` is epoch e's order of the training examples (default: stored).
  """
  w, b = np.array(w0, np.float64), np.array(b0, np.float64)
  (x0, y0), (tx, ty) = train, test
  out = [_oracle_metrics(w, b, tx, ty)]
  for epoch in range(epochs):
    order = np.arange(len(y0)) if orders is None else orders[epoch]
    x, y = x0[order], y0[order]
    for start in range(0, len(y), batch_size):
      gw, gb = _cross_entropy_grads(
          w, b, x[start : start + batch_size], y[start : start + batch_size]
      )
      w, b = w - lr * gw, b - lr * gb
    out.append(_oracle_metrics(w, b, tx, ty))
  return out


# ----------------------------------------------------------------- fixtures


@pytest.fixture(scope='module')
def setup():
  """Nonzero starting weights and three clients' (train, eval) arrays."""
  rng = np.random.default_rng(7)
  nf, nc = synthetic.NUM_FEATURES, synthetic.NUM_CLASSES
  w0 = rng.normal(0.0, 0.2, (nf, nc)).astype(np.float32)
  b0 = rng.normal(0.0, 0.2, nc).astype(np.float32)
  teacher = rng.normal(size=(nf, nc))
  clients = []
  for n_train, n_test in SIZES:
    # Mostly the teacher's labels, some noisy; the evaluation data repeat
    # half of the fine-tuning examples, so fine-tuning changes the accuracy.
    n_new = n_test - n_test // 2
    x = rng.normal(size=(n_train + n_new, nf)).astype(np.float32)
    y = np.argmax(x @ teacher + rng.normal(0, 3.0, (len(x), nc)), axis=1)
    y = y.astype(np.int32)
    test_rows = np.r_[: n_test // 2, n_train : n_train + n_new]
    clients.append(((x[:n_train], y[:n_train]), (x[test_rows], y[test_rows])))
  weights = tff.learning.models.ModelWeights(
      trainable=[w0, b0], non_trainable=[]
  )
  return w0, b0, clients, weights


def _pairs(clients):
  return [
      (
          tf.data.Dataset.from_tensor_slices(tr),
          tf.data.Dataset.from_tensor_slices(te),
      )
      for tr, te in clients
  ]


@pytest.fixture(scope='module')
def direct(setup):
  """`fine_tune_directly` results keyed by shuffle seed (None, SEED)."""
  _, _, clients, weights = setup
  return {
      seed: personalization.fine_tune_directly(
          _model_fn,
          weights,
          _pairs(clients),
          learning_rates=LEARNING_RATES,
          max_epochs=MAX_EPOCHS,
          batch_size=BATCH,
          shuffle_seed=seed,
      )
      for seed in (None, SEED)
  }


def _federated(weights, clients, shuffle_seed):
  computation = personalization.build_fine_tuning_evaluation(
      _model_fn,
      learning_rates=LEARNING_RATES,
      max_epochs=MAX_EPOCHS,
      batch_size=BATCH,
      max_num_clients=len(clients),
      shuffle_seed=shuffle_seed,
  )
  return personalization.fine_tune_clients(
      computation, weights, _pairs(clients), LEARNING_RATES
  )


def _assert_metrics_close(got, want, *, where):
  """`got`: metric -> per-client array; `want`: list of per-client dicts."""
  assert set(got) == {'accuracy', 'loss', 'num_examples'}, where
  np.testing.assert_array_equal(
      got['num_examples'], [m['num_examples'] for m in want], err_msg=where
  )
  np.testing.assert_allclose(
      got['accuracy'], [m['accuracy'] for m in want], atol=1e-6, err_msg=where
  )
  np.testing.assert_allclose(
      got['loss'], [m['loss'] for m in want], rtol=1e-4, err_msg=where
  )


# -------------------------------------------------------------------- tests


def test_fine_tune_directly_matches_numpy_oracle(setup, direct):
  w0, b0, clients, _ = setup
  result = direct[None]
  assert sorted(result) == sorted(LEARNING_RATES)
  for lr in LEARNING_RATES:
    assert len(result[lr]) == MAX_EPOCHS + 1
    want = [
        oracle_fine_tune(
            w0, b0, tr, te, lr=lr, epochs=MAX_EPOCHS, batch_size=BATCH
        )
        for tr, te in clients
    ]
    for epoch in range(MAX_EPOCHS + 1):
      _assert_metrics_close(
          result[lr][epoch],
          [per_client[epoch] for per_client in want],
          where=f'lr={lr} epoch={epoch}',
      )
    # Fine-tuning really moved the model: every client's loss changed, and
    # the accuracies are not all the starting ones.
    start, end = result[lr][0], result[lr][MAX_EPOCHS]
    assert np.all(np.abs(end['loss'] - start['loss']) > 1e-2)
    assert np.any(end['accuracy'] != start['accuracy'])
  # The two learning rates give different models.
  assert np.all(
      np.abs(
          result[LEARNING_RATES[0]][MAX_EPOCHS]['loss']
          - result[LEARNING_RATES[1]][MAX_EPOCHS]['loss']
      )
      > 1e-3
  )


def _numpy_orders(n, client):
  """`fine_tune_directly`'s documented per-epoch permutations."""
  return [
      np.random.default_rng([SEED, client, e]).permutation(n)
      for e in range(MAX_EPOCHS)
  ]


def _tf_data_orders(n):
  """The orders of the federated form's seeded `tf.data` shuffle."""

  @tf.function
  def orders():
    data = tf.data.Dataset.range(n).shuffle(
        personalization.SHUFFLE_BUFFER,
        seed=SEED,
        reshuffle_each_iteration=True,
    )
    return [data.batch(n).get_single_element() for _ in range(MAX_EPOCHS)]

  return [np.asarray(o) for o in orders()]


def test_fine_tune_directly_seeded_matches_numpy_oracle(setup, direct):
  w0, b0, clients, _ = setup
  for lr in LEARNING_RATES:
    want = [
        oracle_fine_tune(
            w0,
            b0,
            tr,
            te,
            lr=lr,
            epochs=MAX_EPOCHS,
            batch_size=BATCH,
            orders=_numpy_orders(len(tr[1]), k),
        )
        for k, (tr, te) in enumerate(clients)
    ]
    for epoch in range(MAX_EPOCHS + 1):
      _assert_metrics_close(
          direct[SEED][lr][epoch],
          [per_client[epoch] for per_client in want],
          where=f'lr={lr} epoch={epoch}',
      )


def test_shuffle_seed_changes_the_fine_tuning(direct):
  # With the seeded shuffle the batches differ from the stored order, so the
  # shuffled runs must not equal the unshuffled ones (else the federated ==
  # direct check with a seed below would not test the shuffle).
  for lr in LEARNING_RATES:
    np.testing.assert_array_equal(
        direct[SEED][lr][0]['loss'], direct[None][lr][0]['loss']
    )
    assert np.any(
        np.abs(direct[SEED][lr][1]['loss'] - direct[None][lr][1]['loss']) > 1e-4
    )


def _by_num_examples(per_client):
  """A list of per-client metric dicts as one metric -> array dict."""
  return {k: np.asarray([m[k] for m in per_client]) for k in per_client[0]}


@pytest.mark.parametrize('shuffle_seed', [None])
def test_federated_form_equals_direct_form(setup, direct, shuffle_seed):
  w0, b0, clients, weights = setup
  federated = _federated(weights, clients, shuffle_seed)
  if shuffle_seed is None:
    want = direct[None]
  else:
    # The forms shuffle differently (NumPy permutations directly, tf.data in
    # TFF's): the federated one against the oracle on tf.data's orders.
    want = {}
    for lr in LEARNING_RATES:
      per_client = [
          oracle_fine_tune(
              w0,
              b0,
              tr,
              te,
              lr=lr,
              epochs=MAX_EPOCHS,
              batch_size=BATCH,
              orders=_tf_data_orders(len(tr[1])),
          )
          for tr, te in clients
      ]
      want[lr] = [
          _by_num_examples([c[e] for c in per_client])
          for e in range(MAX_EPOCHS + 1)
      ]
  assert sorted(federated) == sorted(LEARNING_RATES)
  for lr in LEARNING_RATES:
    assert len(federated[lr]) == MAX_EPOCHS + 1
    # TFF returns the clients in its own order: the evaluation sizes are
    # distinct, so sort both by num_examples.
    order = np.argsort(federated[lr][0]['num_examples'])
    for epoch in range(MAX_EPOCHS + 1):
      got = {k: v[order] for k, v in federated[lr][epoch].items()}
      ref = want[lr][epoch]
      ref_order = np.argsort(ref['num_examples'])
      _assert_metrics_close(
          got,
          [{k: ref[k][i] for k in ref} for i in ref_order],
          where=f'shuffle_seed={shuffle_seed} lr={lr} epoch={epoch}',
      )
      # One client's metrics stay together: the rows' num_examples agree.
      np.testing.assert_array_equal(
          got['num_examples'], sorted(te[1].size for _, te in clients)
      )


def test_epoch_zero_is_per_client_evaluation_of_start(setup, direct):
  _, _, clients, weights = setup
  per_client = evaluation.evaluate_clients(
      evaluation.build_per_client_evaluation(_model_fn),
      weights,
      [
          tf.data.Dataset.from_tensor_slices(te).batch(BATCH)
          for _, te in clients
      ],
  )
  assert set(per_client) == {'accuracy', 'loss', 'num_examples'}
  want = [
      {k: per_client[k][i] for k in per_client} for i in range(len(clients))
  ]
  for shuffle_seed in (None, SEED):
    for lr in LEARNING_RATES:
      _assert_metrics_close(
          direct[shuffle_seed][lr][0],
          want,
          where=f'shuffle_seed={shuffle_seed} lr={lr}',
      )
  # The starting model is not trivially scored (nonzero, distinct losses).
  assert np.all(per_client['loss'] > 0.1)
  assert len(set(np.round(per_client['loss'], 4))) == len(clients)


@pytest.mark.parametrize(
    'kwargs, match',
    [
        (dict(learning_rates=[0.1, 0.0]), 'learning_rates must be > 0'),
        (dict(learning_rates=[-0.1]), 'learning_rates must be > 0'),
        (dict(learning_rates=[float('nan')]), 'learning_rates must be > 0'),
        (dict(learning_rates=[float('inf')]), 'learning_rates must be > 0'),
        (dict(learning_rates=[]), 'learning_rates must be > 0'),
        (dict(learning_rates=[0.1, 0.2, 0.1]), 'learning_rates repeat'),
        (dict(max_epochs=0), 'max_epochs must be an int >= 1'),
        (dict(max_epochs=True), 'max_epochs must be an int >= 1'),
        (dict(max_epochs=2.0), 'max_epochs must be an int >= 1'),
        (dict(batch_size=0), 'batch_size must be an int >= 1'),
        (dict(batch_size=True), 'batch_size must be an int >= 1'),
        (dict(max_num_clients=0), 'max_num_clients must be an int >= 1'),
    ],
)
def test_build_fine_tuning_evaluation_rejects_bad_arguments(kwargs, match):
  args = dict(
      learning_rates=[0.1], max_epochs=1, batch_size=2, max_num_clients=2
  )
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    personalization.build_fine_tuning_evaluation(_model_fn, **args)


def test_strategy_names_and_empty_clients():
  assert personalization.strategy_name(0.1) == 'lr_0.1'
  assert personalization.strategy_name(1e-3) == 'lr_0.001'

  def not_called(*args):
    raise AssertionError(f'computation called with {args}')

  assert personalization.fine_tune_clients(
      not_called, None, [], [0.1, 1.0]
  ) == {0.1: [], 1.0: []}
