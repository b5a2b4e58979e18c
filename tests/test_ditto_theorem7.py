"""run.experiments.ditto_theorem7: the thesis's lambda* formulas and the
simulated personal-model errors, against a direct computation (no import of the
code's internals beyond the functions under test)."""

import numpy as np

from run.experiments import ditto_theorem7


def test_lambda_star_formulas():
  # (5.80): sigma^2 / (n tau^2).
  assert ditto_theorem7.lambda_star(sigma2=1.0, n=10, tau2=0.1) == 1.0
  # (5.60): sigma^2/n * K / (K tau^2 + K_a/(K-1) (tau_a^2 - tau^2)).
  expected = 0.1 * 20 / (20 * 0.1 + 5 / 19 * (10.0 - 0.1))
  got = ditto_theorem7.lambda_star(
      sigma2=1.0,
      n=10,
      tau2=0.1,
      num_devices=20,
      num_attackers=5,
      tau2_attack=10.0,
  )
  np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_losses_are_the_personal_models_errors():
  losses = ditto_theorem7.benign_losses(
      np.array([0.0, 2.0]),
      sigma2=1.0,
      n=4,
      tau2=0.5,
      num_devices=5,
      num_attackers=2,
      tau2_attack=3.0,
      draws=7,
      seed=3,
  )
  rng = np.random.default_rng(3)
  scale = np.sqrt([0.5, 0.5, 0.5, 3.0, 3.0])
  w = rng.normal(size=(7, 5)) * scale
  w_hat = w + rng.normal(size=(7, 5)) * 0.5
  # lambda = 0: local models; lambda = 2: (2 mean + local) / 3.
  np.testing.assert_allclose(losses[0], (w_hat - w)[:, :3] ** 2)
  personal = (2.0 * w_hat.mean(axis=1, keepdims=True) + w_hat) / 3.0
  np.testing.assert_allclose(losses[1], (personal - w)[:, :3] ** 2)


def test_argmin_of_mean_loss_is_lambda_star():
  lambdas = 10.0 ** np.arange(-2.0, 2.01, 0.25)
  losses = ditto_theorem7.benign_losses(
      lambdas,
      sigma2=1.0,
      n=10,
      tau2=0.1,
      num_devices=20,
      num_attackers=0,
      tau2_attack=0.0,
      draws=4000,
      seed=0,
  )
  best_mean, best_var, best_pooled, _, _ = ditto_theorem7.argmins(
      lambdas, losses, 1.0
  )
  # lambda* = 1 is a grid point.
  assert best_mean == 1.0 and best_var == 1.0 and best_pooled == 1.0
