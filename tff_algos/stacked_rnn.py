# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Recurrent models written once for a stack of clients' weights.

`tf.vectorized_map` over Keras' recurrent layer turns each time step into a
`while_loop` of per-client kernels; this module runs the same model on
`[K, B, ...]` inputs with `[K, ...]` weights as batched matrix products:
the input projection of every time step in one batched matmul, then one
batched matmul per step for the recurrence (the time loop unrolled, so the
gradient is one graph). It covers the recurrent models of
`tasks.shakespeare_leaf`:

  Input ids [B, H] -> OneHot | Embedding -> GRU | LSTM (one or more)
    -> Dense logits,

with Keras' default cells (tanh / sigmoid, biases, GRU `reset_after=True`,
no dropout, masking, state or reversal). `stacked_forward` returns None for
any other model, and the engine keeps `vectorized_map`.

The math is Keras' (`keras.layers.GRU` / `LSTM`, the gates in Keras' order:
GRU z, r, h; LSTM i, f, c, o); tested equal to the Keras model per client
in tests/test_stacked_rnn.py.
"""

from collections.abc import Callable, Sequence
from typing import Any, Optional

import tensorflow as tf

StackedForward = Callable[[Sequence[tf.Tensor], tf.Tensor], tf.Tensor]


def _is_default_cell(layer) -> bool:
  """A GRU / LSTM whose math this module reproduces."""
  kind = type(layer).__name__
  if kind not in ('GRU', 'LSTM'):
    return False
  ok = (
      layer.activation is tf.keras.activations.tanh
      and layer.recurrent_activation is tf.keras.activations.sigmoid
      and layer.use_bias
      and not layer.dropout
      and not layer.recurrent_dropout
      and not layer.go_backwards
      and not layer.stateful
      and not layer.return_state
      and not getattr(layer, 'time_major', False)
  )
  if kind == 'GRU':
    ok = ok and layer.reset_after
  return bool(ok)


def _plan(keras_model) -> Optional[list[tuple[str, Any, int]]]:
  """`[(kind, layer, number of weights)]` or None if not covered."""
  layers = list(getattr(keras_model, 'layers', []))
  if len(layers) < 3:
    return None
  plan = []
  first = layers[0]
  if type(first).__name__ == 'OneHot' and hasattr(first, 'depth'):
    plan.append(('onehot', first, 0))
  elif isinstance(first, tf.keras.layers.Embedding):
    if first.mask_zero:
      return None
    plan.append(('embedding', first, 1))
  else:
    return None
  cells = layers[1:-1]
  if not cells or not all(_is_default_cell(c) for c in cells):
    return None
  for i, cell in enumerate(cells):
    last = i == len(cells) - 1
    if cell.return_sequences == last:  # Sequences between, last state out.
      return None
    plan.append((type(cell).__name__.lower(), cell, 3))
  dense = layers[-1]
  if not (
      isinstance(dense, tf.keras.layers.Dense)
      and dense.use_bias
      and dense.activation is tf.keras.activations.linear
  ):
    return None
  plan.append(('dense', dense, 2))
  # The functional model's weights are the layers' trainable weights in
  # creation order: the plan must account for every one of them.
  expected = [w.shape for _, layer, _ in plan for w in layer.trainable_weights]
  counted = sum(n for _, _, n in plan)
  if (
      counted != len(keras_model.trainable_weights)
      or [w.shape for w in keras_model.trainable_weights] != expected
  ):
    return None
  return plan


def _bmm(a, w):
  """`[K, N, I] x [K, I, O] -> [K, N, O]`."""
  return tf.linalg.matmul(a, w)


def _projected_steps(inputs, kernel, bias, units):
  """`(steps, zero state)`: every step's input projection `[K, B, G]` of
  `inputs [K, B, H, I]` (one batched matmul for all H steps, plus `bias
  [K, G]`) and a zero `[K, B, units]` state."""
  k, b = tf.unstack(tf.shape(inputs)[:2])
  h = inputs.shape[2]  # Static: the loop is unrolled over it.
  flat = tf.reshape(inputs, [k, b * h, -1])
  projected = tf.reshape(_bmm(flat, kernel), [k, b, h, -1])
  projected += bias[:, None, None, :]
  # Per-step slices by one unstack: a strided slice per step would make the
  # gradient add a full-size zero tensor per step.
  steps = tf.unstack(projected, axis=2)
  return steps, tf.zeros([k, b, units], inputs.dtype)


def _gru(inputs, kernel, recurrent, bias, return_sequences):
  """Keras' GRU (reset_after) over `inputs [K, B, H, I]`."""
  steps, state = _projected_steps(
      inputs, kernel, bias[:, 0], recurrent.shape[1]
  )
  recurrent_bias = bias[:, 1][:, None, :]
  outputs = []
  for step in steps:
    x_z, x_r, x_h = tf.split(step, 3, axis=-1)
    inner = _bmm(state, recurrent) + recurrent_bias
    r_z, r_r, r_h = tf.split(inner, 3, axis=-1)
    z = tf.sigmoid(x_z + r_z)
    r = tf.sigmoid(x_r + r_r)
    candidate = tf.tanh(x_h + r * r_h)
    state = z * state + (1.0 - z) * candidate
    outputs.append(state)
  return tf.stack(outputs, axis=2) if return_sequences else state


def _lstm(inputs, kernel, recurrent, bias, return_sequences):
  """Keras' LSTM over `inputs [K, B, H, I]`."""
  steps, state = _projected_steps(inputs, kernel, bias, recurrent.shape[1])
  carry = tf.zeros_like(state)
  outputs = []
  for step in steps:
    z = step + _bmm(state, recurrent)
    z_i, z_f, z_c, z_o = tf.split(z, 4, axis=-1)
    carry = tf.sigmoid(z_f) * carry + tf.sigmoid(z_i) * tf.tanh(z_c)
    state = tf.sigmoid(z_o) * tf.tanh(carry)
    outputs.append(state)
  return tf.stack(outputs, axis=2) if return_sequences else state


def stacked_forward(keras_model) -> Optional[StackedForward]:
  """`forward(weights, x)`: logits `[K, B, C]` of `x [K, B, H]` ids under
  the stacked trainable weights (each `[K, ...]`, in the model's order), or
  None if the model is not one this module covers."""
  plan = _plan(keras_model)
  if plan is None:
    return None
  window = keras_model.input_shape[1]
  if window is None:
    return None

  def forward(weights, x):
    weights = list(weights)
    pos = 0
    out = None
    for kind, layer, count in plan:
      w = weights[pos : pos + count]
      pos += count
      if kind == 'onehot':
        out = tf.one_hot(tf.cast(x, tf.int32), layer.depth)
      elif kind == 'embedding':  # A one-hot product: a dense gradient.
        ids = tf.one_hot(tf.cast(x, tf.int32), layer.input_dim)
        k, b = tf.unstack(tf.shape(x)[:2])
        flat = tf.reshape(ids, [k, b * window, layer.input_dim])
        out = tf.reshape(_bmm(flat, w[0]), [k, b, window, layer.output_dim])
      elif kind in ('gru', 'lstm'):
        cell = _gru if kind == 'gru' else _lstm
        out = cell(out, w[0], w[1], w[2], layer.return_sequences)
      else:
        out = _bmm(out, w[0]) + w[1][:, None, :]
    return out

  def checked(weights, x):
    x = tf.ensure_shape(x, [None, None, window])
    return forward(weights, x)

  return checked
