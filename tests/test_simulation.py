"""The simulation loop: sampling, evaluation, outputs, checkpoints, resume."""

import csv
import json
import os

import numpy as np
import pytest
import tensorflow_federated as tff

from run import simulation
from tasks import synthetic
from tff_algos import composition
from tff_algos import fed_avg
from tff_algos import fed_prox


@pytest.fixture(scope='module')
def task():
  return synthetic.create_task(
      num_clients=12,
      seed=5,
      size_law='constant',
      constant_size=20,
      batch_size=5,
  )


def make_process(task):
  return fed_prox.build_fed_prox(
      task.model_fn,
      tff.learning.optimizers.build_sgdm(learning_rate=0.05),
      proximal_strength=0.1,
  )


def config(**kwargs):
  base = dict(
      total_rounds=6,
      clients_per_round=4,
      rounds_per_eval=3,
      rounds_per_checkpoint=2,
      seed=1,
      straggler_fraction=0.5,
      client_epochs_per_round=2,
  )
  base.update(kwargs)
  return simulation.SimulationConfig(**base)


def test_sampling_is_deterministic_without_replacement():
  ids = [str(i) for i in range(50)]
  a = simulation.sample_clients(ids, 3, clients_per_round=10, seed=0)
  assert a == simulation.sample_clients(ids, 3, clients_per_round=10, seed=0)
  assert a != simulation.sample_clients(ids, 4, clients_per_round=10, seed=0)
  assert len(set(a)) == 10


def test_sampling_proportional_to_examples():
  ids = ['small', 'big']
  picks = [
      simulation.sample_clients(
          ids,
          r,
          clients_per_round=1,
          seed=0,
          scheme='examples',
          num_examples=[1, 9],
      )[0]
      for r in range(2000)
  ]
  share = picks.count('big') / len(picks)
  assert 0.86 < share < 0.94


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(total_rounds=0), 'total_rounds'),
        (dict(clients_per_round=13), 'exceeds the 12 training clients'),
        (dict(client_epochs_per_round=0), 'client_epochs_per_round'),
        (dict(client_sampling='bogus'), 'client_sampling'),
        (dict(straggler_fraction=2.0), 'straggler_fraction'),
    ],
)
def test_config_validation(kwargs, message):
  with pytest.raises(ValueError, match=message):
    config(**kwargs).validate(12)


def test_run_writes_outputs_and_resume_matches_uninterrupted(task, tmp_path):
  full = simulation.run_simulation(
      make_process(task),
      task,
      config(),
      output_dir=str(tmp_path / 'full'),
      hparams={'a': 1},
      progress=False,
  )
  # A run stopped after 3 rounds, then resumed to 6 from its checkpoint.
  part_dir = str(tmp_path / 'part')
  simulation.run_simulation(
      make_process(task),
      task,
      config(total_rounds=3),
      output_dir=part_dir,
      hparams={'a': 1},
      progress=False,
  )
  resumed = simulation.run_simulation(
      make_process(task),
      task,
      config(),
      output_dir=part_dir,
      hparams={'a': 1},
      progress=False,
  )
  assert [m['round_num'] for m in resumed['history']] == [4, 5, 6]
  process = make_process(task)
  for a, b in zip(
      composition.model_weights_as_numpy(process, full['state']),
      composition.model_weights_as_numpy(process, resumed['state']),
  ):
    np.testing.assert_array_equal(a, b)
  assert full['final_summaries'] == resumed['final_summaries']

  out = tmp_path / 'full'
  with open(out / 'metrics.csv') as f:
    rows = list(csv.DictReader(f))
  assert [int(r['round_num']) for r in rows] == [1, 2, 3, 4, 5, 6]
  assert 'train/loss' in rows[0]
  assert rows[2]['eval/test/accuracy/p90'] != ''
  assert float(rows[0]['stragglers']) == 2
  with open(out / 'clients' / 'round_00006.csv') as f:
    per_client = list(csv.DictReader(f))
  assert len(per_client) == 24  # 12 test + 12 train clients.
  assert {r['split'] for r in per_client} == {'test', 'train'}
  summary = json.loads((out / 'summary.json').read_text())
  assert summary['round_num'] == 6
  assert 'test/accuracy' in summary['summaries']
  assert 'p90' in (out / 'summary.txt').read_text()
  assert os.listdir(out / 'tensorboard')
  # Where the round loop's time went (timing.json, apart from the results):
  # training is the rounds' own seconds; two evaluations (rounds 3, 6),
  # three checkpoints, six metric rows.
  assert 'seconds' not in summary
  seconds = json.loads((out / simulation.TIMING).read_text())
  assert list(seconds) == [*simulation.SECONDS, 'first_round']
  assert seconds.pop('first_round') == 1
  assert seconds['training'] == pytest.approx(
      sum(float(r['round_seconds']) for r in rows), abs=0.01
  )
  assert all(v > 0 for v in seconds.values()), seconds
  assert seconds == {k: round(v, 3) for k, v in full['seconds'].items()}
  # The resumed invocation timed its own three rounds only.
  part = json.loads((tmp_path / 'part' / simulation.TIMING).read_text())
  assert part['first_round'] == 4
  assert part['training'] == pytest.approx(
      sum(m['round_seconds'] for m in resumed['history']), abs=0.01
  )
  # Resuming the finished run only evaluates.
  again = simulation.run_simulation(
      make_process(task),
      task,
      config(),
      output_dir=str(out),
      hparams={'a': 1},
      progress=False,
  )
  assert not again['history'] and again['round_num'] == 6
  assert again['seconds']['training'] == 0.0
  assert again['seconds']['evaluation'] > 0


