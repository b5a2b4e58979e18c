# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The task interface: federated data plus a model, by name.

A `FederatedTask` bundles what a training run needs:

* `train_data`: the training clients (`tff.simulation.datasets.ClientData`);
* `test_data`: the clients evaluated per client at the end (and every
  `rounds_per_eval` rounds). Either the training clients' own held-out split
  (the thesis protocol) or disjoint, unseen test clients (the Delta-FL
  protocol, see `split_clients`);
* `validation_data`: optional per-client validation split;
* `model_fn`: a no-arg callable returning a `tff.learning.models.VariableModel`;
* `preprocess_train(dataset, epochs, shuffle_seed)` and
  `preprocess_eval(dataset)`: turn a client's raw dataset into the batched
  stream the model consumes. `shuffle_seed=None` keeps the stored order.
"""

from collections.abc import Callable, Sequence
import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import runtime

runtime.end_workers_at_exit()  # Quiet at exit: TFF's service manager.

ClientData = tff.simulation.datasets.ClientData
ModelFn = Callable[[], tff.learning.models.VariableModel]


class TaskError(ValueError):
  """A task cannot be built from the given arguments or data files."""


@dataclasses.dataclass(frozen=True)
class FederatedTask:
  """A federated dataset with its model and preprocessing.

  Attributes:
    name: The task's registry name.
    train_data: Training clients.
    test_data: Clients evaluated per client (held-out split or unseen clients).
    validation_data: Optional per-client validation split.
    model_fn: No-arg callable returning a fresh `VariableModel`.
    preprocess_train: `(dataset, epochs, shuffle_seed) -> dataset` for local
      training; batches never straddle epochs.
    preprocess_eval: `dataset -> dataset` for evaluation.
    description: One line describing data and model, for logs and README.
    unseen_data: Optional clients never trained on, evaluated (split
      `unseen`) beside `test_data` when that is the training clients' own
      held-out split (`tasks.holdout`).
  """

  name: str
  train_data: ClientData
  test_data: ClientData
  model_fn: ModelFn
  preprocess_train: Callable[
      [tf.data.Dataset, int, Optional[int]], tf.data.Dataset
  ]
  preprocess_eval: Callable[[tf.data.Dataset], tf.data.Dataset]
  validation_data: Optional[ClientData] = None
  description: str = ''
  unseen_data: Optional[ClientData] = None

  @property
  def element_spec(self):
    return self.train_data.element_type_structure

  def train_dataset(
      self, client_id: str, epochs: int, shuffle_seed: Optional[int] = None
  ) -> tf.data.Dataset:
    """Preprocessed local-training stream of one client."""
    return self.preprocess_train(
        self.train_data.create_tf_dataset_for_client(client_id),
        epochs,
        shuffle_seed,
    )

  def eval_dataset(
      self, client_id: str, split: str = 'test'
  ) -> tf.data.Dataset:
    """Preprocessed evaluation stream of one client (`test`, `train`, ...)."""
    data = {
        'test': self.test_data,
        'train': self.train_data,
        'validation': self.validation_data,
        'unseen': self.unseen_data,
    }.get(split)
    if data is None:
      raise TaskError(f'task {self.name!r} has no {split!r} split')
    return self.preprocess_eval(data.create_tf_dataset_for_client(client_id))


def count_examples(dataset: tf.data.Dataset) -> int:
  """Number of elements of a (raw, unbatched) dataset."""
  card = int(dataset.cardinality())
  if card >= 0:
    return card
  return int(dataset.reduce(np.int64(0), lambda n, _: n + 1))


def filter_clients(client_data: ClientData, *, min_examples: int) -> ClientData:
  """Keeps the clients with at least `min_examples` examples.

  This is the papers' selection rule (e.g. Delta-FL discards EMNIST writers
  with fewer than 100 images).

  Args:
    client_data: The clients to filter.
    min_examples: Minimum number of (raw) examples a client must hold.

  Returns:
    A `ClientData` restricted to the kept clients.

  Raises:
    TaskError: If no client is left.
  """
  if min_examples <= 0:
    return client_data
  kept = [
      cid
      for cid in client_data.client_ids
      if count_examples(client_data.create_tf_dataset_for_client(cid))
      >= min_examples
  ]
  if not kept:
    raise TaskError(
        f'no client has at least {min_examples} examples '
        f'(out of {len(client_data.client_ids)} clients)'
    )
  return select_clients(client_data, kept)


def select_clients(
    client_data: ClientData, client_ids: Sequence[str]
) -> ClientData:
  """A `ClientData` over a subset of `client_data`'s clients."""
  unknown = set(client_ids) - set(client_data.client_ids)
  if unknown:
    raise TaskError(f'unknown client ids: {sorted(unknown)[:5]}')

  def dataset_fn(client_id):
    # TFF's `serializable_dataset_fn` is often a `tf.function` method, which
    # holds its instance only weakly: this closure keeps `client_data` alive,
    # or the subset would fail once the caller drops the source.
    return client_data.serializable_dataset_fn(client_id)

  return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
      list(client_ids), dataset_fn
  )


def split_clients(
    client_data: ClientData, *, test_fraction: float, seed: int
) -> tuple[ClientData, ClientData]:
  """Splits clients into disjoint training and (unseen) test clients.

  The Delta-FL paper evaluates on test devices never seen in training.

  Args:
    client_data: The clients to split.
    test_fraction: Fraction of clients (rounded) that become test clients.
    seed: Seed of the random permutation.

  Returns:
    `(train_clients, test_clients)`.

  Raises:
    TaskError: If either side would be empty.
  """
  train_ids, test_ids = split_client_ids(
      client_data.client_ids, test_fraction=test_fraction, seed=seed
  )
  return (
      select_clients(client_data, train_ids),
      select_clients(client_data, test_ids),
  )


def split_client_ids(
    client_ids: Sequence[str], *, test_fraction: float, seed: int
) -> tuple[list[str], list[str]]:
  """`split_clients` on ids: sorted `(train_ids, test_ids)`."""
  if not 0.0 < test_fraction < 1.0:
    raise TaskError(f'test_fraction must be in (0, 1), got {test_fraction}')
  ids = sorted(client_ids)
  n_test = int(round(test_fraction * len(ids)))
  if n_test == 0 or n_test == len(ids):
    raise TaskError(
        f'cannot split {len(ids)} clients with test_fraction={test_fraction}'
    )
  perm = np.random.default_rng(seed).permutation(len(ids))
  test_ids = sorted(ids[i] for i in perm[:n_test])
  train_ids = sorted(ids[i] for i in perm[n_test:])
  return train_ids, test_ids
