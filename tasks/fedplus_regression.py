# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The synthetic-regression data of Fed+ section 5.1, with one outlier party.

P. Kundu, H. Yu, L. Wynter, S. Lim, "Robustness and Personalization in
Federated Learning: A Unified Approach via Regularization", arXiv:2009.06303,
section 5.1 (spec `fedplus_deltafl.md` A.8.1). Party k's samples follow
y = w_k^T x + v with

  x ~ N(mu_k, Sigma), Sigma_jj = (mod(j - 1, 50) + 1)^-1.1, j = 1..1000
  mu_k[j] ~ N(0, 0.5);  v ~ N(0, 2)
  w_k = w_bar + Laplace(scale 0.5) for k < N, w_bar ~ N(0, 5 I)
  w_N = w_bar' + Laplace(scale 0.5), w_bar' ~ N(0, 50 I)  (the outlier)

100 samples per party split 50/50 into train and test; linear regression
(no bias) with the mean squared error as loss and metric.

Decisions (the paper is silent, spec A.11 item 9): the second argument of
N(., .) is a variance; mu_k has i.i.d. entries; the Laplace noise is fresh
per party; Sigma_jj uses mod(j - 1, 50) + 1 (the printed mod(j, 50) is 0 for
j = 50, 100, ...); the error is the per-sample MSE.
"""

import collections
import dataclasses
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import base
from tasks import options as task_options

DIM = 1000


def generate(
    *, num_parties: int = 10, samples: int = 100, dim: int = DIM, seed: int = 0
):
  """`[(x, y), ...]` per party (float32), the last party the outlier."""
  rng = np.random.default_rng([seed, 5001])
  j = np.arange(1, dim + 1)
  sigma_diag = ((j - 1) % 50 + 1.0) ** -1.1
  w_bar = rng.normal(0.0, np.sqrt(5.0), dim)
  w_bar_outlier = rng.normal(0.0, np.sqrt(50.0), dim)
  parties = []
  for k in range(num_parties):
    center = w_bar_outlier if k == num_parties - 1 else w_bar
    w_k = center + rng.laplace(0.0, 0.5, dim)
    mu_k = rng.normal(0.0, np.sqrt(0.5), dim)
    x = mu_k + rng.normal(size=(samples, dim)) * np.sqrt(sigma_diag)
    y = x @ w_k + rng.normal(0.0, np.sqrt(2.0), samples)
    parties.append((x.astype(np.float32), y.astype(np.float32)))
  return parties


def create_linear_regression_model_fn(dim: int = DIM) -> base.ModelFn:
  """y = w^T x, zero-initialised, MSE loss and `mse` metric."""
  spec = (
      tf.TensorSpec([None, dim], tf.float32),
      tf.TensorSpec([None, 1], tf.float32),
  )

  def model_fn():
    keras_model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(dim,)),
            tf.keras.layers.Dense(
                1, use_bias=False, kernel_initializer='zeros'
            ),
        ]
    )
    return tff.learning.models.from_keras_model(
        keras_model,
        loss=tf.keras.losses.MeanSquaredError(),
        input_spec=spec,
        metrics=[tf.keras.metrics.MeanSquaredError(name='mse')],
    )

  return model_fn


def create_task(
    *,
    num_parties: int = 10,
    samples: int = 100,
    batch_size: int = 10,
    seed: int = 0,
    dim: int = DIM,
) -> base.FederatedTask:
  """The Fed+ synthetic-regression task (50/50 train/test per party)."""
  if num_parties < 2:
    raise base.TaskError(f'num_parties must be >= 2, got {num_parties}')
  if samples < 2:
    raise base.TaskError(f'samples must be >= 2, got {samples}')
  if batch_size < 1:
    raise base.TaskError(f'batch size must be >= 1, got {batch_size}')
  width = len(str(num_parties - 1))
  train, test = {}, {}
  half = samples // 2
  for k, (x, y) in enumerate(
      generate(num_parties=num_parties, samples=samples, dim=dim, seed=seed)
  ):
    cid = f'{k:0{width}d}'
    train[cid] = collections.OrderedDict(x=x[:half], y=y[:half, None])
    test[cid] = collections.OrderedDict(x=x[half:], y=y[half:, None])

  def to_tuple(example):
    return example['x'], example['y']

  def preprocess_train(
      dataset: tf.data.Dataset, epochs: int, shuffle_seed: Optional[int] = None
  ) -> tf.data.Dataset:
    dataset = dataset.map(to_tuple)
    if shuffle_seed is not None:
      dataset = dataset.shuffle(
          1000, seed=shuffle_seed, reshuffle_each_iteration=True
      )
    return dataset.batch(batch_size).repeat(epochs)

  def preprocess_eval(dataset: tf.data.Dataset) -> tf.data.Dataset:
    return dataset.map(to_tuple).batch(256)

  return base.FederatedTask(
      name='fedplus_regression',
      train_data=tff.simulation.datasets.TestClientData(train),
      test_data=tff.simulation.datasets.TestClientData(test),
      model_fn=create_linear_regression_model_fn(dim),
      preprocess_train=preprocess_train,
      preprocess_eval=preprocess_eval,
      description=(
          f'Fed+ synthetic regression, {num_parties} parties (the '
          f'last an outlier), {samples} samples each (50/50), '
          f'd={dim}; linear regression'
      ),
  )


@dataclasses.dataclass(frozen=True)
class FedPlusRegressionOptions(task_options.TaskOptions):
  """Options of `fedplus_regression`."""

  num_parties: int = task_options.option(
      10, 'Number of parties (Fed+: 10).', low=2, flag='num_clients'
  )

  def task_kwargs(self) -> dict[str, Any]:
    return {} if self.num_parties == 10 else {'num_parties': self.num_parties}


TASK = task_options.Task(
    name='fedplus_regression',
    data='Fed+ section 5.1 synthetic regression, built in',
    model='linear regression (MSE)',
    options=FedPlusRegressionOptions,
    create=create_task,
)
