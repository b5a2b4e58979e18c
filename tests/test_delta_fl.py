"""Delta-FL: NumPy oracle of Algorithm 2, theta = 1 is FedAvg, the filter
rules, and the paper's Gaussian-mixture illustration (section 3, Figure 3)."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.compiler import tree_analysis

from tasks import synthetic
from tasks import tail_metrics
from tests import oracles
from tests import quantile_oracles
from tests import secure_checks
from tff_algos import composition
from tff_algos import delta_fl
from tff_algos import fed_avg
from tff_algos import options as options_lib
from tff_algos import quantiles

LR = 0.1
BATCH = 5


@pytest.fixture(scope='module')
def clients():
  rng = np.random.default_rng(8)
  out = []
  for k, n in enumerate((13, 17, 9, 23, 11)):
    x = (rng.normal(size=(n, 60)) + 0.3 * k).astype(np.float32)
    y = rng.integers(0, 10, n).astype(np.int32)
    out.append((x, y))
  return out


def datasets(round_clients, epochs=1):
  return [
      tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat(epochs)
      for x, y in round_clients
  ]


def sgd(lr=LR):
  return tff.learning.optimizers.build_sgdm(learning_rate=lr)


def random_model(seed=1):
  rng = np.random.default_rng(seed)
  return (
      0.1 * rng.normal(size=(60, 10)).astype(np.float32),
      0.1 * rng.normal(size=10).astype(np.float32),
  )


def start(process):
  """Initial state at `random_model()`: at zero weights all losses tie."""
  state = process.initialize()
  weights = process.get_model_weights(state)
  return process.set_model_weights(
      state,
      tff.learning.models.ModelWeights(
          trainable=list(random_model()), non_trainable=weights.non_trainable
      ),
  )


def delta_fl_oracle(
    rounds, theta, *, strict=False, uniform=False, weight_decay=0.0
):
  """Runs Delta-FL (Algorithm 2) in NumPy over `rounds`; returns (w, b)."""
  w, b = (a.astype(np.float64) for a in random_model())
  for round_clients in rounds:
    losses = np.array(
        [oracles.softmax_regression_loss(w, b, x, y) for x, y in round_clients]
    )
    alphas = (
        np.ones(len(losses))
        if uniform
        else np.array([len(y) for _, y in round_clients], float)
    )
    eta = quantile_oracles.weighted_quantile(losses, 1 - theta, alphas)
    kept = losses > eta if strict else losses >= eta
    models = []
    for (x, y), keep in zip(round_clients, kept):
      if not keep:
        continue
      wk, bk = w.copy(), b.copy()
      for xb, yb in oracles.batches(x, y, BATCH, 1):
        gw, gb = oracles.softmax_regression_grads(wk, bk, xb, yb)
        wk = wk - LR * (gw + weight_decay * wk)
        bk = bk - LR * (gb + weight_decay * bk)
      models.append((wk, bk))
    a = alphas[kept] / alphas[kept].sum()
    w = sum(ai * m[0] for ai, m in zip(a, models))
    b = sum(ai * m[1] for ai, m in zip(a, models))
  return w, b


def test_keep_client_rule_and_its_slack():
  # ">=" against eta - slack (a secure estimate may lie slack above eta).
  assert delta_fl.keep_client(0.95, 1.0, strict=False, slack=0.1)
  assert not delta_fl.keep_client(0.85, 1.0, strict=False, slack=0.1)
  assert delta_fl.keep_client(1.0, 1.0, strict=False)
  assert not delta_fl.keep_client(0.999, 1.0, strict=False)
  # ">" ignores the slack.
  assert not delta_fl.keep_client(1.0, 1.0, strict=True, slack=0.1)
  assert delta_fl.keep_client(1.001, 1.0, strict=True)


@pytest.mark.parametrize(
    'theta, strict, uniform, decay',
    [
        (0.5, False, False, 0.0),
        (0.2, False, False, 0.0),
        (0.5, True, False, 0.0),
        (0.6, False, True, 0.01),
    ],
)
def test_matches_numpy_oracle_two_rounds(
    clients, theta, strict, uniform, decay
):
  rounds = [clients, clients[1:]]
  process = delta_fl.build_delta_fl(
      synthetic.create_softmax_regression_model_fn(),
      sgd(),
      theta=theta,
      strict_filter=strict,
      uniform_weights=uniform,
      weight_decay=decay,
  )
  state = start(process)
  for round_clients in rounds:
    out = process.next(state, datasets(round_clients))
    state = out.state
  w, b = composition.model_weights_as_numpy(process, state)
  w_ref, b_ref = delta_fl_oracle(
      rounds, theta, strict=strict, uniform=uniform, weight_decay=decay
  )
  np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)
  assert 0 < out.metrics['client_work']['fraction_kept'] < 1


def test_theta_one_is_fedavg(clients):
  model_fn = synthetic.create_softmax_regression_model_fn()
  results = []
  for process in (
      delta_fl.build_delta_fl(model_fn, sgd(), theta=1.0),
      fed_avg.build_fed_avg(model_fn, sgd()),
      tff.learning.algorithms.build_weighted_fed_avg(model_fn, sgd()),
  ):
    state = process.initialize()
    for round_clients in (clients, clients[:3]):
      state = process.next(state, datasets(round_clients, 2)).state
    results.append(composition.model_weights_as_numpy(process, state))
  for other in results[1:]:
    for a, b in zip(results[0], other):
      np.testing.assert_allclose(a, b, atol=1e-6)


MEANS = np.array([[0.0, 0.0], [1.5, 1.0], [4.0, 0.0]])  # Obtuse, scalene.


def mean_estimation_model_fn():
  """w in R^2 as the bias of a layer fed zeros; loss ||xi - w||^2 / 2."""
  spec = (
      tf.TensorSpec([None, 2], tf.float32),
      tf.TensorSpec([None, 2], tf.float32),
  )

  def model_fn():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(2,)),
            tf.keras.layers.Dense(2, kernel_initializer='zeros'),
        ]
    )
    return tff.learning.models.from_keras_model(
        model, loss=tf.keras.losses.MeanSquaredError(), input_spec=spec
    )

  return model_fn


def gaussian_clients(n=100):
  """Each client: mu_k + the same centred noise, so F_k = |w - mu_k|^2 + c."""
  noise = np.random.default_rng(0).normal(size=(n, 2))
  noise -= noise.mean(axis=0)
  return [
      tf.data.Dataset.from_tensor_slices(
          (np.zeros((n, 2), np.float32), (mu + noise).astype(np.float32))
      ).batch(n)
      for mu in MEANS
  ]


@pytest.mark.parametrize(
    'strict, expected',
    [
        (True, (MEANS[0] + MEANS[2]) / 2),  # Midpoint of the longest side.
        (False, MEANS.mean(axis=0)),  # ">=" keeps all three: the centroid.
    ],
)
def test_gaussian_mixture_illustration(strict, expected):
  process = delta_fl.build_delta_fl(
      mean_estimation_model_fn(),
      sgd(0.05),
      theta=2.0 / 3.0,
      strict_filter=strict,
      uniform_weights=True,
  )
  state = process.initialize()
  data = gaussian_clients()
  for _ in range(150):
    state = process.next(state, data).state
  w = process.get_model_weights(state).trainable[1]
  np.testing.assert_allclose(w, expected, atol=0.05)


def test_superquantile_objective_is_lower_at_the_delta_fl_solution():
  """The paper's claim: the worst conforming mixture is better off."""

  def losses(w):
    return np.sum((w - MEANS) ** 2, axis=1) + 2.0

  w1, w23 = MEANS.mean(axis=0), (MEANS[0] + MEANS[2]) / 2
  sq = lambda w: tail_metrics.superquantile(losses(w), 2.0 / 3.0)
  assert sq(w23) == pytest.approx(6.0)
  assert sq(w23) < sq(w1)
  rng = np.random.default_rng(0)
  pis = rng.dirichlet(np.ones(3), 20000)
  pis = pis[pis.max(axis=1) <= 0.5]
  assert (pis @ losses(w23)).max() < (pis @ losses(w1)).max()


