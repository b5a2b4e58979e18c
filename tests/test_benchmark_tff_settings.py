# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
# pylint: disable=protected-access
"""The tail benchmark's settings on TFF's files: emnist and stackoverflow.

Their data are fixtures in TFF's SQLite format (`tests.sqlite_fixtures`),
written here with every client above the settings' `--min_examples=100`, so
the settings' own task flags select them; the end-to-end runs shrink the
budget with the benchmark's flags and the model with the task flags after
`--` (the setting's flags plus a small model). A loopback HTTP server stands
in for TFF's bucket (`TFF_HETERO_DATA_URL`): nothing leaves the machine, and
its log shows what was fetched.
"""

import contextlib
import http.server
import json
import lzma
import os
import re
import sqlite3
import threading

from absl import flags
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from run.tail_benchmark import benchmark as bm
from run.tail_benchmark import settings as bench_settings
from tasks import base
from tasks import download
from tasks import personalization
from tasks import stackoverflow
from tests import binary
from tests import sqlite_fixtures

WRITERS = 8  # EMNIST writers: 4 training, 4 unseen.
USERS = 8  # StackOverflow users: 4 training, 4 unseen.
CLASSES = 4  # EMNIST labels used: 0-3, each with its own dark band.
WORDS = ('the', 'code', 'java', 'error', 'file', 'class', 'i', 'to', 'is')


def emnist_arrays(sizes: dict[str, int], seed: int) -> dict:
  """`(pixels, labels)` per writer: class c darkens rows 6c..6c+5 (TFF's
  pixels: 1.0 is the background), so a linear model learns them; a third
  of the labels are then drawn anew, so no model is right on all."""
  rng = np.random.default_rng(seed)
  out = {}
  for cid, n in sizes.items():
    bands = rng.integers(0, CLASSES, n)
    pixels = 1.0 - 0.2 * rng.random((n, 28, 28), dtype=np.float32)
    for k, band in enumerate(bands):
      pixels[k, 6 * band : 6 * band + 6, :] = 0.0
    noisy = rng.random(n) < 1 / 3
    labels = np.where(noisy, rng.integers(0, CLASSES, n), bands)
    out[cid] = (pixels, labels.astype(np.int32))
  return out


def write_emnist(folder: str) -> list[str]:
  """`folder/emnist_all.sqlite`: writers of 110 to 145 images (90 to 125
  training, 20 test); returns their ids."""
  os.makedirs(folder, exist_ok=True)
  ids = [f'f{k:04d}_{k * 7 % 100:02d}' for k in range(WRITERS)]
  train = emnist_arrays({c: 90 + 5 * k for k, c in enumerate(ids)}, 0)
  test = emnist_arrays({c: 20 for c in ids}, 1)
  sqlite_fixtures.write_emnist(folder, train, test)
  return ids


def _sentences(rng: np.random.Generator, n: int) -> list[tuple[str, str]]:
  """Sentences walking WORDS in order from a random word (the next word
  follows from the last), with tags."""
  out = []
  for _ in range(n):
    start, length = rng.integers(0, len(WORDS)), rng.integers(3, 9)
    words = [WORDS[(start + i) % len(WORDS)] for i in range(length)]
    out.append((' '.join(words), 'java|python'))
  return out


def write_stackoverflow(folder: str) -> list[str]:
  """`folder/stackoverflow.sqlite` (users of 110 to 145 sentences) and
  `stackoverflow.word_count`; returns the user ids."""
  os.makedirs(folder, exist_ok=True)
  rng = np.random.default_rng(3)
  ids = [f'{k:08d}' for k in range(USERS)]
  sqlite_fixtures.write_stackoverflow(
      folder,
      {
          'train': {c: _sentences(rng, 90 + 5 * k) for k, c in enumerate(ids)},
          'heldout': {'99999999': _sentences(rng, 5)},
          'test': {c: _sentences(rng, 20) for c in ids},
      },
  )
  sqlite_fixtures.write_word_counts(
      folder, {w: 100 - i for i, w in enumerate(WORDS)}
  )
  return ids


