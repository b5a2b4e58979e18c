"""Adding an aggregator is one module and one registry line.

The toy aggregator below, the weighted mean scaled by its option
`toy_agg_scale`, is declared in this file alone: its options, its factory
and its entry. Registered, it is an aggregator like the others: its flag is
in `--help`, a wrong value is refused in flag wording, another aggregator
refuses its option, and a run with it at scale 1 gives the per-client
numbers of the plain mean, at scale 0.5 others.

This module imports `run.train` only inside its tests: the binary's
launcher imports it, registers the toy, then imports the binary.
"""

import collections
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from run import algorithms
from tests import binary
from tff_algos import aggregators
from tff_algos import options as options_lib
from tff_algos.aggregators import stacked

NAME = 'toy_mean'


class ToyMeanFactory(stacked.StackedAggregationFactory):
  """`scale` times the weighted mean of the kept clients' updates."""

  def __init__(self, scale: float):  # pylint: disable=super-init-not-called
    self._scale = scale

  def aggregate(self, updates, weights):
    mean = tf.reduce_sum(updates * weights[:, None], 0) / tf.reduce_sum(weights)
    return self._scale * mean, self.empty_measurements()

  def empty_measurements(self):
    return collections.OrderedDict()


@dataclasses.dataclass(frozen=True)
class ToyMeanOptions(options_lib.AggregatorOptions):
  """The toy's one option."""

  toy_agg_scale: float = options_lib.option(
      1.0, 'Scale of the weighted mean.', low=0, high=10, low_open=True
  )


TOY = options_lib.Aggregator(
    name=NAME,
    options=ToyMeanOptions,
    build=lambda options: ToyMeanFactory(options.toy_agg_scale),
    summary='a scaled weighted mean',
)

# The training binary with the toy registered first (so its flag exists).
BINARY = 'run.train'
_LAUNCH = (
    'import importlib, sys; from tests import test_toy_aggregator as toy;'
    ' from tff_algos import aggregators; aggregators.register(toy.TOY);'
    f' train = importlib.import_module({BINARY!r}); sys.argv[0] = "train";'
    ' train.run_main()'
)
ARGS = [
    '--task=synthetic',
    '--num_clients=8',
    '--clients_per_round=4',
    '--client_batch_size=5',
    '--client_learning_rate=0.1',
    '--synthetic_size_law=table_4_4',
    '--total_rounds=2',
    '--rounds_per_eval=2',
    '--progress=false',
    '--eval_train_clients=false',
]


@pytest.fixture
def toy_registered():
  aggregators.register(TOY)
  yield
  aggregators.unregister(NAME)


def test_the_registered_toy_is_in_the_table(toy_registered):
  del toy_registered
  assert list(aggregators.AGGREGATORS)[-1] == NAME
  assert aggregators.option_owners()['toy_agg_scale'] == NAME
  with pytest.raises(ValueError, match='already registered'):
    aggregators.register(TOY)
  clash = dataclasses.replace(TOY, name='clash')
  with pytest.raises(ValueError, match='toy_agg_scale already declared'):
    aggregators.register(clash)


def test_an_entry_needs_an_aggregator_options_dataclass():
  with pytest.raises(TypeError, match='AggregatorOptions dataclass'):
    dataclasses.replace(TOY, options=options_lib.Options)


def test_the_toy_options_are_checked_in_flag_wording(toy_registered):
  del toy_registered
  cases = [
      (
          dict(aggregator=NAME, toy_agg_scale=20.0),
          '--toy_agg_scale must be in (0, 10], got 20.0',
      ),
      (
          dict(toy_agg_scale=2.0),
          '--toy_agg_scale applies to --aggregator=toy_mean, not mean',
      ),
      (
          dict(aggregator='krum', krum_num_byzantine=1, toy_agg_scale=2.0),
          '--toy_agg_scale applies to --aggregator=toy_mean, not krum',
      ),
  ]
  for kwargs, message in cases:
    spec = algorithms.AlgorithmSpec('fedavg', **kwargs)
    with pytest.raises(ValueError) as info:
      spec.validate()
    assert str(info.value) == message
  spec = algorithms.AlgorithmSpec('fedavg', aggregator=NAME, toy_agg_scale=0.5)
  spec.validate()
  factory = algorithms.model_aggregator(spec)
  assert isinstance(factory, ToyMeanFactory) and factory._scale == 0.5  # pylint: disable=protected-access
  assert spec.describe().endswith(', aggregator toy_mean (toy_agg_scale=0.5))')


def test_help_lists_the_toy_option():
  code, out, err = binary.run_code(_LAUNCH, ['--help'])
  assert code == 0, err[-2000:]
  text = ' '.join((out + err).split())
  assert 'Model aggregator: mean, geometric_median, ' in text
  assert 'clip, toy_mean (not mean:' in text
  assert '--toy_agg_scale: toy_mean: Scale of the weighted mean.' in text


def _clients_table(out_dir, name):
  path = out_dir / name / 'clients' / 'round_00002.csv'
  rows = [line.split(',') for line in path.read_text().splitlines()[1:]]
  return np.array([[float(v) for v in row[2:]] for row in rows])


def test_the_toy_at_scale_one_is_the_mean_and_its_scale_reaches_the_run(
    tmp_path,
):
  runs = {
      'mean': ['--aggregator=mean'],
      'toy1': [f'--aggregator={NAME}', '--toy_agg_scale=1'],
      'toy_half': [f'--aggregator={NAME}', '--toy_agg_scale=0.5'],
  }
  for name, flags in runs.items():
    code, _, err = binary.run_code(
        _LAUNCH,
        ARGS
        + flags
        + [f'--experiment_name={name}', f'--root_output_dir={tmp_path}'],
    )
    assert code == 0, err[-2000:]
  mean = _clients_table(tmp_path, 'mean')
  assert mean.shape == (8, 3)
  np.testing.assert_allclose(
      _clients_table(tmp_path, 'toy1'), mean, rtol=1e-5, atol=1e-6
  )
  assert np.abs(_clients_table(tmp_path, 'toy_half') - mean).max() > 1e-3
