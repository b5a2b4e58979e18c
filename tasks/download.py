# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Fetches TFF's published dataset files into a data directory, on request.

Nothing here runs unless a user asks for it (`--download` of the training
binaries, or `tff-hetero-download`, `run/download.py`): without it a missing
file stops a run with `data_files.find`'s instructions, so an offline run never
waits on a network. With it, each missing file of `data_files` is fetched from
TFF's bucket (`https://storage.googleapis.com/tff-datasets-public/`, the URLs of
TFF 0.87's `simulation/datasets/{emnist,shakespeare,stackoverflow}.py`):

1. The archive is streamed, with a progress bar, to `<archive>.part` in the
   data directory. A `.part` left by an interrupted run is resumed with an
   HTTP `Range` request; a server that ignores it (status 200) or refuses it
   (416) makes the download restart from byte 0.
2. It is verified: its size against the server's `Content-Length` (a
   connection that ends early leaves the `.part` for the next run to resume)
   and against `PUBLISHED`, and its SHA-256 where TFF publishes one. A file
   that fails a check is deleted, so the next run starts afresh.
3. It is decompressed (`.lzma`, checked by the decoder's own integrity check
   and end-of-stream marker) or extracted (`.tar.bz2`) to a temporary name in
   the same folder and renamed to its final name, so a partial download or
   decompression never looks like a complete data file.

