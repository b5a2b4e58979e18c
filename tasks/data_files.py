# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""TFF's cached dataset files in a data directory, and client selection.

TFF 0.87's loaders (`tensorflow_federated/python/simulation/datasets/`
`emnist.py`, `shakespeare.py`, `stackoverflow.py`, `download.py`) download on
first use. We never let them: a task first looks for the files here and raises
`base.TaskError` naming the missing file, the directory searched and the URL.
Downloading is `tasks.download`'s job, only when a user asks (`--download`).

Layout TFF expects in its cache directory (default `~/.tff`):

* `download.get_compressed_file(origin, cache_dir)` fetches
  `<name>.sqlite.lzma` and keeps the decompressed `cache_dir/<name>.sqlite`;
  when that file exists it is used as is. So `load_data(cache_dir=data_dir)`
  reads `data_dir/emnist_all.sqlite`, `shakespeare.sqlite` or
  `stackoverflow.sqlite` without any network access.
* `stackoverflow.load_word_counts` / `load_tag_counts` go through
  `tf.keras.utils.get_file(..., cache_dir=cache_dir, extract=True)` with a
  pinned SHA-256: the archive lives in `cache_dir/datasets/` (Keras'
  `cache_subdir`) and is extracted there to `stackoverflow.word_count`
  (lines `word count`, most frequent first) and `stackoverflow.tag_count`
  (a JSON object `{tag: count}`). Keras re-downloads whenever the archive is
  absent or its hash differs, and the baselines call these loaders without
  `cache_dir`, so we read the extracted files ourselves, in `data_dir` or
  `data_dir/datasets`, with TFF's exact parsing.

The SQLite schema is `examples(split_name, client_id,
serialized_example_proto)` plus `client_metadata(client_id, split_name,
num_examples)`; we read the example counts from `client_metadata`, which makes
the `min_examples` filter cheap on the full datasets (342k StackOverflow
users).

Client selection shared by the TFF-backed tasks (`select_clients`):
`min_examples` filter, optional deterministic `max_clients` subset, then
either the dataset's own per-client test split (thesis protocol) or, with
`test_clients_fraction > 0`, disjoint unseen test clients (Delta-FL protocol,
spec `fedplus_deltafl.md` B.11). In the Delta-FL protocol a device holds all
its data, so each client's train and test splits are merged first: the
filter counts all of a client's examples and unseen test clients are
evaluated on their full local data.
"""

import collections
from collections.abc import Mapping, Sequence
import dataclasses
import json
import os
import shutil
import sqlite3
import tarfile
from typing import Optional

import numpy as np

from tasks import base

_TFF_URL = 'https://storage.googleapis.com/tff-datasets-public/'
KERAS_SUBDIR = 'datasets'


@dataclasses.dataclass(frozen=True)
class DataFile:
  """A file a TFF loader reads from its cache directory.

  Attributes:
    name: File name expected in the data directory.
    url: The URL TFF downloads it from.
    archive: `'lzma'` (a compressed single file) or `'tar.bz2'` (an archive
      holding `name`).
  """

  name: str
  url: str
  archive: str

  def instructions(self, data_dir: str) -> str:
    """How to obtain the file, as a shell command."""
    target = os.path.join(data_dir, self.name)
    if self.archive == 'lzma':
      return f'curl -L {self.url} | unxz > {target}'
    return f'curl -L {self.url} | tar -xj -C {data_dir}'


EMNIST = DataFile(
    'emnist_all.sqlite', _TFF_URL + 'emnist_all.sqlite.lzma', 'lzma'
)
SHAKESPEARE = DataFile(
    'shakespeare.sqlite', _TFF_URL + 'shakespeare.sqlite.lzma', 'lzma'
)
STACKOVERFLOW = DataFile(
    'stackoverflow.sqlite', _TFF_URL + 'stackoverflow.sqlite.lzma', 'lzma'
)
STACKOVERFLOW_WORD_COUNT = DataFile(
    'stackoverflow.word_count',
    _TFF_URL + 'stackoverflow.word_count.tar.bz2',
    'tar.bz2',
)
STACKOVERFLOW_TAG_COUNT = DataFile(
    'stackoverflow.tag_count',
    _TFF_URL + 'stackoverflow.tag_count.tar.bz2',
    'tar.bz2',
)


def default_data_dir() -> str:
  """TFF's default cache directory, `~/.tff`."""
  return os.path.join(os.path.expanduser('~'), '.tff')


def resolve_data_dir(data_dir: Optional[str]) -> str:
  """`data_dir` with `~` expanded, or TFF's default cache when `None`."""
  if data_dir is None:
    return default_data_dir()
  if not isinstance(data_dir, str) or not data_dir:
    raise base.TaskError(
        f'data_dir must be a non-empty string, got {data_dir!r}'
    )
  return os.path.expanduser(data_dir)


