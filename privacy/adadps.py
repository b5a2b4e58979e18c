# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""AdaDPS: private adaptive optimization with side information.

T. Li, M. Zaheer, S. J. Reddi, V. Smith, "Private Adaptive Optimization with
Side Information", ICML 2022, arXiv:2202.05963; thesis (T. Li, "Scalable and
Trustworthy Learning in Heterogeneous Networks", CMU-CS-23-127, 2023)
sections 6.1-6.7, Algorithms 8 and 10.

The idea: precondition each raw gradient by a NON-SENSITIVE preconditioner A
(side information: public-data second moments, or feature frequencies fixed
before training) BEFORE clipping and noising, so the noise is added in the
preconditioned geometry. A = 1 is DP-SGD / DP-FedAvg.

Centralized (Algorithm 8), plain NumPy (`run_centralized`, used by
`run.experiments.privacy_experiments`): each step samples a batch (Poisson with
rate b / n, the subsampled Gaussian of the RDP accountant, or a fixed size b
without replacement), computes per-example gradients, divides them by A,
clips each to L2 norm C, sums, adds N(0, sigma^2 C^2 I), divides by b and
steps w <- w - lr g. A is fixed (Option 2) or the RMSProp statistic of a
public-data gradient (Option 1: v <- beta v + (1 - beta) g_pub^2,
A = sqrt(v) + eps).

Federated (Algorithm 10, `build_adadps_fed`): every selected client runs
local SGD with each mini-batch gradient divided by A
(`build_preconditioned_sgd`, a `tff.learning.optimizers.Optimizer`); its model
delta is clipped to C and the server adds Gaussian noise ONCE to the sum (our
decision, documented in
docs/algorithms.md): Algorithm 10 as printed adds N(0, sigma^2 C^2) on every
device, while the thesis states a trusted server (central user-level DP,
Definition 4), whose standard mechanism (DP-FedAvg) noises the sum, giving
noise std sigma C / b on the mean instead of sigma C / sqrt(b). The server
averages with a fixed denominator b (uniform weights) and applies the noisy
mean with a server optimizer (SGD lr 1, optionally momentum 0.9 as the
thesis).
"""

import collections
import math
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from privacy import dp_aggregation
from tff_algos import fed_avg

ModelFn = Callable[[], tff.learning.models.VariableModel]
SAMPLING = ('poisson', 'fixed')

_PRECONDITIONER_KEY = 'side_information'


# ---------------------------------------------------------------------------
# Federated: preconditioned local SGD + DP aggregation.


class _PreconditionedSgd(tff.learning.optimizers.Optimizer):
  """w <- w - lr * g / A with a fixed, non-sensitive A (Algorithm 10)."""

  def __init__(self, learning_rate: float, side_information: Sequence[Any]):
    self._lr = learning_rate
    self._a = [np.asarray(a, np.float32) for a in side_information]

  def initialize(self, specs):
    """Checks A against the weights' shapes; the state is the learning rate."""
    flat = tf.nest.flatten(specs)
    if len(flat) != len(self._a):
      raise ValueError(
          f'side_information has {len(self._a)} arrays but the model has '
          f'{len(flat)} trainable weights'
      )
    for spec, a in zip(flat, self._a):
      if tuple(spec.shape) != a.shape:
        raise ValueError(
            f'side_information shape {a.shape} does not match weight shape '
            f'{tuple(spec.shape)}'
        )
    return collections.OrderedDict(
        [(tff.learning.optimizers.LEARNING_RATE_KEY, self._lr)]
    )

  def next(self, state, weights, gradients):
    lr = state[tff.learning.optimizers.LEARNING_RATE_KEY]
    flat_w = tf.nest.flatten(weights)
    flat_g = tf.nest.flatten(gradients)
    new = [
        w - lr * g / tf.constant(a, w.dtype)
        for w, g, a in zip(flat_w, flat_g, self._a)
    ]
    return state, tf.nest.pack_sequence_as(weights, new)

  def get_hparams(self, state):
    return collections.OrderedDict(
        [
            (
                tff.learning.optimizers.LEARNING_RATE_KEY,
                state[tff.learning.optimizers.LEARNING_RATE_KEY],
            )
        ]
    )

  def set_hparams(self, state, hparams):
    return tff.structure.update_struct(state, **hparams)


def _check_side_information(side_information) -> list[np.ndarray]:
  if isinstance(side_information, np.ndarray):
    side_information = [side_information]
  arrays = [np.asarray(a, np.float64) for a in side_information]
  for a in arrays:
    if not (np.all(np.isfinite(a)) and np.all(a > 0)):
      raise ValueError('side_information must be finite and > 0 everywhere')
  return arrays


def build_preconditioned_sgd(
    learning_rate: float, side_information: Sequence[Any]
) -> tff.learning.optimizers.Optimizer:
  """Local SGD on g / A (thesis Algorithm 10, line 6).

  Args:
    learning_rate: eta > 0.
    side_information: One positive array per trainable weight (same order
      and shapes as `tf.nest.flatten` of the trainable weights).

  Returns:
    A `tff.learning.optimizers.Optimizer`.
  """
  if not (
      isinstance(learning_rate, (int, float))
      and math.isfinite(learning_rate)
      and learning_rate > 0
  ):
    raise ValueError(f'learning_rate must be > 0, got {learning_rate!r}')
  return _PreconditionedSgd(
      float(learning_rate), _check_side_information(side_information)
  )