def write_calibration_data(folder: str, setting: str, clients: int = 40):
  """A setting's data for `--plan --calibrate_rounds` where TFF's files are
  not at hand: `clients` clients of the real data's sizes, random content
  (a round's cost depends on the sizes, the model and the budget only).

  emnist: writers of 101 to 447 images, log-normal around 190 (Delta-FL's
  Table 1: median 179, min 101, max 447; TFF's 3,400 writers hold 220 on
  average). stackoverflow: users of 400 sentences (TFF's 135,818,730
  training sentences over 342,477 users: 397 on average) over a vocabulary
  of 10,000 words, as the setting's model reads.
  """
  os.makedirs(folder, exist_ok=True)
  rng = np.random.default_rng(0)
  ids = [f'{k:08d}' for k in range(clients)]
  if setting == 'emnist':
    sizes = np.clip(rng.lognormal(np.log(190), 0.35, clients), 101, 447)
    arrays = emnist_arrays({c: int(n) for c, n in zip(ids, sizes)}, 0)
    train = {c: (x[20:], y[20:]) for c, (x, y) in arrays.items()}
    test = {c: (x[:20], y[:20]) for c, (x, y) in arrays.items()}
    sqlite_fixtures.write_emnist(folder, train, test)
    return
  words = [f'w{k}' for k in range(10_000)]
  posts = lambda n: [
      (' '.join(rng.choice(words, rng.integers(5, 25))), 'java')
      for _ in range(n)
  ]
  sqlite_fixtures.write_stackoverflow(
      folder,
      {
          'train': {c: posts(360) for c in ids},
          'heldout': {'99999999': posts(5)},
          'test': {c: posts(40) for c in ids},
      },
  )
  sqlite_fixtures.write_word_counts(
      folder, {w: 20_000 - k for k, w in enumerate(words)}
  )


# --------------------------------------------------------- TFF's bucket


class _Bucket(http.server.BaseHTTPRequestHandler):
  """Serves `server.files[name]` at `/name`; logs every request."""

  def do_GET(self):  # pylint: disable=invalid-name
    """The archive asked for, or 404."""
    name = self.path.lstrip('/')
    self.server.log.append(name)
    body = self.server.files.get(name)
    if body is None:
      self.send_error(404)
      return
    self.send_response(200)
    self.send_header('Content-Length', str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def log_message(self, *args):  # Quiet.
    del args


@pytest.fixture(name='bucket', scope='module')
def _bucket(tmp_path_factory):
  """TFF's archives of the EMNIST fixture, served on the loopback address."""
  folder = str(tmp_path_factory.mktemp('bucket'))
  write_emnist(folder)
  with open(os.path.join(folder, 'emnist_all.sqlite'), 'rb') as f:
    files = {'emnist_all.sqlite.lzma': lzma.compress(f.read())}
  httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _Bucket)
  httpd.files = files
  httpd.log = []
  thread = threading.Thread(target=httpd.serve_forever, daemon=True)
  thread.start()
  yield httpd
  httpd.shutdown()
  httpd.server_close()


@pytest.fixture(name='use_bucket')
def _use_bucket(bucket, monkeypatch):
  monkeypatch.setenv(
      download.BASE_URL_ENV, f'http://127.0.0.1:{bucket.server_address[1]}/'
  )
  bucket.log.clear()
  return bucket


# ------------------------------------------------------------ in-process


@contextlib.contextmanager
def _flags(monkeypatch, args: list[str]):
  """The benchmark's flags parsed from `args` in a fresh `FlagValues`
  (absl's global flags stay untouched)."""
  values = flags.FlagValues()
  bm.define_flags(values)
  monkeypatch.setattr(bm, 'FLAGS', values)
  values(['benchmark', *args])
  yield values


def _main(monkeypatch, capsys, args: list[str]) -> tuple[int, str, str]:
  """`(exit status, stdout, stderr)` of the benchmark's `main` on `args`."""
  with _flags(monkeypatch, args):
    code = bm.main(['benchmark'])
  out = capsys.readouterr()
  return code, out.out, out.err


# --------------------------------------------------------------- settings


