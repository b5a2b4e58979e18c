"""Straggler schedule (FedProx systems heterogeneity) and its use in rounds."""

import numpy as np
import pytest
import tensorflow_federated as tff

from run import simulation
from tasks import synthetic
from tests import oracles
from tff_algos import composition
from tff_algos import fed_prox
from tff_algos import stragglers

IDS = [f'c{i}' for i in range(10)]


@pytest.mark.parametrize(
    'fraction, expected', [(0.0, 0), (0.5, 5), (0.9, 9), (1.0, 10), (0.25, 2)]
)
def test_fixed_fraction_of_selected_clients_straggle(fraction, expected):
  schedule = stragglers.StragglerSchedule(
      fraction=fraction, epochs=20, drop_stragglers=False, seed=1
  )
  for round_num in range(1, 20):
    plans = schedule.plan(round_num, IDS)
    assert [p.client_id for p in plans] == IDS
    assert sum(p.straggler for p in plans) == expected
    for p in plans:
      if p.straggler:
        assert 1 <= p.epochs <= 20
      else:
        assert p.epochs == 20 and p.epoch_fraction == 1.0


def test_straggler_epochs_are_uniform_over_1_to_e():
  schedule = stragglers.StragglerSchedule(
      fraction=0.9, epochs=4, drop_stragglers=False, seed=0
  )
  epochs = [
      p.epochs
      for r in range(1, 400)
      for p in schedule.plan(r, IDS)
      if p.straggler
  ]
  counts = np.bincount(epochs, minlength=5)[1:]
  assert counts.min() > 0.8 * len(epochs) / 4
  assert counts.max() < 1.2 * len(epochs) / 4


def test_schedule_is_deterministic_and_varies_by_round():
  make = lambda: stragglers.StragglerSchedule(  # pylint: disable=g-long-lambda
      fraction=0.5, epochs=5, drop_stragglers=False, seed=7
  )
  assert make().plan(3, IDS) == make().plan(3, IDS)
  assert make().plan(3, IDS) != make().plan(4, IDS)


def test_fedavg_drops_and_fedprox_keeps_stragglers():
  keep = stragglers.StragglerSchedule(
      fraction=0.5, epochs=5, drop_stragglers=False, seed=2
  )
  drop = stragglers.StragglerSchedule(
      fraction=0.5, epochs=5, drop_stragglers=True, seed=2
  )
  kept = keep.participants(1, IDS)
  dropped = drop.participants(1, IDS)
  assert len(kept) == 10
  assert len(dropped) == 5
  assert all(not p.straggler for p in dropped)
  assert {p.client_id for p in dropped} == {
      p.client_id for p in kept if not p.straggler
  }


def test_single_epoch_stragglers_run_a_fraction_of_batches():
  schedule = stragglers.StragglerSchedule(
      fraction=1.0, epochs=1, drop_stragglers=False, seed=0
  )
  plans = schedule.plan(1, IDS)
  for p in plans:
    assert p.straggler and p.epochs == 1 and 0.0 < p.epoch_fraction <= 1.0
    assert 1 <= p.num_batches(7) <= 7
  assert stragglers.ClientPlan('a', True, 1, 0.01).num_batches(7) == 1
  assert stragglers.ClientPlan('a', True, 3).num_batches(7) == 21


@pytest.mark.parametrize(
    'kwargs',
    [
        dict(fraction=-0.1, epochs=1),
        dict(fraction=1.5, epochs=1),
        dict(fraction=0.5, epochs=0),
    ],
)
def test_schedule_validates(kwargs):
  with pytest.raises(ValueError):
    stragglers.StragglerSchedule(drop_stragglers=False, seed=0, **kwargs)


def test_fedprox_round_aggregates_partial_work_as_the_oracle():
  """A round with stragglers equals the oracle of partial local solves."""
  task = synthetic.create_task(
      num_clients=6, seed=4, size_law='constant', constant_size=12, batch_size=4
  )
  ids = list(task.train_data.client_ids)
  config = simulation.SimulationConfig(
      total_rounds=1,
      clients_per_round=6,
      client_epochs_per_round=3,
      straggler_fraction=0.5,
      shuffle=False,
  )
  schedule = stragglers.StragglerSchedule(
      fraction=0.5, epochs=3, drop_stragglers=False, seed=0
  )
  plans = schedule.participants(1, ids)
  assert any(p.straggler and p.epochs < 3 for p in plans)
  process = fed_prox.build_fed_prox(
      task.model_fn,
      tff.learning.optimizers.build_sgdm(learning_rate=0.05),
      proximal_strength=0.3,
  )
  state = process.next(
      process.initialize(), simulation.client_datasets(task, plans, 1, config)
  ).state
  w, b = composition.model_weights_as_numpy(process, state)

  w0 = np.zeros((60, 10))
  b0 = np.zeros(10)
  models, weights = [], []
  for p in plans:
    ((x, y),) = [
        (e['x'].numpy(), e['y'].numpy())
        for e in task.train_data.create_tf_dataset_for_client(
            p.client_id
        ).batch(100)
    ]
    wk, bk, n = oracles.proximal_local_sgd(
        w0, b0, x, y, lr=0.05, mu=0.3, batch_size=4, epochs=p.epochs
    )
    models.append((wk, bk))
    weights.append(n)
  weights = np.asarray(weights, float) / sum(weights)
  np.testing.assert_allclose(
      w, sum(a * m[0] for a, m in zip(weights, models)), atol=2e-6
  )
  np.testing.assert_allclose(
      b, sum(a * m[1] for a, m in zip(weights, models)), atol=2e-6
  )
