# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Federated Shakespeare next-character prediction (one client per role).

Data: TFF's `tff.simulation.datasets.shakespeare.load_data` (LEAF's
Shakespeare; Caldas et al., arXiv:1812.01097), read from the cached
`shakespeare.sqlite` (715 roles; splits `train`/`test`; each example is a
snippet `{'snippets': string}` of contiguous lines). `use_synthetic_data=True`
uses `shakespeare.get_synthetic()` (3 roles), offline.

Preprocessing and model follow TFF's baseline
(`tensorflow_federated/python/simulation/baselines/shakespeare/`,
`char_prediction_preprocessing.py` and `char_prediction_models.py`, after
McMahan et al., AISTATS 2017): each snippet becomes character ids (0 pad,
1..86 `CHAR_VOCAB`, 87 out-of-vocabulary, 88 begin, 89 end) framed by
begin/end and zero-padded to a multiple of `sequence_length + 1`; the ids
are packed into windows of `sequence_length + 1` and split into input and
next-character target, `(x [B, L] int64, y [B, L] int64)`. The model embeds
into 8 dimensions, runs two LSTM(256) layers and a dense layer to 90 logits.

Differences from the baseline: shuffling happens at the snippet level with
a seed (reshuffled each epoch) and the epochs are repeated after batching,
so no window or batch straddles two epochs; the initialisers are seeded.
`accuracy` ignores padding (TFF's `MaskedCategoricalAccuracy` with the pad
token masked, as the baseline); `num_tokens` counts the non-pad targets. The
loss is the baseline's cross-entropy averaged over all positions, padding
included: TFF's `from_keras_model` forward pass does not apply the
embedding's `mask_zero` mask to the loss (checked in the tests).

`min_examples` counts raw snippets, not windows.
"""

import dataclasses
import os
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.simulation.baselines import keras_metrics
from tensorflow_federated.python.simulation.baselines.shakespeare import char_prediction_preprocessing

from tasks import base
from tasks import data_files
from tasks import options as task_options

CHAR_VOCAB = tuple(char_prediction_preprocessing.CHAR_VOCAB)
PAD, OOV, BOS, EOS = char_prediction_preprocessing.get_special_tokens()
VOCAB_SIZE = len(CHAR_VOCAB) + 4  # pad, out-of-vocabulary, begin, end.
DEFAULT_SEQUENCE_LENGTH = 80
SHUFFLE_BUFFER_SIZE = 10_000


def _check_sequence_length(sequence_length: int) -> None:
  if sequence_length < 1:
    raise base.TaskError(f'sequence_length must be >= 1, got {sequence_length}')


def _build_tokenize_fn(split_length: int):
  """Snippet -> int64 ids framed by begin/end, padded to `split_length`."""
  lookup_table = tf.lookup.StaticVocabularyTable(
      tf.lookup.KeyValueTensorInitializer(
          list(CHAR_VOCAB), tf.range(len(CHAR_VOCAB), dtype=tf.int64)
      ),
      num_oov_buckets=1,
  )

  def to_tokens_and_pad(example):
    chars = tf.strings.bytes_split(example['snippets'])
    tokens = lookup_table.lookup(keys=chars) + 1  # Reserve 0 for padding.
    tokens = tf.concat([[BOS], tokens, [EOS]], 0)
    pad_length = (-tf.shape(tokens)[0]) % split_length
    return tf.concat([tokens, tf.zeros(pad_length, dtype=tf.int64)], 0)

  return to_tokens_and_pad


def make_preprocess_fns(
    batch_size: int,
    sequence_length: int = DEFAULT_SEQUENCE_LENGTH,
    eval_batch_size: int = 64,
):
  """`(preprocess_train, preprocess_eval)` for raw Shakespeare datasets."""
  _check_sequence_length(sequence_length)
  if batch_size < 1 or eval_batch_size < 1:
    raise base.TaskError(
        f'batch sizes must be >= 1, got {batch_size} and {eval_batch_size}'
    )

  def to_windows(dataset, batch):
    dataset = dataset.map(_build_tokenize_fn(sequence_length + 1))
    dataset = dataset.unbatch().batch(sequence_length + 1, drop_remainder=True)
    return dataset.batch(batch).map(lambda s: (s[:, :-1], s[:, 1:]))

  def preprocess_train(
      dataset: tf.data.Dataset, epochs: int, shuffle_seed: Optional[int] = None
  ) -> tf.data.Dataset:
    if shuffle_seed is not None:
      dataset = dataset.shuffle(
          SHUFFLE_BUFFER_SIZE, seed=shuffle_seed, reshuffle_each_iteration=True
      )
    return to_windows(dataset, batch_size).repeat(epochs)

  def preprocess_eval(dataset: tf.data.Dataset) -> tf.data.Dataset:
    return to_windows(dataset, eval_batch_size)

  return preprocess_train, preprocess_eval


def create_keras_model(
    *, sequence_length: int = DEFAULT_SEQUENCE_LENGTH, seed: int = 0
) -> tf.keras.Model:
  """TFF's character LSTM (`char_prediction_models`), seeded initialisers."""
  _check_sequence_length(sequence_length)
  seeds = iter(range(seed * 16 + 1, seed * 16 + 16))
  model = tf.keras.Sequential(
      [
          tf.keras.layers.Embedding(
              input_dim=VOCAB_SIZE,
              input_length=sequence_length,
              output_dim=8,
              mask_zero=True,
              embeddings_initializer=tf.keras.initializers.RandomUniform(
                  -0.05, 0.05, seed=next(seeds)
              ),
          ),
      ]
  )
  for _ in range(2):
    model.add(
        tf.keras.layers.LSTM(
            units=256,
            return_sequences=True,
            stateful=False,
            kernel_initializer=tf.keras.initializers.HeNormal(seed=next(seeds)),
            recurrent_initializer=tf.keras.initializers.Orthogonal(
                seed=next(seeds)
            ),
        )
    )
  model.add(
      tf.keras.layers.Dense(
          VOCAB_SIZE,
          kernel_initializer=tf.keras.initializers.GlorotUniform(
              seed=next(seeds)
          ),
      )
  )
  return model