def test_the_settings_hold_the_papers_values():
  emnist = bench_settings.SETTINGS['emnist']
  assert emnist.task_flags[:5] == (
      '--task=emnist_character',
      '--emnist_model=convnet',
      '--min_examples=100',
      '--max_clients=1730',
      '--test_clients_fraction=0.5',
  )
  b = emnist.budget
  assert (b.rounds, b.clients_per_round, b.local_epochs, b.batch_size) == (
      1000,
      100,
      1,
      16,
  )
  assert b.learning_rate == 0.32 and emnist.training_clients == 865
  assert 'Delta-FL' in emnist.scale and '1,730' in emnist.scale
  so = bench_settings.SETTINGS['stackoverflow']
  assert so.task_flags == (
      '--task=stackoverflow_word',
      '--min_examples=100',
      '--max_clients=1000',
      '--test_clients_fraction=0.5',
      '--max_examples_per_client=1000',
  )
  b = so.budget
  assert (b.rounds, b.clients_per_round, b.local_epochs, b.batch_size) == (
      1500,
      50,
      1,
      16,
  )
  # No method of it on the stacked engine: its labels are sequences.
  methods = [m for m in bench_settings.methods() if not m.baseline]
  assert {b.engine(m) for m in methods} == {'batched'}
  assert so.tff_files == ('stackoverflow.sqlite', 'stackoverflow.word_count')
  paper = bench_settings.SETTINGS['shakespeare_paper'].budget
  assert (paper.rounds, paper.clients_per_round, paper.batch_size) == (
      600,
      100,
      16,
  )


def test_a_missing_or_damaged_file_is_one_line_and_nothing_is_fetched(
    tmp_path, use_bucket
):
  (tmp_path / 'damaged').mkdir()
  (tmp_path / 'damaged' / 'emnist_all.sqlite').write_text('not sqlite')
  (tmp_path / 'words').mkdir()
  write_stackoverflow(str(tmp_path / 'words'))
  os.remove(tmp_path / 'words' / 'stackoverflow.word_count')
  out = f'--output_dir={tmp_path}/out'
  cases = [
      (
          ['--setting=emnist', f'--data_dir={tmp_path}/none'],
          f'--setting=emnist reads emnist_all.sqlite from --data_dir='
          f'{tmp_path}/none, where it is missing: rerun with --download',
      ),
      (
          ['--setting=emnist', f'--data_dir={tmp_path}/damaged'],
          'emnist_all.sqlite is not a TFF SQLite dataset',
      ),
      (
          ['--setting=stackoverflow', f'--data_dir={tmp_path}/words'],
          'reads stackoverflow.word_count from',
      ),
      (
          ['--setting=synthetic', '--download'],
          '--setting=synthetic reads none',
      ),
      (
          [
              '--setting=emnist',
              '--data_dir=/a',
              '--',
              '--task=emnist_character',
              '--data_dir=/b',
          ],
          'differ: give the folder once',
      ),
      (['--setting=emnist', '--plan_costs=fedavg:x', '--plan'], 'number > 0'),
      (['--setting=emnist', '--plan_costs=nope:1', '--plan'], 'METHOD:SECONDS'),
      (['--setting=emnist', '--plan_costs=fedavg:1'], 'give --plan too'),
      (
          ['--setting=emnist', '--plan', f'--cost_ratios_from={tmp_path}'],
          'no FedAvg training record there',
      ),
  ]
  results = binary.call_main_in_subprocess(
      'run.tail_benchmark.benchmark',
      'benchmark',
      [[out, *args] for args, _ in cases],
  )
  for (args, words), (code, stderr) in zip(cases, results):
    lines = binary.error_lines(stderr)
    assert code == 2 and len(lines) == 1, (args, stderr)
    assert lines[0].startswith('benchmark: error: ') and words in lines[0], (
        args,
        lines,
    )
  assert use_bucket.log == []  # Without --download nothing is fetched.
  assert not os.path.exists(tmp_path / 'none')
  assert not os.path.exists(tmp_path / 'out' / 'runs')


