# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""A batched simulation engine: a whole round in one TensorFlow call.

TFF's local runtime pays a fixed cost per client and round (the client's
dataset graph is serialized to the worker and rebuilt, the computation is
dispatched, values are moved; about 20 ms per client here, see
docs/performance.md), and on small models that cost, not the arithmetic,
sets the speed. `BatchedEngine` runs a round of the same algorithm without
it: every selected client's local work and the server update happen in one
`tf.compat.v1.Session.run` of one graph, built once.

What is the same as the federated path (and tested equal to float tolerance
in tests/test_batched.py):

* the client math: the clients run the algorithms' own TensorFlow functions
  (`client_work.local_training`, `client_work.local_loss`,
  `q_ffl.q_ffl_client_message`, `quantiles.tf_weighted_quantile`,
  `delta_fl.keep_client`) on the task's own `VariableModel`;
* the data: each client's local stream is the task's own `preprocess_train`
  applied, inside the graph, to the client's raw examples, with the same
  epochs, shuffle seed and straggler truncation as
  the simulation loop's client datasets (a seeded tf.data shuffle depends
  only on its seed and input, so the batches are identical);
* the server: the weighted mean (`tff.aggregators.MeanFactory`), or the
  sums of q-FFL, then the algorithm's server optimizer, rejecting a
  non-finite update as `build_apply_optimizer_finalizer` does;
* the state: `next` takes and returns the process's own
  `LearningAlgorithmState` (global model and server-optimizer state), so
  checkpoints, evaluation and resumption are shared with the federated path.

What differs: clients run one after another inside the graph on one model
object (its metrics are reset per client and summed, as
`tff.learning.metrics.sum_then_finalize` does), and client updates are summed
in client order. This path is for simulation only; the `LearningProcess` is
what a production TFF pipeline runs.

Raw client examples are read once per client and cached (`ClientArrays`), so
a round costs O(selected clients), never O(population).

