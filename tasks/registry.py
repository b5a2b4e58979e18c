# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tasks by name, for the binaries and for Python users.

| name                   | data                                 | model |
|------------------------|--------------------------------------|-------|
| `synthetic`            | Synthetic(alpha, beta), built in     | softmax regression 60x10 |
| `synthetic_iid`        | Synthetic-IID, built in              | softmax regression 60x10 |
| `emnist_character`     | `emnist_all.sqlite` in data_dir      | linear / convnet / cnn_dropout / cnn / 2nn |
| `shakespeare_character`| `shakespeare.sqlite` in data_dir     | TFF's character LSTM |
| `shakespeare_leaf`     | `shakespeare.sqlite` in data_dir, LEAF windows | the seeds' GRU / LSTM (`preset`: deltafl, qffl, fedprox) |
| `stackoverflow_word`   | `stackoverflow.sqlite` + word counts | TFF's next-word LSTM |
| `stackoverflow_tag`    | `stackoverflow.sqlite` + counts      | TFF's tag logistic regression |
| `fedplus_regression`   | Fed+ section 5.1 synthetic regression, built in | linear regression (MSE) |
| `leaf`                 | LEAF JSON (train/, test/) in leaf_dir | LEAF's CNN, stacked LSTMs, bag of words |

Every data-file task also runs offline on TFF's synthetic stand-in data
(`use_synthetic_data=True`).
"""

from typing import Any

from tasks import base
from tasks import synthetic

SYNTHETIC_TASKS = ('synthetic', 'synthetic_iid')
FILE_TASKS = (
    'emnist_character',
    'shakespeare_character',
    'stackoverflow_word',
    'stackoverflow_tag',
)
PRESET_TASKS = ('shakespeare_leaf',)
REGRESSION_TASKS = ('fedplus_regression',)
LEAF_TASKS = ('leaf',)
TASK_NAMES = (
    SYNTHETIC_TASKS + FILE_TASKS + PRESET_TASKS + REGRESSION_TASKS + LEAF_TASKS
)


def create_task(name: str, **kwargs: Any) -> base.FederatedTask:
  """Builds the task `name` with its keyword arguments.

  Args:
    name: One of `TASK_NAMES`.
    **kwargs: The task module's `create_task` arguments.

  Returns:
    The `FederatedTask`.

  Raises:
    TaskError: For an unknown name or bad arguments.
  """
  if name in SYNTHETIC_TASKS:
    return synthetic.create_task(iid=(name == 'synthetic_iid'), **kwargs)
  if name == 'fedplus_regression':
    from tasks import fedplus_regression  # pylint: disable=g-import-not-at-top

    return fedplus_regression.create_task(**kwargs)
  if name == 'leaf':
    from tasks import leaf  # pylint: disable=g-import-not-at-top

    return leaf.create_task(**kwargs)
  if name == 'emnist_character':
    from tasks import emnist  # pylint: disable=g-import-not-at-top

    return emnist.create_task(**kwargs)
  if name == 'shakespeare_character':
    from tasks import shakespeare  # pylint: disable=g-import-not-at-top

    return shakespeare.create_task(**kwargs)
  if name == 'shakespeare_leaf':
    from tasks import shakespeare_leaf  # pylint: disable=g-import-not-at-top

    return shakespeare_leaf.create_task(**kwargs)
  if name in ('stackoverflow_word', 'stackoverflow_tag'):
    from tasks import stackoverflow  # pylint: disable=g-import-not-at-top

    return stackoverflow.create_task(task_type=name.split('_')[1], **kwargs)
  raise base.TaskError(
      f'unknown task {name!r}; choose one of: {", ".join(TASK_NAMES)}'
  )
