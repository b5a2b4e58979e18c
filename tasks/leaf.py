# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Federated datasets in LEAF's JSON layout: FEMNIST, Sent140, Shakespeare.

LEAF (Caldas et al., "LEAF: A Benchmark for Federated Settings",
arXiv:1812.01097; github.com/TalwalkarLab/leaf) and the code of the FedProx,
q-FFL and Ditto papers (litian96/FedProx, litian96/fair_flearn) keep a
dataset as `DIR/train/*.json` and `DIR/test/*.json`, each file

  {"users": [u, ...], "num_samples": [n_u, ...],
   "user_data": {u: {"x": [...], "y": [...]}, ...}, "hierarchies": [...]}

(`hierarchies` optional, ignored). The layouts read here, detected from the
first example of each file unless `leaf_dataset` names one:

* `femnist`: x = 784 floats (a 28x28 image, row-major), y = a class id in
  [0, 62). Models: `cnn`, LEAF's CNN (`models/femnist/cnn.py`: Conv2D 32
  5x5 same + ReLU, MaxPool 2x2, Conv2D 64 5x5 same + ReLU, MaxPool 2x2,
  Dense 2048 ReLU, Dense 62); `convnet` and `linear`, the Delta-FL models of
  `tasks.emnist`.
* `shakespeare`: x = strings of one fixed length (LEAF: 80 characters),
  y = the next character. Characters map to their index in LEAF's
  `ALL_LETTERS` (80 symbols); any other character maps to one extra
  out-of-vocabulary id, 80, in x and in y (LEAF's `ALL_LETTERS.find` gives
  -1 there, which its embedding lookup cannot take), so the model has 81
  outputs. Model `stacked_lstm`, LEAF's (`models/shakespeare/stacked_lstm.py`):
  Embedding(81, 8), LSTM(256) returning sequences, LSTM(256), Dense(81) on
  the last step.
