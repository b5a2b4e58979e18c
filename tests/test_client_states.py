"""Client-state stores: memory/disk equivalence, restore, crash safety."""

import collections
import os

import numpy as np
import pytest

from tff_algos import client_states


def initial(cid):
  del cid
  return collections.OrderedDict(
      personal=([np.zeros((2, 3), np.float32), np.zeros(3, np.float32)],)
  )


def state(value):
  return collections.OrderedDict(
      personal=(
          [np.full((2, 3), value, np.float32), np.full(3, -value, np.float32)],
      )
  )


def value_of(s):
  return float(s['personal'][0][0][0, 0])


def make(kind, tmp_path, **kwargs):
  if kind == 'memory':
    return client_states.InMemoryClientStateStore(
        initial, snapshot_dir=str(tmp_path / 'mem'), **kwargs
    )
  return client_states.DiskClientStateStore(
      str(tmp_path / 'disk'), initial, **kwargs
  )


def play(store):
  """Rounds 1..5 writing a few clients each, snapshots at 2 and 4."""
  schedule = {
      1: ['a', 'b'],
      2: ['b', 'c/x'],
      3: ['a'],
      4: ['c/x', 'd'],
      5: ['a', 'd'],
  }
  for r, ids in schedule.items():
    store.put_many(
        ids, [state(10 * r + i) for i in range(len(ids))], round_num=r
    )
    if r in (2, 4):
      store.snapshot(r)


@pytest.mark.parametrize('kind', ['memory', 'disk'])
def test_get_put_and_initial_state(kind, tmp_path):
  store = make(kind, tmp_path)
  got = store.get_many(['never'])
  assert value_of(got[0]) == 0.0
  store.put_many(['a', 'weird id/../x'], [state(1.0), state(2.0)], round_num=1)
  a, w, n = store.get_many(['a', 'weird id/../x', 'n'])
  assert (value_of(a), value_of(w), value_of(n)) == (1.0, 2.0, 0.0)
  np.testing.assert_array_equal(a['personal'][0][1], np.full(3, -1.0))
  assert store.client_ids() == ['a', 'weird id/../x']
  # Returned states are copies: mutating them does not change the store.
  a['personal'][0][0][:] = 99
  assert value_of(store.get_many(['a'])[0]) == 1.0
  with pytest.raises(ValueError, match='structure'):
    store.put_many(['a'], [{'personal': ()}], round_num=2)
  with pytest.raises(ValueError, match='twice'):
    store.put_many(['a', 'a'], [state(1), state(2)], round_num=2)


def test_memory_and_disk_stores_agree(tmp_path):
  stores = [make('memory', tmp_path), make('disk', tmp_path, cache_size=1)]
  for store in stores:
    play(store)
  ids = ['a', 'b', 'c/x', 'd', 'e']
  for r in (None, 4, 2, 0):
    if r is not None:
      for store in stores:
        store.restore(r)
    values = [[value_of(s) for s in store.get_many(ids)] for store in stores]
    assert values[0] == values[1]
    if r == 2:
      assert values[0] == [10.0, 20.0, 21.0, 0.0, 0.0]
    if r == 4:
      assert values[0] == [30.0, 20.0, 40.0, 41.0, 0.0]
    if r == 0:
      assert values[0] == [0.0] * 5


@pytest.mark.parametrize('kind', ['memory', 'disk'])
def test_restore_in_a_new_process_continues_exactly(kind, tmp_path):
  play(make(kind, tmp_path))
  # A new store object on the same folder (a resumed process).
  store = make(kind, tmp_path)
  store.restore(4)
  assert [value_of(s) for s in store.get_many(['a', 'c/x', 'd'])] == [
      30.0,
      40.0,
      41.0,
  ]
  # The resumed run writes round 5 again and sees its own values.
  store.put_many(['d'], [state(7.0)], round_num=5)
  assert value_of(store.get_many(['d'])[0]) == 7.0
  with pytest.raises(client_states.ClientStateError, match='round 3'):
    make(kind, tmp_path).restore(3)


def test_snapshots_are_pruned_and_old_versions_collected(tmp_path):
  store = make('disk', tmp_path, keep_snapshots=2)
  for r in range(1, 8):
    store.put_many(['a'], [state(r)], round_num=r)
    if r % 2 == 0:
      store.snapshot(r)
  assert store.snapshot_rounds() == [4, 6]
  folder = tmp_path / 'disk' / 'clients' / store.client_key('a')
  # Needed: the newest version at or before 4, and every later one.
  assert sorted(os.listdir(folder)) == [f'{r:08d}.npz' for r in (4, 5, 6, 7)]
  store.restore(4)
  assert value_of(store.get_many(['a'])[0]) == 4.0
  assert sorted(os.listdir(folder)) == ['00000004.npz']
  assert store.snapshot_rounds() == [4]
  mem = make('memory', tmp_path, keep_snapshots=2)
  for r in range(1, 8):
    mem.put_many(['a'], [state(r)], round_num=r)
    mem.snapshot(r)
  assert mem.snapshot_rounds() == [6, 7]
  assert sorted(os.listdir(tmp_path / 'mem')) == [
      'states_round_00000006.npz',
      'states_round_00000007.npz',
  ]


