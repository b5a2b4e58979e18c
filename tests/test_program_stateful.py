"""Stateful-client programs (Ditto, Fed+): resume and match the simulation.

Each algorithm runs as a TFF program (`run.stateful_program`) in two calls
(2 rounds, then resumed from the program state and the client-state store up
to 3) and must end with the global weights AND every client's stored state
equal to an uninterrupted program and to `run.simulation`'s loop with the
same seed. An interruption between the store's snapshot and the program
state's save (the window the ordering protects) is resumed too, and under
`train_model`'s background saves a round still waits for the previous
round's program state.
"""

import asyncio
import contextlib
import copy
import csv
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from run import algorithms
from run import program
from run import simulation
from run import stateful_program
from tasks import registry
from tests import binary as binary_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASK_KWARGS = {
    'num_clients': 8,
    'seed': 2,
    'batch_size': 5,
    'size_law': 'constant',
    'constant_size': 30,
}
SEED = 5
PER_ROUND = 3

SPECS = {
    'ditto': algorithms.AlgorithmSpec(
        'ditto', ditto_lambda=0.5, client_learning_rate=0.05
    ),
    'fedavg_plus': algorithms.AlgorithmSpec(
        'fedavg_plus',
        fedplus_sigma=1.0,
        fedplus_lambda=0.5,
        client_learning_rate=0.05,
    ),
}


@pytest.fixture(scope='module')
def task():
  return registry.create_task('synthetic', **TASK_KWARGS)


@pytest.fixture(scope='module')
def processes(task):
  return {
      name: algorithms.build_process(spec, task.model_fn)
      for name, spec in SPECS.items()
  }


_SIMULATIONS = {}


def simulate(name, process, task):
  """`run.simulation` of 3 rounds (cached per algorithm)."""
  if name not in _SIMULATIONS:
    _SIMULATIONS[name] = simulation.run_simulation(
        process,
        task,
        simulation.SimulationConfig(
            total_rounds=3,
            clients_per_round=PER_ROUND,
            seed=SEED,
            rounds_per_eval=0,
            eval_train_clients=False,
        ),
        progress=False,
    )
  return _SIMULATIONS[name]


def run(process, out_dir, rounds, store='memory', evaluate=False):
  config = program.ProgramConfig(
      total_rounds=rounds,
      clients_per_round=PER_ROUND,
      evaluate_per_client=evaluate,
  )
  return stateful_program.run_stateful_program(
      process,
      task_name='synthetic',
      task_kwargs=TASK_KWARGS,
      config=config,
      output_dir=str(out_dir),
      seed=SEED,
      client_state_store=store,
  )


def stored_states(store):
  return {
      cid: [np.asarray(a) for a in tf.nest.flatten(s)]
      for cid, s in zip(store.client_ids(), store.get_many(store.client_ids()))
  }


def assert_same_run(process, result, expected):
  """Same global weights and the same stored state for every client."""
  ours = program.model_weights_arrays(process, result['state'])
  theirs = program.model_weights_arrays(process, expected['state'])
  assert len(ours) == len(theirs)
  for a, b in zip(ours, theirs):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
  assert max(np.abs(b).max() for b in theirs) > 1e-3  # Trained, not zero.
  ours = stored_states(result['client_state_store'])
  theirs = stored_states(expected['client_state_store'])
  assert sorted(ours) == sorted(theirs)
  assert len(theirs) >= PER_ROUND + 1  # 3 rounds of 3 of 8 clients.
  initial = tf.nest.flatten(process.initial_client_state())
  for cid, leaves in theirs.items():
    for a, b, w0 in zip(ours[cid], leaves, initial):
      np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
      assert np.abs(b - w0).max() > 1e-4  # Every stored state was trained.


def read_rounds(path):
  with open(path) as f:
    return [int(r['round_num']) for r in csv.DictReader(f)]


def versions(folder):
  return sorted(
      int(v.removeprefix('program_state_')) for v in os.listdir(folder)
  )


@pytest.mark.parametrize(
    'name, store', [('ditto', 'memory'), ('fedavg_plus', 'disk')]
)
def test_resumed_program_matches_uninterrupted_and_simulation(
    name, store, task, processes, tmp_path
):
  process = processes[name]
  first = run(process, tmp_path / 'resumed', 2, store=store)
  assert first['round_num'] == 2
  resumed = run(process, tmp_path / 'resumed', 3, store=store)
  assert resumed['round_num'] == 3
  # The second call resumed: round 3 only was trained (each round released
  # once), from the program state and the client states of round 2.
  assert read_rounds(tmp_path / 'resumed' / 'metrics.csv') == [1, 2, 3]
  assert versions(tmp_path / 'resumed' / 'program_state') == [0, 2, 3]
  assert resumed['client_state_store'].snapshot_rounds() == [1, 2, 3]
  expected = simulate(name, process, task)
  assert_same_run(process, resumed, expected)
  uninterrupted = run(process, tmp_path / 'once', 3, store=store)
  assert_same_run(process, resumed, uninterrupted)