def create_model_fn(
    *, sequence_length: int = DEFAULT_SEQUENCE_LENGTH, seed: int = 0
) -> base.ModelFn:
  """A no-arg `model_fn` for `(x [B, L], y [B, L])` int64 windows."""
  _check_sequence_length(sequence_length)
  input_spec = (
      tf.TensorSpec([None, sequence_length], tf.int64),
      tf.TensorSpec([None, sequence_length], tf.int64),
  )

  def model_fn():
    return tff.learning.models.from_keras_model(
        create_keras_model(sequence_length=sequence_length, seed=seed),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=input_spec,
        metrics=[
            keras_metrics.NumTokensCounter(masked_tokens=[PAD]),
            keras_metrics.MaskedCategoricalAccuracy(
                masked_tokens=[PAD], name='accuracy'
            ),
        ],
    )

  return model_fn


def create_task(
    *,
    data_dir: Optional[str],
    use_synthetic_data: bool = False,
    batch_size: int,
    seed: int = 0,
    min_examples: int = 0,
    test_clients_fraction: float = 0.0,
    max_clients: Optional[int] = None,
    sequence_length: int = DEFAULT_SEQUENCE_LENGTH,
    eval_batch_size: int = 64,
) -> base.FederatedTask:
  """Federated Shakespeare with TFF's character LSTM.

  Args:
    data_dir: Directory holding TFF's decompressed `shakespeare.sqlite`
      (`None`: TFF's cache `~/.tff`). Never downloads.
    use_synthetic_data: Use TFF's offline synthetic Shakespeare instead.
    batch_size: Local training mini-batch size, in windows.
    seed: Seed of the model initialisers, the client subset and the split.
    min_examples: Keep roles with at least this many snippets.
    test_clients_fraction: 0: test on the training roles' own test split; in
      (0, 1): this fraction of the roles become unseen test clients, evaluated
      on all their data.
    max_clients: Keep a seeded random subset of at most this many roles.
    sequence_length: Characters per input window (TFF: 80).
    eval_batch_size: Batch size of evaluation streams.

  Returns:
    A `FederatedTask` named `shakespeare_character`.

  Raises:
    TaskError: On invalid arguments or a missing data file.
  """
  _check_sequence_length(sequence_length)
  data_files.validate_selection_args(
      min_examples=min_examples,
      test_clients_fraction=test_clients_fraction,
      max_clients=max_clients,
      batch_size=batch_size,
  )
  preprocess_train, preprocess_eval = make_preprocess_fns(
      batch_size, sequence_length, eval_batch_size
  )
  if use_synthetic_data:
    train = test = tff.simulation.datasets.shakespeare.get_synthetic()
    train_counts = test_counts = None
    source = 'synthetic Shakespeare'
  else:
    path = data_files.find(data_files.SHAKESPEARE, data_dir)
    train_counts = data_files.sql_example_counts(path, ['train'])
    test_counts = data_files.sql_example_counts(path, ['test'])
    train, test = tff.simulation.datasets.shakespeare.load_data(
        cache_dir=os.path.dirname(path)
    )
    source = f'Shakespeare ({path})'
  train, test = data_files.select_clients(
      train_data=train,
      test_data=test,
      seed=seed,
      min_examples=min_examples,
      test_clients_fraction=test_clients_fraction,
      max_clients=max_clients,
      train_counts=train_counts,
      test_counts=test_counts,
      same_data=use_synthetic_data,
  )
  protocol = (
      f'{len(test.client_ids)} unseen test roles'
      if test_clients_fraction > 0
      else 'per-role test split'
  )
  return base.FederatedTask(
      name='shakespeare_character',
      train_data=train,
      test_data=test,
      model_fn=create_model_fn(sequence_length=sequence_length, seed=seed),
      preprocess_train=preprocess_train,
      preprocess_eval=preprocess_eval,
      description=(
          f'{source}, {len(train.client_ids)} training roles, {protocol}; '
          f'char LSTM 2x256, windows of {sequence_length}'
      ),
  )


@dataclasses.dataclass(frozen=True)
class ShakespeareOptions(task_options.DataFiles, task_options.ClientChoice):
  """Options of `shakespeare_character`."""


TASK = task_options.Task(
    name='shakespeare_character',
    data='`shakespeare.sqlite` in data_dir',
    model="TFF's character LSTM",
    options=ShakespeareOptions,
    create=create_task,
)