def test_a_resumed_run_removes_temp_files_of_a_killed_write(task, tmp_path):
  """TFF's `<name>_tempNNNN` leftovers of a killed checkpoint or CSV write
  are removed on resume (as the programs do), those names only."""
  out = tmp_path / 'run'
  run = lambda rounds: simulation.run_simulation(
      make_process(task),
      task,
      config(total_rounds=rounds),
      output_dir=str(out),
      progress=False,
  )
  run(2)
  left = out / 'checkpoints' / 'program_state_3_temp4821' / 'variables'
  left.mkdir(parents=True)
  (left / 'variables.index').write_bytes(b'partial')
  (out / 'metrics.csv_temp1234').write_text('round_num\n')
  (out / 'clients' / 'notes_temp.txt').write_text("not TFF's")
  resumed = run(3)
  assert [m['round_num'] for m in resumed['history']] == [3]
  left_over = sorted(
      os.path.relpath(os.path.join(d, n), out)
      for d, dirs, files in os.walk(out)
      for n in dirs + files
      if '_temp' in n
  )
  assert left_over == [os.path.join('clients', 'notes_temp.txt')]
  assert sorted(os.listdir(out / 'checkpoints')) == [
      'program_state_2',
      'program_state_3',
  ]
  with open(out / 'metrics.csv') as f:
    assert [r['round_num'] for r in csv.DictReader(f)] == ['1', '2', '3']


def test_resume_with_other_settings_is_refused(task, tmp_path):
  simulation.run_simulation(
      make_process(task),
      task,
      config(total_rounds=2),
      output_dir=str(tmp_path),
      hparams={'client_learning_rate': 0.1},
      progress=False,
  )
  with pytest.raises(simulation.SimulationError, match='client_learning_rate'):
    simulation.run_simulation(
        make_process(task),
        task,
        config(total_rounds=3),
        output_dir=str(tmp_path),
        hparams={'client_learning_rate': 0.2},
        progress=False,
    )


