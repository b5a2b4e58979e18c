"""Stateful clients in the simulation loop: personal evaluation and resume."""

import csv
import os
import shutil

import numpy as np
import pytest
import tensorflow_federated as tff

from run import algorithms
from run import engines
from run import simulation
from tasks import synthetic
from tff_algos import client_states
from tff_algos import composition
from tff_algos import ditto
from tff_algos import fed_plus


@pytest.fixture(scope='module')
def task():
  return synthetic.create_task(
      num_clients=6,
      seed=2,
      size_law='constant',
      constant_size=25,
      batch_size=5,
      validation_fraction=0.2,
  )


_PROCESSES = {}


def make_ditto(task):
  """One process per task (building is slow; runs do not mutate it)."""
  if id(task) not in _PROCESSES:
    _PROCESSES[id(task)] = ditto.build_ditto(
        task.model_fn,
        tff.learning.optimizers.build_sgdm(learning_rate=0.1),
        lam=[0.1, 2.0],
    )
  return _PROCESSES[id(task)]


def config(**kwargs):
  base = dict(
      total_rounds=4,
      clients_per_round=3,
      rounds_per_eval=0,
      rounds_per_checkpoint=2,
      seed=3,
      eval_train_clients=False,
  )
  base.update(kwargs)
  return simulation.SimulationConfig(**base)


def store_for(kind, out_dir, process):
  if kind == 'memory':
    return None  # The loop's default: in memory, snapshotted to out_dir.
  return client_states.DiskClientStateStore(
      os.path.join(out_dir, 'client_states'),
      lambda _: process.initial_client_state(),
  )


def run(task, out_dir, kind, **kwargs):
  process = make_ditto(task)
  return simulation.run_simulation(
      process,
      task,
      config(**kwargs),
      output_dir=out_dir,
      hparams={'store': kind},
      progress=False,
      client_state_store=store_for(kind, out_dir, process),
  )


def all_states(result, task):
  store = result['client_state_store']
  return [
      np.concatenate([np.ravel(a) for model in s['personal'] for a in model])
      for s in store.get_many(list(task.train_data.client_ids))
  ]


@pytest.mark.parametrize('kind', ['memory', 'disk'])
def test_resume_continues_every_personal_model(task, tmp_path, kind):
  full = run(task, str(tmp_path / 'full'), kind)
  part = str(tmp_path / 'part')
  run(task, part, kind, total_rounds=2)
  resumed = run(task, part, kind)
  assert [m['round_num'] for m in resumed['history']] == [3, 4]
  # A run that crashed after round 3's states were written but before its
  # checkpoint: resumed from round 2, it must discard them.
  crashed = str(tmp_path / 'crashed')
  run(task, crashed, kind, total_rounds=3, rounds_per_checkpoint=2)
  shutil.rmtree(os.path.join(crashed, 'checkpoints', 'program_state_3'))
  if kind == 'memory':
    os.remove(
        os.path.join(crashed, 'client_states', 'states_round_00000003.npz')
    )
  else:
    os.remove(os.path.join(crashed, 'client_states', 'snapshots', '00000003'))
  after_crash = run(task, crashed, kind)
  assert [m['round_num'] for m in after_crash['history']] == [3, 4]
  process = make_ditto(task)
  reference = composition.model_weights_as_numpy(process, full['state'])
  reference_states = all_states(full, task)
  for other in (resumed, after_crash):
    for a, b in zip(
        reference, composition.model_weights_as_numpy(process, other['state'])
    ):
      np.testing.assert_array_equal(a, b)
    for a, b in zip(reference_states, all_states(other, task)):
      np.testing.assert_array_equal(a, b)
    assert other['final_summaries'] == full['final_summaries']
  # Some personal model moved away from the initial one.
  assert max(np.abs(s).max() for s in reference_states) > 0