def test_interrupted_between_store_snapshot_and_program_state(
    task, processes, tmp_path
):
  """A crash after the store's round-3 snapshot, before round 3 was saved."""
  process = processes['ditto']
  run(process, tmp_path, 3, store='disk')
  shutil.rmtree(tmp_path / 'program_state' / 'program_state_3')
  resumed = run(process, tmp_path, 3, store='disk', evaluate=True)
  assert resumed['round_num'] == 3
  assert versions(tmp_path / 'program_state') == [0, 2, 3]
  expected = simulate('ditto', process, task)
  assert_same_run(process, resumed, expected)
  # The final evaluation: personal models per client, equal to the
  # simulation's evaluation of its own store. (pylint infers only the None
  # that run_stateful_program's result starts from, hence the disables.)
  ours = resumed['per_client']['personal/test']  # pylint: disable=unsubscriptable-object
  theirs = expected['per_client']['personal/test']
  assert list(ours['client_id']) == list(theirs['client_id'])
  np.testing.assert_allclose(ours['accuracy'], theirs['accuracy'], atol=1e-6)
  np.testing.assert_allclose(ours['loss'], theirs['loss'], atol=1e-5)
  assert 'personal/test/accuracy' in resumed['final_summaries']  # pylint: disable=unsupported-membership-test
  assert os.path.exists(tmp_path / 'summary.json')
  # train_model's releases: the model under its key, the training metrics
  # with `client_work/train` promoted to `model_metrics/`; the client states
  # carried in the round's metrics are not released.
  assert os.listdir(tmp_path / 'models') == ['training_checkpoint_round_3']
  assert read_rounds(tmp_path / 'metrics.csv') == [1, 2, 3]
  with open(tmp_path / 'metrics.csv') as f:
    columns = next(csv.reader(f))
  assert {'model_metrics/loss', 'client_work/personal_examples'} <= set(columns)
  assert not [c for c in columns if 'client_state' in c], columns


def test_a_round_waits_for_the_previous_program_state(
    processes, tmp_path, monkeypatch
):
  """train_model saves in the background: slow saves must not fall behind
  the store's snapshots (it keeps 3)."""
  saved = [0]
  lags = []
  save = program.StateAfterMetrics.save
  keep = stateful_program.ProgramRoundProcess.keep_client_states

  async def slow_save(self, program_state, version):
    await asyncio.sleep(0.5)
    await save(self, program_state, version)
    saved[0] = max(saved[0], version)

  def noted_keep(self, output):
    kept = keep(self, output)
    lags.append(self._source.last_selection.round_num - saved[0])  # pylint: disable=protected-access
    return kept

  monkeypatch.setattr(program.StateAfterMetrics, 'save', slow_save)
  monkeypatch.setattr(
      stateful_program.ProgramRoundProcess, 'keep_client_states', noted_keep
  )
  result = run(processes['ditto'], tmp_path, 5)
  assert result['round_num'] == 5
  assert lags == [1] * 5  # Each snapshot right after the previous save.
  assert versions(tmp_path / 'program_state') == [0, 4, 5]


def test_client_sequence_carries_state_once(processes):
  process = processes['ditto']
  batches = tf.data.Dataset.from_tensor_slices(
      (np.ones((7, 60), np.float32), np.arange(7, dtype=np.int32))
  ).batch(3)
  state = tf.nest.map_structure(
      lambda a: a + 2.0, process.initial_client_state()
  )
  elements = list(stateful_program.client_sequence(batches, state, 2))
  assert len(elements) == 4  # Header + 3 batches.
  header = elements[0]
  assert int(header['position']) == 2
  assert header['batch'][0].shape[0] == 0
  for a, b in zip(header['client_state'], tf.nest.flatten(state)):
    np.testing.assert_array_equal(a.numpy()[0], b)
  assert [int(e['batch'][0].shape[0]) for e in elements[1:]] == [3, 3, 1]
  assert all(a.shape[0] == 0 for e in elements[1:] for a in e['client_state'])


def test_iterator_serialization_and_binding(processes, tmp_path):
  process = processes['ditto']
  spec = program.DataSpec(task='synthetic', task_kwargs=TASK_KWARGS, seed=SEED)
  store = stateful_program.build_client_state_store(process, str(tmp_path))
  source = stateful_program.StatefulClientDataSource(spec, process, store)
  iterator = source.iterator()
  first = iterator.select(PER_ROUND)
  assert len(first) == PER_ROUND
  # The same clients as run.program's data source and the simulation.
  assert iterator.selected_ids == simulation.sample_clients(
      [str(i) for i in range(8)], 1, clients_per_round=PER_ROUND, seed=SEED
  )
  restored = stateful_program.StatefulClientDataSourceIterator.from_bytes(
      iterator.to_bytes()
  )
  assert restored == iterator and restored.round_num == 1
  with pytest.raises(ValueError, match='bind a ClientStateStore'):
    restored.select(PER_ROUND)
  restored.bind(store)
  restored.select(PER_ROUND)
  iterator.select(PER_ROUND)
  assert restored.selected_ids == iterator.selected_ids
  # train_model's deep copies share the store and the source's record of
  # the last selection (round, clients).
  assert source.last_selection.round_num == 2
  assert source.last_selection.client_ids == iterator.selected_ids
  copied = copy.deepcopy(iterator)
  copied.select(PER_ROUND)
  assert source.last_selection.round_num == 3
  assert source.last_selection.client_ids == copied.selected_ids
  assert copied._store is store  # pylint: disable=protected-access


