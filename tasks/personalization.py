# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Fine-tuning evaluation: every client personalizes a model on its own data.

The two baselines of a personalization benchmark (TFF's personalization
benchmark, Motley: Wu et al., 2022; Ditto: Li et al., ICML 2021, section 5)
are the same client step from two starting points:

* **local training**: each client trains the common initial model on its own
  training data only, for E epochs at learning rate eta;
* **FedAvg + fine-tuning**: each client does the same from FedAvg's final
  global model.

Each client is then evaluated on its own evaluation data (its held-out or
validation split; an unseen client: the part it did not fine-tune on).

`fine_tune_directly` runs that step for each client in this process (one
model, one traced function): what the benchmark uses.
`build_fine_tuning_evaluation` is the same client step as TFF's own federated
computation, `tff.learning.algorithms.build_personalization_eval_computation`:
one personalization strategy per learning rate, each of which trains with
plain SGD on shuffled mini-batches and evaluates after every epoch, so one
call gives the whole (learning rate, epochs) grid; epoch 0 is the starting
model itself (TFF's baseline metrics). The metrics are the model's own
(`tasks.evaluation.evaluate_local`'s: the same per-client accuracy and loss
as the per-client evaluation of the training binary) plus `num_examples`.
The two forms give the same numbers in stored order (`shuffle_seed=None`;
`tests/test_personalization.py`; with a seed they shuffle differently); the
federated one costs TFF's per-client dataset serialization (minutes for 50
synthetic clients here, against seconds directly).
"""

import collections
from collections.abc import Callable, Sequence
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tasks import evaluation

ModelFn = Callable[[], tff.learning.models.VariableModel]
SHUFFLE_BUFFER = 10_000


def strategy_name(learning_rate: float) -> str:
  """The strategy key of a learning rate in the computation's result."""
  return f'lr_{learning_rate:g}'


def _unfinalized(model, dataset):
  """`(unfinalized metrics, num_examples)` of the model on `dataset`, fresh."""
  model.reset_metrics()
  num_examples = evaluation.forward_all(model, dataset)
  return model.report_local_unfinalized_metrics(), num_examples


def _finalized(model, unfinalized, num_examples) -> collections.OrderedDict:
  """The model's finalized metrics plus `num_examples`."""
  result = collections.OrderedDict()
  for name, finalizer in model.metric_finalizers().items():
    if name in ('num_examples', 'num_batches'):
      continue
    result[name] = tf.cast(finalizer(unfinalized[name]), tf.float32)
  result['num_examples'] = num_examples
  return result


def _evaluate(model, dataset) -> collections.OrderedDict:
  """The model's finalized metrics on `dataset` (batched), fresh."""
  return _finalized(model, *_unfinalized(model, dataset))


def _fine_tune_fn(
    learning_rate: float,
    max_epochs: int,
    batch_size: int,
    shuffle_seed: Optional[int],
    evaluate=_evaluate,
):
  """A personalization strategy: SGD epochs, `evaluate`d after each."""

  @tf.function
  def fine_tune(model, train_data, test_data):
    if shuffle_seed is not None:
      train_data = train_data.shuffle(
          SHUFFLE_BUFFER, seed=shuffle_seed, reshuffle_each_iteration=True
      )
    train = train_data.batch(batch_size)
    test = test_data.batch(batch_size)
    weights = model.trainable_variables
    metrics = collections.OrderedDict()
    for epoch in range(1, max_epochs + 1):
      for batch in train:
        with tf.GradientTape() as tape:
          loss = model.forward_pass(batch, training=True).loss
        grads = tape.gradient(loss, weights)
        for variable, grad in zip(weights, grads):
          variable.assign_sub(learning_rate * grad)
      metrics[f'epoch_{epoch}'] = evaluate(model, test)
    return metrics

  return lambda: fine_tune


def _check_arguments(learning_rates, max_epochs, batch_size) -> list[float]:
  """The learning rates as floats; ValueError for a bad argument."""
  if any(isinstance(r, (bool, str)) for r in learning_rates):
    raise ValueError(f'learning_rates must be numbers, got {learning_rates!r}')
  rates = [float(r) for r in learning_rates]
  if not rates or any(not np.isfinite(r) or r <= 0 for r in rates):
    raise ValueError(f'learning_rates must be > 0, got {learning_rates!r}')
  if len(set(map(strategy_name, rates))) != len(rates):
    raise ValueError(f'learning_rates repeat a value: {learning_rates!r}')
  for name, value in (('max_epochs', max_epochs), ('batch_size', batch_size)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f'{name} must be an int >= 1, got {value!r}')
  return rates