@pytest.mark.parametrize(
    'kwargs, error',
    [
        (dict(theta=0.0), ValueError),
        (dict(theta=1.5), ValueError),
        (dict(theta='0.5'), TypeError),
        (dict(theta=0.5, weight_decay=-1.0), ValueError),
        (dict(theta=0.5, strict_filter=1), TypeError),
    ],
)
def test_validation(kwargs, error):
  with pytest.raises(error):
    delta_fl.build_delta_fl(
        synthetic.create_softmax_regression_model_fn(), sgd(), **kwargs
    )


# Algorithm 3: the client losses reach the server only through secure sums.


def secure_client_work(estimator):
  return delta_fl.build_delta_fl_client_work(
      synthetic.create_softmax_regression_model_fn(),
      sgd(),
      theta=0.5,
      quantile_estimator=estimator,
      strict_filter=True,
      metrics_aggregator=tff.learning.metrics.secure_sum_then_finalize,
  )


@pytest.mark.parametrize(
    'name, options',
    [
        ('bisection', dict(lower=0.0, upper=20.0, tolerance=1e-4)),
        ('mm', dict(num_iterations=5, lower=0.0, upper=20.0)),
    ],
)
def test_secure_variant_moves_client_values_only_through_secure_sums(
    name, options
):
  work = secure_client_work(
      quantiles.build_estimator(name, level=0.5, **options)
  )
  # The client work is where losses are computed: every CLIENTS -> SERVER
  # intrinsic in it must be a secure sum.
  uris = secure_checks.client_to_server_intrinsics(work.next)
  assert uris and set(uris) <= secure_checks.SECURE_URIS, uris
  assert not tree_analysis.find_unsecure_aggregation_in_tree(
      work.next.to_building_block()
  )
  # The only value per client that leaves it otherwise is the model delta
  # with its weight (ClientResult), aggregated by the model aggregator.
  result_type = work.next.type_signature.result.result
  assert result_type.placement == tff.CLIENTS
  assert isinstance(result_type.member, tff.StructType)


