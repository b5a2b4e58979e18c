# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""A small AST mutation tester for the pure math functions (docs/testing.md).

For each target function it enumerates single-point mutants (comparison
flips, arithmetic operator swaps, a dropped term of a sum or difference,
the constants 0 and 1 swapped, a removed unary minus, min/max and
argmin/argmax swaps, and/or swaps, a removed `not`), swaps each mutant's code
into the live function object (`f.__code__`, so every reference sees it),
runs the target's fast oracle tests in-process with `pytest.main`, and
restores the original. A mutant is killed when the tests fail, timed out
when they run past `--timeout` seconds. Guard clauses (`if ...: raise`) are
not mutated: the validation tests cover them and this run is about the math.

  .venv/bin/python -m tools.mutate [--list] [--only NAME] [--sample K]
      [--seed S] [--timeout SEC] [--json PATH]
"""

import argparse
import ast
import contextlib
import copy
import importlib
import inspect
import io
import json
import linecache
import os
import random
import signal
import sys
import textwrap
import time

import tensorflow_federated as tff

from run import atomic
from tff_algos import runtime

# (module, qualified function name, pytest arguments selecting its tests).
_TAIL = ['tests/test_tail_metrics.py']
_Q_FFL = ['tests/test_q_ffl.py', '-k', 'message or server_update or oracle']
_ACCOUNTING = [
    'tests/test_accounting.py',
    '-k',
    'uniform_sampling or is_the_event or private_quantile or '
    'full_participation or replace_one or published or '
    'noise_split',
]
_ADADPS = [
    'tests/test_adadps.py',
    '-k',
    'centralized',
    'tests/test_dp2.py',
    '-k',
    'centralized',
]
TARGETS = [
    ('tasks.tail_metrics', name, _TAIL)
    for name in (
        '_sorted_support',
        '_quantile_indices',
        'weighted_quantile',
        'superquantile',
        '_tail_count',
        'lowest_fraction_mean',
        'highest_fraction_mean',
        'angle_to_uniform_degrees',
        'kl_to_uniform',
    )
] + [
    ('tff_algos.q_ffl', 'q_ffl_client_message', _Q_FFL),
    ('tff_algos.q_ffl', 'q_ffl_server_update', _Q_FFL),
    (
        'tff_algos.delta_fl',
        'keep_client',
        [
            'tests/test_delta_fl.py',
            '-k',
            'numpy_oracle or theta_one or keep_client',
        ],
    ),
    (
        'tff_algos.term',
        'tilted_weight',
        ['tests/test_term.py', '-k', 'numpy_oracle'],
    ),
    (
        'tff_algos.afl',
        'project_to_simplex',
        ['tests/test_afl.py', '-k', 'projection'],
    ),
    (
        'tff_algos.aggregators.geometric_median',
        '_distance',
        ['tests/test_geometric_median.py', '-k', 'weiszfeld'],
    ),
    (
        'tff_algos.aggregators.geometric_median',
        'GeometricMedianFactory.create',
        ['tests/test_geometric_median.py', '-k', 'weiszfeld'],
    ),
    ('privacy.accounting', 'adaptive_clip_noise_split', _ACCOUNTING),
    ('privacy.accounting', 'DpMechanism.gaussian_multipliers', _ACCOUNTING),
    (
        'privacy.accounting',
        'DpMechanism.effective_noise_multiplier',
        _ACCOUNTING,
    ),
    ('privacy.accounting', 'DpMechanism.round_event', _ACCOUNTING),
    ('privacy.adadps', 'clip_rows', _ADADPS),
    ('privacy.adadps', 'privatize', _ADADPS),
    ('privacy.adadps', 'sample_batch', _ADADPS),
    ('privacy.adadps', 'run_centralized', _ADADPS),
    ('privacy.adadps', 'PublicRmsPropPreconditioner.__call__', _ADADPS),
    (
        'privacy.dp2',
        'run_centralized',
        ['tests/test_dp2.py', '-k', 'centralized'],
    ),
    ('privacy.dp2', '_Dp2.next', ['tests/test_dp2.py', '-k', 'optimizer']),
]

_COMPARE_SWAP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
}
_BINOP_SWAP = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.Pow: ast.Mult,
}
_NAME_SWAP = {
    'maximum': 'minimum',
    'minimum': 'maximum',
    'max': 'min',
    'min': 'max',
    'reduce_max': 'reduce_min',
    'reduce_min': 'reduce_max',
    'argmin': 'argmax',
    'argmax': 'argmin',
}


def _is_guard(node) -> bool:
  return (
      isinstance(node, ast.If)
      and len(node.body) == 1
      and isinstance(node.body[0], ast.Raise)
      and not node.orelse
  )


def _sites(tree):
  """(node path, kind, description) of every mutation point, in order."""
  out = []

  def visit(node, path):
    if _is_guard(node) or isinstance(node, ast.Raise):
      return
    line = getattr(node, 'lineno', 0)
    if isinstance(node, ast.Compare):
      for i, op in enumerate(node.ops):
        if type(op) in _COMPARE_SWAP:
          new = _COMPARE_SWAP[type(op)].__name__
          out.append(
              (
                  path,
                  ('compare', i),
                  f'L{line} {type(op).__name__}' f' -> {new}',
              )
          )
    elif isinstance(node, ast.BinOp):
      if type(node.op) in _BINOP_SWAP:
        out.append(
            (
                path,
                ('binop',),
                f'L{line} {type(node.op).__name__} -> '
                f'{_BINOP_SWAP[type(node.op)].__name__}',
            )
        )
      if isinstance(node.op, (ast.Add, ast.Sub)):
        out.append(
            (
                path,
                ('drop_right',),
                f'L{line} drop the right term of ' f'{type(node.op).__name__}',
            )
        )
    elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
      if node.value in (0, 1):
        out.append(
            (
                path,
                ('const',),
                f'L{line} constant {node.value!r} -> '
                f'{type(node.value)(1 - node.value)!r}',
            )
        )
    elif isinstance(node, ast.UnaryOp):
      if isinstance(node.op, (ast.USub, ast.Not)):
        out.append((path, ('unary',), f'L{line} drop {type(node.op).__name__}'))
    elif isinstance(node, ast.BoolOp):
      out.append((path, ('boolop',), f'L{line} {type(node.op).__name__} swap'))
    elif isinstance(node, ast.Attribute) and node.attr in _NAME_SWAP:
      out.append(
          (
              path,
              ('attr',),
              f'L{line} .{node.attr} -> ' f'.{_NAME_SWAP[node.attr]}',
          )
      )
    elif (
        isinstance(node, ast.Name)
        and node.id in _NAME_SWAP
        and isinstance(node.ctx, ast.Load)
    ):
      out.append(
          (path, ('name',), f'L{line} {node.id} -> ' f'{_NAME_SWAP[node.id]}')
      )
    for field, value in ast.iter_fields(node):
      if isinstance(value, list):
        for i, child in enumerate(value):
          if isinstance(child, ast.AST):
            visit(child, path + ((field, i),))
      elif isinstance(value, ast.AST):
        visit(value, path + ((field, None),))

  fn = tree.body[0]
  assert isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)), fn
  body = fn.body
  if (
      body
      and isinstance(body[0], ast.Expr)
      and isinstance(body[0].value, ast.Constant)
  ):
    body = body[1:]  # The docstring.
  start = len(fn.body) - len(body)
  for i, stmt in enumerate(body):
    visit(stmt, (('body', start + i),))
  return out


def _get(node, path):
  parent, key = None, None
  for field, index in path:
    parent, key = node, (field, index)
    node = getattr(node, field)
    if index is not None:
      node = node[index]
  return parent, key, node


def _replace(parent, key, new):
  assert key is not None  # The site is never the root.
  field, index = key
  if index is None:
    setattr(parent, field, new)
  else:
    getattr(parent, field)[index] = new


def _mutate(tree, site):
  """A deep copy of `tree` with the mutation `site` applied."""
  tree = copy.deepcopy(tree)
  path, kind, _ = site
  parent, key, node = _get(tree.body[0], path)
  if kind[0] == 'compare':
    node.ops[kind[1]] = _COMPARE_SWAP[type(node.ops[kind[1]])]()
  elif kind[0] == 'binop':
    node.op = _BINOP_SWAP[type(node.op)]()
  elif kind[0] == 'drop_right':
    _replace(parent, key, node.left)
  elif kind[0] == 'const':
    node.value = type(node.value)(1 - node.value)
  elif kind[0] == 'unary':
    _replace(parent, key, node.operand)
  elif kind[0] == 'boolop':
    node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
  elif kind[0] == 'attr':
    node.attr = _NAME_SWAP[node.attr]
  elif kind[0] == 'name':
    node.id = _NAME_SWAP[node.id]
  return ast.fix_missing_locations(tree)


def _function(module, qualname):
  obj = module
  for part in qualname.split('.'):
    obj = (
        obj.__dict__[part]
        if isinstance(obj, type) and part in obj.__dict__
        else getattr(obj, part)
    )
  fn = obj.fget if isinstance(obj, property) else obj
  if not callable(fn):
    raise TypeError(f'{qualname} is not a function')
  return fn


def _tree(fn):
  tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
  tree.body[0].decorator_list = []
  return tree


def _code(tree, module, label):
  """The mutant's code object, its source registered under a fake file.

  AutoGraph converts a function called inside a `tf.function` from its
  SOURCE (`inspect.getsource`, through `linecache`), not from its code: the
  mutant's source must be what `inspect` finds, or TF graphs would run the
  original.
  """
  source = ast.unparse(tree) + '\n'
  filename = f'<mutant {label}>'
  linecache.cache[filename] = (
      len(source),
      None,
      source.splitlines(keepends=True),
      filename,
  )
  namespace = {}
  exec(  # pylint: disable=exec-used  # Runs the generated mutant's source.
      compile(source, filename, 'exec'),
      vars(module),
      namespace,
  )
  return namespace[tree.body[0].name].__code__


class _Timeout(KeyboardInterrupt):
  pass


def _run_tests(args, timeout):
  """'passed', 'failed' or 'timeout' of pytest on `args`."""
  import pytest  # pylint: disable=g-import-not-at-top

  # Third-party pytest plugins are not needed, and one (typeguard's) fails
  # to load once TensorFlow has imported an older typing_extensions.
  os.environ['PYTEST_DISABLE_PLUGIN_AUTOLOAD'] = '1'

  def alarm(signum, frame):
    del signum, frame
    raise _Timeout()

  old = signal.signal(signal.SIGALRM, alarm)
  signal.alarm(timeout)
  try:
    with contextlib.redirect_stdout(io.StringIO()):
      code = pytest.main(
          ['-x', '-qq', '--tb=no', '-p', 'no:cacheprovider', *args]
      )
  except _Timeout:
    return 'timeout'
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)
    # The suite's session end kills TFF's worker: start a fresh context.
    tff.backends.native.set_sync_local_cpp_execution_context()
  if code == pytest.ExitCode.INTERRUPTED:
    return 'timeout'
  return 'passed' if code == pytest.ExitCode.OK else 'failed'


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n', maxsplit=1)[0]
  )
  parser.add_argument(
      '--list', action='store_true', help='list the mutants and exit'
  )
  parser.add_argument(
      '--only',
      default='',
      help='only targets whose name contains one of these (comma-separated)',
  )
  parser.add_argument(
      '--sample',
      type=int,
      default=0,
      help='run K mutants drawn uniformly (0: all)',
  )
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--timeout', type=int, default=300)
  parser.add_argument('--json', default='', help='write the results here')
  args = parser.parse_args(argv)
  runtime.install_worker_cleanup()

  mutants = []
  for module_name, qualname, tests in TARGETS:
    name = f'{module_name}.{qualname}'
    if args.only and not any(part in name for part in args.only.split(',')):
      continue
    module = importlib.import_module(module_name)
    fn = _function(module, qualname)
    tree = _tree(fn)
    first = fn.__code__.co_firstlineno
    for path, kind, text in _sites(tree):
      line, rest = text.split(' ', 1)  # 'L<n>' in the dedented source.
      text = f'L{int(line[1:]) + first - 1} {rest}'
      mutants.append((name, module, fn, tree, (path, kind, text), tests))
  print(f'{len(mutants)} mutants', file=sys.stderr)
  if args.list:
    for name, _, _, _, site, _ in mutants:
      print(f'{name}: {site[2]}')
    return 0
  if args.sample and args.sample < len(mutants):
    chosen = sorted(
        random.Random(args.seed).sample(range(len(mutants)), args.sample)
    )
    mutants = [mutants[i] for i in chosen]

  baseline = {}
  for name, _, _, _, _, tests in mutants:
    key = tuple(tests)
    if key not in baseline:
      start = time.monotonic()
      baseline[key] = _run_tests(list(tests), args.timeout)
      print(
          f'baseline {" ".join(tests)}: {baseline[key]} '
          f'({time.monotonic() - start:.1f} s)',
          file=sys.stderr,
      )
      if baseline[key] != 'passed':
        return 1

  results = []
  for i, (name, module, fn, tree, site, tests) in enumerate(mutants):
    original = fn.__code__
    try:
      fn.__code__ = _code(_mutate(tree, site), module, i)
      start = time.monotonic()
      outcome = _run_tests(list(tests), args.timeout)
    except Exception as e:  # pylint: disable=broad-except
      outcome = f'invalid ({type(e).__name__})'
      start = time.monotonic()
    finally:
      fn.__code__ = original
    status = {'failed': 'killed', 'passed': 'survived'}.get(outcome, outcome)
    results.append(
        dict(
            target=name,
            mutation=site[2],
            status=status,
            seconds=round(time.monotonic() - start, 1),
        )
    )
    print(
        f'[{i + 1}/{len(mutants)}] {status:8s} {name}: {site[2]}',
        file=sys.stderr,
        flush=True,
    )

  counts = {}
  for r in results:
    counts[r['status']] = counts.get(r['status'], 0) + 1
  valid = sum(v for k, v in counts.items() if not k.startswith('invalid'))
  killed = counts.get('killed', 0) + counts.get('timeout', 0)
  print(json.dumps(counts), file=sys.stderr)
  if valid:
    print(
        f'kill rate {killed}/{valid} = {killed / valid:.1%} (timeouts '
        'count as killed)',
        file=sys.stderr,
    )
  for r in results:
    if r['status'] == 'survived':
      print(f'SURVIVED {r["target"]}: {r["mutation"]}')
  if args.json:
    atomic.write_json(args.json, dict(counts=counts, results=results), indent=1)
  runtime.kill_workers()
  return 0


if __name__ == '__main__':
  sys.exit(main())
