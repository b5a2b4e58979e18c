# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The seeds' Shakespeare settings (Delta-FL, q-FFL, FedProx) as presets.

Each speaking role is a device. A role's text is its snippets (speeches)
joined in stored order (the `train` split, then the `test` split of TFF's
`shakespeare.sqlite`), normalised as LEAF's `shake_utils.__txt_to_data`
(newlines become spaces, runs of two or more spaces become one), and cut
into sliding windows: example `i` is `x = text[i:i + H]`, `y = text[i + H]`
for `i < len(text) - H`, ONE label per example (LEAF; Caldas et al.,
arXiv:1812.01097). The presets (docs/tasks.md traces every choice):

* `deltafl` (seed 000, Delta-FL, Table 1, section 5 and App. C.1.3): H = 20
  over 53 classes (`a-z` 0-25, `A-Z` 26-51, everything else 52), one-hot
  input; devices with >= 100 examples, split into training devices and
  unseen test devices (`n // 2` training, as 544 / 545); GRU(128) then a
  dense layer to 53. The authors' code embeds into 8 dimensions and stacks
  two GRU layers; the paper (seed) wins: one-hot, one GRU layer.
* `qffl` (seed 003, section 4.6.1, Table 4.4): 31 roles sampled among those
  with >= 64 examples (LEAF's `-k 64` in the authors' fair_flearn README),
  80-character windows over LEAF's 80 symbols, an 8-d embedding, two
  LSTM(256) layers (width from fair_flearn's `MODEL_PARAMS`; the seed gives
  none), a dense layer to 80; each device's windows split at random 80 / 10
  / 10 into train / validation / test.
* `fedprox` (seed 003, section 3.7.1, Table 3.1): 143 roles sampled (LEAF
  `-k 0`: any role with >= 2 examples), the same input and embedding, two
  LSTM(100) layers, dense to 80; each device's windows split at random
  80 / 20 into train / test.

