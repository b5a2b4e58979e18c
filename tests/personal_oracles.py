"""Independent NumPy oracles of Ditto and Fed+ on softmax regression.

Written from the papers' update rules (thesis Algorithm 7; Fed+ Algorithm 1
with the errata decided in docs/algorithms.md); nothing here imports the code
under test.
"""

import numpy as np

from tests import oracles


def sgd_steps(w, b, batches, *, lr, lam=0.0, anchor=None):
  """Mini-batch SGD on F(v) + lam/2 ||v - anchor||^2 from (w, b)."""
  for xb, yb in batches:
    gw, gb = oracles.softmax_regression_grads(w, b, xb, yb)
    if lam:
      gw = gw + lam * (w - anchor[0])
      gb = gb + lam * (b - anchor[1])
    w, b = w - lr * gw, b - lr * gb
  return w, b


def client_batches(x, y, batch_size, epochs=1, steps=None):
  """The round's batches: `epochs` passes, or exactly `steps` (cycling)."""
  if steps is None:
    return list(oracles.batches(x, y, batch_size, epochs))
  one_pass = list(oracles.batches(x, y, batch_size, 1))
  return [one_pass[i % len(one_pass)] for i in range(steps)]


def ditto_rounds(
    rounds,
    *,
    lambdas,
    lr,
    personal_lr,
    batch_size,
    epochs,
    personal_steps=None,
    weighting='num_examples',
    clip=None,
):
  """Ditto (Algorithm 7) with clients keyed by id.

  Args:
    rounds: List of rounds, each a list of `(client_id, x, y)`.
    lambdas: One personal model per lambda.
    lr, personal_lr: eta_g and eta_l.
    batch_size, epochs: Local stream.
    personal_steps: s (None: the global stream).
    weighting: `num_examples` or `uniform` weights of the deltas.
    clip: If set, each delta is clipped to this l2 norm before the mean.

  Returns:
    `((w, b), personal)` with `personal[client_id][g] = (w, b)`.
  """
  w, b = np.zeros((60, 10)), np.zeros(10)
  personal = {}
  for clients in rounds:
    deltas, weights = [], []
    for cid, x, y in clients:
      batches = client_batches(x, y, batch_size, epochs)
      wk, bk = sgd_steps(w, b, batches, lr=lr)
      delta = (w - wk, b - bk)
      if clip is not None:
        norm = np.sqrt(np.sum(delta[0] ** 2) + np.sum(delta[1] ** 2))
        scale = min(1.0, clip / norm) if norm > 0 else 1.0
        delta = (delta[0] * scale, delta[1] * scale)
      deltas.append(delta)
      weights.append(len(y) * epochs if weighting == 'num_examples' else 1.0)
      pbatches = (
          batches
          if personal_steps is None
          else client_batches(x, y, batch_size, steps=personal_steps)
      )
      old = personal.get(
          cid, [(np.zeros((60, 10)), np.zeros(10))] * len(lambdas)
      )
      personal[cid] = [
          sgd_steps(
              v[0], v[1], pbatches, lr=personal_lr, lam=lam, anchor=(w, b)
          )
          for v, lam in zip(old, lambdas)
      ]
    a = np.asarray(weights, np.float64) / np.sum(weights)
    w = w - sum(ai * d[0] for ai, d in zip(a, deltas))
    b = b - sum(ai * d[1] for ai, d in zip(a, deltas))
  return (w, b), personal


def fedplus_prox(psi, v, delta):
  """prox of Psi / sigma on a list of arrays (errata: signed soft-threshold)."""
  if psi == 'avg':
    return [a / (1.0 + delta) for a in v]
  if psi == 'zero':
    return [np.zeros_like(a) for a in v]
  if psi == 'comed':
    return [np.sign(a) * np.maximum(np.abs(a) - delta, 0.0) for a in v]
  norm = np.sqrt(sum(np.sum(a**2) for a in v))
  scale = max(0.0, 1.0 - delta / norm) if norm > 0 else 0.0
  return [scale * a for a in v]


def fedplus_aggregate(psi, models, delta, iterations):
  """w~ <- w_mean - Mean_k prox(w_k - w~), from w_mean (eq. 13)."""
  mean = [np.mean([m[i] for m in models], axis=0) for i in range(2)]
  if psi in ('avg', 'zero'):
    return mean
  agg = mean
  for _ in range(iterations):
    thetas = [
        fedplus_prox(psi, [m[i] - agg[i] for i in range(2)], delta)
        for m in models
    ]
    agg = [mean[i] - np.mean([t[i] for t in thetas], axis=0) for i in range(2)]
  return agg


def fedplus_rounds(
    rounds,
    *,
    psi,
    lr,
    sigma,
    delta,
    lam,
    batch_size,
    epochs=1,
    local_steps=None,
    iterations=20,
):
  """Fed+ Algorithm 1 over the sampled parties; returns `(global, locals)`."""
  kappa = 1.0 / (1.0 + lr * sigma)
  g = [np.zeros((60, 10)), np.zeros(10)]
  local = {}
  for clients in rounds:
    new_models = []
    for cid, x, y in clients:
      wk = local.get(cid, [np.zeros((60, 10)), np.zeros(10)])
      theta = fedplus_prox(psi, [wk[i] - g[i] for i in range(2)], delta)
      anchor = [g[i] + theta[i] for i in range(2)]
      w = [(1 - lam) * wk[i] + lam * g[i] for i in range(2)]
      for xb, yb in client_batches(x, y, batch_size, epochs, local_steps):
        grads = oracles.softmax_regression_grads(w[0], w[1], xb, yb)
        w = [
            kappa * (w[i] - lr * grads[i]) + (1 - kappa) * anchor[i]
            for i in range(2)
        ]
      local[cid] = w
      new_models.append(w)
    g = fedplus_aggregate(psi, new_models, delta, iterations)
  return g, local
