"""The papers' fairness direction on a small Synthetic(1,1) run.

A scaled-down version of the comparison recorded in docs/results (thesis
Table 4.5 setting: Synthetic(1,1), lr 0.1, batch 10, one local epoch, clients
sampled proportionally to their data): q-FFL with q = 1 lowers the variance
of per-client test accuracy and raises the worst-10% accuracy over q = 0,
and TERM with t = 1 does the same over t = 0.
"""

import pytest
import tensorflow_federated as tff

from run import simulation
from tasks import synthetic
from tff_algos import q_ffl
from tff_algos import term

ROUNDS = 150


@pytest.fixture(scope='module')
def task():
  return synthetic.create_task(num_clients=30, seed=0, size_law='table_4_4',
                               test_fraction=0.2)


def summary(process, task, sampling):
  config = simulation.SimulationConfig(
      total_rounds=ROUNDS, clients_per_round=10, rounds_per_eval=0,
      seed=0, client_sampling=sampling, eval_train_clients=False)
  result = simulation.run_simulation(process, task, config, progress=False)
  return result['final_summaries']['test/accuracy']


def sgd():
  return tff.learning.optimizers.build_sgdm(learning_rate=0.1)


def test_q_one_is_fairer_than_q_zero(task):
  base, fair = (summary(q_ffl.build_q_fedavg(task.model_fn, sgd(), q=q,
                                             lipschitz_constant=10.0),
                        task, 'examples') for q in (0.0, 1.0))
  assert fair['variance'] < base['variance']
  assert fair['worst10'] > base['worst10']


def test_positive_tilt_is_fairer_than_no_tilt(task):
  base, fair = (summary(term.build_term(task.model_fn, sgd(), tilt=t),
                        task, 'uniform') for t in (0.0, 1.0))
  assert fair['variance'] < base['variance']
  assert fair['worst10'] > base['worst10']