def test_download_fetches_the_settings_file_once_and_only_when_asked(
    tmp_path, use_bucket, monkeypatch, capsys
):
  data = tmp_path / 'data'
  args = [
      '--setting=emnist',
      '--plan',
      f'--data_dir={data}',
      f'--output_dir={tmp_path / "out"}',
      f'--records_dir={tmp_path / "records"}',
  ]
  code, out, _ = _main(monkeypatch, capsys, args)  # A plan reads no data.
  assert code == 0 and 'total: 284 to 460 training runs' in out
  assert use_bucket.log == [] and not data.exists()
  code, out, err = _main(monkeypatch, capsys, args + ['--download'])
  assert code == 0, err
  assert use_bucket.log == ['emnist_all.sqlite.lzma']
  assert os.listdir(data) == ['emnist_all.sqlite']
  with sqlite3.connect(data / 'emnist_all.sqlite') as db:
    writers = db.execute(
        "SELECT COUNT(*) FROM client_metadata WHERE split_name = 'all_train'"
    ).fetchone()
  assert writers == (WRITERS,)
  code, _, err = _main(monkeypatch, capsys, args + ['--download'])
  assert code == 0 and use_bucket.log == ['emnist_all.sqlite.lzma'], err
  assert 'benchmark: error' not in err


def _plan_lines(text: str) -> dict[tuple[str, str], str]:
  """The plan's rows by (stage, method label)."""
  rows = {}
  for line in text.splitlines():
    match = re.match(r'(select|final)\s+(.{28}) (.{20})', line)
    if match:
      rows[(match.group(2).strip(), match.group(3).strip())] = line
  return rows


def test_the_plan_costs_every_method_and_baseline_of_a_paper_setting(
    tmp_path, monkeypatch, capsys
):
  # Records of another setting give the ratios to FedAvg: Ditto 2 s a round
  # where FedAvg takes 1 s; the emnist setting's FedAvg is stated, 3 s.
  ratios = tmp_path / 'ratios'
  ratios.mkdir()
  for name, algorithm, wall in (('a', 'fedavg', 10.0), ('b', 'ditto', 20.0)):
    (ratios / f'select_{name}.json').write_text(
        json.dumps(
            {
                'args': [f'--algorithm={algorithm}', '--total_rounds=10'],
                'wall_s': wall,
            }
        )
    )
  code, out, err = _main(
      monkeypatch,
      capsys,
      [
          '--setting=emnist',
          '--plan',
          '--algorithms=ditto,fedavg_ft,local',
          '--plan_costs=fedavg:3',
          f'--cost_ratios_from={ratios}',
          f'--records_dir={tmp_path / "none"}',
          f'--output_dir={tmp_path / "out"}',
          '--jobs=8',
      ],
  )
  assert code == 0, err
  rows = _plan_lines(out)
  # FedAvg's report: 5 runs x 1,000 rounds x 3 s = 4.17 h; Ditto's at 6 s.
  assert rows[('report', 'FedAvg')].split()[-1] == '4.17'
  assert rows[('report', 'Ditto')].split()[-1] == '8.33'
  # A baseline's epoch over 865 writers: 865 / 100 rounds of FedAvg, 25.95
  # s; local training's grid, 2 seeds x 3 rates x 128 epochs: 5.54 h.
  assert rows[('local training grid', 'Local training')].split()[-2:] == [
      'ep',
      '5.54',
  ]
  # Fine-tuning's report, 5 seeds at up to 5 x 2^2 epochs: 0.72 h.
  assert rows[('fine-tuning report', 'FedAvg + fine-tuning')].endswith('0.72')
  assert 'and 14 to 26 baseline runs' in out
  assert 'on 8 workers' in out
  assert 'cost stated with --plan_costs' in out and ': FedAvg' in out
  assert "ratio to FedAvg's over the records in --cost_ratios_from" in out
  assert 'an epoch of 865 training clients as 865 / (100 clients' in out
  assert 'no cost for' not in out


