"""Independent NumPy oracles of the robust aggregators and FedAvg around them.

Nothing here imports the code under test.
"""

import numpy as np

from tests import oracles


def flat(w, b):
  return np.concatenate([w.ravel(), b.ravel()])


def unflat(v, w_shape, b_size):
  return v[:-b_size].reshape(w_shape), v[-b_size:]


def weiszfeld(points, weights, *, passes, smoothing):
  """Smoothed Weiszfeld from the weighted mean (RFA, Algorithm 2)."""
  points = np.asarray(points, np.float64)
  alpha = np.asarray(weights, np.float64)
  z = alpha @ points / alpha.sum()
  for _ in range(passes):
    beta = alpha / np.maximum(smoothing, np.linalg.norm(points - z, axis=1))
    z = beta @ points / beta.sum()
  return z


def gm_objective(points, weights, z, smoothing):
  d = np.maximum(smoothing, np.linalg.norm(np.asarray(points) - z, axis=1))
  return float(np.dot(weights, d) / np.sum(weights))


def trimmed_mean(points, weights, fraction):
  """Per-coordinate: drop floor(fraction n) at each end, weighted mean."""
  points = np.asarray(points, np.float64)
  weights = np.asarray(weights, np.float64)
  n = len(points)
  k = min(int(np.floor(fraction * n)), (n - 1) // 2)
  out = np.empty(points.shape[1])
  for j in range(points.shape[1]):
    order = np.argsort(points[:, j], kind='stable')[k : n - k]
    out[j] = np.dot(points[order, j], weights[order]) / weights[order].sum()
  return out


def multi_krum(points, weights, *, f, m=None):
  """Blanchard et al. 2017: scores over n - f - 2 neighbours, m lowest."""
  points = np.asarray(points, np.float64)
  weights = np.asarray(weights, np.float64)
  n = len(points)
  neighbours = min(max(n - f - 2, 1), n - 1)
  scores = []
  for i in range(n):
    d = sorted(np.sum((points[i] - points[j]) ** 2) for j in range(n) if j != i)
    scores.append(sum(d[:neighbours]))
  m = n - f if m is None else m
  chosen = np.argsort(scores, kind='stable')[:m]
  return weights[chosen] @ points[chosen] / weights[chosen].sum(), chosen


def clip(points, norm):
  points = np.asarray(points, np.float64)
  norms = np.linalg.norm(points, axis=1, keepdims=True)
  return points * np.minimum(1.0, norm / np.maximum(norms, 1e-30))


def fedavg_with(
    w,
    b,
    rounds,
    aggregate,
    *,
    lr,
    batch_size,
    epochs=1,
    weighting='num_examples',
):
  """FedAvg (server SGD lr 1) with `aggregate(deltas, weights) -> delta`.

  Deltas follow TFF's sign (broadcast minus local model); the server model
  moves by minus the aggregate.
  """
  for clients in rounds:
    deltas, weights = [], []
    for x, y in clients:
      wk, bk, n = oracles.proximal_local_sgd(
          w, b, x, y, lr=lr, mu=0.0, batch_size=batch_size, epochs=epochs
      )
      deltas.append(flat(w - wk, b - bk))
      weights.append(float(n) if weighting == 'num_examples' else 1.0)
    step = aggregate(np.asarray(deltas), np.asarray(weights))
    dw, db = unflat(step, w.shape, b.size)
    w, b = w - dw, b - db
  return w, b
