# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests of the rotation of slow integration tests (`tests/rotation.py`)."""

# bazel-size: medium
# bazel-tags: external
# (The list and the whole suite are read from the real checkout, which the
# test's runfiles do not hold: `external` keeps Bazel from caching it.)

import os
import re
import subprocess
import sys

import pytest

from tests import rotation

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def _entries(*pairs):
  return [rotation.Entry(node, seconds) for node, seconds in pairs]


def test_shards_are_balanced_and_every_entry_is_in_exactly_one():
  entries = _entries(
      ('a', 100), ('b', 90), ('c', 50), ('d', 40), ('e', 30), ('f', 10)
  )
  shards = rotation.deal(entries, 3)
  # Longest first to the lightest shard: a | b | c, then d to c's (50),
  # e to b's (90 each: the lower index), f to c's (90).
  assert [[e.node for e in s] for s in shards] == [
      ['a'],
      ['b', 'e'],
      ['c', 'd', 'f'],
  ]
  assert sorted(e.node for s in shards for e in s) == list('abcdef')
  assert rotation.deal(list(reversed(entries)), 3) == shards  # Stable.


def test_the_shard_of_a_day_and_the_settings():
  assert rotation.todays_shard(now=0.0, shards=3) == 0
  assert rotation.todays_shard(now=86400 * 7 + 5, shards=3) == 1
  assert rotation.choice('all') is None
  assert rotation.choice('none') == -1
  assert rotation.choice('2', shards=3) == 2
  for bad in ('3', '-1', 'monday', '²', ' 1'):
    with pytest.raises(ValueError, match='TEST_ROTATION='):
      rotation.choice(bad, shards=3)


def test_prefixes_match_parametrized_tests_and_whole_files():
  entries = _entries(('tests/t.py::test_a', 5), ('tests/u.py', 9))
  nodes = [
      'tests/t.py::test_a[x]',
      'tests/t.py::test_ab',
      'tests/u.py::test_z',
      'tests/v.py::test_a',
  ]
  # Two shards: u (9) in shard 0, t::test_a (5) in shard 1.
  assert rotation.skipped(nodes, entries, 0) == {'tests/t.py::test_a[x]'}
  assert rotation.skipped(nodes, entries, 1) == {'tests/u.py::test_z'}
  assert rotation.skipped(nodes, entries, None) == set()
  assert rotation.skipped(nodes, entries, -1) == {
      'tests/t.py::test_a[x]',
      'tests/u.py::test_z',
  }
  assert rotation.unmatched(nodes, entries + _entries(('tests/w.py', 1))) == [
      'tests/w.py'
  ]


def test_a_damaged_list_is_one_clear_error(tmp_path):
  path = tmp_path / 'rotation.txt'
  path.write_text('# comment\n12 tests/a.py::test_b\nabc tests/c.py\n')
  with pytest.raises(ValueError, match=r'rotation.txt:3: expected'):
    rotation.read(str(path))
  path.write_text('1 tests/a.py\n2 tests/a.py  # again\n')
  with pytest.raises(ValueError, match='listed twice'):
    rotation.read(str(path))


def test_every_listed_test_exists():
  for entry in rotation.read():
    path, _, name = entry.node.partition('::')
    with open(os.path.join(ROOT, path)) as f:
      source = f.read()
    if name:
      assert re.search(rf'^def {re.escape(name)}\(', source, re.M), entry
    assert entry.seconds > 0, entry


def test_the_whole_suite_runs_one_shard_of_the_listed_tests():
  shard = 1
  env = dict(os.environ, TEST_ROTATION=str(shard))
  out = subprocess.run(
      [sys.executable, '-m', 'pytest', '--collect-only', '-q'],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
  )
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
  collected = [l for l in out.stdout.splitlines() if '::' in l]
  entries = rotation.read()
  shards = rotation.deal(entries)
  for i, members in enumerate(shards):
    for entry in members:
      present = any(entry.matches(n) for n in collected)
      assert present == (i == shard), (i, entry.node)
  assert f'rotation: shard {shard} of {rotation.SHARDS};' in out.stdout
  # Tests outside the list are all there.
  assert 'tests/test_rotation.py::test_every_listed_test_exists' in collected


def test_the_rotation_holds_in_parallel_workers():
  # scripts/test.sh runs the suite in xdist workers, which are handed the
  # collected paths: the whole suite must still run one shard, and say so.
  shard = 1
  other = next(
      e
      for i, members in enumerate(rotation.deal(rotation.read()))
      if i != shard
      for e in members
      if '::' in e.node
  )
  name = other.node.partition('::')[2]
  env = dict(os.environ, TEST_ROTATION=str(shard))
  out = subprocess.run(
      [
          sys.executable,
          '-m',
          'pytest',
          '-q',
          '-n',
          '2',
          '-k',
          f'test_every_listed_test_exists or {name}',
      ],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=900,
      check=False,
  )
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
  assert re.search(r'\b1 passed\b', out.stdout), out.stdout[-2000:]
  assert f'rotation: shard {shard} of {rotation.SHARDS};' in out.stdout


@pytest.mark.parametrize('setting', ['bogus', '5', '²'])
def test_a_bad_setting_is_one_line_before_workers_start(setting):
  # As scripts/test.sh runs the suite (-n 2 --dist worksteal): refused by the
  # controller in one line, not by each worker at collection (which crashes
  # xdist with an INTERNALERROR traceback).
  env = dict(os.environ, TEST_ROTATION=setting)
  out = subprocess.run(
      [sys.executable, '-m', 'pytest', '-q', '-n', '2', '--dist', 'worksteal'],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
  )
  lines = [l for l in (out.stdout + out.stderr).splitlines() if l.strip()]
  assert out.returncode == 4, lines  # pytest's usage error.
  assert lines == [
      f'ERROR: rotation: TEST_ROTATION={setting}: use all, none, today or '
      f'0..{rotation.SHARDS - 1}'
  ]
