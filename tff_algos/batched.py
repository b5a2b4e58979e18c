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
  `run.simulation.client_datasets` (a seeded tf.data shuffle depends only on
  its seed and input, so the batches are identical);
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
(`tff_algos.definition.AlgorithmDefinition`, made by the algorithm's module
and listed in `DEFINITIONS`); the engine has no per-algorithm code, and the
stacked engine runs the same definitions. Supported algorithms: FedAvg and
FedProx (`tff_algos.fed_prox`), q-FedAvg
(`tff_algos.q_ffl`, Li et al., "Fair Resource Allocation in Federated
Learning", ICLR 2020, arXiv:1905.10497) and Delta-FL with the exact quantile
(`tff_algos.delta_fl`, Pillutla et al., "Federated Learning with
Superquantile Aggregation for Heterogeneous Data", arXiv:2112.09429)
and TERM (`tff_algos.term`, Li et al., "Tilted Empirical Risk
Minimization", ICLR 2021, arXiv:2007.01162): each client's loss at the
broadcast model, then local training on a fresh copy of its stream (the
federated path's two client computations each rebuild the dataset), and the
deltas averaged with `term.tilted_weight`.
"""

import collections
from collections.abc import Callable, Mapping, Sequence
import dataclasses
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import client_work as client_work_lib
from tff_algos import definition as definition_lib
from tff_algos import delta_fl
from tff_algos import fed_prox
from tff_algos import q_ffl
from tff_algos import term as term_lib

ModelFn = Callable[[], tff.learning.models.VariableModel]

# Each algorithm's one definition of its round math (in its own module), from
# a `BatchedAlgorithm`'s hyperparameters. Adding an algorithm to both engines
# is adding its definition here.
DEFINITIONS: Mapping[
    str, Callable[['BatchedAlgorithm'], definition_lib.AlgorithmDefinition]
] = {
    'fedavg': lambda a: fed_prox.engine_definition(
        client_weighting=a.client_weighting,
        proximal_strength=a.proximal_strength,
        name='fedavg',
    ),
    'fedprox': lambda a: fed_prox.engine_definition(
        client_weighting=a.client_weighting,
        proximal_strength=a.proximal_strength,
    ),
    'qffl': lambda a: q_ffl.engine_definition(
        q=a.q, lipschitz_constant=a.lipschitz_constant
    ),
    'deltafl': lambda a: delta_fl.engine_definition(
        theta=a.theta,
        strict_filter=a.strict_filter,
        uniform_weights=a.uniform_weights,
        weight_decay=a.weight_decay,
    ),
    'term': lambda a: term_lib.engine_definition(
        tilt=a.tilt, proximal_strength=a.proximal_strength
    ),
}
ALGORITHMS = tuple(DEFINITIONS)


@dataclasses.dataclass(frozen=True)
class BatchedAlgorithm:
  """The algorithm a `BatchedEngine` runs, with its hyperparameters.

  Attributes:
    name: One of `ALGORITHMS`.
    client_optimizer: The client optimizer (as given to the builder).
    server_optimizer: The server optimizer (None: SGD with lr 1.0, the
      builders' default). Unused by q-FFL.
    client_weighting: FedAvg/FedProx weighting.
    proximal_strength: FedProx's (and TERM's) mu.
    q: q-FFL's q.
    lipschitz_constant: q-FFL's L.
    theta: Delta-FL's conformity level.
    strict_filter: Delta-FL's `F_k > eta` rule.
    uniform_weights: Delta-FL's workshop weighting.
    weight_decay: Delta-FL's local weight decay.
    tilt: TERM's t.
  """

  name: str
  client_optimizer: tff.learning.optimizers.Optimizer
  server_optimizer: Optional[tff.learning.optimizers.Optimizer] = None
  client_weighting: tff.learning.ClientWeighting = (
      tff.learning.ClientWeighting.NUM_EXAMPLES
  )
  proximal_strength: float = 0.0
  q: float = 0.0
  lipschitz_constant: float = 1.0
  theta: float = 1.0
  strict_filter: bool = False
  uniform_weights: bool = False
  weight_decay: float = 0.0
  tilt: float = 0.0

  def validate(self) -> None:
    """Raises `TypeError`/`ValueError` for an unsupported configuration."""
    if self.name not in DEFINITIONS:
      raise ValueError(
          f'the batched engine supports {", ".join(DEFINITIONS)}, not '
          f'{self.name!r}'
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
    for label in ('proximal_strength', 'q', 'weight_decay'):
      value = getattr(self, label)
      if not (np.isfinite(value) and value >= 0):
        raise ValueError(f'{label} must be a finite float >= 0, got {value}')
    if not (
        np.isfinite(self.lipschitz_constant) and self.lipschitz_constant > 0
    ):
      raise ValueError(
          'lipschitz_constant must be > 0, got ' f'{self.lipschitz_constant}'
      )
    if not 0.0 < self.theta <= 1.0:
      raise ValueError(f'theta must be in (0, 1], got {self.theta}')
    if isinstance(self.tilt, bool) or not isinstance(self.tilt, (int, float)):
      raise TypeError(f'tilt must be a float, got {type(self.tilt).__name__}')
    if not np.isfinite(self.tilt):
      raise ValueError(f'tilt must be finite, got {self.tilt}')

  def definition(self) -> definition_lib.AlgorithmDefinition:
    """The algorithm's round math (`DEFINITIONS`), with these settings."""
    return DEFINITIONS[self.name](self)

  @property
  def server(self) -> tff.learning.optimizers.Optimizer:
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
  """

  client_ids: Sequence[str]
  epochs: Sequence[int]
  shuffle_seeds: Optional[Sequence[int]]
  max_batches: Sequence[int]


def _placeholders(structure, prefix: str):
  return tf.nest.map_structure(
      lambda s: tf.compat.v1.placeholder(s.dtype, s.shape, name=f'{prefix}_ph'),
      structure,
  )


def _nest_add(a, b):
  return tf.nest.map_structure(lambda x, y: x + tf.cast(y, x.dtype), a, b)


def _any_non_finite(structure):
  flat = tf.nest.flatten(structure)
  return tf.logical_not(
      tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in flat])
  )


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
    metric_specs = tf.nest.map_structure(
        lambda t: tf.TensorSpec(t.shape, t.dtype),
        model.report_local_unfinalized_metrics(),
    )
    shuffle = self._shuffle
    fast_loop = loop_implementation

    def client_dataset(raw, offsets, seeds, epochs, takes, k):
      examples = tf.nest.map_structure(
          lambda t: t[offsets[k] : offsets[k + 1]], raw
      )
      ds = tf.data.Dataset.from_tensor_slices(examples)
      ds = preprocess_train(ds, epochs[k], seeds[k] if shuffle else None)
      return ds.take(takes[k])

    def zeros(specs):
      return tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), specs)

    def as_weights(weights):
      return tff.learning.models.ModelWeights(
          trainable=list(tf.nest.flatten(weights.trainable)),
          non_trainable=list(tf.nest.flatten(weights.non_trainable)),
      )

    def server_step(opt_state, trainable, update):
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

    pass_kind = definition.loss_pass  # A Python string: static branches.

    def broadcast_losses(weights, raw, offsets, seeds, epochs, takes):
      """Each client's `(loss, examples)` at `weights`, clients in order."""
      num_clients = tf.size(seeds)
      losses = tf.TensorArray(tf.float32, size=num_clients)
      counts = tf.TensorArray(tf.int64, size=num_clients)
      for k in tf.range(num_clients):
        ds = client_dataset(raw, offsets, seeds, epochs, takes, k)
        model.reset_metrics()
        loss, n = client_work_lib.local_loss(
            model, weights, ds, loop_implementation=fast_loop
        )
        losses = losses.write(k, loss)
        counts = counts.write(k, n)
      return losses.stack(), counts.stack()

    def continue_stream(ds, loss):
      """`ds` again, its iterator created after `loss` (see the class doc)."""
      with tf.control_dependencies([loss]):
        variant = tf.identity(tf.data.experimental.to_variant(ds))
      return tf.data.experimental.from_variant(variant, ds.element_spec)

    @tf.function
    def round_fn(weights, opt_state, raw, offsets, seeds, epochs, takes):
      weights = as_weights(weights)
      num_clients = tf.size(seeds)
      if pass_kind == 'fresh':
        losses, counts = broadcast_losses(
            weights, raw, offsets, seeds, epochs, takes
        )
        context = definition.prepare(losses, counts)
      else:
        context = definition.prepare(None, None)
      # The continued pass's losses, collected only when there is one.
      continued = (
          (tf.TensorArray(tf.float32, size=num_clients),)
          if pass_kind == 'continued'
          else ()
      )
      vector_sum = zeros(trainable_specs)
      scalar_sum = tf.constant(0.0)
      metrics = zeros(metric_specs)
      for k in tf.range(num_clients):
        # Training reads a fresh copy of the stream (first shuffle order), as
        # the federated path's computations each rebuild the dataset, unless
        # the definition's loss pass is continued by training.
        ds = client_dataset(raw, offsets, seeds, epochs, takes, k)
        model.reset_metrics()
        loss, count = None, None
        if pass_kind == 'fresh':
          loss, count = losses[k], counts[k]
        elif pass_kind == 'continued':
          loss, count = client_work_lib.local_loss(
              model, weights, ds, loop_implementation=fast_loop
          )
          continued = (continued[0].write(k, loss),)
          ds = continue_stream(ds, loss)
        if definition.trains is not None:
          # A filtered-out client does no work: its stream is cut to no batch
          # (no step, no metric update, a zero delta), as the federated
          # path's skip branch.
          kept = definition.trains(context, loss)
          ds = ds.take(tf.where(kept, tf.constant(-1, tf.int64), 0))
        delta, n, non_finite = client_work_lib.local_training(
            model,
            alg.client_optimizer,
            weights,
            ds,
            proximal_strength=definition.proximal_strength,
            weight_decay=definition.weight_decay,
            loop_implementation=fast_loop,
        )
        vector, scalar = definition.client_result(
            context, loss, count, tuple(tf.nest.flatten(delta)), n, non_finite
        )
        if definition.weighted:
          vector = tuple(v * scalar for v in vector)
        vector_sum = tuple(a + v for a, v in zip(vector_sum, vector))
        scalar_sum += scalar
        metrics = _nest_add(metrics, model.report_local_unfinalized_metrics())
      if pass_kind == 'continued':
        losses = continued[0].stack()
      elif pass_kind == 'none':
        losses = None
      extra = collections.OrderedDict(
          definition.metrics(context, losses, scalar_sum, num_clients)
      )
      result = definition.server(
          tuple(weights.trainable), vector_sum, scalar_sum
      )
      if not definition.server_optimizer:
        return tuple(result), (), metrics, extra
      opt_state, trainable, bad = server_step(
          opt_state, weights.trainable, result
      )
      extra['update_non_finite'] = tf.cast(bad, tf.int32)
      return trainable, opt_state, metrics, extra

    trainable, opt_state, metric_sums, extra = round_fn(
        self._weights_ph,
        self._opt_state_ph,
        self._raw_ph,
        self._offsets_ph,
        self._seeds_ph,
        self._epochs_ph,
        self._takes_ph,
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
    self._weight_specs = weight_specs
    self._opt_state_specs = opt_state_specs

  # -------------------------------------------------------------------------
  # Running.

  def run_round(self, weights, server_state, plan: RoundPlan):
    """One round on raw values: `(trainable, server_state, train, extra)`.

    Args:
      weights: `ModelWeights` (or a structure matching it) of NumPy arrays.
      server_state: The server optimizer's state (`()` for q-FFL).
      plan: The round's participants and their data settings.
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
    trainable, opt_state, train, extra = self._session.run(
        self._outputs, feed_dict=feed
    )
    return trainable, opt_state, train, extra

  def next(self, state, plan: RoundPlan):
    """`process.next` on the process's state: `(new_state, metrics)`."""
    return apply_round(
        self.definition.server_optimizer,
        state,
        self.run_round(state.global_model_weights, state.finalizer, plan),
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


def algorithm_from_spec(
    spec, *, client_optimizer, server_optimizer, client_weighting
) -> BatchedAlgorithm:
  """The `BatchedAlgorithm` of a `run.algorithms.AlgorithmSpec`-like object."""
  if spec.name not in ALGORITHMS:
    raise ValueError(
        f'--simulation_engine=batched supports --algorithm='
        f'{", ".join(ALGORITHMS)}, not {spec.name}'
    )
  if getattr(spec, 'secure_quantile', 'none') != 'none':
    raise ValueError(
        '--simulation_engine=batched runs Delta-FL with the '
        'exact quantile only (--secure_quantile=none)'
    )
  algorithm = BatchedAlgorithm(
      name=spec.name,
      client_optimizer=client_optimizer,
      server_optimizer=server_optimizer,
      client_weighting=client_weighting,
      proximal_strength=spec.proximal_strength,
      q=spec.q,
      lipschitz_constant=spec.lipschitz_constant,
      theta=spec.theta,
      strict_filter=spec.strict_filter,
      uniform_weights=spec.uniform_weights,
      weight_decay=spec.weight_decay,
      tilt=spec.tilt,
  )
  if not algorithm.definition().server_optimizer:
    algorithm = dataclasses.replace(algorithm, server_optimizer=None)
  return algorithm


def metrics_as_mapping(metrics: Mapping[str, Any]) -> dict[str, Any]:
  """Plain dicts of the engine's metrics (for logging)."""
  return {
      k: (metrics_as_mapping(v) if isinstance(v, Mapping) else v)
      for k, v in metrics.items()
  }


def apply_round(has_server_optimizer: bool, state, outputs):
  """`(new_state, metrics)` from an engine round's `run_round` outputs.

  Shared by the batched and stacked engines: the new global trainable
  weights and server-optimizer state go into the process's own
  `LearningAlgorithmState` (q-FFL's server keeps no optimizer state), and the
  extra outputs are split into the metrics the federated path reports under
  `client_work` and `finalizer`.
  """
  trainable, opt_state, train, extra = outputs
  weights = state.global_model_weights
  new_weights = tff.learning.models.ModelWeights(
      trainable=trainable, non_trainable=weights.non_trainable
  )
  if not has_server_optimizer:
    finalizer_state = state.finalizer
  else:
    finalizer_state = tf.nest.pack_sequence_as(
        state.finalizer, tf.nest.flatten(opt_state)
    )
  new_state = state._replace(
      global_model_weights=new_weights, finalizer=finalizer_state
  )
  client_work = collections.OrderedDict(train=train)
  finalizer = collections.OrderedDict()
  for key, value in extra.items():
    if key in ('update_non_finite', 'h_sum'):
      finalizer[key] = value
    else:
      client_work[key] = value
  return new_state, collections.OrderedDict(
      client_work=client_work, finalizer=finalizer
  )
