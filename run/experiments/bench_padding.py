# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""Padding of the stacked engine's vectorized rounds on real Shakespeare.

Example (what docs/performance.md records):

  python -m run.experiments.bench_padding \
      --data_dir=output/benchmark/shakespeare/data

The vectorized stacked engine runs a group of clients for its longest
client's steps, every batch padded to the batch size
(`tff_algos.stacked`). For each preset of `tasks.shakespeare_leaf`
(`--presets`) and each per-role cap on windows (`--max_examples_per_client`,
0: all of a role's windows), this samples `--rounds` cohorts of
`--clients_per_round` training roles as `run.simulation` does and counts the
batch slots a one-epoch round runs against its real windows: all clients
padded to the longest one (the engine's default), and as it runs them with
`run.train --stacked_size_groups` (`stacked.round_groups`: size-ordered
groups where they save a fifth of the slots). Arithmetic only: nothing is
trained, so it runs in seconds beside anything.
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
import statistics
from typing import Optional

from absl import flags
import numpy as np
import tensorflow as tf  # pylint: disable=unused-import  (before app.run)

from run import console
from run import simulation
from tasks import base as task_base
from tasks import shakespeare_leaf
from tff_algos import runtime
from tff_algos import stacked

# pylint: enable=g-import-not-at-top,wrong-import-position

_DATA_DIR = None
_PRESETS = None
_CAPS = None
_CLIENTS = None
_BATCH = None
_ROUNDS = None
# More windows than any role holds (as `batched.ClientArrays` reads a
# client whole): a larger batch would only add padding.
MAX_BATCH_SIZE = 2**31 - 1


def define_flags() -> None:
  """The binary's flags (at start-up only: absl flags are global)."""
  global _DATA_DIR, _PRESETS, _CAPS, _CLIENTS, _BATCH, _ROUNDS
  _DATA_DIR = flags.DEFINE_string(
      'data_dir', None, 'Folder of shakespeare.sqlite (run.shakespeare_text).'
  )
  _PRESETS = flags.DEFINE_list(
      'presets', ['deltafl', 'fedprox'], 'Presets of tasks.shakespeare_leaf.'
  )
  _CAPS = flags.DEFINE_list(
      'max_examples_per_client',
      ['0', '200'],
      "Caps on a role's windows (0: all).",
  )
  _CLIENTS = flags.DEFINE_integer('clients_per_round', 10, 'Cohort size.')
  _BATCH = flags.DEFINE_integer(
      'batch_size', 16, f'Local batch size (1 to {MAX_BATCH_SIZE}).'
  )
  _ROUNDS = flags.DEFINE_integer('rounds', 200, 'Cohorts sampled.')


def cohort_padding(sizes, batch_size: int) -> dict[str, float]:
  """A one-epoch cohort's real windows and batch slots, both ways."""
  steps = (np.asarray(sizes, np.int64) + batch_size - 1) // batch_size
  k = len(steps)
  one = (np.arange(k, dtype=np.int32), np.asarray([0, k], np.int32))
  order, bounds = stacked.round_groups(steps)
  return {
      'real': float(np.sum(sizes)),
      'padded_slots': float(stacked.padded_slots(steps, *one, batch_size)),
      'grouped_slots': float(
          stacked.padded_slots(steps, order, bounds, batch_size)
      ),
      'groups': float(len(bounds) - 1),
  }


def measure(sizes: dict[str, int], *, clients_per_round, batch_size, rounds):
  """Medians over sampled cohorts of the padding either way."""
  ids = sorted(sizes)
  per_round = []
  for r in range(1, rounds + 1):
    cohort = simulation.sample_clients(
        ids, r, clients_per_round=min(clients_per_round, len(ids)), seed=0
    )
    per_round.append(cohort_padding([sizes[c] for c in cohort], batch_size))
  waste = lambda key: [1.0 - p['real'] / p[key] for p in per_round]
  total = lambda key: sum(p[key] for p in per_round)
  return {
      'waste_padded_median': statistics.median(waste('padded_slots')),
      'waste_grouped_median': statistics.median(waste('grouped_slots')),
      'waste_padded_total': 1.0 - total('real') / total('padded_slots'),
      'waste_grouped_total': 1.0 - total('real') / total('grouped_slots'),
      'slots_ratio_total': total('grouped_slots') / total('padded_slots'),
      'groups_median': statistics.median(p['groups'] for p in per_round),
  }


def _parse_caps(values: list[str]) -> Optional[list[int]]:
  """`--max_examples_per_client` as integers >= 0, or None if it is not."""
  try:
    caps = [int(c) for c in values]
  except ValueError:
    return None
  return caps if caps and min(caps) >= 0 else None


def usage_error(argv: list[str], caps: Optional[list[int]]) -> Optional[str]:
  """What is wrong with the command line, or None."""
  bad = [p for p in _PRESETS.value if p not in shakespeare_leaf.PRESETS]
  for wrong, message in (
      (len(argv) > 1, f'unexpected arguments {argv[1:]}'),
      (not _DATA_DIR.value, 'needs --data_dir'),
      (
          bad or not _PRESETS.value,
          '--presets must name one or more of '
          f'{", ".join(shakespeare_leaf.PRESETS)}, got {_PRESETS.value}',
      ),
      (
          caps is None,
          '--max_examples_per_client must be one or more integers >= 0, '
          f'got {_CAPS.value}',
      ),
      (
          not 1 <= _BATCH.value <= MAX_BATCH_SIZE,
          f'--batch_size must be in [1, {MAX_BATCH_SIZE}], got {_BATCH.value}',
      ),
      (
          _CLIENTS.value < 1 or _ROUNDS.value < 1,
          '--clients_per_round and --rounds must be >= 1, got '
          f'{_CLIENTS.value} and {_ROUNDS.value}',
      ),
  ):
    if wrong:
      return message
  return None


def main(argv) -> int:
  caps = _parse_caps(_CAPS.value)
  error = usage_error(argv, caps)
  if error is not None:
    print(f'bench_padding: error: {error}', file=sys.stderr)
    return 2
  runtime.install_worker_cleanup()
  header = (
      '| preset | windows per role | training roles | windows min / median /'
      ' max | waste, padded to the longest | waste, --stacked_size_groups |'
      ' slots, groups / padded | groups per round |\n'
      '|---|---|---:|---|---:|---:|---:|---:|'
  )
  for preset in _PRESETS.value:
    for cap in caps:
      try:
        task = shakespeare_leaf.create_task(
            preset=preset,
            data_dir=_DATA_DIR.value,
            batch_size=_BATCH.value,
            max_examples_per_client=cap or None,
        )
      except task_base.TaskError as e:
        print(f'bench_padding: error: {e}', file=sys.stderr)
        return 2
      data = task.train_data
      sizes = {c: len(data.arrays(c)[1]) for c in data.client_ids}
      m = measure(
          sizes,
          clients_per_round=_CLIENTS.value,
          batch_size=_BATCH.value,
          rounds=_ROUNDS.value,
      )
      values = sorted(sizes.values())
      padded = (
          f'{m["waste_padded_total"]:.1%} (median '
          f'{m["waste_padded_median"]:.1%})'
      )
      grouped = (
          f'{m["waste_grouped_total"]:.1%} (median '
          f'{m["waste_grouped_median"]:.1%})'
      )
      if header:  # With the first row: an error alone is one line.
        print(header)
        header = ''
      print(
          f'| {preset} | {cap or "all"} | {len(values)} | {values[0]:,} / '
          f'{int(statistics.median(values)):,} / {values[-1]:,} | {padded} | '
          f'{grouped} | {m["slots_ratio_total"]:.3f} | '
          f'{m["groups_median"]:.0f} |',
          flush=True,
      )
  return 0


def run_main() -> None:
  """Console-script entry point."""
  define_flags()
  console.run(__name__, lambda argv: runtime.exit_now(main(argv)))


if __name__ == '__main__':
  run_main()
