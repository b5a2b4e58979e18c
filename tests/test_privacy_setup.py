"""DP in the training binary: flag validation, calibration, epsilon outputs."""

import csv
import json

import dp_accounting
import numpy as np
import pytest

from run import algorithms
from run import privacy_setup
from run import simulation
from tests import binary

SMALL = [
    '--task=synthetic',
    '--num_clients=12',
    '--synthetic_size_law=constant',
    '--clients_per_round=4',
    '--client_batch_size=5',
    '--client_learning_rate=0.05',
    '--seed=3',
    '--progress=false',
]


def spec(**kw):
  base = dict(
      name='fedavg', client_weighting='uniform', clip=1.0, noise_multiplier=1.0
  )
  base.update(kw)
  return algorithms.AlgorithmSpec(**base)


@pytest.mark.parametrize(
    'kw, message',
    [
        (dict(name='qffl', q=1.0), 'aggregate a mean'),
        (dict(name='term', tilt=1.0), 'aggregate a mean'),
        (dict(name='afl'), 'aggregate a mean'),
        (dict(client_weighting='num_examples'), 'uniform client weighting'),
        (dict(clip=0.0), '--noise_multiplier needs DP aggregation'),
        (
            dict(clip=0.0, noise_multiplier=0.0, adaptive_clip=True),
            '--adaptive_clip needs DP',
        ),
        (dict(clip=-1.0), '--clip must be >= 0'),
        (
            dict(adaptive_clip=True, target_unclipped_quantile=1.5),
            'target_unclipped_quantile',
        ),
        (dict(name='deltafl', theta=0.5), 'pass --uniform_weights'),
        (
            dict(name='deltafl', theta=0.5, uniform_weights=True),
            'needs a private quantile',
        ),
        (dict(server_optimizer='dp2', dp2_sgd_steps=0), 'sgd_steps'),
        (
            dict(target_epsilon=3.0),
            '^pass either --noise_multiplier or --target_epsilon, not both$',
        ),
        (
            dict(clip=0.0, noise_multiplier=0.0, target_epsilon=3.0),
            '^--target_epsilon needs DP aggregation: pass --clip > 0$',
        ),
        (
            dict(clip=0.0, noise_multiplier=0.0, dp_delta=1e-3),
            '^--dp_delta needs DP aggregation',
        ),
        (dict(dp_delta=1.0), r'^--dp_delta must be in \[0, 1\), got 1.0$'),
        (
            dict(dp2_beta=0.5),
            '^--dp2_beta applies to --server_optimizer=dp2, not sgd$',
        ),
        (dict(server_optimizer='dp2', dp2_beta=1.0), '--dp2_beta must be in'),
        (dict(server_optimizer='dp2', server_momentum=0.9), 'does not apply'),
    ],
)
def test_bad_dp_options_are_refused(kw, message):
  with pytest.raises(ValueError, match=message):
    spec(**kw).validate()


def test_prepare_dp_refusals_and_calibration():
  config = simulation.SimulationConfig(total_rounds=20, clients_per_round=5)
  with pytest.raises(ValueError, match='sampling proportional'):
    privacy_setup.prepare_dp(
        spec(),
        simulation.SimulationConfig(
            total_rounds=20, clients_per_round=5, client_sampling='examples'
        ),
        50,
    )
  with pytest.raises(ValueError, match='not private'):
    privacy_setup.prepare_dp(spec(noise_multiplier=0.0), config, 50)
  calibrated, tracker = privacy_setup.prepare_dp(
      spec(noise_multiplier=0.0, target_epsilon=3.0, dp_delta=1e-3),
      config,
      50,
  )
  assert 0 < calibrated.privacy.noise_multiplier < 10
  assert calibrated.privacy.target_epsilon == 0  # The noise it runs with.
  assert tracker.epsilon_rdp(20) == pytest.approx(3.0, abs=0.01)
  assert tracker.epsilon_rdp(20) <= 3.0
  # Delta defaults to 1 / N.
  _, tracker = privacy_setup.prepare_dp(spec(), config, 50)
  assert tracker.delta == 1 / 50


def test_binary_refuses_dp_with_qffl_in_one_line(tmp_path):
  code, _, stderr = binary.run_train(
      SMALL
      + [
          '--total_rounds=2',
          '--algorithm=qffl',
          '--q=1',
          '--clip=1',
          '--noise_multiplier=1',
      ],
      tmp_path,
  )
  lines = [line for line in stderr.splitlines() if line.strip()]
  assert code == 2 and len(lines) == 1, stderr
  assert lines[0].startswith('train: error: DP aggregation (--clip) applies')


def test_binary_writes_epsilon_per_round_and_in_the_summary(tmp_path):
  args = SMALL + [
      '--total_rounds=3',
      '--algorithm=fedavg',
      '--client_weighting=uniform',
      '--clip=0.5',
      '--noise_multiplier=1.2',
      '--client_sampling=poisson',
      '--dp_delta=1e-3',
      '--rounds_per_eval=0',
      '--eval_train_clients=false',
      '--experiment_name=dp',
  ]
  code, stdout, stderr = binary.run_train(args, tmp_path)
  assert code == 0, stderr
  with open(tmp_path / 'dp' / 'metrics.csv') as f:
    rows = list(csv.DictReader(f))
  # Independent: Poisson q = 4 / 12, Gaussian 1.2, RDP, add-or-remove.
  for row in rows:
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(
        dp_accounting.PoissonSampledDpEvent(
            4 / 12, dp_accounting.GaussianDpEvent(1.2)
        ),
        int(row['round_num']),
    )
    assert float(row['dp/epsilon']) == pytest.approx(
        acc.get_epsilon(1e-3), rel=1e-9
    )
  with open(tmp_path / 'dp' / 'summary.json') as f:
    extra = json.load(f)['extra']
  assert extra['dp/epsilon'] == pytest.approx(float(rows[-1]['dp/epsilon']))
  pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  pld.compose(
      dp_accounting.PoissonSampledDpEvent(
          4 / 12, dp_accounting.GaussianDpEvent(1.2)
      ),
      3,
  )
  assert extra['dp/epsilon_pld'] == pytest.approx(
      pld.get_epsilon(1e-3), rel=1e-6
  )
  assert 'dp/epsilon:' in stdout