Every algorithm runs from its one definition of the round math
(`tff_algos.definition.AlgorithmDefinition`, made by the algorithm's module:
its `tff_algos.registry` entry's `definition`, built by
`BatchedAlgorithm.from_registry(name, client_learning_rate=..., **options)`;
any other definition by `BatchedAlgorithm.from_definition`); the engine has
no per-algorithm code and names no algorithm, and the stacked engine runs
the same definitions. Supported algorithms: every one registered with the
batched engine. FedAvg and FedProx
(`tff_algos.fed_prox`), q-FedAvg and q-FedSGD (`tff_algos.q_ffl`, Li et al.,
"Fair Resource Allocation in Federated Learning", ICLR 2020,
arXiv:1905.10497), Delta-FL with the exact
quantile (`tff_algos.delta_fl`, Pillutla et al., "Federated Learning with
Superquantile Aggregation for Heterogeneous Data", arXiv:2112.09429), TERM
(`tff_algos.term`, Li et al., "Tilted Empirical Risk Minimization", ICLR
2021, arXiv:2007.01162), AFL (`tff_algos.afl`, Mohri et al., ICML 2019: its
mixture is the server state, read from and written to the process state),
and Ditto and the Fed+ family (`tff_algos.ditto`, `tff_algos.fed_plus`),
whose personal models come in and go out with the round (`next(state, plan,
client_states)` returns a `stateful.StatefulOutput`, as their processes do).
Algorithms with client work of their own run the very function their TFF
builder's client computation calls (`AlgorithmDefinition.local_work`).
"""

import collections
from collections.abc import Callable, Mapping, Sequence
import dataclasses
from typing import Any, NamedTuple, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import client_work as client_work_lib
from tff_algos import definition as definition_lib
from tff_algos import options as options_lib
from tff_algos import registry
from tff_algos import stateful

ModelFn = Callable[[], tff.learning.models.VariableModel]


def _sgd(learning_rate: float) -> tff.learning.optimizers.Optimizer:
  return tff.learning.optimizers.build_sgdm(learning_rate=learning_rate)


@dataclasses.dataclass(frozen=True)
class BatchedAlgorithm:
  """The algorithm a `BatchedEngine` (or `StackedEngine`) runs.

  Made from an algorithm's registry entry (`from_registry`) or from any
  definition (`from_definition`).

  Attributes:
    name: The algorithm's name.
    definition_fn: Makes the algorithm's round math (its
      `definition.AlgorithmDefinition`, with its options).
    client_optimizer: The client optimizer (as given to the builder).
    server_optimizer: The server optimizer (None: SGD with lr 1.0, the
      builders' default; dropped when the definition has none).
    client_weighting: The weighting of the mean of client updates.
  """

  name: str
  definition_fn: Callable[[], definition_lib.AlgorithmDefinition]
  client_optimizer: tff.learning.optimizers.Optimizer
  server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None
  client_weighting: tff.learning.ClientWeighting = (
      tff.learning.ClientWeighting.NUM_EXAMPLES
  )

  @classmethod
  def from_definition(
      cls,
      name: str,
      definition_fn: Callable[[], definition_lib.AlgorithmDefinition],
      *,
      client_optimizer: tff.learning.optimizers.Optimizer,
      server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
      client_weighting: tff.learning.ClientWeighting = (
          tff.learning.ClientWeighting.NUM_EXAMPLES
      ),
  ) -> 'BatchedAlgorithm':
    """The algorithm whose round math `definition_fn` makes.

    As an algorithm's `tff_algos.registry` entry gives it (its `definition`
    with its options); the server optimizer is dropped when the definition
    has none of its own.
    """
    algorithm = cls(
        name,
        definition_fn,
        client_optimizer,
        server_optimizer,
        client_weighting,
    )
    if not algorithm.definition().server_optimizer:
      algorithm = dataclasses.replace(algorithm, server_optimizer=None)
    return algorithm

  @classmethod
  def from_registry(
      cls,
      name: str,
      *,
      client_learning_rate: float,
      client_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
      optimizer_fn: Callable[[float], tff.learning.optimizers.Optimizer] = _sgd,
      server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None,
      client_weighting: tff.learning.ClientWeighting = (
          tff.learning.ClientWeighting.NUM_EXAMPLES
      ),
      num_clients: int = 0,
      **options: Any,
  ) -> 'BatchedAlgorithm':
    """The registered algorithm `name` with these options and settings.

    For example `from_registry('fedprox', client_learning_rate=0.1,
    proximal_strength=0.5)`.

    Args:
      name: A name of `tff_algos.registry`.
      client_learning_rate: The client learning rate (the step of
        algorithms with plain local steps, AFL's gamma_w, q-FFL's default L
        = 1 / lr).
      client_optimizer: The client optimizer (None:
        `optimizer_fn(client_learning_rate)`).
      optimizer_fn: The client optimizer's kind at a learning rate (SGD
        unless given; Ditto's personal optimizer).
      server_optimizer: As `from_definition`'s.
      client_weighting: As `from_definition`'s.
      num_clients: The population (AFL's mixture size).
      **options: The algorithm's options by name (the fields of its
        registry entry's options class, e.g. `fed_prox.FedProxOptions`).

    Returns:
      A validated `BatchedAlgorithm`.

    Raises:
      options.OptionError: An unknown algorithm, an option of another
        algorithm, a value out of range, or options the batched and
        stacked engines do not run.
      TypeError, ValueError: An option no algorithm has, or a bad setting.
    """
    entry = registry.get(name)
    values = registry.options_from_values(name, options)
    values.check_engine('batched')
    if client_optimizer is None:
      client_optimizer = optimizer_fn(client_learning_rate)
    context = options_lib.Context(
        client_optimizer=client_optimizer,
        client_learning_rate=client_learning_rate,
        optimizer_fn=optimizer_fn,
        server_optimizer=server_optimizer,
        client_weighting=client_weighting,
        num_clients=num_clients,
    )
    algorithm = cls.from_definition(
        name,
        lambda: entry.definition(values, context),
        client_optimizer=client_optimizer,
        server_optimizer=server_optimizer,
        client_weighting=client_weighting,
    )
    algorithm.validate()
    return algorithm

  def validate(self) -> None:
    """Raises `TypeError`/`ValueError` for an unsupported configuration."""
    if not callable(self.definition_fn):
      raise TypeError(
          'definition_fn must be a callable returning an AlgorithmDefinition'
      )
    for label, opt in (
        ('client_optimizer', self.client_optimizer),
        ('server_optimizer', self.server_optimizer),
    ):
      if opt is not None and not isinstance(
          opt, tff.learning.optimizers.Optimizer
      ):
        raise TypeError(
            f'{label} must be a tff.learning.optimizers.Optimizer,'
            f' got {type(opt).__name__}'
        )
    if self.client_optimizer is None:
      raise TypeError('client_optimizer is required')
    if not isinstance(self.client_weighting, tff.learning.ClientWeighting):
      raise TypeError(
          'client_weighting must be a tff.learning.ClientWeighting'
          f', got {self.client_weighting!r}'
      )
    self.definition()  # The definition's own checks (TypeError/ValueError).

  def definition(self) -> definition_lib.AlgorithmDefinition:
    """The algorithm's round math (`definition_fn()`)."""
    return self.definition_fn()

  @property
  def server(self) -> tff.learning.optimizers.Optimizer:
    fixed = self.definition().fixed_server_optimizer
    if fixed is not None:  # E.g. AFL's SGD with gamma_w.
      return fixed
    if self.server_optimizer is None:
      return tff.learning.optimizers.build_sgdm(learning_rate=1.0)
    return self.server_optimizer


class ClientArrays:
  """Each client's raw training examples as NumPy arrays, read once.

  `get(client_id)` reads the client's raw `tf.data.Dataset` (the
  `ClientData` element structure) the first time and caches it; nothing is
  done per round for clients that are not selected.
  """

  def __init__(self, client_data: tff.simulation.datasets.ClientData):
    self._client_data = client_data
    self._cache: dict[str, Any] = {}
    self.element_spec = client_data.element_type_structure

  def get(self, client_id: str):
    """The client's batches as arrays, built once and cached."""
    if client_id not in self._cache:
      ds = self._client_data.create_tf_dataset_for_client(client_id)
      arrays = None
      for arrays in ds.batch(2**31 - 1).take(1):
        arrays = tf.nest.map_structure(lambda t: t.numpy(), arrays)
      if arrays is None:  # An empty client.
        arrays = tf.nest.map_structure(
            lambda s: np.zeros([0] + s.shape.as_list(), s.dtype.as_numpy_dtype),
            self.element_spec,
        )
      self._cache[client_id] = arrays
    return self._cache[client_id]

  def preload(self, client_ids: Sequence[str]) -> None:
    """Reads these clients now (O(len(client_ids)), once), not on demand."""
    for cid in client_ids:
      self.get(cid)

  def __len__(self) -> int:
    return len(self._cache)

  def concatenate(self, client_ids: Sequence[str]):
    """`(flat arrays, offsets)`: the clients' examples end to end."""
    parts = [self.get(cid) for cid in client_ids]
    sizes = [len(tf.nest.flatten(p)[0]) for p in parts]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    flat = tf.nest.map_structure(lambda *xs: np.concatenate(xs, 0), *parts)
    return flat, offsets


@dataclasses.dataclass(frozen=True)
class RoundPlan:
  """What each selected client does in a round (as the federated path).

  Attributes:
    client_ids: The participants, in order.
    epochs: Local epochs of each.
    shuffle_seeds: The tf.data shuffle seed of each (None: no shuffle).
    max_batches: Batches each may run (-1: all; stragglers' truncation).
    client_indices: Each one's index in the population (needed by a
      definition with a server state, e.g. AFL's mixture).
  """

  client_ids: Sequence[str]
  epochs: Sequence[int]
  shuffle_seeds: Optional[Sequence[int]]
  max_batches: Sequence[int]
  client_indices: Optional[Sequence[int]] = None


def _placeholders(structure, prefix: str):
  return tf.nest.map_structure(
      lambda s: tf.compat.v1.placeholder(s.dtype, s.shape, name=f'{prefix}_ph'),
      structure,
  )


def _nest_add(a, b):
  return tf.nest.map_structure(lambda x, y: x + tf.cast(y, x.dtype), a, b)


def state_placeholders(definition, trainable_specs):
  """`(personal, server_state, client_indices)` placeholders of a definition.

  `personal` is G tuples (one per personal model) of `[K, ...]` weights;
  the others are `()` / a `[K]` int32 placeholder when unused.
  """
  personal = tuple(
      tuple(
          tf.compat.v1.placeholder(
              s.dtype, [None] + s.shape.as_list(), f'personal_{g}'
          )
          for s in trainable_specs
      )
      for g in range(definition.personal_models)
  )
  server_state = ()
  if definition.server_state is not None:
    spec = definition.server_state.spec
    server_state = tf.compat.v1.placeholder(
        spec.dtype, spec.shape, 'server_state'
    )
  indices = tf.compat.v1.placeholder(tf.int32, [None], 'client_indices')
  return personal, server_state, indices


def server_rule(
    definition, w0, vector_sum, scalar_sum, vectors
) -> definition_lib.ServerOutput:
  """The definition's server rule, as a `ServerOutput`."""
  if definition.server_sees_clients:
    out = definition.server(w0, vector_sum, scalar_sum, vectors)
  else:
    out = definition.server(w0, vector_sum, scalar_sum)
  if isinstance(out, definition_lib.ServerOutput):
    return out
  return definition_lib.ServerOutput(out, collections.OrderedDict())


def _any_non_finite(structure):
  flat = tf.nest.flatten(structure)
  return tf.logical_not(
      tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in flat])
  )