def _candidate_dirs(data_file: DataFile, data_dir: str) -> list[str]:
  if data_file.archive == 'lzma':
    return [data_dir]
  return [data_dir, os.path.join(data_dir, KERAS_SUBDIR)]


def find(data_file: DataFile, data_dir: Optional[str]) -> str:
  """Path of `data_file` in `data_dir`; never downloads.

  SQLite files must be `data_dir/<name>` (TFF's layout). Count files are
  looked up in `data_dir` and `data_dir/datasets` (Keras' layout); a
  `<name>.tar.bz2` archive found there but not yet extracted is extracted in
  place.

  Args:
    data_file: The file to find.
    data_dir: The directory to search (`None`: `~/.tff`).

  Returns:
    The absolute path of the file.

  Raises:
    TaskError: If the file is missing; the one-line message names the file,
      the directory searched and how to get it.
  """
  data_dir = resolve_data_dir(data_dir)
  dirs = _candidate_dirs(data_file, data_dir)
  for directory in dirs:
    path = os.path.join(directory, data_file.name)
    if os.path.isfile(path):
      return os.path.abspath(path)
  if data_file.archive == 'tar.bz2':
    for directory in dirs:
      archive = os.path.join(directory, data_file.name + '.tar.bz2')
      if os.path.isfile(archive):
        _extract_member(archive, data_file.name, directory)
        return os.path.abspath(os.path.join(directory, data_file.name))
  searched = ' or '.join(dirs)
  raise base.TaskError(
      f'missing data file {data_file.name!r} in {searched}: download '
      f'{data_file.url} and decompress it into {data_dir} '
      f'(`{data_file.instructions(data_dir)}`), or rerun the training '
      'binary with --download'
  )


def _extract_member(archive: str, member: str, directory: str) -> None:
  """Extracts `member` of a .tar.bz2 into `directory`, whole or not at all."""
  final = os.path.join(directory, member)
  # Under a temporary name, renamed when whole: a killed or failed extraction
  # must not leave a partial file that the next run would take as the data.
  temp = f'{final}.tmp-{os.getpid()}'
  try:
    with tarfile.open(archive, 'r:bz2') as tar:
      names = {os.path.normpath(m.name): m for m in tar.getmembers()}
      info = names.get(member)
      if info is None or not info.isfile():
        raise base.TaskError(
            f'archive {archive} does not hold a file {member!r} '
            f'(found {sorted(names)[:5]})'
        )
      with tar.extractfile(info) as src, open(temp, 'wb') as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    os.replace(temp, final)
  except (tarfile.TarError, EOFError, OSError) as e:
    raise base.TaskError(
        f'cannot extract {member!r} from {archive} '
        f'({type(e).__name__}: {e}); if the archive is damaged, delete it '
        'and download it again'
    ) from e
  finally:
    if os.path.exists(temp):
      os.remove(temp)


def sql_example_counts(
    database_path: str, split_names: Sequence[str]
) -> dict[str, int]:
  """Examples per client over `split_names`, from `client_metadata`.

  Raises:
    TaskError: If the file is not a TFF SQLite dataset, or a split has no
      client (TFF's `ClientData` would fail on it with `StopIteration`).
  """
  counts = collections.Counter()
  connection = sqlite3.connect(database_path)
  try:
    for split in split_names:
      rows = connection.execute(
          'SELECT client_id, num_examples FROM client_metadata '
          'WHERE split_name = ?',
          (split,),
      ).fetchall()
      if not rows:
        raise base.TaskError(
            f'{database_path} has no clients in its {split!r} split (its '
            'client_metadata table lists none): the file is incomplete; '
            'fetch it again (--download, after removing it)'
        )
      for client_id, num in rows:
        counts[client_id] += int(num)
  except sqlite3.DatabaseError as e:
    raise base.TaskError(
        f'{database_path} is not a TFF SQLite dataset: {e}'
    ) from e
  finally:
    connection.close()
  return dict(counts)


def read_word_counts(
    path: str, vocab_size: Optional[int] = None
) -> collections.OrderedDict[str, int]:
  """Parses `stackoverflow.word_count` as `stackoverflow.load_word_counts`."""
  word_counts = collections.OrderedDict()
  with open(path) as f:
    for line in f:
      word, count = line.split()
      word_counts[word] = int(count)
      if vocab_size is not None and len(word_counts) >= vocab_size:
        break
  return word_counts


def read_tag_counts(path: str) -> collections.OrderedDict[str, int]:
  """Parses `stackoverflow.tag_count` as `stackoverflow.load_tag_counts`."""
  with open(path) as f:
    tag_counts = json.load(f)
  return collections.OrderedDict(
      sorted(tag_counts.items(), key=lambda item: item[1], reverse=True)
  )