* `sent140`: x = `[tweet_id, date, query, user, text]`, y = 0 or 1. The text
  is split with LEAF's `split_line` pattern (`[\\w']+|[.,!?;]`), lowercased,
  and its first 25 tokens kept (LEAF's `max_words`). LEAF looks tokens up in
  the GloVe vocabulary (`sent140/embs.json`, a download); here the
  vocabulary is the `vocab_size` most frequent tokens of the training
  clients' training examples (ties broken alphabetically: deterministic),
  with id 0 the padding and 1 out-of-vocabulary. Models: `stacked_lstm`,
  LEAF's (`models/sent140/stacked_lstm.py`, whose embedding is trainable,
  `n_hidden` wide): Embedding(vocab + 2, 100), LSTM(100) returning
  sequences, LSTM(100), Dense(128), Dense(2) on the last step, the 25 ids
  padded at the end as LEAF pads; `bag_log_reg`, LEAF's bag-of-words
  logistic regression (`models/sent140/bag_log_reg.py`) on the counts of
  the vocabulary words among the 25 tokens, zero-initialised (LEAF draws
  N(0, 1)).

`lstm_units` shrinks the LSTM models (LEAF: 256 Shakespeare, 100 Sent140).
Initialisers are Keras' defaults, seeded. Every model takes `(x, y)` with
one int32 label per example, ends in logits and reports `accuracy` and the
cross-entropy loss, so every engine runs it.

Users: LEAF splits each user's samples into train and test (`-t sample`),
so both splits hold the same users, and its `read_data` asserts it. With the
same users, each client is tested on its own test split (thesis protocol) or,
with `test_clients_fraction > 0`, its splits are merged and a seeded fraction
of the clients become unseen test clients (Delta-FL protocol). Train and
test holding disjoint users (LEAF's `-t user` split) means unseen test
clients already: they are used as is. Users in only some of both splits are
an error, as is a user in two files of one split.

Loading is lazy. Each split is parsed once (`json.load` per file; each
user's examples become numpy arrays as its file is read, Shakespeare
characters through one `utf-32` encoding per user) into a compact cache
beside the data, `DIR/.leaf_cache/<split>-<key>/` (`tasks.leaf_cache`: one
flat array of every user's converted `x`, one of the labels, and an index of
users, counts and offsets; Sent140 keeps its token ids and sorted token
list, so the vocabulary is counted from the selected training users without
the JSON). The key hashes each JSON file's name, size, modification time
and inode: changing, adding or removing a file rebuilds the cache (the stale
entry is deleted). Entries are built in a temporary folder and renamed into
place; the index records each file's CRC-32, and an entry that does not read
back whole (a missing or garbled file or index, an old format, other sizes
or bytes) is rebuilt with one warning line, never trusted.
If `DIR` is not writable the cache goes to
`$XDG_CACHE_HOME/tff-hetero/leaf/` (default `~/.cache`), else the split is
converted in memory, with a warning. With a cache, `create_task` reads only
the index (and, for Sent140, the selected training users' token ids); a
client's arrays are read from the memory-mapped cache when its dataset is
created, so memory follows the clients in use, not the dataset. Delete
`DIR/.leaf_cache` to drop the cache.
"""

import collections
from collections.abc import Callable, Mapping, Sequence
import dataclasses
import glob
import itertools
import json
import os
import re
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base
from tasks import data_files
from tasks import emnist
from tasks import leaf_cache
from tasks import options as task_options

DATASETS = ('femnist', 'sent140', 'shakespeare')
MODELS = {
    'femnist': ('cnn', 'convnet', 'linear'),
    'sent140': ('stacked_lstm', 'bag_log_reg'),
    'shakespeare': ('stacked_lstm',),
}
LSTM_UNITS = {'sent140': 100, 'shakespeare': 256}
REQUIRED_KEYS = ('users', 'num_samples', 'user_data')

FEMNIST_CLASSES = 62
IMAGE_SIDE = 28
ALL_LETTERS = (
    '\n !"&\'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]'
    'abcdefghijklmnopqrstuvwxyz}'
)
CHAR_OOV = len(ALL_LETTERS)  # 80.
SHAKESPEARE_CLASSES = len(ALL_LETTERS) + 1
SENT140_FIELDS = 5
SENT140_MAX_WORDS = 25
SENT140_CLASSES = 2
WORD_PAD, WORD_OOV = 0, 1
DEFAULT_VOCAB_SIZE = 10_000
# The stacked engine's buffer: equal buffers give equal orders even for
# users larger than the buffer.
SHUFFLE_BUFFER_SIZE = 10_000

_TOKEN = re.compile(r"[\w']+|[.,!?;]")
_CHAR_IDS = np.full(129, CHAR_OOV, np.int32)  # Index 128: any non-ASCII.
_CHAR_IDS[[ord(c) for c in ALL_LETTERS]] = np.arange(len(ALL_LETTERS))
# Every code point's id as uint8: one lookup, no temporary per character.
_CODE_POINT_IDS = np.full(0x110000, CHAR_OOV, np.uint8)
_CODE_POINT_IDS[: len(_CHAR_IDS) - 1] = _CHAR_IDS[:-1]


@dataclasses.dataclass
class _Converted:
  """One user's examples in one split, converted, and the file holding them."""

  x: Any  # np.ndarray; a list of token lists for sent140.
  y: np.ndarray
  path: str


@dataclasses.dataclass(frozen=True)
class _User:
  """A client: its examples in one split, or (merged) in both, read lazily."""

  parts: tuple[tuple[leaf_cache.SplitData, str], ...]
  path: str

  @property
  def count(self) -> int:
    return sum(split.count(user) for split, user in self.parts)

  @property
  def widths(self) -> set[int]:
    return {split.width(user) for split, user in self.parts}

  def arrays(self, encode: Callable) -> tuple[np.ndarray, np.ndarray]:
    """`(x, y)`, read from the cache; `encode(split, x)` maps each part's x."""
    xs, ys = [], []
    for split, user in self.parts:
      x, y = split.arrays(user)
      xs.append(encode(split, x))
      ys.append(y)
    if len(xs) == 1:
      return xs[0], ys[0]
    return np.concatenate(xs), np.concatenate(ys)


# ---------------------------------------------------------------------------
# Reading and checking the files.


def _split_files(leaf_dir: str, split: str) -> list[str]:
  directory = os.path.join(leaf_dir, split)
  if not os.path.isdir(directory):
    raise base.TaskError(
        f'LEAF directory {leaf_dir} has no {split}/ folder (a LEAF dataset '
        'is DIR/train/*.json and DIR/test/*.json)'
    )
  paths = sorted(glob.glob(os.path.join(directory, '*.json')))
  if not paths:
    raise base.TaskError(f'no .json files in {directory}')
  return paths


def _load_json(path: str) -> Mapping[str, Any]:
  """The checked top level of one LEAF file."""
  try:
    with open(path, encoding='utf-8') as f:
      content = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise base.TaskError(f'{path}: malformed JSON ({e})') from None
  except RecursionError:
    raise base.TaskError(
        f'{path}: malformed JSON (nested too deeply for a LEAF file)'
    ) from None
  except OSError as e:
    raise base.TaskError(f'{path}: cannot read ({e.strerror})') from None
  if not isinstance(content, dict):
    raise base.TaskError(
        f'{path}: a LEAF file holds a JSON object, got {type(content).__name__}'
    )
  missing = [k for k in REQUIRED_KEYS if k not in content]
  if missing:
    raise base.TaskError(
        f'{path}: missing key {missing[0]!r} (a LEAF file holds "users", '
        '"num_samples" and "user_data")'
    )
  users, counts, data = (content[k] for k in REQUIRED_KEYS)
  if not isinstance(users, list) or not all(isinstance(u, str) for u in users):
    raise base.TaskError(f'{path}: "users" must be a list of strings')
  if not isinstance(counts, list) or not all(
      isinstance(n, int) and not isinstance(n, bool) for n in counts
  ):
    raise base.TaskError(f'{path}: "num_samples" must be a list of integers')
  if len(users) != len(counts):
    raise base.TaskError(
        f'{path}: {len(users)} "users" but {len(counts)} "num_samples"'
    )
  if len(set(users)) != len(users):
    raise base.TaskError(f'{path}: a user is listed twice in "users"')
  if not isinstance(data, dict):
    raise base.TaskError(f'{path}: "user_data" must be an object')
  extra = sorted(set(data) - set(users))
  if extra:
    raise base.TaskError(
        f'{path}: "user_data" has user {extra[0]!r}, who is not in "users"'
    )
  for user, count in zip(users, counts):
    entry = data.get(user)
    if entry is None:
      raise base.TaskError(f'{path}: user {user!r} has no "user_data" entry')
    if not isinstance(entry, dict) or any(k not in entry for k in 'xy'):
      raise base.TaskError(
          f'{path}: "user_data" of user {user!r} must hold "x" and "y"'
      )
    x, y = entry['x'], entry['y']
    if not isinstance(x, list) or not isinstance(y, list):
      raise base.TaskError(
          f'{path}: "x" and "y" of user {user!r} must be lists'
      )
    if len(x) != len(y):
      raise base.TaskError(
          f'{path}: user {user!r} has {len(x)} x but {len(y)} y'
      )
    if len(x) != count:
      raise base.TaskError(
          f'{path}: user {user!r} has num_samples {count} but {len(x)} '
          'examples'
      )
    if not x:
      raise base.TaskError(f'{path}: user {user!r} has no examples')
  return content


def _describe(value: Any) -> str:
  if isinstance(value, list):
    return f'a list of {len(value)}'
  return f'a {type(value).__name__}'


def detect_layout(x: Any, y: Any) -> Optional[str]:
  """The LEAF dataset one example `(x, y)` belongs to, or None."""
  if isinstance(x, str) and isinstance(y, str):
    return 'shakespeare'
  if (
      isinstance(x, list)
      and len(x) == SENT140_FIELDS
      and isinstance(x[-1], str)
  ):
    return 'sent140'
  if (
      isinstance(x, list)
      and len(x) == IMAGE_SIDE * IMAGE_SIDE
      and isinstance(x[0], (int, float))
  ):
    return 'femnist'
  return None


def _file_layout(path: str, content: Mapping[str, Any]) -> Optional[str]:
  users = content['users']
  if not users:
    return None
  entry = content['user_data'][users[0]]
  x, y = entry['x'][0], entry['y'][0]
  layout = detect_layout(x, y)
  if layout is None:
    raise base.TaskError(
        f"{path}: unknown LEAF layout: user {users[0]!r}'s first example "
        f'has x {_describe(x)} and y {_describe(y)}; this task reads femnist '
        '(x: 784 numbers), sent140 (x: 5 fields ending in the text) and '
        'shakespeare (x: a string, y: one character)'
    )
  return layout


def _int_labels(y: list, path: str, user: str, classes: int) -> np.ndarray:
  """`y` as int32 class ids in [0, classes), or a `TaskError`."""
  labels = np.asarray(y)
  if labels.dtype.kind == 'U':
    try:
      labels = labels.astype(np.int64)
    except ValueError:
      labels = np.asarray([], np.float64)
  elif labels.dtype.kind == 'f' and np.all(np.mod(labels, 1) == 0):
    labels = labels.astype(np.int64)
  if labels.dtype.kind not in 'iu' or labels.shape != (len(y),):
    raise base.TaskError(f'{path}: user {user!r}: y must be integer class ids')
  if labels.min() < 0 or labels.max() >= classes:
    raise base.TaskError(
        f'{path}: user {user!r}: y must be in [0, {classes}), got '
        f'{labels.min()}..{labels.max()}'
    )
  return labels.astype(np.int32)


def _femnist_user(x: list, y: list, path: str, user: str) -> _Converted:
  pixels = IMAGE_SIDE * IMAGE_SIDE
  try:
    images = np.asarray(x, np.float32)
  except (ValueError, TypeError):
    images = None
  if images is None or images.shape != (len(x), pixels):
    raise base.TaskError(
        f'{path}: user {user!r}: femnist x must be lists of {pixels} numbers'
    )
  kinds = set(map(type, itertools.chain.from_iterable(x))) - {int, float}
  if kinds:
    raise base.TaskError(
        f'{path}: user {user!r}: femnist x must be numbers, got a '
        f'{sorted(k.__name__ for k in kinds)[0]}'
    )
  if not np.all(np.isfinite(images)):
    raise base.TaskError(f'{path}: user {user!r}: x holds a non-finite value')
  return _Converted(images, _int_labels(y, path, user, FEMNIST_CLASSES), path)


def char_ids(text: str) -> np.ndarray:
  """Ids of `text`'s characters in `ALL_LETTERS` (`CHAR_OOV` if absent)."""
  codes = np.frombuffer(text.encode('utf-32-le'), np.uint32)
  return _CHAR_IDS[np.minimum(codes, 128)]


def _char_ids_uint8(text: str) -> np.ndarray:
  """`char_ids(text)` as uint8 (as the cache stores them)."""
  return _CODE_POINT_IDS[np.frombuffer(text.encode('utf-32-le'), np.uint32)]


def _shakespeare_user(x: list, y: list, path: str, user: str) -> _Converted:
  # `set(map(type, ...))`: the checks at C speed (JSON gives exact types).
  if (
      set(map(type, x)) != {str}
      or set(map(type, y)) != {str}
      or set(map(len, y)) != {1}
  ):
    raise base.TaskError(
        f'{path}: user {user!r}: shakespeare x must be strings and y single '
        'characters'
    )
  lengths = set(map(len, x))
  if len(lengths) != 1 or 0 in lengths:
    raise base.TaskError(
        f'{path}: user {user!r}: shakespeare x strings must all have one '
        f'non-zero length, got lengths {sorted(lengths)[:5]}'
    )
  try:
    windows = _char_ids_uint8(''.join(x)).reshape(len(x), -1)
    labels = char_ids(''.join(y))
  except UnicodeEncodeError:
    raise base.TaskError(
        f'{path}: user {user!r}: shakespeare text holds a lone surrogate '
        '(a \\ud800-\\udfff escape that is not valid Unicode text)'
    ) from None
  return _Converted(windows, labels, path)


def tokenize(text: str) -> list[str]:
  """LEAF's `split_line` tokens of `text`, lowercased, the first 25."""
  return _TOKEN.findall(text.lower())[:SENT140_MAX_WORDS]


def _sent140_user(x: list, y: list, path: str, user: str) -> _Converted:
  if not all(
      isinstance(r, list)
      and len(r) == SENT140_FIELDS
      and isinstance(r[-1], str)
      for r in x
  ):
    raise base.TaskError(
        f'{path}: user {user!r}: sent140 x must be [id, date, query, user, '
        'text] records'
    )
  tokens = [tokenize(r[-1]) for r in x]
  return _Converted(tokens, _int_labels(y, path, user, SENT140_CLASSES), path)


_CONVERTERS = {
    'femnist': _femnist_user,
    'sent140': _sent140_user,
    'shakespeare': _shakespeare_user,
}


def _check_layout(
    path: str,
    layout: str,
    dataset: Optional[str],
    first_path: Optional[str],
    expected_by: str,
) -> None:
  if dataset is not None and layout != dataset:
    source = f'{first_path} holds' if first_path else expected_by
    raise base.TaskError(
        f'{path}: holds {layout} examples, but {source} {dataset}'
    )


def _convert_split(
    writer: Any,
    paths: Sequence[str],
    dataset: Optional[str],
    expected_by: str,
) -> None:
  """Converts every user of `paths` into `writer` (a `leaf_cache` writer).

  Files are read one at a time, and each user's JSON is dropped once it is
  converted, so memory holds one parsed file and its arrays being written.
  """
  files_of = {}
  first_path = None
  for path in paths:
    content = _load_json(path)
    layout = _file_layout(path, content)
    writer.add_file(path, layout)
    if layout is None:
      continue
    _check_layout(path, layout, dataset, first_path, expected_by)
    if dataset is None:
      dataset, first_path = layout, path
    convert = _CONVERTERS[dataset]
    for user in content['users']:
      if user in files_of:
        raise base.TaskError(
            f'{path}: user {user!r} is also in {files_of[user]}'
        )
      entry = content['user_data'].pop(user)
      converted = convert(entry['x'], entry['y'], path, user)
      writer.add_user(user, converted.x, converted.y)
      files_of[user] = path
    del content


def read_split(
    leaf_dir: str,
    split: str,
    dataset: Optional[str],
    expected_by: str = 'leaf_dataset is',
) -> tuple[dict[str, _User], Optional[str]]:
  """The users of `leaf_dir/split`, and the dataset their examples form.

  The split is converted once into its cache (`tasks.leaf_cache`); then
  only the cache's index is read here, and the users' arrays when used.

  Args:
    leaf_dir: The LEAF dataset folder.
    split: `'train'` or `'test'`.
    dataset: The expected layout, or None to detect it.
    expected_by: Who expects `dataset`, for the error message.

  Returns:
    `(users, dataset)`: each user's examples (lazily read) and file, and the
    layout (None only when every file lists no user).

  Raises:
    TaskError: One line naming the file, for any problem.
  """
  paths = _split_files(leaf_dir, split)
  data = leaf_cache.load_split(
      leaf_dir,
      split,
      paths,
      lambda writer: _convert_split(writer, paths, dataset, expected_by),
  )
  first_path = None
  for path, layout in data.file_layouts:
    if layout is None:
      continue
    _check_layout(path, layout, dataset, first_path, expected_by)
    if dataset is None:
      dataset, first_path = layout, path
  users = {u: _User(((data, u),), r.path) for u, r in data.users.items()}
  return users, dataset


# ---------------------------------------------------------------------------
# Client selection and vocabulary.


def _concat(first: _User, second: _User) -> _User:
  return _User(first.parts + second.parts, first.path)


def _at_least(users: Mapping[str, _User], min_examples: int) -> list[str]:
  kept = [u for u in sorted(users) if users[u].count >= min_examples]
  if not kept:
    raise base.TaskError(
        f'no client has at least {min_examples} examples '
        f'(out of {len(users)} clients)'
    )
  return kept


def select_users(
    train: Mapping[str, _User],
    test: Mapping[str, _User],
    *,
    leaf_dir: str,
    seed: int,
    min_examples: int,
    test_clients_fraction: float,
    max_clients: Optional[int],
) -> tuple[dict[str, _User], dict[str, _User], str]:
  """`(train_clients, test_clients, protocol)` (see the module docstring)."""
  train_only = sorted(set(train) - set(test))
  test_only = sorted(set(test) - set(train))
  if not train_only and not test_only:
    if test_clients_fraction > 0:
      pool = {u: _concat(train[u], test[u]) for u in train}
      ids = data_files.subsample_client_ids(
          _at_least(pool, min_examples), max_clients, seed
      )
      train_ids, test_ids = base.split_client_ids(
          ids, test_fraction=test_clients_fraction, seed=seed
      )
      return (
          {u: pool[u] for u in train_ids},
          {u: pool[u] for u in test_ids},
          f'{len(test_ids)} unseen test users',
      )
    ids = data_files.subsample_client_ids(
        _at_least(train, min_examples), max_clients, seed
    )
    return (
        {u: train[u] for u in ids},
        {u: test[u] for u in ids},
        'per-user test split',
    )
  if len(train_only) == len(train) and len(test_only) == len(test):
    if test_clients_fraction > 0:
      raise base.TaskError(
          f'{leaf_dir}: train/ and test/ hold different users (a split by '
          'user): they are unseen test clients already; leave '
          'test_clients_fraction at 0'
      )
    ids = data_files.subsample_client_ids(
        _at_least(train, min_examples), max_clients, seed
    )
    test_ids = _at_least(test, min_examples)
    return (
        {u: train[u] for u in ids},
        {u: test[u] for u in test_ids},
        f'{len(test_ids)} unseen test users (split by user)',
    )
  side, user, other = (
      ('train', train_only[0], 'test')
      if train_only
      else ('test', test_only[0], 'train')
  )
  raise base.TaskError(
      f'{leaf_dir}: user {user!r} of {side}/ ({len(train_only)} train-only '
      f'and {len(test_only)} test-only users) is not in {other}/: LEAF '
      "splits each user's samples, so both splits hold the same users (or, "
      'split by user, none in common)'
  )


def build_vocabulary(
    token_lists: Sequence[Sequence[str]], vocab_size: int
) -> dict[str, int]:
  """The `vocab_size` most frequent tokens -> ids 2.. (ties alphabetical)."""
  counts = collections.Counter()
  for tokens in token_lists:
    counts.update(tokens)
  return _rank(counts, vocab_size)


def _rank(counts: Mapping[str, int], vocab_size: int) -> dict[str, int]:
  ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
  return {w: i + 2 for i, (w, _) in enumerate(ranked[:vocab_size])}


def _cached_vocabulary(
    users: Mapping[str, _User], vocab_size: int
) -> dict[str, int]:
  """`build_vocabulary` of `users`' tokens, counted from the cached ids."""
  per_split = {}
  for user in users.values():
    for split, name in user.parts:
      ids = split.token_ids(name)
      total = per_split.get(id(split), (split, 0))[1]
      counts = np.bincount(ids.ravel(), minlength=len(split.tokens) + 1)
      per_split[id(split)] = (split, total + counts)
  counts = collections.Counter()
  for split, total in per_split.values():
    for i in np.flatnonzero(total[1:]):
      counts[split.tokens[i]] += int(total[i + 1])
  return _rank(counts, vocab_size)


def _token_encoder(vocabulary: Mapping[str, int]) -> Callable:
  """`encode(split, ids)`: cached token ids to `encode_tokens`'s ids."""
  tables = {}

  def encode(split: leaf_cache.SplitData, ids: np.ndarray) -> np.ndarray:
    if id(split) not in tables:
      table = np.array(
          [WORD_PAD] + [vocabulary.get(t, WORD_OOV) for t in split.tokens],
          np.int32,
      )
      tables[id(split)] = (split, table)
    return tables[id(split)][1][ids]

  return encode


def encode_tokens(
    token_lists: Sequence[Sequence[str]], vocabulary: Mapping[str, int]
) -> np.ndarray:
  """`[n, 25]` int32 ids, out-of-vocabulary 1, padded with 0 at the end."""
  ids = np.full((len(token_lists), SENT140_MAX_WORDS), WORD_PAD, np.int32)
  for row, tokens in zip(ids, token_lists):
    row[: len(tokens)] = [vocabulary.get(t, WORD_OOV) for t in tokens]
  return ids


# ---------------------------------------------------------------------------
# Client data, preprocessing and models.


def _keep_x(split: leaf_cache.SplitData, x: np.ndarray) -> np.ndarray:
  del split
  return x


def _client_data(
    users: Mapping[str, _User], encode: Callable = _keep_x
) -> base.ClientData:
  """Clients over the cached arrays; raw examples are `{'x': ..., 'y': ...}`.

  A client's arrays are read (and `encode`d) when its dataset is created.
  The dataset function takes a Python string or an eager string tensor
  (the data live in numpy, outside any graph).
  """
  users = dict(users)

  def dataset_fn(client_id):
    if tf.is_tensor(client_id):
      client_id = client_id.numpy().decode('utf-8')
    x, y = users[client_id].arrays(encode)
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y))

  return base.ClientData.from_clients_and_tf_fn(sorted(users), dataset_fn)


def _to_xy_fn(dataset: str, model: str, vocab_size: int) -> Callable:
  """The per-example map from a raw `{'x', 'y'}` example to `(x, y)`."""
  if dataset == 'femnist':
    return lambda e: (tf.reshape(e['x'], [IMAGE_SIDE, IMAGE_SIDE, 1]), e['y'])
  if model == 'bag_log_reg':

    def bag(e):
      counts = tf.one_hot(e['x'] - 2, vocab_size, dtype=tf.float32)
      return tf.reduce_sum(counts, axis=0), e['y']

    return bag
  return lambda e: (e['x'], e['y'])


def make_preprocess_fns(
    to_xy: Callable, batch_size: int, eval_batch_size: int = 64
):
  """`(preprocess_train, preprocess_eval)`: map, seeded shuffle, batch."""
  if batch_size < 1 or eval_batch_size < 1:
    raise base.TaskError(
        f'batch sizes must be >= 1, got {batch_size} and {eval_batch_size}'
    )

  def preprocess_train(
      dataset: tf.data.Dataset, epochs: int, shuffle_seed: Optional[int] = None
  ) -> tf.data.Dataset:
    dataset = dataset.map(to_xy)
    if shuffle_seed is not None:
      dataset = dataset.shuffle(
          SHUFFLE_BUFFER_SIZE, seed=shuffle_seed, reshuffle_each_iteration=True
      )
    return dataset.batch(batch_size).repeat(epochs)

  def preprocess_eval(dataset: tf.data.Dataset) -> tf.data.Dataset:
    return dataset.map(to_xy).batch(eval_batch_size)

  return preprocess_train, preprocess_eval


def _femnist_cnn(seed: int) -> tf.keras.Model:
  glorot = lambda k: tf.keras.initializers.GlorotUniform(seed=seed * 16 + k)
  return tf.keras.Sequential(
      [
          tf.keras.layers.InputLayer(input_shape=(IMAGE_SIDE, IMAGE_SIDE, 1)),
          tf.keras.layers.Conv2D(
              32,
              5,
              padding='same',
              activation='relu',
              kernel_initializer=glorot(1),
          ),
          tf.keras.layers.MaxPool2D(pool_size=2, strides=2),
          tf.keras.layers.Conv2D(
              64,
              5,
              padding='same',
              activation='relu',
              kernel_initializer=glorot(2),
          ),
          tf.keras.layers.MaxPool2D(pool_size=2, strides=2),
          tf.keras.layers.Flatten(),
          tf.keras.layers.Dense(
              2048, activation='relu', kernel_initializer=glorot(3)
          ),
          tf.keras.layers.Dense(FEMNIST_CLASSES, kernel_initializer=glorot(4)),
      ]
  )


def _stacked_lstm(
    *,
    vocab: int,
    embedding: int,
    units: int,
    length: int,
    hidden: Optional[int],
    classes: int,
    seed: int,
) -> tf.keras.Model:
  seeds = iter(range(seed * 16 + 1, seed * 16 + 16))
  glorot = lambda: tf.keras.initializers.GlorotUniform(seed=next(seeds))
  layers = [
      tf.keras.layers.InputLayer(input_shape=(length,), dtype=tf.int32),
      tf.keras.layers.Embedding(
          vocab,
          embedding,
          embeddings_initializer=tf.keras.initializers.RandomUniform(
              -0.05, 0.05, seed=next(seeds)
          ),
      ),
  ]
  for last in (False, True):
    layers.append(
        tf.keras.layers.LSTM(
            units,
            return_sequences=not last,
            kernel_initializer=glorot(),
            recurrent_initializer=tf.keras.initializers.Orthogonal(
                seed=next(seeds)
            ),
        )
    )
  if hidden:
    layers.append(tf.keras.layers.Dense(hidden, kernel_initializer=glorot()))
  layers.append(tf.keras.layers.Dense(classes, kernel_initializer=glorot()))
  return tf.keras.Sequential(layers)


def create_keras_model(
    dataset: str,
    model: str,
    *,
    seed: int = 0,
    lstm_units: int = 0,
    sequence_length: int = 80,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> tf.keras.Model:
  """The uncompiled Keras model `model` of `dataset` (module docstring)."""
  if dataset == 'femnist':
    if model == 'cnn':
      return _femnist_cnn(seed)
    return emnist.create_keras_model(model, seed=seed)
  if dataset == 'shakespeare':
    return _stacked_lstm(
        vocab=SHAKESPEARE_CLASSES,
        embedding=8,
        units=lstm_units or LSTM_UNITS[dataset],
        length=sequence_length,
        hidden=None,
        classes=SHAKESPEARE_CLASSES,
        seed=seed,
    )
  if model == 'bag_log_reg':
    return tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(vocab_size,)),
            tf.keras.layers.Dense(SENT140_CLASSES, kernel_initializer='zeros'),
        ]
    )
  units = lstm_units or LSTM_UNITS[dataset]
  return _stacked_lstm(
      vocab=vocab_size + 2,
      embedding=units,
      units=units,
      length=SENT140_MAX_WORDS,
      hidden=128,
      classes=SENT140_CLASSES,
      seed=seed,
  )


def create_model_fn(
    dataset: str,
    model: str,
    *,
    seed: int = 0,
    lstm_units: int = 0,
    sequence_length: int = 80,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> base.ModelFn:
  """A no-arg `model_fn` of `create_keras_model` as a TFF `VariableModel`."""
  x_spec = {
      'femnist': tf.TensorSpec([None, IMAGE_SIDE, IMAGE_SIDE, 1], tf.float32),
      'shakespeare': tf.TensorSpec([None, sequence_length], tf.int32),
      'sent140': (
          tf.TensorSpec([None, vocab_size], tf.float32)
          if model == 'bag_log_reg'
          else tf.TensorSpec([None, SENT140_MAX_WORDS], tf.int32)
      ),
  }[dataset]
  input_spec = (x_spec, tf.TensorSpec([None], tf.int32))
  # emnist's `linear` and `convnet` end in logits, as LEAF's models.

  def model_fn():
    return tff.learning.models.from_keras_model(
        create_keras_model(
            dataset,
            model,
            seed=seed,
            lstm_units=lstm_units,
            sequence_length=sequence_length,
            vocab_size=vocab_size,
        ),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=input_spec,
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')],
    )

  return model_fn


# ---------------------------------------------------------------------------
# The task.


def _check_args(leaf_dir, leaf_dataset, model, lstm_units, vocab_size) -> str:
  if not isinstance(leaf_dir, str) or not leaf_dir:
    raise base.TaskError(f'leaf_dir must be a non-empty path, got {leaf_dir!r}')
  leaf_dir = os.path.expanduser(leaf_dir)
  if not os.path.isdir(leaf_dir):
    raise base.TaskError(f'LEAF directory {leaf_dir} does not exist')
  if leaf_dataset is not None and leaf_dataset not in DATASETS:
    raise base.TaskError(
        f'unknown LEAF dataset {leaf_dataset!r}; choose one of '
        f'{", ".join(DATASETS)} (or none: detected from the data)'
    )
  known = sorted({m for models in MODELS.values() for m in models})
  if model is not None and model not in known:
    raise base.TaskError(
        f'unknown LEAF model {model!r}; choose one of {", ".join(known)}'
    )
  if lstm_units is not None and lstm_units < 1:
    raise base.TaskError(f'lstm_units must be >= 1, got {lstm_units}')
  if vocab_size is not None and vocab_size < 1:
    raise base.TaskError(f'vocab_size must be >= 1, got {vocab_size}')
  return leaf_dir


def _check_model_for(dataset, model, lstm_units, vocab_size) -> str:
  model = model or MODELS[dataset][0]
  if model not in MODELS[dataset]:
    raise base.TaskError(
        f'model {model!r} does not apply to LEAF {dataset}; choose one of '
        f'{", ".join(MODELS[dataset])}'
    )
  if lstm_units is not None and model != 'stacked_lstm':
    raise base.TaskError(
        f'lstm_units applies to the stacked_lstm models, not {dataset} '
        f'{model}'
    )
  if vocab_size is not None and dataset != 'sent140':
    raise base.TaskError(f'vocab_size applies to sent140, not {dataset}')
  return model


def create_task(
    *,
    leaf_dir: str,
    leaf_dataset: Optional[str] = None,
    batch_size: int,
    seed: int = 0,
    min_examples: int = 0,
    test_clients_fraction: float = 0.0,
    max_clients: Optional[int] = None,
    model: Optional[str] = None,
    lstm_units: Optional[int] = None,
    vocab_size: Optional[int] = None,
    eval_batch_size: int = 64,
) -> base.FederatedTask:
  """A federated task from a LEAF-format dataset folder.

  Args:
    leaf_dir: Folder holding `train/*.json` and `test/*.json`.
    leaf_dataset: `'femnist'`, `'sent140'` or `'shakespeare'`; None detects
      it from the examples (every file must agree).
    batch_size: Local training mini-batch size.
    seed: Seed of the model initialisers, the client subset and the split.
    min_examples: Keep users with at least this many training examples (all
      examples when `test_clients_fraction > 0`; test users of a split by
      user with at least this many test examples).
    test_clients_fraction: 0: test each user on its own test split; in
      (0, 1): merge each user's splits and hold out this fraction of the
      users as unseen test clients.
    max_clients: Keep a seeded random subset of at most this many users.
    model: One of `MODELS[dataset]` (None: the first, LEAF's model).
    lstm_units: Units of the stacked LSTMs (None: LEAF's, 256 Shakespeare,
      100 Sent140).
    vocab_size: Sent140 vocabulary size (None: 10,000).
    eval_batch_size: Batch size of evaluation streams.

  Returns:
    A `FederatedTask` named `leaf`.

  Raises:
    TaskError: On invalid arguments or data, in one line naming the file.
  """
  leaf_dir = _check_args(leaf_dir, leaf_dataset, model, lstm_units, vocab_size)
  data_files.validate_selection_args(
      min_examples=min_examples,
      test_clients_fraction=test_clients_fraction,
      max_clients=max_clients,
      batch_size=batch_size,
  )
  if leaf_dataset is not None:
    model = _check_model_for(leaf_dataset, model, lstm_units, vocab_size)
  train, dataset = read_split(leaf_dir, 'train', leaf_dataset)
  if dataset is None:
    raise base.TaskError(
        f'no users in {os.path.join(leaf_dir, "train")}/*.json'
    )
  test, _ = read_split(
      leaf_dir,
      'test',
      dataset,
      'leaf_dataset is' if leaf_dataset else 'train/ holds',
  )
  if not test:
    raise base.TaskError(f'no users in {os.path.join(leaf_dir, "test")}/*.json')
  model = _check_model_for(dataset, model, lstm_units, vocab_size)
  train, test, protocol = select_users(
      train,
      test,
      leaf_dir=leaf_dir,
      seed=seed,
      min_examples=min_examples,
      test_clients_fraction=test_clients_fraction,
      max_clients=max_clients,
  )
  sequence_length, vocab_size = 80, vocab_size or DEFAULT_VOCAB_SIZE
  detail = ''
  if dataset == 'shakespeare':
    users = [*train.values(), *test.values()]
    lengths = set().union(*(u.widths for u in users))
    if len(lengths) != 1:
      raise base.TaskError(
          f'{leaf_dir}: shakespeare x strings must all have one length, got '
          f'lengths {sorted(lengths)[:5]}'
      )
    sequence_length = lengths.pop()
    detail = f', windows of {sequence_length}'
  encode = _keep_x
  if dataset == 'sent140':
    vocabulary = _cached_vocabulary(train, vocab_size)
    encode = _token_encoder(vocabulary)
    detail = f', vocabulary of {len(vocabulary)} training tokens'
  if lstm_units is not None:
    detail += f', {lstm_units} LSTM units'
  preprocess_train, preprocess_eval = make_preprocess_fns(
      _to_xy_fn(dataset, model, vocab_size), batch_size, eval_batch_size
  )
  examples = sum(u.count for u in train.values())
  return base.FederatedTask(
      name='leaf',
      train_data=_client_data(train, encode),
      test_data=_client_data(test, encode),
      model_fn=create_model_fn(
          dataset,
          model,
          seed=seed,
          lstm_units=lstm_units or 0,
          sequence_length=sequence_length,
          vocab_size=vocab_size,
      ),
      preprocess_train=preprocess_train,
      preprocess_eval=preprocess_eval,
      description=(
          f'LEAF {dataset} ({leaf_dir}), {len(train)} training users, '
          f'{examples} training examples, {protocol}; model {model}{detail}'
      ),
  )


@dataclasses.dataclass(frozen=True)
class LeafOptions(task_options.ClientChoice):
  """Options of `leaf` (flags `leaf_*`)."""

  leaf_dir: Optional[str] = task_options.option(
      None, 'Folder of a LEAF-format dataset (train/*.json, test/*.json).'
  )
  leaf_dataset: str = task_options.option(
      'auto',
      'femnist, sent140, shakespeare or auto (detected from the data).',
      choices=DATASETS + ('auto',),
  )
  max_clients: Optional[int] = task_options.option(
      None, 'Keep at most this many clients.', low=1
  )
  model: Optional[str] = task_options.option(
      None,
      "femnist cnn (LEAF's), convnet or linear; sent140 stacked_lstm or "
      "bag_log_reg; shakespeare stacked_lstm (default: the first, LEAF's).",
      flag='leaf_model',
  )
  lstm_units: Optional[int] = task_options.option(
      None,
      "Units of the stacked LSTMs (default LEAF's: 256 shakespeare, 100 "
      'sent140).',
      low=1,
      flag='leaf_lstm_units',
  )
  vocab_size: Optional[int] = task_options.option(
      None,
      'sent140: most frequent training tokens kept (default 10000).',
      low=1,
      flag='leaf_vocab_size',
  )

  def check(self) -> None:
    if not self.leaf_dir:
      raise task_options.OptionError(
          'reads a LEAF-format dataset: pass leaf_dir (the folder holding '
          'train/ and test/)',
          'leaf_dir',
      )

  def task_kwargs(self) -> dict[str, Any]:
    kwargs = super().task_kwargs()
    if self.leaf_dataset == 'auto':
      kwargs['leaf_dataset'] = None
    return kwargs


TASK = task_options.Task(
    name='leaf',
    data='LEAF JSON (train/, test/) in leaf_dir',
    model="LEAF's CNN, stacked LSTMs, bag of words",
    options=LeafOptions,
    create=create_task,
)