def test_the_cap_keeps_each_users_first_sentences(tmp_path):
  write_stackoverflow(str(tmp_path))
  task = stackoverflow.create_task(
      data_dir=str(tmp_path),
      batch_size=4,
      max_examples_per_client=7,
      test_clients_fraction=0.5,
      lstm_size=4,
      embedding_size=4,
  )
  assert "each user's first 7 examples" in task.description
  for data in (task.train_data, task.test_data):
    for cid in data.client_ids:
      assert len(list(data.create_tf_dataset_for_client(cid))) == 7
  with pytest.raises(base.TaskError, match='max_examples_per_client must be'):
    stackoverflow.create_task(
        data_dir=str(tmp_path), batch_size=4, max_examples_per_client=0
    )


def test_fine_tuning_reports_a_sum_metric_as_its_total(tmp_path):
  # The StackOverflow model's num_tokens is a sum ([total]), not a mean:
  # the baselines' fine-tuning reports it as the client's non-pad targets.
  write_stackoverflow(str(tmp_path))
  task = stackoverflow.create_task(
      data_dir=str(tmp_path), batch_size=4, lstm_size=4, embedding_size=4
  )
  pairs = []
  for cid in task.train_data.client_ids[:2]:
    raw = task.train_data.create_tf_dataset_for_client(cid).take(6)
    pairs.append((task.preprocess_eval(raw).unbatch(),) * 2)
  model = task.model_fn()
  weights = tf.nest.map_structure(
      np.asarray, tff.learning.models.ModelWeights.from_model(model)
  )
  out = personalization.fine_tune_directly(
      task.model_fn,
      weights,
      pairs,
      learning_rates=[0.1],
      max_epochs=1,
      batch_size=4,
  )
  for epoch in out[0.1]:
    for k, (_, test) in enumerate(pairs):
      tokens = sum(int(np.count_nonzero(y)) for _, y in test)
      assert epoch['num_tokens'][k] == tokens > 0
      assert 0.0 <= epoch['accuracy'][k] <= 1.0


# ---------------------------------------------------------- end to end


def _tiny_benchmark(setting: str, knob: str, rate: float, model: str):
  """A tiny budget of `setting`: FedAvg, one method with two values of its
  knob (`knob`: `algorithm:knob:v1,v2`) and both baselines, on one
  selection seed and two reported ones; the setting's task flags with
  `model` in place of its model flag (or added)."""
  algorithm, grid = knob.split(':', 1)
  flag = model.split('=', 1)[0]
  task = [
      f
      for f in bench_settings.SETTINGS[setting].task_flags
      if not f.startswith(flag + '=')
  ]
  return [
      f'--setting={setting}',
      f'--algorithms={algorithm},fedavg_ft,local',
      f'--grid={grid}',
      f'--grid=learning_rate:{rate:g}',
      f'--grid=fine_tune_learning_rate:{rate:g}',
      '--max_extensions=0',
      '--max_extra_seeds=0',
      '--rounds=8',
      '--first_rung=0',
      '--notune_server_lr',
      '--notune_client_weighting',
      '--clients_per_round=4',
      '--fine_tune_epochs=1',
      '--local_epochs_max=2',
      '--seeds=0,1',
      '--selection_seeds=100',
      '--jobs=2',
      '--',
      *task,
      model,
  ]


def _records(folder) -> dict[str, dict]:
  return {
      p.name[: -len('.json')]: json.loads(p.read_text())
      for p in folder.glob('*.json')
  }


