"""run.experiments.fedprox_sim: its local solver against the independent oracle,
and a short straggler run against the binary's simulation loop with
build_fed_prox."""

import numpy as np
import pytest

from run import algorithms
from run.experiments import fedprox_sim
from run import simulation
from tasks import synthetic
from tff_algos import composition
from tff_algos import stragglers
from tests import oracles


def test_local_solve_matches_proximal_oracle():
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(23, 6)), rng.integers(0, 4, 23)
  w0, b0 = 0.1 * rng.normal(size=(6, 4)), 0.1 * rng.normal(size=4)
  for plan, max_batches in [
      (stragglers.ClientPlan('c', False, 3), None),
      (stragglers.ClientPlan('c', True, 2), None),
      # An E = 1 straggler runs ceil(0.4 * 5) = 2 of its 5 batches.
      (stragglers.ClientPlan('c', True, 1, 0.4), 2),
  ]:
    w, b, n = fedprox_sim.local_solve(
        w0, b0, x, y, plan=plan, learning_rate=0.2, mu=0.7, batch_size=5
    )
    w_ref, b_ref, n_ref = oracles.proximal_local_sgd(
        w0,
        b0,
        x,
        y,
        lr=0.2,
        mu=0.7,
        batch_size=5,
        epochs=plan.epochs,
        max_batches=max_batches,
    )
    np.testing.assert_allclose(w, w_ref, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(b, b_ref, rtol=1e-12, atol=1e-14)
    assert n == n_ref


def test_bad_setting_is_refused():
  with pytest.raises(ValueError, match='ALPHA_BETA'):
    fedprox_sim.Setting(dataset='one').validate()
  with pytest.raises(ValueError, match='weighting'):
    fedprox_sim.Setting(weighting='uniform').validate()
  with pytest.raises(ValueError, match='mu'):
    fedprox_sim.Setting(mu=-1.0).validate()


def test_matches_binary_simulation_loop_with_stragglers():
  # 6 clients (fedprox size law, seed 1: 54-383 examples), 4 per round, two
  # of them stragglers (1 or 2 epochs of E = 2), 3 rounds, stored order.
  setting = fedprox_sim.Setting(
      dataset='1_1',
      straggler_fraction=0.5,
      mu=0.5,
      rounds=3,
      seed=1,
      num_clients=6,
      clients_per_round=4,
      epochs=2,
      learning_rate=0.05,
      weighting='processed',
      shuffle=False,
      eval_every=3,
  )
  ours = fedprox_sim.simulate(setting)
  task = synthetic.create_task(
      num_clients=6,
      alpha=1.0,
      beta=1.0,
      seed=1,
      size_law='fedprox',
      batch_size=10,
  )
  spec = algorithms.AlgorithmSpec(
      name='fedprox', proximal_strength=0.5, client_learning_rate=0.05
  )
  process = algorithms.build_process(spec, task.model_fn)
  config = simulation.SimulationConfig(
      total_rounds=3,
      clients_per_round=4,
      client_epochs_per_round=2,
      seed=1,
      straggler_fraction=0.5,
      rounds_per_eval=0,
      eval_train_clients=False,
      shuffle=False,
  )
  result = simulation.run_simulation(process, task, config, progress=False)
  w, b = composition.model_weights_as_numpy(process, result['state'])
  np.testing.assert_allclose(ours['w'], w, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(ours['b'], b, rtol=1e-4, atol=1e-5)
  assert np.abs(ours['w']).max() > 1e-2  # Training moved the model.
  # The authors' weighting (n_k, not examples processed) is another model.
  authors = fedprox_sim.simulate(
      fedprox_sim.Setting(**{**setting.__dict__, 'weighting': 'samples'})
  )
  assert np.abs(authors['w'] - ours['w']).max() > 1e-3
