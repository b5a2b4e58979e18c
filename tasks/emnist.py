# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Federated EMNIST character recognition (one client per writer).

Data: TFF's `tff.simulation.datasets.emnist.load_data` (LEAF's EMNIST grouped
by writer; Caldas et al., arXiv:1812.01097), read from the cached
`emnist_all.sqlite` (splits `all_train`/`all_test`, 3,400 writers, 62
classes; `digits_only_train`/`digits_only_test`, 3,383 writers, 10 classes).
Pixels are float32 in [0, 1] with 1.0 the background, as TFF stores them.
`use_synthetic_data=True` uses `emnist.get_synthetic()` (2 clients x 10
digits), offline.

Models (`model=`):

* `'linear'`: the Delta-FL softmax regression (Pillutla et al., "Federated
  Learning with Superquantile Aggregation for Heterogeneous Data", spec
  `fedplus_deltafl.md` B.11): scores <w_c, x> on the 784 flattened pixels,
  no bias, zero initialisation. Its l2 penalty is left to the algorithm.
* `'convnet'`: the Delta-FL ConvNet, as in the authors' code
  (krishnap25/simplicial-fl): Conv2D(32, 5x5, valid) -> ReLU -> MaxPool
  2x2/2 -> Conv2D(64, 5x5, valid) -> ReLU -> MaxPool 2x2/2 -> flatten (1024)
  -> Dense(classes). Keras' default initialisers (Glorot-uniform kernels,
  zero biases), seeded.
* `'cnn_dropout'`, `'cnn'`, `'2nn'`: TFF's baseline models
  (`tensorflow_federated/python/simulation/baselines/emnist/emnist_models.py`;
  `'cnn'` is the CNN of McMahan et al., AISTATS 2017), seeded through their
  `debug_seed`. They end in a softmax, so their loss takes probabilities.