def merge_splits(
    first: base.ClientData, second: base.ClientData
) -> base.ClientData:
  """Each client's examples of `first` followed by those of `second`.

  Clients present in only one split keep that split's examples. Both inputs
  must return an empty dataset (not raise) from `serializable_dataset_fn` for
  an unknown client, as TFF's `SqlClientData` does.
  """
  first_fn = first.serializable_dataset_fn
  second_fn = second.serializable_dataset_fn

  def dataset_fn(client_id):
    return first_fn(client_id).concatenate(second_fn(client_id))

  ids = sorted(set(first.client_ids) | set(second.client_ids))
  return base.ClientData.from_clients_and_tf_fn(ids, dataset_fn)


def _filter(
    client_data: base.ClientData,
    min_examples: int,
    counts: Optional[Mapping[str, int]],
) -> base.ClientData:
  if min_examples <= 0:
    return client_data
  if counts is None:
    return base.filter_clients(client_data, min_examples=min_examples)
  kept = [c for c in client_data.client_ids if counts.get(c, 0) >= min_examples]
  if not kept:
    raise base.TaskError(
        f'no client has at least {min_examples} examples '
        f'(out of {len(client_data.client_ids)} clients)'
    )
  return base.select_clients(client_data, kept)


def _subsample(
    client_data: base.ClientData, max_clients: Optional[int], seed: int
) -> base.ClientData:
  ids = client_data.client_ids
  if max_clients is None or len(ids) <= max_clients:
    return client_data
  return base.select_clients(
      client_data, subsample_client_ids(ids, max_clients, seed)
  )


def subsample_client_ids(
    client_ids: Sequence[str], max_clients: Optional[int], seed: int
) -> list[str]:
  """A seeded random subset of at most `max_clients` of the ids, sorted."""
  ids = sorted(client_ids)
  if max_clients is None or len(ids) <= max_clients:
    return ids
  rng = np.random.default_rng([seed, 1])
  return sorted(
      ids[i] for i in rng.choice(len(ids), max_clients, replace=False)
  )


def validate_selection_args(
    *,
    min_examples: int,
    test_clients_fraction: float,
    max_clients: Optional[int],
    batch_size: int,
) -> None:
  """Eager checks of the arguments every TFF-backed task shares."""
  if batch_size < 1:
    raise base.TaskError(f'batch size must be >= 1, got {batch_size}')
  if min_examples < 0:
    raise base.TaskError(f'min_examples must be >= 0, got {min_examples}')
  if not 0.0 <= test_clients_fraction < 1.0:
    raise base.TaskError(
        f'test_clients_fraction must be in [0, 1), got {test_clients_fraction}'
    )
  if max_clients is not None and max_clients < 1:
    raise base.TaskError(f'max_clients must be >= 1 or None, got {max_clients}')


def select_clients(
    *,
    train_data: base.ClientData,
    test_data: base.ClientData,
    seed: int,
    min_examples: int = 0,
    test_clients_fraction: float = 0.0,
    max_clients: Optional[int] = None,
    train_counts: Optional[Mapping[str, int]] = None,
    test_counts: Optional[Mapping[str, int]] = None,
    same_data: bool = False,
) -> tuple[base.ClientData, base.ClientData]:
  """Training and test clients under the thesis or the Delta-FL protocol.

  Args:
    train_data: The dataset's training split.
    test_data: The dataset's per-client test split.
    seed: Seed of the `max_clients` subset and of the train/test split.
    min_examples: Keep clients with at least this many examples (training
      split; both splits when `test_clients_fraction > 0`).
    test_clients_fraction: 0 keeps the per-client test split of the training
      clients; in (0, 1) merges each client's splits and holds out this
      fraction of the clients as unseen test clients.
    max_clients: Keep a seeded random subset of at most this many clients
      (after the filter, before the split).
    train_counts: Examples per client of `train_data` (e.g. from the SQLite
      metadata); counted by iterating when `None`.
    test_counts: The same for `test_data`.
    same_data: `train_data` and `test_data` are the same examples (TFF's
      synthetic data): never merge them.

  Returns:
    `(train_clients, test_clients)`.

  Raises:
    TaskError: If an argument is invalid or no client is left.
  """
  if test_clients_fraction > 0.0:
    if same_data:
      pool, counts = train_data, train_counts
    else:
      pool = merge_splits(train_data, test_data)
      counts = None
      if train_counts is not None and test_counts is not None:
        counts = collections.Counter(train_counts)
        counts.update(test_counts)
    pool = _subsample(_filter(pool, min_examples, counts), max_clients, seed)
    return base.split_clients(
        pool, test_fraction=test_clients_fraction, seed=seed
    )
  train = _subsample(
      _filter(train_data, min_examples, train_counts), max_clients, seed
  )
  test_ids = set(test_data.client_ids)
  kept = [c for c in train.client_ids if c in test_ids]
  if not kept:
    raise base.TaskError(
        'none of the selected training clients has a test split; use '
        'test_clients_fraction > 0'
    )
  return train, base.select_clients(test_data, kept)