def test_evaluation_matches_numpy(task):
  process = fed_avg.build_fed_avg(
      task.model_fn, tff.learning.optimizers.build_sgdm(learning_rate=0.1)
  )
  result = simulation.run_simulation(
      process,
      task,
      config(total_rounds=2, straggler_fraction=0.0),
      progress=False,
  )
  w, b = composition.model_weights_as_numpy(process, result['state'])
  test = result['per_client']['test']
  for i, cid in enumerate(test['client_id']):
    ds = task.test_data.create_tf_dataset_for_client(cid).batch(1000)
    batch = next(iter(ds))
    x, y = batch['x'].numpy(), batch['y'].numpy()
    pred = np.argmax(x @ w + b, axis=1)
    assert test['num_examples'][i] == len(y)
    np.testing.assert_allclose(
        test['accuracy'][i], np.mean(pred == y), atol=1e-6
    )
    logits = x @ w + b
    logits -= logits.max(axis=1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(
        test['loss'][i], -log_p[np.arange(len(y)), y].mean(), rtol=1e-5
    )
  summary = result['final_summaries']['test/accuracy']
  np.testing.assert_allclose(
      summary['mean'], np.mean(test['accuracy']), rtol=1e-6
  )


def test_fedavg_with_all_stragglers_skips_rounds(task):
  process = fed_avg.build_fed_avg(
      task.model_fn, tff.learning.optimizers.build_sgdm(learning_rate=0.1)
  )
  result = simulation.run_simulation(
      process,
      task,
      config(total_rounds=2, straggler_fraction=1.0, drop_stragglers=True),
      progress=False,
  )
  assert all(m['skipped'] == 1 for m in result['history'])
  w, _ = composition.model_weights_as_numpy(process, result['state'])
  assert np.all(w == 0)


def test_flatten_metrics():
  flat = simulation.flatten_metrics(
      {
          'client_work': {'train': {'loss': np.float32(1.5)}},
          'aggregator': {'mean_value': ()},
          'finalizer': {'n': 3},
      }
  )
  assert flat == {'train/loss': 1.5, 'finalizer/n': 3}


def test_per_client_evaluation_makes_datasets_a_chunk_at_a_time():
  """A lazily loaded split is in memory one chunk of clients at a time."""
  events = []

  class Clients:
    client_ids = [f'c{i}' for i in range(5)]

  class Task:
    test_data = Clients()
    unseen_data = None

    def eval_dataset(self, cid, split):
      events.append(('make', cid))
      return (cid, split)

  def computation(weights, datasets):
    del weights
    events.append(('evaluate', [cid for cid, _ in datasets]))
    return [{'accuracy': float(cid[1:])} for cid, _ in datasets]

  out = simulation.evaluate_per_client(
      Task(), computation, None, include_train=False, chunk_size=2
  )
  assert events == [
      ('make', 'c0'),
      ('make', 'c1'),
      ('evaluate', ['c0', 'c1']),
      ('make', 'c2'),
      ('make', 'c3'),
      ('evaluate', ['c2', 'c3']),
      ('make', 'c4'),
      ('evaluate', ['c4']),
  ]
  assert list(out['test']['accuracy']) == [0, 1, 2, 3, 4]
  assert list(out['test']['client_id']) == Clients.client_ids


def test_client_csv_is_the_union_of_the_splits_columns(tmp_path):
  """The one per-client CSV writer (the simulation's and the programs')."""
  per_client = {
      'test': {
          'client_id': ['a', 'b'],
          'num_examples': np.array([3, 4], np.int32),
          'accuracy': np.array([0.5, 0.25], np.float32),
      },
      'personal/test': {
          'client_id': ['a'],
          'accuracy': np.array([1.0 / 3.0], np.float64),
          'lambda': np.array([0.1], np.float64),
      },
  }
  path = tmp_path / 'round_00001.csv'
  simulation.write_client_csv(str(path), per_client)
  with open(path, newline='') as f:
    rows = list(csv.reader(f))
  assert rows == [
      ['split', 'client_id', 'num_examples', 'accuracy', 'lambda'],
      ['test', 'a', '3', '0.5', ''],
      ['test', 'b', '4', '0.25', ''],
      ['personal/test', 'a', '', '0.3333333', '0.1'],
  ]


def _release_rounds():
  for r in range(1, 7):
    metrics = {
        'clients': 10,
        'round_seconds': 0.1 * r,
        'train/accuracy': np.float32(0.3 + r / 100).item(),
        'flag': True,
        'huge': 1e300,
    }
    if r % 3 == 0:  # Evaluation rounds bring new columns.
      metrics.update({'eval/test/mean': 0.5 + r / 10, 'eval/test/p10': np.nan})
    yield r, metrics


def _events(folder):
  import glob  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  out = []
  for path in sorted(glob.glob(os.path.join(folder, 'events*'))):
    for event in tf.data.TFRecordDataset(path):
      event = tf.compat.v1.Event.FromString(event.numpy())
      for value in event.summary.value:
        out.append(
            (
                event.step,
                value.tag,
                repr(float(tf.make_ndarray(value.tensor))),  # nan == nan.
                value.metadata.SerializeToString(),
            )
        )
  return sorted(out)


def test_metrics_files_are_what_tffs_release_managers_write(tmp_path):
  """metrics.csv byte for byte and the TensorBoard scalars as TFF's
  `CSVFileReleaseManager` (WRITE) and `TensorBoardReleaseManager` write
  them, through a resumed run that repeats rounds and one that goes back."""
  steps = list(_release_rounds())

  def tffs(folder, seq):
    csv_manager = tff.program.CSVFileReleaseManager(
        str(folder / 'metrics.csv'),
        save_mode=tff.program.CSVSaveMode.WRITE,
        key_fieldname='round_num',
    )
    board = tff.program.TensorBoardReleaseManager(str(folder / 'tb'))
    for r, m in seq:
      simulation.run_async(csv_manager.release(dict(m), key=r))
      simulation.run_async(
          board.release(
              {
                  k: np.float64(v) if isinstance(v, float) else v
                  for k, v in m.items()
              },
              key=r,
          )
      )
    board._summary_writer.flush()  # pylint: disable=protected-access

  def ours(folder, seq):
    csv_writer = simulation._MetricsCsv(str(folder / 'metrics.csv'))  # pylint: disable=protected-access
    board = simulation._TensorBoardScalars(str(folder / 'tb'))  # pylint: disable=protected-access
    for r, m in seq:
      csv_writer.release(m, r)
      board.release(m, r)
    board._writer.flush()  # pylint: disable=protected-access

  for name, write in (('tff', tffs), ('ours', ours)):
    folder = tmp_path / name
    folder.mkdir()
    write(folder, steps[:5])
    write(folder, steps[3:])  # Resumed after round 3: rounds 4 to 6 again.
    write(folder, [steps[1]])  # Back to round 2: the later rows go.
  ours_csv = (tmp_path / 'ours' / 'metrics.csv').read_bytes()
  assert ours_csv == (tmp_path / 'tff' / 'metrics.csv').read_bytes()
  assert ours_csv.startswith(b'round_num,clients,flag,huge,round_seconds,')
  assert ours_csv.count(b'\r\n') == 3  # The header, rounds 1 and 2.
  ours_events = _events(tmp_path / 'ours' / 'tb')
  assert ours_events == _events(tmp_path / 'tff' / 'tb')
  # Rounds 1-5 (round 3 with 2 more), 4-6 (6 with 2 more), then 2 again.
  assert len(ours_events) == (5 * 5 + 2) + (3 * 5 + 2) + 5


def test_personal_models_that_overflow_are_divergence(monkeypatch):
  # Ditto's personal models can overflow while its global model's training
  # loss stays finite: the run ends in the divergence line (which the
  # benchmark records as diverged), not in a traceback from the summaries.
  finite = {
      'test': {
          'client_id': np.array([b'a', b'b']),
          'num_examples': np.array([3, 4]),
          'accuracy': np.array([0.5, 0.25]),
          'loss': np.array([1.0, 2.0]),
      }
  }
  personal = {
      'personal/test': {
          **finite['test'],
          'loss': np.array([1.6e28, np.inf]),
      }
  }
  monkeypatch.setattr(simulation, 'evaluate_per_client', lambda *a, **k: finite)
  monkeypatch.setattr(
      simulation, 'evaluate_personal_per_client', lambda *a, **k: personal
  )

  class Process:

    def get_model_weights(self, state):
      return state

  config = simulation.SimulationConfig(
      total_rounds=1, clients_per_round=2, eval_train_clients=False
  )
  with pytest.raises(simulation.SimulationError) as info:
    simulation._evaluate(  # pylint: disable=protected-access
        Process(), None, None, None, config, None, 7, store=object()
    )
  assert str(info.value).startswith(
      'training diverged at round 7 (the per-client evaluation of its model on'
      ' personal/test has non-finite loss'
  )