def server_step(server_opt, opt_state, trainable, update):
  """The optimizer step; a non-finite update is rejected (no change)."""
  trainable = tuple(trainable)
  new_state, new_trainable = server_opt.next(
      opt_state, trainable, tuple(tf.nest.flatten(update))
  )
  bad = _any_non_finite(update)
  new_trainable = tf.nest.map_structure(
      lambda n, o: tf.where(bad, o, n), tuple(new_trainable), trainable
  )
  new_state = tf.nest.map_structure(
      lambda n, o: tf.where(bad, o, n), new_state, opt_state
  )
  return new_state, new_trainable, bad


class RoundSums(NamedTuple):
  """What a round's clients gave, summed (both engines build one)."""

  context: Mapping[str, Any]  # The round context (`definition.prepare`).
  losses: Any  # [K] losses of the loss pass or the work (None: no pass).
  num_clients: Any
  client_counts: tuple[Any, ...]  # The definition's, summed.
  vector_sum: tuple[Any, ...]
  scalar_sum: Any
  client_vectors: Any  # [K, ...] vectors the server sees (or None).


def finish_round(
    definition,
    server_opt,
    w0,
    opt_state,
    sums: RoundSums,
    server_state,
    indices,
):
  """The round's server part, the same in both engines.

  The definition's round metrics and counts, its server-state update, its
  server rule and, with a server optimizer, the step (a non-finite update
  rejected). Returns `(trainable, opt_state, extra metrics, server state)`.
  """
  extra = collections.OrderedDict(
      definition.metrics(
          sums.context, sums.losses, sums.scalar_sum, sums.num_clients
      )
  )
  extra.update(zip(definition.client_counts, sums.client_counts))
  new_server_state = ()
  if definition.server_state is not None:
    new_server_state, state_metrics = definition.server_state.update(
        server_state, sums.losses, indices
    )
    extra.update(state_metrics)
  result = server_rule(
      definition, w0, sums.vector_sum, sums.scalar_sum, sums.client_vectors
  )
  extra.update(result.metrics)
  trainable = tuple(result.result)
  if definition.server_optimizer:
    opt_state, trainable, bad = server_step(
        server_opt, opt_state, w0, trainable
    )
    extra['update_non_finite'] = tf.cast(bad, tf.int32)
  return trainable, opt_state, extra, new_server_state


