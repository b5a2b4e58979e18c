"""The training binary with Ditto and the Fed+ family: options and a run."""

import json

import pytest

from run import algorithms
from tests import binary

SMALL = [
    '--task=synthetic',
    '--num_clients=12',
    '--synthetic_size_law=constant',
    '--clients_per_round=4',
    '--client_batch_size=5',
    '--client_learning_rate=0.05',
    '--rounds_per_eval=4',
    '--seed=3',
    '--progress=false',
]


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(name='ditto'), 'needs --ditto_lambda'),
        (
            dict(name='ditto', ditto_lambda=1.0, ditto_lambda_grid=(0.1, 1.0)),
            'not both',
        ),
        (dict(name='ditto', ditto_lambda=-1.0), 'lambda must be'),
        (dict(name='ditto', ditto_lambda_grid=(0.1, 0.1)), 'duplicates'),
        (
            dict(name='ditto', ditto_lambda=1.0, ditto_personal_steps=-2),
            'ditto_personal_steps',
        ),
        (dict(name='fedavg', ditto_lambda=1.0), 'applies to ditto only'),
        (dict(name='fedavg', ditto_lambda=0.0), 'applies to ditto only'),
        (
            dict(name='ditto', ditto_lambda=1.0, fedplus_sigma=1.0),
            'applies to fedavg_plus',
        ),
        (dict(name='fedgeomed_plus'), 'needs --fedplus_sigma'),
        (dict(name='fedcomed_plus', fedplus_sigma=-1.0), 'fedplus_sigma'),
        (
            dict(name='fedavg_plus', fedplus_sigma=1.0, fedplus_lambda=2.0),
            'fedplus_lambda',
        ),
        (
            dict(name='fedavg_plus', fedplus_sigma=1.0, fedplus_iterations=0),
            'fedplus_iterations',
        ),
        (
            dict(
                name='fedavg_plus', fedplus_sigma=1.0, client_optimizer='adam'
            ),
            'must be sgd',
        ),
        (
            dict(
                name='fedavg_plus', fedplus_sigma=1.0, server_learning_rate=0.5
            ),
            'has no server optimizer .its server step: the new global model',
        ),
    ],
)
def test_spec_validation(kwargs, message):
  with pytest.raises(ValueError, match=message):
    algorithms.AlgorithmSpec(**kwargs).validate()


def test_describe_reports_kappa():
  spec = algorithms.AlgorithmSpec(
      name='fedgeomed_plus', fedplus_sigma=100.0, client_learning_rate=1e-4
  )
  spec.validate()
  assert 'kappa=0.990099' in spec.describe()
  assert algorithms.AlgorithmSpec(
      name='ditto', ditto_lambda_grid=(0.1, 1.0)
  ).options.lambdas == (0.1, 1.0)


def test_binary_runs_fed_plus_with_disk_store_and_refuses_bad_input(tmp_path):
  code, stdout, stderr = binary.run_train(
      SMALL
      + [
          '--total_rounds=2',
          '--algorithm=fedcomed_plus',
          '--fedplus_sigma=1',
          '--fedplus_iterations=3',
          '--client_state_store=disk',
          '--experiment_name=plus',
      ],
      tmp_path,
  )
  assert code == 0, stderr
  assert 'personal/test/accuracy' in stdout
  summary = json.loads((tmp_path / 'plus' / 'summary.json').read_text())
  assert 'personal/test/loss' in summary['summaries']
  assert (
      tmp_path / 'plus' / 'client_states' / 'snapshots' / '00000002'
  ).exists()
  for args, message in (
      (['--algorithm=ditto', '--ditto_lambda_grid=0.1,1'], 'validation data'),
      (['--algorithm=ditto', '--ditto_lambda_grid=0.1,x'], 'comma-separated'),
      (['--client_state_store=disk'], 'apply to ditto and the Fed+'),
  ):
    code, _, stderr = binary.run_train(
        SMALL + ['--total_rounds=2'] + args, tmp_path
    )
    lines = binary.error_lines(stderr)
    assert code == 2, stderr
    assert len(lines) == 1 and lines[0].startswith('train: error: '), stderr
    assert message in lines[0], stderr
