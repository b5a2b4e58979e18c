"""Shared tiny federated data for the robust-aggregator and attack tests."""

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import synthetic
from tff_algos import composition

LR = 0.1
BATCH = 5


def make_clients(seed=11, sizes=(13, 17, 9, 23, 11), outlier=True):
  """Small softmax-regression clients; the last one an outlier (large x)."""
  rng = np.random.default_rng(seed)
  out = []
  for i, n in enumerate(sizes):
    x = rng.normal(size=(n, synthetic.NUM_FEATURES)).astype(np.float32)
    if outlier and i == len(sizes) - 1:
      x *= 8.0
    y = rng.integers(0, synthetic.NUM_CLASSES, n).astype(np.int32)
    out.append((x, y))
  return out


def datasets(clients, epochs=1):
  return [
      tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat(epochs)
      for x, y in clients
  ]


def sgd(lr=LR):
  return tff.learning.optimizers.build_sgdm(learning_rate=lr)


def zeros():
  return (
      np.zeros((synthetic.NUM_FEATURES, synthetic.NUM_CLASSES)),
      np.zeros(synthetic.NUM_CLASSES),
  )


def run(process, rounds, epochs=1):
  """Final weights and the last round's aggregator measurements."""
  state = process.initialize()
  metrics = None
  for clients in rounds:
    out = process.next(state, datasets(clients, epochs))
    state, metrics = out.state, out.metrics
  return composition.model_weights_as_numpy(process, state), metrics
