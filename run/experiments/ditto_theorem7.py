# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""Ditto's lambda* on the thesis's federated point-estimation toy model.

Thesis section 5.4.3 (Theorems 10-13, the d = 1 case of Theorems 6-9): device
k has w_k = theta + zeta_k, zeta_k ~ N(0, tau^2) (benign) or N(0, tau_a^2)
(one of K_a malicious devices), and n points x_{k,i} = w_k + z, z ~ N(0,
sigma^2). With F_k(w) = 1/2 (w - mean_i x_{k,i})^2 and G the FedAvg
objective, Ditto's personal model is (Lemma 16)

  w_k(lambda) = (lambda w* + w_hat_k) / (1 + lambda),  w* = mean_k w_hat_k.

A device's expected test loss is (w_k(lambda) - w_k)^2 + sigma^2. The thesis
claims that lambda* = sigma^2 / (n tau^2) minimises both the mean of that
loss (Theorem 10) and its variance across devices (Theorem 7/11), and that
with attackers the optimum for the benign devices is (Theorem 12, 13)

  lambda_a* = sigma^2/n * K / (K tau^2 + K_a/(K-1) (tau_a^2 - tau^2)).

This script draws the model many times (theta = 0: the estimators are
location-equivariant) and locates the argmin of the mean and of the variance
over benign devices on a fine lambda grid, per seed.

  python -m run.experiments.ditto_theorem7 --seeds=0,1,2,3,4
"""

import sys

from absl import flags
import numpy as np


def lambda_star(
    *, sigma2, n, tau2, num_devices=1, num_attackers=0, tau2_attack=0.0
):
  """The thesis's lambda* (5.80), or lambda_a* (5.60) with attackers."""
  k = num_devices
  spread = k * tau2 + (num_attackers / max(k - 1, 1)) * (tau2_attack - tau2)
  return sigma2 / n * k / spread if num_attackers else sigma2 / (n * tau2)


def benign_losses(
    lambdas,
    *,
    sigma2,
    n,
    tau2,
    num_devices,
    num_attackers,
    tau2_attack,
    draws,
    seed,
):
  """Excess test losses (w_k(lambda) - w_k)^2, `[len(lambdas), draws, K_b]`."""
  rng = np.random.default_rng(seed)
  k, ka = num_devices, num_attackers
  scale = np.sqrt(np.r_[np.full(k - ka, tau2), np.full(ka, tau2_attack)])
  w = rng.normal(size=(draws, k)) * scale
  w_hat = w + rng.normal(size=(draws, k)) * np.sqrt(sigma2 / n)
  w_star = w_hat.mean(axis=1, keepdims=True)
  out = []
  for lam in lambdas:
    personal = (lam * w_star + w_hat) / (1.0 + lam)
    out.append((personal[:, : k - ka] - w[:, : k - ka]) ** 2)
  return np.stack(out)


def argmins(lambdas, losses, sigma2):
  """Grid argmins of the mean and of the variance of test loss.

  Returns `(argmin mean, argmin variance across devices within a draw,
  argmin variance over all draws and devices, mean, within-draw variance)`.
  """
  test = losses + sigma2
  mean = test.mean(axis=(1, 2))
  var = test.var(axis=2).mean(axis=1)
  pooled = test.reshape(len(lambdas), -1).var(axis=1)
  return (
      lambdas[np.argmin(mean)],
      lambdas[np.argmin(var)],
      lambdas[np.argmin(pooled)],
      mean,
      var,
  )


FLAGS = flags.FLAGS


def define_flags() -> None:
  flags.DEFINE_list('seeds', ['0', '1', '2', '3', '4'], 'Seeds.')
  flags.DEFINE_integer('draws', 20000, 'Draws of the K devices per seed.')
  flags.DEFINE_integer('devices', 20, 'K.')
  flags.DEFINE_integer('n', 10, 'Points per device.')
  flags.DEFINE_float('sigma2', 1.0, 'sigma^2.')
  flags.DEFINE_list('tau2', ['1', '0.1', '0.01'], 'tau^2 values.')
  flags.DEFINE_list('attackers', ['0', '5'], 'K_a values.')
  flags.DEFINE_float('tau2_attack', 10.0, 'tau_a^2 of the attackers.')


def main(argv) -> int:
  from run import console  # pylint: disable=g-import-not-at-top

  code = console.unexpected_arguments('ditto_theorem7', argv)
  if code is not None:
    return code
  try:
    seeds = [int(s) for s in FLAGS.seeds]
    tau2s = [float(t) for t in FLAGS.tau2]
    attackers = [int(a) for a in FLAGS.attackers]
    if min(tau2s) <= 0 or FLAGS.devices < 2 or FLAGS.n < 1:
      raise ValueError('tau2 must be > 0, devices >= 2 and n >= 1')
    if not all(0 <= a < FLAGS.devices for a in attackers):
      raise ValueError('attackers must be in [0, devices)')
  except ValueError as e:
    print(f'ditto_theorem7: error: {e}', file=sys.stderr)
    return 2
  lambdas = 10.0 ** np.arange(-3.0, 3.0 + 1e-9, 1.0 / 40)
  print(
      '| tau^2 | K_a | theory lambda | seed | argmin mean loss | argmin'
      ' variance within a draw | variance at theory / at its argmin |'
      ' argmin variance over draws and devices |'
  )
  print('|---|---|---|---|---|---|---|---|')
  for tau2 in tau2s:
    for ka in attackers:
      theory = lambda_star(
          sigma2=FLAGS.sigma2,
          n=FLAGS.n,
          tau2=tau2,
          num_devices=FLAGS.devices,
          num_attackers=ka,
          tau2_attack=FLAGS.tau2_attack,
      )
      logs = []
      for seed in seeds:
        losses = benign_losses(
            lambdas,
            sigma2=FLAGS.sigma2,
            n=FLAGS.n,
            tau2=tau2,
            num_devices=FLAGS.devices,
            num_attackers=ka,
            tau2_attack=FLAGS.tau2_attack,
            draws=FLAGS.draws,
            seed=seed,
        )
        best_mean, best_var, best_pooled, _, var = argmins(
            lambdas, losses, FLAGS.sigma2
        )
        at_theory = var[np.argmin(np.abs(np.log(lambdas / theory)))]
        logs.append(
            [np.log10(b / theory) for b in (best_mean, best_var, best_pooled)]
        )
        print(
            f'| {tau2:g} | {ka} | {theory:.4g} | {seed} | {best_mean:.4g} |'
            f' {best_var:.4g} | {at_theory:.5g} / {var.min():.5g} |'
            f' {best_pooled:.4g} |',
            flush=True,
        )
      logs = np.array(logs)
      print(
          f'| {tau2:g} | {ka} | {theory:.4g} | log10(argmin / theory), '
          f'mean (std) | {logs[:, 0].mean():+.3f} ({logs[:, 0].std():.3f})'
          f' | {logs[:, 1].mean():+.3f} ({logs[:, 1].std():.3f}) | |'
          f' {logs[:, 2].mean():+.3f} ({logs[:, 2].std():.3f}) |'
      )
  return 0


def run_main() -> None:
  """Console-script entry point."""
  from run import console  # pylint: disable=g-import-not-at-top

  define_flags()
  console.run(__name__, lambda argv: sys.exit(main(argv)))


if __name__ == '__main__':
  run_main()