class _ClientPasses:
  """One client's passes in the batched engine's round graph (a client
  after another, each through the task's own tf.data pipeline).

  `streams` is `(raw, offsets, seeds, epochs, takes)`: every client's raw
  examples concatenated, client k's slice `offsets[k]:offsets[k + 1]`, its
  shuffle seed, epochs and batches to take.
  """

  def __init__(
      self,
      model,
      preprocess_train,
      definition,
      client_optimizer,
      *,
      shuffle: bool,
      loop_implementation,
  ):
    self._model = model
    self._preprocess = preprocess_train
    self._definition = definition
    self._optimizer = client_optimizer
    self._shuffle = shuffle
    self._loop = loop_implementation

  def dataset(self, streams, k):
    """Client k's training stream (its first shuffle order)."""
    raw, offsets, seeds, epochs, takes = streams
    examples = tf.nest.map_structure(
        lambda t: t[offsets[k] : offsets[k + 1]], raw
    )
    ds = tf.data.Dataset.from_tensor_slices(examples)
    ds = self._preprocess(ds, epochs[k], seeds[k] if self._shuffle else None)
    return ds.take(takes[k])

  def broadcast_losses(self, weights, streams):
    """Each client's `(loss, examples)` at `weights`, clients in order."""
    num_clients = tf.size(streams[2])
    losses = tf.TensorArray(tf.float32, size=num_clients)
    counts = tf.TensorArray(tf.int64, size=num_clients)
    for k in tf.range(num_clients):
      ds = self.dataset(streams, k)
      self._model.reset_metrics()
      loss, n = client_work_lib.local_loss(
          self._model, weights, ds, loop_implementation=self._loop
      )
      losses = losses.write(k, loss)
      counts = counts.write(k, n)
    return losses.stack(), counts.stack()

  def work(self, weights, streams, k, context, loss, count, personal):
    """Client k's work: `(loss, count, LocalWork)`.

    Training reads a fresh copy of the stream (first shuffle order), as the
    federated path's computations each rebuild the dataset, unless the
    definition's loss pass is continued by training (`loss`, `count`: the
    fresh pass's, or None).
    """
    definition, model = self._definition, self._model
    ds = self.dataset(streams, k)
    model.reset_metrics()
    if definition.loss_pass == 'continued':
      loss, count = client_work_lib.local_loss(
          model, weights, ds, loop_implementation=self._loop
      )
      # `ds` again, its iterator created after `loss` (see the class doc).
      with tf.control_dependencies([loss]):
        variant = tf.identity(tf.data.experimental.to_variant(ds))
      ds = tf.data.experimental.from_variant(variant, ds.element_spec)
    if definition.trains is not None:
      # A filtered-out client does no work: its stream is cut to no batch
      # (no step, no metric update, a zero delta), as the federated path's
      # skip branch.
      kept = definition.trains(context, loss)
      ds = ds.take(tf.where(kept, tf.constant(-1, tf.int64), 0))
    if definition.local_work is None:
      delta, n, non_finite = client_work_lib.local_training(
          model,
          self._optimizer,
          weights,
          ds,
          proximal_strength=definition.proximal_strength,
          weight_decay=definition.weight_decay,
          loop_implementation=self._loop,
      )
      work = definition_lib.LocalWork(
          tuple(tf.nest.flatten(delta)), n, non_finite
      )
    else:
      work = definition.local_work(model, weights, ds, personal, self._loop)
      if definition.loss_pass == 'work':
        loss, count = work.loss, work.num_examples
    return loss, count, work


