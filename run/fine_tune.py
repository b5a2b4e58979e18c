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

import io
import json
import math
import os
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

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


def _final_weights(process, initial, out_dir: str):
  manager = run_dir.CheckpointManager(os.path.join(out_dir, 'checkpoints'))
  loaded, _ = simulation.run_async(manager.load_latest((initial, 0)))
  if loaded is None:
    raise ValueError(f'{out_dir} has no checkpoint to fine-tune')
  return process.get_model_weights(loaded[0])


def _arrays(weights) -> dict[str, np.ndarray]:
  return {
      f'{part}_{k}': np.asarray(v)
      for part in ('trainable', 'non_trainable')
      for k, v in enumerate(getattr(weights, part))
  }


def model_bytes() -> bytes:
  """The finished run's final model weights as an .npz of `trainable_K` and
  `non_trainable_K` arrays (the benchmark keeps it beside FedAvg's
  records)."""
  job = train.prepare(writer='train')
  process, out_dir = job.process, job.out_dir
  weights = _final_weights(process, process.initialize(), out_dir)
  buffer = io.BytesIO()
  np.savez(buffer, **_arrays(weights))
  return buffer.getvalue()


def load_model(path: str, like, content: Optional[bytes] = None):
  """The weights `model_bytes` gave, shaped as the `ModelWeights` `like`
  (read from `content`, the file's bytes, where given: a model sent to a
  worker; `path` then only names it).

  Raises:
    ValueError: The file is unreadable or of another model.
  """
  try:
    source = path if content is None else io.BytesIO(content)
    with np.load(source) as data:
      arrays = {k: data[k] for k in data.files}
  except (OSError, ValueError) as e:
    raise ValueError(f'{path}: unreadable saved model ({e})') from None
  expected = _arrays(like)
  if set(arrays) != set(expected) or any(
      arrays[k].shape != v.shape for k, v in expected.items()
  ):
    raise ValueError(f'{path}: a saved model of another shape')
  return type(like)(
      trainable=[arrays[f'trainable_{k}'] for k in range(len(like.trainable))],
      non_trainable=[
          arrays[f'non_trainable_{k}'] for k in range(len(like.non_trainable))
      ],
  )


def commonest_label(labels) -> Optional[int]:
  """The commonest class of integer (or one-hot) labels; None where the
  labels are sequences (a next-word task), which have no one class."""
  y = np.asarray(labels)
  if y.ndim == 2 and y.shape[1] > 1 and np.issubdtype(y.dtype, np.floating):
    y = y.argmax(axis=1)
  y = y.reshape(len(y), -1)
  if y.shape[1] != 1 or not np.issubdtype(y.dtype, np.integer):
    return None
  counts = np.bincount(y[:, 0].astype(np.int64))
  return int(counts.argmax())


def _labels(dataset) -> np.ndarray:
  """The labels of a client's unbatched examples ((x, y) or a dict with
  'y' or 'label')."""
  batch = next(iter(dataset.batch(2**31 - 1)), None)
  if batch is None:
    return np.zeros([0], np.int64)
  if isinstance(batch, dict):
    y = batch.get('y', batch.get('label'))
  else:
    y = batch[1]
  return np.asarray(y)


def trivial_scores() -> dict[str, Any]:
  """Each evaluated client's accuracy when every example is given the
  commonest class of the training clients' training parts (the score a
  model reaches without learning anything about the inputs).

  Returns:
    `{'label': the class, split: [accuracy per client]}` for the run's
    evaluation split (`validation` or `test`) and `unseen` where the task
    has unseen clients; `{'label': None}` where labels are sequences.
  """
  task = train.build_task()

  def labels(data, cid):
    raw = data.create_tf_dataset_for_client(cid)
    return _labels(task.preprocess_eval(raw).unbatch())

  pooled = [labels(task.train_data, c) for c in task.train_data.client_ids]
  label = commonest_label(np.concatenate(pooled)) if pooled else None
  out: dict[str, Any] = {'label': label}
  if label is None:
    return out
  holdout = train.flags.FLAGS['holdout'].value
  splits = {'validation' if holdout == 'validation' else 'test': task.test_data}
  if task.unseen_data is not None:
    splits['unseen'] = task.unseen_data
  for split, data in splits.items():
    scores = []
    for cid in data.client_ids:
      y = labels(data, cid).reshape(-1)
      scores.append(float(np.mean(y == label)) if y.size else 0.0)
    out[split] = scores
  return out


def fine_tune_run(
    *,
    learning_rates: Sequence[float],
    max_epochs: int,
    batch_size: int,
    unseen_fraction: float = 0.5,
    starts: Sequence[str] = STARTS,
    model_path: Optional[str] = None,
    model: Optional[bytes] = None,
) -> dict[str, Any]:
  """Fine-tunes the finished run named by the parsed flags; see the module.

  Args:
    learning_rates: The fine-tuning learning rates.
    max_epochs: Epochs of fine-tuning, evaluated after each.
    batch_size: Its mini-batch size.
    unseen_fraction: The share of each unseen client's examples it
      fine-tunes on.
    starts: The starting models (of `STARTS`): `final` needs the run's
      final model, `initial` only its flags.
    model_path: The final model as `model_bytes` gave it (default: the
      run's last checkpoint).
    model: That file's content, sent instead of read (`model_path` names it).

  Raises:
    ValueError: Bad arguments, or the run has no checkpoint.
  """
  if not 0.0 < unseen_fraction < 1.0:
    raise ValueError(
        f'unseen_fraction must be in (0, 1), got {unseen_fraction}'
    )
  starts = list(starts)
  if not starts or set(starts) - set(STARTS):
    raise ValueError(f'starts must be some of {STARTS}, got {starts}')
  job = train.prepare(writer='train')
  task, process, out_dir = job.task, job.process, job.out_dir
  initial = process.initialize()
  weights = {'initial': process.get_model_weights(initial)}
  if 'final' in starts:
    weights['final'] = (
        load_model(model_path, weights['initial'], model)
        if model_path
        else _final_weights(process, initial, out_dir)
    )
  holdout = train.flags.FLAGS['holdout'].value
  seed = train.flags.FLAGS['seed'].value  # The run's: shuffles vary with it.
  splits = ['validation' if holdout == 'validation' else 'test']
  if task.unseen_data is not None:
    splits.append('unseen')
  pairs = {s: _pairs(task, s, unseen_fraction) for s in splits}
  result = {}
  for start in starts:
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
  os.makedirs(out_dir, exist_ok=True)
  atomic.write_text(os.path.join(out_dir, RESULT), json.dumps(result))
  return result
