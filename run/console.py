# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""How every binary starts, as `python -m MODULE` or as its console command.

setup.py installs each binary `MODULE` (a module whose `run_main` ends in
`console.run(__name__, ...)`) as the command `tff-hetero-<name>`. absl
describes on `--help` only the flags of the module named by `sys.argv[0]`:
under `python -m` that is the binary, but a console command's `sys.argv[0]` is
the command's wrapper script, so `run` registers the binary's flags for it.
It also makes a malformed flag one `<binary>: error: ...` line with exit
status 2, and leaves through `runtime.exit_now` after `--help` too, so TFF's
teardown prints nothing after the help text.
"""

from collections.abc import Callable, Sequence
import sys
from typing import Optional

from absl import app
from absl import flags

from tff_algos import runtime


def binary_name(module_name: str) -> str:
  """The name a binary's error lines start with, e.g. `train`."""
  if module_name == '__main__':
    spec = getattr(sys.modules['__main__'], '__spec__', None)
    module_name = spec.name if spec is not None else sys.argv[0]
  return module_name.rsplit('.', 1)[-1].rsplit('/', 1)[-1].removesuffix(
      '.py')


def _register_help(module_name: str) -> None:
  main_module = sys.modules['__main__']
  if not main_module.__doc__:  # absl's --help starts with it.
    main_module.__doc__ = sys.modules[module_name].__doc__
  flag_values = flags.FLAGS
  for flag in flag_values.get_key_flags_for_module(module_name):
    flag_values.register_key_flag_for_module(sys.argv[0], flag)


def parse_flags(module_name: str, argv: Sequence[str]) -> list[str]:
  """absl's flag parsing; a malformed flag is one line and exit status 2."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f'{binary_name(module_name)}: error: {e}', file=sys.stderr)
    runtime.exit_now(2)
  except SystemExit as e:  # --help and friends.
    runtime.exit_now(e.code if isinstance(e.code, int) else 0)
  raise AssertionError('unreachable')


def run(
    module_name: str,
    main: Callable[[list[str]], Optional[int]],
    flags_parser: Optional[Callable[[list[str]], list[str]]] = None,
) -> None:
  """`app.run(main)` for the binary `module_name` (its `__name__`).

  Args:
    module_name: The binary's module, `__name__` (`'__main__'` under `-m`).
    main: absl's main: runs the binary on the remaining arguments; its return
      value is the exit status.
    flags_parser: absl's flag parser (default: `parse_flags`).
  """
  if module_name != '__main__':
    _register_help(module_name)
  if flags_parser is None:
    flags_parser = lambda argv: parse_flags(module_name, argv)
  app.run(main, flags_parser=flags_parser)
