"""Production TFF programs: `train_model` runs, resumes, and matches run.train.

Each algorithm runs under `tff.learning.programs.train_model` in a
`NativeFederatedContext` in two calls (2 rounds, then resumed from the
program state up to 3) and must end with the same weights as an
uninterrupted `run.simulation` run of 3 rounds with the same seed (the
program's data source selects exactly the simulation's clients and shuffles).
"""

import asyncio
import collections
import csv
import datetime
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from run import algorithms
from run import program
from run import simulation
from tasks import registry
from tests import binary

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


@pytest.fixture(scope='module')
def task():
  return registry.create_task('synthetic', **TASK_KWARGS)


def weights(process, state):
  return program.model_weights_arrays(process, state)


def simulate(process, task, rounds):
  """The final model weights of `run.simulation` run for `rounds` rounds."""
  result = simulation.run_simulation(
      process,
      task,
      simulation.SimulationConfig(
          total_rounds=rounds,
          clients_per_round=PER_ROUND,
          seed=SEED,
          rounds_per_eval=0,
          eval_train_clients=False,
      ),
      progress=False,
  )
  return weights(process, result['state'])


def run(process, out_dir, rounds, **kwargs):
  config = program.ProgramConfig(
      total_rounds=rounds,
      clients_per_round=PER_ROUND,
      rounds_per_eval=kwargs.pop('rounds_per_eval', 0),
      evaluate_per_client=kwargs.pop('evaluate_per_client', False),
  )
  return program.run_program(
      process,
      task_name='synthetic',
      task_kwargs=TASK_KWARGS,
      config=config,
      output_dir=str(out_dir),
      seed=SEED,
      **kwargs,
  )


def read_rows(path):
  with open(path) as f:
    return list(csv.DictReader(f))


def assert_same(actual, expected):
  assert len(actual) == len(expected)
  for a, e in zip(actual, expected):
    np.testing.assert_allclose(a, e, rtol=0, atol=1e-6)
  assert max(np.abs(e).max() for e in expected) > 1e-3  # Trained, not zero.


SPECS = {
    'fedavg': algorithms.AlgorithmSpec('fedavg', client_learning_rate=0.05),
    'qffl': algorithms.AlgorithmSpec('qffl', q=1.0, client_learning_rate=0.05),
    'deltafl': algorithms.AlgorithmSpec(
        'deltafl', theta=0.5, client_learning_rate=0.05
    ),
}


@pytest.mark.parametrize('name', sorted(SPECS))
def test_resumed_program_matches_uninterrupted_run(name, task, tmp_path):
  process = algorithms.build_process(SPECS[name], task.model_fn)
  first = run(process, tmp_path, 2, evaluate=False)
  assert first['round_num'] == 2
  resumed = run(process, tmp_path, 3, evaluate=False)
  assert resumed['round_num'] == 3
  assert_same(weights(process, resumed['state']), simulate(process, task, 3))
  # The second call resumed: it trained round 3 only, so round 2's state is
  # the one the first call saved (and the CSV holds each round once).
  rounds = [int(r['round_num']) for r in read_rows(tmp_path / 'metrics.csv')]
  assert rounds == [1, 2, 3]
  assert_same(weights(process, first['state']), simulate(process, task, 2))
  versions = sorted(
      int(v.removeprefix('program_state_'))
      for v in os.listdir(tmp_path / 'program_state')
  )
  assert versions == [0, 2, 3]  # keep_total=3: the first and last two.


def test_uninterrupted_program_with_evaluation_and_outputs(task, tmp_path):
  process = algorithms.build_process(SPECS['fedavg'], task.model_fn)
  result = run(
      process, tmp_path, 3, rounds_per_eval=2, evaluate_per_client=True
  )
  assert_same(weights(process, result['state']), simulate(process, task, 3))
  train_rows = read_rows(tmp_path / 'metrics.csv')
  assert [int(r['round_num']) for r in train_rows] == [1, 2, 3]
  assert all(
      int(r['model_metrics/num_examples']) == PER_ROUND * 24 for r in train_rows
  )  # 30 examples, 80% for training.
  # EvaluationManager: rounds 2 (periodic) and 3 (last), on all 8 clients.
  eval_rows = read_rows(tmp_path / 'evaluation.csv')
  assert sorted(int(r['round_num']) for r in eval_rows) == [2, 3]
  assert all(int(r['model_metrics/num_examples']) == 8 * 6 for r in eval_rows)
  # The final per-client table, in the training binary's format, agrees with
  # the EvaluationManager's pooled accuracy over the same test clients.
  # (pylint infers only the None that run_program's result starts from.)
  per_client = result['per_client']['test']  # pylint: disable=unsubscriptable-object
  pooled = np.sum(per_client['accuracy'] * per_client['num_examples']) / np.sum(
      per_client['num_examples']
  )
  last = [r for r in eval_rows if r['round_num'] == '3'][0]
  assert float(last['model_metrics/accuracy']) == pytest.approx(
      pooled, abs=1e-6
  )
  with open(tmp_path / 'summary.json') as f:
    summary = json.load(f)
  assert summary['round_num'] == 3
  assert summary['summaries']['test/accuracy']['weighted_mean'] == (
      pytest.approx(pooled, abs=1e-6)
  )
  assert os.listdir(tmp_path / 'models')  # The released training state.
  assert os.path.isdir(tmp_path / 'tensorboard' / 'train')
  # A finished program asked for no more rounds trains nothing and keeps
  # its state.
  again = run(process, tmp_path, 3, rounds_per_eval=2)
  assert_same(
      weights(process, again['state']), weights(process, result['state'])
  )


