# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""How the training loop executes rounds: simulation engines by name.

* `tff` (default): `process.next` through TFF's runtime, one client
  computation per selected client, as a production TFF pipeline runs it.
* `batched`: `tff_algos.batched.BatchedEngine`, the same round (same clients,
  batches, math and resulting state) in one TensorFlow call; simulation only.
* `stacked`: `tff_algos.stacked.StackedEngine`, the round's clients trained
  together on stacked weights (the algorithms whose client work is local
  training).
"""

from typing import Optional

import tensorflow_federated as tff

from run import algorithms
from tasks import base as task_base
from tff_algos import batched
from tff_algos import stacked

ENGINE_NAMES = ('tff', 'batched', 'stacked')
LOOP_IMPLEMENTATIONS = {
    'dataset_reduce': tff.learning.LoopImplementation.DATASET_REDUCE,
    'dataset_iterator': tff.learning.LoopImplementation.DATASET_ITERATOR,
}


def check_engine(name: str, spec: algorithms.AlgorithmSpec) -> None:
  """Raises `ValueError` for an unknown engine or an unsupported algorithm."""
  if name not in ENGINE_NAMES:
    raise ValueError(
        f'unknown --simulation_engine={name!r}; choose one of: '
        f'{", ".join(ENGINE_NAMES)}'
    )
  if name == 'batched':
    batched_algorithm(spec)
  if name == 'stacked':
    try:
      algorithm = batched_algorithm(spec)
    except ValueError as e:
      raise ValueError(str(e).replace('=batched', '=stacked')) from None
    stacked.check_definition(algorithm.definition())


def batched_algorithm(
    spec: algorithms.AlgorithmSpec, *, num_clients: int = 1
) -> batched.BatchedAlgorithm:
  """The `BatchedAlgorithm` of an algorithm spec (same optimizers).

  `num_clients` is the population (AFL's mixture size; any value checks).
  """
  client_opt = algorithms.build_optimizer(
      spec.client_optimizer, spec.client_learning_rate
  )
  server_opt = algorithms.build_optimizer(
      spec.server_optimizer, spec.server_learning_rate, spec.server_momentum
  )
  return batched.algorithm_from_spec(
      spec,
      client_optimizer=client_opt,
      server_optimizer=server_opt,
      client_weighting=algorithms.WEIGHTINGS[spec.client_weighting],
      options=algorithms.definition_options(spec, num_clients=num_clients),
  )


def build_batched_engine(
    spec: algorithms.AlgorithmSpec,
    task: task_base.FederatedTask,
    *,
    shuffle: bool = True,
    loop_implementation: tff.learning.LoopImplementation = (
        tff.learning.LoopImplementation.DATASET_ITERATOR
    ),
) -> batched.BatchedEngine:
  """The batched engine running `spec` on `task`.

  Args:
    spec: The algorithm (fedavg, fedprox, qffl, deltafl with the exact
      quantile, term, ditto, the Fed+ family, afl).
    task: The task whose model, preprocessing and clients it uses.
    shuffle: As `SimulationConfig.shuffle`.
    loop_implementation: How the engine iterates client streams (the
      result does not depend on it; see `BatchedEngine`).

  Returns:
    A `BatchedEngine`.
  """
  return batched.BatchedEngine(
      task.model_fn,
      task.preprocess_train,
      batched.ClientArrays(task.train_data),
      batched_algorithm(spec, num_clients=len(task.train_data.client_ids)),
      shuffle=shuffle,
      loop_implementation=loop_implementation,
  )


def build_stacked_engine(
    spec: algorithms.AlgorithmSpec,
    task: task_base.FederatedTask,
    *,
    shuffle: bool = True,
    vectorize: Optional[bool] = None,
    rnn_kernels: bool = True,
    group_by_size: bool = False,
) -> stacked.StackedEngine:
  """The stacked engine running `spec` on `task`.

  Args:
    spec: The algorithm (those whose client work is local training: not
      ditto, the Fed+ family or afl).
    task: The task whose model, preprocessing and clients it uses.
    shuffle: As `SimulationConfig.shuffle`.
    vectorize: Train the clients together (False: one after another through
      the same functional step; None: by the model, see `StackedEngine`).
    rnn_kernels: As `StackedEngine`'s (False: `vectorized_map` over Keras'
      recurrent layers, for comparison).
    group_by_size: As `StackedEngine`'s (size-ordered groups of clients).

  Returns:
    A `StackedEngine`.

  Raises:
    ValueError: For an algorithm, model, task or client optimizer the engine
      does not run.
  """
  check_engine('stacked', spec)
  return stacked.StackedEngine(
      task.model_fn,
      task.preprocess_train,
      task.train_data,
      batched_algorithm(spec, num_clients=len(task.train_data.client_ids)),
      shuffle=shuffle,
      vectorize=vectorize,
      rnn_kernels=rnn_kernels,
      group_by_size=group_by_size,
  )


def loop_implementation(name: str) -> tff.learning.LoopImplementation:
  """`--loop_implementation` by name (raises `ValueError` if unknown)."""
  if name not in LOOP_IMPLEMENTATIONS:
    raise ValueError(
        f'unknown --loop_implementation={name!r}; choose one of:'
        f' {", ".join(LOOP_IMPLEMENTATIONS)}'
    )
  return LOOP_IMPLEMENTATIONS[name]
