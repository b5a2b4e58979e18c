# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""How the training loop executes rounds: simulation engines by name.

* `tff` (default): `process.next` through TFF's runtime, one client
  computation per selected client, as a production TFF pipeline runs it.
* `batched`: `tff_algos.batched.BatchedEngine`, the same round (same clients,
  batches, math and resulting state) in one TensorFlow call; simulation only.
* `stacked`: `tff_algos.stacked.StackedEngine`, the round's clients trained
  together on stacked weights (the algorithms whose client work it has in
  stacked form: `stacked.check_definition`).

Which engines run an algorithm with its options is one answer,
`tff_algos.engine_check` (`check_engine` words it as flags, `engines_of`
lists them).
"""

from typing import Optional

import tensorflow_federated as tff

from run import algorithms
from tasks import base as task_base
from tff_algos import batched
from tff_algos import engine_check
from tff_algos import options as options_lib
from tff_algos import stacked

ENGINE_NAMES = ('tff', 'batched', 'stacked')
LOOP_IMPLEMENTATIONS = {
    'dataset_reduce': tff.learning.LoopImplementation.DATASET_REDUCE,
    'dataset_iterator': tff.learning.LoopImplementation.DATASET_ITERATOR,
}


def check_engine(name: str, spec: algorithms.AlgorithmSpec) -> None:
  """Raises `ValueError` for an unknown engine or an unsupported algorithm,
  in this binary's flag wording.

  What an engine runs is `tff_algos.engine_check`'s one answer (the
  registry entry's engines, the options' `check_engine` and, for the
  stacked engine, the definition); a refusal of the stacked engine's own
  keeps its type (`stacked.StackedEngineError`).
  """
  if name not in ENGINE_NAMES:
    raise ValueError(
        f'unknown --simulation_engine={name!r}; choose one of: '
        f'{", ".join(ENGINE_NAMES)}'
    )
  if name == 'tff':
    return
  spec.validate()
  try:
    engine_check.check(*_engine_question(spec), name)
  except stacked.StackedEngineError as e:
    # The definition says why (e.g. client work of its own).
    raise stacked.StackedEngineError(_engine_wording(str(e))) from None
  except engine_check.UndeclaredEngineError as e:
    raise ValueError(
        f'--simulation_engine={name} supports --algorithm='
        f'{", ".join(e.supported)}, not {spec.name}'
    ) from None
  except options_lib.OptionError as e:
    raise ValueError(_engine_wording(str(algorithms.flag_wording(e)))) from None


def engines_of(spec: algorithms.AlgorithmSpec) -> tuple[str, ...]:
  """The engines that run `spec` (`tff_algos.engine_check.engines`)."""
  spec.validate()
  return engine_check.engines(*_engine_question(spec))


def _engine_question(spec: algorithms.AlgorithmSpec):
  """`(entry, options, definition_fn)`: what `engine_check` asks about."""
  return (
      spec.entry,
      spec.options,
      lambda: batched_algorithm(spec, check=False).definition(),
  )


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
    spec: The algorithm (those `engines_of` lists the stacked engine for:
      client work of local training, the full gradient of afl and qfedsgd,
      or a kind with its own stacked kernel such as Ditto's personal passes
      with `ditto_personal_steps=0` and Fed+'s with `fedplus_local_steps=0`).
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