def test_bad_input(task, processes, tmp_path):
  fedavg = algorithms.build_process(
      algorithms.AlgorithmSpec('fedavg', client_learning_rate=0.05),
      task.model_fn,
  )
  with pytest.raises(TypeError, match='StatefulClientsProcess'):
    run(fedavg, tmp_path, 1)
  with pytest.raises(TypeError, match='run.stateful_program'):
    program.run_program(
        processes['ditto'],
        task_name='synthetic',
        task_kwargs=TASK_KWARGS,
        config=program.ProgramConfig(total_rounds=1, clients_per_round=2),
        output_dir=str(tmp_path),
    )
  with pytest.raises(ValueError, match='clients_per_round must be in'):
    stateful_program.run_stateful_program(
        processes['ditto'],
        task_name='synthetic',
        task_kwargs=TASK_KWARGS,
        config=program.ProgramConfig(total_rounds=1, clients_per_round=9),
        output_dir=str(tmp_path),
    )
  with pytest.raises(ValueError, match='unknown client-state store'):
    run(processes['ditto'], tmp_path / 'x', 1, store='cloud')


def test_binary(tmp_path):
  """`python -m run.stateful_program`: a Ditto lambda grid, and a refusal."""
  out = binary(
      [
          '--task=synthetic',
          '--num_clients=8',
          '--algorithm=ditto',
          '--ditto_lambda_grid=0.1,1',
          '--synthetic_validation_fraction=0.1',
          '--total_rounds=1',
          '--clients_per_round=3',
          '--client_learning_rate=0.05',
          f'--root_output_dir={tmp_path}',
          '--experiment_name=ditto',
      ]
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert 'personal/test/lambda' in out.stdout
  with open(tmp_path / 'ditto' / 'clients' / 'round_00001.csv') as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 4 * 8  # Global and personal, test and train splits.
  assert {r['lambda'] for r in rows if r['split'] == 'personal/test'} <= {
      '0.1',
      '1.0',
  }
  refused = binary(['--algorithm=fedavg'])
  assert refused.returncode == 2
  lines = [l for l in refused.stderr.splitlines() if l.strip()]
  assert lines == [
      'stateful_program: error: --algorithm=fedavg keeps no client '
      'state; run it with python -m run.program'
  ]


def test_a_rerun_removes_temp_folders_of_a_killed_save(processes, tmp_path):
  """The shared program loop removes TFF's `<name>_tempNNNN` leftovers."""
  process = processes['ditto']
  run(process, tmp_path, 2)
  left = tmp_path / 'program_state' / 'program_state_3_temp4821'
  left.mkdir()
  (left / 'saved_model.pb').write_bytes(b'partial')
  resumed = run(process, tmp_path, 3)
  assert resumed['round_num'] == 3
  assert versions(tmp_path / 'program_state') == [0, 2, 3]
  assert read_rounds(tmp_path / 'metrics.csv') == [1, 2, 3]


def test_stacked_size_groups_is_refused():
  code, stderr = binary_lib.call_main(
      stateful_program.main,
      'stateful_program',
      ['--algorithm=ditto', '--stacked_size_groups'],
  )
  assert code == 2
  assert binary_lib.error_lines(stderr) == [
      'stateful_program: error: --stacked_size_groups applies to '
      '--simulation_engine=stacked of run.train only'
  ]


@pytest.mark.parametrize('engine', ['stacked', 'batched'])
def test_simulation_engines_of_run_train_are_refused(engine):
  code, stderr = binary_lib.call_main(
      stateful_program.main,
      'stateful_program',
      ['--algorithm=ditto', f'--simulation_engine={engine}'],
  )
  assert code == 2
  assert binary_lib.error_lines(stderr) == [
      f'stateful_program: error: --simulation_engine={engine} applies to '
      "run.train only: a program runs its rounds through TFF's runtime (use "
      '--simulation_engine=tff, the default)'
  ]


def binary(args):
  """Runs the binary in its own process group, ended afterwards."""
  with subprocess.Popen(
      [sys.executable, '-m', 'run.stateful_program', '--progress=false'] + args,
      cwd=ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,
  ) as proc:
    try:
      stdout, stderr = proc.communicate(timeout=600)
    finally:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
  return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
