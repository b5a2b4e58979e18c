# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Federated StackOverflow next-word and tag prediction (one client per user).

Data: TFF's `tff.simulation.datasets.stackoverflow.load_data`, read from the
cached `stackoverflow.sqlite` (splits `train`, `heldout`, `test`; examples
`{creation_date, score, tags, title, tokens, type}`), plus the vocabularies
`stackoverflow.word_count` and (tag task) `stackoverflow.tag_count`, the
extracted contents of TFF's `*.tar.bz2` archives (see `data_files`). The
`heldout` split (disjoint users) is the validation data, as in TFF's
baselines. `use_synthetic_data=True` uses `stackoverflow.get_synthetic()`
(3 users) and its synthetic word and tag counts, offline; the vocabularies
are then smaller than requested (60 words, 20 tags).

Tasks follow TFF's baselines
(`tensorflow_federated/python/simulation/baselines/stackoverflow/`, after
Reddi et al., "Adaptive Federated Optimization", ICLR 2021):

* `task_type='word'`: the `sequence_length` first words of a post, as ids
  (0 pad, 1..V vocabulary, then out-of-vocabulary buckets, begin, end),
  framed by begin/end and padded to `sequence_length + 1`, split into input
  and next-word target `(x [B, L] int64, y [B, L] int64)`. Model: embedding
  (96) -> LSTM(670) -> dense(96) -> dense logits over the extended vocabulary.
  `accuracy` masks padding (TFF's `MaskedCategoricalAccuracy`); TFF's
  `accuracy_without_out_of_vocab[_or_end_of_sentence]` and `num_tokens` are
  kept.
* `task_type='tag'`: normalised bag of words of post plus title
  (`[B, word_vocab_size]` float32) -> multi-hot tags (`[B, tag_vocab_size]`);
  a sigmoid dense layer (one-vs-rest logistic regression) with TFF's summed
  binary cross-entropy, `precision` and `recall_at_5` (so at least 5 tags).
  Multi-label data has no single accuracy; `accuracy` here is precision at 1:
  the fraction of examples whose top-scored tag is one of their tags.

`max_examples_per_client` keeps each user's first N examples, in stored
order (TFF's baselines cap each training user at `max_elements_per_user`,
1,000 in google-research/federated's StackOverflow experiments); here every
client's data is capped, training and test (after the Delta-FL protocol's
merge of a user's splits), and `min_examples` counts before the cap.

Differences from the baselines: seeded shuffling (reshuffled each epoch) and
epochs repeated after batching, so batches never straddle epochs; seeded
initialisers. `min_examples` counts raw examples (posts' sentences).
"""

import dataclasses
import functools
import os
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.simulation.baselines import keras_metrics
from tensorflow_federated.python.simulation.baselines.stackoverflow import tag_prediction_preprocessing
from tensorflow_federated.python.simulation.baselines.stackoverflow import word_prediction_preprocessing

from tasks import base
from tasks import data_files
from tasks import options as task_options

TASK_TYPES = ('word', 'tag')
DEFAULT_WORD_VOCAB_SIZE = 10_000
DEFAULT_TAG_VOCAB_SIZE = 500
DEFAULT_SEQUENCE_LENGTH = 20
SHUFFLE_BUFFER_SIZE = 10_000
_MIN_TAGS = 5  # TFF's `recall_at_5` needs at least 5 tags.


class _Seeds:
  """Distinct seeds for successive initialisers."""

  def __init__(self, seed: int):
    self._next = seed * 64

  def __call__(self) -> int:
    self._next += 1
    return self._next


def _split_input_target(sequences):
  return sequences[:, :-1], sequences[:, 1:]


def make_word_preprocess_fns(
    vocab: list[str],
    *,
    batch_size: int,
    sequence_length: int = DEFAULT_SEQUENCE_LENGTH,
    num_out_of_vocab_buckets: int = 1,
    eval_batch_size: int = 256,
):
  """`(preprocess_train, preprocess_eval)` for next-word prediction."""

  def to_sequences(dataset, batch):
    to_ids = word_prediction_preprocessing.build_to_ids_fn(
        vocab=vocab,
        max_sequence_length=sequence_length,
        num_out_of_vocab_buckets=num_out_of_vocab_buckets,
    )
    dataset = dataset.map(to_ids)
    dataset = dataset.padded_batch(batch, padded_shapes=[sequence_length + 1])
    return dataset.map(_split_input_target)

  def preprocess_train(
      dataset: tf.data.Dataset, epochs: int, shuffle_seed: Optional[int] = None
  ) -> tf.data.Dataset:
    if shuffle_seed is not None:
      dataset = dataset.shuffle(
          SHUFFLE_BUFFER_SIZE, seed=shuffle_seed, reshuffle_each_iteration=True
      )
    return to_sequences(dataset, batch_size).repeat(epochs)

  def preprocess_eval(dataset: tf.data.Dataset) -> tf.data.Dataset:
    return to_sequences(dataset, eval_batch_size)

  return preprocess_train, preprocess_eval


def make_tag_preprocess_fns(
    word_vocab: list[str],
    tag_vocab: list[str],
    *,
    batch_size: int,
    eval_batch_size: int = 256,
):
  """`(preprocess_train, preprocess_eval)` for tag prediction."""

  def to_bags(dataset, batch):
    to_ids = tag_prediction_preprocessing.build_to_ids_fn(word_vocab, tag_vocab)
    return dataset.map(to_ids).batch(batch)

  def preprocess_train(
      dataset: tf.data.Dataset, epochs: int, shuffle_seed: Optional[int] = None
  ) -> tf.data.Dataset:
    if shuffle_seed is not None:
      dataset = dataset.shuffle(
          SHUFFLE_BUFFER_SIZE, seed=shuffle_seed, reshuffle_each_iteration=True
      )
    return to_bags(dataset, batch_size).repeat(epochs)

  def preprocess_eval(dataset: tf.data.Dataset) -> tf.data.Dataset:
    return to_bags(dataset, eval_batch_size)

  return preprocess_train, preprocess_eval


def create_word_model_fn(
    vocab_size: int,
    *,
    sequence_length: int = DEFAULT_SEQUENCE_LENGTH,
    num_out_of_vocab_buckets: int = 1,
    embedding_size: int = 96,
    lstm_size: int = 670,
    seed: int = 0,
) -> base.ModelFn:
  """TFF's next-word LSTM (`word_prediction_models`), seeded initialisers."""
  special = word_prediction_preprocessing.get_special_tokens(
      vocab_size, num_out_of_vocab_buckets=num_out_of_vocab_buckets
  )
  pad, oov, eos = special.padding, special.out_of_vocab, special.end_of_sentence
  extended_vocab_size = vocab_size + special.get_number_of_special_tokens()
  input_spec = (
      tf.TensorSpec([None, sequence_length], tf.int64),
      tf.TensorSpec([None, sequence_length], tf.int64),
  )

  def keras_model():
    seeds = _Seeds(seed)
    glorot = lambda: tf.keras.initializers.GlorotUniform(seed=seeds())
    inputs = tf.keras.layers.Input(shape=(None,))
    embedded = tf.keras.layers.Embedding(
        input_dim=extended_vocab_size,
        output_dim=embedding_size,
        mask_zero=True,
        embeddings_initializer=tf.keras.initializers.RandomUniform(
            -0.05, 0.05, seed=seeds()
        ),
    )(inputs)
    processed = tf.keras.layers.LSTM(
        lstm_size,
        return_sequences=True,
        kernel_initializer=glorot(),
        recurrent_initializer=tf.keras.initializers.Orthogonal(seed=seeds()),
    )(embedded)
    projected = tf.keras.layers.Dense(
        embedding_size, kernel_initializer=glorot()
    )(processed)
    logits = tf.keras.layers.Dense(
        extended_vocab_size, kernel_initializer=glorot()
    )(projected)
    return tf.keras.Model(inputs=inputs, outputs=logits)

  def model_fn():
    return tff.learning.models.from_keras_model(
        keras_model(),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=input_spec,
        metrics=[
            keras_metrics.NumTokensCounter(masked_tokens=[pad]),
            keras_metrics.MaskedCategoricalAccuracy(
                name='accuracy', masked_tokens=[pad]
            ),
            keras_metrics.MaskedCategoricalAccuracy(
                name='accuracy_without_out_of_vocab',
                masked_tokens=[pad] + oov,
            ),
            keras_metrics.MaskedCategoricalAccuracy(
                name='accuracy_without_out_of_vocab_or_end_of_sentence',
                masked_tokens=[pad, eos] + oov,
            ),
        ],
    )

  return model_fn


def create_tag_model_fn(
    word_vocab_size: int, tag_vocab_size: int, *, seed: int = 0
) -> base.ModelFn:
  """TFF's tag logistic regression, seeded; `accuracy` is precision at 1."""
  input_spec = (
      tf.TensorSpec([None, word_vocab_size], tf.float32),
      tf.TensorSpec([None, tag_vocab_size], tf.float32),
  )

  def model_fn():
    keras_model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(word_vocab_size,)),
            tf.keras.layers.Dense(
                tag_vocab_size,
                activation='sigmoid',
                kernel_initializer=tf.keras.initializers.GlorotUniform(
                    seed=seed * 64 + 1
                ),
            ),
        ]
    )
    return tff.learning.models.from_keras_model(
        keras_model,
        loss=tf.keras.losses.BinaryCrossentropy(
            from_logits=False, reduction=tf.keras.losses.Reduction.SUM
        ),
        input_spec=input_spec,
        metrics=[
            tf.keras.metrics.Precision(top_k=1, name='accuracy'),
            tf.keras.metrics.Precision(name='precision'),
            tf.keras.metrics.Recall(top_k=5, name='recall_at_5'),
        ],
    )

  return model_fn


