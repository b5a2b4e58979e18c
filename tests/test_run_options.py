# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The training binary's flags come from declarations, into one tree.

Every flag of `run.train` but the three selectors (task, algorithm,
aggregator) is made from a declared option: the algorithms', the
aggregators', the tasks' and the run's parts (`run.algorithms.PARTS`,
`run.run_options.RUN_PARTS`); the values land in one `RunConfig`, and bad
values are refused in flag wording.
"""

import dataclasses
import json
import subprocess
import sys

from absl import flags
import pytest

from run import algorithms
from run import run_options
from run import simulation
from run import train
from tasks import registry as task_registry
from tff_algos import aggregators
from tff_algos import options as options_lib
from tff_algos import registry
from tests import binary

SELECTORS = {'task', 'algorithm', 'aggregator'}


@pytest.fixture
def parsed():
  def parse(*args):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(['train', *args])

  yield parse
  flags.FLAGS.unparse_flags()


def _declared_flags() -> set[str]:
  names = set(registry.all_options()) | set(task_registry.option_flags())
  for entry in aggregators.AGGREGATORS.values():
    names |= set(options_lib.fields_of(entry.options))
  for part in (*algorithms.PARTS.values(), *run_options.RUN_PARTS.values()):
    names |= {
        options_lib.flag_of(f) for f in options_lib.fields_of(part).values()
    }
  return names


def test_every_flag_but_the_selectors_is_declared():
  own = {
      f.name
      for f in flags.FLAGS.get_key_flags_for_module(sys.modules[train.__name__])
  }
  assert own - _declared_flags() == SELECTORS
  assert _declared_flags() <= own
  # A flag's default and help are its declaration's.
  for part in run_options.RUN_PARTS.values():
    for field in options_lib.fields_of(part).values():
      flag = flags.FLAGS[options_lib.flag_of(field)]
      default = field.default
      assert flag.default == (list(default) if default == () else default)
      assert flag.help == field.metadata['help']


def test_the_flags_fill_one_tree(parsed):
  parsed(
      '--algorithm=fedprox',
      '--proximal_strength=0.3',
      '--client_learning_rate=0.2',
      '--server_sgd_momentum=0.5',
      '--client_weighting=uniform',
      '--total_rounds=7',
      '--clients_per_round=3',
      '--data_seed=4',
      '--seed=5',
      '--holdout=validation',
      '--workers=a:1,b:2',
      '--experiment_name=run1',
      '--noprogress',
  )
  config = train.run_config()
  spec = config.algorithm
  assert (config.task, spec.name, spec.options.proximal_strength) == (
      'synthetic',
      'fedprox',
      0.3,
  )
  assert spec.optimization == dataclasses.replace(
      spec.optimization.__class__(),
      client_learning_rate=0.2,
      server_momentum=0.5,
      client_weighting='uniform',
  )
  assert (config.schedule.total_rounds, config.schedule.task_seed) == (7, 4)
  assert config.data.holdout == 'validation'
  assert config.execution.workers == ('a:1', 'b:2')
  assert config.output.folder_name('synthetic', 'fedprox', 5) == 'run1'
  assert not config.output.progress
  # The simulation's config takes every field of the schedule it shares.
  sim = config.schedule.simulation_config(drop_stragglers=True)
  shared = {f.name for f in dataclasses.fields(simulation.SimulationConfig)}
  for name, value in dataclasses.asdict(config.schedule).items():
    if name in shared:
      assert getattr(sim, name) == value, name
  assert sim.drop_stragglers and sim.clients_per_round == 3


@pytest.mark.parametrize(
    'args,message',
    [
        (
            ['--total_rounds=0'],
            '--total_rounds must be in [1, 1,000,000], got 0',
        ),
        (['--client_sampling=zz'], "unknown --client_sampling='zz'"),
        (
            ['--simulation_engine=batched', '--workers=a:1'],
            '--simulation_engine=batched runs in this process; it cannot use '
            '--workers',
        ),
        (
            ['--stacked_size_groups'],
            '--stacked_size_groups applies to --simulation_engine=stacked '
            'only, got --simulation_engine=tff',
        ),
        (
            [
                '--holdout=test',
                '--holdout_validation_fraction=0.5',
                '--holdout_test_fraction=0.5',
            ],
            '--holdout_validation_fraction + --holdout_test_fraction must be '
            '< 1, got 0.5 + 0.5',
        ),
        (['--experiment_name=a/b'], '--experiment_name must be a plain'),
        (['--root_output_dir='], '--root_output_dir must name a folder'),
        (['--max_concurrent_computation_calls=-2'], 'must be >= -1, got -2'),
    ],
)
def test_bad_run_values_are_refused_in_flag_wording(parsed, args, message):
  parsed(*args)
  with pytest.raises(run_options.UsageError) as error:
    train.run_config()
  assert message in str(error.value)


def test_optimizer_values_are_refused_in_flag_wording(parsed):
  for args, message in [
      (['--server_sgd_momentum=1'], '--server_sgd_momentum must be in [0, 1)'),
      (
          ['--server_optimizer=dp2', '--server_sgd_momentum=0.5'],
          '--server_sgd_momentum does not apply to dp2',
      ),
      (['--client_optimizer=lbfgs'], "unknown --client_optimizer='lbfgs'"),
  ]:
    parsed(*args)
    with pytest.raises(ValueError) as error:
      train.run_config().algorithm.validate()
    assert message in str(error.value), args


def test_python_dash_m_keeps_every_declared_flag(tmp_path):
  """Under `python -m run.train` (module `__main__`) the declared options'
  flags are the binary's own: listed by --help and saved in config.json, so
  resuming with another value is refused (they were filed under '__main__'
  while absl looks up sys.argv[0]: --help listed 3 flags, and config.json
  held 3 settings)."""
  run = [sys.executable, '-m', 'run.train', '--progress=false']
  out = subprocess.run(
      run + ['--help'],
      cwd=binary.ROOT,
      capture_output=True,
      text=True,
      check=False,
  ).stdout
  for flag in ('--total_rounds', '--ditto_lambda', '--synthetic_size_law'):
    assert f'  {flag}:' in out, flag
  args = [
      '--task=synthetic',
      '--num_clients=8',
      '--clients_per_round=2',
      '--total_rounds=1',
      f'--root_output_dir={tmp_path}',
      '--experiment_name=a',
  ]
  first = subprocess.run(
      run + args, cwd=binary.ROOT, capture_output=True, text=True, check=False
  )
  assert first.returncode == 0, first.stderr
  config = json.loads((tmp_path / 'a' / 'config.json').read_text())
  assert config['client_learning_rate'] == 0.01 and 'total_rounds' in config
  again = subprocess.run(
      run + args + ['--client_learning_rate=0.2'],
      cwd=binary.ROOT,
      capture_output=True,
      text=True,
      check=False,
  )
  assert again.returncode != 0
  assert 'client_learning_rate: 0.01 -> 0.2' in again.stderr, again.stderr