A character outside LEAF's 80 symbols (LEAF's `find` would give -1) maps to
the space. Roles larger than the 10,000-example shuffle buffer are shuffled
within that buffer (the stacked engine reproduces the same orders).
`use_synthetic_data=True` builds seeded random role texts (no files) that go
through the same windowing, selection and split.
"""

import collections
import dataclasses
import re
import sqlite3
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base
from tasks import data_files
from tasks import options as task_options

LEAF_VOCAB = (
    '\n !"&\'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]'
    'abcdefghijklmnopqrstuvwxyz}'
)
DELTAFL_CLASSES = 53
SHUFFLE_BUFFER_SIZE = 10_000


@dataclasses.dataclass(frozen=True)
class Preset:
  """One seed's Shakespeare setting.

  Attributes:
    name: `deltafl`, `qffl` or `fedprox`.
    window: Input characters H per example.
    vocabulary: `deltafl53` or `leaf80`.
    cell: `gru` or `lstm`.
    layers: Recurrent layers.
    units: Units per recurrent layer.
    embedding_dim: Learned embedding width (0: one-hot input).
    min_examples: Keep roles with at least this many windows.
    num_clients: Roles sampled (None: every eligible role).
    split: Per-device `(train, validation)` fractions of the windows (the
      rest is test), or None for the unseen-test-devices protocol.
  """

  name: str
  window: int
  vocabulary: str
  cell: str
  layers: int
  units: int
  embedding_dim: int
  min_examples: int
  num_clients: Optional[int]
  split: Optional[tuple[float, float]]

  @property
  def num_classes(self) -> int:
    return (
        DELTAFL_CLASSES if self.vocabulary == 'deltafl53' else len(LEAF_VOCAB)
    )


PRESETS = collections.OrderedDict(
    deltafl=Preset(
        'deltafl', 20, 'deltafl53', 'gru', 1, 128, 0, 100, None, None
    ),
    qffl=Preset('qffl', 80, 'leaf80', 'lstm', 2, 256, 8, 64, 31, (0.8, 0.1)),
    fedprox=Preset(
        'fedprox', 80, 'leaf80', 'lstm', 2, 100, 8, 2, 143, (0.8, 0.0)
    ),
)


def get_preset(name: str) -> Preset:
  if name not in PRESETS:
    raise base.TaskError(
        f'unknown Shakespeare preset {name!r}; choose one '
        f'of: {", ".join(PRESETS)}'
    )
  return PRESETS[name]


# ------------------------------------------------------------------- Text.


def _lookup_table(vocabulary: str) -> np.ndarray:
  """Class id of each code point < 128; `table[128]` is the default class."""
  table = np.zeros(129, np.uint8)
  if vocabulary == 'deltafl53':
    table[:] = 52
    for i in range(26):
      table[ord('a') + i] = i
      table[ord('A') + i] = 26 + i
  else:
    table[:] = LEAF_VOCAB.index(' ')
    for i, c in enumerate(LEAF_VOCAB):
      table[ord(c)] = i
  return table


def normalize(snippets) -> str:
  """A role's text from its snippets, as LEAF's `__txt_to_data` reads it."""
  text = '\n'.join(snippets).replace('\n', ' ')
  return re.sub(r'  +', ' ', text)


def encode(text: str, vocabulary: str) -> np.ndarray:
  """Class ids (uint8) of the characters of `text`."""
  points = np.frombuffer(text.encode('utf-32-le'), np.uint32)
  return _lookup_table(vocabulary)[np.minimum(points, 128)]


def windows(ids: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
  """`(x [n, H], y [n])` with `x[i] = ids[i:i+H]`, `y[i] = ids[i+H]`."""
  n = max(len(ids) - window, 0)
  if n == 0:
    return np.zeros([0, window], ids.dtype), np.zeros([0], ids.dtype)
  x = np.lib.stride_tricks.sliding_window_view(ids, window)[:n]
  return x, ids[window : window + n]


def read_role_snippets(path: str) -> dict[str, list[str]]:
  """Each role's snippets from a TFF-schema `shakespeare.sqlite`.

  Roles in sorted order; snippets in stored order, the `train` split then
  the `test` split.
  """
  roles: dict[str, dict[str, list[str]]] = collections.defaultdict(
      lambda: {'train': [], 'test': []}
  )
  connection = sqlite3.connect(f'file:{path}?mode=ro', uri=True)
  try:
    rows = connection.execute(
        'SELECT client_id, split_name, serialized_example_proto FROM examples'
        ' ORDER BY rowid'
    )
    for client_id, split, proto in rows:
      example = tf.train.Example.FromString(proto)
      snippet = example.features.feature['snippets'].bytes_list.value[0]
      roles[client_id].setdefault(split, []).append(snippet.decode('utf-8'))
  except sqlite3.DatabaseError as e:
    raise base.TaskError(f'cannot read {path}: {e}') from None
  finally:
    connection.close()
  return {
      cid: parts.get('train', []) + parts.get('test', [])
      for cid, parts in sorted(roles.items())
  }


def synthetic_role_snippets(
    seed: int, num_roles: int = 40
) -> dict[str, list[str]]:
  """Seeded random role texts over LEAF's symbols (no files)."""
  rng = np.random.default_rng([seed, 7])
  alphabet = np.array(list(LEAF_VOCAB[1:]))
  roles = {}
  for k in range(num_roles):
    probs = rng.dirichlet(np.full(len(alphabet), 0.3))
    length = int(rng.integers(150, 1200))
    roles[f'SYNTHETIC_ROLE_{k:03d}'] = [
        ''.join(rng.choice(alphabet, size=length, p=probs))
    ]
  return roles


# -------------------------------------------------------------- Selection.


def select_roles(
    counts: dict[str, int],
    preset: Preset,
    *,
    seed: int,
    max_clients: Optional[int] = None,
) -> list[str]:
  """The preset's devices: the >= min rule, then the seeded sample (sorted)."""
  eligible = sorted(
      cid for cid, n in counts.items() if n >= preset.min_examples
  )
  wanted = preset.num_clients
  if max_clients is not None:
    wanted = max_clients if wanted is None else min(wanted, max_clients)
  if not eligible:
    raise base.TaskError(
        f'no role has at least {preset.min_examples} examples of '
        f'{preset.window + 1} characters (out of {len(counts)} roles)'
    )
  if wanted is None or wanted >= len(eligible):
    return eligible
  rng = np.random.default_rng([seed, 11])
  return sorted(
      eligible[i] for i in rng.choice(len(eligible), wanted, replace=False)
  )


