# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""Fed+ section 5.1 synthetic regression: FedGeoMed+, FedCoMed+, FedAvg+ and
FedAvg.

Data: `tasks.fedplus_regression` (10 parties, d = 1000, the last one an
outlier). Every party participates every round (K = N = 10), batch 10,
E_k = 20 local iterations (4 in-order passes over the 50 training samples),
eta = 1e-4, delta = 0.1, lambda = 0, T rounds; FedAvg uses the same eta and
E. Error = per-sample test MSE of each party's model on its own test half
(Fed+: the local model w_k; FedAvg: the global model), averaged over parties
and seeds.

Two back ends run the same algorithms on the same data and batch order:

* `numpy` (default): a NumPy implementation of Algorithm 1 and FedAvg, fast
  enough for the paper's 500 rounds x 5 seeds on a shared 2-core machine;
* `tff`: the library's `build_fed_plus` / `build_fed_avg` processes in TFF
  simulation (about 4 s per round here, so used for short checks that both
  back ends agree).

  python -m run.experiments.fedplus_regression --sigmas=1,100 \
      --seeds=0,1,2,3,4 \
      --rounds=500
  python -m run.experiments.fedplus_regression --backend=tff --sigmas=100 \
      --seeds=0 \
      --rounds=20
"""

import os
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
import numpy as np

from run import atomic
from run import console
from run import run_dir
from tasks import fedplus_regression

# pylint: enable=g-import-not-at-top,wrong-import-position

METHODS = ('fedgeomed_plus', 'fedcomed_plus', 'fedavg_plus', 'fedavg')
PSI = {
    'fedgeomed_plus': 'geomed',
    'fedcomed_plus': 'comed',
    'fedavg_plus': 'avg',
}

# Flags are defined at start-up only: absl flags are global, and the test
# suite and the API-docs build import several binaries into one process.
_BACKEND = None
_SIGMAS = None
_SEEDS = None
_ROUNDS = None
_LR = None
_DELTA = None
_STEPS = None
_BATCH = None
_ITERS = None
_METHODS = None
_OUTPUT = None


def define_flags() -> None:
  """Defines the command-line flags."""
  global _BACKEND, _SIGMAS, _SEEDS, _ROUNDS, _LR, _DELTA, _STEPS, _BATCH
  global _ITERS, _METHODS, _OUTPUT
  _BACKEND = flags.DEFINE_enum(
      'backend', 'numpy', ['numpy', 'tff'], 'Implementation to run.'
  )
  _SIGMAS = flags.DEFINE_list('sigmas', ['1', '100'], 'Fed+ sigma values.')
  _SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2', '3', '4'], 'Data seeds.')
  _ROUNDS = flags.DEFINE_integer('rounds', 500, 'Rounds T.')
  _LR = flags.DEFINE_float('lr', 1e-4, 'eta.')
  _DELTA = flags.DEFINE_float('delta', 0.1, 'delta.')
  _STEPS = flags.DEFINE_integer('local_steps', 20, 'E_k.')
  _BATCH = flags.DEFINE_integer('batch_size', 10, 'Batch size.')
  _ITERS = flags.DEFINE_integer(
      'aggregation_iterations', 20, 'Fixed-point iterations (geomed, comed).'
  )
  _METHODS = flags.DEFINE_list('methods', list(METHODS), 'Methods to run.')
  _OUTPUT = flags.DEFINE_string('output_md', None, 'Markdown table to write.')


def prox(psi, v, delta):
  """prox of Psi/sigma on the rows of `v` (signed soft-threshold for comed)."""
  if psi == 'avg':
    return v / (1.0 + delta)
  if psi == 'comed':
    return np.sign(v) * np.maximum(np.abs(v) - delta, 0.0)
  norm = np.linalg.norm(v, axis=-1, keepdims=True)
  return np.maximum(norm - delta, 0.0) / np.maximum(norm, 1e-300) * v


def aggregate(psi, models, delta, iterations):
  """w~ <- w_mean - Mean_k prox(w_k - w~), from w_mean; `models` is (N, d)."""
  mean = models.mean(axis=0)
  if psi == 'avg':
    return mean
  agg = mean
  for _ in range(iterations):
    agg = mean - prox(psi, models - agg, delta).mean(axis=0)
  return agg


def run_numpy(
    method, parties, *, sigma, lr, delta, steps, batch_size, rounds, iterations
):
  """Returns `(per-party models evaluated, global model)`.

  Vectorised over parties (every party takes part in every round, and all
  have the same number of samples, so their batches line up).
  """
  dim = parties[0][0].shape[1]
  half = len(parties[0][1]) // 2
  xs = np.stack([x[:half] for x, _ in parties]).astype(np.float64)
  ys = np.stack([y[:half] for _, y in parties]).astype(np.float64)
  starts = list(range(0, half, batch_size))
  plan = [
      (xs[:, s : s + batch_size], ys[:, s : s + batch_size])
      for s in (starts[i % len(starts)] for i in range(steps))
  ]
  del parties

  def grads(w, xb, yb):  # w: (N, d); xb: (N, b, d); yb: (N, b).
    residual = np.matmul(xb, w[:, :, None])[:, :, 0] - yb
    return 2.0 * np.matmul(residual[:, None, :], xb)[:, 0, :] / xb.shape[1]

  num = xs.shape[0]
  g = np.zeros(dim)
  local = np.zeros((num, dim))
  for _ in range(rounds):
    if method == 'fedavg':
      w = np.tile(g, (num, 1))
      for xb, yb in plan:
        w = w - lr * grads(w, xb, yb)
      g = w.mean(axis=0)
      continue
    psi = PSI[method]
    kappa = 1.0 / (1.0 + lr * sigma)
    anchor = g + prox(psi, local - g, delta)
    w = local.copy()  # lambda = 0.
    for xb, yb in plan:
      w = kappa * (w - lr * grads(w, xb, yb)) + (1 - kappa) * anchor
    local = w
    g = aggregate(psi, local, delta, iterations)
  evaluated = np.tile(g, (num, 1)) if method == 'fedavg' else local
  return evaluated, g


def run_tff(
    method, parties, *, sigma, lr, delta, steps, batch_size, rounds, iterations
):
  """The library's processes on the same data and batch order."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from tff_algos import fed_avg  # pylint: disable=g-import-not-at-top
  from tff_algos import fed_plus  # pylint: disable=g-import-not-at-top

  dim = parties[0][0].shape[1]
  model_fn = fedplus_regression.create_linear_regression_model_fn(dim)
  half = len(parties[0][1]) // 2
  passes = -(-steps // -(-half // batch_size))
  data = [
      tf.data.Dataset.from_tensor_slices((x[:half], y[:half, None]))
      .batch(batch_size)
      .repeat(passes)
      .take(steps)
      for x, y in parties
  ]
  if method == 'fedavg':
    process = fed_avg.build_fed_avg(
        model_fn,
        tff.learning.optimizers.build_sgdm(learning_rate=lr),
        client_weighting=tff.learning.ClientWeighting.UNIFORM,
    )
    state = process.initialize()
    for _ in range(rounds):
      state = process.next(state, data).state
    g = np.ravel(process.get_model_weights(state).trainable[0])
    return np.tile(g, (len(parties), 1)), g
  process = fed_plus.build_fed_plus(
      model_fn,
      psi=PSI[method],
      learning_rate=lr,
      sigma=sigma,
      delta=delta,
      aggregation_iterations=iterations,
  )
  state = process.initialize()
  states = [process.initial_client_state() for _ in parties]
  for _ in range(rounds):
    out = process.next(state, data, states)
    state, states = out.state, out.client_states
  local = np.asarray([np.ravel(s['personal'][0][0]) for s in states])
  return local, np.ravel(process.get_model_weights(state).trainable[0])


def test_mse(models, parties):
  errors = []
  for w, (x, y) in zip(models, parties):
    xt, yt = x[len(y) // 2 :].astype(np.float64), y[len(y) // 2 :]
    errors.append(np.mean((xt @ w - yt) ** 2))
  return np.asarray(errors)


def main(argv) -> int:
  code = console.unexpected_arguments('fedplus_regression', argv)
  if code is not None:
    return code
  if run_dir.refuse_output_file(
      _OUTPUT.value, flag='--output_md', prog='fedplus_regression'
  ):
    return 2
  if _BACKEND.value == 'tff':
    from tff_algos import runtime  # pylint: disable=g-import-not-at-top

    runtime.install_worker_cleanup()
  run = run_numpy if _BACKEND.value == 'numpy' else run_tff
  sigmas = [float(s) for s in _SIGMAS.value]
  seeds = [int(s) for s in _SEEDS.value]
  results = {}
  for sigma in sigmas:
    for method in _METHODS.value:
      if method == 'fedavg' and sigma != sigmas[0]:
        results[(sigma, method)] = results[(sigmas[0], method)]
        continue
      per_seed, outlier, global_err = [], [], []
      t0 = time.time()
      for seed in seeds:
        parties = fedplus_regression.generate(seed=seed)
        models, g = run(
            method,
            parties,
            sigma=sigma,
            lr=_LR.value,
            delta=_DELTA.value,
            steps=_STEPS.value,
            batch_size=_BATCH.value,
            rounds=_ROUNDS.value,
            iterations=_ITERS.value,
        )
        errors = test_mse(models, parties)
        per_seed.append(errors.mean())
        outlier.append(errors[-1])
        global_err.append(test_mse([g] * len(parties), parties).mean())
      results[(sigma, method)] = (
          np.mean(per_seed),
          np.std(per_seed),
          np.mean(outlier),
          np.mean(global_err),
          per_seed,
      )
      print(
          f'sigma={sigma:g} {method}: test MSE {np.mean(per_seed):.1f} '
          f'(per seed {np.round(per_seed, 1).tolist()}; '
          f'{time.time() - t0:.0f} s)',
          file=sys.stderr,
      )
  lines = [
      f'Backend `{_BACKEND.value}`, {_ROUNDS.value} rounds, seeds {seeds}, '
      f'eta={_LR.value:g}, delta={_DELTA.value:g}, E_k={_STEPS.value}, '
      f'batch {_BATCH.value}, {_ITERS.value} aggregation iterations.',
      '',
      '| sigma | kappa | method | test MSE (mean over parties, mean +- std'
      ' over seeds) | outlier party | 9 regular parties | global model |',
      '|---|---|---|---|---|---|---|',
  ]
  for sigma in sigmas:
    kappa = 1.0 / (1.0 + _LR.value * sigma)
    for method in _METHODS.value:
      mean, std, out, glob, per_seed = results[(sigma, method)]
      regular = (10 * mean - out) / 9
      lines.append(
          f'| {sigma:g} | {kappa:.6g} | {method} | {mean:.1f} +- {std:.1f} | '
          f'{out:.1f} | {regular:.1f} | {glob:.1f} |'
      )
  text = '\n'.join(lines) + '\n'
  print(text)
  if _OUTPUT.value:
    atomic.write_text(_OUTPUT.value, text)
  if _BACKEND.value == 'tff':
    from tff_algos import runtime  # pylint: disable=g-import-not-at-top

    runtime.kill_workers()
  return 0


def run_main() -> None:
  """Console-script entry point."""
  define_flags()
  console.run(__name__, main)


if __name__ == '__main__':
  run_main()