def test_exact_variant_is_not_secure_control():
  work = secure_client_work(quantiles.build_estimator('exact', level=0.5))
  assert tree_analysis.find_unsecure_aggregation_in_tree(
      work.next.to_building_block()
  )


def test_secure_bisection_run_equals_exact_run(clients):
  """Under TFF's test context, Algorithm 3 with bisection = the exact run."""
  tff.backends.test.set_sync_test_cpp_execution_context()
  try:
    results = []
    for estimator in (
        quantiles.build_estimator('exact', level=0.5),
        quantiles.build_estimator(
            'bisection', level=0.5, lower=0.0, upper=20.0, tolerance=1e-6
        ),
    ):
      process = delta_fl.build_delta_fl(
          synthetic.create_softmax_regression_model_fn(),
          sgd(),
          theta=0.5,
          quantile_estimator=estimator,
      )
      state = start(process)
      for round_clients in (clients, clients[1:]):
        state = process.next(state, datasets(round_clients)).state
      results.append(composition.model_weights_as_numpy(process, state))
  finally:
    tff.backends.native.set_sync_local_cpp_execution_context()
  for a, b in zip(*results):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_family_equals_its_members_run_separately(clients):
  """One run trains a model per level; each equals its own Delta-FL run."""
  model_fn = synthetic.create_softmax_regression_model_fn()
  thetas = (1.0, 0.5, 0.2)
  family = delta_fl.build_delta_fl_family(model_fn, sgd(), thetas=thetas)
  weights = family.get_model_weights(family.initialize())
  assert list(weights) == ['theta_1', 'theta_0.5', 'theta_0.2']
  state = family.set_model_weights(
      family.initialize(),
      collections.OrderedDict(
          (
              name,
              tff.learning.models.ModelWeights(
                  trainable=list(random_model()), non_trainable=w.non_trainable
              ),
          )
          for name, w in weights.items()
      ),
  )
  rounds = [clients, clients[1:]]
  for round_clients in rounds:
    out = family.next(state, datasets(round_clients))
    state = out.state
  assert set(out.metrics) == {'theta_1', 'theta_0.5', 'theta_0.2'}
  assert out.metrics['theta_1']['client_work']['fraction_kept'] == 1.0
  assert out.metrics['theta_0.2']['client_work']['fraction_kept'] < 1.0
  final = family.get_model_weights(state)
  for theta in thetas:
    w_ref, b_ref = delta_fl_oracle(rounds, theta)
    w, b = final[delta_fl.member_name(theta)].trainable
    np.testing.assert_allclose(w, w_ref, rtol=1e-4, atol=2e-6)
    np.testing.assert_allclose(b, b_ref, rtol=1e-4, atol=2e-6)


@pytest.mark.parametrize(
    'thetas, error',
    [
        ((), ValueError),
        ((0.5, 0.5), ValueError),
        ('0.5', TypeError),
        ((0.5, True), TypeError),
        ((0.5, 1.5), ValueError),
    ],
)
def test_family_validation(thetas, error):
  with pytest.raises(error):
    delta_fl.build_delta_fl_family(
        synthetic.create_softmax_regression_model_fn(), sgd(), thetas=thetas
    )


@pytest.mark.parametrize(
    'thetas, bad',
    [
        ((0.5, 1.5), '1.5'),  # Not only the first level is checked.
        ((0.5, 0.8, 0.0), '0.0'),
        ((1.5, 0.5), '1.5'),
        ((0.5, float('nan')), 'nan'),
    ],
)
def test_the_thetas_option_checks_every_level(thetas, bad):
  delta_fl.DeltaFlOptions(thetas=(0.5, 1.0)).validate()
  with pytest.raises(options_lib.OptionError) as raised:
    delta_fl.DeltaFlOptions(thetas=thetas).validate()
  assert str(raised.value) == f'thetas must be in (0, 1], got {bad}'
