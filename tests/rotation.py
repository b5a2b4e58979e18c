# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The rotation: the slow integration tests, a share of them each day.

The whole suite takes over an hour on CI's 2 cores; CI must finish in 60
minutes with its code checks and Bazel. So the slow integration tests listed
in `tests/rotation.txt` (each with its measured seconds) are dealt into
`SHARDS` shards of about equal time, and a run of the whole suite
(`scripts/test.sh` with no test paths) runs every other test plus one shard:
shard (days since 1970-01-01 UTC) mod `SHARDS`, as CI's Bazel shard. Every
listed test thus runs at least once in `SHARDS` consecutive days.

`TEST_ROTATION` picks otherwise: `all` runs every test, a number runs that
shard, `none` runs no listed test. A run given test paths runs what it was
given, unless `TEST_ROTATION` is set.
"""

import dataclasses
import os
import time
from collections.abc import Iterable, Sequence
from typing import Optional

SHARDS = 5
LIST = os.path.join(os.path.dirname(os.path.realpath(__file__)), 'rotation.txt')


@dataclasses.dataclass(frozen=True)
class Entry:
  """A listed test: a node id, or its prefix (a file, a parametrized test)."""

  node: str
  seconds: float

  def matches(self, nodeid: str) -> bool:
    return nodeid == self.node or nodeid.startswith(
        (self.node + '[', self.node + '::')
    )


def read(path: str = LIST) -> list[Entry]:
  """The entries of `path`: `SECONDS NODE` lines; `#` starts a comment.

  Raises:
    ValueError: A line is not `SECONDS NODE`, or a node is listed twice.
  """
  entries, seen = [], set()
  with open(path, encoding='utf-8') as f:
    for number, line in enumerate(f, 1):
      text = line.split('#', 1)[0].strip()
      if not text:
        continue
      parts = text.split()
      try:
        if len(parts) != 2:
          raise ValueError
        seconds = float(parts[0])
      except ValueError:
        raise ValueError(
            f'{path}:{number}: expected "SECONDS NODE", got {text!r}'
        ) from None
      if parts[1] in seen:
        raise ValueError(f'{path}:{number}: {parts[1]} is listed twice')
      seen.add(parts[1])
      entries.append(Entry(parts[1], seconds))
  return entries


def deal(entries: Sequence[Entry], shards: int = SHARDS) -> list[list[Entry]]:
  """The entries in `shards` shards of about equal seconds.

  Longest first, each to the shard with the fewest seconds so far (ties to
  the lower index); the same list always gives the same shards.
  """
  if shards < 1:
    raise ValueError(f'shards must be >= 1, got {shards}')
  out: list[list[Entry]] = [[] for _ in range(shards)]
  totals = [0.0] * shards
  for entry in sorted(entries, key=lambda e: (-e.seconds, e.node)):
    i = min(range(shards), key=lambda k: (totals[k], k))
    out[i].append(entry)
    totals[i] += entry.seconds
  return out


def todays_shard(now: Optional[float] = None, shards: int = SHARDS) -> int:
  """Days since 1970-01-01 UTC, mod `shards`."""
  return int((time.time() if now is None else now) // 86400) % shards


def choice(setting: Optional[str], shards: int = SHARDS) -> Optional[int]:
  """The shard `TEST_ROTATION=setting` asks for; None: every test.

  Returns -1 for `none` (no listed test).

  Raises:
    ValueError: `setting` is not all, none, today or a shard number.
  """
  if setting in (None, '', 'today'):
    return todays_shard(shards=shards)
  if setting == 'all':
    return None
  if setting == 'none':
    return -1
  # ASCII digits only: `str.isdigit` also takes '²', which `int` refuses.
  if setting.isascii() and setting.isdigit() and int(setting) < shards:
    return int(setting)
  raise ValueError(
      f'TEST_ROTATION={setting}: use all, none, today or 0..{shards - 1}'
  )


def skipped(
    nodeids: Iterable[str], entries: Sequence[Entry], shard: Optional[int]
) -> set[str]:
  """The node ids that shard `shard` leaves out (None: none left out)."""
  if shard is None:
    return set()
  kept = deal(entries)[shard] if shard >= 0 else []
  out = set()
  for nodeid in nodeids:
    if any(e.matches(nodeid) for e in entries) and not any(
        e.matches(nodeid) for e in kept
    ):
      out.add(nodeid)
  return out


def unmatched(nodeids: Iterable[str], entries: Sequence[Entry]) -> list[str]:
  """The listed nodes that match no collected test (a stale list)."""
  nodeids = list(nodeids)
  return [e.node for e in entries if not any(e.matches(n) for n in nodeids)]
