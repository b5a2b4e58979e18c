# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""One definition of an algorithm's round math, for the simulation engines.

An `AlgorithmDefinition` says what a round of an algorithm computes, in
terms that do not depend on how the clients are run:

1. an optional **loss pass**: each client's mean loss at the broadcast model
   (`'fresh'`: training then restarts the client's stream, as the TFF path's
   two client computations each rebuild the dataset; `'continued'`: training
   continues the same stream, as q-FFL's single client computation does;
   `'work'`: the loss is the one the algorithm's own client work returns,
   e.g. AFL's and q-FedSGD's at the broadcast model);
2. a **round context** from all the clients' losses (`prepare`: e.g. Delta-FL's
   quantile threshold, TERM's largest tilted loss), and which clients train
   (`trains`: Delta-FL's filter). Declared as `reductions` (sums, maxima and
   minima over the clients of a per-client value), the context is also
   what the TFF path computes with `tff.federated_sum`/`max`/`min`, so
   `client_work.build_local_training_client_work` derives the TFF client
   work from the definition alone (TERM's);
3. **local training** with the definition's proximal strength and weight
   decay (`client_work.local_training`);
4. each client's **contribution** (`client_result`: a vector and a scalar;
   with `weighted=True` the server sums `vector * scalar` and the scalars,
   otherwise the vectors and the scalars);
5. the **server**: `server(w0, vector_sum, scalar_sum)` is the update the
   server optimizer applies (rejecting a non-finite one) or, with
   `server_optimizer=False`, the new trainable weights; and the round's extra
   metrics (`metrics`).

Three optional parts cover the algorithms whose clients do more than local
training (Ditto, Fed+, AFL):

* `local_work` replaces local training by the algorithm's own client work,
  the same function its TFF builder's client computation calls (it returns a
  `LocalWork`: what the client sends, its personal models, its loss);
* `personal_models` > 0: every client keeps that many personal models
  (the client-state store's `OrderedDict(personal=...)`), which the engine
  takes in and returns with the round;
* `server_state`: server state beyond the optimizer's (AFL's mixture), read
  from and written to the process state, with the clients' indices in the
  round context; and `server_sees_clients`: the server rule also gets every
  client's vector (Fed+'s fixed-point aggregate).

Both engines (`tff_algos.batched`, clients one after another in a graph, and
`tff_algos.stacked`, clients vectorized) run every algorithm from its
definition and nothing else: they hold no per-algorithm code. Each
algorithm's TFF builder builds the same definition, and its client
computation runs the definition's local training (`proximal_strength`,
`weight_decay`) or `local_work`, `trains` and `client_result` (through
`client_work.structured_client_result`); the round-wide parts (`prepare`,
`server`, `server_state`) it places with TFF's federated operators, as each
builder documents. So the math is written once. `prepare`,
`trains`, `client_result` (unless `per_client_message`) and `metrics` are
elementwise over clients: the batched engine calls them with one client's
scalars, the stacked engine with `[K]` vectors.
"""

import collections
from collections.abc import Callable, Mapping
import dataclasses
from typing import Any, Optional

import tensorflow as tf

LOSS_PASSES = ('none', 'fresh', 'continued', 'work')

# A `Reduction`'s kinds: the engines' reduction over the clients axis (TFF's
# federated operator is `tff.federated_<kind>`).
REDUCTIONS = {'sum': tf.reduce_sum, 'max': tf.reduce_max, 'min': tf.reduce_min}


def no_context(losses, counts) -> Mapping[str, Any]:
  """A round context with nothing in it."""
  del losses, counts
  return {}


def no_metrics(context, losses, scalar_sum, num_clients):
  """No extra round metrics."""
  del context, losses, scalar_sum, num_clients
  return collections.OrderedDict()


def mean_loss(losses, num_clients):
  """The participants' mean loss at the broadcast model."""
  return tf.reduce_sum(losses) / tf.cast(num_clients, tf.float32)


def mean_update(w0, vector_sum, scalar_sum):
  """The weighted mean of the clients' deltas: sum(w_k d_k) / sum(w_k)."""
  del w0
  return tuple(v / scalar_sum for v in vector_sum)