def capped(
    client_data: base.ClientData, max_examples: Optional[int]
) -> base.ClientData:
  """Each client's first `max_examples` examples (`None`: all of them)."""
  if max_examples is None:
    return client_data
  source = client_data.serializable_dataset_fn

  def dataset_fn(client_id):
    return source(client_id).take(max_examples)

  return base.ClientData.from_clients_and_tf_fn(
      list(client_data.client_ids), dataset_fn
  )


def create_task(
    *,
    data_dir: Optional[str],
    use_synthetic_data: bool = False,
    batch_size: int,
    seed: int = 0,
    min_examples: int = 0,
    test_clients_fraction: float = 0.0,
    max_clients: Optional[int] = None,
    max_examples_per_client: Optional[int] = None,
    task_type: str = 'word',
    word_vocab_size: int = DEFAULT_WORD_VOCAB_SIZE,
    tag_vocab_size: int = DEFAULT_TAG_VOCAB_SIZE,
    sequence_length: int = DEFAULT_SEQUENCE_LENGTH,
    num_out_of_vocab_buckets: int = 1,
    embedding_size: int = 96,
    lstm_size: int = 670,
    eval_batch_size: int = 256,
) -> base.FederatedTask:
  """Federated StackOverflow next-word (`'word'`) or tag (`'tag'`) prediction.

  Args:
    data_dir: Directory holding TFF's `stackoverflow.sqlite` and the extracted
      `stackoverflow.word_count` (and `stackoverflow.tag_count` for tags),
      directly or in `data_dir/datasets` (`None`: `~/.tff`). Never downloads.
    use_synthetic_data: Use TFF's offline synthetic StackOverflow instead.
    batch_size: Local training mini-batch size.
    seed: Seed of the model initialisers, the client subset and the split.
    min_examples: Keep users with at least this many examples.
    test_clients_fraction: 0: test on the training users' own test split
      (users without one are not tested); in (0, 1): this fraction of the
      users become unseen test clients, evaluated on all their data.
    max_clients: Keep a seeded random subset of at most this many users.
    max_examples_per_client: Keep each user's first this many examples
      (`None`: all; TFF's baselines: 1000 training examples).
    task_type: `'word'` or `'tag'`.
    word_vocab_size: Most frequent words kept (TFF: 10000).
    tag_vocab_size: Most frequent tags kept (TFF: 500; tag task only).
    sequence_length: Words per sequence (word task only; TFF: 20).
    num_out_of_vocab_buckets: Out-of-vocabulary buckets (word task only).
    embedding_size: Word embedding size (word task only; TFF: 96).
    lstm_size: LSTM units (word task only; TFF: 670).
    eval_batch_size: Batch size of evaluation streams.

  Returns:
    A `FederatedTask` named `stackoverflow_word` or `stackoverflow_tag`.

  Raises:
    TaskError: On invalid arguments or a missing data file.
  """
  if task_type not in TASK_TYPES:
    raise base.TaskError(
        f'unknown StackOverflow task_type {task_type!r}; choose one of '
        f'{", ".join(TASK_TYPES)}'
    )
  if max_examples_per_client is not None and max_examples_per_client < 1:
    raise base.TaskError(
        'max_examples_per_client must be >= 1 or None, got '
        f'{max_examples_per_client}'
    )
  for name, value in (
      ('word_vocab_size', word_vocab_size),
      ('tag_vocab_size', tag_vocab_size),
      ('sequence_length', sequence_length),
      ('num_out_of_vocab_buckets', num_out_of_vocab_buckets),
      ('embedding_size', embedding_size),
      ('lstm_size', lstm_size),
      ('eval_batch_size', eval_batch_size),
  ):
    if value < 1:
      raise base.TaskError(f'{name} must be >= 1, got {value}')
  if task_type == 'tag' and tag_vocab_size < _MIN_TAGS:
    raise base.TaskError(
        f'tag_vocab_size must be >= {_MIN_TAGS} (recall_at_5), got '
        f'{tag_vocab_size}'
    )
  data_files.validate_selection_args(
      min_examples=min_examples,
      test_clients_fraction=test_clients_fraction,
      max_clients=max_clients,
      batch_size=batch_size,
  )
  if use_synthetic_data:
    train = validation = test = (
        tff.simulation.datasets.stackoverflow.get_synthetic()
    )
    word_counts = (
        tff.simulation.datasets.stackoverflow.get_synthetic_word_counts()
    )
    tag_counts = (
        tff.simulation.datasets.stackoverflow.get_synthetic_tag_counts()
    )
    train_counts = test_counts = None
    source = 'synthetic StackOverflow'
  else:
    path = data_files.find(data_files.STACKOVERFLOW, data_dir)
    word_counts = data_files.read_word_counts(
        data_files.find(data_files.STACKOVERFLOW_WORD_COUNT, data_dir),
        vocab_size=word_vocab_size,
    )
    tag_counts = None
    if task_type == 'tag':
      tag_counts = data_files.read_tag_counts(
          data_files.find(data_files.STACKOVERFLOW_TAG_COUNT, data_dir)
      )
    train_counts = data_files.sql_example_counts(path, ['train'])
    test_counts = data_files.sql_example_counts(path, ['test'])
    train, validation, test = tff.simulation.datasets.stackoverflow.load_data(
        cache_dir=os.path.dirname(path)
    )
    source = f'StackOverflow ({path})'
  word_vocab = list(word_counts)[:word_vocab_size]
  if not word_vocab:
    raise base.TaskError('the StackOverflow word vocabulary is empty')
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
  train = capped(train, max_examples_per_client)
  test = capped(test, max_examples_per_client)
  if task_type == 'word':
    preprocess_train, preprocess_eval = make_word_preprocess_fns(
        word_vocab,
        batch_size=batch_size,
        sequence_length=sequence_length,
        num_out_of_vocab_buckets=num_out_of_vocab_buckets,
        eval_batch_size=eval_batch_size,
    )
    model_fn = create_word_model_fn(
        len(word_vocab),
        sequence_length=sequence_length,
        num_out_of_vocab_buckets=num_out_of_vocab_buckets,
        embedding_size=embedding_size,
        lstm_size=lstm_size,
        seed=seed,
    )
    model_text = (
        f'next-word LSTM({lstm_size}), {len(word_vocab)} words, sequences of '
        f'{sequence_length}'
    )
  else:
    tag_vocab = list(tag_counts)[:tag_vocab_size]
    if len(tag_vocab) < _MIN_TAGS:
      raise base.TaskError(
          f'the StackOverflow tag vocabulary has {len(tag_vocab)} tags; '
          f'recall_at_5 needs at least {_MIN_TAGS}'
      )
    preprocess_train, preprocess_eval = make_tag_preprocess_fns(
        word_vocab,
        tag_vocab,
        batch_size=batch_size,
        eval_batch_size=eval_batch_size,
    )
    model_fn = create_tag_model_fn(len(word_vocab), len(tag_vocab), seed=seed)
    model_text = (
        f'tag logistic regression, {len(word_vocab)} words -> '
        f'{len(tag_vocab)} tags'
    )
  protocol = (
      f'{len(test.client_ids)} unseen test users'
      if test_clients_fraction > 0
      else 'per-user test split'
  )
  if max_examples_per_client is not None:
    protocol += f", each user's first {max_examples_per_client} examples"
  return base.FederatedTask(
      name=f'stackoverflow_{task_type}',
      train_data=train,
      test_data=test,
      validation_data=validation,
      model_fn=model_fn,
      preprocess_train=preprocess_train,
      preprocess_eval=preprocess_eval,
      description=(
          f'{source}, {len(train.client_ids)} training users, {protocol}; '
          f'{model_text}'
      ),
  )