def _round_function(
    model, clients, definition, server_opt, trainable_specs, metric_specs
):
  """The round as one `tf.function` of (weights, server-optimizer state,
  client streams, personal models, server state, client indices): every
  client's passes and work in client order, their sums, the server step."""
  pass_kind = definition.loss_pass  # A Python string: static branches.
  sees_clients = definition.server_sees_clients

  def zeros(specs):
    return tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), specs)

  def client_arrays(specs, size):
    return tuple(tf.TensorArray(s.dtype, size=size) for s in specs)

  @tf.function
  def round_fn(weights, opt_state, streams, personal, server_state, indices):
    weights = tff.learning.models.ModelWeights(
        trainable=list(tf.nest.flatten(weights.trainable)),
        non_trainable=list(tf.nest.flatten(weights.non_trainable)),
    )
    num_clients = tf.size(streams[2])
    losses = counts = None
    if pass_kind == 'fresh':
      losses, counts = clients.broadcast_losses(weights, streams)
    context = definition.prepare(losses, counts)
    if definition.server_state is not None:
      context = dict(context, server_state=server_state)
    # Per-client outputs, collected only when the definition has them: the
    # continued pass's or the work's losses, the new personal models, the
    # vectors the server sees.
    collect_losses = pass_kind in ('continued', 'work')
    loss_list = (
        (tf.TensorArray(tf.float32, size=num_clients),)
        if collect_losses
        else ()
    )
    new_personal = tuple(
        client_arrays(trainable_specs, num_clients)
        for _ in range(definition.personal_models)
    )
    vector_list = (
        (client_arrays(trainable_specs, num_clients),) if sees_clients else ()
    )
    client_counts = tuple(
        tf.constant(0, tf.int32) for _ in definition.client_counts
    )
    vector_sum = zeros(trainable_specs)
    scalar_sum = tf.constant(0.0)
    metrics = zeros(metric_specs)
    for k in tf.range(num_clients):
      loss, count = None, None
      if pass_kind == 'fresh':
        loss, count = losses[k], counts[k]
      client_personal = tuple(tuple(w[k] for w in p) for p in personal)
      loss, count, work = clients.work(
          weights, streams, k, context, loss, count, client_personal
      )
      client_context = context
      if definition.server_state is not None:
        client_context = dict(context, client_index=indices[k])
      vector, scalar = definition.client_result(
          client_context,
          loss,
          count,
          work.vector,
          work.num_examples,
          work.non_finite,
      )
      if collect_losses:
        loss_list = (loss_list[0].write(k, loss),)
      new_personal = tuple(
          tuple(ta.write(k, v) for ta, v in zip(tas, p))
          for tas, p in zip(new_personal, work.personal)
      )
      if sees_clients:
        vector_list = (
            tuple(ta.write(k, v) for ta, v in zip(vector_list[0], vector)),
        )
      client_counts = tuple(
          total + work.client_counts[name]
          for total, name in zip(client_counts, definition.client_counts)
      )
      if definition.weighted:
        vector = tuple(v * scalar for v in vector)
      vector_sum = tuple(a + v for a, v in zip(vector_sum, vector))
      scalar_sum += scalar
      model_metrics = work.model_metrics
      if model_metrics is None:
        model_metrics = model.report_local_unfinalized_metrics()
      metrics = _nest_add(metrics, model_metrics)
    if collect_losses:
      losses = loss_list[0].stack()
    trainable, new_opt_state, extra, new_server_state = finish_round(
        definition,
        server_opt,
        tuple(weights.trainable),
        opt_state,
        RoundSums(
            context,
            losses,
            num_clients,
            client_counts,
            vector_sum,
            scalar_sum,
            tuple(ta.stack() for ta in vector_list[0])
            if sees_clients
            else None,
        ),
        server_state,
        indices,
    )
    stacked_personal = tuple(
        tuple(ta.stack() for ta in tas) for tas in new_personal
    )
    return (
        trainable,
        new_opt_state,
        metrics,
        extra,
        stacked_personal,
        new_server_state,
    )

  return round_fn