Every model takes `(x [B, 28, 28, 1] float32, y [B] int32)` and reports
`accuracy` (sparse categorical accuracy) and the cross-entropy loss.
"""

import dataclasses
import os
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.simulation.baselines.emnist import emnist_models

from tasks import base
from tasks import data_files
from tasks import options as task_options

MODELS = ('linear', 'convnet', 'cnn_dropout', 'cnn', '2nn')
SHUFFLE_BUFFER_SIZE = 10_000  # Larger than any writer (418 examples at most).
_TFF_MODELS = {
    'cnn_dropout': emnist_models.create_conv_dropout_model,
    'cnn': emnist_models.create_original_fedavg_cnn_model,
    '2nn': emnist_models.create_two_hidden_layer_model,
}


def num_classes(only_digits: bool) -> int:
  """10 digit classes, or 62 (digits, upper and lower case letters)."""
  return 10 if only_digits else 62


def _check_model(model: str) -> None:
  if model not in MODELS:
    raise base.TaskError(
        f'unknown EMNIST model {model!r}; choose one of {", ".join(MODELS)}'
    )


def create_keras_model(
    model: str, *, only_digits: bool = False, seed: int = 0
) -> tf.keras.Model:
  """The uncompiled Keras model `model` (see the module docstring).

  Args:
    model: One of `MODELS`.
    only_digits: 10 output classes instead of 62.
    seed: Seed of the weight initialisers (same seed, same weights).

  Returns:
    A `tf.keras.Model` taking `[B, 28, 28, 1]` float32 images.
  """
  _check_model(model)
  classes = num_classes(only_digits)
  if model in _TFF_MODELS:
    return _TFF_MODELS[model](only_digits=only_digits, debug_seed=seed)
  if model == 'linear':
    return tf.keras.Sequential(
        [
            tf.keras.layers.Flatten(input_shape=(28, 28, 1)),
            tf.keras.layers.Dense(
                classes, use_bias=False, kernel_initializer='zeros'
            ),
        ]
    )
  glorot = lambda k: tf.keras.initializers.GlorotUniform(seed=seed * 16 + k)
  return tf.keras.Sequential(
      [
          tf.keras.layers.Conv2D(
              32,
              (5, 5),
              padding='valid',
              activation='relu',
              input_shape=(28, 28, 1),
              kernel_initializer=glorot(1),
          ),
          tf.keras.layers.MaxPool2D(pool_size=(2, 2), strides=(2, 2)),
          tf.keras.layers.Conv2D(
              64,
              (5, 5),
              padding='valid',
              activation='relu',
              kernel_initializer=glorot(2),
          ),
          tf.keras.layers.MaxPool2D(pool_size=(2, 2), strides=(2, 2)),
          tf.keras.layers.Flatten(),
          tf.keras.layers.Dense(classes, kernel_initializer=glorot(3)),
      ]
  )


def create_model_fn(
    model: str = 'convnet', *, only_digits: bool = False, seed: int = 0
) -> base.ModelFn:
  """A no-arg `model_fn` building `model` as a TFF `VariableModel`."""
  _check_model(model)
  input_spec = (
      tf.TensorSpec([None, 28, 28, 1], tf.float32),
      tf.TensorSpec([None], tf.int32),
  )
  from_logits = model not in _TFF_MODELS  # TFF's models end in a softmax.

  def model_fn():
    return tff.learning.models.from_keras_model(
        create_keras_model(model, only_digits=only_digits, seed=seed),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=from_logits
        ),
        input_spec=input_spec,
        metrics=[tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')],
    )

  return model_fn


def make_preprocess_fns(batch_size: int, eval_batch_size: int = 256):
  """`(preprocess_train, preprocess_eval)` for raw EMNIST client datasets.

  Maps `{'label', 'pixels'}` to `(pixels[..., None], label)`. Training
  shuffles with `shuffle_seed` (reshuffled every epoch, reproducible) and
  batches within each epoch, so batches never straddle epochs.
  """
  if batch_size < 1 or eval_batch_size < 1:
    raise base.TaskError(
        f'batch sizes must be >= 1, got {batch_size} and {eval_batch_size}'
    )

  def to_xy(example):
    return tf.expand_dims(example['pixels'], axis=-1), example['label']

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


def create_task(
    *,
    data_dir: Optional[str],
    use_synthetic_data: bool = False,
    batch_size: int,
    seed: int = 0,
    min_examples: int = 0,
    test_clients_fraction: float = 0.0,
    max_clients: Optional[int] = None,
    only_digits: bool = False,
    model: str = 'convnet',
    eval_batch_size: int = 256,
) -> base.FederatedTask:
  """Federated EMNIST with a Delta-FL or TFF baseline model.

  Args:
    data_dir: Directory holding TFF's decompressed `emnist_all.sqlite`
      (`None`: TFF's cache `~/.tff`). Never downloads.
    use_synthetic_data: Use TFF's offline synthetic EMNIST instead.
    batch_size: Local training mini-batch size (Delta-FL: 10 linear, 16
      ConvNet).
    seed: Seed of the model initialisers, the client subset and the split.
    min_examples: Keep writers with at least this many examples (Delta-FL:
      100).
    test_clients_fraction: 0: test on the training writers' own test split;
      in (0, 1): this fraction of the writers become unseen test clients,
      evaluated on all their data (Delta-FL: 0.5).
    max_clients: Keep a seeded random subset of at most this many writers.
    only_digits: The 10-class digits-only split instead of the 62-class one.
    model: One of `MODELS`.
    eval_batch_size: Batch size of evaluation streams.

  Returns:
    A `FederatedTask` named `emnist_character`.

  Raises:
    TaskError: On invalid arguments or a missing data file.
  """
  _check_model(model)
  data_files.validate_selection_args(
      min_examples=min_examples,
      test_clients_fraction=test_clients_fraction,
      max_clients=max_clients,
      batch_size=batch_size,
  )
  preprocess_train, preprocess_eval = make_preprocess_fns(
      batch_size, eval_batch_size
  )
  if use_synthetic_data:
    train = test = tff.simulation.datasets.emnist.get_synthetic()
    train_counts = test_counts = None
    source = 'synthetic EMNIST'
  else:
    path = data_files.find(data_files.EMNIST, data_dir)
    prefix = 'digits_only' if only_digits else 'all'
    train_counts = data_files.sql_example_counts(path, [f'{prefix}_train'])
    test_counts = data_files.sql_example_counts(path, [f'{prefix}_test'])
    train, test = tff.simulation.datasets.emnist.load_data(
        only_digits=only_digits, cache_dir=os.path.dirname(path)
    )
    source = f'EMNIST-{num_classes(only_digits)} ({path})'
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
      f'{len(test.client_ids)} unseen test writers'
      if test_clients_fraction > 0
      else 'per-writer test split'
  )
  return base.FederatedTask(
      name='emnist_character',
      train_data=train,
      test_data=test,
      model_fn=create_model_fn(model, only_digits=only_digits, seed=seed),
      preprocess_train=preprocess_train,
      preprocess_eval=preprocess_eval,
      description=(
          f'{source}, {len(train.client_ids)} training writers, {protocol}; '
          f'model {model}, {num_classes(only_digits)} classes'
      ),
  )


@dataclasses.dataclass(frozen=True)
class EmnistOptions(task_options.DataFiles, task_options.ClientChoice):
  """Options of `emnist_character`."""

  only_digits: bool = task_options.option(False, '10 digit classes only.')
  model: str = task_options.option(
      'cnn_dropout',
      'Model: linear, convnet, cnn_dropout, cnn or 2nn.',
      choices=MODELS,
      flag='emnist_model',
  )


def _label_classes(options: EmnistOptions) -> int:
  return 10 if options.only_digits else 62


TASK = task_options.Task(
    name='emnist_character',
    data='`emnist_all.sqlite` in data_dir',
    model='linear / convnet / cnn_dropout / cnn / 2nn',
    options=EmnistOptions,
    create=create_task,
    label_classes=_label_classes,
)
