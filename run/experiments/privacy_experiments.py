# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""Privacy reproductions (issue 6): AdaDPS toy problem, DP-FedAvg vs epsilon.

  python -m run.experiments.privacy_experiments --experiment=adadps_toy
  python -m run.experiments.privacy_experiments --experiment=dpfedavg_synthetic
  python -m run.experiments.privacy_experiments --experiment=dp2_toy

* `adadps_toy` (thesis section 6.2.1, Figure 6.4): sparse linear regression,
  d = 500, n = 1000; features j <= 50 are 1 with probability 0.9 (true
  w_j = 0.01), the others with probability 0.01 (w_j = 1); y = <w, x> + b,
  b ~ N(0, 0.01) (read as variance). AdaDPS uses A_j = 1 (j <= 50), 0.01
  otherwise. SGD, AdaS (non-private AdaDPS), DP-SGD and AdaDPS; the private
  runs share sigma, b, T, hence (epsilon, delta) = (4.13, 1e-3) by RDP with
  Poisson sampling. Learning rate and clip are tuned per method on run 0 by
  final training loss (the thesis tunes lr per method); 5 runs reported.
* `dpfedavg_synthetic`: DP-FedAvg (uniform weights, Poisson sampling of 20 of
  100 clients, fixed clip) on Synthetic(1,1) through the training binary at
  several target epsilons (delta 1e-3), plus the non-private run.
* `dp2_toy`: DP-SGD, DP-RMSProp (privatize then precondition) and DP^2-RMSProp
  (Algorithm 11) on the same sparse regression at the same budget, without
  side information.