def test_afl_is_refused_with_the_reason(task, tmp_path):
  spec = algorithms.AlgorithmSpec(
      'afl', client_learning_rate=0.05, afl_lambda_lr=0.1
  )
  process = algorithms.build_process(spec, task.model_fn, num_clients=8)
  with pytest.raises(ValueError, match='NativeFederatedContext materializes'):
    run(process, tmp_path, 1, evaluate=False)


def test_iterator_serialization_round_trip(task):
  del task
  spec = program.DataSpec(task='synthetic', task_kwargs=TASK_KWARGS, seed=SEED)
  iterator = program.ClientDataSource(spec).iterator()
  iterator.select(2)
  restored = program.ClientDataSourceIterator.from_bytes(iterator.to_bytes())
  assert restored == iterator and restored.round_num == 1
  a = [list(ds.as_numpy_iterator()) for ds in iterator.select(2)]
  b = [list(ds.as_numpy_iterator()) for ds in restored.select(2)]
  for x, y in zip(a, b):
    for bx, by in zip(x, y):
      np.testing.assert_array_equal(bx[0], by[0])
  with pytest.raises(ValueError, match=r'k must be in \[1, 8\]'):
    iterator.select(9)


def test_bad_settings(task, tmp_path):
  process = algorithms.build_process(SPECS['fedavg'], task.model_fn)
  with pytest.raises(ValueError, match='clients_per_round must be in'):
    program.run_program(
        process,
        task_name='synthetic',
        task_kwargs=TASK_KWARGS,
        config=program.ProgramConfig(total_rounds=1, clients_per_round=20),
        output_dir=str(tmp_path),
    )
  with pytest.raises(TypeError, match='LearningProcess'):
    program.run_program(
        process.next,
        task_name='synthetic',
        task_kwargs=TASK_KWARGS,
        config=program.ProgramConfig(total_rounds=1, clients_per_round=2),
        output_dir=str(tmp_path),
    )
  (tmp_path / program.PROGRAM_CONFIG).write_text(json.dumps({'seed': 99}))
  with pytest.raises(program.ProgramError, match='other settings'):
    run(process, tmp_path, 1)


def test_binary_bad_flag_is_one_line():
  proc = subprocess.run(
      [
          sys.executable,
          '-m',
          'run.program',
          '--straggler_fraction=0.5',
          '--progress=false',
      ],
      cwd=ROOT,
      check=False,
      capture_output=True,
      text=True,
      timeout=300,
      start_new_session=True,
  )
  assert proc.returncode == 2
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert lines == [
      'program: error: --straggler_fraction is not supported by'
      ' the program logic (use run.train)'
  ]


# The binary on a small task: 8 clients of 30 examples, 3 a round.
SMALL_BINARY = [
    '--task=synthetic',
    '--num_clients=8',
    '--synthetic_size_law=constant',
    '--clients_per_round=3',
    '--client_batch_size=5',
    '--progress=false',
    '--experiment_name=run',
]


def temp_names(folder):
  """The paths under `folder` with TFF's temporary names (`*_tempNNNN`)."""
  return sorted(
      os.path.relpath(os.path.join(d, n), folder)
      for d, dirs, files in os.walk(folder)
      for n in dirs + files
      if '_temp' in n
  )