def build_adadps_fed(
    model_fn: ModelFn,
    side_information: Sequence[Any],
    *,
    client_learning_rate: float,
    clients_per_round: int,
    dp_options: Optional[dp_aggregation.DpOptions],
    server_optimizer_fn: Optional[tff.learning.optimizers.Optimizer] = None,
) -> tff.learning.templates.LearningProcess:
  """AdaDPS for federated learning (thesis Algorithm 10), central noise.

  Args:
    model_fn: No-arg callable returning a `VariableModel`.
    side_information: The non-sensitive A, one positive array per trainable
      weight; all ones gives DP-FedAvg.
    client_learning_rate: Local learning rate eta.
    clients_per_round: b, the denominator of the DP mean.
    dp_options: Noise and clipping (None: non-private, a plain mean).
    server_optimizer_fn: Default SGD with lr 1 (the unscaled average).

  Returns:
    A `tff.learning.templates.LearningProcess`.
  """
  client_opt = build_preconditioned_sgd(client_learning_rate, side_information)
  aggregator = None
  if dp_options is not None:
    aggregator = dp_aggregation.build_dp_aggregator(
        dp_options, clients_per_round=clients_per_round
    )
  return fed_avg.build_fed_avg(
      model_fn,
      client_opt,
      server_optimizer_fn,
      client_weighting=tff.learning.ClientWeighting.UNIFORM,
      model_aggregator=aggregator,
  )


# ---------------------------------------------------------------------------
# Centralized (Algorithm 8), NumPy.


def clip_rows(g: np.ndarray, clip: float) -> np.ndarray:
  """Each row scaled to L2 norm <= clip: clip(g, C) = g min(1, C / ||g||)."""
  norms = np.linalg.norm(g, axis=1, keepdims=True)
  return g * np.minimum(1.0, clip / np.maximum(norms, 1e-30))


def privatize(
    per_example: np.ndarray,
    *,
    clip: float,
    noise_multiplier: float,
    batch_size: float,
    rng: np.random.Generator,
) -> np.ndarray:
  """(1/b) (sum_i clip(g_i, C) + N(0, sigma^2 C^2 I)) (Algorithm 8, line 7)."""
  total = clip_rows(per_example, clip).sum(axis=0)
  noise = rng.normal(0.0, noise_multiplier * clip, size=total.shape)
  return (total + noise) / batch_size


def sample_batch(
    n: int, batch_size: int, sampling: str, rng: np.random.Generator
) -> np.ndarray:
  """Indices of a batch: Poisson with rate b / n, or b without replacement."""
  if sampling == 'poisson':
    return np.flatnonzero(rng.random(n) < batch_size / n)
  if sampling == 'fixed':
    return rng.choice(n, size=batch_size, replace=False)
  raise ValueError(f'unknown sampling {sampling!r}; choose {SAMPLING}')


class FixedPreconditioner:
  """Option 2: A fixed before training (side information)."""

  def __init__(self, a):
    self.a = _check_side_information([a])[0]

  def __call__(self, w) -> np.ndarray:
    del w
    return self.a


class PublicRmsPropPreconditioner:
  """Option 1: v <- beta v + (1-beta) g_pub^2, A = sqrt(v) + eps."""

  def __init__(
      self,
      public_gradient: Callable[[np.ndarray], np.ndarray],
      *,
      beta: float = 0.9,
      epsilon: float = 1e-3,
  ):
    self.public_gradient = public_gradient
    self.beta = beta
    self.epsilon = epsilon
    self.v = None

  def __call__(self, w) -> np.ndarray:
    g = self.public_gradient(w)
    if self.v is None:
      self.v = np.zeros_like(g)
    self.v = self.beta * self.v + (1 - self.beta) * g**2
    return np.sqrt(self.v) + self.epsilon


def run_centralized(
    per_example_gradients: Callable[[np.ndarray, np.ndarray], np.ndarray],
    num_examples: int,
    w0: np.ndarray,
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    clip: float,
    noise_multiplier: float,
    preconditioner: Optional[Callable[[np.ndarray], np.ndarray]] = None,
    sampling: str = 'poisson',
    seed: int = 0,
    private: bool = True,
    callback: Optional[Callable[[int, np.ndarray], None]] = None,
) -> np.ndarray:
  """Algorithm 8 (AdaDPS); `preconditioner=None` is DP-SGD.

  Args:
    per_example_gradients: `(w, indices) -> [len(indices), d]` gradients.
    num_examples: n.
    w0: Initial model [d].
    steps: T.
    batch_size: b (expected size with Poisson sampling; the denominator).
    learning_rate: alpha.
    clip: C.
    noise_multiplier: sigma.
    preconditioner: `w -> A` (None: A = 1, DP-SGD).
    sampling: 'poisson' or 'fixed'.
    seed: Seed of sampling and noise.
    private: False: no clipping or noise (AdaS / SGD), mean over the batch.
    callback: Called as `callback(step, w)` after every step.

  Returns:
    The final model.
  """
  rng = np.random.default_rng(seed)
  w = np.array(w0, np.float64)
  for t in range(steps):
    idx = sample_batch(num_examples, batch_size, sampling, rng)
    a = preconditioner(w) if preconditioner is not None else 1.0
    g = per_example_gradients(w, idx) / a if len(idx) else np.zeros((0, w.size))
    if private:
      update = privatize(
          g,
          clip=clip,
          noise_multiplier=noise_multiplier,
          batch_size=batch_size,
          rng=rng,
      )
    else:
      update = g.mean(axis=0) if len(idx) else np.zeros_like(w)
    w = w - learning_rate * update
    if callback is not None:
      callback(t, w)
  return w
