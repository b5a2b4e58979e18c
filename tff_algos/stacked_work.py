# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""How a kind of client work brings its own kernel to the stacked engine.

The stacked engine (`tff_algos.stacked`) runs a round's clients with their
weights stacked on a leading client axis. It computes two kinds of client
work itself: local training with the client optimizer, and the loss and
full gradient at the broadcast model (`client_work.full_gradient_work`).
Any other `local_work` of a definition runs there only if it is a
`StackedLocalWork`: the definition's callable (which the TFF builder and the
batched engine call per client) also says how to compute the same work on
stacked weights, from the pieces the engine lends it (`Kit`). Ditto's
personal passes (`ditto.PersonalWork`) and Fed+'s mixed steps
(`fed_plus.FedPlusWork`) come this way, so the engine names no algorithm.
"""

import abc
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import tensorflow as tf


class StackedEngineError(ValueError):
  """The stacked engine cannot run this model, task or algorithm."""


class RoundInputs(NamedTuple):
  """What a kernel's round reads (tensors of the engine's round graph).

  Attributes:
    w0: The broadcast model's trainable weights (a tuple).
    personal: The clients' state models, one stacked tuple [K, ...] per
      personal model of the definition (empty without).
    x_all, y_all: The round's examples (a dummy last row for padding).
    idx: Example indices [S, K, b] of the training pass's batch slots.
    valid: [S, K, b] bool: the slot holds a real example (a client the
      definition's filter dropped has none).
    steps: [K] the training pass's steps per client.
    kept: [K] bool: the client trains (the definition's filter).
    extra_pos: [P, S, K, b] slot positions of the P further passes over the
      stream the work asked for (`extra_passes`); `Kit.indices` turns them
      into example indices.
  """

  w0: tuple[tf.Tensor, ...]
  personal: tuple[tuple[tf.Tensor, ...], ...]
  x_all: tf.Tensor
  y_all: tf.Tensor
  idx: tf.Tensor
  valid: tf.Tensor
  steps: tf.Tensor
  kept: tf.Tensor
  extra_pos: tf.Tensor


class LocalResult(NamedTuple):
  """A round's client work on stacked weights.

  Attributes:
    vectors: Each client's vector [K, ...] for the definition's
      `client_result` (a delta, a gradient or a model).
    sums: `(loss_sum, correct, examples, batches)`, each [K], of the pass
      whose metrics the round reports.
    non_finite: [K] bool: the client's vector was not finite.
    personal: The clients' new state models (as `RoundInputs.personal`).
    client_counts: The definition's `client_counts`, summed over clients.
  """

  vectors: tuple[tf.Tensor, ...]
  sums: tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]
  non_finite: tf.Tensor
  personal: tuple[tuple[tf.Tensor, ...], ...] = ()
  client_counts: tuple[tf.Tensor, ...] = ()


# A pass over the clients: `(w0, start, x_all, y_all, idx, valid, proximal,
# decay) -> (vectors [K, ...], sums)`, `start` None or stacked start models.
ClientPass = Callable[..., tuple[tuple[tf.Tensor, ...], tuple[tf.Tensor, ...]]]


class Kit(Protocol):
  """The stacked engine's pieces a kernel composes (all built in its graph).

  `solver(optimizer)` prepares an elementwise optimizer for `descend`;
  `descend(w_start, anchor, solver, x_all, y_all, idx, valid, proximal,
  decay, mix=None)` runs mini-batch steps of every client from its stacked
  start, with a proximal pull toward `anchor` and, with `mix`, each step
  mixed as `mix * step + (1 - mix) * anchor`, returning `(weights, sums)`;
  `run_clients(pass_fn, w0, start, x_all, y_all, idx, valid, steps,
  proximal, decay)` runs a `ClientPass` over the round's clients (grouped by
  size or one after another, as the engine runs training); `train(inputs)`
  is the engine's own work (local training or the full gradient) as a
  `LocalResult`; `indices(pos, x_all)` turns slot positions into example
  indices; `finite_per_client(stacked)` is [K] bool and
  `per_client(mask, tensor)` broadcasts a [K] mask against [K, ...].
  """

  def solver(self, optimizer: Any) -> Any:
    """`optimizer` prepared for `descend` (its initial per-weight state)."""

  def descend(self, *args, **kwargs) -> Any:
    """Mini-batch steps of every client from its stacked start."""

  def run_clients(self, pass_fn: ClientPass, *args) -> Any:
    """`pass_fn` over the round's clients, as the engine runs training."""

  def train(self, inputs: RoundInputs) -> LocalResult:
    """The engine's own work (local training or the full gradient)."""

  def indices(self, pos: tf.Tensor, x_all: tf.Tensor) -> tf.Tensor:
    """Example indices of slot positions (the dummy row on padding)."""

  def finite_per_client(self, stacked) -> tf.Tensor:
    """[K] bool: every entry of client k's slices is finite."""

  def per_client(self, mask: tf.Tensor, tensor: tf.Tensor) -> tf.Tensor:
    """A [K] mask broadcast against a [K, ...] tensor."""


class StackedLocalWork(abc.ABC):
  """A definition's `local_work` that runs on the stacked engine.

  Subclasses are the callables a definition's `local_work` holds (called per
  client by the TFF builder and the batched engine) and add how the same
  work runs with the clients stacked. `stacked_kernel` must give the
  per-client callable's numbers (tested per kind against the batched
  engine: tests/test_stacked_ditto.py, tests/test_stacked_fedplus.py).
  """

  @property
  def extra_passes(self) -> int:
    """Reads of each client's stream after training's (a new shuffle order
    each, as the per-client work's re-reads of its dataset)."""
    return 0

  def training_optimizer(self, run_optimizer: Any) -> Any:
    """The optimizer of the engine's own training pass (`Kit.train`), given
    the run's client optimizer."""
    return run_optimizer

  @abc.abstractmethod
  def check_stacked(self, definition: Any) -> None:
    """Raises `StackedEngineError` where these settings cannot run stacked."""

  @abc.abstractmethod
  def stacked_kernel(self, kit: Kit) -> Callable[[RoundInputs], LocalResult]:
    """Builds the work's round function from the engine's `kit` (called once,
    while the engine builds its graph)."""


def keep_finite(kit: Kit, new, old) -> tuple[tuple[tf.Tensor, ...], tf.Tensor]:
  """`new` where a client's slices are all finite, else `old`; and the [K]
  flags of the clients kept at `old`."""
  ok = kit.finite_per_client(new)
  kept = tuple(tf.where(kit.per_client(ok, n), n, o) for n, o in zip(new, old))
  return kept, tf.logical_not(ok)