def test_poisson_client_sampling_is_seeded_and_has_rate_m_over_n():
  ids = [str(i) for i in range(200)]
  sizes = [
      len(
          simulation.sample_clients(
              ids, r, clients_per_round=20, seed=1, scheme='poisson'
          )
      )
      for r in range(1, 301)
  ]
  assert np.mean(sizes) == pytest.approx(20, rel=0.05)
  assert len(set(sizes)) > 5  # The number varies, as Poisson sampling does.
  again = simulation.sample_clients(
      ids, 7, clients_per_round=20, seed=1, scheme='poisson'
  )
  assert again == simulation.sample_clients(
      ids, 7, clients_per_round=20, seed=1, scheme='poisson'
  )


def test_deltafl_with_dp_counts_its_private_quantile():
  s = spec(
      name='deltafl',
      client_weighting='num_examples',  # It weighs by uniform_weights.
      theta=0.5,
      uniform_weights=True,
      secure_quantile='private',
      quantile_noise_stddev=1.5,
      quantile_iterations=4,
      dp_delta=1e-3,
  )
  s.validate()
  estimator = algorithms.quantile_estimator(s, clients_per_round=10)
  assert estimator.noise_stddev == 1.5
  assert estimator.expected_num_clients == 10.0
  config = simulation.SimulationConfig(
      total_rounds=5, clients_per_round=10, client_sampling='poisson'
  )
  _, tracker = privacy_setup.prepare_dp(s, config, 100)
  assert tracker.mechanism.gaussian_multipliers == [1.0, 3.0, 3.0, 3.0, 3.0]
  composed = dp_accounting.ComposedDpEvent(
      [dp_accounting.GaussianDpEvent(1.0)]
      + [dp_accounting.GaussianDpEvent(3.0)] * 4
  )
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(dp_accounting.PoissonSampledDpEvent(0.1, composed), 5)
  assert tracker.epsilon_rdp(5) == pytest.approx(
      acc.get_epsilon(1e-3), rel=1e-9
  )


def test_ditto_global_model_takes_the_dp_mean():
  """Ditto's global model through the DP aggregator: with no noise and a
  large clip it is Ditto's uniform mean; a tiny clip changes it."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tasks import synthetic  # pylint: disable=g-import-not-at-top
  from tff_algos import composition  # pylint: disable=g-import-not-at-top
  from tff_algos import ditto  # pylint: disable=g-import-not-at-top

  model_fn = synthetic.create_softmax_regression_model_fn()
  rng = np.random.default_rng(5)
  data = [
      tf.data.Dataset.from_tensor_slices(
          (
              rng.normal(size=(n, 60)).astype(np.float32),
              rng.integers(0, 10, n).astype(np.int32),
          )
      ).batch(5)
      for n in (7, 9, 12)
  ]

  def one_round(process):
    initial = [process.initial_client_state() for _ in data]
    out = process.next(process.initialize(), data, initial)
    return composition.model_weights_as_numpy(process, out.state)

  reference = one_round(
      ditto.build_ditto(
          model_fn,
          tff.learning.optimizers.build_sgdm(
              learning_rate=spec().optimization.client_learning_rate
          ),
          lam=0.5,
          client_weighting=tff.learning.ClientWeighting.UNIFORM,
      )
  )
  results = {}
  for clip in (1e6, 1e-3):
    results[clip] = one_round(
        algorithms.build_process(
            spec(
                name='ditto', ditto_lambda=0.5, clip=clip, noise_multiplier=0.0
            ),
            model_fn,
            clients_per_round=3,
        )
    )
  for a, b in zip(results[1e6], reference):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  assert not np.allclose(results[1e-3][0], reference[0], atol=1e-5)


def test_the_binary_makes_its_privacy_and_attack_flags_from_declarations(
    tmp_path,
):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from run import train  # pylint: disable=g-import-not-at-top,unused-import
  from tff_algos import options as options_lib  # pylint: disable=g-import-not-at-top

  del train  # Imported for its flags.
  for part in algorithms.PARTS.values():
    for name, field in options_lib.fields_of(part).items():
      flag = flags.FLAGS[options_lib.flag_of(field)]
      assert flag.default == field.default, name
      assert flag.help == field.metadata['help'], name
  assert flags.FLAGS['server_sgd_momentum'].default == 0.0
  # A DP^2 flag without DP^2's server optimizer is refused, not ignored.
  code, _, stderr = binary.run_train(
      SMALL + ['--total_rounds=1', '--dp2_beta=0.5'], tmp_path
  )
  assert code == 2
  assert binary.error_lines(stderr) == [
      'train: error: --dp2_beta applies to --server_optimizer=dp2, not sgd'
  ]