@pytest.mark.parametrize('kind', ['memory', 'disk'])
def test_crash_mid_write_keeps_the_previous_version(
    kind, tmp_path, monkeypatch
):
  store = make(kind, tmp_path)
  store.put_many(['a'], [state(1.0)], round_num=1)
  store.snapshot(1)
  real_savez = np.savez

  def crashing_savez(f, **arrays):
    real_savez(f, **arrays)
    f.write(b'garbage')
    raise OSError('disk full')

  monkeypatch.setattr(np, 'savez', crashing_savez)
  with pytest.raises(OSError, match='disk full'):
    store.put_many(['a'], [state(2.0)], round_num=2)
    store.snapshot(2)
  monkeypatch.setattr(np, 'savez', real_savez)
  fresh = make(kind, tmp_path)
  fresh.restore(1)
  assert value_of(fresh.get_many(['a'])[0]) == 1.0
  leftovers = [
      name
      for _, _, files in os.walk(tmp_path)
      for name in files
      if name.startswith('.tmp_')
  ]
  assert leftovers == []


def test_build_store_and_validation(tmp_path):
  assert isinstance(
      client_states.build_store('memory', initial),
      client_states.InMemoryClientStateStore,
  )
  assert isinstance(
      client_states.build_store('disk', initial, directory=str(tmp_path)),
      client_states.DiskClientStateStore,
  )
  with pytest.raises(ValueError, match='directory'):
    client_states.build_store('disk', initial)
  with pytest.raises(ValueError, match='unknown'):
    client_states.build_store('cloud', initial)
  with pytest.raises(ValueError, match='keep_snapshots'):
    client_states.InMemoryClientStateStore(initial, keep_snapshots=0)
  with pytest.raises(TypeError):
    client_states.InMemoryClientStateStore('not callable')
  with pytest.raises(ValueError, match='round_num'):
    client_states.InMemoryClientStateStore(initial).put_many(
        ['a'], [state(1)], round_num=-1
    )


def _count_client_listings(monkeypatch, store):
  """A list that collects the client folders `os.listdir` reads."""
  clients_dir = os.path.join(store._dir, 'clients')  # pylint: disable=protected-access
  seen = []
  real_listdir = os.listdir

  def listdir(path):
    if os.path.dirname(str(path)) == clients_dir:
      seen.append(os.path.basename(str(path)))
    return real_listdir(path)

  monkeypatch.setattr(client_states.os, 'listdir', listdir)
  return seen


def test_disk_snapshot_reads_only_clients_written_since(tmp_path, monkeypatch):
  store = make('disk', tmp_path, keep_snapshots=2)
  many = [f'c{i:03d}' for i in range(40)]
  store.put_many(many, [state(1.0)] * 40, round_num=1)
  store.snapshot(1)  # First snapshot of this object: one full scan.
  seen = _count_client_listings(monkeypatch, store)
  for r in range(2, 6):
    store.put_many(['c000', 'c001'], [state(r), state(-r)], round_num=r)
    store.snapshot(r)
  # Only the two rewritten clients were listed, never the other 38.
  assert set(seen) == {store.client_key('c000'), store.client_key('c001')}
  assert len(seen) <= 2 * 4
  folder = tmp_path / 'disk' / 'clients' / store.client_key('c000')
  # Kept snapshots 4 and 5: versions 4 and 5 only (1, 2, 3 collected).
  assert sorted(os.listdir(folder)) == ['00000004.npz', '00000005.npz']
  assert [value_of(s) for s in store.get_many(['c000', 'c001', 'c039'])] == [
      5.0,
      -5.0,
      1.0,
  ]


def test_disk_snapshot_of_a_new_store_object_collects_old_versions(tmp_path):
  old = make('disk', tmp_path, keep_snapshots=1)
  for r in (1, 2, 3):
    old.put_many(['a', 'b'], [state(r), state(-r)], round_num=r)
  # A new object on the same folder (no restore) knows nothing of them.
  store = make('disk', tmp_path, keep_snapshots=1)
  store.put_many(['c'], [state(4.0)], round_num=4)
  store.snapshot(4)
  for cid, versions in (('a', [3]), ('b', [3]), ('c', [4])):
    folder = tmp_path / 'disk' / 'clients' / store.client_key(cid)
    assert sorted(os.listdir(folder)) == [f'{r:08d}.npz' for r in versions]
  store.restore(4)
  assert [value_of(s) for s in store.get_many(['a', 'b', 'c'])] == [
      3.0,
      -3.0,
      4.0,
  ]


def test_disk_cache_is_bounded_in_states_and_bytes(tmp_path):
  one = sum(a.nbytes for a in state(0.0)['personal'][0])  # 36 bytes.
  store = make('disk', tmp_path, cache_size=10, cache_bytes=3 * one)
  ids = [f'c{i}' for i in range(6)]
  store.put_many(ids, [state(i) for i in range(6)], round_num=1)
  assert store.cache_info() == (3, 3 * one)
  assert [value_of(s) for s in store.get_many(ids)] == list(range(6))
  assert store.cache_info() == (3, 3 * one)
  small = make('disk', tmp_path, cache_size=2)
  small.get_many(ids)
  assert small.cache_info() == (2, 2 * one)
  none = make('disk', tmp_path, cache_bytes=one - 1)
  assert [value_of(s) for s in none.get_many(ids)] == list(range(6))
  assert none.cache_info() == (0, 0)
  with pytest.raises(ValueError, match='cache_bytes'):
    make('disk', tmp_path, cache_bytes=-1)
  with pytest.raises(TypeError, match='cache_size'):
    make('disk', tmp_path, cache_size=1.5)