class BatchedEngine:
  """Runs rounds of a supported algorithm in one TensorFlow call each.

  Usage with a process built by the matching builder:

    engine = BatchedEngine(task.model_fn, task.preprocess_train,
                           ClientArrays(task.train_data), algorithm)
    state = process.initialize()
    state, metrics = engine.next(state, plan)

  `next` returns the process's state type, updated as `process.next` would,
  and metrics shaped like `process.next`'s (`client_work/train/...`).

  Loops: client streams are iterated with `loop_implementation`, by
  default `DATASET_ITERATOR`. Inside the engine's while loop it is several
  times faster than `DATASET_REDUCE`, whose reduce function is instantiated
  once per client. The batches, and so the result, are the same with
  either.

  q-FFL trains on the same dataset object that its loss pass read, so a
  seeded `reshuffle_each_iteration` shuffle gives training the next order.
  That holds only if the training iterator is created after the loss pass.
  Within one graph nothing orders two passes over one dataset: in TF 2.14 an
  iterator op was seen to run before an earlier `reduce`. The engine
  therefore makes the training stream depend on the loss.
  """

  def __init__(
      self,
      model_fn: ModelFn,
      preprocess_train: Callable[..., tf.data.Dataset],
      client_arrays: ClientArrays,
      algorithm: BatchedAlgorithm,
      *,
      shuffle: bool = True,
      loop_implementation: tff.learning.LoopImplementation = (
          tff.learning.LoopImplementation.DATASET_ITERATOR
      ),
      session_config: Optional[tf.compat.v1.ConfigProto] = None,
  ):
    if not callable(model_fn) or not callable(preprocess_train):
      raise TypeError('model_fn and preprocess_train must be callables')
    if not isinstance(client_arrays, ClientArrays):
      raise TypeError(
          'client_arrays must be a ClientArrays, got '
          f'{type(client_arrays).__name__}'
      )
    if not isinstance(algorithm, BatchedAlgorithm):
      raise TypeError(
          'algorithm must be a BatchedAlgorithm, got '
          f'{type(algorithm).__name__}'
      )
    algorithm.validate()
    self.algorithm = algorithm
    self.definition = algorithm.definition()  # Built once, not per round.
    self.client_arrays = client_arrays
    self._shuffle = bool(shuffle)
    self._graph = tf.Graph()
    with self._graph.as_default():  # pytype: disable=attribute-error
      self._build(model_fn, preprocess_train, loop_implementation)
      init_ops = [
          tf.compat.v1.global_variables_initializer(),
          tf.compat.v1.local_variables_initializer(),
          tf.compat.v1.tables_initializer(),
      ]
    self._session = tf.compat.v1.Session(
        graph=self._graph, config=session_config
    )
    self._session.run(init_ops)
    self._graph.finalize()

  # -------------------------------------------------------------------------
  # Graph construction.

  def _build(self, model_fn, preprocess_train, loop_implementation):
    alg = self.algorithm
    model = model_fn()
    if not isinstance(model, tff.learning.models.VariableModel):
      raise TypeError(
          'model_fn must return a tff.learning.models.'
          f'VariableModel, got {type(model).__name__}'
      )
    model_weights = tff.learning.models.ModelWeights.from_model(model)
    weight_specs = tf.nest.map_structure(
        lambda v: tf.TensorSpec(v.shape, v.dtype), model_weights
    )
    server_opt = alg.server
    trainable_specs = tuple(tf.nest.flatten(weight_specs.trainable))
    opt_state_specs = tf.nest.map_structure(
        lambda t: tf.TensorSpec(t.shape, t.dtype),
        tf.nest.map_structure(
            tf.convert_to_tensor, server_opt.initialize(trainable_specs)
        ),
    )
    definition = self.definition
    if not definition.server_optimizer:  # E.g. q-FFL's finalizer.
      opt_state_specs = ()
    raw_specs = tf.nest.map_structure(
        lambda s: tf.TensorSpec([None] + s.shape.as_list(), s.dtype),
        self.client_arrays.element_spec,
    )

    self._weights_ph = _placeholders(weight_specs, 'weights')
    self._opt_state_ph = _placeholders(opt_state_specs, 'server_opt')
    self._raw_ph = _placeholders(raw_specs, 'raw')
    self._offsets_ph = tf.compat.v1.placeholder(tf.int64, [None], 'offsets')
    self._seeds_ph = tf.compat.v1.placeholder(tf.int64, [None], 'seeds')
    self._epochs_ph = tf.compat.v1.placeholder(tf.int64, [None], 'epochs')
    self._takes_ph = tf.compat.v1.placeholder(tf.int64, [None], 'takes')
    self._personal_ph, self._server_state_ph, self._indices_ph = (
        state_placeholders(definition, trainable_specs)
    )
    metric_specs = tf.nest.map_structure(
        lambda t: tf.TensorSpec(t.shape, t.dtype),
        model.report_local_unfinalized_metrics(),
    )
    clients = _ClientPasses(
        model,
        preprocess_train,
        definition,
        alg.client_optimizer,
        shuffle=self._shuffle,
        loop_implementation=loop_implementation,
    )
    round_fn = _round_function(
        model, clients, definition, server_opt, trainable_specs, metric_specs
    )

    trainable, opt_state, metric_sums, extra, personal, server_state = round_fn(
        self._weights_ph,
        self._opt_state_ph,
        (
            self._raw_ph,
            self._offsets_ph,
            self._seeds_ph,
            self._epochs_ph,
            self._takes_ph,
        ),
        self._personal_ph,
        self._server_state_ph,
        self._indices_ph,
    )
    # sum_then_finalize: the finalizers run on the summed unfinalized values
    # (outside the tf.function: Keras finalizers create variables).
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
    self._weight_specs = weight_specs
    self._opt_state_specs = opt_state_specs

  # -------------------------------------------------------------------------
  # Running.

  def run_round(
      self,
      weights,
      server_state,
      plan: RoundPlan,
      client_states=None,
      extra_state=None,
  ):
    """One round on raw values: `(trainable, server_state, train, extra)`.

    With personal models or a definition's server state, two more
    outputs follow: the clients' new states and the new server state.

    Args:
      weights: `ModelWeights` (or a structure matching it) of NumPy arrays.
      server_state: The server optimizer's state (`()` for q-FFL).
      plan: The round's participants and their data settings.
      client_states: The participants' states (personal models), in order.
      extra_state: The definition's server state (e.g. AFL's mixture).
    """
    if not plan.client_ids:
      raise ValueError('a round needs at least one client')
    raw, offsets = self.client_arrays.concatenate(plan.client_ids)
    seeds = (
        plan.shuffle_seeds
        if plan.shuffle_seeds is not None
        else [0] * len(plan.client_ids)
    )
    feed = weights_and_state_feed(
        self._weights_ph, self._opt_state_ph, weights, server_state
    )
    feed.update(zip(tf.nest.flatten(self._raw_ph), tf.nest.flatten(raw)))
    feed[self._offsets_ph] = offsets
    feed[self._seeds_ph] = np.asarray(seeds, np.int64)
    feed[self._epochs_ph] = np.asarray(plan.epochs, np.int64)
    feed[self._takes_ph] = np.asarray(plan.max_batches, np.int64)
    feed.update(
        client_state_feed(
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
        run_outputs(self.definition, self._outputs, self._state_outputs),
        feed_dict=feed,
    )

  def next(self, state, plan: RoundPlan, client_states=None) -> Any:
    """`process.next` on the process's state.

    Returns:
      `(new_state, metrics)`; for a definition with personal models (Ditto,
      Fed+), a `stateful.StatefulOutput(state, client_states, metrics)` as
      the `StatefulClientsProcess` returns, given the participants'
      `client_states`.
    """
    return apply_round(
        self.definition, state, plan, client_states, self.run_round
    )

  def close(self) -> None:
    self._session.close()


def weights_and_state_feed(
    weights_ph, opt_state_ph, weights, server_state
) -> dict:
  """The feed of an engine's weights and server-optimizer placeholders."""
  feed = dict(zip(tf.nest.flatten(weights_ph), tf.nest.flatten(weights)))
  flat_state = tf.nest.flatten(server_state)
  state_phs = tf.nest.flatten(opt_state_ph)
  if len(flat_state) != len(state_phs):
    raise ValueError(
        f"the server state has {len(flat_state)} tensors, the engine's "
        f'server optimizer {len(state_phs)}: build the engine with the '
        "process's server optimizer"
    )
  feed.update(zip(state_phs, flat_state))
  return feed


def metrics_as_mapping(metrics: Mapping[str, Any]) -> dict[str, Any]:
  """Plain dicts of the engine's metrics (for logging)."""
  return {
      k: (metrics_as_mapping(v) if isinstance(v, Mapping) else v)
      for k, v in metrics.items()
  }


def client_state_feed(
    definition,
    personal_ph,
    server_state_ph,
    indices_ph,
    plan: RoundPlan,
    client_states,
    extra_state,
) -> dict:
  """The feed of the personal-model, server-state and index placeholders."""
  feed = {}
  k = len(plan.client_ids)
  if definition.personal_models:
    if client_states is None or len(client_states) != k:
      raise ValueError(
          f'{definition.name} keeps client states: pass the {k} '
          "participants' states (client_states)"
      )
    for g, phs in enumerate(personal_ph):
      models = [list(tf.nest.flatten(c['personal'][g])) for c in client_states]
      for w, ph in enumerate(phs):
        feed[ph] = np.stack([m[w] for m in models])
  elif client_states is not None:
    raise ValueError(f'{definition.name} keeps no client states')
  if definition.server_state is not None:
    if plan.client_indices is None or len(plan.client_indices) != k:
      raise ValueError(
          f"{definition.name} needs the clients' indices in the plan "
          '(RoundPlan.client_indices)'
      )
    feed[server_state_ph] = np.asarray(extra_state)
  indices = plan.client_indices if plan.client_indices is not None else [0] * k
  feed[indices_ph] = np.asarray(indices, np.int32)
  return feed


def run_outputs(definition, outputs, state_outputs):
  """What a round fetches: the outputs, plus the states when there are any."""
  if definition.personal_models or definition.server_state is not None:
    return tuple(outputs) + tuple(state_outputs)
  return outputs


def _get(state, name):
  return state[name] if isinstance(state, Mapping) else getattr(state, name)


def _replace(state, **fields):
  if isinstance(state, Mapping):
    new = collections.OrderedDict(state)
    new.update(fields)
    return new
  return state._replace(**fields)


def _metric_groups(extra):
  """Splits round metrics into the process's `client_work`, `aggregator`
  and `finalizer` groups (a key `group/name` names its group)."""
  groups = collections.OrderedDict(
      client_work=collections.OrderedDict(),
      aggregator=collections.OrderedDict(),
      finalizer=collections.OrderedDict(),
  )
  for key, value in extra.items():
    group, _, name = key.partition('/')
    if name and group in groups:
      groups[group][name] = value
    elif key in ('update_non_finite', 'h_sum'):
      groups['finalizer'][key] = value
    else:
      groups['client_work'][key] = value
  return groups


def apply_round(definition, state, plan, client_states, run_round) -> Any:
  """`process.next`'s result from an engine's `run_round`.

  Shared by the batched and stacked engines: the new global trainable
  weights, server-optimizer state and the definition's server state go into
  the process's own state (a `LearningAlgorithmState`, or a stateful
  process's mapping), and the round's metrics are split into the groups the
  federated path reports. With personal models the result is a
  `stateful.StatefulOutput` with the clients' new states.
  """
  weights = _get(state, 'global_model_weights')
  extra_state = None
  if definition.server_state is not None:
    extra_state = _get(state, definition.server_state.key)
  outputs = run_round(
      weights,
      _get(state, 'finalizer') if definition.server_optimizer else (),
      plan,
      client_states,
      extra_state,
  )
  trainable, opt_state, train, extra = outputs[:4]
  non_trainable = (
      weights.non_trainable
      if hasattr(weights, 'non_trainable')
      else weights['non_trainable']
  )
  fields = {
      'global_model_weights': tff.learning.models.ModelWeights(
          trainable=trainable, non_trainable=non_trainable
      )
  }
  if definition.server_optimizer:
    fields['finalizer'] = tf.nest.pack_sequence_as(
        _get(state, 'finalizer'), tf.nest.flatten(opt_state)
    )
  if definition.server_state is not None:
    fields[definition.server_state.key] = outputs[5]
  new_state = _replace(state, **fields)
  groups = _metric_groups(extra)
  metrics = collections.OrderedDict(
      client_work=collections.OrderedDict(train=train, **groups['client_work'])
  )
  if groups['aggregator']:
    metrics['aggregator'] = groups['aggregator']
  metrics['finalizer'] = groups['finalizer']
  if not definition.personal_models:
    return new_state, metrics
  personal = outputs[4]
  new_client_states = [
      collections.OrderedDict(
          personal=tuple(
              [np.asarray(w[k]) for w in model] for model in personal
          )
      )
      for k in range(len(plan.client_ids))
  ]
  return stateful.StatefulOutput(new_state, new_client_states, metrics)