def test_a_diverged_last_evaluation_is_one_line(tmp_path):
  """2 rounds: the final evaluation meets the divergence before training
  does; its error used to be logged from TFF's task callback first."""
  code, stdout, stderr = binary.run_module(
      'run.program',
      SMALL_BINARY
      + [
          f'--root_output_dir={tmp_path}',
          '--total_rounds=2',
          '--client_learning_rate=1e38',
      ],
  )
  assert code == 1, stderr
  lines = binary.error_lines(stderr)
  assert [l.split(':')[0] for l in lines[:2]] == ['task', 'algorithm']
  assert lines[2:] == [
      'program: error: training diverged at round 1 (train loss nan); lower '
      'the learning rates. The program states of earlier rounds are kept.'
  ], stderr
  assert 'Per-client metrics' not in stdout
  assert not temp_names(tmp_path)


@pytest.mark.parametrize('size', ['64k', '200k'])
def test_a_full_disk_is_one_line_and_leaves_no_temp_files(size, tmp_path):
  """On a tmpfs of `size` (a mount namespace of its own: no root needed)."""
  disk = tmp_path / 'disk'
  disk.mkdir()
  listing = tmp_path / 'listing'
  script = (
      'mount -t tmpfs -o size="$1" tmpfs "$2" || exit 99; shift 3; '
      '"$@"; code=$?; find "$OUT" > "$LISTING"; exit $code'
  )
  args = [
      sys.executable,
      '-m',
      'run.program',
      f'--root_output_dir={disk}',
      '--total_rounds=2',
      '--client_learning_rate=0.05',
  ] + SMALL_BINARY
  proc = subprocess.run(
      ['unshare', '-rm', 'sh', '-c', script, 'sh', size, str(disk), '--']
      + args,
      cwd=ROOT,
      env={**os.environ, 'OUT': str(disk), 'LISTING': str(listing)},
      check=False,
      capture_output=True,
      text=True,
      timeout=400,
      start_new_session=True,
  )
  assert proc.returncode == 1, proc.stderr
  lines = binary.error_lines(proc.stderr)
  assert [l.split(':')[0] for l in lines[:2]] == ['task', 'algorithm']
  assert lines[2:] == [
      f'program: error: disk full while writing in {disk}/run; the '
      'checkpoints written before are kept: free some space and rerun the '
      'same command to resume'
  ], proc.stderr
  found = listing.read_text().split()
  assert f'{disk}/run/program_config.json' in found  # The run had started.
  assert [p for p in found if '_temp' in p] == []


def test_a_rerun_removes_temp_folders_of_a_killed_save(task, tmp_path):
  """A kill during TFF's write leaves `<name>_tempNNNN`: the next run removes
  those, and only those."""
  process = algorithms.build_process(SPECS['fedavg'], task.model_fn)
  run(process, tmp_path, 2, evaluate=False)
  states = tmp_path / 'program_state'
  left = states / 'program_state_3_temp4821' / 'variables'
  left.mkdir(parents=True)
  (left / 'variables.index').write_bytes(b'partial')
  (tmp_path / 'metrics.csv_temp1234').write_text('round_num\n')
  resumed = run(process, tmp_path, 3, evaluate=False)
  assert resumed['round_num'] == 3
  assert sorted(os.listdir(states)) == [
      'program_state_0',
      'program_state_2',
      'program_state_3',
  ]
  assert not temp_names(tmp_path)
  rounds = [int(r['round_num']) for r in read_rows(tmp_path / 'metrics.csv')]
  assert rounds == [1, 2, 3]


def test_stacked_size_groups_is_refused():
  code, stderr = binary.call_main(
      program.main, 'program', ['--stacked_size_groups']
  )
  assert code == 2
  assert binary.error_lines(stderr) == [
      'program: error: --stacked_size_groups applies to '
      '--simulation_engine=stacked of run.train only'
  ]


@pytest.mark.parametrize('engine', ['stacked', 'batched'])
def test_simulation_engines_of_run_train_are_refused(engine):
  code, stderr = binary.call_main(
      program.main, 'program', [f'--simulation_engine={engine}']
  )
  assert code == 2
  assert binary.error_lines(stderr) == [
      f'program: error: --simulation_engine={engine} applies to run.train '
      "only: a program runs its rounds through TFF's runtime (use "
      '--simulation_engine=tff, the default)'
  ]


def test_run_async_errors_are_not_chained_to_its_loop_probe():
  async def fail():
    raise ValueError('bad')

  with pytest.raises(ValueError, match='bad') as raised:
    simulation.run_async(fail())
  assert raised.value.__context__ is None  # No "no running event loop".


