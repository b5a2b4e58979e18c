"""run.algorithms: aggregator and attack options are validated and built."""

import pytest
import tensorflow_federated as tff

from run import algorithms
from run import simulation
from tasks import synthetic
from tff_algos import aggregators
from tff_algos import attacks
from tff_algos import registry
from tff_algos import stateful


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(aggregator='average'), "unknown --aggregator='average'"),
        (
            dict(name='qffl', aggregator='krum', krum_num_byzantine=1),
            'applies to fedavg, fedprox, term, deltafl, ditto, not qffl',
        ),
        (
            dict(gm_passes=3),
            '--gm_passes applies to --aggregator=geometric_median',
        ),
        (
            dict(aggregator='krum', trim_fraction=0.1),
            '--trim_fraction applies to --aggregator=trimmed_mean',
        ),
        (
            dict(aggregator='clip'),
            '--aggregator=clip needs exactly one of --clip_norm (fixed) and '
            '--clip_target_quantile (adaptive)',
        ),
        (
            dict(aggregator='clip', clip_norm=1.0, clip_target_quantile=0.5),
            'exactly one of --clip_norm',
        ),
        (dict(aggregator='clip', clip_norm=0.0), '--clip_norm must be > 0'),
        (
            dict(aggregator='krum'),
            '--aggregator=krum needs --krum_num_byzantine',
        ),
        (
            dict(aggregator='krum', krum_num_byzantine=1, krum_num_selected=0),
            '--krum_num_selected must be >= 1, got 0',
        ),
        (
            dict(aggregator='trimmed_mean', trim_fraction=0.5),
            '--trim_fraction must be in [0, 0.5), got 0.5',
        ),
        (
            dict(aggregator='geometric_median', gm_passes=-1),
            '--gm_passes must be >= 0, got -1',
        ),
        (dict(attack='flip'), "unknown --attack='flip'"),
        (dict(name='afl', attack='gaussian'), 'not afl'),
        (
            dict(attack='label_poison', attack_scale=2.0),
            '--attack_scale applies to --attack=gaussian',
        ),
        (dict(attack='gaussian', attack_scale=-1.0), 'sigma must be > 0'),
    ],
)
def test_bad_options_are_refused(kwargs, message):
  spec = algorithms.AlgorithmSpec(**{'name': 'fedavg', **kwargs})
  with pytest.raises(ValueError, match='') as info:
    spec.validate()
  assert message in str(info.value)


@pytest.mark.parametrize(
    'kwargs, factory_type',
    [
        (dict(), type(None)),
        (
            dict(aggregator='geometric_median', gm_passes=5),
            aggregators.GeometricMedianFactory,
        ),
        (
            dict(aggregator='coordinate_median'),
            aggregators.CoordinateMedianFactory,
        ),
        (dict(aggregator='trimmed_mean'), aggregators.TrimmedMeanFactory),
        (
            dict(aggregator='krum', krum_num_byzantine=2),
            aggregators.KrumFactory,
        ),
        (
            dict(aggregator='clip', clip_norm=2.0),
            tff.aggregators.WeightedAggregationFactory,
        ),
    ],
)
def test_factories(kwargs, factory_type):
  spec = algorithms.AlgorithmSpec(name='fedavg', **kwargs)
  spec.validate()
  assert isinstance(algorithms.model_aggregator(spec), factory_type)


def test_update_attack_defaults_and_process_marker():
  spec = algorithms.AlgorithmSpec(
      name='fedprox',
      attack='model_replacement',
      server_learning_rate=0.5,
      aggregator='coordinate_median',
  )
  attack = algorithms.update_attack(spec, clients_per_round=10)
  assert attack == attacks.UpdateAttack('model_replacement', -20.0)
  assert (
      algorithms.update_attack(
          algorithms.AlgorithmSpec(name='fedavg', attack='label_poison'),
          clients_per_round=10,
      )
      is None
  )
  process = algorithms.build_process(
      spec, synthetic.create_softmax_regression_model_fn(), clients_per_round=10
  )
  assert attacks.needs_attack_marker(process)
  assert 'aggregator coordinate_median, attack model_replacement' in (
      spec.describe()
  )


@pytest.mark.parametrize('name', registry.names())
def test_the_client_index_trait_is_the_processs(name):
  # `Algorithm.client_index` refuses a program before anything is built;
  # it must say what the built process's client data carry.
  entry = registry.get(name)
  process = algorithms.build_process(
      algorithms.AlgorithmSpec(name, **entry.example),
      synthetic.create_softmax_regression_model_fn(),
      num_clients=4,
      clients_per_round=4,
  )
  if stateful.is_stateful(process):
    assert not entry.client_index
    return
  assert simulation.needs_client_index(process) == entry.client_index
