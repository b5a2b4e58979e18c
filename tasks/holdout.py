# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Held-out and validation splits of the training clients, for any task.

The tail benchmark (`run.tail_benchmark.benchmark`) needs, on every dataset, the
training clients' own held-out data, a validation split of those clients to
tune each algorithm's knob on, and the unseen clients when the task has
them. `with_holdout` derives all three from a task:

* A task whose test clients are its training clients (a per-client test
  split: Synthetic, LEAF by sample, the q-FFL/FedProx Shakespeare presets)
  keeps that test split as the held-out data; the validation split is the
  last `validation_fraction` of each client's training examples.
* A task whose test clients are other clients (unseen test clients: the
  Delta-FL protocol, `--test_clients_fraction`) keeps them as `unseen_data`;
  each training client's examples, in stored order, are cut into training
  (the first part), validation (the next `validation_fraction`) and held-out
  test (the last `test_fraction`). Contiguous parts: Shakespeare's windows
  overlap their neighbours, so interleaved splits would share text.

`evaluate_on='validation'` makes the validation split the evaluated one
(`test_data`) and drops the held-out and unseen data from the task, so a
tuning run cannot read them: what it reports as `test/*` is validation.
Each part keeps at least one example; a client with fewer than three
training examples is refused.
"""

import tensorflow_federated as tff

from tasks import base

EVALUATE_ON = ('test', 'validation')


def _check_fraction(name: str, value: float) -> None:
  if not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
    raise base.TaskError(f'{name} must be in (0, 1), got {value!r}')


def _parts(n: int, validation: float, test: float) -> tuple[int, int, int]:
  """Sizes `(train, validation, test)` of n examples; each at least 1."""
  n_test = max(1, int(round(test * n))) if test else 0
  n_val = max(1, int(round(validation * n)))
  return n - n_val - n_test, n_val, n_test


def _sliced(
    client_data: base.ClientData, bounds: dict[str, tuple[int, int]]
) -> base.ClientData:
  """The examples `[start, stop)` of each client of `bounds`, in order."""

  def dataset_fn(client_id):
    # The eager dataset: a `serializable_dataset_fn` that is a tf.function
    # (TFF's in-memory ClientData) would be traced again for every client.
    start, stop = bounds[client_id]
    return (
        client_data.create_tf_dataset_for_client(client_id)
        .skip(start)
        .take(stop - start)
    )

  return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
      list(bounds), dataset_fn
  )


def with_holdout(
    task: base.FederatedTask,
    *,
    validation_fraction: float = 0.2,
    test_fraction: float = 0.2,
    evaluate_on: str = 'test',
) -> base.FederatedTask:
  """`task` with validation, held-out and (if any) unseen clients' splits.

  Args:
    task: The task as its builder made it.
    validation_fraction: Share of each training client's examples used for
      validation (tuning).
    test_fraction: Share held out for testing, when the task has no
      per-client test split of its training clients.
    evaluate_on: `'test'`: evaluate on the held-out split (`test_data`) and
      the unseen clients (`unseen_data`); `'validation'`: evaluate on the
      validation split only; held-out and unseen data are dropped.

  Returns:
    The new task (same model and preprocessing).

  Raises:
    TaskError: Bad fractions, an unknown `evaluate_on`, or a client too small
      to split.
  """
  if evaluate_on not in EVALUATE_ON:
    raise base.TaskError(
        f'evaluate_on must be one of {", ".join(EVALUATE_ON)}, got '
        f'{evaluate_on!r}'
    )
  _check_fraction('validation_fraction', validation_fraction)
  _check_fraction('test_fraction', test_fraction)
  if validation_fraction + test_fraction >= 1.0:
    raise base.TaskError(
        'validation_fraction + test_fraction must be < 1, got '
        f'{validation_fraction} + {test_fraction}'
    )
  train_ids = list(task.train_data.client_ids)
  own_test = set(task.test_data.client_ids) == set(train_ids)
  cut_test = 0.0 if own_test else test_fraction
  train_bounds, val_bounds, test_bounds = {}, {}, {}
  for cid in train_ids:
    n = base.count_examples(task.train_data.create_tf_dataset_for_client(cid))
    n_train, n_val, _ = _parts(n, validation_fraction, cut_test)
    if n_train < 1:
      raise base.TaskError(
          f'client {cid!r} has {n} training examples: too few to hold out '
          f'{validation_fraction:g} for validation'
          + (f' and {cut_test:g} for testing' if cut_test else '')
      )
    train_bounds[cid] = (0, n_train)
    val_bounds[cid] = (n_train, n_train + n_val)
    test_bounds[cid] = (n_train + n_val, n)
  train = _sliced(task.train_data, train_bounds)
  validation = _sliced(task.train_data, val_bounds)
  if own_test:
    held_out, unseen = task.test_data, None
  else:
    held_out, unseen = _sliced(task.train_data, test_bounds), task.test_data
  shares = (
      f'validation = last {validation_fraction:g} of each training '
      "client's training examples"
  )
  if not own_test:
    shares = (
        f'training / validation / held-out test = the first '
        f'{1 - validation_fraction - test_fraction:g} / next '
        f'{validation_fraction:g} / last {test_fraction:g} of each '
        "training client's examples; unseen clients kept"
    )
  if evaluate_on == 'validation':
    held_out, unseen = validation, None
    shares += '; evaluated on validation only'
  return base.FederatedTask(
      name=task.name,
      train_data=train,
      test_data=held_out,
      validation_data=validation,
      unseen_data=unseen,
      model_fn=task.model_fn,
      preprocess_train=task.preprocess_train,
      preprocess_eval=task.preprocess_eval,
      description=f'{task.description}; {shares}',
  )