def test_evaluations_of_rounds_after_the_saved_state_are_forgotten(
    tmp_path, monkeypatch
):
  """A program stopped after round 3's evaluation started but before its
  training state was saved resumes after round 2: round 3's evaluation (its
  entry in TFF's manager state and its state folder) is dropped, since the
  resumed round 3 starts it again; round 2's is resumed."""
  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff
  from tensorflow_federated.python.learning.programs import (
      evaluation_program_logic as tff_eval,
  )

  # pylint: enable=g-import-not-at-top
  # The names the manager drops are TFF's own (private there: a rename in
  # TFF must fail here, not leave the drop a no-op).
  assert tff_eval._EVAL_MANAGER_KEY == 'eval_manager'  # pylint: disable=protected-access
  name_of = tff_eval._EVAL_NAME_PATTERN.format  # pylint: disable=protected-access
  assert name_of(round_num=3) == 'evaluation_of_train_round_00003'
  root = tmp_path / 'evaluation'

  def state(name):
    return tff.program.FileProgramStateManager(str(root / name))

  async def setup():
    await state('eval_manager').save(
        (np.array([2, 3], np.int32), np.array([10, 11], np.int32)), version=0
    )
    for r in (2, 3):
      await state(f'evaluation_of_train_round_{r:05d}').save(
          np.int32(r), version=0
      )

  asyncio.run(setup())
  resumed = []

  async def tffs_resume(self):
    loaded, _ = await state('eval_manager').load_latest(
        (np.zeros([0], np.int32), np.zeros([0], np.int32))
    )
    resumed.append([a.tolist() for a in loaded])
    del self

  monkeypatch.setattr(
      tff.learning.programs.EvaluationManager,
      'resume_from_previous_state',
      tffs_resume,
  )
  manager = program.EvaluationAfterState(
      data_source=None,
      aggregated_metrics_manager=None,
      create_state_manager_fn=state,
      create_process_fn=lambda name: (None, None),
      cohort_size=1,
      duration=datetime.timedelta(seconds=0),
      root_dir=str(root),
      saved_round=2,
  )
  asyncio.run(manager.resume_from_previous_state())
  assert resumed == [[[2], [10]]]
  assert sorted(os.listdir(root)) == [
      'eval_manager',
      'evaluation_of_train_round_00002',
  ]
  # Nothing after the saved round: nothing changes.
  asyncio.run(manager.resume_from_previous_state())
  assert resumed[-1] == [[2], [10]]


def test_program_state_saves_run_one_at_a_time(tmp_path):
  """`train_model` starts every round's save in the background; saves that
  ran at once both removed the same old version and one failed with
  NotFoundError mid-program (30 FedAvg rounds, --rounds_per_eval=0). They
  now run one at a time, in order, each after its round's metrics."""

  class Released:
    """Round r's metrics are written once the test says so."""

    def __init__(self):
      self.events = collections.defaultdict(asyncio.Event)

    async def written(self, key):
      await self.events[key].wait()

  async def save_all():
    released = Released()
    manager = program.StateAfterMetrics(
        str(tmp_path), released, keep_total=3, keep_first=True
    )
    state = [np.arange(20000, dtype=np.float32)]
    saves = [
        asyncio.create_task(manager.save(state, version))
        for version in range(0, 9)
    ]
    for version in reversed(range(1, 9)):  # Released last round first.
      released.events[version].set()
    await asyncio.gather(*saves)

  asyncio.run(save_all())
  assert sorted(os.listdir(tmp_path)) == [
      'program_state_0',
      'program_state_7',
      'program_state_8',
  ]


def test_keyed_ends_tell_each_waiter_how_its_keys_work_ended():
  # train_model runs releases and saves as background tasks; the program
  # waits for one by key: after it ended, before it started, or failed.
  async def main():
    ends = program.KeyedEnds()
    order = []

    async def work(key, error=None):
      await asyncio.sleep(0.01)
      order.append(key)
      if error:
        raise error

    await ends.run(1, work(1))
    await ends.wait(1)  # Ended before the wait.
    waiting = asyncio.ensure_future(ends.wait(2))  # Waits before it runs.
    await asyncio.sleep(0)
    assert not waiting.done()
    await ends.run(2, work(2))
    await asyncio.wait_for(waiting, 5)
    with pytest.raises(ValueError, match='bad save'):
      await ends.run(3, work(3, ValueError('bad save')))
    with pytest.raises(ValueError, match='bad save'):
      await asyncio.wait_for(ends.wait(3), 5)
    task = asyncio.ensure_future(ends.run(4, asyncio.sleep(10)))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
      await asyncio.wait_for(ends.wait(4), 5)
    assert order == [1, 2, 3]
    assert not ends._futures  # pylint: disable=protected-access

  asyncio.run(main())
