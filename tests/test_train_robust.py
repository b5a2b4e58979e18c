"""The training binary's robustness flags: one error line for bad input."""

import json

import pytest

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


@pytest.mark.parametrize(
    'args, message',
    [
        (
            [
                '--aggregator=krum',
                '--krum_num_byzantine=2',
                '--clients_per_round=5',
            ],
            'needs --clients_per_round > 2f + 2 = 6',
        ),
        (['--attack=gaussian'], 'attack gaussian needs a fraction'),
        (
            [
                '--algorithm=qffl',
                '--attack=model_replacement',
                '--attack_fraction=0.2',
            ],
            'not qffl',
        ),
    ],
)
def test_bad_robustness_flags_give_one_line(args, message, tmp_path):
  code, _, stderr = binary.run_train(
      SMALL + ['--total_rounds=2'] + args, tmp_path
  )
  lines = binary.error_lines(stderr)
  assert code == 2, stderr
  assert len(lines) == 1, stderr
  assert lines[0].startswith('train: error: ') and message in lines[0], stderr


def test_attacked_run_with_robust_aggregator(tmp_path):
  code, stdout, stderr = binary.run_train(
      SMALL
      + [
          '--total_rounds=2',
          '--rounds_per_eval=0',
          '--aggregator=geometric_median',
          '--attack=label_poison',
          '--attack_fraction=0.25',
          '--experiment_name=robust',
      ],
      tmp_path,
  )
  assert code == 0, stderr
  assert 'all_test/accuracy' in stdout
  with open(tmp_path / 'robust' / 'attack.json') as f:
    attack = json.load(f)
  assert attack['kind'] == 'label_poison' and len(attack['corrupted']) == 3
