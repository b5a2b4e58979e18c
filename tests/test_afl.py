"""AFL: simplex projection, NumPy oracle, lambda ascent to the worst client."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import synthetic
from tests import oracles
from tff_algos import afl
from tff_algos import batched
from tff_algos import composition
from tff_algos import stacked


def test_projection_matches_bisection_oracle():
  rng = np.random.default_rng(0)
  for _ in range(50):
    v = rng.normal(size=rng.integers(1, 12)) * rng.choice([0.1, 1.0, 10.0])
    p = afl.project_to_simplex(tf.constant(v, tf.float32)).numpy()
    np.testing.assert_allclose(
        p, oracles.project_simplex_bisection(v), atol=1e-5
    )
    assert abs(p.sum() - 1) < 1e-5 and p.min() >= 0


@pytest.fixture(scope='module')
def clients():
  rng = np.random.default_rng(2)
  out = []
  for n, shift in ((20, 0.0), (15, 1.0), (25, -1.0)):
    x = (rng.normal(size=(n, 60)) + shift).astype(np.float32)
    y = rng.integers(0, 10, n).astype(np.int32)
    out.append((x, y))
  return out


def inputs(clients):
  return [
      afl.client_data_with_index(
          tf.data.Dataset.from_tensor_slices((x, y)).batch(7), k
      )
      for k, (x, y) in enumerate(clients)
  ]


def test_afl_matches_numpy_oracle(clients):
  process = afl.build_afl(
      synthetic.create_softmax_regression_model_fn(),
      num_clients=3,
      model_learning_rate=0.5,
      mixture_learning_rate=0.3,
  )
  state = process.initialize()
  for _ in range(3):
    out = process.next(state, inputs(clients))
    state = out.state
  w, b = composition.model_weights_as_numpy(process, state)
  w_ref, b_ref, mix_ref = oracles.afl_rounds(
      np.zeros((60, 10)), np.zeros(10), clients, 3, lr_w=0.5, lr_lambda=0.3
  )
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(state.client_work, mix_ref, atol=1e-5)
  assert out.metrics['client_work']['mixture']['lambda_max'] == pytest.approx(
      mix_ref.max(), abs=1e-5
  )
  # The client with the highest loss gains mass.
  assert np.argmax(mix_ref) == np.argmax(
      [oracles.softmax_regression_loss(w, b, x, y) for x, y in clients]
  )


def test_partial_participation_matches_numpy_oracle(clients):
  """Only the round's clients: lambda-weighted mean of their gradients,
  ascent on their coordinates only (then the projection)."""
  process = afl.build_afl(
      synthetic.create_softmax_regression_model_fn(),
      num_clients=3,
      model_learning_rate=0.5,
      mixture_learning_rate=0.3,
  )
  participants = [[0, 2], [1], [2, 1], [0]]
  state = process.initialize()
  everyone = inputs(clients)
  for part in participants:
    state = process.next(state, [everyone[k] for k in part]).state
  w, b = composition.model_weights_as_numpy(process, state)
  w_ref, b_ref, mix_ref = oracles.afl_rounds(
      np.zeros((60, 10)),
      np.zeros(10),
      clients,
      4,
      lr_w=0.5,
      lr_lambda=0.3,
      participants=participants,
  )
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(state.client_work, mix_ref, atol=1e-5)
  # Partial participation matters: the full-participation oracle differs.
  w_all, _, mix_all = oracles.afl_rounds(
      np.zeros((60, 10)), np.zeros(10), clients, 4, lr_w=0.5, lr_lambda=0.3
  )
  assert np.abs(mix_all - mix_ref).max() > 1e-2
  assert np.abs(w_all - w_ref).max() > 1e-3


def _engine(kind, clients, options):
  """The `kind` engine over `clients` (ids '0', '1', ...), AFL's definition
  with `build_afl`'s `options`."""
  client_data = tff.simulation.datasets.TestClientData(
      {
          str(k): collections.OrderedDict(x=x, y=y)
          for k, (x, y) in enumerate(clients)
      }
  )
  preprocess, _ = synthetic.make_preprocess_fns(7)
  algorithm = batched.BatchedAlgorithm.from_registry(
      'afl',
      client_optimizer=tff.learning.optimizers.build_sgdm(0.1),
      client_learning_rate=options['model_learning_rate'],
      num_clients=options['num_clients'],
      afl_lambda_lr=options['mixture_learning_rate'],
  )
  model_fn = synthetic.create_softmax_regression_model_fn()
  if kind == 'batched':
    data = batched.ClientArrays(client_data)
    return batched.BatchedEngine(model_fn, preprocess, data, algorithm)
  return stacked.StackedEngine(model_fn, preprocess, client_data, algorithm)