@dataclasses.dataclass(frozen=True)
class Reduction:
  """A round-wide value from every client's loss pass.

  Attributes:
    kind: `'sum'`, `'max'` or `'min'` over the clients (`REDUCTIONS`).
    value: `(loss, count) -> tensor`, elementwise: the engines call it on
      the `[K]` losses and example counts, a TFF client on its own; `count`
      is a number of examples (cast it as the value needs).
  """

  kind: str
  value: Callable[[tf.Tensor, tf.Tensor], tf.Tensor]

  def __post_init__(self):
    if self.kind not in REDUCTIONS:
      raise ValueError(
          f'a reduction is one of {tuple(REDUCTIONS)}, got {self.kind!r}'
      )


@dataclasses.dataclass(frozen=True)
class ReducedContext:
  """The `prepare` of a definition that declares `reductions`: each name's
  reduction of its value over the clients."""

  reductions: tuple[tuple[str, Reduction], ...]

  def __call__(self, losses, counts) -> Mapping[str, Any]:
    return {
        name: REDUCTIONS[r.kind](r.value(losses, counts))
        for name, r in self.reductions
    }


@dataclasses.dataclass
class LocalWork:
  """What an algorithm's own client work (`local_work`) returns.

  Attributes:
    vector: What the client sends (a delta, a model, a gradient), a tuple of
      tensors shaped as the trainable weights.
    num_examples: Examples processed (int64).
    non_finite: Whether the work produced a NaN/inf (bool).
    model_metrics: The model's unfinalized training metrics, read where the
      algorithm's metrics end (None: the engine reads them after the work).
    personal: The client's new personal models (a tuple of G tuples).
    loss: The client's loss from the work (AFL: at the broadcast model).
    client_counts: Per-client int32 counts the engine sums over the clients
      into the round's metrics (a key `group/name` goes under that group);
      their names are the definition's `client_counts`.
  """

  vector: tuple[tf.Tensor, ...]
  num_examples: tf.Tensor
  non_finite: tf.Tensor
  model_metrics: Optional[Mapping[str, Any]] = None
  personal: tuple[tuple[tf.Tensor, ...], ...] = ()
  loss: Optional[tf.Tensor] = None
  client_counts: Mapping[str, tf.Tensor] = dataclasses.field(
      default_factory=collections.OrderedDict
  )


@dataclasses.dataclass
class ServerOutput:
  """A server rule's result with round metrics (`server` may return one).

  Attributes:
    result: The update (or the new trainable weights).
    metrics: Round metrics (a key `group/name` goes under that group).
  """

  result: tuple[tf.Tensor, ...]
  metrics: Mapping[str, tf.Tensor]


@dataclasses.dataclass(frozen=True)
class ServerState:
  """Server state beyond the optimizer's (e.g. AFL's mixture lambda).

  Attributes:
    key: Where it lives in the process state (e.g. `'client_work'`).
    spec: Its `tf.TensorSpec`.
    update: `(state, losses, client_indices) -> (new_state, metrics)` after
      the round's client work (`losses` from `LocalWork.loss`, `[K]`).
  """

  key: str
  spec: tf.TensorSpec
  update: Callable[..., tuple[tf.Tensor, Mapping[str, tf.Tensor]]]


