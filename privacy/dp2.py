# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""DP^2: private adaptive optimization with delayed preconditioners.

T. Li, M. Zaheer, K. Liu, S. J. Reddi, H. B. McMahan, V. Smith,
"Differentially Private Adaptive Optimization with Delayed Preconditioners",
ICLR 2023, arXiv:2212.00309; thesis (T. Li, CMU-CS-23-127) sections 6.8-6.14,
Algorithm 11 (DP^2-RMSProp).

Alternate s1 steps of private SGD with s2 steps of private RMSProp whose
preconditioner v is refreshed once per cycle from the AVERAGE of the s1
already-private SGD gradients (averaging divides the noise variance by s1).
At step t, with phase p = t mod (s1 + s2):

  p == 0:   G <- 0
  p == s1:  v <- beta v + (1 - beta) (G / s1)^2;  G <- 0
  D = 1 if p < s1 else sqrt(v) + eps
  g~ = private gradient of the preconditioned gradients g / D
  G <- G + g~;  w <- w - lr_p g~   (lr_p: SGD or RMSProp learning rate)

Only already-private gradients feed v, so DP^2 costs exactly what DP-SGD
costs with the same sigma, b, T (thesis Theorem 20).

Two forms here:

* `run_centralized` (NumPy): Algorithm 11 as the thesis evaluates it, the
  preconditioner applied to clean per-example gradients BEFORE clipping and
  noising (`adadps.privatize`).
* `build_dp2` (a `tff.learning.optimizers.Optimizer`): OUR federated
  extension (the thesis gives none; its section 6.10 lists FL as future work),
  a server optimizer applied to the DP-aggregated mean model update, which
  plays g~. The server only sees the privatized aggregate, so in the RMSProp
  phase the preconditioner divides the noised update: the order of the
  thesis's ablation "Variant 2" (noise before preconditioning), which it found
  worse than Algorithm 11 in the centralized setting. The privacy cost is that
  of the DP aggregation alone (post-processing). With s2 = 0 it is server SGD.
