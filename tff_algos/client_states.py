# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Per-client state stores keyed by client id (Ditto, Fed+ personal models).

Personalised algorithms keep a model per client across rounds: Ditto's v_k
(T. Li, S. Hu, A. Beirami, V. Smith, "Ditto: Fair and Robust Federated
Learning Through Personalization", ICML 2021, arXiv:2012.04221) and Fed+'s
local models w_k (P. Kundu, H. Yu, L. Wynter, S. Lim, "Robustness and
Personalization in Federated Learning: A Unified Approach via
Regularization", arXiv:2009.06303). TFF's stateful-clients pattern passes the
selected clients' states into the round and returns the updated ones
(`tff_notes.md` section 1.2); the simulation keeps them here.

A state is any `tf.nest` structure of NumPy arrays with the structure of
`initial_state_fn(client_id)`, the state of a client never written.

Both stores version states by round, so that `restore(r)` brings back exactly
the states at the end of round r:

* `InMemoryClientStateStore`: a dict. `snapshot(r)` keeps a reference copy of
  the dict (arrays are never mutated in place) and, with `snapshot_dir`,
  writes every state to one `.npz` (temp file, fsync, rename), so a resumed
  process can restore it.
* `DiskClientStateStore`: one `.npz` per client and round in which it was
  written, `<dir>/clients/<client key>/<round>.npz`, each written to a temp
  file and renamed into place, so a crash mid-write leaves the previous
  versions intact. Only the requested states are read (bounded memory: an
  LRU cache of at most `cache_size` states and `cache_bytes` bytes).
  `snapshot(r)` records round r as a checkpoint and deletes versions no kept
  checkpoint needs; `restore(r)` deletes the versions written after round r
  (by a run that crashed after its last checkpoint) and reads, for each
  client, its newest version at or before r. Nothing a round calls is
  O(population): `get_many` and `put_many` touch the requested clients, and
  `snapshot` only the clients holding more than one version (written since
  the oldest kept snapshot), which the store remembers; only a new store
  object's first `snapshot`, or a `restore`, scans every client's folder.

The simulation loop snapshots the store before it saves the server
checkpoint of the same round, so the newest server checkpoint always has its
client states.
"""

import abc
import collections
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf

State = Any
InitialStateFn = Callable[[str], State]
_ROUND_FILE = re.compile(r'^(\d{8})\.npz$')
_MEMORY_SNAPSHOT = re.compile(r'^states_round_(\d{8})\.npz$')


class ClientStateError(RuntimeError):
  """A store cannot restore the requested round, or holds foreign states."""


def _as_numpy(state: State) -> State:
  return tf.nest.map_structure(lambda t: np.array(t, copy=True), state)


def _atomic_savez(path: str, arrays: dict[str, np.ndarray]) -> None:
  """Writes `arrays` to `path` via a temp file and rename (crash safe)."""
  folder = os.path.dirname(path)
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix='.tmp_', suffix='.npz')
  try:
    with os.fdopen(fd, 'wb') as f:
      np.savez(f, **arrays)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def _check_round(round_num: int) -> int:
  if isinstance(round_num, bool) or not isinstance(
      round_num, (int, np.integer)
  ):
    raise TypeError(f'round_num must be an int, got {type(round_num).__name__}')
  if round_num < 0:
    raise ValueError(f'round_num must be >= 0, got {round_num}')
  return int(round_num)


class ClientStateStore(abc.ABC):
  """States of clients keyed by id, versioned by round.

  Args:
    initial_state_fn: `client_id -> state` of a client never written.
    keep_snapshots: How many of the newest snapshots stay restorable.
  """

  def __init__(
      self, initial_state_fn: InitialStateFn, *, keep_snapshots: int = 3
  ):
    if not callable(initial_state_fn):
      raise TypeError('initial_state_fn must be callable: client_id -> state')
    if isinstance(keep_snapshots, bool) or not isinstance(keep_snapshots, int):
      raise TypeError('keep_snapshots must be an int')
    if keep_snapshots < 1:
      raise ValueError(f'keep_snapshots must be >= 1, got {keep_snapshots}')
    self._initial_state_fn = initial_state_fn
    self._keep = keep_snapshots
    self._template = None

  def initial_state(self, client_id: str) -> State:
    """The state of a client that was never written."""
    return _as_numpy(self._initial_state_fn(client_id))

  def _flat(self, client_id: str, state: State) -> list[np.ndarray]:
    if self._template is None:
      self._template = self.initial_state(client_id)
    try:
      tf.nest.assert_same_structure(self._template, state)
    except (ValueError, TypeError) as e:
      raise ValueError(
          f'the state of client {client_id!r} does not have the structure of '
          f'the initial state: {e}'
      ) from None
    return [np.array(a, copy=True) for a in tf.nest.flatten(state)]

  def _pack(self, client_id: str, flat: Sequence[np.ndarray]) -> State:
    if self._template is None:
      self._template = self.initial_state(client_id)
    return tf.nest.pack_sequence_as(self._template, list(flat))

  def get_many(self, client_ids: Sequence[str]) -> list[State]:
    """The current states of `client_ids` (initial state if never written)."""
    return [self._get(str(cid)) for cid in client_ids]

  def put_many(
      self,
      client_ids: Sequence[str],
      states: Sequence[State],
      *,
      round_num: int,
  ) -> None:
    """Writes the states of `client_ids` as of the end of `round_num`."""
    round_num = _check_round(round_num)
    if len(client_ids) != len(states):
      raise ValueError(f'{len(client_ids)} client ids but {len(states)} states')
    if len(set(client_ids)) != len(client_ids):
      raise ValueError('put_many got a client id twice')
    for cid, state in zip(client_ids, states):
      self._put(str(cid), self._flat(str(cid), state), round_num)

  @abc.abstractmethod
  def _get(self, client_id: str) -> State:
    ...

  @abc.abstractmethod
  def _put(
      self, client_id: str, flat: list[np.ndarray], round_num: int
  ) -> None:
    ...

  @abc.abstractmethod
  def client_ids(self) -> list[str]:
    """The clients with a written state, sorted."""

  @abc.abstractmethod
  def snapshot(self, round_num: int) -> None:
    """Makes the current states restorable as those of `round_num`."""

  @abc.abstractmethod
  def restore(self, round_num: int) -> None:
    """Brings back the states of `snapshot(round_num)` (0: all initial).

    Raises:
      ClientStateError: If that round is not restorable.
    """

  @abc.abstractmethod
  def snapshot_rounds(self) -> list[int]:
    """The restorable snapshot rounds, ascending."""


class InMemoryClientStateStore(ClientStateStore):
  """Client states in a dict; snapshots in memory and optionally on disk.

  Args:
    initial_state_fn: `client_id -> state` of a client never written.
    snapshot_dir: If set, every snapshot is also written there as one `.npz`
      (atomically), and `restore` can read it in a new process.
    keep_snapshots: How many of the newest snapshots stay restorable.
  """

  def __init__(
      self,
      initial_state_fn: InitialStateFn,
      *,
      snapshot_dir: Optional[str] = None,
      keep_snapshots: int = 3,
  ):
    super().__init__(initial_state_fn, keep_snapshots=keep_snapshots)
    self._states: dict[str, list[np.ndarray]] = {}
    self._snapshots: dict[int, dict[str, list[np.ndarray]]] = {}
    self._dir = snapshot_dir
    if snapshot_dir:
      os.makedirs(snapshot_dir, exist_ok=True)

  def _get(self, client_id):
    flat = self._states.get(client_id)
    if flat is None:
      return self.initial_state(client_id)
    return self._pack(client_id, [a.copy() for a in flat])

  def _put(self, client_id, flat, round_num):
    del round_num
    self._states[client_id] = flat

  def client_ids(self):
    return sorted(self._states)

  def _path(self, round_num: int) -> str:
    return os.path.join(self._dir, f'states_round_{round_num:08d}.npz')

  def snapshot(self, round_num):
    round_num = _check_round(round_num)
    self._snapshots[round_num] = dict(self._states)
    if self._dir:
      ids = sorted(self._states)
      arrays = {'client_ids': np.asarray(ids, dtype=np.str_)}
      for i, cid in enumerate(ids):
        for j, a in enumerate(self._states[cid]):
          arrays[f'c{i}_{j}'] = a
      _atomic_savez(self._path(round_num), arrays)
    for old in self.snapshot_rounds()[: -self._keep]:
      self._snapshots.pop(old, None)
      if self._dir and os.path.exists(self._path(old)):
        os.remove(self._path(old))

  def snapshot_rounds(self):
    rounds = set(self._snapshots)
    if self._dir:
      for name in os.listdir(self._dir):
        match = _MEMORY_SNAPSHOT.match(name)
        if match:
          rounds.add(int(match.group(1)))
    return sorted(rounds)

  def restore(self, round_num):
    round_num = _check_round(round_num)
    if round_num == 0:
      self._states = {}
      return
    if round_num in self._snapshots:
      self._states = dict(self._snapshots[round_num])
      return
    if self._dir and os.path.exists(self._path(round_num)):
      with np.load(self._path(round_num)) as data:
        ids = [str(c) for c in data['client_ids']]
        num_leaves = collections.Counter(
            int(k.split('_')[0][1:]) for k in data.files if k != 'client_ids'
        )
        self._states = {
            cid: [data[f'c{i}_{j}'] for j in range(num_leaves[i])]
            for i, cid in enumerate(ids)
        }
      return
    raise ClientStateError(
        f'no client-state snapshot of round {round_num} (have '
        f'{self.snapshot_rounds()}); the client states cannot be resumed'
    )


class DiskClientStateStore(ClientStateStore):
  """One `.npz` per client and round in a folder, crash safe.

  Args:
    directory: The store's folder (created if missing).
    initial_state_fn: `client_id -> state` of a client never written.
    keep_snapshots: How many of the newest snapshots stay restorable.
    cache_size: At most this many states are kept in memory (least recently
      used evicted).
    cache_bytes: ... and at most this many bytes of them (a state larger
      than this is not cached), so the cache stays small for large models.
  """

  def __init__(
      self,
      directory: str,
      initial_state_fn: InitialStateFn,
      *,
      keep_snapshots: int = 3,
      cache_size: int = 64,
      cache_bytes: int = 64 * 2**20,
  ):
    super().__init__(initial_state_fn, keep_snapshots=keep_snapshots)
    if not directory:
      raise ValueError('DiskClientStateStore needs a directory')
    for name, value in (
        ('cache_size', cache_size),
        ('cache_bytes', cache_bytes),
    ):
      if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f'{name} must be an int')
      if value < 0:
        raise ValueError(f'{name} must be >= 0, got {value}')
    self._dir = directory
    self._clients_dir = os.path.join(directory, 'clients')
    self._snapshots_dir = os.path.join(directory, 'snapshots')
    os.makedirs(self._clients_dir, exist_ok=True)
    os.makedirs(self._snapshots_dir, exist_ok=True)
    self._cache: collections.OrderedDict[str, list[np.ndarray]] = (
        collections.OrderedDict()
    )
    self._cache_size = cache_size
    self._cache_bytes = cache_bytes
    self._cached_bytes = 0
    # Keys of the client folders that may hold a version a snapshot can
    # delete (more than one version); None until a full scan has run.
    self._multi_version: Optional[set[str]] = None

  @staticmethod
  def client_key(client_id: str) -> str:
    """A file-system-safe folder name for a client id (injective)."""
    safe = re.sub(r'[^A-Za-z0-9_.-]', '_', client_id)[:64]
    digest = hashlib.sha1(client_id.encode('utf-8')).hexdigest()[:12]
    return f'{safe}-{digest}'

  def _client_dir(self, client_id: str) -> str:
    return os.path.join(self._clients_dir, self.client_key(client_id))

  def _versions(self, client_id: str) -> list[int]:
    folder = self._client_dir(client_id)
    if not os.path.isdir(folder):
      return []
    return sorted(
        int(m.group(1)) for m in map(_ROUND_FILE.match, os.listdir(folder)) if m
    )

  def _remember(self, client_id, flat):
    old = self._cache.pop(client_id, None)
    if old is not None:
      self._cached_bytes -= sum(a.nbytes for a in old)
    size = sum(a.nbytes for a in flat)
    if not self._cache_size or size > self._cache_bytes:
      return
    self._cache[client_id] = flat
    self._cached_bytes += size
    while (
        len(self._cache) > self._cache_size
        or self._cached_bytes > self._cache_bytes
    ):
      _, evicted = self._cache.popitem(last=False)
      self._cached_bytes -= sum(a.nbytes for a in evicted)

  def cache_info(self) -> tuple[int, int]:
    """`(states, bytes)` held in the in-memory cache now."""
    return len(self._cache), self._cached_bytes

  def _get(self, client_id):
    flat = self._cache.get(client_id)
    if flat is None:
      versions = self._versions(client_id)
      if not versions:
        return self.initial_state(client_id)
      path = os.path.join(
          self._client_dir(client_id), f'{versions[-1]:08d}.npz'
      )
      with np.load(path) as data:
        if data['client_id'].item() != client_id:
          raise ClientStateError(f"{path} holds another client's state")
        flat = [data[f'leaf_{j}'] for j in range(int(data['num_leaves']))]
    self._remember(client_id, flat)
    return self._pack(client_id, [a.copy() for a in flat])

  def _put(self, client_id, flat, round_num):
    folder = self._client_dir(client_id)
    arrays = {f'leaf_{j}': a for j, a in enumerate(flat)}
    arrays['client_id'] = np.asarray(client_id, dtype=np.str_)
    arrays['num_leaves'] = np.asarray(len(flat))
    _atomic_savez(os.path.join(folder, f'{round_num:08d}.npz'), arrays)
    if self._multi_version is not None:
      self._multi_version.add(os.path.basename(folder))
    self._remember(client_id, flat)

  def _client_folders(self) -> Iterable[str]:
    return (
        os.path.join(self._clients_dir, d)
        for d in sorted(os.listdir(self._clients_dir))
    )

  def client_ids(self):
    ids = []
    for folder in self._client_folders():
      files = sorted(f for f in os.listdir(folder) if _ROUND_FILE.match(f))
      if files:
        with np.load(os.path.join(folder, files[-1])) as data:
          ids.append(str(data['client_id'].item()))
    return sorted(ids)

  def snapshot_rounds(self):
    return sorted(
        int(name) for name in os.listdir(self._snapshots_dir) if name.isdigit()
    )

  def snapshot(self, round_num):
    round_num = _check_round(round_num)
    marker = os.path.join(self._snapshots_dir, f'{round_num:08d}')
    fd, tmp = tempfile.mkstemp(dir=self._snapshots_dir, prefix='.tmp_')
    with os.fdopen(fd, 'w') as f:
      json.dump({'round_num': round_num}, f)
    os.replace(tmp, marker)
    kept = self.snapshot_rounds()[-self._keep :]
    for old in self.snapshot_rounds()[: -self._keep]:
      os.remove(os.path.join(self._snapshots_dir, f'{old:08d}'))
    # A version is needed while it is the newest one at or before some kept
    # snapshot, or newer than the oldest kept snapshot. Only folders written
    # since they last held a single version can hold an unneeded one.
    oldest = kept[0]
    if self._multi_version is None:
      folders = list(self._client_folders())
    else:
      folders = [
          os.path.join(self._clients_dir, key)
          for key in sorted(self._multi_version)
      ]
    multi_version = set()
    for folder in folders:
      rounds = sorted(
          int(m.group(1))
          for m in map(_ROUND_FILE.match, os.listdir(folder))
          if m
      )
      older = [r for r in rounds if r <= oldest]
      for r in older[:-1]:
        os.remove(os.path.join(folder, f'{r:08d}.npz'))
      if len(rounds) - len(older[:-1]) > 1:
        multi_version.add(os.path.basename(folder))
    self._multi_version = multi_version

  def restore(self, round_num):
    round_num = _check_round(round_num)
    snapshots = self.snapshot_rounds()
    if (
        round_num
        and round_num not in snapshots
        and (not snapshots or round_num < snapshots[-1])
    ):
      raise ClientStateError(
          f'no client-state snapshot of round {round_num} in {self._dir} '
          f'(have {snapshots}); the client states cannot be resumed'
      )
    if snapshots and round_num < snapshots[0] and round_num != 0:
      raise ClientStateError(
          f'round {round_num} is older than the kept ' f'snapshots {snapshots}'
      )
    self._cache.clear()
    self._cached_bytes = 0
    for name in snapshots:
      if name > round_num:
        os.remove(os.path.join(self._snapshots_dir, f'{name:08d}'))
    multi_version = set()
    for folder in self._client_folders():
      for name in os.listdir(folder):
        match = _ROUND_FILE.match(name)
        if (match and int(match.group(1)) > round_num) or name.startswith(
            '.tmp_'
        ):
          os.remove(os.path.join(folder, name))
      left = os.listdir(folder)
      if not left:
        shutil.rmtree(folder)
      elif len(left) > 1:
        multi_version.add(os.path.basename(folder))
    self._multi_version = multi_version


def build_store(
    kind: str,
    initial_state_fn: InitialStateFn,
    *,
    directory: Optional[str] = None,
    keep_snapshots: int = 3,
) -> ClientStateStore:
  """A store by name: `memory` (snapshots to `directory` if given) or `disk`."""
  if kind == 'memory':
    return InMemoryClientStateStore(
        initial_state_fn, snapshot_dir=directory, keep_snapshots=keep_snapshots
    )
  if kind == 'disk':
    if not directory:
      raise ValueError('a disk client-state store needs a directory')
    return DiskClientStateStore(
        directory, initial_state_fn, keep_snapshots=keep_snapshots
    )
  raise ValueError(
      f'unknown client-state store {kind!r}; choose memory or ' 'disk'
  )