def build_fine_tuning_evaluation(
    model_fn: ModelFn,
    *,
    learning_rates: Sequence[float],
    max_epochs: int,
    batch_size: int,
    max_num_clients: int,
    shuffle_seed: Optional[int] = 0,
) -> tff.Computation:
  """Each client's metrics after 0..max_epochs epochs of fine-tuning.

  Args:
    model_fn: No-arg callable returning a new `VariableModel`.
    learning_rates: The SGD learning rates, one strategy each (> 0).
    max_epochs: Epochs of fine-tuning (>= 1); metrics after each.
    batch_size: Mini-batch size of fine-tuning and evaluation.
    max_num_clients: The most clients one call evaluates (all of them are
      returned, in an order of TFF's choosing, each client's metrics
      together).
    shuffle_seed: Seed of the fine-tuning data's shuffle (None: no shuffle).

  Returns:
    TFF's personalization evaluation computation,
    `(weights@SERVER, {train_data, test_data}@CLIENTS) -> metrics@SERVER`,
    with unbatched datasets of the model's input elements.

  Raises:
    ValueError: For a bad argument.
  """
  rates = _check_arguments(learning_rates, max_epochs, batch_size)
  if (
      isinstance(max_num_clients, bool)
      or not isinstance(max_num_clients, int)
      or max_num_clients < 1
  ):
    raise ValueError(
        f'max_num_clients must be an int >= 1, got {max_num_clients!r}'
    )
  strategies = collections.OrderedDict(
      (strategy_name(r), _fine_tune_fn(r, max_epochs, batch_size, shuffle_seed))
      for r in rates
  )

  @tf.function
  def baseline(model, data):
    return _evaluate(model, data.batch(batch_size))

  return tff.learning.algorithms.build_personalization_eval_computation(
      model_fn, strategies, baseline, max_num_clients=max_num_clients
  )


def fine_tune_clients(
    computation: tff.Computation,
    weights: tff.learning.models.ModelWeights,
    pairs: Sequence[tuple[tf.data.Dataset, tf.data.Dataset]],
    learning_rates: Sequence[float],
) -> dict[float, list[dict[str, np.ndarray]]]:
  """Runs the fine-tuning evaluation on `(train, eval)` dataset pairs.

  Args:
    computation: From `build_fine_tuning_evaluation`, built with
      `max_num_clients >= len(pairs)`.
    weights: The starting model.
    pairs: Per client, its unbatched fine-tuning and evaluation datasets.
    learning_rates: The computation's learning rates.

  Returns:
    Learning rate -> one entry per epoch (0 = the starting model), each a
    dict of metric name -> values, one per client (the clients in one
    order across all entries).
  """
  if not pairs:
    return {float(r): [] for r in learning_rates}
  inputs = [
      collections.OrderedDict(train_data=train, test_data=test)
      for train, test in pairs
  ]
  result = computation(weights, inputs)

  def arrays(metrics) -> dict[str, np.ndarray]:
    return {name: np.asarray(values) for name, values in metrics.items()}

  out = {}
  for rate in learning_rates:
    per_epoch = result[strategy_name(float(rate))]
    epochs = sorted(per_epoch, key=lambda k: int(k.split('_')[1]))
    out[float(rate)] = [arrays(result['baseline_metrics'])] + [
        arrays(per_epoch[e]) for e in epochs
    ]
  return out


def _as_tensors(dataset: tf.data.Dataset):
  """An unbatched dataset as one structure of tensors (all its elements)."""
  for batch in dataset.batch(2**31 - 1):
    return batch
  raise ValueError('a client has no examples to fine-tune on or evaluate')