What TFF publishes: SHA-256 hashes only for the StackOverflow count archives
(pinned in TFF's `stackoverflow.load_word_counts` and `load_tag_counts`); no
size or hash for the three `.sqlite.lzma` files, whose check is the
`Content-Length`, the LZMA decoder's integrity check and the two SQLite
tables TFF's `SqlClientData` reads (`examples`, `client_metadata`).

The environment variable `TFF_HETERO_DATA_URL` replaces the bucket's URL
(tests point it at a server on the loopback address; a mirror works too).
"""

from collections.abc import Sequence
import contextlib
import dataclasses
import hashlib
import http.client
import lzma
import os
import socket
import sqlite3
import sys
import tarfile
from typing import BinaryIO, Optional
import urllib.error
import urllib.parse
import urllib.request

import tqdm

from tasks import base
from tasks import data_files

BASE_URL_ENV = 'TFF_HETERO_DATA_URL'
TFF_BASE_URL = 'https://storage.googleapis.com/tff-datasets-public/'
CHUNK_BYTES = 1 << 20
TIMEOUT_SECONDS = 60.0


@dataclasses.dataclass(frozen=True)
class Published:
  """What TFF publishes about an archive (`None`: nothing published)."""

  size: Optional[int] = None
  sha256: Optional[str] = None


PUBLISHED = {
    'emnist_all.sqlite.lzma': Published(),
    'shakespeare.sqlite.lzma': Published(),
    'stackoverflow.sqlite.lzma': Published(),
    'stackoverflow.word_count.tar.bz2': Published(
        sha256='1dc00256d6e527c54b9756d968118378'
        'ae14e6692c0b3b6cad470cdd3f0c519c'
    ),
    'stackoverflow.tag_count.tar.bz2': Published(
        sha256='6fe281cec490d9384a290d560072438e'
        '7e2b377bbb823876ce7bd6f82696772d'
    ),
}

DATASETS = {
    'emnist': (data_files.EMNIST,),
    'shakespeare': (data_files.SHAKESPEARE,),
    'stackoverflow': (
        data_files.STACKOVERFLOW,
        data_files.STACKOVERFLOW_WORD_COUNT,
        data_files.STACKOVERFLOW_TAG_COUNT,
    ),
}
_TASK_DATASETS = {
    'emnist_character': 'emnist',
    'shakespeare_character': 'shakespeare',
    'stackoverflow_word': 'stackoverflow',
    'stackoverflow_tag': 'stackoverflow',
}


class DownloadError(base.TaskError):
  """A file could not be fetched or failed a check (one-line message)."""


def files_for_task(task_name: str) -> tuple[data_files.DataFile, ...]:
  """The files the task `task_name` reads (none for built-in data)."""
  dataset = _TASK_DATASETS.get(task_name)
  return DATASETS[dataset] if dataset else ()


def archive_name(data_file: data_files.DataFile) -> str:
  """The name of the file TFF publishes for `data_file`."""
  return data_file.url.rsplit('/', 1)[-1]


def base_url() -> str:
  """TFF's bucket, or `$TFF_HETERO_DATA_URL` when set.

  Raises:
    DownloadError: If `$TFF_HETERO_DATA_URL` is not an http(s), ftp or file
      URL.
  """
  url = os.environ.get(BASE_URL_ENV) or TFF_BASE_URL
  parsed = urllib.parse.urlsplit(url)
  if parsed.scheme not in ('http', 'https', 'ftp', 'file') or (
      parsed.scheme != 'file' and not parsed.netloc
  ):
    raise DownloadError(
        f'${BASE_URL_ENV}={url!r} is not a URL (e.g. '
        f'https://example.org/tff-data/ or file:///srv/tff-data/); unset it '
        "to download from TFF's bucket"
    )
  return url if url.endswith('/') else url + '/'


def ensure(
    files: Sequence[data_files.DataFile],
    data_dir: Optional[str],
    *,
    progress: bool = True,
) -> list[str]:
  """Paths of `files` in `data_dir`, fetching the missing ones.

  Args:
    files: The files, e.g. `files_for_task(name)` or `DATASETS['emnist']`.
    data_dir: Their folder (`None`: TFF's cache, `~/.tff`); created if
      missing.
    progress: Show a progress bar on stderr while downloading.

  Returns:
    The absolute paths, in the order of `files`.

  Raises:
    DownloadError: If a file cannot be fetched or fails a check.
  """
  data_dir = data_files.resolve_data_dir(data_dir)
  paths = []
  for data_file in files:
    try:
      paths.append(data_files.find(data_file, data_dir))
    except base.TaskError:
      paths.append(fetch(data_file, data_dir, progress=progress))
  return paths


def fetch(
    data_file: data_files.DataFile,
    data_dir: str,
    *,
    progress: bool = True,
    published: Optional[Published] = None,
) -> str:
  """Downloads, verifies and unpacks `data_file` into `data_dir`.

  Args:
    data_file: The file to fetch (its archive is fetched from `base_url()`).
    data_dir: The destination folder; created if missing.
    progress: Show a progress bar on stderr.
    published: The archive's published size and hash (default:
      `PUBLISHED`).

  Returns:
    The absolute path of the unpacked file.

  Raises:
    DownloadError: If the download fails (the message names the URL and the
      fix) or the file fails a check (then it is deleted).
  """
  name = archive_name(data_file)
  if published is None:
    published = PUBLISHED.get(name, Published())
  url = base_url() + name
  try:
    os.makedirs(data_dir, exist_ok=True)
  except OSError as e:
    raise DownloadError(f'cannot create --data_dir {data_dir}: {e}') from e
  part = os.path.join(data_dir, name + '.part')
  _download(url, part, progress=progress)
  try:
    _verify(url, part, published)
    target = os.path.join(data_dir, data_file.name)
    _unpack(url, part, data_file, target)
  except DownloadError:
    _remove(part)
    raise
  _remove(part)
  return os.path.abspath(target)


def _retry_hint(url: str) -> str:
  return (
      f'check the connection (or fetch {url} yourself) and rerun with '
      '--download; a partial download resumes'
  )


def _download(url: str, part: str, *, progress: bool) -> None:
  """Streams `url` into `part`, resuming an earlier partial download."""
  have = os.path.getsize(part) if os.path.isfile(part) else 0
  request = urllib.request.Request(url)
  if have:
    request.add_header('Range', f'bytes={have}-')
  try:
    response = urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS)
  except urllib.error.HTTPError as e:
    if e.code == 416 and have:  # The range is past the end: start again.
      _remove(part)
      _download(url, part, progress=progress)
      return
    raise DownloadError(
        f'cannot download {url}: HTTP {e.code} {e.reason}; '
        f'{_retry_hint(url)}'
    ) from e
  except (urllib.error.URLError, OSError) as e:
    reason = getattr(e, 'reason', e)
    raise DownloadError(
        f'cannot download {url} (offline?): {reason}; {_retry_hint(url)}'
    ) from e
  with response:
    resumed = (
        have
        and response.status == 206
        and _range_start(response.headers.get('Content-Range')) == have
    )
    if not resumed:
      have = 0
    length = response.headers.get('Content-Length')
    total = have + int(length) if length is not None else None
    with open(part, 'ab' if resumed else 'wb') as out:
      _copy(response, out, url=url, total=total, done=have, progress=progress)
  size = os.path.getsize(part)
  if total is not None and size != total:
    raise DownloadError(
        f'cannot download {url}: the connection ended after {size} of '
        f'{total} bytes; {_retry_hint(url)}'
    )


def _range_start(content_range: Optional[str]) -> Optional[int]:
  """The first byte of `Content-Range: bytes START-END/TOTAL`."""
  if not content_range or not content_range.startswith('bytes '):
    return None
  try:
    return int(content_range[len('bytes ') :].split('-', 1)[0])
  except ValueError:
    return None


def _copy(
    response: BinaryIO,
    out: BinaryIO,
    *,
    url: str,
    total: Optional[int],
    done: int,
    progress: bool,
) -> None:
  with tqdm.tqdm(
      total=total,
      initial=done,
      unit='B',
      unit_scale=True,
      desc=f'Downloading {url.rsplit("/", 1)[-1]}',
      disable=not progress,
      file=sys.stderr,
  ) as progress_bar:
    while True:
      try:
        chunk = response.read(CHUNK_BYTES)
      except http.client.IncompleteRead as e:
        out.write(e.partial)
        return  # The size check reports it; the `.part` is kept.
      except (OSError, socket.timeout) as e:
        out.flush()
        raise DownloadError(
            f'cannot download {url}: {e}; {_retry_hint(url)}'
        ) from e
      if not chunk:
        return
      out.write(chunk)
      progress_bar.update(len(chunk))


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(CHUNK_BYTES), b''):
      digest.update(chunk)
  return digest.hexdigest()


def _verify(url: str, part: str, published: Published) -> None:
  deleted = 'deleted it; rerun with --download to fetch it again'
  size = os.path.getsize(part)
  if published.size is not None and size != published.size:
    raise DownloadError(
        f'{url} has {size} bytes, TFF publishes {published.size}: {deleted}'
    )
  if published.sha256 is not None:
    got = _sha256(part)
    if got != published.sha256:
      raise DownloadError(
          f'{url} has SHA-256 {got}, TFF publishes {published.sha256}: '
          f'{deleted}'
      )


def _unpack(
    url: str, part: str, data_file: data_files.DataFile, target: str
) -> None:
  """Decompresses or extracts `part` to `target`, atomically."""
  tmp = f'{target}.tmp-{os.getpid()}'
  try:
    if data_file.archive == 'lzma':
      _decompress_lzma(url, part, tmp)
      _check_sqlite(url, tmp)
    else:
      _extract(url, part, data_file.name, tmp)
    os.replace(tmp, target)
  finally:
    _remove(tmp)


def _decompress_lzma(url: str, source: str, dest: str) -> None:
  decompressor = lzma.LZMADecompressor()
  try:
    with open(source, 'rb') as src, open(dest, 'wb') as out:
      for chunk in iter(lambda: src.read(CHUNK_BYTES), b''):
        out.write(decompressor.decompress(chunk))
  except lzma.LZMAError as e:
    raise DownloadError(
        f'{url} is corrupted ({e}); deleted it, rerun with --download to '
        'fetch it again'
    ) from e
  if not decompressor.eof:
    raise DownloadError(
        f'{url} is truncated (the LZMA stream has no end); deleted it, rerun '
        'with --download to fetch it again'
    )


def _check_sqlite(url: str, path: str) -> None:
  try:
    connection = sqlite3.connect(f'file:{path}?mode=ro', uri=True)
    try:
      for table in ('examples', 'client_metadata'):
        connection.execute(f'SELECT * FROM {table} LIMIT 1').fetchall()
    finally:
      connection.close()
  except sqlite3.DatabaseError as e:
    raise DownloadError(
        f'{url} does not hold a TFF SQLite dataset ({e}); deleted it, rerun '
        'with --download to fetch it again'
    ) from e


def _extract(url: str, archive: str, member: str, dest: str) -> None:
  try:
    with tarfile.open(archive, 'r:bz2') as tar:
      info = {os.path.normpath(m.name): m for m in tar.getmembers()}.get(member)
      if info is None or not info.isfile():
        raise DownloadError(
            f'{url} does not hold a file {member!r}; deleted it'
        )
      with tar.extractfile(info) as src, open(dest, 'wb') as out:
        for chunk in iter(lambda: src.read(CHUNK_BYTES), b''):
          out.write(chunk)
  except (tarfile.TarError, EOFError, OSError) as e:
    raise DownloadError(
        f'{url} is corrupted ({e}); deleted it, rerun with --download to '
        'fetch it again'
    ) from e


def _remove(path: str) -> None:
  with contextlib.suppress(FileNotFoundError):
    os.remove(path)
