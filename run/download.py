# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Fetches TFF's dataset files into a data directory (`tasks.download`).

Example (what `--download` of the training binary does for one task):

  tff-hetero-download --datasets=emnist,shakespeare --data_dir=$HOME/.tff

Each file is fetched only if missing, with a progress bar, verified and
renamed into place when complete; an interrupted download resumes. Prints the
paths of the files; a failure is one `download: error: ...` line naming the
URL and the fix, with exit status 2.
"""

from collections.abc import Sequence
import sys

from absl import flags

from run import console
from tasks import base
from tasks import download
from tff_algos import runtime

_DATASETS = None
_DATA_DIR = None
_PROGRESS = None


def define_flags() -> None:
  """Defines the binary's flags (`run_main` does this)."""
  global _DATASETS, _DATA_DIR, _PROGRESS
  _DATASETS = flags.DEFINE_list(
      'datasets',
      None,
      f'Comma-separated datasets to fetch: {", ".join(download.DATASETS)}.',
  )
  _DATA_DIR = flags.DEFINE_string(
      'data_dir', None, "Where the files go (default TFF's cache, ~/.tff)."
  )
  _PROGRESS = flags.DEFINE_boolean('progress', True, 'Show a progress bar.')


def main(argv: Sequence[str]) -> int:
  """Fetches `--datasets` into `--data_dir`; returns the exit status."""
  if len(argv) > 1:
    print(
        f'download: error: unexpected arguments: {" ".join(argv[1:])}',
        file=sys.stderr,
    )
    return 2
  names = _DATASETS.value or []
  if not names or not set(names) <= set(download.DATASETS):
    print(
        'download: error: --datasets must name some of '
        f'{", ".join(download.DATASETS)}, got {",".join(names) or "none"}',
        file=sys.stderr,
    )
    return 2
  files = [f for name in names for f in download.DATASETS[name]]
  try:
    paths = download.ensure(files, _DATA_DIR.value, progress=_PROGRESS.value)
  except base.TaskError as e:
    print(f'download: error: {e}', file=sys.stderr)
    return 2
  for path in paths:
    print(path)
  return 0


def run_main() -> None:
  """Console-script entry point."""
  define_flags()
  console.run(__name__, lambda argv: runtime.exit_now(main(argv)))


if __name__ == '__main__':
  run_main()
