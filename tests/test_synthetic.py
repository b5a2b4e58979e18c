"""Synthetic(alpha, beta) and Synthetic-IID: generative recipe and splits."""

import numpy as np
import pytest

from tasks import base
from tasks import synthetic


def test_deterministic_given_seed():
  a = synthetic.generate(num_clients=5, alpha=1, beta=1, seed=3)
  b = synthetic.generate(num_clients=5, alpha=1, beta=1, seed=3)
  c = synthetic.generate(num_clients=5, alpha=1, beta=1, seed=4)
  for (xa, ya), (xb, yb) in zip(a, b):
    np.testing.assert_array_equal(xa, xb)
    np.testing.assert_array_equal(ya, yb)
  assert not np.array_equal(a[0][0][:5], c[0][0][:5])


def test_size_laws():
  rng = np.random.default_rng(0)
  fedprox = synthetic.client_sizes(20000, rng, size_law='fedprox')
  assert fedprox.min() >= 50
  # int(lognormal(4, 2)) + 50: median e^4 + 50 ~ 104.6.
  assert abs(np.median(fedprox) - 104) < 3
  table = synthetic.client_sizes(20000, rng, size_law='table_4_4')
  assert abs(table.mean() - 127) < 3 and abs(table.std() - 73) < 4
  const = synthetic.client_sizes(4, rng, size_law='constant', constant_size=7)
  assert list(const) == [7, 7, 7, 7]
  with pytest.raises(base.TaskError, match='size_law'):
    synthetic.client_sizes(4, rng, size_law='zipf')


def test_features_follow_the_recipe():
  """x ~ N(v_k, diag(j^-1.2)): the per-feature variance decays as j^-1.2."""
  clients = synthetic.generate(
      num_clients=1,
      alpha=0,
      beta=0,
      seed=0,
      size_law='constant',
      constant_size=20000,
  )
  x, y = clients[0]
  var = x.var(axis=0)
  expected = np.arange(1, 61) ** -1.2
  np.testing.assert_allclose(var, expected, rtol=0.06)
  assert x.shape == (20000, 60) and y.min() >= 0 and y.max() <= 9


def test_iid_clients_share_one_model():
  clients = synthetic.generate(
      num_clients=3,
      alpha=1,
      beta=1,
      iid=True,
      seed=2,
      size_law='constant',
      constant_size=4000,
  )
  means = np.array([x.mean(axis=0) for x, _ in clients])
  assert np.abs(means).max() < 0.1  # v_k = 0 for every client.
  hist = np.array([np.bincount(y, minlength=10) / len(y) for _, y in clients])
  assert np.abs(hist - hist.mean(axis=0)).max() < 0.05


def test_non_iid_clients_differ():
  clients = synthetic.generate(
      num_clients=3,
      alpha=1,
      beta=1,
      seed=2,
      size_law='constant',
      constant_size=2000,
  )
  means = np.array([x.mean(axis=0) for x, _ in clients])
  assert np.abs(means[0] - means[1]).max() > 0.3


def test_task_splits_and_unseen_test_clients():
  task = synthetic.create_task(
      num_clients=10,
      seed=0,
      size_law='constant',
      constant_size=50,
      test_fraction=0.2,
      validation_fraction=0.1,
  )
  cid = task.train_data.client_ids[0]
  sizes = [
      sum(1 for _ in d.create_tf_dataset_for_client(cid))
      for d in (task.train_data, task.test_data, task.validation_data)
  ]
  assert sizes == [35, 10, 5]
  split = synthetic.create_task(
      num_clients=10,
      seed=0,
      size_law='constant',
      constant_size=50,
      test_clients_fraction=0.3,
  )
  train_ids = set(split.train_data.client_ids)
  test_ids = set(split.test_data.client_ids)
  assert len(test_ids) == 3 and not train_ids & test_ids
  assert len(train_ids) == 7
  tid = sorted(test_ids)[0]
  assert sum(1 for _ in split.test_data.create_tf_dataset_for_client(tid)) == 50


def test_preprocessing_batches_within_epochs_and_shuffles_reproducibly():
  task = synthetic.create_task(
      num_clients=2, seed=0, size_law='constant', constant_size=13, batch_size=4
  )
  cid = task.train_data.client_ids[0]
  sizes = [int(b[1].shape[0]) for b in task.train_dataset(cid, 2, None)]
  assert sizes == [4, 4, 2, 4, 4, 2]  # 10 training examples per epoch.
  first = [b[1].numpy().tolist() for b in task.train_dataset(cid, 2, 7)]
  again = [b[1].numpy().tolist() for b in task.train_dataset(cid, 2, 7)]
  assert first == again


@pytest.mark.parametrize(
    'kwargs',
    [
        dict(num_clients=0),
        dict(alpha=-1.0),
        dict(test_fraction=1.0),
        dict(validation_fraction=0.9),
        dict(batch_size=0),
    ],
)
def test_validation(kwargs):
  with pytest.raises(base.TaskError):
    synthetic.create_task(**kwargs)


def test_unseen_test_clients_are_disjoint_and_complete():
  """Unseen test clients hold all their data, and so do training clients.

  (The training clients' own test split used to be dropped: 20% of their
  examples gone, so a 0.6 / 0.2 / 0.2 holdout was 48 / 16 / 16% of them.)
  """
  task = synthetic.create_task(
      num_clients=10, seed=0, test_clients_fraction=0.5
  )
  full = synthetic.create_task(num_clients=10, seed=0)
  train_ids, test_ids = set(task.train_data.client_ids), set(
      task.test_data.client_ids
  )
  assert not train_ids & test_ids
  assert train_ids | test_ids == set(full.train_data.client_ids)
  count = lambda data, cid: sum(
      1 for _ in data.create_tf_dataset_for_client(cid)
  )
  for cid in sorted(test_ids):
    assert count(task.test_data, cid) == (
        count(full.train_data, cid) + count(full.test_data, cid)
    )
  for cid in sorted(train_ids):
    assert count(task.train_data, cid) == (
        count(full.train_data, cid) + count(full.test_data, cid)
    )
  with_val = synthetic.create_task(
      num_clients=10,
      seed=0,
      test_clients_fraction=0.5,
      validation_fraction=0.1,
  )
  full_val = synthetic.create_task(
      num_clients=10, seed=0, validation_fraction=0.1
  )
  for cid in sorted(train_ids):
    assert count(with_val.train_data, cid) + count(
        with_val.validation_data, cid
    ) == sum(
        count(d, cid)
        for d in (
            full_val.train_data,
            full_val.test_data,
            full_val.validation_data,
        )
    )


def test_select_clients_keeps_its_source_alive():
  """TFF holds a tf.function method's instance weakly; the subset must not."""
  import gc  # pylint: disable=g-import-not-at-top
  import weakref  # pylint: disable=g-import-not-at-top

  source = synthetic.create_task(num_clients=4, seed=0).train_data
  ref = weakref.ref(source)
  subset = base.select_clients(source, source.client_ids[:2])
  del source
  gc.collect()
  assert ref() is not None
  assert (
      sum(1 for _ in subset.create_tf_dataset_for_client(subset.client_ids[1]))
      > 0
  )
