# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""Stateful-client algorithms (Ditto, Fed+) as production-style TFF programs.

`run.program` runs `LearningProcess`es under
`tff.learning.programs.train_model`. Ditto (Li et al., "Ditto: Fair and
Robust Federated Learning Through Personalization", ICML 2021,
arXiv:2012.04221) and Fed+ (Kundu et al., "Robustness and Personalization in
Federated Learning: A Unified Approach via Regularization", arXiv:2009.06303)
keep a model per client across rounds (`tff_algos.stateful`): their `next`
takes and returns the selected clients' states (`(state, data,
client_states) -> (state, client_states, metrics)`), while `train_model`
calls `next(state, data)`, and `tff.program.NativeFederatedContext` only
returns server-placed values and materializes a CLIENTS-placed argument only
as what a data-source iterator selects (a sequence per client). This module
runs them under the same `train_model` all the same, by what it gives it:

* `train_data_source`: `StatefulClientDataSource`, a
  `tff.program.FederatedDataSource` whose iterator selects exactly
  `run.program.ClientDataSource`'s clients and shuffles (so `run.train`'s)
  and yields each selected client's training data together with its stored
  state: one sequence per client whose first element (the header) holds the
  state and the client's position in the cohort, the next ones its batches
  (`client_sequence`). The iterator is `tff.Serializable` (task, seed, round
  counter); the states are not in it, they are read from a
  `tff_algos.client_states.ClientStateStore` bound to it, and it notes each
  selection (round, client ids) in the source's `LastSelection`. Its deep
  copies (`train_model` copies it every round) share both.
* `train_process`: `ProgramRoundProcess`. Its `initialize` and
  `get_model_weights` are the algorithm's; its `next(state, data)` runs
  `build_program_round`, a `tff.Computation` `(state@SERVER,
  {header+batches}@CLIENTS) -> <state, client states, metrics>@SERVER` (each
  client splits its sequence into its state and its batches, runs the
  algorithm's own round computation, and places its new state at its
  position in a `[k, ...]` tensor per weight, all zero elsewhere; the
  `federated_sum` of these is exact, x + 0 = x, and brings the cohort's new
  states to the server in selection order), and returns a
  `tff.learning.templates.LearningProcessOutput(state, metrics)` whose
  metrics carry these states as one more server-placed field,
  `client_states`.
* `should_discard_round`: `ProgramRoundProcess.keep_client_states`.
  `train_model` (TFF 0.87) calls it with each round's materialized output
  before it schedules the round's program-state save and metrics release; it
  takes `client_states` out of the metrics (so they are not released),
  writes them to the store (`put_many` of the last selection's clients, at
  its round), snapshots the store at that round and never discards the
  round.
* `program_state_manager`: `ClientStatesManager`, around `run.program`'s
  (a `tff.program.FileProgramStateManager` under `program_state/` that saves
  a round's version once its metrics row is written). Its `load_latest`
  loads the newest version whose client states restore too (the store is
  restored to that round; a version whose snapshot is damaged is set aside,
  program state and snapshot, and the one before is tried), and binds the
  loaded iterator to the store. It saves in this program's format
  `(state, round_num, iterator)`: `train_model`'s
  `next_evaluation_timestamp_seconds` is always None here (no evaluation
  manager), so folders of earlier versions resume.

The store is snapshotted before the program state of the same round is
saved, so the latest program-state version always has its client states; a
program interrupted between the two resumes from the previous version, and
the store's restore drops the newer states. `train_model` saves and releases
in background tasks and goes on with the next round, and the store keeps
only as many snapshots (3) as the state manager keeps versions: a save that
fell behind by 3 rounds would leave its version without client states. So
`next` gives the round computation a third, server-placed argument, the
previous round's number as a reference that materializes once that round's
program state is saved; TFF materializes the arguments before it runs a
computation, so round r runs after version r - 1 is saved (and so after its
metrics row is written) and the store is never more than one snapshot ahead.

The releases are `train_model`'s, as in `run.program`: the training metrics
(`client_work/train` promoted to `model_metrics/`, the algorithm's other
metrics kept) to `metrics.csv` (`tff.program.CSVFileReleaseManager`) and
`tensorboard/train` (`tff.program.TensorBoardReleaseManager`), and the
training state every 10 rounds and at the end to
`models/training_checkpoint_round_N`
(`tff.program.SavedModelFileReleaseManager`): `models/` holds what
`run.program`'s does.

At the end the global model and every client's personal model are evaluated
on every client (`clients/round_NNNNN.csv`, `clients/personal_...`,
`summary.json`, `run.train`'s format).

`ClientStates` holds all of this: it is the optional stateful part of
`run.program`'s one program loop (`run.program.run_program` and
`binary_main`: settings, folder lock, `NativeFederatedContext`, event loop,
errors, per-client outputs, flags), which hands `train_model` the pieces
above instead of its stateless ones when it is given one.

Example:

  python -m run.stateful_program --task=synthetic --algorithm=ditto \
      --ditto_lambda=1 --total_rounds=20 --clients_per_round=10 \
      --client_learning_rate=0.05 --experiment_name=ditto_program
"""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
import collections
import json
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from absl import flags
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from run import program
from run import simulation
from run import train
from tasks import base as task_base
from tff_algos import client_states as client_states_lib
from tff_algos import stateful

# pylint: enable=g-import-not-at-top,wrong-import-position
# This module extends run.program's data source and reuses its helpers.
# pylint: disable=protected-access

BATCH = 'batch'
CLIENT_STATE = 'client_state'
POSITION = 'position'
# The metrics field of `ProgramRoundProcess.next` carrying the new states.
CLIENT_STATES = 'client_states'


def _leaf_specs(
    process: stateful.StatefulClientsProcess,
) -> list[tuple[list[int], str]]:
  """`(shape, dtype name)` of each leaf of a client state (JSON-able)."""
  return [
      (list(np.shape(a)), np.asarray(a).dtype.name)
      for a in tf.nest.flatten(process.initial_client_state())
  ]


def _batch_spec(spec: program.DataSpec):
  task = spec.task_object
  return task.train_dataset(spec.client_ids()[0], 1, None).element_spec


def _element_spec(spec: program.DataSpec, leaves):
  """The `tf.TensorSpec` structure of one element of a client's sequence."""
  return collections.OrderedDict(
      [
          (BATCH, _batch_spec(spec)),
          (
              CLIENT_STATE,
              tuple(
                  tf.TensorSpec([None] + list(shape), dtype)
                  for shape, dtype in leaves
              ),
          ),
          (POSITION, tf.TensorSpec([], tf.int32)),
      ]
  )


def _empty_batch(batch_spec):
  """A batch of 0 examples with `batch_spec`'s structure."""

  def empty(s: tf.TensorSpec):
    if not s.shape or s.shape[0] is not None:
      raise ValueError(
          'client batches need an unknown leading (batch) dimension to carry '
          f'a state header, got {s}'
      )
    shape = [0] + [d if d is not None else 0 for d in s.shape[1:]]
    return np.zeros(shape, s.dtype.as_numpy_dtype)

  return tf.nest.map_structure(empty, batch_spec)


def client_sequence(
    batches: tf.data.Dataset, client_state, position: int
) -> tf.data.Dataset:
  """A client's batches with its state in front, as the program feeds them.

  Element 0 (the header) holds an empty batch, the state's leaves each with a
  leading dimension of 1, and `position`; the next elements hold the batches
  with empty (0-row) state leaves, so the state is carried once.

  Args:
    batches: The client's training batches (leading dimension unknown).
    client_state: Its stored state (a `tf.nest` structure of arrays).
    position: Its index in the round's cohort.

  Returns:
    A `tf.data.Dataset` of `OrderedDict(batch, client_state, position)`.
  """
  leaves = [np.asarray(a) for a in tf.nest.flatten(client_state)]
  header = tf.data.Dataset.from_tensors(
      collections.OrderedDict(
          [
              (BATCH, _empty_batch(batches.element_spec)),
              (CLIENT_STATE, tuple(a[np.newaxis] for a in leaves)),
              (POSITION, np.int32(position)),
          ]
      )
  )
  empty = tuple(np.zeros((0,) + a.shape, a.dtype) for a in leaves)

  def with_empty_state(*batch):
    # `map` unpacks tuple elements: pack them again.
    return collections.OrderedDict(
        [
            (BATCH, batch[0] if len(batch) == 1 else batch),
            (CLIENT_STATE, empty),
            (POSITION, np.int32(position)),
        ]
    )

  body = batches.map(with_empty_state)
  return header.concatenate(body)


class LastSelection:
  """The round and clients of the latest selection of the iterators bound to
  it (`StatefulClientDataSourceIterator.bind`).

  Attributes:
    round_num: The round of that selection (0: none yet).
    client_ids: Its clients, in cohort order.
  """

  def __init__(self):
    self.round_num = 0
    self.client_ids: list[str] = []


class StatefulClientDataSourceIterator(program.ClientDataSourceIterator):
  """`ClientDataSourceIterator`'s clients, each with its stored state.

  `select(k)` returns one `client_sequence` per selected client; the states
  come from the bound `ClientStateStore` (`bind`), `selected_ids` names the
  clients of the last selection, and so does the bound `LastSelection`, if
  any, with its round. Serialized as the parent (data spec, round counter)
  plus the state leaves' shapes; the store is not serialized: it is
  versioned by round next to the program state. A deep copy shares the store
  and the `LastSelection`.
  """

  def __init__(
      self,
      spec: program.DataSpec,
      leaves,
      round_num: int = 0,
      store: Optional[client_states_lib.ClientStateStore] = None,
      last_selection: Optional[LastSelection] = None,
  ):
    if spec.split != 'train' or spec.client_index:
      raise ValueError(
          'stateful clients train on the train split, without a client index'
      )
    super().__init__(spec, round_num)
    self._leaves = [(list(s), str(d)) for s, d in leaves]
    self._federated_type = tff.FederatedType(
        tff.SequenceType(
            tff.types.tensorflow_to_type(_element_spec(spec, self._leaves))
        ),
        tff.CLIENTS,
    )
    self._store = store
    self._last_selection = last_selection
    self._selected: list[str] = []

  @classmethod
  def from_bytes(cls, buffer: bytes) -> 'StatefulClientDataSourceIterator':
    """Deserializes the iterator (unbound: call `bind`)."""
    saved = json.loads(bytes(buffer).decode('utf-8'))
    return cls(
        program.DataSpec.from_json(saved['spec']),
        saved['leaves'],
        int(saved['round_num']),
    )

  def to_bytes(self) -> bytes:
    """Serializes the data spec, round counter and state leaf specs."""
    return json.dumps(
        {
            'spec': self._spec.to_json(),
            'round_num': self._round_num,
            'leaves': self._leaves,
        }
    ).encode('utf-8')

  def bind(
      self,
      store: client_states_lib.ClientStateStore,
      last_selection: Optional[LastSelection] = None,
  ) -> None:
    """Reads the clients' states from `store` from now on, and notes each
    selection in `last_selection` (if given)."""
    self._store = store
    self._last_selection = last_selection

  @property
  def selected_ids(self) -> list[str]:
    """The client ids of the last `select`, in cohort order."""
    return list(self._selected)

  def select(self, k: Optional[int] = None) -> list[tf.data.Dataset]:
    """The next round's `k` clients' sequences (state header + batches).

    Raises:
      ValueError: If `k` is out of range or no store is bound.
    """
    if self._store is None:
      raise ValueError('bind a ClientStateStore to the iterator first')
    datasets = super().select(k)
    ids = self._spec.client_ids()
    num_examples = None
    if self._spec.sampling == 'examples':
      task = self._spec.task_object
      num_examples = [
          task_base.count_examples(
              task.train_data.create_tf_dataset_for_client(cid)
          )
          for cid in ids
      ]
    self._selected = simulation.sample_clients(
        ids,
        self._round_num,
        clients_per_round=k,
        seed=self._spec.seed,
        scheme=self._spec.sampling,
        num_examples=num_examples,
    )
    if self._last_selection is not None:
      self._last_selection.round_num = self._round_num
      self._last_selection.client_ids = list(self._selected)
    states = self._store.get_many(self._selected)
    return [
        client_sequence(ds, s, i)
        for i, (ds, s) in enumerate(zip(datasets, states))
    ]

  def __deepcopy__(self, memo) -> 'StatefulClientDataSourceIterator':
    # `train_model` deep-copies the iterator each round (to save it, and to
    # retry a discarded round): the copy reads the same store and notes its
    # selections in the same `LastSelection`.
    del memo
    return StatefulClientDataSourceIterator(
        self._spec,
        self._leaves,
        self._round_num,
        self._store,
        self._last_selection,
    )

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, StatefulClientDataSourceIterator):
      return NotImplemented
    return super().__eq__(other) and self._leaves == other._leaves


class StatefulClientDataSource(tff.program.FederatedDataSource):
  """A `tff.program.FederatedDataSource` of clients with stored states.

  Its iterators read the states from `store` and note their selections in
  `last_selection`.
  """

  def __init__(
      self,
      spec: program.DataSpec,
      process: stateful.StatefulClientsProcess,
      store: client_states_lib.ClientStateStore,
  ):
    self._spec = spec
    self._leaves = _leaf_specs(process)
    self._store = store
    self.last_selection = LastSelection()
    self._federated_type = self.iterator().federated_type

  @property
  def federated_type(self) -> tff.FederatedType:
    """The type of what its iterators select."""
    return self._federated_type

  @property
  def store(self) -> client_states_lib.ClientStateStore:
    """The store its iterators read the states from."""
    return self._store

  def iterator(self) -> StatefulClientDataSourceIterator:
    """A fresh iterator bound to the store, starting at round 1."""
    return StatefulClientDataSourceIterator(
        self._spec,
        self._leaves,
        store=self._store,
        last_selection=self.last_selection,
    )

  def bind(self, iterator: StatefulClientDataSourceIterator) -> None:
    """Binds a loaded iterator as `iterator()` binds a fresh one."""
    iterator.bind(self._store, self.last_selection)


def _next_computation(
    process: stateful.StatefulClientsProcess,
) -> tff.Computation:
  # The round `tff.Computation` itself (the process's `next` wraps it).
  return tff.templates.IterativeProcess.next.fget(process)


def build_program_round(
    process: stateful.StatefulClientsProcess,
    data_type: tff.FederatedType,
    clients_per_round: int,
) -> tff.Computation:
  """The round as a program computation: server-placed results only.

  Args:
    process: A `stateful.StatefulClientsProcess` (Ditto, Fed+).
    data_type: `StatefulClientDataSource.federated_type`.
    clients_per_round: k, the cohort size (the positions are in [0, k)).

  Returns:
    A `tff.Computation` `(state@SERVER, {header+batches}@CLIENTS) ->
    <state@SERVER, client_states@SERVER, metrics@SERVER>`, where
    `client_states` holds, for each leaf of a client state, a `[k, ...]`
    array whose row i is the new state of the cohort's i-th client.

  Raises:
    TypeError: If `process` is not stateful.
    ValueError: If its client data are not plain sequences (attack markers).
  """
  if not stateful.is_stateful(process):
    raise TypeError(
        'process must be a stateful.StatefulClientsProcess, got '
        f'{type(process).__name__}'
    )
  if clients_per_round < 1:
    raise ValueError(
        f'clients_per_round must be >= 1, got ' f'{clients_per_round}'
    )
  inner = _next_computation(process)
  state_type, inner_data, inner_states = inner.type_signature.parameter
  if not isinstance(inner_data.member, tff.SequenceType):
    raise ValueError(
        'the program feeds plain client sequences; this process expects '
        f'{inner_data.member} (attack markers are for run.train)'
    )
  client_state_type = inner_states.member
  template = process.initial_client_state()
  shapes = [np.shape(a) for a in tf.nest.flatten(template)]
  sequence_type = data_type.member
  k = int(clients_per_round)

  @tff.tensorflow.computation(sequence_type)
  def split(sequence):
    initial = (
        tuple(
            tf.zeros(s, dtype=t.dtype)
            for s, t in zip(shapes, sequence.element_spec[CLIENT_STATE])
        ),
        tf.constant(0),
    )
    leaves, position = sequence.take(1).reduce(
        initial,
        lambda _, e: (
            tuple(  # pylint: disable=g-long-lambda
                tf.reshape(a[0], s) for a, s in zip(e[CLIENT_STATE], shapes)
            ),
            e[POSITION],
        ),
    )
    batches = sequence.skip(1).map(lambda e: e[BATCH])
    return (batches, tf.nest.pack_sequence_as(template, list(leaves)), position)

  @tff.tensorflow.computation(client_state_type, np.int32)
  def place(client_state, position):
    return tuple(
        tf.scatter_nd([[position]], a[tf.newaxis], [k] + list(s))
        for a, s in zip(tf.nest.flatten(client_state), shapes)
    )

  @tff.federated_computation(state_type, data_type)
  def program_round(state, data):
    parts = tff.federated_map(split, data)
    output = inner(state, parts[0], parts[1])
    placed = tff.federated_map(place, (output[1], parts[2]))
    return output[0], tff.federated_sum(placed), output[2]

  return program_round


def unstack_states(
    process: stateful.StatefulClientsProcess, stacked, count: int
) -> list[Any]:
  """Row i of every `[k, ...]` leaf, packed as a client state, for i < count."""
  template = process.initial_client_state()
  leaves = [np.asarray(a) for a in tf.nest.flatten(stacked)]
  return [
      tf.nest.pack_sequence_as(template, [a[i] for a in leaves])
      for i in range(count)
  ]


def _saved_form(state, round_num, iterator):
  """The program state as this program saves it (`ClientStatesManager`)."""
  return collections.OrderedDict(
      state=state, round_num=round_num, iterator=iterator
  )


def _train_model_form(saved) -> tff.learning.programs.ProgramState:
  """A saved program state as `train_model` takes it (no evaluation)."""
  return tff.learning.programs.ProgramState(
      saved['state'], int(saved['round_num']), None, saved['iterator']
  )


# What a damaged client-state file raises when it is read.
_DAMAGED_CLIENT_STATES = (
    zipfile.BadZipFile,
    EOFError,
    OSError,
    ValueError,
    KeyError,
)


def _set_aside_client_states(output_dir: str, version: int) -> None:
  """Renames the memory store's snapshot of `version` `damaged_<name>`."""
  folder = os.path.join(output_dir, 'client_states')
  name = f'states_round_{version:08d}.npz'
  if os.path.exists(os.path.join(folder, name)):
    kept, i = f'damaged_{name}', 0
    while os.path.lexists(os.path.join(folder, kept)):
      i += 1
      kept = f'damaged_{name}.{i}'
    os.rename(os.path.join(folder, name), os.path.join(folder, kept))


class ClientStatesManager(tff.program.ProgramStateManager):
  """`train_model`'s program-state manager: `run.program`'s, with the store.

  * `load_latest` loads the newest version whose client states restore: the
    store is restored to that round; a version whose snapshot is damaged is
    set aside (`run_dir.CheckpointManager.set_aside`, and the snapshot is
    renamed `damaged_<name>`) and the one before is tried; no version: the
    store is emptied (the states of a program that never saved a round). The
    loaded iterator is bound to the store (`StatefulClientDataSource.bind`).
  * The states are saved as `(state, round_num, iterator)`, the format of
    this program before it ran under `train_model`, whose
    `next_evaluation_timestamp_seconds` is always None here.
  * `saved(version)` returns once that version is saved (or was loaded).
  """

  def __init__(
      self,
      inner: program.StateAfterMetrics,
      source: StatefulClientDataSource,
      output_dir: str,
  ):
    self._inner = inner
    self._source = source
    self._store = source.store
    self._output_dir = output_dir
    self._saved_through = -1  # The newest version loaded or saved.
    self._saves = program.KeyedEnds()  # Each version's save.

  async def get_versions(self) -> Optional[list[int]]:
    """The saved versions (None if none)."""
    return await self._inner.get_versions()

  async def load(self, version: int, structure):
    """Version `version`, as a `tff.learning.programs.ProgramState`."""
    saved = await self._inner.load(
        version,
        _saved_form(structure.state, 0, structure.data_iterator),
    )
    return _train_model_form(saved)

  async def load_latest(self, structure):
    """The newest version whose client states restore, and its number."""
    saved_structure = _saved_form(structure.state, 0, structure.data_iterator)
    while True:
      saved, version = await self._inner.load_latest(saved_structure)
      if saved is None:
        self._store.restore(0)
        return None, 0
      try:
        self._store.restore(version)
        break
      except _DAMAGED_CLIENT_STATES as e:
        if not version:
          raise
        _set_aside_client_states(self._output_dir, version)
        self._inner.set_aside(
            version, f'its client states: {type(e).__name__}: {e}'
        )
    self._source.bind(saved['iterator'])
    self._saved_through = max(self._saved_through, version)
    return _train_model_form(saved), version

  async def save(self, program_state, version: int) -> None:
    """Saves `train_model`'s `program_state` as `version`."""

    async def save_it():
      await self._inner.save(
          _saved_form(
              program_state.state,
              program_state.round_number,
              program_state.data_iterator,
          ),
          version,
      )
      self._saved_through = max(self._saved_through, version)

    await self._saves.run(version, save_it())

  async def saved(self, version: int) -> None:
    """Returns once `version` is saved or was loaded.

    Raises:
      The save's error, if it failed.
    """
    if version <= self._saved_through:
      return
    await self._saves.wait(version)


class _AfterSave(tff.program.MaterializableValueReference):
  """`round_num`, materialized once its program state is saved."""

  def __init__(self, manager: ClientStatesManager, round_num: int):
    self._manager = manager
    self._round_num = round_num

  @property
  def type_signature(self) -> tff.TensorType:
    return tff.TensorType(np.int32)

  async def get_value(self) -> np.int32:
    await self._manager.saved(self._round_num)
    return np.int32(self._round_num)


class ProgramRoundProcess:
  """A stateful process as `train_model`'s `train_process` (see the module
  docstring).

  `initialize` and `get_model_weights` are the process's. `next(state,
  data)` runs the round of the last selection once the round before is
  saved and returns a `LearningProcessOutput` whose metrics hold the
  cohort's new states (`CLIENT_STATES`, `[k, ...]` per leaf);
  `keep_client_states` is `train_model`'s `should_discard_round`.
  """

  def __init__(
      self,
      process: stateful.StatefulClientsProcess,
      source: StatefulClientDataSource,
      manager: ClientStatesManager,
      clients_per_round: int,
  ):
    self._process = process
    self._source = source
    self._manager = manager
    self._store = source.store
    self.initialize = process.initialize
    self.get_model_weights = process.get_model_weights
    round_fn = build_program_round(
        process, source.federated_type, clients_per_round
    )

    @tff.federated_computation(
        round_fn.type_signature.parameter[0],
        source.federated_type,
        tff.FederatedType(np.int32, tff.SERVER),
    )
    def after_saved_round(state, data, saved_round):
      del saved_round  # Materialized before the round runs: that orders it.
      return round_fn(state, data)

    self._round = after_saved_round

  def next(self, state, data) -> tff.learning.templates.LearningProcessOutput:
    """Runs the round of the last selection after the previous one's save."""
    round_num = self._source.last_selection.round_num
    new_state, stacked, metrics = self._round(
        state, data, _AfterSave(self._manager, round_num - 1)
    )
    metrics = collections.OrderedDict(metrics)
    metrics[CLIENT_STATES] = stacked
    return tff.learning.templates.LearningProcessOutput(new_state, metrics)

  def keep_client_states(
      self, output: tff.learning.templates.LearningProcessOutput
  ) -> bool:
    """Writes a round's new client states to the store and snapshots it.

    `train_model`'s `should_discard_round`: it is called with the round's
    materialized output before the round's program state is saved. The
    states are taken out of the metrics (not released).

    Returns:
      False: the round is kept.
    """
    stacked = output.metrics.pop(CLIENT_STATES)
    selection = self._source.last_selection
    self._store.put_many(
        selection.client_ids,
        unstack_states(self._process, stacked, len(selection.client_ids)),
        round_num=selection.round_num,
    )
    self._store.snapshot(selection.round_num)  # Before the program state.
    return False


def build_client_state_store(
    process: stateful.StatefulClientsProcess,
    output_dir: str,
    kind: str = 'memory',
) -> client_states_lib.ClientStateStore:
  """The program's store: `memory` (snapshots in `client_states/`) or `disk`.

  Its snapshots live next to `program_state/` and keep as many rounds (3)
  as the `FileProgramStateManager`.
  """
  return client_states_lib.build_store(
      kind,
      lambda _: process.initial_client_state(),
      directory=os.path.join(output_dir, 'client_states'),
      keep_snapshots=3,
  )


class ClientStates:
  """The stateful part of a program (`run.program.ClientStatesPart`).

  It keeps the clients' states in a `ClientStateStore` of kind `memory` or
  `disk` under `client_states/`, trains the rounds under `train_model` with
  this module's data source, round process and state manager, and evaluates
  every client's personal model after training.
  """

  outputs = (
      '(metrics.csv, clients/, summary.txt, tensorboard/, program_state/, '
      'client_states/, models/)'
  )

  def __init__(self, kind: str = 'memory'):
    if kind not in ('memory', 'disk'):
      raise ValueError(
          f'unknown client-state store {kind!r}; choose memory or disk'
      )
    self._kind = kind
    self._store: Optional[client_states_lib.ClientStateStore] = None

  def settings(self) -> dict[str, Any]:
    """The store's kind, saved with the program's settings."""
    return {'client_state_store': self._kind}

  def check(self, process, task: task_base.FederatedTask) -> None:
    """Raises `TypeError` / `ValueError` if it cannot run `process`."""
    if not stateful.is_stateful(process):
      raise TypeError(
          'process must be a stateful.StatefulClientsProcess (Ditto, Fed+); '
          'run LearningProcesses with run.program.run_program'
      )
    if len(process.personal_model_names) > 1 and task.validation_data is None:
      raise ValueError(
          'a lambda grid is selected on validation data, and this task has '
          'none; give it a validation split or a single lambda'
      )

  async def train(self, process, spec, config, output_dir, managers):
    """Trains under `train_model`; the final state and its round."""
    self._store = build_client_state_store(process, output_dir, self._kind)
    source = StatefulClientDataSource(spec, process, self._store)
    state_manager = ClientStatesManager(managers.state, source, output_dir)
    rounds = ProgramRoundProcess(
        process, source, state_manager, config.clients_per_round
    )
    await tff.learning.programs.train_model(
        train_process=rounds,
        train_data_source=source,
        train_per_round_clients=config.clients_per_round,
        train_total_rounds=config.total_rounds,
        should_discard_round=rounds.keep_client_states,
        program_state_manager=state_manager,
        model_output_manager=managers.models,
        train_metrics_manager=managers.metrics,
        evaluation_manager=None,
        evaluation_periodicity=config.total_rounds,
    )
    # The state the program ended with, as a resumed program would load it.
    initial = await tff.program.materialize_value(process.initialize())
    saved, version = await managers.state.load_latest(
        _saved_form(initial, 0, source.iterator())
    )
    return saved['state'], version

  def personal_per_client(
      self, process, state, task: task_base.FederatedTask
  ) -> Mapping[str, Any]:
    """Every client's personal model on its data (`personal/...` tables)."""
    return simulation.evaluate_personal_per_client(
        process, state, task, self._store, include_train=True
    )

  def result(self) -> dict[str, Any]:
    """`{'client_state_store': the store}`."""
    return {'client_state_store': self._store}

  def error_message(self, error: Exception, output_dir: str) -> Optional[str]:
    """The binary's line for a store error or a damaged client-state file."""
    if isinstance(error, client_states_lib.ClientStateError):
      return str(error)
    if isinstance(error, (zipfile.BadZipFile, EOFError)):
      return (
          f'a client-state file under {output_dir} is damaged '
          f'({type(error).__name__}: {error}); restore it or remove that '
          'folder to start over'
      )
    return None


def run_stateful_program(
    process: stateful.StatefulClientsProcess,
    *,
    task_name: str,
    task_kwargs: Mapping[str, Any],
    config: program.ProgramConfig,
    output_dir: str,
    seed: int = 0,
    client_epochs_per_round: int = 1,
    client_sampling: str = 'uniform',
    client_state_store: str = 'memory',
    settings: Optional[Mapping[str, Any]] = None,
) -> dict[str, Any]:
  """Runs a stateful-client process as a TFF program (see module docstring).

  `run.program.run_program` with this module's `ClientStates` part.

  Args:
    process: A `stateful.StatefulClientsProcess` (Ditto, Fed+) built for the
      task's model.
    task_name: A `tasks.registry` task name.
    task_kwargs: Its `create_task` arguments (JSON-able).
    config: Rounds and cohort (`rounds_per_eval` and `eval_clients` are not
      used: the models are evaluated per client after training).
    output_dir: Program state, client states, metrics and models; a program
      found there is resumed from its last saved round.
    seed: Seed of client selection and shuffles.
    client_epochs_per_round: Local epochs per round.
    client_sampling: `uniform` or `examples`.
    client_state_store: `memory` or `disk` (`client_states/` either way).
    settings: Extra JSON-able settings saved to `program_config.json`.

  Returns:
    `{'state', 'round_num', 'client_state_store', 'final_summaries',
    'per_client'}`; the last two (global and `personal/` splits) with
    `config.evaluate_per_client`, else None.

  Raises:
    TypeError: If `process` is not stateful.
    ValueError: For impossible settings.
    program.ProgramError: If `output_dir` holds a program with other settings.
  """
  return program.run_program(
      process,
      task_name=task_name,
      task_kwargs=task_kwargs,
      config=config,
      output_dir=output_dir,
      seed=seed,
      client_epochs_per_round=client_epochs_per_round,
      client_sampling=client_sampling,
      settings=settings,
      client_states=ClientStates(client_state_store),
  )


def main(argv: Sequence[str]) -> int:
  """`python -m run.stateful_program`: the training binary's flags."""
  return program.binary_main(
      argv, lambda: ClientStates(flags.FLAGS.client_state_store)
  )


def run_main() -> None:
  """Console-script entry point."""
  # --help lists the flags this binary takes, all defined in run.program and
  # run.train.
  flags.adopt_module_key_flags(program)
  flags.adopt_module_key_flags(train)
  program.run_main(main)


if __name__ == '__main__':
  run_main()