"""

import collections
import math
from collections.abc import Callable
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from privacy import adadps

_KEYS = ('learning_rate', 'rmsprop_learning_rate', 'beta', 'epsilon')


def _check(name, value, low, high=math.inf, low_open=False):
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise TypeError(f'{name} must be a number, got {value!r}')
  if (
      not math.isfinite(value)
      or value < low
      or value > high
      or (low_open and value == low)
  ):
    bound = f'in ({low}, {high}]' if low_open else f'in [{low}, {high}]'
    raise ValueError(f'{name} must be {bound}, got {value}')
  return value


def _check_steps(s1, s2):
  for name, value, low in (('sgd_steps', s1, 1), ('rmsprop_steps', s2, 0)):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      raise ValueError(f'{name} must be an int >= {low}, got {value!r}')


class _Dp2(tff.learning.optimizers.Optimizer):
  """DP^2-RMSProp as a server optimizer (see `build_dp2`)."""

  def __init__(
      self,
      learning_rate,
      rmsprop_learning_rate,
      sgd_steps,
      rmsprop_steps,
      beta,
      epsilon,
  ):
    self._hparams = collections.OrderedDict(
        learning_rate=learning_rate,
        rmsprop_learning_rate=rmsprop_learning_rate,
        beta=beta,
        epsilon=epsilon,
    )
    self._s1 = sgd_steps
    self._s2 = rmsprop_steps

  def initialize(self, specs):
    zeros = lambda: tf.nest.map_structure(  # pylint: disable=g-long-lambda
        lambda s: tf.zeros(s.shape, s.dtype), specs
    )
    state = collections.OrderedDict(self._hparams)
    state['step'] = tf.constant(0, tf.int64)
    state['accumulator'] = zeros()
    state['preconditioner'] = zeros()
    return state

  def next(self, state, weights, gradients):
    """One step: SGD in the first phase of a cycle, RMSprop in the second."""
    s1, cycle = self._s1, self._s1 + self._s2
    step = state['step']
    phase = tf.math.floormod(step, cycle)
    reset = tf.equal(phase, 0)
    refresh = tf.logical_and(tf.equal(phase, s1), self._s2 > 0)
    sgd_phase = phase < s1
    beta = state['beta']
    lr = tf.where(
        sgd_phase,
        tf.cast(state['learning_rate'], tf.float32),
        tf.cast(state['rmsprop_learning_rate'], tf.float32),
    )

    def leaf(w, g, acc, v):
      dtype = w.dtype
      acc = tf.where(reset, tf.zeros_like(acc), acc)
      new_v = tf.cast(beta, dtype) * v + (1 - tf.cast(beta, dtype)) * tf.square(
          acc / s1
      )
      v = tf.where(refresh, new_v, v)
      acc = tf.where(refresh, tf.zeros_like(acc), acc)
      d = tf.where(
          sgd_phase,
          tf.ones_like(v),
          tf.sqrt(v) + tf.cast(state['epsilon'], dtype),
      )
      update = g / d
      return (w - tf.cast(lr, dtype) * update, acc + update, v)

    flat = [
        leaf(w, g, a, v)
        for w, g, a, v in zip(
            tf.nest.flatten(weights),
            tf.nest.flatten(gradients),
            tf.nest.flatten(state['accumulator']),
            tf.nest.flatten(state['preconditioner']),
        )
    ]
    new_state = collections.OrderedDict((k, state[k]) for k in _KEYS)
    new_state['step'] = step + 1
    new_state['accumulator'] = tf.nest.pack_sequence_as(
        state['accumulator'], [f[1] for f in flat]
    )
    new_state['preconditioner'] = tf.nest.pack_sequence_as(
        state['preconditioner'], [f[2] for f in flat]
    )
    return new_state, tf.nest.pack_sequence_as(weights, [f[0] for f in flat])

  def get_hparams(self, state):
    return collections.OrderedDict((k, state[k]) for k in _KEYS)

  def set_hparams(self, state, hparams):
    return tff.structure.update_struct(state, **hparams)


def build_dp2(
    learning_rate: float,
    rmsprop_learning_rate: float,
    *,
    sgd_steps: int,
    rmsprop_steps: int,
    beta: float = 0.9,
    epsilon: float = 1e-3,
) -> tff.learning.optimizers.Optimizer:
  """DP^2-RMSProp as a server optimizer on DP-aggregated updates.

  Our federated extension of thesis Algorithm 11 (see the module docstring):
  a step is a round, the "gradient" is the DP mean model delta.

  Args:
    learning_rate: Server lr of the SGD phase (1.0: FedAvg's average).
    rmsprop_learning_rate: Server lr of the RMSProp phase.
    sgd_steps: s1 >= 1 rounds of SGD per cycle (their updates form v).
    rmsprop_steps: s2 >= 0 rounds of preconditioned steps (0: always SGD).
    beta: Moving average of v, in [0, 1).
    epsilon: eps > 0 of D = sqrt(v) + eps.

  Returns:
    A `tff.learning.optimizers.Optimizer`.
  """
  _check('learning_rate', learning_rate, 0.0, low_open=True)
  _check('rmsprop_learning_rate', rmsprop_learning_rate, 0.0, low_open=True)
  _check('beta', beta, 0.0, 1.0)
  if beta == 1.0:
    raise ValueError('beta must be < 1 (v would never change)')
  _check('epsilon', epsilon, 0.0, low_open=True)
  _check_steps(sgd_steps, rmsprop_steps)
  return _Dp2(
      float(learning_rate),
      float(rmsprop_learning_rate),
      sgd_steps,
      rmsprop_steps,
      float(beta),
      float(epsilon),
  )


def run_centralized(
    per_example_gradients: Callable[[np.ndarray, np.ndarray], np.ndarray],
    num_examples: int,
    w0: np.ndarray,
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    rmsprop_learning_rate: float,
    clip: float,
    rmsprop_clip: Optional[float] = None,
    noise_multiplier: float,
    sgd_steps: int,
    rmsprop_steps: int,
    beta: float = 0.9,
    epsilon: float = 1e-3,
    sampling: str = 'poisson',
    seed: int = 0,
    callback: Optional[Callable[[int, np.ndarray], None]] = None,
) -> np.ndarray:
  """Thesis Algorithm 11 (DP^2-RMSProp), centralized, NumPy.

  Per-example gradients are divided by D before clipping (C in the SGD
  phase, `rmsprop_clip` in the RMSProp phase, as the thesis tunes them
  separately) and the Gaussian noise of the clip in use is added. Sampling,
  clipping and noise as `adadps.run_centralized`.

  Returns:
    The final model.
  """
  _check_steps(sgd_steps, rmsprop_steps)
  rmsprop_clip = clip if rmsprop_clip is None else rmsprop_clip
  rng = np.random.default_rng(seed)
  w = np.array(w0, np.float64)
  acc = np.zeros_like(w)
  v = np.zeros_like(w)
  cycle = sgd_steps + rmsprop_steps
  for t in range(steps):
    phase = t % cycle
    if phase == 0:
      acc = np.zeros_like(w)
    if phase == sgd_steps and rmsprop_steps:
      v = beta * v + (1 - beta) * (acc / sgd_steps) ** 2
      acc = np.zeros_like(w)
    sgd = phase < sgd_steps
    d = 1.0 if sgd else np.sqrt(v) + epsilon
    idx = adadps.sample_batch(num_examples, batch_size, sampling, rng)
    g = per_example_gradients(w, idx) / d if len(idx) else np.zeros((0, w.size))
    g_tilde = adadps.privatize(
        g,
        clip=clip if sgd else rmsprop_clip,
        noise_multiplier=noise_multiplier,
        batch_size=batch_size,
        rng=rng,
    )
    acc = acc + g_tilde
    w = w - (learning_rate if sgd else rmsprop_learning_rate) * g_tilde
    if callback is not None:
      callback(t, w)
  return w
