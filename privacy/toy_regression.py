# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The thesis's toy problem for AdaDPS and DP^2 (section 6.2.1).

A sparse linear regression: n = 1,000 examples of d = 500 binary features,
the first 50 frequent (present with probability 0.9) and the rest rare
(0.01); the target weights are small on the frequent features and large on
the rare ones, so that side information about feature frequency (AdaDPS) or
a preconditioner learned from noisy gradients (DP^2) helps. DP-SGD runs
`steps` steps of Poisson-sampled batches of expected size `batch` at the
noise that gives epsilon = 4.13 at delta = 1e-3 (`toy_sigma`).

`run.experiments.privacy_experiments` reproduces the thesis's comparison on
it, and `examples/privacy.ipynb` uses it; it lives in the library so that
the notebook runs from the installed wheel too.
"""

import numpy as np

from privacy import accounting

TOY = dict(
    n=1000,
    d=500,
    frequent=50,
    steps=500,
    batch=50,
    delta=1e-3,
    target_epsilon=4.13,
)


def toy_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """`(x, y)`: the sparse linear regression of thesis section 6.2.1."""
  rng = np.random.default_rng(seed)
  n, d, k = TOY['n'], TOY['d'], TOY['frequent']
  p = np.where(np.arange(d) < k, 0.9, 0.01)
  x = (rng.random((n, d)) < p).astype(np.float64)
  w_true = np.where(np.arange(d) < k, 0.01, 1.0)
  y = x @ w_true + rng.normal(0.0, 0.1, size=n)
  return x, y


def toy_loss(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
  """The mean squared error over two."""
  return float(0.5 * np.mean((x @ w - y) ** 2))


def toy_sigma() -> float:
  """sigma with epsilon(T steps) = 4.13 at delta 1e-3, Poisson q = b / n."""
  mech = lambda z: accounting.DpMechanism(  # pylint: disable=g-long-lambda
      z, TOY['batch'], TOY['n'], 'poisson'
  )
  return accounting.calibrate_noise_multiplier(
      TOY['target_epsilon'], TOY['delta'], TOY['steps'], mech, tol=1e-3
  )