def fine_tune_directly(
    model_fn: ModelFn,
    weights: tff.learning.models.ModelWeights,
    pairs: Sequence[tuple[tf.data.Dataset, tf.data.Dataset]],
    *,
    learning_rates: Sequence[float],
    max_epochs: int,
    batch_size: int,
    shuffle_seed: Optional[int] = 0,
) -> dict[float, list[dict[str, np.ndarray]]]:
  """The same client step as `build_fine_tuning_evaluation`, run here.

  Each client's data are read into tensors once and its mini-batches are
  slices of them (a traced loop over slices: about 30x faster per step
  than iterating a dataset in the traced function here). With
  `shuffle_seed=None` the batches are in stored order, as the federated
  form's, and the two give the same numbers; otherwise each epoch takes a
  NumPy permutation seeded by `(shuffle_seed, client index, epoch)` (the
  federated form shuffles with `tf.data`: other orders).

  Args:
    model_fn: No-arg callable returning a new `VariableModel`.
    weights: The starting model (`ModelWeights` of arrays).
    pairs: Per client, its unbatched fine-tuning and evaluation datasets.
    learning_rates: The SGD learning rates (> 0).
    max_epochs: Epochs of fine-tuning (>= 1); metrics after each.
    batch_size: Mini-batch size of fine-tuning and evaluation.
    shuffle_seed: Seed of the fine-tuning data's order (None: stored order).

  Returns:
    As `fine_tune_clients`, the clients in the order of `pairs`.
  """
  learning_rates = _check_arguments(learning_rates, max_epochs, batch_size)
  model = model_fn()
  variables = tff.learning.models.ModelWeights.from_model(model)
  trainable = model.trainable_variables
  start = tf.nest.map_structure(np.asarray, weights)
  names = [
      n
      for n in model.metric_finalizers()
      if n not in ('num_examples', 'num_batches')
  ]
  clients = [(_as_tensors(a), _as_tensors(b)) for a, b in pairs]
  if not clients:
    return {float(r): [] for r in learning_rates}
  spec = tf.nest.map_structure(
      lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), clients[0][0]
  )

  def size(data):
    return tf.shape(tf.nest.flatten(data)[0])[0]

  def evaluate(data):
    model.reset_metrics()
    n = size(data)
    for i in tf.range((n + batch_size - 1) // batch_size):
      batch = tf.nest.map_structure(
          lambda t, i=i: t[i * batch_size : (i + 1) * batch_size], data
      )
      model.forward_pass(batch, training=False)
    unfinalized = model.report_local_unfinalized_metrics()
    return [tf.stack(unfinalized[k]) for k in names], tf.cast(n, tf.int64)

  @tf.function(
      input_signature=[
          tf.TensorSpec([], tf.float32),
          spec,
          spec,
          tf.TensorSpec([max_epochs, None], tf.int32),
      ]
  )
  def step(rate, train, test, orders):
    results = [evaluate(test)]
    n = size(train)
    for epoch in range(max_epochs):
      shuffled = tf.nest.map_structure(
          lambda t, e=epoch: tf.gather(t, orders[e]), train
      )
      for i in tf.range((n + batch_size - 1) // batch_size):
        batch = tf.nest.map_structure(
            lambda t, i=i: t[i * batch_size : (i + 1) * batch_size], shuffled
        )
        with tf.GradientTape() as tape:
          loss = model.forward_pass(batch, training=True).loss
        grads = tape.gradient(loss, trainable)
        for variable, grad in zip(trainable, grads):
          variable.assign_sub(rate * grad)
      results.append(evaluate(test))
    return results

  def finalized(state, count):
    # TFF's Keras finalizers build a metric inside a tf.function, which only
    # works in graph mode; our models' metrics are Keras means, whose
    # unfinalized state is [total, count], or sums ([total]: TFF's
    # NumTokensCounter of the StackOverflow and Shakespeare baselines).
    out = {}
    for name, value in zip(names, state):
      value = np.asarray(value)
      if value.shape == (1,):
        out[name] = np.float32(value[0])
        continue
      if value.shape != (2,):
        raise ValueError(
            f'metric {name!r} is neither a mean ([total, count]) nor a sum '
            '([total]): fine-tuning evaluates Keras means and sums only'
        )
      out[name] = np.float32(value[0] / value[1] if value[1] else 0.0)
    out['num_examples'] = np.int64(count)
    return out

  out = {}
  for rate in learning_rates:
    rows = []
    for k, (train, test) in enumerate(clients):
      tf.nest.map_structure(lambda v, t: v.assign(t), variables, start)
      n = int(size(train))
      if shuffle_seed is None:
        orders = np.tile(np.arange(n, dtype=np.int32), (max_epochs, 1))
      else:
        orders = np.stack(
            [
                np.random.default_rng([shuffle_seed, k, e]).permutation(n)
                for e in range(max_epochs)
            ]
        ).astype(np.int32)
      metrics = step(tf.constant(float(rate)), train, test, orders)
      rows.append([finalized(m, c) for m, c in metrics])
    out[float(rate)] = [
        {
            name: np.asarray([row[e][name] for row in rows])
            for name in rows[0][e]
        }
        for e in range(max_epochs + 1)
    ]
  return out
