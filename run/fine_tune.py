# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The fine-tuning baselines of a finished training run.

`fine_tune_run` takes a run of the training binary (its flags already parsed,
as `run.train.prepare` reads them) and evaluates, per client, the two
personalization baselines of `tasks.personalization` on the run's task:

* `final`: the run's final global model fine-tuned by each client (FedAvg +
  fine-tuning, when the run is FedAvg's);
* `initial`: the run's initial model (the same initialisation as the
  federated run) trained by each client alone (local training).

Each is evaluated after 0..`max_epochs` epochs at each learning rate (the
fine-tuning data shuffled with the run's `--seed`), on:

* the training clients' evaluation split (`test`: their held-out data, or
  `validation` in a `--holdout=validation` run), fine-tuned on their training
  part;
* the unseen clients (`unseen`, when the task has them): each fine-tunes on
  the first `unseen_fraction` of its examples, in stored order, and is
  evaluated on the rest (contiguous parts: Shakespeare's windows overlap
  their neighbours).

The result is written to `<run>/fine_tuning.json` (whole or not at all) and
returned: `{start: {split: {lr: [epoch 0, 1, ...: {metric: [per client]}]}}}`.
"""

import json
import math
import os
from collections.abc import Sequence
from typing import Any

from run import atomic
from run import run_dir
from run import simulation
from run import train
from tasks import base as task_base
from tasks import personalization

RESULT = 'fine_tuning.json'
STARTS = ('final', 'initial')


def _pairs(task, split: str, unseen_fraction: float):
  """Per client of `split`: (fine-tuning, evaluation) unbatched datasets."""

  def elements(raw):
    return task.preprocess_eval(raw).unbatch()

  if split == 'unseen':
    pairs = []
    for cid in task.unseen_data.client_ids:
      raw = task.unseen_data.create_tf_dataset_for_client(cid)
      n = task_base.count_examples(raw)
      cut = min(max(1, int(math.floor(unseen_fraction * n))), n - 1)
      pairs.append((elements(raw.take(cut)), elements(raw.skip(cut))))
    return pairs
  return [
      (
          elements(task.train_data.create_tf_dataset_for_client(cid)),
          elements(task.test_data.create_tf_dataset_for_client(cid)),
      )
      for cid in task.test_data.client_ids
  ]


def fine_tune_run(
    *,
    learning_rates: Sequence[float],
    max_epochs: int,
    batch_size: int,
    unseen_fraction: float = 0.5,
) -> dict[str, Any]:
  """Fine-tunes the finished run named by the parsed flags; see the module.

  Raises:
    ValueError: Bad arguments, or the run has no checkpoint.
  """
  if not 0.0 < unseen_fraction < 1.0:
    raise ValueError(
        f'unseen_fraction must be in (0, 1), got {unseen_fraction}'
    )
  task, process, _, out_dir, _, _ = train.prepare(writer='train')
  initial = process.initialize()
  manager = run_dir.CheckpointManager(os.path.join(out_dir, 'checkpoints'))
  loaded, _ = simulation.run_async(manager.load_latest((initial, 0)))
  if loaded is None:
    raise ValueError(f'{out_dir} has no checkpoint to fine-tune')
  weights = {
      'final': process.get_model_weights(loaded[0]),
      'initial': process.get_model_weights(initial),
  }
  holdout = train.flags.FLAGS['holdout'].value
  seed = train.flags.FLAGS['seed'].value  # The run's: shuffles vary with it.
  splits = ['validation' if holdout == 'validation' else 'test']
  if task.unseen_data is not None:
    splits.append('unseen')
  pairs = {s: _pairs(task, s, unseen_fraction) for s in splits}
  result = {}
  for start in STARTS:
    result[start] = {}
    for split in splits:
      per_rate = personalization.fine_tune_directly(
          task.model_fn,
          weights[start],
          pairs[split],
          learning_rates=learning_rates,
          max_epochs=max_epochs,
          batch_size=batch_size,
          shuffle_seed=seed,
      )
      result[start][split] = {
          f'{rate:g}': [
              {k: [float(x) for x in v] for k, v in epoch.items()}
              for epoch in epochs
          ]
          for rate, epochs in per_rate.items()
      }
  result['unseen_fraction'] = unseen_fraction
  # Examples one epoch of fine-tuning reads, per split (all clients).
  result['train_examples'] = {
      split: sum(task_base.count_examples(train) for train, _ in pairs[split])
      for split in splits
  }
  atomic.write_text(os.path.join(out_dir, RESULT), json.dumps(result))
  return result
