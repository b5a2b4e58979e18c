# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""A stacked simulation engine: a round's clients trained together.

`tff_algos.batched.BatchedEngine` runs a round in one TensorFlow call but
its clients one after another, each with an in-graph tf.data pipeline and
the Keras `VariableModel` (metrics, variable assignments) at every step.
`StackedEngine` removes those costs:

* **Data.** Each client's examples are preprocessed once (the task's own
  `preprocess_train`, one epoch, no shuffle) and cached as arrays
  (`ClientExamples`). A round gathers its batches from them by index. The
  indices reproduce the federated path's batches exactly: the shuffle order
  of a seeded `tf.data` shuffle depends only on its seed, buffer and number
  of elements, so the engine shuffles `Dataset.range(n)` with the client's
  seed (all of a round's clients in one small `flat_map`), with the same
  epochs, straggler truncation and, for q-FFL (whose training pass re-reads
  the dataset its loss pass read), the second pass's orders. The layout
  (epochs of `ceil(n / b)` batches, the last one partial) is checked once
  against the task's own `preprocess_train`: a task whose preprocessing is
  not "per-example map, shuffle, batch, repeat" is refused.
* **Model.** The model runs in functional form
  (`tff.learning.models.functional_model_from_keras` on the task's Keras
  model): weights are tensors, not variables, and no Keras metric is
  updated per step. The training metrics the federated path reports
  (loss, accuracy, num_examples, num_batches) are computed from the same
  masked sums and finalized with the model's own finalizers.
* **Clients together.** With `vectorize=True` (the default for models
  without convolutions) every client's weights are stacked on a leading
  client axis and one `tf.while_loop` runs all clients' step `t` at once
  (`tf.vectorized_map` of the functional forward pass over the clients, or
  for the recurrent presets the batched matmuls of `tff_algos.stacked_rnn`;
  one gradient of the sum of the clients' losses gives each client its own
  gradient). Batches are padded to the batch size and the clients of a
  group to the group's longest step count, and masked: a padded example has
  weight 0 in its client's loss and metrics, and a step with no real example
  leaves that client's weights and optimizer state exactly unchanged
  (`tf.where` on the step's result). Real clients differ in size by 1,000x,
  so with `group_by_size=True` (the training binary's size-groups option) a
  round's clients run in size-ordered groups (`size_groups`) when that cuts
  the padded slots by a fifth or more: one vectorized loop per group, the
  grouping that minimises the modelled work of the padded steps. Each
  client's result is the same either way to float rounding (the batched
  matmuls change shape); as long runs can amplify rounding, it is off by
  default. With
  `vectorize=False` (the default for models with convolutions) the clients
  run one after another through the same functional step (no padding beyond
  the last partial batch), which is faster for convolutions with per-client
  filters, where `vectorized_map` falls back to a loop.

Every algorithm runs from its one definition (`tff_algos.definition`, the
same object the batched engine runs: loss pass, round context, client filter,
client contribution, server rule); the engine names no algorithm. The
elementwise parts of a definition are called on `[K]` vectors, a per-client
message (q-FFL's) is mapped over the clients. The engine's own client work
is local training, or the loss and full gradient at the broadcast model for
a definition whose `local_work` is `client_work.full_gradient_work`. Any
other client work runs here only through its own kernel
(`tff_algos.stacked_work.StackedLocalWork`: Ditto's personal passes, Fed+'s
mixed steps), composed from the engine's pieces (`_StackedOps`, the kernel's
`Kit`: mini-batch descent with a proximal pull and mixing, passes over the
round's clients, further reads of each client's stream in new shuffle
orders, client-state models [K, ...] fed from and returned to the
client-state store as the batched engine's); the work says which of its
settings it cannot run (`check_definition`). The server step (and its
rejection of a non-finite update) is the batched engine's. The client
optimizer is applied to the stacked weights; it must be elementwise with
per-weight state (SGD with or without momentum, Adagrad): an optimizer with
a step counter (Adam, Yogi) is refused, as is such a kernel's optimizer.

`next` takes and returns the process's own `LearningAlgorithmState`, so
checkpoints, evaluation and resumption are shared with the federated path,
which stays what a production TFF pipeline runs; this engine is for
simulation. Tested equal to the federated path in tests/test_stacked.py.
"""

import collections
from collections.abc import Callable
import functools
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import batched
from tff_algos import client_work as client_work_lib
from tff_algos import stacked_rnn
from tff_algos import stacked_work

SUPPORTED_METRICS = ('accuracy', 'loss', 'num_examples', 'num_batches')
_CHECK_SEED = 20261122


StackedEngineError = stacked_work.StackedEngineError


def _as_xy(element):
  """`(x, y)` of a preprocessed element (a pair or an `x`/`y` mapping)."""
  if isinstance(element, collections.abc.Mapping):
    if set(element) != {'x', 'y'}:
      raise StackedEngineError(
          'the stacked engine needs (x, y) examples, got keys '
          f'{sorted(element)}'
      )
    return element['x'], element['y']
  if not isinstance(element, (tuple, list)) or len(element) != 2:
    raise StackedEngineError('the stacked engine needs (x, y) examples')
  return element[0], element[1]


class ClientExamples:
  """Each client's preprocessed training examples as arrays, read once.

  `get(client_id)` applies the task's `preprocess_train` (one epoch, no
  shuffle) to the client's raw dataset the first time, unbatches it and
  caches `(x, y)` arrays; clients that are never selected are never read.
  """

  def __init__(
      self,
      client_data: tff.simulation.datasets.ClientData,
      preprocess_train: Callable[..., tf.data.Dataset],
  ):
    self.client_data = client_data
    self.preprocess_train = preprocess_train
    self._cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    spec = _as_xy(
        preprocess_train(
            client_data.create_tf_dataset_for_client(client_data.client_ids[0]),
            1,
            None,
        ).element_spec
    )
    for s in spec:
      if not isinstance(s, tf.TensorSpec):
        raise StackedEngineError('the stacked engine needs dense tensor x, y')
    self.x_spec = tf.TensorSpec(spec[0].shape[1:], spec[0].dtype)
    self.y_spec = tf.TensorSpec(spec[1].shape[1:], spec[1].dtype)
    if self.y_spec.shape.rank != 0:
      raise StackedEngineError(
          'the stacked engine needs one label per example (y of shape [B]), '
          f'got y of shape {spec[1].shape}'
      )

  def get(self, client_id: str) -> tuple[np.ndarray, np.ndarray]:
    """The client's padded (inputs, labels) arrays, built once and cached."""
    if client_id not in self._cache:
      ds = self.preprocess_train(
          self.client_data.create_tf_dataset_for_client(client_id), 1, None
      )
      arrays = None
      # One read of the whole client (unbatched, then one batch).
      for element in ds.unbatch().batch(2**31 - 1).take(1):
        x, y = _as_xy(element)
        arrays = (x.numpy(), y.numpy())
      if arrays is None:  # An empty client.
        arrays = (
            np.zeros(
                [0] + self.x_spec.shape.as_list(),
                self.x_spec.dtype.as_numpy_dtype,
            ),
            np.zeros([0], self.y_spec.dtype.as_numpy_dtype),
        )
      self._cache[client_id] = arrays
    return self._cache[client_id]

  def preload(self, client_ids) -> None:
    """Reads these clients now (O(len(client_ids)), once), not on demand."""
    for cid in client_ids:
      self.get(cid)

  def __len__(self) -> int:
    return len(self._cache)


def stream_layout(
    sizes,
    epochs,
    takes,
    batch_size: int,
    *,
    shuffle: bool,
    passes: int = 1,
    train_pass: int = 0,
):
  """Where each padded batch slot of a round reads its example.

  The federated path's stream of client k is `ceil(n_k / b)` batches per
  epoch (the last one partial), `epochs_k` epochs, cut to `takes_k` batches
  (-1: no cut); a pass reads `L_k = (s_k // B_k) n_k + (s_k % B_k) b`
  examples in `s_k` steps. With a shuffle, the engine's order stream holds,
  client after client, `passes` passes of each client's shuffled positions;
  slot `(t, k, i)` reads position `e n_k + j b + i` of pass `train_pass`
  (epoch `e = t // B_k`, batch `j = t % B_k`). Without a shuffle it reads the
  client's example `j b + i` directly.

  Args:
    sizes: Examples of each client (n_k).
    epochs: Epochs of each client.
    takes: Batches each client may run (-1: all).
    batch_size: b.
    shuffle: Whether positions index the shuffled order stream.
    passes: Passes held in the order stream per client (2 for q-FFL, 1 + G
      for Ditto with G lambdas).
    train_pass: The pass these slots read (q-FFL trains on pass 1; Ditto's
      personal pass g reads pass 1 + g).

  Returns:
    `(positions [S, K, b] int64, -1 on padding; steps [K] int64)`.
  """
  n = np.asarray(sizes, np.int64)
  e = np.asarray(epochs, np.int64)
  takes = np.asarray(takes, np.int64)
  b = int(batch_size)
  per_epoch = (n + b - 1) // b
  total = e * per_epoch
  steps = np.where(takes < 0, total, np.minimum(takes, total))
  safe_b = np.maximum(per_epoch, 1)
  pass_len = (steps // safe_b) * n + (steps % safe_b) * b
  starts = np.concatenate([[0], np.cumsum(passes * pass_len)])[:-1]
  num_steps = int(steps.max()) if len(steps) else 0
  t = np.arange(num_steps, dtype=np.int64)[:, None, None]
  i = np.arange(b, dtype=np.int64)[None, None, :]
  j = t % safe_b[None, :, None]
  within = j * b + i
  valid = (t < steps[None, :, None]) & (within < n[None, :, None])
  if shuffle:
    pos = (
        starts[None, :, None]
        + train_pass * pass_len[None, :, None]
        + (t // safe_b[None, :, None]) * n[None, :, None]
        + within
    )
  else:
    pos = within
  return np.where(valid, pos, -1).astype(np.int64), steps


def order_stream(
    seeds, sizes, epochs, takes, batch_size, *, passes: int, buffer_size: int
):
  """The clients' shuffled positions, pass after pass, as one int64 vector.

  For each client, the positions `0..n-1` go through the same dataset
  structure as the task's stream (`shuffle(buffer, seed,
  reshuffle_each_iteration=True)`, `batch`, `repeat(epochs)`, `take`) and
  the dataset is read `passes` times. How many shuffle orders a pass draws
  depends on the structure (a `repeat(E)` over E >= 2 epochs draws E + 1;
  a `take(-1)` around a one-epoch stream changes the next pass), so a
  one-epoch stream has no `repeat` and only a cut stream has a `take`: the
  structure that gave the federated path's Python-built datasets' orders
  in every case checked (1 to 3 epochs, with and without cuts).
  """

  def client_orders(row):
    seed, n, reps, take = row[0], row[1], row[2], row[3]

    def base(on):
      return (
          tf.data.Dataset.range(tf.where(on, n, tf.constant(0, tf.int64)))
          .shuffle(buffer_size, seed=seed, reshuffle_each_iteration=True)
          .batch(batch_size)
      )

    once = tf.equal(reps, 1)
    plain = base(tf.logical_and(once, take < 0))
    cut = base(tf.logical_and(once, take >= 0)).take(take)
    repeated = base(tf.logical_not(once)).repeat(reps).take(take)
    ds = plain.concatenate(cut).concatenate(repeated)
    stream = ds
    for _ in range(passes - 1):
      stream = stream.concatenate(ds)
    return stream.unbatch()

  rows = tf.stack([seeds, sizes, epochs, takes], axis=1)
  ds = tf.data.Dataset.from_tensor_slices(rows).flat_map(client_orders)
  ds = ds.concatenate(tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)))
  return ds.batch(2**40).get_single_element()


def size_groups(
    steps, *, step_overhead: float = 2.0
) -> tuple[np.ndarray, np.ndarray]:
  """The round's clients in size-ordered groups for the vectorized loop.

  A group of `m` clients runs its longest client's `S` steps for all `m`
  clients (the shorter ones padded); a step's cost is modelled as
  `m + step_overhead` client-steps (the loop's per-step work beside the
  clients' arithmetic). The clients sorted by steps are cut into contiguous
  groups minimising `sum_g S_g (m_g + step_overhead)` (dynamic programming,
  O(K^2)); clients of equal sizes stay one group.

  Args:
    steps: Each client's step count (K,).
    step_overhead: The per-step cost in client-steps (>= 0).

  Returns:
    `(order [K] int32: the clients by ascending steps (stable), bounds [G+1]
    int32: group g is order[bounds[g]:bounds[g + 1]])`.
  """
  steps = np.asarray(steps, np.int64)
  order = np.argsort(steps, kind='stable').astype(np.int32)
  s = steps[order].astype(np.float64)
  k = len(s)
  best = np.zeros(k + 1)
  cut = np.zeros(k + 1, np.int64)
  for j in range(1, k + 1):
    # Group (i, j]: its longest client is s[j - 1] (sorted).
    i = np.arange(j)
    cost = best[:j] + s[j - 1] * ((j - i) + step_overhead)
    cut[j] = int(np.argmin(cost))
    best[j] = cost[cut[j]]
  bounds = [k]
  while bounds[-1] > 0:
    bounds.append(int(cut[bounds[-1]]))
  return order, np.asarray(bounds[::-1], np.int32)


def padded_slots(steps, order, bounds, batch_size: int) -> int:
  """Batch slots the vectorized loop runs for these groups (padding too)."""
  steps = np.asarray(steps, np.int64)[order]
  return int(
      sum(
          (b - a) * steps[a:b].max(initial=0) * batch_size
          for a, b in zip(bounds[:-1], bounds[1:])
      )
  )


def round_groups(
    steps, *, group_by_size: bool = True, min_saving: float = 0.2
) -> tuple[np.ndarray, np.ndarray]:
  """The engine's groups for a round: `size_groups` where they cut the
  padded slots by `min_saving` or more, else one group in cohort order (a
  cohort of near sizes keeps its one loop, and its results to the last
  bit)."""
  k = len(steps)
  order = np.arange(k, dtype=np.int32)
  bounds = np.asarray([0, k], np.int32)
  if group_by_size:
    grouped = size_groups(steps)
    if padded_slots(steps, *grouped, 1) <= (1.0 - min_saving) * padded_slots(
        steps, order, bounds, 1
    ):
      return grouped
  return order, bounds


def _per_client(mask, tensor):
  """`mask` [K] broadcast against `tensor` [K, ...]."""
  shape = tf.concat(
      [tf.shape(mask), tf.ones([tf.rank(tensor) - 1], tf.int32)], 0
  )
  return tf.reshape(mask, shape)


def _keep_active(active, new, old):
  """Client k's slice of `new` where `active[k]`, else of `old`."""
  return tf.where(_per_client(active, old), new, old)


def _finite_per_client(stacked):
  """[K] bool: every entry of client k's slices is finite."""
  flags = [
      tf.reduce_all(
          tf.reshape(tf.math.is_finite(t), [tf.shape(t)[0], -1]), axis=1
      )
      for t in stacked
  ]
  return tf.reduce_all(tf.stack(flags, axis=0), axis=0)


def functional_model(model_fn):
  """`(keras_model, functional model, per-example loss)` of a task's model.

  The model must be built by `tff.learning.models.from_keras_model` with one
  Keras loss object, no regularization losses, dropout or batch
  normalization, and report only `SUPPORTED_METRICS` (accuracy as
  `SparseCategoricalAccuracy`): the metrics the engines compute from masked
  sums of per-example losses (the loss with no reduction) and hits.

  Raises:
    StackedEngineError: For a model of another kind.
  """
  model = model_fn()
  keras_model = getattr(model, '_keras_model', None)
  loss_fns = getattr(model, '_loss_fns', None)
  if keras_model is None or not loss_fns or len(loss_fns) != 1:
    raise StackedEngineError(
        'the stacked engine needs a model built by tff.learning.models.'
        'from_keras_model with one loss'
    )
  if keras_model.losses:
    raise StackedEngineError(
        'the stacked engine does not run models with regularization losses'
    )
  if any(
      isinstance(
          layer, (tf.keras.layers.Dropout, tf.keras.layers.BatchNormalization)
      )
      for layer in keras_model.submodules
  ):
    raise StackedEngineError(
        'the stacked engine does not run models with '
        'dropout or batch normalization'
    )
  loss = loss_fns[0]
  if not isinstance(loss, tf.keras.losses.Loss):
    raise StackedEngineError(
        'the stacked engine needs a tf.keras.losses.'
        "Loss object as the model's loss"
    )
  loss_none = type(loss).from_config(
      dict(loss.get_config(), reduction=tf.keras.losses.Reduction.NONE)
  )
  metrics = [m for m in getattr(model, '_metrics', []) if m.name == 'accuracy']
  if any(type(m).__name__ != 'SparseCategoricalAccuracy' for m in metrics):
    raise StackedEngineError(
        'the stacked engine computes accuracy as '
        'SparseCategoricalAccuracy only'
    )
  names = set(model.report_local_unfinalized_metrics())
  if not names <= set(SUPPORTED_METRICS):
    raise StackedEngineError(
        'the stacked engine reports the metrics '
        f'{", ".join(SUPPORTED_METRICS)}; the model also has '
        f'{", ".join(sorted(names - set(SUPPORTED_METRICS)))}'
    )
  functional = tff.learning.models.functional_model_from_keras(
      keras_model, loss, model.input_spec
  )
  return keras_model, functional, loss_none


def example_losses(loss_none, y, preds):
  """Per-example losses [...] of labels `y` [...] and predictions [..., C]."""
  shape = tf.shape(y)
  flat_preds = tf.reshape(
      preds, tf.concat([[-1], tf.shape(preds)[tf.rank(y) :]], 0)
  )
  losses = loss_none(tf.reshape(y, [-1]), flat_preds)
  return tf.reshape(tf.cast(losses, tf.float32), shape)


def correct_predictions(y, preds):
  """1.0 where the arg-max of `preds` [..., C] is the label `y` [...]."""
  labels = tf.cast(tf.argmax(preds, axis=-1), y.dtype)
  return tf.cast(tf.equal(labels, y), tf.float32)


def _optimizer_state(optimizer, trainable_specs):
  """`(initial state, keys of its per-weight parts)` of a client optimizer.

  Raises:
    StackedEngineError: For state that is not per weight (a step counter).
  """
  state = optimizer.initialize(trainable_specs)
  hparams = set(optimizer.get_hparams(state))
  per_weight = []
  for key, value in state.items():
    if key in hparams:
      continue
    shapes = [tuple(np.shape(v)) for v in tf.nest.flatten(value)]
    if shapes != [tuple(s.shape) for s in trainable_specs]:
      raise StackedEngineError(
          f'the stacked engine needs a client optimizer with per-weight '
          f'state (SGD, momentum, Adagrad); its state {key!r} is not'
      )
    per_weight.append(key)
  return state, per_weight


def check_definition(definition) -> None:
  """Raises `StackedEngineError` for a definition the engine cannot run.

  The engine computes two kinds of client work itself on stacked weights:
  local training with the client optimizer, and the loss and full gradient
  at the broadcast model (`client_work.full_gradient_work`: AFL, q-FedSGD).
  Other work runs here through its own kernel
  (`stacked_work.StackedLocalWork`), which also says which of its settings
  it cannot run; a definition with other client work of its own runs on the
  batched engine, which calls that work's own function.
  """
  work = definition.local_work
  if isinstance(work, stacked_work.StackedLocalWork):
    work.check_stacked(definition)
    return
  if work not in (None, client_work_lib.full_gradient_work):
    raise StackedEngineError(
        'the stacked engine runs local training or full gradients on '
        f'stacked weights; {definition.name} has its own client work: use '
        'the batched engine'
    )


class _StackedOps:
  """The round graph's pieces: the engine's `stacked_work.Kit`.

  Built once in the engine's graph; its methods add ops when the round
  function is traced. Every tensor of weights is a tuple of the trainable
  weights, stacked [K, ...] where it is per client.
  """

  def __init__(
      self,
      engine: 'StackedEngine',
      functional,
      loss_none,
      trainable_specs,
      training_optimizer,
  ):
    self.definition = engine.definition
    self._functional = functional
    self._per_example_loss = functools.partial(example_losses, loss_none)
    self._trainable_specs = trainable_specs
    self._vectorize = engine.vectorize
    self._rnn_forward = engine.rnn_forward
    self._shuffle = engine._shuffle  # pylint: disable=protected-access
    self._engine = engine
    self.non_trainable = ()  # The model's, set before the round is traced.
    self._training_solver = self.solver(training_optimizer)
    self._gradient_work = (
        self.definition.local_work is client_work_lib.full_gradient_work
    )

  # Helpers a kernel uses.

  def solver(self, optimizer):
    """`(optimizer, its initial state, its per-weight keys)` for `descend`."""
    return (optimizer,) + _optimizer_state(optimizer, self._trainable_specs)

  @staticmethod
  def finite_per_client(stacked):
    return _finite_per_client(stacked)

  @staticmethod
  def per_client(mask, tensor):
    return _per_client(mask, tensor)

  def indices(self, pos, x_all):
    """Example indices of padded slots (the last, dummy, row on padding)."""
    engine = self._engine
    dummy = tf.cast(tf.shape(x_all)[0] - 1, tf.int64)
    safe = tf.maximum(pos, 0)
    if self._shuffle:
      local = tf.gather(engine._order, safe)  # pylint: disable=protected-access
    else:
      local = safe
    base = engine._base_ph[None, :, None]  # pylint: disable=protected-access
    return tf.where(pos >= 0, base + local, dummy)

  # The model.

  def predict(self, w, x, training):
    return self._functional.predict_on_batch(
        (list(w), list(self.non_trainable)), x, training
    )

  def forward(self, w_stacked, x):
    """Predictions [K, b, ...] of each client's weights on its batch."""
    if self._vectorize and self._rnn_forward is not None:
      return self._rnn_forward(w_stacked, x)
    if self._vectorize:
      return tf.vectorized_map(
          lambda a: self.predict(a[0], a[1], True),
          (w_stacked, x),
          fallback_to_while_loop=True,
      )
    return self.predict([w[0] for w in w_stacked], x[0], True)[None]

  def _batch_loss(self, w, x, y, mask):
    """`(predictions, per-client mean loss, per-client count)` of a step."""
    preds = self.forward(w, x)
    count = tf.reduce_sum(mask, axis=1)
    client_loss = tf.reduce_sum(
        self._per_example_loss(y, preds) * mask, axis=1
    ) / tf.maximum(count, 1.0)
    return preds, client_loss, count

  # Passes over the clients' streams.

  def descend(
      self,
      w_start,
      anchor,
      solver,
      x_all,
      y_all,
      idx,
      valid,
      proximal,
      decay,
      mix=None,
  ):
    """Mini-batch steps of the clients of `idx` [S, K, b] from `w_start`.

    `w_start` is stacked [K, ...]; the proximal term pulls toward `anchor`
    ([K, ...] or broadcast [...]); `solver` is `(optimizer, its initial
    state, its per-weight keys)`. With `mix` (Fed+'s kappa) each step's
    result is `mix * step + (1 - mix) * anchor`. Returns `(weights
    [K, ...], sums)`.
    """
    optimizer, initial_state, per_weight = solver
    k = tf.shape(idx)[1]
    stack = lambda t: tf.broadcast_to(t[None], tf.concat([[k], tf.shape(t)], 0))
    state = collections.OrderedDict(
        (key, tf.nest.map_structure(tf.convert_to_tensor, value))
        for key, value in initial_state.items()
    )
    for key in per_weight:
      state[key] = tuple(
          stack(tf.convert_to_tensor(v))
          for v in tf.nest.flatten(initial_state[key])
      )
    w = w_start
    zeros_k = tf.zeros([k], tf.float32)
    sums = (zeros_k, zeros_k, zeros_k, zeros_k)
    for t in tf.range(tf.shape(idx)[0]):
      slots = idx[t]
      mask = tf.cast(valid[t], tf.float32)
      active = tf.reduce_any(valid[t], axis=1)
      x = tf.gather(x_all, slots)
      y = tf.gather(y_all, slots)
      with tf.GradientTape() as tape:
        tape.watch(w)
        preds, client_loss, count = self._batch_loss(w, x, y, mask)
        total = tf.reduce_sum(client_loss)
      grads = tape.gradient(total, w)
      if proximal:
        grads = tuple(
            g + proximal * (v - v0) for g, v, v0 in zip(grads, w, anchor)
        )
      if decay:
        grads = tuple(g + decay * v for g, v in zip(grads, w))
      new_state, new_w = optimizer.next(state, w, grads)
      if mix is not None:
        new_w = tuple(mix * n + (1.0 - mix) * z for n, z in zip(new_w, anchor))
      keep = functools.partial(_keep_active, active)
      w = tuple(keep(n, o) for n, o in zip(new_w, w))
      merged = collections.OrderedDict(
          (key, tf.nest.map_structure(tf.convert_to_tensor, value))
          for key, value in new_state.items()
      )
      for key in per_weight:
        merged[key] = tuple(
            keep(n, o)
            for n, o in zip(tf.nest.flatten(new_state[key]), state[key])
        )
      state = merged
      sums = _add_step(
          sums, client_loss, count, correct_predictions(y, preds), mask, active
      )
    return w, sums

  def local_training(
      self, w0, start, x_all, y_all, idx, valid, proximal, decay
  ):
    """Local training of the clients of `idx` [S, K, b] from `w0`.

    `(deltas, sums)`; `start` is None (every client starts at `w0`).
    """
    del start
    k = tf.shape(idx)[1]
    w_start = tuple(
        tf.broadcast_to(v[None], tf.concat([[k], tf.shape(v)], 0)) for v in w0
    )
    w, sums = self.descend(
        w_start,
        w_start,
        self._training_solver,
        x_all,
        y_all,
        idx,
        valid,
        proximal,
        decay,
    )
    delta = tuple(a - c for a, c in zip(w_start, w))
    return delta, sums

  def gradient_at(self, w0, start, x_all, y_all, idx, valid, proximal, decay):
    """Each client's mean gradient at `w0` over its stream.

    As `client_work.full_gradient_work`: batch-mean gradients weighted by
    the batch sizes, divided by the examples; the metrics of the pass.
    """
    del start, proximal, decay
    k = tf.shape(idx)[1]
    w = tuple(
        tf.broadcast_to(v[None], tf.concat([[k], tf.shape(v)], 0)) for v in w0
    )
    grad_sums = tuple(tf.zeros_like(v) for v in w)
    zeros_k = tf.zeros([k], tf.float32)
    sums = (zeros_k, zeros_k, zeros_k, zeros_k)
    for t in tf.range(tf.shape(idx)[0]):
      mask = tf.cast(valid[t], tf.float32)
      x = tf.gather(x_all, idx[t])
      y = tf.gather(y_all, idx[t])
      with tf.GradientTape() as tape:
        tape.watch(w)
        preds, client_loss, count = self._batch_loss(w, x, y, mask)
        total = tf.reduce_sum(client_loss)
      grads = tape.gradient(total, w)
      grad_sums = tuple(
          a + _per_client(count, g) * g for a, g in zip(grad_sums, grads)
      )
      sums = _add_step(
          sums,
          client_loss,
          count,
          correct_predictions(y, preds),
          mask,
          tf.reduce_any(valid[t], axis=1),
      )
    n = tf.maximum(sums[2], 1.0)
    return tuple(g / _per_client(n, g) for g in grad_sums), sums

  def _grouped(
      self, pass_fn, w0, start, x_all, y_all, idx, valid, steps, proximal, decay
  ):
    """`pass_fn` over size-ordered groups, each to its longest steps."""
    engine = self._engine
    order = engine._order_ph  # pylint: disable=protected-access
    bounds = engine._bounds_ph  # pylint: disable=protected-access
    idx_s = tf.gather(idx, order, axis=1)
    valid_s = tf.gather(valid, order, axis=1)
    steps_s = tf.cast(tf.gather(steps, order), tf.int32)
    start_s = None
    if start is not None:
      start_s = tuple(tf.gather(v, order) for v in start)
    g_count = tf.size(bounds) - 1
    new_ta = lambda dtype: tf.TensorArray(
        dtype, size=g_count, infer_shape=False
    )
    deltas = [new_ta(s.dtype) for s in self._trainable_specs]
    sums = [new_ta(tf.float32) for _ in range(4)]
    for g in tf.range(g_count):
      a, b = bounds[g], bounds[g + 1]
      s = tf.reduce_max(steps_s[a:b])
      d, m = pass_fn(
          w0,
          None if start_s is None else tuple(v[a:b] for v in start_s),
          x_all,
          y_all,
          idx_s[:s, a:b],
          valid_s[:s, a:b],
          proximal,
          decay,
      )
      deltas = [ta.write(g, v) for ta, v in zip(deltas, d)]
      sums = [ta.write(g, v) for ta, v in zip(sums, m)]
    back = tf.math.invert_permutation(order)
    unsort = lambda ta: tf.gather(ta.concat(), back)
    return (
        tuple(unsort(ta) for ta in deltas),
        tuple(unsort(ta) for ta in sums),
    )

  def run_clients(
      self, pass_fn, w0, start, x_all, y_all, idx, valid, steps, proximal, decay
  ):
    """`pass_fn` for every client: `(vectors [K, ...], sums [K])`.

    Vectorized in `_grouped`'s groups, else client after client; `start` is
    None or the clients' stacked start weights [K, ...].
    """
    if self._vectorize:
      return self._grouped(
          pass_fn, w0, start, x_all, y_all, idx, valid, steps, proximal, decay
      )
    k_count = tf.shape(idx)[1]
    deltas = [
        tf.TensorArray(s.dtype, size=k_count) for s in self._trainable_specs
    ]
    sums = [tf.TensorArray(tf.float32, size=k_count) for _ in range(4)]
    for k in tf.range(k_count):
      s = tf.cast(steps[k], tf.int32)
      d, m = pass_fn(
          w0,
          None if start is None else tuple(v[k : k + 1] for v in start),
          x_all,
          y_all,
          idx[:s, k : k + 1],
          valid[:s, k : k + 1],
          proximal,
          decay,
      )
      deltas = [ta.write(k, v[0]) for ta, v in zip(deltas, d)]
      sums = [ta.write(k, v[0]) for ta, v in zip(sums, m)]
    return (
        tuple(ta.stack() for ta in deltas),
        tuple(ta.stack() for ta in sums),
    )

  def train(self, inputs: stacked_work.RoundInputs) -> stacked_work.LocalResult:
    """The engine's own work: local training's deltas (or, for
    `client_work.full_gradient_work`, the gradients at `w0`), zeroed where
    non-finite."""
    pass_fn = self.gradient_at if self._gradient_work else self.local_training
    deltas, sums = self.run_clients(
        pass_fn,
        inputs.w0,
        None,
        inputs.x_all,
        inputs.y_all,
        inputs.idx,
        inputs.valid,
        inputs.steps,
        self.definition.proximal_strength,
        self.definition.weight_decay,
    )
    ok = _finite_per_client(deltas)
    deltas = tuple(
        tf.where(_per_client(ok, d), d, tf.zeros_like(d)) for d in deltas
    )
    return stacked_work.LocalResult(deltas, sums, tf.logical_not(ok))

  def loss_at(self, w0, x_all, y_all, idx, valid):
    """Each client's mean loss over its (loss-pass) stream at `w0`.

    Summed as `client_work.local_loss` does (batch means, weighted by
    batch sizes, accumulated batch after batch), so that exact ties, e.g.
    at a zero-initialised model, tie the same way in Delta-FL's filter.
    """
    preds = self.predict(w0, x_all, False)
    losses = tf.reshape(self._per_example_loss(y_all[None], preds[None]), [-1])
    mask = tf.cast(valid, tf.float32)
    counts = tf.reduce_sum(mask, axis=2)
    means = tf.math.divide_no_nan(
        tf.reduce_sum(tf.gather(losses, idx) * mask, axis=2), counts
    )
    k = tf.shape(idx)[1]
    total = tf.zeros([k], tf.float32)
    n = tf.zeros([k], tf.float32)
    for t in tf.range(tf.shape(idx)[0]):
      total += counts[t] * means[t]
      n += counts[t]
    return total / tf.maximum(n, 1.0), n


def _add_step(sums, client_loss, count, correct, mask, active):
  """The pass's `(loss, correct, examples, batches)` [K] after one step."""
  loss_sum, correct_sum, n_sum, batches = sums
  return (
      loss_sum + client_loss * count,
      correct_sum + tf.reduce_sum(correct * mask, axis=1),
      n_sum + count,
      batches + tf.cast(active, tf.float32),
  )


def _finalized_metrics(metric_specs, sums):
  """The model's unfinalized training metrics from the clients' sums."""
  loss_sum, correct_sum, n_sum, batches = (tf.reduce_sum(s) for s in sums)
  values = {
      'accuracy': [correct_sum, n_sum],
      'loss': [loss_sum, n_sum],
      'num_examples': [n_sum],
      'num_batches': [batches],
  }
  metrics = collections.OrderedDict()
  for name, spec in metric_specs.items():
    metrics[name] = tf.nest.pack_sequence_as(
        spec,
        [
            tf.cast(tf.reshape(v, s.shape), s.dtype)
            for v, s in zip(values[name], tf.nest.flatten(spec))
        ],
    )
  return metrics


def _round_function(
    definition, ops, local_work, server_opt, trainable_specs, metric_specs
):
  """The round as one `tf.function` over the stacked clients: the loss
  pass, the local work of all clients at once, their messages and the
  server step."""
  server_state_rule = definition.server_state

  def round_losses(w0, x_all, y_all, idx, valid, loss_pos):
    """The loss pass's `(losses, counts)` [K] (None without one)."""
    if definition.loss_pass == 'fresh':
      return ops.loss_at(w0, x_all, y_all, idx, valid)
    if definition.loss_pass == 'continued':
      lidx = ops.indices(loss_pos, x_all)
      return ops.loss_at(w0, x_all, y_all, lidx, loss_pos >= 0)
    return None, None

  @tf.function
  def round_fn(
      weights,
      opt_state,
      x_all,
      y_all,
      train_pos,
      loss_pos,
      steps,
      server_state,
      client_indices,
      personal,
      extra_pos,
  ):
    w0 = tuple(tf.nest.flatten(weights.trainable))
    idx = ops.indices(train_pos, x_all)
    valid = train_pos >= 0
    k_count = tf.shape(train_pos)[1]
    losses, counts = round_losses(w0, x_all, y_all, idx, valid, loss_pos)
    context = definition.prepare(losses, counts)
    kept = tf.ones([k_count], tf.bool)
    if definition.trains is not None:
      # A filtered-out client does no work (no step, no metric, zero delta).
      kept = definition.trains(context, losses)
      valid = tf.logical_and(valid, kept[None, :, None])
      steps = tf.where(kept, steps, tf.zeros_like(steps))
    result = local_work(
        stacked_work.RoundInputs(
            w0, personal, x_all, y_all, idx, valid, steps, kept, extra_pos
        )
    )
    deltas, sums, bad = result.vectors, result.sums, result.non_finite
    num_examples = sums[2]
    if definition.loss_pass == 'work':  # The gradient pass's losses.
      losses = sums[0] / tf.maximum(num_examples, 1.0)
      counts = num_examples
    if server_state_rule is not None:
      context = dict(
          context, server_state=server_state, client_index=client_indices
      )
    if definition.per_client_message:
      vectors, scalars = tf.map_fn(
          lambda a: definition.client_result(context, *a),
          (losses, counts, deltas, num_examples, bad),
          fn_output_signature=(
              tuple(tf.TensorSpec(s.shape, s.dtype) for s in trainable_specs),
              tf.TensorSpec([], tf.float32),
          ),
      )
    else:
      vectors, scalars = definition.client_result(
          context, losses, counts, deltas, num_examples, bad
      )
    client_vectors = vectors if definition.server_sees_clients else None
    if definition.weighted:
      vectors = tuple(v * _per_client(scalars, v) for v in vectors)
    trainable, opt_state, extra, new_server_state = batched.finish_round(
        definition,
        server_opt,
        w0,
        opt_state,
        batched.RoundSums(
            context,
            losses,
            k_count,
            result.client_counts,
            tuple(tf.reduce_sum(v, axis=0) for v in vectors),
            tf.reduce_sum(scalars),
            client_vectors,
        ),
        server_state,
        client_indices,
    )
    return (
        trainable,
        opt_state,
        _finalized_metrics(metric_specs, sums),
        extra,
        new_server_state,
        result.personal,
    )

  return round_fn


class StackedEngine:
  """Runs rounds of a supported algorithm with the clients stacked.

  Usage, with a process built by the matching builder:

    engine = StackedEngine(task.model_fn, task.preprocess_train,
                           task.train_data, algorithm)
    state = process.initialize()
    state, metrics = engine.next(state, plan)   # a batched.RoundPlan

  `next` returns the process's state type, updated as `process.next` would,
  and metrics shaped like `process.next`'s (as `BatchedEngine.next`).
  """

  def __init__(
      self,
      model_fn: Callable[[], tff.learning.models.VariableModel],
      preprocess_train: Callable[..., tf.data.Dataset],
      client_data: tff.simulation.datasets.ClientData,
      algorithm: batched.BatchedAlgorithm,
      *,
      shuffle: bool = True,
      vectorize: Optional[bool] = None,
      group_by_size: bool = False,
      rnn_kernels: bool = True,
      shuffle_buffer_size: int = 10_000,
      session_config: Optional[tf.compat.v1.ConfigProto] = None,
  ):
    """Builds the engine's graph.

    Args:
      model_fn: The task's model function (a model built by
        `tff.learning.models.from_keras_model` with one Keras loss).
      preprocess_train: The task's `(dataset, epochs, seed)` preprocessing.
      client_data: The clients' raw training data.
      algorithm: The algorithm and its hyperparameters.
      shuffle: As `SimulationConfig.shuffle`.
      vectorize: Train the round's clients together (stacked); False runs
        them one after another through the same functional step; None
        (default): False for models with convolutions (per-client filters
        make `vectorized_map` fall back to a slow loop), else True.
      group_by_size: Vectorized: run the round's clients in size-ordered
        groups (`round_groups`) instead of padding every client to the
        longest one. The same results to float rounding (batched matmuls of
        other shapes), which a long run can amplify: off by default, so
        recorded runs rerun to the same numbers.
      rnn_kernels: Vectorized: run a recurrent model of
        `tff_algos.stacked_rnn`'s kind (the Shakespeare presets) as batched
        matrix products instead of `vectorized_map` over Keras' layers.
      shuffle_buffer_size: The task's shuffle buffer (any size >= every
        client's example count gives the same orders).
      session_config: Optional `tf.compat.v1.ConfigProto`.

    Raises:
      TypeError, ValueError: For bad arguments or an unsupported model,
        task or client optimizer (`StackedEngineError`).
    """
    if not callable(model_fn) or not callable(preprocess_train):
      raise TypeError('model_fn and preprocess_train must be callables')
    if not isinstance(client_data, tff.simulation.datasets.ClientData):
      raise TypeError(
          'client_data must be a tff.simulation.datasets.'
          f'ClientData, got {type(client_data).__name__}'
      )
    if not isinstance(algorithm, batched.BatchedAlgorithm):
      raise TypeError(
          'algorithm must be a batched.BatchedAlgorithm, got '
          f'{type(algorithm).__name__}'
      )
    if (
        isinstance(shuffle_buffer_size, bool)
        or not isinstance(shuffle_buffer_size, int)
        or shuffle_buffer_size < 1
    ):
      raise ValueError(
          'shuffle_buffer_size must be an int >= 1, got '
          f'{shuffle_buffer_size!r}'
      )
    algorithm.validate()
    self.algorithm = algorithm
    self.definition = algorithm.definition()  # Built once, not per round.
    check_definition(self.definition)
    self._vectorize_arg = vectorize
    if not isinstance(group_by_size, bool):
      raise TypeError(f'group_by_size must be a bool, got {group_by_size!r}')
    self.group_by_size = group_by_size
    if not isinstance(rnn_kernels, bool):
      raise TypeError(f'rnn_kernels must be a bool, got {rnn_kernels!r}')
    self._rnn_kernels = rnn_kernels
    self.rnn_forward = None  # Set by _functional_model when it applies.
    self.last_padding = (0, 0)
    self._shuffle = bool(shuffle)
    self._buffer = shuffle_buffer_size
    self.examples = ClientExamples(client_data, preprocess_train)
    # A loss pass that training continues reads pass 0, training pass 1; a
    # kernel's further passes (`extra_passes`) read the passes after, in order.
    continued = self.definition.loss_pass == 'continued'
    self._train_pass = 1 if continued else 0
    work = self.definition.local_work
    self._kernel_work = (
        work if isinstance(work, stacked_work.StackedLocalWork) else None
    )
    self._extra_passes = (
        self._kernel_work.extra_passes if self._kernel_work else 0
    )
    self._passes = self._train_pass + 1 + self._extra_passes
    functional, loss_none = self._functional_model(model_fn)
    self.vectorize = bool(self._vectorize_arg)
    if not self.vectorize:
      self.rnn_forward = None  # Sequential: the functional model's own step.
    # The batch size is the first full batch of a probe of the task's
    # preprocessing (the layout is checked against it on the first round).
    probe = preprocess_train(
        client_data.create_tf_dataset_for_client(
            client_data.client_ids[0]
        ).repeat(),
        1,
        None,
    )
    self.batch_size = int(_as_xy(next(iter(probe)))[1].shape[0])
    self._graph = tf.Graph()
    with self._graph.as_default():  # pytype: disable=attribute-error
      self._build(model_fn, functional, loss_none)
    self._session = tf.compat.v1.Session(
        graph=self._graph, config=session_config
    )
    self._session.run(self._init_ops)
    self._graph.finalize()
    self._check_layout(client_data.client_ids[0])

  # -------------------------------------------------------------------------
  # Model.

  def _functional_model(self, model_fn):
    keras_model, functional, loss_none = functional_model(model_fn)
    if self._vectorize_arg is None:
      self._vectorize_arg = not any(
          type(layer).__name__.startswith('Conv')
          for layer in keras_model.submodules
      )
    if self._rnn_kernels:
      self.rnn_forward = stacked_rnn.stacked_forward(keras_model)
    return functional, loss_none

  # -------------------------------------------------------------------------
  # Graph construction.

  def _build(self, model_fn, functional, loss_none):
    alg = self.algorithm
    model = model_fn()  # For the metric structure and finalizers.
    weights = tff.learning.models.ModelWeights.from_model(model)
    weight_specs = tf.nest.map_structure(
        lambda v: tf.TensorSpec(v.shape, v.dtype), weights
    )
    trainable_specs = tuple(tf.nest.flatten(weight_specs.trainable))
    server_opt = alg.server
    opt_state_specs = tf.nest.map_structure(
        lambda t: tf.TensorSpec(t.shape, t.dtype),
        tf.nest.map_structure(
            tf.convert_to_tensor, server_opt.initialize(trainable_specs)
        ),
    )
    definition = self.definition
    if not definition.server_optimizer:
      opt_state_specs = ()
    work = self._kernel_work
    # A kind's training pass may run its own optimizer (Ditto's global pass
    # runs its definition's, as the batched engine, which calls the work).
    training_optimizer = alg.client_optimizer
    if work is not None:
      training_optimizer = work.training_optimizer(alg.client_optimizer)
    metric_specs = tf.nest.map_structure(
        lambda t: tf.TensorSpec(t.shape, t.dtype),
        model.report_local_unfinalized_metrics(),
    )
    self._make_placeholders(weight_specs, opt_state_specs, trainable_specs)
    ops = _StackedOps(
        self, functional, loss_none, trainable_specs, training_optimizer
    )
    local_work = ops.train if work is None else work.stacked_kernel(ops)
    round_fn = _round_function(
        definition, ops, local_work, server_opt, trainable_specs, metric_specs
    )

    ops.non_trainable = tuple(tf.nest.flatten(self._weights_ph.non_trainable))
    weights_in = tff.learning.models.ModelWeights(
        trainable=list(tf.nest.flatten(self._weights_ph.trainable)),
        non_trainable=list(ops.non_trainable),
    )
    trainable, opt_state, metric_sums, extra, server_state, personal = round_fn(
        weights_in,
        self._opt_state_ph,
        self._x_ph,
        self._y_ph,
        self._train_pos_ph,
        self._loss_pos_ph,
        self._steps_ph,
        self._server_state_ph,
        self._indices_ph,
        self._personal_ph,
        self._extra_pos_ph,
    )
    finalizers = model.metric_finalizers()
    finalized = collections.OrderedDict(
        (name, finalizers[name](metric_sums[name])) for name in metric_sums
    )
    self._outputs = (
        tf.nest.pack_sequence_as(weight_specs.trainable, list(trainable)),
        opt_state,
        finalized,
        extra,
    )
    self._state_outputs = (personal, server_state)
    init = [
        tf.compat.v1.global_variables_initializer(),
        tf.compat.v1.local_variables_initializer(),
    ]
    self._init_ops = init

  def _make_placeholders(self, weight_specs, opt_state_specs, trainable_specs):
    """The round's inputs, and the order stream of its clients' passes (in
    the engine's graph: `_build` calls it from `__init__`)."""
    # pylint: disable=attribute-defined-outside-init
    x_spec, y_spec = self.examples.x_spec, self.examples.y_spec
    b = self.batch_size
    ph = tf.compat.v1.placeholder
    placeholders = batched._placeholders  # pylint: disable=protected-access
    self._weights_ph = placeholders(weight_specs, 'weights')
    self._opt_state_ph = placeholders(opt_state_specs, 'server')
    self._x_ph = ph(x_spec.dtype, [None] + x_spec.shape.as_list(), 'x')
    self._y_ph = ph(y_spec.dtype, [None], 'y')
    self._base_ph = ph(tf.int64, [None], 'base')  # First example of client k.
    self._train_pos_ph = ph(tf.int64, [None, None, b], 'train_pos')
    self._loss_pos_ph = ph(tf.int64, [None, None, b], 'loss_pos')
    self._steps_ph = ph(tf.int64, [None], 'steps')
    self._order_ph = ph(tf.int32, [None], 'order')  # size_groups' order.
    self._bounds_ph = ph(tf.int32, [None], 'bounds')  # and its groups.
    self._personal_ph, self._server_state_ph, self._indices_ph = (
        batched.state_placeholders(self.definition, trainable_specs)
    )
    # The further passes' slots [P, S, K, b] (as `train_pos`, passes after).
    self._extra_pos_ph = ph(
        tf.int64, [self._extra_passes, None, None, b], 'extra_pos'
    )
    self._seeds_ph = ph(tf.int64, [None], 'seeds')
    self._sizes_ph = ph(tf.int64, [None], 'sizes')
    self._epochs_ph = ph(tf.int64, [None], 'epochs')
    self._takes_ph = ph(tf.int64, [None], 'takes')
    self._order = order_stream(
        self._seeds_ph,
        self._sizes_ph,
        self._epochs_ph,
        self._takes_ph,
        b,
        passes=self._passes,
        buffer_size=self._buffer,
    )

  # -------------------------------------------------------------------------
  # Running.

  def _check_layout(self, client_id: str) -> None:
    """Checks, once, that cached arrays + orders give the task's batches."""
    x, y = self.examples.get(client_id)
    seed = _CHECK_SEED if self._shuffle else None
    raw = self.examples.client_data.create_tf_dataset_for_client(client_id)
    expected = [_as_xy(e) for e in self.examples.preprocess_train(raw, 2, seed)]
    pos, _ = stream_layout(
        [len(y)],
        [2],
        [-1],
        self.batch_size,
        shuffle=self._shuffle,
        passes=self._passes,
    )
    if self._shuffle:
      order = self._session.run(
          self._order,
          {
              self._seeds_ph: [seed],
              self._sizes_ph: [len(y)],
              self._epochs_ph: [2],
              self._takes_ph: [-1],
          },
      )
      local = np.where(pos >= 0, order[np.maximum(pos, 0)], -1)
    else:
      local = pos
    got = [local[t, 0][local[t, 0] >= 0] for t in range(local.shape[0])]
    same = len(got) == len(expected) and all(
        np.array_equal(y[g], e[1].numpy())
        and np.array_equal(x[g], e[0].numpy())
        for g, e in zip(got, expected)
    )
    if not same:
      raise StackedEngineError(
          "the task's preprocess_train is not of the form the stacked "
          'engine reproduces (per-example map, seeded shuffle with buffer '
          f'{self._buffer}, batch, repeat): use the tff or batched engine'
      )

  def run_round(
      self,
      weights,
      server_state,
      plan: batched.RoundPlan,
      client_states=None,
      extra_state=None,
  ):
    """One round on raw values: `(trainable, server_state, train, extra)`."""

    if not plan.client_ids:
      raise ValueError('a round needs at least one client')
    parts = [self.examples.get(cid) for cid in plan.client_ids]
    sizes = np.array([len(p[1]) for p in parts], np.int64)
    x_all = np.concatenate(
        [p[0] for p in parts] + [np.zeros_like(parts[0][0][:1])]
    )
    y_all = np.concatenate(
        [p[1] for p in parts] + [np.zeros_like(parts[0][1][:1])]
    )
    base = np.concatenate([[0], np.cumsum(sizes)])[:-1].astype(np.int64)
    seeds = (
        plan.shuffle_seeds
        if plan.shuffle_seeds is not None
        else [0] * len(sizes)
    )
    epochs = np.asarray(plan.epochs, np.int64)
    takes = np.asarray(plan.max_batches, np.int64)
    layout = lambda p: stream_layout(
        sizes,
        epochs,
        takes,
        self.batch_size,
        shuffle=self._shuffle,
        passes=self._passes,
        train_pass=p,
    )
    train_pos, steps = layout(self._train_pass)
    loss_pos = layout(0)[0] if self._train_pass else train_pos[:0]
    # A kernel's further passes read the stream again, one pass each, in order.
    extra_pos = np.zeros([0, 0, len(sizes), self.batch_size], np.int64)
    if self._extra_passes:
      extra_pos = np.stack(
          [
              layout(self._train_pass + 1 + g)[0]
              for g in range(self._extra_passes)
          ]
      )
    order, bounds = round_groups(steps, group_by_size=self.group_by_size)
    # (real examples, batch slots run) of this round's training pass.
    self.last_padding = (
        int((train_pos >= 0).sum()),
        padded_slots(steps, order, bounds, self.batch_size),
    )
    feed = batched.weights_and_state_feed(
        self._weights_ph, self._opt_state_ph, weights, server_state
    )
    feed.update(
        {
            self._x_ph: x_all,
            self._y_ph: y_all,
            self._base_ph: base,
            self._train_pos_ph: train_pos,
            self._loss_pos_ph: loss_pos,
            self._steps_ph: steps,
            self._order_ph: order,
            self._bounds_ph: bounds,
            self._seeds_ph: np.asarray(seeds, np.int64),
            self._sizes_ph: sizes,
            self._epochs_ph: epochs,
            self._takes_ph: takes,
            self._extra_pos_ph: extra_pos,
        }
    )
    feed.update(
        batched.client_state_feed(
            self.definition,
            self._personal_ph,
            self._server_state_ph,
            self._indices_ph,
            plan,
            client_states,
            extra_state,
        )
    )
    return self._session.run(
        batched.run_outputs(
            self.definition, self._outputs, self._state_outputs
        ),
        feed_dict=feed,
    )

  def next(self, state, plan: batched.RoundPlan, client_states=None) -> Any:
    """`process.next` on the process's state.

    Returns:
      `(new_state, metrics)`; for a definition with personal models (Ditto),
      a `stateful.StatefulOutput(state, client_states, metrics)` as the
      `StatefulClientsProcess` returns, given the participants'
      `client_states` (as `BatchedEngine.next`).
    """
    return batched.apply_round(
        self.definition, state, plan, client_states, self.run_round
    )

  def close(self) -> None:
    self._session.close()
