# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Per-client evaluation on the simulation engines: many clients per call.

`tasks.evaluation` evaluates a model per client through a TFF computation:
each client's preprocessed `tf.data` pipeline is built in Python (its
`Dataset.map` traced once per client) and the client computation is
dispatched once per client. `EngineEvaluation` computes the same per-client
metrics (`evaluation.evaluate_clients`' output: the model's finalized
`accuracy` and `loss`, float32, and `num_examples`, int64, one value per
client) in one TensorFlow call per chunk of clients, with the machinery of
the stacked engine:

* **Data.** A chunk's raw examples are read (`batched.ClientArrays`) and
  concatenated; the task's own `preprocess_eval` runs once, inside the
  graph, on the concatenation, unbatched. That is each client's own stream
  end to end when `preprocess_eval` is a per-example map followed by a
  batch (every task the stacked engine runs): checked once, on a probe
  client, against the task's own per-client stream; another form is
  refused (`stacked.StackedEngineError`). While the evaluated splits fit
  `cache_bytes`, each client's preprocessed examples are kept and later
  calls feed them to the model directly: no read, no preprocessing (on
  the Shakespeare benchmark's GRU 64, half of a call's time).
* **Model.** The model runs in functional form (`stacked.functional_model`):
  one forward pass over `batch_size` examples at a time, whatever their
  clients. The examples of the chunk are laid end to end in slots
  `[S, batch_size]`; a padded slot of the last step reads a dummy row and
  belongs to no client (segment K, dropped), and every client's
  per-example losses (the model's Keras loss without reduction) and hits
  are summed into its own segment.
* **Personal models** (`evaluate_personal`: each client's own weights, as
  `stateful.StatefulClientsProcess.evaluate_personal`). The clients' weights
  are stacked on a leading client axis and their examples laid out as in
  training (`stacked.stream_layout`: slots `[S, K, personal_batch_size]`,
  -1 on padding, masked), one forward pass of every client's model per step
  (`tf.vectorized_map`, or the batched matmuls of `tff_algos.stacked_rnn`
  for the recurrent presets), the clients in size groups
  (`stacked.round_groups`) so that a client of 1 example is not padded to
  one of thousands.
* **Metrics.** `loss` is the client's mean per-example loss and `accuracy`
  its share of hits, as the Keras metrics finalize them (the loss metric is
  the mean of batch means weighted by batch sizes: the same mean up to
  float rounding); an empty client has 0 for both, as Keras' `Mean`.

The model is evaluated with `training=False`, as `evaluation.forward_all`.
Tested equal to the TFF evaluation per client in tests/test_engine_eval.py.
"""

import collections
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import batched
from tff_algos import stacked
from tff_algos import stacked_rnn

ClientData = tff.simulation.datasets.ClientData
_SKIPPED = ('num_examples', 'num_batches')


class EngineEvaluation:
  """Per-client evaluation of a model's weights, a chunk of clients a call.

  Usage:

    evaluation = EngineEvaluation(task.model_fn, task.preprocess_eval,
                                  task.train_data)
    values = evaluation.evaluate(weights, task.test_data)

  `values` is what `tasks.evaluation.evaluate_clients` returns for the
  clients' preprocessed evaluation streams.
  """

  def __init__(
      self,
      model_fn: Callable[[], tff.learning.models.VariableModel],
      preprocess_eval: Callable[[tf.data.Dataset], tf.data.Dataset],
      probe_data: ClientData,
      *,
      batch_size: int = 2048,
      personal_batch_size: int = 32,
      chunk_size: int = 100,
      cache_bytes: int = 256 * 2**20,
      session_config: Any = None,
  ):
    """Builds the evaluation graph.

    Args:
      model_fn: The task's model function (as the stacked engine needs it).
      preprocess_eval: The task's evaluation preprocessing.
      probe_data: Clients whose raw element structure every evaluated split
        shares; its first non-empty client checks the preprocessing.
      batch_size: Examples per forward pass (any value gives the same
        metrics to float rounding).
      personal_batch_size: Examples per client and forward pass of the
        clients' own (personal) models.
      chunk_size: Clients per TensorFlow call.
      cache_bytes: The evaluated splits' preprocessed examples are kept
        between calls (read and preprocessed once, as the engines keep the
        training clients') while all of them fit in this many bytes; a split
        that does not is read and preprocessed again at each call, a chunk
        at a time. 0: nothing kept.
      session_config: Optional `tf.compat.v1.ConfigProto`.

    Raises:
      stacked.StackedEngineError: For a model or preprocessing it does not
        run.
      ValueError: For a batch or chunk size below 1.
    """
    for name, value, least in (
        ('batch_size', batch_size, 1),
        ('personal_batch_size', personal_batch_size, 1),
        ('chunk_size', chunk_size, 1),
        ('cache_bytes', cache_bytes, 0),
    ):
      if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f'{name} must be an int >= {least}, got {value!r}')
    self.cache_bytes = cache_bytes
    # The splits evaluated so far by id (each held, so that its id stays
    # its own): their preprocessed examples kept, or read at each call.
    self._splits: dict[int, _Split] = {}
    self.batch_size = batch_size
    self.personal_batch_size = personal_batch_size
    self.chunk_size = chunk_size
    self._preprocess_eval = preprocess_eval
    keras_model, functional, loss_none = stacked.functional_model(model_fn)
    self._rnn_forward = stacked_rnn.stacked_forward(keras_model)
    model = model_fn()
    self._names = [
        n for n in model.metric_finalizers() if n not in _SKIPPED
    ] + ['num_examples']
    weight_specs = tf.nest.map_structure(
        lambda v: tf.TensorSpec(v.shape, v.dtype),
        tff.learning.models.ModelWeights.from_model(model),
    )
    raw_specs = tf.nest.map_structure(
        lambda s: tf.TensorSpec([None] + s.shape.as_list(), s.dtype),
        probe_data.element_type_structure,
    )
    self._personal_ph = ()
    self._client_rows_ph = None
    self._graph = tf.Graph()
    with self._graph.as_default():  # pytype: disable=attribute-error
      self._build(functional, loss_none, weight_specs, raw_specs)
    self._session = tf.compat.v1.Session(
        graph=self._graph, config=session_config
    )
    self._check_preprocessing(probe_data)

  # -------------------------------------------------------------------------
  # Graph construction.

  def _examples(self, raw):
    """`(x_all, y_all)`: the preprocessed examples, then one dummy row."""
    ds = self._preprocess_eval(tf.data.Dataset.from_tensor_slices(raw))
    ds = ds.unbatch()
    if isinstance(ds.element_spec, collections.abc.Mapping):
      ds = ds.map(stacked._as_xy)  # pylint: disable=protected-access
    else:
      stacked._as_xy(ds.element_spec)  # pylint: disable=protected-access
    specs = []
    for spec in ds.element_spec:
      if (
          not isinstance(spec, tf.TensorSpec)
          or not spec.shape.is_fully_defined()
      ):
        raise stacked.StackedEngineError(
            'the engine evaluation needs dense examples of a fixed shape, '
            f'got {ds.element_spec}'
        )
      specs.append(spec)
    if specs[1].shape.rank != 0:
      raise stacked.StackedEngineError(
          'the engine evaluation needs one label per example, got labels of'
          f' shape {specs[1].shape}'
      )
    dummy = tuple(tf.zeros(s.shape, s.dtype) for s in specs)
    ds = ds.concatenate(tf.data.Dataset.from_tensors(dummy))
    return ds.batch(2**31 - 1).get_single_element()

  def _build(self, functional, loss_none, weight_specs, raw_specs):
    placeholders = batched._placeholders  # pylint: disable=protected-access
    self._weights_ph = placeholders(weight_specs, 'weights')
    self._raw_ph = placeholders(raw_specs, 'raw')
    self._slots_ph = tf.compat.v1.placeholder(tf.int64, [None, None], 'slots')
    self._segments_ph = tf.compat.v1.placeholder(
        tf.int32, [None, None], 'segments'
    )
    self._clients_ph = tf.compat.v1.placeholder(tf.int32, [], 'clients')
    x_all, y_all = self._examples(self._raw_ph)
    self._probe = (x_all, y_all)
    self._rows = tf.shape(y_all, out_type=tf.int64)[0] - 1
    weights = (
        list(tf.nest.flatten(self._weights_ph.trainable)),
        list(tf.nest.flatten(self._weights_ph.non_trainable)),
    )

    @tf.function
    def client_sums(slots, segments, num_clients):
      """`(loss sum, hits, examples)` [K] float64 of each client."""
      sums = [tf.zeros([num_clients + 1], tf.float64) for _ in range(3)]
      for t in tf.range(tf.shape(slots)[0]):
        x = tf.gather(x_all, slots[t])
        y = tf.gather(y_all, slots[t])
        preds = functional.predict_on_batch(weights, x, False)
        values = (
            stacked.example_losses(loss_none, y, preds),
            stacked.correct_predictions(y, preds),
            tf.ones_like(y, tf.float32),
        )
        sums = [
            s
            + tf.math.unsorted_segment_sum(
                tf.cast(v, tf.float64), segments[t], num_clients + 1
            )
            for s, v in zip(sums, values)
        ]
      return tuple(s[:num_clients] for s in sums)  # Segment K: padding.

    self._outputs = self._metrics(
        *client_sums(self._slots_ph, self._segments_ph, self._clients_ph)
    )
    # Built on the first evaluate_personal (its vectorized_map takes seconds
    # to trace, and most runs have no personal models).
    self._personal_parts = (functional, loss_none, weights[1], x_all, y_all)
    self._personal_outputs = None

  def _metrics(self, loss_sum, hits, count):
    """The finalized metrics of per-client sums, named and typed as TFF's."""
    values = {
        'loss': tf.math.divide_no_nan(loss_sum, count),
        'accuracy': tf.math.divide_no_nan(hits, count),
    }
    outputs = collections.OrderedDict(
        (name, tf.cast(values[name], tf.float32)) for name in self._names[:-1]
    )
    outputs['num_examples'] = tf.cast(count, tf.int64)
    return outputs

  def _build_personal(self, functional, loss_none, non_trainable, x_all, y_all):
    """The graph of per-client weights: clients stacked, as in training."""
    self._personal_ph = tuple(
        tf.compat.v1.placeholder(
            t.dtype, [None] + t.shape.as_list(), 'personal'
        )
        for t in tf.nest.flatten(self._weights_ph.trainable)
    )
    self._client_rows_ph = tf.compat.v1.placeholder(
        tf.int64, [None, None, None], 'client_rows'
    )
    dummy = tf.shape(y_all, out_type=tf.int64)[0] - 1
    rnn_forward = self._rnn_forward

    def forward(w_stacked, x):
      """Predictions [K, b, ...] of each client's weights on its batch."""
      if rnn_forward is not None:
        return rnn_forward(w_stacked, x)
      return tf.vectorized_map(
          lambda a: functional.predict_on_batch(
              (list(a[0]), non_trainable), a[1], False
          ),
          (w_stacked, x),
          fallback_to_while_loop=True,
      )

    @tf.function
    def personal_sums(w_stacked, rows):
      """`(loss sum, hits, examples)` [K] float64 under each client's model."""
      sums = [tf.zeros([tf.shape(rows)[1]], tf.float64) for _ in range(3)]
      for t in tf.range(tf.shape(rows)[0]):
        valid = rows[t] >= 0
        slots = tf.where(valid, rows[t], dummy)
        y = tf.gather(y_all, slots)
        preds = forward(w_stacked, tf.gather(x_all, slots))
        values = (
            stacked.example_losses(loss_none, y, preds),
            stacked.correct_predictions(y, preds),
            tf.ones_like(y, tf.float32),
        )
        mask = tf.cast(valid, tf.float64)
        sums = [
            s + tf.reduce_sum(tf.cast(v, tf.float64) * mask, axis=1)
            for s, v in zip(sums, values)
        ]
      return tuple(sums)

    self._personal_outputs = self._metrics(
        *personal_sums(self._personal_ph, self._client_rows_ph)
    )

  # -------------------------------------------------------------------------
  # Running.

  def slots(self, sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The examples of clients of `sizes`, end to end, in forward passes.

    Returns:
      `(slots [S, batch_size] int64, segments [S, batch_size] int32)`: the
      row each slot reads (the dummy row `sum(sizes)` on padding) and its
      client (K on padding).
    """
    sizes = np.asarray(sizes, np.int64)
    total = int(sizes.sum())
    steps = max(1, -(-total // self.batch_size))
    rows = np.arange(steps * self.batch_size, dtype=np.int64)
    segments = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)
    padding = len(rows) - total
    slots = np.where(rows < total, rows, total)
    segments = np.concatenate(
        [segments, np.full([padding], len(sizes), np.int32)]
    )
    shape = [steps, self.batch_size]
    return slots.reshape(shape), segments.reshape(shape)

  def _feed(self, weights, examples: dict, sizes) -> dict:
    feed = dict(
        zip(tf.nest.flatten(self._weights_ph), tf.nest.flatten(weights))
    )
    feed.update(examples)
    slots, segments = self.slots(sizes)
    feed[self._slots_ph] = slots
    feed[self._segments_ph] = segments
    feed[self._clients_ph] = len(sizes)
    return feed

  def _check_preprocessing(self, probe_data: ClientData) -> None:
    """Checks, once, that the in-graph stream is the clients' own streams.

    On up to three clients with examples, end to end (one client alone
    would not tell a per-example map from, e.g., a `skip`).
    """
    arrays = batched.ClientArrays(probe_data)
    ids = [
        c
        for c in probe_data.client_ids[:20]
        if len(tf.nest.flatten(arrays.get(c))[0])
    ][:3] or list(probe_data.client_ids[:1])
    raw, _ = arrays.concatenate(ids)
    x_all, y_all = self._session.run(
        self._probe,
        dict(zip(tf.nest.flatten(self._raw_ph), tf.nest.flatten(raw))),
    )
    expected = [
        stacked._as_xy(e)  # pylint: disable=protected-access
        for c in ids
        for e in self._preprocess_eval(
            probe_data.create_tf_dataset_for_client(c)
        ).unbatch()
    ]
    same = len(expected) == len(y_all) - 1 and all(
        np.array_equal(x_all[i], x.numpy()) and np.array_equal(y_all[i], y)
        for i, (x, y) in enumerate(expected)
    )
    if not same:
      raise stacked.StackedEngineError(
          "the task's preprocess_eval is not of the form the engine "
          'evaluation reproduces (a per-example map, then a batch)'
      )

  def evaluate_chunk(
      self, weights, client_data: ClientData, client_ids: Sequence[str]
  ) -> dict[str, np.ndarray]:
    """The metrics of `client_ids` (one TensorFlow call), by name."""
    examples, offsets = self._chunk_feed(client_data, client_ids)
    feed = self._feed(weights, examples, np.diff(offsets))
    values, rows = self._session.run(
        (self._outputs, self._rows), feed_dict=feed
    )
    if rows != offsets[-1]:
      raise stacked.StackedEngineError(
          f"the task's preprocess_eval made {rows} examples of "
          f'{offsets[-1]}: the engine evaluation needs a per-example map'
      )
    return values

  def evaluate(
      self,
      weights,
      client_data: ClientData,
      client_ids: Optional[Sequence[str]] = None,
  ) -> dict[str, np.ndarray]:
    """Each client's metrics, as `evaluation.evaluate_clients` returns them.

    Args:
      weights: `tff.learning.models.ModelWeights` (or the same structure) of
        the model to evaluate.
      client_data: The split's clients.
      client_ids: The clients to evaluate, in order (default: all).

    Returns:
      Metric name -> array with one value per client (`{}` for no client).
    """
    ids = list(client_data.client_ids if client_ids is None else client_ids)
    parts = [
        self.evaluate_chunk(weights, client_data, ids[i : i + self.chunk_size])
        for i in range(0, len(ids), self.chunk_size)
    ]
    self._keep_within_budget()
    if not parts:
      return {}
    return {
        name: np.concatenate([p[name] for p in parts]) for name in self._names
    }

  def _split(self, client_data: ClientData) -> '_Split':
    split = self._splits.get(id(client_data))
    if split is None or split.client_data is not client_data:
      split = _Split(client_data, kept=self.cache_bytes > 0)
      self._splits[id(client_data)] = split
    return split

  def _raw_feed(self, raw) -> dict:
    return dict(zip(tf.nest.flatten(self._raw_ph), tf.nest.flatten(raw)))

  def _chunk_feed(
      self, client_data: ClientData, client_ids: Sequence[str]
  ) -> tuple[dict, np.ndarray]:
    """`(feed, offsets)`: the clients' examples end to end, as a feed.

    A kept split's clients are preprocessed once (one call for those not
    yet kept) and fed as examples; another split's are read and fed raw.
    """
    split = self._split(client_data)
    if not split.kept or (split.dummy is None and not client_ids):
      raw, offsets = batched.ClientArrays(client_data).concatenate(client_ids)
      return self._raw_feed(raw), offsets
    missing = [c for c in dict.fromkeys(client_ids) if c not in split.examples]
    if missing:
      raw, offsets = batched.ClientArrays(client_data).concatenate(missing)
      x_all, y_all = self._session.run(self._probe, self._raw_feed(raw))
      if len(y_all) - 1 != offsets[-1]:
        raise stacked.StackedEngineError(
            f"the task's preprocess_eval made {len(y_all) - 1} examples of "
            f'{offsets[-1]}: the engine evaluation needs a per-example map'
        )
      for c, a, b in zip(missing, offsets[:-1], offsets[1:]):
        split.examples[c] = (x_all[a:b], y_all[a:b])
      split.dummy = (x_all[-1:], y_all[-1:])
    parts = [split.examples[c] for c in client_ids] + [split.dummy]
    sizes = [len(y) for _, y in parts[:-1]]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    feed = {
        self._probe[0]: np.concatenate([x for x, _ in parts]),
        self._probe[1]: np.concatenate([y for _, y in parts]),
    }
    return feed, offsets

  def _keep_within_budget(self) -> None:
    """Stops keeping the largest splits until the kept ones fit."""
    kept = sorted(
        (s for s in self._splits.values() if s.kept), key=lambda s: s.nbytes
    )
    total = sum(s.nbytes for s in kept)
    while kept and total > self.cache_bytes:
      split = kept.pop()
      total -= split.nbytes
      self._splits[id(split.client_data)] = _Split(
          split.client_data, kept=False
      )

  @property
  def kept_bytes(self) -> int:
    """Bytes of the preprocessed examples kept between calls."""
    return sum(s.nbytes for s in self._splits.values() if s.kept)

  def client_rows(self, sizes: Sequence[int]) -> np.ndarray:
    """`[S, K, personal_batch_size]`: the row each client's slot reads.

    Client k's examples (rows after those of clients 0..k-1) in passes of
    `personal_batch_size`, padded with -1 to the longest client's passes.
    """
    sizes = np.asarray(sizes, np.int64)
    k = len(sizes)
    positions, _ = stacked.stream_layout(
        sizes,
        np.ones([k], np.int64),
        -np.ones([k], np.int64),
        self.personal_batch_size,
        shuffle=False,
    )
    base = np.concatenate([[0], np.cumsum(sizes)])[:-1]
    return np.where(positions >= 0, base[None, :, None] + positions, -1)

  def evaluate_personal(
      self,
      weights,
      client_states: Sequence[Any],
      client_data: ClientData,
      client_ids: Sequence[str],
  ) -> list[dict[str, np.ndarray]]:
    """Each client's G personal models on its data, in size groups.

    As `stateful.StatefulClientsProcess.evaluate_personal`: client k's
    model g is `client_states[k]['personal'][g]` (trainable weights) with
    the global model's non-trainable `weights`.

    Returns:
      One dict per client: metric name -> vector of its G models' values.
    """
    if not client_ids:
      return []
    if self._personal_outputs is None:
      with self._graph.as_default():  # pytype: disable=attribute-error
        self._build_personal(*self._personal_parts)
    _, offsets = self._chunk_feed(client_data, client_ids)
    sizes = np.diff(offsets)
    steps = -(-np.asarray(sizes, np.int64) // self.personal_batch_size)
    order, bounds = stacked.round_groups(steps, group_by_size=True)
    num_models = len(client_states[0]['personal'])
    values = {
        name: np.zeros([len(client_ids), num_models], np.float32)
        for name in self._names
    }
    values['num_examples'] = values['num_examples'].astype(np.int64)
    for a, b in zip(bounds[:-1], bounds[1:]):
      group = order[a:b]
      examples, offsets = self._chunk_feed(
          client_data, [client_ids[i] for i in group]
      )
      feed = self._feed(weights, examples, np.diff(offsets))
      feed[self._client_rows_ph] = self.client_rows(np.diff(offsets))
      for g in range(num_models):
        models = [
            tf.nest.flatten(client_states[i]['personal'][g]) for i in group
        ]
        for w, ph in enumerate(self._personal_ph):
          feed[ph] = np.stack([np.asarray(m[w]) for m in models])
        out = self._session.run(self._personal_outputs, feed_dict=feed)
        for name in self._names:
          values[name][group, g] = out[name]
    self._keep_within_budget()
    return [
        {name: values[name][k] for name in self._names}
        for k in range(len(client_ids))
    ]

  def close(self) -> None:
    self._splits.clear()
    self._session.close()


class _Split:
  """An evaluated split: its clients' preprocessed examples, if kept.

  Attributes:
    client_data: The split.
    kept: Its examples are kept between calls.
    examples: Client id -> its preprocessed `(x, y)` arrays (kept ones).
    dummy: One padding row `(x, y)`, as the graph's.
  """

  def __init__(self, client_data: ClientData, *, kept: bool):
    self.client_data = client_data
    self.kept = kept
    self.examples: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    self.dummy: Any = None

  @property
  def nbytes(self) -> int:
    return sum(x.nbytes + y.nbytes for x, y in self.examples.values())
