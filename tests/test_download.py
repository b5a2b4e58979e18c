# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests of `tasks.download` against an HTTP server on the loopback address.

The server serves fixture archives under several prefixes: `good/` (with HTTP
Range support), `norange/` (ignores Range: always the whole file),
`corrupt/` (one byte of the archive flipped), `truncated/` (announces the
whole length, sends half and closes), `short/` (the first half of the
archive, with a Content-Length of that half). Nothing leaves the machine.
"""

import contextlib
import hashlib
import http.server
import io
import lzma
import os
import socket
import tarfile
import threading

import pytest

from tasks import base
from tasks import data_files
from tasks import download
from tests import binary
from tests import sqlite_fixtures


class _Handler(http.server.BaseHTTPRequestHandler):
  """Serves `server.files[name]` under the prefixes of the module doc."""

  def do_GET(self):  # pylint: disable=invalid-name
    """Serves `/<prefix>/<name>` as its prefix (module doc) says."""
    prefix, _, name = self.path.lstrip('/').partition('/')
    body = self.server.files.get(name)
    self.server.log.append((prefix, name, self.headers.get('Range')))
    if body is None or prefix not in (
        'good',
        'norange',
        'corrupt',
        'truncated',
        'short',
    ):
      self.send_error(404)
      return
    if prefix == 'short':  # Cut, with a Content-Length saying so.
      body = body[: len(body) // 2]
    if prefix == 'corrupt':
      body = bytearray(body)
      body[len(body) // 2] ^= 0xFF
      body = bytes(body)
    start = 0
    wanted = self.headers.get('Range')
    if prefix == 'good' and wanted:
      start = int(wanted.split('=')[1].split('-')[0])
      if start >= len(body):
        self.send_error(416)
        return
      self.send_response(206)
      self.send_header(
          'Content-Range', f'bytes {start}-{len(body) - 1}/{len(body)}'
      )
    else:
      self.send_response(200)
    self.send_header('Content-Length', str(len(body) - start))
    self.end_headers()
    if prefix == 'truncated':
      self.wfile.write(body[: len(body) // 2])
      self.close_connection = True
      return
    self.wfile.write(body[start:])

  def log_message(self, *args):  # Quiet.
    del args


@pytest.fixture(scope='module')
def fixtures(tmp_path_factory):
  """The archives TFF publishes, made from fixture files."""
  src = str(tmp_path_factory.mktemp('src'))
  sqlite_fixtures.write_shakespeare(
      src, {'A': ['to be'], 'B': ['or not']}, {'A': ['to be'], 'B': ['that is']}
  )
  train = sqlite_fixtures.emnist_client_arrays(
      {'u1': 4, 'u2': 4, 'u3': 4}, seed=0
  )
  test = sqlite_fixtures.emnist_client_arrays(
      {'u1': 2, 'u2': 2, 'u3': 2}, seed=1
  )
  sqlite_fixtures.write_emnist(src, train, test)
  contents = {}
  files = {}
  for name in ('shakespeare.sqlite', 'emnist_all.sqlite'):
    with open(os.path.join(src, name), 'rb') as f:
      contents[name] = f.read()
    files[name + '.lzma'] = lzma.compress(contents[name])
  word_counts = b'the 9\nof 7\n'
  archive = io.BytesIO()
  with tarfile.open(fileobj=archive, mode='w:bz2') as tar:
    info = tarfile.TarInfo('stackoverflow.word_count')
    info.size = len(word_counts)
    tar.addfile(info, io.BytesIO(word_counts))
  files['stackoverflow.word_count.tar.bz2'] = archive.getvalue()
  contents['stackoverflow.word_count'] = word_counts
  return files, contents


@pytest.fixture(scope='module')
def server(fixtures):
  httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _Handler)
  httpd.files = fixtures[0]
  httpd.log = []
  thread = threading.Thread(target=httpd.serve_forever, daemon=True)
  thread.start()
  yield httpd
  httpd.shutdown()
  httpd.server_close()


def _use(monkeypatch, server, prefix):
  url = f'http://127.0.0.1:{server.server_address[1]}/{prefix}/'
  monkeypatch.setenv(download.BASE_URL_ENV, url)
  server.log.clear()
  return url


def _read(path):
  with open(path, 'rb') as f:
    return f.read()


def _sha256(data):
  return hashlib.sha256(data).hexdigest()


def test_fetch_verifies_decompresses_and_renames(
    tmp_path, monkeypatch, server, fixtures, capfd
):
  _use(monkeypatch, server, 'good')
  data_dir = str(tmp_path / 'new' / 'dir')
  path = download.fetch(data_files.SHAKESPEARE, data_dir)
  assert path == os.path.join(data_dir, 'shakespeare.sqlite')
  assert _read(path) == fixtures[1]['shakespeare.sqlite']
  assert os.listdir(data_dir) == ['shakespeare.sqlite']  # No .part, no tmp.
  assert server.log == [('good', 'shakespeare.sqlite.lzma', None)]
  err = capfd.readouterr().err
  assert 'Downloading shakespeare.sqlite.lzma' in err and '100%' in err
  # A published hash that matches, and a tar.bz2 member extracted.
  archive = fixtures[0]['stackoverflow.word_count.tar.bz2']
  path = download.fetch(
      data_files.STACKOVERFLOW_WORD_COUNT,
      data_dir,
      progress=False,
      published=download.Published(size=len(archive), sha256=_sha256(archive)),
  )
  assert _read(path) == b'the 9\nof 7\n'
  assert data_files.find(data_files.STACKOVERFLOW_WORD_COUNT, data_dir) == path


def test_ensure_fetches_only_missing_files(
    tmp_path, monkeypatch, server, fixtures
):
  _use(monkeypatch, server, 'good')
  data_dir = str(tmp_path)
  sqlite_fixtures.write_shakespeare(data_dir, {'Z': ['z']}, {'Z': ['z']})
  mine = _read(os.path.join(data_dir, 'shakespeare.sqlite'))
  paths = download.ensure(
      [data_files.SHAKESPEARE, data_files.EMNIST], data_dir, progress=False
  )
  assert [os.path.basename(p) for p in paths] == [
      'shakespeare.sqlite',
      'emnist_all.sqlite',
  ]
  assert _read(paths[0]) == mine  # Kept, not fetched.
  assert _read(paths[1]) == fixtures[1]['emnist_all.sqlite']
  assert [name for _, name, _ in server.log] == ['emnist_all.sqlite.lzma']
  assert (
      download.files_for_task('stackoverflow_tag')
      == download.DATASETS['stackoverflow']
  )
  assert download.files_for_task('synthetic') == ()


def test_partial_download_resumes_with_range(
    tmp_path, monkeypatch, server, fixtures
):
  _use(monkeypatch, server, 'good')
  archive = fixtures[0]['emnist_all.sqlite.lzma']
  part = tmp_path / 'emnist_all.sqlite.lzma.part'
  part.write_bytes(archive[:1000])
  path = download.fetch(data_files.EMNIST, str(tmp_path), progress=False)
  assert server.log == [('good', 'emnist_all.sqlite.lzma', 'bytes=1000-')]
  assert _read(path) == fixtures[1]['emnist_all.sqlite']
  assert not part.exists()
  # A .part as long as the file: the server refuses the range (416) and the
  # download starts again from byte 0.
  os.remove(path)
  part.write_bytes(archive)
  _use(monkeypatch, server, 'good')
  path = download.fetch(data_files.EMNIST, str(tmp_path), progress=False)
  assert [r for _, _, r in server.log] == [f'bytes={len(archive)}-', None]
  assert _read(path) == fixtures[1]['emnist_all.sqlite']


def test_server_without_range_restarts(tmp_path, monkeypatch, server, fixtures):
  _use(monkeypatch, server, 'norange')
  (tmp_path / 'emnist_all.sqlite.lzma.part').write_bytes(b'stale bytes')
  path = download.fetch(data_files.EMNIST, str(tmp_path), progress=False)
  assert server.log == [('norange', 'emnist_all.sqlite.lzma', 'bytes=11-')]
  assert _read(path) == fixtures[1]['emnist_all.sqlite']


def _closed_port():
  with contextlib.closing(socket.socket()) as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def test_failures_are_one_line_naming_the_url(
    tmp_path, monkeypatch, server, fixtures
):
  archive = fixtures[0]['stackoverflow.word_count.tar.bz2']
  cases = [
      # (prefix or URL, file, published, words in the message, .part kept)
      (
          f'http://127.0.0.1:{_closed_port()}/',
          data_files.EMNIST,
          None,
          'offline',
          False,
      ),
      ('missing', data_files.EMNIST, None, 'HTTP 404', False),
      ('corrupt', data_files.EMNIST, None, 'corrupted', False),
      (
          'good',
          data_files.STACKOVERFLOW_WORD_COUNT,
          download.Published(sha256=_sha256(b'other')),
          'SHA-256',
          False,
      ),
      (
          'good',
          data_files.STACKOVERFLOW_WORD_COUNT,
          download.Published(size=len(archive) + 1),
          'bytes',
          False,
      ),
      ('truncated', data_files.SHAKESPEARE, None, 'connection ended', True),
      # The whole of a cut archive arrives (its size is what the server
      # said): the LZMA decoder's end-of-stream check finds it.
      (
          'short',
          data_files.SHAKESPEARE,
          None,
          'truncated (the LZMA stream has no end)',
          False,
      ),
  ]
  for where, data_file, published, words, kept in cases:
    data_dir = tmp_path / where.replace('/', '_').replace(':', '_')
    url = (
        where if where.startswith('http') else _use(monkeypatch, server, where)
    )
    monkeypatch.setenv(download.BASE_URL_ENV, url)
    with pytest.raises(download.DownloadError) as raised:
      download.fetch(
          data_file, str(data_dir), progress=False, published=published
      )
    message = str(raised.value)
    assert isinstance(raised.value, base.TaskError)
    assert '\n' not in message, message
    assert url + download.archive_name(data_file) in message, message
    assert words in message and '--download' in message, message
    left = sorted(os.listdir(data_dir))
    part = download.archive_name(data_file) + '.part'
    assert left == ([part] if kept else []), (where, left)
  # The truncated download resumes where it stopped.
  data_dir = tmp_path / 'truncated'
  have = os.path.getsize(data_dir / 'shakespeare.sqlite.lzma.part')
  assert have == len(fixtures[0]['shakespeare.sqlite.lzma']) // 2
  _use(monkeypatch, server, 'good')
  path = download.fetch(data_files.SHAKESPEARE, str(data_dir), progress=False)
  assert server.log == [('good', 'shakespeare.sqlite.lzma', f'bytes={have}-')]
  assert _read(path) == fixtures[1]['shakespeare.sqlite']


def test_published_hashes_are_tffs():
  # TFF 0.87 stackoverflow.load_word_counts / load_tag_counts pin these.
  assert download.PUBLISHED['stackoverflow.word_count.tar.bz2'].sha256 == (
      '1dc00256d6e527c54b9756d968118378ae14e6692c0b3b6cad470cdd3f0c519c'
  )
  assert download.PUBLISHED['stackoverflow.tag_count.tar.bz2'].sha256 == (
      '6fe281cec490d9384a290d560072438e7e2b377bbb823876ce7bd6f82696772d'
  )
  for files in download.DATASETS.values():
    for data_file in files:
      assert data_file.url == download.TFF_BASE_URL + download.archive_name(
          data_file
      )
      assert download.archive_name(data_file) in download.PUBLISHED


def test_training_binary_downloads_when_asked(tmp_path, monkeypatch, server):
  args = [
      '--task=emnist_character',
      '--emnist_model=linear',
      f'--data_dir={tmp_path / "data"}',
      '--total_rounds=1',
      '--clients_per_round=2',
      '--client_batch_size=2',
      '--progress=false',
      f'--root_output_dir={tmp_path / "out"}',
  ]
  _use(monkeypatch, server, 'good')
  # Without --download nothing is fetched: one line with the fix.
  code, _, stderr = binary.run_module('run.train', args)
  lines = binary.error_lines(stderr)
  assert code == 2 and len(lines) == 1 and '--download' in lines[0], stderr
  assert server.log == []
  code, stdout, stderr = binary.run_module('run.train', args + ['--download'])
  assert code == 0, stderr
  assert server.log == [('good', 'emnist_all.sqlite.lzma', None)]
  assert 'Per-client metrics after round 1' in stdout
  assert os.listdir(tmp_path / 'data') == ['emnist_all.sqlite']
  # The download binary: the file is there, so nothing is fetched.
  server.log.clear()
  code, stdout, stderr = binary.run_module(
      'run.download', ['--datasets=emnist', f'--data_dir={tmp_path / "data"}']
  )
  assert code == 0, stderr
  assert stdout.split() == [str(tmp_path / 'data' / 'emnist_all.sqlite')]
  assert server.log == []
  code, _, stderr = binary.run_module('run.download', ['--datasets=mnist'])
  assert code == 2 and binary.error_lines(stderr) == [
      'download: error: --datasets must name some of emnist, shakespeare, '
      'stackoverflow, got mnist'
  ]


def test_a_data_url_that_is_not_a_url_is_one_line(tmp_path, monkeypatch):
  for url in ('not a url', 'example.org/tff', 'http://', 'mailto:x@y'):
    monkeypatch.setenv(download.BASE_URL_ENV, url)
    with pytest.raises(download.DownloadError) as raised:
      download.fetch(data_files.EMNIST, str(tmp_path / 'd'), progress=False)
    message = str(raised.value)
    assert '\n' not in message, message
    assert f'${download.BASE_URL_ENV}={url!r} is not a URL' in message
    assert not (tmp_path / 'd').exists()  # Refused before anything.