@pytest.mark.parametrize('kind', ['batched', 'stacked'])
def test_engines_run_the_definition_as_the_numpy_oracle(clients, kind):
  """The engines' path (the definition's rules), partial participation.

  With some clients out, the weights lambda_k of a round sum to less than
  1: the server divides the weighted sum by them (a rule returning the sum
  alone passes the full-participation tests, whose lambda sums to 1).
  """
  options = dict(
      num_clients=3, model_learning_rate=0.5, mixture_learning_rate=0.3
  )
  process = afl.build_afl(
      synthetic.create_softmax_regression_model_fn(), **options
  )
  engine = _engine(kind, clients, options)
  participants = [[0, 2], [1], [2, 1], [0]]
  state = process.initialize()
  for part in participants:
    plan = batched.RoundPlan(
        client_ids=[str(k) for k in part],
        epochs=[1] * len(part),
        shuffle_seeds=None,
        max_batches=[-1] * len(part),
        client_indices=part,
    )
    state, _ = engine.next(state, plan)
  engine.close()
  w, b = composition.model_weights_as_numpy(process, state)
  w_ref, b_ref, mix_ref = oracles.afl_rounds(
      np.zeros((60, 10)),
      np.zeros(10),
      clients,
      4,
      lr_w=0.5,
      lr_lambda=0.3,
      participants=participants,
  )
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(state.client_work, mix_ref, atol=1e-5)


def test_definition_server_rule_is_the_weighted_mean():
  definition = afl.engine_definition(
      num_clients=3, model_learning_rate=0.5, mixture_learning_rate=0.3
  )
  rng = np.random.default_rng(4)
  vectors = (rng.normal(size=(60, 10)), rng.normal(size=10))
  vector_sum = tuple(tf.constant(v, tf.float32) for v in vectors)
  for scalar_sum, expected in ((0.6, [v / 0.6 for v in vectors]), (0.0, None)):
    out = definition.server(None, vector_sum, tf.constant(scalar_sum))
    if expected is None:  # Every weight 0: no step (no NaN).
      expected = [np.zeros_like(v) for v in vectors]
    for got, want in zip(out, expected):
      np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7)


def test_zero_mixture_rate_is_fedsgd_with_simple_average(clients):
  process = afl.build_afl(
      synthetic.create_softmax_regression_model_fn(),
      num_clients=3,
      model_learning_rate=0.5,
      mixture_learning_rate=0.0,
  )
  state = process.next(process.initialize(), inputs(clients)).state
  w, _ = composition.model_weights_as_numpy(process, state)
  grads = [
      oracles.softmax_regression_grads(np.zeros((60, 10)), np.zeros(10), x, y)[
          0
      ]
      for x, y in clients
  ]
  np.testing.assert_allclose(w, -0.5 * np.mean(grads, axis=0), atol=1e-6)
  np.testing.assert_allclose(state.client_work, [1 / 3] * 3, atol=1e-7)


@pytest.mark.parametrize(
    'kwargs, error',
    [
        (
            dict(
                num_clients=0,
                model_learning_rate=0.1,
                mixture_learning_rate=0.1,
            ),
            ValueError,
        ),
        (
            dict(
                num_clients=3,
                model_learning_rate=0.0,
                mixture_learning_rate=0.1,
            ),
            ValueError,
        ),
        (
            dict(
                num_clients=3,
                model_learning_rate=0.1,
                mixture_learning_rate=-1.0,
            ),
            ValueError,
        ),
        (
            dict(
                num_clients=2.5,
                model_learning_rate=0.1,
                mixture_learning_rate=0.1,
            ),
            TypeError,
        ),
    ],
)
def test_validation(kwargs, error):
  with pytest.raises(error):
    afl.build_afl(synthetic.create_softmax_regression_model_fn(), **kwargs)