@dataclasses.dataclass(frozen=True)
class StackOverflowOptions(task_options.DataFiles, task_options.ClientChoice):
  """Options of `stackoverflow_word` and `stackoverflow_tag`."""

  max_examples_per_client: Optional[int] = task_options.option(
      None,
      "Keep each client's first N examples (StackOverflow: sentences, TFF's "
      'baselines cap users at 1000; shakespeare_leaf: windows).',
      low=1,
  )
  lstm_size: Optional[int] = task_options.option(
      None,
      "Units of the next-word LSTM (default: TFF's baseline's 670).",
      low=1,
      flag='stackoverflow_lstm_size',
  )

  def task_kwargs(self) -> dict[str, Any]:
    # The options not given leave the builder's arguments as they were
    # before they existed (its defaults).
    return {
        name: value
        for name, value in super().task_kwargs().items()
        if value is not None
        or name not in ('max_examples_per_client', 'lstm_size')
    }


WORD_TASK = task_options.Task(
    name='stackoverflow_word',
    data='`stackoverflow.sqlite` + word counts',
    model="TFF's next-word LSTM",
    options=StackOverflowOptions,
    create=functools.partial(create_task, task_type='word'),
)
TAG_TASK = task_options.Task(
    name='stackoverflow_tag',
    data='`stackoverflow.sqlite` + counts',
    model="TFF's tag logistic regression",
    options=StackOverflowOptions,
    create=functools.partial(create_task, task_type='tag'),
)