Each writes a Markdown table (with the commands) to --output (stdout if
empty). A SIGTERM, SIGINT or SIGHUP to `dpfedavg_synthetic` ends the running
training run and its TFF workers and starts no other (as
run.experiments.reproduce does, with `run.tail_benchmark.processes`);
rerunning the same command resumes from the run's last checkpoint.
"""

import concurrent.futures
import json
import sys
import time

from absl import flags
import numpy as np

from run import atomic
from run import console
from run import run_dir
from run.experiments import reproduce
from run.tail_benchmark import processes
from privacy import accounting
from privacy import adadps
from privacy import dp2
from privacy import toy_regression
from tff_algos import runtime

# Flags are defined at start-up only: absl flags are global, and the test
# suite and the API-docs build import several binaries into one process.
_EXPERIMENT = None
_OUTPUT = None
_ROOT = None
_RUNS = None
_ROUNDS = None
_EPSILONS = None
_SEEDS = None


def define_flags() -> None:
  """Defines the command-line flags."""
  global _EXPERIMENT, _OUTPUT, _ROOT, _RUNS, _ROUNDS, _EPSILONS, _SEEDS
  _EXPERIMENT = flags.DEFINE_enum(
      'experiment',
      'adadps_toy',
      ['adadps_toy', 'dpfedavg_synthetic', 'dp2_toy'],
      'Which reproduction.',
  )
  _OUTPUT = flags.DEFINE_string('output', '', 'Markdown file to write.')
  _ROOT = flags.DEFINE_string(
      'root_output_dir',
      'output/privacy',
      'dpfedavg_synthetic: training outputs.',
  )
  _RUNS = flags.DEFINE_integer('runs', 5, 'Toy problems: runs per method.')
  _ROUNDS = flags.DEFINE_integer(
      'total_rounds', 100, 'dpfedavg_synthetic: rounds.'
  )
  _EPSILONS = flags.DEFINE_list(
      'epsilons', ['20', '10', '5', '2'], 'dpfedavg_synthetic: target epsilons.'
  )
  _SEEDS = flags.DEFINE_list('seeds', ['0'], 'dpfedavg_synthetic: seeds.')


TOY = toy_regression.TOY
toy_data = toy_regression.toy_data
toy_loss = toy_regression.toy_loss
toy_sigma = toy_regression.toy_sigma
LRS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
CLIPS = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)


def _toy_run(method, x, y, *, lr, clip, sigma, seed, a, **extra):
  grads = lambda w, idx: (x[idx] @ w - y[idx])[:, None] * x[idx]
  common = dict(
      steps=TOY['steps'], batch_size=TOY['batch'], learning_rate=lr, seed=seed
  )
  w0 = np.zeros(x.shape[1])
  if method in ('sgd', 'adas'):
    return adadps.run_centralized(
        grads,
        len(y),
        w0,
        clip=1.0,
        noise_multiplier=0.0,
        private=False,
        preconditioner=(
            adadps.FixedPreconditioner(a) if method == 'adas' else None
        ),
        **common,
    )
  if method in ('dpsgd', 'adadps'):
    return adadps.run_centralized(
        grads,
        len(y),
        w0,
        clip=clip,
        noise_multiplier=sigma,
        preconditioner=(
            adadps.FixedPreconditioner(a) if method == 'adadps' else None
        ),
        **common,
    )
  if method == 'dp2':
    return dp2.run_centralized(
        grads,
        len(y),
        w0,
        clip=clip,
        rmsprop_clip=extra['rmsprop_clip'],
        noise_multiplier=sigma,
        rmsprop_learning_rate=extra['rmsprop_lr'],
        sgd_steps=extra['delay'],
        rmsprop_steps=extra['delay'],
        beta=0.9,
        epsilon=extra['eps'],
        **common,
    )
  if method == 'dprmsprop':
    # Privatize first, then RMSProp on the noisy gradient (the baseline).
    rng = np.random.default_rng(seed)
    w, v = w0.copy(), np.zeros_like(w0)
    for _ in range(TOY['steps']):
      idx = adadps.sample_batch(len(y), TOY['batch'], 'poisson', rng)
      g = adadps.privatize(
          grads(w, idx),
          clip=clip,
          noise_multiplier=sigma,
          batch_size=TOY['batch'],
          rng=rng,
      )
      v = 0.9 * v + 0.1 * g**2
      w = w - lr * g / (np.sqrt(v) + extra['eps'])
    return w
  raise ValueError(method)


def _tune(method, x, y, sigma, a, grid):
  best_loss, best_params = np.inf, None
  for params in grid:
    with np.errstate(all='ignore'):
      w = _toy_run(method, x, y, sigma=sigma, seed=0, a=a, **params)
      loss = toy_loss(x, y, w)
    if np.isfinite(loss) and (best_params is None or loss < best_loss):
      best_loss, best_params = loss, params
  if best_params is None:
    raise ValueError(f'{method}: every setting of the grid diverged')
  return best_params


def run_toy(methods) -> str:
  """Tunes each method on run 0, then reports mean (std) over runs 1..R."""
  x, y = toy_data(0)
  a = np.where(np.arange(TOY['d']) < TOY['frequent'], 1.0, 0.01)
  sigma = toy_sigma()
  eps = accounting.DpMechanism(sigma, TOY['batch'], TOY['n'], 'poisson')
  eps_rdp = eps.epsilon(TOY['steps'], TOY['delta'])
  eps_pld = eps.epsilon(TOY['steps'], TOY['delta'], 'pld')
  grids = {
      'sgd': [dict(lr=lr, clip=None) for lr in LRS],
      'adas': [dict(lr=lr, clip=None) for lr in LRS],
      'dpsgd': [dict(lr=lr, clip=c) for lr in LRS for c in CLIPS],
      'adadps': [dict(lr=lr, clip=c) for lr in LRS for c in CLIPS],
      'dprmsprop': [
          dict(lr=lr, clip=c, eps=e)
          for lr in (0.001, 0.01, 0.1)
          for c in CLIPS
          for e in (1e-3, 1e-1)
      ],
      'dp2': [
          dict(lr=lr, clip=c, rmsprop_lr=rl, rmsprop_clip=rc, delay=s, eps=e)
          for lr, c in ((0.3, 1.0), (1.0, 1.0), (0.3, 3.0))
          for rl in (0.003, 0.03)
          for rc in (1.0, 10.0)
          for s in (10, 50)
          for e in (1e-3, 1e-1)
      ],
  }
  names = {
      'sgd': 'SGD (non-private)',
      'adas': 'AdaS (non-private AdaDPS)',
      'dpsgd': 'DP-SGD',
      'adadps': 'AdaDPS (side information)',
      'dprmsprop': 'DP-RMSProp (noise, then precondition)',
      'dp2': 'DP^2-RMSProp (Algorithm 11)',
  }
  rows = []
  zero = toy_loss(x, y, np.zeros(TOY['d']))
  for method in methods:
    t0 = time.time()
    params = _tune(method, x, y, sigma, a, grids[method])
    losses = []
    for run in range(1, _RUNS.value + 1):
      with np.errstate(all='ignore'):
        w = _toy_run(method, x, y, sigma=sigma, seed=run, a=a, **params)
      losses.append(toy_loss(x, y, w))
    shown = {k: v for k, v in params.items() if v is not None}
    rows.append(
        f'| {names[method]} | {np.mean(losses):.4f} '
        f'({np.std(losses):.4f}) | {json.dumps(shown)} | '
        f'{time.time() - t0:.0f} s |'
    )
    print(rows[-1], file=sys.stderr)
  return '\n'.join(
      [
          f'n = {TOY["n"]}, d = {TOY["d"]}, batch b = {TOY["batch"]} (Poisson, '
          f'q = {TOY["batch"] / TOY["n"]}), T = {TOY["steps"]} steps; private '
          f'runs: sigma = {sigma:.4f}, epsilon = {eps_rdp:.3f} (RDP) / '
          f'{eps_pld:.3f} (PLD) at delta = {TOY["delta"]}. Loss at w = 0: '
          f'{zero:.4f}. Final training loss, mean (std) over runs 1-'
          f'{_RUNS.value}, hyperparameters tuned on run 0.',
          '',
          '| method | final training loss | tuned | time |',
          '|---|---|---|---|',
          *rows,
      ]
  )


def _dpfedavg_row(label, seed, summary, seconds) -> str:
  acc = summary['summaries']['test/accuracy']
  extra_out = summary.get('extra', {})
  return (
      f'| {label} | {seed} | {extra_out.get("dp/noise_multiplier", 0):.3f}'
      f' | {extra_out.get("dp/epsilon", float("inf")):.2f} | '
      f'{extra_out.get("dp/epsilon_pld", float("inf")):.2f} | '
      f'{acc["weighted_mean"]:.4f} | {acc["mean"]:.4f} | '
      f'{acc["p10"]:.4f} | {seconds:.0f} s |'
  )


def run_dpfedavg(train) -> str:
  """DP-FedAvg on Synthetic(1,1) through the training binary.

  Args:
    train: Runs `python -m run.train` with the given flags; returns its
      summary.json.
  """
  base = [
      '--task=synthetic',
      '--num_clients=100',
      '--algorithm=fedavg',
      '--client_weighting=uniform',
      '--client_sampling=poisson',
      '--clients_per_round=20',
      f'--total_rounds={_ROUNDS.value}',
      '--client_learning_rate=0.01',
      '--client_batch_size=10',
      '--rounds_per_eval=0',
      '--eval_train_clients=false',
      '--progress=false',
      f'--root_output_dir={_ROOT.value}',
  ]
  settings = [('inf', [])] + [
      (e, ['--clip=1.0', f'--target_epsilon={e}', '--dp_delta=1e-3'])
      for e in _EPSILONS.value
  ]
  rows = []
  for seed in _SEEDS.value:
    for label, extra in settings:
      name = f'dpfedavg_eps{label}_seed{seed}'
      t0 = time.time()
      summary = train(
          [*base, *extra, f'--seed={seed}', f'--experiment_name={name}']
      )
      rows.append(_dpfedavg_row(label, seed, summary, time.time() - t0))
      print(rows[-1], file=sys.stderr)
  command = ' '.join(
      [
          'python -m run.train',
          *base,
          '--clip=1.0',
          '--target_epsilon=EPS',
          '--dp_delta=1e-3',
          '--seed=S',
      ]
  )
  return '\n'.join(
      [
          f'Command per row: `{command}` (the non-private row drops the '
          'three DP flags).',
          '',
          '| target epsilon | seed | noise multiplier z | epsilon (RDP) | '
          'epsilon (PLD) | test accuracy (pooled) | mean over clients | p10 | '
          'time |',
          '|---|---|---|---|---|---|---|---|---|',
          *rows,
      ]
  )


def _run_dpfedavg_stoppably():
  """run_dpfedavg; a SIGTERM, SIGINT or SIGHUP ends its run (exit status)."""
  # The runs start in sessions of their own (reproduce.run_one) from a
  # thread: the main thread waits, so a signal's processes.Stopped reaches it
  # while the run is still listed for processes.end_children.
  pool = concurrent.futures.ThreadPoolExecutor(1)
  log = lambda line: print(line, file=sys.stderr, flush=True)
  with processes.signals_stop():
    try:
      return run_dpfedavg(
          lambda args: pool.submit(reproduce.run_one, args, log).result()
      )
    except processes.Stopped as e:
      ended = processes.end_children(e.signum)
      return processes.exit_stopped(
          'privacy_experiments',
          e,
          '; rerun the same command to resume from the last checkpoint',
          ended,
      )
    except RuntimeError as e:  # A run failed (reproduce.run_one).
      print(f'privacy_experiments: error: {e}', file=sys.stderr)
      return 1
    finally:
      pool.shutdown(wait=True, cancel_futures=True)


def main(argv) -> int:
  """Runs the experiment; returns the exit status."""
  code = console.unexpected_arguments('privacy_experiments', argv)
  if code is not None:
    return code
  try:
    if _OUTPUT.value:
      run_dir.check_output_file(_OUTPUT.value, flag='--output')
    if _EXPERIMENT.value == 'dpfedavg_synthetic':
      run_dir.check_output_dir(_ROOT.value, flag='--root_output_dir')
  except run_dir.OutputDirError as e:
    print(f'privacy_experiments: error: {e}', file=sys.stderr)
    return 2
  runtime.install_worker_cleanup()
  if _EXPERIMENT.value == 'adadps_toy':
    text = run_toy(['sgd', 'adas', 'dpsgd', 'adadps'])
  elif _EXPERIMENT.value == 'dp2_toy':
    text = run_toy(['dpsgd', 'dprmsprop', 'dp2'])
  else:
    text = _run_dpfedavg_stoppably()
    if isinstance(text, int):
      return text
  if _OUTPUT.value:
    atomic.write_text(_OUTPUT.value, text + '\n')
  print(text)
  runtime.kill_workers()
  runtime.disarm_service_managers()
  return 0


def run_main() -> None:
  """Console-script entry point."""
  define_flags()
  console.run(__name__, lambda argv: sys.exit(main(argv)))


if __name__ == '__main__':
  run_main()