def test_personal_evaluation_outputs(task, tmp_path):
  out = tmp_path / 'eval'
  result = run(task, str(out), 'memory', total_rounds=2)
  summaries = result['final_summaries']
  for key in (
      'test/accuracy',
      'personal/test/accuracy',
      'personal/test/loss',
      'personal/test/lambda',
  ):
    assert key in summaries
  assert set(result['per_client']['personal/test']['lambda']) <= {0.1, 2.0}
  with open(out / 'clients' / 'personal_round_00002.csv') as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 6 and {r['split'] for r in rows} == {'personal/test'}
  # The loop's personal metrics are those of each client's chosen model.
  process = make_ditto(task)
  store = result['client_state_store']
  cid = rows[0]['client_id']
  row = process.evaluate_personal(
      result['state'], store.get_many([cid]), [task.eval_dataset(cid, 'test')]
  )[0]
  g = [0.1, 2.0].index(float(rows[0]['lambda']))
  assert float(rows[0]['accuracy']) == pytest.approx(row['accuracy'][g])
  assert float(rows[0]['loss']) == pytest.approx(row['loss'][g], abs=1e-7)
  with open(out / 'metrics.csv') as f:
    metrics = list(csv.DictReader(f))
  assert metrics[-1]['eval/personal/test/accuracy/mean'] != ''
  # Each client's lambda is the one of lowest validation loss, recomputed
  # here from the stored personal models (min by hand, not np.argmin).
  ids = list(task.test_data.client_ids)
  val_rows = process.evaluate_personal(
      result['state'],
      store.get_many(ids),
      [task.eval_dataset(c, 'validation') for c in ids],
  )
  want, trained = [], 0
  for r in val_rows:
    losses = [float(x) for x in r['loss']]
    want.append([0.1, 2.0][losses.index(min(losses))])
    trained += losses[0] != losses[1]  # Never sampled: both initial.
  assert trained >= 3  # Clients where argmin and argmax differ.
  got = result['per_client']['personal/test']['lambda']
  assert list(got) == want
  assert list(result['per_client']['personal/test']['client_id']) == ids


@pytest.mark.parametrize(
    'losses, want',
    [
        ([[0.3, 0.1, 0.2]], [1]),
        ([[1.0, 2.0], [5.0, -1.0], [0.5, 0.5]], [0, 1, 0]),  # A tie: the first.
        ([np.float32([2.5]), np.float32([0.0])], [0, 0]),
        ([], []),
    ],
)
def test_select_personal_models_takes_the_lowest_validation_loss(losses, want):
  assert simulation.select_personal_models(losses) == want


def test_lambda_grid_needs_validation_data(tmp_path):
  no_val = synthetic.create_task(
      num_clients=4, seed=2, size_law='constant', constant_size=10, batch_size=5
  )
  with pytest.raises(simulation.SimulationError, match='validation'):
    simulation.run_simulation(
        make_ditto(no_val), no_val, config(clients_per_round=2), progress=False
    )


def test_fed_plus_runs_in_the_loop(task):
  process = fed_plus.build_fed_plus(
      task.model_fn,
      psi='comed',
      learning_rate=0.05,
      sigma=1.0,
      aggregation_iterations=3,
  )
  result = simulation.run_simulation(
      process, task, config(total_rounds=2), progress=False
  )
  assert 'personal/test/accuracy' in result['final_summaries']
  assert 'personal/test/lambda' not in result['final_summaries']
  assert len(result['client_state_store'].client_ids()) >= 3


@pytest.mark.parametrize('kind', ['memory', 'disk'])
def test_resume_on_the_batched_engine_equals_uninterrupted(
    task, tmp_path, kind
):
  spec = algorithms.AlgorithmSpec(
      name='ditto', ditto_lambda_grid=(0.1, 2.0), client_learning_rate=0.1
  )
  num_clients = len(task.train_data.client_ids)
  process = algorithms.build_process(
      spec, task.model_fn, num_clients=num_clients
  )
  engine = engines.build_batched_engine(spec, task)

  def run_engine(out_dir, **kwargs):
    return simulation.run_simulation(
        process,
        task,
        config(**kwargs),
        output_dir=out_dir,
        hparams={'store': kind, 'engine': 'batched'},
        progress=False,
        client_state_store=store_for(kind, out_dir, process),
        engine=engine,
    )

  full = run_engine(str(tmp_path / 'full'))
  part = str(tmp_path / 'part')
  run_engine(part, total_rounds=2)
  resumed = run_engine(part)
  assert [m['round_num'] for m in resumed['history']] == [3, 4]
  for a, b in zip(
      composition.model_weights_as_numpy(process, full['state']),
      composition.model_weights_as_numpy(process, resumed['state']),
  ):
    np.testing.assert_array_equal(a, b)
  full_states = all_states(full, task)
  for a, b in zip(full_states, all_states(resumed, task)):
    np.testing.assert_array_equal(a, b)
  assert resumed['final_summaries'] == full['final_summaries']
  assert max(np.abs(s).max() for s in full_states) > 0