def _end_to_end(tmp_path, monkeypatch, capsys, setting, args, ids, files):
  """Runs the tiny benchmark of `setting` on the fixture in tmp_path/data;
  checks its runs against its plan, its page and its records' populations
  and origins; returns (results.json, records)."""
  data, out = tmp_path / 'data', tmp_path / 'out'
  where = [f'--data_dir={data}', f'--output_dir={out}']
  code, stdout, stderr = binary.run_module(
      'run.tail_benchmark.benchmark', where + args, timeout=1200
  )
  assert code == 0, stderr[-3000:]
  assert 'benchmark: wrote' in stdout and 'Traceback' not in stderr
  progress = [l for l in stderr.splitlines() if re.match(r'\[\d+\] ', l)]
  # The plan of the same command counts every run made, baselines too:
  # 1 FedAvg and 2 configurations selected, 2 x 2 reported; each baseline
  # selected on the selection seed and reported on both seeds.
  code, planned, err = _main(
      monkeypatch,
      capsys,
      where + ['--plan', f'--records_dir={out / "records"}'] + args,
  )
  assert code == 0, err
  assert 'total: 7 to 7 training runs and 6 to 6 baseline runs' in planned
  assert len(progress) == 13, progress
  assert sum('fine-tuning of FedAvg' in l for l in progress) == 3
  assert sum('local training of FedAvg' in l for l in progress) == 3
  page = (out / 'benchmark.md').read_text()
  scale = bench_settings.SETTINGS[setting].scale
  for words in (
      f'# Tail benchmark: {setting}',
      scale[:60],
      '(b) Unseen clients',
      '| FedAvg + fine-tuning |',
      '| Local training |',
      '--data_dir=<data_dir>',
  ):
    assert words in page, words
  assert str(tmp_path) not in page
  records = _records(out / 'records')
  training, unseen = set(), set()
  for name, record in records.items():
    assert sorted(record['origin']['data']) == sorted(files), name
    splits = record.get('splits', {})
    if name.startswith('select_') and 'test' in splits:
      training |= set(splits['test']['client_id'])
      assert 'unseen' not in splits
    elif name.startswith('final_') and 'unseen' in splits:
      unseen |= set(splits['unseen']['client_id'])
  # Half of the writers (users) train, the other half are unseen, in every
  # run: the setting's --test_clients_fraction=0.5 on the fixture.
  assert len(training) == len(unseen) == len(ids) // 2
  assert training | unseen == set(ids)
  results = json.loads((out / 'results.json').read_text())
  for seed in (0, 1):  # The page's numbers are the records'.
    record = records[
        next(
            n
            for n in records
            if n.startswith('final_fedavg_') and n.endswith(f'_seed{seed}')
        )
    ]
    for split in ('test', 'unseen'):
      assert results['reported']['fedavg'][seed][split]['mean'] == (
          pytest.approx(np.mean(record['splits'][split]['accuracy']))
      )
  return results, records


def test_emnist_setting_end_to_end_on_a_fixture(tmp_path, monkeypatch, capsys):
  ids = write_emnist(str(tmp_path / 'data'))
  args = _tiny_benchmark(
      'emnist', 'deltafl:theta:0.5,0.8', 0.001, '--emnist_model=linear'
  )
  results, records = _end_to_end(
      tmp_path, monkeypatch, capsys, 'emnist', args, ids, ['emnist_all.sqlite']
  )
  # Learnt: each seed's held-out mean accuracy is above the commonest
  # class's (its band is one of 4; a third of the labels are drawn anew).
  trivial = np.mean(records['trivial_final']['test'])
  for seed in (0, 1):
    assert results['reported']['fedavg'][seed]['test']['mean'] > trivial + 0.1
  assert set(results['reported']) == {'fedavg', 'deltafl', 'fedavg_ft', 'local'}


def test_stackoverflow_setting_end_to_end_on_a_fixture(
    tmp_path, monkeypatch, capsys
):
  ids = write_stackoverflow(str(tmp_path / 'data'))
  args = _tiny_benchmark(
      'stackoverflow',
      'fedprox:proximal_strength:0.01,0.1',
      0.5,
      '--stackoverflow_lstm_size=16',
  )
  results, records = _end_to_end(
      tmp_path,
      monkeypatch,
      capsys,
      'stackoverflow',
      args,
      ids,
      ['stackoverflow.sqlite', 'stackoverflow.word_count'],
  )
  # Every run on the batched engine (the stacked one runs no sequence
  # labels); the next word is learnt: FedAvg above 5% on every seed.
  for name, record in records.items():
    if name.startswith(('select_', 'final_')) and '_ft' not in name:
      assert '--simulation_engine=batched' in record['args'], name
  for seed in (0, 1):
    assert results['reported']['fedavg'][seed]['test']['mean'] > 0.05