@dataclasses.dataclass(frozen=True)
class AlgorithmDefinition:
  """An algorithm's round math (see the module docstring).

  Attributes:
    name: The algorithm's name (for messages).
    client_result: `(context, loss, count, delta, num_examples,
      non_finite) -> (vector, scalar)`; `delta` is a tuple of the trainable
      weights' deltas, zeroed where non-finite. `loss`/`count` are None
      without a loss pass.
    server: `(w0, vector_sum, scalar_sum) -> update` (or new trainable
      weights when `server_optimizer` is False); with `server_sees_clients`
      also a 4th argument, the clients' vectors stacked `[K, ...]`. It may
      return a `ServerOutput` to add round metrics.
    loss_pass: One of `LOSS_PASSES`.
    prepare: `(losses, counts) -> context` from every client's loss pass.
    reductions: `((name, Reduction), ...)`: the round context as reductions
      over the clients (then `prepare` is derived from them:
      `ReducedContext`), which a TFF client work can place itself.
    trains: `(context, loss) -> bool`: whether the client trains (None: all).
    metrics: `(context, losses, scalar_sum, num_clients) -> OrderedDict` of
      the round's extra metrics (the engine adds `update_non_finite` when
      there is a server optimizer).
    weighted: Whether the server sums `vector * scalar` (else `vector`).
    per_client_message: Whether `client_result` needs one client at a time
      (it reduces over the weights, e.g. a norm); the stacked engine then
      maps it over the clients.
    server_optimizer: Whether `server` returns an update for the server
      optimizer (False: the new weights; the server keeps no state).
    proximal_strength: mu of local training's proximal term.
    weight_decay: Local training's weight decay.
    local_work: `(model, weights, dataset, personal, loop_implementation) ->
      LocalWork`, the client work in place of local training (None: local
      training with `proximal_strength` and `weight_decay`). `personal` is
      the client's personal models (`()` without them).
    personal_models: How many personal models each client keeps (0: none).
    server_state: A `ServerState` (None: only the optimizer's).
    server_sees_clients: Whether `server` gets the clients' vectors.
    client_counts: The names of `LocalWork.client_counts`.
    fixed_server_optimizer: The server optimizer the algorithm prescribes
      (AFL: SGD with gamma_w), in place of the configured one.
  """

  name: str
  client_result: Callable[..., tuple[Any, tf.Tensor]]
  server: Callable[..., tuple[tf.Tensor, ...]] = mean_update
  loss_pass: str = 'none'
  prepare: Callable[..., Mapping[str, Any]] = no_context
  reductions: tuple[tuple[str, Reduction], ...] = ()
  trains: Optional[Callable[..., tf.Tensor]] = None
  metrics: Callable[..., Mapping[str, tf.Tensor]] = no_metrics
  weighted: bool = True
  per_client_message: bool = False
  server_optimizer: bool = True
  proximal_strength: float = 0.0
  weight_decay: float = 0.0
  local_work: Optional[Callable[..., LocalWork]] = None
  personal_models: int = 0
  server_state: Optional[ServerState] = None
  server_sees_clients: bool = False
  client_counts: tuple[str, ...] = ()
  fixed_server_optimizer: Optional[Any] = None

  def __post_init__(self):
    if self.loss_pass not in LOSS_PASSES:
      raise ValueError(
          f'loss_pass must be one of {LOSS_PASSES}, got {self.loss_pass!r}'
      )
    if self.reductions:
      self._derive_prepare()
    if self.loss_pass == 'continued' and (
        self.prepare is not no_context or self.trains is not None
    ):
      # The batched engine trains each client right after its loss pass.
      raise ValueError(
          'a continued loss pass cannot feed a round context or a filter'
      )
    if self.loss_pass == 'none' and self.trains is not None:
      raise ValueError('a client filter needs a loss pass')
    if self.personal_models < 0:
      raise ValueError(
          f'personal_models must be >= 0, got {self.personal_models}'
      )
    if self.personal_models and self.local_work is None:
      raise ValueError('personal models need a local_work that updates them')
    if self.loss_pass == 'work' and self.local_work is None:
      raise ValueError("loss_pass 'work' takes the loss from local_work")
    if self.loss_pass == 'work' and self.prepare is not no_context:
      raise ValueError('a loss from the client work cannot feed a context')
    if self.server_state is not None and self.loss_pass != 'work':
      raise ValueError(
          "a server state is updated from the work's losses (loss_pass "
          "'work')"
      )
    if self.local_work is not None and (
        self.proximal_strength or self.weight_decay
    ):
      raise ValueError(
          'proximal_strength and weight_decay configure local training, '
          'which local_work replaces'
      )

  def _derive_prepare(self) -> None:
    """`prepare` from `reductions` (checked: a fresh loss pass, distinct
    names, no hand-written `prepare` besides)."""
    names = [name for name, _ in self.reductions]
    if len(set(names)) != len(names) or not all(
        isinstance(r, Reduction) for _, r in self.reductions
    ):
      raise ValueError('reductions are (distinct name, Reduction) pairs')
    if self.loss_pass != 'fresh':
      raise ValueError(
          "reductions reduce a fresh loss pass (loss_pass 'fresh')"
      )
    derived = ReducedContext(tuple(self.reductions))
    if self.prepare is not no_context and self.prepare != derived:
      raise ValueError('give either prepare or reductions, not both')
    # A frozen dataclass: set the derived field as its constructor would.
    object.__setattr__(self, 'reductions', derived.reductions)
    object.__setattr__(self, 'prepare', derived)