def split_devices(role_ids, *, seed: int) -> tuple[list[str], list[str]]:
  """Delta-FL: `n // 2` training devices, the rest unseen test devices."""
  ids = sorted(role_ids)
  if len(ids) < 2:
    raise base.TaskError(
        f'the unseen-test-devices split needs >= 2 roles, got {len(ids)}'
    )
  perm = np.random.default_rng([seed, 13]).permutation(len(ids))
  n_train = len(ids) // 2
  return (
      sorted(ids[i] for i in perm[:n_train]),
      sorted(ids[i] for i in perm[n_train:]),
  )


def split_examples(
    n: int, fractions: tuple[float, float], rng
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Random `(train, validation, test)` index sets of one device's windows.

  LEAF's `split_data.py` (by sample): `max(1, int(0.8 n))` training windows
  drawn at random; here also `int(f_val n)` validation windows; the rest
  is test. Each set keeps the text order.
  """
  train_f, val_f = fractions
  n_train = max(1, int(train_f * n))
  n_val = int(val_f * n)
  perm = rng.permutation(n)
  return (
      np.sort(perm[:n_train]),
      np.sort(perm[n_train : n_train + n_val]),
      np.sort(perm[n_train + n_val :]),
  )


class _WindowClientData(tff.simulation.datasets.ClientData):
  """Clients whose examples are `{'x': uint8[H], 'y': uint8}` windows.

  Built on demand from each role's class ids (no window is stored), so the
  full dataset costs its characters, not its windows.
  """

  def __init__(
      self,
      ids: dict[str, np.ndarray],
      window: int,
      indices: Optional[dict[str, np.ndarray]] = None,
  ):
    if not ids:
      raise base.TaskError('no client left')
    self._ids = ids
    self._window = window
    self._indices = indices
    self._element_spec = collections.OrderedDict(
        x=tf.TensorSpec([window], tf.uint8), y=tf.TensorSpec([], tf.uint8)
    )

  def arrays(self, client_id: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = windows(self._ids[client_id], self._window)
    if self._indices is not None:
      idx = self._indices[client_id]
      x, y = x[idx], y[idx]
    return np.ascontiguousarray(x), np.ascontiguousarray(y)

  @property
  def client_ids(self):
    return list(self._ids)

  def create_tf_dataset_for_client(self, client_id: str) -> tf.data.Dataset:
    if client_id not in self._ids:
      raise ValueError(f'unknown client id {client_id!r}')
    x, y = self.arrays(client_id)
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(x=x, y=y))

  @property
  def serializable_dataset_fn(self):
    return self.create_tf_dataset_for_client

  @property
  def element_type_structure(self):
    return self._element_spec

  @property
  def dataset_computation(self):
    raise NotImplementedError(
        'windowed Shakespeare clients are built in '
        'Python; use create_tf_dataset_for_client'
    )


# ------------------------------------------------------------------ Model.


class OneHot(tf.keras.layers.Layer):
  """`ids [B, H]` -> one-hot `[B, H, depth]` float32 (Delta-FL's input)."""

  def __init__(self, depth: int, **kwargs):
    super().__init__(**kwargs)
    self.depth = depth

  def call(self, inputs):
    return tf.one_hot(tf.cast(inputs, tf.int32), self.depth)

  def get_config(self):
    return dict(super().get_config(), depth=self.depth)


def create_keras_model(
    preset: Preset, *, units: Optional[int] = None, seed: int = 0
) -> tf.keras.Model:
  """The preset's recurrent model; seeded initialisers."""
  units = preset.units if units is None else units
  if units < 1:
    raise base.TaskError(f'rnn_units must be >= 1, got {units}')
  seeds = iter(range(seed * 16 + 1, seed * 16 + 16))
  model = tf.keras.Sequential()
  model.add(tf.keras.Input([preset.window], dtype=tf.int32))
  if preset.embedding_dim:
    model.add(
        tf.keras.layers.Embedding(
            preset.num_classes,
            preset.embedding_dim,
            embeddings_initializer=tf.keras.initializers.RandomUniform(
                -0.05, 0.05, seed=next(seeds)
            ),
        )
    )
  else:
    model.add(OneHot(preset.num_classes))
  cell = tf.keras.layers.GRU if preset.cell == 'gru' else tf.keras.layers.LSTM
  for layer in range(preset.layers):
    model.add(
        cell(
            units,
            return_sequences=layer < preset.layers - 1,
            kernel_initializer=tf.keras.initializers.GlorotUniform(
                seed=next(seeds)
            ),
            recurrent_initializer=tf.keras.initializers.Orthogonal(
                seed=next(seeds)
            ),
        )
    )
  model.add(
      tf.keras.layers.Dense(
          preset.num_classes,
          kernel_initializer=tf.keras.initializers.GlorotUniform(
              seed=next(seeds)
          ),
      )
  )
  return model


def create_model_fn(
    preset: Preset, *, units: Optional[int] = None, seed: int = 0
) -> base.ModelFn:
  """A no-arg `model_fn` for `(x [B, H] int32, y [B] int32)` batches."""
  create_keras_model(preset, units=units, seed=seed)  # Validates eagerly.
  input_spec = (
      tf.TensorSpec([None, preset.window], tf.int32),
      tf.TensorSpec([None], tf.int32),
  )

  def model_fn():
    return tff.learning.models.from_keras_model(
        create_keras_model(preset, units=units, seed=seed),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=input_spec,
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')],
    )

  return model_fn


def make_preprocess_fns(batch_size: int, eval_batch_size: int = 256):
  """Per-example cast, seeded shuffle, batch, repeat (as tasks.synthetic)."""
  if batch_size < 1 or eval_batch_size < 1:
    raise base.TaskError(
        f'batch sizes must be >= 1, got {batch_size} and {eval_batch_size}'
    )

  def to_tuple(example):
    return tf.cast(example['x'], tf.int32), tf.cast(example['y'], tf.int32)

  def preprocess_train(
      dataset: tf.data.Dataset, epochs: int, shuffle_seed: Optional[int] = None
  ) -> tf.data.Dataset:
    dataset = dataset.map(to_tuple)
    if shuffle_seed is not None:
      dataset = dataset.shuffle(
          SHUFFLE_BUFFER_SIZE, seed=shuffle_seed, reshuffle_each_iteration=True
      )
    return dataset.batch(batch_size).repeat(epochs)

  def preprocess_eval(dataset: tf.data.Dataset) -> tf.data.Dataset:
    return dataset.map(to_tuple).batch(eval_batch_size)

  return preprocess_train, preprocess_eval


# ------------------------------------------------------------------- Task.


def create_task(
    *,
    preset: str,
    data_dir: Optional[str],
    use_synthetic_data: bool = False,
    batch_size: int,
    seed: int = 0,
    model_seed: Optional[int] = None,
    max_clients: Optional[int] = None,
    max_examples_per_client: Optional[int] = None,
    rnn_units: Optional[int] = None,
    eval_batch_size: int = 256,
) -> base.FederatedTask:
  """A seed's Shakespeare setting (`deltafl`, `qffl` or `fedprox`).

  Args:
    preset: The setting, a key of `PRESETS`.
    data_dir: Directory holding `shakespeare.sqlite` in TFF's schema (`None`:
      `~/.tff`). Never downloads.
    use_synthetic_data: Use seeded random role texts instead (offline).
    batch_size: Local training mini-batch size.
    seed: Seed of the role sample and the splits (the data seed), and of the
      model initialisers unless `model_seed` is given.
    model_seed: Seed of the model initialisers (None: `seed`), so that runs
      on the same roles can vary their initialisation.
    max_clients: Scale-down: keep at most this many roles (a seeded subset
      of the eligible ones, before the preset's split).
    max_examples_per_client: Scale-down: keep each role's first this many
      windows (after the selection rule, before the per-device split).
    rnn_units: Scale-down: recurrent width instead of the preset's.
    eval_batch_size: Batch size of evaluation streams.

  Returns:
    A `FederatedTask` named `shakespeare_leaf`.

  Raises:
    TaskError: On invalid arguments or a missing data file.
  """
  spec = get_preset(preset)
  data_files.validate_selection_args(
      min_examples=0,
      test_clients_fraction=0.0,
      max_clients=max_clients,
      batch_size=batch_size,
  )
  if max_examples_per_client is not None and max_examples_per_client < 1:
    raise base.TaskError(
        'max_examples_per_client must be >= 1 or None, got '
        f'{max_examples_per_client}'
    )
  model_fn = create_model_fn(
      spec, units=rnn_units, seed=seed if model_seed is None else model_seed
  )
  preprocess_train, preprocess_eval = make_preprocess_fns(
      batch_size, eval_batch_size
  )
  if use_synthetic_data:
    snippets = synthetic_role_snippets(seed)
    source = 'synthetic role texts'
  else:
    path = data_files.find(data_files.SHAKESPEARE, data_dir)
    snippets = read_role_snippets(path)
    source = f'Shakespeare ({path})'
  ids = {
      cid: encode(normalize(s), spec.vocabulary) for cid, s in snippets.items()
  }
  counts = {cid: max(len(v) - spec.window, 0) for cid, v in ids.items()}
  chosen = select_roles(counts, spec, seed=seed, max_clients=max_clients)
  if max_examples_per_client is not None:
    ids = {
        cid: v[: max_examples_per_client + spec.window]
        for cid, v in ids.items()
    }
  ids = {cid: ids[cid] for cid in chosen}
  validation = None
  if spec.split is None:
    train_ids, test_ids = split_devices(chosen, seed=seed)
    train = _WindowClientData({c: ids[c] for c in train_ids}, spec.window)
    test = _WindowClientData({c: ids[c] for c in test_ids}, spec.window)
    protocol = (
        f'{len(train_ids)} training roles, {len(test_ids)} unseen ' 'test roles'
    )
  else:
    parts = collections.defaultdict(dict)
    for k, cid in enumerate(chosen):
      n = max(len(ids[cid]) - spec.window, 0)
      rng = np.random.default_rng([seed, 17, k])
      for name, idx in zip(
          ('train', 'validation', 'test'), split_examples(n, spec.split, rng)
      ):
        parts[name][cid] = idx
    train = _WindowClientData(ids, spec.window, parts['train'])
    test = _WindowClientData(ids, spec.window, parts['test'])
    if spec.split[1] > 0:
      validation = _WindowClientData(ids, spec.window, parts['validation'])
    fractions = '/'.join(
        f'{round(100 * f)}'
        for f in (spec.split[0], spec.split[1], 1 - sum(spec.split))
        if f > 0
    )
    protocol = f'{len(chosen)} roles, {fractions} split per role'
  units = spec.units if rnn_units is None else rnn_units
  model = (
      f'{"one-hot" if not spec.embedding_dim else "8-d embedding"}, '
      f'{spec.layers}x{spec.cell.upper()}({units}), dense '
      f'{spec.num_classes}'
  )
  return base.FederatedTask(
      name='shakespeare_leaf',
      train_data=train,
      test_data=test,
      validation_data=validation,
      model_fn=model_fn,
      preprocess_train=preprocess_train,
      preprocess_eval=preprocess_eval,
      description=(
          f'{spec.name} preset: {source}, {protocol}; windows of '
          f'{spec.window} -> next of {spec.num_classes} classes; '
          f'{model}'
      ),
  )


@dataclasses.dataclass(frozen=True)
class ShakespeareLeafOptions(task_options.DataFiles):
  """Options of `shakespeare_leaf`: its preset fixes the client selection
  and the split (no `min_examples`, no `test_clients_fraction`)."""

  preset: str = task_options.option(
      'deltafl',
      "The seed's setting, deltafl, qffl or fedprox (see docs/tasks.md).",
      choices=tuple(PRESETS),
      flag='shakespeare_preset',
  )
  max_examples_per_client: Optional[int] = task_options.option(
      None, "Scale-down: keep each role's first N windows.", low=1
  )
  rnn_units: Optional[int] = task_options.option(
      None, "Scale-down: recurrent width instead of the preset's.", low=1
  )


TASK = task_options.Task(
    name='shakespeare_leaf',
    data='`shakespeare.sqlite` in data_dir, LEAF windows',
    model="the seeds' GRU / LSTM (`preset`: deltafl, qffl, fedprox)",
    options=ShakespeareLeafOptions,
    create=create_task,
    model_seed=True,
)
