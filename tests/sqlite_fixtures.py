# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Small data files in the exact format of TFF's cached datasets.

`write_sqlite` writes TFF's SQLite schema (`examples(split_name, client_id,
serialized_example_proto)` + `client_metadata(client_id, split_name,
num_examples)`, as `tff.simulation.datasets.save_to_sql_client_data` and the
published `*.sqlite` files). Rows are serialized `tf.train.Example` protos
with the feature names, dtypes and shapes the TFF loaders parse
(`emnist._add_proto_parsing`, `shakespeare._add_parsing`,
`stackoverflow._add_proto_parsing`). The StackOverflow vocabularies are
written as the files TFF's `load_word_counts` / `load_tag_counts` read after
extraction: `word count` lines and a JSON object.
"""

import collections
from collections.abc import Mapping, Sequence
import io
import json
import os
import sqlite3
import tarfile

import numpy as np
import tensorflow as tf

# split -> client id -> serialized examples.
Rows = Mapping[str, Mapping[str, Sequence[bytes]]]


def write_sqlite(path: str, rows: Rows) -> str:
  """Writes `rows` in TFF's SQLite cache schema; returns `path`."""
  if os.path.exists(path):
    os.remove(path)
  connection = sqlite3.connect(path)
  with connection:
    connection.execute(
        'CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT '
        'NULL, serialized_example_proto BLOB NOT NULL);'
    )
    connection.execute(
        'CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name '
        'TEXT NOT NULL, num_examples INTEGER NOT NULL);'
    )
    connection.execute(
        'CREATE INDEX idx_examples_client_id ON examples (client_id);'
    )
    for split, clients in rows.items():
      for client_id, examples in clients.items():
        connection.executemany(
            'INSERT INTO examples (split_name, client_id, '
            'serialized_example_proto) VALUES (?, ?, ?);',
            [(split, client_id, sqlite3.Binary(e)) for e in examples],
        )
        connection.execute(
            'INSERT INTO client_metadata (client_id, split_name, num_examples)'
            ' VALUES (?, ?, ?);',
            (client_id, split, len(examples)),
        )
  connection.close()
  return path


def _bytes(values) -> tf.train.Feature:
  return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))


def _int64(values) -> tf.train.Feature:
  return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def _float(values) -> tf.train.Feature:
  return tf.train.Feature(float_list=tf.train.FloatList(value=values))


def _example(features: Mapping[str, tf.train.Feature]) -> bytes:
  return tf.train.Example(
      features=tf.train.Features(feature=features)
  ).SerializeToString()


# ----------------------------------------------------------------- EMNIST


def emnist_example(pixels: np.ndarray, label: int) -> bytes:
  """`pixels` float [28, 28] in [0, 1], `label` in [0, 62)."""
  pixels = np.asarray(pixels, np.float32)
  assert pixels.shape == (28, 28)
  return _example(
      {
          'pixels': _float(pixels.reshape(-1).tolist()),
          'label': _int64([int(label)]),
      }
  )


def emnist_client_arrays(
    sizes: Mapping[str, int], *, seed: int, num_classes: int = 62
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Random `(pixels [n, 28, 28], labels [n])` per client.

  Labels within a client are distinct when `n <= num_classes`, so the order
  of a client's examples can be read off its labels.
  """
  rng = np.random.default_rng(seed)
  out = {}
  for cid, n in sizes.items():
    pixels = rng.random((n, 28, 28), dtype=np.float32)
    labels = (
        rng.permutation(num_classes)[:n]
        if n <= num_classes
        else (rng.integers(0, num_classes, n))
    )
    out[cid] = (pixels, labels.astype(np.int32))
  return out


def write_emnist(
    data_dir: str,
    train: Mapping[str, tuple[np.ndarray, np.ndarray]],
    test: Mapping[str, tuple[np.ndarray, np.ndarray]],
) -> str:
  """`data_dir/emnist_all.sqlite` with `all_*` and `digits_only_*` splits.

  The digits-only splits hold the same images with labels `label % 10`.
  """
  rows = collections.defaultdict(dict)
  for suffix, clients in (('train', train), ('test', test)):
    for cid, (pixels, labels) in clients.items():
      rows[f'all_{suffix}'][cid] = [
          emnist_example(p, l) for p, l in zip(pixels, labels)
      ]
      rows[f'digits_only_{suffix}'][cid] = [
          emnist_example(p, l % 10) for p, l in zip(pixels, labels)
      ]
  return write_sqlite(os.path.join(data_dir, 'emnist_all.sqlite'), rows)


# ------------------------------------------------------------ Shakespeare


def shakespeare_example(snippet: str) -> bytes:
  return _example({'snippets': _bytes([snippet.encode('utf-8')])})


def write_shakespeare(
    data_dir: str,
    train: Mapping[str, Sequence[str]],
    test: Mapping[str, Sequence[str]],
) -> str:
  """`data_dir/shakespeare.sqlite` with `train` and `test` splits."""
  rows = {
      'train': {
          c: [shakespeare_example(s) for s in v] for c, v in train.items()
      },
      'test': {c: [shakespeare_example(s) for s in v] for c, v in test.items()},
  }
  return write_sqlite(os.path.join(data_dir, 'shakespeare.sqlite'), rows)


# ---------------------------------------------------------- StackOverflow


def stackoverflow_example(
    tokens: str,
    tags: str,
    *,
    title: str = 'a title',
    score: int = 1,
    kind: str = 'question',
    creation_date: str = '2010-01-08 09:34:05 UTC',
) -> bytes:
  """One post sentence, with the six features TFF parses."""
  return _example(
      {
          'creation_date': _bytes([creation_date.encode()]),
          'score': _int64([score]),
          'tags': _bytes([tags.encode()]),
          'title': _bytes([title.encode()]),
          'tokens': _bytes([tokens.encode()]),
          'type': _bytes([kind.encode()]),
      }
  )


def write_stackoverflow(
    data_dir: str,
    splits: Mapping[str, Mapping[str, Sequence[tuple[str, str]]]],
) -> str:
  """`data_dir/stackoverflow.sqlite`; `splits[split][client] = [(tokens,
  tags), ...]` for splits among `train`, `heldout`, `test`."""
  rows = {
      split: {
          c: [stackoverflow_example(t, g) for t, g in posts]
          for c, posts in clients.items()
      }
      for split, clients in splits.items()
  }
  return write_sqlite(os.path.join(data_dir, 'stackoverflow.sqlite'), rows)


def word_count_text(word_counts: Mapping[str, int]) -> str:
  return ''.join(f'{w} {c}\n' for w, c in word_counts.items())


def write_word_counts(
    directory: str, word_counts: Mapping[str, int], *, archive: bool = False
) -> str:
  """`stackoverflow.word_count` (or its `.tar.bz2`) in `directory`."""
  return _write(
      directory,
      'stackoverflow.word_count',
      word_count_text(word_counts),
      archive,
  )


def write_tag_counts(
    directory: str, tag_counts: Mapping[str, int], *, archive: bool = False
) -> str:
  """`stackoverflow.tag_count` (or its `.tar.bz2`) in `directory`."""
  return _write(
      directory, 'stackoverflow.tag_count', json.dumps(tag_counts), archive
  )


def _write(directory: str, name: str, text: str, archive: bool) -> str:
  os.makedirs(directory, exist_ok=True)
  if not archive:
    path = os.path.join(directory, name)
    with open(path, 'w') as f:
      f.write(text)
    return path
  path = os.path.join(directory, name + '.tar.bz2')
  data = text.encode()
  with tarfile.open(path, 'w:bz2') as tar:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
  return path


# Words with the characters a Shakespeare parser must handle: punctuation,
# non-ASCII, runs of spaces, stage directions.
WORDS = [
    'Thou',
    'art',
    'a',
    'villain;',
    'Good',
    'my',
    'lord,',
    'é',
    '*x*',
    'ZOUNDS!',
    'speak:',
    '12',
    "o'er",
    '[Exit]',
    '|bar|',
    'Hie  thee',
]


def role_snippets(
    rng: np.random.Generator, n_snippets: int, words_per_snippet: int
) -> list[str]:
  """`n_snippets` speeches of `words_per_snippet` random WORDS each."""
  snippets = []
  for _ in range(n_snippets):
    words = rng.choice(WORDS, words_per_snippet)
    # Newlines and runs of spaces, as speeches spanning several lines.
    snippets.append(
        '\n'.join(' '.join(words[i : i + 4]) for i in range(0, len(words), 4))
    )
  return snippets


def write_small_roles(directory: str, seed: int = 7, roles: int = 6) -> str:
  """`roles` Shakespeare roles of 2-5 training speeches and one test speech
  of 20 random WORDS each, written to `directory`; returns it."""
  rng = np.random.default_rng(seed)
  train, test = {}, {}
  for k in range(roles):
    snippets = role_snippets(rng, int(rng.integers(3, 7)), 20)
    train[f'PLAY_ROLE{k:02d}'] = snippets[:-1]
    test[f'PLAY_ROLE{k:02d}'] = snippets[-1:]
  write_shakespeare(directory, train, test)
  return directory
