"""Independent NumPy oracles of the algorithms, on softmax regression.

Nothing here imports the code under test: each oracle is written from the
papers' update rules.
"""

import numpy as np


def softmax_regression_grads(w, b, x, y):
  """Gradients of the mean cross-entropy of softmax(x @ w + b) at (w, b)."""
  logits = x @ w + b
  logits = logits - logits.max(axis=1, keepdims=True)
  p = np.exp(logits)
  p /= p.sum(axis=1, keepdims=True)
  p[np.arange(len(y)), y] -= 1.0
  p /= len(y)
  return x.T @ p, p.sum(axis=0)


def softmax_regression_loss(w, b, x, y):
  logits = x @ w + b
  logits = logits - logits.max(axis=1, keepdims=True)
  log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
  return float(-log_p[np.arange(len(y)), y].mean())


def batches(x, y, batch_size, epochs):
  """The batches of `epochs` in-order passes, never straddling an epoch."""
  for _ in range(epochs):
    for start in range(0, len(y), batch_size):
      yield x[start : start + batch_size], y[start : start + batch_size]


def proximal_local_sgd(
    w0, b0, x, y, *, lr, mu, batch_size, epochs, max_batches=None
):
  """FedProx's local solver: SGD on F_k(w) + mu/2 ||w - w0||^2 from w0.

  Returns:
    `(w, b, num_examples_processed)`.
  """
  w, b = w0.copy(), b0.copy()
  n = 0
  for i, (xb, yb) in enumerate(batches(x, y, batch_size, epochs)):
    if max_batches is not None and i >= max_batches:
      break
    gw, gb = softmax_regression_grads(w, b, xb, yb)
    w = w - lr * (gw + mu * (w - w0))
    b = b - lr * (gb + mu * (b - b0))
    n += len(yb)
  return w, b, n


def fedprox_rounds(
    w, b, rounds, *, lr, mu, batch_size, epochs, weighting='num_examples'
):
  """FedProx / FedAvg server loop (server lr 1: weighted mean of models).

  Args:
    w, b: Initial global model.
    rounds: A list of rounds, each a list of `(x, y)` client arrays.
    lr, mu, batch_size, epochs: Local solver settings.
    weighting: `num_examples` (weights = examples processed) or `uniform`.

  Returns:
    The final `(w, b)`.
  """
  for clients in rounds:
    models, weights = [], []
    for x, y in clients:
      wk, bk, n = proximal_local_sgd(
          w, b, x, y, lr=lr, mu=mu, batch_size=batch_size, epochs=epochs
      )
      models.append((wk, bk))
      weights.append(n if weighting == 'num_examples' else 1.0)
    weights = np.asarray(weights, dtype=np.float64) / np.sum(weights)
    w = sum(a * m[0] for a, m in zip(weights, models))
    b = sum(a * m[1] for a, m in zip(weights, models))
  return w, b


def q_ffl_rounds(
    w, b, rounds, *, q, lipschitz, lr=None, batch_size=None, epochs=1
):
  """q-FedAvg (lr given) or q-FedSGD (lr None), Li et al. ICLR 2020, Alg 3/4."""
  for clients in rounds:
    sum_dw, sum_db, sum_h = 0.0, 0.0, 0.0
    for x, y in clients:
      loss = softmax_regression_loss(w, b, x, y)
      if lr is None:
        dw, db = softmax_regression_grads(w, b, x, y)
      else:
        wk, bk, _ = proximal_local_sgd(
            w, b, x, y, lr=lr, mu=0.0, batch_size=batch_size, epochs=epochs
        )
        dw, db = lipschitz * (w - wk), lipschitz * (b - bk)
      sq_norm = np.sum(dw**2) + np.sum(db**2)
      sum_dw = sum_dw + loss**q * dw
      sum_db = sum_db + loss**q * db
      sum_h += (
          q * loss ** (q - 1) * sq_norm if q else 0.0
      ) + lipschitz * loss**q
    w = w - sum_dw / sum_h
    b = b - sum_db / sum_h
  return w, b


def tilted_weights(losses, num_examples, tilt):
  """TERM client weights n_k exp(t F_k) / sum_j n_j exp(t F_j)."""
  losses = np.asarray(losses, dtype=np.float64)
  logits = tilt * losses + np.log(np.asarray(num_examples, dtype=np.float64))
  logits -= logits.max()
  weights = np.exp(logits)
  return weights / weights.sum()


def project_simplex_bisection(v, iters=200):
  """Projection onto the simplex by bisection on the threshold theta."""
  v = np.asarray(v, dtype=np.float64)
  lo, hi = v.min() - 1.0, v.max()
  for _ in range(iters):
    theta = (lo + hi) / 2
    if np.maximum(v - theta, 0).sum() > 1:
      lo = theta
    else:
      hi = theta
  return np.maximum(v - (lo + hi) / 2, 0)


def afl_rounds(w, b, clients, rounds, *, lr_w, lr_lambda, participants=None):
  """AFL with full local gradients; all clients every round by default.

  `participants[t]` (optional) lists the client indices of round t: the
  descent step averages their gradients with weights lambda_k (normalised
  over them), and only their coordinates of lambda get the ascent step
  before the projection.
  """
  mix = np.full(len(clients), 1.0 / len(clients))
  for t in range(rounds):
    part = range(len(clients)) if participants is None else participants[t]
    losses = np.zeros(len(clients))
    gw, gb = np.zeros_like(w), np.zeros_like(b)
    for k in part:
      x, y = clients[k]
      losses[k] = softmax_regression_loss(w, b, x, y)
      g = softmax_regression_grads(w, b, x, y)
      gw, gb = gw + mix[k] * g[0], gb + mix[k] * g[1]
    total = sum(mix[k] for k in part)
    if total > 0:
      w, b = w - lr_w * gw / total, b - lr_w * gb / total
    mix = project_simplex_bisection(mix + lr_lambda * losses)
  return w, b, mix
