"""Adding a task is one module and one registry line; tasks read their flags.

The toy task below is declared in this file alone: its options (one flag of
its own, `toy_clients`, and the shared `test_clients_fraction`), its builder
and its entry. Registered, it is a training-binary task like the others: its
flag is in `--help`, a wrong value is refused in flag wording, another task
refuses its flag, and the binary trains on it. The registered tasks' own
flags give exactly the builder arguments they gave before the declarations
(a program's saved settings compare them on resume).

This module imports `run.train` only inside its tests: the binary's
launcher imports it, registers the toy, then imports the binary.
"""

import dataclasses

from absl import flags
import pytest

from tasks import options as task_options
from tasks import registry
from tasks import synthetic
from tests import binary

NAME = 'toy_task'


@dataclasses.dataclass(frozen=True)
class ToyTaskOptions(task_options.TaskOptions):
  """The toy task's options."""

  clients: int = task_options.option(
      6, 'Toy task: number of clients.', low=2, flag='toy_clients'
  )
  test_clients_fraction: float = task_options.unseen_clients_option()


def _create(*, clients, test_clients_fraction, seed, batch_size):
  task = synthetic.create_task(
      num_clients=clients,
      size_law='constant',
      constant_size=20,
      test_clients_fraction=test_clients_fraction,
      seed=seed,
      batch_size=batch_size,
  )
  return dataclasses.replace(task, name=NAME, description='toy task')


TOY_TASK = task_options.Task(
    name=NAME,
    data='20 synthetic examples a client',
    model='softmax regression',
    options=ToyTaskOptions,
    create=_create,
)

# The training binary with the toy task registered first (its flags exist).
_LAUNCH = (
    'import sys; from tests import test_toy_task as toy;'
    ' from tasks import registry; registry.register(toy.TOY_TASK);'
    ' from run import train; sys.argv[0] = "train"; train.run_main()'
)


@pytest.fixture
def toy_registered():
  registry.register(TOY_TASK)
  yield
  registry.unregister(NAME)


def test_the_registered_toy_task_is_in_the_table(toy_registered):
  del toy_registered
  assert registry.TASK_NAMES[-1] == NAME
  flag = registry.option_flags()['toy_clients']
  assert (flag.kind, flag.default, flag.owners) == (int, 6, (NAME,))
  assert NAME in registry.option_flags()['test_clients_fraction'].owners
  assert registry.table().splitlines()[-1].startswith(f'| `{NAME}`')
  with pytest.raises(ValueError, match='already registered'):
    registry.register(TOY_TASK)


def test_a_flag_declared_with_two_types_is_refused():
  @dataclasses.dataclass(frozen=True)
  class Clash(task_options.TaskOptions):
    num_clients: float = task_options.option(1.0, 'Clients, as a float.')

  clash = dataclasses.replace(TOY_TASK, name='clash', options=Clash)
  with pytest.raises(ValueError, match='--num_clients with different types'):
    registry.register(clash)
  assert 'clash' not in registry.TASKS


def test_an_entry_needs_a_task_options_dataclass():
  with pytest.raises(TypeError, match='TaskOptions dataclass'):
    dataclasses.replace(TOY_TASK, options=dict)


def test_the_docstring_table_is_the_registry_table():
  assert registry.table() in registry.__doc__
  assert len(registry.table().splitlines()) == 2 + len(registry.TASKS)


def test_every_task_option_is_a_flag_with_its_declaration():
  from run import train  # pylint: disable=g-import-not-at-top

  declared = registry.option_flags()
  assert set(train._TASK_FLAGS) == set(declared)  # pylint: disable=protected-access
  for name, flag in declared.items():
    assert flags.FLAGS[name].default == flag.default, name
    assert flags.FLAGS[name].help.endswith(f'[{", ".join(flag.owners)}]') or (
        name == 'num_clients'
    ), name
  assert flags.FLAGS['num_clients'].help == (
      'Number of clients. [synthetic, synthetic_iid, fedplus_regression; '
      'fedplus_regression: default 10]'
  )


