# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""Ditto's best fixed lambda on federated linear regression vs lambda*.

Thesis section 5.4 (Theorems 6-9; spec `thesis_algorithms.md` section 6.5):
device models w_k = theta + zeta_k, zeta_k ~ N(0, tau^2 I_d); data
y = X_k w_k + z, z ~ N(0, sigma^2), n samples per device with
X_k^T X_k = beta I_d. With F_k(w) = 1/(2n) ||X_k w - y_k||^2 (the
normalisation of the thesis's solution (5.23)) the lambda minimising the
expected test error of Ditto's personal models is lambda* = sigma^2 /
(n tau^2).

The sweep runs our Ditto (`tff_algos.ditto.build_ditto`, TFF simulation) with
a lambda grid, one personal model per lambda on every device, full
participation, and measures each lambda's mean squared parameter error
||v_k - w_k||^2 over devices and trials (the expected excess test MSE, since
X^T X = beta I). It also checks that the personal models converged to the
closed-form Ditto solution (5.23), and computes the same curve from that
closed form over many more trials (NumPy), for a precise argmin.

  python -m run.experiments.ditto_lambda_sweep --trials=3 \
      --output_md=docs/results/ditto_lambda_sweep.part.md
"""

import os
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from run import atomic
from run import console
from run import run_dir
from tff_algos import ditto
from tff_algos import runtime

# pylint: enable=g-import-not-at-top,wrong-import-position

# Flags are defined at start-up only: absl flags are global, and the test
# suite and the API-docs build import several binaries into one process.
_TRIALS = None
_NUMPY_TRIALS = None
_DEVICES = None
_DIM = None
_N = None
_SIGMA = None
_TAU2 = None
_ROUNDS = None
_STEPS = None
_OUTPUT = None


def define_flags() -> None:
  """Defines the command-line flags."""
  global _TRIALS, _NUMPY_TRIALS, _DEVICES, _DIM, _N, _SIGMA, _TAU2, _ROUNDS
  global _STEPS, _OUTPUT
  _TRIALS = flags.DEFINE_integer('trials', 3, 'Independent draws (TFF runs).')
  _NUMPY_TRIALS = flags.DEFINE_integer(
      'numpy_trials', 2000, 'Draws of the closed-form curve.'
  )
  _DEVICES = flags.DEFINE_integer('devices', 40, 'K devices.')
  _DIM = flags.DEFINE_integer('dim', 5, 'd.')
  _N = flags.DEFINE_integer('n', 10, 'Samples per device (beta = n).')
  _SIGMA = flags.DEFINE_float('sigma', 1.0, 'Label noise sigma.')
  _TAU2 = flags.DEFINE_list(
      'tau2', ['1', '0.1', '0.01'], 'tau^2 values, one sweep each.'
  )
  _ROUNDS = flags.DEFINE_integer('rounds', 20, 'Ditto rounds.')
  _STEPS = flags.DEFINE_integer(
      'personal_steps', 100, 'Personal steps s per round.'
  )
  _OUTPUT = flags.DEFINE_string('output_md', None, 'Markdown table to write.')

  # 16 lambdas, a quarter decade apart, none a power of ten.


GRID = tuple(float(10 ** (-1.875 + 0.25 * k)) for k in range(16))


def draw(rng, *, devices, dim, n, sigma, tau2):
  """`(X, Y, w_true)`: X_k = sqrt(n) Q_k (orthonormal columns)."""
  theta = rng.normal(size=dim)
  xs, ys, ws = [], [], []
  for _ in range(devices):
    q, _ = np.linalg.qr(rng.normal(size=(n, dim)))
    x = np.sqrt(n) * q  # X^T X = n I: beta = n.
    w = theta + np.sqrt(tau2) * rng.normal(size=dim)
    y = x @ w + sigma * rng.normal(size=n)
    xs.append(x)
    ys.append(y)
    ws.append(w)
  return xs, ys, np.asarray(ws)


def closed_form(xs, ys, lam):
  """The Ditto solution (5.23) with w* the minimiser of sum_k F_k."""
  n = xs[0].shape[0]
  w_hat = [np.linalg.lstsq(x, y, rcond=None)[0] for x, y in zip(xs, ys)]
  w_star = np.mean(w_hat, axis=0)  # Equal X^T X: the mean of the w_hat.
  return np.asarray(
      [
          np.linalg.solve(
              x.T @ x / n + lam * np.eye(x.shape[1]), x.T @ y / n + lam * w_star
          )
          for x, y in zip(xs, ys)
      ]
  )


def model_fn_for(dim):
  """Linear regression without bias, loss 1/(2n) ||Xw - y||^2 per batch."""
  spec = (
      tf.TensorSpec([None, dim], tf.float32),
      tf.TensorSpec([None, 1], tf.float32),
  )

  class HalfMSE(tf.keras.losses.Loss):

    def call(self, y_true, y_pred):
      return 0.5 * tf.reduce_mean(tf.square(y_true - y_pred), axis=-1)

  def model_fn():
    keras_model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(dim,)),
            tf.keras.layers.Dense(
                1, use_bias=False, kernel_initializer='zeros'
            ),
        ]
    )
    return tff.learning.models.from_keras_model(
        keras_model, loss=HalfMSE(), input_spec=spec
    )

  return model_fn


def tff_sweep(xs, ys, *, rounds, personal_steps, grid=GRID):
  """Runs Ditto with the lambda grid; returns v[g, k] (d-vectors)."""
  dim, n = xs[0].shape[1], xs[0].shape[0]
  beta_over_n = 1.0  # X^T X / n = I.
  process = ditto.build_ditto(
      model_fn_for(dim),
      tff.learning.optimizers.build_sgdm(learning_rate=1.0 / beta_over_n),
      lam=list(grid),
      personal_optimizer_fn=tff.learning.optimizers.build_sgdm(
          learning_rate=1.0 / (beta_over_n + max(grid))
      ),
      personal_steps=personal_steps,
      client_weighting=tff.learning.ClientWeighting.UNIFORM,
  )
  data = [
      tf.data.Dataset.from_tensor_slices(
          (x.astype(np.float32), y[:, None].astype(np.float32))
      ).batch(n)
      for x, y in zip(xs, ys)
  ]
  state = process.initialize()
  states = [process.initial_client_state() for _ in xs]
  for _ in range(rounds):
    out = process.next(state, data, states)
    state, states = out.state, out.client_states
  return np.asarray(
      [
          [np.ravel(s['personal'][g][0]) for s in states]
          for g in range(len(grid))
      ]
  )


def main(argv) -> int:
  code = console.unexpected_arguments('ditto_lambda_sweep', argv)
  if code is not None:
    return code
  if run_dir.refuse_output_file(
      _OUTPUT.value, flag='--output_md', prog='ditto_lambda_sweep'
  ):
    return 2
  runtime.install_worker_cleanup()
  sigma, n = _SIGMA.value, _N.value
  lines = [
      '| tau^2 | lambda* = sigma^2/(n tau^2) | best grid lambda (TFF Ditto, '
      f'{_TRIALS.value} x {_DEVICES.value} devices) | best grid lambda '
      f'(closed form, {_NUMPY_TRIALS.value} x {_DEVICES.value}) | '
      'MSE at best / at lambda=0 / at largest | max |v - closed form| |',
      '|---|---|---|---|---|---|',
  ]
  curves = {}
  for tau2 in (float(t) for t in _TAU2.value):
    lam_star = sigma**2 / (n * tau2)
    rng = np.random.default_rng([7, int(round(1e6 * tau2))])
    t0 = time.time()
    errors = np.zeros(len(GRID))
    max_dev = 0.0
    local_err = 0.0
    for _ in range(_TRIALS.value):
      xs, ys, w_true = draw(
          rng,
          devices=_DEVICES.value,
          dim=_DIM.value,
          n=n,
          sigma=sigma,
          tau2=tau2,
      )
      v = tff_sweep(xs, ys, rounds=_ROUNDS.value, personal_steps=_STEPS.value)
      for g, lam in enumerate(GRID):
        errors[g] += np.mean(np.sum((v[g] - w_true) ** 2, axis=1))
        max_dev = max(max_dev, np.abs(v[g] - closed_form(xs, ys, lam)).max())
      local_err += np.mean(
          np.sum((closed_form(xs, ys, 0.0) - w_true) ** 2, axis=1)
      )
    # --trials=0: the closed-form curve only (no TFF run).
    errors /= max(_TRIALS.value, 1)
    local_err /= max(_TRIALS.value, 1)
    np_errors = np.zeros(len(GRID))
    for _ in range(_NUMPY_TRIALS.value):
      xs, ys, w_true = draw(
          rng,
          devices=_DEVICES.value,
          dim=_DIM.value,
          n=n,
          sigma=sigma,
          tau2=tau2,
      )
      # X^T X / n = I: (5.23) is (w_hat_k + lambda w*) / (1 + lambda).
      w_hat = np.asarray([x.T @ y / n for x, y in zip(xs, ys)])
      w_star = w_hat.mean(axis=0)
      for g, lam in enumerate(GRID):
        v = (w_hat + lam * w_star) / (1.0 + lam)
        np_errors[g] += np.mean(np.sum((v - w_true) ** 2, axis=1))
    np_errors /= _NUMPY_TRIALS.value
    if not _TRIALS.value:
      errors = np_errors
    best, np_best = (
        GRID[int(np.argmin(errors))],
        GRID[int(np.argmin(np_errors))],
    )
    curves[tau2] = (errors, np_errors)
    lines.append(
        f'| {tau2:g} | {lam_star:.4g} | {best:.4g} (x{best / lam_star:.2f}) |'
        f' {np_best:.4g} (x{np_best / lam_star:.2f}) | {errors.min():.4g} / '
        f'{local_err:.4g} / {errors[-1]:.4g} | {max_dev:.2g} |'
    )
    print(lines[-1], f'({time.time() - t0:.0f} s)', file=sys.stderr)
  lines.append('')
  lines.append(
      'Mean squared parameter error per grid lambda (TFF Ditto; '
      'closed form in parentheses):'
  )
  lines.append('')
  lines.append(
      '| lambda | ' + ' | '.join(f'tau^2={t:g}' for t in curves) + ' |'
  )
  lines.append('|---|' + '---|' * len(curves))
  for g, lam in enumerate(GRID):
    lines.append(
        f'| {lam:.4g} | '
        + ' | '.join(f'{c[0][g]:.4g} ({c[1][g]:.4g})' for c in curves.values())
        + ' |'
    )
  text = '\n'.join(lines) + '\n'
  print(text)
  if _OUTPUT.value:
    atomic.write_text(_OUTPUT.value, text)
  runtime.kill_workers()
  return 0


def run_main() -> None:
  """Console-script entry point."""
  define_flags()
  console.run(__name__, main)


if __name__ == '__main__':
  run_main()
