# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""How every binary starts and ends, as `python -m MODULE` or as a command.

setup.py installs each binary `MODULE` (a module whose `run_main` ends in
`console.run(__name__, ...)`) as the command `tff-hetero-<name>`. `run`:

* registers the binary's flags for `--help`: absl describes only the flags of
  the module named by `sys.argv[0]`, which for a console command is its
  wrapper script;
* parses the flags before anything else runs: an unparsable value or a
  missing `--flagfile` is one `<binary>: error: ...` line and exit status 2
  (absl prints two lines and exits 1); `--help` and `--helpfull` exit 0;
* turns a Ctrl-C or SIGINT anywhere into one `<binary>: interrupted` line
  and status 130, and arms `runtime.install_exit_watchdog`: a run still
  alive 20 s after a SIGINT, SIGTERM or SIGHUP is ended from another thread;
* ends the process through `tff_algos.runtime.exit_now`, which ends the TFF
  workers and skips interpreter teardown, where TFF 0.87's executor service
  manager prints a traceback from `__del__` (also after `--help`).
"""

from collections.abc import Callable, Sequence
import sys
import traceback
from typing import Optional

from absl import app
from absl import flags

from tff_algos import runtime


def binary_name(module_name: str) -> str:
  """The name a binary's error lines start with, e.g. `train`."""
  if module_name == '__main__':
    spec = getattr(sys.modules['__main__'], '__spec__', None)
    module_name = spec.name if spec is not None else sys.argv[0]
  return module_name.rsplit('.', 1)[-1].rsplit('/', 1)[-1].removesuffix('.py')


def _register_help(module_name: str) -> None:
  main_module = sys.modules['__main__']
  if not main_module.__doc__:  # absl's --help starts with it.
    main_module.__doc__ = sys.modules[module_name].__doc__
  flag_values = flags.FLAGS
  for flag in flag_values.get_key_flags_for_module(module_name):
    flag_values.register_key_flag_for_module(sys.argv[0], flag)


def flags_parser(prog: str) -> Callable[[Sequence[str]], list[str]]:
  """absl's flag parser; a malformed flag is one `prog: error:` line, exit 2.

  Leaves through `SystemExit` (2 for a malformed flag, 0 after `--help`), so
  tests can call it in their own process; `run` turns that into `exit_now`.
  """

  def parse(argv: Sequence[str]) -> list[str]:
    try:
      return flags.FLAGS(list(argv))
    except flags.Error as e:
      message = ' '.join(str(e).split()).removeprefix('ERROR:: ')
      print(f'{prog}: error: {message}', file=sys.stderr)
      sys.exit(2)
    except SystemExit:  # absl ends --help and --helpfull with status 1.
      sys.exit(0)

  return parse


def unexpected_arguments(prog: str, argv: Sequence[str]) -> Optional[int]:
  """2 after one `prog: error:` line if `argv` has arguments past its
  program name (absl leaves them; a binary without positional arguments
  would ignore them), else None."""
  if len(argv) <= 1:
    return None
  print(
      f'{prog}: error: unexpected arguments: {" ".join(argv[1:])} (flags '
      'are --name=value)',
      file=sys.stderr,
  )
  return 2


def interrupted_message(prog: str) -> str:
  return (
      f'{prog}: interrupted; rerun the same command to resume from the '
      'last checkpoint'
  )


def run(
    module_name: str,
    main: Callable[[list[str]], Optional[int]],
    flags_parser: Optional[Callable[[list[str]], list[str]]] = None,  # pylint: disable=redefined-outer-name
    prog: Optional[str] = None,
) -> None:
  """`app.run(main)` for the binary `module_name` (its `__name__`).

  Args:
    module_name: The binary's module, `__name__` (`'__main__'` under `-m`).
    main: absl's main: runs the binary on the remaining arguments; its return
      value is the exit status.
    flags_parser: absl's flag parser (default: `flags_parser(prog)`).
    prog: The name error lines start with (default: the module's name).
  """
  prog = prog or binary_name(module_name)
  if module_name != '__main__':
    _register_help(module_name)
  runtime.install_exit_watchdog(interrupted_message(prog))
  try:
    app.run(main, flags_parser=flags_parser or globals()['flags_parser'](prog))
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