# The builder arguments each flag set gave before the tasks declared their
# options (`run.train.task_kwargs` of the commit before; a program's saved
# settings hold them).
_KWARGS = [
    (
        ['--task=synthetic', '--synthetic_validation_fraction=0.1'],
        dict(
            seed=0,
            batch_size=10,
            num_clients=100,
            alpha=1.0,
            beta=1.0,
            size_law='fedprox',
            test_fraction=0.2,
            test_clients_fraction=0.0,
            validation_fraction=0.1,
        ),
    ),
    (
        ['--task=synthetic_iid', '--num_clients=12', '--seed=3'],
        dict(
            seed=3,
            batch_size=10,
            num_clients=12,
            alpha=1.0,
            beta=1.0,
            size_law='fedprox',
            test_fraction=0.2,
            test_clients_fraction=0.0,
        ),
    ),
    (['--task=fedplus_regression'], dict(seed=0, batch_size=10)),
    (
        ['--task=fedplus_regression', '--num_clients=5'],
        dict(seed=0, batch_size=10, num_parties=5),
    ),
    (
        ['--task=emnist_character', '--use_synthetic_data', '--only_digits'],
        dict(
            seed=0,
            batch_size=10,
            data_dir=None,
            use_synthetic_data=True,
            min_examples=0,
            test_clients_fraction=0.0,
            max_clients=None,
            model='cnn_dropout',
            only_digits=True,
        ),
    ),
    (
        ['--task=stackoverflow_tag', '--data_dir=/d', '--max_clients=7'],
        dict(
            seed=0,
            batch_size=10,
            data_dir='/d',
            use_synthetic_data=False,
            min_examples=0,
            test_clients_fraction=0.0,
            max_clients=7,
        ),
    ),
    (
        [
            '--task=shakespeare_leaf',
            '--data_dir=/d',
            '--data_seed=5',
            '--seed=101',
            '--rnn_units=64',
        ],
        dict(
            seed=5,
            batch_size=10,
            preset='deltafl',
            data_dir='/d',
            use_synthetic_data=False,
            max_clients=None,
            max_examples_per_client=None,
            rnn_units=64,
            model_seed=101,
        ),
    ),
    (
        ['--task=leaf', '--leaf_dir=/x', '--leaf_vocab_size=5'],
        dict(
            seed=0,
            batch_size=10,
            leaf_dir='/x',
            leaf_dataset=None,
            min_examples=0,
            test_clients_fraction=0.0,
            max_clients=None,
            model=None,
            lstm_units=None,
            vocab_size=5,
        ),
    ),
]


@pytest.mark.parametrize('args,expected', _KWARGS)
def test_the_flags_give_the_builder_arguments_they_gave(args, expected):
  from run import train  # pylint: disable=g-import-not-at-top

  try:
    flags.FLAGS(['train', *args])
    assert train.task_kwargs() == expected
  finally:
    flags.FLAGS.unparse_flags()


def test_help_lists_the_toy_task_and_its_option():
  code, out, err = binary.run_code(_LAUNCH, ['--help'])
  assert code == 0, err[-2000:]
  text = ' '.join((out + err).split())
  assert f'leaf, {NAME}.' in text
  assert '--toy_clients: Toy task: number of clients. [toy_task]' in text


def test_toy_task_flags_are_refused_in_flag_wording(tmp_path):
  code, _, err = binary.run_code(
      _LAUNCH,
      [f'--task={NAME}', '--toy_clients=1', f'--root_output_dir={tmp_path}'],
  )
  assert code == 2
  assert binary.error_lines(err) == [
      'train: error: --toy_clients must be >= 2, got 1'
  ]
  code, _, err = binary.run_code(
      _LAUNCH,
      ['--task=synthetic', '--toy_clients=4', f'--root_output_dir={tmp_path}'],
  )
  assert code == 2
  assert binary.error_lines(err) == [
      'train: error: --toy_clients applies to --task=toy_task, not '
      '--task=synthetic'
  ]


def test_the_binary_trains_on_the_toy_task(tmp_path):
  code, _, err = binary.run_code(
      _LAUNCH,
      [
          f'--task={NAME}',
          '--toy_clients=4',
          '--clients_per_round=2',
          '--total_rounds=1',
          '--rounds_per_eval=1',
          '--progress=false',
          '--eval_train_clients=false',
          '--experiment_name=toy',
          f'--root_output_dir={tmp_path}',
      ],
  )
  assert code == 0, err[-2000:]
  rows = (tmp_path / 'toy' / 'clients' / 'round_00001.csv').read_text()
  assert len(rows.splitlines()) == 1 + 4  # The header and the 4 clients.
