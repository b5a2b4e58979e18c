"""Fed+ synthetic-regression task, and its comparison script's two back ends."""

import numpy as np
import pytest

from run.experiments import fedplus_regression as script
from tasks import fedplus_regression
from tasks import registry


def test_generator_shapes_outlier_and_determinism():
  parties = fedplus_regression.generate(seed=1)
  assert len(parties) == 10
  x, y = parties[0]
  assert x.shape == (100, 1000) and y.shape == (100,)
  again = fedplus_regression.generate(seed=1)
  np.testing.assert_array_equal(again[3][0], parties[3][0])
  assert not np.array_equal(
      fedplus_regression.generate(seed=2)[3][0], parties[3][0]
  )
  # The outlier's labels have about 10x the variance (w_bar ~ N(0, 50 I)).
  regular = np.mean([np.var(y) for _, y in parties[:-1]])
  assert np.var(parties[-1][1]) > 4 * regular
  # Sigma_jj pattern: coordinate 50 has variance 50^-1.1, 51 has 1 (+ mu).
  many = fedplus_regression.generate(
      num_parties=2, samples=4000, dim=60, seed=0
  )
  spread = np.var(many[0][0], axis=0)
  assert spread[49] == pytest.approx(50**-1.1, rel=0.1)
  assert spread[50] == pytest.approx(1.0, rel=0.1)


def test_task_splits_and_model_loss():
  task = registry.create_task(
      'fedplus_regression', num_parties=3, dim=8, batch_size=10
  )
  assert list(task.train_data.client_ids) == ['0', '1', '2']
  batch = next(iter(task.train_dataset('0', 1)))
  assert batch[0].shape == (10, 8) and batch[1].shape == (10, 1)
  assert sum(1 for _ in task.train_dataset('0', 2)) == 10
  n_test = sum(int(b[0].shape[0]) for b in task.eval_dataset('1', 'test'))
  assert n_test == 50


@pytest.mark.parametrize(
    'method', ['fedgeomed_plus', 'fedcomed_plus', 'fedavg']
)
def test_numpy_back_end_equals_the_library(method):
  parties = fedplus_regression.generate(seed=0, dim=20, num_parties=4)
  kwargs = dict(
      sigma=100.0,
      lr=1e-3,
      delta=0.1,
      steps=7,
      batch_size=10,
      rounds=3,
      iterations=4,
  )
  ours, g = script.run_numpy(method, parties, **kwargs)
  lib, lib_g = script.run_tff(method, parties, **kwargs)
  np.testing.assert_allclose(lib, ours, rtol=2e-4, atol=1e-4)
  np.testing.assert_allclose(lib_g, g, rtol=2e-4, atol=1e-4)
  assert np.abs(ours).max() > 0.1
