# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""How the binaries start and end: one error line, exit status, no leftovers.

Every binary's `run_main` is `cli.run_binary('<name>', main)`:

* flags are parsed before anything else runs; an unparsable value or a
  missing `--flagfile` is one `<name>: error: ...` line and exit status 2
  (absl prints two lines and exits 1);
* `main(argv)` returns the exit status (2: bad input, 1: failed run);
* a Ctrl-C or SIGINT anywhere is one `<name>: interrupted` line and status
  130;
* the process then ends through `tff_algos.runtime.exit_now`, which ends the
  TFF workers and skips interpreter teardown, where TFF 0.87's executor
  service manager prints a traceback from `__del__` (also after `--help`).
"""

import sys
import traceback
from collections.abc import Callable, Sequence

from absl import app
from absl import flags

from tff_algos import runtime

Main = Callable[[Sequence[str]], int]


def flags_parser(prog: str) -> Callable[[Sequence[str]], list[str]]:
  """absl's flag parser, with errors as one `prog: error:` line and exit 2."""

  def parse(argv: Sequence[str]) -> list[str]:
    try:
      return flags.FLAGS(list(argv))
    except flags.Error as e:
      message = ' '.join(str(e).split()).removeprefix('ERROR:: ')
      print(f'{prog}: error: {message}', file=sys.stderr)
      sys.exit(2)

  return parse


def interrupted_message(prog: str) -> str:
  return (f'{prog}: interrupted; rerun the same command to resume from the '
          'last checkpoint')


def run_binary(prog: str, main: Main) -> None:
  """Runs `main` as absl's `app.run` would and exits with its status."""
  try:
    app.run(lambda argv: runtime.exit_now(main(argv)),
            flags_parser=flags_parser(prog))
  except SystemExit as e:  # --help, flag errors: skip TFF's teardown.
    code = e.code
    if code is None:
      code = 0
    elif not isinstance(code, int):
      print(code, file=sys.stderr)
      code = 1
    runtime.exit_now(code)
  except KeyboardInterrupt:
    print(interrupted_message(prog), file=sys.stderr)
    runtime.exit_now(130)
  except Exception:  # pylint: disable=broad-except
    if runtime.shutting_down():  # A signal arrived: TFF's calls fail.
      print(interrupted_message(prog), file=sys.stderr)
      runtime.exit_now(130)
    traceback.print_exc()  # A bug: keep its traceback, skip the teardown.
    runtime.exit_now(1)
