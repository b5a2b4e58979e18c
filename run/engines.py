# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""How the training loop executes rounds: simulation engines by name.

* `tff` (default): `process.next` through TFF's runtime, one client
  computation per selected client, as a production TFF pipeline runs it.
* `batched`: `tff_algos.batched.BatchedEngine`, the same round (same clients,
  batches, math and resulting state) in one TensorFlow call; simulation only.
* `stacked`: `tff_algos.stacked.StackedEngine`, the round's clients trained
  together on stacked weights (the algorithms whose client work it has in
  stacked form: `stacked.check_definition`).
"""

from typing import Optional

import tensorflow_federated as tff

from run import algorithms
from tasks import base as task_base
from tff_algos import batched
from tff_algos import options as options_lib
from tff_algos import registry
from tff_algos import stacked

ENGINE_NAMES = ('tff', 'batched', 'stacked')
LOOP_IMPLEMENTATIONS = {
    'dataset_reduce': tff.learning.LoopImplementation.DATASET_REDUCE,
    'dataset_iterator': tff.learning.LoopImplementation.DATASET_ITERATOR,
}


def check_engine(name: str, spec: algorithms.AlgorithmSpec) -> None:
  """Raises `ValueError` for an unknown engine or an unsupported algorithm.

  What an engine runs is the algorithm's registry entry (`engines`), its
  options' `check_engine` and, for the stacked engine, its definition.
  """
  if name not in ENGINE_NAMES:
    raise ValueError(
        f'unknown --simulation_engine={name!r}; choose one of: '
        f'{", ".join(ENGINE_NAMES)}'
    )
  if name == 'tff':
    return
  spec.validate()
  entry = spec.entry
  if name == 'stacked' and 'batched' in entry.engines:
    # The definition says why (e.g. client work of its own).
    try:
      stacked.check_definition(
          batched_algorithm(spec, check=False).definition()
      )
    except stacked.StackedEngineError as e:
      raise stacked.StackedEngineError(_engine_wording(str(e))) from None
  if name not in entry.engines:
    raise ValueError(
        f'--simulation_engine={name} supports --algorithm='
        f'{", ".join(registry.engine_names(name))}, not {spec.name}'
    )
  try:
    spec.options.check_engine(name)
  except options_lib.OptionError as e:
    raise ValueError(_engine_wording(str(algorithms.flag_wording(e)))) from None


def _engine_wording(text: str) -> str:
  """A library message about an engine in this binary's flag wording."""
  for engine in ENGINE_NAMES:
    text = text.replace(f'the {engine} engine', f'--simulation_engine={engine}')
  return text


def batched_algorithm(
    spec: algorithms.AlgorithmSpec,
    *,
    num_clients: int = 1,
    check: bool = True,
) -> batched.BatchedAlgorithm:
  """The `BatchedAlgorithm` of an algorithm spec (same optimizers).

  Its definition is the algorithm's registry `definition` with the spec's
  options; `num_clients` is the population (AFL's mixture size; any value
  checks).
  """
  if check:
    spec.validate()
  context = algorithms.context(spec, num_clients=num_clients)
  entry, options = spec.entry, spec.options
  return batched.BatchedAlgorithm.from_definition(
      spec.name,
      lambda: entry.definition(options, context),
      client_optimizer=context.client_optimizer,
      server_optimizer=context.server_optimizer,
      client_weighting=context.client_weighting,
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
    spec: The algorithm (those whose client work is local training, the
      full gradient of afl and qfedsgd, or ditto's personal passes with
      `ditto_personal_steps=0`: not the Fed+ family).
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
