"""Adding an algorithm changes no file of the package.

The toy algorithm below, FedAvg whose server step is scaled by its option
`toy_scale`, is declared in this file alone: its options, its round math
for the batched and stacked engines, its TFF builder and its registry
entry. Registered, it is a training-binary algorithm like the others: its
flag is in `--help`, a wrong value is refused in flag wording, another
algorithm refuses it, and the TFF path and both engines train it to the
same per-client numbers.
"""

import dataclasses

import numpy as np
import pytest
import tensorflow_federated as tff

from tests import binary
from tff_algos import client_work
from tff_algos import definition as definition_lib
from tff_algos import fed_avg
from tff_algos import options as options_lib
from tff_algos import registry

NAME = 'toy'


@dataclasses.dataclass(frozen=True)
class ToyOptions(options_lib.Options):
  """The toy's one option."""

  toy_scale: float = options_lib.option(
      1.0,
      'Toy: the server steps toy_scale times the mean update.',
      low=0.0,
      high=10.0,
      low_open=True,
  )

  def describe(self, settings: options_lib.RunSettings) -> str:
    del settings
    return f', scale={self.toy_scale:g}'


def _server_sgd(options: ToyOptions):
  return tff.learning.optimizers.build_sgdm(learning_rate=options.toy_scale)


def _definition(options: ToyOptions, context: options_lib.Context):
  return definition_lib.AlgorithmDefinition(
      name=NAME,
      client_result=client_work.weighted_delta_result(context.client_weighting),
      fixed_server_optimizer=_server_sgd(options),
  )


def _build(options: ToyOptions, model_fn, context: options_lib.Context):
  return fed_avg.build_fed_avg(
      model_fn,
      context.client_optimizer,
      _server_sgd(options),
      client_weighting=context.client_weighting,
      loop_implementation=context.loop_implementation,
  )


TOY = options_lib.Algorithm(
    name=NAME,
    options=ToyOptions,
    definition=_definition,
    builder=_build,
    tuned=options_lib.TunedOption(
        'toy_scale', grid=(0.25, 0.5, 1.0, 2.0, 4.0), low=0.1, high=10.0
    ),
)


def register() -> None:
  registry.register(TOY)


# The training binary with the toy registered first (so its flags exist).
_LAUNCH = (
    'import sys; from tests import test_toy_algorithm as toy; toy.register();'
    ' from run import train; sys.argv[0] = "train"; train.run_main()'
)
ARGS = [
    '--task=synthetic',
    '--num_clients=8',
    '--clients_per_round=4',
    '--client_batch_size=5',
    '--client_learning_rate=0.1',
    '--synthetic_size_law=table_4_4',
    '--algorithm=toy',
    '--toy_scale=0.5',
    '--total_rounds=3',
    '--rounds_per_eval=3',
    '--progress=false',
    '--eval_train_clients=false',
]


def run_binary(args, timeout=400):
  """`(returncode, stdout, stderr)` of the binary with the toy registered."""
  return binary.run_code(_LAUNCH, args, timeout)


@pytest.fixture
def toy_registered():
  register()
  yield
  registry.unregister(NAME)


def test_registered_toy_is_in_the_table(toy_registered):
  del toy_registered
  assert registry.names()[-1] == NAME
  assert registry.engine_names('stacked')[-1] == NAME
  assert registry.owners('toy_scale') == (NAME,)
  with pytest.raises(ValueError, match='already registered'):
    register()


def test_the_registered_toy_enters_the_benchmark_with_its_grid(toy_registered):
  # No benchmark file names it: the registry's traits do (label, tuned
  # option), and the plan runs its declared grid.
  del toy_registered
  from run.tail_benchmark import settings as benchmark_settings  # pylint: disable=g-import-not-at-top

  methods = {m.name: m for m in benchmark_settings.methods()}
  toy = methods[NAME]
  assert (toy.label, toy.knob, toy.grid) == (
      NAME,
      'toy_scale',
      (0.25, 0.5, 1.0, 2.0, 4.0),
  )
  assert (toy.low, toy.high) == (0.1, 10.0)
  names = list(methods)
  assert names.index(NAME) == names.index('fedcomed_plus') + 1
  assert names[-2:] == ['fedavg_ft', 'local']  # The baselines stay last.
  assert 'qfedsgd' not in methods  # Declared out of the benchmark.


def test_the_registered_toy_has_its_rows_in_the_generated_docs(toy_registered):
  # No docs file is edited by hand: the tables `tools.option_table --write`
  # writes (options in docs/usage.md, engines in docs/performance.md) gain
  # the toy's rows from its entry.
  del toy_registered
  from tools import option_table  # pylint: disable=g-import-not-at-top

  assert any(
      l.startswith('| `--toy_scale` | `toy` |')
      for l in option_table.table().splitlines()
  )
  rows = option_table.engine_table().splitlines()
  # FedAvg's engines and no notes: on FedAvg's row.
  assert any(l.startswith('| `fedavg`, ') and '`toy`' in l for l in rows), rows


def test_help_lists_the_toy_and_its_option():
  code, out, err = run_binary(['--help'])
  assert code == 0, err[-2000:]
  text = out + err
  assert 'fedcomed_plus, toy.' in ' '.join(text.split())
  assert (
      '--toy_scale: Toy: the server steps toy_scale times the mean update. '
      '[toy]' in ' '.join(text.split())
  )


def test_bad_toy_options_are_refused_in_flag_wording(tmp_path):
  code, _, err = run_binary(
      ARGS + ['--toy_scale=20', f'--root_output_dir={tmp_path}']
  )
  assert code == 2
  assert binary.error_lines(err) == [
      'train: error: --toy_scale must be in (0, 10], got 20.0'
  ]
  code, _, err = run_binary(
      ['--algorithm=fedavg', '--toy_scale=2', f'--root_output_dir={tmp_path}']
  )
  assert code == 2
  assert binary.error_lines(err) == [
      'train: error: --toy_scale applies to toy only, not fedavg'
  ]


def test_toy_trains_equally_on_tff_and_both_engines(tmp_path):
  tables = {}
  for engine in ('tff', 'batched', 'stacked'):
    code, _, err = run_binary(
        ARGS
        + [
            f'--simulation_engine={engine}',
            f'--experiment_name={engine}',
            f'--root_output_dir={tmp_path}',
        ]
    )
    assert code == 0, err[-2000:]
    assert 'algorithm: toy (client sgd lr=0.1, server sgd lr=1, scale=0.5)' in (
        err
    )
    path = tmp_path / engine / 'clients' / 'round_00003.csv'
    rows = [line.split(',') for line in path.read_text().splitlines()[1:]]
    tables[engine] = np.array([[float(v) for v in row[2:]] for row in rows])
  assert tables['tff'].shape == (8, 3)
  for engine in ('batched', 'stacked'):
    np.testing.assert_allclose(
        tables[engine], tables['tff'], rtol=1e-5, atol=1e-6, err_msg=engine
    )


def test_toy_scale_changes_the_training(tmp_path):
  """The option reaches the engines: another scale, other numbers."""
  tables = {}
  for scale in ('0.5', '2'):
    code, _, err = run_binary(
        ARGS
        + [
            f'--toy_scale={scale}',
            '--simulation_engine=batched',
            f'--experiment_name=s{scale}',
            f'--root_output_dir={tmp_path}',
        ]
    )
    assert code == 0, err[-2000:]
    path = tmp_path / f's{scale}' / 'clients' / 'round_00003.csv'
    tables[scale] = path.read_text()
  assert tables['0.5'] != tables['2']
